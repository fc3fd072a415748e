// The C ABI: handles, error codes and last-error text over the C++ implementation.
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_set>

#include "base/error.hpp"
#include "bootstrap/env_init.hpp"
#include "bootstrap/unique_id.hpp"
#include "chorus/chorus.h"
#include "core/api.hpp"
#include "core/comm_impl.hpp"
#include "core/device.hpp"
#include "core/group.hpp"
#include "core/window.hpp"
#include "topology/comm_topology.hpp"
#include "transports/shm/shm_memory.hpp"

struct chorusComm {
  std::shared_ptr<chorus::CommImpl> impl;             // null once destroyed (the handle stays as a tombstone)
  std::shared_ptr<chorus::onesided::State> oneSided;  // signals and windows, from the first window
};

namespace chorus {
namespace {

// Every handle ever returned. Destroyed handles stay (a few bytes each) so that a later use is
// recognised and reported instead of reading freed memory.
std::mutex gHandlesMu;
std::unordered_set<chorusComm*>& handles() {
  static auto* set = new std::unordered_set<chorusComm*>();
  return *set;
}

chorusComm_t newHandle(std::shared_ptr<CommImpl> impl) {
  auto* h = new chorusComm{std::move(impl)};
  std::lock_guard lk(gHandlesMu);
  handles().insert(h);
  return h;
}

std::shared_ptr<CommImpl> lookup(const chorusComm* comm, const char* call) {
  if (comm == nullptr) fail(chorusInvalidArgument, strCat(call, ": communicator is NULL"));
  std::lock_guard lk(gHandlesMu);
  if (!handles().count(const_cast<chorusComm*>(comm))) {
    fail(chorusInvalidArgument, strCat(call, ": not a communicator made by Chorus"));
  }
  if (!comm->impl) fail(chorusInvalidUsage, strCat(call, ": communicator was already destroyed or aborted"));
  return comm->impl;
}

// Runs `body`, turning exceptions into result codes and recording the message.
template <typename F>
chorusResult_t guarded(const chorusComm* comm, F&& body) {
  try {
    body();
    return chorusSuccess;
  } catch (const Error& e) {
    setThreadLastError(e.what());
    std::shared_ptr<CommImpl> impl;
    {
      std::lock_guard lk(gHandlesMu);
      if (comm && handles().count(const_cast<chorusComm*>(comm))) impl = comm->impl;
    }
    if (impl) impl->setLastError(e.what());
    return e.code();
  } catch (const std::bad_alloc&) {
    setThreadLastError("out of memory");
    return chorusSystemError;
  } catch (const std::exception& e) {
    setThreadLastError(strCat("internal error: ", e.what()));
    return chorusInternalError;
  } catch (...) {
    setThreadLastError("internal error: unknown exception");
    return chorusInternalError;
  }
}

// The integer a caller passed for an enum parameter, read without loading it as the enum: a C caller
// may pass any int, and loading a value outside a C++ enum's range is undefined (clang's
// -fsanitize=enum reports it); the checks after this reject the unknown ones.
template <typename E>
std::underlying_type_t<E> rawValue(const E& e) {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}
DataType dtypeOf(const chorusDataType_t& t) { return static_cast<DataType>(rawValue(t)); }
ReduceOp redopOf(const chorusRedOp_t& op) { return static_cast<ReduceOp>(rawValue(op)); }

std::shared_ptr<onesided::State> oneSidedOf(const chorusComm* comm) {
  std::lock_guard lk(gHandlesMu);
  return comm->oneSided;
}

// A NULL stream: host buffers, run to completion (or queued in the current group). Otherwise
// device buffers, enqueued on the stream (core/api.hpp).
chorusResult_t collective(chorusComm_t comm, void* stream, const char* call, Op op) {
  return guarded(comm, [&] { api::run(lookup(comm, call), std::move(op), stream); });
}

}  // namespace
}  // namespace chorus

using namespace chorus;

