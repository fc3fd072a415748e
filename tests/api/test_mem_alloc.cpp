// chorusMemAlloc / chorus::memAlloc and the zero-copy path: allocation, misuse, and collectives
// whose buffers come from it on all, some or none of the ranks (every mix must give exact
// results; only the path taken differs). Processes are covered by tests/perf (chorus-perf -M 1).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "api_test_util.hpp"
#include "chorus/chorus.h"
#include "chorus/chorus.hpp"

using namespace chorus;
using chorus::apitest::mentions;
using chorus::apitest::runRanks;
using chorus::apitest::testConfig;

namespace {

TEST(MemAlloc, PageAlignedZeroedWritable) {
  const size_t bytes = (size_t{1} << 20) + 5;
  auto* p = static_cast<unsigned char*>(memAlloc(bytes));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  for (size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(p[i], 0) << i;
  std::memset(p, 0x5a, bytes);
  EXPECT_EQ(p[bytes - 1], 0x5a);
  memFree(p);
  memFree(nullptr);  // no-op
}

TEST(MemAlloc, MisuseIsAnErrorNotACrash) {
  try {
    memAlloc(0);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
    EXPECT_TRUE(mentions(e.what(), {"chorusMemAlloc", "size"}));
  }
  int onStack = 0;
  try {
    memFree(&onStack);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
    EXPECT_TRUE(mentions(e.what(), {"chorusMemFree", "not returned by chorusMemAlloc"}));
  }
  void* p = memAlloc(100);
  memFree(p);
  EXPECT_THROW(memFree(p), Error);  // double free is caught too
  // More than the machine has fails with a system error, before reserving anything.
  try {
    memAlloc(size_t{1} << 50);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusSystemError) << e.what();
  }
}

TEST(MemAlloc, CApi) {
  void* p = nullptr;
  ASSERT_EQ(chorusMemAlloc(&p, 4096), chorusSuccess);
  ASSERT_NE(p, nullptr);
  static_cast<char*>(p)[4095] = 1;
  EXPECT_EQ(chorusMemFree(p), chorusSuccess);
  EXPECT_EQ(chorusMemAlloc(nullptr, 4096), chorusInvalidArgument);
  EXPECT_EQ(chorusMemAlloc(&p, 0), chorusInvalidArgument);
  EXPECT_EQ(p, nullptr);
  int x = 0;
  EXPECT_EQ(chorusMemFree(&x), chorusInvalidArgument);
  EXPECT_EQ(chorusMemFree(nullptr), chorusSuccess);
}

struct Freer {
  void operator()(void* p) const { memFree(p); }
};
using Shared = std::unique_ptr<void, Freer>;

// Buffers of one rank: from memAlloc (at an offset, to check that buffers inside an allocation
// work) or from the heap.
struct RankBuffers {
  Shared shared;
  std::vector<float> heap;
  float* send = nullptr;
  float* recv = nullptr;
  RankBuffers(bool fromMemAlloc, size_t sendCount, size_t recvCount) {
    const size_t offset = 16;  // floats
    if (fromMemAlloc) {
      shared.reset(memAlloc((offset + sendCount + recvCount) * sizeof(float)));
      send = static_cast<float*>(shared.get()) + offset;
    } else {
      heap.resize(sendCount + recvCount);
      send = heap.data();
    }
    recv = send + sendCount;
  }
};

// Which ranks use memAlloc: all (zero copy), some and none (staged): results identical.
class ZeroCopyMix : public ::testing::TestWithParam<int> {};

TEST_P(ZeroCopyMix, EveryCollectiveExact) {
  const int n = 3, mix = GetParam();
  auto shared = [&](int r) { return mix == 0 || (mix == 1 && r == 1); };
  auto comms = Communicator::createLocal(n, testConfig());
  const size_t count = 100'003;  // per rank, past the zero-copy threshold, not a multiple of anything
  runRanks(comms, [&](Communicator& c, int r) {
    auto value = [](int rank, size_t i) {
      return static_cast<float>((rank + 1) * 1000 + static_cast<int>(i % 997));
    };
    // AllReduce, out of place and in place.
    {
      RankBuffers b(shared(r), count, count);
      for (size_t i = 0; i < count; ++i) b.send[i] = value(r, i);
      c.allReduce(b.send, b.recv, count, DataType::Float32, ReduceOp::Sum);
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int k = 0; k < n; ++k) want += value(k, i);
        ASSERT_EQ(b.recv[i], want) << "allreduce rank " << r << " element " << i;
      }
      c.allReduce(b.send, b.send, count, DataType::Float32, ReduceOp::Max);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(b.send[i], value(n - 1, i)) << "in-place max " << i;
    }
    // ReduceScatter: n blocks of `count` in, one out.
    {
      RankBuffers b(shared(r), count * n, count);
      for (size_t i = 0; i < count * n; ++i) b.send[i] = value(r, i);
      c.reduceScatter(b.send, b.recv, count, DataType::Float32, ReduceOp::Sum);
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int k = 0; k < n; ++k) want += value(k, static_cast<size_t>(r) * count + i);
        ASSERT_EQ(b.recv[i], want) << "reducescatter rank " << r << " element " << i;
      }
    }
    // AllGather.
    {
      RankBuffers b(shared(r), count, count * n);
      for (size_t i = 0; i < count; ++i) b.send[i] = value(r, i);
      c.allGather(b.send, b.recv, count, DataType::Float32);
      for (int k = 0; k < n; ++k)
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(b.recv[static_cast<size_t>(k) * count + i], value(k, i)) << "allgather block " << k;
    }
    // Broadcast from rank 2.
    {
      RankBuffers b(shared(r), count, count);
      for (size_t i = 0; i < count; ++i) b.send[i] = value(r, i);
      c.broadcast(b.send, b.recv, count, DataType::Float32, 2);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(b.recv[i], value(2, i)) << "broadcast element " << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, ZeroCopyMix, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return p.param == 0   ? std::string("AllRanks")
                                  : p.param == 1 ? std::string("OneRank")
                                                 : std::string("NoRank");
                         });

