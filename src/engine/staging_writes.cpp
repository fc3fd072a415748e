// How reductions into the staging area are written (see staging_writes.hpp).
#include "engine/staging_writes.hpp"

#include <algorithm>

#include "base/config.hpp"

namespace chorus::engine {

kernels::CopyMode StagingWrites::next(size_t bytes) {
  switch (policy_) {
    case Policy::Stores:
      return kernels::CopyMode::Cached;
    case Policy::Memcpy:
      return kernels::CopyMode::Handoff;
    case Policy::Auto:
      break;
  }
  if (!timed(bytes)) return kernels::CopyMode::Cached;
  ++timed_;
  if (samples_[kStores] < kWarmUp || samples_[kMemcpy] < kWarmUp) {
    return modeOf(samples_[kStores] <= samples_[kMemcpy] ? kStores : kMemcpy);
  }
  // The other way takes over once it is kSwitchMargin faster: timings of single reductions are
  // noisy, and where the two are close, switching back and forth only adds noise.
  if (cost_[1 - best_] < cost_[best_] * (1 - kSwitchMargin)) best_ = 1 - best_;
  return modeOf(timed_ % kExplore == 0 ? 1 - best_ : best_);
}

void StagingWrites::record(kernels::CopyMode mode, size_t bytes, uint64_t ns) {
  if (!timed(bytes)) return;
  const int way = mode == kernels::CopyMode::Handoff ? kMemcpy : kStores;
  double x = static_cast<double>(ns) * 1024.0 / static_cast<double>(bytes);
  double& cost = cost_[way];
  if (samples_[way]++ == 0) {
    cost = x;
    return;
  }
  // A sample far above the estimate is mostly a rank that lost its core for a while (more ranks
  // than cores): it counts as twice the estimate. Each sample moves the estimate half way, so that
  // a change of placement shows within a few samples.
  x = std::min(x, 2 * cost);
  cost += (x - cost) / 2;
}

StagingWrites::Policy stagingWritesPolicy() {
  const std::string& s = envConfig().stageWrite;
  if (s == "stores") return StagingWrites::Policy::Stores;
  if (s == "memcpy") return StagingWrites::Policy::Memcpy;
  return StagingWrites::Policy::Auto;
}

}  // namespace chorus::engine
