// Bad input through the C API: every mistake returns an error code and a message naming the
// problem (on the calling thread and on the communicator), nothing crashes, and the communicator
// keeps working afterwards (bad input must not break it).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "api_test_util.hpp"
#include "chorus/chorus.h"
#include "core/device.hpp"

using chorus::apitest::mentions;

namespace {

constexpr int kRanks = 2;
constexpr size_t kCount = 64;

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(chorusCommInitAll(comms_, kRanks, nullptr), chorusSuccess) << chorusGetLastError(nullptr);
    send_.assign(kCount * kRanks, 1.0f);
    recv_.assign(kCount * kRanks, 0.0f);
  }

  void TearDown() override {
    for (chorusComm_t c : comms_) {
      if (c) {
        EXPECT_EQ(chorusCommDestroy(c), chorusSuccess) << chorusGetLastError(nullptr);
      }
    }
  }

  // `result` must be `code`, and both the thread's and the communicator's last error must name
  // every word of `words`.
  void expectError(chorusResult_t result, chorusResult_t code, std::initializer_list<const char*> words,
                   chorusComm_t comm = nullptr) {
    EXPECT_EQ(result, code) << "got " << chorusGetErrorString(result) << ": " << chorusGetLastError(nullptr);
    std::string threadText = chorusGetLastError(nullptr);
    EXPECT_TRUE(mentions(threadText, words)) << "(chorusGetLastError(NULL))";
    if (comm) {
      std::string commText = chorusGetLastError(comm);
      EXPECT_TRUE(mentions(commText, words)) << "(chorusGetLastError(comm))";
    }
  }

  // After bad input the communicator still works: an allreduce over both ranks gives exact sums.
  void expectStillWorks() {
    std::vector<float> in[kRanks], out[kRanks];
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    for (int r = 0; r < kRanks; ++r) {
      in[r].assign(kCount, static_cast<float>(r + 1));
      out[r].assign(kCount, -1.0f);
      EXPECT_EQ(
          chorusAllReduce(in[r].data(), out[r].data(), kCount, chorusFloat32, chorusSum, comms_[r], nullptr),
          chorusSuccess)
          << chorusGetLastError(comms_[r]);
    }
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
    for (int r = 0; r < kRanks; ++r) {
      for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(out[r][i], 3.0f) << "rank " << r << " element " << i;
      chorusResult_t async = chorusInternalError;
      EXPECT_EQ(chorusCommGetAsyncError(comms_[r], &async), chorusSuccess);
      EXPECT_EQ(async, chorusSuccess) << "bad input broke the communicator";
    }
  }

  chorusComm_t comms_[kRanks] = {};
  std::vector<float> send_, recv_;
};

TEST_F(BadInput, NullSendbuffWithCount) {
  expectError(chorusAllReduce(nullptr, recv_.data(), kCount, chorusFloat32, chorusSum, comms_[0], nullptr),
              chorusInvalidArgument, {"sendbuff", "NULL"}, comms_[0]);
  expectError(chorusAllReduce(send_.data(), nullptr, kCount, chorusFloat32, chorusSum, comms_[0], nullptr),
              chorusInvalidArgument, {"recvbuff", "NULL"}, comms_[0]);
  expectError(chorusAllGather(nullptr, recv_.data(), kCount, chorusFloat32, comms_[1], nullptr),
              chorusInvalidArgument, {"sendbuff", "NULL"}, comms_[1]);
  expectError(chorusSend(nullptr, kCount, chorusFloat32, 1, comms_[0], nullptr), chorusInvalidArgument,
              {"NULL"}, comms_[0]);
  expectStillWorks();
}

TEST_F(BadInput, NullBuffersWithZeroCountAreFine) {
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(chorusAllReduce(nullptr, nullptr, 0, chorusFloat32, chorusSum, comms_[r], nullptr),
              chorusSuccess)
        << chorusGetLastError(comms_[r]);
  }
  EXPECT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
  expectStillWorks();
}

TEST_F(BadInput, UnknownDatatype) {
  for (int t : {42, -1, static_cast<int>(chorusNumTypes)}) {
    SCOPED_TRACE(t);
    expectError(chorusAllReduce(send_.data(), recv_.data(), kCount, static_cast<chorusDataType_t>(t),
                                chorusSum, comms_[0], nullptr),
                chorusInvalidArgument, {"datatype", std::to_string(t).c_str()}, comms_[0]);
  }
  expectError(chorusBroadcast(send_.data(), recv_.data(), kCount, static_cast<chorusDataType_t>(42), 0,
                              comms_[1], nullptr),
              chorusInvalidArgument, {"datatype"}, comms_[1]);
  expectStillWorks();
}

