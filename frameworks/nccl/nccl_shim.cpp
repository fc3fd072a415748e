// libnccl.so.2 from Chorus: NCCL 2.28's API (the nccl.h installed with CUDA) over Chorus's C API.
//
// Programs and frameworks that load libnccl.so.2 run on Chorus unchanged. As an extension, host
// buffers with a NULL stream work (real NCCL rejects them), so the library is usable without a GPU.
// Device buffers and streams go to Chorus's device path (docs/gpu.md; stream 0 with device buffers
// as the per-thread default stream), except for gather and scatter, which refuse them, as do the few
// functions listed in docs/frameworks.md.
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "chorus/chorus.h"

namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(chorusUniqueId), "unique ids must have the same size");
static_assert(static_cast<int>(ncclInProgress) == static_cast<int>(chorusInProgress),
              "result codes 0..7 agree");
static_assert(static_cast<int>(ncclBfloat16) == static_cast<int>(chorusBfloat16), "types 0..9 agree");
static_assert(static_cast<int>(ncclAvg) == static_cast<int>(chorusAvg), "ops 0..4 agree");

// The shim's own last error (a call it refused itself); chorusGetLastError holds Chorus's.
thread_local std::string tShimError;
thread_local bool tShimErrorIsLatest = false;

ncclResult_t refuse(ncclResult_t code, const std::string& message) {
  tShimError = message;
  tShimErrorIsLatest = true;
  return code;
}

// Chorus's codes are NCCL's for 0..7; chorusTimeout (a wait passed its deadline, the message naming
// the ranks that did not arrive) has no NCCL counterpart and is reported as a remote error.
ncclResult_t fromChorus(chorusResult_t r) {
  if (r != chorusSuccess) tShimErrorIsLatest = false;  // Chorus's message is the latest now
  if (r == chorusTimeout) return ncclRemoteError;
  if (static_cast<int>(r) < 0 || static_cast<int>(r) >= static_cast<int>(ncclNumResults))
    return ncclInternalError;
  return static_cast<ncclResult_t>(r);
}

// What an exception inside an exported function becomes: nothing may unwind into a C caller.
ncclResult_t fromException() noexcept {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return ncclSystemError;
  } catch (...) {
    return ncclInternalError;
  }
}

// The caller's ncclGroupStart/End nesting on this thread, and the local copies that gather and
// scatter must make once the caller's outermost group has run (their sources may be filled by
// earlier calls of the group).
thread_local int tGroupDepth = 0;
thread_local std::vector<std::function<void()>> tAfterGroup;

void afterGroup(std::function<void()> fn) {
  if (tGroupDepth > 0)
    tAfterGroup.push_back(std::move(fn));
  else
    fn();
}

chorusComm_t toChorus(ncclComm_t c) { return reinterpret_cast<chorusComm_t>(c); }
ncclComm_t toNccl(chorusComm_t c) { return reinterpret_cast<ncclComm_t>(c); }

// cudaPointerGetAttributes from libcudart, if it loads: a device pointer with a NULL stream would
// otherwise be read by the CPU. Without CUDA (or without a GPU) every pointer is host memory.
using PointerAttrFn = cudaError_t (*)(cudaPointerAttributes*, const void*);
std::atomic<PointerAttrFn> gPointerAttr{nullptr};
std::once_flag gCudaOnce;

void loadCuda() {
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
      auto fn = reinterpret_cast<PointerAttrFn>(dlsym(h, "cudaPointerGetAttributes"));
      int (*count)(int*) = reinterpret_cast<int (*)(int*)>(dlsym(h, "cudaGetDeviceCount"));
      int devices = 0;
      // No usable GPU: nothing can be a device pointer, so skip the per-call check.
      if (fn && count && count(&devices) == 0 && devices > 0) gPointerAttr.store(fn);
      return;
    }
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

// Gather and scatter (grouped sends and receives, and a copy of the root's own block) take host
// buffers with a NULL stream only.
bool hostOnly(const char* call, cudaStream_t stream, const void* a, const void* b, ncclResult_t* out) {
  std::string why;
  if (stream != nullptr)
    why =
        "a CUDA stream was given; this Chorus libnccl runs gather and scatter on host buffers with a NULL "
        "stream only";
  else if (isDeviceMemory(a) || isDeviceMemory(b))
    why = "a device buffer was given; this Chorus libnccl runs gather and scatter on host buffers only";
  if (why.empty()) return true;
  *out = refuse(ncclInvalidUsage, std::string(call) + ": " + why);
  return false;
}

