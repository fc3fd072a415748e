// The device collectives' synchronisation (kernels/cuda/ipc_steps.hpp's kernel bodies) run by real
// threads on the host: every block of every rank is a thread, flags and kernel numbers are atomics
// with the orderings the kernels' fences give, and each rank runs its calls one after another (as
// a stream does) while the ranks run side by side. A sequence of calls of every kind, sizes and
// grids back to back exercises the per-block barriers, the kernel numbers bumped by the last block,
// the halves and LL slots that alternate between kernels, and the barrier that ends each kernel.
// The send/recv kernel (p2pKernelBody) runs the same way, one thread per lane: FIFOs that fill up
// and drain, counters that carry on across kernels, several messages to one peer, exchanges with
// self, and a receive that meets a send of another size.
// Results are checked exactly; under ThreadSanitizer (the TSan pass runs this binary) any read the
// protocol does not order after its write is reported as a race. No GPU needed.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cpu/reduce.hpp"
#include "kernels/cuda/ipc_steps.hpp"

namespace chorus::kernels::cuda::ipc {
namespace {

using Clock = std::chrono::steady_clock;

struct Call {
  Kind kind;
  size_t count;  // as the API counts (per rank for reduce-scatter and all-gather)
  DataType type;
  ReduceOp op;
  bool inPlace;
};

// One rank's workspace and buffers.
struct Rank {
  std::vector<Vec16> ws;
  std::vector<std::vector<Byte>> inputs, recv;  // per call
  uint32_t error = 0;                           // what a kernel reports (why << 16 | peer + 1)
};

struct World {
  World(int n, size_t stageBytes, size_t llBytes, size_t p2pChunk = 4096)
      : layout(makeLayout(stageBytes, llBytes, p2pChunk, n)), ranks(n) {
    for (auto& r : ranks) r.ws.assign(layout.total / sizeof(Vec16) + 1, Vec16{});
  }
  Byte* base(int r) { return reinterpret_cast<Byte*>(ranks[static_cast<size_t>(r)].ws.data()); }
  Signals& sig(int r) { return *reinterpret_cast<Signals*>(base(r)); }
  Layout layout;
  std::vector<Rank> ranks;
  std::chrono::milliseconds timeout{20000};
};

template <typename T>
std::atomic_ref<T> at(T& x) {
  return std::atomic_ref<T>(x);
}

// ipc_steps.hpp's memory operations: plain memory for data, atomics for LL lines.
struct HostMem {
  World& w;
  int rank;
  DataType type;
  ReduceOp op;

  void copy(Byte* dst, const Byte* src, size_t n) { std::memmove(dst, src, n); }
  Vec16 load(const Byte* src) {
    Vec16 v;
    std::memcpy(&v, src, 16);
    return v;
  }
  void store(Byte* dst, const Vec16& v, size_t n) { std::memcpy(dst, &v, n); }
  Vec16 reduce(const Vec16* in, int n) {
    const void* srcs[kMaxRanks];
    for (int k = 0; k < n; ++k) srcs[k] = &in[k];
    Vec16 out;
    kernels::reduce(&out, srcs, n, 16 / dataTypeSize(type), type, op, static_cast<int>(w.ranks.size()));
    return out;
  }
  // A line as two 8-byte {data, flag} halves, as the GPU's vector store guarantees.
  void storeLine(Byte* dst, const Vec16& line) {
    uint64_t half[2];
    std::memcpy(half, &line, 16);
    at(reinterpret_cast<uint64_t*>(dst)[0]).store(half[0], std::memory_order_release);
    at(reinterpret_cast<uint64_t*>(dst)[1]).store(half[1], std::memory_order_release);
  }
  bool pollLine(const Byte* src, uint32_t flag, int peer, Vec16* line) {
    auto* p = reinterpret_cast<uint64_t*>(const_cast<Byte*>(src));
    const auto start = Clock::now();
    for (;;) {
      const uint64_t half[2] = {at(p[0]).load(std::memory_order_acquire),
                                at(p[1]).load(std::memory_order_acquire)};
      std::memcpy(line, half, 16);
      if (line->u[1] == flag && line->u[3] == flag) return true;
      if (Clock::now() - start > w.timeout) {
        report(kErrTimeout, peer);
        return false;
      }
      std::this_thread::yield();
    }
  }
  void report(uint32_t why, int peer) {
    uint32_t none = 0;
    at(w.ranks[static_cast<size_t>(rank)].error)
        .compare_exchange_strong(none, (why << 16) | static_cast<uint32_t>(peer + 1));
  }
};

// ipc_steps.hpp's executor: one block of one rank, a thread of its own.
struct HostBlock {
  World& w;
  int rank;
  int block;
  int blocks;
  HostMem m;
  std::mt19937 rng;

