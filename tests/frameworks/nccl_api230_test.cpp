// A program written against NCCL 2.30's nccl.h and nccl_device.h, linked against Chorus's
// libnccl.so.2: every call 2.30 added, on host ranks that are processes forked here, checked
// exactly, and every refusal checked with its message.
//
//   nccl_api230_test ranks   4 ranks: InitRankScalable with 2 ids on ranks 0-1, grow 2 -> 4,
//                            windows with put/signal/wait, the device API's host calls, revoke,
//                            suspend/resume with the memory measured, shrink 4 -> 3 after a kill
//   nccl_api230_test params  NCCL_* variables mapped onto Chorus's and read back with ncclParam*
//                            (the test sets the environment)
//
// Rank 0 makes the unique ids (its process serves their stores, and it survives) and passes them,
// and the grow id, through shared memory; the parent checks how each rank ended.
#include <nccl.h>
#include <nccl_device.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

int gRank = -1;
int gFailures = 0;

#define CHECK(cond, ...)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "rank %d: FAIL %s:%d: %s: ", gRank, __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                   \
      std::fprintf(stderr, "\n");                                                          \
      ++gFailures;                                                                         \
    }                                                                                      \
  } while (0)

#define NCCL_OK(call)                                                                            \
  do {                                                                                           \
    ncclResult_t r_ = (call);                                                                    \
    if (r_ != ncclSuccess) {                                                                     \
      std::fprintf(stderr, "rank %d: %s failed: %s: %s\n", gRank, #call, ncclGetErrorString(r_), \
                   ncclGetLastError(nullptr));                                                   \
      std::_Exit(1);                                                                             \
    }                                                                                            \
  } while (0)

bool has(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }
std::string lastError() { return ncclGetLastError(nullptr); }

// Refused with `code` and a message containing `part`.
#define REFUSED(call, code, part)                                                                \
  do {                                                                                           \
    ncclResult_t r_ = (call);                                                                    \
    CHECK(r_ == (code) && has(lastError(), part), "%s gave %d: %s", #call, static_cast<int>(r_), \
          lastError().c_str());                                                                  \
  } while (0)

struct Mailbox {
  std::atomic<int> idsReady;
  ncclUniqueId ids[3];  // made by rank 0 (its process serves their stores)
  std::atomic<int> growIdReady;
  ncclUniqueId growId;
};

// Resident bytes of this process's mappings of /dev/shm (Chorus's shared segments), from smaps.
size_t shmResidentBytes() {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool shm = false;
  size_t total = 0;
  while (std::getline(in, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') != std::string::npos && line.find(' ') != std::string::npos) {
      shm = line.find("/dev/shm/") != std::string::npos;
    } else if (shm && line.rfind("Rss:", 0) == 0) {
      total += std::stoull(line.substr(4)) * 1024;
    }
  }
  return total;
}

int64_t sumOfRanks(ncclComm_t comm, int64_t mine) {
  int64_t sum = -1;
  NCCL_OK(ncclAllReduce(&mine, &sum, 1, ncclInt64, ncclSum, comm, nullptr));
  return sum;
}

// Ranks 0 and 1 join with two ids; a rank passing another second id is refused on both.
ncclComm_t scalableInit(const ncclUniqueId ids[3]) {
  ncclUniqueId two[2] = {ids[0], ids[1]};
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  NCCL_OK(ncclCommInitRankScalable(&comm, 2, gRank, 2, two, &config));
  CHECK(sumOfRanks(comm, gRank + 1) == 3, "scalable init: allreduce");
  // The refusal: rank 1 passes ids[2] as its second id. Both ranks meet on ids[0]... which is
  // consumed, so the check runs on a fresh first id: ids[2] itself, with the wrong second id on rank 1.
  ncclUniqueId mixed[2] = {ids[2], gRank == 0 ? ids[1] : ids[0]};
  ncclComm_t bad = reinterpret_cast<ncclComm_t>(0x1);
  REFUSED(ncclCommInitRankScalable(&bad, 2, gRank, 2, mixed, nullptr), ncclInvalidArgument,
          "rank(s) 1 passed other unique ids");
  CHECK(bad == nullptr, "a refused init leaves NULL");
  REFUSED(ncclCommInitRankScalable(&bad, 2, gRank, 0, two, nullptr), ncclInvalidArgument, "nId 0");
  return comm;
}

