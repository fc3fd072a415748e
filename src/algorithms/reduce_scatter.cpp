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
  if (trySingleCopy(ctx, op.kind, sendBytes, op.count * elem, op.send, sendBytes, op.recv, 0, peers)) {
    if (!peers[static_cast<size_t>(me)].mapped) {
      // Single copy: pull block `me` of every peer's input into cache, reduce into the output.
      reducePulled(ctx, op, peers, static_cast<size_t>(me) * op.count, op.count, op.recv, avgDivisor(op, n),
                   store, false);
      shared(ctx).syncAll();  // nobody reads this rank's input any more
      return;
    }
    // Zero copy: reduce block `me` of every peer's input straight into the output.
    for (int k = 0; k < n; ++k)
      srcs[static_cast<size_t>(k)] =
          peers[static_cast<size_t>(k)].send + static_cast<size_t>(me) * op.count * elem;
    kernels::reduce(op.recv, srcs.data(), n, op.count, op.type, op.op, avgDivisor(op, n), store);
    shared(ctx).syncAll();  // nobody reads this rank's input any more
    return;
  }
  transport::ShmGroup& shm = shared(ctx).group();
  const size_t chunk = stageChunkElems(shm, elem, static_cast<size_t>(n));
  forEachStagedChunk(
      ctx, op.count, chunk,
      [&](size_t off, size_t ce, int h) { stageBlocks(shm, h, op.send, op.count, off, ce, elem, me); },
      [&](size_t off, size_t ce, int h) {
        for (int k = 0; k < n; ++k)
          srcs[static_cast<size_t>(k)] = shm.stage(k, h) + static_cast<size_t>(me) * ce * elem;
        // This rank's own block is read from its input: staging it would only copy it once more.
        srcs[static_cast<size_t>(me)] = at(op.send, static_cast<size_t>(me) * op.count + off, elem);
        kernels::reduce(at(op.recv, off, elem), srcs.data(), n, ce, op.type, op.op, avgDivisor(op, n), store);
      });
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
