// Where reading a peer's ordinary buffer in place beats staging it. Staging costs two copies per
// byte (into the sender's staging area, out into the receiver's buffer), but both run at memcpy
// speed in cache, on both cores at once, chunk after chunk. Cross-memory attach (process_vm_readv)
// costs one copy, but a system call, page pinning, a kernel copy at 35-80% of memcpy's speed (one
// thread here: 63% for 1 MiB, 76% for 16 MiB, 35% for 256 MiB), plain stores where staging
// streams large outputs, and one synchronisation of every rank before any data moves.
//
// How fast the kernel copy is differs by machine: on an AMD EPYC VM process_vm_readv moved 4 MiB at
// 23-25% of memcpy's rate, and staging beat single copy 1.2-3x at every size of allreduce,
// all_gather and reduce_scatter from 32 KiB. So these ranges apply between processes only where
// the host's first rank measured the read at 50% of memcpy's rate or more at set-up (ShmGroup;
// peerReadsEnabled() is false otherwise; CHORUS_CMA=1 or a size skips the test). Below it, the
// allreduce, all_gather and reduce_scatter still read in place where rank 0's timing says so,
// staging first (peerReadsTimed(), engine/single_copy_choice.hpp): on that EPYC the read is slow
// but where the host puts the two vCPUs on two core complexes, staging crosses between them twice
// and single copy once, 1.6-3.5x faster (docs/performance.md, "Timed where cross-memory attach is
// slow").
//
// Measured with chorus-perf on the 2-core Xeon VM (the read at 63-76% of memcpy's rate), 2 ranks,
// float32, CHORUS_CMA=0 against forced single copy (docs/performance.md, "Single copy", has the
// table):
//   all_gather: wins from 16 KiB blocks (1.3x at 32 KiB total, 1.8x at 256 KiB, 1.35x at 2 MiB,
//               1.3x at 16 MiB), even at 32 MiB, loses from 48 MiB (no streaming stores).
//   broadcast:  out of place wins from 64 KiB (1.9x) to 16 MiB (1.5x); but with the root in place
//               (torch's broadcast) staging is a pipelined single copy already, and from 1 MiB it
//               wins (1 MiB: 63 against 94 us): the buffer exchange is a barrier, which stops a
//               root running a chunk ahead into the next call. Only the root knows it is in place,
//               and learning it costs that barrier, so broadcast reads in place below 1 MiB only.
//   all_to_all: even at 32 KiB blocks, wins from 128 KiB blocks (2.1x at 256 KiB, 1.4x at 16
//               MiB, 1.2x at 64 MiB); not when a rank works in place (the algorithm checks).
//   allreduce:  staging costs each byte a copy into the staging area and one out of it, and the
//               reduced slices a copy-out from the peers' staging areas; pulling (reducePulled)
//               reads the peers' slices of the input into cache by CMA, reduces them with this
//               rank's own into its output, and (measured so) reads the peers' reduced slices
//               from their outputs: two kernel copies of (n-1)/n instead of three user copies,
//               and three synchronisations per call instead of two per chunk. Since 2026-12-05
//               the reduced pieces are pushed instead (allreduce_direct.cpp), two
//               synchronisations. Out of place (CHORUS_CMA=0
//               against 1K, median of 5 interleaved launches, staged / pulled): 0.82 at 128 KiB,
//               1.30 at 256 KiB, 1.31 at 1 MiB, 1.18 at 2 MiB, 1.21 at 4 MiB, 1.18 at 16 MiB,
//               0.81 at 32 MiB (staging streams its output there; CMA cannot), 0.74 at 64 MiB.
//               In place the output lines are in cache already, but peers read lines just
//               written: 0.79 at 256 KiB and 1 MiB, 1.03 at 2 MiB, 1.21 at 4 MiB, 1.24 at 16 MiB,
//               1.16 at 32 MiB, 0.83 at 64 MiB.
//   reduce_scatter: pulling saves the staging copy of every block and all synchronisations but
//               one. By total size (blocks of half of it), out of place / in place: 0.87 / 0.93
//               at 16 KiB, 1.26 / 1.23 at 32 KiB, 1.73 / 1.89 at 256 KiB, 1.40 / 1.93 at 2 MiB,
//               1.22 / 1.44 at 16 MiB, 1.04 / 1.26 at 256 MiB: from 16 KiB blocks, no upper limit.
//   Outputs staging streams: from the non-temporal threshold (topo::ntStoreBytes(): the L3's size,
//               64 MiB at most) staging writes the out-of-place allreduce's output with streaming
//               stores, which the kernel's copy cannot, and single copy stops there (the range
//               above ends below the Xeon's 64 MiB). On the AVX2 EPYC VM (L3 8 MiB: streaming from
//               8 MiB) staging was as fast or faster there in every A/B (CHORUS_CMA=0 against the
//               default, median of 9 interleaved launches, us out of place: 8 MiB 2087 / 3030 and
//               3477 / 3557, 16 MiB 4238 / 6153, 7133 / 7365 and 6814 / 7279). all_gather keeps
//               its range: there staging won by 12-45% from 8 MiB in one A/B and lost by 5-20% in
//               another, by where the host placed the vCPUs.
//   Timed (allreduce): on a VM whose host moves its two vCPUs, which of the two wins at 256 KiB to
//               16 MiB follows where they run (staging up to 1.8x faster with them close, single
//               copy 1.2-1.8x faster with them far apart), so the allreduce's ranges above are
//               only the way rank 0 tries first: it times both (engine/single_copy_choice.hpp).
//               The all-gather and reduce-scatter likewise. Since 2026-12-06 at every size from
//               the lower bounds above: on the AVX-512 EPYC VM with the vCPUs on two core
//               complexes, single copy ran the 64-256 MiB allreduce 1.8-2.6x and all-gather
//               1.6-2.5x faster than staging, which wins 1.3-1.8x with them close
//               (docs/performance.md, "Timed where cross-memory attach is slow").
//   4 ranks on 2 cores: single copy loses everywhere (1.1-2x): ranks waiting for each other at the
//               buffer exchange share cores. The communicator offers no in-place reads then.
#include "algorithms/common.hpp"

