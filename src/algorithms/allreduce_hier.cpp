// AllReduce, hierarchical: on H hosts of G ranks each, a ring reduce-scatter among the ranks of each
// host leaves local rank j with one slice reduced over its host; the H ranks of local index j (one
// per host, so a host's G ranks use G disjoint rings across hosts, one per rail) allreduce that
// slice with a ring; a ring all-gather within each host completes the result. Across hosts each
// rank moves 2 (H-1)/H of a G-th of the message in 2 (H-1) steps, instead of the flat ring's
// 2 (n-1) steps. Without several hosts of equal rank count it is the flat ring.
#include <algorithm>

#include "algorithms/cost_model.hpp"
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

// Ring reduce-scatter within each host, ring allreduce of each slice among the ranks of equal local
// index (all of a host's ranks share its NIC), ring all-gather within the host. Not on one host.
double allReduceHierarchicalUs(const CostModel& m, const Op& op, int) {
  const int G = m.ranksPerHost, H = m.hosts;
  if (H <= 1 || G <= 0) return -1;
  const double B = static_cast<double>(op.messageBytes()), red = 1.0 / (m.reduceGBps * 1e3);
  const double g = G, h = H, slice = B / g;
  const double wi = 1.0 / (m.intra.GBps * 1e3);
  const double perRankInter = m.nicGBps > 0 ? std::min(m.inter.GBps, m.nicGBps / g) : m.inter.GBps;
  const double wx = 1.0 / (perRankInter * 1e3);
  const double local = (g - 1) * (2 * m.intra.alphaUs + 2 * slice * wi + slice * red);
  const double across =
      2 * (h - 1) * m.inter.alphaUs + 2 * (h - 1) / h * slice * wx + (h - 1) / h * slice * red;
  return local + across;
}

}  // namespace chorus::algo