extern "C" {

chorusResult_t chorusGetVersion(int* version) {
  return guarded(nullptr, [&] {
    if (!version) failInvalid("chorusGetVersion: version is NULL");
    *version = CHORUS_VERSION_CODE;
  });
}

chorusResult_t chorusMemAlloc(void** ptr, size_t size) {
  return guarded(nullptr, [&] {
    if (!ptr) failInvalid("chorusMemAlloc: ptr is NULL");
    *ptr = nullptr;
    *ptr = chorus::transport::sharedAlloc(size);
  });
}

chorusResult_t chorusMemFree(void* ptr) {
  return guarded(nullptr, [&] { chorus::transport::sharedFree(ptr); });
}

const char* chorusGetErrorString(chorusResult_t result) {
  switch (rawValue(result)) {
    case chorusSuccess:
      return "no error";
    case chorusUnhandledCudaError:
      return "unhandled CUDA error";
    case chorusSystemError:
      return "system error (shared memory, sockets or memory)";
    case chorusInternalError:
      return "internal error";
    case chorusInvalidArgument:
      return "invalid argument";
    case chorusInvalidUsage:
      return "invalid usage";
    case chorusRemoteError:
      return "remote error (a peer failed, died or aborted)";
    case chorusInProgress:
      return "operation in progress";
    case chorusTimeout:
      return "timed out";
    default:
      return "unknown result code";
  }
}

const char* chorusGetLastError(chorusComm_t comm) {
  thread_local std::string copy;
  copy = threadLastError();
  if (comm) {
    std::lock_guard lk(gHandlesMu);
    if (handles().count(comm) && comm->impl) {
      std::string s = comm->impl->lastError();
      if (!s.empty()) copy = s;
    }
  }
  return copy.c_str();
}

chorusResult_t chorusGetUniqueId(chorusUniqueId* uniqueId) {
  return guarded(nullptr, [&] {
    if (!uniqueId) failInvalid("chorusGetUniqueId: uniqueId is NULL");
    makeUniqueId(uniqueId);
  });
}

chorusResult_t chorusCommInitRank(chorusComm_t* comm, int nranks, chorusUniqueId uniqueId, int rank) {
  return guarded(nullptr, [&] {
    if (!comm) failInvalid("chorusCommInitRank: comm is NULL");
    *comm = nullptr;
    if (nranks < 1) failInvalid("chorusCommInitRank: nranks ", nranks, " must be at least 1");
    if (rank < 0 || rank >= nranks)
      failInvalid("chorusCommInitRank: rank ", rank, " is out of range [0, ", nranks, ")");
    *comm =
        newHandle(CommImpl::create(storeForUniqueId(uniqueId, envConfig().timeout), rank, nranks, Config{}));
  });
}

chorusResult_t chorusCommInitAll(chorusComm_t* comms, int ndev, const int* devlist) {
  return guarded(nullptr, [&] {
    if (!comms) failInvalid("chorusCommInitAll: comms is NULL");
    if (ndev < 1) failInvalid("chorusCommInitAll: ndev ", ndev, " must be at least 1");
    auto impls = CommImpl::createLocal(ndev, Config{});
    // With a device list, rank i runs device calls on devlist[i], set up now: one thread may then
    // drive every rank in a group, as with NCCL.
    if (devlist) device::bindDevices(impls, devlist);
    for (int i = 0; i < ndev; ++i) comms[i] = newHandle(std::move(impls[static_cast<size_t>(i)]));
  });
}

chorusResult_t chorusCommInitFromEnv(chorusComm_t* comm) {
  return guarded(nullptr, [&] {
    if (!comm) failInvalid("chorusCommInitFromEnv: comm is NULL");
    *comm = nullptr;
    EnvRendezvous rv = rendezvousFromEnvironment();
    *comm = newHandle(CommImpl::create(rv.store, rv.rank, rv.size, Config{}, rv.keepAlive));
  });
}

chorusResult_t chorusCommSplit(chorusComm_t comm, int color, int key, chorusComm_t* newcomm) {
  return guarded(comm, [&] {
    if (!newcomm) failInvalid("chorusCommSplit: newcomm is NULL");
    *newcomm = nullptr;
    auto child = api::split(*lookup(comm, "chorusCommSplit"), color, key, "chorusCommSplit");
    if (child) *newcomm = newHandle(std::move(child));
  });
}

chorusResult_t chorusCommShrink(chorusComm_t comm, const int* excludeRanks, int excludeCount,
                                chorusComm_t* newcomm) {
  return guarded(comm, [&] {
    if (!newcomm) failInvalid("chorusCommShrink: newcomm is NULL");
    *newcomm = nullptr;
    if (excludeCount < 0) failInvalid("chorusCommShrink: excludeCount ", excludeCount, " is negative");
    if (excludeCount > 0 && !excludeRanks) failInvalid("chorusCommShrink: excludeRanks is NULL");
    auto child = api::shrink(*lookup(comm, "chorusCommShrink"),
                             std::span<const int>(excludeRanks, static_cast<size_t>(excludeCount)),
                             "chorusCommShrink");
    *newcomm = newHandle(std::move(child));
  });
}

chorusResult_t chorusCommDestroy(chorusComm_t comm) {
  return guarded(comm, [&] {
    std::shared_ptr<CommImpl> impl = lookup(comm, "chorusCommDestroy");
    std::lock_guard lk(gHandlesMu);
    onesided::release(comm->oneSided);
    comm->impl.reset();
  });
}

chorusResult_t chorusCommAbort(chorusComm_t comm) {
  return guarded(comm, [&] {
    std::shared_ptr<CommImpl> impl = lookup(comm, "chorusCommAbort");
    impl->abort();
    std::lock_guard lk(gHandlesMu);
    onesided::release(comm->oneSided);
    comm->impl.reset();
  });
}

chorusResult_t chorusCommRevoke(chorusComm_t comm) {
  return guarded(comm, [&] { lookup(comm, "chorusCommRevoke")->abort(); });
}

chorusResult_t chorusCommMemoryBytes(const chorusComm_t comm, size_t* bytes) {
  return guarded(comm, [&] {
    if (!bytes) failInvalid("chorusCommMemoryBytes: bytes is NULL");
    *bytes = lookup(comm, "chorusCommMemoryBytes")->memoryBytes();
  });
}

chorusResult_t chorusCommLocalRanks(const chorusComm_t comm, int* count, int* index) {
  return guarded(comm, [&] {
    if (!count || !index) failInvalid("chorusCommLocalRanks: count or index is NULL");
    auto impl = lookup(comm, "chorusCommLocalRanks");
    const topo::CommTopology& t = impl->topology();
    *count = t.localSize(impl->rank());
    *index = t.ranks[static_cast<size_t>(impl->rank())].localRank;
  });
}

chorusResult_t chorusWindowRegister(chorusComm_t comm, void* buff, size_t size, chorusWindow_t* win) {
  return guarded(comm, [&] {
    if (!win) failInvalid("chorusWindowRegister: win is NULL");
    *win = nullptr;
    auto impl = lookup(comm, "chorusWindowRegister");
    std::shared_ptr<onesided::State> state = oneSidedOf(comm);
    *win = onesided::registerWindow(impl, state, buff, size);
    std::lock_guard lk(gHandlesMu);
    comm->oneSided = state;
  });
}

chorusResult_t chorusWindowDeregister(chorusComm_t comm, chorusWindow_t win) {
  return guarded(comm, [&] {
    auto impl = lookup(comm, "chorusWindowDeregister");
    onesided::deregisterWindow(impl, oneSidedOf(comm).get(), win);
  });
}

chorusResult_t chorusWindowPeerPointer(chorusWindow_t win, int peer, void** ptr, size_t* size) {
  return guarded(nullptr, [&] { onesided::peerPointer(win, peer, ptr, size); });
}

chorusResult_t chorusPutSignal(const void* src, size_t bytes, int peer, chorusWindow_t win, size_t offset,
                               int signal, chorusComm_t comm) {
  return guarded(comm, [&] {
    auto impl = lookup(comm, "chorusPutSignal");
    onesided::putSignal(*impl, oneSidedOf(comm).get(), src, bytes, peer, win, offset, signal);
  });
}

chorusResult_t chorusWaitSignal(int peer, int signal, uint64_t count, chorusComm_t comm) {
  return guarded(comm, [&] {
    auto impl = lookup(comm, "chorusWaitSignal");
    onesided::waitSignal(*impl, oneSidedOf(comm).get(), peer, signal, count);
  });
}

chorusResult_t chorusConfigGet(const char* name, const char** value) {
  return guarded(nullptr, [&] {
    if (!name || !value) failInvalid("chorusConfigGet: name or value is NULL");
    thread_local std::string text;
    text = configValue(name);
    *value = text.c_str();
  });
}

chorusResult_t chorusCommSetTimeout(chorusComm_t comm, double seconds) {
  return guarded(comm, [&] {
    if (!(seconds >= 0 && seconds <= 1e9))
      failInvalid("chorusCommSetTimeout: ", seconds, " seconds is not in [0, 1e9]");
    const auto ms = static_cast<int64_t>(std::ceil(seconds * 1000));
    lookup(comm, "chorusCommSetTimeout")->setCallTimeout(std::chrono::milliseconds(ms));
  });
}

chorusResult_t chorusCommGetAsyncError(chorusComm_t comm, chorusResult_t* asyncError) {
  return guarded(comm, [&] {
    if (!asyncError) failInvalid("chorusCommGetAsyncError: asyncError is NULL");
    *asyncError = api::asyncError(*lookup(comm, "chorusCommGetAsyncError"));
  });
}

chorusResult_t chorusCommCount(const chorusComm_t comm, int* count) {
  return guarded(comm, [&] {
    if (!count) failInvalid("chorusCommCount: count is NULL");
    *count = lookup(comm, "chorusCommCount")->size();
  });
}

chorusResult_t chorusCommCuDevice(const chorusComm_t comm, int* device) {
  return guarded(comm, [&] {
    if (!device) failInvalid("chorusCommCuDevice: device is NULL");
    *device = device::deviceOf(*lookup(comm, "chorusCommCuDevice"));
  });
}

chorusResult_t chorusCommUserRank(const chorusComm_t comm, int* rank) {
  return guarded(comm, [&] {
    if (!rank) failInvalid("chorusCommUserRank: rank is NULL");
    *rank = lookup(comm, "chorusCommUserRank")->rank();
  });
}

chorusResult_t chorusAllReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                               chorusRedOp_t op, chorusComm_t comm, void* stream) {
  return collective(
      comm, stream, "chorusAllReduce",
      api::makeOp(OpKind::AllReduce, sendbuff, recvbuff, count, dtypeOf(datatype), redopOf(op)));
}

