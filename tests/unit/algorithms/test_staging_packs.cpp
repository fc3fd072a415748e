// Which staged calls are packed through the whole staging area (algo::stagingPacks,
// src/algorithms/common.hpp), by the host's ranks per core and the chunks a call takes: the policy
// the measurements in docs/performance.md ("Staging slots") chose.
#include <gtest/gtest.h>

#include "algorithms/common.hpp"

using namespace chorus::algo;

namespace {

// A core each: every call of the broadcast, reduce, reduce-scatter and all-to-all (Always), the
// calls of one or two chunks of the allreduce and all-gather (ShortCalls).
TEST(StagingPacks, WithACoreEachEveryCallOrTheShortOnes) {
  for (size_t chunks : {1, 2, 3, 64}) {
    EXPECT_TRUE(stagingPacks(1, chunks, Packing::Always)) << chunks << " chunks";
    EXPECT_EQ(stagingPacks(1, chunks, Packing::ShortCalls), chunks <= 2) << chunks << " chunks";
    EXPECT_FALSE(stagingPacks(1, chunks, Packing::None)) << chunks << " chunks";
  }
}

// Two ranks a core: only the short calls of the collectives that pack every call (4 ranks on 2
// cores: those 1.05-1.8x faster packed, their long calls and the allreduce's short ones slower).
TEST(StagingPacks, TwoRanksACorePackOnlyTheShortCallsOfAlways) {
  for (size_t chunks : {1, 2, 3, 64}) {
    EXPECT_EQ(stagingPacks(2, chunks, Packing::Always), chunks <= 2) << chunks << " chunks";
    EXPECT_FALSE(stagingPacks(2, chunks, Packing::ShortCalls)) << chunks << " chunks";
    EXPECT_FALSE(stagingPacks(2, chunks, Packing::None)) << chunks << " chunks";
  }
}

// More ranks a core (8 ranks on 2 cores: packed short calls 1.1-1.5x slower), or no verdict
// published (0): nothing packs.
TEST(StagingPacks, MoreRanksACoreOrNoVerdictPackNothing) {
  for (int perCore : {0, 3, 4, 16}) {
    for (size_t chunks : {1, 2, 3, 64}) {
      for (Packing p : {Packing::None, Packing::ShortCalls, Packing::Always}) {
        EXPECT_FALSE(stagingPacks(perCore, chunks, p)) << perCore << " ranks a core, " << chunks << " chunks";
      }
    }
  }
}

}  // namespace
