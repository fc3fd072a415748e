// Reduce, k-nomial tree (k = 4) towards the root, chunk by chunk: a rank reduces each chunk from its
// children one after the other (smallest subtree first: it is ready first), and sends the previous
// chunk to its parent while it reduces the next. The tree is patterns::knomialTree.
#include <algorithm>

#include "algorithms/algorithm.hpp"
#include "algorithms/common.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/patterns/patterns.hpp"

namespace chorus::algo {

namespace {
constexpr int kReduceRadix = 4;
constexpr size_t kChunkBytes = size_t{128} << 10;
}  // namespace

void reduceKnomial(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size(), r = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const patterns::TreeLinks links = patterns::knomialTree(n, op.root, kReduceRadix, r);
  const bool isRoot = r == op.root;
  const size_t line = cacheLineElems(elem);
  const size_t chunkElems = std::max(line, kChunkBytes / elem / line * line);
  const size_t chunks = (op.count + chunkElems - 1) / chunkElems;
  auto offsetOf = [&](size_t c) { return c * chunkElems; };
  auto bytesOf = [&](size_t c) { return std::min(chunkElems, op.count - c * chunkElems) * elem; };
  std::vector<engine::Transfer> ts;
  if (links.children.empty()) {
    // A leaf: every chunk straight from the input (one message per chunk, as the parent expects).
    for (size_t c = 0; c < chunks; ++c) {
      ts.push_back(
          engine::Transfer::send(links.parent, at(op.send, offsetOf(c), elem), bytesOf(c), elem, ctx.tag()));
    }
    ctx.run(ts);
    return;
  }
  // Partial results accumulate in the output at the root, in scratch elsewhere.
  std::byte* acc = isRoot ? static_cast<std::byte*>(op.recv) : ctx.scratch(op.count * elem);
  const int div = isRoot ? avgDivisor(op, n) : 0;
  const size_t nc = links.children.size();
  for (size_t c = 0; c < chunks; ++c) {
    const size_t off = offsetOf(c);
    for (size_t j = 0; j < nc; ++j) {
      const int child = links.children[nc - 1 - j];  // smallest subtree first
      ts.clear();
      ts.push_back(engine::Transfer::recvReduce(
          child, at(acc, off, elem), j == 0 ? at(op.send, off, elem) : at(acc, off, elem), bytesOf(c),
          op.type, op.op, j + 1 == nc ? div : 0, ctx.tag()));
      if (!isRoot && j == 0 && c > 0) {
        ts.push_back(engine::Transfer::send(links.parent, at(acc, offsetOf(c - 1), elem), bytesOf(c - 1),
                                            elem, ctx.tag()));
      }
      ctx.run(ts);
    }
  }
  if (!isRoot) {
    engine::Transfer last = engine::Transfer::send(links.parent, at(acc, offsetOf(chunks - 1), elem),
                                                   bytesOf(chunks - 1), elem, ctx.tag());
    ctx.run(std::span(&last, 1));
  }
}

// Depth ceil(log_4 n); a parent receives and reduces up to (k - 1) d children's chunks.
double reduceKnomialUs(const CostModel& m, const Op& op, int n) {
  const auto t = m.terms(op, n);
  const int d = ceilLog(n, kReduceRadix);
  return d * t.al + (kReduceRadix - 1) * d * t.B * (t.wire + t.red);
}

}  // namespace chorus::algo