ncclComm_t grow(ncclComm_t comm2, Mailbox* box) {
  ncclComm_t comm4 = nullptr;
  if (gRank < 2) {
    ncclUniqueId id{};
    if (gRank == 0) {
      NCCL_OK(ncclCommGetUniqueId(comm2, &id));
      ncclUniqueId again;
      REFUSED(ncclCommGetUniqueId(comm2, &again), ncclInvalidUsage, "not been consumed");
      box->growId = id;
      box->growIdReady.store(1);
    }
    REFUSED(ncclCommGrow(comm2, 4, nullptr, 0, &comm4, nullptr), ncclInvalidArgument,
            "existing ranks pass rank -1");
    REFUSED(ncclCommGrow(comm2, 2, nullptr, -1, &comm4, nullptr), ncclInvalidArgument, "does not exceed");
    NCCL_OK(ncclCommGrow(comm2, 4, gRank == 0 ? &id : nullptr, -1, &comm4, nullptr));
    // The old communicator still works.
    CHECK(sumOfRanks(comm2, gRank) == 1, "old communicator after grow");
  } else {
    while (!box->growIdReady.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclUniqueId id = box->growId;
    REFUSED(ncclCommGrow(nullptr, 4, nullptr, gRank, &comm4, nullptr), ncclInvalidArgument,
            "must pass the uniqueId");
    NCCL_OK(ncclCommGrow(nullptr, 4, &id, gRank, &comm4, nullptr));
  }
  int rank = -1, count = 0;
  NCCL_OK(ncclCommUserRank(comm4, &rank));
  NCCL_OK(ncclCommCount(comm4, &count));
  CHECK(rank == gRank && count == 4, "grown: rank %d of %d", rank, count);
  CHECK(sumOfRanks(comm4, gRank) == 6, "grown: allreduce");
  return comm4;
}

void windows(ncclComm_t comm) {
  constexpr size_t kFloats = 1024;  // per source rank and round
  constexpr size_t kBytes = 8 * kFloats * sizeof(float);
  const int next = (gRank + 1) % 4, prev = (gRank + 3) % 4;
  float* buf = nullptr;
  NCCL_OK(ncclMemAlloc(reinterpret_cast<void**>(&buf), kBytes));
  ncclWindow_t win = nullptr;
  NCCL_OK(ncclCommWindowRegister(comm, buf, kBytes, &win, NCCL_WIN_COLL_SYMMETRIC));
  void* user = nullptr;
  NCCL_OK(ncclWinGetUserPtr(comm, win, &user));
  CHECK(user == buf, "ncclWinGetUserPtr");
  // Put my block into slot [round][gRank] of the next rank's window, in two rounds.
  std::vector<float> mine(kFloats);
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < kFloats; ++i) mine[i] = static_cast<float>(gRank * 100000 + round * 10000 + i);
    NCCL_OK(ncclPutSignal(mine.data(), kFloats, ncclFloat32, next, win,
                          (round * 4 + gRank) * kFloats * sizeof(float), 3, 1, 0, comm, nullptr));
    ncclWaitSignalDesc_t d{1, prev, 3, 1};
    NCCL_OK(ncclWaitSignal(1, &d, comm, nullptr));
    bool exact = true;
    for (size_t i = 0; i < kFloats; ++i)
      exact = exact &&
              buf[(round * 4 + prev) * kFloats + i] == static_cast<float>(prev * 100000 + round * 10000 + i);
    CHECK(exact, "put round %d: block from rank %d", round, prev);
  }
  // Signals alone, counted: two from every other rank, waited for at once.
  for (int p = 0; p < 4; ++p)
    if (p != gRank) {
      NCCL_OK(ncclSignal(p, 7, 0, 0, comm, nullptr));
      NCCL_OK(ncclSignal(p, 7, 0, 0, comm, nullptr));
    }
  std::vector<ncclWaitSignalDesc_t> all;
  for (int p = 0; p < 4; ++p)
    if (p != gRank) all.push_back({2, p, 7, 0});
  NCCL_OK(ncclWaitSignal(static_cast<int>(all.size()), all.data(), comm, nullptr));
  // A peer's buffer read in place (ncclGetPeerDevicePointer: host windows map the peer's memory).
  void* peer = nullptr;
  NCCL_OK(ncclGetPeerDevicePointer(win, (4 + gRank) * kFloats * sizeof(float), next, &peer));
  CHECK(static_cast<float*>(peer)[5] == static_cast<float>(gRank * 100000 + 10000 + 5), "peer pointer: %g",
        static_cast<double>(static_cast<float*>(peer)[5]));
  void* lsa = nullptr;
  NCCL_OK(ncclGetLsaDevicePointer(win, 0, next, &lsa));
  CHECK(lsa == static_cast<char*>(peer) - (4 + gRank) * kFloats * sizeof(float), "LSA pointer");

  // Refusals.
  REFUSED(ncclPutSignal(mine.data(), kFloats, ncclFloat32, next, win, kBytes - 4, 0, 0, 0, comm, nullptr),
          ncclInvalidArgument, "do not fit");
  REFUSED(ncclSignal(next, 64, 0, 0, comm, nullptr), ncclInvalidArgument, "sigIdx 64");
  REFUSED(ncclSignal(9, 0, 0, 0, comm, nullptr), ncclInvalidArgument, "peer 9");
  REFUSED(ncclSignal(next, 0, 0, 0, comm, reinterpret_cast<cudaStream_t>(0x10)), ncclInvalidUsage,
          "NULL stream");
  REFUSED(ncclCommSuspend(comm, NCCL_SUSPEND_MEM), ncclInvalidUsage, "deregister them first");
  REFUSED(ncclGetLsaMultimemDevicePointer(win, 0, &peer), ncclInvalidUsage, "multimem");
  // A window of memory not from ncclMemAlloc: refused on every rank, naming rank 2's buffer.
  std::vector<char> heap(4096);
  ncclWindow_t bad = nullptr;
  float* other = nullptr;
  NCCL_OK(ncclMemAlloc(reinterpret_cast<void**>(&other), 4096));
  REFUSED(ncclCommWindowRegister(comm, gRank == 2 ? static_cast<void*>(heap.data()) : other, 4096, &bad, 0),
          ncclInvalidArgument, "rank(s) 2 is not in memory from chorusMemAlloc");
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  REFUSED(ncclWinGetUserPtr(comm, win, &user), ncclInvalidArgument, "not a registered window");
  NCCL_OK(ncclMemFree(other));
  NCCL_OK(ncclMemFree(buf));
}

