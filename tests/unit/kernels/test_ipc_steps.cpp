// The device collectives' data movement (kernels/cuda/ipc_steps.hpp) and plans (ipc_layout.hpp),
// run on the host: every rank's workspace is host memory, each GPU thread's share of a phase a
// function call, and the reduction the CPU kernels'. No GPU needed.
//
// The kernels synchronise only block b of one rank with block b of the others. So the emulation
// runs the blocks one after another, last first, each through its whole kernel (the ranks taking
// turns between barriers): a legal schedule of the real kernels. Were any block to read what
// another block wrote, it would read stale bytes here and the exact comparison would fail. A
// tracker also checks directly that every byte read from a workspace was written by the same block.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/reduce.hpp"
#include "kernels/cuda/ipc_steps.hpp"

namespace chorus::kernels::cuda::ipc {
namespace {

template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

struct World {
  World(int n, size_t stageBytes, size_t llBytes) : layout(makeLayout(stageBytes, llBytes)) {
    for (int r = 0; r < n; ++r) {
      ws.emplace_back(layout.total / sizeof(Vec16) + 1);
      writer.emplace_back(layout.total, 0);
    }
  }
  Byte* base(int r) { return reinterpret_cast<Byte*>(ws[static_cast<size_t>(r)].data()); }
  // The rank whose workspace holds p, or -1.
  int owner(const Byte* p) {
    for (size_t r = 0; r < ws.size(); ++r) {
      const Byte* b = base(static_cast<int>(r));
      if (p >= b && p < b + layout.total) return static_cast<int>(r);
    }
    return -1;
  }
  Layout layout;
  std::vector<std::vector<Vec16>> ws;
  // Per byte of each workspace: generation * 64 + block + 1 of its last write in the current call.
  std::vector<std::vector<uint32_t>> writer;
  uint32_t generation = 1;
  int crossBlockReads = 0;
};

// ipc_steps.hpp's memory operations for one block of the emulation.
struct HostMem {
  World& w;
  int block;
  DataType type;
  ReduceOp op;
  int nranks;

  void noteRead(const Byte* p, size_t n) {
    const int r = w.owner(p);
    if (r < 0) return;
    const size_t at = static_cast<size_t>(p - w.base(r));
    for (size_t i = 0; i < n; ++i) {
      const uint32_t by = w.writer[static_cast<size_t>(r)][at + i];
      if (by / 64 == w.generation && static_cast<int>(by % 64) - 1 != block) ++w.crossBlockReads;
    }
  }
  void noteWrite(Byte* p, size_t n) {
    const int r = w.owner(p);
    if (r < 0) return;
    const size_t at = static_cast<size_t>(p - w.base(r));
    for (size_t i = 0; i < n; ++i)
      w.writer[static_cast<size_t>(r)][at + i] = w.generation * 64 + static_cast<uint32_t>(block) + 1;
  }
  void copy(Byte* dst, const Byte* src, size_t n) {
    EXPECT_LE(n, kPack);
    noteRead(src, n);
    std::memmove(dst, src, n);
    noteWrite(dst, n);
  }
  Vec16 load(const Byte* src) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(src) % 16, 0u) << "packs of a stage are aligned";
    noteRead(src, 16);
    Vec16 v;
    std::memcpy(&v, src, 16);
    return v;
  }
  void store(Byte* dst, const Vec16& v, size_t n) {
    std::memcpy(dst, &v, n);
    noteWrite(dst, n);
  }
  Vec16 reduce(const Vec16* in, int n) {
    const void* srcs[kMaxRanks];
    for (int k = 0; k < n; ++k) srcs[k] = &in[k];
    Vec16 out;
    kernels::reduce(&out, srcs, n, 16 / dataTypeSize(type), type, op, nranks);
    return out;
  }
  void storeLine(Byte* dst, const Vec16& line) { store(dst, line, 16); }
  bool pollLine(const Byte* src, uint32_t flag, int peer, Vec16* line) {
    *line = load(src);
    EXPECT_TRUE(line->u[1] == flag && line->u[3] == flag) << "line from rank " << peer << " not written yet";
    return line->u[1] == flag && line->u[3] == flag;
  }
};

struct Case {
  Kind kind;
  int nranks;
  size_t count;
  DataType type;
  ReduceOp op;
  bool inPlace;
  size_t misalign;  // bytes added to every user buffer's address
  size_t stageBytes;
  size_t llBytes;
  int maxBlocks;
};

