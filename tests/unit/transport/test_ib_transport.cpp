// The RDMA verbs transport against the in-process fake of the verbs calls (fake_verbs.hpp): device
// and port selection with clear reasons, connection set-up, RDMA writes with immediate data into
// rings that wrap, credits that hold a sender until the receiver consumed, a send queue that fills,
// failure notices, and a peer that goes away while this rank only receives from it.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/store.hpp"
#include "fake_verbs.hpp"
#include "pipe_test_util.hpp"
#include "transports/ib/ib_transport.hpp"

using namespace chorus;
using namespace chorus::transport;
using namespace chorus::transport::pipetest;

namespace {

IbOptions fakeOptions(size_t ringBytes = 64 << 10) {
  IbOptions o;
  o.commId = "test";
  o.ringBytes = ringBytes;
  o.timeout = std::chrono::seconds(20);
  o.verbs = fake::api();
  return o;
}

using Pair = TransportPair<IbTransport, IbOptions>;

TEST(IbDevices, ReasonsWhenNoneCanBeUsed) {
  std::string why;
  fake::reset({}, ENOSYS);  // this kernel: no RDMA support at all
  EXPECT_FALSE(ibAvailable(fakeOptions(), &why));
  EXPECT_NE(why.find("ibv_get_device_list: Function not implemented"), std::string::npos) << why;
  fake::reset({});
  EXPECT_FALSE(ibAvailable(fakeOptions(), &why));
  EXPECT_EQ(why, "no RDMA devices");
  fake::reset({{"mlx5_0", false, false}, {"mlx5_1", true, false}});
  IbOptions o = fakeOptions();
  o.hca = "mlx5_0";
  EXPECT_FALSE(ibAvailable(o, &why));
  EXPECT_NE(why.find("mlx5_0 (port 1 is not active), mlx5_1 (not matched by CHORUS_IB_HCA)"),
            std::string::npos)
      << why;
  o.hca = "";
  EXPECT_TRUE(ibAvailable(o, &why));  // the first with an active port
}

TEST(IbTransport, SetUpFailsNamingTheDevice) {
  fake::reset({{"mlx5_0", false, false}});
  auto store = makeInProcessStore();
  try {
    IbTransport t(*store, 0, 2, {true, true}, fakeOptions());
    FAIL() << "set up on a device whose port is down";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mlx5_0 (port 1 is not active)"), std::string::npos) << e.what();
  }
}

TEST(IbTransport, InfiniBandAndRoceEndsAreRefusedAtSetUp) {
  fake::reset({{"ib0", true, false}, {"roce0", true, true}});
  IbOptions a = fakeOptions(), b = fakeOptions();
  a.hca = "ib0";
  b.hca = "roce0";
  try {
    Pair p(a, b);
    FAIL() << "an InfiniBand and a RoCE end were connected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no RDMA path between them"), std::string::npos) << e.what();
  }
}

class IbPair : public ::testing::TestWithParam<bool> {};

TEST_P(IbPair, BothDirectionsAreExactAcrossWrapsWithCredits) {
  fake::reset({{"mlx5_0", true, GetParam()}});
  Pair p(fakeOptions(16 << 10));  // small rings: the senders wait for credits all the time
  const size_t bytes = 3 << 20;
  size_t wrong[2] = {0, 0};
  std::thread other([&] { exchange(*p.t[1], 1, bytes, 3000, 8, &wrong[1]); });
  exchange(*p.t[0], 0, bytes, 3000, 8, &wrong[0]);
  other.join();
  EXPECT_EQ(wrong[0], 0u);
  EXPECT_EQ(wrong[1], 0u);
  const fake::Stats s = fake::stats();
  EXPECT_GE(s.writesWithImm, 2 * static_cast<long>(bytes / 3048));
  EXPECT_GT(s.inlineWrites, 0);  // credits
  EXPECT_EQ(p.t[0]->memoryBytes(), 2u * (16 << 10) + 4160u);
  EXPECT_NE(p.t[0]->describeLocal().find(GetParam() ? "RoCE, GID index 0" : "LID"), std::string::npos)
      << p.t[0]->describeLocal();
}

INSTANTIATE_TEST_SUITE_P(LinkLayer, IbPair, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& pi) { return pi.param ? "roce" : "ib"; });

