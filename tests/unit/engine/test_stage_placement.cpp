// engine::StagePlacement: where each chunk goes in a rank's staging area. A long call's chunks
// alternate between slots 0 and 1; a short call's are packed one after another through the whole
// area, so back-to-back short calls rewrite a line only once they have walked through all of it;
// and no chunk ever overlaps the chunk before it, whatever the mix of calls and sizes (a slower
// peer may still be reading that one). Which calls pack (algo::stagingPacks) and the data through
// the area: soak.short_staged_slots and collectives_processes_*_staged_slots in tests/multirank.
#include <gtest/gtest.h>

#include <cstddef>
#include <random>
#include <vector>

#include "engine/stage_placement.hpp"
#include "transports/shm/shm_group.hpp"

using chorus::engine::StagePlacement;
using chorus::transport::kStageSlots;

namespace {

constexpr size_t K = 1024;

TEST(StagePlacement, FourSlotsOfHalfTheStagingSize) { EXPECT_EQ(kStageSlots, 4); }

TEST(StagePlacement, LongCallsAlternateBetweenTheFirstTwoSlots) {
  StagePlacement p(512 * K, kStageSlots);
  std::vector<size_t> got;
  for (int i = 0; i < 5; ++i) got.push_back(p.nextSlot());
  EXPECT_EQ(got, (std::vector<size_t>{0, 512 * K, 0, 512 * K, 0}));
}

TEST(StagePlacement, ShortCallsWalkThroughTheWholeArea) {
  StagePlacement p(512 * K, kStageSlots);
  std::vector<size_t> got;
  for (int i = 0; i < 17; ++i) got.push_back(p.nextPacked(128 * K));
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(got[i], i * 128 * K) << "chunk " << i;
  EXPECT_EQ(got[16], 0u) << "back at the start once the area (2 MiB) is used up";
}

TEST(StagePlacement, PackedChunksTakeWholePages) {
  StagePlacement p(512 * K, kStageSlots);
  EXPECT_EQ(p.nextPacked(100), 0u);
  EXPECT_EQ(p.nextPacked(4096), 4096u);
  EXPECT_EQ(p.nextPacked(4097), 8192u);
  EXPECT_EQ(p.nextPacked(0), 16384u);
  EXPECT_EQ(p.nextPacked(1), 20480u);
}

TEST(StagePlacement, LongCallAfterShortOnesTakesAFreeSlot) {
  StagePlacement p(512 * K, kStageSlots);
  p.nextPacked(256 * K);
  EXPECT_EQ(p.nextPacked(512 * K), 256 * K);  // over slots 0 and 1
  EXPECT_EQ(p.nextSlot(), 1024 * K) << "slots 0 and 1 overlap the chunk before";
  EXPECT_EQ(p.nextSlot(), 0u);
  EXPECT_EQ(p.nextSlot(), 512 * K);
  // A packed chunk after a long call's follows its slot.
  EXPECT_EQ(p.nextPacked(64 * K), 1024 * K);
  EXPECT_EQ(p.nextSlot(), 0u);
}

TEST(StagePlacement, ShortCallWrappingOntoTheChunkBeforeGoesAfterIt) {
  StagePlacement p(512 * K, kStageSlots);
  for (int i = 0; i < 3; ++i) p.nextPacked(512 * K);  // up to 1.5 MiB
  EXPECT_EQ(p.nextPacked(400 * K), 1536 * K);
  EXPECT_EQ(p.nextPacked(300 * K), 0u);  // 1.9 MiB + 300 KiB does not fit
  EXPECT_EQ(p.nextPacked(512 * K), 300 * K) << "at 0 it would overlap the chunk before";
}

// Any mix of long and short calls, chunk sizes and slot sizes (pages or not): every chunk lies in
// the area and never overlaps the chunk before; a long call's chunk either starts where the one
// two chunks before did or does not overlap it (the allreduce's pipeline relies on it).
TEST(StagePlacement, NoChunkOverlapsTheChunkBefore) {
  std::mt19937_64 rng(7);
  for (size_t slot : {size_t{4096}, 32 * K, 100000 + size_t{13}, 512 * K}) {
    StagePlacement p(slot, kStageSlots);
    size_t lastAt = 0, lastLen = 0, twoBefore = 0;
    bool lastLong = false, twoBeforeLong = false;
    for (int i = 0; i < 200000; ++i) {
      const bool isLong = rng() % 3 == 0;
      const size_t bytes = 1 + rng() % slot;
      const size_t at = isLong ? p.nextSlot() : p.nextPacked(bytes);
      const size_t len = isLong ? slot : bytes;
      ASSERT_LE(at + len, p.area()) << "slot " << slot << ", chunk " << i;
      ASSERT_TRUE(lastLen == 0 || at + len <= lastAt || lastAt + lastLen <= at)
          << "slot " << slot << ", chunk " << i << " at " << at << " (" << len
          << " B) overlaps the one before at " << lastAt << " (" << lastLen << " B)";
      if (isLong) {
        ASSERT_EQ(at % slot, 0u);
        if (lastLong && twoBeforeLong) {
          ASSERT_TRUE(at == twoBefore || at + slot <= twoBefore || twoBefore + slot <= at)
              << "slot " << slot << ", chunk " << i;
        }
      }
      twoBefore = lastAt;
      twoBeforeLong = lastLong;
      lastAt = at;
      const size_t pages = (bytes + 4095) / 4096 * 4096;
      lastLen = isLong ? slot : (pages <= slot ? pages : bytes);
      lastLong = isLong;
    }
  }
}

}  // namespace
