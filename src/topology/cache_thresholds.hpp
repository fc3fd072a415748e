// Sizes that depend on the machine's caches, derived from the host topology instead of constants:
// where outputs stop fitting in cache (non-temporal stores from there) and how large a staging
// chunk of the direct algorithms is (its working set must stay in L2). The non-temporal threshold
// is the one measured best on the EPYC VM with data in the buffers; the staging size reproduces
// the one measured best on the 2 MiB-L2 Xeon VM (docs/performance.md, "Thresholds from the
// machine") and is the smaller of the two sizes topology/stage_probe.hpp times on the machine;
// CHORUS_NT_STORE_BYTES and CHORUS_SHM_STAGE_BYTES override them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "topology/host_topology.hpp"

namespace chorus::topo {

struct CacheThresholds {
  uint64_t l2Bytes = 0;  // what they were derived from (0: unknown)
  uint64_t l3Bytes = 0;
  /// Outputs of at least this many bytes per rank use non-temporal stores: the L3 (the larger of
  /// it and 2 x L2), within 1-64 MiB (4 MiB where L2 is unknown).
  size_t ntStoreBytes = size_t{4} << 20;
  /// The staging size (a long call's two slots, shm_group.hpp): L2 / 2 rounded down to a power of
  /// two, within 256 KiB-8 MiB (1 MiB where L2 is unknown), so a chunk of the reading ranks' slots
  /// fits L2.
  size_t stageBytes = size_t{1} << 20;
  /// "from L2 1 MiB and L3 32 MiB", "from L2 2 MiB" (L3 unknown) or "L2 unknown: defaults".
  std::string basis;
};

/// The thresholds for a host (pure).
CacheThresholds cacheThresholdsFor(const HostTopology& host);

/// This host's (localHost()), computed once; the defaults if the topology cannot be read.
const CacheThresholds& localCacheThresholds();

/// The non-temporal store threshold in force: CHORUS_NT_STORE_BYTES if set, else this host's.
size_t ntStoreBytes();

}  // namespace chorus::topo
