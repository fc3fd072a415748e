// engine::OutputStores: plain or streaming stores for the outputs the staged all-gather, allreduce
// and all-to-all copy out, chosen by each rank from its own timings (made-up ones here): each size class
// and collective on its own, the preferred way first, the faster one kept; small outputs, other
// collectives and an untimed instance (CHORUS_NT_STORE_BYTES set) always take the preferred way.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/output_stores.hpp"

using namespace chorus;
using namespace chorus::engine;
using kernels::CopyMode;

namespace {

constexpr size_t M = size_t{1} << 20;

// Runs `n` calls of `kind` writing `bytes`, the preferred way `preferred`, each costing what
// `costNs` says for the way chosen; returns the ways.
template <typename F>
std::vector<CopyMode> run(OutputStores& s, OpKind kind, size_t bytes, CopyMode preferred, int n, F costNs) {
  std::vector<CopyMode> ways;
  for (int i = 0; i < n; ++i) {
    const CopyMode m = s.next(kind, bytes, preferred);
    ways.push_back(m);
    s.record(kind, bytes, m, costNs(m));
  }
  return ways;
}

int count(const std::vector<CopyMode>& ways, CopyMode m, size_t from = 0) {
  int c = 0;
  for (size_t i = from; i < ways.size(); ++i) c += ways[i] == m;
  return c;
}

constexpr int kWarm = 2 * TimedChoice::kWarmUp;

TEST(OutputStores, StreamsFirstAndKeepsTheFasterWay) {
  OutputStores s;
  // Streaming 1.7x faster (4-rank all-gather of 2 MiB on the AVX2 EPYC VM).
  auto ways = run(s, OpKind::AllGather, 2 * M, CopyMode::Streaming, kWarm + 4 * TimedChoice::kExplore,
                  [](CopyMode m) { return m == CopyMode::Streaming ? 600000 : 1000000; });
  for (int i = 0; i < kWarm; ++i)
    EXPECT_EQ(ways[i], i % 2 == 0 ? CopyMode::Streaming : CopyMode::Cached) << i;
  EXPECT_EQ(s.current(OpKind::AllGather, 2 * M), CopyMode::Streaming);
  // Once warm, plain stores only as the rare tries (TimedChoice's backing off).
  EXPECT_LE(count(ways, CopyMode::Cached, kWarm), 3);
  EXPECT_NEAR(s.nsPerKiB(OpKind::AllGather, 2 * M, CopyMode::Streaming), 600000.0 * 1024 / (2 * M), 1e-6);
  EXPECT_NEAR(s.nsPerKiB(OpKind::AllGather, 2 * M, CopyMode::Cached), 1000000.0 * 1024 / (2 * M), 1e-6);
}

TEST(OutputStores, TurnsToPlainStoresWhereStreamingIsSlower) {
  OutputStores s;
  // Streaming 1.7x slower (the Zen 5 EPYC VM's 4-rank all-gather of 8 MiB).
  auto ways = run(s, OpKind::AllReduce, 8 * M, CopyMode::Streaming, kWarm + 2 * TimedChoice::kExplore,
                  [](CopyMode m) { return m == CopyMode::Streaming ? 1700000 : 1000000; });
  EXPECT_EQ(s.current(OpKind::AllReduce, 8 * M), CopyMode::Cached);
  EXPECT_GE(count(ways, CopyMode::Cached, kWarm), 2 * static_cast<int>(TimedChoice::kExplore) - 2);
}

TEST(OutputStores, ClassesAndCollectivesAreTimedApart) {
  OutputStores s;
  run(s, OpKind::AllGather, 4 * M, CopyMode::Streaming, kWarm + 4,
      [](CopyMode m) { return m == CopyMode::Streaming ? 100 : 300; });
  run(s, OpKind::AllGather, 16 * M, CopyMode::Streaming, kWarm + 4,
      [](CopyMode m) { return m == CopyMode::Streaming ? 300 : 100; });
  EXPECT_EQ(s.current(OpKind::AllGather, 4 * M), CopyMode::Streaming);
  EXPECT_EQ(s.current(OpKind::AllGather, 4 * M + 12345), CopyMode::Streaming);  // the same log2 class
  EXPECT_EQ(s.current(OpKind::AllGather, 16 * M), CopyMode::Cached);
  // Nothing learnt for the allreduce or the all-to-all of the same size: their first call takes the
  // preferred way; the all-to-all's own timings stay its own.
  EXPECT_FALSE(s.current(OpKind::AllReduce, 4 * M).has_value());
  EXPECT_EQ(s.next(OpKind::AllReduce, 4 * M, CopyMode::Cached), CopyMode::Cached);
  EXPECT_FALSE(s.current(OpKind::AllToAll, 4 * M).has_value());
  run(s, OpKind::AllToAll, 4 * M, CopyMode::Streaming, kWarm + 4,
      [](CopyMode m) { return m == CopyMode::Streaming ? 300 : 100; });
  EXPECT_EQ(s.current(OpKind::AllToAll, 4 * M), CopyMode::Cached);
  EXPECT_EQ(s.current(OpKind::AllGather, 4 * M), CopyMode::Streaming);
}

TEST(OutputStores, UntimedCallsTakeThePreferredWay) {
  OutputStores s;
  const auto slowStreaming = [](CopyMode m) { return m == CopyMode::Streaming ? 900 : 100; };
  // Too small to time, or a collective that is not timed.
  EXPECT_FALSE(s.timed(OpKind::AllGather, OutputStores::kTimedBytes - 1));
  EXPECT_TRUE(s.timed(OpKind::AllGather, OutputStores::kTimedBytes));
  EXPECT_FALSE(s.timed(OpKind::ReduceScatter, 64 * M));
  for (CopyMode m :
       run(s, OpKind::AllGather, OutputStores::kTimedBytes - 1, CopyMode::Streaming, 40, slowStreaming))
    EXPECT_EQ(m, CopyMode::Streaming);
  for (CopyMode m : run(s, OpKind::Broadcast, 64 * M, CopyMode::Streaming, 40, slowStreaming))
    EXPECT_EQ(m, CopyMode::Streaming);
  // CHORUS_NT_STORE_BYTES set: the threshold alone, whatever the timings say.
  OutputStores fixed(false);
  EXPECT_FALSE(fixed.timed(OpKind::AllReduce, 64 * M));
  for (CopyMode m : run(fixed, OpKind::AllReduce, 64 * M, CopyMode::Streaming, 40, slowStreaming))
    EXPECT_EQ(m, CopyMode::Streaming);
  EXPECT_FALSE(fixed.current(OpKind::AllReduce, 64 * M).has_value());
}

}  // namespace
