// engine::SingleCopyChoice: single copy or staging for the allreduce, decided by rank 0. Fed
// made-up timings: under Policy::Ranges the verdict is the ranges' answer and never moves; timed,
// it tries the ranges' way first, then each way twice, keeps the faster and tries the other every
// kExplore-th call; sizes of one power of two share a class, other sizes and the in-place case
// do not; following a verdict counts the calls each way. And TimedChoice, the timing under both
// it and StagingWrites: how often it tries the slower way.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/single_copy_choice.hpp"

using namespace chorus::engine;
using chorus::OpKind;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Rank 0's side of `n` calls of `bytes` (no rank in place unless `inPlace`), each taking what
// `costNs(pulled)` says; returns whether each call pulled.
template <typename F>
std::vector<bool> run(SingleCopyChoice& c, size_t bytes, bool inPlace, int n, F costNs,
                      bool rangesPull = true) {
  std::vector<bool> pulled;
  for (int i = 0; i < n; ++i) {
    const uint32_t v = c.verdict(OpKind::AllReduce, bytes, rangesPull, rangesPull);
    const SingleCopyChoice::Way w = c.follow(v, inPlace);
    pulled.push_back(w.single);
    if (w.timed) c.record(OpKind::AllReduce, bytes, inPlace, w.single, costNs(w.single));
  }
  return pulled;
}

int count(const std::vector<bool>& pulled, bool value, size_t from = 0) {
  int k = 0;
  for (size_t i = from; i < pulled.size(); ++i) k += pulled[i] == value;
  return k;
}

// Runs `n` timed runs each costing costOf(way); returns the ways.
template <typename F>
std::vector<int> runTimed(TimedChoice& t, int n, F costOf) {
  std::vector<int> ways;
  for (int i = 0; i < n; ++i) {
    ways.push_back(t.next());
    t.record(ways.back(), costOf(ways.back()));
  }
  return ways;
}

TEST(TimedChoice, TriesTheSlowerWayHalfAsOftenEachTimeDownToAFloor) {
  TimedChoice t;
  auto ways = runTimed(t, 1000, [](int way) { return way == 1 ? 170.0 : 100.0; });
  // Warm-up 0, 1, 0, 1; then the tries of way 1 at runs 16, 48, 112, 240, and every 128th on.
  std::vector<size_t> tries;
  for (size_t i = 2 * TimedChoice::kWarmUp; i < ways.size(); ++i)
    if (ways[i] == 1) tries.push_back(i + 1);
  EXPECT_EQ(tries, (std::vector<size_t>{16, 48, 112, 240, 368, 496, 624, 752, 880}));
  EXPECT_EQ(t.explorePeriod(), TimedChoice::kMaxExplore);
  EXPECT_EQ(t.current(), 0);
}

TEST(TimedChoice, ATryNotSlowerBringsTheTriesBackAndASwitchFollows) {
  TimedChoice t;
  bool changed = false;
  auto cost = [&](int way) { return way == 1 ? (changed ? 60.0 : 170.0) : 100.0; };
  runTimed(t, 300, cost);
  ASSERT_EQ(t.explorePeriod(), TimedChoice::kMaxExplore);
  // Way 1 becomes faster: its next try (at most kMaxExplore runs away) is not slower, so the
  // period falls back to kExplore, and within a few more tries way 1 takes over.
  changed = true;
  runTimed(t, static_cast<int>(TimedChoice::kMaxExplore + 4 * TimedChoice::kExplore), cost);
  EXPECT_EQ(t.current(), 1);
  EXPECT_GT(t.explorePeriod(), TimedChoice::kExplore);  // way 0's tries since, found slower, back off
}

// A way's first run pays for touching its pages (measured: the first staged all-gather of 2 MiB
// at 2.5-3.5x the next ones): the least of the warm-up runs is the estimate, so a cold first run
// does not hand the choice to the slower way.
TEST(TimedChoice, AColdFirstRunDoesNotDecide) {
  TimedChoice t;
  int run = 0;
  auto ways = runTimed(t, 2 * static_cast<int>(TimedChoice::kWarmUp) + 8, [&](int way) {
    ++run;
    if (way == 1) return 150.0;
    return run == 1 ? 400.0 : 100.0;  // way 0's first run is cold
  });
  EXPECT_EQ(t.current(), 0);
  EXPECT_DOUBLE_EQ(t.cost(0), 100.0);
  for (size_t i = 2 * TimedChoice::kWarmUp; i < ways.size(); ++i) EXPECT_EQ(ways[i], 0) << "run " << i;
}

TEST(SingleCopyChoice, RangesPolicyPublishesTheRangesAnswers) {
  SingleCopyChoice c(SingleCopyChoice::Policy::Ranges);
  for (int i = 0; i < 40; ++i) {
    const uint32_t v = c.verdict(OpKind::AllReduce, kMiB, /*pullOutOfPlace=*/true, /*pullInPlace=*/false);
    EXPECT_TRUE(c.follow(v, false).single);
    EXPECT_FALSE(c.follow(v, true).single);
    c.record(OpKind::AllReduce, kMiB, false, true, 1000000);  // slow, but not timed
  }
  EXPECT_EQ(c.nsPerKiB(OpKind::AllReduce, kMiB, false, true), 0.0);
  EXPECT_EQ(c.pulledCalls(), 40u);
  EXPECT_EQ(c.stagedCalls(), 40u);
}

