// libnccl.so.2 from Chorus: NCCL's API (2.30, the nccl.h of the NCCL wheel PyTorch depends on; or
// the 2.28 of CUDA's nccl.h) over Chorus's C API. This file: creation, queries and the shared
// helpers of shim.hpp; nccl_collectives.cpp: collectives, point to point and groups;
// nccl_elastic.cpp: grow, suspend, revoke and the other 2.30 calls; nccl_windows.cpp: windows,
// one-sided calls and the device API; nccl_env.cpp: NCCL's variables and ncclParam*.
//
// Programs and frameworks that load libnccl.so.2 run on Chorus unchanged. As an extension, host
// buffers with a NULL stream work (real NCCL rejects them), so the library is usable without a GPU.
// Device buffers and streams go to Chorus's device path (docs/gpu.md; stream 0 with device buffers
// as the per-thread default stream), except for gather and scatter, which refuse them, as do the few
// functions listed in docs/frameworks.md.
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>
#include <vector>

#include "chorus/chorus.h"
#include "frameworks/nccl/shim.hpp"

using shim::fromChorus;
using shim::refuse;

namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(chorusUniqueId), "unique ids must have the same size");
static_assert(static_cast<int>(ncclInProgress) == static_cast<int>(chorusInProgress),
              "result codes 0..7 agree");
static_assert(static_cast<int>(ncclBfloat16) == static_cast<int>(chorusBfloat16), "types 0..9 agree");
static_assert(static_cast<int>(ncclAvg) == static_cast<int>(chorusAvg), "ops 0..4 agree");

// The shim's own last error (a call it refused itself); chorusGetLastError holds Chorus's.
thread_local std::string tShimError;
thread_local bool tShimErrorIsLatest = false;

// Every handle ever made (they are never freed: a destroyed one stays recognisable).
std::mutex gCommsMu;
std::unordered_set<const ncclComm*>& comms() {
  static auto* set = new std::unordered_set<const ncclComm*>();
  return *set;
}

// cudaPointerGetAttributes from libcudart, if it loads: a device pointer with a NULL stream would
// otherwise be read by the CPU. Without CUDA (or without a GPU) every pointer is host memory.
using PointerAttrFn = cudaError_t (*)(cudaPointerAttributes*, const void*);
std::atomic<PointerAttrFn> gPointerAttr{nullptr};
// cudaMalloc / cudaFree, for ncclMemAlloc where there is a GPU (set with gPointerAttr).
using MallocFn = cudaError_t (*)(void**, size_t);
using FreeFn = cudaError_t (*)(void*);
std::atomic<MallocFn> gCudaMalloc{nullptr};
std::atomic<FreeFn> gCudaFree{nullptr};
std::once_flag gCudaOnce;

void loadCuda() {
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
      auto fn = reinterpret_cast<PointerAttrFn>(dlsym(h, "cudaPointerGetAttributes"));
      int (*count)(int*) = reinterpret_cast<int (*)(int*)>(dlsym(h, "cudaGetDeviceCount"));
      int devices = 0;
      // No usable GPU: nothing can be a device pointer, so skip the per-call check.
      if (fn && count && count(&devices) == 0 && devices > 0) {
        gCudaMalloc.store(reinterpret_cast<MallocFn>(dlsym(h, "cudaMalloc")));
        gCudaFree.store(reinterpret_cast<FreeFn>(dlsym(h, "cudaFree")));
        gPointerAttr.store(fn);
      }
      return;
    }
  }
}

}  // namespace

namespace shim {

ncclResult_t refuse(ncclResult_t code, const std::string& message) {
  tShimError = message;
  tShimErrorIsLatest = true;
  return code;
}

ncclResult_t fromChorus(chorusResult_t r) {
  if (r != chorusSuccess) tShimErrorIsLatest = false;  // Chorus's message is the latest now
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 30, 0)
  // 2.28 has no ncclTimeout: a wait past its deadline is reported as a remote error.
  if (r == chorusTimeout) return ncclRemoteError;
#else
  static_assert(static_cast<int>(ncclTimeout) == static_cast<int>(chorusTimeout), "result codes 0..8 agree");
#endif
  if (static_cast<int>(r) < 0 || static_cast<int>(r) >= static_cast<int>(ncclNumResults))
    return ncclInternalError;
  return static_cast<ncclResult_t>(r);
}