std::string describe(const Case& c) {
  static const char* kinds[] = {"allreduce", "reduce_scatter", "all_gather",
                                "broadcast", "reduce",         "alltoall"};
  return strCat(kinds[static_cast<int>(c.kind)], " n=", c.nranks, " count=", c.count, " ",
                dataTypeName(c.type), " ", reduceOpName(c.op), c.inPlace ? " in place" : "",
                " misalign=", c.misalign, " stage=", c.stageBytes, " blocks<=", c.maxBlocks);
}

// Small values, so that products of 8 ranks stay exact in every type.
void fill(Byte* p, size_t count, DataType t, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(1, 3);
  for (size_t i = 0; i < count; ++i) {
    const int v = d(rng);
    switch (t) {
      case DataType::Int8:
      case DataType::Uint8:
        p[i] = static_cast<Byte>(v);
        break;
      case DataType::Int32:
      case DataType::Uint32: {
        const uint32_t x = static_cast<uint32_t>(v);
        std::memcpy(p + 4 * i, &x, 4);
        break;
      }
      case DataType::Int64:
      case DataType::Uint64: {
        const uint64_t x = static_cast<uint64_t>(v);
        std::memcpy(p + 8 * i, &x, 8);
        break;
      }
      case DataType::Float32: {
        const float x = static_cast<float>(v);
        std::memcpy(p + 4 * i, &x, 4);
        break;
      }
      case DataType::Float64: {
        const double x = static_cast<double>(v);
        std::memcpy(p + 8 * i, &x, 8);
        break;
      }
      case DataType::Float16: {
        const uint16_t bits[] = {0, 0x3C00, 0x4000, 0x4200};  // 1, 2, 3
        std::memcpy(p + 2 * i, &bits[v], 2);
        break;
      }
      case DataType::BFloat16: {
        const uint16_t bits[] = {0, 0x3F80, 0x4000, 0x4040};
        std::memcpy(p + 2 * i, &bits[v], 2);
        break;
      }
    }
  }
}

constexpr size_t kGuard = 256;  // bytes after each user buffer that no call may touch

