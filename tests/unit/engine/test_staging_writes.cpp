// engine::StagingWrites: how a rank writes reductions and copies into its staging area. Fed
// made-up timings: it tries both ways, settles on the faster, tries the other from time to time,
// follows a change of which is faster within a few samples, shrugs off one descheduled sample,
// never times small writes, and the forced policies (CHORUS_STAGE_WRITE, CHORUS_STAGE_COPY) never
// change. Copies stream only where their writes are faster by more than the readers then pay (as
// the readers measure it, or 1.5x until they have), the reductions stream while the copies do, and
// copies that write the own output in the same pass are timed apart.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/staging_writes.hpp"

using namespace chorus;
using namespace chorus::engine;
using kernels::CopyMode;

namespace {

constexpr size_t kBytes = 256 * 1024;

// Runs `n` reductions (or, with `copies`, copies) of kBytes into staging, each taking what `costNs`
// says for the way chosen; returns the ways.
template <typename F>
std::vector<CopyMode> run(StagingWrites& w, int n, F costNs, bool copies = false) {
  std::vector<CopyMode> ways;
  for (int i = 0; i < n; ++i) {
    const CopyMode m = copies ? w.nextCopy(kBytes) : w.next(kBytes);
    ways.push_back(m);
    if (copies)
      w.recordCopy(m, kBytes, costNs(m));
    else
      w.record(m, kBytes, costNs(m));
  }
  return ways;
}

int count(const std::vector<CopyMode>& ways, CopyMode m, size_t from = 0) {
  int c = 0;
  for (size_t i = from; i < ways.size(); ++i) c += ways[i] == m;
  return c;
}

TEST(StagingWrites, TriesBothThenKeepsTheFasterExploringTheOther) {
  StagingWrites w;
  // Two complexes: stores 2.3x slower.
  auto ways = run(w, 2 * StagingWrites::kWarmUp + 4 * StagingWrites::kExplore,
                  [](CopyMode m) { return m == CopyMode::Handoff ? 2000 : 4600; });
  // The warm-up alternates, starting with the stores.
  for (uint32_t i = 0; i < 2 * StagingWrites::kWarmUp; ++i)
    EXPECT_EQ(ways[i], i % 2 == 0 ? CopyMode::Cached : CopyMode::Handoff) << i;
  // Then memcpy, but for the stores' tries: the first at the kExplore-th reduction, the next
  // twice as far on (each try finds them slower: TimedChoice).
  const size_t warm = 2 * StagingWrites::kWarmUp;
  EXPECT_EQ(count(ways, CopyMode::Cached, warm), 2);
  EXPECT_EQ(ways[StagingWrites::kExplore - 1], CopyMode::Cached);
  EXPECT_EQ(ways[3 * StagingWrites::kExplore - 1], CopyMode::Cached);
  EXPECT_EQ(w.current(), CopyMode::Handoff);
  EXPECT_NEAR(w.memcpyNsPerKiB(), 2000.0 * 1024 / kBytes, 1e-9);
  EXPECT_NEAR(w.storesNsPerKiB(), 4600.0 * 1024 / kBytes, 1e-9);
}

TEST(StagingWrites, FollowsAChangeOfPlacementBothWays) {
  StagingWrites w;
  bool twoComplexes = false;  // one complex: stores 10% faster
  auto cost = [&](CopyMode m) {
    if (twoComplexes) return m == CopyMode::Handoff ? 2000 : 4600;
    return m == CopyMode::Handoff ? 1100 : 1000;
  };
  run(w, 40, cost);
  EXPECT_EQ(w.current(), CopyMode::Cached);
  // The vCPUs move to two complexes: the stores in use slow down at once, so within a few
  // reductions memcpy takes over.
  twoComplexes = true;
  auto ways = run(w, 8, cost);
  EXPECT_EQ(w.current(), CopyMode::Handoff);
  EXPECT_GE(count(ways, CopyMode::Handoff, 4), 3);
  // And back: the stores are seen to be faster again at their next explorations (the estimate
  // moves half way per sample, and must come kSwitchMargin below memcpy's), within 8 of them.
  twoComplexes = false;
  ways = run(w, 8 * StagingWrites::kExplore, cost);
  EXPECT_EQ(w.current(), CopyMode::Cached);
  EXPECT_GE(count(ways, CopyMode::Cached, ways.size() - StagingWrites::kExplore),
            static_cast<int>(StagingWrites::kExplore) - 1);
}

TEST(StagingWrites, OneDescheduledSampleDoesNotSwitch) {
  StagingWrites w;
  run(w, 20, [](CopyMode m) { return m == CopyMode::Handoff ? 1100 : 1000; });
  ASSERT_EQ(w.current(), CopyMode::Cached);
  // One reduction of the stores took 100x as long (its rank lost the core): counted as 2x, which
  // moves the estimate to 1.5x, so memcpy is used until the stores are tried again and recover.
  const CopyMode m = w.next(kBytes);
  w.record(m, kBytes, m == CopyMode::Cached ? 100000 : 1100);
  EXPECT_LT(w.storesNsPerKiB(), 2.0 * 1000 * 1024 / kBytes);
  run(w, 4 * StagingWrites::kExplore, [](CopyMode way) { return way == CopyMode::Handoff ? 1100 : 1000; });
  EXPECT_EQ(w.current(), CopyMode::Cached);
}

TEST(StagingWrites, SmallReductionsAndCopiesArePlainUntimed) {
  StagingWrites w;
  EXPECT_FALSE(w.timed(StagingWrites::kTimedBytes - 1));
  EXPECT_TRUE(w.timed(StagingWrites::kTimedBytes));
  EXPECT_FALSE(w.copyTimed(StagingWrites::kTimedBytes - 1));
  EXPECT_TRUE(w.copyTimed(StagingWrites::kTimedBytes));
  for (int i = 0; i < 50; ++i) {
    const CopyMode m = w.next(StagingWrites::kTimedBytes - 1), c = w.nextCopy(StagingWrites::kTimedBytes - 1);
    EXPECT_EQ(m, CopyMode::Cached);
    EXPECT_EQ(c, CopyMode::Cached);
    w.record(m, StagingWrites::kTimedBytes - 1, 1000000);
    w.recordCopy(c, StagingWrites::kTimedBytes - 1, 1000000);
  }
  EXPECT_EQ(w.storesNsPerKiB(), 0.0);
  EXPECT_EQ(w.memcpyNsPerKiB(), 0.0);
  EXPECT_EQ(w.plainCopyNsPerKiB(), 0.0);
  EXPECT_EQ(w.streamingCopyNsPerKiB(), 0.0);
}

TEST(StagingWrites, ForcedPoliciesNeverChange) {
  StagingWrites stores(StagingWrites::Policy::Stores), memcpy(StagingWrites::Policy::Memcpy);
  auto slowStores = [](CopyMode m) { return m == CopyMode::Handoff ? 1000 : 9000; };
  EXPECT_EQ(count(run(stores, 100, slowStores), CopyMode::Cached), 100);
  EXPECT_EQ(count(run(memcpy, 100, [](CopyMode m) { return m == CopyMode::Handoff ? 9000 : 1000; }),
                  CopyMode::Handoff),
            100);
  EXPECT_EQ(memcpy.next(64), CopyMode::Handoff);  // whatever the size
  EXPECT_FALSE(stores.timed(kBytes));             // and nothing is timed
  EXPECT_FALSE(memcpy.timed(kBytes));
}

// The same for `n` copies of kBytes into staging.
template <typename F>
std::vector<CopyMode> runCopies(StagingWrites& w, int n, F costNs) {
  return run(w, n, costNs, true);
}

TEST(StagingCopies, StreamOnlyWhereTheWritesGainMoreThanTheReadersPay) {
  // Two complexes: plain stores take every line back from the other cache, 2.3x streaming's time.
  StagingWrites far;
  auto ways = runCopies(far, 2 * StagingWrites::kWarmUp + 4 * StagingWrites::kExplore,
                        [](CopyMode m) { return m == CopyMode::Streaming ? 1000 : 2300; });
  for (uint32_t i = 0; i < 2 * StagingWrites::kWarmUp; ++i)  // the warm-up alternates, plain first
    EXPECT_EQ(ways[i], i % 2 == 0 ? CopyMode::Cached : CopyMode::Streaming) << i;
  EXPECT_TRUE(far.copiesStream());
  EXPECT_EQ(far.nextCopy(kBytes), CopyMode::Streaming);
  EXPECT_GE(count(ways, CopyMode::Streaming, 2 * StagingWrites::kWarmUp), 4 * StagingWrites::kExplore - 2);
  // The streaming estimate carries the readers' share.
  EXPECT_NEAR(far.streamingCopyNsPerKiB(), 1000.0 * 1024 / kBytes * StagingWrites::kStreamingReadFactor,
              1e-9);
  EXPECT_NEAR(far.plainCopyNsPerKiB(), 2300.0 * 1024 / kBytes, 1e-9);
  // One complex: streaming writes 10% faster for the writer, but the readers would fetch the lines
  // from memory instead of the shared cache: plain.
  StagingWrites near;
  ways = runCopies(near, 2 * StagingWrites::kWarmUp + 4 * StagingWrites::kExplore,
                   [](CopyMode m) { return m == CopyMode::Streaming ? 900 : 1000; });
  EXPECT_FALSE(near.copiesStream());
  EXPECT_GE(count(ways, CopyMode::Cached, 2 * StagingWrites::kWarmUp), 4 * StagingWrites::kExplore - 2);
}

TEST(StagingCopies, TheReadersMeasuredShareReplacesTheFactor) {
  StagingWrites w;
  const double perKiB = 1024.0 / kBytes;
  EXPECT_EQ(w.readPenaltyNsPerKiB(kBytes), -1);
  // Plain blocks read, streamed ones not yet: still unknown.
  w.recordRead(false, kBytes, 1000);
  EXPECT_EQ(w.readPenaltyNsPerKiB(kBytes), -1);
  w.recordRead(true, kBytes, 3000);
  EXPECT_NEAR(w.readPenaltyNsPerKiB(kBytes), 2000 * perKiB, 1e-9);
  // By size class: powers of two from kTimedBytes; nothing below it is kept.
  EXPECT_NEAR(w.readPenaltyNsPerKiB(kBytes + kBytes / 2), 2000 * perKiB, 1e-9);
  EXPECT_EQ(w.readPenaltyNsPerKiB(2 * kBytes), -1);
  EXPECT_EQ(w.readPenaltyNsPerKiB(kBytes / 2), -1);
  w.recordRead(false, StagingWrites::kTimedBytes - 1, 10);
  w.recordRead(true, StagingWrites::kTimedBytes - 1, 100000);
  EXPECT_EQ(w.readPenaltyNsPerKiB(StagingWrites::kTimedBytes - 1), -1);
  // The first samples' least is the estimate; then each moves it half way.
  w.recordRead(true, kBytes, 2000);  // second sample: the least, 2000
  EXPECT_NEAR(w.readPenaltyNsPerKiB(kBytes), 1000 * perKiB, 1e-9);
  w.recordRead(true, kBytes, 4000);  // 2000 + (4000 - 2000) / 2
  EXPECT_NEAR(w.readPenaltyNsPerKiB(kBytes), 2000 * perKiB, 1e-9);
  // Streamed blocks read faster than plain ones count as no penalty.
  StagingWrites faster;
  faster.recordRead(false, kBytes, 3000);
  faster.recordRead(true, kBytes, 1000);
  EXPECT_EQ(faster.readPenaltyNsPerKiB(kBytes), 0);
  // A streaming copy's time counts the measured share, not the factor.
  StagingWrites copies;
  copies.recordRead(false, kBytes, 1000);
  copies.recordRead(true, kBytes, 4000);
  copies.recordCopy(CopyMode::Streaming, kBytes, 1000);
  EXPECT_NEAR(copies.streamingCopyNsPerKiB(), (1000 + 3000) * perKiB, 1e-9);
  copies.recordCopy(CopyMode::Cached, kBytes, 2000);
  EXPECT_NEAR(copies.plainCopyNsPerKiB(), 2000 * perKiB, 1e-9);
  // What the readers published wins over this rank's own measure.
  StagingWrites published;
  published.recordRead(false, kBytes, 1000);
  published.recordRead(true, kBytes, 4000);
  published.recordCopy(CopyMode::Streaming, kBytes, 1000, 500 * perKiB);
  EXPECT_NEAR(published.streamingCopyNsPerKiB(), (1000 + 500) * perKiB, 1e-9);
  StagingWrites rootOnly;  // a broadcast's root: nothing read, the readers' figure only
  rootOnly.recordCopy(CopyMode::Streaming, kBytes, 1000, 2000 * perKiB);
  EXPECT_NEAR(rootOnly.streamingCopyNsPerKiB(), (1000 + 2000) * perKiB, 1e-9);
  // Reductions' reads are compared among themselves only, and averaged with the copies'.
  StagingWrites mixed;
  mixed.recordRead(false, kBytes, 1000);       // a copy
  mixed.recordRead(true, kBytes, 9000, true);  // a reduction
  EXPECT_EQ(mixed.readPenaltyNsPerKiB(kBytes), -1);
  mixed.recordRead(false, kBytes, 5000, true);
  EXPECT_NEAR(mixed.readPenaltyNsPerKiB(kBytes), 4000 * perKiB, 1e-9);
  mixed.recordRead(true, kBytes, 3000);
  EXPECT_NEAR(mixed.readPenaltyNsPerKiB(kBytes), (4000 + 2000) / 2.0 * perKiB, 1e-9);
  // Fixed copies are not timed, and neither are the reads.
  StagingWrites fixed(StagingWrites::Policy::Auto, StagingWrites::CopyPolicy::Plain);
  fixed.recordRead(false, kBytes, 1000);
  fixed.recordRead(true, kBytes, 4000);
  EXPECT_EQ(fixed.readPenaltyNsPerKiB(kBytes), -1);
}

TEST(StagingCopies, ReadsAreTimedAtThePeersTriesAndOneInEightOtherwise) {
  StagingWrites w;
  EXPECT_FALSE(w.readTimed(false, StagingWrites::kTimedBytes - 1));  // too short to tell
  // The first kWarmUp plain reads, then one in kReadSample.
  int timed = 0;
  for (int i = 0; i < 2 + 8 * static_cast<int>(StagingWrites::kReadSample); ++i) {
    if (!w.readTimed(false, kBytes)) continue;
    ++timed;
    w.recordRead(false, kBytes, 1000);
  }
  EXPECT_EQ(timed, 2 + 8);
  // A block streamed (a peer's try) is timed, and so is the plain one after it.
  EXPECT_TRUE(w.readTimed(true, kBytes));
  EXPECT_TRUE(w.readTimed(false, kBytes));
  EXPECT_FALSE(w.readTimed(false, kBytes));
  // Where the copies are fixed, nothing is.
  StagingWrites fixed(StagingWrites::Policy::Auto, StagingWrites::CopyPolicy::Streaming);
  EXPECT_FALSE(fixed.readTimed(true, kBytes));
  EXPECT_FALSE(fixed.readTimed(false, kBytes));
}

TEST(StagingCopies, WritesCheaperForTheWriterStayPlainWhereTheReadersPayMore) {
  // The near placement of 2026-12-07 (2 ranks, 16 KiB blocks): a streaming copy cost its writer
  // ~0.6 of a plain one, which the factor of 1.5 let through, and its reader ~2x as much again.
  auto copyCost = [](CopyMode m) { return m == CopyMode::Streaming ? 600 : 1000; };
  StagingWrites unmeasured;
  runCopies(unmeasured, 2 * StagingWrites::kWarmUp + 4 * StagingWrites::kExplore, copyCost);
  EXPECT_TRUE(unmeasured.copiesStream());  // 600 x 1.5 < 1000
  StagingWrites measured;
  for (int i = 0; i < 4; ++i) {
    measured.recordRead(false, kBytes, 1000);
    measured.recordRead(true, kBytes, 2300);
  }
  auto ways = runCopies(measured, 2 * StagingWrites::kWarmUp + 4 * StagingWrites::kExplore, copyCost);
  EXPECT_FALSE(measured.copiesStream());  // 600 + 1300 > 1000
  EXPECT_GE(count(ways, CopyMode::Cached, 2 * StagingWrites::kWarmUp), 4 * StagingWrites::kExplore - 2);
  // The far placement: plain copies take every line back from the other complex, 6x streaming's
  // time: streaming, readers' share and all.
  StagingWrites far;
  for (int i = 0; i < 4; ++i) {
    far.recordRead(false, kBytes, 1000);
    far.recordRead(true, kBytes, 2300);
  }
  runCopies(far, 2 * StagingWrites::kWarmUp + 4 * StagingWrites::kExplore,
            [](CopyMode m) { return m == CopyMode::Streaming ? 600 : 4000; });
  EXPECT_TRUE(far.copiesStream());
}

TEST(StagingCopies, ReductionsStreamWhileTheCopiesDo) {
  StagingWrites w;
  bool twoComplexes = false;
  auto copyCost = [&](CopyMode m) {
    if (twoComplexes) return m == CopyMode::Streaming ? 1000 : 2300;
    return m == CopyMode::Streaming ? 1000 : 800;
  };
  run(w, 20, [](CopyMode m) { return m == CopyMode::Handoff ? 1100 : 1000; });
  runCopies(w, 20, copyCost);
  ASSERT_EQ(w.current(), CopyMode::Cached);
  ASSERT_FALSE(w.copiesStream());
  EXPECT_EQ(w.next(kBytes), CopyMode::Cached);
  // The vCPUs move apart: the copies stream within a few, and the reductions with them, untimed.
  twoComplexes = true;
  runCopies(w, 8, copyCost);
  ASSERT_TRUE(w.copiesStream());
  EXPECT_EQ(w.next(kBytes), CopyMode::Streaming);
  EXPECT_FALSE(w.timed(kBytes));
  EXPECT_EQ(w.next(StagingWrites::kTimedBytes - 1), CopyMode::Cached);  // small ones as ever
  // A streaming reduction's time is not taken for the stores' or memcpy's.
  const double stores = w.storesNsPerKiB(), memcpy = w.memcpyNsPerKiB();
  w.record(CopyMode::Streaming, kBytes, 50000);
  EXPECT_EQ(w.storesNsPerKiB(), stores);
  EXPECT_EQ(w.memcpyNsPerKiB(), memcpy);
  // And back: at the plain copies' next tries the copies go plain, the reductions back to the
  // way their own timings chose.
  twoComplexes = false;
  runCopies(w, 4 * static_cast<int>(TimedChoice::kMaxExplore), copyCost);
  EXPECT_FALSE(w.copiesStream());
  EXPECT_EQ(w.next(kBytes), CopyMode::Cached);
  EXPECT_TRUE(w.timed(kBytes));
}

// A copy that writes the rank's own output in the same pass (the staged all-gather's own block)
// costs both writes: its two ways are timed apart from the copies into staging alone, and neither
// moves the other. Here the copies alone stream (far placement: plain 2.3x) while the copies beside
// the output are plainer (their streaming way 1.8x the plain one, readers' share included).
TEST(StagingCopies, CopiesBesideTheOwnOutputAreTimedApart) {
  StagingWrites w;
  const uint32_t n = 2 * StagingWrites::kWarmUp + 4 * StagingWrites::kExplore;
  uint32_t plainBeside = 0, streamingAlone = 0;
  for (uint32_t i = 0; i < n; ++i) {  // interleaved, as an allreduce and an all-gather would be
    const CopyMode alone = w.nextCopy(kBytes);
    streamingAlone += alone == CopyMode::Streaming;
    w.recordCopy(alone, kBytes, alone == CopyMode::Streaming ? 1000 : 2300, 0);
    const CopyMode beside = w.nextCopy(kBytes, true);
    plainBeside += beside == CopyMode::Cached;
    w.recordCopy(beside, kBytes, beside == CopyMode::Streaming ? 3600 : 2000, 0, true);
  }
  EXPECT_TRUE(w.copiesStream());
  EXPECT_EQ(w.nextCopy(kBytes), CopyMode::Streaming);
  EXPECT_EQ(w.nextCopy(kBytes, true), CopyMode::Cached);
  EXPECT_GE(streamingAlone, n - 2 * StagingWrites::kWarmUp - 2);
  EXPECT_GE(plainBeside, n - 2 * StagingWrites::kWarmUp - 2);
  const double perKiB = 1024.0 / kBytes;
  EXPECT_NEAR(w.plainCopyNsPerKiB(), 2300 * perKiB, 1e-9);
  EXPECT_NEAR(w.streamingCopyNsPerKiB(), 1000 * perKiB, 1e-9);
  EXPECT_NEAR(w.plainCopyNsPerKiB(true), 2000 * perKiB, 1e-9);
  EXPECT_NEAR(w.streamingCopyNsPerKiB(true), 3600 * perKiB, 1e-9);
  // Forced policies hold for them too, and small ones are plain and untimed.
  StagingWrites streaming(StagingWrites::Policy::Auto, StagingWrites::CopyPolicy::Streaming);
  EXPECT_EQ(streaming.nextCopy(kBytes, true), CopyMode::Streaming);
  EXPECT_EQ(w.nextCopy(StagingWrites::kTimedBytes - 1, true), CopyMode::Cached);
}

TEST(StagingCopies, ForcedPoliciesNeverChange) {
  using P = StagingWrites::Policy;
  using C = StagingWrites::CopyPolicy;
  StagingWrites plain(P::Auto, C::Plain), streaming(P::Auto, C::Streaming);
  EXPECT_EQ(count(runCopies(plain, 100, [](CopyMode m) { return m == CopyMode::Streaming ? 100 : 9000; }),
                  CopyMode::Cached),
            100);
  EXPECT_EQ(count(runCopies(streaming, 100, [](CopyMode m) { return m == CopyMode::Streaming ? 9000 : 100; }),
                  CopyMode::Streaming),
            100);
  EXPECT_FALSE(plain.copyTimed(kBytes));
  EXPECT_FALSE(streaming.copyTimed(kBytes));
  EXPECT_EQ(streaming.nextCopy(64), CopyMode::Streaming);  // whatever the size
  EXPECT_TRUE(streaming.copiesStream());
  // Reductions left to auto follow the copies; a forced reduction policy holds.
  EXPECT_EQ(streaming.next(kBytes), CopyMode::Streaming);
  EXPECT_EQ(plain.next(kBytes), CopyMode::Cached);
  EXPECT_EQ(StagingWrites(P::Stores, C::Streaming).next(kBytes), CopyMode::Cached);
  EXPECT_EQ(StagingWrites(P::Memcpy, C::Streaming).next(kBytes), CopyMode::Handoff);
  StagingWrites streamingReductions(P::Streaming);
  EXPECT_EQ(streamingReductions.next(64), CopyMode::Streaming);
  EXPECT_FALSE(streamingReductions.timed(kBytes));
  EXPECT_EQ(streamingReductions.nextCopy(kBytes), CopyMode::Cached);  // the copies still timed
  EXPECT_TRUE(streamingReductions.copyTimed(kBytes));
}

}  // namespace
