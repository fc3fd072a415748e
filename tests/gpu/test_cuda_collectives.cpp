// Device-buffer collectives through the C API (a stream given): ranks as threads sharing one GPU,
// every result compared exactly with the CPU kernels' reduction in rank order, as on the host.
// Also CUDA graph capture and replay, calls on changing streams, the timeout and abort of a kernel
// whose peer never comes, destroy while kernels wait, send/recv kernels (in and out of groups, a
// size mismatch), and the operations staged through host memory. Skips, saying why, where no CUDA device is
// usable (tests/gpu/run.sh runs it on a machine with one).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "chorus/chorus.hpp"
#include "cpu/reduce.hpp"
#include "cuda/cuda_kernels.hpp"

namespace chorus {
namespace {

#define CUDA_OK(call)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (call);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_); \
  } while (0)
#define CHORUS_OK(call, comm)                                                  \
  do {                                                                         \
    const chorusResult_t r_ = (call);                                          \
    ASSERT_EQ(r_, chorusSuccess) << #call << ": " << chorusGetLastError(comm); \
  } while (0)

class DeviceCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (kernels::cuda::deviceCount(&why) == 0)
      GTEST_SKIP() << "no CUDA device here (" << why
                   << "); tests/gpu/run.sh runs these on a machine with one";
  }
};

using RankFn = std::function<void(int, chorusComm_t, cudaStream_t)>;

// `n` ranks as threads on device 0, each with a communicator and a non-blocking stream, kept for
// several rounds (set-up of the device state happens once).
class Ranks {
 public:
  explicit Ranks(int n) : comms_(static_cast<size_t>(n)), streams_(static_cast<size_t>(n)) {
    EXPECT_EQ(chorusCommInitAll(comms_.data(), n, nullptr), chorusSuccess) << chorusGetLastError(nullptr);
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
    for (auto& s : streams_) EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  }
  ~Ranks() {
    for (auto c : comms_) chorusCommDestroy(c);
    for (auto s : streams_) cudaStreamDestroy(s);
  }
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;
  /// fn(rank, comm, stream) on every rank's thread; returns once all are done and synchronized.
  void run(const RankFn& fn) {
    std::vector<std::thread> threads;
    for (size_t r = 0; r < comms_.size(); ++r) {
      threads.emplace_back([&, r] {
        ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
        fn(static_cast<int>(r), comms_[r], streams_[r]);
        EXPECT_EQ(cudaStreamSynchronize(streams_[r]), cudaSuccess);
      });
    }
    for (auto& t : threads) t.join();
  }
  int size() const { return static_cast<int>(comms_.size()); }

 private:
  std::vector<chorusComm_t> comms_;
  std::vector<cudaStream_t> streams_;
};

// Runs fn on `n` fresh ranks.
void onRanks(int n, const RankFn& fn) {
  Ranks ranks(n);
  ranks.run(fn);
}

struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) : bytes(bytes) {
    EXPECT_EQ(cudaMalloc(&p, bytes ? bytes : 1), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::byte* get() const { return static_cast<std::byte*>(p); }
  void* p = nullptr;
  size_t bytes;
};

// Values 1..3 (as the type): sums and products of up to 8 ranks stay exact in every type.
std::vector<std::byte> inputOf(int rank, size_t count, DataType t, unsigned salt) {
  const size_t e = dataTypeSize(t);
  std::vector<std::byte> out(count * e);
  std::mt19937 rng(static_cast<unsigned>(rank) * 7919u + salt);
  for (size_t i = 0; i < count; ++i) {
    const int v = 1 + static_cast<int>(rng() % 3);
    std::byte* p = out.data() + i * e;
    switch (t) {
      case DataType::Float32: {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DataType::Float64: {
        const double d = v;
        std::memcpy(p, &d, 8);
        break;
      }
      case DataType::Float16: {
        const uint16_t bits[] = {0, 0x3C00, 0x4000, 0x4200};
        std::memcpy(p, &bits[v], 2);
        break;
      }
      case DataType::BFloat16: {
        const uint16_t bits[] = {0, 0x3F80, 0x4000, 0x4040};
        std::memcpy(p, &bits[v], 2);
        break;
      }
      default: {
        const uint64_t x = static_cast<uint64_t>(v);
        std::memcpy(p, &x, e);  // little endian: the low bytes
        break;
      }
    }
  }
  return out;
}

std::string firstDifference(const std::vector<std::byte>& got, const std::vector<std::byte>& want, size_t e) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i])
      return "first differing byte " + std::to_string(i) + " (element " + std::to_string(i / e) + " of " +
             std::to_string(want.size() / e) + ")";
  }
  return "";
}

