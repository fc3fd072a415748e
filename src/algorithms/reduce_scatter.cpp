// ReduceScatter: direct (shared staging) and ring.
#include <algorithm>

#include "algorithms/common.hpp"
#include "algorithms/cost_model.hpp"

namespace chorus::algo {

// Direct: each rank stages the n-1 blocks of a chunk its peers reduce; rank r reduces block r of
// every peer's stage and of its own input straight into its output. One synchronisation per chunk.
void reduceScatterDirect(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size(), me = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  std::vector<const void*> srcs(static_cast<size_t>(n));
  std::vector<engine::PeerBuffers> peers;
  const size_t sendBytes = static_cast<size_t>(n) * op.count * elem;
  // The output overwrites this rank's own input block in place: those lines were just read.
  const kernels::CopyMode store =
      outputCopyMode(op.count * elem, op.recv == at(op.send, static_cast<size_t>(me) * op.count, elem));
  auto staged = [&] {
    transport::ShmGroup& shm = shared(ctx).group();
    const size_t chunk = stageChunkElems(shm, elem, static_cast<size_t>(n));
    forEachStagedChunk(
        ctx, op.count, chunk, static_cast<size_t>(n) * elem,
        [&](size_t off, size_t ce, size_t place) {
          stageBlocks(ctx, place, op.send, op.count, off, ce, elem, me);
        },
        [&](size_t off, size_t ce, size_t place) {
          for (int k = 0; k < n; ++k)
            srcs[static_cast<size_t>(k)] = shm.stageAt(k, place) + static_cast<size_t>(me) * ce * elem;
          // This rank's own block is read from its input: staging it would only copy it once more.
          srcs[static_cast<size_t>(me)] = at(op.send, static_cast<size_t>(me) * op.count + off, elem);
          kernels::reduce(at(op.recv, off, elem), srcs.data(), n, ce, op.type, op.op, avgDivisor(op, n),
                          store);
        },
        // Packed through the whole staging area: every call, the short ones where ranks share cores
        // (stagingPacks).
        Packing::Always);
  };
  // Single copy or staging (ordinary buffers): rank 0's verdict travels with its buffers, and
  // rank 0 times the calls each way (engine/single_copy_choice.hpp); the ranges say single copy
  // where cross-memory attach is fast enough here, else staging is tried first.
  engine::SingleCopyChoice& choice = shared(ctx).singleCopyChoice();
  const bool asks =
      me == 0 && shared(ctx).peerReadsTimed() && singleCopyPays(op.kind, sendBytes, op.count * elem);
  const bool fast = shared(ctx).peerReadsEnabled();
  const uint32_t verdict = asks ? choice.verdict(op.kind, sendBytes, fast, fast) : 0;
  if (!trySingleCopy(ctx, op.kind, sendBytes, op.count * elem, op.send, sendBytes, op.recv, 0, peers,
                     verdict))
    return staged();
  if (peers[static_cast<size_t>(me)].mapped) {
    // Zero copy: reduce block `me` of every peer's input straight into the output.
    for (int k = 0; k < n; ++k)
      srcs[static_cast<size_t>(k)] =
          peers[static_cast<size_t>(k)].send + static_cast<size_t>(me) * op.count * elem;
    kernels::reduce(op.recv, srcs.data(), n, op.count, op.type, op.op, avgDivisor(op, n), store);
    shared(ctx).syncAll();  // nobody reads this rank's input any more
    return;
  }
  // Every rank is here: rank 0's clock starts (a timed call ends with every rank done).
  const auto start = std::chrono::steady_clock::now();
  bool anyInPlace = false;  // a rank whose output is its own block of the input (addresses in its process)
  for (int k = 0; k < n; ++k) {
    const engine::PeerBuffers& p = peers[static_cast<size_t>(k)];
    anyInPlace = anyInPlace || p.recv == p.send + static_cast<size_t>(k) * op.count * elem;
  }
  const engine::SingleCopyChoice::Way way = choice.follow(peers[0].choice, anyInPlace);
  if (way.single) {
    // Single copy: pull block `me` of every peer's input into cache, reduce into the output.
    reducePulled(ctx, op, peers, static_cast<size_t>(me) * op.count, op.count, op.recv, avgDivisor(op, n),
                 store, false);
    shared(ctx).syncAll();  // nobody reads this rank's input any more
  } else {
    staged();  // nobody reads this rank's input: the staging areas hold what the peers read
    if (way.timed) shared(ctx).syncAll();
  }
  if (asks && way.timed) choice.record(op.kind, sendBytes, anyInPlace, way.single, nsSince(start));
}

// Ring: block r-s-1 travels one hop per step, each rank adding its own contribution; partial
// sums live in scratch; the last step lands in the output.
void reduceScatterRing(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size(), r = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const size_t blockBytes = op.count * elem;
  std::byte* partial = ctx.scratch(blockBytes * static_cast<size_t>(n));
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  std::vector<engine::Transfer> ts;
  ts.reserve(static_cast<size_t>(2 * (n - 1)));
  int lastRecv = -1;
  for (int s = 0; s < n - 1; ++s) {
    int si = mod(r - s - 1, n), ri = mod(r - s - 2, n);
    const void* src = s == 0 ? at(op.send, static_cast<size_t>(si) * op.count, elem)
                             : static_cast<const void*>(partial + static_cast<size_t>(si) * blockBytes);
    auto snd = engine::Transfer::send(next, src, blockBytes, elem, ctx.tag());
    snd.waitFor = lastRecv;
    ts.push_back(snd);
    bool last = s == n - 2;
    void* dst = last ? op.recv : static_cast<void*>(partial + static_cast<size_t>(ri) * blockBytes);
    ts.push_back(
        engine::Transfer::recvReduce(prev, dst, at(op.send, static_cast<size_t>(ri) * op.count, elem),
                                     blockBytes, op.type, op.op, last ? avgDivisor(op, n) : 0, ctx.tag()));
    lastRecv = static_cast<int>(ts.size()) - 1;
  }
  ctx.run(ts);
}

// n - 1 steps, each moving and reducing one block.
double reduceScatterRingUs(const CostModel& m, const Op& op, int n) {
  const auto t = m.terms(op, n);
  return (t.fn - 1) * (t.al + t.B * t.wire + t.B * t.red);
}

}  // namespace chorus::algo
