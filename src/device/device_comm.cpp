// Device-buffer calls (core/device.hpp): the per-communicator CUDA state, made by the first call
// that passes a stream, and the choice between a kernel over CUDA IPC and staging through pinned
// host memory.
//
// Set-up (collective, over the communicator's host transport): every rank allocates its workspace
// (ipc_layout.hpp), exports it with cudaIpcGetMemHandle and all-gathers {pid, device, UUID, SMs,
// handle, address}. When every rank is on this host and there are at most ipc::kMaxRanks of them,
// each maps the peers' workspaces: the address itself for a rank of the same process (ranks as
// threads; another device's memory through peer access), cudaIpcOpenMemHandle otherwise. Several
// ranks of one process may share a GPU (their kernels run side by side); ranks of different
// processes on one GPU take the staged path unless CHORUS_CUDA_SHARED_GPU=ipc (their kernels are
// time-sliced without MPS). If any rank cannot map every peer, all use the staged path.
//
// Threads as ranks: nothing here may wait for the whole device once a peer's kernel can be waiting
// for this thread (cudaFree, cudaFreeHost, cudaMemcpy on the legacy stream): all allocations happen
// before set-up's last exchange, staging buffers are pooled and freed only with the communicator,
// and copies go on the call's stream.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "base/error.hpp"
#include "base/log.hpp"
#include "core/api.hpp"
#include "core/comm_impl.hpp"
#include "core/device.hpp"
#include "core/group.hpp"
#include "kernels/cuda/ipc_collectives.hpp"
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

// Relaxed stream-capture mode for this thread while it lives: set-up may run while another thread
// (or this one) captures a graph.
struct RelaxedCapture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode); }
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;
};

// The communicator's device current while it lives (one thread may drive several devices).
struct OnDevice {
  int previous = -1;
  explicit OnDevice(int device) {
    if (cudaGetDevice(&previous) != cudaSuccess) {
      (void)cudaGetLastError();
      previous = -1;
    }
    if (previous != device && device >= 0) (void)cudaSetDevice(device);
  }
  ~OnDevice() {
    int now = -1;
    if (previous >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous) (void)cudaSetDevice(previous);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
};

// Tells this process from any other, even in another container with the same pid.
uint64_t processNonce() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  }();
  return nonce;
}

// Pinned staging buffers, reused and freed only with the pool (cudaFreeHost waits for the device).
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  explicit PinnedPool(int rank) : rank_(rank) {}
  /// At least `bytes` of pinned memory until the returned pointer is dropped.
  std::shared_ptr<Pinned> acquire(size_t bytes) {
    std::unique_ptr<Pinned> buf;
    {
      std::lock_guard lk(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if ((*it)->size() >= bytes && (best == free_.end() || (*it)->size() < (*best)->size())) best = it;
      }
      if (best != free_.end()) {
        buf = std::move(*best);
        free_.erase(best);
      }
    }
    if (!buf) buf = std::make_unique<Pinned>(std::max<size_t>(bytes, 4096), false, rank_);
    Pinned* raw = buf.release();
    return std::shared_ptr<Pinned>(raw, [pool = shared_from_this()](Pinned* p) {
      std::lock_guard lk(pool->mu_);
      pool->free_.emplace_back(p);
    });
  }

 private:
  int rank_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Pinned>> free_;
};

// What each rank tells the others at set-up.
struct PeerInfo {
  int32_t hasDevice = 0;
  int32_t device = -1;
  int32_t sms = 0;
  int32_t workspaceOk = 0;
  int32_t sharedGpuIpc = 0;  // rank 0's CHORUS_CUDA_SHARED_GPU=ipc holds for all
  int32_t ipcOff = 0;        // rank 0's CHORUS_CUDA_IPC=0 holds for all
  int32_t setUpOk = 0;       // this rank's own allocations succeeded
  uint8_t uuid[16] = {};
  uint64_t process = 0;  // processNonce()
  uint64_t address = 0;
  uint64_t stageBytes = 0;  // rank 0's settings hold for all
  uint64_t llBytes = 0;
  uint64_t p2pChunkBytes = 0;
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
         k == OpKind::Broadcast || k == OpKind::Reduce || k == OpKind::AllToAll;
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
    case OpKind::AllToAll:
      return ipc::Kind::AllToAll;
    default:
      return ipc::Kind::AllReduce;
  }
}

bool onDevice(const void* p, int device, int rank, const char* what, OpKind kind);

