// Arithmetic of the device-buffer collectives over CUDA IPC (ipc_collectives.cu): where each
// rank's workspace keeps its flags and buffers, and how a call is cut into pieces, slices and
// per-block work. Pure functions with no CUDA header, so that the host tests check them on
// machines without a GPU (tests/unit/test_cuda_ipc_layout.cpp).
//
// Workspace of one rank (device memory, mapped into every peer of the communicator):
//   [Signals] [LL area: 2 parities x kMaxRanks sources x llLines x 16 B] [Simple: 2 halves x (stage, result)]
//   [P2P: p2pSources sources x kP2pChannels channels x kP2pSlots slots x p2pSlotBytes]
// - Signals::flag[b][p] is written by block b of peer p (a barrier value that only grows);
//   Signals::seq counts the kernels run on the workspace; the last block of each kernel bumps it.
//   Every Simple kernel ends with a barrier, so once a rank's kernel has completed no peer touches
//   its workspace for that call (a communicator can then be destroyed once its kernels are done).
// - LL (low latency, NCCL's LL is the model): 16-byte lines {data0, flag, data1, flag} written
//   straight into every peer's slot for this rank; a reader polls its own memory until both flags
//   equal the kernel's. Slots alternate by the parity of seq.
// - Simple: each rank copies its input into its stage, the ranks meet at a per-block barrier, read
//   each other's stages (and result areas) directly. Halves alternate by the parity of seq, so a
//   kernel never overwrites what a peer's previous kernel may still be reading.
// - P2P (send/recv): a FIFO per source and channel in the receiver's workspace. The sender copies
//   chunk n into slot n % kP2pSlots once the receiver has taken chunk n - kP2pSlots (p2pHead, which
//   the receiver keeps in its own Signals and the sender reads), writes the message's size beside
//   it (p2pMeta) and then p2pTail (both in the receiver's Signals). The receiver writes only its
//   own workspace, so a sender's workspace can go as soon as its kernels are done. Chunk counts per
//   peer and channel live on (p2pSent, p2pHead), so that each kernel goes on where the last one
//   stopped.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define CHORUS_HD __host__ __device__
#else
#define CHORUS_HD
#endif

namespace chorus::kernels::cuda::ipc {

inline constexpr int kMaxRanks = 8;    // ranks one IPC communicator can hold (more: staged path)
inline constexpr int kMaxBlocks = 32;  // blocks per kernel per rank
inline constexpr int kThreads = 512;   // threads per block
inline constexpr size_t kPack = 16;    // bytes moved per thread per step (one uint4)
inline constexpr size_t kLine = 16;    // bytes of one LL line (8 of them data)
inline constexpr size_t kLineData = 8;
inline constexpr int kP2pChannels = 4;  // blocks (and FIFOs) per peer and direction at most
inline constexpr int kP2pSlots = 4;     // chunks in flight per FIFO

struct Signals {
  uint64_t flag[kMaxBlocks][kMaxRanks];
  unsigned long long seq;  // 64 bits: barrier values built from it never wrap
  unsigned int done;
  unsigned int errorClaim;  // the first failing wait of this rank's kernels takes it (never reset)
  // P2P, per peer and channel. Written by that peer: p2pTail (chunks it has put into this rank's
  // FIFO) and p2pMeta (the size of the message each slot's chunk belongs to). Written by this rank:
  // p2pHead (chunks it has taken from that peer's FIFO; the peer reads it) and p2pSent (chunks it
  // has sent to that peer).
  uint64_t p2pTail[kMaxRanks][kP2pChannels];
  uint64_t p2pHead[kMaxRanks][kP2pChannels];
  uint64_t p2pSent[kMaxRanks][kP2pChannels];
  uint64_t p2pMeta[kMaxRanks][kP2pChannels][kP2pSlots];
};
inline constexpr size_t kSignalsBytes = 8192;
static_assert(sizeof(Signals) <= kSignalsBytes);

CHORUS_HD constexpr size_t roundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }
CHORUS_HD constexpr size_t ceilDiv(size_t x, size_t m) { return (x + m - 1) / m; }

struct Layout {
  size_t stageBytes = 0;  // one stage (and one result area) of one half
  size_t llBytes = 0;     // largest LL payload, bytes per rank per call
  size_t llOffset = 0;
  size_t simpleOffset = 0;
  size_t p2pSlotBytes = 0;  // one P2P chunk
  int p2pSources = 0;       // FIFOs for this many source ranks
  size_t p2pOffset = 0;
  size_t total = 0;

  CHORUS_HD constexpr size_t llLines() const { return llBytes / kLineData; }
  /// Where source `src` writes its lines for a kernel of parity `parity`.
  CHORUS_HD constexpr size_t llSlot(int parity, int src) const {
    return llOffset +
           (static_cast<size_t>(parity) * kMaxRanks + static_cast<size_t>(src)) * llLines() * kLine;
  }
  CHORUS_HD constexpr size_t stage(int half) const {
    return simpleOffset + static_cast<size_t>(half) * 2 * stageBytes;
  }
  CHORUS_HD constexpr size_t result(int half) const { return stage(half) + stageBytes; }
  /// Slot `slot` of the FIFO that source `src` fills on channel `channel`.
  CHORUS_HD constexpr size_t p2pSlot(int src, int channel, int slot) const {
    return p2pOffset + ((static_cast<size_t>(src) * kP2pChannels + static_cast<size_t>(channel)) * kP2pSlots +
                        static_cast<size_t>(slot)) *
                           p2pSlotBytes;
  }
};