TEST_F(BadInput, UnknownReductionOp) {
  for (int op : {42, -1, static_cast<int>(chorusNumOps)}) {
    SCOPED_TRACE(op);
    expectError(chorusAllReduce(send_.data(), recv_.data(), kCount, chorusFloat32,
                                static_cast<chorusRedOp_t>(op), comms_[0], nullptr),
                chorusInvalidArgument, {"op", std::to_string(op).c_str()}, comms_[0]);
  }
  expectError(chorusReduce(send_.data(), recv_.data(), kCount, chorusFloat32, static_cast<chorusRedOp_t>(42),
                           0, comms_[1], nullptr),
              chorusInvalidArgument, {"op"}, comms_[1]);
  expectError(chorusReduceScatter(send_.data(), recv_.data(), kCount, chorusFloat32,
                                  static_cast<chorusRedOp_t>(42), comms_[1], nullptr),
              chorusInvalidArgument, {"op"}, comms_[1]);
  expectStillWorks();
}

TEST_F(BadInput, RootOutOfRange) {
  for (int root : {-1, kRanks, 1000}) {
    SCOPED_TRACE(root);
    expectError(chorusBroadcast(send_.data(), recv_.data(), kCount, chorusFloat32, root, comms_[0], nullptr),
                chorusInvalidArgument, {"root", std::to_string(root).c_str()}, comms_[0]);
    expectError(
        chorusReduce(send_.data(), recv_.data(), kCount, chorusFloat32, chorusSum, root, comms_[1], nullptr),
        chorusInvalidArgument, {"root", std::to_string(root).c_str()}, comms_[1]);
  }
  expectStillWorks();
}

TEST_F(BadInput, PeerOutOfRange) {
  for (int peer : {-1, kRanks}) {
    SCOPED_TRACE(peer);
    expectError(chorusSend(send_.data(), kCount, chorusFloat32, peer, comms_[0], nullptr),
                chorusInvalidArgument, {"peer", std::to_string(peer).c_str()}, comms_[0]);
    expectError(chorusRecv(recv_.data(), kCount, chorusFloat32, peer, comms_[1], nullptr),
                chorusInvalidArgument, {"peer", std::to_string(peer).c_str()}, comms_[1]);
  }
  expectStillWorks();
}

TEST_F(BadInput, CountOverflow) {
  // The buffers are far too small for these counts: validation must reject them before touching memory.
  expectError(
      chorusAllReduce(send_.data(), recv_.data(), SIZE_MAX / 2, chorusFloat32, chorusSum, comms_[0], nullptr),
      chorusInvalidArgument, {"overflow"}, comms_[0]);
  expectError(
      chorusAllReduce(send_.data(), recv_.data(), SIZE_MAX, chorusFloat64, chorusSum, comms_[0], nullptr),
      chorusInvalidArgument, {"overflow"}, comms_[0]);
  expectError(
      chorusBroadcast(send_.data(), recv_.data(), SIZE_MAX / 4 + 1, chorusInt32, 0, comms_[1], nullptr),
      chorusInvalidArgument, {"overflow"}, comms_[1]);
  // count * nranks overflows size_t although count * elemSize does not.
  const size_t wraps = SIZE_MAX / 2 + 1;
  expectError(chorusAllGather(send_.data(), recv_.data(), wraps, chorusUint8, comms_[0], nullptr),
              chorusInvalidArgument, {"overflow"}, comms_[0]);
  // count * elemSize fits the message limit but count * nranks * elemSize does not.
  const size_t justFits = (size_t{1} << 46) + 1;
  expectError(chorusAllGather(send_.data(), recv_.data(), justFits, chorusUint8, comms_[0], nullptr),
              chorusInvalidArgument, {"overflow"}, comms_[0]);
  expectError(
      chorusReduceScatter(send_.data(), recv_.data(), justFits, chorusUint8, chorusSum, comms_[1], nullptr),
      chorusInvalidArgument, {"overflow"}, comms_[1]);
  expectError(chorusAllToAll(send_.data(), recv_.data(), wraps, chorusUint8, comms_[1], nullptr),
              chorusInvalidArgument, {"overflow"}, comms_[1]);
  expectStillWorks();
}

