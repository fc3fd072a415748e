// The shared-memory world of one communicator on one host.
//
// Every rank owns one segment, named after the communicator's random id and the rank, so two
// communicators never share a flag or a buffer. A segment holds:
//   - a header: the rank's sync counter (direct algorithms), and its failure notice; how it wrote
//     its last copy into staging, and what it measured reading its peers' streamed blocks;
//   - slots of low-latency lines: small payloads sent with a sequence number in the same 64-byte
//     line, so a reader learns of the data and gets it in one cache-line transfer; two for the
//     messages every rank reads, a ring of 128 for those of the broadcast's root and the reduce's
//     senders; and the last low-latency call the rank finished;
//   - one FIFO per source rank (the point-to-point pipes *into* this rank);
//   - the staging area for direct algorithms: kStageSlots slots of half the staging size, which a
//     long allreduce's or all-gather's chunks alternate between (two of them) and other calls'
//     chunks are packed through (all; engine/stage_placement.hpp).
// Segments are created and reserved, announced through the store, mapped by every peer, then
// unlinked once all ranks have mapped them: after init nothing of the job is left in /dev/shm.
// A set-up that fails, or whose creator dies before unlinking, leaves nothing either (shm_names.hpp).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "chorus/store.hpp"
#include "transports/shm/shm_channel.hpp"
#include "transports/shm/shm_memory.hpp"
#include "transports/shm/shm_segment.hpp"
#include "transports/transport.hpp"

namespace chorus::transport {

/// What a rank is about to call, compared across ranks in check mode (CHORUS_CHECK).
struct CallFingerprint {
  uint64_t seq = 0;
  uint64_t count = 0;
  int32_t kind = 0;
  int32_t type = 0;
  int32_t op = 0;
  int32_t root = 0;
  bool operator==(const CallFingerprint&) const = default;
};

/// Staging slots per rank, each of half the staging size: the segment holds twice the staging size.
constexpr int kStageSlots = 4;
/// Size classes of the read penalties a rank publishes (ShmGroup::publishReadPenalty).
constexpr int kReadPenaltyClasses = 16;

struct ShmGroupOptions {
  std::string jobTag;  // unique per communicator (hex of its random id)
  size_t fifoBytes = 0;
  size_t stageBytes = 0;
  /// The host's ranks per core it may run on, rounded up (1: a core each), which decides the staged
  /// calls that pack their chunks through all kStageSlots (algo::stagingPacks). Group rank 0's
  /// value holds for every rank (ranksPerCore()), as the places a chunk goes to must agree.
  int ranksPerCore = 1;
  std::chrono::milliseconds timeout{0};
  /// By group rank: the process id of each peer whose liveness this process can watch (same pid
  /// namespace, another process), else 0. A peer that exits during set-up stops it at once.
  std::vector<int> peerPids;
  /// By group rank: the rank in the communicator, which errors name (empty: the group rank).
  std::vector<int> commRanks;
  /// Throws the failure a peer published, if one did (called when a peer is found gone: a peer
  /// that failed publishes why before it exits, which names the cause better than its exit).
  std::function<void()> throwIfPeerFailed;
  /// Why this rank does not offer to read its peers' ordinary memory in place ("" = it offers to):
  /// every rank must offer it, and every rank must be able to read every other process, for the
  /// group to.
  std::string noPeerReads;
  /// Where every rank reads every other in place: point-to-point payloads from this size on are
  /// sent by address (0: never).
  size_t inPlaceMinBytes = 0;
  /// Read peers in place however slow cross-memory attach is here (CHORUS_CMA=1 or a size). Else
  /// group rank 0 measures its speed at set-up (measurePeerReadSpeed) and, below
  /// kMinPeerReadSpeed, every rank stages. Group rank 0's setting decides whether it measures,
  /// and so whether the speed gates the group.
  bool peerReadsRegardless = false;
};

/// Cross-memory attach must copy at least this fraction of memcpy's rate for reading peers'
/// ordinary memory in place to be used (it saves one of staging's two copies, but runs on one
/// core where staging's two run on both; docs/performance.md, "Single copy").
constexpr double kMinPeerReadSpeed = 0.5;
/// Whether peers' ordinary memory is read in place at cross-memory attach's measured `speed`
/// (measurePeerReadSpeed), or `regardless` of it (ShmGroupOptions::peerReadsRegardless).
inline bool peerReadsPay(double speed, bool regardless) { return regardless || speed >= kMinPeerReadSpeed; }

/// Where a rank's buffers of one buffer exchange are, and what they are for.
struct PublishedBuffers {
  SharedBufferRef send, recv;  // where they lie in chorusMemAlloc memory (invalid: they do not)
  uint64_t sendAddress = 0;    // their addresses in the owner's address space
  uint64_t recvAddress = 0;
  bool usable = false;   // every buffer the rank needs is in chorusMemAlloc memory
  uint32_t choice = 0;   // a word the algorithm passes along (the allreduce: rank 0's path)
  CallFingerprint call;  // the collective they are for
};

/// The pipes between the ranks of one host, and the shared-memory capability the direct algorithms
/// use (staging area, sync flags, low-latency lines, buffer exchange), which no other transport has.
class ShmGroup final : public Transport {
 public:
  /// Collective over all `nranks` ranks (uses `store` to rendezvous).
  ShmGroup(Store& store, int rank, int nranks, const ShmGroupOptions& options);
  ~ShmGroup() override;
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return nranks_; }