ncclResult_t fromException() noexcept {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return refuse(ncclSystemError, "out of memory");
  } catch (...) {
    return refuse(ncclInternalError, "internal error in Chorus's libnccl");
  }
}

ncclComm_t wrap(chorusComm_t c) {
  auto* comm = new ncclComm;
  comm->c = c;
  chorusCommUserRank(c, &comm->rank);
  chorusCommCount(c, &comm->nranks);
  std::lock_guard lk(gCommsMu);
  comms().insert(comm);
  return comm;
}

bool known(const ncclComm* comm) {
  std::lock_guard lk(gCommsMu);
  return comms().count(comm) > 0;
}

bool resolve(const ncclComm* comm, const char* call, chorusComm_t* out, ncclResult_t* err) {
  if (comm == nullptr) {
    *err = refuse(ncclInvalidArgument, std::string(call) + ": comm is NULL");
    return false;
  }
  if (!known(comm)) {
    *err = refuse(ncclInvalidArgument, std::string(call) + ": not a communicator made by Chorus's libnccl");
    return false;
  }
  if (comm->destroyed) {
    *err =
        refuse(ncclInvalidUsage, std::string(call) + ": the communicator was already destroyed or aborted");
    return false;
  }
  if (comm->suspended) {
    *err =
        refuse(ncclInvalidUsage, std::string(call) + ": rank " + std::to_string(comm->rank) +
                                     ": the communicator is suspended (ncclCommSuspend); ncclCommResume it "
                                     "first");
    return false;
  }
  *out = comm->c;
  return true;
}

bool typeOk(const char* call, const ncclDataType_t& t, ncclResult_t* out) {
  const int value = static_cast<int>(rawValue(t));
  if (value >= 0 && value < static_cast<int>(chorusNumTypes)) return true;
  if (value == ncclFloat8e4m3 || value == ncclFloat8e5m2)
    *out = refuse(ncclInvalidArgument, std::string(call) + ": the float8 types are not supported by Chorus");
  else
    *out = refuse(ncclInvalidArgument, std::string(call) + ": unknown data type " + std::to_string(value));
  return false;
}

size_t typeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

bool isDeviceMemory(const void* p) {
  if (p == nullptr) return false;
  std::call_once(gCudaOnce, loadCuda);
  PointerAttrFn fn = gPointerAttr.load();
  if (!fn) return false;
  cudaPointerAttributes a{};
  if (fn(&a, p) != cudaSuccess) return false;
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

}  // namespace shim

using shim::isDeviceMemory;

namespace {

ncclResult_t unsupported(const char* call) {
  return refuse(ncclInvalidUsage,
                std::string(call) + " is not supported by Chorus's libnccl yet (see docs/frameworks.md)");
}

}  // namespace

SHIM_EXPORT ncclResult_t ncclGetVersion(int* version) {
  START
  if (!version) return refuse(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclGetVersion)

SHIM_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  switch (shim::rawValue(result)) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error (see ncclGetLastError)";
    case ncclInternalError:
      return "internal error - please report this issue to the Chorus developers";
    case ncclInvalidArgument:
      return "invalid argument (see ncclGetLastError)";
    case ncclInvalidUsage:
      return "invalid usage (see ncclGetLastError)";
    case ncclRemoteError:
      return "remote process exited, failed or did not arrive in time (see ncclGetLastError)";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}
SHIM_ALIAS(ncclGetErrorString)

