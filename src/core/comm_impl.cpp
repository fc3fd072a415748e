#include "core/comm_impl.hpp"

#include <poll.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "algorithms/cost_model.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "core/validate.hpp"
#include "transports/peer_set.hpp"
#include "tuning/tuning.hpp"

namespace chorus {

namespace {

constexpr uint16_t kPointToPointTag = 0xFFFF;

}  // namespace

void CommImpl::validate(const Op& op) const { validateOp(op, rank_, size_); }

// ---- Submission (ordering: core/op_queue.hpp)
// --------------------------------------------------------------------

std::shared_ptr<WorkState> CommImpl::submit(std::vector<Op> ops, bool async) {
  return submit(std::move(ops), async, Hooks{});
}

std::shared_ptr<WorkState> CommImpl::submit(std::vector<Op> ops, bool async, Hooks hooks) {
  auto task = std::make_shared<Task>();
  task->ops = std::move(ops);
  task->hooks = std::move(hooks);
  task->work = std::make_shared<WorkState>();
  if (async) {
    opQueue_.post([this, task] { runTask(*task); });
  } else {
    opQueue_.runInTurn([&] { runTask(*task); });
  }
  return task->work;
}

void CommImpl::runInTurn(const Op& op) {
  std::pair<chorusResult_t, std::string> outcome;
  opQueue_.runInTurn([&] { outcome = runOps(std::span<const Op>(&op, 1)); });
  if (outcome.first != chorusSuccess) throw Error(outcome.first, outcome.second);
}

void CommImpl::runTask(Task& task) {
  chorusResult_t code = chorusSuccess;
  std::string message;
  try {
    // A broken communicator fails the operations at once, without waiting for their input.
    if (task.hooks.before && failCode_.load() == chorusSuccess) task.hooks.before();
  } catch (const Error& e) {
    code = e.code();
    message = e.what();
  } catch (const std::exception& e) {
    code = chorusInternalError;
    message =
        strCat("rank ", rank_, ": internal error before ", opKindName(task.ops.front().kind), ": ", e.what());
  }
  if (code == chorusSuccess)
    std::tie(code, message) = runOps(task.ops);
  else
    markFailed(code, message);  // the peers are in this operation: the communicator cannot go on
  if (task.hooks.after) task.hooks.after(code);
  task.work->complete(code, std::move(message));
}

std::pair<chorusResult_t, std::string> CommImpl::runOps(std::span<const Op> ops) {
  if (int code = failCode_.load(); code != chorusSuccess) {
    std::lock_guard lk(errMu_);
    return {static_cast<chorusResult_t>(code), strCat("communicator is broken: ", failMessage_)};
  }
  try {
    executeGroup(ops);
    curOp_ = nullptr;
    groupTransfers_ = 0;
    return {chorusSuccess, {}};
  } catch (const Error& e) {
    return failOperation(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return failOperation(chorusSystemError, strCat("rank ", rank_, ": out of memory during ", runningWhat()));
  } catch (const std::exception& e) {
    return failOperation(chorusInternalError,
                         strCat("rank ", rank_, ": internal error during ", runningWhat(), ": ", e.what()));
  }
}

std::pair<chorusResult_t, std::string> CommImpl::failOperation(chorusResult_t code, std::string message) {
  flight_.end(code);
  // Once: a peer's timeout reported here already says where each rank is.
  constexpr std::string_view kWhere = "; where each rank is: ";
  if (code == chorusTimeout && shmSync_ && message.find(kWhere) == std::string::npos)
    message += strCat(kWhere, shmSync_->progressReport());
  markFailed(code, message);
  if (const std::string& path = envConfig().flightRecorderPath; !path.empty()) {
    // One file per rank and communicator: <path>.<comm id>.<rank>.
    std::string header = strCat("# chorus flight recorder: rank ", rank_, " of ", size_, ", pid ", getpid(),
                                ", communicator ", commId_, "\n# failed: ", message, "\n");
    if (shmSync_) header += strCat("# where each rank is: ", shmSync_->progressReport(), "\n");
    message += flight_.writeFile(strCat(path, ".", commId_, ".", rank_), header);
    std::lock_guard lk(errMu_);
    lastError_ = message;
  }
  return {code, std::move(message)};
}

void CommImpl::markFailed(chorusResult_t code, const std::string& message) {
  {
    std::lock_guard lk(errMu_);
    if (failCode_.load() == chorusSuccess) {
      failMessage_ = message;
      failCode_.store(code);
    }
    lastError_ = message;
  }
  if (peers_) peers_->publishFailure(code, message);
  // Device kernels waiting for peers of a broken communicator stop too.
  std::lock_guard lk(hookMu_);
  if (abortHook_) abortHook_();
}

void CommImpl::setAbortHook(std::function<void()> hook) {
  std::lock_guard lk(hookMu_);
  abortHook_ = std::move(hook);
}

void CommImpl::abort() {
  abortRequested_.store(true);
  markFailed(chorusRemoteError, strCat("rank ", rank_, " aborted the communicator"));
}

void CommImpl::checkUsable() const {
  if (int code = failCode_.load(); code != chorusSuccess) {
    std::lock_guard lk(errMu_);
    fail(static_cast<chorusResult_t>(code), strCat("communicator is broken: ", failMessage_));
  }
}

std::string CommImpl::lastError() const {
  std::lock_guard lk(errMu_);
  return lastError_;
}

void CommImpl::setLastError(const std::string& message) {
  std::lock_guard lk(errMu_);
  lastError_ = message;
}

// ---- Execution ------------------------------------------------------------------------------------

std::string CommImpl::callWhat(const Op& op, uint64_t seq, const char* algorithm) {
  std::string size = strCat(op.count, " x ", dataTypeName(op.type));
  if (op.kind == OpKind::AllToAllv) {  // its count is 0: the counts are per peer
    size_t sent = 0, received = 0;
    for (size_t c : op.sendCounts()) sent += c;
    for (size_t c : op.recvCounts()) received += c;
    size = strCat(sent, " x ", dataTypeName(op.type), " sent, ", received, " received");
  }
  return strCat(opKindName(op.kind), " #", seq, " (", size,
                algorithm ? strCat(", ", algorithm) : std::string(), ")");
}

std::string CommImpl::runningWhat() const {
  if (curOp_) return callWhat(*curOp_, collSeq_, curAlgo_);
  if (groupTransfers_) return strCat("group of ", groupTransfers_, " sends/receives");
  return "operation";
}

void CommImpl::executeGroup(std::span<const Op> ops) {
  // The coarse clock where no flight recorder file will show the time: the deadline then adds two
  // ticks, so that a call does not time out early (on a 250 Hz kernel, up to 8 ms late).
  opStart_ = flight_.now();
  // Each call carries the timeout in force when it was issued; a group waits by its shortest.
  opTimeout_ = config_.timeout;
  bool perCall = false;
  for (const Op& op : ops) {
    if (op.timeout.count() > 0 && (!perCall || op.timeout < opTimeout_)) {
      opTimeout_ = op.timeout;
      perCall = true;
    }
  }
  opDeadline_ =
      opStart_ + opTimeout_ + (flight_.precise() ? engine::Clock::duration{} : 2 * engine::coarseTick());
  {
    // A peer that already failed (or aborted) fails this call too, even where the algorithm would
    // find every message it needs already published (low-latency exchanges wait for nothing else).
    std::string text;
    chorusResult_t code = chorusRemoteError;
    if (int peer = findPeerFailure(&code, &text); peer >= 0) {
      // Numbered as the peers number it: this call has not counted itself yet.
      const Op* first = ops.empty() ? nullptr : &ops.front();
      const std::string what =
          first && !first->isPointToPoint() ? callWhat(*first, collSeq_ + 1, nullptr) : runningWhat();
      curOp_ = first;
      fail(code == chorusTimeout ? chorusTimeout : chorusRemoteError,
           strCat("rank ", rank_, ": ", what, " stopped: rank ", peer, " failed: ", text));
    }
  }
  std::vector<engine::Transfer> p2p;
  for (const Op& op : ops) {
    if (op.isPointToPoint()) {
      size_t bytes = op.messageBytes();
      size_t elem = dataTypeSize(op.type);
      p2p.push_back(op.kind == OpKind::Send
                        ? engine::Transfer::send(op.peer, op.send, bytes, elem, kPointToPointTag)
                        : engine::Transfer::recv(op.peer, op.recv, bytes, elem, kPointToPointTag));
    } else {
      executeCollective(op);
    }
  }
  if (!p2p.empty()) {
    curOp_ = nullptr;
    if (shmSync_) shmSync_->clearCall();
    groupTransfers_ = p2p.size();
    tag_ = kPointToPointTag;
    if (FlightEntry* e = flight_.begin(opStart_)) {
      e->kind = OpKind::Send;
      e->count = p2p.size();
    }
    run(p2p);
    flight_.end(chorusSuccess);
  }
}

void CommImpl::executeLocally(const Op& op) {
  // One rank: every collective is a copy (Avg divides by 1).
  size_t bytes = op.messageBytes();
  switch (op.kind) {
    case OpKind::AllToAllv:
      if (op.sendCounts()[0]) {
        size_t elem = dataTypeSize(op.type);
        std::memmove(static_cast<std::byte*>(op.recv) + op.recvDispls()[0] * elem,
                     static_cast<const std::byte*>(op.send) + op.sendDispls()[0] * elem,
                     op.sendCounts()[0] * elem);
      }
      return;
    case OpKind::Barrier:
      return;
    default:
      if (bytes && op.send != op.recv && op.recv) std::memmove(op.recv, op.send, bytes);
  }
}

void CommImpl::executeCollective(const Op& op) {
  ++collSeq_;
  // What this call is travels with it: its hash is every message's tag (the pipes compare it, on
  // shared memory and over the network), and on shared memory the call itself is published for
  // the first synchronisation to compare (verifyPeerCalls).
  call_ = engine::fingerprintOf(op, collSeq_);
  callHash_ = engine::callHash(call_);
  tag_ = engine::callTag(callHash_);
  if (size_ == 1) {
    curOp_ = &op;
    curAlgo_ = nullptr;
    executeLocally(op);
    return;
  }
  if (op.kind == OpKind::AllToAllv && op.sendCounts().size() != static_cast<size_t>(size_)) {
    fail(chorusInternalError, "alltoallv without counts reached the engine");
  }
  const algo::Algorithm* algorithm = &selector_.choose(op, sharedMemory() != nullptr, model_.get());
  curOp_ = &op;
  curAlgo_ = algorithm->name;
  if (FlightEntry* e = flight_.begin(opStart_)) {
    // Field by field: a whole-struct assignment went through a stack temporary whose narrow stores
    // the wide reloads could not forward from (two stalls a call on the latency path).
    e->seq = collSeq_;
    e->kind = op.kind;
    e->count = op.count;
    e->type = op.type;
    e->op = op.op;
    e->root = op.root;
    e->algorithm = algorithm->name;
  }
  if (shmSync_) {
    shmSync_->beginCall(call_, callHash_, tag_, op.kind);
    if (config_.checkCalls) shmSync_->checkCallsMatch();
  }
  algorithm->run(*this, op);
  flight_.end(chorusSuccess);
  if (shmSync_) shmSync_->endCall(op.kind);
}

// ---- Context for algorithms ---------------------------------------------------------------------

engine::Waiter CommImpl::makeWaiter() { return engine::Waiter(*this, opDeadline_, opTimeout_, waitPolicy_); }

void CommImpl::run(std::span<engine::Transfer> transfers) {
  engine::Waiter waiter = makeWaiter();
  try {
    engine::runTransfers(transfers, *this, rank_, waiter, [this] { return runningWhat(); });
  } catch (const transport::PeerError& e) {
    // The transport names the peer; the operation is named here.
    fail(e.code(), strCat("rank ", rank_, ": ", runningWhat(), " stopped: ", e.what()));
  } catch (const Error& e) {
    // A message of another call (its tag or length differ): on shared memory, the sender's
    // published call names what it called.
    if (e.code() == chorusInvalidUsage && shmSync_) shmSync_->verifyPeerCalls("", false);
    throw;
  }
}

std::byte* CommImpl::scratch(size_t bytes, int slot) {
  Scratch& s = scratch_[slot & 1];
  if (s.bytes < bytes) {
    size_t want = alignUp(std::max(bytes, s.bytes * 2), 4096);
    auto* p = static_cast<std::byte*>(std::aligned_alloc(64, want));
    if (!p)
      fail(chorusSystemError, strCat("rank ", rank_, ": cannot allocate ", formatBytes(want), " of scratch"));
    std::free(s.ptr);
    scratchBytes_ += want - s.bytes;
    s.ptr = p;
    s.bytes = want;
  }
  return s.ptr;
}

transport::SendPipe& CommImpl::sendPipe(int peer) { return peers_->sendPipe(peer); }
transport::RecvPipe& CommImpl::recvPipe(int peer) { return peers_->recvPipe(peer); }

size_t CommImpl::memoryBytes() const { return (peers_ ? peers_->memoryBytes() : 0) + scratchBytes_.load(); }

int CommImpl::findPeerFailure(chorusResult_t* code, std::string* text) {
  return peers_ ? peers_->findPeerFailure(code, text) : -1;
}

void CommImpl::waitIdle(std::chrono::microseconds duration) {
  if (!peers_ || !peers_->waitReadable(duration)) engine::Health::waitIdle(duration);
}

// ---- Health --------------------------------------------------------------------------------------

void CommImpl::checkHealth(engine::FunctionRef<bool(int)> waitingOn) {
  if (abortRequested_.load()) {
    fail(chorusRemoteError,
         strCat("rank ", rank_, ": ", runningWhat(), " stopped: the communicator was aborted"));
  }
  {
    std::string text;
    chorusResult_t code = chorusRemoteError;
    int peer = findPeerFailure(&code, &text);
    if (peer >= 0) {
      // A peer's timeout is this rank's timeout too (same missing ranks); anything else is remote.
      fail(code == chorusTimeout ? chorusTimeout : chorusRemoteError,
           strCat("rank ", rank_, ": ", runningWhat(), " stopped: rank ", peer, " failed: ", text));
    }
  }
  for (size_t r = 0; r < peerPidfds_.size(); ++r) {
    int fd = peerPidfds_[r];
    if (fd < 0 || !waitingOn(static_cast<int>(r))) continue;
    struct pollfd p {
      fd, POLLIN, 0
    };
    if (poll(&p, 1, 0) > 0) {
      fail(chorusRemoteError, strCat("rank ", rank_, ": ", runningWhat(), " stopped: rank ", r, " (",
                                     hosts_[r].describe(), ") died"));
    }
  }
}

}  // namespace chorus
