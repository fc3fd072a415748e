// Barrier: shared-memory arrival counters, or a dissemination barrier over pipes.
#include <cmath>

#include "algorithms/common.hpp"
#include "algorithms/cost_model.hpp"

namespace chorus::algo {

void barrierDirect(Context& ctx, const Op&) { shared(ctx).syncAll(); }

// Round k: notify rank r+2^k, wait for rank r-2^k; after ceil(log2 n) rounds everyone has heard
// (indirectly) from everyone.
void barrierPipes(Context& ctx, const Op&) {
  const int n = ctx.size(), r = ctx.rank();
  for (int dist = 1; dist < n; dist <<= 1) {
    engine::Transfer ts[2] = {engine::Transfer::send(mod(r + dist, n), nullptr, 0, 1, ctx.tag()),
                              engine::Transfer::recv(mod(r - dist, n), nullptr, 0, 1, ctx.tag())};
    ctx.run(ts);
  }
}

// ceil(log2 n) rounds of one empty message.
double barrierPipesUs(const CostModel& m, const Op& op, int n) {
  return std::ceil(std::log2(static_cast<double>(n))) * m.terms(op, n).al;
}

}  // namespace chorus::algo
