// transport::ShmGroup's words that say how a rank last wrote into its staging area and what
// reading a streamed block costs it more: two groups of one job as ranks 0 and 1 on two threads
// (set-up is collective), each reading what the other published.
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "chorus/store.hpp"
#include "transports/shm/shm_group.hpp"

using namespace chorus;
using namespace chorus::transport;

namespace {

struct GroupPair {
  std::unique_ptr<ShmGroup> g[2];
  GroupPair() {
    auto store = makeInProcessStore();
    ShmGroupOptions o;
    o.jobTag = "test" + std::to_string(std::random_device{}());
    o.fifoBytes = 64 * 1024;
    o.stageBytes = 256 * 1024;
    o.timeout = std::chrono::milliseconds(20000);
    std::exception_ptr otherError;
    std::thread other([&] {
      try {
        g[1] = std::make_unique<ShmGroup>(*store, 1, 2, o);
      } catch (...) {
        otherError = std::current_exception();
      }
    });
    try {
      g[0] = std::make_unique<ShmGroup>(*store, 0, 2, o);
    } catch (...) {
      other.join();
      throw;
    }
    other.join();
    if (otherError) std::rethrow_exception(otherError);
  }
};

TEST(ShmGroup, StagedStreamingIsPublishedToThePeers) {
  GroupPair p;
  // A new group's ranks have written nothing streaming.
  EXPECT_FALSE(p.g[0]->stagedStreaming(1));
  EXPECT_FALSE(p.g[1]->stagedStreaming(0));
  p.g[0]->publishStagedStreaming(true);
  EXPECT_TRUE(p.g[1]->stagedStreaming(0));
  EXPECT_TRUE(p.g[0]->stagedStreaming(0));   // its own, as the peers see it
  EXPECT_FALSE(p.g[0]->stagedStreaming(1));  // the other rank's is its own
  p.g[0]->publishStagedStreaming(true);      // again: unchanged
  EXPECT_TRUE(p.g[1]->stagedStreaming(0));
  p.g[1]->publishStagedStreaming(true);
  p.g[0]->publishStagedStreaming(false);
  EXPECT_FALSE(p.g[1]->stagedStreaming(0));
  EXPECT_TRUE(p.g[0]->stagedStreaming(1));
  // The sync flag, in the same line, is untouched by it.
  p.g[1]->setSyncFlag(7, 3);
  uint16_t call = 0;
  EXPECT_EQ(p.g[0]->syncFlag(1, &call), 7u);
  EXPECT_EQ(call, 3);
  EXPECT_TRUE(p.g[0]->stagedStreaming(1));
}

TEST(ShmGroup, ReadPenaltiesArePublishedByClass) {
  GroupPair p;
  EXPECT_EQ(p.g[0]->readPenalty(1, 0), -1);  // none yet
  p.g[1]->publishReadPenalty(3, 42.5);
  EXPECT_EQ(p.g[0]->readPenalty(1, 3), 42.5);  // kept to 1/16 ns per KiB
  EXPECT_EQ(p.g[0]->readPenalty(1, 2), -1);    // other classes still unknown
  EXPECT_EQ(p.g[1]->readPenalty(0, 3), -1);    // and the other rank's own
  p.g[1]->publishReadPenalty(3, 0);            // a penalty of nothing is known, not unknown
  EXPECT_EQ(p.g[0]->readPenalty(1, 3), 0);
  p.g[1]->publishReadPenalty(3, 7.03);
  EXPECT_NEAR(p.g[0]->readPenalty(1, 3), 7.03, 1.0 / 16);
  // Unknown or out of range: ignored.
  p.g[1]->publishReadPenalty(3, -1);
  p.g[1]->publishReadPenalty(kReadPenaltyClasses, 5);
  p.g[1]->publishReadPenalty(-1, 5);
  EXPECT_NEAR(p.g[0]->readPenalty(1, 3), 7.03, 1.0 / 16);
  EXPECT_EQ(p.g[0]->readPenalty(1, kReadPenaltyClasses), -1);
  EXPECT_EQ(p.g[0]->readPenalty(1, -1), -1);
  p.g[1]->publishReadPenalty(kReadPenaltyClasses - 1, 1e12);  // clamped, not wrapped
  EXPECT_GT(p.g[0]->readPenalty(1, kReadPenaltyClasses - 1), 1e8);
}

}  // namespace
