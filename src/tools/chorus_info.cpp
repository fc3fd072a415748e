// chorus-info: what this build of Chorus has and would do on this machine: version, CPU kernels,
// the topology (hwloc, or CHORUS_TOPO_FILE), transports, shared-memory space, configuration, the
// algorithm registry, the decisions and the placement for a communicator of -n ranks, and the memory
// such a communicator allocates. --json prints all of it as one object.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "base/config.hpp"
#include "base/util.hpp"
#include "chorus/chorus.hpp"
#include "core/comm_impl.hpp"
#include "core/device.hpp"
#include "engine/shm_sync.hpp"
#include "kernels/cpu/reduce.hpp"
#include "topology/cache_thresholds.hpp"
#include "topology/comm_topology.hpp"
#include "topology/stage_probe.hpp"
#include "transports/factory.hpp"
#include "transports/shm/peer_memory.hpp"
#include "transports/shm/shm_group.hpp"
#include "transports/shm/shm_segment.hpp"
#include "transports/tcp/net_interfaces.hpp"
#include "tuning/tuning.hpp"

namespace {

using Json = nlohmann::ordered_json;

const chorus::OpKind kKinds[] = {chorus::OpKind::AllReduce, chorus::OpKind::ReduceScatter,
                                 chorus::OpKind::AllGather, chorus::OpKind::Broadcast,
                                 chorus::OpKind::Reduce,    chorus::OpKind::AllToAll};
const size_t kSizes[] = {8, 4096, size_t{1} << 20, size_t{64} << 20};

const char* decide(chorus::OpKind k, size_t bytes, int ranks,
                   const std::vector<chorus::tuning::Rule>& rules) {
  chorus::Op op;
  op.kind = k;
  op.type = chorus::DataType::Uint8;
  op.count = bytes;
  return chorus::tuning::select(op, ranks, ranks > 1, rules).name;
}

// Whether processes of this user may read each other's memory in place, found as every rank finds
// it at set-up: by reading the probe word of another process (here a child that waits).
bool singleCopyAllowed(std::string* state) {
  const pid_t child = fork();
  if (child < 0) {
    *state = "unknown (fork failed)";
    return false;
  }
  if (child == 0) {
    for (;;) pause();
  }
  std::string why;
  bool ok = chorus::transport::probePeerMemory(
      child, reinterpret_cast<uintptr_t>(chorus::transport::peerProbeWord()), &why);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  if (ok && !chorus::transport::probeOwnMemoryWrite(&why)) ok = false;  // as ShmGroup's probe
  *state =
      ok ? "allowed (cross-memory attach: process_vm_readv of another process and process_vm_writev work)"
         : chorus::strCat("refused, collectives stage heap buffers: ", why);
  return ok;
}

// What CHORUS_CMA=auto makes of cross-memory attach's speed here, measured as a communicator's
// first rank measures it at set-up.
std::string singleCopySpeed(double speed, const chorus::EnvConfig& env) {
  using chorus::transport::kMinPeerReadSpeed;
  const std::string pct = chorus::strCat("copies 4 MiB at ", static_cast<int>(speed * 100 + 0.5),
                                         "% of memcpy's rate (single copy pays from ",
                                         static_cast<int>(kMinPeerReadSpeed * 100), "%): ");
  if (!env.cma) return pct + "not used (CHORUS_CMA=0)";
  if (env.cmaAlways)
    return pct + "used whatever its speed (CHORUS_CMA=" + chorus::configValue("CHORUS_CMA") + ")";
  return pct + (chorus::transport::peerReadsPay(speed, false)
                    ? "used between processes"
                    : "heap buffers are staged between processes, but where the host's first rank times "
                      "single copy against staging (allreduce, all-gather, reduce-scatter)");
}

// What chorus-info reports, gathered once for the text and the JSON output.
struct Facts {
  int ranks = 0;
  chorus::Config config;
  std::vector<chorus::tuning::Rule> rules;
  const chorus::topo::HostTopology* host = nullptr;
  std::vector<chorus::Communicator> comms;
  const chorus::topo::CommTopology* comm = nullptr;
  const chorus::EnvConfig* env = nullptr;
  std::vector<chorus::transport::NetInterface> ifaces;
  std::string netChoice;
  std::string ucxState, ibState;
  bool ucxReady = false, ibReady = false;
  std::string cudaState;
  bool cudaReady = false;
  std::string singleCopyState;
  bool singleCopyReady = false;
  double singleCopySpeed = 0;  // cross-memory attach's rate / memcpy's (0: refused)
};

// Reads the configuration, creates a local communicator of `ranks` threads and probes the transports.
Facts gather(int ranks) {
  using namespace chorus;
  Facts f;
  f.ranks = ranks;
  f.config = Config::fromEnvironment();
  f.rules = tuning::parseRules(f.config.algo);
  f.host = &topo::localHost();
  f.comms = Communicator::createLocal(ranks, f.config);
  f.comm = &f.comms[0].impl()->topology();

  // The address a multi-host communicator would advertise, with the same settings.
  f.env = &envConfig();
  f.ifaces = transport::listInterfaces();
  try {
    const transport::NetInterface n = transport::selectInterface(f.ifaces, f.env->socketIfname,
                                                                 transport::parseFamily(f.env->socketFamily));
    f.netChoice = strCat(n.name, " ", transport::addressText(n.address));
  } catch (const Error& e) {
    f.netChoice = strCat("none: ", e.what());
  }

  // UCX and verbs: built in, and usable here?
  f.ucxReady = transport::netKindUsable(transport::NetKind::Ucx, &f.ucxState);
  f.ibReady = transport::netKindUsable(transport::NetKind::Ib, &f.ibState);

  f.cudaReady = device::available(&f.cudaState);
  f.singleCopyReady = singleCopyAllowed(&f.singleCopyState);
  if (f.singleCopyReady) f.singleCopySpeed = transport::measurePeerReadSpeed();
  return f;
}

// How this tool's communicator places staged calls (algo::stagingPacks): which are packed through
// the whole staging area and which go to two slots in turn, with the ranks and cores rank 0 decided
// from; "" where the ranks have no shared memory.
std::string stagingSlotsNote(const Facts& f) {
  using namespace chorus;
  engine::ShmSync* sm = f.comms[0].impl()->sharedMemory();
  if (sm == nullptr) return "";
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  const int perCore = sm->group().ranksPerCore();
  return strCat(perCore == 1 ? std::string("every staged call of the broadcast, reduce, reduce-scatter and "
                                           "all-to-all, the short ones of the rest, packed one after another "
                                           "through all of them")
                : perCore == 2
                    ? std::string("the short staged calls of the broadcast, reduce, reduce-scatter and "
                                  "all-to-all packed one after another through all of them, the rest in "
                                  "two in turn")
                    : std::string("every staged call in two in turn"),
                " (", f.ranks, " ranks on ", cores, cores == 1 ? " core)" : " cores)");
}

void printJson(const Facts& f) {
  using namespace chorus;
  const EnvConfig& env = *f.env;
  const Config& config = f.config;
  Json j;
  j["version"] = strCat(CHORUS_MAJOR, ".", CHORUS_MINOR, ".", CHORUS_PATCH);
  j["cpu_kernels"] = kernels::simdLevel();
  j["transports"] = {
      {"shm", true}, {"tcp", true}, {"ucx", f.ucxReady}, {"verbs", f.ibReady}, {"cuda", f.cudaReady}};
  j["cuda"] = {{"state", f.cudaState},
               {"CHORUS_CUDA_STAGE_BYTES", env.cudaStageBytes},
               {"CHORUS_CUDA_LL_BYTES", env.cudaLlBytes},
               {"CHORUS_CUDA_P2P_CHUNK_BYTES", env.cudaP2pChunkBytes},
               {"CHORUS_CUDA_SHARED_GPU", env.cudaSharedGpuIpc ? "ipc" : "staged"},
               {"CHORUS_CUDA_IPC", env.cudaIpc ? 1 : 0}};
  Json list = Json::array();
  for (const auto& n : f.ifaces) {
    list.push_back({{"name", n.name},
                    {"address", transport::addressText(n.address)},
                    {"loopback", n.loopback},
                    {"link_local", n.linkLocal}});
  }
  j["network"] = {{"interfaces", std::move(list)},
                  {"tcp_address", f.netChoice},
                  {"CHORUS_SOCKET_IFNAME", env.socketIfname},
                  {"CHORUS_SOCKET_FAMILY", env.socketFamily},
                  {"CHORUS_SOCKET_NSTREAMS", env.socketStreams},
                  {"CHORUS_SOCKET_BUFFER_BYTES", env.socketBufferBytes},
                  {"CHORUS_SOCKET_CHECKSUM", env.socketChecksum},
                  {"CHORUS_NET", env.net},
                  {"ucx", f.ucxState},
                  {"verbs", f.ibState}};
  j["single_copy"] = {
      {"allowed", f.singleCopyReady},
      {"state", f.singleCopyState},
      {"speed", f.singleCopySpeed},
      {"min_speed", transport::kMinPeerReadSpeed},
      {"used", f.singleCopyReady && env.cma && transport::peerReadsPay(f.singleCopySpeed, env.cmaAlways)},
      {"CHORUS_CMA", configValue("CHORUS_CMA")}};
  const topo::CacheThresholds& t = topo::localCacheThresholds();
  j["thresholds"] = {
      {"l2_bytes", t.l2Bytes},
      {"l3_bytes", t.l3Bytes},
      {"basis", t.basis},
      {"nt_store_bytes", topo::ntStoreBytes()},
      {"nt_store_from", env.ntStoreBytes ? "CHORUS_NT_STORE_BYTES" : "machine"},
      {"output_stores", env.ntStoreBytes ? "threshold" : "timed"},
      {"nt_copy_pages", kernels::streamPages()},
      {"nt_copy_pages_from", kernels::streamPagesBasis()},
      {"stage_write", configValue("CHORUS_STAGE_WRITE")},
      {"stage_copy", configValue("CHORUS_STAGE_COPY")},
      {"single_copy_choice", configValue("CHORUS_SINGLE_COPY_CHOICE")},
      {"shm_stage_bytes", config.shmStageBytes},
      {"shm_stage_from", env.shmStageBytes ? "CHORUS_SHM_STAGE_BYTES" : "machine"},
      {"shm_stage_basis", env.shmStageBytes ? "CHORUS_SHM_STAGE_BYTES" : topo::localStageChoice().basis},
      {"shm_stage_rule_bytes", t.stageBytes},
      {"shm_stage_slots", transport::kStageSlots},
      {"shm_stage_short_calls", stagingSlotsNote(f)},
      {"CHORUS_STAGE_PROBE", configValue("CHORUS_STAGE_PROBE")},
      {"cache_dir", topo::probeCacheDir()}};
  j["dev_shm_free_bytes"] = transport::shmFreeBytes();
  j["config"] = {{"CHORUS_TIMEOUT_ms", config.timeout.count()},
                 {"CHORUS_SHM_STAGE_BYTES", config.shmStageBytes},
                 {"CHORUS_SHM_FIFO_BYTES", config.shmFifoBytes},
                 {"CHORUS_CHECK", config.checkCalls},
                 {"CHORUS_ALGO", config.algo}};
  Json algos = Json::array();
  for (const algo::Algorithm& a : tuning::registry()) {
    algos.push_back({{"collective", opKindName(a.kind)},
                     {"name", a.name},
                     {"description", a.description},
                     {"needs_shared_memory", a.needsSharedMemory}});
  }
  j["algorithms"] = std::move(algos);
  Json decisions;
  for (OpKind k : kKinds) {
    for (size_t s : kSizes) decisions[opKindName(k)][std::to_string(s)] = decide(k, s, f.ranks, f.rules);
  }
  j["decisions"] = {{"ranks", f.ranks}, {"bytes_per_rank", std::move(decisions)}};
  j["memory_per_rank_bytes"] = f.comms[0].memoryBytes();
  j["host"] = f.host->toJson();
  j["communicator"] = f.comm->toJson();
  std::printf("%s\n", j.dump(2).c_str());
}

// The text output, first part: version, kernels, topology, transports, /dev/shm and configuration.
void printSetup(const Facts& f) {
  using namespace chorus;
  const EnvConfig& env = *f.env;
  const Config& config = f.config;
  std::printf("Chorus %d.%d.%d\n", CHORUS_MAJOR, CHORUS_MINOR, CHORUS_PATCH);
  std::printf("\nCPU kernels        %s\n", kernels::simdLevel());
  std::printf("\nTopology (%s)\n%s", topo::haveHwloc() ? "hwloc" : "built without hwloc",
              f.host->describe().c_str());
  std::printf("\nTransports\n");
  std::printf("  shm              yes (POSIX shared memory, ranks of one host)\n");
  std::printf("  tcp              yes (between hosts; would advertise %s)\n", f.netChoice.c_str());
  std::printf("                   %d stream(s) per pair, %s rings, checksum %s (docs/networking.md)\n",
              env.socketStreams, formatBytes(env.socketBufferBytes).c_str(),
              env.socketChecksum ? "on" : "off");
  std::printf("  ucx              %s\n", f.ucxState.c_str());
  std::printf("  verbs            %s\n", f.ibState.c_str());
  std::printf("  CHORUS_NET       %s\n",
              env.net.empty() ? "unset (automatic: docs/networking.md)" : env.net.c_str());
  std::printf("  cuda             %s\n", f.cudaState.c_str());
  std::printf(
      "                   device buffers: %s, IPC stage %s, LL up to %s, send/recv chunk %s, GPUs shared "
      "by processes: %s (docs/gpu.md)\n",
      env.cudaIpc ? "kernels over CUDA IPC within a host" : "all staged (CHORUS_CUDA_IPC=0)",
      formatBytes(env.cudaStageBytes).c_str(), formatBytes(env.cudaLlBytes).c_str(),
      formatBytes(env.cudaP2pChunkBytes).c_str(), env.cudaSharedGpuIpc ? "ipc" : "staged");
  const topo::CacheThresholds& t = topo::localCacheThresholds();
  std::printf("\nThresholds         non-temporal stores from %s per rank (%s)\n",
              formatBytes(topo::ntStoreBytes()).c_str(),
              env.ntStoreBytes ? "CHORUS_NT_STORE_BYTES" : t.basis.c_str());
  std::printf("                   staging %s per rank (%s; the L2 / 2 rule: %s)\n",
              formatBytes(config.shmStageBytes).c_str(),
              env.shmStageBytes ? "CHORUS_SHM_STAGE_BYTES" : topo::localStageChoice().basis.c_str(),
              formatBytes(t.stageBytes).c_str());
  if (const std::string slots = stagingSlotsNote(f); !slots.empty()) {
    std::printf("                   staging slots: %d of %s; %s\n", transport::kStageSlots,
                formatBytes(config.shmStageBytes / 2).c_str(), slots.c_str());
  }
  std::printf("                   staged all-gather, allreduce and all-to-all outputs: %s\n",
              env.ntStoreBytes ? "by the threshold per rank (CHORUS_NT_STORE_BYTES set)"
                               : "timed by each rank, streaming first, where all ranks' buffers reach the "
                                 "threshold");
  std::printf("                   non-temporal copies interleave %u page(s) (%s)\n", kernels::streamPages(),
              kernels::streamPagesBasis());
  const std::string stageCopy = configValue("CHORUS_STAGE_COPY");
  std::printf("                   copies into staging written by %s (CHORUS_STAGE_COPY=%s)\n",
              stageCopy == "auto" ? "plain or streaming stores, each rank timing both" : stageCopy.c_str(),
              stageCopy.c_str());
  const std::string stageWrite = configValue("CHORUS_STAGE_WRITE");
  std::printf("                   reductions into staging written by %s (CHORUS_STAGE_WRITE=%s)\n",
              stageWrite == "auto"
                  ? "streaming stores where the copies stream, else stores or memcpy, each rank "
                    "timing both"
                  : stageWrite.c_str(),
              stageWrite.c_str());
  std::printf("\nSingle copy        %s\n", f.singleCopyState.c_str());
  if (f.singleCopyReady)
    std::printf("                   %s\n", singleCopySpeed(f.singleCopySpeed, env).c_str());
  const std::string choice = configValue("CHORUS_SINGLE_COPY_CHOICE");
  std::printf(
      "                   allreduce, all-gather, reduce-scatter: single copy or staging %s "
      "(CHORUS_SINGLE_COPY_CHOICE=%s)\n",
      env.cmaMinBytes     ? "forced to single copy by CHORUS_CMA"
      : choice == "timed" ? "timed by the host's first rank, per size"
                          : "by the measured size ranges",
      choice.c_str());
  std::printf(
      "                   heap buffers of allreduce, reduce-scatter, all-gather, broadcast and all-to-all "
      "read in place, point-to-point messages from %s sent by address (ranks of one process: always): "
      "CHORUS_CMA=%s (docs/performance.md)\n",
      formatBytes(env.inPlaceSendMinBytes(config.shmFifoBytes)).c_str(), configValue("CHORUS_CMA").c_str());
  std::printf("\n/dev/shm free      %s\n", formatBytes(transport::shmFreeBytes()).c_str());
  std::printf("\nConfiguration (environment, then defaults)\n");
  std::printf("  CHORUS_TIMEOUT          %lld ms\n", static_cast<long long>(config.timeout.count()));
  std::printf("  CHORUS_SHM_STAGE_BYTES  %s\n", formatBytes(config.shmStageBytes).c_str());
  std::printf("  CHORUS_SHM_FIFO_BYTES   %s\n", formatBytes(config.shmFifoBytes).c_str());
  std::printf("  CHORUS_CHECK            %d\n", config.checkCalls ? 1 : 0);
  std::printf("  CHORUS_ALGO             %s\n",
              config.algo.empty() ? "(built-in choice)" : config.algo.c_str());
}

// The text output, second part: the algorithm registry, the decisions for this communicator and the
// cost model's predictions.
void printAlgorithms(const Facts& f) {
  using namespace chorus;
  const int ranks = f.ranks;
  std::printf("\nAlgorithms\n");
  for (const algo::Algorithm& a : tuning::registry()) {
    std::printf("  %-14s %-9s %s%s\n", opKindName(a.kind), a.name, a.description,
                a.needsSharedMemory ? " [shm]" : "");
  }
  std::printf("\nDecisions for %d ranks on one host (bytes per rank -> algorithm)\n", ranks);
  std::printf("  %-14s", "");
  for (size_t s : kSizes) std::printf(" %10s", formatBytes(s).c_str());
  std::printf("\n");
  for (OpKind k : kKinds) {
    std::printf("  %-14s", opKindName(k));
    for (size_t s : kSizes) std::printf(" %10s", decide(k, s, ranks, f.rules));
    std::printf("\n");
  }
  const algo::CostModel& model = *f.comms[0].impl()->costModel();
  std::printf("\nCost model of the pipe algorithms (%s)\n", model.describe().c_str());
  std::printf("  predicted us for %d ranks; * = the choice without shared memory (ranks on several hosts)\n",
              ranks);
  std::printf("  %-24s", "");
  for (size_t s : kSizes) std::printf(" %11s", formatBytes(s).c_str());
  std::printf("\n");
  for (const algo::Algorithm& a : tuning::registry()) {
    if (a.needsSharedMemory || a.kind == OpKind::AllToAllv || a.kind == OpKind::Barrier) continue;
    std::printf("  %-14s %-9s", opKindName(a.kind), a.name);
    for (size_t s : kSizes) {
      Op op;
      op.kind = a.kind;
      op.type = DataType::Uint8;
      op.count = s;
      const bool chosen = &tuning::select(op, ranks, false, f.rules, &model) == &a;
      const double us = model.predictUs(a, op, ranks);
      if (us < 0)
        std::printf(" %10s ", "-");  // does not apply (hierarchical on one host)
      else
        std::printf(" %10.1f%s", us, chosen ? "*" : " ");
    }
    std::printf("\n");
  }
}

// The text output, last part: the placement and memory of the communicator.
void printCommunicator(const Facts& f) {
  using namespace chorus;
  std::printf("\nA communicator of %d ranks (threads of this process)\n", f.ranks);
  const std::string placement = f.comm->describe();
  // The host block was printed above: show the ranks and links only.
  std::printf("%s", placement.substr(placement.find("  ranks:")).c_str());
  std::printf("\nMemory of one communicator of %d ranks: %s per rank (shared segment)\n", f.ranks,
              formatBytes(f.comms[0].memoryBytes()).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-info: what Chorus has and would do on this machine"};
  int ranks = 4;
  bool json = false;
  app.add_option("-n,--ranks", ranks, "ranks of the communicator to describe (as threads)")
      ->check(CLI::Range(1, 64));
  app.add_flag("--json", json, "print everything as one JSON object");
  CLI11_PARSE(app, argc, argv);
  try {
    const Facts facts = gather(ranks);
    if (json) {
      printJson(facts);
      return 0;
    }
    printSetup(facts);
    printAlgorithms(facts);
    printCommunicator(facts);
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "chorus-info: %s\n", e.what());
    return 2;
  }
  return 0;
}