// Back-to-back zero-copy calls that reuse and rewrite the buffers at once: the closing
// synchronisation must keep a fast rank from overwriting what a slow peer still reads.
TEST(ZeroCopy, ImmediateReuseNeverCorrupts) {
  const int n = 2;
  auto comms = Communicator::createLocal(n, testConfig());
  const size_t count = 1 << 16;
  runRanks(comms, [&](Communicator& c, int r) {
    RankBuffers b(true, count, count);
    for (int iter = 0; iter < 50; ++iter) {
      for (size_t i = 0; i < count; ++i)
        b.send[i] = static_cast<float>(iter * 10 + r + static_cast<int>(i % 7));
      c.allReduce(b.send, b.recv, count, DataType::Float32, ReduceOp::Sum);
      for (size_t i = 0; i < count; ++i) {
        const float want = static_cast<float>(2 * (iter * 10 + static_cast<int>(i % 7)) + 1);
        ASSERT_EQ(b.recv[i], want) << "iteration " << iter << " element " << i;
      }
      std::memset(b.recv, 0xff, count * sizeof(float));  // scribble at once
    }
  });
}

// Which ranks' buffers are shared changes from call to call (all, some, none), back to back: a
// rank with ordinary buffers answers the buffer exchange at once, without waiting for its peers, so
// it can run ahead into the staged path (and the next exchange) while a peer still reads its slot.
TEST(ZeroCopy, ChangingMixEveryCallStaysExact) {
  const int n = 3;
  auto comms = Communicator::createLocal(n, testConfig());
  const size_t count = 1 << 15;  // 128 KiB: past the zero-copy threshold
  runRanks(comms, [&](Communicator& c, int r) {
    RankBuffers shared(true, count, count * n), heap(false, count, count * n);
    for (int iter = 0; iter < 60; ++iter) {
      // iter % 4: 0 all shared, 1 only rank iter % 3, 2 all but rank iter % 3, 3 none.
      const int pick = iter % 3;
      const bool mine = iter % 4 == 0 || (iter % 4 == 1 && r == pick) || (iter % 4 == 2 && r != pick);
      RankBuffers& b = mine ? shared : heap;
      for (size_t i = 0; i < count; ++i)
        b.send[i] = static_cast<float>(iter * 8 + r + static_cast<int>(i % 5));
      c.allReduce(b.send, b.recv, count, DataType::Float32, ReduceOp::Sum);
      for (size_t i = 0; i < count; ++i) {
        const float want = static_cast<float>(n * (iter * 8 + static_cast<int>(i % 5)) + 0 + 1 + 2);
        ASSERT_EQ(b.recv[i], want) << "iteration " << iter << " rank " << r << " element " << i;
      }
      c.allGather(b.send, b.recv, count, DataType::Float32);
      for (int k = 0; k < n; ++k) {
        for (size_t i = 0; i < count; ++i) {
          const float want = static_cast<float>(iter * 8 + k + static_cast<int>(i % 5));
          ASSERT_EQ(b.recv[static_cast<size_t>(k) * count + i], want)
              << "allgather iteration " << iter << " block " << k;
        }
      }
    }
  });
}

}  // namespace