  uint64_t seq() { return at(w.sig(rank).seq).load(std::memory_order_acquire); }
  HostMem& mem() { return m; }
  template <typename F>
  void each(F&& f) {
    if (rng() % 4 == 0) std::this_thread::yield();  // vary the interleaving
    const size_t n = static_cast<size_t>(blocks) * kThreads;
    for (size_t t = 0; t < static_cast<size_t>(kThreads); ++t)
      f(static_cast<size_t>(block) * kThreads + t, n);
  }
  bool barrier(uint64_t s, uint32_t& k) {
    const uint64_t v = barrierValue(s, k++);
    const int n = static_cast<int>(w.ranks.size());
    for (int p = 0; p < n; ++p) at(w.sig(p).flag[block][rank]).store(v, std::memory_order_release);
    const auto start = Clock::now();
    for (int p = 0; p < n; ++p) {
      while (at(w.sig(rank).flag[block][p]).load(std::memory_order_acquire) < v) {
        if (Clock::now() - start > w.timeout) {
          m.report(kErrTimeout, p);
          return false;
        }
        std::this_thread::yield();
      }
    }
    return true;
  }
  void finish(uint64_t s) {
    Signals& self = w.sig(rank);
    if (at(self.done).fetch_add(1u, std::memory_order_acq_rel) == static_cast<unsigned>(blocks - 1)) {
      at(self.done).store(0u, std::memory_order_relaxed);
      at(self.seq).store(s + 1, std::memory_order_release);
    }
  }
};

size_t inBytesOf(const Call& c, int n) {
  const size_t b = c.count * dataTypeSize(c.type);
  return c.kind == Kind::ReduceScatter || c.kind == Kind::AllToAll ? b * static_cast<size_t>(n) : b;
}
size_t outBytesOf(const Call& c, int n) {
  const size_t b = c.count * dataTypeSize(c.type);
  return c.kind == Kind::AllGather || c.kind == Kind::AllToAll ? b * static_cast<size_t>(n) : b;
}

void fill(std::vector<Byte>& buf, DataType t, std::mt19937& rng) {
  const size_t e = dataTypeSize(t);
  for (size_t i = 0; i < buf.size() / e; ++i) {
    const int v = 1 + static_cast<int>(rng() % 3);
    Byte* p = buf.data() + i * e;
    if (t == DataType::Float32) {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
    } else if (t == DataType::Float64) {
      const double d = v;
      std::memcpy(p, &d, 8);
    } else if (t == DataType::BFloat16) {
      const uint16_t bits[] = {0, 0x3F80, 0x4000, 0x4040};
      std::memcpy(p, &bits[v], 2);
    } else {
      const uint64_t x = static_cast<uint64_t>(v);
      std::memcpy(p, &x, e);
    }
  }
}

// Runs `calls` on every rank (rank r runs calls[0, stopAt[r]) ), each rank its calls in order and
// the blocks of each call as threads; the ranks side by side.
void runAll(World& w, const std::vector<Call>& calls, int maxBlocks, size_t llMax,
            std::vector<size_t> stopAt = {}) {
  const int n = static_cast<int>(w.ranks.size());
  if (stopAt.empty()) stopAt.assign(static_cast<size_t>(n), calls.size());
  std::mt19937 rng(42);
  for (int r = 0; r < n; ++r) {
    Rank& rk = w.ranks[static_cast<size_t>(r)];
    for (const Call& c : calls) {
      std::vector<Byte> in(inBytesOf(c, n));
      fill(in, c.type, rng);
      rk.inputs.push_back(std::move(in));
      rk.recv.emplace_back(std::max(inBytesOf(c, n), outBytesOf(c, n)) + 64, Byte{0xEE});
    }
  }
  std::vector<std::thread> drivers;
  for (int r = 0; r < n; ++r) {
    drivers.emplace_back([&, r] {
      Rank& rk = w.ranks[static_cast<size_t>(r)];
      for (size_t ci = 0; ci < stopAt[static_cast<size_t>(r)]; ++ci) {
        const Call& c = calls[ci];
        const size_t e = dataTypeSize(c.type), bytes = c.count * e;
        std::vector<Byte>& rb = rk.recv[ci];
        StepArgs a{};
        for (int q = 0; q < n; ++q) a.ws[q] = w.base(q);
        a.recv = rb.data();
        if (!c.inPlace) {
          a.send = rk.inputs[ci].data();
        } else if (c.kind == Kind::AllGather) {
          std::memcpy(rb.data() + static_cast<size_t>(r) * bytes, rk.inputs[ci].data(), bytes);
          a.send = rb.data() + static_cast<size_t>(r) * bytes;
        } else if (c.kind == Kind::ReduceScatter) {
          std::memcpy(rb.data(), rk.inputs[ci].data(), rk.inputs[ci].size());
          a.send = rb.data();
          a.recv = rb.data() + static_cast<size_t>(r) * bytes;
        } else {
          std::memcpy(rb.data(), rk.inputs[ci].data(), rk.inputs[ci].size());
          a.send = rb.data();
        }
        a.layout = w.layout;
        a.plan = planFor(c.kind, bytes, n, w.layout.stageBytes, maxBlocks);
        a.bytes = bytes;
        a.rank = r;
        a.nranks = n;
        a.root = static_cast<int>(ci) % n;
        a.kind = c.kind;
        const bool ll = usesLL(c.kind, bytes, llMax, w.layout);
        const int blocks = ll ? llBlocks(bytes, maxBlocks) : a.plan.blocks;
        std::vector<std::thread> threads;
        for (int b = 0; b < blocks; ++b) {
          threads.emplace_back([&, b] {
            HostBlock x{w,
                        r,
                        b,
                        blocks,
                        HostMem{w, r, c.type, c.op},
                        std::mt19937(static_cast<unsigned>(ci * 131 + b))};
            if (ll)
              llKernelBody(x, a);
            else
              simpleKernelBody(x, a);
          });
        }
        for (auto& t : threads) t.join();  // the next call on this "stream" starts after this one
      }
    });
  }
  for (auto& d : drivers) d.join();
}

void check(World& w, const std::vector<Call>& calls) {
  const int n = static_cast<int>(w.ranks.size());
  const auto N = static_cast<size_t>(n);
  for (size_t ci = 0; ci < calls.size(); ++ci) {
    const Call& c = calls[ci];
    const size_t e = dataTypeSize(c.type), bytes = c.count * e;
    const int root = static_cast<int>(ci) % n;
    std::vector<Byte> reduced(inBytesOf(c, n));
    std::vector<const void*> srcs;
    for (auto& rk : w.ranks) srcs.push_back(rk.inputs[ci].data());
    kernels::reduce(reduced.data(), srcs.data(), n, reduced.size() / e, c.type, c.op, n);
    for (int r = 0; r < n; ++r) {
      const auto R = static_cast<size_t>(r);
      const Byte* out = w.ranks[R].recv[ci].data();
      std::vector<Byte> want;
      switch (c.kind) {
        case Kind::AllReduce:
          want = reduced;
          break;
        case Kind::ReduceScatter:
          want.assign(reduced.begin() + static_cast<ptrdiff_t>(R * bytes),
                      reduced.begin() + static_cast<ptrdiff_t>((R + 1) * bytes));
          if (c.inPlace) out += R * bytes;
          break;
        case Kind::AllGather:
          for (auto& rk : w.ranks) want.insert(want.end(), rk.inputs[ci].begin(), rk.inputs[ci].end());
          break;
        case Kind::Broadcast:
          want = w.ranks[static_cast<size_t>(root)].inputs[ci];
          break;
        case Kind::Reduce:
          if (r != root) continue;
          want = reduced;
          break;
        case Kind::AllToAll:
          for (auto& rk : w.ranks)
            want.insert(want.end(), rk.inputs[ci].begin() + static_cast<ptrdiff_t>(R * bytes),
                        rk.inputs[ci].begin() + static_cast<ptrdiff_t>((R + 1) * bytes));
          break;
      }
      ASSERT_EQ(std::memcmp(out, want.data(), want.size()), 0)
          << "call " << ci << " (kind " << static_cast<int>(c.kind) << ", count " << c.count << ") rank "
          << r;
      (void)N;
    }
  }
}

std::vector<Call> mixedCalls() {
  std::vector<Call> calls;
  const Kind kinds[] = {Kind::AllReduce, Kind::ReduceScatter, Kind::AllGather,
                        Kind::Broadcast, Kind::Reduce,        Kind::AllToAll};
  const size_t counts[] = {1, 300, 5000, 21000};  // LL and Simple; the largest takes several pieces
  int i = 0;
  for (size_t count : counts) {
    for (Kind k : kinds) {
      const DataType t = i % 3 == 0 ? DataType::Float32 : (i % 3 == 1 ? DataType::BFloat16 : DataType::Int32);
      const ReduceOp op = i % 2 == 0 ? ReduceOp::Sum : ReduceOp::Max;
      calls.push_back({k, count, t, op, i % 4 == 1});
      ++i;
    }
  }
  // Back-to-back allreduces of both protocols: the LL slots and the stage halves alternate.
  for (int j = 0; j < 6; ++j)
    calls.push_back({Kind::AllReduce, j % 2 ? 700u : 9000u, DataType::Float32, ReduceOp::Sum, j % 3 == 0});
  // Twice over: 60 kernels, so that fast ranks run well ahead into reused halves and slots.
  const size_t once = calls.size();
  for (size_t j = 0; j < once; ++j) calls.push_back(calls[j]);
  return calls;
}

TEST(IpcProtocol, MixedCallsOnConcurrentRanksAreExact) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    World w(n, size_t{64} << 10, size_t{4} << 10);
    const auto calls = mixedCalls();
    runAll(w, calls, 3, size_t{4} << 10);
    for (auto& rk : w.ranks) EXPECT_EQ(rk.error, 0u);
    check(w, calls);
    // Every rank ran every kernel: the kernel numbers agree.
    for (int r = 0; r < n; ++r) EXPECT_EQ(w.sig(r).seq, calls.size());
  }
}

