// Device-buffer collectives over CUDA IPC: one kernel per call, enqueued on the caller's stream,
// reading and writing the peers' workspaces (ipc_layout.hpp) directly. Internal to libchorus;
// includes no CUDA header (streams are void*, a cudaStream_t).
#pragma once

#include <cstddef>
#include <cstdint>

#include "chorus/chorus.hpp"
#include "ipc_steps.hpp"

namespace chorus::kernels::cuda::ipc {

struct Call {
  Kind kind = Kind::AllReduce;
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  /// Elements, as the API counts them: per rank for ReduceScatter (recv), AllGather (send) and
  /// AllToAll (per peer).
  size_t count = 0;
  int rank = 0;
  int nranks = 1;
  /// Every rank's workspace as mapped in this process (ws[rank] is this rank's own).
  void* ws[kMaxRanks] = {};
  Layout layout;
  int maxBlocks = kMaxBlocks;
  /// Allreduces of at most this many bytes use LL (and at most layout.llBytes).
  size_t llMaxBytes = 0;
  /// Device addresses of host-mapped words: set to non-zero to stop the kernels; the first failure.
  const volatile uint32_t* abortFlag = nullptr;
  volatile uint32_t* errorWord = nullptr;
  /// Three host-mapped words: where the first failed wait was (WaitSite), what it waited for, what
  /// it saw.
  volatile uint32_t* errorDetail = nullptr;
  uint64_t timeoutNs = 0;
};

/// Enqueues the call on `stream`; throws chorus::Error when the launch fails. count must be > 0.
void launch(const Call& c, void* stream);

/// The sends and receives of one call or group (args.lanes planned by planP2pLanes).
struct P2pCall {
  P2pArgs args{};
  const volatile uint32_t* abortFlag = nullptr;
  volatile uint32_t* errorWord = nullptr;
  volatile uint32_t* errorDetail = nullptr;  // as Call's
  uint64_t timeoutNs = 0;
};

/// Enqueues one block per lane on `stream` (nothing when there are no lanes); throws chorus::Error
/// when the launch fails.
void launchP2p(const P2pCall& c, void* stream);

/// Enqueues a one-thread kernel that holds `stream` until the host-mapped word `*done` reaches
/// `ticket` (an operation staged through host memory has finished there; tickets only grow) or the
/// abort flag is set. Once `*started` has reached `ticket` (the host began it), it gives up after
/// `timeoutNs`, reported as kErrStaged.
void launchWaitForHost(const volatile uint32_t* done, const volatile uint32_t* started, uint32_t ticket,
                       const volatile uint32_t* abortFlag, volatile uint32_t* errorWord, uint64_t timeoutNs,
                       void* stream);

}  // namespace chorus::kernels::cuda::ipc
