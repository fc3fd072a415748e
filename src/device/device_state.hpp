// Device-buffer calls (core/device.hpp), internal to src/device: the per-communicator CUDA state,
// made by the first call that passes a stream, and the choice between a kernel over CUDA IPC and
// staging through pinned host memory.
//
//   device_setup.cpp   set-up and clean-up of the state, the order of a communicator's calls, the
//                      failure a kernel reported
//   device_ipc.cpp     collectives as one kernel over CUDA IPC; sends, receives and all-to-all-v as
//                      one send/recv kernel
//   device_staged.cpp  anything else, staged through pinned host memory into the host path
//   device_api.cpp     the calls of core/device.hpp, and which path a call takes
//
// Threads as ranks: nothing here may wait for the whole device once a peer's kernel can be waiting
// for this thread (cudaFree, cudaFreeHost, cudaMemcpy on the legacy stream): all allocations happen
// before set-up's last exchange, staging buffers are pooled and freed only with the communicator,
// and copies go on the call's stream. Pinned allocations can also wait behind another thread's copy
// into pageable memory that waits for a kernel (seen on an H200): set-up reserves the buffers and
// events of four staged calls of up to CHORUS_CUDA_STAGE_BYTES / 8 (at most 1 MiB) per buffer, and
// a staged call takes them back from the calls before it that are done; only a larger call, or a
// fifth in flight, allocates pinned memory.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/config.hpp"
#include "base/error.hpp"
#include "base/op.hpp"
#include "core/device.hpp"
#include "kernels/cuda/ipc_collectives.hpp"

namespace chorus {

class CommImpl;

namespace device::detail {

namespace ipc = kernels::cuda::ipc;

inline std::string cudaText(cudaError_t e) {
  return strCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

inline void check(cudaError_t e, int rank, const char* what) {
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

// Pinned staging buffers, reused and freed only with the pool (cudaFreeHost waits for the device).
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  explicit PinnedPool(int rank) : rank_(rank) {}
  /// `count` buffers of `bytes` made now (at set-up), for acquire to hand out later.
  void reserve(size_t count, size_t bytes) {
    for (size_t i = 0; i < count; ++i) {
      auto buf = std::make_unique<Pinned>(bytes, false, rank_);
      std::lock_guard lk(mu_);
      free_.push_back(std::move(buf));
    }
  }
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

// Device memory of this rank's device (kernels can use it), or any other memory cudaMemcpy takes.
// (device_api.cpp)
bool onDevice(const void* p, int device, int rank, const char* what, OpKind kind);

// Sends and receives with their streams, run as one kernel.
using P2pList = std::vector<std::pair<Op, cudaStream_t>>;

class DeviceComm : public State {
 public:
  /// Collective. `device` < 0: the calling thread's current device.
  DeviceComm(CommImpl& comm, int device);
  /// Waits for this rank's kernels (after which no peer touches its workspace), then frees.
  ~DeviceComm() override;
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
  // Set-up, in the order the constructor runs them (device_setup.cpp).
  void probeDevice(int device, PeerInfo* mine);
  void allocateOwn(PeerInfo* mine);
  bool ipcCandidate(CommImpl& comm, const std::vector<PeerInfo>& info, std::string* why) const;
  void setUpIpc(CommImpl& comm, PeerInfo& me, std::vector<PeerInfo>& info, std::string* why);
  void mapPeers(const std::vector<PeerInfo>& info, std::string* why);
  void sizeKernels(const std::vector<PeerInfo>& info);
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
  // the host finished, [3] of the last it began, [4..6] where the failed wait of the error word was
  // (ipc::WaitSite, the value waited for, the value seen).
  static constexpr size_t kWords = 8;
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
  // A staged call's buffers: the caller's on the device side, the pinned ones on the host side.
  struct Staging {
    size_t inBytes = 0, outBytes = 0;
    std::shared_ptr<Pinned> in, out;
    const void* devSend = nullptr;
    void* devRecv = nullptr;
    std::byte* hostSend = nullptr;
    std::byte* hostRecv = nullptr;
  };
  // Staged operations (device_staged.cpp).
  Staging stage(Op& op);
  void enqueueStaged(const std::shared_ptr<CommImpl>& comm, Op op, const Staging& s, cudaStream_t stream);
  // Staged calls whose two pinned buffers (of reservedStagingBytes()) and two events are made at
  // set-up.
  static constexpr size_t kReservedStaging = 4;
  static size_t reservedStagingBytes() {
    return std::clamp<size_t>(envConfig().cudaStageBytes / 8, 4096, size_t{1} << 20);
  }
  std::mutex stagedMu_;  // staged tickets in the order of the communicator's own
  std::deque<InFlight> inFlight_;
  // Events no staged call uses now; those left at destruction are destroyed (also when set-up fails
  // after reserving them).
  struct EventList {
    std::vector<cudaEvent_t> free;
    EventList() = default;
    EventList(const EventList&) = delete;
    EventList& operator=(const EventList&) = delete;
    ~EventList() {
      for (cudaEvent_t e : free) {
        if (cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
      }
    }
  } freeEvents_;
  uint32_t stagedTicket_ = 0;
  cudaEvent_t takeEvent();
  void reapInFlight();
  std::atomic<int64_t> timeoutMs_{0};  // of the latest call, for the message (read by other threads)
};

}  // namespace device::detail
}  // namespace chorus