void deviceApi(ncclComm_t comm) {
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  NCCL_OK(ncclCommQueryProperties(comm, &props));
  CHECK(props.rank == gRank && props.nRanks == 4 && !props.deviceApiSupport && !props.multimemSupport &&
            props.hostRmaSupport && props.ginType == NCCL_GIN_TYPE_NONE && props.nLsaTeams == 1,
        "properties: rank %d nRanks %d device %d multimem %d hostRma %d lsaTeams %d", props.rank,
        props.nRanks, props.deviceApiSupport, props.multimemSupport, props.hostRmaSupport, props.nLsaTeams);
  ncclDevCommRequirements_t reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  ncclDevComm_t dev;
  REFUSED(ncclDevCommCreate(comm, &reqs, &dev), ncclInvalidUsage, "ncclDevCommCreate: NCCL's device API");
  REFUSED(ncclDevCommDestroy(comm, &dev), ncclInvalidUsage, "ncclDevCommDestroy");
  ncclLsaBarrierHandle_t bar;
  ncclDevResourceRequirements_t res;
  REFUSED(ncclLsaBarrierCreateRequirement(ncclTeamWorld(comm), 1, &bar, &res), ncclInvalidUsage,
          "ncclLsaBarrierCreateRequirement");
  ncclGinBarrierHandle_t gin;
  REFUSED(ncclGinBarrierCreateRequirement(comm, ncclTeamWorld(comm), 1, &gin, &res), ncclInvalidUsage,
          "ncclGinBarrierCreateRequirement: NCCL's device API");
  ncclLLA2AHandle_t a2a;
  REFUSED(ncclLLA2ACreateRequirement(1, 1, &a2a, &res), ncclInvalidUsage, "ncclLLA2ACreateRequirement");
  CHECK(ncclLLA2ACalcSlots(1024, 8) == 0 && has(lastError(), "ncclLLA2ACalcSlots"), "ncclLLA2ACalcSlots: %s",
        lastError().c_str());
  void* mm = nullptr;
  REFUSED(ncclGetMultimemDevicePointer(nullptr, 0, ncclMultimemHandle_t{}, &mm), ncclInvalidUsage,
          "multimem");
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  REFUSED(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "ncclGroupSimulateEnd is not supported");
  const ncclTeam_t world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm), rail = ncclTeamRail(comm);
  CHECK(world.nRanks == 4 && world.rank == gRank && world.stride == 1, "world team");
  CHECK(lsa.nRanks == 4 && lsa.rank == gRank && lsa.stride == 1, "LSA team");
  CHECK(rail.nRanks == 1 && rail.rank == 0 && rail.stride == 4, "rail team");
  CHECK(ncclTeamRankToWorld(comm, lsa, 3) == 3 && ncclTeamRankToLsa(comm, world, 2) == 2, "team ranks");
}

