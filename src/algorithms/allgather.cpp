// AllGather: direct (shared staging) and ring.
#include <algorithm>
#include <cstring>

#include "algorithms/common.hpp"
#include "algorithms/cost_model.hpp"

namespace chorus::algo {

void allGatherDirect(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size(), me = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const bool inPlace = at(op.recv, static_cast<size_t>(me) * op.count, elem) == op.send;
  // Against the threshold: the mean of output and input per rank, as for the collectives whose
  // output is their input's size (its working set is (n + 1) / 2n of theirs per output byte).
  const kernels::CopyMode store = outputCopyMode((static_cast<size_t>(n) + 1) * op.count * elem / 2);
  std::vector<engine::PeerBuffers> peers;
  if (trySingleCopy(ctx, op.kind, op.count * elem, static_cast<size_t>(n) * op.count * elem, op.send,
                    op.count * elem, op.recv, 0, peers)) {
    // Zero or single copy: every rank copies the peers' inputs straight into its output.
    for (int k = 0; k < n; ++k) {
      if (k == me && inPlace) continue;
      shared(ctx).readPeer(k, peers[static_cast<size_t>(k)],
                           at(op.recv, static_cast<size_t>(k) * op.count, elem),
                           peers[static_cast<size_t>(k)].send, op.count * elem, store);
    }
    shared(ctx).syncAll();  // nobody reads this rank's input any more
    return;
  }
  transport::ShmGroup& shm = shared(ctx).group();
  const size_t chunk = stageChunkElems(shm, elem, 1);
  forEachStagedChunk(
      ctx, op.count, chunk,
      [&](size_t off, size_t ce, int h) {
        kernels::copy(shm.stage(me, h), at(op.send, off, elem), ce * elem);
      },
      [&](size_t off, size_t ce, int h) {
        for (int k = 0; k < n; ++k) {
          if (k == me) continue;
          kernels::copy(at(op.recv, static_cast<size_t>(k) * op.count + off, elem), shm.stage(k, h),
                        ce * elem, store);
        }
        if (!inPlace) {
          kernels::copy(at(op.recv, static_cast<size_t>(me) * op.count + off, elem), at(op.send, off, elem),
                        ce * elem, store);
        }
      });
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
