// Two ways of doing the same work, chosen by timing them as they run. Which is faster can depend on
// where the host put the threads (two cores sharing an L3 or not), and a VM's host may move its
// vCPUs while a job runs: so both ways are tried, the faster one used, and the other tried now and
// then: every kExplore-th run at first, then, while each try finds it slower, half as often, down
// to one run in kMaxExplore (a try costs the difference between the two; a change noticed late
// costs it on every run until then). The results must not depend on the way chosen
// (StagingWrites, SingleCopyChoice).
#pragma once

#include <cstdint>

namespace chorus::engine {

class TimedChoice {
 public:
  /// Runs timed each way before the faster one is chosen (alternating, the preferred way first);
  /// the least of them is the way's first estimate.
  static constexpr uint32_t kWarmUp = 2;
  /// Once warm, every kExplore-th run goes the other way, to notice a change; each try that finds
  /// it slower (by kSwitchMargin) doubles the period, up to kMaxExplore; any other resets it.
  static constexpr uint32_t kExplore = 16;
  static constexpr uint32_t kMaxExplore = 128;
  /// The way not in use takes over when its estimate is this much lower (a fraction): single
  /// timings are noisy, and where the two are close, switching back and forth only adds noise.
  static constexpr double kSwitchMargin = 0.05;

  /// `preferred` (0 or 1): the way tried first, and used until the other is measured faster.
  explicit TimedChoice(int preferred = 0) : first_(preferred & 1), best_(preferred & 1) {}

  /// The way (0 or 1) the next run takes.
  int next() const;
  /// A run the way `way` cost `cost` (any unit, the same for both ways: nanoseconds per KiB, say).
  void record(int way, double cost);

  /// The estimated cost each way (0 before its first sample).
  double cost(int way) const { return cost_[way & 1]; }
  /// The way in use once warm (explorations aside).
  int current() const { return best_; }
  /// Whether both ways have had their warm-up runs.
  bool warm() const { return samples_[0] >= kWarmUp && samples_[1] >= kWarmUp; }
  /// Runs from one try of the other way to the next, now.
  uint32_t explorePeriod() const { return period_; }

 private:
  double cost_[2] = {0, 0};  // moving averages
  uint32_t samples_[2] = {0, 0};
  uint32_t sinceTry_ = 0;  // recorded runs since the other way was last tried (or since the start)
  uint32_t period_ = kExplore;
  int first_;
  int best_;
};

}  // namespace chorus::engine
