#include "engine/shm_sync.hpp"

#include <algorithm>
#include <cstring>

#include "base/error.hpp"
#include "base/tsan_sync.hpp"
#include "transports/shm/peer_memory.hpp"

namespace chorus::engine {

std::string describeCall(const transport::CallFingerprint& f) {
  auto kind = static_cast<OpKind>(f.kind);
  return strCat(opKindName(kind), " #", f.seq, " (count ", f.count, ", ",
                dataTypeName(static_cast<DataType>(f.type)),
                isReducing(kind) ? strCat(", ", reduceOpName(static_cast<ReduceOp>(f.op))) : std::string(),
                f.root >= 0 ? strCat(", root ", f.root) : std::string(), ")");
}

ShmSync::ShmSync(transport::ShmGroup& group, std::function<Waiter()> waiter,
                 std::function<std::string()> what, bool zeroCopy)
    : group_(group),
      waiter_(std::move(waiter)),
      what_(std::move(what)),
      zeroCopy_(zeroCopy),
      peerMappings_(std::max<size_t>(64, 4 * static_cast<size_t>(group.size()))) {}

void ShmSync::beginCall(const transport::CallFingerprint& call, uint64_t hash, uint16_t tag, OpKind kind) {
  if (inCall_) previousCall_ = call_;
  inCall_ = true;
  call_ = call;
  hash_ = hash;
  // The synchronisations carry the small calls' history too: a broadcast or reduce whose ranks
  // disagreed, which no rank waited in, differs by the next synchronisation (llNext).
  tag_ = llSeq_ ? callTag(hash ^ llWord_) : tag;
  group_.publishFingerprint(call_);
  group_.publishProgress(call_.seq, static_cast<int>(kind), false);
}

void ShmSync::endCall(OpKind kind) { group_.publishProgress(call_.seq, static_cast<int>(kind), true); }

// Check mode: every collective synchronises first, and so compares every rank's call.
void ShmSync::checkCallsMatch() {
  syncAll();
  verifyPeerCalls(" (CHORUS_CHECK)", true);
}

// After a synchronisation with every rank in this call: each published its call before, and a
// mismatch is an error naming both. A peer's slot that holds another call means either that it ran
// two calls ahead (it can, where it waits for nobody: nothing to tell) or that it has not yet started
// this call although it synchronised with this rank (its calls differ: an error too).
void ShmSync::verifyPeerCalls(const char* how, bool allArrived) {
  if (!inCall_) return;
  std::string differ;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    transport::CallFingerprint theirs;
    if (group_.fingerprint(r, call_.seq, &theirs)) {
      if (!(theirs == call_))
        differ += strCat(differ.empty() ? "" : "; ", "rank ", r, " called ", describeCall(theirs));
    } else if (allArrived && theirs.seq != 0 && theirs.seq < call_.seq) {
      differ += strCat(differ.empty() ? "" : "; ", "rank ", r, " was still in call #", theirs.seq + 1,
                       " or before");
    }
  }
  if (!differ.empty()) {
    fail(chorusInvalidUsage, strCat("rank ", rank(), ": collective call mismatch", how, ": this rank called ",
                                    describeCall(call_), " but ", differ));
  }
}

void ShmSync::callMismatch(int peer) {
  verifyPeerCalls("", true);
  fail(chorusInvalidUsage, strCat("rank ", rank(), ": collective call mismatch: this rank called ",
                                  inCall_ ? describeCall(call_) : what_(), " but rank ", peer,
                                  " is in another call", earlierDifference(peer)));
}

std::string ShmSync::earlierDifference(int peer) const {
  if (!llSeq_) return {};
  // The call before is still in the peer's other fingerprint slot while it is in this one.
  transport::CallFingerprint theirs;
  if (previousCall_.seq && group_.fingerprint(peer, previousCall_.seq, &theirs) && !(theirs == previousCall_))
    return strCat(": in the call before it called ", describeCall(theirs), " where this rank called ",
                  describeCall(previousCall_));
  return ", or one of the small calls before (through the low-latency lines) differed";
}

