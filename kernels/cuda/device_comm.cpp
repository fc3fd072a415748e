// Device-buffer calls (core/device.hpp): the per-communicator CUDA state, made by the first call
// that passes a stream, and the choice between a kernel over CUDA IPC and staging through pinned
// host memory.
//
// Set-up (collective, over the communicator's host transport): every rank allocates its workspace
// (ipc_layout.hpp), exports it with cudaIpcGetMemHandle and all-gathers {pid, device, UUID, SMs,
// handle, address}. When every rank is on this host and there are at most ipc::kMaxRanks of them,
// each maps the peers' workspaces: the address itself for a rank of the same process (ranks as
// threads; another device's memory through peer access), cudaIpcOpenMemHandle otherwise. Several
// ranks may share a GPU. If any rank cannot map every peer, all use the staged path.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/api.hpp"
#include "core/comm_impl.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/group.hpp"
#include "core/log.hpp"
#include "ipc_collectives.hpp"
#include "topology/comm_topology.hpp"

namespace chorus::device {

namespace {

namespace ipc = kernels::cuda::ipc;

std::string cudaText(cudaError_t e) { return strCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"); }

void check(cudaError_t e, int rank, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  fail(e == cudaErrorMemoryAllocation ? chorusSystemError : chorusUnhandledCudaError,
       strCat("rank ", rank, ": ", what, ": ", cudaText(e)));
}

// Pinned host memory (RAII). Mapped into the device when asked.
class Pinned {
 public:
  Pinned() = default;
  Pinned(size_t bytes, bool mapped, int rank) : bytes_(bytes) {
    if (bytes == 0) return;
    check(cudaHostAlloc(&p_, bytes,
                        mapped ? cudaHostAllocMapped | cudaHostAllocPortable : cudaHostAllocPortable),
          rank, "cudaHostAlloc");
  }
  ~Pinned() {
    if (p_ && cudaFreeHost(p_) != cudaSuccess) (void)cudaGetLastError();
  }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  std::byte* get() const { return static_cast<std::byte*>(p_); }
  size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Device memory, IPC mappings and an event, released even when set-up fails half way.
struct DeviceMemory {
  void* p = nullptr;
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { reset(); }
  void reset() {
    if (p && cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
    p = nullptr;
  }
};
struct IpcMappings {
  std::vector<void*> opened;
  IpcMappings() = default;
  IpcMappings(const IpcMappings&) = delete;
  IpcMappings& operator=(const IpcMappings&) = delete;
  ~IpcMappings() { reset(); }
  void reset() {
    for (void* q : opened) {
      if (cudaIpcCloseMemHandle(q) != cudaSuccess) (void)cudaGetLastError();
    }
    opened.clear();
  }
};
struct Event {
  cudaEvent_t e = nullptr;
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (e && cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
  }
};

// What each rank tells the others at set-up.
struct PeerInfo {
  int32_t hasDevice = 0;
  int32_t pid = 0;
  int32_t device = -1;
  int32_t sms = 0;
  int32_t workspaceOk = 0;
  uint8_t uuid[16] = {};
  uint64_t address = 0;
  uint64_t stageBytes = 0;  // rank 0's settings hold for all
  uint64_t llBytes = 0;
  cudaIpcMemHandle_t handle{};
  char why[224] = {};
};

struct MapResult {
  int32_t ok = 0;
  char why[252] = {};
};

void copyText(char* dst, size_t cap, const std::string& s) {
  const size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

template <typename T>
std::vector<T> allGather(CommImpl& comm, const T& mine) {
  std::vector<T> all(static_cast<size_t>(comm.size()));
  Op op = api::makeOp(OpKind::AllGather, &mine, all.data(), sizeof(T), DataType::Uint8);
  comm.runBlocking(op);
  return all;
}

bool kernelKind(OpKind k) {
  return k == OpKind::AllReduce || k == OpKind::ReduceScatter || k == OpKind::AllGather ||
         k == OpKind::Broadcast || k == OpKind::Reduce;
}

ipc::Kind ipcKind(OpKind k) {
  switch (k) {
    case OpKind::ReduceScatter:
      return ipc::Kind::ReduceScatter;
    case OpKind::AllGather:
      return ipc::Kind::AllGather;
    case OpKind::Broadcast:
      return ipc::Kind::Broadcast;
    case OpKind::Reduce:
      return ipc::Kind::Reduce;
    default:
      return ipc::Kind::AllReduce;
  }
}

class DeviceComm {
 public:
  explicit DeviceComm(CommImpl& comm);
  DeviceComm(const DeviceComm&) = delete;
  DeviceComm& operator=(const DeviceComm&) = delete;

  bool ipc() const { return ipc_; }
  int device() const { return device_; }
  void launch(CommImpl& comm, const Op& op, cudaStream_t stream);
  void staged(const std::shared_ptr<CommImpl>& comm, Op op, cudaStream_t stream);
  chorusResult_t error(std::string* message) const;
  void abortKernels() {
    if (words_) *reinterpret_cast<volatile uint32_t*>(words_->get()) = 1;
  }
  void throwIfFailed() const {
    std::string text;
    if (const chorusResult_t code = error(&text); code != chorusSuccess) fail(code, text);
  }

 private:
  void mapPeers(const std::vector<PeerInfo>& info, std::string* why);

  int rank_;
  int size_;
  int device_ = -1;
  bool ipc_ = false;
  // Declared before what refers to them, destroyed after.
  DeviceMemory own_;
  IpcMappings opened_;
  void* ws_[ipc::kMaxRanks] = {};
  ipc::Layout layout_;
  size_t llMax_ = 0;
  int maxBlocks_ = 1;
  std::unique_ptr<Pinned> words_;  // [0]: abort flag, [1]: error word (host-mapped on the IPC path)
  uint32_t* devWords_ = nullptr;
  Event order_;
  cudaStream_t last_ = nullptr;
  std::chrono::milliseconds timeout_{0};
};

DeviceComm::DeviceComm(CommImpl& comm) : rank_(comm.rank()), size_(comm.size()) {
  const EnvConfig& env = envConfig();
  PeerInfo mine;
  mine.pid = static_cast<int32_t>(getpid());
  mine.stageBytes = env.cudaStageBytes;
  mine.llBytes = env.cudaLlBytes;
  // Nothing here throws before the exchange: a rank that cannot take part says why instead, so
  // that its peers fail with that reason rather than wait for it.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);  // set-up may happen while capturing
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    copyText(mine.why, sizeof mine.why,
             e != cudaSuccess ? strCat("cudaGetDeviceCount: ", cudaText(e)) : std::string("no CUDA device"));
  } else if (e = cudaGetDevice(&device_); e != cudaSuccess) {
    (void)cudaGetLastError();
    copyText(mine.why, sizeof mine.why, strCat("cudaGetDevice: ", cudaText(e)));
  } else {
    mine.hasDevice = 1;
    mine.device = device_;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device_) == cudaSuccess) {
      mine.sms = prop.multiProcessorCount;
      std::memcpy(mine.uuid, prop.uuid.bytes, sizeof mine.uuid);
    } else {
      (void)cudaGetLastError();
      mine.sms = 1;
    }
  }
  auto info = std::vector<PeerInfo>{};
  try {
    // Rank 0's sizes, known to everyone only after the exchange: allocate after a first one.
    info = allGather(comm, mine);
  } catch (...) {
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    throw;
  }
  for (int r = 0; r < size_; ++r) {
    if (!info[static_cast<size_t>(r)].hasDevice) {
      (void)cudaThreadExchangeStreamCaptureMode(&mode);
      fail(chorusInvalidUsage, strCat("rank ", rank_,
                                      ": device buffers on this communicator need a CUDA device "
                                      "on every rank, and rank ",
                                      r, " has none: ", info[static_cast<size_t>(r)].why));
    }
  }
  layout_ = ipc::makeLayout(info[0].stageBytes, info[0].llBytes);
  llMax_ = info[0].llBytes;
  timeout_ = comm.callTimeout().count() > 0 ? comm.callTimeout() : comm.config().timeout;

  std::string why;
  bool candidate = size_ <= ipc::kMaxRanks;
  if (!candidate) why = strCat(size_, " ranks (CUDA IPC collectives take at most ", ipc::kMaxRanks, ")");
  const auto& topo = comm.topology();
  for (int r = 0; candidate && r < size_; ++r) {
    if (topo.ranks[static_cast<size_t>(r)].host != topo.ranks[static_cast<size_t>(rank_)].host) {
      candidate = false;
      why = strCat("rank ", r, " is on another host");
    }
  }
  // Everyone decides alike (same inputs); a workspace per rank, then the second exchange.
  if (candidate) {
    PeerInfo& me = mine;
    cudaStream_t s = nullptr;
    cudaError_t e = cudaMalloc(&own_.p, layout_.total);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMemsetAsync(own_.p, 0, layout_.total, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (s) (void)cudaStreamDestroy(s);
    if (e == cudaSuccess) e = cudaIpcGetMemHandle(&me.handle, own_.p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      copyText(me.why, sizeof me.why,
               strCat("rank ", rank_, ": workspace of ", layout_.total, " bytes: ", cudaText(e)));
    } else {
      me.workspaceOk = 1;
      me.address = reinterpret_cast<uintptr_t>(own_.p);
    }
    try {
      info = allGather(comm, me);
    } catch (...) {
      (void)cudaThreadExchangeStreamCaptureMode(&mode);
      throw;
    }
    for (int r = 0; candidate && r < size_; ++r) {
      if (!info[static_cast<size_t>(r)].workspaceOk) {
        candidate = false;
        why = info[static_cast<size_t>(r)].why;
      }
    }
    MapResult mapped;
    if (candidate) {
      std::string mapWhy;
      mapPeers(info, &mapWhy);
      mapped.ok = mapWhy.empty() ? 1 : 0;
      copyText(mapped.why, sizeof mapped.why, mapWhy);
    }
    std::vector<MapResult> all;
    try {
      all = allGather(comm, mapped);
    } catch (...) {
      (void)cudaThreadExchangeStreamCaptureMode(&mode);
      throw;
    }
    ipc_ = candidate;
    for (const auto& m : all) {
      if (candidate && !m.ok) {
        ipc_ = false;
        why = m.why;
        break;
      }
    }
  }
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  if (ipc_) {
    // As many blocks as keep every rank's kernel resident at once on a GPU shared by several.
    maxBlocks_ = ipc::kMaxBlocks;
    for (int r = 0; r < size_; ++r) {
      int sharing = 0;
      for (int q = 0; q < size_; ++q) {
        sharing += std::memcmp(info[static_cast<size_t>(r)].uuid, info[static_cast<size_t>(q)].uuid, 16) == 0;
      }
      maxBlocks_ = std::min(maxBlocks_, std::max(1, info[static_cast<size_t>(r)].sms / std::max(1, sharing)));
    }
    words_ = std::make_unique<Pinned>(2 * sizeof(uint32_t), true, rank_);
    std::memset(words_->get(), 0, 2 * sizeof(uint32_t));
    void* dev = nullptr;
    check(cudaHostGetDevicePointer(&dev, words_->get(), 0), rank_, "cudaHostGetDevicePointer");
    devWords_ = static_cast<uint32_t*>(dev);
    check(cudaEventCreateWithFlags(&order_.e, cudaEventDisableTiming), rank_, "cudaEventCreate");
    logInfo(Subsys::Init, "rank ", rank_, ": device buffers over CUDA IPC on device ", device_, ", ", size_,
            " ranks, up to ", maxBlocks_, " blocks per kernel, stage ", layout_.stageBytes,
            " bytes, LL up to ", llMax_, " bytes");
  } else {
    opened_.reset();
    own_.reset();
    words_ = std::make_unique<Pinned>(2 * sizeof(uint32_t), false, rank_);
    std::memset(words_->get(), 0, 2 * sizeof(uint32_t));
    logInfo(Subsys::Init, "rank ", rank_, ": device buffers staged through pinned host memory: ", why);
  }
}

void DeviceComm::mapPeers(const std::vector<PeerInfo>& info, std::string* why) {
  const PeerInfo& me = info[static_cast<size_t>(rank_)];
  for (int p = 0; p < size_; ++p) {
    const PeerInfo& peer = info[static_cast<size_t>(p)];
    if (p == rank_) {
      ws_[p] = own_.p;
      continue;
    }
    if (peer.pid == me.pid) {
      // Another rank of this process: its address is valid here.
      if (peer.device != device_) {
        int can = 0;
        if (cudaDeviceCanAccessPeer(&can, device_, peer.device) != cudaSuccess || !can) {
          (void)cudaGetLastError();
          *why = strCat("rank ", rank_, ": device ", device_, " cannot access device ", peer.device,
                        " of rank ", p);
          return;
        }
        const cudaError_t e = cudaDeviceEnablePeerAccess(peer.device, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
          *why = strCat("rank ", rank_, ": cudaDeviceEnablePeerAccess(", peer.device, "): ", cudaText(e));
          (void)cudaGetLastError();
          return;
        }
        (void)cudaGetLastError();
      }
      ws_[p] = reinterpret_cast<void*>(static_cast<uintptr_t>(peer.address));
      continue;
    }
    void* ptr = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&ptr, peer.handle, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      *why = strCat("rank ", rank_, ": cudaIpcOpenMemHandle of rank ", p, "'s workspace: ", cudaText(e));
      return;
    }
    opened_.opened.push_back(ptr);
    ws_[p] = ptr;
  }
}

chorusResult_t DeviceComm::error(std::string* message) const {
  if (!words_) return chorusSuccess;
  const uint32_t w = reinterpret_cast<const volatile uint32_t*>(words_->get())[1];
  if (w == 0) return chorusSuccess;
  const uint32_t why = w >> 16;
  const int peer = static_cast<int>(w & 0xFFFF) - 1;
  if (why == ipc::kErrAborted) {
    if (message)
      *message = strCat("rank ", rank_, ": a device collective was stopped: the communicator was aborted");
    return chorusRemoteError;
  }
  if (message) {
    *message = strCat("rank ", rank_, ": a device collective timed out after ", timeout_.count() / 1000.0,
                      " s waiting for rank ", peer,
                      " (it never made the matching call: every rank must issue the same device calls in the "
                      "same order)");
  }
  return chorusTimeout;
}

void DeviceComm::launch(CommImpl& comm, const Op& op, cudaStream_t stream) {
  throwIfFailed();
  // Calls on one communicator run in call order even on different streams (as NCCL's do).
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capturing), rank_, "cudaStreamIsCapturing");
  if (last_ && last_ != stream && capturing == cudaStreamCaptureStatusNone) {
    if (cudaEventRecord(order_.e, last_) == cudaSuccess)
      check(cudaStreamWaitEvent(stream, order_.e, 0), rank_, "cudaStreamWaitEvent");
    else
      (void)cudaGetLastError();  // the previous stream is gone, and its work with it
  }
  last_ = stream;
  ipc::Call c;
  c.kind = ipcKind(op.kind);
  c.type = op.type;
  c.op = op.op;
  c.root = op.root < 0 ? 0 : op.root;
  c.send = op.send;
  c.recv = op.recv;
  c.count = op.count;
  c.rank = rank_;
  c.nranks = size_;
  for (int r = 0; r < size_; ++r) c.ws[r] = ws_[r];
  c.layout = layout_;
  c.maxBlocks = maxBlocks_;
  c.llMaxBytes = llMax_;
  c.abortFlag = devWords_;
  c.errorWord = devWords_ + 1;
  const auto t = op.timeout.count() > 0 ? op.timeout : comm.config().timeout;
  c.timeoutNs = static_cast<uint64_t>(t.count()) * 1'000'000ull;
  timeout_ = t;  // for the message, should this call time out
  ipc::launch(c, stream);
}

// Bytes an operation reads from its send buffer and writes to its receive buffer, on this rank.
std::pair<size_t, size_t> stagedBytes(const Op& op, int rank, int n) {
  const size_t e = dataTypeSize(op.type);
  const size_t c = op.count * e;
  const auto N = static_cast<size_t>(n);
  switch (op.kind) {
    case OpKind::AllReduce:
      return {c, c};
    case OpKind::ReduceScatter:
      return {c * N, c};
    case OpKind::AllGather:
      return {c, c * N};
    case OpKind::Broadcast:
      return {rank == op.root ? c : 0, c};
    case OpKind::Reduce:
      return {c, rank == op.root ? c : 0};
    case OpKind::AllToAll:
      return {c * N, c * N};
    case OpKind::AllToAllv: {
      size_t in = 0, out = 0;
      for (size_t r = 0; r < N; ++r) {
        in = std::max(in, (op.sendDispls[r] + op.sendCounts[r]) * e);
        out = std::max(out, (op.recvDispls[r] + op.recvCounts[r]) * e);
      }
      return {in, out};
    }
    case OpKind::Send:
      return {c, 0};
    case OpKind::Recv:
      return {0, c};
    case OpKind::Barrier:
      return {0, 0};
  }
  return {0, 0};
}

bool within(const void* p, const void* base, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto b = reinterpret_cast<uintptr_t>(base);
  return bytes > 0 && a >= b && a < b + bytes;
}

void DeviceComm::staged(const std::shared_ptr<CommImpl>& comm, Op op, cudaStream_t stream) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capturing), rank_, "cudaStreamIsCapturing");
  if (capturing != cudaStreamCaptureStatusNone) {
    fail(chorusInvalidUsage, strCat("rank ", rank_, ": ", opKindName(op.kind),
                                    " on device buffers is staged through host memory here and cannot be "
                                    "captured in a CUDA graph (only collectives over CUDA IPC can)"));
  }
  const auto [inBytes, outBytes] = stagedBytes(op, rank_, size_);
  // One pinned buffer when the call is in place (one buffer inside the other), else two. A
  // non-root of Reduce still gets a receive buffer (unused, never copied back).
  const size_t outAlloc = op.kind == OpKind::Reduce ? op.count * dataTypeSize(op.type) : outBytes;
  auto out = std::make_shared<Pinned>(outAlloc, false, rank_);
  std::shared_ptr<Pinned> in;
  std::byte* hostSend = nullptr;
  std::byte* hostRecv = out->get();
  if (inBytes > 0 && within(op.send, op.recv, outBytes)) {
    hostSend = out->get() + (static_cast<const std::byte*>(op.send) - static_cast<const std::byte*>(op.recv));
  } else if (inBytes > 0) {
    in = std::make_shared<Pinned>(inBytes, false, rank_);
    hostSend = in->get();
    if (outBytes > 0 && within(op.recv, op.send, inBytes)) {
      hostRecv = in->get() + (static_cast<std::byte*>(op.recv) - static_cast<const std::byte*>(op.send));
      out.reset();
    }
  }
  check(cudaStreamSynchronize(stream), rank_, "cudaStreamSynchronize before a staged call");
  if (inBytes > 0)
    check(cudaMemcpy(hostSend, op.send, inBytes, cudaMemcpyDefault), rank_, "staging copy to host");
  void* devRecv = op.recv;
  const bool hasRecv = op.recv != nullptr;
  // A non-root of Broadcast passes its receive buffer as the (unread) send buffer.
  op.send = hostSend ? hostSend : (op.send ? hostRecv : nullptr);
  op.recv = hasRecv ? hostRecv : nullptr;
  const int rank = rank_;
  auto copyBack = [in, out, hostRecv, devRecv, outBytes, stream, rank] {
    if (outBytes == 0) return;
    check(cudaMemcpyAsync(devRecv, hostRecv, outBytes, cudaMemcpyDefault, stream), rank,
          "staging copy to device");
    check(cudaStreamSynchronize(stream), rank, "cudaStreamSynchronize after a staged call");
  };
  if (group::active()) {
    group::add(comm, std::move(op));
    group::defer(std::move(copyBack));
    return;
  }
  comm->runBlocking(op);
  copyBack();
}

