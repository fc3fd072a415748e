#include "algorithms/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/util.hpp"

namespace chorus::algo {

int floorLog2(int n) {
  int l = 0;
  while ((2 << l) <= n) ++l;
  return l;
}

int ceilLog(int n, int k) {
  int d = 0;
  for (long span = 1; span < n; span *= k) ++d;
  return d;
}

CostModel CostModel::forLinkClass(const std::string& linkClass) {
  CostModel m;
  m.intra.name = linkClass;
  if (linkClass == "shm-xnuma") {
    m.intra.GBps = 1.0;
  } else if (linkClass == "network") {
    m.intra = m.inter;
    m.hosts = 0;  // unknown: every rank may be on its own host
  }
  return m;
}

CostModel CostModel::forTopology(const topo::CommTopology& topology, bool emulatedHosts) {
  topo::LinkClass worstIntra = topo::LinkClass::Self;
  for (int a = 0; a < topology.size(); ++a) {
    for (int b = 0; b < topology.size(); ++b) {
      const topo::LinkClass c = topology.link(a, b);
      if (c != topo::LinkClass::CrossHost) worstIntra = std::max(worstIntra, c);
    }
  }
  CostModel m =
      forLinkClass(worstIntra == topo::LinkClass::Self ? "shm-numa" : topo::linkClassName(worstIntra));
  m.hosts = static_cast<int>(topology.hosts.size());
  m.ranksPerHost = topology.size() / std::max(m.hosts, 1);
  for (int r = 0; r < topology.size(); ++r) {
    if (topology.localSize(r) != m.ranksPerHost) m.ranksPerHost = 0;
  }
  // More ranks than cores on a host: every round of the tree waits for the scheduler. Measured on
  // the 2-core development VM with 4 ranks, an extra round cost about 25 us (16 MiB in 128 KiB
  // chunks against 512 KiB chunks: 48 more rounds, 1.2 ms more).
  int cores = 0;
  for (const topo::HostTopology& h : topology.hosts) {
    if (h.cores > 0) cores = cores ? std::min(cores, h.cores) : h.cores;
  }
  int busiest = 0;
  for (int r = 0; r < topology.size(); ++r) busiest = std::max(busiest, topology.localSize(r));
  if (cores > 0 && busiest > cores) m.roundUs = 12.5 * busiest / cores;
  if (emulatedHosts) {
    m.inter = m.intra;
    m.inter.name = strCat("emulated (", m.intra.name, ")");
  } else {
    m.nicGBps = m.inter.GBps;
  }
  return m;
}

std::string CostModel::describe() const {
  return strCat("intra ", intra.name, " alpha ", intra.alphaUs, " us ", intra.GBps, " GB/s; inter ",
                inter.name, " alpha ", inter.alphaUs, " us ", inter.GBps, " GB/s",
                nicGBps > 0 ? strCat(", NIC ", nicGBps, " GB/s") : "", "; reduce ", reduceGBps, " GB/s; ",
                hosts, " host(s)",
                ranksPerHost ? strCat(" x ", ranksPerHost, " ranks") : std::string(" of unequal size"));
}

double CostModel::predictUs(const Algorithm& a, const Op& op, int n) const {
  if (!a.cost) return -1;
  if (n <= 1) return 0;
  return a.cost(*this, op, n);
}

CostModel::Terms CostModel::terms(const Op& op, int n) const {
  const LinkCost& link = flatLink();
  return Terms{static_cast<double>(op.messageBytes()), static_cast<double>(n), link.alphaUs,
               1.0 / (link.GBps * 1e3), 1.0 / (reduceGBps * 1e3)};
}

double CostModel::recursiveUs(const Op& op, int n, bool halving) const {
  const double B = static_cast<double>(op.messageBytes());
  const double red = 1.0 / (reduceGBps * 1e3);
  const int L = floorLog2(n);
  const bool pow2 = (1 << L) == n;
  const double p = static_cast<double>(1 << L);
  // Step by step: with hosts of G contiguous ranks, the exchange at distance d (in the
  // power-of-two group) stays within every host only when G is a multiple of 2d; otherwise
  // some pairs cross hosts and the step waits for them, with all of a host's ranks sharing
  // its NIC at once.
  const auto stepUs = [&](int d, double bytes, bool reduce) {
    const bool across = hosts > 1 && (ranksPerHost == 0 || ranksPerHost % (2 * d) != 0);
    const LinkCost& l = across ? inter : intra;
    double gbps = l.GBps;
    if (across && nicGBps > 0) gbps = std::min(gbps, nicGBps / std::max(ranksPerHost, 1));
    return l.alphaUs + bytes / (gbps * 1e3) + (reduce ? bytes * red : 0);
  };
  // Ranks beyond the power of two fold into a neighbour first and get the result back last.
  double us = pow2 ? 0 : stepUs(1, B, true) + stepUs(1, B, false);
  for (int d = 1; d < (1 << L); d *= 2) {
    if (!halving)
      us += stepUs(d, B, true);
    else
      us += stepUs(d, B * d / p, true) + stepUs(d, B * d / p, false);
  }
  return us;
}

double CostModel::treeUs(double B, int n, double chunk) const {
  const LinkCost& link = flatLink();
  const double wire = 1.0 / (link.GBps * 1e3), red = 1.0 / (reduceGBps * 1e3);
  const double h = std::ceil(std::log2(static_cast<double>(n)));
  // Rounds of chunks moving up and down both trees: each half of the message is cut into chunks,
  // and it takes 2h rounds to fill and drain the pipeline. In a round a rank that is interior in
  // one tree and a leaf in the other receives and reduces two children's chunks, sends one up,
  // receives one down and sends two down in the first tree, and sends one up and receives one down
  // in the second: 4 chunks on the wire each way and 2 reduced.
  const double chunks = std::ceil(B / 2 / chunk);
  return (chunks + 2 * h) * (link.alphaUs + roundUs + chunk * (4 * wire + 2 * red));
}

size_t CostModel::treeChunkBytes(size_t bytes, int n) const {
  // The pipelining trade-off: more chunks cost more alphas, larger ones a longer fill and drain.
  size_t best = kMinTreeChunk;
  double bestUs = -1;
  for (size_t c = kMinTreeChunk; c <= kMaxTreeChunk; c *= 2) {
    const double us = treeUs(static_cast<double>(bytes), std::max(n, 2), static_cast<double>(c));
    if (bestUs < 0 || us < bestUs) {
      best = c;
      bestUs = us;
    }
    if (c >= bytes / 2) break;  // one chunk per half already
  }
  return best;
}

}  // namespace chorus::algo
