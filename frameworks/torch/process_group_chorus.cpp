// torch.distributed backend "chorus": a c10d::Backend (PyTorch 2.x, pinned in scripts/torch-venv)
// whose collectives run through Chorus's C API on CPU tensors. The only translation unit that
// includes torch.
//
// Each group bootstraps through the c10d store it is given: the group's rank 0 makes a Chorus
// unique id and sets it there, the others read it, and after the (collective) init rank 0 deletes
// the key. From then on data moves only through Chorus. Each group runs its calls in order on a
// worker thread of its own, as ProcessGroupGloo does: a call checks its arguments, queues the
// operation and returns a Work that completes (and marks its future, which DDP's comm hooks chain
// on) when the worker has run it.
#include <Python.h>
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef CHORUS_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif
#include <vector>

#include "chorus/chorus.h"

namespace chorus_torch {
namespace {

using c10d::OpType;
using RedOp = c10d::ReduceOp;

// The stream the worker passes to Chorus: NULL for CPU tensors, the caller's CUDA stream while
// the worker enqueues a CUDA call (set around each operation's body).
thread_local void* tlsStream = nullptr;
void* callStream() { return tlsStream; }

// ---- Argument checks ---------------------------------------------------------------------------

// Every tensor a call touches passes here before anything is read or queued.
void checkTensor(const at::Tensor& t, const char* call) {
  TORCH_CHECK(t.defined(), "chorus ", call, ": an undefined tensor");
  if (t.layout() != at::kStrided) {
    std::string layout = c10::str(t.layout());
    std::transform(layout.begin(), layout.end(), layout.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    TORCH_CHECK(false, "chorus ", call, ": a ", layout,
                " tensor: only dense (strided) tensors are supported; no data was read");
  }
#ifdef CHORUS_TORCH_CUDA
  if (t.is_cuda()) return;
#endif
  TORCH_CHECK(t.device().is_cpu(), "chorus ", call, ": a tensor on ", t.device(),
              ": this build of the chorus backend takes CPU"
#ifdef CHORUS_TORCH_CUDA
              " and CUDA"
#endif
              " tensors only (use \"cpu:chorus,cuda:nccl\")");
}

// The one device of every tensor of a call.
at::Device deviceOf(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const char* call) {
  std::optional<at::Device> dev;
  for (const auto* list : {&a, &b})
    for (const auto& t : *list) {
      if (!t.defined()) continue;
      if (!dev) dev = t.device();
      TORCH_CHECK(t.device() == *dev, "chorus ", call, ": tensors on ", *dev, " and ", t.device(),
                  " in one call; every tensor of a call must be on one device");
    }
  return dev.value_or(at::Device(at::kCPU));
}

void checkAll(const std::vector<at::Tensor>& ts, const char* call) {
  for (const auto& t : ts) checkTensor(t, call);
}

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* call) {
  TORCH_CHECK(tensors.size() == 1, "chorus ", call, ": one tensor per call, got ", tensors.size());
  checkTensor(tensors[0], call);
  return tensors[0];
}

void checkLike(const at::Tensor& t, const at::Tensor& like, const char* call) {
  checkTensor(t, call);
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.numel() == like.numel(), "chorus ", call,
              ": every tensor must have the input's type (", like.scalar_type(), ") and size (", like.numel(),
              " elements), not ", t.scalar_type(), " and ", t.numel());
}

// ---- Element types and reductions ---------------------------------------------------------------

// "torch.int16", as Python users write the type.
std::string dtypeName(at::ScalarType s) { return "torch." + std::string(c10::getDtypeNames(s).first); }

// The Chorus type of a reduction over `s`, or nullopt where Chorus has none. Complex numbers
// reduce as pairs of reals (sum and average only).
std::optional<chorusDataType_t> reductionType(at::ScalarType s) {
  switch (s) {
    case at::kChar:
      return chorusInt8;
    case at::kByte:
    case at::kBool:
      return chorusUint8;
    case at::kInt:
      return chorusInt32;
    case at::kUInt32:
      return chorusUint32;
    case at::kLong:
      return chorusInt64;
    case at::kUInt64:
      return chorusUint64;
    case at::kHalf:
      return chorusFloat16;
    case at::kBFloat16:
      return chorusBfloat16;
    case at::kFloat:
    case at::kComplexFloat:
      return chorusFloat32;
    case at::kDouble:
    case at::kComplexDouble:
      return chorusFloat64;
    default:
      return std::nullopt;
  }
}

const char* opName(RedOp::RedOpType op) {
  switch (op) {
    case RedOp::SUM:
      return "SUM";
    case RedOp::AVG:
      return "AVG";
    case RedOp::PRODUCT:
      return "PRODUCT";
    case RedOp::MIN:
      return "MIN";
    case RedOp::MAX:
      return "MAX";
    case RedOp::BAND:
      return "BAND";
    case RedOp::BOR:
      return "BOR";
    case RedOp::BXOR:
      return "BXOR";
    case RedOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "an unknown op";
  }
}

// How one reduction runs: a Chorus op on a Chorus type (after scaling by a PREMUL_SUM factor), or,
// for bitwise ops on integers, Chorus gathers every rank's data and each rank folds it
// (Chorus has no bitwise reductions; the gather moves world_size times the data).
struct Reduction {
  chorusDataType_t type = chorusFloat32;
  chorusRedOp_t op = chorusSum;
  bool complexPairs = false;
  std::optional<RedOp::RedOpType> bitwise;  // BAND, BOR or BXOR folded after a gather
  std::optional<double> factor;             // PREMUL_SUM with a scalar factor
  at::Tensor factorTensor;                  // PREMUL_SUM with a tensor factor
};

Reduction reductionOf(const RedOp& rop, at::ScalarType s, const char* call) {
  const RedOp::RedOpType op = rop.op_;
  const auto type = reductionType(s);
  TORCH_CHECK(
      type.has_value(), "chorus ", call, ": reductions over ", dtypeName(s),
      " tensors are not supported (bool, int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, "
      "float32, float64 and complex are)");
  Reduction r;
  r.type = *type;
  r.complexPairs = at::isComplexType(s);
  const bool isBool = s == at::kBool;
  const bool isIntegral = at::isIntegralType(s, /*includeBool=*/false);
  auto refuse = [&](const char* why) {
    TORCH_CHECK(false, "chorus ", call, ": ReduceOp.", opName(op), " is not supported on ", dtypeName(s),
                " tensors (", why, ")");
  };
  if (r.complexPairs && op != RedOp::SUM && op != RedOp::AVG && op != RedOp::PREMUL_SUM)
    refuse("complex tensors take SUM, AVG and PREMUL_SUM");
  switch (op) {
    case RedOp::SUM:
      r.op = isBool ? chorusMax : chorusSum;  // logical or, as torch's backends do for bool
      break;
    case RedOp::PRODUCT:
      r.op = isBool ? chorusMin : chorusProd;  // logical and
      break;
    case RedOp::MIN:
      r.op = chorusMin;
      break;
    case RedOp::MAX:
      r.op = chorusMax;
      break;
    case RedOp::AVG:
      if (isBool) refuse("the average of booleans is not a boolean");
      r.op = chorusAvg;
      break;
    case RedOp::BAND:
    case RedOp::BOR:
    case RedOp::BXOR:
      if (!isBool && !isIntegral) refuse("bitwise ops take integer and bool tensors");
      if (isBool && op == RedOp::BAND) {
        r.op = chorusMin;
      } else if (isBool && op == RedOp::BOR) {
        r.op = chorusMax;
      } else {
        r.bitwise = op;
      }
      break;
    case RedOp::PREMUL_SUM: {
      if (!at::isFloatingType(s) && !r.complexPairs) refuse("PREMUL_SUM takes floating-point tensors");
      auto* sup = dynamic_cast<c10d::PreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK(sup != nullptr, "chorus ", call, ": ReduceOp.PREMUL_SUM without a factor");
      if (sup->tensor_factor.defined()) {
        checkTensor(sup->tensor_factor, call);
        TORCH_CHECK(sup->tensor_factor.numel() == 1, "chorus ", call,
                    ": a PREMUL_SUM factor tensor must hold one element, not ", sup->tensor_factor.numel());
        r.factorTensor = sup->tensor_factor;
      } else {
        r.factor = sup->double_factor;
      }
      r.op = chorusSum;
      break;
    }
    default:
      refuse("unknown op");
  }
  return r;
}

// The contiguous tensor an operation reads or writes in place of `t`: `t` itself, or a copy that
// write() copies back.
struct Dense {
  explicit Dense(const at::Tensor& user, bool copyIn = true)
      : user_(user),
        t(user.is_contiguous()
              ? user
              : (copyIn ? user.contiguous() : at::empty_like(user, at::MemoryFormat::Contiguous))) {}
  void write() {
    if (!t.is_same(user_)) user_.copy_(t);
  }
  at::Tensor user_;
  at::Tensor t;
};

// Chorus element count and type of a reduction buffer (complex: twice the reals).
size_t reductionCount(const at::Tensor& t, const Reduction& r) {
  return static_cast<size_t>(t.numel()) * (r.complexPairs ? 2 : 1);
}

// Scales `t` (contiguous, owned by the operation) for PREMUL_SUM.
void premultiply(at::Tensor& t, const Reduction& r) {
  if (r.factor)
    t.mul_(*r.factor);
  else if (r.factorTensor.defined())
    t.mul_(r.factorTensor.to(t.scalar_type()));
}

bool premul(const Reduction& r) { return r.factor.has_value() || r.factorTensor.defined(); }

at::Tensor fold(const at::Tensor& stacked, RedOp::RedOpType op) {
  at::Tensor acc = stacked[0].clone();
  for (int64_t i = 1; i < stacked.size(0); ++i) {
    if (op == RedOp::BAND)
      acc.bitwise_and_(stacked[i]);
    else if (op == RedOp::BOR)
      acc.bitwise_or_(stacked[i]);
    else
      acc.bitwise_xor_(stacked[i]);
  }
  return acc;
}

std::string timeoutText(chorusResult_t r) {
  // torch's tests and users look for "Timed out"; Chorus's detail (which ranks) follows.
  return r == chorusTimeout ? "Timed out waiting for peers: " : "";
}

void check(chorusComm_t comm, chorusResult_t r, const char* what) {
  if (r == chorusSuccess) return;
  const std::string msg = std::string("chorus ") + what + " failed (" + chorusGetErrorString(r) +
                          "): " + timeoutText(r) +
                          (comm ? chorusGetLastError(comm) : chorusGetLastError(nullptr));
  C10_THROW_ERROR(DistBackendError, msg);
}

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

// ---- Worker and Work ---------------------------------------------------------------------------

// One group's operations, run in the order they were queued on a thread of their own.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // runs what is queued first
  }
  void submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  // Runs `task` on the calling thread when nothing is queued or running, keeping call order (a
  // blocking call's caller waits for it anyway, and this saves two thread hand-offs); false, doing
  // nothing, when the worker is busy.
  bool runInline(const std::function<void()>& task) {
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

 private:
  void loop() {
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
            std::vector<at::Tensor> outputs, uint64_t seq)
      : c10d::Work(rank, type, title, std::optional<std::vector<at::Tensor>>(inputs)),
        outputs_(std::move(outputs)),
        seq_(seq),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  uint64_t getSequencenumber() const override { return seq_; }
  int sourceRank() const override {
    TORCH_CHECK(sourceRank_ >= 0, "chorus: sourceRank() is only defined for a receive");
    return sourceRank_;
  }
  void setSourceRank(int r) { sourceRank_ = r; }
  // The future first: whoever returns from wait() may read it at once.
  void complete(std::exception_ptr error) {
    if (error)
      future_->setError(error);
    else
      future_->markCompleted(c10::IValue(outputs_));
    finish(error);
  }

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
           std::vector<at::Tensor> outputs, uint64_t seq, chorusComm_t comm, at::Device device)
      : c10d::Work(rank, type, title, std::optional<std::vector<at::Tensor>>(inputs)),
        inputs_(inputs),
        outputs_(std::move(outputs)),
        seq_(seq),
        comm_(comm),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         std::vector<c10::Device>{device})) {}
  // On the worker, with the call's stream current, once the operation is enqueued.
  void enqueued() {
    event_.record();
    future_->markCompleted(c10::IValue(outputs_));  // records its own event on the current stream
    finish(nullptr);                                // ends the profiler's record: the host side is done
  }
  bool isCompleted() override { return event_.query(); }
  bool isSuccess() const override { return asyncError() == chorusSuccess; }
  bool wait(std::chrono::milliseconds) override {
    synchronize();
    const chorusResult_t e = asyncError();
    if (e != chorusSuccess) check(comm_, e, "a CUDA operation");
    return true;
  }
  void synchronize() override { event_.block(c10::cuda::getCurrentCUDAStream(event_.device_index())); }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  chorusResult_t asyncError() const {
    chorusResult_t e = chorusSuccess;
    if (chorusCommGetAsyncError(comm_, &e) != chorusSuccess) return chorusInvalidUsage;
    return e;
  }
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
  bool isCompleted() override {
    return std::all_of(works_.begin(), works_.end(), [](auto& w) { return w->isCompleted(); });
  }
  bool isSuccess() const override {
    return std::all_of(works_.begin(), works_.end(), [](auto& w) { return w->isSuccess(); });
  }
  bool wait(std::chrono::milliseconds timeout) override {
    for (auto& w : works_) w->wait(timeout);
    return true;
  }
  // Completes with every operation's outputs once all have completed, or with the first error.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
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

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::mutex futureMu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// ---- Point to point with tags ------------------------------------------------------------------
//
// Chorus matches the messages between two ranks in order. torch (like gloo and MPI) matches a
// receive to the first message from its source with its tag. So every message carries an envelope
// (tag, bytes) sent just before it; a batch of queued receives is posted in order, and after it
// the worker moves each message to the first receive of that source and tag that is still open.
// A message no open receive wants waits in an unexpected list for a later receive; a receive
// whose buffer held another tag's message is posted again. So receives of one size may be posted in
// any tag order. A receive of one size that meets a message of another (receives of different sizes
// posted in another tag order than the sends) fails with Chorus's size mismatch and a hint saying so.

