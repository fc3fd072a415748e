// How a rank writes a reduction into its own staging area, whose lines its peers read last (the
// reduced slices of the `direct` allreduce): with the reduction kernel's vector stores, or a block
// at a time through L1 and memcpy (kernels::CopyMode::Handoff). Which is faster depends on where
// the peers run (docs/performance.md, "Writing what the peers read"): where they share this core's
// L3 the stores save a pass through L1; where they do not (measured: two core complexes of an AMD
// EPYC) memcpy's whole-line writes take the lines from the other cache several times faster than
// stores. A VM's host may move its vCPUs between the two while a job runs, so each rank times
// its own reductions both ways and uses the faster, trying the other now and then. The results
// are the same bit for bit either way, so ranks need not agree (TimedChoice does the timing).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/timed_choice.hpp"
#include "kernels/cpu/reduce.hpp"

namespace chorus::engine {

class StagingWrites {
 public:
  /// CHORUS_STAGE_WRITE: auto (timed, the default), stores or memcpy (always that way).
  enum class Policy { Auto, Stores, Memcpy };

  /// Reductions writing less than this are not timed (too short to tell) and use the stores.
  static constexpr size_t kTimedBytes = 16 * 1024;
  /// The timing's constants (TimedChoice): warm-up runs each way, the exploration period, the
  /// margin for a switch.
  static constexpr uint32_t kWarmUp = TimedChoice::kWarmUp;
  static constexpr uint32_t kExplore = TimedChoice::kExplore;

  explicit StagingWrites(Policy policy = Policy::Auto) : policy_(policy) {}

  /// How to write the next reduction of `bytes` into the staging area.
  kernels::CopyMode next(size_t bytes);
  /// Whether a reduction of `bytes` is timed (only then does record() take its time).
  bool timed(size_t bytes) const { return policy_ == Policy::Auto && bytes >= kTimedBytes; }
  /// The reduction that next() answered `mode` for took `ns` nanoseconds to write `bytes`.
  void record(kernels::CopyMode mode, size_t bytes, uint64_t ns);

  /// Estimated nanoseconds per KiB written each way (0 before the first sample), for the log and
  /// tests.
  double storesNsPerKiB() const { return choice_.cost(kStores); }
  double memcpyNsPerKiB() const { return choice_.cost(kMemcpy); }
  /// The way in use once warm (explorations aside).
  kernels::CopyMode current() const { return modeOf(choice_.current()); }

 private:
  static constexpr int kStores = 0, kMemcpy = 1;
  static kernels::CopyMode modeOf(int way) {
    return way == kMemcpy ? kernels::CopyMode::Handoff : kernels::CopyMode::Cached;
  }

  Policy policy_;
  TimedChoice choice_{kStores};  // ns per KiB written
};

/// CHORUS_STAGE_WRITE's policy (envConfig()).
StagingWrites::Policy stagingWritesPolicy();

}  // namespace chorus::engine