void ShmSync::syncAll() { waitAll(arrive()); }

uint64_t ShmSync::arrive() {
  const uint64_t target = ++syncCounter_;
  tsanReleaseShm();
  group_.setSyncFlag(target, tag_);
  return target;
}

void ShmSync::waitAll(uint64_t target) {
  const int n = size();
  Waiter waiter = waiter_();
  int next = 0;    // ranks below `next` have arrived
  int other = -1;  // a rank that arrived from another call (its flag carries another tag)
  for (;;) {
    while (next < n) {
      uint16_t tag;
      const uint64_t flag = group_.syncFlag(next, &tag);
      if (flag < target) break;
      if (flag == target && tag != tag_) other = next;
      ++next;
    }
    if (next == n) {
      tsanAcquireShm();
      if (other >= 0) callMismatch(other);
      return;
    }
    waiter.idle(
        [&] {
          std::string missing;
          for (int r = 0; r < n; ++r) {
            if (group_.syncFlag(r) < target) missing += strCat(missing.empty() ? "" : ", ", r);
          }
          return strCat("rank ", rank(), ": ", what_(), ": waiting for rank(s) ", missing, " to arrive");
        },
        [&](int r) { return group_.syncFlag(r) < target; });
  }
}

bool ShmSync::synchronisesAhead(int peer) const { return group_.syncFlag(peer) > syncCounter_; }

uint64_t ShmSync::llNext() {
  // Every rank folds the same calls in the same order, so equal words mean equal histories.
  llWord_ = (llWord_ ^ hash_) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  return ++llSeq_;
}

int ShmSync::llGatherSlot() { return static_cast<int>(llGathers_++ % transport::ShmGroup::kLlGatherSlots); }

int ShmSync::llRingDepth() const {
  // The whole ring where ranks share cores; a sixteenth of it where each has its own. Builds
  // against each other, launches of 1000 calls: the 2-rank reduce of 8 B took 0.09-0.12 us with
  // 16 slots, 0.16-0.24 with 128 (0.12 with two slots), while at 4 ranks on 2 cores 128 slots
  // halved the 16-slot ring's time (docs/performance.md, "Rooted calls in the low-latency lines").
  return group_.ownCores() ? transport::ShmGroup::kLlRootedSlots / 8 : transport::ShmGroup::kLlRootedSlots;
}

int ShmSync::llRootedSlot(uint64_t k) const {
  // Both depths are powers of two: a mask, not a division on every small call.
  static_assert((transport::ShmGroup::kLlRootedSlots & (transport::ShmGroup::kLlRootedSlots - 1)) == 0);
  return transport::ShmGroup::kLlGatherSlots + static_cast<int>(k & static_cast<uint64_t>(llRingDepth() - 1));
}

void ShmSync::llClaim(int slot, uint64_t seq) {
  const uint64_t need = llWritten_[static_cast<size_t>(slot)];  // the slot's last message
  llWritten_[static_cast<size_t>(slot)] = seq;
  if (need == 0 || llFree_ >= need) return;
  const int n = size(), me = rank();
  uint64_t least = UINT64_MAX;
  Waiter waiter = waiter_();
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    uint64_t done;
    while ((done = group_.llFinished(r)) < need) {
      // A peer synchronising in a later call without having finished this one skipped it.
      if (synchronisesAhead(r) && group_.llFinished(r) < need) callMismatch(r);
      waiter.idle(
          [&] {
            std::string missing;
            for (int k = r; k < n; ++k) {
              if (k != me && group_.llFinished(k) < need) missing += strCat(missing.empty() ? "" : ", ", k);
            }
            return strCat("rank ", me, ": ", what_(), ": waiting for rank(s) ", missing,
                          " to finish small call ", need,
                          " (a broadcast's root or a reduce's sender runs at most ", llRingDepth(),
                          " small calls ahead of the slowest)");
          },
          [&](int k) { return k >= r && k != me && group_.llFinished(k) < need; });
    }
    least = std::min(least, done);
  }
  tsanAcquireShm();
  llFree_ = least;
}