struct Envelope {
  int64_t tag;
  int64_t bytes;
};

struct P2pOp {
  bool isSend;
  at::Tensor tensor;  // the user's tensor
  int peer;
  int64_t tag;
  c10::intrusive_ptr<AsyncWork> work;
};

class P2pEngine {
 public:
  // Runs on the worker: every op completes (or fails) before it returns.
  void run(chorusComm_t comm, std::vector<P2pOp>& ops) {
    std::exception_ptr error;
    try {
      runChecked(comm, ops);
    } catch (...) {
      error = std::current_exception();
    }
    for (P2pOp& op : ops)
      if (!op.work->isCompleted())
        op.work->complete(
            error ? error : std::make_exception_ptr(std::runtime_error("chorus send/recv: not completed")));
  }

 private:
  struct Received {
    int64_t tag;
    at::Tensor bytes;  // uint8
  };
  struct Pending {
    P2pOp* op;
    at::Tensor dense;  // contiguous buffer the message lands in
    Envelope env{0, 0};
    bool done = false;
  };

  static at::Tensor asBytes(const at::Tensor& t) { return t.view({-1}).view(at::kByte); }

  void deliver(Pending& p, const at::Tensor& bytes) {
    at::Tensor dst = asBytes(p.op->tensor.is_contiguous() ? p.op->tensor : p.dense);
    TORCH_CHECK(dst.numel() == bytes.numel(), "chorus recv from rank ", p.op->peer, " with tag ", p.op->tag,
                ": the message has ", bytes.numel(), " bytes and the receive ", dst.numel());
    if (!dst.is_same(bytes) && dst.data_ptr() != bytes.data_ptr()) dst.copy_(bytes);
    if (!p.op->tensor.is_contiguous()) p.op->tensor.copy_(p.dense);
    p.done = true;
    p.op->work->setSourceRank(p.op->peer);
    p.op->work->complete(nullptr);
  }