  // Transport (peers numbered by group rank).
  const char* name() const override { return "shm"; }
  SendPipe& sendPipe(int peer) override { return *sendPipes_[static_cast<size_t>(peer)]; }
  RecvPipe& recvPipe(int peer) override { return *recvPipes_[static_cast<size_t>(peer)]; }
  /// Tells the peers this rank failed (first call wins); they report `text` naming this rank.
  void publishFailure(chorusResult_t code, const std::string& text) override;
  /// A peer that published a failure: its rank (and code and text), or -1.
  int findPeerFailure(chorusResult_t* code, std::string* text) override;
  /// Nothing to block on: peers write flags and FIFOs in memory, the caller naps.
  bool waitReadable(std::chrono::microseconds) override { return false; }
  /// This rank's segment's name.
  const std::string& describeLocal() const override { return ownName_; }
  /// Bytes of shared memory this rank created (its own segment).
  size_t memoryBytes() const override { return segmentBytes_; }

  /// The byte at `offset` of rank `r`'s staging area: kStageSlots slots of half the staging size
  /// (ShmGroupOptions::stageBytes) back to back, where the direct algorithms put their chunks
  /// (engine::StagePlacement says where).
  std::byte* stageAt(int r, size_t offset) const { return stages_[static_cast<size_t>(r)] + offset; }
  size_t stageSlotBytes() const { return stageSlot_; }

  /// Publishes this rank's sync counter (release: staged data written before is visible), and in
  /// the same word the 16-bit tag of the call it synchronises in.
  void setSyncFlag(uint64_t value, uint16_t call);
  /// Reads rank r's sync counter (acquire), and the tag published with it into `*call`.
  uint64_t syncFlag(int r, uint16_t* call = nullptr) const;
  /// How this rank wrote what it last copied into its staging area: with streaming stores or not.
  /// Published before the synchronisation after which the peers read it, so that a peer can tell
  /// what its reads of that block cost by how the block was written (engine::StagingWrites). A
  /// peer that reads it late may see the next block's way: a hint for timing, never for results.
  void publishStagedStreaming(bool streaming);
  /// Rank `r`'s last publishStagedStreaming().
  bool stagedStreaming(int r) const;
  /// What this rank measured it pays more per KiB to read a peer's block of size class `sizeClass`
  /// (0 to kReadPenaltyClasses - 1) where the peer streamed it than where it wrote it plain, for
  /// the peers that write what it reads (engine::StagingWrites); kept to 1/16 ns per KiB.
  void publishReadPenalty(int sizeClass, double nsPerKiB);
  /// Rank `r`'s last publishReadPenalty() for `sizeClass`, or -1 if it published none.
  double readPenalty(int r, int sizeClass) const;

  /// Publishes which collective this rank is in (`done` false) or has finished (true). Peers read
  /// it only to report where every rank is when something times out.
  void publishProgress(uint64_t seq, int kind, bool done);
  /// Rank r's progress: seq * 2 + done, and the kind of that collective.
  uint64_t progress(int r, int* kind) const;

  /// Publishes the call this rank is entering (visible to a peer once it has synchronised with this
  /// rank in that call). Two slots, by seq parity.
  void publishFingerprint(const CallFingerprint& f);
  /// Rank r's published call `seq` into `*f`; false if its slot holds another call (or was being
  /// rewritten: r ran two calls ahead), `f->seq` then being what the slot held.
  bool fingerprint(int r, uint64_t seq, CallFingerprint* f) const;