// A stream means device buffers: without a usable GPU (hidden here, so that the test means the same
// everywhere) or without CUDA in the build, each rank is refused at once, saying why.
TEST_F(BadInput, StreamWithoutAGpu) {
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  int fakeStream = 0;
  const chorusResult_t code = chorus::device::built() ? chorusInvalidUsage : chorusInvalidArgument;
  expectError(
      chorusAllReduce(send_.data(), recv_.data(), kCount, chorusFloat32, chorusSum, comms_[0], &fakeStream),
      code, {"CUDA", "rank 0"}, comms_[0]);
  expectError(chorusBarrier(comms_[1], &fakeStream), code, {"CUDA", "rank 1"}, comms_[1]);
  expectStillWorks();
}

TEST_F(BadInput, PartiallyOverlappingBuffers) {
  std::vector<float> buf(kCount * kRanks * 2, 1.0f);
  // Shifted by one element: neither in place nor disjoint.
  expectError(
      chorusAllReduce(buf.data(), buf.data() + 1, kCount, chorusFloat32, chorusSum, comms_[0], nullptr),
      chorusInvalidArgument, {"overlap"}, comms_[0]);
  expectError(chorusAllToAll(buf.data(), buf.data() + kCount / 2, kCount, chorusFloat32, comms_[1], nullptr),
              chorusInvalidArgument, {"overlap"}, comms_[1]);
  // Rank 1's in-place position is recvbuff + 1 * count; recvbuff + 3 elements is not it.
  expectError(chorusAllGather(buf.data() + 3, buf.data(), kCount, chorusFloat32, comms_[1], nullptr),
              chorusInvalidArgument, {"overlap"}, comms_[1]);
  expectStillWorks();
}

TEST_F(BadInput, NullCommunicator) {
  expectError(chorusAllReduce(send_.data(), recv_.data(), kCount, chorusFloat32, chorusSum, nullptr, nullptr),
              chorusInvalidArgument, {"NULL"});
  int value = 0;
  expectError(chorusCommCount(nullptr, &value), chorusInvalidArgument, {"NULL"});
  expectError(chorusCommUserRank(nullptr, &value), chorusInvalidArgument, {"NULL"});
  expectError(chorusCommCuDevice(nullptr, &value), chorusInvalidArgument, {"NULL"});
  expectError(chorusCommDestroy(nullptr), chorusInvalidArgument, {"NULL"});
  expectError(chorusBarrier(nullptr, nullptr), chorusInvalidArgument, {"NULL"});
  // A pointer Chorus never handed out is recognised, not dereferenced.
  alignas(64) char notAComm[256] = {};
  expectError(chorusCommCount(reinterpret_cast<chorusComm_t>(notAComm), &value), chorusInvalidArgument,
              {"not a communicator"});
  // NULL output pointers.
  expectError(chorusCommCount(comms_[0], nullptr), chorusInvalidArgument, {"NULL"});
  expectError(chorusCommCuDevice(comms_[0], nullptr), chorusInvalidArgument, {"NULL"});
  expectError(chorusCommSplit(comms_[0], 0, 0, nullptr), chorusInvalidArgument, {"NULL"});
  expectStillWorks();
}

TEST_F(BadInput, GroupEndWithoutStart) {
  expectError(chorusGroupEnd(), chorusInvalidUsage, {"group"});
  // Balanced groups still work afterwards (including an empty one).
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  EXPECT_EQ(chorusGroupEnd(), chorusSuccess);
  expectStillWorks();
  expectError(chorusGroupEnd(), chorusInvalidUsage, {"group"});
}

TEST_F(BadInput, SplitInsideGroupIsInvalidUsage) {
  chorusComm_t child = nullptr;
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  expectError(chorusCommSplit(comms_[0], 0, 0, &child), chorusInvalidUsage, {"group"}, comms_[0]);
  EXPECT_EQ(child, nullptr);
  ASSERT_EQ(chorusGroupEnd(), chorusSuccess);
  expectStillWorks();
}

TEST_F(BadInput, AllToAllvNullCounts) {
  size_t counts[kRanks] = {1, 1}, displs[kRanks] = {0, 1};
  expectError(chorusAllToAllv(send_.data(), nullptr, displs, recv_.data(), counts, displs, chorusFloat32,
                              comms_[0], nullptr),
              chorusInvalidArgument, {"NULL"}, comms_[0]);
  expectStillWorks();
}

TEST_F(BadInput, LastErrorPerThreadAndPerCommunicator) {
  ASSERT_EQ(chorusBroadcast(send_.data(), recv_.data(), kCount, chorusFloat32, 7, comms_[0], nullptr),
            chorusInvalidArgument);
  EXPECT_TRUE(mentions(chorusGetLastError(nullptr), {"root", "7"}));
  EXPECT_TRUE(mentions(chorusGetLastError(comms_[0]), {"root", "7"}));
  // The text belongs to this thread: another thread that made no failing call sees an empty string.
  std::string otherThread = "not run";
  std::thread([&] { otherThread = chorusGetLastError(nullptr); }).join();
  EXPECT_EQ(otherThread, "");
  // ... but it sees the communicator's text.
  std::string otherThreadComm;
  std::thread([&] { otherThreadComm = chorusGetLastError(comms_[0]); }).join();
  EXPECT_TRUE(mentions(otherThreadComm, {"root"}));
  expectStillWorks();
}