// Sends and receives with their streams, run as one kernel.
using P2pList = std::vector<std::pair<Op, cudaStream_t>>;

class DeviceComm;
// The sends and receives of this thread's current group, per communicator, until the group ends
// (thread-local, as the group is).
thread_local std::vector<std::pair<DeviceComm*, std::shared_ptr<P2pList>>> tGroupP2p;

class DeviceComm {
 public:
  /// Collective. `device` < 0: the calling thread's current device.
  DeviceComm(CommImpl& comm, int device);
  /// Waits for this rank's kernels (after which no peer touches its workspace), then frees.
  ~DeviceComm();
  DeviceComm(const DeviceComm&) = delete;
  DeviceComm& operator=(const DeviceComm&) = delete;

  bool ipc() const { return ipc_; }
  /// Send/recv (and all-to-all-v) run as kernels: over CUDA IPC, with every lane resident.
  bool p2pKernels() const { return ipc_ && p2pCap_ > 0; }
  int device() const { return device_; }
  void launch(CommImpl& comm, const Op& op, cudaStream_t stream);
  /// A send or receive over CUDA IPC: launched at once, or in a group with the group's others (of
  /// this communicator) as one kernel at the group's end.
  void p2p(const std::shared_ptr<CommImpl>& comm, const Op& op, cudaStream_t stream);
  /// AllToAllv as one send/recv kernel (a send to and a receive from every rank), enqueued at once.
  void allToAllv(CommImpl& comm, const Op& op, cudaStream_t stream);
  void staged(const std::shared_ptr<CommImpl>& comm, Op op, cudaStream_t stream);
  chorusResult_t error(std::string* message) const;
  void abortKernels() {
    if (words_) std::atomic_ref<uint32_t>(reinterpret_cast<uint32_t*>(words_->get())[0]).store(1);
  }
  void throwIfFailed() const {
    std::string text;
    if (const chorusResult_t code = error(&text); code != chorusSuccess) fail(code, text);
  }

 private:
  void mapPeers(const std::vector<PeerInfo>& info, std::string* why);
  bool capturing(cudaStream_t stream) const;
  // Calls on one communicator run in call order even on different streams (as NCCL's do): each
  // waits for the event recorded after the one before. Not across graph captures: replays of a
  // captured call must be ordered with this communicator's other calls by the caller.
  void orderAfterPrevious(cudaStream_t stream);
  void markDone(cudaStream_t stream);
  void launchP2p(CommImpl& comm, const P2pList& ops);

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
  int p2pCap_ = 0;  // channels (blocks) per send or receive; 0: send/recv staged
  // Host-mapped words: [0] abort flag, [1] error word, [2] the ticket of the last staged operation
  // the host finished, [3] of the last it began.
  std::unique_ptr<Pinned> words_;
  uint32_t* devWords_ = nullptr;
  Event order_;           // recorded after this rank's latest call (outside captures)
  Event join_;            // joins the streams of a group's sends and receives
  bool ordered_ = false;  // order_ has been recorded
  std::shared_ptr<PinnedPool> pool_;
  // Staged operations in flight outside groups: their buffers and events until the copy back is done.
  struct InFlight {
    std::shared_ptr<Pinned> in, out;
    cudaEvent_t copiedIn = nullptr;    // the input is in host memory
    cudaEvent_t copiedBack = nullptr;  // the output is back on the device
    uint32_t ticket = 0;               // the host is done with the buffers once words[2] reaches it
  };
  std::mutex stagedMu_;  // staged tickets in the order of the communicator's own
  std::deque<InFlight> inFlight_;
  std::vector<cudaEvent_t> freeEvents_;
  uint32_t stagedTicket_ = 0;
  cudaEvent_t takeEvent();
  void reapInFlight();
  std::atomic<int64_t> timeoutMs_{0};  // of the latest call, for the message (read by other threads)
};

