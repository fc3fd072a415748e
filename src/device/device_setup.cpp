// The device communicator's set-up and clean-up, the order of its calls and the failure its kernels
// reported (device_state.hpp).
//
// Set-up (collective, over the communicator's host transport): every rank allocates its workspace
// (ipc_layout.hpp), exports it with cudaIpcGetMemHandle and all-gathers {pid, device, UUID, SMs,
// handle, address}. When every rank is on this host and there are at most ipc::kMaxRanks of them,
// each maps the peers' workspaces: the address itself for a rank of the same process (ranks as
// threads; another device's memory through peer access), cudaIpcOpenMemHandle otherwise. Several
// ranks of one process may share a GPU (their kernels run side by side); ranks of different
// processes on one GPU take the staged path unless CHORUS_CUDA_SHARED_GPU=ipc (their kernels are
// time-sliced without MPS). If any rank cannot map every peer, all use the staged path.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/config.hpp"
#include "base/log.hpp"
#include "core/api.hpp"
#include "core/comm_impl.hpp"
#include "device/device_state.hpp"
#include "topology/comm_topology.hpp"

namespace chorus::device::detail {

namespace {

// Tells this process from any other, even in another container with the same pid.
uint64_t processNonce() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  }();
  return nonce;
}

struct MapResult {
  int32_t ok = 0;
  char why[252] = {};
};

void copyText(char* dst, size_t cap, const std::string& s) {
  const size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

// A set-up exchange: every rank of the communicator must be setting up too, so a failure says so.
template <typename T>
std::vector<T> allGather(CommImpl& comm, const T& mine) {
  std::vector<T> all(static_cast<size_t>(comm.size()));
  Op op = api::makeOp(OpKind::AllGather, &mine, all.data(), sizeof(T), DataType::Uint8);
  try {
    comm.runInTurn(op);
  } catch (const Error& e) {
    throw Error(e.code(), strCat("device set-up (collective: every rank's first call on device buffers, or "
                                 "chorusCommInitAll with a device list, which sets up all its ranks at once "
                                 "so that one thread may drive them): ",
                                 e.what()));
  }
  return all;
}

}  // namespace

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
  probeDevice(device, &mine);
  if (!mine.hasDevice)
    fail(chorusInvalidUsage,
         strCat("rank ", rank_, ": device buffers (a stream was given) need a CUDA device: ", mine.why));
  const OnDevice on(device_);
  allocateOwn(&mine);
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
  if (ipcCandidate(comm, info, &why)) setUpIpc(comm, mine, info, &why);
  if (ipc_) {
    sizeKernels(info);
  } else {
    // No peer maps this rank's workspace: it can go (cudaFree waits for the device, but no kernel
    // of this communicator has been launched).
    opened_.reset();
    own_.reset();
    logInfo(Subsys::Init, "rank ", rank_, ": device buffers staged through pinned host memory on device ",
            device_, ": ", why);
  }
}

// This rank's device (`device`, or else the current one) made current and described in `mine`;
// mine->hasDevice stays 0 when there is none, and mine->why says why.
void DeviceComm::probeDevice(int device, PeerInfo* mine) {
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    copyText(mine->why, sizeof mine->why,
             e != cudaSuccess ? strCat("cudaGetDeviceCount: ", cudaText(e)) : std::string("no CUDA device"));
  } else if (device >= devices) {
    copyText(mine->why, sizeof mine->why,
             strCat("device ", device, " was asked for but there are ", devices));
  } else if (e = device >= 0 ? cudaSetDevice(device) : cudaGetDevice(&device_); e != cudaSuccess) {
    (void)cudaGetLastError();
    copyText(mine->why, sizeof mine->why, strCat("cudaSetDevice/cudaGetDevice: ", cudaText(e)));
  } else {
    if (device >= 0) device_ = device;
    mine->hasDevice = 1;
    mine->device = device_;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device_) == cudaSuccess) {
      mine->sms = prop.multiProcessorCount;
      std::memcpy(mine->uuid, prop.uuid.bytes, sizeof mine->uuid);
    } else {
      (void)cudaGetLastError();
      mine->sms = 1;
    }
  }
}

// Everything this rank allocates but the workspace, before the first exchange, so that a failure
// reaches every rank (and because once set-up's last exchange returns a peer's kernel may wait
// for this thread, while some allocations wait for the whole device).
void DeviceComm::allocateOwn(PeerInfo* mine) {
  try {
    words_ = std::make_unique<Pinned>(kWords * sizeof(uint32_t), true, rank_);
    std::memset(words_->get(), 0, kWords * sizeof(uint32_t));
    void* mapped = nullptr;
    check(cudaHostGetDevicePointer(&mapped, words_->get(), 0), rank_, "cudaHostGetDevicePointer");
    devWords_ = static_cast<uint32_t*>(mapped);
    check(cudaEventCreateWithFlags(&order_.e, cudaEventDisableTiming), rank_, "cudaEventCreate");
    check(cudaEventCreateWithFlags(&join_.e, cudaEventDisableTiming), rank_, "cudaEventCreate");
    mine->setUpOk = 1;
  } catch (const Error& e) {
    copyText(mine->why, sizeof mine->why, e.what());
    return;
  }
  // Staged calls' buffers and events (device_state.hpp: no pinned allocation once a peer may
  // wait): two buffers (input and output) and two events for each of kReservedStaging calls. Best
  // effort: without them a staged call allocates its own, as before.
  try {
    pool_->reserve(2 * kReservedStaging, reservedStagingBytes());
    for (size_t i = 0; i < 2 * kReservedStaging; ++i) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), rank_, "cudaEventCreate");
      freeEvents_.free.push_back(e);
    }
  } catch (const Error& e) {
    logInfo(Subsys::Init, "rank ", rank_, ": no staging buffers reserved at set-up (", e.what(),
            "): staged calls allocate pinned memory as they come");
  }
}

