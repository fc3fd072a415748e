// The shared-memory FIFO's view of free space (transports/shm/shm_channel.*).
#include <gtest/gtest.h>

#include <vector>

#include "transports/shm/shm_channel.hpp"

namespace chorus::transport {
namespace {

// Regression: the sender reloaded the receiver's tail only when its cached view was completely full.
// A view refreshed while the receiver stood inside a message of 1-byte elements left 3 bytes "free";
// the engine writes headers and 8-byte elements whole, so it wrote nothing, the view never became
// full again, and the sender stalled forever on an empty FIFO (a 100,000-op soak hung in alltoallv).
TEST(ShmPipe, SenderSeesSpaceFreedAfterAStaleOddView) {
  FifoControl ctrl{};
  std::vector<std::byte> buf(64);
  ShmSendPipe send(&ctrl, buf.data(), buf.size());
  ShmRecvPipe recv(&ctrl, buf.data(), buf.size());
  ASSERT_EQ(send.reserve().size(), 64u);
  send.commit(64);  // full, e.g. a message of uint8 elements
  ASSERT_EQ(recv.peek().size(), 64u);
  recv.consume(3);  // the receiver is inside that message
  EXPECT_EQ(send.reserve().size(), 3u);
  recv.consume(recv.peek().size());  // now it has read everything
  EXPECT_EQ(send.reserve().size(), 64u) << "the sender does not see the empty FIFO";
}

// Free space is reported in wrap-around order: up to the end of the buffer, then from its start.
TEST(ShmPipe, WrapsAroundTheBuffer) {
  FifoControl ctrl{};
  std::vector<std::byte> buf(64);
  ShmSendPipe send(&ctrl, buf.data(), buf.size());
  ShmRecvPipe recv(&ctrl, buf.data(), buf.size());
  send.commit(48);
  recv.consume(recv.peek().size());
  EXPECT_EQ(send.reserve().size(), 16u);  // to the end of the buffer
  send.commit(16);
  EXPECT_EQ(send.reserve().size(), 48u);  // then from the start
}

}  // namespace
}  // namespace chorus::transport