// Rank 0 revokes a copy of the communicator: its pending and later calls fail on every rank; all
// revoke, and a split of the revoked communicator works.
void revoke(ncclComm_t comm4) {
  ncclComm_t r = nullptr;
  NCCL_OK(ncclCommSplit(comm4, 0, gRank, &r, nullptr));
  REFUSED(ncclCommRevoke(r, 1), ncclInvalidArgument, "NCCL_REVOKE_DEFAULT");
  if (gRank == 0) NCCL_OK(ncclCommRevoke(r, NCCL_REVOKE_DEFAULT));
  int64_t one = 1, out = 0;
  const ncclResult_t res = ncclAllReduce(&one, &out, 1, ncclInt64, ncclSum, r, nullptr);
  CHECK(res == ncclRemoteError && has(lastError(), "aborted"), "after revoke: %d %s", static_cast<int>(res),
        lastError().c_str());
  NCCL_OK(ncclCommRevoke(r, NCCL_REVOKE_DEFAULT));
  ncclResult_t async = ncclInternalError;
  NCCL_OK(ncclCommGetAsyncError(r, &async));
  CHECK(async == ncclSuccess, "revoked communicator is quiescent: %d", static_cast<int>(async));
  REFUSED(ncclCommFinalize(r), ncclInvalidUsage, "revoked");
  ncclComm_t again = nullptr;
  NCCL_OK(ncclCommSplit(r, gRank % 2, gRank, &again, nullptr));
  CHECK(sumOfRanks(again, gRank) == (gRank % 2 == 0 ? 2 : 4), "split of a revoked communicator");
  NCCL_OK(ncclCommDestroy(again));
  NCCL_OK(ncclCommDestroy(r));
  REFUSED(ncclCommDestroy(r), ncclInvalidUsage, "already destroyed");
}