bool typeOk(const char* call, ncclDataType_t t, ncclResult_t* out) {
  if (static_cast<int>(t) >= 0 && static_cast<int>(t) < static_cast<int>(chorusNumTypes)) return true;
  if (t == ncclFloat8e4m3 || t == ncclFloat8e5m2)
    *out = refuse(ncclInvalidArgument, std::string(call) + ": the float8 types are not supported by Chorus");
  else
    *out = refuse(ncclInvalidArgument,
                  std::string(call) + ": unknown data type " + std::to_string(static_cast<int>(t)));
  return false;
}

bool opOk(const char* call, ncclRedOp_t op, ncclResult_t* out) {
  if (static_cast<int>(op) >= 0 && static_cast<int>(op) < static_cast<int>(ncclNumOps)) return true;
  *out = refuse(ncclInvalidArgument, std::string(call) + ": reduction op " +
                                         std::to_string(static_cast<int>(op)) +
                                         " is not a built-in op (ncclRedOpCreatePreMulSum is not supported)");
  return false;
}

ncclResult_t unsupported(const char* call) {
  return refuse(ncclInvalidUsage,
                std::string(call) + " is not supported by Chorus's libnccl yet (see docs/frameworks.md)");
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

bool configOk(const char* call, const ncclConfig_t* config, ncclResult_t* out) {
  if (config == nullptr) return true;
  if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int)) {
    *out = refuse(ncclInvalidArgument,
                  std::string(call) + ": the config was not set from NCCL_CONFIG_INITIALIZER");
    return false;
  }
  return true;
}

}  // namespace

#define SHIM_EXPORT extern "C" __attribute__((visibility("default")))
// pnccl* are NCCL's profiling aliases of the same functions.
#define SHIM_ALIAS(name) SHIM_EXPORT decltype(name) p##name __attribute__((alias(#name)));

#define START try {
#define END                 \
  }                         \
  catch (...) {             \
    return fromException(); \
  }

SHIM_EXPORT ncclResult_t ncclGetVersion(int* version) {
  START
  if (!version) return refuse(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclGetVersion)

SHIM_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
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
  return chorusGetLastError(toChorus(comm));
}
SHIM_ALIAS(ncclGetLastError)

// Deprecated in nccl.h; Chorus reads its environment once per process, so there is nothing to reload.
SHIM_EXPORT void ncclResetDebugInit() {}
SHIM_EXPORT void pncclResetDebugInit() __attribute__((alias("ncclResetDebugInit")));

SHIM_EXPORT ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  START
  return fromChorus(chorusMemAlloc(ptr, size));
  END
}
SHIM_ALIAS(ncclMemAlloc)

SHIM_EXPORT ncclResult_t ncclMemFree(void* ptr) {
  START
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
  if (tGroupDepth > 0)
    return refuse(
        ncclInvalidUsage,
        "ncclCommInitRank inside ncclGroupStart/End: Chorus joins each communicator on its own; call it "
        "outside a group, one thread per rank, or use ncclCommInitAll");
  chorusUniqueId id;
  std::memcpy(&id, &commId, sizeof id);
  chorusComm_t c = nullptr;
  const chorusResult_t r = chorusCommInitRank(&c, nranks, id, rank);
  *comm = r == chorusSuccess ? toNccl(c) : nullptr;
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclCommInitRank)

// Chorus initialises blocking whatever config->blocking says; a non-blocking caller polls
// ncclCommGetAsyncError, which then reports ncclSuccess at once.
SHIM_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                ncclConfig_t* config) {
  START
  ncclResult_t out;
  if (!configOk("ncclCommInitRankConfig", config, &out)) return out;
  return ncclCommInitRank(comm, nranks, commId, rank);
  END
}
SHIM_ALIAS(ncclCommInitRankConfig)

SHIM_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                  ncclUniqueId* commIds, ncclConfig_t* config) {
  START
  ncclResult_t out;
  if (!configOk("ncclCommInitRankScalable", config, &out)) return out;
  if (nId != 1 || commIds == nullptr)
    return refuse(
        ncclInvalidUsage,
        "ncclCommInitRankScalable: Chorus takes exactly one unique id (nId = 1), got " + std::to_string(nId));
  return ncclCommInitRank(newcomm, nranks, commIds[0], myrank);
  END
}
SHIM_ALIAS(ncclCommInitRankScalable)

