// torch.distributed backend "chorus": a c10d::ProcessGroup (PyTorch 1.13) whose collectives run
// through Chorus's C API on CPU tensors. The only translation unit that includes torch.
//
// The Python package (chorus_torch/__init__.py) registers the backend and bootstraps each group:
// the group's rank 0 makes a Chorus unique id and passes it through the c10d store; from then on
// data moves only through Chorus. Each group runs its calls in order on a worker thread of its own,
// as ProcessGroupGloo does: a call checks its arguments, queues the operation and returns a Work
// that completes (and marks its future, which DistributedDataParallel chains on) when the worker
// has run it. So DDP's bucket allreduces overlap the rest of its backward pass.
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <cstring>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "chorus/chorus.h"

namespace chorus_torch {
namespace {

chorusDataType_t dtypeOf(const at::Tensor& t, const char* call) {
  switch (t.scalar_type()) {
    case at::kChar:
      return chorusInt8;
    case at::kByte:
      return chorusUint8;
    case at::kInt:
      return chorusInt32;
    case at::kLong:
      return chorusInt64;
    case at::kHalf:
      return chorusFloat16;
    case at::kBFloat16:
      return chorusBfloat16;
    case at::kFloat:
      return chorusFloat32;
    case at::kDouble:
      return chorusFloat64;
    default:
      TORCH_CHECK(false, "chorus ", call, ": tensors of type ", t.scalar_type(), " are not supported");
  }
}

chorusRedOp_t opOf(const c10d::ReduceOp& op, const char* call) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return chorusSum;
    case c10d::ReduceOp::AVG:
      return chorusAvg;
    case c10d::ReduceOp::PRODUCT:
      return chorusProd;
    case c10d::ReduceOp::MIN:
      return chorusMin;
    case c10d::ReduceOp::MAX:
      return chorusMax;
    default:
      TORCH_CHECK(false, "chorus ", call, ": reduce op ", static_cast<int>(op.op_),
                  " is not supported (SUM, AVG, PRODUCT, MIN and MAX are)");
  }
}

void checkTensor(const at::Tensor& t, const char* call) {
  TORCH_CHECK(t.device().is_cpu(), "chorus ", call, ": tensors must be on the CPU, not ", t.device(),
              " (device tensors are not supported yet)");
  TORCH_CHECK(t.is_contiguous(), "chorus ", call, ": tensors must be contiguous");
}

const at::Tensor& single(std::vector<at::Tensor>& tensors, const char* call) {
  TORCH_CHECK(tensors.size() == 1, "chorus ", call, ": one tensor per call, got ", tensors.size());
  checkTensor(tensors[0], call);
  return tensors[0];
}

at::Tensor flatCat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

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

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