void suspendResume(ncclComm_t comm) {
  std::vector<float> big(1 << 20, 1.0f);  // 4 MiB: the staging areas are written
  NCCL_OK(ncclAllReduce(big.data(), big.data(), big.size(), ncclFloat32, ncclSum, comm, nullptr));
  uint64_t held = 0, suspended = 9, total = 0, persist = 9;
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspend, &held));
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &suspended));
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &total));
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemPersist, &persist));
  const size_t before = shmResidentBytes();
  CHECK(held > 0 && suspended == 0 && total == held && persist == 0 && before > 0,
        "before suspend: held %llu total %llu shm resident %zu", static_cast<unsigned long long>(held),
        static_cast<unsigned long long>(total), before);
  REFUSED(ncclCommResume(comm), ncclInvalidUsage, "not suspended");
  REFUSED(ncclCommSuspend(comm, 4), ncclInvalidArgument, "unknown flags");
  NCCL_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  const size_t after = shmResidentBytes();
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspend, &held));
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &suspended));
  CHECK(after == 0 && held == 0 && suspended == 1, "suspended: shm resident %zu, held %llu, suspended %llu",
        after, static_cast<unsigned long long>(held), static_cast<unsigned long long>(suspended));
  std::printf("rank %d: suspend: resident shared memory %zu -> %zu bytes; communicator held %llu bytes\n",
              gRank, before, after, static_cast<unsigned long long>(total));
  float x = 1;
  REFUSED(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidUsage, "is suspended");
  int count = 0;
  NCCL_OK(ncclCommCount(comm, &count));
  CHECK(count == 4, "count while suspended");
  NCCL_OK(ncclCommResume(comm));
  NCCL_OK(ncclAllReduce(big.data(), big.data(), big.size(), ncclFloat32, ncclSum, comm, nullptr));
  CHECK(big[0] == 16.0f && big.back() == 16.0f, "allreduce after resume: %g", static_cast<double>(big[0]));
  NCCL_OK(ncclCommMemStats(comm, ncclStatGpuMemSuspend, &held));
  CHECK(held > 0 && shmResidentBytes() > 0, "resumed: held %llu", static_cast<unsigned long long>(held));
}

// Rank 3 dies; the others see it in a wait for its signal and in a collective, then shrink without
// it (NCCL_SHRINK_ABORT: the error-recovery form).
void shrinkAfterKill(ncclComm_t comm) {
  void* buf = nullptr;
  NCCL_OK(ncclMemAlloc(&buf, 4096));
  ncclWindow_t win = nullptr;
  NCCL_OK(ncclCommWindowRegister(comm, buf, 4096, &win, 0));
  int64_t one = 1, out = 0;
  NCCL_OK(ncclAllReduce(&one, &out, 1, ncclInt64, ncclSum, comm, nullptr));
  if (gRank == 3) raise(SIGKILL);
  ncclWaitSignalDesc_t fromDead{1, 3, 0, 0};
  const auto t0 = std::chrono::steady_clock::now();
  ncclResult_t r = ncclWaitSignal(1, &fromDead, comm, nullptr);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  CHECK(r == ncclRemoteError && has(lastError(), "rank 3 (pid") && has(lastError(), "died") && ms < 5000,
        "wait for a dead rank's signal: %d after %lld ms: %s", static_cast<int>(r),
        static_cast<long long>(ms), lastError().c_str());
  r = ncclAllReduce(&one, &out, 1, ncclInt64, ncclSum, comm, nullptr);
  CHECK(r == ncclRemoteError && has(lastError(), "rank 3"), "allreduce after the kill: %d %s",
        static_cast<int>(r), lastError().c_str());
  int exclude = 3;
  ncclComm_t comm3 = nullptr;
  NCCL_OK(ncclCommShrink(comm, &exclude, 1, &comm3, nullptr, NCCL_SHRINK_ABORT));
  int rank = -1, count = 0;
  NCCL_OK(ncclCommUserRank(comm3, &rank));
  NCCL_OK(ncclCommCount(comm3, &count));
  CHECK(rank == gRank && count == 3 && sumOfRanks(comm3, gRank + 1) == 6, "shrunk: rank %d of %d", rank,
        count);
  NCCL_OK(ncclCommDestroy(comm3));
  NCCL_OK(ncclCommDestroy(comm));  // frees the window too
  NCCL_OK(ncclMemFree(buf));
}

