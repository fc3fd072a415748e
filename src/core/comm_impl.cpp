#include "core/comm_impl.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "algorithms/cost_model.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "base/tsan_sync.hpp"
#include "core/validate.hpp"
#include "transports/peer_set.hpp"
#include "transports/shm/shm_group.hpp"
#include "tuning/tuning.hpp"

namespace chorus {

namespace {

constexpr uint16_t kPointToPointTag = 0xFFFF;

}  // namespace

void CommImpl::validate(const Op& op) const { validateOp(op, rank_, size_); }

// ---- Submission and ordering --------------------------------------------------------------------

std::shared_ptr<WorkState> CommImpl::submit(std::vector<Op> ops, bool async) {
  return submit(std::move(ops), async, Hooks{});
}

std::shared_ptr<WorkState> CommImpl::submit(std::vector<Op> ops, bool async, Hooks hooks) {
  Task task;
  task.ops = std::move(ops);
  task.hooks = std::move(hooks);
  task.work = std::make_shared<WorkState>();
  std::unique_lock lk(qmu_);
  task.ticket = nextTicket_++;
  if (async) {
    if (!worker_.joinable()) worker_ = std::thread([this] { workerLoop(); });
    auto work = task.work;
    queue_.push_back(std::move(task));
    qcv_.notify_all();
    return work;
  }
  qcv_.wait(lk, [&] { return serving_ == task.ticket; });
  lk.unlock();
  runTask(task);
  lk.lock();
  ++serving_;
  qcv_.notify_all();
  return task.work;
}

void CommImpl::workerLoop() {
  std::unique_lock lk(qmu_);
  for (;;) {
    qcv_.wait(lk, [&] { return stopWorker_ || (!queue_.empty() && serving_ == queue_.front().ticket); });
    if (queue_.empty()) return;  // stopping, nothing left
    Task task = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    runTask(task);
    lk.lock();
    ++serving_;
    qcv_.notify_all();
  }
}

void CommImpl::runBlocking(const Op& op) {
  std::unique_lock lk(qmu_);
  const uint64_t ticket = nextTicket_++;
  if (serving_ != ticket) qcv_.wait(lk, [&] { return serving_ == ticket; });
  lk.unlock();
  auto [code, message] = runOps(std::span<const Op>(&op, 1));
  lk.lock();
  ++serving_;
  qcv_.notify_all();
  lk.unlock();
  if (code != chorusSuccess) throw Error(code, message);
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
    curP2p_ = 0;
    return {chorusSuccess, {}};
  } catch (const Error& e) {
    return failOperation(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return failOperation(chorusSystemError, strCat("rank ", rank_, ": out of memory during ", opWhat()));
  } catch (const std::exception& e) {
    return failOperation(chorusInternalError,
                         strCat("rank ", rank_, ": internal error during ", opWhat(), ": ", e.what()));
  }
}

std::pair<chorusResult_t, std::string> CommImpl::failOperation(chorusResult_t code, std::string message) {
  flight_.end(code);
  // Once: a peer's timeout reported here already says where each rank is.
  constexpr std::string_view kWhere = "; where each rank is: ";
  if (code == chorusTimeout && shm_ && message.find(kWhere) == std::string::npos)
    message += strCat(kWhere, progressReport());
  markFailed(code, message);
  if (const std::string& path = envConfig().flightRecorderPath; !path.empty()) {
    // One file per rank and communicator: <path>.<comm id>.<rank>.
    std::string file = strCat(path, ".", commId_, ".", rank_);
    if (FILE* f = std::fopen(file.c_str(), "w")) {
      std::fprintf(f, "# chorus flight recorder: rank %d of %d, pid %d, communicator %s\n# failed: %s\n",
                   rank_, size_, static_cast<int>(getpid()), commId_.c_str(), message.c_str());
      if (shm_) std::fprintf(f, "# where each rank is: %s\n", progressReport().c_str());
      std::fprintf(f, "# the last %zu operations of this rank, oldest first:\n%s", flight_.size(),
                   flight_.format().c_str());
      std::fclose(f);
      message += strCat(" (flight recorder written to ", file, ")");
    } else {
      message += strCat(" (cannot write the flight recorder to ", file, ": ", std::strerror(errno), ")");
    }
    std::lock_guard lk(errMu_);
    lastError_ = message;
  }
  return {code, std::move(message)};
}

std::string CommImpl::progressReport() const {
  std::string out;
  for (int r = 0; r < size_; ++r) {
    int kind = 0;
    const uint64_t p = shm_->progress(r, &kind);
    const uint64_t seq = p >> 1;
    const char* name = opKindName(static_cast<OpKind>(kind));
    out += strCat(r ? ", " : "", "rank ", r, " ",
                  seq == 0  ? std::string("has run no collective")
                  : (p & 1) ? strCat("finished ", name, " #", seq)
                            : strCat("in ", name, " #", seq));
  }
  return out;
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
    for (size_t c : op.sendCounts) sent += c;
    for (size_t c : op.recvCounts) received += c;
    size = strCat(sent, " x ", dataTypeName(op.type), " sent, ", received, " received");
  }
  return strCat(opKindName(op.kind), " #", seq, " (", size,
                algorithm ? strCat(", ", algorithm) : std::string(), ")");
}

