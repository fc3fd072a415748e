#include "topology/cache_thresholds.hpp"

#include <algorithm>

#include "base/config.hpp"
#include "base/error.hpp"
#include "base/util.hpp"

namespace chorus::topo {

namespace {
constexpr size_t K = 1024, M = K * K;

size_t floorPow2(uint64_t v) {
  size_t p = 1;
  while (p <= v / 2) p <<= 1;
  return p;
}
}  // namespace

CacheThresholds cacheThresholdsFor(const HostTopology& host) {
  CacheThresholds t;
  t.l2Bytes = host.l2Bytes;
  t.l3Bytes = host.l3Bytes;
  if (host.l2Bytes == 0) {
    t.basis = "L2 unknown: defaults";
    return t;
  }
  // Streaming stores only for outputs the last-level cache would not hold anyway: plain stores up
  // to there leave the output in cache for whoever reads it next (docs/performance.md).
  t.ntStoreBytes = static_cast<size_t>(
      std::clamp<uint64_t>(std::max<uint64_t>(2 * host.l2Bytes, host.l3Bytes), 1 * M, 64 * M));
  t.stageBytes = std::clamp<size_t>(floorPow2(host.l2Bytes / 2), 256 * K, 8 * M);
  t.basis = host.l3Bytes
                ? strCat("from L2 ", formatBytes(host.l2Bytes), " and L3 ", formatBytes(host.l3Bytes))
                : strCat("from L2 ", formatBytes(host.l2Bytes));
  return t;
}

const CacheThresholds& localCacheThresholds() {
  static const CacheThresholds t = [] {
    try {
      return cacheThresholdsFor(localHost());
    } catch (const Error& e) {
      CacheThresholds d;
      d.basis = strCat("topology unreadable (", e.what(), "): defaults");
      return d;
    }
  }();
  return t;
}

size_t ntStoreBytes() {
  const size_t set = envConfig().ntStoreBytes;
  return set ? set : localCacheThresholds().ntStoreBytes;
}

}  // namespace chorus::topo
