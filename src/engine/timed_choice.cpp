// Two ways of doing the same work, chosen by timing them (see timed_choice.hpp).
#include "engine/timed_choice.hpp"

#include <algorithm>

namespace chorus::engine {

int TimedChoice::next() const {
  if (!warm()) return samples_[first_] <= samples_[1 - first_] ? first_ : 1 - first_;
  return sinceTry_ + 1 >= period_ ? 1 - best_ : best_;
}

void TimedChoice::record(int way, double cost) {
  way &= 1;
  if (warm() && way != best_) {
    // A try of the other way: found slower, try it half as often; else as often as at first.
    sinceTry_ = 0;
    period_ = cost > cost_[best_] * (1 + kSwitchMargin) ? std::min(2 * period_, kMaxExplore) : kExplore;
  } else {
    ++sinceTry_;
  }
  double& estimate = cost_[way];
  if (samples_[way]++ == 0) {
    estimate = cost;
  } else if (samples_[way] <= kWarmUp) {
    // A way's first runs pay for what they touch first (pages, caches): the least of the warm-up
    // samples is the estimate to start from.
    estimate = std::min(estimate, cost);
  } else {
    // A sample far above the estimate is mostly a thread that lost its core for a while (more
    // ranks than cores): it counts as twice the estimate. Each sample moves the estimate half way,
    // so that a change of placement shows within a few samples.
    estimate += (std::min(cost, 2 * estimate) - estimate) / 2;
  }
  if (warm() && cost_[1 - best_] < cost_[best_] * (1 - kSwitchMargin)) {
    best_ = 1 - best_;
    period_ = kExplore;
  }
}

}  // namespace chorus::engine
