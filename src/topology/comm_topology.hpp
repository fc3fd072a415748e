// The topology of a communicator: which ranks share a host, where each rank runs on its host, and a
// link class for every pair of ranks. Built at communicator creation from what each rank discovered
// on its own host (host_topology.hpp), exchanged through the bootstrap store.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "chorus/store.hpp"
#include "topology/host_topology.hpp"

namespace chorus::topo {

/// How two ranks reach each other, best first. GPU link classes come with device buffers.
enum class LinkClass { Self, SameNuma, CrossNuma, CrossHost };
const char* linkClassName(LinkClass c);

struct RankPlacement {
  int host = 0;          // index into CommTopology::hosts
  int localRank = 0;     // among the ranks of its host, in rank order
  std::vector<int> pus;  // OS indices of the CPUs it may run on
  int numa = -1;         // NUMA node of those CPUs, -1 when they span several
};

struct CommTopology {
  std::vector<HostTopology> hosts;
  std::vector<RankPlacement> ranks;

  int size() const { return static_cast<int>(ranks.size()); }
  /// Number of ranks on the host of `rank`.
  int localSize(int rank) const;
  LinkClass link(int a, int b) const;
  /// Ranks per host, host by host, e.g. "1 host x 4 ranks" or "2 hosts: 4 + 3 ranks".
  std::string shape() const;
  /// Hosts, then one line per rank (host, local rank, CPUs, NUMA), then the link classes.
  std::string describe() const;
  nlohmann::ordered_json toJson() const;

  /// Collective over `size` ranks: publishes this rank's placement (and, from the first rank of each
  /// host, the host's topology) under prefix "topo/" of `store` and reads everyone's. `hostOf[r]` is
  /// the host index of rank r, which the caller already knows from the host identities.
  static CommTopology exchange(Store& store, int rank, const std::vector<int>& hostOf,
                               std::chrono::milliseconds timeout);
};

}  // namespace chorus::topo
