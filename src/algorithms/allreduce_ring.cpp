// AllReduce, ring: reduce-scatter then all-gather around the ring of all ranks, as one list of
// transfers (ring.hpp), so the all-gather of a slice starts as soon as it is reduced.
#include <numeric>

#include "algorithms/cost_model.hpp"
#include "algorithms/ring.hpp"

namespace chorus::algo {

void appendRingReduceScatter(std::vector<engine::Transfer>& ts, const Ring& ring, const Op& op,
                             const void* in, void* out, size_t count, int avgDivisor, uint16_t tag,
                             int& lastRecv) {
  const int n = ring.size(), r = ring.me;
  const size_t elem = dataTypeSize(op.type);
  const Slices sl = ringSlices(ring, count, elem);
  auto off = [&](int i) { return sl.offset(static_cast<size_t>(i)); };
  auto len = [&](int i) { return sl.length(static_cast<size_t>(i)) * elem; };
  // After step s this rank holds slice r-s-1 reduced over s+2 ranks.
  for (int s = 0; s < n - 1; ++s) {
    const int si = mod(r - s, n), ri = mod(r - s - 1, n);
    auto snd = engine::Transfer::send(ring.next(), s == 0 ? at(in, off(si), elem) : at(out, off(si), elem),
                                      len(si), elem, tag);
    snd.waitFor = lastRecv;
    ts.push_back(snd);
    ts.push_back(engine::Transfer::recvReduce(ring.prev(), at(out, off(ri), elem), at(in, off(ri), elem),
                                              len(ri), op.type, op.op, s == n - 2 ? avgDivisor : 0, tag));
    lastRecv = static_cast<int>(ts.size()) - 1;
  }
}

void appendRingAllGather(std::vector<engine::Transfer>& ts, const Ring& ring, void* buf, size_t count,
                         size_t elem, uint16_t tag, int& lastRecv) {
  const int n = ring.size(), r = ring.me;
  const Slices sl = ringSlices(ring, count, elem);
  auto off = [&](int i) { return sl.offset(static_cast<size_t>(i)); };
  auto len = [&](int i) { return sl.length(static_cast<size_t>(i)) * elem; };
  for (int s = 0; s < n - 1; ++s) {
    const int si = mod(r + 1 - s, n), ri = mod(r - s, n);
    auto snd = engine::Transfer::send(ring.next(), at(buf, off(si), elem), len(si), elem, tag);
    snd.waitFor = lastRecv;
    ts.push_back(snd);
    ts.push_back(engine::Transfer::recv(ring.prev(), at(buf, off(ri), elem), len(ri), elem, tag));
    lastRecv = static_cast<int>(ts.size()) - 1;
  }
}

void allReduceRing(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size();
  std::vector<int> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  const Ring ring{all, ctx.rank()};
  std::vector<engine::Transfer> ts;
  ts.reserve(static_cast<size_t>(4 * (n - 1)));
  int lastRecv = -1;
  appendRingReduceScatter(ts, ring, op, op.send, op.recv, op.count, avgDivisor(op, n), ctx.tag(), lastRecv);
  appendRingAllGather(ts, ring, op.recv, op.count, dataTypeSize(op.type), ctx.tag(), lastRecv);
  ctx.run(ts);
}

// Reduce-scatter then all-gather: 2 (n - 1) steps, each moving and (in the first half) reducing 1/n.
double allReduceRingUs(const CostModel& m, const Op& op, int n) {
  const auto t = m.terms(op, n);
  return 2 * (t.fn - 1) * t.al + 2 * (t.fn - 1) / t.fn * t.B * t.wire + (t.fn - 1) / t.fn * t.B * t.red;
}

}  // namespace chorus::algo