chorusResult_t chorusReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                   chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                   void* stream) {
  return collective(
      comm, stream, "chorusReduceScatter",
      api::makeOp(OpKind::ReduceScatter, sendbuff, recvbuff, recvcount, dtypeOf(datatype), redopOf(op)));
}

chorusResult_t chorusAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                               chorusDataType_t datatype, chorusComm_t comm, void* stream) {
  return collective(comm, stream, "chorusAllGather",
                    api::makeOp(OpKind::AllGather, sendbuff, recvbuff, sendcount, dtypeOf(datatype)));
}

chorusResult_t chorusBroadcast(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                               int root, chorusComm_t comm, void* stream) {
  return collective(
      comm, stream, "chorusBroadcast",
      api::makeOp(OpKind::Broadcast, sendbuff, recvbuff, count, dtypeOf(datatype), ReduceOp::Sum, root));
}

chorusResult_t chorusReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                            chorusRedOp_t op, int root, chorusComm_t comm, void* stream) {
  return collective(
      comm, stream, "chorusReduce",
      api::makeOp(OpKind::Reduce, sendbuff, recvbuff, count, dtypeOf(datatype), redopOf(op), root));
}

chorusResult_t chorusAllToAll(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                              chorusComm_t comm, void* stream) {
  return collective(comm, stream, "chorusAllToAll",
                    api::makeOp(OpKind::AllToAll, sendbuff, recvbuff, count, dtypeOf(datatype)));
}

