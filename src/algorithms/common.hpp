// Small helpers shared by the algorithm files.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "base/config.hpp"
#include "base/error.hpp"
#include "kernels/cpu/reduce.hpp"
#include "topology/cache_thresholds.hpp"

namespace chorus::algo {

inline int mod(int a, int n) { return ((a % n) + n) % n; }

inline const std::byte* at(const void* base, size_t elems, size_t elemSize) {
  return static_cast<const std::byte*>(base) + elems * elemSize;
}
inline std::byte* at(void* base, size_t elems, size_t elemSize) {
  return static_cast<std::byte*>(base) + elems * elemSize;
}

/// Elements per 64-byte cache line (slices start on cache lines so ranks never write one line).
inline size_t cacheLineElems(size_t elemSize) { return 64 / elemSize; }

/// The shared-memory capability of a direct algorithm's communicator (it is selected only where the
/// ranks share a host; anything else is an internal error, not a crash).
inline engine::ShmSync& shared(Context& ctx) {
  engine::ShmSync* s = ctx.sharedMemory();
  if (s == nullptr) fail(chorusInternalError, "a shared-memory algorithm ran without shared memory");
  return *s;
}

/// Largest chunk of `blocks` equal blocks, in elements per block, that fits one staging slot.
inline size_t stageChunkElems(const transport::ShmGroup& shm, size_t elemSize, size_t blocks) {
  size_t per = shm.stageSlotBytes() / elemSize / blocks;
  size_t line = cacheLineElems(elemSize);
  return per >= line ? per / line * line : (per ? per : 1);
}

/// Which calls of a collective pack their chunks one after another through the whole staging
/// area (engine::StagePlacement::nextPacked) rather than alternating between slots 0 and 1: none,
/// calls of one or two chunks, or every call. A rank rewriting staging lines that a peer read last
/// and still holds in its L2 writes them several times slower than lines the peer has let go
/// (docs/performance.md, "Staging slots"). Measured on the AVX-512 EPYC VM against two slots in
/// turn, 2 ranks: short calls, the all-to-all and the broadcast of 256 KiB-1 MiB 1.1-2.1x faster,
/// the reduce-scatter of 256 KiB 1.8-1.9x, the all-gather of 256 KiB 1.2-1.4x but of 1 MiB 4-7%
/// slower (so it packs blocks of up to half a slot); every call (2026-12-07, near placement), the
/// broadcast of 2 MiB 1.5-1.9x faster, the reduce and the in-place all-to-all of 2-16 MiB
/// 1.25-1.9x, the reduce-scatter of 2-8 MiB 1.1-1.4x, while the allreduce lost 5-12% and the
/// all-gather held (those two pack short calls).
enum class Packing { None, ShortCalls, Always };
/// That is where every rank has a core of its own (`ranksPerCore` 1: ShmGroup::ranksPerCore, rank
/// 0's verdict). With two ranks a core only the short calls of the collectives that pack every
/// call: 4 ranks on the 2 vCPUs (2026-12-07, sixth session), the reduce-scatter, reduce and
/// all-to-all of 32 and 256 KiB 1.05-1.8x faster, the broadcast even; their calls of 2 and 16 MiB
/// up to 25% slower packed, the allreduce of 256 KiB 12% slower with its short calls packed, the
/// all-gather even. With more, none: 8 ranks on the 2 vCPUs, the same short calls 1.1-1.5x slower
/// packed.
inline bool stagingPacks(int ranksPerCore, size_t chunks, Packing packing) {
  const bool shortCall = chunks <= 2;
  if (ranksPerCore == 1) return packing == Packing::Always || (packing == Packing::ShortCalls && shortCall);
  return ranksPerCore == 2 && packing == Packing::Always && shortCall;
}
inline bool stagingPacks(const transport::ShmGroup& shm, size_t chunks, Packing packing) {
  return stagingPacks(shm.ranksPerCore(), chunks, packing);
}

/// The shape of every direct algorithm: for each chunk of at most `chunk` elements (offset `off`,
/// length `ce`), `stage(off, ce, place)` writes this rank's part, `rowBytes` per element of the
/// chunk, at byte `place` of its staging area (ShmGroup::stageAt), all ranks synchronise, and
/// `consume(off, ce, place)` reads what the peers staged at the same place of theirs. A chunk never
/// overlaps the chunk before, so its staging cannot overwrite data a slower peer is still reading
/// (see shm_group.hpp; engine/stage_placement.hpp). `packing`: stagingPacks. `local(off, ce)`, where
/// given, runs between this rank's arrival and its wait for the others (ShmSync::arrive, waitAll):
/// work on its own buffers only, such as copying its own block to its output, which then hides the
/// flags' trip between the cores instead of following it.
template <typename Stage, typename Consume, typename Local>
void forEachStagedChunk(Context& ctx, size_t count, size_t chunk, size_t rowBytes, Stage&& stage,
                        Consume&& consume, Packing packing, Local&& local) {
  const bool packed = stagingPacks(shared(ctx).group(), (count + chunk - 1) / chunk, packing);
  for (size_t off = 0; off < count; off += chunk) {
    const size_t ce = std::min(chunk, count - off);
    const size_t place = shared(ctx).nextStageOffset(ce * rowBytes, packed);
    stage(off, ce, place);
    const uint64_t point = shared(ctx).arrive();
    local(off, ce);
    shared(ctx).waitAll(point);
    consume(off, ce, place);
  }
}
template <typename Stage, typename Consume>
void forEachStagedChunk(Context& ctx, size_t count, size_t chunk, size_t rowBytes, Stage&& stage,
                        Consume&& consume, Packing packing) {
  forEachStagedChunk(ctx, count, chunk, rowBytes, stage, consume, packing, [](size_t, size_t) {});
}

/// Nanoseconds since `start` (steady clock), for the timed choices.
inline uint64_t nsSince(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
}

/// The chunk size from which a staged all-gather, and the root of a staged broadcast, out of place,
/// write their own input to their output in the same pass as into staging (stageCopy's `own`) rather
/// than by a second copy while the others arrive. Measured on the AVX-512 EPYC VM, 2 ranks, against
/// the second copy (docs/performance.md, "The own block in the same pass"): the all-gather of
/// 256 KiB and 2 MiB 1.06-1.14x faster near, 1.1-1.25x far; of 64 KiB (32 KiB a rank) even near,
/// 1.08x far; of 32 KiB 1.2x slower near (the copy's plain vector stores against memcpy's, and the
/// timed choice streaming more often where the two are close); the broadcast of 64 KiB to 16 MiB
/// out of place 1.1-1.4x faster near, 1.3-1.7x far from 2 MiB.
inline constexpr size_t kOwnInSamePassFrom = 32 * 1024;

/// Copies `bytes` of this rank's input into its staging area at `dst`, whose lines the peers read
/// last: with plain or streaming stores, whichever this rank has timed faster
/// (engine/staging_writes.hpp; both give the same bytes), and says which to the peers
/// (transport::ShmGroup::publishStagedStreaming), which time their reads of it by that and
/// publish what a streamed block costs them more (recordStagedRead), which a streaming copy's
/// time then counts. With `own`, the same bytes go to this rank's output there too, with `ownStore`'s
/// stores, in the same pass (kernels::copyToBoth: the input read once), timed apart
/// (StagingWrites::nextCopy's `withOwn`).
inline void stageCopy(Context& ctx, std::byte* dst, const void* src, size_t bytes, void* own = nullptr,
                      kernels::CopyMode ownStore = kernels::CopyMode::Cached) {
  engine::StagingWrites& writes = shared(ctx).stagingWrites();
  const bool withOwn = own != nullptr;
  const kernels::CopyMode how = writes.nextCopy(bytes, withOwn);
  const auto write = [&] {
    if (withOwn)
      kernels::copyToBoth(dst, how, own, ownStore, src, bytes);
    else
      kernels::copy(dst, src, bytes, how);
  };
  if (!writes.copyTimed(bytes)) return write();
  transport::ShmGroup& shm = shared(ctx).group();
  const bool streaming = how == kernels::CopyMode::Streaming;
  shm.publishStagedStreaming(streaming);
  const auto start = std::chrono::steady_clock::now();
  write();
  const uint64_t ns = nsSince(start);
  // A streaming copy counts what its readers published they pay more for it (the mean over the
  // peers that did): the root of a broadcast reads nothing of its own to measure it by.
  double readers = -1;
  if (streaming) {
    const int sizeClass = engine::StagingWrites::readClass(bytes);
    double sum = 0;
    int known = 0;
    for (int k = 0; k < shm.size(); ++k) {
      const double p = k == shm.rank() ? -1 : shm.readPenalty(k, sizeClass);
      if (p >= 0) {
        sum += p;
        ++known;
      }
    }
    if (known) readers = sum / known;
  }
  writes.recordCopy(how, bytes, ns, readers, withOwn);
}

static_assert(engine::StagingWrites::kReadClasses <= transport::kReadPenaltyClasses);

/// Records a timed read of `bytes` of the peers' staged blocks, written `streamed` or not, and
/// publishes what this rank now measures a streamed block costs it more, for the peers' copies.
inline void recordStagedRead(Context& ctx, bool streamed, size_t bytes, uint64_t ns, bool reduction) {
  engine::StagingWrites& writes = shared(ctx).stagingWrites();
  writes.recordRead(streamed, bytes, ns, reduction);
  shared(ctx).group().publishReadPenalty(engine::StagingWrites::readClass(bytes),
                                         writes.readPenaltyNsPerKiB(bytes));
}

/// Copies `bytes` of peer `k`'s staging area at `src` (a block it staged with stageCopy) to
/// `dst` with `store`'s stores; where the copies into staging are timed, the read is timed too
/// (StagingWrites::readTimed says which), against how the peer wrote the block
/// (StagingWrites::recordRead).
inline void copyStaged(Context& ctx, int k, void* dst, const std::byte* src, size_t bytes,
                       kernels::CopyMode store) {
  engine::StagingWrites& writes = shared(ctx).stagingWrites();
  if (!writes.copyTimed(bytes)) return kernels::copy(dst, src, bytes, store);
  const bool streamed = shared(ctx).group().stagedStreaming(k);
  if (!writes.readTimed(streamed, bytes)) return kernels::copy(dst, src, bytes, store);
  const auto start = std::chrono::steady_clock::now();
  kernels::copy(dst, src, bytes, store);
  recordStagedRead(ctx, streamed, bytes, nsSince(start), false);
}

/// Stages elements [off, off+ce) of each of the n blocks (of `count` elements) of `send`, packed
/// block after block at byte `place` of this rank's staging area (reduce-scatter and all-to-all layouts); all
/// but block `skip` (-1: none), which no peer reads.
inline void stageBlocks(Context& ctx, size_t place, const void* send, size_t count, size_t off, size_t ce,
                        size_t elemSize, int skip = -1) {
  transport::ShmGroup& shm = shared(ctx).group();
  std::byte* mine = shm.stageAt(shm.rank(), place);
  for (size_t j = 0; j < static_cast<size_t>(shm.size()); ++j) {
    if (static_cast<int>(j) == skip) continue;
    stageCopy(ctx, mine + j * ce * elemSize, at(send, j * count + off, elemSize), ce * elemSize);
  }
}

/// How to write an output of `bytes` per rank: past topo::ntStoreBytes() the output will not fit
/// in cache with the input anyway, and non-temporal stores save the read-for-ownership of every
/// destination line (a third of the memory traffic of a copy). Not when the output overwrites the
/// input chunk by chunk (`overwritesInput`): those lines were just read, so plain stores hit the
/// cache and streaming would only evict them (measured: in-place 4-16 MiB allreduce 10-15% slower).
inline kernels::CopyMode outputCopyMode(size_t bytes, bool overwritesInput = false) {
  return !overwritesInput && bytes >= topo::ntStoreBytes() ? kernels::CopyMode::Streaming
                                                           : kernels::CopyMode::Cached;
}

/// Whether the staged all-gather, allreduce and all-to-all time their output stores
/// (engine/output_stores.hpp), streaming first, where outputCopyMode says plain stores for this
/// rank's output: where the buffers all `ranks` ranks of the host touch, `footprint` bytes each
/// (input and output), reach the non-temporal threshold, since they share the last-level cache.
/// Below it plain stores, untimed: there a copy with streaming stores timed alone looks cheaper
/// than it is (the lines it evicts cost the next reader), measured on the AVX2 EPYC VM
/// (docs/performance.md, "Output stores, timed").
inline bool streamsFirst(size_t footprint, int ranks) {
  return footprint * static_cast<size_t>(std::max(ranks, 1)) >= topo::ntStoreBytes();
}

/// Zero-copy algorithms read peers' buffers in place when all ranks' buffers come from
/// chorusMemAlloc. Below this size the extra synchronisation of the buffer exchange costs more
/// than the copy through the staging area that it saves.
constexpr size_t kZeroCopyMinBytes = size_t{64} << 10;

/// Whether reading peers' ordinary buffers in place (trySingleCopy) beats staging them for a call
/// of `kind` with a message of `messageBytes` (the per-rank block for all-gather and all-to-all,
/// the buffer for broadcast and allreduce, the whole send buffer for reduce-scatter) and `outputBytes` per
/// rank (single_copy.cpp has the measurements). CHORUS_CMA=0: never; CHORUS_CMA=<size>: from that message
/// size up, for every collective that has a single-copy path (allreduce, reduce-scatter, all-gather,
/// broadcast, all-to-all).
bool singleCopyPays(OpKind kind, size_t messageBytes, size_t outputBytes);

/// For the reductions (allreduce, reduce-scatter), whose single copy pulls the peers' inputs
/// (reducePulled) instead of staging them: whether that beats staging once the buffers are
/// exchanged and every rank knows whether any rank works in place (single_copy.cpp). For the
/// allreduce only the way tried first: rank 0 times both (engine/single_copy_choice.hpp).
bool pullingPays(OpKind kind, size_t messageBytes, bool anyInPlace);
/// The all-gather's way tried first (rank 0 times both): single copy up to 32 MiB of output per
/// rank, staging (which streams large outputs) past it.
bool allGatherPullsFirst(size_t outputBytes);

/// Single copy's reduction, with no synchronisation of its own (the caller exchanged buffers in
/// `peers` and synchronises afterwards): dst = op.op over every rank k of `count` elements at
/// element offset `offset` of k's send buffer (`divisor`: Avg's, or 0). This rank's own are read in
/// place; each peer's are read into scratch with readPeer, piece by piece, so that they are in
/// cache for the reduction, 256 KiB (shared by the peers) at a time. `store`: how dst is written
/// (outputCopyMode of the whole output, or Cached when pushing). With `pushToPeers` (allreduce)
/// each reduced piece is also written, from cache, to the same elements of every peer's receive
/// buffer (writePeer).
void reducePulled(Context& ctx, const Op& op, const std::vector<engine::PeerBuffers>& peers, size_t offset,
                  size_t count, void* dst, int divisor, kernels::CopyMode store, bool pushToPeers);

/// ShmSync::exchangeBuffers for a message of `messageBytes`, skipped (false on every rank) when the
/// message is too small or zero copy is off.
inline bool tryZeroCopy(Context& ctx, size_t messageBytes, const void* send, size_t sendBytes, void* recv,
                        size_t recvBytes, std::vector<engine::PeerBuffers>& peers) {
  engine::ShmSync& sm = shared(ctx);
  if (messageBytes < kZeroCopyMinBytes || !sm.zeroCopyEnabled()) return false;
  return sm.exchangeBuffers(send, sendBytes, recv, recvBytes, peers);
}

/// Single copy: zero copy, or else (every rank able to read every peer process's memory, fast
/// enough or, for the collectives rank 0 times, at all, and singleCopyPays) the peers' ordinary
/// buffers read in place: directly between ranks of one
/// process, by cross-memory attach between processes. The caller reads peers' buffers only
/// through ShmSync::readPeer and synchronises once more before returning (nobody may reuse a
/// buffer a peer still reads). The same answer on every rank. `choice` travels to every rank's
/// peers[this rank].choice (the allreduce: rank 0's verdict, engine/single_copy_choice.hpp).
inline bool trySingleCopy(Context& ctx, OpKind kind, size_t messageBytes, size_t outputBytes,
                          const void* send, size_t sendBytes, void* recv, size_t recvBytes,
                          std::vector<engine::PeerBuffers>& peers, uint32_t choice = 0) {
  engine::ShmSync& sm = shared(ctx);
  const bool ordinary =
      (engine::SingleCopyChoice::times(kind) ? sm.peerReadsTimed() : sm.peerReadsEnabled()) &&
      singleCopyPays(kind, messageBytes, outputBytes);
  if (!ordinary && (messageBytes < kZeroCopyMinBytes || !sm.zeroCopyEnabled())) return false;
  return sm.exchangeBuffers(send, sendBytes, recv, recvBytes, peers, ordinary, choice);
}

/// The divisor for Avg at the point where a reduction completes (0 = no division).
inline int avgDivisor(const Op& op, int nranks) { return op.op == ReduceOp::Avg ? nranks : 0; }

}  // namespace chorus::algo