// Runs one call on every rank (kernel number `seq`) and checks each rank's output exactly.
void run(const Case& c, World& w, uint32_t seq) {
  SCOPED_TRACE(describe(c));
  const size_t e = dataTypeSize(c.type);
  const int n = c.nranks;
  const auto N = static_cast<size_t>(n);
  const size_t bytes = c.count * e;
  const int root = n - 1;
  size_t inBytes = bytes, outBytes = bytes;
  if (c.kind == Kind::ReduceScatter || c.kind == Kind::AllToAll) inBytes = bytes * N;
  if (c.kind == Kind::AllGather || c.kind == Kind::AllToAll) outBytes = bytes * N;
  std::mt19937 rng(static_cast<unsigned>(bytes * 31 + N));
  std::vector<std::vector<Byte>> sendMem(N), recvMem(N), input(N);
  std::vector<StepArgs> args(N);
  for (int r = 0; r < n; ++r) {
    auto R = static_cast<size_t>(r);
    input[R].resize(inBytes);
    fill(input[R].data(), inBytes / e, c.type, rng);
    recvMem[R].assign(outBytes + c.misalign + kGuard, 0xEE);
    sendMem[R].assign(inBytes + c.misalign + kGuard, 0);
    StepArgs& a = args[R];
    for (int q = 0; q < n; ++q) a.ws[q] = w.base(q);
    a.recv = recvMem[R].data() + c.misalign;
    if (!c.inPlace) {
      std::memcpy(sendMem[R].data() + c.misalign, input[R].data(), inBytes);
      a.send = sendMem[R].data() + c.misalign;
    } else if (c.kind == Kind::AllGather) {  // NCCL's in place: send = recv + rank * count
      std::memcpy(a.recv + R * bytes, input[R].data(), bytes);
      a.send = a.recv + R * bytes;
    } else if (c.kind == Kind::ReduceScatter) {  // recv = send + rank * count
      sendMem[R].assign(inBytes + c.misalign + kGuard, 0);
      std::memcpy(sendMem[R].data() + c.misalign, input[R].data(), inBytes);
      a.send = sendMem[R].data() + c.misalign;
      a.recv = sendMem[R].data() + c.misalign + R * bytes;
    } else {
      std::memcpy(a.recv, input[R].data(), inBytes);
      a.send = a.recv;
    }
    a.layout = w.layout;
    a.plan = planFor(c.kind, bytes, n, w.layout.stageBytes, c.maxBlocks);
    a.bytes = bytes;
    a.rank = r;
    a.nranks = n;
    a.root = root;
    a.kind = c.kind;
  }
  const bool ll = usesLL(c.kind, bytes, c.llBytes, w.layout);
  const Plan& pl = args[0].plan;
  const int blocks = ll ? llBlocks(bytes, c.maxBlocks) : pl.blocks;
  ASSERT_GE(blocks, 1);
  ASSERT_LE(blocks, c.maxBlocks);
  if (!ll) {
    ASSERT_LE(static_cast<size_t>(pl.slices) * pl.pieceLen, w.layout.stageBytes) << "a piece fits its stage";
    ASSERT_EQ(pl.pieceLen % kPack, 0u);
  }
  const size_t threads = static_cast<size_t>(blocks) * kThreads;
  ++w.generation;
  // Each block through the whole kernel, last block first; the ranks take turns between barriers.
  for (int b = blocks - 1; b >= 0; --b) {
    HostMem m{w, b, c.type, c.op, n};
    auto eachRank = [&](auto&& phase) {
      for (int r = 0; r < n; ++r)
        for (size_t i = static_cast<size_t>(b) * kThreads; i < static_cast<size_t>(b + 1) * kThreads; ++i)
          phase(args[static_cast<size_t>(r)], i);
    };
    if (ll) {
      eachRank([&](const StepArgs& a, size_t i) {
        llWrite(a, static_cast<int>(seq & 1), llFlag(seq), i, threads, m);
      });
      eachRank([&](const StepArgs& a, size_t i) {
        ASSERT_TRUE(llRead(a, static_cast<int>(seq & 1), llFlag(seq), i, threads, m));
      });
      continue;
    }
    const int half = static_cast<int>(seq & 1);
    for (size_t p = 0; p < pl.pieces; ++p) {
      eachRank([&](const StepArgs& a, size_t i) { simpleCopyIn(a, half, p, i, threads, m); });
      eachRank([&](const StepArgs& a, size_t i) { simpleRead(a, half, p, i, threads, m); });
      if (c.kind == Kind::AllReduce)
        eachRank([&](const StepArgs& a, size_t i) { simpleGather(a, half, p, i, threads, m); });
    }
  }
  EXPECT_EQ(w.crossBlockReads, 0) << "bytes read from a workspace that another block wrote";
  w.crossBlockReads = 0;

  // The expected outputs, from the CPU kernels in rank order.
  const size_t count = c.count;
  std::vector<Byte> reduced(bytes * (c.kind == Kind::ReduceScatter ? N : 1));
  {
    std::vector<const void*> srcs;
    for (auto& in : input) srcs.push_back(in.data());
    if (c.kind == Kind::AllReduce || c.kind == Kind::Reduce || c.kind == Kind::ReduceScatter)
      kernels::reduce(reduced.data(), srcs.data(), n, reduced.size() / e, c.type, c.op, n);
  }
  for (int r = 0; r < n; ++r) {
    const auto R = static_cast<size_t>(r);
    const Byte* out = args[R].recv;
    const Byte* want = nullptr;
    std::vector<Byte> gathered;
    switch (c.kind) {
      case Kind::AllReduce:
        want = reduced.data();
        break;
      case Kind::ReduceScatter:
        want = reduced.data() + R * bytes;
        break;
      case Kind::AllGather:
        for (auto& in : input) gathered.insert(gathered.end(), in.begin(), in.end());
        want = gathered.data();
        break;
      case Kind::Broadcast:
        want = input[static_cast<size_t>(root)].data();
        break;
      case Kind::Reduce:
        if (r != root) continue;
        want = reduced.data();
        break;
      case Kind::AllToAll:
        for (size_t q = 0; q < N; ++q)
          gathered.insert(gathered.end(), input[q].begin() + static_cast<ptrdiff_t>(R * bytes),
                          input[q].begin() + static_cast<ptrdiff_t>((R + 1) * bytes));
        want = gathered.data();
        break;
    }
    for (size_t i = 0; i < outBytes; ++i) {
      if (out[i] != want[i]) {
        ADD_FAILURE() << "rank " << r << ": first wrong byte " << i << " of " << outBytes << " (element "
                      << i / e << " of " << outBytes / e << "): " << int(out[i]) << " instead of "
                      << int(want[i]);
        return;
      }
    }
    if (!c.inPlace) {
      for (size_t i = 0; i < kGuard; ++i)
        ASSERT_EQ(recvMem[R][c.misalign + outBytes + i], 0xEE)
            << "rank " << r << " wrote past its receive buffer";
    }
  }
  (void)count;
}

