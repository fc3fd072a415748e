// An alpha-beta cost model of the algorithms that move data over point-to-point links (the pipes):
// each message costs alpha, each byte 1/bandwidth on the wire and 1/reduceBandwidth where it is
// reduced. There are two levels of links: between ranks of one host (intra) and between hosts
// (inter, whose bandwidth the ranks of a host share through its NIC). Its constants come from the
// communicator's topology, and the selection uses it where no shared-memory algorithm applies (ranks
// on several hosts): the cheapest prediction wins, so latency-bound sizes get log-depth algorithms
// and bandwidth-bound ones the ring, halving-doubling, the chain or the hierarchical allreduce. Each
// algorithm's formula sits beside it in its file (Algorithm::cost). The shared-memory algorithms are
// chosen by the default size rules (src/tuning/rules.cpp), measured on real machines; the model
// gives them no prediction. chorus-sim (src/sim) runs the algorithms' own
// schedules for a finer prediction.
#pragma once

#include <string>

#include "algorithms/algorithm.hpp"

namespace chorus::algo {

/// One class of link: a per-message cost and the bandwidth one rank gets on it.
struct LinkCost {
  std::string name = "shm-numa";  // topo::linkClassName, or a name given by the user
  double alphaUs = 1.5;           // per message (latency + software overhead)
  double GBps = 2.0;              // GB/s (1e9 bytes) one rank moves over one link
};

struct CostModel {
  LinkCost intra;                        // between ranks of one host
  LinkCost inter{"network", 25.0, 1.1};  // between hosts
  double nicGBps = 0;                    // per host, shared by its ranks' inter traffic (0: no limit)
  double reduceGBps = 5.0;               // GB/s a rank reduces incoming data into its buffer
  int hosts = 1;                         // hosts of the communicator
  int ranksPerHost = 0;                  // ranks on every host, 0 when hosts differ
  /// Extra cost of each synchronised round of a pipelined algorithm (the tree) beyond alpha: with
  /// more ranks than cores, a round waits for the scheduler to run every rank in it.
  double roundUs = 0;

  /// A one-host model whose links are of `linkClass` (topo::linkClassName): the pipes between ranks
  /// of one host measured on the development VM, halved bandwidth across NUMA nodes; "network" is a
  /// 10 GbE-class network (then every pair of ranks is taken to be on different hosts).
  static CostModel forLinkClass(const std::string& linkClass);
  /// The model of a communicator: intra from the slowest link within a host, inter from the network,
  /// the host shape from the topology. `emulatedHosts` (CHORUS_VIRTUAL_HOSTS): the hosts are blocks
  /// of ranks of one machine, so inter-host links cost what the intra-host pipes cost.
  static CostModel forTopology(const topo::CommTopology& topology, bool emulatedHosts);

  /// The link that bounds an algorithm that ignores hosts (inter when there are several hosts).
  const LinkCost& flatLink() const { return hosts > 1 ? inter : intra; }
  /// One line: the link constants and the host shape.
  std::string describe() const;

  /// The chunk size (a power of two in [kMinTreeChunk, kMaxTreeChunk]) for which the double binary
  /// tree allreduce of `bytes` on `n` ranks is predicted fastest: the pipelining optimum between
  /// per-chunk latency and pipeline fill.
  size_t treeChunkBytes(size_t bytes, int n) const;
  static constexpr size_t kMinTreeChunk = size_t{4} << 10;
  static constexpr size_t kMaxTreeChunk = size_t{16} << 20;
  /// The tree's predicted microseconds for `bytes` on `n` ranks in chunks of `chunk` bytes.
  double treeUs(double bytes, int n, double chunk) const;

  /// Predicted microseconds of `a` running `op` on `n` ranks (its cost formula); a negative value
  /// when it has none (shared-memory algorithms) or it does not apply (hierarchical on one host).
  double predictUs(const Algorithm& a, const Op& op, int n) const;

  /// What the formulas start from, for `op` on the flat link: bytes per rank, ranks, alpha (us),
  /// us per byte on the wire and us per byte reduced.
  struct Terms {
    double B, fn, al, wire, red;
  };
  Terms terms(const Op& op, int n) const;
  /// Recursive doubling (`halving` false) or halving-doubling of `op` step by step, each exchange
  /// priced on the link it crosses (allreduce_rd.cpp, allreduce_rhd.cpp).
  double recursiveUs(const Op& op, int n, bool halving) const;
};

/// floor(log2 n), n >= 1; ceil(log_k n).
int floorLog2(int n);
int ceilLog(int n, int k);

}  // namespace chorus::algo
