// AllToAll: direct (shared staging) and pairwise; AllToAllv pairwise.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "algorithms/common.hpp"
#include "algorithms/cost_model.hpp"

namespace chorus::algo {

// In place is safe: a chunk is fully staged by every rank before anyone writes that chunk's output.
// Single copy only where no rank works in place (a peer would read blocks this rank overwrites).
void allToAllDirect(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  transport::ShmGroup& shm = shared(ctx).group();
  const int n = ctx.size(), me = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const size_t all = static_cast<size_t>(n) * op.count * elem;
  std::vector<engine::PeerBuffers> peers;
  if (trySingleCopy(ctx, op.kind, op.count * elem, all, op.send, all, op.recv, all, peers) &&
      std::none_of(peers.begin(), peers.end(), [](const engine::PeerBuffers& p) { return p.inPlace; })) {
    const kernels::CopyMode out = outputCopyMode(all);
    for (int k = 0; k < n; ++k) {
      const engine::PeerBuffers& p = peers[static_cast<size_t>(k)];
      shared(ctx).readPeer(k, p, at(op.recv, static_cast<size_t>(k) * op.count, elem),
                           p.send + static_cast<size_t>(me) * op.count * elem, op.count * elem, out);
    }
    shared(ctx).syncAll();  // nobody reads this rank's input any more
    return;
  }
  const size_t chunk = stageChunkElems(shm, elem, static_cast<size_t>(n));
  const bool inPlace = op.send == op.recv;
  const kernels::CopyMode fixed = outputCopyMode(all, inPlace);
  // Out of place, where all ranks' inputs and outputs reach the non-temporal threshold but this
  // rank's output does not, each rank times its output stores both ways, streaming first, from the
  // first synchronisation to its last copy (engine/output_stores.hpp, as the all-gather's); in place
  // the output overwrites input lines just read, which plain stores find in cache.
  engine::OutputStores& stores = shared(ctx).outputStores();
  const bool timed = !inPlace && fixed == kernels::CopyMode::Cached && stores.timed(op.kind, all) &&
                     streamsFirst(2 * all, n);
  const kernels::CopyMode store = timed ? stores.next(op.kind, all, kernels::CopyMode::Streaming) : fixed;
  std::chrono::steady_clock::time_point since{};
  bool started = false;
  forEachStagedChunk(
      ctx, op.count, chunk, static_cast<size_t>(n) * elem,
      [&](size_t off, size_t ce, size_t place) {
        stageBlocks(ctx, place, op.send, op.count, off, ce, elem, me);
      },
      [&](size_t off, size_t ce, size_t place) {
        if (timed && !started) {
          since = std::chrono::steady_clock::now();
          started = true;
        }
        for (int k = 0; k < n; ++k) {
          if (k == me) continue;
          copyStaged(ctx, k, at(op.recv, static_cast<size_t>(k) * op.count + off, elem),
                     shm.stageAt(k, place) + static_cast<size_t>(me) * ce * elem, ce * elem, store);
        }
      },
      // Packed through the whole staging area: every call, the short ones where ranks share cores
      // (stagingPacks).
      Packing::Always,
      // This rank's own block goes straight from its input to its output, while the others arrive.
      [&](size_t off, size_t ce) {
        if (!inPlace) {
          const size_t own = static_cast<size_t>(me) * op.count + off;
          kernels::copy(at(op.recv, own, elem), at(op.send, own, elem), ce * elem, store);
        }
      });
  if (timed) stores.record(op.kind, all, store, nsSince(since));
}

namespace {

// Every pairwise exchange as one transfer list: sends to r+k and receives from r-k for all k.
void pairwise(Context& ctx, const Op& op, const void* send, const size_t* sendCounts,
              const size_t* sendDispls, const size_t* recvCounts, const size_t* recvDispls) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const auto R = static_cast<size_t>(r);
  if (sendCounts[R] != recvCounts[R]) {
    failInvalid("rank ", r, ": ", opKindName(op.kind), ": sends ", sendCounts[R],
                " elements to itself but expects ", recvCounts[R]);
  }
  if (sendCounts[R] && at(send, sendDispls[R], elem) != at(op.recv, recvDispls[R], elem)) {
    ctx.localCopy(at(op.recv, recvDispls[R], elem), at(send, sendDispls[R], elem), sendCounts[R] * elem);
  }
  std::vector<engine::Transfer> ts;
  ts.reserve(static_cast<size_t>(2 * (n - 1)));
  for (int k = 1; k < n; ++k) {
    const auto to = static_cast<size_t>(mod(r + k, n)), from = static_cast<size_t>(mod(r - k, n));
    ts.push_back(engine::Transfer::send(static_cast<int>(to), at(send, sendDispls[to], elem),
                                        sendCounts[to] * elem, elem, ctx.tag()));
    ts.push_back(engine::Transfer::recv(static_cast<int>(from), at(op.recv, recvDispls[from], elem),
                                        recvCounts[from] * elem, elem, ctx.tag()));
  }
  ctx.run(ts);
}

}  // namespace

void allToAllPairwise(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size();
  const size_t elem = dataTypeSize(op.type);
  std::vector<size_t> counts(static_cast<size_t>(n), op.count), displs(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) displs[static_cast<size_t>(j)] = static_cast<size_t>(j) * op.count;
  const void* send = op.send;
  if (op.send == op.recv) {  // in place: the blocks we still have to send must not be overwritten
    std::byte* copy = ctx.scratch(op.count * elem * static_cast<size_t>(n));
    ctx.localCopy(copy, op.send, op.count * elem * static_cast<size_t>(n));
    send = copy;
  }
  pairwise(ctx, op, send, counts.data(), displs.data(), counts.data(), displs.data());
}

void allToAllvPairwise(Context& ctx, const Op& op) {
  pairwise(ctx, op, op.send, op.sendCounts().data(), op.sendDispls().data(), op.recvCounts().data(),
           op.recvDispls().data());
}

// Every pair exchanges its blocks, all progressed together.
double allToAllPairwiseUs(const CostModel& m, const Op& op, int n) {
  const auto t = m.terms(op, n);
  return (t.fn - 1) * (t.al + t.B * t.wire);
}

// The counts differ by rank: only the message count is known.
double allToAllvPairwiseUs(const CostModel& m, const Op& op, int n) { return (n - 1) * m.terms(op, n).al; }

}  // namespace chorus::algo
