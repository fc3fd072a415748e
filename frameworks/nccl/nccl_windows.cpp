// libnccl.so.2 from Chorus: windows and the one-sided calls (ncclPutSignal, ncclSignal,
// ncclWaitSignal) over Chorus's windows (chorusWindowRegister: every rank's buffer mapped by the
// others of its host, so a put is a copy into the peer's memory and a signal an atomic add there).
// Host memory with a NULL stream; windows of device memory are refused (docs/frameworks.md).
#include <mutex>
#include <string>
#include <unordered_set>

#include "frameworks/nccl/shim.hpp"

using shim::fromChorus;
using shim::refuse;

// 2.28's nccl.h has no NCCL_WIN_STRICT_ORDERING.
#ifndef NCCL_WIN_STRICT_ORDERING
#define NCCL_WIN_STRICT_ORDERING 0x02
#endif

namespace {

// What ncclWindow_t points to in this library.
struct Window {
  ncclComm* comm;
  chorusWindow_t win;
  void* user;
  size_t size;
};

std::mutex gWindowsMu;
std::unordered_set<const Window*>& windows() {
  static auto* set = new std::unordered_set<const Window*>();
  return *set;
}

Window* lookup(ncclWindow_t handle, const char* call, ncclResult_t* err) {
  auto* w = reinterpret_cast<Window*>(handle);
  std::lock_guard lk(gWindowsMu);
  if (w == nullptr || !windows().count(w)) {
    *err = refuse(ncclInvalidArgument, std::string(call) + ": not a registered window");
    return nullptr;
  }
  if (w->comm->destroyed) {
    *err = refuse(ncclInvalidUsage, std::string(call) + ": the window's communicator was destroyed");
    return nullptr;
  }
  return w;
}

}  // namespace

ncclResult_t shim::windowPointer(const char* call, ncclWindow_t handle, size_t offset, int peer, void** out) {
  if (!out) return refuse(ncclInvalidArgument, std::string(call) + ": outPtr is NULL");
  ncclResult_t err;
  Window* w = lookup(handle, call, &err);
  if (!w) return err;
  void* base = nullptr;
  size_t size = 0;
  if (chorusResult_t r = chorusWindowPeerPointer(w->win, peer, &base, &size); r != chorusSuccess)
    return fromChorus(r);
  if (offset > size)
    return refuse(ncclInvalidArgument, std::string(call) + ": offset " + std::to_string(offset) +
                                           " is past rank " + std::to_string(peer) + "'s " +
                                           std::to_string(size) + " bytes");
  *out = static_cast<char*>(base) + offset;
  return ncclSuccess;
}

// Collective. NCCL_WIN_COLL_SYMMETRIC and NCCL_WIN_STRICT_ORDERING are accepted: Chorus's windows
// are not used by its collectives, and one-sided calls complete in call order.
SHIM_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                                int winFlags) {
  START
  if (!win) return refuse(ncclInvalidArgument, "ncclCommWindowRegister: win is NULL");
  *win = nullptr;
  RESOLVE(comm, "ncclCommWindowRegister");
  if (winFlags & ~(NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING))
    return refuse(ncclInvalidArgument,
                  "ncclCommWindowRegister: unknown winFlags " + std::to_string(winFlags));
  if (shim::isDeviceMemory(buff))
    return refuse(ncclInvalidUsage,
                  "ncclCommWindowRegister: a device buffer was given; Chorus's libnccl registers windows of "
                  "host memory from ncclMemAlloc only (device windows over CUDA IPC are not built)");
  chorusWindow_t w = nullptr;
  if (chorusResult_t r = chorusWindowRegister(cc, buff, size, &w); r != chorusSuccess) return fromChorus(r);
  auto* made = new Window{comm, w, buff, size};
  {
    std::lock_guard lk(gWindowsMu);
    windows().insert(made);
  }
  ++comm->windows;
  *win = reinterpret_cast<ncclWindow_t>(made);
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclCommWindowRegister)

SHIM_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  START
  RESOLVE(comm, "ncclCommWindowDeregister");
  ncclResult_t err;
  Window* w = lookup(win, "ncclCommWindowDeregister", &err);
  if (!w) return err;
  if (w->comm != comm)
    return refuse(ncclInvalidArgument,
                  "ncclCommWindowDeregister: the window was registered on another communicator");
  const chorusResult_t r = chorusWindowDeregister(cc, w->win);
  if (r != chorusSuccess) return fromChorus(r);
  {
    std::lock_guard lk(gWindowsMu);
    windows().erase(w);
  }
  --comm->windows;
  delete w;
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclCommWindowDeregister)

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)

