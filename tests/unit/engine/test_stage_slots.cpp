// engine::nextStageSlot: which staging slot each chunk uses. Chunks taking turns in two slots
// alternate between slots 0 and 1; in all four they rotate, so back-to-back short calls rewrite a
// slot only every fourth chunk; and no chunk ever takes the slot of the chunk before it, whatever the
// mix of calls (a slower peer may still be reading that one). Which calls rotate (algo::stageSlotsFor)
// and the data through the slots: soak.short_staged_slots and collectives_processes_*_staged_slots
// in tests/multirank.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "engine/shm_sync.hpp"

using chorus::engine::nextStageSlot;
using chorus::transport::kStageSlots;

namespace {

// The slots of a sequence of calls, each {chunks, slots taken in turn}, from ShmSync's start.
std::vector<int> slotsOf(const std::vector<std::pair<int, int>>& calls) {
  std::vector<int> out;
  int slot = 1;
  for (auto [chunks, slots] : calls) {
    for (int i = 0; i < chunks; ++i) out.push_back(slot = nextStageSlot(slot, slots));
  }
  return out;
}

TEST(StageSlots, FourSlotsOfHalfTheStagingSize) { EXPECT_EQ(kStageSlots, 4); }

TEST(StageSlots, RotatingCallsGoThroughEverySlot) {
  EXPECT_EQ(slotsOf({{1, 4}, {1, 4}, {1, 4}, {1, 4}, {1, 4}, {1, 4}}), (std::vector<int>{2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(slotsOf({{2, 4}, {2, 4}, {2, 4}}), (std::vector<int>{2, 3, 0, 1, 2, 3}));
}

TEST(StageSlots, OtherCallsAlternateBetweenTheFirstTwo) {
  EXPECT_EQ(slotsOf({{3, 2}}), (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(slotsOf({{5, 2}, {4, 2}}), (std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1, 0}));
  EXPECT_EQ(slotsOf({{1, 2}, {1, 2}, {1, 2}}), (std::vector<int>{0, 1, 0}));
}

TEST(StageSlots, NoChunkTakesTheSlotOfTheChunkBefore) {
  for (int last = 0; last < kStageSlots; ++last) {
    for (int slots : {2, kStageSlots}) {
      const int next = nextStageSlot(last, slots);
      EXPECT_NE(next, last) << "from slot " << last << ", taking turns in " << slots;
      EXPECT_GE(next, 0);
      EXPECT_LT(next, slots);
    }
  }
  // Calls of both kinds mixed: a two-slot call after rotating ones starts in slot 0 or 1.
  EXPECT_EQ(slotsOf({{1, 4}, {1, 4}, {3, 2}}), (std::vector<int>{2, 3, 0, 1, 0}));
  EXPECT_EQ(slotsOf({{1, 4}, {3, 2}, {2, 4}, {2, 2}}), (std::vector<int>{2, 0, 1, 0, 1, 2, 0, 1}));
}

}  // namespace
