// AllGather: direct (shared staging) and ring.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "algorithms/common.hpp"
#include "algorithms/cost_model.hpp"

namespace chorus::algo {

namespace {

// Every rank stages its input, chunk by chunk, and copies the peers' chunks out of their staging
// areas into its output: with plain or streaming stores, whichever this rank has timed faster for
// outputs of this size (engine/output_stores.hpp), where all ranks' buffers reach the threshold
// but this rank's do not (streamsFirst); elsewhere `fixed` (the threshold's way per rank). Out of
// place, from kOwnInSamePassFrom bytes a chunk, its own block goes to its output in the same pass
// as into staging (stageCopy's `own`: one read of the input for both writes); below it by a
// second copy while the others arrive.
void allGatherStaged(Context& ctx, const Op& op, bool inPlace, kernels::CopyMode fixed) {
  const int n = ctx.size(), me = ctx.rank();
  const size_t elem = dataTypeSize(op.type), block = op.count * elem;
  transport::ShmGroup& shm = shared(ctx).group();
  const size_t chunk = stageChunkElems(shm, elem, 1);
  engine::OutputStores& stores = shared(ctx).outputStores();
  const size_t output = static_cast<size_t>(n) * block;
  const bool timed = fixed == kernels::CopyMode::Cached && stores.timed(op.kind, output) &&
                     streamsFirst(output + (inPlace ? 0 : block), n);
  const kernels::CopyMode store = timed ? stores.next(op.kind, output, kernels::CopyMode::Streaming) : fixed;
  // Timed: the call from its first synchronisation (every rank has arrived) to this rank's last
  // copy out, as the allreduce's (allreduce_direct.cpp).
  std::chrono::steady_clock::time_point since{};
  bool started = false;
  const auto samePass = [&](size_t ce) { return !inPlace && ce * elem >= kOwnInSamePassFrom; };
  forEachStagedChunk(
      ctx, op.count, chunk, elem,
      [&](size_t off, size_t ce, size_t place) {
        stageCopy(ctx, shm.stageAt(me, place), at(op.send, off, elem), ce * elem,
                  samePass(ce) ? at(op.recv, static_cast<size_t>(me) * op.count + off, elem) : nullptr,
                  store);
      },
      [&](size_t off, size_t ce, size_t place) {
        if (timed && !started) {
          since = std::chrono::steady_clock::now();
          started = true;
        }
        for (int k = 0; k < n; ++k) {
          if (k == me) continue;
          copyStaged(ctx, k, at(op.recv, static_cast<size_t>(k) * op.count + off, elem),
                     shm.stageAt(k, place), ce * elem, store);
        }
      },
      // Short calls are packed through the whole staging area (stagingPacks), blocks of up to
      // half a slot: the 2-rank all-gather of 1 MiB ran 4-7% slower packed, of 256 KiB 1.2-1.4x faster.
      2 * block <= shm.stageSlotBytes() ? Packing::ShortCalls : Packing::None,
      // Else this rank's own block, while the others arrive.
      [&](size_t off, size_t ce) {
        if (!inPlace && !samePass(ce)) {
          kernels::copy(at(op.recv, static_cast<size_t>(me) * op.count + off, elem), at(op.send, off, elem),
                        ce * elem, store);
        }
      });
  if (timed) stores.record(op.kind, output, store, nsSince(since));
}

}  // namespace

void allGatherDirect(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size(), me = ctx.rank();
  const size_t elem = dataTypeSize(op.type), block = op.count * elem;
  const bool inPlace = at(op.recv, static_cast<size_t>(me) * op.count, elem) == op.send;
  // Against the threshold: the mean of output and input per rank, as for the collectives whose
  // output is their input's size (its working set is (n + 1) / 2n of theirs per output byte).
  const kernels::CopyMode store = outputCopyMode((static_cast<size_t>(n) + 1) * block / 2);
  // Single copy or staging (ordinary buffers): rank 0's verdict travels with its buffers, and
  // rank 0 times the calls each way (engine/single_copy_choice.hpp); the ranges say single copy
  // where cross-memory attach is fast enough here.
  engine::SingleCopyChoice& choice = shared(ctx).singleCopyChoice();
  const size_t output = static_cast<size_t>(n) * block;
  // Where cross-memory attach is slow here, staging is the way tried first.
  const bool asks = me == 0 && shared(ctx).peerReadsTimed() && singleCopyPays(op.kind, block, output);
  const bool fast = shared(ctx).peerReadsEnabled();
  const bool first = fast && allGatherPullsFirst(output);
  const uint32_t verdict = asks ? choice.verdict(op.kind, block, first, first) : 0;
  std::vector<engine::PeerBuffers> peers;
  if (!trySingleCopy(ctx, op.kind, block, output, op.send, block, op.recv, 0, peers, verdict)) {
    return allGatherStaged(ctx, op, inPlace, store);
  }
  // Every rank is here: rank 0's clock starts (a timed call ends with every rank done).
  const auto start = std::chrono::steady_clock::now();
  const bool mapped = peers[static_cast<size_t>(me)].mapped;
  bool anyInPlace = false;  // a rank whose block of the output is its input (addresses in its process)
  for (int k = 0; k < n && !mapped; ++k) {
    const engine::PeerBuffers& p = peers[static_cast<size_t>(k)];
    anyInPlace = anyInPlace || p.send == p.recv + static_cast<size_t>(k) * block;
  }
  const engine::SingleCopyChoice::Way way =
      mapped ? engine::SingleCopyChoice::Way{true, false} : choice.follow(peers[0].choice, anyInPlace);
  if (way.single) {
    // Zero or single copy: every rank copies the peers' inputs straight into its output.
    for (int k = 0; k < n; ++k) {
      if (k == me && inPlace) continue;
      shared(ctx).readPeer(k, peers[static_cast<size_t>(k)],
                           at(op.recv, static_cast<size_t>(k) * op.count, elem),
                           peers[static_cast<size_t>(k)].send, block, store);
    }
    shared(ctx).syncAll();  // nobody reads this rank's input any more
  } else {
    allGatherStaged(ctx, op, inPlace, store);  // nobody reads this rank's buffers
    if (way.timed) shared(ctx).syncAll();
  }
  if (asks && way.timed) choice.record(op.kind, block, anyInPlace, way.single, nsSince(start));
}

void allGatherRing(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size(), r = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const size_t blockBytes = op.count * elem;
  auto block = [&](int i) { return at(op.recv, static_cast<size_t>(i) * op.count, elem); };
  if (block(r) != op.send) ctx.localCopy(block(r), op.send, blockBytes);
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  std::vector<engine::Transfer> ts;
  ts.reserve(static_cast<size_t>(2 * (n - 1)));
  int lastRecv = -1;
  for (int s = 0; s < n - 1; ++s) {
    int si = mod(r - s, n), ri = mod(r - s - 1, n);
    auto snd = engine::Transfer::send(next, s == 0 ? op.send : static_cast<const void*>(block(si)),
                                      blockBytes, elem, ctx.tag());
    snd.waitFor = lastRecv;
    ts.push_back(snd);
    ts.push_back(engine::Transfer::recv(prev, block(ri), blockBytes, elem, ctx.tag()));
    lastRecv = static_cast<int>(ts.size()) - 1;
  }
  ctx.run(ts);
}

// n - 1 steps, each moving one block.
double allGatherRingUs(const CostModel& m, const Op& op, int n) {
  const auto t = m.terms(op, n);
  return (t.fn - 1) * (t.al + t.B * t.wire);
}

}  // namespace chorus::algo
