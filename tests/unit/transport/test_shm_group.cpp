// transport::ShmGroup's word that says how a rank last wrote into its staging area: two groups of
// one job as ranks 0 and 1 on two threads (set-up is collective), each reading what the other
// published.
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

}  // namespace