TEST(IpcLayout, AreasAreAlignedAndDisjoint) {
  for (size_t stage : {size_t{64} << 10, size_t{8} << 20, size_t{1} << 30}) {
    for (size_t ll : {size_t{0}, size_t{8}, size_t{64} << 10, size_t{1} << 20}) {
      const Layout l = makeLayout(stage, ll);
      EXPECT_GE(l.llOffset, sizeof(Signals));
      EXPECT_EQ(l.simpleOffset % 4096, 0u);
      EXPECT_GE(l.simpleOffset, l.llSlot(1, kMaxRanks - 1) + l.llLines() * kLine);
      EXPECT_EQ(l.result(0), l.stage(0) + l.stageBytes);
      EXPECT_EQ(l.stage(1), l.result(0) + l.stageBytes);
      EXPECT_EQ(l.total, l.result(1) + l.stageBytes);
      // With send/recv FIFOs: after the stages, 4 KiB aligned, slot after slot to the end.
      for (int sources : {1, 3, kMaxRanks}) {
        const Layout q = makeLayout(stage, ll, size_t{64} << 10, sources);
        EXPECT_EQ(q.p2pOffset, q.result(1) + q.stageBytes);
        EXPECT_EQ(q.p2pSlot(0, 0, 0), q.p2pOffset);
        EXPECT_EQ(q.p2pSlot(0, 0, 1), q.p2pOffset + q.p2pSlotBytes);
        EXPECT_EQ(q.p2pSlot(0, 1, 0), q.p2pSlot(0, 0, kP2pSlots - 1) + q.p2pSlotBytes);
        EXPECT_EQ(q.p2pSlot(1, 0, 0), q.p2pSlot(0, kP2pChannels - 1, kP2pSlots - 1) + q.p2pSlotBytes);
        EXPECT_EQ(q.total, q.p2pSlot(sources - 1, kP2pChannels - 1, kP2pSlots - 1) + q.p2pSlotBytes);
        EXPECT_EQ(q.p2pSlotBytes % 4096, 0u);
      }
    }
  }
  EXPECT_EQ(makeLayout(size_t{64} << 10, 0, 5000, 2).p2pSlotBytes, 8192u) << "rounded up to 4 KiB";
  // Chunks and channels: the same on both ends of a message, 0 for an empty one.
  const Layout q = makeLayout(size_t{64} << 10, 0, 4096, 2);
  EXPECT_EQ(p2pChunks(0, q), 0u);
  EXPECT_EQ(p2pChannels(0, q, 4), 0);
  EXPECT_EQ(p2pChunks(4097, q), 2u);
  EXPECT_EQ(p2pChannels(4097, q, 4), 2);
  EXPECT_EQ(p2pChannels(4096 * 9, q, 4), 4);
  EXPECT_EQ(p2pChannels(4096 * 9, q, 9), kP2pChannels);
  EXPECT_EQ(p2pChannels(4096 * 9, q, 1), 1);
  EXPECT_LT(barrierValue(7, 1u << 23), barrierValue(8, 0));
  EXPECT_NE(llFlag(0), 0u);
  EXPECT_NE(llFlag(0xFFFFFFFFu), 0u);
}

TEST(IpcLayout, SendRecvLanesPerDirectionPeerAndChannel) {
  P2pArgs a{};
  a.layout = makeLayout(size_t{64} << 10, 0, 4096, 3);
  a.channelsCap = 4;
  Byte buf[1] = {};
  const P2pOp ops[] = {
      {buf, 4096 * 9, 1, 1}, {buf, 100, 1, 0}, {buf, 10, 1, 1}, {buf, 0, 2, 1}, {buf, 8192, 2, 0}};
  for (const P2pOp& op : ops) a.ops[a.nOps++] = op;
  ASSERT_EQ(planP2pLanes(a), 7);
  const P2pLane want[] = {{1, 1, 0}, {1, 1, 1}, {1, 1, 2}, {1, 1, 3}, {0, 1, 0}, {0, 2, 0}, {0, 2, 1}};
  for (int l = 0; l < 7; ++l) {
    EXPECT_EQ(a.lanes[l].send, want[l].send) << l;
    EXPECT_EQ(a.lanes[l].peer, want[l].peer) << l;
    EXPECT_EQ(a.lanes[l].channel, want[l].channel) << l;
  }
  a.channelsCap = 1;  // one lane per direction and peer that moves bytes
  EXPECT_EQ(planP2pLanes(a), 3);
  a.nOps = 1;
  a.ops[0].bytes = 0;
  EXPECT_EQ(planP2pLanes(a), 0) << "nothing to move: no kernel";
}

