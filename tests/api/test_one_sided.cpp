// One-sided transfers (chorusWindowRegister, chorusPutSignal, chorusWaitSignal) and the other C
// calls the NCCL 2.30 shim stands on (chorusCommRevoke, chorusCommMemoryBytes,
// chorusCommLocalRanks, chorusConfigGet), with ranks as threads of this process. Processes are
// covered through the shim (tests/frameworks/nccl_api230_test.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "api_test_util.hpp"
#include "chorus/chorus.h"

using chorus::apitest::mentions;

namespace {

constexpr int kRanks = 3;
constexpr size_t kFloats = 4096;

// Runs body(rank, comm) on one thread per rank of a fresh communicator, then destroys it.
template <typename F>
void onRanks(F body) {
  chorusComm_t comms[kRanks];
  ASSERT_EQ(chorusCommInitAll(comms, kRanks, nullptr), chorusSuccess) << chorusGetLastError(nullptr);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) threads.emplace_back([&, r] { body(r, comms[r]); });
  for (auto& t : threads) t.join();
  for (chorusComm_t c : comms) EXPECT_EQ(chorusCommDestroy(c), chorusSuccess) << chorusGetLastError(nullptr);
}

TEST(OneSided, PutSignalWaitIsExactAndOrdered) {
  onRanks([](int rank, chorusComm_t comm) {
    float* buf = nullptr;
    ASSERT_EQ(chorusMemAlloc(reinterpret_cast<void**>(&buf), kRanks * kFloats * sizeof(float)),
              chorusSuccess);
    chorusWindow_t win = nullptr;
    ASSERT_EQ(chorusWindowRegister(comm, buf, kRanks * kFloats * sizeof(float), &win), chorusSuccess)
        << chorusGetLastError(comm);
    // Every rank puts a block into its slot of every other rank's window, 20 times, each time
    // waiting for the peers' previous round before overwriting (the slot holds the latest round).
    std::vector<float> mine(kFloats);
    for (int round = 0; round < 20; ++round) {
      for (size_t i = 0; i < kFloats; ++i) mine[i] = static_cast<float>(rank * 1000000 + round * 10000 + i);
      for (int p = 0; p < kRanks; ++p) {
        if (p == rank) continue;
        ASSERT_EQ(chorusPutSignal(mine.data(), kFloats * sizeof(float), p, win,
                                  rank * kFloats * sizeof(float), 5, comm),
                  chorusSuccess)
            << chorusGetLastError(comm);
      }
      for (int p = 0; p < kRanks; ++p) {
        if (p == rank) continue;
        ASSERT_EQ(chorusWaitSignal(p, 5, 1, comm), chorusSuccess) << chorusGetLastError(comm);
        for (size_t i = 0; i < kFloats; ++i)
          ASSERT_EQ(buf[p * kFloats + i], static_cast<float>(p * 1000000 + round * 10000 + i))
              << p << " " << i;
        // Tell p its slot here may be overwritten.
        ASSERT_EQ(chorusPutSignal(nullptr, 0, p, nullptr, 0, 6, comm), chorusSuccess);
      }
      for (int p = 0; p < kRanks; ++p) {
        if (p != rank) {
          ASSERT_EQ(chorusWaitSignal(p, 6, 1, comm), chorusSuccess) << chorusGetLastError(comm);
        }
      }
    }
    void* peer = nullptr;
    size_t size = 0;
    const int next = (rank + 1) % kRanks;
    ASSERT_EQ(chorusWindowPeerPointer(win, next, &peer, &size), chorusSuccess);
    EXPECT_EQ(size, kRanks * kFloats * sizeof(float));
    ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess);
    EXPECT_EQ(static_cast<float*>(peer)[rank * kFloats + 7],
              static_cast<float>(rank * 1000000 + 19 * 10000 + 7));
    ASSERT_EQ(chorusWindowDeregister(comm, win), chorusSuccess) << chorusGetLastError(comm);
    EXPECT_EQ(chorusWindowPeerPointer(win, next, &peer, &size), chorusInvalidArgument);
    ASSERT_EQ(chorusMemFree(buf), chorusSuccess);
  });
}