  void runChecked(chorusComm_t comm, std::vector<P2pOp>& ops) {
    std::vector<Pending> recvs;
    std::vector<P2pOp*> sends;
    std::vector<at::Tensor> sendDense;
    std::vector<Envelope> sendEnv;
    for (P2pOp& op : ops) {
      if (op.isSend) {
        sends.push_back(&op);
      } else {
        recvs.push_back(Pending{&op, op.tensor.is_contiguous()
                                         ? op.tensor
                                         : at::empty_like(op.tensor, at::MemoryFormat::Contiguous)});
      }
    }
    // Receives an earlier message already answers.
    for (Pending& p : recvs) takeUnexpected(p);
    sendEnv.reserve(sends.size());
    for (P2pOp* s : sends) {
      sendDense.push_back(s->tensor.contiguous());
      sendEnv.push_back(Envelope{s->tag, static_cast<int64_t>(s->tensor.nbytes())});
    }
    bool first = true;
    for (;;) {
      std::vector<Pending*> open;
      for (Pending& p : recvs)
        if (!p.done) open.push_back(&p);
      if (open.empty() && (!first || sends.empty())) break;
      {
        GroupGuard group;
        check(comm, group.startResult(), "send/recv");
        chorusResult_t r = chorusSuccess;
        if (first) {
          for (size_t i = 0; i < sends.size() && r == chorusSuccess; ++i) {
            r = chorusSend(&sendEnv[i], sizeof(Envelope), chorusUint8, sends[i]->peer, comm, nullptr);
            if (r == chorusSuccess)
              r = chorusSend(sendDense[i].data_ptr(), sendDense[i].nbytes(), chorusUint8, sends[i]->peer,
                             comm, nullptr);
          }
        }
        for (Pending* p : open) {
          if (r != chorusSuccess) break;
          r = chorusRecv(&p->env, sizeof(Envelope), chorusUint8, p->op->peer, comm, nullptr);
          if (r == chorusSuccess)
            r = chorusRecv(p->dense.data_ptr(), p->dense.nbytes(), chorusUint8, p->op->peer, comm, nullptr);
        }
        const chorusResult_t end = group.end();
        if (r == chorusSuccess) r = end;
        if (r != chorusSuccess) {
          std::string hint = reorderHint(open);
          check(comm, r, hint.empty() ? "send/recv" : hint.c_str());
        }
      }
      if (first)
        for (P2pOp* s : sends) s->work->complete(nullptr);
      first = false;
      match(open);
    }
  }

  // Why a batch may have failed: receives from one rank posted in another tag order than the sends,
  // with different sizes. Messages land in the receives in posting order, so their sizes differ.
  static std::string reorderHint(const std::vector<Pending*>& open) {
    for (size_t i = 0; i < open.size(); ++i)
      for (size_t j = i + 1; j < open.size(); ++j)
        if (open[i]->op->peer == open[j]->op->peer && open[i]->op->tag != open[j]->op->tag &&
            open[i]->dense.nbytes() != open[j]->dense.nbytes())
          return "send/recv (receives from rank " + std::to_string(open[i]->op->peer) + " with tags " +
                 std::to_string(open[i]->op->tag) + " and " + std::to_string(open[j]->op->tag) +
                 " have different sizes: chorus matches tags by moving messages between receives of the same "
                 "size, so post receives of different sizes in the order they were sent)";
    return "";
  }

  // The messages that landed in `open` (in arrival order per source) go to the first open receive
  // of their source and tag; the rest wait in the unexpected list.
  void match(std::vector<Pending*>& open) {
    // Take every message out first: a message may move into a buffer another message landed in.
    std::vector<std::pair<int, Received>> arrived;
    for (Pending* p : open) {
      at::Tensor bytes = asBytes(p->dense);
      arrived.push_back({p->op->peer, Received{p->env.tag, bytes}});
    }
    std::vector<bool> claimed(open.size(), false);
    std::vector<std::pair<Pending*, at::Tensor>> moves;
    for (size_t i = 0; i < arrived.size(); ++i) {
      const int peer = arrived[i].first;
      Received& m = arrived[i].second;
      TORCH_CHECK(open[i]->env.bytes == m.bytes.numel(), "chorus recv from rank ", peer,
                  ": the envelope announced ", open[i]->env.bytes, " bytes and ", m.bytes.numel(),
                  " arrived");
      size_t target = open.size();
      for (size_t j = 0; j < open.size(); ++j)
        if (!claimed[j] && open[j]->op->peer == peer && open[j]->op->tag == m.tag) {
          target = j;
          break;
        }
      if (target == i) {
        claimed[i] = true;
        moves.push_back({open[i], at::Tensor()});  // in place
      } else if (target < open.size()) {
        claimed[target] = true;
        moves.push_back({open[target], m.bytes.clone()});
      } else {
        unexpected_[peer].push_back(Received{m.tag, m.bytes.clone()});
      }
    }
    for (auto& [p, bytes] : moves) deliver(*p, bytes.defined() ? bytes : asBytes(p->dense));
  }

  void takeUnexpected(Pending& p) {
    auto it = unexpected_.find(p.op->peer);
    if (it == unexpected_.end()) return;
    auto& q = it->second;
    for (auto m = q.begin(); m != q.end(); ++m)
      if (m->tag == p.op->tag) {
        at::Tensor bytes = m->bytes;
        q.erase(m);
        deliver(p, bytes);
        return;
      }
  }

  std::map<int, std::deque<Received>> unexpected_;  // touched by the worker only
};

// Point-to-point calls wait here and run together, as one Chorus group on the worker, when one of
// their Works is waited for, at endCoalescing, or before the next collective. So irecv-then-isend on
// two ranks, or a batch_isend_irecv list, progress together instead of each blocking the other.
class P2pQueue {
 public:
  P2pQueue(chorusComm_t comm, Worker* worker)
      : comm_(comm), worker_(worker), engine_(std::make_shared<P2pEngine>()) {}
  void add(P2pOp op) {
    std::lock_guard<std::mutex> lk(mu_);
    ops_.push_back(std::move(op));
  }
  void flush() {
    std::lock_guard<std::mutex> lk(mu_);
    if (ops_.empty() || worker_ == nullptr) return;
    auto batch = std::make_shared<std::vector<P2pOp>>();
    batch->swap(ops_);
    worker_->submit([comm = comm_, batch, engine = engine_] { engine->run(comm, *batch); });
  }
  void detach() {
    std::lock_guard<std::mutex> lk(mu_);
    worker_ = nullptr;
  }

