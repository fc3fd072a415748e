// torch.distributed backend "chorus": ProcessGroupChorus, a c10d::Backend (PyTorch 2.x, pinned in
// scripts/torch-venv) whose collectives run through Chorus's C API. Its methods are defined in
// process_group_chorus.cpp (lifetime, options, queueing, coalescing, point to point) and
// collectives.cpp (the collectives and barriers).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "chorus/chorus.h"
#include "p2p.hpp"
#include "work.hpp"

namespace chorus_torch {

namespace detail {

// A call's own options: its timeout (kUnsetTimeout: the group's) and whether the caller asked for
// an asynchronous Work.
struct CallOptions {
  std::chrono::milliseconds timeout;
  bool async;
};

}  // namespace detail

class ProcessGroupChorus : public c10d::Backend {
 public:
  // Collective over the group: rank 0 publishes a unique id in `store`, every rank joins with it.
  ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout, std::string groupName);

  // A group around a communicator Chorus made (shrink).
  ProcessGroupChorus(chorusComm_t comm, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     c10::intrusive_ptr<Options> options);

  ~ProcessGroupChorus() override;

  const std::string getBackendName() const override { return "chorus"; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }

  // ---- Collectives (collectives.cpp) ----

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  // A sparse COO tensor, SUM (as gloo): every rank's indices and values are all-gathered (padded to
  // the largest count), concatenated and coalesced; the result replaces the tensor's contents.
  c10::intrusive_ptr<c10d::Work> allreduceSparse(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                   std::vector<int64_t>& outSplits,
                                                   std::vector<int64_t>& inSplits,
                                                   const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // Through the store, as gloo's does through its pairs, with gloo's messages: every rank checks in
  // with rank 0, which names the first rank (or, with waitAllRanks, every rank) that did not arrive
  // within `timeout`, then lets everyone go; a rank that is not let go within `timeout` says so.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;

  // ---- Point to point ----

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override;

  // ---- Coalescing, groups and lifetime ----

  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  bool supportsSplitting() const override { return true; }
  // A new communicator for `ranks` (this group's ranks, in order), made through `store` as at
  // creation; a rank not in `ranks` gets none.
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;

  bool supportsShrinking() const override { return true; }
  // chorusCommShrink: the survivors (every rank not excluded, with the same list) form a new group,
  // even where this one is broken by a dead rank.
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& exclude, int /*flags*/,
                                           const c10::intrusive_ptr<Options>& opts) override;

  void setTimeout(std::chrono::milliseconds timeout) override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  void eagerConnectSingleDevice(at::Device) override {}  // the communicator exists from the constructor on

  // Pending operations fail with Chorus's error; the peers are told.
  void abort() override;
  void shutdown() override;

  c10d::ErrorType getError() override;

  chorusComm_t comm() const { return comm_; }

 private:
  void start(std::chrono::milliseconds timeout);

  // Waits for everything queued so far.
  void flushAndDrain();

  // Sends and receives nobody waited for still happen, as in NCCL; then the worker runs what is
  // queued and stops, and only then the communicator goes. With `abort`, the communicator is
  // aborted first, so queued operations fail at once instead of waiting for peers.
  void teardown(bool abort);

  // The pairs of a coalesced call: large[i] holds world_size times small[i], of one type.
  void checkCoalesced(const std::vector<at::Tensor>& small, const std::vector<at::Tensor>& large,
                      const char* call) const;

  void checkRoot(int64_t root, const char* call) const;

  // Queued sends and receives go first, so calls run in the order they were made.
  c10::intrusive_ptr<c10d::Work> enqueue(detail::OpType type, const char* title,
                                         const std::vector<at::Tensor>& inputs,
                                         std::vector<at::Tensor> outputs, const detail::CallOptions& call,
                                         std::function<void(chorusComm_t)> body);

#ifdef CHORUS_TORCH_CUDA
  // The worker enqueues the body on the caller's current stream (cudaStreamPerThread of the worker
  // where that is the legacy default stream, which it synchronizes with) while the caller waits:
  // so the caller's later kernels on its stream are ordered after the operation, and operations
  // stay in call order with the CPU ones queued before. An error while enqueuing raises here.
  c10::intrusive_ptr<c10d::Work> enqueueCuda(detail::OpType type, const char* title,
                                             const std::vector<at::Tensor>& inputs,
                                             std::vector<at::Tensor> outputs, at::Device device,
                                             std::function<void(chorusComm_t)> body);
#endif

  c10::intrusive_ptr<c10d::Work> pointToPoint(std::vector<at::Tensor>& tensors, int peer, int tag,
                                              bool isSend);

  void record(const c10::intrusive_ptr<c10d::Work>& work);

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Options> options_;
  chorusComm_t comm_ = nullptr;
  std::mutex commMu_;
  std::unique_ptr<detail::Worker> worker_;
  std::shared_ptr<detail::P2pQueue> p2p_;
  std::atomic<uint64_t> seq_{0};
  uint64_t monitoredRound_ = 0;
  std::mutex coalesceMu_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
  struct CudaP2p {
    std::function<void(chorusComm_t)> op;
    at::Tensor tensor;
    c10::intrusive_ptr<detail::AsyncWork> work;
  };
  std::vector<CudaP2p> cudaP2p_;  // CUDA sends and receives waiting for endCoalescing
};

}  // namespace chorus_torch
