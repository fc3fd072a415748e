// How a rank writes into its own staging area, whose lines its peers read last: the copies of its
// input that the peers read (every staged collective), and the reductions the `direct` allreduce
// leaves there for them. Which way is faster depends on where the peers run (docs/performance.md,
// "Writing what the peers read"): where they share this core's L3, plain stores keep the lines in
// it for the readers, and a reduction's vector stores save a pass through L1; where they do not
// (measured: two core complexes of an AMD EPYC) every plain store first takes its line back from
// the other complex's cache, and streaming stores, which write whole lines to memory without
// taking them, were 2-5x faster per call on the host measured last (memcpy's whole-line writes
// had been as fast as streaming on an earlier host, and still beat the reduction's stores there).
// A VM's host may move its vCPUs between the two while a job runs, so each rank times its own
// writes each way and uses the faster, trying the other now and then: the copies plain or
// streaming; the reductions streaming wherever the copies stream, else by the kernel's stores or
// a block at a time through L1 and memcpy, timed apart. A streaming copy's readers fetch its lines
// from memory, which the writer's clock does not see: each rank also times its reads of its peers'
// blocks by how they were written, and counts that difference with its own streaming copies'
// time. The results are the same bit for bit either way, so ranks need not agree (TimedChoice
// does the timing).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/timed_choice.hpp"
#include "kernels/cpu/reduce.hpp"

namespace chorus::engine {

class StagingWrites {
 public:
  /// CHORUS_STAGE_WRITE, for the reductions: auto (the default: streaming where the copies
  /// stream, else stores or memcpy, timed), stores, memcpy or streaming (always that way).
  enum class Policy { Auto, Stores, Memcpy, Streaming };
  /// CHORUS_STAGE_COPY, for the copies: auto (timed, the default), plain or streaming.
  enum class CopyPolicy { Auto, Plain, Streaming };

  /// Writes of less than this are not timed (too short to tell) and use plain stores.
  static constexpr size_t kTimedBytes = 16 * 1024;
  /// The peers read streamed lines from memory, plain ones from a cache, and the writer's clock
  /// sees none of that: a streaming copy's time counts what the readers pay more for it, as this
  /// rank measures reading its peers' blocks (recordRead: each rank reads its peers' blocks as
  /// they read its own), and until that is measured in the copy's size class, this much more.
  static constexpr double kStreamingReadFactor = 1.5;
  /// Size classes of the reads' measurements: powers of two from kTimedBytes up, the last one
  /// open-ended.
  static constexpr int kReadClasses = 14;
  /// Reads of blocks written the same way as the read before are timed one in this many (a timing
  /// costs two clock reads, ~50 ns: a tenth of a 16 KiB copy's time).
  static constexpr uint32_t kReadSample = 8;
  /// The timing's constants (TimedChoice): warm-up runs each way, the exploration period, the
  /// margin for a switch.
  static constexpr uint32_t kWarmUp = TimedChoice::kWarmUp;
  static constexpr uint32_t kExplore = TimedChoice::kExplore;

  explicit StagingWrites(Policy policy = Policy::Auto, CopyPolicy copyPolicy = CopyPolicy::Auto)
      : policy_(policy), copyPolicy_(copyPolicy) {}

  /// How to write the next reduction of `bytes` into the staging area: Cached (the kernel's
  /// stores), Handoff (through L1 and memcpy) or Streaming.
  kernels::CopyMode next(size_t bytes);
  /// Whether a reduction of `bytes` is timed (only then does record() take its time): not while
  /// the copies stream, since the reductions stream then.
  bool timed(size_t bytes) const {
    return policy_ == Policy::Auto && bytes >= kTimedBytes && !copiesStream();
  }
  /// The reduction that next() answered `mode` for took `ns` nanoseconds to write `bytes`
  /// (streaming ones are not compared: ignored).
  void record(kernels::CopyMode mode, size_t bytes, uint64_t ns);