 private:
  std::mutex mu_;
  std::vector<P2pOp> ops_;
  chorusComm_t comm_;
  Worker* worker_;
  std::shared_ptr<P2pEngine> engine_;
};

class P2pWork : public AsyncWork {
 public:
  P2pWork(std::shared_ptr<P2pQueue> queue, int rank, OpType type, const char* title,
          const std::vector<at::Tensor>& tensors, uint64_t seq)
      : AsyncWork(rank, type, title, tensors, tensors, seq), queue_(std::move(queue)) {}
  bool wait(std::chrono::milliseconds timeout) override {
    if (!isCompleted()) queue_->flush();
    return AsyncWork::wait(timeout);
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (!isCompleted()) queue_->flush();
    return future_;
  }

 private:
  std::shared_ptr<P2pQueue> queue_;
};

// Runs `f` without the GIL if this thread holds it (so the worker, which may need the GIL to run a
// future's Python callback or free a tensor, can finish).
template <typename F>
void withoutGil(F&& f) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release nogil;
    f();
  } else {
    f();
  }
}

const std::string kIdKey = "chorus/unique_id";

// A call's own options: its timeout (kUnsetTimeout: the group's) and whether the caller asked for
// an asynchronous Work.
struct CallOptions {
  std::chrono::milliseconds timeout;
  bool async;
};

}  // namespace

class ProcessGroupChorus : public c10d::Backend {
 public:
  // Collective over the group: rank 0 publishes a unique id in `store`, every rank joins with it.
  ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
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

  // A group around a communicator Chorus made (shrink).
  ProcessGroupChorus(chorusComm_t comm, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     c10::intrusive_ptr<Options> options)
      : c10d::Backend(rank, size), store_(store), options_(std::move(options)), comm_(comm) {
    start(options_->timeout);
  }

  ~ProcessGroupChorus() override {
    withoutGil([this] { teardown(false); });
  }

  const std::string getBackendName() const override { return "chorus"; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }

  // ---- Collectives ----

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const at::Tensor t = single(tensors, "broadcast");
    checkRoot(opts.rootRank, "broadcast");
    const int root = static_cast<int>(opts.rootRank);
    return enqueue(OpType::BROADCAST, "chorus:broadcast", tensors, tensors, {opts.timeout, opts.asyncOp},
                   [t, root](chorusComm_t c) {
                     Dense d(t, true);
                     check(c,
                           chorusBroadcast(d.t.data_ptr(), d.t.data_ptr(), d.t.nbytes(), chorusUint8, root, c,
                                           callStream()),
                           "broadcast");
                     d.write();
                   });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (tensors.size() == 1 && tensors[0].defined() && tensors[0].layout() == at::kSparse)
      return allreduceSparse(tensors, opts);
    const at::Tensor t = single(tensors, "all_reduce");
    const Reduction red = reductionOf(opts.reduceOp, t.scalar_type(), "all_reduce");
    const int n = getSize();
    return enqueue(OpType::ALLREDUCE, "chorus:all_reduce", tensors, tensors, {opts.timeout, opts.asyncOp},
                   [t, red, n](chorusComm_t c) { allreduceNow(c, t, red, n, "all_reduce"); });
  }

  // A sparse COO tensor, SUM (as gloo): every rank's indices and values are all-gathered (padded to
  // the largest count), concatenated and coalesced; the result replaces the tensor's contents.
  c10::intrusive_ptr<c10d::Work> allreduceSparse(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceOptions& opts) {
    const at::Tensor t = tensors[0];
    TORCH_CHECK(t.device().is_cpu(), "chorus all_reduce: sparse tensors on ", t.device(),
                " are not supported");
    TORCH_CHECK(opts.reduceOp == RedOp::SUM, "chorus all_reduce: sparse tensors take ReduceOp.SUM only, not ",
                opName(opts.reduceOp.op_));
    const int n = getSize();
    return enqueue(
        OpType::ALLREDUCE, "chorus:all_reduce", tensors, tensors, {opts.timeout, opts.asyncOp},
        [t, n](chorusComm_t c) {
          const at::Tensor in = t.coalesce();
          const at::Tensor idx = in._indices().contiguous(), val = in._values().contiguous();
          const int64_t nnz = idx.size(1);
          at::Tensor counts = at::empty({n}, at::kLong);
          check(c, chorusAllGather(&nnz, counts.data_ptr(), sizeof nnz, chorusUint8, c, callStream()),
                "all_reduce (sparse counts)");
          const int64_t most = counts.max().item<int64_t>();
          auto gather = [&](const at::Tensor& part, int64_t dim, const char* what) {
            // `part` padded to `most` along `dim`, gathered: n x its padded shape.
            std::vector<int64_t> shape(part.sizes().begin(), part.sizes().end());
            shape[dim] = most;
            at::Tensor padded = at::zeros(shape, part.options());
            padded.narrow(dim, 0, part.size(dim)).copy_(part);
            shape.insert(shape.begin(), n);
            at::Tensor all = at::empty(shape, part.options());
            check(c,
                  chorusAllGather(padded.data_ptr(), all.data_ptr(), padded.nbytes(), chorusUint8, c,
                                  callStream()),
                  what);
            return all;
          };
          at::Tensor allIdx = gather(idx, 1, "all_reduce (sparse indices)");
          at::Tensor allVal = gather(val, 0, "all_reduce (sparse values)");
          std::vector<at::Tensor> idxs, vals;
          for (int r = 0; r < n; ++r) {
            const int64_t k = counts[r].item<int64_t>();
            idxs.push_back(allIdx[r].narrow(1, 0, k));
            vals.push_back(allVal[r].narrow(0, 0, k));
          }
          at::Tensor sum =
              at::sparse_coo_tensor(at::cat(idxs, 1), at::cat(vals, 0), t.sizes(), t.options()).coalesce();
          at::Tensor(t).copy_(sum);
        });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "chorus allreduce_coalesced: no tensors");
    checkAll(tensors, "allreduce_coalesced");
    for (const auto& t : tensors)
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "chorus allreduce_coalesced: mixed types (",
                  tensors[0].scalar_type(), " and ", t.scalar_type(), ")");
    const Reduction red = reductionOf(opts.reduceOp, tensors[0].scalar_type(), "allreduce_coalesced");
    const int n = getSize();
    return enqueue(OpType::ALLREDUCE_COALESCED, "chorus:all_reduce", tensors, tensors,
                   {opts.timeout, opts.asyncOp}, [tensors, red, n](chorusComm_t c) {
                     std::vector<at::Tensor> flat;
                     for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
                     at::Tensor all = at::cat(flat);
                     allreduceNow(c, all, red, n, "allreduce_coalesced");
                     int64_t offset = 0;
                     for (const auto& t : tensors) {
                       at::Tensor(t).copy_(all.narrow(0, offset, t.numel()).view(t.sizes()));
                       offset += t.numel();
                     }
                   });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const at::Tensor t = single(tensors, "reduce");
    checkRoot(opts.rootRank, "reduce");
    const Reduction red = reductionOf(opts.reduceOp, t.scalar_type(), "reduce");
    const int root = static_cast<int>(opts.rootRank), me = getRank(), n = getSize();
    return enqueue(
        OpType::REDUCE, "chorus:reduce", tensors, tensors, {opts.timeout, opts.asyncOp},
        [t, red, root, me, n](chorusComm_t c) {
          if (red.bitwise) {
            at::Tensor in = t.contiguous();
            at::Tensor all = at::empty({n, t.numel()}, t.options());
            check(c,
                  chorusAllGather(in.data_ptr(), all.data_ptr(), in.nbytes(), chorusUint8, c, callStream()),
                  "reduce");
            if (me == root) at::Tensor(t).copy_(fold(all, *red.bitwise).view(t.sizes()));
            return;
          }
          // A copy when scaling: only the root's tensor may change.
          Dense d(t, true);
          at::Tensor buf = premul(red) ? d.t.clone() : d.t;
          if (premul(red)) premultiply(buf, red);
          check(c,
                chorusReduce(buf.data_ptr(), buf.data_ptr(), reductionCount(buf, red), red.type, red.op, root,
                             c, callStream()),
                "reduce");
          if (me == root) {
            if (!buf.is_same(d.t)) d.t.copy_(buf);
            d.write();
          }
        });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    const at::Tensor in = single(inputs, "all_gather");
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "chorus all_gather: one list of ", getSize(), " output tensors expected");
    for (const auto& o : outputs[0]) checkLike(o, in, "all_gather");
    const std::vector<at::Tensor> outs = outputs[0];
    return enqueue(
        OpType::ALLGATHER, "chorus:all_gather", inputs, outs, {opts.timeout, opts.asyncOp},
        [in, outs](chorusComm_t c) {
          at::Tensor src = in.contiguous();
          at::Tensor flat = at::empty({static_cast<int64_t>(outs.size()), in.numel()}, in.options());
          check(c,
                chorusAllGather(src.data_ptr(), flat.data_ptr(), src.nbytes(), chorusUint8, c, callStream()),
                "all_gather");
          for (size_t r = 0; r < outs.size(); ++r)
            at::Tensor(outs[r]).copy_(flat[static_cast<int64_t>(r)].view(outs[r].sizes()));
        });
  }

  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override {
    checkTensor(input, "all_gather_into_tensor");
    checkTensor(output, "all_gather_into_tensor");
    TORCH_CHECK(output.numel() == input.numel() * getSize() && output.scalar_type() == input.scalar_type(),
                "chorus all_gather_into_tensor: the output must hold world_size (", getSize(), ") inputs of ",
                input.numel(), " ", input.scalar_type(), " elements, not ", output.numel(), " ",
                output.scalar_type());
    const at::Tensor in = input, out = output;
    return enqueue(OpType::_ALLGATHER_BASE, "chorus:all_gather_into_tensor", {input}, {output},
                   {opts.timeout, opts.asyncOp},
                   [in, out](chorusComm_t c) { allgatherNow(c, in, out, "all_gather_into_tensor"); });
  }

  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) override {
    checkCoalesced(inputs, outputs, "all_gather_into_tensor_coalesced");
    const std::vector<at::Tensor> ins = inputs, outs = outputs;
    return enqueue(OpType::COALESCED, "chorus:all_gather_into_tensor_coalesced", inputs, outputs,
                   {opts.timeout, opts.asyncOp}, [ins, outs](chorusComm_t c) {
                     for (size_t i = 0; i < ins.size(); ++i)
                       allgatherNow(c, ins[i], outs[i], "all_gather_into_tensor_coalesced");
                   });
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK(static_cast<int>(outputLists.size()) == getSize(), "chorus all_gather_coalesced: ", getSize(),
                " output lists expected, got ", outputLists.size());
    checkAll(inputs, "all_gather_coalesced");
    for (const auto& list : outputLists) {
      TORCH_CHECK(list.size() == inputs.size(), "chorus all_gather_coalesced: every output list needs ",
                  inputs.size(), " tensors");
      for (size_t i = 0; i < list.size(); ++i) checkLike(list[i], inputs[i], "all_gather_coalesced");
    }
    TORCH_CHECK(!inputs.empty(), "chorus all_gather_coalesced: no tensors");
    const std::vector<at::Tensor> ins = inputs;
    const std::vector<std::vector<at::Tensor>> outs = outputLists;
    std::vector<at::Tensor> flatOuts;
    for (const auto& l : outputLists) flatOuts.insert(flatOuts.end(), l.begin(), l.end());
    return enqueue(
        OpType::ALLGATHER_COALESCED, "chorus:all_gather_coalesced", inputs, flatOuts,
        {opts.timeout, opts.asyncOp}, [ins, outs](chorusComm_t c) {
          // Every input as bytes in one buffer, gathered once.
          std::vector<at::Tensor> bytes;
          for (const auto& t : ins) bytes.push_back(t.contiguous().view({-1}).view(at::kByte));
          at::Tensor mine = at::cat(bytes);
          at::Tensor all = at::empty({static_cast<int64_t>(outs.size()), mine.numel()}, mine.options());
          check(c,
                chorusAllGather(mine.data_ptr(), all.data_ptr(), mine.nbytes(), chorusUint8, c, callStream()),
                "all_gather_coalesced");
          for (size_t r = 0; r < outs.size(); ++r) {
            int64_t off = 0;
            for (size_t i = 0; i < ins.size(); ++i) {
              const int64_t nb = static_cast<int64_t>(ins[i].nbytes());
              at::Tensor dst = outs[r][i];
              at::Tensor src = all[static_cast<int64_t>(r)].narrow(0, off, nb);
              dst.copy_(src.view(dst.scalar_type()).view(dst.sizes()));
              off += nb;
            }
          }
        });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "chorus reduce_scatter: one list of ", getSize(), " input tensors expected");
    for (const auto& i : inputs[0]) checkLike(i, out, "reduce_scatter");
    const Reduction red = reductionOf(opts.reduceOp, out.scalar_type(), "reduce_scatter");
    const std::vector<at::Tensor> ins = inputs[0];
    const int me = getRank(), n = getSize();
    return enqueue(OpType::REDUCE_SCATTER, "chorus:reduce_scatter", ins, outputs,
                   {opts.timeout, opts.asyncOp}, [out, ins, red, me, n](chorusComm_t c) {
                     std::vector<at::Tensor> flat;
                     for (const auto& t : ins) flat.push_back(t.reshape({-1}));
                     reduceScatterNow(c, at::cat(flat), out, red, me, n, "reduce_scatter", true);
                   });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts) override {
    checkTensor(input, "reduce_scatter_tensor");
    checkTensor(output, "reduce_scatter_tensor");
    TORCH_CHECK(input.numel() == output.numel() * getSize() && output.scalar_type() == input.scalar_type(),
                "chorus reduce_scatter_tensor: the input must hold world_size (", getSize(), ") outputs of ",
                output.numel(), " ", output.scalar_type(), " elements, not ", input.numel(), " ",
                input.scalar_type());
    const Reduction red = reductionOf(opts.reduceOp, output.scalar_type(), "reduce_scatter_tensor");
    const at::Tensor in = input, out = output;
    const int me = getRank(), n = getSize();
    return enqueue(OpType::_REDUCE_SCATTER_BASE, "chorus:reduce_scatter_tensor", {input}, {output},
                   {opts.timeout, opts.asyncOp}, [in, out, red, me, n](chorusComm_t c) {
                     reduceScatterNow(c, in, out, red, me, n, "reduce_scatter_tensor", false);
                   });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    checkCoalesced(outputs, inputs, "reduce_scatter_tensor_coalesced");
    std::vector<Reduction> reds;
    for (const auto& o : outputs)
      reds.push_back(reductionOf(opts.reduceOp, o.scalar_type(), "reduce_scatter_tensor_coalesced"));
    const std::vector<at::Tensor> ins = inputs, outs = outputs;
    const int me = getRank(), n = getSize();
    return enqueue(OpType::COALESCED, "chorus:reduce_scatter_tensor_coalesced", inputs, outputs,
                   {opts.timeout, opts.asyncOp}, [ins, outs, reds, me, n](chorusComm_t c) {
                     for (size_t i = 0; i < ins.size(); ++i)
                       reduceScatterNow(c, ins[i], outs[i], reds[i], me, n, "reduce_scatter_tensor_coalesced",
                                        false);
                   });
  }

  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                   std::vector<int64_t>& outSplits,
                                                   std::vector<int64_t>& inSplits,
                                                   const c10d::AllToAllOptions& opts) override {
    checkTensor(input, "all_to_all_single");
    checkTensor(output, "all_to_all_single");
    const int n = getSize();
    TORCH_CHECK(input.scalar_type() == output.scalar_type(), "chorus all_to_all_single: input (",
                input.scalar_type(), ") and output (", output.scalar_type(), ") types differ");
    const at::Tensor in = input, out = output;
    if (outSplits.empty() && inSplits.empty()) {
      const int64_t rows = input.dim() > 0 ? input.size(0) : 0;
      TORCH_CHECK(
          input.numel() == output.numel() && rows % n == 0,
          "chorus all_to_all_single: equal splits need input and output of the same size, with a first "
          "dimension divisible by ",
          n);
      return enqueue(OpType::ALLTOALL_BASE, "chorus:all_to_all", {input}, {output},
                     {opts.timeout, opts.asyncOp}, [in, out, n](chorusComm_t c) {
                       at::Tensor src = in.contiguous();
                       Dense d(out, false);
                       check(c,
                             chorusAllToAll(src.data_ptr(), d.t.data_ptr(), src.nbytes() / n, chorusUint8, c,
                                            callStream()),
                             "all_to_all_single");
                       d.write();
                     });
    }
    TORCH_CHECK((outSplits.empty() || static_cast<int>(outSplits.size()) == n) &&
                    (inSplits.empty() || static_cast<int>(inSplits.size()) == n),
                "chorus all_to_all_single: split sizes must have ", n, " entries");
    // Splits count rows (the first dimension); they must be non-negative and add up to it.
    auto counts = [&](const std::vector<int64_t>& splits, const at::Tensor& t, std::vector<size_t>& cnt,
                      std::vector<size_t>& disp, const char* which) {
      TORCH_CHECK(t.dim() > 0, "chorus all_to_all_single: uneven splits need a tensor with dimensions");
      const int64_t rows = t.size(0);
      const int64_t rowBytes = rows > 0 ? static_cast<int64_t>(t.nbytes()) / rows : 0;
      TORCH_CHECK(!splits.empty() || rows % n == 0, "chorus all_to_all_single: ", which, " has ", rows,
                  " rows, not divisible by ", n);
      int64_t total = 0;
      for (int r = 0; r < n; ++r) {
        const int64_t sz = splits.empty() ? rows / n : splits[r];
        TORCH_CHECK(sz >= 0, "chorus all_to_all_single: negative split size");
        disp.push_back(static_cast<size_t>(total * rowBytes));
        cnt.push_back(static_cast<size_t>(sz * rowBytes));
        total += sz;
      }
      TORCH_CHECK(total == rows, "chorus all_to_all_single: ", which, " splits add up to ", total,
                  " rows, not ", rows);
    };
    std::vector<size_t> sc, sd, rc, rd;
    counts(inSplits, input, sc, sd, "the input");
    counts(outSplits, output, rc, rd, "the output");
    return enqueue(OpType::ALLTOALL_BASE, "chorus:all_to_all", {input}, {output},
                   {opts.timeout, opts.asyncOp}, [in, out, sc, sd, rc, rd](chorusComm_t c) {
                     at::Tensor src = in.contiguous();
                     Dense d(out, false);
                     check(c,
                           chorusAllToAllv(src.data_ptr(), sc.data(), sd.data(), d.t.data_ptr(), rc.data(),
                                           rd.data(), chorusUint8, c, callStream()),
                           "all_to_all_single");
                     d.write();
                   });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    const int n = getSize();
    TORCH_CHECK(static_cast<int>(outputs.size()) == n && static_cast<int>(inputs.size()) == n,
                "chorus all_to_all: ", n, " input and output tensors expected");
    std::vector<size_t> sc, sd, rc, rd;
    for (int r = 0; r < n; ++r) {
      checkTensor(inputs[r], "all_to_all");
      checkTensor(outputs[r], "all_to_all");
      TORCH_CHECK(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                      outputs[r].scalar_type() == inputs[0].scalar_type(),
                  "chorus all_to_all: every tensor must have the same type");
      sd.push_back(r == 0 ? 0 : sd.back() + sc.back());
      sc.push_back(inputs[r].nbytes());
      rd.push_back(r == 0 ? 0 : rd.back() + rc.back());
      rc.push_back(outputs[r].nbytes());
    }
    const std::vector<at::Tensor> ins = inputs, outs = outputs;
    return enqueue(OpType::ALLTOALL, "chorus:all_to_all", inputs, outputs, {opts.timeout, opts.asyncOp},
                   [ins, outs, sc, sd, rc, rd](chorusComm_t c) {
                     std::vector<at::Tensor> bytes;
                     for (const auto& t : ins) bytes.push_back(t.contiguous().view({-1}).view(at::kByte));
                     at::Tensor in = at::cat(bytes);
                     at::Tensor out = at::empty({static_cast<int64_t>(rd.back() + rc.back())}, in.options());
                     check(c,
                           chorusAllToAllv(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(),
                                           rd.data(), chorusUint8, c, callStream()),
                           "all_to_all");
                     for (size_t r = 0; r < outs.size(); ++r) {
                       at::Tensor dst = outs[r];
                       dst.copy_(out.narrow(0, static_cast<int64_t>(rd[r]), static_cast<int64_t>(rc[r]))
                                     .view(dst.scalar_type())
                                     .view(dst.sizes()));
                     }
                   });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const at::Tensor in = single(inputs, "gather");
    checkRoot(opts.rootRank, "gather");
    const int root = static_cast<int>(opts.rootRank), me = getRank();
    const bool isRoot = me == root;
    if (isRoot) {
      TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                  "chorus gather: the root needs one list of ", getSize(), " output tensors");
      for (const auto& o : outputs[0]) checkLike(o, in, "gather");
    } else {
      TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "chorus gather: rank ", me,
                  " is not the root (", root, ") and takes no output list");
    }
    const std::vector<at::Tensor> outs = isRoot ? outputs[0] : std::vector<at::Tensor>{};
    return enqueue(OpType::GATHER, "chorus:gather", inputs, outs, {opts.timeout, opts.asyncOp},
                   [in, outs, root, me](chorusComm_t c) {
                     at::Tensor src = in.contiguous();
                     std::vector<at::Tensor> dense;
                     chorusResult_t first = chorusSuccess;
                     {
                       GroupGuard group;
                       check(c, group.startResult(), "gather");
                       if (me == root) {
                         for (size_t r = 0; r < outs.size(); ++r) {
                           dense.push_back(outs[r].is_contiguous()
                                               ? outs[r]
                                               : at::empty_like(outs[r], at::MemoryFormat::Contiguous));
                           if (static_cast<int>(r) == root)
                             dense[r].copy_(src.view(outs[r].sizes()));
                           else if (first == chorusSuccess)
                             first = chorusRecv(dense[r].data_ptr(), dense[r].nbytes(), chorusUint8,
                                                static_cast<int>(r), c, callStream());
                         }
                       } else {
                         first = chorusSend(src.data_ptr(), src.nbytes(), chorusUint8, root, c, callStream());
                       }
                       const chorusResult_t end = group.end();
                       check(c, first, "gather");
                       check(c, end, "gather");
                     }
                     for (size_t r = 0; r < dense.size(); ++r)
                       if (!dense[r].is_same(outs[r])) at::Tensor(outs[r]).copy_(dense[r]);
                   });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const at::Tensor out = single(outputs, "scatter");
    checkRoot(opts.rootRank, "scatter");
    const int root = static_cast<int>(opts.rootRank), me = getRank();
    const bool isRoot = me == root;
    if (isRoot) {
      TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                  "chorus scatter: the root needs one list of ", getSize(), " input tensors");
      for (const auto& i : inputs[0]) checkLike(i, out, "scatter");
    } else {
      TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "chorus scatter: rank ", me,
                  " is not the root (", root, ") and takes no input list");
    }
    const std::vector<at::Tensor> ins = isRoot ? inputs[0] : std::vector<at::Tensor>{};
    return enqueue(OpType::SCATTER, "chorus:scatter", ins, outputs, {opts.timeout, opts.asyncOp},
                   [out, ins, root, me](chorusComm_t c) {
                     Dense d(out, false);
                     std::vector<at::Tensor> srcs;
                     for (const auto& t : ins) srcs.push_back(t.contiguous());
                     chorusResult_t first = chorusSuccess;
                     GroupGuard group;
                     check(c, group.startResult(), "scatter");
                     if (me == root) {
                       for (size_t r = 0; r < srcs.size(); ++r) {
                         if (static_cast<int>(r) == root)
                           d.t.copy_(srcs[r].view(d.t.sizes()));
                         else if (first == chorusSuccess)
                           first = chorusSend(srcs[r].data_ptr(), srcs[r].nbytes(), chorusUint8,
                                              static_cast<int>(r), c, callStream());
                       }
                     } else {
                       first = chorusRecv(d.t.data_ptr(), d.t.nbytes(), chorusUint8, root, c, callStream());
                     }
                     const chorusResult_t end = group.end();
                     check(c, first, "scatter");
                     check(c, end, "scatter");
                     d.write();
                   });
  }

  // ---- Point to point ----

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override {
    return pointToPoint(tensors, dstRank, tag, true);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override {
    return pointToPoint(tensors, srcRank, tag, false);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    TORCH_CHECK(
        false,
        "chorus recv: a receive from any source is not supported (Chorus matches messages per source); "
        "name the source rank");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return enqueue(OpType::BARRIER, "chorus:barrier", {}, {}, {opts.timeout, opts.asyncOp},
                   [](chorusComm_t c) { check(c, chorusBarrier(c, callStream()), "barrier"); });
  }

  // Through the store, as gloo's does through its pairs, with gloo's messages: every rank checks in
  // with rank 0, which names the first rank (or, with waitAllRanks, every rank) that did not arrive
  // within `timeout`, then lets everyone go; a rank that is not let go within `timeout` says so.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override {
    const auto timeout = opts.timeout == c10d::kUnsetTimeout ? options_->timeout : opts.timeout;
    const uint64_t round = monitoredRound_++;
    const std::string base = "chorus/monitored_barrier/" + std::to_string(round) + "/";
    const int me = getRank(), n = getSize();
    withoutGil([&] {
      if (me != 0) {
        store_->set(base + std::to_string(me), std::vector<uint8_t>{1});
        try {
          store_->wait({base + "done"}, timeout);
        } catch (const std::exception& e) {
          TORCH_CHECK(false, "Rank ", me,
                      " successfully reached monitoredBarrier, but received errors while waiting "
                      "for send/recv from rank 0. Please check rank 0 logs for faulty rank. (chorus: Timed "
                      "out after ",
                      timeout.count(), " ms: ", e.what(), ")");
        }
        return;
      }
      const auto start = std::chrono::steady_clock::now();
      std::vector<int> missing;
      for (int r = 1; r < n; ++r) {
        const auto left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::steady_clock::now() - start);
        if (left.count() <= 0 && !waitAllRanks)
          TORCH_CHECK(false, "Rank 0 timed out in monitoredBarrier after ", timeout.count(), " ms (chorus)");
        bool arrived = false;
        try {
          store_->wait({base + std::to_string(r)}, std::max(left, std::chrono::milliseconds(1)));
          arrived = true;
        } catch (const std::exception&) {
        }
        if (!arrived) {
          missing.push_back(r);
          if (!waitAllRanks) break;
        }
      }
      if (!missing.empty()) {
        std::string list;
        for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
        TORCH_CHECK(false, missing.size() == 1 ? "Rank " : "Ranks ", list,
                    " failed to pass monitoredBarrier in ", timeout.count(), " ms (chorus: Timed out)");
      }
      store_->set(base + "done", std::vector<uint8_t>{1});
    });
  }

  // ---- Coalescing, groups and lifetime ----

  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override {
    std::lock_guard<std::mutex> lk(coalesceMu_);
    TORCH_CHECK(!coalescing_, "chorus: startCoalescing called twice without endCoalescing");
    coalescing_ = true;
    coalesced_.clear();
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
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

  bool supportsSplitting() const override { return true; }
  // A new communicator for `ranks` (this group's ranks, in order), made through `store` as at
  // creation; a rank not in `ranks` gets none.
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override {
    auto it = std::find(ranks.begin(), ranks.end(), getRank());
    if (it == ranks.end()) return nullptr;
    const auto timeout = opts ? opts->timeout : options_->timeout;
    auto pg = c10::make_intrusive<ProcessGroupChorus>(store, static_cast<int>(it - ranks.begin()),
                                                      static_cast<int>(ranks.size()), timeout,
                                                      opts ? opts->group_name : std::string());
    return pg;
  }

  bool supportsShrinking() const override { return true; }
  // chorusCommShrink: the survivors (every rank not excluded, with the same list) form a new group,
  // even where this one is broken by a dead rank.
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& exclude, int /*flags*/,
                                           const c10::intrusive_ptr<Options>& opts) override {
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

  void setTimeout(std::chrono::milliseconds timeout) override {
    TORCH_CHECK(timeout.count() >= 0, "chorus setTimeout: a negative timeout (", timeout.count(), " ms)");
    std::lock_guard<std::mutex> lk(commMu_);
    TORCH_CHECK(comm_ != nullptr && worker_, "chorus setTimeout: the process group was aborted or shut down");
    options_->timeout = timeout;
    // In call order: operations queued before keep the timeout they were queued with.
    worker_->submit([c = comm_, timeout] { chorusCommSetTimeout(c, timeout.count() / 1000.0); });
  }

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  void eagerConnectSingleDevice(at::Device) override {}  // the communicator exists from the constructor on

  // Pending operations fail with Chorus's error; the peers are told.
  void abort() override {
    withoutGil([this] { teardown(true); });
  }
  void shutdown() override {
    withoutGil([this] { teardown(false); });
  }

  c10d::ErrorType getError() override {
    std::lock_guard<std::mutex> lk(commMu_);
    if (comm_ == nullptr) return c10d::ErrorType::SUCCESS;
    chorusResult_t e = chorusSuccess;
    chorusCommGetAsyncError(comm_, &e);
    if (e == chorusSuccess) return c10d::ErrorType::SUCCESS;
    if (e == chorusTimeout) return c10d::ErrorType::TIMEOUT;
    if (e == chorusRemoteError) return c10d::ErrorType::REMOTE_ERROR;
    return c10d::ErrorType::COMM_ERROR;
  }

  chorusComm_t comm() const { return comm_; }

 private:
  void start(std::chrono::milliseconds timeout) {
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

  // Waits for everything queued so far.
  void flushAndDrain() {
    p2p_->flush();
    std::promise<void> done;
    auto f = done.get_future();
    worker_->submit([&done] { done.set_value(); });
    withoutGil([&] { f.wait(); });
  }

  // Sends and receives nobody waited for still happen, as in NCCL; then the worker runs what is
  // queued and stops, and only then the communicator goes. With `abort`, the communicator is
  // aborted first, so queued operations fail at once instead of waiting for peers.
  void teardown(bool abort) {
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

  // The pairs of a coalesced call: large[i] holds world_size times small[i], of one type.
  void checkCoalesced(const std::vector<at::Tensor>& small, const std::vector<at::Tensor>& large,
                      const char* call) const {
    TORCH_CHECK(small.size() == large.size(), "chorus ", call, ": ", small.size(), " and ", large.size(),
                " tensors: one of each per pair");
    for (size_t i = 0; i < small.size(); ++i) {
      checkTensor(small[i], call);
      checkTensor(large[i], call);
      TORCH_CHECK(large[i].numel() == small[i].numel() * getSize() &&
                      large[i].scalar_type() == small[i].scalar_type(),
                  "chorus ", call, ": pair ", i, " must be a tensor and one of world_size (", getSize(),
                  ") times its size and of its type, not ", small[i].numel(), " and ", large[i].numel(),
                  " elements");
    }
  }

  void checkRoot(int64_t root, const char* call) const {
    TORCH_CHECK(root >= 0 && root < getSize(), "chorus ", call, ": root ", root,
                " is not a rank of this group of ", getSize());
  }

  static void allreduceNow(chorusComm_t c, const at::Tensor& t, const Reduction& red, int n,
                           const char* call) {
    if (red.bitwise) {
      at::Tensor in = t.contiguous();
      at::Tensor all = at::empty({n, t.numel()}, t.options());
      check(c, chorusAllGather(in.data_ptr(), all.data_ptr(), in.nbytes(), chorusUint8, c, callStream()),
            call);
      at::Tensor(t).copy_(fold(all, *red.bitwise).view(t.sizes()));
      return;
    }
    Dense d(t, true);
    if (premul(red)) premultiply(d.t, red);
    check(c,
          chorusAllReduce(d.t.data_ptr(), d.t.data_ptr(), reductionCount(d.t, red), red.type, red.op, c,
                          callStream()),
          call);
    d.write();
  }

  static void allgatherNow(chorusComm_t c, const at::Tensor& in, const at::Tensor& out, const char* call) {
    at::Tensor src = in.contiguous();
    Dense d(out, false);
    check(c, chorusAllGather(src.data_ptr(), d.t.data_ptr(), src.nbytes(), chorusUint8, c, callStream()),
          call);
    d.write();
  }

  // `in` holds n blocks of out's size; `owned` when `in` is a temporary the call may scale in place.
  static void reduceScatterNow(chorusComm_t c, const at::Tensor& in, const at::Tensor& out,
                               const Reduction& red, int me, int n, const char* call, bool owned) {
    if (red.bitwise) {
      at::Tensor src = in.contiguous();
      at::Tensor all = at::empty({n, in.numel()}, in.options());
      check(c, chorusAllGather(src.data_ptr(), all.data_ptr(), src.nbytes(), chorusUint8, c, callStream()),
            call);
      at::Tensor folded = fold(all, *red.bitwise);
      at::Tensor(out).copy_(folded.view({n, -1})[me].view(out.sizes()));
      return;
    }
    at::Tensor src = in.contiguous();
    if (premul(red)) {
      if (!owned && src.is_same(in)) src = src.clone();
      premultiply(src, red);
    }
    Dense d(out, false);
    check(c,
          chorusReduceScatter(src.data_ptr(), d.t.data_ptr(), reductionCount(d.t, red), red.type, red.op, c,
                              callStream()),
          call);
    d.write();
  }

  // Queued sends and receives go first, so calls run in the order they were made.
  c10::intrusive_ptr<c10d::Work> enqueue(OpType type, const char* title,
                                         const std::vector<at::Tensor>& inputs,
                                         std::vector<at::Tensor> outputs, const CallOptions& call,
                                         std::function<void(chorusComm_t)> body) {
    const std::chrono::milliseconds timeout = call.timeout;
    TORCH_CHECK(comm_ != nullptr, "chorus: the process group was aborted or shut down");
    [[maybe_unused]] const at::Device device = deviceOf(inputs, outputs, title);
#ifdef CHORUS_TORCH_CUDA
    if (device.is_cuda())
      return enqueueCuda(type, title, inputs, std::move(outputs), device, std::move(body));
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
  // The worker enqueues the body on the caller's current stream (cudaStreamPerThread of the worker
  // where that is the legacy default stream, which it synchronizes with) while the caller waits:
  // so the caller's later kernels on its stream are ordered after the operation, and operations
  // stay in call order with the CPU ones queued before. An error while enqueuing raises here.
  c10::intrusive_ptr<c10d::Work> enqueueCuda(OpType type, const char* title,
                                             const std::vector<at::Tensor>& inputs,
                                             std::vector<at::Tensor> outputs, at::Device device,
                                             std::function<void(chorusComm_t)> body) {
    auto stream = c10::cuda::getCurrentCUDAStream(device.index());
    auto work = c10::make_intrusive<CudaWork>(getRank(), type, title, inputs, std::move(outputs), ++seq_,
                                              comm_, device);
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

  c10::intrusive_ptr<c10d::Work> pointToPoint(std::vector<at::Tensor>& tensors, int peer, int tag,
                                              bool isSend) {
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

  void record(const c10::intrusive_ptr<c10d::Work>& work) {
    std::lock_guard<std::mutex> lk(coalesceMu_);
    if (coalescing_) coalesced_.push_back(work);
  }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Options> options_;
  chorusComm_t comm_ = nullptr;
  std::mutex commMu_;
  std::unique_ptr<Worker> worker_;
  std::shared_ptr<P2pQueue> p2p_;
  std::atomic<uint64_t> seq_{0};
  uint64_t monitoredRound_ = 0;
  std::mutex coalesceMu_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
  struct CudaP2p {
    std::function<void(chorusComm_t)> op;
    at::Tensor tensor;
    c10::intrusive_ptr<AsyncWork> work;
  };
  std::vector<CudaP2p> cudaP2p_;  // CUDA sends and receives waiting for endCoalescing
};

}  // namespace chorus_torch

PYBIND11_MODULE(_C, m) {
  m.doc() = "Chorus's torch.distributed backend (registered as 'chorus' by the chorus_torch package)";
  py::module::import("torch.distributed");  // registers c10d.Backend, our base class
  m.def("version", [] {
    int v = 0;
    chorusGetVersion(&v);
    return v;
  });
  py::class_<chorus_torch::ProcessGroupChorus, c10d::Backend,
             c10::intrusive_ptr<chorus_torch::ProcessGroupChorus>>(m, "ProcessGroupChorus")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int, std::chrono::milliseconds,
                    std::string>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_name") = "",
           py::call_guard<py::gil_scoped_release>());
}