int rankMain(int rank, Mailbox* box) {
  gRank = rank;
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  CHECK(version == NCCL_VERSION_CODE && version >= 23000, "version %d", version);
  if (rank == 0) {
    for (auto& id : box->ids) NCCL_OK(ncclGetUniqueId(&id));
    box->idsReady.store(1);
  }
  while (!box->idsReady.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ncclComm_t comm2 = rank < 2 ? scalableInit(box->ids) : nullptr;
  ncclComm_t comm4 = grow(comm2, box);
  if (comm2) NCCL_OK(ncclCommDestroy(comm2));
  windows(comm4);
  deviceApi(comm4);
  suspendResume(comm4);
  revoke(comm4);
  shrinkAfterKill(comm4);
  std::printf("rank %d: %s\n", gRank, gFailures ? "FAILED" : "every NCCL 2.30 call checked");
  std::fflush(stdout);
  return gFailures ? 1 : 0;
}

int runRanks() {
  auto* box = static_cast<Mailbox*>(
      mmap(nullptr, sizeof(Mailbox), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (box == MAP_FAILED) return 2;
  new (box) Mailbox{};
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) {
    pid_t pid = fork();
    if (pid == 0) std::_Exit(rankMain(r, box));
    pids.push_back(pid);
  }
  int bad = 0;
  for (int r = 0; r < 4; ++r) {
    int status = 0;
    waitpid(pids[static_cast<size_t>(r)], &status, 0);
    const bool expected = r == 3 ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
                                 : WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!expected) {
      std::fprintf(stderr, "rank %d ended with status %#x\n", r, status);
      ++bad;
    }
  }
  std::printf("%s\n", bad ? "FAILED" : "ok: 4 ranks, every NCCL 2.30 call checked");
  return bad ? 1 : 0;
}

// The test's environment: NCCL_DEBUG=INFO NCCL_ALGO=Tree NCCL_BUFFSIZE=2097152 NCCL_PROTO=Simple
// NCCL_SOCKET_IFNAME=eth NCCL_IB_HCA==mlx5_2:2 NCCL_P2P_DISABLE=1 CHORUS_SOCKET_IFNAME=lo.
int params() {
  auto get = [](const char* key) {
    const char* v = nullptr;
    int len = -1;
    NCCL_OK(ncclParamGetParameter(key, &v, &len));
    CHECK(len == static_cast<int>(std::strlen(v)), "%s: length %d", key, len);
    return std::string(v);
  };
  CHECK(get("NCCL_DEBUG") == "INFO", "NCCL_DEBUG: %s", get("NCCL_DEBUG").c_str());
  CHECK(get("NCCL_ALGO") == "allreduce:tree", "NCCL_ALGO: %s", get("NCCL_ALGO").c_str());
  CHECK(get("NCCL_BUFFSIZE") == "2097152", "NCCL_BUFFSIZE: %s", get("NCCL_BUFFSIZE").c_str());
  CHECK(get("CHORUS_SOCKET_BUFFER_BYTES") == "2097152", "both of NCCL_BUFFSIZE's targets");
  CHECK(get("NCCL_PROTO") == "0", "NCCL_PROTO=Simple turns LL off: %s", get("NCCL_PROTO").c_str());
  CHECK(get("NCCL_SOCKET_IFNAME") == "lo", "CHORUS_SOCKET_IFNAME wins: %s",
        get("NCCL_SOCKET_IFNAME").c_str());
  CHECK(get("NCCL_IB_HCA") == "mlx5_2" && get("CHORUS_IB_PORT") == "2", "NCCL_IB_HCA: %s port %s",
        get("NCCL_IB_HCA").c_str(), get("CHORUS_IB_PORT").c_str());
  CHECK(get("NCCL_P2P_DISABLE") == "0", "NCCL_P2P_DISABLE=1 is CHORUS_CUDA_IPC=0");
  CHECK(get("NCCL_NET").empty(), "unset stays the default: '%s'", get("NCCL_NET").c_str());
  ncclParamHandle_t h = nullptr;
  NCCL_OK(ncclParamBind(&h, "NCCL_BUFFSIZE"));
  int64_t i64 = 0;
  uint32_t u32 = 0;
  int8_t i8 = 0;
  NCCL_OK(ncclParamGetI64(h, &i64));
  NCCL_OK(ncclParamGetU32(h, &u32));
  CHECK(i64 == 2097152 && u32 == 2097152u, "typed reads");
  REFUSED(ncclParamGetI8(h, &i8), ncclInvalidArgument, "not an integer of this width");
  const char* s = nullptr;
  NCCL_OK(ncclParamGetStr(h, &s));
  CHECK(std::string(s) == "2097152", "GetStr");
  char raw[16];
  int len = 0;
  NCCL_OK(ncclParamGet(h, raw, sizeof raw, &len));
  CHECK(len == 7 && std::memcmp(raw, "2097152", 7) == 0, "Get");
  REFUSED(ncclParamGet(h, raw, 3, &len), ncclInvalidArgument, "needs 7 bytes");
  ncclParamHandle_t debug = nullptr;
  NCCL_OK(ncclParamBind(&debug, "NCCL_DEBUG"));
  REFUSED(ncclParamGetI32(debug, reinterpret_cast<int32_t*>(&u32)), ncclInvalidArgument, "not an integer");
  REFUSED(ncclParamBind(&h, "NCCL_NO_SUCH_THING"), ncclInvalidArgument, "is not a parameter");
  NCCL_OK(ncclParamBind(&h, "CHORUS_TIMEOUT"));
  const char** keys = nullptr;
  int n = 0;
  NCCL_OK(ncclParamGetAllParameterKeys(&keys, &n));
  bool sawDebug = false, sawAlgo = false;
  for (int i = 0; i < n; ++i) {
    sawDebug = sawDebug || std::string(keys[i]) == "NCCL_DEBUG";
    sawAlgo = sawAlgo || std::string(keys[i]) == "NCCL_ALGO";
  }
  CHECK(n >= 10 && sawDebug && sawAlgo, "%d keys", n);
  // ncclParamDumpAll writes to stderr: caught in a file.
  char path[] = "/tmp/nccl_param_dump_XXXXXX";
  const int fd = mkstemp(path);
  const int saved = dup(2);
  std::fflush(stderr);
  dup2(fd, 2);
  ncclParamDumpAll();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::ifstream dumped(path);
  std::stringstream text;
  text << dumped.rdbuf();
  std::remove(path);
  CHECK(has(text.str(), "NCCL_DEBUG=INFO (CHORUS_DEBUG)") && has(text.str(), "NCCL_BUFFSIZE=2097152"),
        "ncclParamDumpAll: %s", text.str().c_str());
  std::printf("%s\n", gFailures ? "FAILED" : "ok: NCCL variables mapped and read back");
  return gFailures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("CUDA_VISIBLE_DEVICES", "", 1);  // host ranks, also on a machine with a GPU
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "ranks") return runRanks();
  if (mode == "params") return params();
  std::fprintf(stderr, "usage: %s ranks|params\n", argv[0]);
  return 2;
}
