// AllReduce, hierarchical: on H hosts of G ranks each, a ring reduce-scatter among the ranks of each
// host leaves local rank j with one slice reduced over its host; the H ranks of local index j (one
// per host, so a host's G ranks use G disjoint rings across hosts, one per rail) allreduce that
// slice with a ring; a ring all-gather within each host completes the result. Across hosts each
// rank moves 2 (H-1)/H of a G-th of the message in 2 (H-1) steps, instead of the flat ring's
// 2 (n-1) steps. Without several hosts of equal rank count it is the flat ring.
#include "algorithms/ring.hpp"

namespace chorus::algo {

void allReduceHierarchical(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const topo::CommTopology& topo = ctx.topology();
  const int n = ctx.size(), me = ctx.rank();
  const int hosts = static_cast<int>(topo.hosts.size());
  bool uniform = hosts > 1 && topo.size() == n;
  std::vector<int> perHost(static_cast<size_t>(hosts), 0);
  for (int r = 0; uniform && r < n; ++r)
    ++perHost[static_cast<size_t>(topo.ranks[static_cast<size_t>(r)].host)];
  const int local = uniform ? perHost[static_cast<size_t>(topo.ranks[static_cast<size_t>(me)].host)] : 0;
  for (int c : perHost) uniform = uniform && c == local;
  if (!uniform) return allReduceRing(ctx, op);

  const size_t elem = dataTypeSize(op.type);
  const topo::RankPlacement& mine = topo.ranks[static_cast<size_t>(me)];
  // The ranks of this host by local rank, and the ranks of this local index by host.
  std::vector<int> hostRanks(static_cast<size_t>(local)), rail(static_cast<size_t>(hosts));
  for (int r = 0; r < n; ++r) {
    const topo::RankPlacement& p = topo.ranks[static_cast<size_t>(r)];
    if (p.host == mine.host) hostRanks[static_cast<size_t>(p.localRank)] = r;
    if (p.localRank == mine.localRank) rail[static_cast<size_t>(p.host)] = r;
  }
  const Ring inHost{hostRanks, mine.localRank}, acrossHosts{rail, mine.host};
  std::vector<engine::Transfer> ts;
  int lastRecv = -1;
  if (local > 1) {
    appendRingReduceScatter(ts, inHost, op, op.send, op.recv, op.count, 0, ctx.tag(), lastRecv);
    ctx.run(ts);
  }
  // The slice this rank owns after the reduce-scatter (all of it when alone on its host).
  const Slices slices = ringSlices(inHost, op.count, elem);
  const auto owned = static_cast<size_t>(ringOwnedSlice(inHost, mine.localRank));
  const size_t off = local > 1 ? slices.offset(owned) : 0, len = local > 1 ? slices.length(owned) : op.count;
  ts.clear();
  lastRecv = -1;
  const void* in = local > 1 ? op.recv : op.send;
  appendRingReduceScatter(ts, acrossHosts, op, at(in, off, elem), at(op.recv, off, elem), len,
                          avgDivisor(op, n), ctx.tag(), lastRecv);
  appendRingAllGather(ts, acrossHosts, at(op.recv, off, elem), len, elem, ctx.tag(), lastRecv);
  ctx.run(ts);
  if (local > 1) {
    ts.clear();
    lastRecv = -1;
    appendRingAllGather(ts, inHost, op.recv, op.count, elem, ctx.tag(), lastRecv);
    ctx.run(ts);
  }
}

}  // namespace chorus::algo