namespace {

bool hostCall(const char* call, cudaStream_t stream, const void* buff, ncclResult_t* out) {
  if (stream == nullptr && !shim::isDeviceMemory(buff)) return true;
  *out = refuse(ncclInvalidUsage, std::string(call) +
                                      ": Chorus's libnccl runs one-sided calls on host memory with a NULL "
                                      "stream; device windows (over CUDA IPC) are not built");
  return false;
}

// NCCL's (sigIdx, ctx) as one of Chorus's CHORUS_SIGNALS slots.
constexpr int kSignalsPerCtx = 64;
constexpr int kContexts = CHORUS_SIGNALS / kSignalsPerCtx;

bool signalOf(const char* call, int sigIdx, int ctx, int* out, ncclResult_t* err) {
  if (sigIdx < 0 || sigIdx >= kSignalsPerCtx || ctx < 0 || ctx >= kContexts) {
    *err = refuse(ncclInvalidArgument, std::string(call) + ": sigIdx " + std::to_string(sigIdx) +
                                           " and ctx " + std::to_string(ctx) + " must be in [0, " +
                                           std::to_string(kSignalsPerCtx) + ") and [0, " +
                                           std::to_string(kContexts) + ")");
    return false;
  }
  *out = ctx * kSignalsPerCtx + sigIdx;
  return true;
}

}  // namespace

SHIM_EXPORT ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr) {
  START
  if (!outUserPtr) return refuse(ncclInvalidArgument, "ncclWinGetUserPtr: outUserPtr is NULL");
  RESOLVE(comm, "ncclWinGetUserPtr");
  (void)cc;
  ncclResult_t err;
  Window* w = lookup(win, "ncclWinGetUserPtr", &err);
  if (!w) return err;
  *outUserPtr = w->user;
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclWinGetUserPtr)

// Returns once the data is in the peer's buffer and the signal raised (NCCL: once enqueued).
SHIM_EXPORT ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                                       ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                                       unsigned int flags, ncclComm_t comm, cudaStream_t stream) {
  START
  const char* call = "ncclPutSignal";
  RESOLVE(comm, call);
  ncclResult_t err;
  if (!hostCall(call, stream, localbuff, &err)) return err;
  if (!shim::typeOk(call, datatype, &err)) return err;
  if (flags != 0) return refuse(ncclInvalidArgument, std::string(call) + ": flags must be 0");
  int signal = 0;
  if (!signalOf(call, sigIdx, ctx, &signal, &err)) return err;
  Window* w = lookup(peerWin, call, &err);
  if (!w) return err;
  if (w->comm != comm)
    return refuse(ncclInvalidArgument,
                  std::string(call) + ": the window was registered on another communicator");
  return fromChorus(
      chorusPutSignal(localbuff, count * shim::typeSize(datatype), peer, w->win, peerWinOffset, signal, cc));
  END
}
SHIM_ALIAS(ncclPutSignal)

SHIM_EXPORT ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                                    cudaStream_t stream) {
  START
  const char* call = "ncclSignal";
  RESOLVE(comm, call);
  ncclResult_t err;
  if (!hostCall(call, stream, nullptr, &err)) return err;
  if (flags != 0) return refuse(ncclInvalidArgument, std::string(call) + ": flags must be 0");
  int signal = 0;
  if (!signalOf(call, sigIdx, ctx, &signal, &err)) return err;
  return fromChorus(chorusPutSignal(nullptr, 0, peer, nullptr, 0, signal, cc));
  END
}
SHIM_ALIAS(ncclSignal)

SHIM_EXPORT ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                                        cudaStream_t stream) {
  START
  const char* call = "ncclWaitSignal";
  RESOLVE(comm, call);
  ncclResult_t err;
  if (!hostCall(call, stream, nullptr, &err)) return err;
  if (nDesc < 0 || (nDesc > 0 && !signalDescs))
    return refuse(ncclInvalidArgument, std::string(call) + ": nDesc " + std::to_string(nDesc) +
                                           " with signalDescs " + (signalDescs ? "set" : "NULL"));
  for (int i = 0; i < nDesc; ++i) {
    const ncclWaitSignalDesc_t& d = signalDescs[i];
    int signal = 0;
    if (!signalOf(call, d.sigIdx, d.ctx, &signal, &err)) return err;
    if (d.opCnt < 0)
      return refuse(ncclInvalidArgument, std::string(call) + ": descriptor " + std::to_string(i) +
                                             " has opCnt " + std::to_string(d.opCnt));
    if (chorusResult_t r = chorusWaitSignal(d.peer, signal, static_cast<uint64_t>(d.opCnt), cc);
        r != chorusSuccess)
      return fromChorus(r);
  }
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclWaitSignal)

#endif  // NCCL 2.30
