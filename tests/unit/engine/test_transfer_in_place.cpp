// Point-to-point payloads sent by address (src/engine/transfer.cpp, single copy): two ranks as two
// threads over a pair of shared-memory FIFOs in ordinary memory, the receiver copying the sender's
// buffer either directly (a rank of this process) or by cross-memory attach (process_vm_readv of
// this very process, as of a peer's).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.hpp"
#include "engine/transfer.hpp"
#include "engine/waiter.hpp"
#include "transports/shm/shm_channel.hpp"

namespace chorus::engine {
namespace {

using namespace std::chrono_literals;

class AlwaysHealthy : public Health {
 public:
  bool abortRequested() const override { return false; }
  void checkHealth(FunctionRef<bool(int)>) override {}
};

// One direction's FIFO: its control block and its buffer, as in a segment.
struct Fifo {
  transport::FifoControl ctrl{};
  std::vector<std::byte> data = std::vector<std::byte>(size_t{64} << 10);
};

class OnePeer : public PipeSet {
 public:
  OnePeer(transport::SendPipe& s, transport::RecvPipe& r) : send_(s), recv_(r) {}
  transport::SendPipe& sendPipe(int) override { return send_; }
  transport::RecvPipe& recvPipe(int) override { return recv_; }

 private:
  transport::SendPipe& send_;
  transport::RecvPipe& recv_;
};

// Rank 0 sends to rank 1 over `fifo`; the receiver reads the sender's memory as process `pid`
// (0: directly). Payloads from `inPlaceMin` bytes go by address.
struct Link {
  Fifo fifo, back;
  transport::ShmSendPipe send0, send1;
  transport::ShmRecvPipe recv0, recv1;
  OnePeer rank0, rank1;
  Link(size_t inPlaceMin, int pid)
      : send0(&fifo.ctrl, fifo.data.data(), fifo.data.size(), inPlaceMin),
        send1(&back.ctrl, back.data.data(), back.data.size(), inPlaceMin),
        recv0(&back.ctrl, back.data.data(), back.data.size(), pid, "rank 1"),
        recv1(&fifo.ctrl, fifo.data.data(), fifo.data.size(), pid, "rank 0"),
        rank0(send0, recv0),
        rank1(send1, recv1) {}
};

void run(std::vector<Transfer>& ts, PipeSet& pipes, int self, std::chrono::milliseconds timeout = 20s) {
  AlwaysHealthy health;
  Waiter waiter(health, Clock::now() + timeout, timeout, WaitPolicy::Yield);
  runTransfers(ts, pipes, self, waiter, [] { return std::string("test transfers"); });
}

// Runs rank 0's and rank 1's lists on two threads; rethrows the first error.
void runBoth(Link& link, std::vector<Transfer>& at0, std::vector<Transfer>& at1) {
  std::exception_ptr error1;
  std::thread peer([&] {
    try {
      run(at1, link.rank1, 1);
    } catch (...) {
      error1 = std::current_exception();
    }
  });
  run(at0, link.rank0, 0);
  peer.join();
  if (error1) std::rethrow_exception(error1);
}

class TransferInPlace : public ::testing::TestWithParam<bool> {
 protected:
  int pid() const { return GetParam() ? static_cast<int>(getpid()) : 0; }
};

// A payload much larger than the FIFO, of odd length, goes by address and arrives exact; a small
// one after it on the same pipe goes through the FIFO; the sender learns of exactly one copy.
TEST_P(TransferInPlace, LargeReceiveIsExactAndSmallOnesStillStream) {
  Link link(size_t{1} << 20, pid());
  std::vector<uint8_t> big((size_t{3} << 20) + 5), small(1000), gotBig(big.size()), gotSmall(small.size());
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + (i >> 11));
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<Transfer> at0 = {Transfer::send(1, big.data(), big.size(), 1, 9),
                               Transfer::send(1, small.data(), small.size(), 1, 9)};
  std::vector<Transfer> at1 = {Transfer::recv(0, gotBig.data(), gotBig.size(), 1, 9),
                               Transfer::recv(0, gotSmall.data(), gotSmall.size(), 1, 9)};
  runBoth(link, at0, at1);
  EXPECT_EQ(gotBig, big);
  EXPECT_EQ(gotSmall, small);
  EXPECT_EQ(link.fifo.ctrl.readsDone.load(), 1u);
  EXPECT_EQ(link.send0.inPlaceReadsDone(), 1u);
}

// A receive that reduces: the payload read in cache-sized pieces and summed into the output, both
// out of place and in place (the local operand is the output), exact in int32.
TEST_P(TransferInPlace, ReduceOfAPayloadSentByAddressIsExact) {
  Link link(4096, pid());
  const size_t count = (size_t{700} << 10) + 3;  // several 256 KiB pieces and a ragged end
  std::vector<int32_t> theirs(count), mine(count), out(count, -1), inPlace(count);
  for (size_t i = 0; i < count; ++i) {
    theirs[i] = static_cast<int32_t>(i % 1009) - 500;
    mine[i] = static_cast<int32_t>(i % 997) * 3;
  }
  inPlace = mine;
  std::vector<Transfer> at0 = {Transfer::send(1, theirs.data(), count * 4, 4, 5),
                               Transfer::send(1, theirs.data(), count * 4, 4, 5)};
  std::vector<Transfer> at1 = {
      Transfer::recvReduce(0, out.data(), mine.data(), count * 4, DataType::Int32, ReduceOp::Sum, 0, 5),
      Transfer::recvReduce(0, inPlace.data(), inPlace.data(), count * 4, DataType::Int32, ReduceOp::Sum, 0,
                           5)};
  runBoth(link, at0, at1);
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    wrong += out[i] != theirs[i] + mine[i];
    wrong += inPlace[i] != theirs[i] + mine[i];
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(link.fifo.ctrl.readsDone.load(), 2u);
}

// Both ways at once (a pairwise exchange): neither rank's send completes before the other has
// copied it, so each waits on its peer while it copies; both finish, exact.
TEST_P(TransferInPlace, ExchangeBothWays) {
  Link link(size_t{64} << 10, pid());
  const size_t bytes = size_t{2} << 20;
  std::vector<uint8_t> a(bytes), b(bytes), gotA(bytes), gotB(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    a[i] = static_cast<uint8_t>(i * 13);
    b[i] = static_cast<uint8_t>(i * 29 + 1);
  }
  std::vector<Transfer> at0 = {Transfer::send(1, a.data(), bytes, 1, 2),
                               Transfer::recv(1, gotB.data(), bytes, 1, 2)};
  std::vector<Transfer> at1 = {Transfer::recv(0, gotA.data(), bytes, 1, 2),
                               Transfer::send(0, b.data(), bytes, 1, 2)};
  runBoth(link, at0, at1);
  EXPECT_EQ(gotA, a);
  EXPECT_EQ(gotB, b);
}

// A send bound to another transfer's progress (ring forwarding: rank 0 relays what rank 1 sends
// it) streams through the FIFO, its bytes not all there when it starts; the payload it relays came
// by address.
TEST_P(TransferInPlace, ForwardingSendsStream) {
  Link link(4096, pid());
  const size_t bytes = size_t{256} << 10;
  std::vector<uint8_t> src(bytes), relay(bytes), got(bytes);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 5 + 1);
  std::vector<Transfer> at0 = {Transfer::recv(1, relay.data(), bytes, 1, 3),
                               Transfer::send(1, relay.data(), bytes, 1, 3)};
  at0[1].waitFor = 0;
  std::vector<Transfer> at1 = {Transfer::send(0, src.data(), bytes, 1, 3),
                               Transfer::recv(0, got.data(), bytes, 1, 3)};
  runBoth(link, at0, at1);
  EXPECT_EQ(got, src);
  EXPECT_EQ(link.back.ctrl.readsDone.load(), 1u) << "rank 1's send did not go by address";
  EXPECT_EQ(link.fifo.ctrl.readsDone.load(), 0u) << "a forwarding send went by address";
}

