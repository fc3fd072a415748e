// AllReduce, recursive halving-doubling (Rabenseifner): reduce-scatter by recursive halving, then
// all-gather by recursive doubling, each rank moving about 2 (n-1)/n of the message in 2 log2(n)
// steps; ranks beyond the largest power of two fold into a partner first and get the result back at
// the end. The schedule is patterns::halvingDoublingSchedule; each of its steps is one exchange.
#include "algorithms/algorithm.hpp"
#include "algorithms/common.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/patterns/patterns.hpp"

namespace chorus::algo {

void allReduceHalvingDoubling(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const size_t elem = dataTypeSize(op.type);
  const std::vector<patterns::Step> steps =
      patterns::halvingDoublingSchedule(ctx.size(), ctx.rank(), op.count, cacheLineElems(elem));
  // The last reduction completes this rank's block: Avg divides there.
  int lastReduce = -1;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].reduce) lastReduce = static_cast<int>(i);
  }
  // Until the first step, this rank's data is its input; from then on the (partly) reduced output.
  // Within a step the sent and received ranges never overlap, so both use the buffers directly.
  const void* cur = op.send;
  std::vector<engine::Transfer> ts;
  for (size_t i = 0; i < steps.size(); ++i) {
    const patterns::Step& s = steps[i];
    ts.clear();
    if (!s.send.empty()) {
      ts.push_back(
          engine::Transfer::send(s.peer, at(cur, s.send.begin, elem), s.send.size() * elem, elem, ctx.tag()));
    }
    if (!s.recv.empty()) {
      void* dst = at(op.recv, s.recv.begin, elem);
      const size_t bytes = s.recv.size() * elem;
      if (s.reduce) {
        const int div = static_cast<int>(i) == lastReduce ? avgDivisor(op, ctx.size()) : 0;
        ts.push_back(engine::Transfer::recvReduce(s.peer, dst, at(cur, s.recv.begin, elem), bytes, op.type,
                                                  op.op, div, ctx.tag()));
      } else {
        ts.push_back(engine::Transfer::recv(s.peer, dst, bytes, elem, ctx.tag()));
      }
    }
    if (!ts.empty()) ctx.run(ts);
    cur = op.recv;
  }
}

// Halving then doubling: the step at distance d moves d / p of the message each way.
double allReduceHalvingDoublingUs(const CostModel& m, const Op& op, int n) {
  return m.recursiveUs(op, n, true);
}

}  // namespace chorus::algo