TEST(SingleCopyChoice, TimedTriesTheRangesWayFirstThenKeepsTheFaster) {
  SingleCopyChoice c;
  ASSERT_EQ(c.policy(), SingleCopyChoice::Policy::Timed);
  // The ranges say pull; staging is 1.5x faster (two vCPUs sharing a cache).
  auto pulled = run(c, kMiB, false, 4 + 4 * TimedChoice::kExplore,
                    [](bool pull) { return pull ? uint64_t{300000} : uint64_t{200000}; });
  for (uint32_t i = 0; i < 2 * TimedChoice::kWarmUp; ++i) EXPECT_EQ(pulled[i], i % 2 == 0) << i;
  const size_t warm = 2 * TimedChoice::kWarmUp;
  // Then staging, timed one call in kStagedSample, so that single copy's first try, at the 16th
  // timed call, comes at the 45th call after the warm-up.
  EXPECT_EQ(count(pulled, true, warm), 1);
  // (The 16th timed call: 4 warming up, then 11 staged, each ending kStagedSample calls.)
  EXPECT_TRUE(pulled[warm + (TimedChoice::kExplore - 1 - warm) * SingleCopyChoice::kStagedSample]);
  EXPECT_NEAR(c.nsPerKiB(OpKind::AllReduce, kMiB, false, false), 200000.0 / 1024, 1e-9);
  EXPECT_NEAR(c.nsPerKiB(OpKind::AllReduce, kMiB, false, true), 300000.0 / 1024, 1e-9);
  // Where the ranges say stage, staging is tried first.
  SingleCopyChoice d;
  pulled = run(
      d, kMiB, false, 2, [](bool) { return uint64_t{1000}; }, /*rangesPull=*/false);
  EXPECT_EQ(pulled, (std::vector<bool>{false, true}));
}

TEST(SingleCopyChoice, SingleCopyIsTimedAlwaysStagingWhileWarmingTriedAndOneCallInFour) {
  SingleCopyChoice c;
  std::vector<SingleCopyChoice::Way> ways;
  for (int i = 0; i < 200; ++i) {
    ways.push_back(c.follow(c.verdict(OpKind::AllGather, kMiB, true, true), false));
    if (ways.back().timed)
      c.record(OpKind::AllGather, kMiB, false, ways.back().single, ways.back().single ? 300 : 100);
  }
  int stagedUntimed = 0, stagedTimed = 0;
  for (size_t i = 0; i < ways.size(); ++i) {
    if (ways[i].single) {
      EXPECT_TRUE(ways[i].timed) << i;
    } else {
      (ways[i].timed ? stagedTimed : stagedUntimed) += 1;
    }
  }
  // Past the warm-up (2 staged calls, both timed), one staged call in kStagedSample is timed.
  EXPECT_NEAR(stagedTimed - 2, (stagedTimed - 2 + stagedUntimed) / SingleCopyChoice::kStagedSample, 1);
  EXPECT_GT(stagedUntimed, 100);
  // Under Policy::Ranges nothing is timed.
  SingleCopyChoice r(SingleCopyChoice::Policy::Ranges);
  EXPECT_FALSE(r.follow(r.verdict(OpKind::AllGather, kMiB, true, true), false).timed);
}

TEST(SingleCopyChoice, SizesOfOnePowerOfTwoShareAClassInPlaceApart) {
  SingleCopyChoice c;
  // 1 MiB out of place: staging faster.
  run(c, kMiB, false, 40, [](bool pull) { return pull ? uint64_t{400000} : uint64_t{200000}; });
  // 1.5 MiB is timed with it: staged at once (per KiB, the same costs).
  EXPECT_FALSE(c.follow(c.verdict(OpKind::AllReduce, kMiB + kMiB / 2, true, true), false).single);
  // 2 MiB, and 1 MiB with a rank in place, start over with the ranges' way (pull) first.
  EXPECT_TRUE(c.follow(c.verdict(OpKind::AllReduce, 2 * kMiB, true, true), false).single);
  EXPECT_TRUE(c.follow(c.verdict(OpKind::AllReduce, kMiB, true, true), true).single);
  EXPECT_EQ(c.nsPerKiB(OpKind::AllReduce, 2 * kMiB, false, false), 0.0);
  EXPECT_EQ(c.nsPerKiB(OpKind::AllReduce, kMiB, true, false), 0.0);
  // A verdict carries both answers: out of place staged, in place pulled, in one word.
  run(c, kMiB, true, 40, [](bool pull) { return pull ? uint64_t{100000} : uint64_t{200000}; });
  const uint32_t v = c.verdict(OpKind::AllReduce, kMiB, true, true);
  // (40 calls: the next call of either class is no try.)
  EXPECT_FALSE(c.follow(v, false).single);
  EXPECT_TRUE(c.follow(v, true).single);
}