/// stageBytes and llBytes are rounded up to 4 KiB and 8 bytes, p2pSlotBytes (0: no P2P area) to
/// 4 KiB; the areas stay 4 KiB aligned. The P2P area holds FIFOs for `p2pSources` source ranks.
CHORUS_HD constexpr Layout makeLayout(size_t stageBytes, size_t llBytes, size_t p2pSlotBytes = 0,
                                      int p2pSources = kMaxRanks) {
  Layout l;
  l.stageBytes = roundUp(stageBytes, 4096);
  l.llBytes = roundUp(llBytes, kLineData);
  l.llOffset = kSignalsBytes;
  l.simpleOffset = roundUp(l.llOffset + 2 * kMaxRanks * l.llLines() * kLine, 4096);
  l.p2pSlotBytes = roundUp(p2pSlotBytes, 4096);
  l.p2pSources = l.p2pSlotBytes == 0 ? 0 : p2pSources;
  l.p2pOffset = l.simpleOffset + 4 * l.stageBytes;
  l.total = l.p2pOffset + static_cast<size_t>(l.p2pSources) * kP2pChannels * kP2pSlots * l.p2pSlotBytes;
  return l;
}

/// A Simple call: `total` bytes as `slices` slices of `sliceLen` bytes (the last ones shorter, or
/// empty, when total < slices * sliceLen), processed in `pieces` pieces; piece p covers bytes
/// [p*pieceLen, (p+1)*pieceLen) of every slice. In a stage, slice s of a piece starts at
/// s*pieceLen. pieceLen is a multiple of kPack.
struct Plan {
  int slices = 1;
  size_t sliceLen = 0;
  size_t total = 0;
  size_t pieceLen = 0;
  size_t pieces = 0;
  int blocks = 1;

  /// Bytes of slice s.
  CHORUS_HD constexpr size_t sliceBytes(int s) const {
    const size_t begin = static_cast<size_t>(s) * sliceLen;
    if (begin >= total) return 0;
    return total - begin < sliceLen ? total - begin : sliceLen;
  }
  /// Bytes of slice s that piece p carries (0 when the slice ends before it).
  CHORUS_HD constexpr size_t len(int s, size_t p) const {
    const size_t all = sliceBytes(s);
    const size_t begin = p * pieceLen;
    if (begin >= all) return 0;
    return all - begin < pieceLen ? all - begin : pieceLen;
  }
};

/// `total` bytes as `slices` slices of `sliceLen`, through stages of `stageBytes`, at most
/// `maxBlocks` blocks. The grid depends only on the arguments, so that every rank of a call
/// computes the same one (the flags are per block).
CHORUS_HD constexpr Plan planSimple(int slices, size_t sliceLen, size_t total, size_t stageBytes,
                                    int maxBlocks) {
  Plan p;
  p.slices = slices < 1 ? 1 : slices;
  p.sliceLen = sliceLen;
  p.total = total;
  const size_t room = stageBytes / static_cast<size_t>(p.slices) / kPack * kPack;  // >= kPack by contract
  const size_t want = roundUp(sliceLen < total ? sliceLen : total, kPack);
  p.pieceLen = want < room ? want : room;
  if (p.pieceLen == 0) p.pieceLen = kPack;
  p.pieces = want == 0 ? 0 : ceilDiv(want, p.pieceLen);
  const size_t blocks = ceilDiv(p.pieceLen, kPack * kThreads);
  const size_t cap =
      static_cast<size_t>(maxBlocks < 1 ? 1 : (maxBlocks > kMaxBlocks ? kMaxBlocks : maxBlocks));
  p.blocks = static_cast<int>(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
  return p;
}

/// Allreduce of `bytes` over `nranks`: slice s of the message is reduced by rank s. Slices are
/// multiples of kPack, so that they start aligned wherever the buffer does.
CHORUS_HD constexpr Plan planAllReduce(size_t bytes, int nranks, size_t stageBytes, int maxBlocks) {
  const size_t slice = roundUp(ceilDiv(bytes, static_cast<size_t>(nranks)), kPack);
  return planSimple(nranks, slice, bytes, stageBytes, maxBlocks);
}

/// LL: `bytes` as lines of 8 data bytes; the grid for them.
CHORUS_HD constexpr int llBlocks(size_t bytes, int maxBlocks) {
  const size_t lines = ceilDiv(bytes, kLineData);
  const size_t blocks = ceilDiv(lines, static_cast<size_t>(kThreads));
  const size_t cap =
      static_cast<size_t>(maxBlocks < 1 ? 1 : (maxBlocks > kMaxBlocks ? kMaxBlocks : maxBlocks));
  return static_cast<int>(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
}

/// Barrier value of barrier `k` (0-based, k < 2^24) of the kernel numbered `seq`: grows across
/// kernels and within one (for 2^40 kernels), never 0.
CHORUS_HD constexpr uint64_t barrierValue(uint64_t seq, uint32_t k) { return (seq << 24) + k + 1; }
/// LL flag of the kernel numbered `seq` (never 0, the value of a fresh workspace). A slot holds
/// lines of the kernels of its parity only, so a stale line matches only 2^32 kernels later.
CHORUS_HD constexpr uint32_t llFlag(uint64_t seq) {
  const auto f = static_cast<uint32_t>(seq + 1);
  return f == 0 ? 1 : f;
}

}  // namespace chorus::kernels::cuda::ipc
