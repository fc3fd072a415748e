// Process-wide settings read once from the environment into a typed struct, by one table-driven
// reader (config.cpp: each variable's rule and parser in one row; docs/configuration.md documents
// them, and test_config checks the two lists agree). Nothing else in the library calls getenv:
// variables read afresh at each use (rendezvous, secrets) go through launchVariable().
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/log.hpp"
#include "chorus/chorus.hpp"

namespace chorus {

struct EnvConfig {
  LogLevel logLevel = LogLevel::Warn;
  unsigned logSubsystems = kAllSubsystems;  // CHORUS_DEBUG_SUBSYS
  std::chrono::milliseconds timeout{300'000};
  std::string algo;
  /// 0: from the machine's L2 (topo::CacheThresholds), as ntStoreBytes.
  size_t shmStageBytes = 0;
  size_t shmFifoBytes = size_t{1} << 20;
  bool checkCalls = false;
  /// Collectives whose output per rank is at least this many bytes write it with non-temporal stores.
  size_t ntStoreBytes = 0;
  /// Collectives read peers' chorusMemAlloc buffers in place when every rank's buffers are such.
  bool zeroCopy = true;
  /// CHORUS_CMA: collectives read peers' ordinary buffers in place (cross-memory attach) where the
  /// system allows it, from cmaMinBytes per message, or (0) from each collective's own threshold;
  /// "auto" only where cross-memory attach is fast enough on this machine (measured at set-up),
  /// "1" (cmaAlways) or a size whatever its speed.
  bool cma = true;
  bool cmaAlways = false;
  size_t cmaMinBytes = 0;
  /// Point-to-point payloads from this size on go by address where peers read in place: a size
  /// in CHORUS_CMA, else the FIFO's (such payloads never completed without the receiver anyway).
  size_t inPlaceSendMinBytes(size_t fifoBytes) const { return cmaMinBytes ? cmaMinBytes : fifoBytes; }
  /// Testing and validation: ranks of one host split into this many emulated hosts (0/1: off).
  int virtualHosts = 0;
  /// Transport between hosts ("" = the best available) and the TCP transport's settings.
  std::string net;
  std::string socketIfname;
  std::string socketFamily;
  int socketStreams = 1;
  bool socketChecksum = false;
  size_t socketBufferBytes = size_t{512} << 10;
  /// The RDMA verbs transport: device name prefix, port, GID index (RoCE).
  std::string ibHca;
  int ibPort = 1;
  int ibGidIndex = 0;
  /// Device buffers over CUDA IPC: bytes of each rank's stage (two halves, each with a result area
  /// as large) and the largest allreduce sent with the LL protocol.
  size_t cudaStageBytes = size_t{8} << 20;
  size_t cudaLlBytes = size_t{64} << 10;
  /// Device send/recv over CUDA IPC: bytes of one chunk (each FIFO holds four, per peer and channel).
  size_t cudaP2pChunkBytes = size_t{64} << 10;
  /// CHORUS_CUDA_IPC=0: every device call is staged through host memory (no kernels over CUDA IPC).
  bool cudaIpc = true;
  /// Processes sharing a GPU use CUDA IPC anyway (CHORUS_CUDA_SHARED_GPU=ipc; default: staged).
  bool cudaSharedGpuIpc = false;
  /// Flight recorder: entries kept per communicator, and the file prefix written on failure.
  size_t flightRecorderEntries = 256;
  std::string flightRecorderPath;
  /// CHORUS_WAIT: how ranks wait for each other: "" or "auto" (chosen by ranks per core), "spin",
  /// "adaptive", "yield" or "sleep" (engine/waiter.hpp).
  std::string waitPolicy;
  /// CHORUS_CPU_KERNELS: "portable" forces the portable kernels; "" or "auto": the best the CPU runs.
  std::string cpuKernels;
  /// CHORUS_NT_COPY_PAGES: pages the streaming copy interleaves (1, 2, 4 or 8); 0: by CPU vendor.
  int ntCopyPages = 0;
  /// CHORUS_STAGE_WRITE: how reductions into the staging area are written: "" (auto: streaming
  /// where the copies stream, else timed by each rank), "stores", "memcpy" or "streaming"
  /// (engine/staging_writes.hpp).
  std::string stageWrite;
  /// CHORUS_STAGE_COPY: how copies into the staging area are written: "" (auto: timed by each
  /// rank), "plain" or "streaming" (engine/staging_writes.hpp).
  std::string stageCopy;
  /// CHORUS_SINGLE_COPY_CHOICE: how the allreduce picks single copy or staging where either may
  /// win: "" (timed by rank 0) or "ranges" (the measured size ranges; engine/single_copy_choice.hpp).
  std::string singleCopyChoice;
  /// CHORUS_STAGE_PROBE: where nothing sets the staging size, measure it on this machine (cached
  /// in CHORUS_CACHE_DIR; topology/stage_probe.hpp); 0: the L2 / 2 rule.
  bool stageProbe = true;
  /// CHORUS_CACHE_DIR: where what was measured on this machine is kept ("": $XDG_CACHE_HOME/chorus,
  /// else $HOME/.cache/chorus).
  std::string cacheDir;
  /// CHORUS_TOPO_FILE (an hwloc XML file used as this host's topology) and CHORUS_TOPO_DUMP_FILE.
  std::string topoFile;
  std::string topoDumpFile;
  /// First problem found while parsing (empty if none); reported when a communicator is created.
  std::string parseError;
};

/// The environment as read on first use (thread-safe).
const EnvConfig& envConfig();
/// Parses the settings from `lookup` (a variable's value, or NULL when unset): envConfig() with
/// getenv, tests with a table of their own.
EnvConfig readEnvironment(const std::function<const char*(const char*)>& lookup);
/// The names of every setting readEnvironment parses, in table order.
std::vector<std::string> settingNames();
/// A variable read afresh at each use (not a setting: where a job meets, secrets), non-empty, or
/// std::nullopt. `name` must be one of the list in config.cpp (chorusInternalError otherwise).
std::optional<std::string> launchVariable(const char* name);
/// "tcp", "ucx,tcp" (any case) -> the lower-case list; std::nullopt unless a comma list of tcp, ucx, ib.
std::optional<std::string> parseNetList(const std::string& text);

/// The effective value of the CHORUS_* setting `name` as text (chorusConfigGet); throws
/// chorusInvalidArgument for a name that is not a setting of EnvConfig.
std::string configValue(const std::string& name);
/// Parses "4096", "64k", "4M", "1G" (powers of 1024; "inf" gives SIZE_MAX). std::nullopt if malformed.
std::optional<size_t> parseByteSize(const std::string& text);

/// Config with every unset field taken from envConfig(); throws chorusInvalidArgument for bad values.
/// shmStageBytes stays 0 where the environment leaves it to the machine (core fills it in from
/// topo::CacheThresholds, which this layer cannot see).
Config resolveConfig(const Config& user);

}  // namespace chorus