// Use after chorusCommDestroy returns chorusInvalidUsage and never touches freed memory (this test
// is also run under AddressSanitizer: see the CHORUS_SANITIZE build).
TEST(UseAfterDestroy, ReturnsInvalidUsage) {
  chorusComm_t comms[kRanks] = {};
  ASSERT_EQ(chorusCommInitAll(comms, kRanks, nullptr), chorusSuccess) << chorusGetLastError(nullptr);
  for (chorusComm_t c : comms) ASSERT_EQ(chorusCommDestroy(c), chorusSuccess) << chorusGetLastError(nullptr);
  std::vector<float> buf(kCount, 1.0f), out(kCount);
  int value = -1;
  chorusResult_t async = chorusSuccess;
  chorusComm_t child = nullptr;
  auto destroyed = [](chorusResult_t r) {
    EXPECT_EQ(r, chorusInvalidUsage) << chorusGetErrorString(r);
    EXPECT_TRUE(mentions(chorusGetLastError(nullptr), {"destroyed"}));
  };
  destroyed(chorusAllReduce(buf.data(), out.data(), kCount, chorusFloat32, chorusSum, comms[0], nullptr));
  destroyed(chorusBroadcast(buf.data(), out.data(), kCount, chorusFloat32, 0, comms[1], nullptr));
  destroyed(chorusBarrier(comms[0], nullptr));
  destroyed(chorusSend(buf.data(), kCount, chorusFloat32, 1, comms[0], nullptr));
  destroyed(chorusCommCount(comms[0], &value));
  destroyed(chorusCommUserRank(comms[1], &value));
  destroyed(chorusCommGetAsyncError(comms[0], &async));
  destroyed(chorusCommSplit(comms[0], 0, 0, &child));
  EXPECT_EQ(child, nullptr);
  destroyed(chorusCommDestroy(comms[0]));
  destroyed(chorusCommAbort(comms[1]));
  // The destroyed handle's text falls back to the thread's.
  EXPECT_TRUE(mentions(chorusGetLastError(comms[0]), {"destroyed"}));
  // Inside a group too: the call fails at once, and the group still ends cleanly.
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  destroyed(chorusAllReduce(buf.data(), out.data(), kCount, chorusFloat32, chorusSum, comms[0], nullptr));
  EXPECT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
}

TEST(UseAfterDestroy, AbortedHandleReturnsInvalidUsage) {
  chorusComm_t comm = nullptr;
  ASSERT_EQ(chorusCommInitAll(&comm, 1, nullptr), chorusSuccess) << chorusGetLastError(nullptr);
  ASSERT_EQ(chorusCommAbort(comm), chorusSuccess) << chorusGetLastError(nullptr);
  float x = 1, y = 0;
  EXPECT_EQ(chorusAllReduce(&x, &y, 1, chorusFloat32, chorusSum, comm, nullptr), chorusInvalidUsage);
  EXPECT_TRUE(mentions(chorusGetLastError(nullptr), {"destroyed"}));
}

TEST(InitArguments, BadArgumentsFailWithMessage) {
  chorusComm_t comms[2] = {};
  EXPECT_EQ(chorusCommInitAll(nullptr, 2, nullptr), chorusInvalidArgument);
  EXPECT_TRUE(mentions(chorusGetLastError(nullptr), {"NULL"}));
  EXPECT_EQ(chorusCommInitAll(comms, 0, nullptr), chorusInvalidArgument);
  EXPECT_TRUE(mentions(chorusGetLastError(nullptr), {"ndev", "0"}));
  EXPECT_EQ(chorusCommInitFromEnv(nullptr), chorusInvalidArgument);
  EXPECT_TRUE(mentions(chorusGetLastError(nullptr), {"NULL"}));
  chorusUniqueId garbage;
  std::memset(&garbage, 'x', sizeof garbage);
  EXPECT_EQ(chorusCommInitRank(&comms[0], 1, garbage, 0), chorusInvalidArgument);
  EXPECT_TRUE(mentions(chorusGetLastError(nullptr), {"chorusUniqueId"}));
  EXPECT_EQ(comms[0], nullptr);
}

}  // namespace
