// The data movement of the IPC collectives (ipc_collectives.cu), one thread's share of each phase,
// written once for the device kernels and for the host emulation that the tests run on machines
// without a GPU (tests/unit/kernels/test_ipc_steps.cpp). No CUDA header.
//
// `M` supplies the memory operations and the reduction:
//   void copy(Byte* dst, const Byte* src, size_t n)     n <= kPack bytes
//   Vec16 load(const Byte* src)                          16 aligned bytes
//   void store(Byte* dst, const Vec16& v, size_t n)      the first n <= kPack bytes of v
//   Vec16 reduce(const Vec16* in, int n)                 element-wise, in rank order
//   void storeLine(Byte* dst, const Vec16& line)         one LL line, as one 16-byte store
//   bool pollLine(const Byte* src, uint32_t flag, int peer, Vec16* line)   false: timed out
// (copy and load/store are all that the P2P kernel uses).
// Thread i of n threads (i = block * kThreads + thread) handles the packs w = i, i + n, ... of
// every slice, so position w is always handled by block (w / kThreads) % blocks: what a block
// reads after a barrier was written before it by the same block of the writer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ipc_layout.hpp"

namespace chorus::kernels::cuda::ipc {

enum class Kind : int { AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, AllToAll };

/// What a kernel writes into the host-mapped error word: why << 16 | (peer waited for + 1).
inline constexpr uint32_t kErrTimeout = 1;
inline constexpr uint32_t kErrAborted = 2;
inline constexpr uint32_t kErrStaged = 3;   // a staged operation did not finish on the host in time
inline constexpr uint32_t kErrP2pSize = 4;  // a receive met a send of another size

/// Where a kernel's failed wait was, written beside the error word (what the host message names):
/// site = kind << 29 | index << 24 | number (24 bits, as barrier values count barriers), then the
/// value waited for and the value seen (low 32 bits each).
enum WaitSite : uint32_t {
  kSiteBarrier = 1,  // index: the block; number: which barrier of the kernel
  kSiteLL = 2,       // index: the block
  kSiteP2pSend = 3,  // index: the channel; waiting for the receiver to free a slot
  kSiteP2pRecv = 4,  // index: the channel; waiting for the sender's next chunk
};
CHORUS_HD constexpr uint32_t waitSite(uint32_t kind, uint32_t index, uint32_t number) {
  return kind << 29 | (index & 0x1F) << 24 | (number & 0xFFFFFF);
}
static_assert(kMaxBlocks <= 32 && kP2pChannels <= 32, "waitSite keeps 5 bits of block or channel");

using Byte = unsigned char;
struct alignas(16) Vec16 {
  uint32_t u[4];
};

struct StepArgs {
  Byte* ws[kMaxRanks];  // every rank's workspace as mapped here
  const Byte* send;
  Byte* recv;
  Layout layout;
  Plan plan;     // Simple
  size_t bytes;  // LL: message bytes
  int rank;
  int nranks;
  int root;
  Kind kind;
};

/// The Simple plan of a call moving `bytes` per slice (allreduce: the whole message).
CHORUS_HD inline Plan planFor(Kind kind, size_t bytes, int nranks, size_t stageBytes, int maxBlocks) {
  switch (kind) {
    case Kind::AllReduce:
      return planAllReduce(bytes, nranks, stageBytes, maxBlocks);
    case Kind::ReduceScatter:
    case Kind::AllToAll:
      return planSimple(nranks, bytes, bytes * static_cast<size_t>(nranks), stageBytes, maxBlocks);
    default:
      return planSimple(1, bytes, bytes, stageBytes, maxBlocks);
  }
}

/// Whether an allreduce of `bytes` takes LL.
CHORUS_HD inline bool usesLL(Kind kind, size_t bytes, size_t llMaxBytes, const Layout& layout) {
  return kind == Kind::AllReduce && bytes <= llMaxBytes && bytes <= layout.llBytes;
}

CHORUS_HD inline Byte* stageOf(const StepArgs& a, int r, int half) { return a.ws[r] + a.layout.stage(half); }
CHORUS_HD inline Byte* resultOf(const StepArgs& a, int r, int half) {
  return a.ws[r] + a.layout.result(half);
}
CHORUS_HD inline size_t atMost(size_t x, size_t cap) { return x < cap ? x : cap; }

/// `len` bytes from src to dst, thread i of n: 16-byte packs i, i + n, ..., four loads in flight
/// when both addresses are 16-byte aligned. Pack w stays with thread w mod n (so, in the Simple
/// phases, with block (w / kThreads) mod blocks).
template <typename M>
CHORUS_HD void copyRange(Byte* dst, const Byte* src, size_t len, size_t i, size_t n, M& m) {
  size_t w = i;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & (kPack - 1)) == 0) {
    constexpr size_t kU = 4;
    const size_t packs = len / kPack;
    for (; w + (kU - 1) * n < packs; w += kU * n) {
      Vec16 v[kU];
      for (size_t u = 0; u < kU; ++u) v[u] = m.load(src + (w + u * n) * kPack);
      for (size_t u = 0; u < kU; ++u) m.store(dst + (w + u * n) * kPack, v[u], kPack);
    }
  }
  for (; w * kPack < len; w += n) m.copy(dst + w * kPack, src + w * kPack, atMost(len - w * kPack, kPack));
}