TEST(IpcLayout, PlansCoverEveryByteOnce) {
  for (int n = 1; n <= kMaxRanks; ++n) {
    for (size_t bytes : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{4095}, size_t{65536},
                         size_t{1000003}, size_t{64} << 20}) {
      for (size_t stage : {size_t{64} << 10, size_t{8} << 20}) {
        const Plan p = planAllReduce(bytes, n, stage, kMaxBlocks);
        SCOPED_TRACE(strCat("n=", n, " bytes=", bytes, " stage=", stage));
        size_t total = 0;
        for (int s = 0; s < p.slices; ++s) {
          size_t slice = 0;
          for (size_t q = 0; q < p.pieces; ++q) {
            EXPECT_LE(p.len(s, q), p.pieceLen);
            slice += p.len(s, q);
          }
          EXPECT_EQ(slice, p.sliceBytes(s));
          EXPECT_LE(slice, p.sliceLen);
          total += slice;
        }
        EXPECT_EQ(total, bytes);
        EXPECT_EQ(p.sliceLen % kPack, 0u);
        EXPECT_LE(static_cast<size_t>(p.slices) * p.pieceLen, makeLayout(stage, 0).stageBytes);
        EXPECT_GE(p.blocks, 1);
        EXPECT_LE(p.blocks, kMaxBlocks);
      }
    }
  }
}

TEST(IpcSteps, EveryCollectiveExactOnEmulatedRanks) {
  const Kind kinds[] = {Kind::AllReduce, Kind::ReduceScatter, Kind::AllGather,
                        Kind::Broadcast, Kind::Reduce,        Kind::AllToAll};
  struct TypeOp {
    DataType t;
    ReduceOp op;
  };
  const TypeOp typeOps[] = {{DataType::Float32, ReduceOp::Sum},  {DataType::Int8, ReduceOp::Prod},
                            {DataType::BFloat16, ReduceOp::Max}, {DataType::Float64, ReduceOp::Avg},
                            {DataType::Uint64, ReduceOp::Min},   {DataType::Float16, ReduceOp::Sum}};
  // CHORUS_TEST_QUICK=1 (the sanitizer passes, where this test took 2 minutes): each kind and count
  // runs two of the six type/op pairs, a different two for the next count, so that every pair
  // still meets every kind at every rank count.
  const char* quickEnv = std::getenv("CHORUS_TEST_QUICK");
  const bool quick = quickEnv != nullptr && std::string(quickEnv) == "1";
  int cases = 0;
  size_t rotation = 0;
  for (int n : {1, 2, 3, 8}) {
    // Small stages so that messages of a few hundred KiB take several pieces.
    World w(n, size_t{64} << 10, size_t{4} << 10);
    uint32_t seq = 0;
    for (Kind k : kinds) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{33}, size_t{1000}, size_t{40000}}) {
        ++rotation;
        for (size_t pair = 0; pair < std::size(typeOps); ++pair) {
          if (quick && (pair + rotation) % 3 != 0) continue;
          const TypeOp& to = typeOps[pair];
          for (bool inPlace : {false, true}) {
            for (size_t mis : {size_t{0}, size_t{4}}) {
              if (mis % dataTypeSize(to.t) != 0) continue;
              // One block (512 threads) with 64 KiB pieces also takes copyRange's unrolled path.
              const std::vector<int> grids =
                  count >= 40000 ? std::vector<int>{kMaxBlocks, 3, 1} : std::vector<int>{kMaxBlocks, 3};
              for (int maxBlocks : grids) {
                Case c{k,        n, count, to.t, to.op, inPlace, mis, w.layout.stageBytes, size_t{4} << 10,
                       maxBlocks};
                run(c, w, seq++);
                ++cases;
                if (HasFailure()) return;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, quick ? 300 : 1000);
}

}  // namespace
}  // namespace chorus::kernels::cuda::ipc