TEST(IpcProtocol, AMissingPeerIsReportedByTheWaitingRank) {
  World w(2, size_t{64} << 10, size_t{4} << 10);
  w.timeout = std::chrono::milliseconds(300);
  const std::vector<Call> calls = {{Kind::AllReduce, 5000, DataType::Float32, ReduceOp::Sum, false},
                                   {Kind::AllReduce, 5000, DataType::Float32, ReduceOp::Sum, false},
                                   {Kind::AllReduce, 10, DataType::Float32, ReduceOp::Sum, false}};
  // Rank 1 makes only the first call: rank 0's second (Simple) call waits for it and gives up.
  runAll(w, calls, 3, size_t{4} << 10, {2, 1});
  EXPECT_EQ(w.ranks[0].error, (kErrTimeout << 16) | 2u) << "why << 16 | (peer 1) + 1";
  EXPECT_EQ(w.ranks[1].error, 0u);
}

// ---- Send/Recv ----

// ipc_steps.hpp's P2P executor: one lane of one rank, a thread of its own.
struct HostP2pBlock {
  World& w;
  int rank;
  int b;
  HostMem m;

  int block() const { return b; }
  HostMem& mem() { return m; }
  template <typename F>
  void threads(F&& f) {
    for (size_t t = 0; t < static_cast<size_t>(kThreads); ++t) f(t, static_cast<size_t>(kThreads));
  }
  uint64_t read(const uint64_t* word) {
    return at(*const_cast<uint64_t*>(word)).load(std::memory_order_acquire);
  }
  bool waitAtLeast(const uint64_t* word, uint64_t v, int peer) {
    const auto start = Clock::now();
    while (read(word) < v) {
      if (Clock::now() - start > w.timeout) {
        m.report(kErrTimeout, peer);
        return false;
      }
      std::this_thread::yield();
    }
    return true;
  }
  void publish(uint64_t* word, uint64_t v) { at(*word).store(v, std::memory_order_release); }
  void report(uint32_t why, int peer) { m.report(why, peer); }
};

