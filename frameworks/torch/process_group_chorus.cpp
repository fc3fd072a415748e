// torch.distributed backend "chorus": a c10d::ProcessGroup (PyTorch 1.13) whose collectives run
// through Chorus's C API on CPU tensors. The only translation unit that includes torch.
//
// The Python package (chorus_torch/__init__.py) registers the backend and bootstraps each group:
// the group's rank 0 makes a Chorus unique id and passes it through the c10d store; from then on
// data moves only through Chorus. Calls run to completion before they return, so every Work is
// complete, and its future (which DistributedDataParallel chains on) is already marked.
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

// A finished operation. Its future holds the output tensors, as ProcessGroupGloo's does.
class WorkChorus : public c10d::Work {
 public:
  WorkChorus(std::vector<at::Tensor> outputs, c10d::OpType type)
      : c10d::Work(-1, type), outputs_(std::move(outputs)) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future_->markCompleted(c10::IValue(outputs_));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
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

// Point-to-point calls wait in this queue and run together, as one Chorus group, when one of their
// Works is waited for or before the next collective. So irecv-then-isend on two ranks, or a
// batch_isend_irecv list, progress together instead of each blocking the other.
class P2pQueue {
 public:
  struct Status {
    bool done = false;
    std::string error;
  };
  explicit P2pQueue(chorusComm_t comm) : comm_(comm) {}

  std::shared_ptr<Status> add(bool isSend, at::Tensor t, int peer, chorusDataType_t type) {
    std::lock_guard<std::mutex> lk(mu_);
    auto status = std::make_shared<Status>();
    ops_.push_back(Op{isSend, std::move(t), peer, type, status});
    return status;
  }

  // Runs every queued call; each one's status records the group's outcome.
  void flush() {
    std::lock_guard<std::mutex> lk(mu_);
    if (ops_.empty()) return;
    std::vector<Op> ops;
    ops.swap(ops_);
    std::string error;
    chorusResult_t r = chorusGroupStart();
    if (r == chorusSuccess) {
      for (Op& op : ops) {
        const chorusResult_t e =
            op.isSend ? chorusSend(op.tensor.data_ptr(), op.tensor.numel(), op.type, op.peer, comm_, nullptr)
                      : chorusRecv(op.tensor.data_ptr(), op.tensor.numel(), op.type, op.peer, comm_, nullptr);
        if (e != chorusSuccess && r == chorusSuccess) r = e;
      }
      const chorusResult_t end = chorusGroupEnd();
      if (r == chorusSuccess) r = end;
    }
    if (r != chorusSuccess)
      error = std::string("chorus send/recv failed (") + chorusGetErrorString(r) +
              "): " + chorusGetLastError(comm_);
    for (Op& op : ops) {
      op.status->done = true;
      op.status->error = error;
    }
  }

 private:
  struct Op {
    bool isSend;
    at::Tensor tensor;
    int peer;
    chorusDataType_t type;
    std::shared_ptr<Status> status;
  };
  std::mutex mu_;
  std::vector<Op> ops_;
  chorusComm_t comm_;
};

class WorkP2p : public c10d::Work {
 public:
  WorkP2p(std::shared_ptr<P2pQueue> queue, std::shared_ptr<P2pQueue::Status> status,
          std::vector<at::Tensor> tensors, c10d::OpType type)
      : c10d::Work(-1, type),
        queue_(std::move(queue)),
        status_(std::move(status)),
        tensors_(std::move(tensors)) {}
  bool isCompleted() override { return status_->done; }
  bool isSuccess() const override { return status_->done && status_->error.empty(); }
  bool wait(std::chrono::milliseconds) override {
    run();
    return true;
  }
  std::vector<at::Tensor> result() override { return tensors_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    run();
    auto f = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    f->markCompleted(c10::IValue(tensors_));
    return f;
  }

 private:
  void run() {
    if (!status_->done) queue_->flush();
    TORCH_CHECK(status_->error.empty(), status_->error);
  }
  std::shared_ptr<P2pQueue> queue_;
  std::shared_ptr<P2pQueue::Status> status_;
  std::vector<at::Tensor> tensors_;
};

void checkLike(const at::Tensor& t, const at::Tensor& like, const char* call) {
  checkTensor(t, call);
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.numel() == like.numel(), "chorus ", call,
              ": every tensor must have the input's type (", like.scalar_type(), ") and size (", like.numel(),
              " elements), not ", t.scalar_type(), " and ", t.numel());
}