// An operation queued on the worker. The base class's wait, isCompleted and isSuccess work from
// finish(); the future holds the output tensors, as ProcessGroupGloo's does.
class AsyncWork : public c10d::Work {
 public:
  AsyncWork(std::vector<at::Tensor> outputs, c10d::OpType type)
      : c10d::Work(-1, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
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
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Ends a Chorus group however the scope is left: a group left open would only queue every later call.
class GroupGuard {
 public:
  GroupGuard() : result_(chorusGroupStart()) {}
  ~GroupGuard() {
    if (open()) chorusGroupEnd();
  }
  bool open() const { return result_ == chorusSuccess && !ended_; }
  chorusResult_t startResult() const { return result_; }
  chorusResult_t end() {
    ended_ = true;
    return chorusGroupEnd();
  }

 private:
  chorusResult_t result_;
  bool ended_ = false;
};

// Point-to-point calls wait in this queue and run together, as one Chorus group on the worker, when
// one of their Works is waited for or before the next collective. So irecv-then-isend on two ranks,
// or a batch_isend_irecv list, progress together instead of each blocking the other.
class P2pWork;
class P2pQueue : public std::enable_shared_from_this<P2pQueue> {
 public:
  P2pQueue(chorusComm_t comm, Worker* worker) : comm_(comm), worker_(worker) {}
  void add(bool isSend, at::Tensor t, int peer, chorusDataType_t type, c10::intrusive_ptr<P2pWork> work) {
    std::lock_guard<std::mutex> lk(mu_);
    ops_.push_back(Op{isSend, std::move(t), peer, type, std::move(work)});
  }
  // Queues the waiting calls on the worker as one group (nothing if none wait).
  void flush();
  void detach() {
    std::lock_guard<std::mutex> lk(mu_);
    worker_ = nullptr;
  }

 private:
  struct Op {
    bool isSend;
    at::Tensor tensor;
    int peer;
    chorusDataType_t type;
    c10::intrusive_ptr<P2pWork> work;
  };
  static void run(chorusComm_t comm, std::vector<Op>& ops);
  std::mutex mu_;
  std::vector<Op> ops_;
  chorusComm_t comm_;
  Worker* worker_;
};

class P2pWork : public AsyncWork {
 public:
  P2pWork(std::shared_ptr<P2pQueue> queue, std::vector<at::Tensor> tensors, c10d::OpType type)
      : AsyncWork(std::move(tensors), type), queue_(std::move(queue)) {}
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

void P2pQueue::flush() {
  std::lock_guard<std::mutex> lk(mu_);
  if (ops_.empty() || worker_ == nullptr) return;
  auto batch = std::make_shared<std::vector<Op>>();
  batch->swap(ops_);
  worker_->submit([comm = comm_, batch] { run(comm, *batch); });
}

void P2pQueue::run(chorusComm_t comm, std::vector<Op>& ops) {
  chorusResult_t r = chorusGroupStart();
  if (r == chorusSuccess) {
    for (Op& op : ops) {
      const chorusResult_t e =
          op.isSend ? chorusSend(op.tensor.data_ptr(), op.tensor.numel(), op.type, op.peer, comm, nullptr)
                    : chorusRecv(op.tensor.data_ptr(), op.tensor.numel(), op.type, op.peer, comm, nullptr);
      if (e != chorusSuccess && r == chorusSuccess) r = e;
    }
    const chorusResult_t end = chorusGroupEnd();
    if (r == chorusSuccess) r = end;
  }
  std::exception_ptr error;
  if (r != chorusSuccess)
    error = std::make_exception_ptr(std::runtime_error(std::string("chorus send/recv failed (") +
                                                       chorusGetErrorString(r) +
                                                       "): " + chorusGetLastError(comm)));
  for (Op& op : ops) op.work->complete(error);
}

void checkLike(const at::Tensor& t, const at::Tensor& like, const char* call) {
  checkTensor(t, call);
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.numel() == like.numel(), "chorus ", call,
              ": every tensor must have the input's type (", like.scalar_type(), ") and size (", like.numel(),
              " elements), not ", t.scalar_type(), " and ", t.numel());
}

}  // namespace

class ProcessGroupChorus : public c10d::ProcessGroup {
 public:
  ProcessGroupChorus(const py::bytes& uniqueId, int rank, int size, double timeoutSeconds)
      : c10d::ProcessGroup(rank, size) {
    const std::string id = uniqueId;
    TORCH_CHECK(id.size() == CHORUS_UNIQUE_ID_BYTES, "chorus: a unique id has ", CHORUS_UNIQUE_ID_BYTES,
                " bytes, got ", id.size());
    chorusUniqueId uid;
    std::memcpy(uid.internal, id.data(), id.size());
    {
      py::gil_scoped_release nogil;
      check(comm_, chorusCommInitRank(&comm_, size, uid, rank), "init");
    }
    if (timeoutSeconds > 0) {
      const chorusResult_t r = chorusCommSetTimeout(comm_, timeoutSeconds);
      if (r != chorusSuccess) {
        const std::string why = chorusGetLastError(comm_);
        chorusCommDestroy(comm_);
        comm_ = nullptr;
        TORCH_CHECK(false, "chorus: setting the timeout to ", timeoutSeconds, " s failed: ", why);
      }
    }
    worker_ = std::make_unique<Worker>();
    p2p_ = std::make_shared<P2pQueue>(comm_, worker_.get());
  }
  ~ProcessGroupChorus() override {
    // Sends and receives nobody waited for still happen, as in NCCL; then the worker runs what is
    // queued and stops, and only then the communicator goes.
    if (p2p_) {
      p2p_->flush();
      p2p_->detach();
    }
    worker_.reset();
    if (comm_) chorusCommDestroy(comm_);
  }

