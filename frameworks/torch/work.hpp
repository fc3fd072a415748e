// The chorus backend's work objects: the worker thread that runs a group's operations in call
// order, the c10d::Work of an operation queued there (AsyncWork) or enqueued on a CUDA stream
// (CudaWork), the Work of a coalesced batch, and the scope guards of Chorus groups and the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef CHORUS_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#endif
#include <vector>

#include "chorus/chorus.h"

namespace chorus_torch::detail {

using c10d::OpType;

// A Chorus group ended however the scope is left.
class GroupGuard {
 public:
  GroupGuard() : result_(chorusGroupStart()) {}
  ~GroupGuard() {
    if (result_ == chorusSuccess && !ended_) chorusGroupEnd();
  }
  chorusResult_t startResult() const { return result_; }
  chorusResult_t end() {
    ended_ = true;
    return chorusGroupEnd();
  }

 private:
  chorusResult_t result_;
  bool ended_ = false;
};

// Runs `f` without the GIL if this thread holds it (so the worker, which may need the GIL to run a
// future's Python callback or free a tensor, can finish).
template <typename F>
void withoutGil(F&& f) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release nogil;
    f();
  } else {
    f();
  }
}

// ---- Worker and Work ---------------------------------------------------------------------------

// One group's operations, run in the order they were queued on a thread of their own.
class Worker {
 public:
  Worker();
  ~Worker();  // runs what is queued first
  void submit(std::function<void()> task);
  // Runs `task` on the calling thread when nothing is queued or running, keeping call order (a
  // blocking call's caller waits for it anyway, and this saves two thread hand-offs); false, doing
  // nothing, when the worker is busy.
  bool runInline(const std::function<void()>& task);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  bool busy_ = false;  // a task runs, on the worker or inline
  std::thread thread_;
};

// An operation queued on the worker. The base class's wait, isCompleted and isSuccess work from
// finish(), which also ends the profiler's record of the operation ("chorus:all_reduce", ...); the
// future holds the output tensors, as ProcessGroupGloo's does.
class AsyncWork : public c10d::Work {
 public:
  AsyncWork(int rank, OpType type, const char* title, const std::vector<at::Tensor>& inputs,
            std::vector<at::Tensor> outputs, uint64_t seq);
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  uint64_t getSequencenumber() const override { return seq_; }
  int sourceRank() const override;
  void setSourceRank(int r) { sourceRank_ = r; }
  // The future first: whoever returns from wait() may read it at once.
  void complete(std::exception_ptr error);

 protected:
  std::vector<at::Tensor> outputs_;
  uint64_t seq_;
  int sourceRank_ = -1;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

#ifdef CHORUS_TORCH_CUDA
// An operation on CUDA tensors, enqueued on the caller's current stream before the call returned
// (as ProcessGroupNCCL's are). It is complete when the event recorded after it on that stream is;
// wait() makes the waiting thread's current stream wait for that event without blocking the host,
// and reports an error Chorus's kernels raised since (chorusCommGetAsyncError). The tensors are kept
// until then.
class CudaWork : public c10d::Work {
 public:
  CudaWork(int rank, OpType type, const char* title, const std::vector<at::Tensor>& inputs,
           std::vector<at::Tensor> outputs, uint64_t seq, chorusComm_t comm, at::Device device);
  // On the worker, with the call's stream current, once the operation is enqueued.
  void enqueued();
  bool isCompleted() override { return event_.query(); }
  bool isSuccess() const override { return asyncError() == chorusSuccess; }
  bool wait(std::chrono::milliseconds) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  chorusResult_t asyncError() const;
  std::vector<at::Tensor> inputs_, outputs_;
  uint64_t seq_;
  chorusComm_t comm_;
  at::cuda::CUDAEvent event_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};
#endif

// What endCoalescing returns: complete when every operation issued since startCoalescing is.
class CoalescedWork : public c10d::Work {
 public:
  CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works)
      : c10d::Work(rank, OpType::COALESCED), works_(std::move(works)) {}
  bool isCompleted() override;
  bool isSuccess() const override;
  bool wait(std::chrono::milliseconds timeout) override;
  // Completes with every operation's outputs once all have completed, or with the first error.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::mutex futureMu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace chorus_torch::detail