TEST(SingleCopyChoice, FollowsAPlacementChange) {
  SingleCopyChoice c;
  bool close = true;  // close: staging 1.4x faster; far: pulling 1.3x faster
  auto cost = [&](bool pull) {
    if (close) return pull ? uint64_t{280000} : uint64_t{200000};
    return pull ? uint64_t{400000} : uint64_t{520000};
  };
  run(c, 4 * kMiB, false, 40, cost);
  EXPECT_FALSE(c.follow(c.verdict(OpKind::AllReduce, 4 * kMiB, true, true), false).single);
  // The host moves the vCPUs apart: staging, in use, slows at once; pulling takes over at its next
  // exploration or the one after.
  close = false;
  auto pulled = run(c, 4 * kMiB, false, 2 * TimedChoice::kExplore + 8, cost);
  EXPECT_TRUE(c.follow(c.verdict(OpKind::AllReduce, 4 * kMiB, true, true), false)
                  .single);  // (call 81: no exploration)
  EXPECT_GE(count(pulled, true, pulled.size() - TimedChoice::kExplore),
            static_cast<int>(TimedChoice::kExplore) - 1);
}

TEST(SingleCopyChoice, EachTimedKindApartOtherKindsKeepTheRanges) {
  SingleCopyChoice c;
  EXPECT_TRUE(SingleCopyChoice::times(OpKind::AllReduce));
  EXPECT_TRUE(SingleCopyChoice::times(OpKind::AllGather));
  EXPECT_TRUE(SingleCopyChoice::times(OpKind::ReduceScatter));
  EXPECT_FALSE(SingleCopyChoice::times(OpKind::AllToAll));
  EXPECT_FALSE(SingleCopyChoice::times(OpKind::Broadcast));
  // The allreduce of 1 MiB settles on staging...
  run(c, kMiB, false, 40, [](bool pull) { return pull ? uint64_t{400000} : uint64_t{200000}; });
  // ...the all-gather of 1 MiB blocks starts over, single copy first, and settles on its own.
  std::vector<bool> pulled;
  for (int i = 0; i < 40; ++i) {
    const SingleCopyChoice::Way w = c.follow(c.verdict(OpKind::AllGather, kMiB, true, true), false);
    pulled.push_back(w.single);
    EXPECT_TRUE(w.timed);  // single copy is timed always; staging while warming up and when tried
    c.record(OpKind::AllGather, kMiB, false, w.single, w.single ? 100000 : 300000);
  }
  EXPECT_TRUE(pulled[0]);
  EXPECT_FALSE(pulled[1]);
  EXPECT_EQ(count(pulled, false), 3);  // two to warm up, one try at the 16th call
  EXPECT_NEAR(c.nsPerKiB(OpKind::AllGather, kMiB, false, true), 100000.0 / 1024, 1e-9);
  EXPECT_NEAR(c.nsPerKiB(OpKind::AllReduce, kMiB, false, true), 400000.0 / 1024, 1e-9);
  // The reduce-scatter of 1 MiB, where cross-memory attach is slow: staging first (the ranges'
  // answer given), then single copy, found faster here, kept.
  pulled.clear();
  for (int i = 0; i < 40; ++i) {
    const SingleCopyChoice::Way w = c.follow(c.verdict(OpKind::ReduceScatter, kMiB, false, false), false);
    pulled.push_back(w.single);
    c.record(OpKind::ReduceScatter, kMiB, false, w.single, w.single ? 100000 : 300000);
  }
  EXPECT_FALSE(pulled[0]);
  EXPECT_TRUE(pulled[1]);
  EXPECT_EQ(count(pulled, false), 3);
  EXPECT_NEAR(c.nsPerKiB(OpKind::ReduceScatter, kMiB, false, true), 100000.0 / 1024, 1e-9);
  // A kind not timed gets the ranges' answers, whatever was recorded.
  c.record(OpKind::AllToAll, kMiB, false, true, 1);
  EXPECT_EQ(c.nsPerKiB(OpKind::AllToAll, kMiB, false, true), 0.0);
  const uint32_t v = c.verdict(OpKind::AllToAll, kMiB, true, false);
  EXPECT_TRUE(c.follow(v, false).single);
  EXPECT_FALSE(c.follow(v, true).single);
}

TEST(SingleCopyChoice, OnlyTheRankThatGaveAVerdictTimes) {
  SingleCopyChoice c;
  // Ranks other than 0 follow rank 0's verdict and record nothing of their own.
  c.record(OpKind::AllReduce, kMiB, false, true, 5000);
  EXPECT_EQ(c.nsPerKiB(OpKind::AllReduce, kMiB, false, true), 0.0);
  EXPECT_TRUE(c.follow(1, false).single);
  EXPECT_FALSE(c.follow(1, true).single);
  EXPECT_TRUE(c.follow(2, true).single);
  EXPECT_EQ(c.pulledCalls(), 2u);
  EXPECT_EQ(c.stagedCalls(), 1u);
}

}  // namespace