  const std::string getBackendName() const override { return "chorus"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const at::Tensor t = single(tensors, "broadcast");
    const chorusDataType_t dt = dtypeOf(t, "broadcast");
    const int root = static_cast<int>(opts.rootRank);
    return enqueue(tensors, c10d::OpType::BROADCAST, [t, dt, root](chorusComm_t c) {
      check(c, chorusBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), dt, root, c, nullptr), "broadcast");
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const at::Tensor t = single(tensors, "allreduce");
    const chorusDataType_t dt = dtypeOf(t, "allreduce");
    const chorusRedOp_t op = opOf(opts.reduceOp, "allreduce");
    return enqueue(tensors, c10d::OpType::ALLREDUCE, [t, dt, op](chorusComm_t c) {
      check(c, chorusAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), dt, op, c, nullptr), "allreduce");
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "chorus allreduce_coalesced: no tensors");
    for (const auto& t : tensors) {
      checkTensor(t, "allreduce_coalesced");
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "chorus allreduce_coalesced: mixed types");
    }
    const chorusDataType_t dt = dtypeOf(tensors[0], "allreduce_coalesced");
    const chorusRedOp_t op = opOf(opts.reduceOp, "allreduce_coalesced");
    return enqueue(tensors, c10d::OpType::ALLREDUCE_COALESCED, [tensors, dt, op](chorusComm_t c) {
      at::Tensor flat = flatCat(tensors);
      check(c, chorusAllReduce(flat.data_ptr(), flat.data_ptr(), flat.numel(), dt, op, c, nullptr),
            "allreduce_coalesced");
      int64_t offset = 0;
      for (const auto& t : tensors) {
        at::Tensor(t).copy_(flat.narrow(0, offset, t.numel()).view_as(t));
        offset += t.numel();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const at::Tensor t = single(tensors, "reduce");
    const chorusDataType_t dt = dtypeOf(t, "reduce");
    const chorusRedOp_t op = opOf(opts.reduceOp, "reduce");
    const int root = static_cast<int>(opts.rootRank);
    return enqueue(tensors, c10d::OpType::REDUCE, [t, dt, op, root](chorusComm_t c) {
      check(c, chorusReduce(t.data_ptr(), t.data_ptr(), t.numel(), dt, op, root, c, nullptr), "reduce");
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    const at::Tensor in = single(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "chorus allgather: one list of ", getSize(), " output tensors expected");
    for (const auto& o : outputs[0]) checkLike(o, in, "allgather");
    const chorusDataType_t dt = dtypeOf(in, "allgather");
    const std::vector<at::Tensor> outs = outputs[0];
    return enqueue(outs, c10d::OpType::ALLGATHER, [in, outs, dt](chorusComm_t c) {
      at::Tensor flat = at::empty({in.numel() * static_cast<int64_t>(outs.size())}, in.options());
      check(c, chorusAllGather(in.data_ptr(), flat.data_ptr(), in.numel(), dt, c, nullptr), "allgather");
      for (size_t r = 0; r < outs.size(); ++r)
        at::Tensor(outs[r]).copy_(
            flat.narrow(0, static_cast<int64_t>(r) * in.numel(), in.numel()).view_as(outs[r]));
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    checkTensor(input, "all_gather_into_tensor");
    checkTensor(output, "all_gather_into_tensor");
    TORCH_CHECK(output.numel() == input.numel() * getSize() && output.scalar_type() == input.scalar_type(),
                "chorus all_gather_into_tensor: the output must hold world_size inputs of the same type");
    const chorusDataType_t dt = dtypeOf(input, "all_gather_into_tensor");
    const at::Tensor in = input, out = output;
    return enqueue({output}, c10d::OpType::_ALLGATHER_BASE, [in, out, dt](chorusComm_t c) {
      check(c, chorusAllGather(in.data_ptr(), out.data_ptr(), in.numel(), dt, c, nullptr),
            "all_gather_into_tensor");
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "chorus reduce_scatter: one list of ", getSize(), " input tensors expected");
    for (const auto& i : inputs[0]) checkLike(i, out, "reduce_scatter");
    const chorusDataType_t dt = dtypeOf(out, "reduce_scatter");
    const chorusRedOp_t op = opOf(opts.reduceOp, "reduce_scatter");
    const std::vector<at::Tensor> ins = inputs[0];
    return enqueue(outputs, c10d::OpType::REDUCE_SCATTER, [out, ins, dt, op](chorusComm_t c) {
      at::Tensor flat = flatCat(ins);
      check(c, chorusReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(), dt, op, c, nullptr),
            "reduce_scatter");
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    checkTensor(input, "reduce_scatter_tensor");
    checkTensor(output, "reduce_scatter_tensor");
    TORCH_CHECK(input.numel() == output.numel() * getSize() && output.scalar_type() == input.scalar_type(),
                "chorus reduce_scatter_tensor: the input must hold world_size outputs of the same type");
    const chorusDataType_t dt = dtypeOf(output, "reduce_scatter_tensor");
    const chorusRedOp_t op = opOf(opts.reduceOp, "reduce_scatter_tensor");
    const at::Tensor in = input, out = output;
    return enqueue({output}, c10d::OpType::_REDUCE_SCATTER_BASE, [in, out, dt, op](chorusComm_t c) {
      check(c, chorusReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), dt, op, c, nullptr),
            "reduce_scatter_tensor");
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outSplits,
                                               std::vector<int64_t>& inSplits,
                                               const c10d::AllToAllOptions&) override {
    checkTensor(input, "all_to_all_single");
    checkTensor(output, "all_to_all_single");
    const int n = getSize();
    TORCH_CHECK(input.scalar_type() == output.scalar_type(),
                "chorus all_to_all_single: input and output types differ");
    const chorusDataType_t dt = dtypeOf(input, "all_to_all_single");
    const at::Tensor in = input, out = output;
    if (outSplits.empty() && inSplits.empty()) {
      const int64_t rows = input.dim() > 0 ? input.size(0) : 0;
      TORCH_CHECK(
          input.numel() == output.numel() && rows % n == 0,
          "chorus all_to_all_single: equal splits need input and output of the same size, with a first "
          "dimension divisible by ",
          n);
      return enqueue({output}, c10d::OpType::ALLTOALL_BASE, [in, out, dt, n](chorusComm_t c) {
        check(c, chorusAllToAll(in.data_ptr(), out.data_ptr(), in.numel() / n, dt, c, nullptr),
              "all_to_all_single");
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
      const int64_t perRow = rows > 0 ? t.numel() / rows : 0;
      TORCH_CHECK(!splits.empty() || rows % n == 0, "chorus all_to_all_single: ", which, " has ", rows,
                  " rows, not divisible by ", n);
      int64_t total = 0;
      for (int r = 0; r < n; ++r) {
        const int64_t sz = splits.empty() ? rows / n : splits[r];
        TORCH_CHECK(sz >= 0, "chorus all_to_all_single: negative split size");
        disp.push_back(static_cast<size_t>(total * perRow));
        cnt.push_back(static_cast<size_t>(sz * perRow));
        total += sz;
      }
      TORCH_CHECK(total == rows, "chorus all_to_all_single: ", which, " splits add up to ", total,
                  " rows, not ", rows);
    };
    std::vector<size_t> sc, sd, rc, rd;
    counts(inSplits, input, sc, sd, "the input");
    counts(outSplits, output, rc, rd, "the output");
    return enqueue({output}, c10d::OpType::ALLTOALL_BASE, [in, out, dt, sc, sd, rc, rd](chorusComm_t c) {
      check(c,
            chorusAllToAllv(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(), rd.data(), dt, c,
                            nullptr),
            "all_to_all_single");
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
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
      sc.push_back(inputs[r].numel());
      rd.push_back(r == 0 ? 0 : rd.back() + rc.back());
      rc.push_back(outputs[r].numel());
    }
    const chorusDataType_t dt = dtypeOf(inputs[0], "all_to_all");
    const std::vector<at::Tensor> ins = inputs, outs = outputs;
    return enqueue(outputs, c10d::OpType::ALLTOALL, [ins, outs, dt, sc, sd, rc, rd](chorusComm_t c) {
      at::Tensor in = flatCat(ins);
      at::Tensor out = at::empty({static_cast<int64_t>(rd.back() + rc.back())}, outs[0].options());
      check(c,
            chorusAllToAllv(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(), rd.data(), dt, c,
                            nullptr),
            "all_to_all");
      for (size_t r = 0; r < outs.size(); ++r)
        at::Tensor(outs[r]).copy_(
            out.narrow(0, static_cast<int64_t>(rd[r]), static_cast<int64_t>(rc[r])).view_as(outs[r]));
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const at::Tensor in = single(inputs, "gather");
    const int root = static_cast<int>(opts.rootRank);
    const bool isRoot = getRank() == root;
    if (isRoot) {
      TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                  "chorus gather: the root needs one list of ", getSize(), " output tensors");
      for (const auto& o : outputs[0]) checkLike(o, in, "gather");
    }
    const chorusDataType_t dt = dtypeOf(in, "gather");
    const std::vector<at::Tensor> outs = isRoot ? outputs[0] : std::vector<at::Tensor>{};
    const int me = getRank();
    return enqueue(
        isRoot ? outputs[0] : inputs, c10d::OpType::GATHER, [in, outs, dt, root, me](chorusComm_t c) {
          chorusResult_t first = chorusSuccess;
          GroupGuard group;
          check(c, group.startResult(), "gather");
          if (me == root) {
            for (size_t r = 0; r < outs.size(); ++r) {
              if (static_cast<int>(r) == root)
                at::Tensor(outs[r]).copy_(in.view_as(outs[r]));
              else if (first == chorusSuccess)
                first = chorusRecv(outs[r].data_ptr(), outs[r].numel(), dt, static_cast<int>(r), c, nullptr);
            }
          } else {
            first = chorusSend(in.data_ptr(), in.numel(), dt, root, c, nullptr);
          }
          const chorusResult_t end = group.end();
          check(c, first, "gather");
          check(c, end, "gather");
        });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const at::Tensor out = single(outputs, "scatter");
    const int root = static_cast<int>(opts.rootRank);
    const bool isRoot = getRank() == root;
    if (isRoot) {
      TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                  "chorus scatter: the root needs one list of ", getSize(), " input tensors");
      for (const auto& i : inputs[0]) checkLike(i, out, "scatter");
    }
    const chorusDataType_t dt = dtypeOf(out, "scatter");
    const std::vector<at::Tensor> ins = isRoot ? inputs[0] : std::vector<at::Tensor>{};
    const int me = getRank();
    return enqueue(outputs, c10d::OpType::SCATTER, [out, ins, dt, root, me](chorusComm_t c) {
      chorusResult_t first = chorusSuccess;
      GroupGuard group;
      check(c, group.startResult(), "scatter");
      if (me == root) {
        for (size_t r = 0; r < ins.size(); ++r) {
          if (static_cast<int>(r) == root)
            at::Tensor(out).copy_(ins[r].view_as(out));
          else if (first == chorusSuccess)
            first = chorusSend(ins[r].data_ptr(), ins[r].numel(), dt, static_cast<int>(r), c, nullptr);
        }
      } else {
        first = chorusRecv(out.data_ptr(), out.numel(), dt, root, c, nullptr);
      }
      const chorusResult_t end = group.end();
      check(c, first, "scatter");
      check(c, end, "scatter");
    });
  }

  // Queued until a Work is waited for or a collective comes (see P2pQueue). Tags are not matched:
  // messages between two ranks arrive in the order they were sent.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int) override {
    return pointToPoint(tensors, dstRank, true);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int) override {
    return pointToPoint(tensors, srcRank, false);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return enqueue({}, c10d::OpType::BARRIER,
                   [](chorusComm_t c) { check(c, chorusBarrier(c, nullptr), "barrier"); });
  }

 private:
  static void check(chorusComm_t comm, chorusResult_t r, const char* what) {
    TORCH_CHECK(r == chorusSuccess, "chorus ", what, " failed (", chorusGetErrorString(r),
                "): ", chorusGetLastError(comm));
  }

  // Queued sends and receives go first, so calls run in the order they were made.
  c10::intrusive_ptr<c10d::Work> enqueue(std::vector<at::Tensor> outputs, c10d::OpType type,
                                         std::function<void(chorusComm_t)> body) {
    auto work = c10::make_intrusive<AsyncWork>(std::move(outputs), type);
    p2p_->flush();
    worker_->submit([work, body = std::move(body), comm = comm_] {
      std::exception_ptr error;
      try {
        body(comm);
      } catch (...) {
        error = std::current_exception();
      }
      work->complete(error);
    });
    return work;
  }

  c10::intrusive_ptr<c10d::Work> pointToPoint(std::vector<at::Tensor>& tensors, int peer, bool isSend) {
    const char* call = isSend ? "send" : "recv";
    const at::Tensor t = single(tensors, call);
    TORCH_CHECK(peer >= 0 && peer < getSize() && peer != getRank(), "chorus ", call, ": peer ", peer,
                " is not another rank of this group of ", getSize());
    auto work = c10::make_intrusive<P2pWork>(p2p_, tensors, isSend ? c10d::OpType::SEND : c10d::OpType::RECV);
    p2p_->add(isSend, t, peer, dtypeOf(t, call), work);
    return work;
  }

  chorusComm_t comm_ = nullptr;
  std::unique_ptr<Worker> worker_;
  std::shared_ptr<P2pQueue> p2p_;
};

}  // namespace chorus_torch

PYBIND11_MODULE(_C, m) {
  m.doc() = "Chorus's torch.distributed backend (import chorus_torch, then init_process_group('chorus'))";
  py::module::import("torch.distributed");  // registers c10d.ProcessGroup, our base class
  m.def("unique_id", [] {
    chorusUniqueId id;
    const chorusResult_t r = chorusGetUniqueId(&id);
    TORCH_CHECK(r == chorusSuccess, "chorus: making a unique id failed: ", chorusGetLastError(nullptr));
    return py::bytes(id.internal, sizeof id.internal);
  });
  m.def("version", [] {
    int v = 0;
    chorusGetVersion(&v);
    return v;
  });
  py::class_<chorus_torch::ProcessGroupChorus, c10d::ProcessGroup,
             c10::intrusive_ptr<chorus_torch::ProcessGroupChorus>>(m, "ProcessGroupChorus")
      .def(py::init<const py::bytes&, int, int, double>(), py::arg("unique_id"), py::arg("rank"),
           py::arg("size"), py::arg("timeout_seconds"));
}