chorusResult_t chorusAllToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                               void* recvbuff, const size_t* recvcounts, const size_t* rdispls,
                               chorusDataType_t datatype, chorusComm_t comm, void* stream) {
  return guarded(comm, [&] {
    auto impl = lookup(comm, "chorusAllToAllv");
    if (!sendcounts || !sdispls || !recvcounts || !rdispls) {
      failInvalid("chorusAllToAllv: counts and displacements must not be NULL");
    }
    const auto n = static_cast<size_t>(impl->size());
    api::run(impl,
             api::makeAllToAllv(sendbuff, {sendcounts, n}, {sdispls, n}, recvbuff, {recvcounts, n},
                                {rdispls, n}, dtypeOf(datatype)),
             stream);
  });
}

chorusResult_t chorusSend(const void* sendbuff, size_t count, chorusDataType_t datatype, int peer,
                          chorusComm_t comm, void* stream) {
  return collective(
      comm, stream, "chorusSend",
      api::makeOp(OpKind::Send, sendbuff, nullptr, count, dtypeOf(datatype), ReduceOp::Sum, -1, peer));
}

chorusResult_t chorusRecv(void* recvbuff, size_t count, chorusDataType_t datatype, int peer,
                          chorusComm_t comm, void* stream) {
  return collective(
      comm, stream, "chorusRecv",
      api::makeOp(OpKind::Recv, nullptr, recvbuff, count, dtypeOf(datatype), ReduceOp::Sum, -1, peer));
}

chorusResult_t chorusBarrier(chorusComm_t comm, void* stream) {
  return collective(comm, stream, "chorusBarrier",
                    api::makeOp(OpKind::Barrier, nullptr, nullptr, 0, DataType::Uint8));
}

chorusResult_t chorusGroupStart(void) {
  return guarded(nullptr, [] { group::start(); });
}

chorusResult_t chorusGroupEnd(void) {
  return guarded(nullptr, [] { group::end(); });
}

}  // extern "C"