// Whether the ranks may try CUDA IPC at all (and if not, why not): all on this host, at most
// ipc::kMaxRanks, and no two processes on one GPU unless CHORUS_CUDA_SHARED_GPU=ipc.
bool DeviceComm::ipcCandidate(CommImpl& comm, const std::vector<PeerInfo>& info, std::string* why) const {
  bool candidate = size_ <= ipc::kMaxRanks;
  if (!candidate) *why = strCat(size_, " ranks (CUDA IPC collectives take at most ", ipc::kMaxRanks, ")");
  if (info[0].ipcOff) {
    candidate = false;
    *why = "CHORUS_CUDA_IPC=0";
  }
  const auto& topo = comm.topology();
  for (int r = 0; candidate && r < size_; ++r) {
    const PeerInfo& pr = info[static_cast<size_t>(r)];
    if (topo.ranks[static_cast<size_t>(r)].host != topo.ranks[0].host) {
      candidate = false;
      *why = strCat("rank ", r, " is on another host");
    }
    for (int q = 0; candidate && q < r; ++q) {
      const PeerInfo& pq = info[static_cast<size_t>(q)];
      if (pq.process != pr.process && std::memcmp(pq.uuid, pr.uuid, 16) == 0 && !info[0].sharedGpuIpc) {
        candidate = false;
        *why = strCat("ranks ", q, " and ", r,
                      " are processes sharing one GPU, whose kernels are time-sliced "
                      "(CHORUS_CUDA_SHARED_GPU=ipc uses CUDA IPC anyway, e.g. under MPS)");
      }
    }
  }
  return candidate;
}

// This rank's workspace allocated and exported, the workspaces' handles all-gathered (into `info`)
// and the peers' mapped: ipc_ once every rank has mapped every peer, else why not.
void DeviceComm::setUpIpc(CommImpl& comm, PeerInfo& me, std::vector<PeerInfo>& info, std::string* why) {
  bool candidate = true;
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
      *why = info[static_cast<size_t>(r)].why;
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
      *why = m.why;
      break;
    }
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

void DeviceComm::sizeKernels(const std::vector<PeerInfo>& info) {
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
          " ranks, up to ", maxBlocks_, " blocks per kernel, stage ", layout_.stageBytes, " bytes, LL up to ",
          llMax_, " bytes, send/recv ",
          p2pCap_ > 0 ? strCat(p2pCap_, " channel(s) of ", layout_.p2pSlotBytes, "-byte chunks")
                      : strCat("staged (", maxBlocks_, " blocks cannot hold 2 x ", size_, " lanes)"));
}

DeviceComm::~DeviceComm() {
  const OnDevice on(device_);
  if (ordered_ && cudaEventSynchronize(order_.e) != cudaSuccess) (void)cudaGetLastError();
  for (const InFlight& f : inFlight_)
    freeEvents_.free.insert(freeEvents_.free.end(), {f.copiedIn, f.copiedBack});
  inFlight_.clear();
  for (cudaEvent_t e : freeEvents_.free) {
    if (cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
  }
  freeEvents_.free.clear();
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

namespace {

// Where a kernel's failed wait was (ipc::WaitSite and the two values beside it), for the message.
std::string waitText(uint32_t site, uint32_t want, uint32_t seen, int peer) {
  const uint32_t kind = site >> 29, index = (site >> 24) & 0x1F, number = site & 0xFFFFFF;
  switch (kind) {
    case ipc::kSiteBarrier:
      // Barrier values: kernel number << 24 | (barrier + 1), low 32 bits.
      return strCat("; block ", index, " waited at barrier ", number, " of kernel #", want >> 24,
                    " (mod 256); rank ", peer, "'s block ", index, " had reached ",
                    seen == 0 ? std::string("no barrier on this workspace")
                              : strCat("barrier ", (seen & 0xFFFFFF) - 1, " of kernel #", seen >> 24));
    case ipc::kSiteLL:
      return strCat("; block ", index, " polled a low-latency line for flag ", want, " and saw ", seen);
    case ipc::kSiteP2pSend:
      return strCat("; channel ", index, " waited for a free FIFO slot: chunk ", want + ipc::kP2pSlots - 1,
                    " needs rank ", peer, " to have taken ", want, " chunks, it had taken ", seen);
    case ipc::kSiteP2pRecv:
      return strCat("; channel ", index, " waited for chunk ", want - 1, " of rank ", peer,
                    ", which had put ", seen, " chunks there");
    default:
      return "";
  }
}

}  // namespace

chorusResult_t DeviceComm::error(std::string* message) const {
  if (!words_) return chorusSuccess;
  const auto* words = reinterpret_cast<uint32_t*>(words_->get());
  const uint32_t w = std::atomic_ref<const uint32_t>(words[1]).load();
  if (w == 0) return chorusSuccess;
  const uint32_t why = w >> 16;
  const int peer = static_cast<int>(w & 0xFFFF) - 1;
  // Written before the error word.
  const std::string where = waitText(std::atomic_ref<const uint32_t>(words[4]).load(),
                                     std::atomic_ref<const uint32_t>(words[5]).load(),
                                     std::atomic_ref<const uint32_t>(words[6]).load(), peer);
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
                      "same order",
                      where, ")");
  }
  return chorusTimeout;
}

}  // namespace chorus::device::detail
