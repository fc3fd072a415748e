// torch.distributed backend "chorus": a c10d::Backend (PyTorch 2.x, pinned in scripts/torch-venv)
// whose collectives run through Chorus's C API on CPU tensors. The files of frameworks/torch are
// the only ones that include torch. This file: ProcessGroupChorus's lifetime, options, queueing,
// coalescing and point-to-point calls; collectives.cpp: the collectives; module.cpp: the Python
// module.
//
// Each group bootstraps through the c10d store it is given: the group's rank 0 makes a Chorus
// unique id and sets it there, the others read it, and after the (collective) init rank 0 deletes
// the key. From then on data moves only through Chorus. Each group runs its calls in order on a
// worker thread of its own, as ProcessGroupGloo does: a call checks its arguments, queues the
// operation and returns a Work that completes (and marks its future, which DDP's comm hooks chain
// on) when the worker has run it.
#include "process_group_chorus.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <future>
#include <string>
#include <vector>
#ifdef CHORUS_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include "tensors.hpp"

namespace chorus_torch {

using namespace detail;

namespace {

const std::string kIdKey = "chorus/unique_id";

}  // namespace

ProcessGroupChorus::ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                       std::chrono::milliseconds timeout, std::string groupName)
    : c10d::Backend(rank, size), store_(store), options_(c10::make_intrusive<Options>("chorus", timeout)) {
  options_->group_name = std::move(groupName);
  TORCH_CHECK(store_, "chorus: a process group needs a store");
  chorusUniqueId uid;
  if (rank == 0) {
    check(nullptr, chorusGetUniqueId(&uid), "making a unique id");
    store_->set(kIdKey, std::vector<uint8_t>(uid.internal, uid.internal + CHORUS_UNIQUE_ID_BYTES));
  } else {
    const std::vector<uint8_t> id = store_->get(kIdKey);
    TORCH_CHECK(id.size() == CHORUS_UNIQUE_ID_BYTES, "chorus: the store's unique id has ", id.size(),
                " bytes, not ", CHORUS_UNIQUE_ID_BYTES);
    std::memcpy(uid.internal, id.data(), id.size());
  }
  // Called without the GIL (the binding releases it): the other ranks may be joining from
  // threads of this process.
  check(comm_, chorusCommInitRank(&comm_, size, uid, rank), "init");
  // Every rank read the id before joining, and joining is collective: the key can go.
  if (rank == 0) store_->deleteKey(kIdKey);
  start(timeout);
}

ProcessGroupChorus::ProcessGroupChorus(chorusComm_t comm, const c10::intrusive_ptr<c10d::Store>& store,
                                       int rank, int size, c10::intrusive_ptr<Options> options)
    : c10d::Backend(rank, size), store_(store), options_(std::move(options)), comm_(comm) {
  start(options_->timeout);
}

ProcessGroupChorus::~ProcessGroupChorus() {
  withoutGil([this] { teardown(false); });
}

void ProcessGroupChorus::start(std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) {
    const chorusResult_t r = chorusCommSetTimeout(comm_, timeout.count() / 1000.0);
    if (r != chorusSuccess) {
      const std::string why = chorusGetLastError(comm_);
      chorusCommDestroy(comm_);
      comm_ = nullptr;
      TORCH_CHECK(false, "chorus: setting the timeout to ", timeout.count(), " ms failed: ", why);
    }
  }
  worker_ = std::make_unique<Worker>();
  p2p_ = std::make_shared<P2pQueue>(comm_, worker_.get());
}

void ProcessGroupChorus::flushAndDrain() {
  p2p_->flush();
  std::promise<void> done;
  auto f = done.get_future();
  worker_->submit([&done] { done.set_value(); });
  withoutGil([&] { f.wait(); });
}

void ProcessGroupChorus::teardown(bool abort) {
  std::lock_guard<std::mutex> lk(commMu_);
  if (comm_ == nullptr) return;
  if (abort) chorusCommAbort(comm_);  // frees it; later calls on the handle fail cleanly
  if (p2p_) {
    if (!abort) p2p_->flush();
    p2p_->detach();
  }
  worker_.reset();
  if (!abort) chorusCommDestroy(comm_);
  comm_ = nullptr;
}

void ProcessGroupChorus::setTimeout(std::chrono::milliseconds timeout) {
  TORCH_CHECK(timeout.count() >= 0, "chorus setTimeout: a negative timeout (", timeout.count(), " ms)");
  std::lock_guard<std::mutex> lk(commMu_);
  TORCH_CHECK(comm_ != nullptr && worker_, "chorus setTimeout: the process group was aborted or shut down");
  options_->timeout = timeout;
  // In call order: operations queued before keep the timeout they were queued with.
  worker_->submit([c = comm_, timeout] { chorusCommSetTimeout(c, timeout.count() / 1000.0); });
}

void ProcessGroupChorus::abort() {
  withoutGil([this] { teardown(true); });
}

void ProcessGroupChorus::shutdown() {
  withoutGil([this] { teardown(false); });
}