SHIM_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  START
  if (!comm) return refuse(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
  static_assert(sizeof(ncclComm_t) == sizeof(chorusComm_t), "handles have the same size");
  // NCCL's NULL devlist means devices 0..ndev-1: bound now where there is a GPU, so that one thread
  // can then drive every rank in a group. Without a GPU, host buffers.
  std::vector<int> devices;
  std::call_once(gCudaOnce, loadCuda);
  if (!devlist && ndev > 0 && gPointerAttr.load() != nullptr) {
    for (int i = 0; i < ndev; ++i) devices.push_back(i);
    devlist = devices.data();
  }
  return fromChorus(chorusCommInitAll(reinterpret_cast<chorusComm_t*>(comm), ndev, devlist));
  END
}
SHIM_ALIAS(ncclCommInitAll)

// Chorus's destroy waits for pending operations, so finalize has nothing to do first.
SHIM_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  START
  int n;
  return fromChorus(chorusCommCount(toChorus(comm), &n));
  END
}
SHIM_ALIAS(ncclCommFinalize)

SHIM_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  START
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  return fromChorus(chorusCommDestroy(toChorus(comm)));
  END
}
SHIM_ALIAS(ncclCommDestroy)

SHIM_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  START
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  return fromChorus(chorusCommAbort(toChorus(comm)));
  END
}
SHIM_ALIAS(ncclCommAbort)

SHIM_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t, int) {
  START
  return unsupported("ncclCommRevoke");
  END
}
SHIM_ALIAS(ncclCommRevoke)

SHIM_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                       ncclConfig_t* config) {
  START
  ncclResult_t out;
  if (!configOk("ncclCommSplit", config, &out)) return out;
  if (!newcomm) return refuse(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  chorusComm_t c = nullptr;
  const chorusResult_t r = chorusCommSplit(toChorus(comm), color, key, &c);
  *newcomm = r == chorusSuccess ? toNccl(c) : nullptr;
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclCommSplit)

SHIM_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                        ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  START
  ncclResult_t out;
  if (!configOk("ncclCommShrink", config, &out)) return out;
  if (!newcomm) return refuse(ncclInvalidArgument, "ncclCommShrink: newcomm is NULL");
  // NCCL_SHRINK_ABORT first stops the parent's pending operations: Chorus's shrink works on a broken
  // communicator, so aborting first is not needed for it to complete.
  if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
    return refuse(ncclInvalidArgument, "ncclCommShrink: unknown flags " + std::to_string(shrinkFlags));
  chorusComm_t c = nullptr;
  const chorusResult_t r = chorusCommShrink(toChorus(comm), excludeRanksList, excludeRanksCount, &c);
  *newcomm = r == chorusSuccess ? toNccl(c) : nullptr;
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclCommShrink)

SHIM_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  START
  if (!asyncError) return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  chorusResult_t e = chorusSuccess;
  const chorusResult_t r = chorusCommGetAsyncError(toChorus(comm), &e);
  *asyncError = fromChorus(e);
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclCommGetAsyncError)

SHIM_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  START
  return fromChorus(chorusCommCount(toChorus(comm), count));
  END
}
SHIM_ALIAS(ncclCommCount)

// The device bound (or the calling thread's current one); -1 where no CUDA device is usable.
SHIM_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  START
  if (!device) return refuse(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  return fromChorus(chorusCommCuDevice(toChorus(comm), device));
  END
}
SHIM_ALIAS(ncclCommCuDevice)

SHIM_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  START
  return fromChorus(chorusCommUserRank(toChorus(comm), rank));
  END
}
SHIM_ALIAS(ncclCommUserRank)

// Registration is an optimisation hint: host buffers need none, so registering succeeds with a
// handle that deregistration accepts.
SHIM_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  START
  if (!handle) return refuse(ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  int n;
  const chorusResult_t r = chorusCommCount(toChorus(comm), &n);
  if (r != chorusSuccess) return fromChorus(r);
  ncclResult_t out;
  if (!hostOnly("ncclCommRegister", nullptr, buff, nullptr, &out)) return out;
  (void)size;
  *handle = buff;
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclCommRegister)