SHIM_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  if (tShimErrorIsLatest) return tShimError.c_str();
  return chorusGetLastError(comm && shim::known(comm) ? comm->c : nullptr);
}
SHIM_ALIAS(ncclGetLastError)

// Deprecated in nccl.h; Chorus reads its environment once per process, so there is nothing to reload.
// (2.30's nccl.h declares it only under NCCL_OS_LINUX, else makes it a macro; NVIDIA's library
// exports it either way.)
#ifdef ncclResetDebugInit
#undef ncclResetDebugInit
#undef pncclResetDebugInit
#endif
SHIM_EXPORT void ncclResetDebugInit() {}
SHIM_EXPORT void pncclResetDebugInit() __attribute__((alias("ncclResetDebugInit")));

// Device memory where a GPU is usable (NCCL's ncclMemAlloc is GPU memory, and callers such as
// torch's NCCL memory pool hand it to kernels); host memory the other ranks of the host map in
// place (chorusMemAlloc, which windows need) where there is none.
SHIM_EXPORT ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  START
  if (!ptr) return refuse(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  std::call_once(gCudaOnce, loadCuda);
  if (MallocFn cudaAlloc = gCudaMalloc.load(); cudaAlloc && gPointerAttr.load()) {
    *ptr = nullptr;
    if (cudaAlloc(ptr, size) != cudaSuccess)
      return refuse(ncclUnhandledCudaError,
                    "ncclMemAlloc: cudaMalloc of " + std::to_string(size) + " bytes failed");
    return ncclSuccess;
  }
  return fromChorus(chorusMemAlloc(ptr, size));
  END
}
SHIM_ALIAS(ncclMemAlloc)

SHIM_EXPORT ncclResult_t ncclMemFree(void* ptr) {
  START
  if (ptr && isDeviceMemory(ptr)) {
    FreeFn cudaRelease = gCudaFree.load();
    if (!cudaRelease || cudaRelease(ptr) != cudaSuccess)
      return refuse(ncclUnhandledCudaError, "ncclMemFree: cudaFree failed");
    return ncclSuccess;
  }
  return fromChorus(chorusMemFree(ptr));
  END
}
SHIM_ALIAS(ncclMemFree)

SHIM_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  START
  if (!uniqueId) return refuse(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  chorusUniqueId id;
  const chorusResult_t r = chorusGetUniqueId(&id);
  if (r == chorusSuccess) std::memcpy(uniqueId, &id, sizeof id);
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclGetUniqueId)

SHIM_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  START
  if (!comm) return refuse(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *comm = nullptr;
  if (shim::groupDepth() > 0)
    return refuse(
        ncclInvalidUsage,
        "ncclCommInitRank inside ncclGroupStart/End: Chorus joins each communicator on its own; call it "
        "outside a group, one thread per rank, or use ncclCommInitAll");
  chorusUniqueId id;
  std::memcpy(&id, &commId, sizeof id);
  chorusComm_t c = nullptr;
  const chorusResult_t r = chorusCommInitRank(&c, nranks, id, rank);
  if (r == chorusSuccess) *comm = shim::wrap(c);
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclCommInitRank)

bool shim::configOk(const char* call, const ncclConfig_t* config, ncclResult_t* out) {
  if (config == nullptr) return true;
  // 0xcafebeef: NCCL_API_MAGIC (2.28's nccl.h does not name it).
  if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int)) {
    *out = refuse(ncclInvalidArgument,
                  std::string(call) + ": the config was not set from NCCL_CONFIG_INITIALIZER");
    return false;
  }
  return true;
}

// Chorus initialises blocking whatever config->blocking says; a non-blocking caller polls
// ncclCommGetAsyncError, which then reports ncclSuccess at once.
SHIM_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                ncclConfig_t* config) {
  START
  ncclResult_t out;
  if (!shim::configOk("ncclCommInitRankConfig", config, &out)) return out;
  return ncclCommInitRank(comm, nranks, commId, rank);
  END
}
SHIM_ALIAS(ncclCommInitRankConfig)