// Device memory of this rank's device (kernels can use it), or any other memory cudaMemcpy takes.
bool onDevice(const void* p, int device, int rank, const char* what, OpKind kind) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (attr.type == cudaMemoryTypeDevice && attr.device != device) {
    fail(chorusInvalidArgument,
         strCat("rank ", rank, ": ", opKindName(kind), ": the ", what, " buffer is on device ", attr.device,
                " but this rank uses device ", device, " (cudaSetDevice before the call)"));
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

DeviceComm& stateOf(CommImpl& comm) {
  std::lock_guard lk(comm.deviceMutex());
  auto& slot = comm.deviceState();
  if (!slot) {
    auto d = std::make_shared<DeviceComm>(comm);
    comm.setAbortHook([w = std::weak_ptr<DeviceComm>(d)] {
      if (auto p = w.lock()) p->abortKernels();
    });
    slot = d;
  }
  return *static_cast<DeviceComm*>(slot.get());
}

}  // namespace

bool built() { return true; }

void enqueue(const std::shared_ptr<CommImpl>& comm, Op op, void* streamv) {
  CommImpl& c = *comm;
  c.validate(op);
  op.timeout = c.callTimeout();
  c.checkUsable();
  DeviceComm& d = stateOf(c);
  d.throwIfFailed();
  auto stream = static_cast<cudaStream_t>(streamv);
  if (d.ipc() && kernelKind(op.kind)) {
    const bool sends = op.kind != OpKind::Broadcast || op.root == c.rank();
    const bool receives = op.kind != OpKind::Reduce || op.root == c.rank();
    const bool dev = (!sends || onDevice(op.send, d.device(), c.rank(), "send", op.kind)) &&
                     (!receives || onDevice(op.recv, d.device(), c.rank(), "receive", op.kind));
    // Every rank must take the same path: the kernel path needs device memory on all of them, which
    // the API requires of device calls (host memory with a stream is staged, on every rank alike).
    if (dev) {
      if (op.count > 0) d.launch(c, op, stream);
      return;
    }
  }
  d.staged(comm, std::move(op), stream);
}

chorusResult_t asyncError(CommImpl& comm, std::string* message) {
  std::shared_ptr<void> state;
  {
    std::lock_guard lk(comm.deviceMutex());
    state = comm.deviceState();
  }
  if (!state) return chorusSuccess;
  return static_cast<DeviceComm*>(state.get())->error(message);
}

}  // namespace chorus::device