struct P2pTestOp {
  int peer;
  bool send;
  size_t bytes;
  size_t misalign = 0;
};
using P2pKernel = std::vector<std::vector<P2pTestOp>>;  // the ops of one kernel, per rank

// Byte i of the k-th message from src to dst.
Byte p2pByte(int src, int dst, size_t k, size_t i) {
  return static_cast<Byte>((i * 131 + k * 29 + static_cast<size_t>(src) * 7 + static_cast<size_t>(dst) * 3) %
                           251);
}

// Runs `kernels` (every rank its ops of each, one kernel after another, the lanes of each as
// threads; the ranks side by side) and checks every received byte and the bytes around it.
void runP2p(World& w, const std::vector<P2pKernel>& kernels, int cap, bool expectExact = true) {
  const int n = static_cast<int>(w.ranks.size());
  std::vector<std::thread> drivers;
  std::vector<int> bad(static_cast<size_t>(n), 0);
  for (int r = 0; r < n; ++r) {
    drivers.emplace_back([&, r] {
      std::vector<size_t> sent(static_cast<size_t>(n), 0), received(static_cast<size_t>(n), 0);
      for (const P2pKernel& kern : kernels) {
        const auto& mine = kern[static_cast<size_t>(r)];
        std::vector<std::vector<Byte>> bufs;
        std::vector<size_t> msg;  // which message (k) of its pair each op is
        P2pArgs a{};
        for (int q = 0; q < n; ++q) a.ws[q] = w.base(q);
        a.layout = w.layout;
        a.rank = r;
        a.nranks = n;
        a.channelsCap = cap;
        for (const P2pTestOp& op : mine) {
          bufs.emplace_back(op.bytes + op.misalign + 32, Byte{0xEE});
          auto& k = op.send ? sent[static_cast<size_t>(op.peer)] : received[static_cast<size_t>(op.peer)];
          msg.push_back(k++);
          Byte* p = bufs.back().data() + op.misalign;
          if (op.send) {
            for (size_t i = 0; i < op.bytes; ++i) p[i] = p2pByte(r, op.peer, msg.back(), i);
          }
          a.ops[a.nOps++] = P2pOp{p, op.bytes, op.peer, op.send ? 1 : 0};
        }
        const int lanes = planP2pLanes(a);
        std::vector<std::thread> threads;
        for (int b = 0; b < lanes; ++b) {
          threads.emplace_back([&, b] {
            HostP2pBlock x{w, r, b, HostMem{w, r, DataType::Uint8, ReduceOp::Sum}};
            p2pKernelBody(x, a);
          });
        }
        for (auto& t : threads) t.join();
        if (!expectExact) continue;
        for (size_t o = 0; o < mine.size(); ++o) {
          const P2pTestOp& op = mine[o];
          const Byte* p = bufs[o].data();
          for (size_t i = 0; i < bufs[o].size(); ++i) {
            const bool inside = i >= op.misalign && i < op.misalign + op.bytes;
            const Byte want = op.send || !inside
                                  ? (inside ? p2pByte(r, op.peer, msg[o], i - op.misalign) : Byte{0xEE})
                                  : p2pByte(op.peer, r, msg[o], i - op.misalign);
            if (p[i] != want && bad[static_cast<size_t>(r)]++ == 0) {
              ADD_FAILURE() << "rank " << r << " op " << o << (op.send ? " (send to " : " (receive from ")
                            << op.peer << ", " << op.bytes << " bytes) byte " << i << ": " << int{p[i]}
                            << " instead of " << int{want};
            }
          }
        }
      }
    });
  }
  for (auto& d : drivers) d.join();
}