void ShmSync::llFinish(uint64_t seq) { group_.llFinish(seq); }

void ShmSync::llWordMismatch(int peer) {
  verifyPeerCalls("", true);
  fail(chorusInvalidUsage,
       strCat("rank ", rank(), ": collective call mismatch: this rank called ", describeCall(call_),
              " but rank ", peer, "'s message is from another call", earlierDifference(peer)));
}

void ShmSync::llGather(const void* mine, size_t bytes, std::byte* out) {
  const uint64_t seq = llNext();
  const int slot = llGatherSlot();
  llClaim(slot, seq);
  tsanReleaseShm();
  group_.llPublish(slot, seq, llWord_, mine, bytes);
  llCollect(seq, slot, mine, bytes, out);
  // Every peer published message seq, so finished every call before it.
  llFree_ = std::max(llFree_, seq - 1);
  group_.llPrepare(static_cast<int>(llGathers_ % transport::ShmGroup::kLlGatherSlots), bytes);
  llFinish(seq);
}

void ShmSync::llCollect(uint64_t seq, int slot, const void* mine, size_t bytes, std::byte* out) {
  const int n = size(), me = rank();
  std::byte* own = out + static_cast<size_t>(me) * bytes;
  if (own != mine && bytes) std::memcpy(own, mine, bytes);
  Waiter waiter = waiter_();
  int other = -1;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    while (!group_.llArrived(r, slot, seq, bytes)) {
      if (synchronisesAhead(r) && !group_.llArrived(r, slot, seq, bytes)) callMismatch(r);
      waiter.idle(
          [&] {
            std::string missing;
            for (int k = r; k < n; ++k) {
              if (k != me && !group_.llArrived(k, slot, seq, bytes))
                missing += strCat(missing.empty() ? "" : ", ", k);
            }
            return strCat("rank ", me, ": ", what_(), ": waiting for rank(s) ", missing, " to arrive");
          },
          [&](int k) { return k >= r && k != me && !group_.llArrived(k, slot, seq, bytes); });
    }
    tsanAcquireShm();
    if (group_.llCopy(r, slot, out + static_cast<size_t>(r) * bytes, bytes) != llWord_) other = r;
  }
  if (other >= 0) llWordMismatch(other);
}

void ShmSync::llBroadcast(int root, const void* data, size_t bytes, void* out) {
  const uint64_t seq = llNext();
  const int slot = llRootedSlot(llRooted_++);
  const int me = rank();
  if (me == root) {
    llClaim(slot, seq);
    tsanReleaseShm();
    group_.llPublish(slot, seq, llWord_, data, bytes);
    if (out != data && bytes) std::memcpy(out, data, bytes);
    llFinish(seq);
    return;
  }
  Waiter waiter = waiter_();
  while (!group_.llArrived(root, slot, seq, bytes)) {
    if (synchronisesAhead(root) && !group_.llArrived(root, slot, seq, bytes)) callMismatch(root);
    waiter.idle(
        [&] { return strCat("rank ", me, ": ", what_(), ": waiting for rank ", root, " (the root)"); },
        [&](int k) { return k == root; });
  }
  tsanAcquireShm();
  if (group_.llCopy(root, slot, out, bytes) != llWord_) llWordMismatch(root);
  llFinish(seq);
  // A root that runs ahead has written the next slot too: its lines are on their way. (Further
  // ahead paid nothing more with a ring of 16: 2 ranks, 8 B, 0.082-0.084 us a call at 1, 2 and 4
  // slots ahead, 0.093 at 6; 4 ranks on the 2 cores 0.38 at 1 slot, 0.43 at 4; 0.126 without.)
  group_.llPrefetch(root, llRootedSlot(llRooted_), bytes);
}