std::string CommImpl::opWhat() const {
  if (curOp_) return callWhat(*curOp_, collSeq_, curAlgo_);
  if (curP2p_) return strCat("group of ", curP2p_, " sends/receives");
  return "operation";
}

void CommImpl::executeGroup(std::span<const Op> ops) {
  opStart_ = engine::Clock::now();
  // Each call carries the timeout in force when it was issued; a group waits by its shortest.
  opTimeout_ = config_.timeout;
  bool perCall = false;
  for (const Op& op : ops) {
    if (op.timeout.count() > 0 && (!perCall || op.timeout < opTimeout_)) {
      opTimeout_ = op.timeout;
      perCall = true;
    }
  }
  opDeadline_ = opStart_ + opTimeout_;
  {
    // A peer that already failed (or aborted) fails this call too, even where the algorithm would
    // find every message it needs already published (low-latency exchanges wait for nothing else).
    std::string text;
    chorusResult_t code = chorusRemoteError;
    if (int peer = findPeerFailure(&code, &text); peer >= 0) {
      // Numbered as the peers number it: this call has not counted itself yet.
      const Op* first = ops.empty() ? nullptr : &ops.front();
      const std::string what =
          first && !first->isPointToPoint() ? callWhat(*first, collSeq_ + 1, nullptr) : opWhat();
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
    curP2p_ = p2p.size();
    tag_ = kPointToPointTag;
    if (FlightEntry* e = flight_.begin(opStart_)) {
      e->kind = OpKind::Send;
      e->count = p2p.size();
    }
    run(p2p);
    flight_.end(chorusSuccess);
  }
}

namespace {

// What must agree between the ranks of one collective call: kind, count, type, op, root.
transport::CallFingerprint fingerprintOf(const Op& o, uint64_t seq) {
  transport::CallFingerprint f;
  f.seq = seq;
  f.kind = static_cast<int32_t>(o.kind);
  f.count = o.kind == OpKind::AllToAllv ? 0 : o.count;  // alltoallv counts differ by design
  f.type = o.kind == OpKind::Barrier ? 0 : static_cast<int32_t>(o.type);
  f.op = isReducing(o.kind) ? static_cast<int32_t>(o.op) : 0;
  f.root = (o.kind == OpKind::Broadcast || o.kind == OpKind::Reduce) ? o.root : -1;
  return f;
}

std::string describeCall(const transport::CallFingerprint& f) {
  auto kind = static_cast<OpKind>(f.kind);
  return strCat(opKindName(kind), " #", f.seq, " (count ", f.count, ", ",
                dataTypeName(static_cast<DataType>(f.type)),
                isReducing(kind) ? strCat(", ", reduceOpName(static_cast<ReduceOp>(f.op))) : std::string(),
                f.root >= 0 ? strCat(", root ", f.root) : std::string(), ")");
}

// A 64-bit hash of the call: low-latency messages carry it whole.
uint64_t callHash(const transport::CallFingerprint& f) {
  uint64_t h = f.seq * 0x9E3779B97F4A7C15ull;
  for (uint64_t v :
       {f.count, uint64_t{static_cast<uint32_t>(f.kind)}, uint64_t{static_cast<uint32_t>(f.type)},
        uint64_t{static_cast<uint32_t>(f.op)}, uint64_t{static_cast<uint32_t>(f.root)}}) {
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h;
}

// 16 bits of it (never kPointToPointTag): every pipe message's tag, and every sync flag's.
uint16_t callTag(uint64_t hash) { return static_cast<uint16_t>((hash >> 16) % 0xFFFF); }

}  // namespace

void CommImpl::executeLocally(const Op& op) {
  // One rank: every collective is a copy (Avg divides by 1).
  size_t bytes = op.messageBytes();
  switch (op.kind) {
    case OpKind::AllToAllv:
      if (op.sendCounts[0]) {
        size_t elem = dataTypeSize(op.type);
        std::memmove(static_cast<std::byte*>(op.recv) + op.recvDispls[0] * elem,
                     static_cast<const std::byte*>(op.send) + op.sendDispls[0] * elem,
                     op.sendCounts[0] * elem);
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
  call_ = fingerprintOf(op, collSeq_);
  callHash_ = callHash(call_);
  tag_ = callTag(callHash_);
  if (size_ == 1) {
    curOp_ = &op;
    curAlgo_ = nullptr;
    executeLocally(op);
    return;
  }
  if (op.kind == OpKind::AllToAllv && op.sendCounts.size() != static_cast<size_t>(size_)) {
    fail(chorusInternalError, "alltoallv without counts reached the engine");
  }
  const algo::Algorithm* algorithm = &selector_.choose(op, shm() != nullptr, model_.get());
  curOp_ = &op;
  curAlgo_ = algorithm->name;
  if (FlightEntry* e = flight_.begin(opStart_)) {
    *e = FlightEntry{collSeq_, op.kind, op.count, op.type, op.op, op.root, algorithm->name, opStart_};
  }
  if (shm_) {
    shm_->publishFingerprint(call_);
    shm_->publishProgress(collSeq_, static_cast<int>(op.kind), false);
  }
  if (config_.checkCalls && shm_) checkCallsMatch();
  algorithm->run(*this, op);
  flight_.end(chorusSuccess);
  if (shm_) shm_->publishProgress(collSeq_, static_cast<int>(op.kind), true);
}

// Check mode: every collective synchronises first, and so compares every rank's call.
void CommImpl::checkCallsMatch() {
  syncAll();
  verifyPeerCalls(" (CHORUS_CHECK)", true);
}

// After a synchronisation with every rank in this call: each published its call before, and a
// mismatch is an error naming both. A peer's slot that holds another call means either that it ran
// two calls ahead (it can, where it waits for nobody: nothing to tell) or that it has not yet started
// this call although it synchronised with this rank (its calls differ: an error too).
void CommImpl::verifyPeerCalls(const char* how, bool allArrived) {
  std::string differ;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    transport::CallFingerprint theirs;
    if (shm_->fingerprint(r, collSeq_, &theirs)) {
      if (!(theirs == call_))
        differ += strCat(differ.empty() ? "" : "; ", "rank ", r, " called ", describeCall(theirs));
    } else if (allArrived && theirs.seq != 0 && theirs.seq < collSeq_) {
      differ += strCat(differ.empty() ? "" : "; ", "rank ", r, " was still in call #", theirs.seq + 1,
                       " or before");
    }
  }
  if (!differ.empty()) {
    fail(chorusInvalidUsage, strCat("rank ", rank_, ": collective call mismatch", how, ": this rank called ",
                                    describeCall(call_), " but ", differ));
  }
}

// ---- Context for algorithms ---------------------------------------------------------------------

engine::Waiter CommImpl::makeWaiter() { return engine::Waiter(*this, opDeadline_, opTimeout_, spinPolls_); }

void CommImpl::run(std::span<engine::Transfer> transfers) {
  engine::Waiter waiter = makeWaiter();
  try {
    engine::runTransfers(transfers, *this, rank_, waiter, [this] { return opWhat(); });
  } catch (const transport::PeerError& e) {
    // The transport names the peer; the operation is named here.
    fail(e.code(), strCat("rank ", rank_, ": ", opWhat(), " stopped: ", e.what()));
  } catch (const Error& e) {
    // A message of another call (its tag or length differ): on shared memory, the sender's
    // published call names what it called.
    if (e.code() == chorusInvalidUsage && shm_ && curOp_) verifyPeerCalls("", false);
    throw;
  }
}

void CommImpl::syncAll() {
  const uint64_t target = ++syncCounter_;
  tsanReleaseShm();
  shm_->setSyncFlag(target, tag_);
  engine::Waiter waiter = makeWaiter();
  int next = 0;    // ranks below `next` have arrived
  int other = -1;  // a rank that arrived from another call (its flag carries another tag)
  for (;;) {
    while (next < size_) {
      uint16_t tag;
      const uint64_t flag = shm_->syncFlag(next, &tag);
      if (flag < target) break;
      if (flag == target && tag != tag_) other = next;
      ++next;
    }
    if (next == size_) {
      tsanAcquireShm();
      if (other >= 0) callMismatch(other);
      return;
    }
    waiter.idle(
        [&] {
          std::string missing;
          for (int r = 0; r < size_; ++r) {
            if (shm_->syncFlag(r) < target) missing += strCat(missing.empty() ? "" : ", ", r);
          }
          return strCat("rank ", rank_, ": ", opWhat(), ": waiting for rank(s) ", missing, " to arrive");
        },
        [&](int r) { return shm_->syncFlag(r) < target; });
  }
}

// Rank `peer` synchronised, or sent a message, from another call than this rank's: an error naming
// both calls where the peers' published calls tell them.
void CommImpl::callMismatch(int peer) {
  if (curOp_) verifyPeerCalls("", true);
  fail(chorusInvalidUsage,
       strCat("rank ", rank_, ": collective call mismatch: this rank called ",
              curOp_ ? describeCall(call_) : opWhat(), " but rank ", peer, " is in another call"));
}

void CommImpl::llGather(const void* mine, size_t bytes, std::byte* out) {
  const uint64_t seq = ++llSeq_;
  const int slot = static_cast<int>(seq & 1);
  tsanReleaseShm();
  shm_->llPublish(slot, seq, callHash_, mine, bytes);
  std::byte* own = out + static_cast<size_t>(rank_) * bytes;
  if (own != mine && bytes) std::memcpy(own, mine, bytes);
  engine::Waiter waiter = makeWaiter();
  int other = -1;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    while (!shm_->llArrived(r, slot, seq, bytes)) {
      waiter.idle(
          [&] {
            std::string missing;
            for (int k = r; k < size_; ++k) {
              if (k != rank_ && !shm_->llArrived(k, slot, seq, bytes))
                missing += strCat(missing.empty() ? "" : ", ", k);
            }
            return strCat("rank ", rank_, ": ", opWhat(), ": waiting for rank(s) ", missing, " to arrive");
          },
          [&](int k) { return k >= r && k != rank_ && !shm_->llArrived(k, slot, seq, bytes); });
    }
    tsanAcquireShm();
    if (shm_->llCopy(r, slot, out + static_cast<size_t>(r) * bytes, bytes) != callHash_) other = r;
  }
  if (other >= 0) callMismatch(other);
}

bool CommImpl::exchangeBuffers(const void* send, size_t sendBytes, void* recv, size_t recvBytes,
                               std::vector<PeerBuffers>& peers) {
  if (!zeroCopyEnabled()) return false;
  const uint64_t seq = ++bufferSeq_;
  transport::SharedBufferRef s, r;
  if (sendBytes) s = transport::findShared(send, sendBytes);
  if (recvBytes) r = transport::findShared(recv, recvBytes);
  // The call travels with the buffers: a peer in another call (kind, count, type, op, root) would
  // have this rank read its buffer past its end. Every rank compares, so every rank refuses.
  const transport::CallFingerprint call = curOp_ ? call_ : transport::CallFingerprint{};
  const bool mine = (!sendBytes || s.valid()) && (!recvBytes || r.valid());
  tsanReleaseShm();
  shm_->publishBuffers(seq, s, r, mine, call);
  // Zero copy needs every rank's buffers: a rank whose own are ordinary memory knows the answer and
  // goes on at once (its peers read it in its slot), so buffers in ordinary memory, the common case,
  // cost no synchronisation. Only ranks whose buffers are all shared wait for every peer's slot.
  if (!mine) return false;
  awaitBuffers(seq);
  std::vector<transport::SharedBufferRef> sends(static_cast<size_t>(size_)), recvs(sends.size());
  bool allUsable = true;
  std::string differ;
  for (int k = 0; k < size_; ++k) {
    bool usable = false;
    transport::CallFingerprint theirs;
    if (!shm_->buffers(k, seq, &sends[static_cast<size_t>(k)], &recvs[static_cast<size_t>(k)], &usable,
                       &theirs)) {
      fail(chorusInvalidUsage, strCat("rank ", rank_, ": ", opWhat(), ": rank ", k,
                                      " is not in the same collective (it published another buffer exchange "
                                      "than #",
                                      seq, "): mismatched calls"));
    }
    if (!(theirs == call))
      differ += strCat(differ.empty() ? "" : "; ", "rank ", k, " called ", describeCall(theirs));
    allUsable = allUsable && usable;
  }
  if (!differ.empty()) {
    fail(chorusInvalidUsage,
         strCat("rank ", rank_, ": collective call mismatch: this rank called ", describeCall(call), " but ",
                differ, " (found by the zero-copy buffer exchange)"));
  }
  if (!allUsable) return false;
  peers.assign(static_cast<size_t>(size_), PeerBuffers{});
  for (int k = 0; k < size_; ++k) {
    PeerBuffers& p = peers[static_cast<size_t>(k)];
    if (k == rank_) {
      p.send = static_cast<const std::byte*>(send);
      p.recv = static_cast<std::byte*>(recv);
      continue;
    }
    const auto& sk = sends[static_cast<size_t>(k)];
    const auto& rk = recvs[static_cast<size_t>(k)];
    try {
      if (sk.valid()) p.send = peerMappings_.map(sk, k);
      if (rk.valid()) p.recv = peerMappings_.map(rk, k);
    } catch (const Error& e) {
      // A peer that failed first (and exited, taking its buffers along) says why.
      std::string text;
      chorusResult_t code = chorusRemoteError;
      if (const int peer = findPeerFailure(&code, &text); peer >= 0) {
        fail(chorusRemoteError,
             strCat("rank ", rank_, ": ", opWhat(), " stopped: rank ", peer, " failed: ", text));
      }
      fail(e.code(), strCat("rank ", rank_, ": ", opWhat(), " stopped: ", e.what()));
    }
  }
  return true;
}

void CommImpl::awaitBuffers(uint64_t seq) {
  engine::Waiter waiter = makeWaiter();
  int next = 0;  // ranks below `next` have published exchange `seq`
  for (;;) {
    while (next < size_ && shm_->buffersSeq(next, seq) == seq) ++next;
    if (next == size_) {
      tsanAcquireShm();
      return;
    }
    // A peer synchronising past this rank's last synchronisation, from another call, will never
    // publish this exchange.
    uint16_t tag = 0;
    if (shm_->syncFlag(next, &tag) > syncCounter_ && tag != tag_) callMismatch(next);
    waiter.idle(
        [&] {
          std::string missing;
          for (int k = 0; k < size_; ++k) {
            if (shm_->buffersSeq(k, seq) != seq) missing += strCat(missing.empty() ? "" : ", ", k);
          }
          return strCat("rank ", rank_, ": ", opWhat(), ": waiting for rank(s) ", missing,
                        " to publish their buffers");
        },
        [&](int k) { return shm_->buffersSeq(k, seq) != seq; });
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

void CommImpl::sleepIdle(std::chrono::microseconds duration) {
  if (!peers_ || !peers_->waitReadable(duration)) engine::Health::sleepIdle(duration);
}

// ---- Health --------------------------------------------------------------------------------------

void CommImpl::checkHealth(engine::FunctionRef<bool(int)> waitingOn) {
  if (abortRequested_.load()) {
    fail(chorusRemoteError, strCat("rank ", rank_, ": ", opWhat(), " stopped: the communicator was aborted"));
  }
  {
    std::string text;
    chorusResult_t code = chorusRemoteError;
    int peer = findPeerFailure(&code, &text);
    if (peer >= 0) {
      // A peer's timeout is this rank's timeout too (same missing ranks); anything else is remote.
      fail(code == chorusTimeout ? chorusTimeout : chorusRemoteError,
           strCat("rank ", rank_, ": ", opWhat(), " stopped: rank ", peer, " failed: ", text));
    }
  }
  for (size_t r = 0; r < peerPidfds_.size(); ++r) {
    int fd = peerPidfds_[r];
    if (fd < 0 || !waitingOn(static_cast<int>(r))) continue;
    struct pollfd p {
      fd, POLLIN, 0
    };
    if (poll(&p, 1, 0) > 0) {
      fail(chorusRemoteError, strCat("rank ", rank_, ": ", opWhat(), " stopped: rank ", r, " (",
                                     hosts_[r].describe(), ") died"));
    }
  }
}

}  // namespace chorus