// The kernels of a mixed sequence on n ranks, with chunks of `chunk` bytes (FIFOs of 4 per
// channel): messages of 1 byte to many times a FIFO, odd sizes, buffers off alignment.
std::vector<P2pKernel> p2pSequence(int n, size_t chunk) {
  std::vector<P2pKernel> ks;
  const auto N = static_cast<size_t>(n);
  const size_t big = chunk * kP2pSlots * kP2pChannels * 3 + 4093;  // fills every FIFO three times
  // A ring exchange in one kernel (both ends of every pair in one kernel each).
  for (size_t bytes : {size_t{1}, size_t{17}, chunk + 5, big}) {
    P2pKernel k(N);
    for (int r = 0; r < n; ++r) {
      k[static_cast<size_t>(r)].push_back({(r + 1) % n, true, bytes, static_cast<size_t>(r) % 3});
      k[static_cast<size_t>(r)].push_back({(r + n - 1) % n, false, bytes, 5});
    }
    ks.push_back(k);
  }
  // Rank 0 to rank 1, a kernel per side (no group): the sender runs ahead into free slots.
  for (size_t bytes : {size_t{3 * 4096}, size_t{100}, size_t{8}}) {
    P2pKernel k(N);
    k[0].push_back({1, true, bytes, 0});
    k[1].push_back({0, false, bytes, 0});
    ks.push_back(k);
  }
  // Several messages to one peer in one kernel, of different widths, and an empty one.
  {
    P2pKernel k(N);
    for (int r = 0; r < n; ++r) {
      const int to = (r + 1) % n, from = (r + n - 1) % n;
      for (size_t bytes : {big / 2, size_t{0}, size_t{33}, chunk * 2}) {
        k[static_cast<size_t>(r)].push_back({to, true, bytes, 1});
        k[static_cast<size_t>(r)].push_back({from, false, bytes, 2});
      }
    }
    ks.push_back(k);
  }
  // All-to-all through sends and receives, self included.
  {
    P2pKernel k(N);
    for (int r = 0; r < n; ++r) {
      for (int q = 0; q < n; ++q) {
        k[static_cast<size_t>(r)].push_back({q, true, chunk * 5 + static_cast<size_t>(q), 0});
        k[static_cast<size_t>(r)].push_back({q, false, chunk * 5 + static_cast<size_t>(r), 0});
      }
    }
    ks.push_back(k);
  }
  // Twice over: the counters go on from where the last kernel left them.
  const size_t once = ks.size();
  for (size_t i = 0; i < once; ++i) ks.push_back(ks[i]);
  return ks;
}

