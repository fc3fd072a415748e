// The synchronisation protocol of the ranks of one host over their shared memory, which only the
// direct algorithms use (transports/shm holds the memory; this is how it is used): arrival counters
// carrying the call's tag, the low-latency lines, the buffer exchange (zero and single copy), the
// call checks and the progress each rank publishes. One per communicator whose ranks all share a host, driven
// by the thread running the current operation.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/op.hpp"
#include "engine/output_stores.hpp"
#include "engine/single_copy_choice.hpp"
#include "engine/stage_placement.hpp"
#include "engine/staging_writes.hpp"
#include "engine/waiter.hpp"
#include "kernels/cpu/reduce.hpp"
#include "transports/shm/shm_group.hpp"
#include "transports/shm/shm_memory.hpp"

namespace chorus::engine {

// fingerprintOf, callHash and callTag run on every call: inline, as the communicator's own code.

/// What must agree between the ranks of one collective call: kind, count, type, op, root.
inline transport::CallFingerprint fingerprintOf(const Op& o, uint64_t seq) {
  transport::CallFingerprint f;
  f.seq = seq;
  f.kind = static_cast<int32_t>(o.kind);
  f.count = o.kind == OpKind::AllToAllv ? 0 : o.count;  // alltoallv counts differ by design
  f.type = o.kind == OpKind::Barrier ? 0 : static_cast<int32_t>(o.type);
  f.op = isReducing(o.kind) ? static_cast<int32_t>(o.op) : 0;
  f.root = (o.kind == OpKind::Broadcast || o.kind == OpKind::Reduce) ? o.root : -1;
  return f;
}
/// "allreduce #3 (count 1000, float32, sum)".
std::string describeCall(const transport::CallFingerprint& f);
/// A 64-bit hash of the call (low-latency messages carry it whole).
inline uint64_t callHash(const transport::CallFingerprint& f) {
  uint64_t h = f.seq * 0x9E3779B97F4A7C15ull;
  for (uint64_t v :
       {f.count, uint64_t{static_cast<uint32_t>(f.kind)}, uint64_t{static_cast<uint32_t>(f.type)},
        uint64_t{static_cast<uint32_t>(f.op)}, uint64_t{static_cast<uint32_t>(f.root)}}) {
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h;
}
/// 16 bits of the hash that are never 0xFFFF (the point-to-point tag): every pipe message's tag
/// and every sync flag's.
inline uint16_t callTag(uint64_t hash) { return static_cast<uint16_t>((hash >> 16) % 0xFFFF); }

/// A rank's buffers for zero-copy and single-copy algorithms: addresses in this process (`pid` 0:
/// a chorusMemAlloc buffer mapped here, or a rank of this process), or in process `pid` (another
/// process's ordinary memory), which only ShmSync::readPeer and writePeer may touch.
struct PeerBuffers {
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  int pid = 0;
  bool inPlace = false;  // the rank's send and receive buffers start at one address
  bool mapped = false;   // zero copy: every rank's buffers are chorusMemAlloc memory (same on all)
  uint32_t choice = 0;   // the word the rank passed to exchangeBuffers
};

class ShmSync {
 public:
  /// `waiter()` makes a waiter bounded by the running operation's deadline; `what()` names the
  /// operation for errors. `zeroCopy`: whether buffer exchanges may succeed (rank 0's setting).
  ShmSync(transport::ShmGroup& group, std::function<Waiter()> waiter, std::function<std::string()> what,
          bool zeroCopy);

  transport::ShmGroup& group() { return group_; }
  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }

  /// Enters collective `call` (its hash and tag travel with its synchronisations and lines): its
  /// fingerprint and progress are published. `endCall` publishes that this rank finished it.
  void beginCall(const transport::CallFingerprint& call, uint64_t hash, uint16_t tag, OpKind kind);
  void endCall(OpKind kind);
  /// Point-to-point operations: no call to compare.
  void clearCall() { inCall_ = false; }

  /// Publishes arrival at the next sync point and waits until every rank arrives (release then
  /// acquire: what a rank staged before is visible after). A rank arriving from another call is
  /// a mismatch.
  void syncAll();
  /// syncAll() in two halves, for work on this rank's own buffers in between (it hides the flags'
  /// trip between the cores): arrive() publishes this rank's arrival at the next sync point and
  /// returns it; waitAll(point) waits until every rank has arrived there. syncAll() is
  /// waitAll(arrive()). Between the two a rank touches nothing its peers read or write.
  uint64_t arrive();
  void waitAll(uint64_t point);
  /// Where in this rank's staging area (ShmGroup::stageAt) the next chunk of `bytes` goes: packed
  /// right after the chunk before for a short call's (`packed`), else slot 0 or 1 in turn
  /// (stage_placement.hpp). Every rank asks for the same chunks in the same order, so all agree.
  size_t nextStageOffset(size_t bytes, bool packed) {
    return packed ? stagePlacement_.nextPacked(bytes) : stagePlacement_.nextSlot();
  }
  /// How this rank writes copies and reductions into its staging area (timed per rank,
  /// staging_writes.hpp).
  StagingWrites& stagingWrites() { return stagingWrites_; }
  /// How this rank writes the outputs it copies out of staging (timed per rank, output_stores.hpp).
  OutputStores& outputStores() { return outputStores_; }
  /// Whether the allreduce pulls or stages ordinary buffers (rank 0 decides, single_copy_choice.hpp).
  SingleCopyChoice& singleCopyChoice() { return singleCopyChoice_; }
  /// Publishes `bytes` (<= llCapacity()) of `mine` and copies every rank's message, own included,
  /// to out + r * bytes: one cache-line transfer per 56 bytes and peer, no separate flag; every
  /// rank waits for every other.
  void llGather(const void* mine, size_t bytes, std::byte* out);
  /// A message of the low-latency lines that only some ranks wait for. Broadcast: `root` publishes
  /// `bytes` of `data` (copied to its `out` too, unless the same) and returns at once; every other
  /// rank copies the root's message to `out`. Gather to the root (reduce): every rank publishes
  /// `bytes` of `mine` and all but `root` return at once; the root copies rank r's message to
  /// out + r * bytes (the root publishes nothing). `bytes` <= llRootedCapacity(). A rank that waits
  /// for nobody runs ahead through a ring of slots, by up to kLlRootedSlots messages where ranks
  /// share cores and 16 where each has its own: writing a slot again waits until every peer
  /// finished the call that read it (llClaim). Every message carries the chain of the small calls
  /// so far (llNext), which its readers compare, and the synchronisations of the calls after carry
  /// it in their tags: a broadcast or reduce whose ranks disagreed fails by the next message read or
  /// synchronisation between two ranks whose calls differed.
  void llBroadcast(int root, const void* data, size_t bytes, void* out);
  void llGatherToRoot(int root, const void* mine, size_t bytes, std::byte* out);
  static constexpr size_t llCapacity() { return transport::ShmGroup::kLlBytes; }
  /// How many of the ring's slots the rooted messages use: all where ranks share cores, 16 where
  /// each has its own (ShmGroup::ownCores()), the same on every rank.
  int llRingDepth() const;
  /// What one message of llBroadcast() or llGatherToRoot() carries at most.
  static constexpr size_t llRootedCapacity() { return transport::ShmGroup::kLlRootedBytes; }
  /// Zero copy: publishes where this rank's buffers are (a buffer of 0 bytes is not needed). If
  /// zero copy is enabled and every rank's needed buffers lie in chorusMemAlloc memory, fills
  /// `peers` (one entry per rank, own included) and returns true; otherwise false, the same on
  /// every rank. A rank whose own buffers are ordinary memory answers at once; the others wait for
  /// every rank's buffers (one synchronisation), so only for large messages.
  ///
  /// With `ordinaryToo` (single copy: the caller reads peers' buffers only through readPeer), the
  /// answer is true also for ordinary memory where peerReadsTimed(): every rank then waits for
  /// every rank's buffers, so `ordinaryToo` must be the same on every rank (a function of the call).
  /// `choice` travels with this rank's buffers to every rank's PeerBuffers::choice.
  bool exchangeBuffers(const void* send, size_t sendBytes, void* recv, size_t recvBytes,
                       std::vector<PeerBuffers>& peers, bool ordinaryToo = false, uint32_t choice = 0);
  bool zeroCopyEnabled() const { return zeroCopy_; }
  /// Whether every rank can read every other rank's ordinary memory in place (ShmGroup's probe),
  /// and cross-memory attach is fast enough here for the paths that read in place by size alone.
  bool peerReadsEnabled() const { return group_.peerReadsFast(); }
  /// Whether single copy may be tried where rank 0 decides it (SingleCopyChoice::times): every
  /// rank can read every other in place, however fast (the same answer on every rank, whatever
  /// each one's CHORUS_SINGLE_COPY_CHOICE). Where cross-memory attach is slow, rank 0 tries
  /// staging first, and under the `ranges` policy it always stages.
  bool peerReadsTimed() const { return group_.peerMemoryReadable(); }
  /// Copies `bytes` at `src` of rank `peer`'s buffers (`p`, from exchangeBuffers) to `dst`: a copy
  /// in this process (`mode` applies), else a cross-memory read. A failure names the peer, and the
  /// peer's own failure where it published one (it exited, taking its buffers along).
  void readPeer(int peer, const PeerBuffers& p, void* dst, const std::byte* src, size_t bytes,
                kernels::CopyMode mode);
  /// Copies `bytes` from `src` to `dst` of rank `peer`'s buffers (`p`): a copy in this process,
  /// else a cross-memory write; failures as readPeer's.
  void writePeer(int peer, const PeerBuffers& p, std::byte* dst, const void* src, size_t bytes);

  /// Check mode (CHORUS_CHECK): one synchronisation, then every peer's whole call compared.
  void checkCallsMatch();
  /// Compares the peers' published calls with this rank's and fails naming those that differ; with
  /// `allArrived` (after a synchronisation with every rank), a peer not yet in this call differs too.
  /// Nothing to compare outside a collective.
  void verifyPeerCalls(const char* how, bool allArrived);
  /// Rank `peer` synchronised, or sent a message, from another call: an error naming both calls
  /// where the peers' published calls tell them.
  [[noreturn]] void callMismatch(int peer);

  /// Where every rank is, from the progress each publishes: "rank 0 in allreduce #5, ...".
  std::string progressReport() const;

 private:
  // Throws `e`, or the failure a peer published first (the likelier cause).
  [[noreturn]] void failNamingPeer(const Error& e);
  // Waits until every rank has published buffer exchange `seq`.
  void awaitBuffers(uint64_t seq);
  // The next low-latency message's number; folds this call into llWord_, the call word every
  // message carries: a chain of the hashes of every low-latency call so far, so that a reader finds
  // a difference in any earlier small call, not only in this one.
  uint64_t llNext();
  // The slot of the next gather (llGather: every rank reads every message) and of the next
  // message of the ring (a broadcast's or a reduce's): every rank counts both, so all agree.
  int llGatherSlot();
  // The ring's slot of rooted message k (of llRingDepth()).
  int llRootedSlot(uint64_t k) const;
  // Before this rank writes message `seq` into its `slot`: waits until every peer has finished the
  // call of the slot's last message (llFree_: what is known already, so the peers' lines are read
  // once in many calls).
  void llClaim(int slot, uint64_t seq);
  // Whether `peer` arrived at a synchronisation this rank has not reached. Waiting for its
  // low-latency message, that is a mismatch (it runs the staged path of another call: a count on
  // the other side of a low-latency bound), unless the message is there after all: a peer publishes
  // it before it synchronises in a later call, so the waits look again after a true answer.
  bool synchronisesAhead(int peer) const;
  // Copies `mine` and every peer's message `seq`, once there, to out + r * bytes, comparing their
  // call words with this rank's.
  void llCollect(uint64_t seq, int slot, const void* mine, size_t bytes, std::byte* out);
  // Low-latency call `seq` finished here: published for the writers waiting to reuse a slot.
  void llFinish(uint64_t seq);
  // Rank `peer`'s message carries another call word: an error naming this call.
  [[noreturn]] void llWordMismatch(int peer);
  // Where rank `peer` agrees on this call but its small calls' history differs: the call before,
  // named where the peer's published fingerprint of it differs, else a sentence saying so.
  std::string earlierDifference(int peer) const;

  transport::ShmGroup& group_;
  std::function<Waiter()> waiter_;
  std::function<std::string()> what_;
  bool zeroCopy_;
  bool inCall_ = false;
  transport::CallFingerprint call_;
  transport::CallFingerprint previousCall_;
  uint64_t hash_ = 0;
  uint16_t tag_ = 0;
  uint64_t syncCounter_ = 0;
  StagePlacement stagePlacement_{group_.stageSlotBytes(), transport::kStageSlots};
  StagingWrites stagingWrites_{stagingWritesPolicy(), stagingCopiesPolicy()};
  OutputStores outputStores_{outputStoresTimed()};
  SingleCopyChoice singleCopyChoice_{singleCopyChoicePolicy()};
  uint64_t llSeq_ = 0;
  uint64_t llWord_ = 0;                    // the call word of message llSeq_ (llNext)
  uint64_t llFree_ = 0;                    // every peer is known to have finished low-latency call llFree_
  uint64_t llGathers_ = 0, llRooted_ = 0;  // messages so far through the gather slots, the ring
  // The last message this rank wrote into each of its slots (0: none).
  std::array<uint64_t, transport::ShmGroup::kLlGatherSlots + transport::ShmGroup::kLlRootedSlots>
      llWritten_{};
  uint64_t bufferSeq_ = 0;
  // Peers' chorusMemAlloc buffers mapped here; room for two operations' worth (send and receive
  // buffer of every peer), so that no pointer of the running operation is ever unmapped.
  transport::PeerMappings peerMappings_;
};

}  // namespace chorus::engine