namespace chorus::algo {

bool singleCopyPays(OpKind kind, size_t messageBytes, size_t outputBytes) {
  const EnvConfig& env = envConfig();
  if (!env.cma) return false;
  const bool hasPath = kind == OpKind::AllGather || kind == OpKind::Broadcast || kind == OpKind::AllToAll ||
                       kind == OpKind::AllReduce || kind == OpKind::ReduceScatter;
  if (env.cmaMinBytes) return hasPath && messageBytes >= env.cmaMinBytes;
  constexpr size_t K = 1024, M = K * K;
  switch (kind) {
    case OpKind::AllGather:  // timed by rank 0 at every size; the ranges' first way: allGatherPullsFirst
      return messageBytes >= 16 * K;
    case OpKind::Broadcast:
      return messageBytes >= 64 * K && outputBytes < 1 * M;
    case OpKind::AllToAll:
      return messageBytes >= 128 * K;
    case OpKind::AllReduce:  // timed by rank 0 at every size; the ranges' first way: pullingPays
      return messageBytes >= 256 * K;
    case OpKind::ReduceScatter:  // the whole send buffer, as zero copy's threshold (16 KiB blocks at 2 ranks)
      return messageBytes >= 32 * K;
    default:
      return false;
  }
}

bool allGatherPullsFirst(size_t outputBytes) { return outputBytes <= size_t{32} << 20; }

bool pullingPays(OpKind kind, size_t messageBytes, bool anyInPlace) {
  if (envConfig().cmaMinBytes) return true;  // CHORUS_CMA=<size> forces single copy
  constexpr size_t M = size_t{1} << 20;
  if (kind == OpKind::ReduceScatter) return true;  // in place or not, wherever singleCopyPays says
  if (kind != OpKind::AllReduce) return false;
  // Out of place, staging streams outputs from the non-temporal threshold on; the kernel's copy
  // cannot (in place, outputs are never streamed).
  return anyInPlace ? messageBytes >= 4 * M && messageBytes <= 32 * M
                    : messageBytes >= M / 4 && messageBytes <= 16 * M && messageBytes < topo::ntStoreBytes();
}

void reducePulled(Context& ctx, const Op& op, const std::vector<engine::PeerBuffers>& peers, size_t offset,
                  size_t count, void* dst, int divisor, kernels::CopyMode store, bool pushToPeers) {
  const int n = ctx.size(), me = ctx.rank();
  const size_t elem = dataTypeSize(op.type), line = cacheLineElems(elem);
  // 256 KiB in all, shared by the peers. At 2 ranks and 2 MiB pieces of 128-256 KiB were best on
  // the Xeon (2 MiB L2; 1 MiB or 32 KiB about 15% slower); on the AVX2 EPYC VM (512 KiB L2) 256 KiB
  // against 64 KiB, median of 9 interleaved launches, out of place: 2 MiB 520 / 561 us, 4 MiB
  // 1495 / 1575, 16 MiB 6225 / 6536 (and 564 / 594, 1444 / 1529, 6951 / 7365 in a run pulling
  // the reduced slices), 1 MiB even.
  constexpr size_t kPieceBytes = size_t{256} << 10;
  const size_t per = kPieceBytes / elem / static_cast<size_t>(std::max(1, n - 1));
  const size_t piece = std::max(line, per / line * line);
  std::byte* scratch = ctx.scratch(piece * elem * static_cast<size_t>(n));
  std::vector<const void*> srcs(static_cast<size_t>(n));
  for (size_t o = offset; o < offset + count; o += piece) {
    const size_t l = std::min(piece, offset + count - o);
    for (int k = 0; k < n; ++k) {
      const engine::PeerBuffers& p = peers[static_cast<size_t>(k)];
      if (k == me || p.pid == 0) {  // this rank's own input, or a rank of this process: in place
        srcs[static_cast<size_t>(k)] = k == me ? at(op.send, o, elem) : p.send + o * elem;
        continue;
      }
      std::byte* into = scratch + static_cast<size_t>(k) * piece * elem;
      shared(ctx).readPeer(k, p, into, p.send + o * elem, l * elem, kernels::CopyMode::Cached);
      srcs[static_cast<size_t>(k)] = into;
    }
    std::byte* out = at(dst, o - offset, elem);
    kernels::reduce(out, srcs.data(), n, l, op.type, op.op, divisor, store);
    if (!pushToPeers) continue;
    for (int k = 0; k < n; ++k) {
      const engine::PeerBuffers& p = peers[static_cast<size_t>(k)];
      if (k != me) shared(ctx).writePeer(k, p, p.recv + o * elem, out, l * elem);
    }
  }
}

}  // namespace chorus::algo