/// Simple, phase 1 of piece p: this rank's input into its stage (slice s at s * pieceLen).
template <typename M>
CHORUS_HD void simpleCopyIn(const StepArgs& a, int half, size_t p, size_t i, size_t n, M& m) {
  if (a.kind == Kind::Broadcast && a.rank != a.root) return;
  const size_t off = p * a.plan.pieceLen;
  for (int s = 0; s < a.plan.slices; ++s) {
    const size_t len = a.plan.len(s, p);
    const Byte* src = a.send + static_cast<size_t>(s) * a.plan.sliceLen + off;
    Byte* dst = stageOf(a, a.rank, half) + static_cast<size_t>(s) * a.plan.pieceLen;
    copyRange(dst, src, len, i, n, m);
  }
}

/// Simple, phase 2 (after a barrier): reduce this rank's slice (allreduce: into its result area;
/// reduce-scatter, and reduce on the root: into recv), or copy the peers' stages out (all-to-all:
/// the slice each peer staged for this rank).
template <typename M>
CHORUS_HD void simpleRead(const StepArgs& a, int half, size_t p, size_t i, size_t n, M& m) {
  const size_t off = p * a.plan.pieceLen;
  const bool reduces = a.kind == Kind::AllReduce || a.kind == Kind::ReduceScatter ||
                       (a.kind == Kind::Reduce && a.rank == a.root);
  if (reduces) {
    const int s = a.kind == Kind::Reduce ? 0 : a.rank;
    const size_t len = a.plan.len(s, p);
    for (size_t w = i; w * kPack < len; w += n) {
      const size_t o = static_cast<size_t>(s) * a.plan.pieceLen + w * kPack;
      Vec16 in[kMaxRanks];
      for (int r = 0; r < a.nranks; ++r) in[r] = m.load(stageOf(a, r, half) + o);
      const Vec16 v = m.reduce(in, a.nranks);
      if (a.kind == Kind::AllReduce)
        m.store(resultOf(a, a.rank, half) + w * kPack, v, kPack);
      else
        m.store(a.recv + off + w * kPack, v, atMost(len - w * kPack, kPack));
    }
  } else if (a.kind == Kind::AllToAll) {
    const size_t len = a.plan.len(a.rank, p);
    for (int r = 0; r < a.nranks; ++r) {
      Byte* dst = a.recv + static_cast<size_t>(r) * a.plan.sliceLen + off;
      const Byte* src = stageOf(a, r, half) + static_cast<size_t>(a.rank) * a.plan.pieceLen;
      copyRange(dst, src, len, i, n, m);
    }
  } else if (a.kind == Kind::AllGather || a.kind == Kind::Broadcast) {
    const size_t len = a.plan.len(0, p);
    const int from = a.kind == Kind::Broadcast ? a.root : 0;
    const int to = a.kind == Kind::Broadcast ? a.root + 1 : a.nranks;
    for (int r = from; r < to; ++r) {
      Byte* dst = a.recv + (a.kind == Kind::AllGather ? static_cast<size_t>(r) * a.plan.sliceLen : 0) + off;
      copyRange(dst, stageOf(a, r, half), len, i, n, m);
    }
  }
}

/// Simple, phase 3 of an allreduce (after a barrier): every slice from the rank that reduced it.
template <typename M>
CHORUS_HD void simpleGather(const StepArgs& a, int half, size_t p, size_t i, size_t n, M& m) {
  const size_t off = p * a.plan.pieceLen;
  for (int s = 0; s < a.nranks; ++s) {
    const size_t len = a.plan.len(s, p);
    Byte* dst = a.recv + static_cast<size_t>(s) * a.plan.sliceLen + off;
    copyRange(dst, resultOf(a, s, half), len, i, n, m);
  }
}

/// LL allreduce, part 1: this rank's lines {data, flag, data, flag} into every rank's slot for it.
template <typename M>
CHORUS_HD void llWrite(const StepArgs& a, int parity, uint32_t flag, size_t i, size_t n, M& m) {
  const size_t lines = ceilDiv(a.bytes, kLineData);
  for (size_t l = i; l < lines; l += n) {
    Vec16 d{};
    m.copy(reinterpret_cast<Byte*>(&d), a.send + l * kLineData, atMost(a.bytes - l * kLineData, kLineData));
    const Vec16 line{{d.u[0], flag, d.u[1], flag}};
    for (int r = 0; r < a.nranks; ++r)
      m.storeLine(a.ws[r] + a.layout.llSlot(parity, a.rank) + l * kLine, line);
  }
}