SHIM_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void*) {
  START
  int n;
  return fromChorus(chorusCommCount(toChorus(comm), &n));
  END
}
SHIM_ALIAS(ncclCommDeregister)

SHIM_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t, void*, size_t, ncclWindow_t*, int) {
  START
  return unsupported("ncclCommWindowRegister");
  END
}
SHIM_ALIAS(ncclCommWindowRegister)

SHIM_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t, ncclWindow_t) {
  START
  return unsupported("ncclCommWindowDeregister");
  END
}
SHIM_ALIAS(ncclCommWindowDeregister)

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

// ---- Collectives ----------------------------------------------------------------------------

#define CHECK_HOST(call, stream, a, b)                     \
  do {                                                     \
    ncclResult_t out_;                                     \
    if (!hostOnly(call, stream, a, b, &out_)) return out_; \
    if (!typeOk(call, datatype, &out_)) return out_;       \
  } while (0)
// Host buffers (NULL stream) or device buffers on a stream: Chorus takes both. NCCL's stream 0 with
// device buffers becomes the per-thread default stream (Chorus reads NULL as host buffers; the
// legacy stream would serialize ranks that are threads sharing a GPU).
#define CHECK_TYPE(call)                             \
  do {                                               \
    ncclResult_t out_;                               \
    if (!typeOk(call, datatype, &out_)) return out_; \
  } while (0)
cudaStream_t streamFor(cudaStream_t stream, const void* a, const void* b) {
  if (stream == nullptr && (isDeviceMemory(a) || isDeviceMemory(b))) return cudaStreamPerThread;
  return stream;
}
#define CHECK_OP(call)                       \
  do {                                       \
    ncclResult_t out_;                       \
    if (!opOk(call, op, &out_)) return out_; \
  } while (0)

#define CT(t) static_cast<chorusDataType_t>(t)
#define CO(o) static_cast<chorusRedOp_t>(o)

SHIM_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream) {
  START
  CHECK_TYPE("ncclAllReduce");
  CHECK_OP("ncclAllReduce");
  return fromChorus(chorusAllReduce(sendbuff, recvbuff, count, CT(datatype), CO(op), toChorus(comm),
                                    streamFor(stream, sendbuff, recvbuff)));
  END
}
SHIM_ALIAS(ncclAllReduce)

SHIM_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                           cudaStream_t stream) {
  START
  CHECK_TYPE("ncclReduceScatter");
  CHECK_OP("ncclReduceScatter");
  return fromChorus(chorusReduceScatter(sendbuff, recvbuff, recvcount, CT(datatype), CO(op), toChorus(comm),
                                        streamFor(stream, sendbuff, recvbuff)));
  END
}
SHIM_ALIAS(ncclReduceScatter)

SHIM_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  START
  CHECK_TYPE("ncclAllGather");
  return fromChorus(chorusAllGather(sendbuff, recvbuff, sendcount, CT(datatype), toChorus(comm),
                                    streamFor(stream, sendbuff, recvbuff)));
  END
}
SHIM_ALIAS(ncclAllGather)

SHIM_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  START
  CHECK_TYPE("ncclBroadcast");
  return fromChorus(chorusBroadcast(sendbuff, recvbuff, count, CT(datatype), root, toChorus(comm),
                                    streamFor(stream, sendbuff, recvbuff)));
  END
}
SHIM_ALIAS(ncclBroadcast)

SHIM_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                   ncclComm_t comm, cudaStream_t stream) {
  START
  CHECK_TYPE("ncclBcast");
  return fromChorus(chorusBroadcast(buff, buff, count, CT(datatype), root, toChorus(comm),
                                    streamFor(stream, buff, nullptr)));
  END
}
SHIM_ALIAS(ncclBcast)

SHIM_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                                    cudaStream_t stream) {
  START
  CHECK_TYPE("ncclReduce");
  CHECK_OP("ncclReduce");
  return fromChorus(chorusReduce(sendbuff, recvbuff, count, CT(datatype), CO(op), root, toChorus(comm),
                                 streamFor(stream, sendbuff, recvbuff)));
  END
}
SHIM_ALIAS(ncclReduce)

SHIM_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  START
  CHECK_TYPE("ncclAlltoAll");
  return fromChorus(chorusAllToAll(sendbuff, recvbuff, count, CT(datatype), toChorus(comm),
                                   streamFor(stream, sendbuff, recvbuff)));
  END
}
SHIM_ALIAS(ncclAlltoAll)