  /// How to write the next copy of `bytes` of input into the staging area: Cached or Streaming.
  /// `withOwn`: a copy that writes the rank's own output in the same pass
  /// (kernels::copyToBoth, the staged all-gather's own block), timed apart from the copies into
  /// staging alone (its time counts both writes; only each kind's two ways compare).
  kernels::CopyMode nextCopy(size_t bytes, bool withOwn = false);
  /// Whether a copy of `bytes` is timed (only then does recordCopy() take its time).
  bool copyTimed(size_t bytes) const { return copyPolicy_ == CopyPolicy::Auto && bytes >= kTimedBytes; }
  /// The copy that nextCopy() answered `mode` for took `ns` nanoseconds to write `bytes`.
  /// `readersPenalty`: what its readers published they pay more per KiB for a streamed block of
  /// this size (the mean over them), or -1 where none has: a streaming copy's time counts that,
  /// else this rank's own measure (readPenaltyNsPerKiB), else kStreamingReadFactor.
  /// `withOwn`: as nextCopy's (`bytes` the staged bytes; the fallback factor then weighs the
  /// own output's writes too, which makes it err toward plain stores).
  void recordCopy(kernels::CopyMode mode, size_t bytes, uint64_t ns, double readersPenalty = -1,
                  bool withOwn = false);
  /// Whether to time the next read of `bytes` out of a peer's staging area, written `streamed`
  /// or not: where the copies are timed, a read of a block written the other way than the read
  /// before (one of a peer's tries), its way's first kWarmUp, and one in kReadSample of the rest.
  bool readTimed(bool streamed, size_t bytes);
  /// A read of `bytes` out of a peer's staging area (a copy, or a reduction's share of it) took
  /// `ns`, the peer having written that block with streaming stores or not
  /// (transport::ShmGroup::stagedStreaming). Reads shorter than kTimedBytes are not kept.
  /// `reduction`: the read was a reduction's (the block and this rank's input reduced together),
  /// whose time per KiB is measured apart from the copies' (only each one's two ways compare).
  void recordRead(bool streamed, size_t bytes, uint64_t ns, bool reduction = false);
  /// Nanoseconds per KiB a reader of a block of `bytes` pays more where it was streamed than
  /// where it was written plain (0 if less), as this rank has measured (the mean of its copies'
  /// and its reductions' where it has both); -1 until it has read blocks of that size class both
  /// ways.
  double readPenaltyNsPerKiB(size_t bytes) const;
  /// The size class of a block of `bytes` for the reads' measurements (0 to kReadClasses - 1), or
  /// -1 below kTimedBytes.
  static int readClass(size_t bytes);

  /// Whether the copies stream, once warm (explorations aside), or are forced to.
  bool copiesStream() const {
    return copyPolicy_ == CopyPolicy::Streaming ||
           (copyPolicy_ == CopyPolicy::Auto && copies_.current() == kStreaming);
  }

  /// Estimated nanoseconds per KiB written each way (0 before the first sample), for the log and
  /// tests.
  double storesNsPerKiB() const { return choice_.cost(kStores); }
  double memcpyNsPerKiB() const { return choice_.cost(kMemcpy); }
  double plainCopyNsPerKiB(bool withOwn = false) const { return copyChoice(withOwn).cost(kPlain); }
  double streamingCopyNsPerKiB(bool withOwn = false) const { return copyChoice(withOwn).cost(kStreaming); }
  /// The way in use once warm (explorations aside).
  kernels::CopyMode current() const { return modeOf(choice_.current()); }

 private:
  static constexpr int kStores = 0, kMemcpy = 1;
  static constexpr int kPlain = 0, kStreaming = 1;
  const TimedChoice& copyChoice(bool withOwn) const { return withOwn ? copiesWithOwn_ : copies_; }
  static kernels::CopyMode modeOf(int way) {
    return way == kMemcpy ? kernels::CopyMode::Handoff : kernels::CopyMode::Cached;
  }

  Policy policy_;
  CopyPolicy copyPolicy_;
  TimedChoice choice_{kStores};        // the reductions, ns per KiB written
  TimedChoice copies_{kPlain};         // the copies, ns per KiB written
  TimedChoice copiesWithOwn_{kPlain};  // the copies beside the own output, ns per KiB staged
  struct ReadCost {
    double nsPerKiB[2] = {0, 0};  // by the block's way: kPlain, kStreaming
    uint32_t samples[2] = {0, 0};
  };
  ReadCost reads_[2][kReadClasses];  // copies, reductions
  bool lastReadStreamed_ = false;
  uint32_t readsUntimed_ = 0;
};

/// CHORUS_STAGE_WRITE's policy (envConfig()).
StagingWrites::Policy stagingWritesPolicy();
/// CHORUS_STAGE_COPY's policy (envConfig()).
StagingWrites::CopyPolicy stagingCopiesPolicy();

}  // namespace chorus::engine