void ShmSync::llGatherToRoot(int root, const void* mine, size_t bytes, std::byte* out) {
  const uint64_t seq = llNext();
  const int slot = llRootedSlot(llRooted_++);
  if (rank() == root) {
    llCollect(seq, slot, mine, bytes, out);
    // Senders that run ahead have written their next slots too, as a broadcast's root has.
    const int next = llRootedSlot(llRooted_);
    for (int r = 0; r < size(); ++r)
      if (r != root) group_.llPrefetch(r, next, bytes);
  } else {
    llClaim(slot, seq);
    tsanReleaseShm();
    group_.llPublish(slot, seq, llWord_, mine, bytes);
  }
  llFinish(seq);
}

bool ShmSync::exchangeBuffers(const void* send, size_t sendBytes, void* recv, size_t recvBytes,
                              std::vector<PeerBuffers>& peers, bool ordinaryToo, uint32_t choice) {
  ordinaryToo = ordinaryToo && peerReadsTimed();
  if (!zeroCopy_ && !ordinaryToo) return false;
  const int n = size(), me = rank();
  const uint64_t seq = ++bufferSeq_;
  transport::PublishedBuffers own;
  if (zeroCopy_ && sendBytes) own.send = transport::findShared(send, sendBytes);
  if (zeroCopy_ && recvBytes) own.recv = transport::findShared(recv, recvBytes);
  own.sendAddress = reinterpret_cast<uintptr_t>(send);
  own.recvAddress = reinterpret_cast<uintptr_t>(recv);
  // The call travels with the buffers: a peer in another call (kind, count, type, op, root) would
  // have this rank read its buffer past its end. Every rank compares, so every rank refuses.
  own.call = inCall_ ? call_ : transport::CallFingerprint{};
  own.usable = zeroCopy_ && (!sendBytes || own.send.valid()) && (!recvBytes || own.recv.valid());
  own.choice = choice;
  tsanReleaseShm();
  group_.publishBuffers(seq, own);
  // Zero copy needs every rank's buffers: a rank whose own are ordinary memory knows the answer and
  // goes on at once (its peers read it in its slot), so buffers in ordinary memory, the common case,
  // cost no synchronisation. Only ranks whose buffers are all shared wait for every peer's slot, and
  // every rank where ordinary buffers can be read in place too (single copy).
  if (!own.usable && !ordinaryToo) return false;
  awaitBuffers(seq);
  std::vector<transport::PublishedBuffers> theirs(static_cast<size_t>(n));
  bool allUsable = true;
  std::string differ;
  for (int k = 0; k < n; ++k) {
    transport::PublishedBuffers& b = theirs[static_cast<size_t>(k)];
    if (!group_.buffers(k, seq, &b)) {
      fail(chorusInvalidUsage, strCat("rank ", me, ": ", what_(), ": rank ", k,
                                      " is not in the same collective (it published another buffer exchange "
                                      "than #",
                                      seq, "): mismatched calls"));
    }
    if (!(b.call == own.call))
      differ += strCat(differ.empty() ? "" : "; ", "rank ", k, " called ", describeCall(b.call));
    allUsable = allUsable && b.usable;
  }
  if (!differ.empty()) {
    fail(chorusInvalidUsage,
         strCat("rank ", me, ": collective call mismatch: this rank called ", describeCall(own.call), " but ",
                differ, " (found by the buffer exchange of the zero- or single-copy path)"));
  }
  if (!allUsable && !ordinaryToo) return false;
  peers.assign(static_cast<size_t>(n), PeerBuffers{});
  for (int k = 0; k < n; ++k) {
    PeerBuffers& p = peers[static_cast<size_t>(k)];
    const transport::PublishedBuffers& b = theirs[static_cast<size_t>(k)];
    p.inPlace = b.sendAddress == b.recvAddress;
    p.mapped = allUsable;
    p.choice = b.choice;
    if (k == me || (!allUsable && group_.remotePid(k) == 0)) {
      // This rank's own buffers, or (single copy) those of a rank of this process.
      p.send = reinterpret_cast<const std::byte*>(static_cast<uintptr_t>(b.sendAddress));
      p.recv = reinterpret_cast<std::byte*>(static_cast<uintptr_t>(b.recvAddress));
      continue;
    }
    if (!allUsable) {
      // Single copy: addresses in the peer's process, for readPeer.
      p.send = reinterpret_cast<const std::byte*>(static_cast<uintptr_t>(b.sendAddress));
      p.recv = reinterpret_cast<std::byte*>(static_cast<uintptr_t>(b.recvAddress));
      p.pid = group_.remotePid(k);
      continue;
    }
    try {
      if (b.send.valid()) p.send = peerMappings_.map(b.send, k);
      if (b.recv.valid()) p.recv = peerMappings_.map(b.recv, k);
    } catch (const Error& e) {
      failNamingPeer(e);
    }
  }
  return true;
}