c10d::ErrorType ProcessGroupChorus::getError() {
  std::lock_guard<std::mutex> lk(commMu_);
  if (comm_ == nullptr) return c10d::ErrorType::SUCCESS;
  chorusResult_t e = chorusSuccess;
  chorusCommGetAsyncError(comm_, &e);
  if (e == chorusSuccess) return c10d::ErrorType::SUCCESS;
  if (e == chorusTimeout) return c10d::ErrorType::TIMEOUT;
  if (e == chorusRemoteError) return c10d::ErrorType::REMOTE_ERROR;
  return c10d::ErrorType::COMM_ERROR;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupChorus::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                            const std::vector<int>& ranks,
                                                            const c10::intrusive_ptr<Options>& opts) {
  auto it = std::find(ranks.begin(), ranks.end(), getRank());
  if (it == ranks.end()) return nullptr;
  const auto timeout = opts ? opts->timeout : options_->timeout;
  auto pg = c10::make_intrusive<ProcessGroupChorus>(store, static_cast<int>(it - ranks.begin()),
                                                    static_cast<int>(ranks.size()), timeout,
                                                    opts ? opts->group_name : std::string());
  return pg;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupChorus::shrink(const std::vector<int64_t>& exclude,
                                                             int /*flags*/,
                                                             const c10::intrusive_ptr<Options>& opts) {
  std::vector<int> ex(exclude.begin(), exclude.end());
  for (int r : ex)
    TORCH_CHECK(r >= 0 && r < getSize(), "chorus shrink: rank ", r, " is not in this group of ", getSize());
  TORCH_CHECK(std::find(ex.begin(), ex.end(), getRank()) == ex.end(), "chorus shrink: rank ", getRank(),
              " excludes itself");
  flushAndDrain();
  chorusComm_t next = nullptr;
  chorusResult_t r;
  {
    std::lock_guard<std::mutex> lk(commMu_);
    TORCH_CHECK(comm_ != nullptr, "chorus shrink: the group was aborted or shut down");
    withoutGil([&] { r = chorusCommShrink(comm_, ex.data(), static_cast<int>(ex.size()), &next); });
  }
  check(comm_, r, "shrink");
  int rank = 0, size = 0;
  chorusCommUserRank(next, &rank);
  chorusCommCount(next, &size);
  auto o = opts ? opts : options_->clone();
  return c10::make_intrusive<ProcessGroupChorus>(next, store_, rank, size, o);
}

void ProcessGroupChorus::startCoalescing() {
  std::lock_guard<std::mutex> lk(coalesceMu_);
  TORCH_CHECK(!coalescing_, "chorus: startCoalescing called twice without endCoalescing");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<CudaP2p> cudaOps;
  {
    std::lock_guard<std::mutex> lk(coalesceMu_);
    TORCH_CHECK(coalescing_, "chorus: endCoalescing without startCoalescing");
    coalescing_ = false;
    works.swap(coalesced_);
    cudaOps.swap(cudaP2p_);
  }
  if (!cudaOps.empty()) {
    // The CUDA sends and receives of the batch as one Chorus group (one kernel over CUDA IPC).
    std::vector<at::Tensor> tensors;
    std::vector<std::function<void(chorusComm_t)>> ops;
    for (auto& p : cudaOps) {
      ops.push_back(std::move(p.op));
      tensors.push_back(p.tensor);
    }
    std::exception_ptr error;
    c10::intrusive_ptr<c10d::Work> batch;
    try {
      batch = enqueue(OpType::COALESCED, "chorus:coalesced", tensors, tensors, {c10d::kUnsetTimeout, true},
                      [ops](chorusComm_t c) {
                        GroupGuard group;
                        check(c, group.startResult(), "coalesced send/recv");
                        for (const auto& op : ops) op(c);
                        check(c, group.end(), "coalesced send/recv");
                      });
    } catch (...) {
      error = std::current_exception();
    }
    for (auto& p : cudaOps) p.work->complete(error);
    if (error) std::rethrow_exception(error);
    return batch;
  }
  p2p_->flush();
  return c10::make_intrusive<CoalescedWork>(getRank(), std::move(works));
}

void ProcessGroupChorus::record(const c10::intrusive_ptr<c10d::Work>& work) {
  std::lock_guard<std::mutex> lk(coalesceMu_);
  if (coalescing_) coalesced_.push_back(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::enqueue(OpType type, const char* title,
                                                           const std::vector<at::Tensor>& inputs,
                                                           std::vector<at::Tensor> outputs,
                                                           const CallOptions& call,
                                                           std::function<void(chorusComm_t)> body) {
  const std::chrono::milliseconds timeout = call.timeout;
  TORCH_CHECK(comm_ != nullptr, "chorus: the process group was aborted or shut down");
  [[maybe_unused]] const at::Device device = deviceOf(inputs, outputs, title);
#ifdef CHORUS_TORCH_CUDA
  if (device.is_cuda()) return enqueueCuda(type, title, inputs, std::move(outputs), device, std::move(body));
#endif
  auto work = c10::make_intrusive<AsyncWork>(getRank(), type, title, inputs, std::move(outputs), ++seq_);
  p2p_->flush();
  const double seconds = timeout.count() > 0 ? timeout.count() / 1000.0 : 0.0;
  const double restore = options_->timeout.count() > 0 ? options_->timeout.count() / 1000.0 : 0.0;
  std::function<void()> task = [work, body = std::move(body), comm = comm_, seconds, restore] {
    std::exception_ptr error;
    try {
      if (seconds > 0) check(comm, chorusCommSetTimeout(comm, seconds), "setting the call's timeout");
      body(comm);
    } catch (...) {
      error = std::current_exception();
    }
    if (seconds > 0) chorusCommSetTimeout(comm, restore);
    work->complete(error);
  };
  // A blocking call (async_op=False) with nothing queued before it runs here, on the caller's thread.
  bool ran = false;
  if (!call.async) withoutGil([&] { ran = worker_->runInline(task); });
  if (!ran) worker_->submit(std::move(task));
  record(work);
  return work;
}

#ifdef CHORUS_TORCH_CUDA
c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::enqueueCuda(OpType type, const char* title,
                                                               const std::vector<at::Tensor>& inputs,
                                                               std::vector<at::Tensor> outputs,
                                                               at::Device device,
                                                               std::function<void(chorusComm_t)> body) {
  auto stream = c10::cuda::getCurrentCUDAStream(device.index());
  auto work = c10::make_intrusive<CudaWork>(getRank(), type, title, inputs, std::move(outputs), ++seq_, comm_,
                                            device);
  p2p_->flush();
  std::promise<void> done;
  auto enqueuedFuture = done.get_future();
  std::exception_ptr error;
  worker_->submit([&, comm = comm_] {
    try {
      c10::cuda::CUDAGuard deviceGuard(device);
      c10::cuda::CUDAStreamGuard streamGuard(stream);
      tlsStream =
          stream.stream() ? static_cast<void*>(stream.stream()) : static_cast<void*>(cudaStreamPerThread);
      body(comm);
      tlsStream = nullptr;
      work->enqueued();
    } catch (...) {
      tlsStream = nullptr;
      error = std::current_exception();
    }
    done.set_value();
  });
  withoutGil([&] { enqueuedFuture.wait(); });
  if (error) std::rethrow_exception(error);
  record(work);
  return work;
}
#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                        int tag) {
  return pointToPoint(tensors, dstRank, tag, true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                        int tag) {
  return pointToPoint(tensors, srcRank, tag, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recvAnysource(std::vector<at::Tensor>&, int) {
  TORCH_CHECK(false,
              "chorus recv: a receive from any source is not supported (Chorus matches messages per source); "
              "name the source rank");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::pointToPoint(std::vector<at::Tensor>& tensors, int peer,
                                                                int tag, bool isSend) {
  const char* call = isSend ? "send" : "recv";
  const at::Tensor t = single(tensors, call);
  TORCH_CHECK(comm_ != nullptr, "chorus: the process group was aborted or shut down");
  TORCH_CHECK(peer >= 0 && peer < getSize() && peer != getRank(), "chorus ", call, ": peer ", peer,
              " is not another rank of this group of ", getSize(), " (this is rank ", getRank(), ")");
#ifdef CHORUS_TORCH_CUDA
  // CUDA tensors: enqueued at once and matched in order, tags ignored, as ProcessGroupNCCL does.
  // Between startCoalescing and endCoalescing (batch_isend_irecv) they wait and run as one group.
  if (t.is_cuda()) {
    const at::Tensor dense = t.contiguous();
    auto op = [dense, t, peer, isSend](chorusComm_t c) {
      chorusResult_t r =
          isSend ? chorusSend(dense.data_ptr(), dense.nbytes(), chorusUint8, peer, c, callStream())
                 : chorusRecv(dense.data_ptr(), dense.nbytes(), chorusUint8, peer, c, callStream());
      check(c, r, isSend ? "send" : "recv");
      if (!isSend && !dense.is_same(t)) at::Tensor(t).copy_(dense);
    };
    {
      std::lock_guard<std::mutex> lk(coalesceMu_);
      if (coalescing_) {
        // Its handle completes once endCoalescing has enqueued the batch (whose Work is the one
        // batch_isend_irecv returns).
        auto work = c10::make_intrusive<AsyncWork>(getRank(), isSend ? OpType::SEND : OpType::RECV, nullptr,
                                                   tensors, tensors, seq_.load());
        cudaP2p_.push_back(CudaP2p{std::move(op), t, work});
        return work;
      }
    }
    return enqueue(isSend ? OpType::SEND : OpType::RECV, isSend ? "chorus:send" : "chorus:recv", tensors,
                   tensors, {c10d::kUnsetTimeout, true}, std::move(op));
  }
#endif
  auto work = c10::make_intrusive<P2pWork>(p2p_, getRank(), isSend ? OpType::SEND : OpType::RECV,
                                           isSend ? "chorus:send" : "chorus:recv", tensors, ++seq_);
  p2p_->add(P2pOp{isSend, t, peer, tag, work});
  record(work);
  return work;
}
}  // namespace chorus_torch