c10::intrusive_ptr<c10d::Work> done(std::vector<at::Tensor> outputs, c10d::OpType type) {
  return c10::make_intrusive<WorkChorus>(std::move(outputs), type);
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
      check(chorusCommInitRank(&comm_, size, uid, rank), "init");
    }
    p2p_ = std::make_shared<P2pQueue>(comm_);
    if (timeoutSeconds > 0) {
      const chorusResult_t r = chorusCommSetTimeout(comm_, timeoutSeconds);
      if (r != chorusSuccess) {
        const std::string why = chorusGetLastError(comm_);
        chorusCommDestroy(comm_);
        comm_ = nullptr;
        TORCH_CHECK(false, "chorus: setting the timeout to ", timeoutSeconds, " s failed: ", why);
      }
    }
  }
  ~ProcessGroupChorus() override {
    if (p2p_) p2p_->flush();  // sends and receives nobody waited for still happen, as in NCCL
    if (comm_) chorusCommDestroy(comm_);
  }

  const std::string getBackendName() const override { return "chorus"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    flushP2p();
    const at::Tensor& t = single(tensors, "broadcast");
    check(chorusBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), dtypeOf(t, "broadcast"),
                          static_cast<int>(opts.rootRank), comm_, nullptr),
          "broadcast");
    return done(tensors, c10d::OpType::BROADCAST);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    flushP2p();
    const at::Tensor& t = single(tensors, "allreduce");
    check(chorusAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), dtypeOf(t, "allreduce"),
                          opOf(opts.reduceOp, "allreduce"), comm_, nullptr),
          "allreduce");
    return done(tensors, c10d::OpType::ALLREDUCE);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    flushP2p();
    TORCH_CHECK(!tensors.empty(), "chorus allreduce_coalesced: no tensors");
    for (const auto& t : tensors) {
      checkTensor(t, "allreduce_coalesced");
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "chorus allreduce_coalesced: mixed types");
    }
    at::Tensor flat = flatCat(tensors);
    check(
        chorusAllReduce(flat.data_ptr(), flat.data_ptr(), flat.numel(), dtypeOf(flat, "allreduce_coalesced"),
                        opOf(opts.reduceOp, "allreduce_coalesced"), comm_, nullptr),
        "allreduce_coalesced");
    int64_t offset = 0;
    for (auto& t : tensors) {
      t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
    return done(tensors, c10d::OpType::ALLREDUCE_COALESCED);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    flushP2p();
    const at::Tensor& t = single(tensors, "reduce");
    check(chorusReduce(t.data_ptr(), t.data_ptr(), t.numel(), dtypeOf(t, "reduce"),
                       opOf(opts.reduceOp, "reduce"), static_cast<int>(opts.rootRank), comm_, nullptr),
          "reduce");
    return done(tensors, c10d::OpType::REDUCE);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    flushP2p();
    const at::Tensor& in = single(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "chorus allgather: one list of ", getSize(), " output tensors expected");
    for (const auto& o : outputs[0])
      TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                  "chorus allgather: every output must match the input's size and type");
    at::Tensor flat = at::empty({in.numel() * getSize()}, in.options());
    check(
        chorusAllGather(in.data_ptr(), flat.data_ptr(), in.numel(), dtypeOf(in, "allgather"), comm_, nullptr),
        "allgather");
    for (int r = 0; r < getSize(); ++r)
      outputs[0][r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view_as(in));
    return done(outputs[0], c10d::OpType::ALLGATHER);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    flushP2p();
    checkTensor(input, "all_gather_into_tensor");
    checkTensor(output, "all_gather_into_tensor");
    TORCH_CHECK(output.numel() == input.numel() * getSize() && output.scalar_type() == input.scalar_type(),
                "chorus all_gather_into_tensor: the output must hold world_size inputs of the same type");
    check(chorusAllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                          dtypeOf(input, "all_gather_into_tensor"), comm_, nullptr),
          "all_gather_into_tensor");
    return done({output}, c10d::OpType::_ALLGATHER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    flushP2p();
    const at::Tensor& out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "chorus reduce_scatter: one list of ", getSize(), " input tensors expected");
    for (const auto& i : inputs[0])
      TORCH_CHECK(i.numel() == out.numel() && i.scalar_type() == out.scalar_type(),
                  "chorus reduce_scatter: every input must match the output's size and type");
    at::Tensor flat = flatCat(inputs[0]);
    check(chorusReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(), dtypeOf(out, "reduce_scatter"),
                              opOf(opts.reduceOp, "reduce_scatter"), comm_, nullptr),
          "reduce_scatter");
    return done(outputs, c10d::OpType::REDUCE_SCATTER);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    flushP2p();
    checkTensor(input, "reduce_scatter_tensor");
    checkTensor(output, "reduce_scatter_tensor");
    TORCH_CHECK(input.numel() == output.numel() * getSize() && output.scalar_type() == input.scalar_type(),
                "chorus reduce_scatter_tensor: the input must hold world_size outputs of the same type");
    check(chorusReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                              dtypeOf(output, "reduce_scatter_tensor"),
                              opOf(opts.reduceOp, "reduce_scatter_tensor"), comm_, nullptr),
          "reduce_scatter_tensor");
    return done({output}, c10d::OpType::_REDUCE_SCATTER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outSplits,
                                               std::vector<int64_t>& inSplits,
                                               const c10d::AllToAllOptions&) override {
    flushP2p();
    checkTensor(input, "all_to_all_single");
    checkTensor(output, "all_to_all_single");
    const int n = getSize();
    TORCH_CHECK(input.scalar_type() == output.scalar_type(),
                "chorus all_to_all_single: input and output types differ");
    if (outSplits.empty() && inSplits.empty()) {
      const int64_t rows = input.dim() > 0 ? input.size(0) : 0;
      TORCH_CHECK(
          input.numel() == output.numel() && rows % n == 0,
          "chorus all_to_all_single: equal splits need input and output of the same size, with a first "
          "dimension divisible by ",
          n);
      check(chorusAllToAll(input.data_ptr(), output.data_ptr(), input.numel() / n,
                           dtypeOf(input, "all_to_all_single"), comm_, nullptr),
            "all_to_all_single");
      return done({output}, c10d::OpType::ALLTOALL_BASE);
    }
    // Splits count rows (the first dimension); they must be non-negative and add up to it.
    auto counts = [&](const std::vector<int64_t>& splits, const at::Tensor& t, std::vector<size_t>& c,
                      std::vector<size_t>& d, const char* which) {
      TORCH_CHECK(t.dim() > 0, "chorus all_to_all_single: uneven splits need a tensor with dimensions");
      const int64_t rows = t.size(0);
      const int64_t perRow = rows > 0 ? t.numel() / rows : 0;
      TORCH_CHECK(!splits.empty() || rows % n == 0, "chorus all_to_all_single: ", which, " has ", rows,
                  " rows, not divisible by ", n);
      int64_t total = 0;
      for (int r = 0; r < n; ++r) {
        const int64_t s = splits.empty() ? rows / n : splits[r];
        TORCH_CHECK(s >= 0, "chorus all_to_all_single: negative split size");
        d.push_back(static_cast<size_t>(total * perRow));
        c.push_back(static_cast<size_t>(s * perRow));
        total += s;
      }
      TORCH_CHECK(total == rows, "chorus all_to_all_single: ", which, " splits add up to ", total,
                  " rows, not ", rows);
    };
    TORCH_CHECK((outSplits.empty() || static_cast<int>(outSplits.size()) == n) &&
                    (inSplits.empty() || static_cast<int>(inSplits.size()) == n),
                "chorus all_to_all_single: split sizes must have ", n, " entries");
    std::vector<size_t> sc, sd, rc, rd;
    counts(inSplits, input, sc, sd, "the input");
    counts(outSplits, output, rc, rd, "the output");
    check(chorusAllToAllv(input.data_ptr(), sc.data(), sd.data(), output.data_ptr(), rc.data(), rd.data(),
                          dtypeOf(input, "all_to_all_single"), comm_, nullptr),
          "all_to_all_single");
    return done({output}, c10d::OpType::ALLTOALL_BASE);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    flushP2p();
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
    at::Tensor in = flatCat(inputs);
    at::Tensor out = at::empty({static_cast<int64_t>(rd.back() + rc.back())}, outputs[0].options());
    check(chorusAllToAllv(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(), rd.data(),
                          dtypeOf(in, "all_to_all"), comm_, nullptr),
          "all_to_all");
    for (int r = 0; r < n; ++r) outputs[r].copy_(out.narrow(0, rd[r], rc[r]).view_as(outputs[r]));
    return done(outputs, c10d::OpType::ALLTOALL);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    flushP2p();
    const at::Tensor& in = single(inputs, "gather");
    const int root = static_cast<int>(opts.rootRank);
    const bool isRoot = getRank() == root;
    if (isRoot)
      TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                  "chorus gather: the root needs one list of ", getSize(), " output tensors");
    const chorusDataType_t dt = dtypeOf(in, "gather");
    if (isRoot)
      for (const auto& o : outputs[0]) checkLike(o, in, "gather");
    chorusResult_t first = chorusSuccess;
    GroupGuard group;
    check(group.startResult(), "gather");
    if (isRoot) {
      for (int r = 0; r < getSize(); ++r) {
        at::Tensor& o = outputs[0][r];
        if (r == root) {
          o.copy_(in.view_as(o));
        } else if (first == chorusSuccess) {
          first = chorusRecv(o.data_ptr(), o.numel(), dt, r, comm_, nullptr);
        }
      }
    } else {
      first = chorusSend(in.data_ptr(), in.numel(), dt, root, comm_, nullptr);
    }
    const chorusResult_t end = group.end();
    check(first, "gather");
    check(end, "gather");
    return done(isRoot ? outputs[0] : inputs, c10d::OpType::GATHER);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    flushP2p();
    const at::Tensor& out = single(outputs, "scatter");
    const int root = static_cast<int>(opts.rootRank);
    const bool isRoot = getRank() == root;
    if (isRoot)
      TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                  "chorus scatter: the root needs one list of ", getSize(), " input tensors");
    const chorusDataType_t dt = dtypeOf(out, "scatter");
    if (isRoot)
      for (const auto& i : inputs[0]) checkLike(i, out, "scatter");
    chorusResult_t first = chorusSuccess;
    GroupGuard group;
    check(group.startResult(), "scatter");
    if (isRoot) {
      for (int r = 0; r < getSize(); ++r) {
        const at::Tensor& i = inputs[0][r];
        if (r == root) {
          out.copy_(i.view_as(out));
        } else if (first == chorusSuccess) {
          first = chorusSend(i.data_ptr(), i.numel(), dt, r, comm_, nullptr);
        }
      }
    } else {
      first = chorusRecv(out.data_ptr(), out.numel(), dt, root, comm_, nullptr);
    }
    const chorusResult_t end = group.end();
    check(first, "scatter");
    check(end, "scatter");
    return done(outputs, c10d::OpType::SCATTER);
  }

  // Queued until a Work is waited for or a collective comes (see P2pQueue). Tags are not matched:
  // messages between two ranks arrive in the order they were sent.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int) override {
    const at::Tensor& t = single(tensors, "send");
    checkPeer(dstRank, "send");
    auto status = p2p_->add(true, t, dstRank, dtypeOf(t, "send"));
    return c10::make_intrusive<WorkP2p>(p2p_, std::move(status), tensors, c10d::OpType::SEND);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int) override {
    const at::Tensor& t = single(tensors, "recv");
    checkPeer(srcRank, "recv");
    auto status = p2p_->add(false, t, srcRank, dtypeOf(t, "recv"));
    return c10::make_intrusive<WorkP2p>(p2p_, std::move(status), tensors, c10d::OpType::RECV);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    flushP2p();
    check(chorusBarrier(comm_, nullptr), "barrier");
    return done({}, c10d::OpType::BARRIER);
  }

 private:
  void checkPeer(int peer, const char* call) const {
    TORCH_CHECK(peer >= 0 && peer < getSize() && peer != getRank(), "chorus ", call, ": peer ", peer,
                " is not another rank of this group of ", getSize());
  }
  // Queued sends and receives go first: calls run in the order they were made.
  void flushP2p() { p2p_->flush(); }

  void check(chorusResult_t r, const char* what) const {
    TORCH_CHECK(r == chorusSuccess, "chorus ", what, " failed (", chorusGetErrorString(r),
                "): ", chorusGetLastError(comm_));
  }

  chorusComm_t comm_ = nullptr;
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
