// AllReduce, recursive doubling: log2(p) exchanges of the whole message with partners at distance
// 1, 2, 4, ...; ranks beyond the largest power of two p first fold into a partner and get the
// result back at the end. Best for small messages (few steps, each latency-bound).
#include <cstring>

#include "algorithms/common.hpp"
#include "algorithms/cost_model.hpp"

namespace chorus::algo {

void allReduceRecursiveDoubling(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size(), r = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const size_t bytes = op.count * elem;
  auto* buf = static_cast<std::byte*>(op.recv);
  if (op.send != op.recv) ctx.localCopy(buf, op.send, bytes);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  const uint16_t tag = ctx.tag();
  int newRank;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      // Fold into r+1, then receive the result from it.
      engine::Transfer ts[2] = {engine::Transfer::send(r + 1, buf, bytes, elem, tag),
                                engine::Transfer::recv(r + 1, buf, bytes, elem, tag)};
      ctx.run(std::span(ts, 1));
      ctx.run(std::span(ts + 1, 1));
      return;
    }
    engine::Transfer t = engine::Transfer::recvReduce(r - 1, buf, buf, bytes, op.type, op.op, 0, tag);
    ctx.run(std::span(&t, 1));
    newRank = r / 2;
  } else {
    newRank = r - rem;
  }
  std::byte* tmp = ctx.scratch(bytes);
  for (int mask = 1; mask < p; mask <<= 1) {
    int pn = newRank ^ mask;
    int partner = pn < rem ? pn * 2 + 1 : pn + rem;
    ctx.localCopy(tmp, buf, bytes);  // the partner needs our value from before this step's reduction
    engine::Transfer ts[2] = {engine::Transfer::send(partner, tmp, bytes, elem, tag),
                              engine::Transfer::recvReduce(partner, buf, buf, bytes, op.type, op.op, 0, tag)};
    ctx.run(ts);
  }
  if (op.op == ReduceOp::Avg) {
    const void* self[1] = {buf};
    ctx.localReduce(buf, self, 1, op.count, op.type, op.op, n);
  }
  if (r < 2 * rem) {
    engine::Transfer t = engine::Transfer::send(r - 1, buf, bytes, elem, tag);
    ctx.run(std::span(&t, 1));
  }
}

// log2 n exchanges of the whole message, each priced on the link it crosses.
double allReduceRecursiveDoublingUs(const CostModel& m, const Op& op, int n) {
  return m.recursiveUs(op, n, false);
}

}  // namespace chorus::algo