/// LL allreduce, part 2: poll this rank's slots until every source's line carries `flag`, reduce,
/// store. False when a wait failed.
template <typename M>
CHORUS_HD bool llRead(const StepArgs& a, int parity, uint32_t flag, size_t i, size_t n, M& m) {
  const size_t lines = ceilDiv(a.bytes, kLineData);
  for (size_t l = i; l < lines; l += n) {
    Vec16 in[kMaxRanks];
    for (int r = 0; r < a.nranks; ++r) {
      Vec16 line;
      if (!m.pollLine(a.ws[a.rank] + a.layout.llSlot(parity, r) + l * kLine, flag, r, &line)) return false;
      in[r] = Vec16{{line.u[0], line.u[2], 0, 0}};
    }
    const Vec16 v = m.reduce(in, a.nranks);
    m.store(a.recv + l * kLineData, v, atMost(a.bytes - l * kLineData, kLineData));
  }
  return true;
}

// ---- Send/Recv (P2P): one kernel runs every send and receive of a call or a group ----

inline constexpr int kMaxP2pOps = 64;                              // sends and receives per kernel
inline constexpr int kMaxP2pLanes = 2 * kMaxRanks * kP2pChannels;  // blocks per kernel at most

struct P2pOp {
  Byte* buf;  // the send buffer (read) or the receive buffer (written)
  size_t bytes;
  int peer;
  int send;  // 1: send to peer, 0: receive from peer
};
/// One block: the ops of one direction and peer (in call order), the chunks of channel `channel`.
struct P2pLane {
  int send;
  int peer;
  int channel;
};
struct P2pArgs {
  Byte* ws[kMaxRanks];
  Layout layout;
  int rank;
  int nranks;
  int channelsCap;  // the same on every rank of the communicator
  int nOps;
  int nLanes;
  P2pOp ops[kMaxP2pOps];
  P2pLane lanes[kMaxP2pLanes];
};

/// Chunks of a message of `bytes`, and the channels they are dealt to (chunk k to channel k % C,
/// the same on both sides of a matched send and receive; 0 for an empty message).
CHORUS_HD inline size_t p2pChunks(size_t bytes, const Layout& l) { return ceilDiv(bytes, l.p2pSlotBytes); }
CHORUS_HD inline int p2pChannels(size_t bytes, const Layout& l, int cap) {
  const size_t chunks = p2pChunks(bytes, l);
  const size_t c = static_cast<size_t>(cap < 1 ? 1 : (cap > kP2pChannels ? kP2pChannels : cap));
  return static_cast<int>(chunks < c ? chunks : c);
}

/// Fills a.lanes from a.ops: per direction and peer (in order of first use), as many lanes as its
/// widest op has channels. Returns the number of lanes (0: nothing to move).
inline int planP2pLanes(P2pArgs& a) {
  a.nLanes = 0;
  for (int o = 0; o < a.nOps; ++o) {
    const P2pOp& op = a.ops[o];
    bool seen = false;
    for (int q = 0; q < o && !seen; ++q) seen = a.ops[q].send == op.send && a.ops[q].peer == op.peer;
    if (seen) continue;
    int width = 0;
    for (int q = o; q < a.nOps; ++q) {
      if (a.ops[q].send == op.send && a.ops[q].peer == op.peer) {
        const int c = p2pChannels(a.ops[q].bytes, a.layout, a.channelsCap);
        width = c > width ? c : width;
      }
    }
    for (int c = 0; c < width && a.nLanes < kMaxP2pLanes; ++c)
      a.lanes[a.nLanes++] = P2pLane{op.send, op.peer, c};
  }
  return a.nLanes;
}

CHORUS_HD inline Signals* signalsAt(Byte* ws) { return reinterpret_cast<Signals*>(ws); }