SHIM_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  START
  if (!comm) return refuse(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
  // NCCL's NULL devlist means devices 0..ndev-1: bound now where there is a GPU, so that one thread
  // can then drive every rank in a group. Without a GPU, host buffers.
  std::vector<int> devices;
  std::call_once(gCudaOnce, loadCuda);
  if (!devlist && ndev > 0 && gPointerAttr.load() != nullptr) {
    for (int i = 0; i < ndev; ++i) devices.push_back(i);
    devlist = devices.data();
  }
  std::vector<chorusComm_t> made(static_cast<size_t>(std::max(ndev, 0)));
  const chorusResult_t r = chorusCommInitAll(made.data(), ndev, devlist);
  if (r == chorusSuccess)
    for (int i = 0; i < ndev; ++i) comm[i] = shim::wrap(made[static_cast<size_t>(i)]);
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclCommInitAll)

// Chorus's destroy waits for pending operations, so finalize has nothing to do first.
SHIM_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  START
  RESOLVE(comm, "ncclCommFinalize");
  if (comm->revoked)
    return refuse(ncclInvalidUsage, "ncclCommFinalize: rank " + std::to_string(comm->rank) +
                                        ": the communicator was revoked (ncclCommRevoke); destroy it, or "
                                        "shrink or split it first");
  int n;
  return fromChorus(chorusCommCount(cc, &n));
  END
}
SHIM_ALIAS(ncclCommFinalize)

// Destroy and abort free the Chorus communicator (a suspended one has none); the handle stays.
static ncclResult_t release(ncclComm_t comm, const char* call, bool abort) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  if (!shim::known(comm))
    return refuse(ncclInvalidArgument, std::string(call) + ": not a communicator made by Chorus's libnccl");
  if (comm->destroyed)
    return refuse(ncclInvalidUsage,
                  std::string(call) + ": the communicator was already destroyed or aborted");
  comm->destroyed = true;
  chorusComm_t c = comm->c;
  comm->c = nullptr;
  comm->windows = 0;
  if (c == nullptr) return ncclSuccess;
  return fromChorus(abort ? chorusCommAbort(c) : chorusCommDestroy(c));
}

SHIM_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  START
  return release(comm, "ncclCommDestroy", false);
  END
}
SHIM_ALIAS(ncclCommDestroy)

SHIM_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  START
  return release(comm, "ncclCommAbort", true);
  END
}
SHIM_ALIAS(ncclCommAbort)

// Chorus's shrink works on a broken or revoked communicator (it rendezvous through the store);
// split needs a working one, so a revoked communicator is first shrunk by nobody.
SHIM_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                       ncclConfig_t* config) {
  START
  ncclResult_t out;
  if (!shim::configOk("ncclCommSplit", config, &out)) return out;
  if (!newcomm) return refuse(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  *newcomm = nullptr;
  RESOLVE(comm, "ncclCommSplit");
  chorusComm_t parent = cc;
  chorusComm_t fresh = nullptr;
  if (comm->revoked) {
    const chorusResult_t r = chorusCommShrink(cc, nullptr, 0, &fresh);
    if (r != chorusSuccess) return fromChorus(r);
    parent = fresh;
  }
  chorusComm_t c = nullptr;
  const chorusResult_t r = chorusCommSplit(parent, color, key, &c);
  if (fresh) chorusCommDestroy(fresh);
  if (r == chorusSuccess && c != nullptr) *newcomm = shim::wrap(c);
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclCommSplit)

SHIM_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                        ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  START
  ncclResult_t out;
  if (!shim::configOk("ncclCommShrink", config, &out)) return out;
  if (!newcomm) return refuse(ncclInvalidArgument, "ncclCommShrink: newcomm is NULL");
  *newcomm = nullptr;
  if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
    return refuse(ncclInvalidArgument, "ncclCommShrink: unknown flags " + std::to_string(shrinkFlags));
  RESOLVE(comm, "ncclCommShrink");
  // NCCL_SHRINK_ABORT: stop the parent's pending operations first (the error-recovery form: they
  // may wait for the ranks being excluded). The parent stays revoked; it is destroyed as usual.
  if (shrinkFlags == NCCL_SHRINK_ABORT && !comm->revoked) {
    const chorusResult_t r = chorusCommRevoke(cc);
    if (r != chorusSuccess) return fromChorus(r);
    comm->revoked = true;
  }
  chorusComm_t c = nullptr;
  const chorusResult_t r = chorusCommShrink(cc, excludeRanksList, excludeRanksCount, &c);
  if (r == chorusSuccess) *newcomm = shim::wrap(c);
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclCommShrink)

