// The staging area's size, measured on the machine (docs/performance.md, "The staging size,
// measured"). L2 / 2 (CacheThresholds::stageBytes) was the best size on the Xeon VM, but on the
// AVX-512 EPYC (1 MiB L2) twice that ran the 2-rank reduce-scatter 1.8x faster: there a rank
// rewriting staging lines that the other core read last, and still holds, writes at a third of the
// rate it has once the other core has evicted them. Which of the two sizes wins is not in the cache
// sizes hwloc reports, so it is timed: two threads run the staged 2-rank reduce-scatter (stage a
// block, synchronise, reduce the peer's staged block with the own input) with each size in turn,
// and the larger one is taken where it is faster by kMargin in the median of the paired rounds.
//
// The verdict is cached per machine in a file (`<dir>/machine-probe`, dir CHORUS_CACHE_DIR, else
// $XDG_CACHE_HOME/chorus, else $HOME/.cache/chorus), keyed by the CPU model, the caches and the CPU
// count; deleting the file measures again. Concurrent first uses take turns on a lock file. Only
// the rank that decides for a communicator (rank 0) asks, once per process; CHORUS_SHM_STAGE_BYTES
// and Config::shmStageBytes override it, CHORUS_STAGE_PROBE=0 keeps the L2 / 2 rule.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "topology/cache_thresholds.hpp"

namespace chorus::topo {

/// One run of the probe: the two sizes and the median time of a reduce-scatter with each.
struct StageProbeResult {
  size_t small = 0;                 // the L2 / 2 rule's size
  size_t large = 0;                 // twice that
  double smallUs = 0, largeUs = 0;  // medians, microseconds a call
  double ratio = 0;                 // median over the rounds of large / small (paired)
  int rounds = 0;
  bool ok = false;
  std::string failure;  // why not ok (a deadline passed, no memory)
};

/// The larger size must be at least this much faster (a fraction) to be taken.
inline constexpr double kStageProbeMargin = 0.10;

/// Times the staged 2-rank reduce-scatter of `messageBytes` per thread with staging areas of
/// `small` and `large` bytes, `rounds` paired rounds, the order alternating; gives up after
/// `deadline` (ok false).
StageProbeResult probeStageSizes(size_t small, size_t large, size_t messageBytes, int rounds,
                                 std::chrono::milliseconds deadline);

/// The size a probe result picks (pure): `large` where it ran at most (1 - kStageProbeMargin) of
/// `small`'s time, else `small` (also where the probe failed).
size_t chooseStageBytes(const StageProbeResult& r);

/// What identifies this machine to the cache: CPU model, L2, L3 and CPU count, one line.
std::string machineKey(const CacheThresholds& t);

/// The cache file's directory as the environment names it ("" where none can be named).
std::string probeCacheDir();

/// Reads the staging size cached in `file` for `key`; std::nullopt where the file is missing,
/// malformed or written for another key.
std::optional<size_t> readCachedStage(const std::string& file, const std::string& key);
/// Writes it (atomically: a temporary file renamed); false with `why` set where it cannot.
bool writeCachedStage(const std::string& file, const std::string& key, size_t bytes, const std::string& note,
                      std::string* why);

/// The staging size when nothing sets it, and where it comes from ("measured ...", "cached in ...",
/// "from L2 ... (CHORUS_STAGE_PROBE=0)" ...).
struct StageChoice {
  size_t bytes = 0;
  std::string basis;
};
/// This process's choice, made once: the cache, else the probe (then cached), else the rule.
/// Builds with a sanitizer read the cache but neither probe nor write it (their timings are not the
/// machine's).
const StageChoice& localStageChoice();

}  // namespace chorus::topo