TEST(OneSided, MisuseIsNamed) {
  onRanks([](int rank, chorusComm_t comm) {
    // Before any window, signals do not exist yet.
    EXPECT_EQ(chorusWaitSignal(0, 0, 1, comm), chorusInvalidUsage);
    EXPECT_TRUE(mentions(chorusGetLastError(comm), {"no window yet"})) << chorusGetLastError(comm);
    // Rank 1's buffer is on the heap: every rank fails, naming rank 1.
    std::vector<char> heap(4096);
    void* shared = nullptr;
    ASSERT_EQ(chorusMemAlloc(&shared, 4096), chorusSuccess);
    chorusWindow_t win = nullptr;
    EXPECT_EQ(chorusWindowRegister(comm, rank == 1 ? heap.data() : shared, 4096, &win),
              chorusInvalidArgument);
    EXPECT_TRUE(mentions(chorusGetLastError(comm), {"rank(s) 1", "chorusMemAlloc"}))
        << chorusGetLastError(comm);
    EXPECT_EQ(win, nullptr);
    ASSERT_EQ(chorusWindowRegister(comm, shared, 4096, &win), chorusSuccess) << chorusGetLastError(comm);
    char data[16] = {};
    EXPECT_EQ(chorusPutSignal(data, sizeof data, (rank + 1) % kRanks, win, 4090, 0, comm),
              chorusInvalidArgument);
    EXPECT_TRUE(mentions(chorusGetLastError(comm), {"do not fit", "4096 bytes"})) << chorusGetLastError(comm);
    EXPECT_EQ(chorusPutSignal(data, sizeof data, kRanks, win, 0, 0, comm), chorusInvalidArgument);
    EXPECT_EQ(chorusPutSignal(nullptr, 0, 0, nullptr, 0, CHORUS_SIGNALS, comm), chorusInvalidArgument);
    EXPECT_TRUE(mentions(chorusGetLastError(comm), {"signal 256"})) << chorusGetLastError(comm);
    // A wait that nobody answers times out, naming the peer and how many arrived.
    ASSERT_EQ(chorusCommSetTimeout(comm, 0.2), chorusSuccess);
    EXPECT_EQ(chorusWaitSignal((rank + 1) % kRanks, 9, 1, comm), chorusTimeout);
    EXPECT_TRUE(mentions(chorusGetLastError(comm), {"signal 9", "0 arrived"})) << chorusGetLastError(comm);
    ASSERT_EQ(chorusCommSetTimeout(comm, 0), chorusSuccess);
    // The communicator still works, and the window deregisters.
    ASSERT_EQ(chorusWindowDeregister(comm, win), chorusSuccess) << chorusGetLastError(comm);
    ASSERT_EQ(chorusMemFree(shared), chorusSuccess);
  });
}

TEST(OneSided, RevokeKeepsTheHandleForShrink) {
  onRanks([](int rank, chorusComm_t comm) {
    if (rank == 0) {
      ASSERT_EQ(chorusCommRevoke(comm), chorusSuccess);
    }
    int64_t one = 1, sum = 0;
    EXPECT_EQ(chorusAllReduce(&one, &sum, 1, chorusInt64, chorusSum, comm, nullptr), chorusRemoteError);
    EXPECT_TRUE(mentions(chorusGetLastError(comm), {"aborted"})) << chorusGetLastError(comm);
    chorusComm_t fresh = nullptr;
    ASSERT_EQ(chorusCommShrink(comm, nullptr, 0, &fresh), chorusSuccess) << chorusGetLastError(comm);
    ASSERT_EQ(chorusAllReduce(&one, &sum, 1, chorusInt64, chorusSum, fresh, nullptr), chorusSuccess);
    EXPECT_EQ(sum, kRanks);
    EXPECT_EQ(chorusCommDestroy(fresh), chorusSuccess);
  });
}

TEST(OneSided, MemoryLocalRanksAndSettings) {
  onRanks([](int rank, chorusComm_t comm) {
    std::vector<float> big(1 << 18, 1.0f);
    ASSERT_EQ(chorusAllReduce(big.data(), big.data(), big.size(), chorusFloat32, chorusSum, comm, nullptr),
              chorusSuccess);
    size_t bytes = 0;
    ASSERT_EQ(chorusCommMemoryBytes(comm, &bytes), chorusSuccess);
    EXPECT_GT(bytes, size_t{1} << 20) << "shared segments and staging";
    int count = 0, index = -1;
    ASSERT_EQ(chorusCommLocalRanks(comm, &count, &index), chorusSuccess);
    EXPECT_EQ(count, kRanks);
    EXPECT_EQ(index, rank);
  });
  const char* v = nullptr;
  ASSERT_EQ(chorusConfigGet("CHORUS_SHM_FIFO_BYTES", &v), chorusSuccess);
  EXPECT_STREQ(v, "1048576");
  ASSERT_EQ(chorusConfigGet("CHORUS_TIMEOUT", &v), chorusSuccess);
  const char* env = std::getenv("CHORUS_TIMEOUT");
  EXPECT_DOUBLE_EQ(std::stod(v), env ? std::stod(env) : 300.0) << v;
  ASSERT_EQ(chorusConfigGet("CHORUS_DEBUG_SUBSYS", &v), chorusSuccess);
  EXPECT_STREQ(v, "ALL");
  EXPECT_EQ(chorusConfigGet("CHORUS_NOPE", &v), chorusInvalidArgument);
  EXPECT_TRUE(mentions(chorusGetLastError(nullptr), {"CHORUS_NOPE", "not a Chorus setting"}));
}

}  // namespace
