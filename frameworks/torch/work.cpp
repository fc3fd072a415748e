// The chorus backend's work objects (work.hpp): the worker loop, and how each kind of Work
// completes, waits and reports errors.
#include "work.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#ifdef CHORUS_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "tensors.hpp"

namespace chorus_torch::detail {

// ---- Worker ------------------------------------------------------------------------------------

Worker::Worker() : thread_([this] { loop(); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // runs what is queued first
}

void Worker::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

bool Worker::runInline(const std::function<void()>& task) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (busy_ || !tasks_.empty()) return false;
    busy_ = true;
  }
  task();
  {
    std::lock_guard<std::mutex> lk(mu_);
    busy_ = false;
  }
  cv_.notify_all();
  return true;
}

void Worker::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return !busy_ && (stop_ || !tasks_.empty()); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
    }
    task();
    std::lock_guard<std::mutex> lk(mu_);
    busy_ = false;
  }
}

// ---- AsyncWork ---------------------------------------------------------------------------------

AsyncWork::AsyncWork(int rank, OpType type, const char* title, const std::vector<at::Tensor>& inputs,
                     std::vector<at::Tensor> outputs, uint64_t seq)
    : c10d::Work(rank, type, title, std::optional<std::vector<at::Tensor>>(inputs)),
      outputs_(std::move(outputs)),
      seq_(seq),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

int AsyncWork::sourceRank() const {
  TORCH_CHECK(sourceRank_ >= 0, "chorus: sourceRank() is only defined for a receive");
  return sourceRank_;
}

void AsyncWork::complete(std::exception_ptr error) {
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
  finish(error);
}

// ---- CudaWork ----------------------------------------------------------------------------------

#ifdef CHORUS_TORCH_CUDA
CudaWork::CudaWork(int rank, OpType type, const char* title, const std::vector<at::Tensor>& inputs,
                   std::vector<at::Tensor> outputs, uint64_t seq, chorusComm_t comm, at::Device device)
    : c10d::Work(rank, type, title, std::optional<std::vector<at::Tensor>>(inputs)),
      inputs_(inputs),
      outputs_(std::move(outputs)),
      seq_(seq),
      comm_(comm),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{device})) {}

void CudaWork::enqueued() {
  event_.record();
  future_->markCompleted(c10::IValue(outputs_));  // records its own event on the current stream
  finish(nullptr);                                // ends the profiler's record: the host side is done
}

bool CudaWork::wait(std::chrono::milliseconds) {
  synchronize();
  const chorusResult_t e = asyncError();
  if (e != chorusSuccess) check(comm_, e, "a CUDA operation");
  return true;
}

void CudaWork::synchronize() { event_.block(c10::cuda::getCurrentCUDAStream(event_.device_index())); }

chorusResult_t CudaWork::asyncError() const {
  chorusResult_t e = chorusSuccess;
  if (chorusCommGetAsyncError(comm_, &e) != chorusSuccess) return chorusInvalidUsage;
  return e;
}
#endif

// ---- CoalescedWork -----------------------------------------------------------------------------

bool CoalescedWork::isCompleted() {
  return std::all_of(works_.begin(), works_.end(), [](auto& w) { return w->isCompleted(); });
}

bool CoalescedWork::isSuccess() const {
  return std::all_of(works_.begin(), works_.end(), [](auto& w) { return w->isSuccess(); });
}

bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  for (auto& w : works_) w->wait(timeout);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> CoalescedWork::getFuture() {
  std::lock_guard<std::mutex> lk(futureMu_);
  if (future_) return future_;
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  std::vector<at::Tensor> outputs;
  for (auto& w : works_) {
    auto r = w->result();
    outputs.insert(outputs.end(), r.begin(), r.end());
  }
  if (works_.empty()) {
    future_->markCompleted(c10::IValue(outputs));
    return future_;
  }
  auto left = std::make_shared<std::atomic<size_t>>(works_.size());
  for (auto& w : works_)
    w->getFuture()->addCallback([out = future_, left, outputs](c10::ivalue::Future& f) {
      if (f.hasError())
        out->setErrorIfNeeded(f.exception_ptr());
      else if (left->fetch_sub(1) == 1 && !out->completed())
        out->markCompleted(c10::IValue(outputs));
    });
  return future_;
}

}  // namespace chorus_torch::detail
