// Whether the allreduce, all-gather and reduce-scatter of ordinary buffers between processes read
// their peers' buffers in place (single copy: algo::reducePulled, the all-gather's reads of every
// peer's block) or stage them, for the messages where either may win. Which is
// faster depends on where the host runs the ranks, not only on the size: on a VM whose host moves
// its vCPUs, staging was up to 1.5x faster at 256 KiB-1 MiB out of place in one run, and single
// copy up to 1.8x faster in place at the same sizes in another (docs/performance.md, "Single copy
// or staging, timed").
//
// Both paths need every rank to take the same one, so group rank 0 decides for all: it times its
// own calls each way, per collective, size class (a power of two) and whether any rank works in
// place (TimedChoice), and its verdict travels with its buffers in the buffer exchange that every
// such call makes first. The other ranks follow it; all ranks count the calls each way (tests).
// Where cross-memory attach measured slow at set-up (ShmGroup::peerReadsFast() false: the only
// single copy left is these three, timed), the caller passes staging as the ranges' answer, so it
// is the way tried first.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "base/op.hpp"
#include "engine/timed_choice.hpp"

namespace chorus::engine {

class SingleCopyChoice {
 public:
  /// CHORUS_SINGLE_COPY_CHOICE: timed (the default), or the measured size ranges only
  /// (algo::pullingPays), as also when CHORUS_CMA=<size> forces single copy.
  enum class Policy { Timed, Ranges };

  explicit SingleCopyChoice(Policy policy = Policy::Timed) : policy_(policy) {}

  /// Whether calls of `kind` are timed (allreduce, all-gather and reduce-scatter; the others keep
  /// their ranges).
  static bool times(OpKind kind) { return slotOf(kind) >= 0; }
  /// Rank 0, before the buffer exchange of a call of `kind` and `bytes` (the size singleCopyPays
  /// takes): the verdict it publishes. The ranges' answers for the call (`pullOutOfPlace` when no
  /// rank works in place, `pullInPlace` when one does) are the first way tried, and the answer
  /// under Policy::Ranges or for a kind not timed.
  uint32_t verdict(OpKind kind, size_t bytes, bool pullOutOfPlace, bool pullInPlace);
  /// What rank 0's verdict says of one call: read in place or stage, and whether the call is timed.
  /// A timed call ends with a synchronisation of every rank (single copy always does), so that
  /// rank 0's clock, started when the exchange ends (every rank there), stops when every rank is
  /// done: without it a staged call's end on rank 0 leaves out a slower peer, whose lag the next
  /// call's exchange would absorb. Staged calls are timed while warming up, when tried, and one in
  /// kStagedSample otherwise (that synchronisation is their only cost).
  struct Way {
    bool single = false;
    bool timed = false;
  };
  static constexpr uint32_t kStagedSample = 4;
  /// Every rank, after the exchange: what rank 0's `verdict` says, where any rank works in place
  /// or not. Counted.
  Way follow(uint32_t verdict, bool anyInPlace);
  /// Rank 0, after a timed call: it took `ns` nanoseconds the way `follow` said.
  void record(OpKind kind, size_t bytes, bool anyInPlace, bool single, uint64_t ns);

  Policy policy() const { return policy_; }
  /// Calls this rank pulled and staged so far (of those that asked).
  uint64_t pulledCalls() const { return calls_[1]; }
  uint64_t stagedCalls() const { return calls_[0]; }
  /// Rank 0's estimates for a class, ns per KiB each way (0: not timed yet), for tests and logs.
  double nsPerKiB(OpKind kind, size_t bytes, bool anyInPlace, bool pulled) const;

 private:
  static constexpr int kKinds = 3;     // allreduce, all-gather, reduce-scatter
  static constexpr int kClasses = 64;  // by the position of the size's highest bit
  static int slotOf(OpKind kind) {
    return kind == OpKind::AllReduce       ? 0
           : kind == OpKind::AllGather     ? 1
           : kind == OpKind::ReduceScatter ? 2
                                           : -1;
  }
  // The class's index, or -1 for a kind not timed.
  static int indexOf(OpKind kind, size_t bytes, bool anyInPlace);

  Policy policy_;
  std::array<std::optional<TimedChoice>, static_cast<size_t>(kKinds * 2 * kClasses)> classes_;
  std::array<uint32_t, static_cast<size_t>(kKinds * 2 * kClasses)> stagedAsked_{};  // untried staged verdicts
  uint64_t calls_[2] = {0, 0};
};

/// CHORUS_SINGLE_COPY_CHOICE's policy (envConfig()); Ranges also where CHORUS_CMA=<size> forces
/// single copy.
SingleCopyChoice::Policy singleCopyChoicePolicy();

}  // namespace chorus::engine