DeviceComm::DeviceComm(CommImpl& comm, int device)
    : rank_(comm.rank()), size_(comm.size()), pool_(std::make_shared<PinnedPool>(comm.rank())) {
  const EnvConfig& env = envConfig();
  const RelaxedCapture relaxed;  // every CUDA call below, until the end of set-up
  PeerInfo mine;
  mine.process = processNonce();
  mine.stageBytes = env.cudaStageBytes;
  mine.llBytes = env.cudaLlBytes;
  mine.p2pChunkBytes = env.cudaP2pChunkBytes;
  mine.sharedGpuIpc = env.cudaSharedGpuIpc ? 1 : 0;
  mine.ipcOff = env.cudaIpc ? 0 : 1;
  // A rank without a device fails at once (its peers, if they have one, time out in set-up); other
  // failures are told to the peers through the exchanges, so that all fail with the reason.
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    copyText(mine.why, sizeof mine.why,
             e != cudaSuccess ? strCat("cudaGetDeviceCount: ", cudaText(e)) : std::string("no CUDA device"));
  } else if (device >= devices) {
    copyText(mine.why, sizeof mine.why, strCat("device ", device, " was asked for but there are ", devices));
  } else if (e = device >= 0 ? cudaSetDevice(device) : cudaGetDevice(&device_); e != cudaSuccess) {
    (void)cudaGetLastError();
    copyText(mine.why, sizeof mine.why, strCat("cudaSetDevice/cudaGetDevice: ", cudaText(e)));
  } else {
    if (device >= 0) device_ = device;
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
  if (!mine.hasDevice)
    fail(chorusInvalidUsage,
         strCat("rank ", rank_, ": device buffers (a stream was given) need a CUDA device: ", mine.why));
  const OnDevice on(device_);
  // Everything this rank allocates but the workspace, before the first exchange, so that a failure
  // reaches every rank (and because once set-up's last exchange returns a peer's kernel may wait
  // for this thread, while some allocations wait for the whole device).
  try {
    words_ = std::make_unique<Pinned>(4 * sizeof(uint32_t), true, rank_);
    std::memset(words_->get(), 0, 4 * sizeof(uint32_t));
    void* mapped = nullptr;
    check(cudaHostGetDevicePointer(&mapped, words_->get(), 0), rank_, "cudaHostGetDevicePointer");
    devWords_ = static_cast<uint32_t*>(mapped);
    check(cudaEventCreateWithFlags(&order_.e, cudaEventDisableTiming), rank_, "cudaEventCreate");
    check(cudaEventCreateWithFlags(&join_.e, cudaEventDisableTiming), rank_, "cudaEventCreate");
    mine.setUpOk = 1;
  } catch (const Error& e) {
    copyText(mine.why, sizeof mine.why, e.what());
  }
  auto info = allGather(comm, mine);
  for (int r = 0; r < size_; ++r) {
    if (!info[static_cast<size_t>(r)].setUpOk)
      fail(chorusSystemError, strCat("rank ", rank_, ": device set-up failed on rank ", r, ": ",
                                     info[static_cast<size_t>(r)].why));
  }
  layout_ = ipc::makeLayout(info[0].stageBytes, info[0].llBytes, info[0].p2pChunkBytes,
                            std::min(size_, ipc::kMaxRanks));
  llMax_ = info[0].llBytes;
  timeoutMs_ = (comm.callTimeout().count() > 0 ? comm.callTimeout() : comm.config().timeout).count();

  // Everyone decides alike, from the same information.
  std::string why;
  bool candidate = size_ <= ipc::kMaxRanks;
  if (!candidate) why = strCat(size_, " ranks (CUDA IPC collectives take at most ", ipc::kMaxRanks, ")");
  if (info[0].ipcOff) {
    candidate = false;
    why = "CHORUS_CUDA_IPC=0";
  }
  const auto& topo = comm.topology();
  for (int r = 0; candidate && r < size_; ++r) {
    const PeerInfo& pr = info[static_cast<size_t>(r)];
    if (topo.ranks[static_cast<size_t>(r)].host != topo.ranks[0].host) {
      candidate = false;
      why = strCat("rank ", r, " is on another host");
    }
    for (int q = 0; candidate && q < r; ++q) {
      const PeerInfo& pq = info[static_cast<size_t>(q)];
      if (pq.process != pr.process && std::memcmp(pq.uuid, pr.uuid, 16) == 0 && !info[0].sharedGpuIpc) {
        candidate = false;
        why = strCat("ranks ", q, " and ", r,
                     " are processes sharing one GPU, whose kernels are time-sliced "
                     "(CHORUS_CUDA_SHARED_GPU=ipc uses CUDA IPC anyway, e.g. under MPS)");
      }
    }
  }
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
    info = allGather(comm, me);
    for (int r = 0; candidate && r < size_; ++r) {
      if (!info[static_cast<size_t>(r)].workspaceOk) {
        candidate = false;
        why = info[static_cast<size_t>(r)].why;
      }
    }
    MapResult mapResult;
    if (candidate) {
      std::string mapWhy;
      mapPeers(info, &mapWhy);
      mapResult.ok = mapWhy.empty() ? 1 : 0;
      copyText(mapResult.why, sizeof mapResult.why, mapWhy);
    }
    const auto all = allGather(comm, mapResult);
    ipc_ = candidate;
    for (const auto& m : all) {
      if (candidate && !m.ok) {
        ipc_ = false;
        why = m.why;
        break;
      }
    }
  }
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
    // A send/recv kernel has a block per direction, peer and channel, up to maxBlocks_ in all, so
    // that all are resident at once (or else send/recv is staged, on every rank alike).
    p2pCap_ = std::min(maxBlocks_ / (2 * size_), ipc::kP2pChannels);
    logInfo(Subsys::Init, "rank ", rank_, ": device buffers over CUDA IPC on device ", device_, ", ", size_,
            " ranks, up to ", maxBlocks_, " blocks per kernel, stage ", layout_.stageBytes,
            " bytes, LL up to ", llMax_, " bytes, send/recv ",
            p2pCap_ > 0 ? strCat(p2pCap_, " channel(s) of ", layout_.p2pSlotBytes, "-byte chunks")
                        : strCat("staged (", maxBlocks_, " blocks cannot hold 2 x ", size_, " lanes)"));
  } else {
    // No peer maps this rank's workspace: it can go (cudaFree waits for the device, but no kernel
    // of this communicator has been launched).
    opened_.reset();
    own_.reset();
    logInfo(Subsys::Init, "rank ", rank_, ": device buffers staged through pinned host memory on device ",
            device_, ": ", why);
  }
}

