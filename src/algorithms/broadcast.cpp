// Broadcast: direct (root stages, all copy out) and pipeline (a chain from the root).
#include <algorithm>
#include <cstring>

#include "algorithms/common.hpp"
#include "algorithms/cost_model.hpp"

namespace chorus::algo {

void broadcastDirect(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int me = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const size_t bytes = op.count * elem;
  const kernels::CopyMode store = outputCopyMode(bytes);
  std::vector<engine::PeerBuffers> peers;
  if (trySingleCopy(ctx, op.kind, bytes, bytes, op.send, me == op.root ? bytes : 0, op.recv, 0, peers)) {
    // Zero or single copy: every rank copies the root's input straight into its output.
    const engine::PeerBuffers& root = peers[static_cast<size_t>(op.root)];
    if (root.send != op.recv || root.pid != 0)
      shared(ctx).readPeer(op.root, root, op.recv, root.send, bytes, store);
    shared(ctx).syncAll();  // nobody reads the root's input any more
    return;
  }
  transport::ShmGroup& shm = shared(ctx).group();
  const size_t chunk = stageChunkElems(shm, elem, 1);
  // Out of place, the root's own output in the same pass as its staging from kOwnInSamePassFrom
  // bytes a chunk (one read of the input for both writes), else by a second copy while the others
  // arrive.
  const bool rootCopies = me == op.root && op.send != op.recv;
  const auto samePass = [&](size_t ce) { return rootCopies && ce * elem >= kOwnInSamePassFrom; };
  forEachStagedChunk(
      ctx, op.count, chunk, elem,
      [&](size_t off, size_t ce, size_t place) {
        if (me == op.root)
          stageCopy(ctx, shm.stageAt(me, place), at(op.send, off, elem), ce * elem,
                    samePass(ce) ? at(op.recv, off, elem) : nullptr, store);
      },
      [&](size_t off, size_t ce, size_t place) {
        if (me != op.root)
          copyStaged(ctx, op.root, at(op.recv, off, elem), shm.stageAt(op.root, place), ce * elem, store);
      },
      // Packed through the whole staging area: every call, the short ones where ranks share cores
      // (stagingPacks). Then the local step: else the root's own copy, while the others arrive.
      Packing::Always,
      [&](size_t off, size_t ce) {
        if (rootCopies && !samePass(ce))
          kernels::copy(at(op.recv, off, elem), at(op.send, off, elem), ce * elem, store);
      });
}

// Broadcast, low latency: chunks of up to llRootedCapacity() bytes through the root's ring of
// low-latency slots. The root waits for nobody in its own call (ShmSync::llBroadcast): only, once
// it has gone round its ring, for every rank to have read the slot it writes, so a loop of
// broadcasts costs the root no round trip.
void broadcastLowLatency(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const bool root = ctx.rank() == op.root;
  const size_t elem = dataTypeSize(op.type);
  const size_t chunk = engine::ShmSync::llRootedCapacity() / elem;
  for (size_t off = 0; off < op.count; off += chunk) {
    const size_t ce = std::min(chunk, op.count - off);
    shared(ctx).llBroadcast(op.root, root ? at(op.send, off, elem) : nullptr, ce * elem,
                            at(op.recv, off, elem));
  }
}

void broadcastPipeline(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size(), r = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const size_t bytes = op.count * elem;
  const int pos = mod(r - op.root, n);
  std::vector<engine::Transfer> ts;
  if (pos == 0) {
    if (op.send != op.recv) ctx.localCopy(op.recv, op.send, bytes);
    ts.push_back(engine::Transfer::send(mod(r + 1, n), op.send, bytes, elem, ctx.tag()));
  } else {
    ts.push_back(engine::Transfer::recv(mod(r - 1, n), op.recv, bytes, elem, ctx.tag()));
    if (pos < n - 1) {
      auto fwd = engine::Transfer::send(mod(r + 1, n), op.recv, bytes, elem, ctx.tag());
      fwd.waitFor = 0;  // forward bytes as they arrive
      ts.push_back(fwd);
    }
  }
  ctx.run(ts);
}

// The chain: fill (n - 1 hops), the message once over the wire, drain.
double broadcastPipelineUs(const CostModel& m, const Op& op, int n) {
  const auto t = m.terms(op, n);
  return (t.fn - 1) * t.al + t.B * t.wire + (t.fn - 2) * t.al;
}

}  // namespace chorus::algo