void ShmSync::failNamingPeer(const Error& e) {
  // A peer that failed first (and exited, taking its buffers along) says why.
  std::string text;
  chorusResult_t code = chorusRemoteError;
  if (const int peer = group_.findPeerFailure(&code, &text); peer >= 0) {
    fail(chorusRemoteError,
         strCat("rank ", rank(), ": ", what_(), " stopped: rank ", peer, " failed: ", text));
  }
  fail(e.code(), strCat("rank ", rank(), ": ", what_(), " stopped: ", e.what()));
}

void ShmSync::readPeer(int peer, const PeerBuffers& p, void* dst, const std::byte* src, size_t bytes,
                       kernels::CopyMode mode) {
  if (p.pid == 0) {
    kernels::copy(dst, src, bytes, mode);
    return;
  }
  try {
    const std::string what = strCat("rank ", peer);
    transport::readPeerMemory(p.pid, dst, reinterpret_cast<uintptr_t>(src), bytes, what.c_str());
  } catch (const Error& e) {
    failNamingPeer(e);
  }
}

void ShmSync::writePeer(int peer, const PeerBuffers& p, std::byte* dst, const void* src, size_t bytes) {
  if (p.pid == 0) {
    kernels::copy(dst, src, bytes, kernels::CopyMode::Cached);
    return;
  }
  try {
    const std::string what = strCat("rank ", peer);
    transport::writePeerMemory(p.pid, reinterpret_cast<uintptr_t>(dst), src, bytes, what.c_str());
  } catch (const Error& e) {
    failNamingPeer(e);
  }
}

void ShmSync::awaitBuffers(uint64_t seq) {
  const int n = size();
  Waiter waiter = waiter_();
  int next = 0;  // ranks below `next` have published exchange `seq`
  for (;;) {
    while (next < n && group_.buffersSeq(next, seq) == seq) ++next;
    if (next == n) {
      tsanAcquireShm();
      return;
    }
    // A peer synchronising past this rank's last synchronisation, from another call, will never
    // publish this exchange.
    uint16_t tag = 0;
    if (group_.syncFlag(next, &tag) > syncCounter_ && tag != tag_) callMismatch(next);
    waiter.idle(
        [&] {
          std::string missing;
          for (int k = 0; k < n; ++k) {
            if (group_.buffersSeq(k, seq) != seq) missing += strCat(missing.empty() ? "" : ", ", k);
          }
          return strCat("rank ", rank(), ": ", what_(), ": waiting for rank(s) ", missing,
                        " to publish their buffers");
        },
        [&](int k) { return group_.buffersSeq(k, seq) != seq; });
  }
}

std::string ShmSync::progressReport() const {
  std::string out;
  for (int r = 0; r < group_.size(); ++r) {
    int kind = 0;
    const uint64_t p = group_.progress(r, &kind);
    const uint64_t seq = p >> 1;
    const char* name = opKindName(static_cast<OpKind>(kind));
    out += strCat(r ? ", " : "", "rank ", r, " ",
                  seq == 0  ? std::string("has run no collective")
                  : (p & 1) ? strCat("finished ", name, " #", seq)
                            : strCat("in ", name, " #", seq));
  }
  return out;
}

}  // namespace chorus::engine