/// The P2P kernel, one lane per block, for an executor `X`:
///   int block()                                 this block's index
///   M& mem()                                    the memory operations above
///   void threads(F f)                           f(t, kThreads) for every thread t of the block
///   uint64_t read(const uint64_t* word)         a counter, the same for every thread
///   bool waitAtLeast(const uint64_t* word, uint64_t v, int peer)   until *word >= v; false: it failed
///                                                (what follows is ordered after the writes before it)
///   void publish(uint64_t* word, uint64_t v)    after the block's writes (and reads) so far, *word = v
///   void report(uint32_t why, int peer)         a failure, into the error word
/// A sender waits for a free slot (reading the receiver's head), fills it, publishes the message
/// size and then the tail into the receiver's workspace; the receiver waits for the tail, checks
/// the size, copies the chunk out and publishes the head in its own workspace.
template <typename X>
CHORUS_HD void p2pKernelBody(X& x, const P2pArgs& a) {
  const int b = x.block();
  if (b >= a.nLanes) return;
  const P2pLane lane = a.lanes[b];
  const int c = lane.channel;
  const int p = lane.peer;
  auto& m = x.mem();
  Signals* mine = signalsAt(a.ws[a.rank]);
  Signals* theirs = signalsAt(a.ws[p]);
  uint64_t* count = lane.send ? &mine->p2pSent[p][c] : &mine->p2pHead[p][c];
  uint64_t n = x.read(count);
  const size_t slotBytes = a.layout.p2pSlotBytes;
  bool ok = true;
  for (int o = 0; o < a.nOps && ok; ++o) {
    const P2pOp& op = a.ops[o];
    if (op.send != lane.send || op.peer != p) continue;
    const size_t chunks = p2pChunks(op.bytes, a.layout);
    const auto width = static_cast<size_t>(p2pChannels(op.bytes, a.layout, a.channelsCap));
    for (size_t k = static_cast<size_t>(c); k < chunks && ok; k += width, ++n) {
      const int slot = static_cast<int>(n % kP2pSlots);
      const size_t off = k * slotBytes;
      const size_t len = atMost(op.bytes - off, slotBytes);
      if (lane.send) {
        Byte* dst = a.ws[p] + a.layout.p2pSlot(a.rank, c, slot);
        if (n >= static_cast<uint64_t>(kP2pSlots) &&
            !x.waitAtLeast(&theirs->p2pHead[a.rank][c], n - kP2pSlots + 1, p)) {
          ok = false;
          break;
        }
        x.threads([&](size_t i, size_t t) { copyRange(dst, op.buf + off, len, i, t, m); });
        x.publish(&theirs->p2pMeta[a.rank][c][slot], static_cast<uint64_t>(op.bytes));
        x.publish(&theirs->p2pTail[a.rank][c], n + 1);
      } else {
        const Byte* src = a.ws[a.rank] + a.layout.p2pSlot(p, c, slot);
        if (!x.waitAtLeast(&mine->p2pTail[p][c], n + 1, p)) {
          ok = false;
          break;
        }
        if (x.read(&mine->p2pMeta[p][c][slot]) != static_cast<uint64_t>(op.bytes)) {
          x.report(kErrP2pSize, p);
          ok = false;
          break;
        }
        x.threads([&](size_t i, size_t t) { copyRange(op.buf + off, src, len, i, t, m); });
        x.publish(&mine->p2pHead[p][c], n + 1);
      }
    }
  }
  if (ok && lane.send) x.publish(count, n);  // only this lane counts this peer and channel
}

/// The Simple kernel, for an executor `X` running one block of one rank (the device kernel, or a host
/// thread in the tests):
///   uint64_t seq()                             this kernel's number (read before any block finishes)
///   M& mem()                                   the memory operations above
///   void each(F f)                             f(i, n) for every thread i of the block, n in the grid
///   bool barrier(uint64_t seq, uint32_t& k)    with the same block of every rank; false: it failed
///   void finish(uint64_t seq)                  the last block of the kernel numbers the next one
/// Every piece ends on a barrier, the last one too: once a rank's kernel has completed, no peer
/// touches its workspace for this call.
template <typename X>
CHORUS_HD void simpleKernelBody(X& x, const StepArgs& s) {
  const uint64_t seq = x.seq();
  const int half = static_cast<int>(seq & 1);
  uint32_t k = 0;
  auto& m = x.mem();
  for (size_t p = 0; p < s.plan.pieces; ++p) {
    x.each([&](size_t i, size_t n) { simpleCopyIn(s, half, p, i, n, m); });
    if (!x.barrier(seq, k)) break;
    x.each([&](size_t i, size_t n) { simpleRead(s, half, p, i, n, m); });
    if (s.kind == Kind::AllReduce) {
      if (!x.barrier(seq, k)) break;
      x.each([&](size_t i, size_t n) { simpleGather(s, half, p, i, n, m); });
    }
    if (!x.barrier(seq, k)) break;
  }
  x.finish(seq);
}

/// The LL kernel (allreduce), for the same executors. A failed wait has been reported by pollLine.
template <typename X>
CHORUS_HD void llKernelBody(X& x, const StepArgs& s) {
  const uint64_t seq = x.seq();
  const int parity = static_cast<int>(seq & 1);
  const uint32_t flag = llFlag(seq);
  auto& m = x.mem();
  x.each([&](size_t i, size_t n) { llWrite(s, parity, flag, i, n, m); });
  x.each([&](size_t i, size_t n) { (void)llRead(s, parity, flag, i, n, m); });
  x.finish(seq);
}

}  // namespace chorus::kernels::cuda::ipc
