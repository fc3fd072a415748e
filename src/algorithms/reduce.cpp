// Reduce: direct (root reduces all staged chunks) and pipeline (a chain towards the root).
#include <algorithm>
#include <array>

#include "algorithms/common.hpp"
#include "algorithms/cost_model.hpp"

namespace chorus::algo {

void reduceDirect(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  transport::ShmGroup& shm = shared(ctx).group();
  const int n = ctx.size(), me = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const size_t chunk = stageChunkElems(shm, elem, 1);
  const kernels::CopyMode store = outputCopyMode(op.count * elem, op.send == op.recv);
  std::vector<const void*> srcs(static_cast<size_t>(n));
  // The others stage their inputs; the root reduces its own straight from its input (reduce()
  // allows the output to be that same pointer, in place) and stages nothing.
  forEachStagedChunk(
      ctx, op.count, chunk, elem,
      [&](size_t off, size_t ce, size_t place) {
        if (me != op.root) stageCopy(ctx, shm.stageAt(me, place), at(op.send, off, elem), ce * elem);
      },
      [&](size_t off, size_t ce, size_t place) {
        if (me != op.root) return;
        for (int k = 0; k < n; ++k)
          srcs[static_cast<size_t>(k)] = k == me ? at(op.send, off, elem) : shm.stageAt(k, place);
        kernels::reduce(at(op.recv, off, elem), srcs.data(), n, ce, op.type, op.op, avgDivisor(op, n), store);
      },
      // Packed through the whole staging area: every call, the short ones where ranks share cores
      // (stagingPacks).
      Packing::Always);
}

// Reduce, low latency: every rank publishes each chunk of up to llRootedCapacity() bytes in its
// ring of low-latency slots and goes on (ShmSync::llGatherToRoot); the root reduces all n copies in rank
// order, as the allreduce's "ll" does.
void reduceLowLatency(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size();
  const bool root = ctx.rank() == op.root;
  const size_t elem = dataTypeSize(op.type);
  const size_t chunk = engine::ShmSync::llRootedCapacity() / elem;
  std::byte* gathered = root ? ctx.scratch(static_cast<size_t>(n) * chunk * elem) : nullptr;
  // The sources' addresses on the stack up to 64 ranks: no allocation on the latency path.
  constexpr int kOnStack = 64;
  std::array<const void*, kOnStack> few;
  std::vector<const void*> many(root && n > kOnStack ? static_cast<size_t>(n) : 0);
  const void** srcs = n > kOnStack ? many.data() : few.data();
  for (size_t off = 0; off < op.count; off += chunk) {
    const size_t ce = std::min(chunk, op.count - off), bytes = ce * elem;
    shared(ctx).llGatherToRoot(op.root, at(op.send, off, elem), bytes, gathered);
    if (!root) continue;
    for (int k = 0; k < n; ++k) srcs[k] = gathered + static_cast<size_t>(k) * bytes;
    kernels::reduce(at(op.recv, off, elem), srcs, n, ce, op.type, op.op, avgDivisor(op, n));
  }
}

void reducePipeline(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size(), r = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const size_t bytes = op.count * elem;
  const int pos = mod(r - op.root, n);  // data flows from position n-1 down to the root (0)
  const int from = mod(r + 1, n), to = mod(r - 1, n);
  std::vector<engine::Transfer> ts;
  if (pos == n - 1) {
    ts.push_back(engine::Transfer::send(to, op.send, bytes, elem, ctx.tag()));
  } else if (pos == 0) {
    ts.push_back(engine::Transfer::recvReduce(from, op.recv, op.send, bytes, op.type, op.op,
                                              avgDivisor(op, n), ctx.tag()));
  } else {
    std::byte* partial = ctx.scratch(bytes);
    ts.push_back(engine::Transfer::recvReduce(from, partial, op.send, bytes, op.type, op.op, 0, ctx.tag()));
    auto fwd = engine::Transfer::send(to, partial, bytes, elem, ctx.tag());
    fwd.waitFor = 0;
    ts.push_back(fwd);
  }
  ctx.run(ts);
}

// The chain towards the root, reducing as bytes arrive.
double reducePipelineUs(const CostModel& m, const Op& op, int n) {
  const auto t = m.terms(op, n);
  return 2 * (t.fn - 1) * t.al + t.B * t.wire + t.B * t.red;
}

}  // namespace chorus::algo