INSTANTIATE_TEST_SUITE_P(Reads, TransferInPlace, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return std::string(p.param ? "CrossMemoryAttach" : "SameProcess");
                         });

// A receive that expects another length is refused from the flagged header, before any byte of
// the sender's buffer is copied.
TEST(TransferInPlaceFaults, MismatchedLengthIsRefusedBeforeAnyCopy) {
  Link link(4096, 0);
  std::vector<uint8_t> data(size_t{1} << 20, 7), got(data.size() / 2, 0);
  std::vector<Transfer> at0 = {Transfer::send(1, data.data(), data.size(), 1, 1)};
  std::vector<Transfer> at1 = {Transfer::recv(0, got.data(), got.size(), 1, 1)};
  std::thread sender([&] { EXPECT_THROW(run(at0, link.rank0, 0, 1000ms), Error); });
  try {
    run(at1, link.rank1, 1);
    ADD_FAILURE() << "a receive of another length completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find("has 1048576 bytes"), std::string::npos) << e.what();
  }
  sender.join();
  EXPECT_EQ(link.fifo.ctrl.readsDone.load(), 0u);
  EXPECT_EQ(std::count(got.begin(), got.end(), uint8_t{0}), static_cast<ptrdiff_t>(got.size()));
}

// A sender whose process is gone: the receiver's read fails naming the sender's rank and saying it
// died; the sender, never told of a copy, times out saying what it waits for.
TEST(TransferInPlaceFaults, SenderGoneIsNamedAndTheWaitingSenderTimesOut) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // a pid with no process behind it (for now)
  Link link(4096, static_cast<int>(child));
  std::vector<uint8_t> data(size_t{1} << 20, 7), got(data.size());
  std::vector<Transfer> at0 = {Transfer::send(1, data.data(), data.size(), 1, 1)};
  std::vector<Transfer> at1 = {Transfer::recv(0, got.data(), got.size(), 1, 1)};
  std::string receiverError;
  std::thread receiver([&] {
    try {
      run(at1, link.rank1, 1);
    } catch (const Error& e) {
      receiverError = e.what();
      EXPECT_EQ(e.code(), chorusRemoteError) << e.what();
    }
  });
  try {
    run(at0, link.rank0, 0, 1500ms);
    ADD_FAILURE() << "the send completed without a copy";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sent by address, not yet copied by the receiver"),
              std::string::npos)
        << e.what();
  }
  receiver.join();
  EXPECT_NE(receiverError.find("rank 0 (pid " + std::to_string(child) + ") died"), std::string::npos)
      << receiverError;
  EXPECT_NE(receiverError.find("rank 1: test transfers"), std::string::npos) << receiverError;
}

}  // namespace
}  // namespace chorus::engine