DeviceComm::~DeviceComm() {
  const OnDevice on(device_);
  if (ordered_ && cudaEventSynchronize(order_.e) != cudaSuccess) (void)cudaGetLastError();
  for (const InFlight& f : inFlight_) freeEvents_.insert(freeEvents_.end(), {f.copiedIn, f.copiedBack});
  inFlight_.clear();
  for (cudaEvent_t e : freeEvents_) {
    if (cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
  }
}

cudaEvent_t DeviceComm::takeEvent() {
  if (!freeEvents_.empty()) {
    cudaEvent_t e = freeEvents_.back();
    freeEvents_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), rank_, "cudaEventCreate");
  return e;
}

// Staged operations whose copy back is done give back their buffers and events (in call order:
// one stream's work completes in order, and later calls wait for earlier ones).
void DeviceComm::reapInFlight() {
  const uint32_t finished = std::atomic_ref<uint32_t>(reinterpret_cast<uint32_t*>(words_->get())[2]).load();
  while (!inFlight_.empty()) {
    const InFlight& f = inFlight_.front();
    // Both: the stream may give up on the host (abort) before the host has run the operation.
    if (static_cast<int32_t>(finished - f.ticket) < 0) return;
    const cudaError_t e = cudaEventQuery(f.copiedBack);
    if (e != cudaSuccess) {
      if (e != cudaErrorNotReady) (void)cudaGetLastError();  // a broken context: keep them
      return;
    }
    freeEvents_.insert(freeEvents_.end(), {f.copiedIn, f.copiedBack});
    inFlight_.pop_front();
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
    if (peer.process == me.process) {
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

bool DeviceComm::capturing(cudaStream_t stream) const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &status), rank_, "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

void DeviceComm::orderAfterPrevious(cudaStream_t stream) {
  if (ordered_) check(cudaStreamWaitEvent(stream, order_.e, 0), rank_, "cudaStreamWaitEvent");
}

void DeviceComm::markDone(cudaStream_t stream) {
  check(cudaEventRecord(order_.e, stream), rank_, "cudaEventRecord");
  ordered_ = true;
}

chorusResult_t DeviceComm::error(std::string* message) const {
  if (!words_) return chorusSuccess;
  const uint32_t w = std::atomic_ref<uint32_t>(reinterpret_cast<uint32_t*>(words_->get())[1]).load();
  if (w == 0) return chorusSuccess;
  const uint32_t why = w >> 16;
  const int peer = static_cast<int>(w & 0xFFFF) - 1;
  if (why == ipc::kErrStaged) {
    if (message)
      *message =
          strCat("rank ", rank_, ": an operation staged through host memory did not finish within twice ",
                 timeoutMs_.load() / 1000.0, " s");
    return chorusTimeout;
  }
  if (why == ipc::kErrP2pSize) {
    if (message)
      *message = strCat("rank ", rank_, ": a device receive from rank ", peer,
                        " met a send of another size (a send's count and type must match its receive's)");
    return chorusInvalidUsage;
  }
  if (why == ipc::kErrAborted) {
    if (message)
      *message = strCat("rank ", rank_, ": a device collective was stopped: the communicator was aborted");
    return chorusRemoteError;
  }
  if (message) {
    *message = strCat("rank ", rank_, ": a device collective timed out after ", timeoutMs_.load() / 1000.0,
                      " s waiting for rank ", peer,
                      " (it never made the matching call: every rank must issue the same device calls in the "
                      "same order)");
  }
  return chorusTimeout;
}

void DeviceComm::launch(CommImpl& comm, const Op& op, cudaStream_t stream) {
  throwIfFailed();
  const bool captured = capturing(stream);
  if (!captured) orderAfterPrevious(stream);
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
  timeoutMs_ = t.count();  // for the message, should this call time out
  ipc::launch(c, stream);
  if (!captured) markDone(stream);
}

void DeviceComm::p2p(const std::shared_ptr<CommImpl>& comm, const Op& op, cudaStream_t stream) {
  if (!group::active()) {
    launchP2p(*comm, P2pList{{op, stream}});
    return;
  }
  // In a group, all of this communicator's sends and receives run as one kernel at the group's
  // end (after its collectives, as on the host), launched before anything there waits, so that
  // the two ends of an exchange never wait for each other's next kernel.
  auto it = std::find_if(tGroupP2p.begin(), tGroupP2p.end(), [&](const auto& e) { return e.first == this; });
  if (it == tGroupP2p.end()) {
    auto list = std::make_shared<P2pList>();
    group::launch([this, comm, list] {
      std::erase_if(tGroupP2p, [&](const auto& e) { return e.second == list; });
      const OnDevice on(device_);
      launchP2p(*comm, *list);
    });
    tGroupP2p.emplace_back(this, list);
    it = tGroupP2p.end() - 1;
  }
  // Refused here, on the call that goes over, rather than at the group's end.
  if (it->second->size() >= static_cast<size_t>(ipc::kMaxP2pOps)) {
    fail(chorusInvalidUsage,
         strCat("rank ", rank_, ": ", opKindName(op.kind), ": a group holds at most ", ipc::kMaxP2pOps,
                " sends and receives of device buffers per communicator (they run as one "
                "kernel)"));
  }
  it->second->emplace_back(op, stream);
}

void DeviceComm::launchP2p(CommImpl& comm, const P2pList& ops) {
  throwIfFailed();
  if (ops.empty()) return;
  if (ops.size() > static_cast<size_t>(ipc::kMaxP2pOps)) {
    fail(chorusInvalidUsage, strCat("rank ", rank_, ": a group holds ", ops.size(),
                                    " sends and receives of device buffers on one communicator; at most ",
                                    ipc::kMaxP2pOps, " run together"));
  }
  ipc::P2pCall c;
  ipc::P2pArgs& a = c.args;
  for (int r = 0; r < size_; ++r) a.ws[r] = static_cast<ipc::Byte*>(ws_[r]);
  a.layout = layout_;
  a.rank = rank_;
  a.nranks = size_;
  a.channelsCap = p2pCap_;
  for (const auto& [op, s] : ops) {
    const bool send = op.kind == OpKind::Send;
    a.ops[a.nOps++] = ipc::P2pOp{static_cast<ipc::Byte*>(send ? const_cast<void*>(op.send) : op.recv),
                                 op.messageBytes(), op.peer, send ? 1 : 0};
  }
  if (ipc::planP2pLanes(a) == 0) return;  // empty messages only
  c.abortFlag = devWords_;
  c.errorWord = devWords_ + 1;
  const auto t = ops.front().first.timeout.count() > 0 ? ops.front().first.timeout : comm.config().timeout;
  c.timeoutNs = static_cast<uint64_t>(t.count()) * 1'000'000ull;
  timeoutMs_ = t.count();
  const cudaStream_t stream = ops.front().second;
  std::vector<cudaStream_t> others;
  for (const auto& [op, s] : ops) {
    if (s != stream && std::find(others.begin(), others.end(), s) == others.end()) others.push_back(s);
  }
  const bool captured = capturing(stream);
  for (cudaStream_t s : others) {
    if (capturing(s) != captured)
      fail(chorusInvalidUsage, strCat("rank ", rank_,
                                      ": the sends and receives of a group are on streams of which some are "
                                      "being captured into a CUDA graph and some are not"));
  }
  if (!captured) orderAfterPrevious(stream);
  for (cudaStream_t s : others) {  // the kernel starts once every stream of the group got there
    check(cudaEventRecord(join_.e, s), rank_, "cudaEventRecord");
    check(cudaStreamWaitEvent(stream, join_.e, 0), rank_, "cudaStreamWaitEvent");
  }
  ipc::launchP2p(c, stream);
  if (!captured) markDone(stream);
  if (!others.empty()) {  // and every stream goes on once it is done
    check(cudaEventRecord(join_.e, stream), rank_, "cudaEventRecord");
    for (cudaStream_t s : others) check(cudaStreamWaitEvent(s, join_.e, 0), rank_, "cudaStreamWaitEvent");
  }
}

void DeviceComm::allToAllv(CommImpl& comm, const Op& op, cudaStream_t stream) {
  P2pList list;
  const size_t e = dataTypeSize(op.type);
  for (int q = 0; q < size_; ++q) {
    const auto Q = static_cast<size_t>(q);
    Op send = op, recv = op;  // an empty block's buffer and displacement are never used
    send.kind = OpKind::Send;
    send.peer = q;
    send.count = op.sendCounts[Q];
    if (send.count > 0) send.send = static_cast<const std::byte*>(op.send) + op.sendDispls[Q] * e;
    recv.kind = OpKind::Recv;
    recv.peer = q;
    recv.count = op.recvCounts[Q];
    if (recv.count > 0) recv.recv = static_cast<std::byte*>(op.recv) + op.recvDispls[Q] * e;
    for (Op* o : {&send, &recv}) {
      o->sendCounts.clear();
      o->sendDispls.clear();
      o->recvCounts.clear();
      o->recvDispls.clear();
      if (o->count > 0) list.emplace_back(std::move(*o), stream);
    }
  }
  launchP2p(comm, list);
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
      for (size_t r = 0; r < N; ++r) {  // an empty block's displacement is never used
        if (op.sendCounts[r] > 0) in = std::max(in, (op.sendDispls[r] + op.sendCounts[r]) * e);
        if (op.recvCounts[r] > 0) out = std::max(out, (op.recvDispls[r] + op.recvCounts[r]) * e);
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

// [p, p + bytes) lies inside [base, base + baseBytes).
bool inside(const void* p, size_t bytes, const void* base, size_t baseBytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto b = reinterpret_cast<uintptr_t>(base);
  return bytes > 0 && a >= b && a + bytes <= b + baseBytes;
}

void DeviceComm::staged(const std::shared_ptr<CommImpl>& comm, Op op, cudaStream_t stream) {
  if (capturing(stream)) {
    fail(chorusInvalidUsage, strCat("rank ", rank_, ": ", opKindName(op.kind),
                                    " on device buffers is staged through host memory here and cannot be "
                                    "captured in a CUDA graph (only collectives over CUDA IPC can)"));
  }
  const auto [inBytes, outBytes] = stagedBytes(op, rank_, size_);
  // One pinned buffer when the call is in place (one buffer inside the other), else two. A
  // non-root of Reduce still gets a receive buffer (unused, never copied back).
  const size_t outAlloc = op.kind == OpKind::Reduce ? op.count * dataTypeSize(op.type) : outBytes;
  std::shared_ptr<Pinned> out = pool_->acquire(outAlloc);
  std::shared_ptr<Pinned> in;
  std::byte* hostSend = nullptr;
  std::byte* hostRecv = out->get();
  if (inside(op.send, inBytes, op.recv, outBytes)) {
    hostSend = out->get() + (static_cast<const std::byte*>(op.send) - static_cast<const std::byte*>(op.recv));
  } else if (inBytes > 0) {
    in = pool_->acquire(inBytes);
    hostSend = in->get();
    if (inside(op.recv, outBytes, op.send, inBytes)) {
      hostRecv = in->get() + (static_cast<std::byte*>(op.recv) - static_cast<const std::byte*>(op.send));
      out.reset();
    }
  }
  const void* devSend = op.send;
  void* devRecv = op.recv;
  const bool hasRecv = op.recv != nullptr;
  // A non-root of Broadcast passes its receive buffer as the (unread) send buffer.
  op.send = hostSend ? hostSend : (op.send ? hostRecv : nullptr);
  op.recv = hasRecv ? hostRecv : nullptr;
  // The input once the stream (and this communicator's previous call) has produced it; the output
  // back on the stream. Both on the call's stream: a copy on the legacy stream would wait for
  // every blocking stream, a peer's waiting kernel among them.
  // `comm` keeps this DeviceComm (its device state) alive until the lambdas have run.
  auto copyIn = [this, comm, devSend, hostSend, inBytes, stream] {
    const OnDevice on(device_);
    orderAfterPrevious(stream);
    if (inBytes > 0)
      check(cudaMemcpyAsync(hostSend, devSend, inBytes, cudaMemcpyDefault, stream), rank_,
            "staging copy to host");
    check(cudaStreamSynchronize(stream), rank_, "cudaStreamSynchronize before a staged call");
  };
  auto copyBack = [this, comm, in, out, hostRecv, devRecv, outBytes, stream] {
    const OnDevice on(device_);
    if (outBytes > 0)
      check(cudaMemcpyAsync(devRecv, hostRecv, outBytes, cudaMemcpyDefault, stream), rank_,
            "staging copy to device");
    markDone(stream);
    check(cudaStreamSynchronize(stream), rank_, "cudaStreamSynchronize after a staged call");
  };
  if (group::active()) {
    // At the group's end: kernels launched in the group (for peers driven by this thread too) are
    // all enqueued by then. The group returns when done.
    group::add(comm, std::move(op));
    group::prepare(std::move(copyIn));
    group::defer(std::move(copyBack));
    return;
  }
  // Host memory on the caller's side: copies between host buffers are synchronous, so the call
  // runs to completion, as in a group.
  const bool callerOnDevice =
      (inBytes == 0 || onDevice(devSend, device_, rank_, "send", OpKind::Barrier)) &&
      (outBytes == 0 || onDevice(devRecv, device_, rank_, "receive", OpKind::Barrier));
  if (!callerOnDevice) {
    copyIn();
    comm->runBlocking(op);
    copyBack();
    return;
  }
  // Outside a group, enqueued like a kernel and the call returns: on the stream, the copy to host
  // memory, a one-thread kernel that holds the stream until the host has run the operation, and
  // the copy back. The host runs it on the communicator's worker, in call order with every other
  // operation of the communicator, once the copy to host memory is done.
  const OnDevice on(device_);
  const std::lock_guard lk(stagedMu_);
  reapInFlight();
  auto* words = reinterpret_cast<uint32_t*>(words_->get());
  const uint32_t ticket = ++stagedTicket_;
  inFlight_.push_back({in, out, takeEvent(), takeEvent(), ticket});
  const cudaEvent_t copiedIn = inFlight_.back().copiedIn, copiedBack = inFlight_.back().copiedBack;
  // Should anything below fail once the wait kernel may be enqueued, the stream must not wait for
  // a host operation that will never run: released here (and the error thrown).
  struct Release {
    uint32_t* words;
    uint32_t ticket;
    bool armed = true;
    ~Release() {
      if (!armed) return;
      std::atomic_ref<uint32_t>(words[3]).store(ticket, std::memory_order_release);
      std::atomic_ref<uint32_t>(words[2]).store(ticket, std::memory_order_release);
    }
  } release{words, ticket};
  orderAfterPrevious(stream);
  if (inBytes > 0)
    check(cudaMemcpyAsync(hostSend, devSend, inBytes, cudaMemcpyDefault, stream), rank_,
          "staging copy to host");
  check(cudaEventRecord(copiedIn, stream), rank_, "cudaEventRecord");
  const auto t = op.timeout.count() > 0 ? op.timeout : comm->config().timeout;
  timeoutMs_ = t.count();
  // From when the host begins: the wait for the copy, then the operation, each within the timeout.
  ipc::launchWaitForHost(devWords_ + 2, devWords_ + 3, ticket, devWords_, devWords_ + 1,
                         2 * static_cast<uint64_t>(t.count()) * 1'000'000ull, stream);
  if (outBytes > 0)
    check(cudaMemcpyAsync(devRecv, hostRecv, outBytes, cudaMemcpyDefault, stream), rank_,
          "staging copy to device");
  check(cudaEventRecord(copiedBack, stream), rank_, "cudaEventRecord");
  markDone(stream);
  // Not `comm` in the hooks: the worker must never hold the last reference to its communicator.
  CommImpl::Hooks hooks;
  hooks.before = [copiedIn, words, ticket, t, rank = rank_, device = device_] {
    std::atomic_ref<uint32_t>(words[3]).store(ticket, std::memory_order_release);
    if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();  // no context made on device 0
    const auto deadline = std::chrono::steady_clock::now() + t;
    cudaError_t e;
    while ((e = cudaEventQuery(copiedIn)) == cudaErrorNotReady) {
      if (std::atomic_ref<uint32_t>(words[0]).load() != 0)
        fail(chorusRemoteError, strCat("rank ", rank, ": the communicator was aborted"));
      if (std::chrono::steady_clock::now() > deadline) {
        fail(chorusTimeout, strCat("rank ", rank,
                                   ": the input of a staged operation did not reach host memory "
                                   "within ",
                                   t.count() / 1000.0, " s (its stream did not get there)"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    check(e, rank, "waiting for the staging copy to host memory");
  };
  // Also after a failure (reported by asyncError): the stream goes on rather than wait.
  hooks.after = [words, ticket](chorusResult_t) {
    std::atomic_ref<uint32_t>(words[2]).store(ticket, std::memory_order_release);
  };
  comm->submit({std::move(op)}, true, std::move(hooks));
  release.armed = false;
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

// The communicator's device state, set up (collectively) on first use.
DeviceComm& stateOf(CommImpl& comm, int device = -1) {
  std::lock_guard lk(comm.deviceMutex());
  auto& slot = comm.deviceState();
  if (!slot) {
    auto d = std::make_shared<DeviceComm>(comm, device);
    comm.setAbortHook([w = std::weak_ptr<DeviceComm>(d)] {
      if (auto p = w.lock()) p->abortKernels();
    });
    slot = d;
  }
  return *static_cast<DeviceComm*>(slot.get());
}

}  // namespace

bool built() { return true; }

bool available(std::string* state) {
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    if (state)
      *state =
          strCat("built, not usable here: ", e != cudaSuccess ? cudaText(e) : std::string("no CUDA device"));
    return false;
  }
  if (state) {
    *state = strCat("yes: ", n, " device(s):");
    for (int d = 0; d < n; ++d) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, d) == cudaSuccess) {
        *state += strCat(d == 0 ? " " : "; ", prop.name, " (sm_", prop.major, prop.minor, ", ",
                         prop.totalGlobalMem >> 30, " GiB)");
      } else {
        (void)cudaGetLastError();
      }
    }
  }
  return true;
}

void enqueue(const std::shared_ptr<CommImpl>& comm, Op op, void* streamv) {
  CommImpl& c = *comm;
  c.validate(op);
  op.timeout = c.callTimeout();
  c.checkUsable();
  DeviceComm& d = stateOf(c);
  d.throwIfFailed();
  const OnDevice on(d.device());
  auto stream = static_cast<cudaStream_t>(streamv);
  if (d.p2pKernels() && op.isPointToPoint()) {
    // The peer takes the same path when it passes device memory too (which device calls require).
    const void* buf = op.kind == OpKind::Send ? op.send : op.recv;
    if (op.count == 0) return;
    if (onDevice(buf, d.device(), c.rank(), op.kind == OpKind::Send ? "send" : "receive", op.kind)) {
      d.p2p(comm, op, stream);
      return;
    }
  }
  if (d.p2pKernels() && op.kind == OpKind::AllToAllv) {
    const auto [in, out] = stagedBytes(op, c.rank(), c.size());
    if (in == 0 && out == 0) return;  // then every peer sends this rank nothing, and expects nothing
    if ((in == 0 || onDevice(op.send, d.device(), c.rank(), "send", op.kind)) &&
        (out == 0 || onDevice(op.recv, d.device(), c.rank(), "receive", op.kind))) {
      d.allToAllv(c, op, stream);
      return;
    }
  }
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

void bindDevices(const std::vector<std::shared_ptr<CommImpl>>& comms, const int* devices) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(comms.size());
  for (size_t i = 0; i < comms.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        if (devices[i] < 0) failInvalid("rank ", i, ": device ", devices[i], " in devlist is negative");
        stateOf(*comms[i], devices[i]);
      } catch (...) {
        errors[i] = std::current_exception();
        comms[i]->abort();  // the others' set-up fails at once instead of waiting
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

int deviceOf(CommImpl& comm) {
  {
    std::lock_guard lk(comm.deviceMutex());
    if (const auto& state = comm.deviceState()) return static_cast<DeviceComm*>(state.get())->device();
  }
  int n = 0, d = -1;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return d;
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