enum class Coll { AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, AllToAll };
const char* collName(Coll c) {
  static const char* names[] = {"allreduce", "reduce_scatter", "all_gather",
                                "broadcast", "reduce",         "alltoall"};
  return names[static_cast<int>(c)];
}

// One call on every rank, in or out of place, checked exactly on every rank that has a result.
void checkCollective(Ranks& ranks, Coll coll, size_t count, DataType type, ReduceOp op, bool inPlace) {
  const int n = ranks.size();
  SCOPED_TRACE(std::string(collName(coll)) + " n=" + std::to_string(n) + " count=" + std::to_string(count) +
               " " + dataTypeName(type) + " " + reduceOpName(op) + (inPlace ? " in place" : ""));
  const size_t e = dataTypeSize(type);
  const auto N = static_cast<size_t>(n);
  const int root = n - 1;
  size_t inCount = count, outCount = count;
  if (coll == Coll::ReduceScatter) inCount = count * N;
  if (coll == Coll::AllGather) outCount = count * N;
  if (coll == Coll::AllToAll) inCount = outCount = count * N;
  std::vector<std::vector<std::byte>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(inputOf(r, inCount, type, static_cast<unsigned>(count)));
  std::vector<std::byte> reduced(inCount * e);
  {
    std::vector<const void*> srcs;
    for (auto& in : inputs) srcs.push_back(in.data());
    kernels::reduce(reduced.data(), srcs.data(), n, inCount, type, op, n);
  }
  const auto dt = static_cast<chorusDataType_t>(type);
  const auto ro = static_cast<chorusRedOp_t>(op);
  ranks.run([&](int r, chorusComm_t comm, cudaStream_t s) {
    const auto R = static_cast<size_t>(r);
    DeviceBuffer recv(std::max(inCount, outCount) * e), sendBuf(inCount * e);
    std::byte* send = sendBuf.get();
    std::byte* out = recv.get();
    if (inPlace) {
      // NCCL's in-place forms: all_gather send = recv + rank*count, reduce_scatter recv = send + rank*count.
      if (coll == Coll::AllGather) {
        send = recv.get() + R * count * e;
      } else if (coll == Coll::ReduceScatter) {
        send = recv.get();
        out = recv.get() + R * count * e;
      } else {
        send = recv.get();
      }
    }
    // On the rank's stream: a plain cudaMemcpy from pageable memory may return before the transfer.
    CUDA_OK(cudaMemcpyAsync(send, inputs[R].data(), inCount * e, cudaMemcpyHostToDevice, s));
    switch (coll) {
      case Coll::AllReduce:
        CHORUS_OK(chorusAllReduce(send, out, count, dt, ro, comm, s), comm);
        break;
      case Coll::ReduceScatter:
        CHORUS_OK(chorusReduceScatter(send, out, count, dt, ro, comm, s), comm);
        break;
      case Coll::AllGather:
        CHORUS_OK(chorusAllGather(send, out, count, dt, comm, s), comm);
        break;
      case Coll::Broadcast:
        CHORUS_OK(chorusBroadcast(send, out, count, dt, root, comm, s), comm);
        break;
      case Coll::Reduce:
        CHORUS_OK(chorusReduce(send, out, count, dt, ro, root, comm, s), comm);
        break;
      case Coll::AllToAll:
        CHORUS_OK(chorusAllToAll(send, out, count, dt, comm, s), comm);
        break;
    }
    CUDA_OK(cudaStreamSynchronize(s));
    chorusResult_t async = chorusSuccess;
    CHORUS_OK(chorusCommGetAsyncError(comm, &async), comm);
    ASSERT_EQ(async, chorusSuccess) << chorusGetLastError(comm);
    std::vector<std::byte> got(outCount * e), want(outCount * e);
    CUDA_OK(cudaMemcpyAsync(got.data(), out, outCount * e, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    switch (coll) {
      case Coll::AllReduce:
        want = reduced;
        break;
      case Coll::ReduceScatter:
        std::memcpy(want.data(), reduced.data() + R * count * e, count * e);
        break;
      case Coll::AllGather:
        for (size_t q = 0; q < N; ++q) std::memcpy(want.data() + q * count * e, inputs[q].data(), count * e);
        break;
      case Coll::Broadcast:
        want = inputs[static_cast<size_t>(root)];
        break;
      case Coll::Reduce:
        if (r != root) return;
        want = reduced;
        break;
      case Coll::AllToAll:
        for (size_t q = 0; q < N; ++q)
          std::memcpy(want.data() + q * count * e, inputs[q].data() + R * count * e, count * e);
        break;
    }
    EXPECT_EQ(firstDifference(got, want, e), "") << "rank " << r;
  });
}

TEST_F(DeviceCollectives, EveryCollectiveExact) {
  struct TypeOp {
    DataType t;
    ReduceOp op;
  };
  const TypeOp typeOps[] = {{DataType::Float32, ReduceOp::Sum}, {DataType::BFloat16, ReduceOp::Sum},
                            {DataType::Float16, ReduceOp::Max}, {DataType::Int8, ReduceOp::Prod},
                            {DataType::Float64, ReduceOp::Avg}, {DataType::Uint64, ReduceOp::Min},
                            {DataType::Int32, ReduceOp::Sum}};
  // Around the LL limit (64 KiB), and over the 8 MiB stage (several pieces).
  const size_t counts[] = {1, 7, 1000, 16383, 16385, 300001, 3u << 20};
  for (int n : {2, 4, 8}) {
    Ranks ranks(n);  // one set-up per rank count; every call below reuses it
    for (Coll c : {Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather, Coll::Broadcast, Coll::Reduce,
                   Coll::AllToAll}) {
      for (size_t count : counts) {
        if (count * static_cast<size_t>(n) >= (size_t{24} << 20) && c != Coll::AllReduce) continue;
        for (const TypeOp& to : typeOps) {
          // Large counts: float32 and bfloat16 sums only (the CPU reference takes its time too).
          if (count >= 16383 && to.t != DataType::Float32 && to.t != DataType::BFloat16) continue;
          for (bool inPlace : {false, true}) {
            checkCollective(ranks, c, count, to.t, to.op, inPlace);
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

// Byte i of the k-th message from src to dst.
unsigned char p2pByte(int src, int dst, int k, size_t i) {
  return static_cast<unsigned char>(
      (i * 131 + static_cast<size_t>(k) * 29 + static_cast<size_t>(src) * 7 + static_cast<size_t>(dst) * 3) %
      251);
}

// One send/recv round on every rank: messages of `bytes` (int8), `off` bytes into their buffers.
struct P2pMsg {
  int peer;
  bool send;
  size_t bytes;
  size_t off;
  int k;  // which message of its pair
};

// One send/recv round: rank r's messages msgs[r] (none: it sits the round out). The buffers are
// made and filled by this thread before any rank calls, and freed after every rank is done:
// cudaMalloc, cudaFree and pageable copies in a rank's thread can wait for a peer's kernel that
// waits for this rank to launch (docs/gpu.md; seen on the H200 as a rank timing out).
void runP2pRound(Ranks& ranks, const std::vector<std::vector<P2pMsg>>& msgs, bool group) {
  std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> bufs(msgs.size());
  for (size_t r = 0; r < msgs.size(); ++r) {
    for (const P2pMsg& m : msgs[r]) {
      bufs[r].push_back(std::make_unique<DeviceBuffer>(m.bytes + m.off + 64));
      std::vector<unsigned char> host(m.bytes + m.off + 64, 0xEE);
      if (m.send) {
        for (size_t i = 0; i < m.bytes; ++i) host[m.off + i] = p2pByte(static_cast<int>(r), m.peer, m.k, i);
      }
      CUDA_OK(cudaMemcpy(bufs[r].back()->get(), host.data(), host.size(), cudaMemcpyHostToDevice));
    }
  }
  ranks.run([&](int r, chorusComm_t comm, cudaStream_t s) {
    const auto R = static_cast<size_t>(r);
    if (msgs[R].empty()) return;
    if (group) CHORUS_OK(chorusGroupStart(), comm);
    for (size_t i = 0; i < msgs[R].size(); ++i) {
      const P2pMsg& m = msgs[R][i];
      if (m.send)
        CHORUS_OK(chorusSend(bufs[R][i]->get() + m.off, m.bytes, chorusInt8, m.peer, comm, s), comm);
      else
        CHORUS_OK(chorusRecv(bufs[R][i]->get() + m.off, m.bytes, chorusInt8, m.peer, comm, s), comm);
    }
    if (group) CHORUS_OK(chorusGroupEnd(), comm);
    CUDA_OK(cudaStreamSynchronize(s));
    // A kernel that failed is named (with where it waited) before the data it left is compared.
    chorusResult_t async = chorusSuccess;
    CHORUS_OK(chorusCommGetAsyncError(comm, &async), comm);
    ASSERT_EQ(async, chorusSuccess) << "rank " << r << ": " << chorusGetLastError(comm);
    for (size_t i = 0; i < msgs[R].size(); ++i) {
      const P2pMsg& m = msgs[R][i];
      std::vector<unsigned char> host(m.bytes + m.off + 64);
      CUDA_OK(cudaMemcpyAsync(host.data(), bufs[R][i]->get(), host.size(), cudaMemcpyDeviceToHost, s));
      CUDA_OK(cudaStreamSynchronize(s));
      for (size_t j = 0; j < host.size(); ++j) {
        const bool inside = j >= m.off && j < m.off + m.bytes;
        const unsigned char want = !inside  ? 0xEE
                                   : m.send ? p2pByte(r, m.peer, m.k, j - m.off)
                                            : p2pByte(m.peer, r, m.k, j - m.off);
        ASSERT_EQ(host[j], want) << "rank " << r << (m.send ? " send to " : " receive from ") << m.peer
                                 << " of " << m.bytes << " bytes, byte " << j;
      }
    }
  });
}

TEST_F(DeviceCollectives, SendRecvOverIpcExact) {
  // Sizes from 1 byte to many times a FIFO (4 slots of 64 KiB per channel), buffers off alignment.
  const size_t sizes[] = {1, 17, 4096, 65537, 1u << 20, (5u << 20) + 3};
  for (int n : {2, 4}) {
    const auto N = static_cast<size_t>(n);
    Ranks ranks(n);
    int k = 0;  // messages so far between every pair (the same for all pairs)
    for (size_t bytes : sizes) {
      SCOPED_TRACE("ranks " + std::to_string(n) + ", " + std::to_string(bytes) + " bytes");
      // A ring exchange in a group: each rank sends to the next and receives from the one before.
      std::vector<std::vector<P2pMsg>> ring(N);
      for (int r = 0; r < n; ++r) {
        ring[static_cast<size_t>(r)] = {{(r + 1) % n, true, bytes, static_cast<size_t>(r) % 3, k},
                                        {(r + n - 1) % n, false, bytes, 5, k}};
      }
      runP2pRound(ranks, ring, true);
      ++k;
      // Rank 0 to rank 1 outside a group: each side a kernel of its own.
      std::vector<std::vector<P2pMsg>> pair(N);
      pair[0] = {{1, true, bytes, 0, k}};
      pair[1] = {{0, false, bytes, 0, k}};
      runP2pRound(ranks, pair, false);
      if (HasFailure()) return;
    }
    // Everyone to everyone (self included) in one group: an all-to-all of sends and receives.
    std::vector<std::vector<P2pMsg>> all(N);
    for (int r = 0; r < n; ++r) {
      for (int q = 0; q < n; ++q) {
        all[static_cast<size_t>(r)].push_back({q, true, 300001 + static_cast<size_t>(q), 0, 100});
        all[static_cast<size_t>(r)].push_back({q, false, 300001 + static_cast<size_t>(r), 1, 100});
      }
    }
    runP2pRound(ranks, all, true);
  }
}

TEST_F(DeviceCollectives, OneThreadDrivesBothEndsOfAnExchangeInAGroup) {
  // As with NCCL: one thread, every rank's calls in one group, messages far larger than the FIFOs.
  // A device list sets every rank's device state up at once (set-up is collective, so ranks set up
  // lazily, on their first device call, need a thread each).
  const int n = 2;
  std::vector<chorusComm_t> comms(n);
  const int devlist[n] = {0, 0};
  ASSERT_EQ(chorusCommInitAll(comms.data(), n, devlist), chorusSuccess) << chorusGetLastError(nullptr);
  const size_t bytes = 8u << 20;
  std::vector<std::unique_ptr<DeviceBuffer>> send, recv;
  std::vector<cudaStream_t> streams(n);
  for (int r = 0; r < n; ++r) {
    send.push_back(std::make_unique<DeviceBuffer>(bytes));
    recv.push_back(std::make_unique<DeviceBuffer>(bytes));
    CUDA_OK(cudaStreamCreateWithFlags(&streams[static_cast<size_t>(r)], cudaStreamNonBlocking));
    CUDA_OK(cudaMemset(send.back()->get(), 10 + r, bytes));
  }
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  for (int r = 0; r < n; ++r) {
    const auto R = static_cast<size_t>(r);
    ASSERT_EQ(chorusSend(send[R]->get(), bytes, chorusUint8, 1 - r, comms[R], streams[R]), chorusSuccess)
        << chorusGetLastError(comms[R]);
    ASSERT_EQ(chorusRecv(recv[R]->get(), bytes, chorusUint8, 1 - r, comms[R], streams[R]), chorusSuccess)
        << chorusGetLastError(comms[R]);
  }
  ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    const auto R = static_cast<size_t>(r);
    CUDA_OK(cudaStreamSynchronize(streams[R]));
    chorusResult_t async = chorusSuccess;
    ASSERT_EQ(chorusCommGetAsyncError(comms[R], &async), chorusSuccess);
    EXPECT_EQ(async, chorusSuccess) << chorusGetLastError(comms[R]);
    std::vector<unsigned char> host(bytes);
    CUDA_OK(cudaMemcpy(host.data(), recv[R]->get(), bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(host[0], 10 + (1 - r));
    EXPECT_EQ(host[bytes - 1], 10 + (1 - r));
    chorusCommDestroy(comms[R]);
    cudaStreamDestroy(streams[R]);
  }
}

TEST_F(DeviceCollectives, AReceiveOfAnotherSizeIsAnAsyncError) {
  onRanks(2, [](int r, chorusComm_t comm, cudaStream_t s) {
    DeviceBuffer buf(8192);
    CHORUS_OK(chorusCommSetTimeout(comm, 2.0), comm);
    if (r == 0)
      CHORUS_OK(chorusSend(buf.get(), 5000, chorusUint8, 1, comm, s), comm);
    else
      CHORUS_OK(chorusRecv(buf.get(), 4000, chorusUint8, 0, comm, s), comm);
    CUDA_OK(cudaStreamSynchronize(s));
    chorusResult_t async = chorusSuccess;
    CHORUS_OK(chorusCommGetAsyncError(comm, &async), comm);
    if (r == 0) {
      EXPECT_EQ(async, chorusSuccess) << "the send fits in the FIFO";
    } else {
      EXPECT_EQ(async, chorusInvalidUsage);
      EXPECT_NE(std::string(chorusGetLastError(comm)).find("met a send of another size"), std::string::npos)
          << chorusGetLastError(comm);
    }
  });
}

TEST_F(DeviceCollectives, BarrierIsStagedAndExact) {
  // The barrier goes through host memory; a send/recv before it must have completed after it.
  onRanks(2, [](int r, chorusComm_t comm, cudaStream_t s) {
    DeviceBuffer buf(4096);
    std::vector<int32_t> host(1024, r == 0 ? 42 : 0);
    CUDA_OK(cudaMemcpyAsync(buf.get(), host.data(), 4096, cudaMemcpyHostToDevice, s));
    if (r == 0)
      CHORUS_OK(chorusSend(buf.get(), 1024, chorusInt32, 1, comm, s), comm);
    else
      CHORUS_OK(chorusRecv(buf.get(), 1024, chorusInt32, 0, comm, s), comm);
    CHORUS_OK(chorusBarrier(comm, s), comm);
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpyAsync(host.data(), buf.get(), 4096, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_EQ(host[0], 42);
    EXPECT_EQ(host[1023], 42);
  });
}

TEST_F(DeviceCollectives, AllToAllvBetweenAllReducesIsEnqueuedInOrder) {
  // allreduce, then an all-to-all-v (a send/recv kernel; under CHORUS_CUDA_IPC=0, which run.sh's
  // second pass sets, staged: enqueued, the call returning before it has run), then an allreduce
  // of its output: each must see the one before.
  onRanks(2, [](int r, chorusComm_t comm, cudaStream_t s) {
    const size_t n = 1024, half = n / 2;
    DeviceBuffer x(n * 4), y(n * 4);
    std::vector<float> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(r * 1000 + static_cast<int>(i));
    CUDA_OK(cudaMemcpyAsync(x.get(), host.data(), n * 4, cudaMemcpyHostToDevice, s));
    CHORUS_OK(chorusAllReduce(x.get(), x.get(), n, chorusFloat32, chorusSum, comm, s), comm);  // 1000 + 2i
    const size_t counts[2] = {half, half}, displs[2] = {0, half};
    CHORUS_OK(chorusAllToAllv(x.get(), counts, displs, y.get(), counts, displs, chorusFloat32, comm, s),
              comm);
    CHORUS_OK(chorusAllReduce(y.get(), y.get(), n, chorusFloat32, chorusSum, comm, s), comm);
    CUDA_OK(cudaMemcpyAsync(host.data(), y.get(), n * 4, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    chorusResult_t async = chorusSuccess;
    CHORUS_OK(chorusCommGetAsyncError(comm, &async), comm);
    ASSERT_EQ(async, chorusSuccess) << "rank " << r << ": " << chorusGetLastError(comm);
    // y on rank r, block q: x[r*half + j] = 1000 + 2(r*half + j); summed over r: 2000 + 4j + 2*half.
    for (size_t q = 0; q < 2; ++q) {
      for (size_t j = 0; j < half; j += 97) {
        const float want = 2000.0f + 4.0f * static_cast<float>(j) + 2.0f * static_cast<float>(half);
        ASSERT_EQ(host[q * half + j], want) << "rank " << r << " block " << q << " element " << j;
      }
    }
  });
}

TEST_F(DeviceCollectives, CapturedInAGraphReplaysCorrectly) {
  const size_t count = 1 << 20;  // Simple
  const size_t small = 1000;     // LL
  onRanks(4, [&](int r, chorusComm_t comm, cudaStream_t s) {
    DeviceBuffer big(count * 4), little(small * 4);
    // One call before capturing sets up the communicator's device state.
    CHORUS_OK(chorusAllReduce(big.get(), big.get(), count, chorusFloat32, chorusSum, comm, s), comm);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHORUS_OK(chorusAllReduce(big.get(), big.get(), count, chorusFloat32, chorusSum, comm, s), comm);
    CHORUS_OK(chorusAllReduce(little.get(), little.get(), small, chorusFloat32, chorusSum, comm, s), comm);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) {
      std::vector<float> a(count, static_cast<float>(r + replay)),
          b(small, static_cast<float>(2 * r + replay));
      CUDA_OK(cudaMemcpyAsync(big.get(), a.data(), count * 4, cudaMemcpyHostToDevice, s));
      CUDA_OK(cudaMemcpyAsync(little.get(), b.data(), small * 4, cudaMemcpyHostToDevice, s));
      CUDA_OK(cudaGraphLaunch(exec, s));
      CUDA_OK(cudaStreamSynchronize(s));
      CUDA_OK(cudaMemcpyAsync(a.data(), big.get(), count * 4, cudaMemcpyDeviceToHost, s));
      CUDA_OK(cudaMemcpyAsync(b.data(), little.get(), small * 4, cudaMemcpyDeviceToHost, s));
      CUDA_OK(cudaStreamSynchronize(s));
      const float wantA = 0 + 1 + 2 + 3 + 4.0f * replay, wantB = 2 * (0 + 1 + 2 + 3) + 4.0f * replay;
      EXPECT_EQ(a[0], wantA) << "replay " << replay;
      EXPECT_EQ(a[count - 1], wantA) << "replay " << replay;
      EXPECT_EQ(b[0], wantB) << "replay " << replay;
      EXPECT_EQ(b[small - 1], wantB) << "replay " << replay;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  });
}

TEST_F(DeviceCollectives, CallsOnChangingStreamsStayInOrder) {
  onRanks(2, [](int r, chorusComm_t comm, cudaStream_t s) {
    cudaStream_t other = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    const size_t count = 1 << 20;
    DeviceBuffer buf(count * 4);
    std::vector<float> host(count, static_cast<float>(r + 1));
    CUDA_OK(cudaMemcpyAsync(buf.get(), host.data(), count * 4, cudaMemcpyHostToDevice, s));
    // (1 + 2) = 3, then 3 + 3 = 6, then 12: each call must see the previous one's result.
    CHORUS_OK(chorusAllReduce(buf.get(), buf.get(), count, chorusFloat32, chorusSum, comm, s), comm);
    CHORUS_OK(chorusAllReduce(buf.get(), buf.get(), count, chorusFloat32, chorusSum, comm, other), comm);
    CHORUS_OK(chorusAllReduce(buf.get(), buf.get(), count, chorusFloat32, chorusSum, comm, s), comm);
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaStreamSynchronize(other));
    CUDA_OK(cudaMemcpyAsync(host.data(), buf.get(), count * 4, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_EQ(host[0], 12.0f);
    EXPECT_EQ(host[count - 1], 12.0f);
    cudaStreamDestroy(other);
  });
}

TEST_F(DeviceCollectives, MissingPeerTimesOutAsAnAsyncError) {
  // Each kind of wait a kernel can time out in, named in the message with where it waited: an LL
  // allreduce (4 KiB), a Simple one (4 MiB: its first barrier), a receive whose send never comes.
  struct Case {
    const char* name;
    size_t count;  // float32 elements
    bool receive;
    const char* where;
  };
  const Case cases[] = {{"LL allreduce", 1024, false, "polled a low-latency line for flag"},
                        {"Simple allreduce", 1u << 20, false, "waited at barrier 0 of kernel #"},
                        {"receive", 1024, true, "channel 0 waited for chunk 0 of rank 1, which had put 0"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    onRanks(2, [&](int r, chorusComm_t comm, cudaStream_t s) {
      DeviceBuffer buf(c.count * 4);
      // Set up the device state on both ranks first, then only rank 0 calls.
      CHORUS_OK(chorusAllReduce(buf.get(), buf.get(), 16, chorusFloat32, chorusSum, comm, s), comm);
      CUDA_OK(cudaStreamSynchronize(s));
      if (r != 0) return;
      CHORUS_OK(chorusCommSetTimeout(comm, 1.0), comm);
      const auto start = std::chrono::steady_clock::now();
      if (c.receive)
        CHORUS_OK(chorusRecv(buf.get(), c.count, chorusFloat32, 1, comm, s), comm);
      else
        CHORUS_OK(chorusAllReduce(buf.get(), buf.get(), c.count, chorusFloat32, chorusSum, comm, s), comm);
      CUDA_OK(cudaStreamSynchronize(s));
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_GE(waited, 0.9);
      EXPECT_LT(waited, 30.0);
      chorusResult_t async = chorusSuccess;
      CHORUS_OK(chorusCommGetAsyncError(comm, &async), comm);
      EXPECT_EQ(async, chorusTimeout);
      const std::string text = chorusGetLastError(comm);
      EXPECT_NE(text.find("waiting for rank 1"), std::string::npos) << text;
      EXPECT_NE(text.find(c.where), std::string::npos) << text;
      // Later device calls fail at once with the same cause.
      EXPECT_EQ(chorusAllReduce(buf.get(), buf.get(), 16, chorusFloat32, chorusSum, comm, s), chorusTimeout);
    });
  }
}

TEST_F(DeviceCollectives, AbortStopsAWaitingKernel) {
  std::vector<chorusComm_t> comms(2);
  ASSERT_EQ(chorusCommInitAll(comms.data(), 2, nullptr), chorusSuccess);
  std::vector<std::thread> threads;
  std::atomic<bool> setUp{false};
  DeviceBuffer buf0(4096), buf1(4096);
  cudaStream_t s0 = nullptr, s1 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  std::thread peer([&] {
    cudaSetDevice(0);
    EXPECT_EQ(chorusAllReduce(buf1.get(), buf1.get(), 1024, chorusFloat32, chorusSum, comms[1], s1),
              chorusSuccess);
    cudaStreamSynchronize(s1);
  });
  ASSERT_EQ(chorusAllReduce(buf0.get(), buf0.get(), 1024, chorusFloat32, chorusSum, comms[0], s0),
            chorusSuccess);
  cudaStreamSynchronize(s0);
  peer.join();
  // Rank 0 waits for a rank 1 that never comes (for its timeout, 20 s or more); aborting stops it at once.
  ASSERT_EQ(chorusAllReduce(buf0.get(), buf0.get(), 1024, chorusFloat32, chorusSum, comms[0], s0),
            chorusSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(chorusCommAbort(comms[0]), chorusSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s0), cudaSuccess);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  chorusCommDestroy(comms[1]);
  cudaStreamDestroy(s0);
  cudaStreamDestroy(s1);
}

// Destroy is bounded with device buffers too: rank 1's thread destroys its handles of two
// communicators while rank 0's kernels on both wait for rank 1 (which never calls), then rank 0
// destroys its own. Freeing device memory can wait for every kernel on the device, the waiting
// ones included, so a destroy may last until they time out: never longer (timeout 2 s here).
TEST_F(DeviceCollectives, DestroyWhileKernelsWaitReturnsWithinTheTimeout) {
  std::vector<chorusComm_t> a(2), b(2);
  ASSERT_EQ(chorusCommInitAll(a.data(), 2, nullptr), chorusSuccess);
  ASSERT_EQ(chorusCommInitAll(b.data(), 2, nullptr), chorusSuccess);
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  std::vector<cudaStream_t> streams(4, nullptr);  // a0, a1, b0, b1
  for (auto& st : streams) {
    bufs.push_back(std::make_unique<DeviceBuffer>(4096));
    ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  }
  const auto call = [&](int i, chorusComm_t c) {
    return chorusAllReduce(bufs[i]->get(), bufs[i]->get(), 1024, chorusFloat32, chorusSum, c, streams[i]);
  };
  // Both ranks set up their device state on both communicators first.
  std::thread one([&] {
    cudaSetDevice(0);
    EXPECT_EQ(call(1, a[1]), chorusSuccess);
    EXPECT_EQ(call(3, b[1]), chorusSuccess);
    cudaStreamSynchronize(streams[1]);
    cudaStreamSynchronize(streams[3]);
  });
  EXPECT_EQ(call(0, a[0]), chorusSuccess);  // no ASSERT while `one` runs: it must be joined
  EXPECT_EQ(call(2, b[0]), chorusSuccess);
  cudaStreamSynchronize(streams[0]);
  cudaStreamSynchronize(streams[2]);
  one.join();
  for (chorusComm_t c : {a[0], a[1], b[0], b[1]}) ASSERT_EQ(chorusCommSetTimeout(c, 2.0), chorusSuccess);
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  // Rank 0's kernels wait for rank 1 on both communicators.
  ASSERT_EQ(call(0, a[0]), chorusSuccess);
  ASSERT_EQ(call(2, b[0]), chorusSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  double destroyA1 = -1, destroyB1 = -1;
  std::thread destroyer([&] {
    cudaSetDevice(0);
    const auto t0 = Clock::now();
    EXPECT_EQ(chorusCommDestroy(a[1]), chorusSuccess);
    destroyA1 = seconds(t0);
    const auto t1 = Clock::now();
    EXPECT_EQ(chorusCommDestroy(b[1]), chorusSuccess);
    destroyB1 = seconds(t1);
  });
  destroyer.join();
  const auto t2 = Clock::now();
  EXPECT_EQ(chorusCommDestroy(a[0]), chorusSuccess);
  const double destroyA0 = seconds(t2);
  cudaStreamSynchronize(streams[2]);
  const auto t3 = Clock::now();
  EXPECT_EQ(chorusCommDestroy(b[0]), chorusSuccess);
  const double destroyB0 = seconds(t3);
  for (double d : {destroyA1, destroyB1, destroyA0, destroyB0}) {
    EXPECT_GE(d, 0.0);
    EXPECT_LT(d, 2.0 + 8.0) << "a destroy outlasted the kernels' timeout (2 s) by more than 8 s";
  }
  std::printf("destroy: rank 1 of A %.3f s, of B %.3f s; rank 0 of A %.3f s, of B %.3f s\n", destroyA1,
              destroyB1, destroyA0, destroyB0);
  for (auto st : streams) cudaStreamDestroy(st);
}

TEST_F(DeviceCollectives, HostMemoryWithAStreamIsStaged) {
  onRanks(2, [](int r, chorusComm_t comm, cudaStream_t s) {
    // Host memory with a stream is staged (same on every rank), and correct.
    std::vector<float> host(100, static_cast<float>(r + 1));
    CHORUS_OK(chorusAllReduce(host.data(), host.data(), 100, chorusFloat32, chorusSum, comm, s), comm);
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_EQ(host[99], 3.0f);
  });
}

}  // namespace
}  // namespace chorus
