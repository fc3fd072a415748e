// The chorus backend's point-to-point engine (p2p.hpp says how tags are matched): it runs a batch
// of queued sends and receives as Chorus groups on the worker, moving each message to the receive
// its tag names; and the queue that hands batches to the worker.
#include "p2p.hpp"

#include <deque>
#include <exception>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "tensors.hpp"

namespace chorus_torch::detail {

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

P2pQueue::P2pQueue(chorusComm_t comm, Worker* worker)
    : comm_(comm), worker_(worker), engine_(std::make_shared<P2pEngine>()) {}

void P2pQueue::add(P2pOp op) {
  std::lock_guard<std::mutex> lk(mu_);
  ops_.push_back(std::move(op));
}

void P2pQueue::flush() {
  std::lock_guard<std::mutex> lk(mu_);
  if (ops_.empty() || worker_ == nullptr) return;
  auto batch = std::make_shared<std::vector<P2pOp>>();
  batch->swap(ops_);
  worker_->submit([comm = comm_, batch, engine = engine_] { engine->run(comm, *batch); });
}

void P2pQueue::detach() {
  std::lock_guard<std::mutex> lk(mu_);
  worker_ = nullptr;
}

}  // namespace chorus_torch::detail