  /// Low-latency lines: 56 payload bytes and an 8-byte sequence number per 64-byte line. Slots
  /// 0 and 1 (kLlGatherSlots, kLlLines lines each, up to kLlBytes) carry the messages every rank
  /// reads (llGather); slots kLlGatherSlots.. (kLlRootedSlots, kLlRootedLines lines each, up to
  /// kLlRootedBytes) the ring of the messages only some ranks read (a broadcast's root's, a
  /// reduce's senders'). A rank writes a slot again only once every peer has finished the call
  /// that read the slot's last message (llFinished), so the ring lets a rank that waits for nobody
  /// run up to kLlRootedSlots calls ahead of its slowest peer.
  static constexpr size_t kLlLinePayload = 56;
  static constexpr size_t kLlLines = 64;
  static constexpr int kLlGatherSlots = 2;
  static constexpr size_t kLlRootedLines = 5;
  static constexpr int kLlRootedSlots = 128;
  /// Payload capacity of a slot: its lines less the 8-byte call word every message starts with.
  static constexpr size_t kLlBytes = kLlLinePayload * kLlLines - sizeof(uint64_t);
  static constexpr size_t kLlRootedBytes = kLlLinePayload * kLlRootedLines - sizeof(uint64_t);
  /// Writes `bytes` (<= the slot's capacity) into this rank's slot, after `call` (a hash of the call the
  /// message belongs to, which the reader compares), each line tagged with `seq` (> 0).
  void llPublish(int slot, uint64_t seq, uint64_t call, const void* data, size_t bytes);
  /// Whether rank r's slot holds all lines of message `seq` of `bytes` bytes (acquire).
  bool llArrived(int r, int slot, uint64_t seq, size_t bytes) const;
  /// Copies the payload of rank r's slot (call after llArrived returned true); returns its call word.
  uint64_t llCopy(int r, int slot, void* out, size_t bytes) const;
  /// Asks for this rank's lines of `slot` that a message of `bytes` uses in the exclusive state
  /// ahead of the next llPublish into it, where that pays (call once every peer has read the
  /// slot's last message). A hint: it changes no data.
  void llPrepare(int slot, size_t bytes) const;
  /// Publishes that this rank finished low-latency call `seq` (release): it reads none of the
  /// peers' messages up to `seq` any more.
  void llFinish(uint64_t seq);
  /// The last low-latency call rank r published it finished (acquire).
  uint64_t llFinished(int r) const;
  /// A hint: starts loading the lines of rank r's `slot` that a message of `bytes` fills.
  void llPrefetch(int r, int slot, size_t bytes) const;

  /// Publishes where this rank's buffers of exchange `seq` live (release: a peer that reads `seq`
  /// in the slot sees the rest). Two slots by seq parity: a rank publishes exchange seq + 2 only
  /// after a synchronisation of collective seq + 1, which every reader of seq has passed.
  /// The peers compare `b.call` with theirs.
  void publishBuffers(uint64_t seq, const PublishedBuffers& b);
  /// The exchange rank r's slot for `seq` holds now (acquire).
  uint64_t buffersSeq(int r, uint64_t seq) const;
  /// Rank r's buffers of exchange `seq` (false if r published another exchange there).
  bool buffers(int r, uint64_t seq, PublishedBuffers* b) const;

  /// Whether every rank can read every other rank's ordinary memory in place: ranks of this
  /// process directly, those of other processes by cross-memory attach (peer_memory.hpp), probed
  /// on every pair at set-up. The same answer on every rank.
  bool peerMemoryReadable() const { return peerReadable_; }
  /// peerMemoryReadable(), and cross-memory attach fast enough here (peerReadsPay) for the paths
  /// that read in place by size alone; where it is readable but slow, only the collectives whose
  /// first rank times both ways read in place (engine/single_copy_choice.hpp). The same answer
  /// on every rank.
  bool peerReadsFast() const { return peerReadsFast_; }
  /// Group rank 0's ShmGroupOptions::ranksPerCore, the same on every rank (0 where it published
  /// none, which packs nothing).
  int ranksPerCore() const { return ranksPerCore_; }
  /// Every rank of the host has a core of its own (ranksPerCore() 1).
  bool ownCores() const { return ranksPerCore_ == 1; }
  /// Why not (readable, or fast), when not ("rank 1 offers no in-place reads (CHORUS_CMA=0)",
  /// "rank 0 cannot read rank 1: process 123 refused it: ...", "cross-memory attach copies at 25%
  /// of memcpy's rate here ..."); empty otherwise.
  const std::string& peerMemoryNote() const { return peerReadNote_; }
  /// Cross-memory attach's speed relative to memcpy as group rank 0 measured it at set-up (0: not
  /// measured: every rank in one process, reads refused, or peerReadsRegardless).
  double peerReadSpeed() const { return peerReadSpeed_; }
  /// Rank r's process id, or 0 when r is in this process (its memory is addressable here).
  int remotePid(int r) const { return remotePids_[static_cast<size_t>(r)]; }

 private:
  struct Header;
  Header* header(int r) const;
  // Rank r's low-latency slot `slot` (its first line): a gather slot below kLlGatherSlots, else
  // one of the ring.
  void* llSlotLines(int r, int slot) const;
  // Creates this rank's segment, maps every peer's, and unlinks ours once all have mapped all.
  void mapSegments(Store& store, const ShmGroupOptions& options);
  // Before the ranks' last set-up barrier: probes reading every peer process's memory, publishes
  // the answer. After it: combines every rank's answer (probePeers, agreePeerReads).
  void probePeers(const std::string& noPeerReads, bool regardless);
  void agreePeerReads();

  int rank_;
  int nranks_;
  size_t fifoBytes_;
  size_t stageSlot_;
  size_t segmentBytes_;
  std::vector<ShmSegment> segments_;  // index = rank
  std::string ownName_;
  std::vector<std::unique_ptr<ShmSendPipe>> sendPipes_;
  std::vector<std::unique_ptr<ShmRecvPipe>> recvPipes_;
  std::vector<std::byte*> stages_;
  std::vector<int> remotePids_;  // index = rank; 0 = this process
  bool peerReadable_ = false;
  bool peerReadsFast_ = false;
  int ranksPerCore_ = 0;
  double peerReadSpeed_ = 0;
  std::string peerReadNote_;
};

}  // namespace chorus::transport