TEST(IbTransport, AFullSendQueueWaitsForCompletions) {
  // Many tiny flushes with nobody reading: more writes than the send queue holds are posted, and
  // the queue never overflows.
  fake::reset({{"mlx5_0", true, false}});
  Pair p(fakeOptions(1 << 20));
  SendPipe& out = p.t[0]->sendPipe(1);
  for (int i = 0; i < 1000; ++i) {
    auto s = out.reserve();
    ASSERT_GE(s.size(), 8u);
    std::memset(s.data(), i & 0xFF, 8);
    out.commit(8);
    out.flush();
  }
  EXPECT_LE(fake::stats().maxSendQueue, 128);
  size_t got = 0;
  for (int k = 0; k < 100 && got < 8000; ++k) {
    auto r = p.t[1]->recvPipe(0).peek();
    for (size_t i = 0; i < r.size(); ++i) ASSERT_EQ(r[i], std::byte(((got + i) / 8) & 0xFF));
    p.t[1]->recvPipe(0).consume(r.size());
    got += r.size();
  }
  EXPECT_EQ(got, 8000u);
}

TEST(IbTransport, FailureNoticeReachesThePeerWithItsText) {
  fake::reset({{"mlx5_0", true, false}});
  Pair p(fakeOptions());
  p.t[0]->publishFailure(chorusTimeout, "rank 0: allreduce #3 timed out");
  std::string notice;
  chorusResult_t code = chorusSuccess;
  EXPECT_EQ(p.t[1]->findPeerFailure(&code, &notice), 0);
  EXPECT_EQ(code, chorusRemoteError);  // the notices carry no code
  EXPECT_EQ(notice, "rank 0: allreduce #3 timed out");
  EXPECT_EQ(p.t[0]->findPeerFailure(&code, &notice), -1);
}

TEST(IbTransport, APeerThatGoesAwayIsReadToTheEndThenNamed) {
  fake::reset({{"mlx5_0", true, false}});
  Pair p(fakeOptions(1 << 20));
  SendPipe& out = p.t[0]->sendPipe(1);
  auto s = out.reserve();
  ASSERT_GE(s.size(), 4096u);
  for (size_t i = 0; i < 4096; ++i) s[i] = std::byte{pattern(i, 0)};
  out.commit(4096);
  out.flush();
  p.t[0].reset();  // its queue pair is gone, as when the process exits
  // Rank 1 only receives: what arrived is read, then the probe of the idle wait finds the peer gone.
  size_t got = 0, wrong = 0;
  std::string text;
  std::string notice;
  chorusResult_t code = chorusSuccess;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  try {
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = p.t[1]->recvPipe(0).peek();
      for (size_t i = 0; i < r.size(); ++i) wrong += r[i] != std::byte{pattern(got + i, 0)};
      p.t[1]->recvPipe(0).consume(r.size());
      got += r.size();
      if (r.empty()) {
        EXPECT_EQ(p.t[1]->findPeerFailure(&code, &notice), -1);  // going away is not a failure notice
        p.t[1]->waitReadable(std::chrono::microseconds(1000));
      }
    }
  } catch (const PeerError& e) {
    text = e.what();
  }
  EXPECT_EQ(got, 4096u);
  EXPECT_EQ(wrong, 0u);
  EXPECT_NE(text.find("the RDMA connection with rank 0 failed: transport retry counter exceeded"),
            std::string::npos)
      << text;
}

TEST(IbTransport, AnIdleWaitFindsAPeerThatDiedWhileNothingWasExchanged) {
  // No data either way, so no write of this rank's would fail: the probe of findPeerFailure (once
  // a second) is what finds the peer gone.
  fake::reset({{"mlx5_0", true, false}});
  Pair p(fakeOptions());
  p.t[0].reset();
  std::string text, notice;
  chorusResult_t code = chorusSuccess;
  const auto start = std::chrono::steady_clock::now();
  try {
    while (std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
      if (!p.t[1]->recvPipe(0).peek().empty()) break;
      p.t[1]->findPeerFailure(&code, &notice);
      p.t[1]->waitReadable(std::chrono::microseconds(1000));
    }
  } catch (const PeerError& e) {
    text = e.what();
  }
  EXPECT_NE(text.find("the RDMA connection with rank 0 failed: transport retry counter exceeded"),
            std::string::npos)
      << text;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

}  // namespace