SHIM_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  START
  CHECK_TYPE("ncclSend");
  return fromChorus(
      chorusSend(sendbuff, count, CT(datatype), peer, toChorus(comm), streamFor(stream, sendbuff, nullptr)));
  END
}
SHIM_ALIAS(ncclSend)

SHIM_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  START
  CHECK_TYPE("ncclRecv");
  return fromChorus(
      chorusRecv(recvbuff, count, CT(datatype), peer, toChorus(comm), streamFor(stream, recvbuff, nullptr)));
  END
}
SHIM_ALIAS(ncclRecv)

SHIM_EXPORT ncclResult_t ncclGroupStart() {
  START
  const chorusResult_t r = chorusGroupStart();
  if (r == chorusSuccess) ++tGroupDepth;
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclGroupStart)

SHIM_EXPORT ncclResult_t ncclGroupEnd() {
  START
  if (tGroupDepth == 0) return refuse(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  const chorusResult_t r = chorusGroupEnd();
  if (--tGroupDepth == 0) {
    auto pending = std::move(tAfterGroup);
    tAfterGroup.clear();
    if (r == chorusSuccess)
      for (auto& fn : pending) fn();
  }
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclGroupEnd)

// Gather and scatter as NCCL 2.28 defines them: the root receives (sends) `count` elements per
// rank, in rank order; built from grouped sends and receives, the root's own block copied once the
// caller's outermost group has run. `many` is the root's buffer of n blocks (gather's recvbuff,
// scatter's sendbuff), `one` every rank's own block (gather's sendbuff, scatter's recvbuff).
static ncclResult_t rooted(const char* call, bool toRoot, void* one, void* many, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm) {
  int rank = 0, n = 0;
  chorusResult_t r = chorusCommUserRank(toChorus(comm), &rank);
  if (r == chorusSuccess) r = chorusCommCount(toChorus(comm), &n);
  if (r != chorusSuccess) return fromChorus(r);
  if (root < 0 || root >= n)
    return refuse(ncclInvalidArgument, std::string(call) + ": root " + std::to_string(root) + " of " +
                                           std::to_string(n) + " ranks");
  const size_t bytes = count * typeSize(datatype);
  if (count > 0 && (one == nullptr || (rank == root && many == nullptr)))
    return refuse(ncclInvalidArgument, std::string(call) + ": NULL buffer on rank " + std::to_string(rank));
  char* blocks = static_cast<char*>(many);
  chorusGroupStart();
  chorusResult_t first = chorusSuccess;
  if (rank == root) {
    for (int p = 0; p < n && first == chorusSuccess; ++p) {
      if (p == rank) continue;
      first = toRoot ? chorusRecv(blocks + p * bytes, count, CT(datatype), p, toChorus(comm), nullptr)
                     : chorusSend(blocks + p * bytes, count, CT(datatype), p, toChorus(comm), nullptr);
    }
  } else {
    first = toRoot ? chorusSend(one, count, CT(datatype), root, toChorus(comm), nullptr)
                   : chorusRecv(one, count, CT(datatype), root, toChorus(comm), nullptr);
  }
  const chorusResult_t end = chorusGroupEnd();
  if (first != chorusSuccess) return fromChorus(first);
  if (end != chorusSuccess) return fromChorus(end);
  if (rank == root && bytes > 0 && blocks + rank * bytes != one) {
    char* mine = blocks + rank * bytes;
    if (toRoot)
      afterGroup([mine, one, bytes] { std::memmove(mine, one, bytes); });
    else
      afterGroup([mine, one, bytes] { std::memmove(one, mine, bytes); });
  }
  return ncclSuccess;
}

SHIM_EXPORT ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  START
  CHECK_HOST("ncclGather", stream, sendbuff, recvbuff);
  return rooted("ncclGather", true, const_cast<void*>(sendbuff), recvbuff, count, datatype, root, comm);
  END
}
SHIM_ALIAS(ncclGather)

// The sendbuff is only read (const_cast to share rooted()).
SHIM_EXPORT ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  START
  CHECK_HOST("ncclScatter", stream, sendbuff, recvbuff);
  return rooted("ncclScatter", false, recvbuff, const_cast<void*>(sendbuff), count, datatype, root, comm);
  END
}
SHIM_ALIAS(ncclScatter)
