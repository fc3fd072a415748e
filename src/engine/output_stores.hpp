// How a rank writes the output it copies out of the staging areas (the staged all-gather,
// allreduce and all-to-all): with plain stores, which leave the output in cache for whoever reads it next, or
// with streaming (non-temporal) stores, which save every destination line's read for ownership and keep the
// output from evicting what the ranks read next. Which is faster depends on whether all the host's ranks'
// buffers fit its last-level cache, and on the machine: on an AVX2-only EPYC VM (L3 8 MiB, copy floor 15-17
// GB/s) streaming made the 4-rank all-gather of 2 MiB 1.7x faster and the 2-rank one of 4 MiB 1.5x, while on
// a Zen 5 EPYC VM (L3 32 MiB) it made the 4-rank one of 8 MiB 1.7x slower (docs/performance.md, "Output
// stores, timed"). So where all ranks' buffers reach the non-temporal threshold but one rank's output does
// not (algo::streamsFirst), each rank times its calls both ways (from the first synchronisation on: the
// copies out alone favoured streaming where it made the call slower), per collective and size class,
// streaming first, and uses the faster (TimedChoice). The results are the same bit for bit either way, so
// ranks need not agree. With CHORUS_NT_STORE_BYTES set, the threshold alone decides.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "base/op.hpp"
#include "engine/timed_choice.hpp"
#include "kernels/cpu/reduce.hpp"

namespace chorus::engine {

class OutputStores {
 public:
  /// Outputs smaller than this (per rank) are not timed: the threshold's way (plain stores below
  /// any threshold the machine gives) is used.
  static constexpr size_t kTimedBytes = size_t{256} << 10;

  /// `timed` false: the threshold's way always (CHORUS_NT_STORE_BYTES set).
  explicit OutputStores(bool timed = true) : timed_(timed) {}

  /// Whether a call of `kind` writing `outputBytes` per rank is timed (then next() may differ from
  /// `preferred` and record() takes its time). Only all-gather, allreduce and all-to-all are.
  bool timed(OpKind kind, size_t outputBytes) const;
  /// How to write the next call's output; `preferred` is the way tried first in each class (the
  /// algorithms pass streaming) and the answer for calls not timed.
  kernels::CopyMode next(OpKind kind, size_t outputBytes, kernels::CopyMode preferred);
  /// The call that next() answered `mode` for took `ns` nanoseconds from its first synchronisation
  /// to this rank's last copy out.
  void record(OpKind kind, size_t outputBytes, kernels::CopyMode mode, uint64_t ns);

  /// The class's estimated nanoseconds per KiB of output each way (0 before a sample), and its
  /// way in use once warm (explorations aside): for tests and the log.
  double nsPerKiB(OpKind kind, size_t outputBytes, kernels::CopyMode mode) const;
  std::optional<kernels::CopyMode> current(OpKind kind, size_t outputBytes) const;

 private:
  static constexpr int kCached = 0, kStreaming = 1;
  static constexpr size_t kClasses = 64;  // log2 of the output's size
  static int wayOf(kernels::CopyMode m) { return m == kernels::CopyMode::Streaming ? kStreaming : kCached; }
  static kernels::CopyMode modeOf(int way) {
    return way == kStreaming ? kernels::CopyMode::Streaming : kernels::CopyMode::Cached;
  }
  // The index in classes_ of a timed call's class (timed() true), kNone for the others.
  static constexpr size_t kNone = SIZE_MAX;
  size_t indexOf(OpKind kind, size_t outputBytes) const;

  bool timed_;
  std::array<std::optional<TimedChoice>, 3 * kClasses> classes_{};  // all-gather, allreduce, all-to-all
};

/// Whether output stores are timed here: CHORUS_NT_STORE_BYTES unset (envConfig()).
bool outputStoresTimed();

}  // namespace chorus::engine
