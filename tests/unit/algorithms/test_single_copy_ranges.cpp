// Where heap buffers are read in place (src/algorithms/single_copy.cpp): the out-of-place allreduce
// stops where staging would stream the output (the non-temporal threshold, topo::ntStoreBytes()),
// because the kernel's copy cannot stream. Each test runs in its own process (gtest_discover_tests), so the
// variables it sets are read fresh.
#include <gtest/gtest.h>

#include <cstdlib>

#include "algorithms/common.hpp"
#include "topology/cache_thresholds.hpp"

using namespace chorus;
using namespace chorus::algo;

namespace {

constexpr size_t K = 1024, M = K * K;

void fourMiBThreshold() {
  unsetenv("CHORUS_CMA");
  setenv("CHORUS_NT_STORE_BYTES", "4M", 1);
  ASSERT_EQ(topo::ntStoreBytes(), 4 * M);
}

TEST(SingleCopyRanges, AllReduceOutOfPlaceStopsWhereStagingStreamsTheOutput) {
  fourMiBThreshold();
  EXPECT_TRUE(pullingPays(OpKind::AllReduce, 256 * K, false));
  EXPECT_TRUE(pullingPays(OpKind::AllReduce, 2 * M, false));
  EXPECT_FALSE(pullingPays(OpKind::AllReduce, 4 * M, false));
  EXPECT_FALSE(pullingPays(OpKind::AllReduce, 16 * M, false));
  // In place nothing is streamed: the range stays.
  EXPECT_TRUE(pullingPays(OpKind::AllReduce, 16 * M, true));
  EXPECT_FALSE(pullingPays(OpKind::AllReduce, 2 * M, true));
  EXPECT_TRUE(singleCopyPays(OpKind::AllGather, 8 * M, 16 * M)) << "all_gather keeps its range";
}

TEST(SingleCopyRanges, TheRangesFollowTheThreshold) {
  unsetenv("CHORUS_CMA");
  setenv("CHORUS_NT_STORE_BYTES", "64M", 1);
  EXPECT_TRUE(pullingPays(OpKind::AllReduce, 16 * M, false));
  EXPECT_FALSE(pullingPays(OpKind::AllReduce, 32 * M, false)) << "out of place up to 16 MiB at most";
}

// The allreduce, all-gather and reduce-scatter are timed by rank 0 at every size from their lower
// bounds (both ways tried: which wins follows where the host runs the ranks); the ranges only say
// which way goes first. Broadcast keeps its range.
TEST(SingleCopyRanges, TheTimedCollectivesHaveNoUpperBound) {
  unsetenv("CHORUS_CMA");
  setenv("CHORUS_NT_STORE_BYTES", "4M", 1);
  EXPECT_FALSE(singleCopyPays(OpKind::AllReduce, 128 * K, 128 * K));
  EXPECT_TRUE(singleCopyPays(OpKind::AllReduce, 256 * M, 256 * M));
  EXPECT_FALSE(singleCopyPays(OpKind::AllGather, 8 * K, 16 * K));
  EXPECT_TRUE(singleCopyPays(OpKind::AllGather, 128 * M, 256 * M));
  EXPECT_TRUE(singleCopyPays(OpKind::ReduceScatter, 256 * M, 128 * M));
  EXPECT_TRUE(allGatherPullsFirst(32 * M));
  EXPECT_FALSE(allGatherPullsFirst(64 * M)) << "staging streams large outputs: it goes first";
  EXPECT_FALSE(pullingPays(OpKind::AllReduce, 256 * M, false));
  EXPECT_FALSE(singleCopyPays(OpKind::Broadcast, 4 * M, 4 * M)) << "broadcast keeps its range";
}

TEST(SingleCopyRanges, ASizeForcesItEverywhere) {
  setenv("CHORUS_CMA", "1K", 1);
  setenv("CHORUS_NT_STORE_BYTES", "4M", 1);
  EXPECT_TRUE(pullingPays(OpKind::AllReduce, 16 * M, false));
}

}  // namespace