TEST(IpcProtocol, SendsAndReceivesOnConcurrentRanksAreExact) {
  const size_t chunk = 4096;
  for (int n : {2, 3, 4}) {
    for (int cap : {1, 4}) {
      SCOPED_TRACE("ranks " + std::to_string(n) + ", channels " + std::to_string(cap));
      World w(n, size_t{64} << 10, size_t{4} << 10, chunk);
      runP2p(w, p2pSequence(n, chunk), cap);
      for (auto& rk : w.ranks) EXPECT_EQ(rk.error, 0u);
      // Every chunk sent was received: the counters of both ends agree, channel by channel.
      for (int r = 0; r < n; ++r) {
        for (int q = 0; q < n; ++q) {
          for (int c = 0; c < kP2pChannels; ++c) {
            EXPECT_EQ(w.sig(r).p2pSent[q][c], w.sig(q).p2pHead[r][c]) << r << " -> " << q << " channel " << c;
            EXPECT_EQ(w.sig(q).p2pTail[r][c], w.sig(r).p2pSent[q][c]);
          }
        }
      }
      EXPECT_GT(w.sig(0).p2pSent[1][0], static_cast<uint64_t>(kP2pSlots)) << "the FIFOs wrapped";
    }
  }
  // The default 64 KiB chunks: a block's 512 threads then copy four packs at a time.
  World w(2, size_t{64} << 10, size_t{4} << 10, size_t{64} << 10);
  runP2p(w, p2pSequence(2, size_t{64} << 10), 2);
  for (auto& rk : w.ranks) EXPECT_EQ(rk.error, 0u);
}

TEST(IpcProtocol, AReceiveOfAnotherSizeIsReported) {
  World w(2, size_t{64} << 10, size_t{4} << 10, 4096);
  w.timeout = std::chrono::milliseconds(300);
  P2pKernel k(2);
  k[0].push_back({1, true, 5000, 0});
  k[1].push_back({0, false, 4000, 0});
  runP2p(w, {k}, 2, false);
  EXPECT_EQ(w.ranks[0].error, 0u) << "the send fits in the FIFO and completes";
  EXPECT_EQ(w.ranks[1].error, (kErrP2pSize << 16) | 1u) << "why << 16 | (peer 0) + 1";
}

TEST(IpcProtocol, AReceiveWithoutASendTimesOutNamingThePeer) {
  World w(3, size_t{64} << 10, size_t{4} << 10, 4096);
  w.timeout = std::chrono::milliseconds(300);
  P2pKernel k(3);
  k[1].push_back({2, false, 100, 0});
  // And a send larger than the FIFO that no one receives: it waits for a free slot.
  k[0].push_back({2, true, 4096 * kP2pSlots * 2, 0});
  runP2p(w, {k}, 1, false);
  EXPECT_EQ(w.ranks[1].error, (kErrTimeout << 16) | 3u);
  EXPECT_EQ(w.ranks[0].error, (kErrTimeout << 16) | 3u);
  EXPECT_EQ(w.ranks[2].error, 0u);
}

}  // namespace
}  // namespace chorus::kernels::cuda::ipc
