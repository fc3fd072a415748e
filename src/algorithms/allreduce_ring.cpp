// AllReduce, ring: reduce-scatter then all-gather around the ring, as one list of transfers.
// Each send is bound to the progress of the receive that produced its bytes, so slices flow around
// the ring as soon as they arrive (pipelined at the granularity of the pipe's free space).
#include "algorithms/common.hpp"

namespace chorus::algo {

void allReduceRing(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size(), r = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  Slices sl(op.count, static_cast<size_t>(n), cacheLineElems(elem));
  auto off = [&](int i) { return sl.offset(static_cast<size_t>(i)); };
  auto len = [&](int i) { return sl.length(static_cast<size_t>(i)) * elem; };
  std::vector<engine::Transfer> ts;
  ts.reserve(static_cast<size_t>(4 * (n - 1)));
  int lastRecv = -1;
  // Reduce-scatter: after step s this rank holds slice r-s-1 reduced over s+2 ranks.
  for (int s = 0; s < n - 1; ++s) {
    int si = mod(r - s, n), ri = mod(r - s - 1, n);
    auto snd =
        engine::Transfer::send(next, at(s == 0 ? op.send : op.recv, off(si), elem), len(si), elem, ctx.tag());
    snd.waitFor = lastRecv;
    ts.push_back(snd);
    ts.push_back(engine::Transfer::recvReduce(prev, at(op.recv, off(ri), elem), at(op.send, off(ri), elem),
                                              len(ri), op.type, op.op, s == n - 2 ? avgDivisor(op, n) : 0,
                                              ctx.tag()));
    lastRecv = static_cast<int>(ts.size()) - 1;
  }
  // All-gather: pass the fully reduced slices on.
  for (int s = 0; s < n - 1; ++s) {
    int si = mod(r + 1 - s, n), ri = mod(r - s, n);
    auto snd = engine::Transfer::send(next, at(op.recv, off(si), elem), len(si), elem, ctx.tag());
    snd.waitFor = lastRecv;
    ts.push_back(snd);
    ts.push_back(engine::Transfer::recv(prev, at(op.recv, off(ri), elem), len(ri), elem, ctx.tag()));
    lastRecv = static_cast<int>(ts.size()) - 1;
  }
  ctx.run(ts);
}

}  // namespace chorus::algo
