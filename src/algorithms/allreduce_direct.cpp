// AllReduce, direct: on one host every rank stages the slices of its chunk that its peers reduce,
// reduces its own slice from its input and all peers' staging areas into its staging area and its
// output, and copies the peers' reduced slices out. One synchronisation per chunk and one more per
// call (pipelined: chunk i is copied out after the synchronisation that follows chunk i+1's
// staging); per rank, (n-1)/n of the chunk copied in, 1/n reduced from n sources and written
// twice, (n-1)/n copied out.
#include <array>
#include <chrono>
#include <optional>
#include <utility>

#include "algorithms/common.hpp"

namespace chorus::algo {

namespace {

// Zero copy (every rank's buffers in chorusMemAlloc memory): rank r reduces slice r straight from
// every peer's input into its own output, then copies the other slices from the peers' outputs.
// Three synchronisations (buffers published, slices reduced, peers done reading) and each rank
// reads n + n-1 slices and writes n: no staging copy at all.
void allReduceShared(Context& ctx, const Op& op, const std::vector<engine::PeerBuffers>& peers) {
  const int n = ctx.size(), me = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  Slices slices(op.count, static_cast<size_t>(n), cacheLineElems(elem));
  const size_t so = slices.offset(static_cast<size_t>(me)), sn = slices.length(static_cast<size_t>(me));
  if (sn) {
    std::vector<const void*> srcs(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) srcs[static_cast<size_t>(k)] = peers[static_cast<size_t>(k)].send + so * elem;
    kernels::reduce(at(op.recv, so, elem), srcs.data(), n, sn, op.type, op.op, avgDivisor(op, n),
                    outputCopyMode(op.count * elem, op.send == op.recv));
  }
  shared(ctx).syncAll();  // every slice reduced
  const kernels::CopyMode store = outputCopyMode(op.count * elem);
  for (int k = 0; k < n; ++k) {
    const size_t o = slices.offset(static_cast<size_t>(k)), l = slices.length(static_cast<size_t>(k));
    if (k != me && l)
      kernels::copy(at(op.recv, o, elem), peers[static_cast<size_t>(k)].recv + o * elem, l * elem, store);
  }
  shared(ctx).syncAll();  // nobody reads this rank's buffers any more: the caller may reuse them
}

// Single copy (ordinary buffers, every peer process's memory readable): rank r pulls slice r of
// every peer's input into cache piece by piece, reduces it with its own into its output and
// writes the reduced piece, still in cache, into every peer's output (reducePulled). Slice r of
// every rank's buffers is touched by rank r alone, read before it is written, so ranks in place
// are safe. Two synchronisations per call (the buffer exchange, and this one: every slice
// written, nobody touches this rank's buffers any more), none per chunk; each rank copies
// 2(n-1)/n of the message by CMA and nothing through staging.
//
// Pushing the reduced pieces instead of having the peers read them after a synchronisation (as
// up to 2026-12-05) copies the same bytes, but from the writer's cache rather than from lines just
// written on another core, and saves a synchronisation. AVX2 EPYC VM, 2 ranks, median of 9
// interleaved launches, us read / pushed: out of place 256 KiB 79.3 / 51.4, 1 MiB 241 / 214,
// 2 MiB 583 / 561, 4 MiB 1536 / 1575, 8 MiB 3547 / 3294, 16 MiB 7335 / 6536; in place 4 MiB
// 1108 / 1053, 8 MiB 3073 / 2546, 16 MiB 6324 / 5286 (docs/performance.md, "Single copy").
void allReducePulled(Context& ctx, const Op& op, const std::vector<engine::PeerBuffers>& peers) {
  const int n = ctx.size(), me = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  Slices slices(op.count, static_cast<size_t>(n), cacheLineElems(elem));
  const size_t so = slices.offset(static_cast<size_t>(me)), sn = slices.length(static_cast<size_t>(me));
  // Each reduced piece is read right back to be pushed: it stays in cache, whatever the size.
  if (sn) {
    reducePulled(ctx, op, peers, so, sn, at(op.recv, so, elem), avgDivisor(op, n), kernels::CopyMode::Cached,
                 true);
  }
  // Every slice reduced into every output; nobody touches this rank's buffers any more.
  shared(ctx).syncAll();
}

// Staged: every rank stages its input through its staging area, chunk by chunk (the header).
void allReduceStaged(Context& ctx, const Op& op) {
  const int n = ctx.size(), me = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const size_t bytes = op.count * elem;
  transport::ShmGroup& shm = shared(ctx).group();
  const size_t chunk = stageChunkElems(shm, elem, 1);
  // The output: with plain or streaming stores, whichever this rank has timed faster for outputs
  // of this size (engine/output_stores.hpp), where all ranks' inputs and outputs reach the
  // threshold but this rank's output does not (streamsFirst); elsewhere the threshold's way per
  // rank. In place always plain: the lines were just read, and streaming would only evict them
  // (outputCopyMode).
  const bool inPlace = op.send == op.recv;
  engine::OutputStores& stores = shared(ctx).outputStores();
  const kernels::CopyMode fixed = outputCopyMode(bytes, inPlace);
  const bool storesTimed = fixed == kernels::CopyMode::Cached && !inPlace && stores.timed(op.kind, bytes) &&
                           streamsFirst(2 * bytes, n);
  const kernels::CopyMode store =
      storesTimed ? stores.next(op.kind, bytes, kernels::CopyMode::Streaming) : fixed;
  // Timed: the whole call from the first synchronisation (every rank has arrived) to this rank's
  // last copy out, not the copies out alone: on an AVX-512 EPYC VM the 2-rank allreduce of 8 MiB
  // copied out faster with streaming stores but took 1.17x longer per call (docs/performance.md).
  std::chrono::steady_clock::time_point since{};
  std::vector<const void*> srcs(static_cast<size_t>(n));
  struct Chunk {
    size_t off, ce;
    size_t at;  // byte offset in the staging area (ShmGroup::stageAt)
  };
  auto myRange = [&](size_t ce) {
    Slices slices(ce, static_cast<size_t>(n), cacheLineElems(elem));
    const size_t so = slices.offset(static_cast<size_t>(me));
    return std::pair{so, so + slices.length(static_cast<size_t>(me))};
  };
  // Plain or streaming stores for the copies, stores, memcpy or streaming ones for the reductions,
  // as this rank has timed them (engine/staging_writes.hpp).
  engine::StagingWrites& writes = shared(ctx).stagingWrites();
  // Peers need every slice of a chunk but this rank's own, which it reduces from its input.
  auto stage = [&](const Chunk& c) {
    const auto [so, end] = myRange(c.ce);
    stageCopy(ctx, shm.stageAt(me, c.at), at(op.send, c.off, elem), so * elem);
    stageCopy(ctx, shm.stageAt(me, c.at) + end * elem, at(op.send, c.off + end, elem), (c.ce - end) * elem);
  };
  // This rank's slice, from its input and what the peers staged, into the same place of its slot,
  // whose lines the peers read last (they copied a chunk out of it), and into its output: each
  // block reduced once, in L1, and written to both (kernels::reduceToBoth), rather than copied out
  // of the staging area after the next synchronisation, which read it back (2 ranks, AVX-512 EPYC
  // VM, 2026-12-07: 1.3x faster from 256 KiB to 2 MiB). Not where the output streams: written 16
  // KiB at a time beside the staging writes, the out-of-place allreduce of 16 MiB then took 10%
  // longer than with the slice streamed out of staging after the next synchronisation. Nor where
  // ranks share cores (ShmGroup::ownCores() false): 4 ranks on the 2 vCPUs took 5-12% longer
  // at 256 KiB and 2 MiB (docs/performance.md, "Its own slice straight to its output").
  const bool ownAtReduce = store != kernels::CopyMode::Streaming && shm.ownCores();
  auto reduce = [&](const Chunk& c) {
    const auto [so, end] = myRange(c.ce);
    if (end == so) return;
    for (int k = 0; k < n; ++k) srcs[static_cast<size_t>(k)] = shm.stageAt(k, c.at) + so * elem;
    srcs[static_cast<size_t>(me)] = at(op.send, c.off + so, elem);
    const size_t outBytes = (end - so) * elem;
    const kernels::CopyMode how = writes.next(outBytes);
    const bool timed = writes.timed(outBytes);
    const auto start = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    if (ownAtReduce)
      kernels::reduceToBoth(shm.stageAt(me, c.at) + so * elem, how, at(op.recv, c.off + so, elem), store,
                            srcs.data(), n, end - so, op.type, op.op, avgDivisor(op, n));
    else
      kernels::reduce(shm.stageAt(me, c.at) + so * elem, srcs.data(), n, end - so, op.type, op.op,
                      avgDivisor(op, n), how);
    if (!timed) return;
    const uint64_t ns = nsSince(start);
    writes.record(how, outBytes, ns);
    // The same time as a read of the peers' staged slices, where they all wrote them one way.
    int streamed = 0;
    for (int k = 0; k < n; ++k) streamed += k != me && shm.stagedStreaming(k);
    if (streamed == 0 || streamed == n - 1)
      recordStagedRead(ctx, streamed != 0, static_cast<size_t>(n - 1) * outBytes, ns, true);
  };
  // The peers' slices, and this rank's own where the reduction did not write it to the output.
  auto copyOut = [&](const Chunk& c) {
    Slices slices(c.ce, static_cast<size_t>(n), cacheLineElems(elem));
    for (int k = 0; k < n; ++k) {
      const size_t o = slices.offset(static_cast<size_t>(k)), l = slices.length(static_cast<size_t>(k));
      if (l && (k != me || !ownAtReduce))
        kernels::copy(at(op.recv, c.off + o, elem), shm.stageAt(k, c.at) + o * elem, l * elem, store);
    }
  };
  // Pipelined so that a chunk costs one synchronisation, not two: the one after chunk i+1 is
  // staged also says chunk i is reduced, and its copy out runs after it. Staging chunk i+2 into
  // chunk i's slot while slower peers still copy chunk i's reduced slices out of it is safe: it
  // writes every slice but this rank's own, and peers read only that one (of the same layout,
  // hence the extra synchronisation before a chunk of another length reuses a slot). A packed call
  // has two chunks at most, in two places apart.
  std::optional<Chunk> reduced;  // reduced, waiting for the next synchronisation to be copied out
  std::array<size_t, transport::kStageSlots> slotCe{};  // the length of the chunk last staged in each slot
  const bool packed = stagingPacks(shm, (op.count + chunk - 1) / chunk, Packing::ShortCalls);
  for (size_t off = 0; off < op.count; off += chunk) {
    const size_t ce = std::min(chunk, op.count - off);
    const Chunk c{off, ce, shared(ctx).nextStageOffset(ce * elem, packed)};
    if (!packed) {
      size_t& last = slotCe[c.at / shm.stageSlotBytes()];
      if (last != 0 && last != c.ce) shared(ctx).syncAll();  // peers are done copying that chunk out
      last = c.ce;
    }
    stage(c);
    shared(ctx).syncAll();  // chunk c staged, the one before it reduced
    if (storesTimed && !reduced) since = std::chrono::steady_clock::now();
    if (reduced) copyOut(*reduced);
    reduce(c);
    reduced = c;
  }
  shared(ctx).syncAll();  // the last chunk reduced
  copyOut(*reduced);
  if (storesTimed) stores.record(op.kind, bytes, store, nsSince(since));
}

}  // namespace

void allReduceDirect(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int me = ctx.rank();
  const size_t bytes = op.count * dataTypeSize(op.type);
  // Single copy or staging (ordinary buffers): rank 0's verdict travels with its buffers, and
  // rank 0 times the calls each way (engine/single_copy_choice.hpp).
  engine::SingleCopyChoice& choice = shared(ctx).singleCopyChoice();
  // Where cross-memory attach is slow here, staging is the way tried first.
  const bool asks = me == 0 && shared(ctx).peerReadsTimed() && singleCopyPays(op.kind, bytes, bytes);
  const bool fast = shared(ctx).peerReadsEnabled();
  const uint32_t verdict = asks ? choice.verdict(op.kind, bytes, fast && pullingPays(op.kind, bytes, false),
                                                 fast && pullingPays(op.kind, bytes, true))
                                : 0;
  std::vector<engine::PeerBuffers> peers;
  if (trySingleCopy(ctx, op.kind, bytes, bytes, op.send, bytes, op.recv, bytes, peers, verdict)) {
    if (peers[static_cast<size_t>(me)].mapped) return allReduceShared(ctx, op, peers);
    // Every rank is here: rank 0's clock starts (a timed call ends with every rank done).
    const auto start = std::chrono::steady_clock::now();
    const bool anyInPlace =
        std::any_of(peers.begin(), peers.end(), [](const engine::PeerBuffers& p) { return p.inPlace; });
    const engine::SingleCopyChoice::Way way = choice.follow(peers[0].choice, anyInPlace);
    if (way.single) {
      allReducePulled(ctx, op, peers);  // ends with every rank done
    } else {
      allReduceStaged(ctx, op);
      if (way.timed) shared(ctx).syncAll();
    }
    if (asks && way.timed) choice.record(op.kind, bytes, anyInPlace, way.single, nsSince(start));
    return;
  }
  allReduceStaged(ctx, op);
}

// AllReduce, one-shot: every rank stages its input and, after one synchronisation, reduces the
// whole chunk from all staging areas into its own output. Each rank reads n times what it would
// read in `direct`, but a chunk costs one synchronisation instead of two: the choice for small
// messages, where the flag round trip is most of the time.
void allReduceOneShot(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  transport::ShmGroup& shm = shared(ctx).group();
  const int n = ctx.size(), me = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const size_t chunk = stageChunkElems(shm, elem, 1);
  std::vector<const void*> srcs(static_cast<size_t>(n));
  forEachStagedChunk(
      ctx, op.count, chunk, elem,
      [&](size_t off, size_t ce, size_t place) {
        kernels::copy(shm.stageAt(me, place), at(op.send, off, elem), ce * elem);
      },
      [&](size_t off, size_t ce, size_t place) {
        for (int k = 0; k < n; ++k) srcs[static_cast<size_t>(k)] = shm.stageAt(k, place);
        kernels::reduce(at(op.recv, off, elem), srcs.data(), n, ce, op.type, op.op, avgDivisor(op, n));
      },
      Packing::ShortCalls);  // short calls are packed through the whole staging area (stagingPacks)
}

// AllReduce, low latency: chunks of up to llCapacity() bytes go through the low-latency lines
// (data and flag in one cache line); every rank reduces all n copies in rank order, so all ranks
// get bit-identical results.
void allReduceLowLatency(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size();
  const size_t elem = dataTypeSize(op.type);
  const size_t chunk = engine::ShmSync::llCapacity() / elem;
  std::byte* gathered = ctx.scratch(static_cast<size_t>(n) * chunk * elem);
  // The sources' addresses on the stack up to 64 ranks: no allocation on the latency path.
  constexpr int kOnStack = 64;
  std::array<const void*, kOnStack> few;
  std::vector<const void*> many(n > kOnStack ? static_cast<size_t>(n) : 0);
  const void** srcs = n > kOnStack ? many.data() : few.data();
  for (size_t off = 0; off < op.count; off += chunk) {
    const size_t ce = std::min(chunk, op.count - off), bytes = ce * elem;
    shared(ctx).llGather(at(op.send, off, elem), bytes, gathered);
    for (int k = 0; k < n; ++k) srcs[k] = gathered + static_cast<size_t>(k) * bytes;
    kernels::reduce(at(op.recv, off, elem), srcs, n, ce, op.type, op.op, avgDivisor(op, n));
  }
}

}  // namespace chorus::algo