// A revoked communicator is quiescent as soon as the revoke returns (Chorus's pending operations
// have failed by then): it reports ncclSuccess, as NCCL does once quiescent.
SHIM_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  START
  if (!asyncError) return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  if (comm && shim::known(comm) && comm->suspended && !comm->destroyed) {
    *asyncError = ncclSuccess;
    return ncclSuccess;
  }
  RESOLVE(comm, "ncclCommGetAsyncError");
  if (comm->revoked) {
    *asyncError = ncclSuccess;
    return ncclSuccess;
  }
  chorusResult_t e = chorusSuccess;
  const chorusResult_t r = chorusCommGetAsyncError(cc, &e);
  *asyncError = fromChorus(e);
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclCommGetAsyncError)

// Count and rank are the handle's, so they answer while suspended too.
SHIM_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  START
  if (!count) return refuse(ncclInvalidArgument, "ncclCommCount: count is NULL");
  if (comm && shim::known(comm) && comm->suspended && !comm->destroyed) {
    *count = comm->nranks;
    return ncclSuccess;
  }
  RESOLVE(comm, "ncclCommCount");
  return fromChorus(chorusCommCount(cc, count));
  END
}
SHIM_ALIAS(ncclCommCount)

// The device bound (or the calling thread's current one); -1 where no CUDA device is usable.
SHIM_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  START
  if (!device) return refuse(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  RESOLVE(comm, "ncclCommCuDevice");
  return fromChorus(chorusCommCuDevice(cc, device));
  END
}
SHIM_ALIAS(ncclCommCuDevice)

SHIM_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  START
  if (!rank) return refuse(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  if (comm && shim::known(comm) && comm->suspended && !comm->destroyed) {
    *rank = comm->rank;
    return ncclSuccess;
  }
  RESOLVE(comm, "ncclCommUserRank");
  return fromChorus(chorusCommUserRank(cc, rank));
  END
}
SHIM_ALIAS(ncclCommUserRank)

// Registration is an optimisation hint: host buffers need none, so registering succeeds with a
// handle that deregistration accepts.
SHIM_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  START
  if (!handle) return refuse(ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  RESOLVE(comm, "ncclCommRegister");
  ncclResult_t out;
  if (!shim::hostOnly("ncclCommRegister", nullptr, buff, nullptr, &out)) return out;
  (void)size;
  *handle = buff;
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclCommRegister)

SHIM_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void*) {
  START
  RESOLVE(comm, "ncclCommDeregister");
  (void)cc;
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclCommDeregister)

SHIM_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t,
                                                  ncclComm_t) {
  START
  return unsupported("ncclRedOpCreatePreMulSum");
  END
}
SHIM_ALIAS(ncclRedOpCreatePreMulSum)

SHIM_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t) {
  START
  return refuse(ncclInvalidArgument,
                "ncclRedOpDestroy: op " + std::to_string(static_cast<int>(op)) +
                    " was not made by ncclRedOpCreatePreMulSum (which Chorus does not support)");
  END
}
SHIM_ALIAS(ncclRedOpDestroy)

SHIM_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t*) {
  START
  return unsupported("ncclGroupSimulateEnd");
  END
}
SHIM_ALIAS(ncclGroupSimulateEnd)
