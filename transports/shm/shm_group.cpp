#include "transports/shm/shm_group.hpp"

#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstring>
#include <new>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/rank_wait.hpp"
#include "transports/shm/peer_memory.hpp"
#include "transports/shm/shm_names.hpp"

namespace chorus::transport {

namespace {
constexpr uint64_t kMagic = 0x43484f5255534d31ull;  // "CHORUSM1"
constexpr size_t kHeaderBytes = 4096 + (ShmGroup::kLlGatherSlots * ShmGroup::kLlLines +
                                        ShmGroup::kLlRootedSlots * ShmGroup::kLlRootedLines) *
                                           64;
constexpr size_t kFailTextBytes = 1024;

// PREFETCHW where the CPU has it (CPUID 0x80000001 ECX bit 8), else nothing.
bool hasPrefetchW() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0x80000001u, &a, &b, &c, &d) == 0) return false;
  return (c & (1u << 8)) != 0;
#else
  return true;
#endif
}

void prefetchForWrite(const void* p) {
  static const bool kHave = hasPrefetchW();
#if defined(__x86_64__)
  if (kHave) asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  if (kHave) __builtin_prefetch(p, 1, 3);
#endif
}

}  // namespace

struct ShmGroup::Header {
  uint64_t magic;
  int32_t rank;
  int32_t nranks;
  uint64_t fifoBytes;
  uint64_t stageBytes;
  alignas(64) std::atomic<uint64_t> syncFlag;
  // In the flag's line, which a peer has just read when it reads this: 1 where this rank's last
  // copy into its staging area streamed (publishStagedStreaming).
  std::atomic<uint32_t> stagedStreaming;
  // What this rank measured it pays more to read a peer's streamed block than a plain one, by size
  // class (publishReadPenalty): 1/16 ns per KiB plus one, 0 while unknown. Its own line, written by
  // this rank now and then, read by the peers when they stream a copy.
  alignas(64) std::atomic<uint32_t> readPenalty[kReadPenaltyClasses];
  alignas(64) std::atomic<uint64_t> progress;  // written per collective; read on timeouts only
  std::atomic<int32_t> progressKind;
  alignas(64) std::atomic<uint32_t> failCode;  // 0 = healthy; set once, after failText is written
  char failText[kFailTextBytes];
  // The call this rank is in, by seq parity, written as a seqlock: a reader may race with the
  // writer (a rank can run ahead by two calls where it waits for nobody) and then sees seq change.
  struct alignas(64) CallSlot {
    std::atomic<uint64_t> seq;  // 0 while being written
    std::atomic<uint64_t> count;
    std::atomic<uint64_t> kindType;
    std::atomic<uint64_t> opRoot;
  } calls[2];
  struct alignas(64) LlLine {
    std::byte payload[kLlLinePayload];
    std::atomic<uint64_t> seq;
  };
  static_assert(sizeof(LlLine) == 64);
  // The slots every rank reads (gathers), then the ring of the rooted calls' slots: 5 lines each,
  // an odd count, so that the ring's first lines spread over the sets of the L1 cache.
  LlLine ll[kLlGatherSlots][kLlLines];
  LlLine llRooted[kLlRootedSlots][kLlRootedLines];
  // The last low-latency call this rank finished (llFinish): its own line, written once a call.
  alignas(64) std::atomic<uint64_t> llFinished;
  struct BufferSlot {
    std::atomic<uint64_t> seq;  // written last (release): the exchange the slot holds
    PublishedBuffers b;
  } buffers[2];
  // In-place reads of ordinary memory: the owner's pid and the address of its probe word, written
  // before the segment is announced; then this rank's verdict (0 unknown, 1 it reads every peer,
  // 2 it does not), published before the last set-up barrier, and its reason.
  int32_t pid;
  uint64_t processNonce;
  uint64_t probeAddress;
  std::atomic<int32_t> peerReads;
  char peerReadText[256];
  // Group rank 0 only, written before its verdict: cross-memory attach's speed relative to memcpy
  // in thousandths (0: not measured, and then not a reason to stage).
  uint32_t peerReadPermille;
  // Group rank 0 only, written before its verdict: ShmGroupOptions::ranksPerCore.
  uint32_t ranksPerCore;
};

ShmGroup::Header* ShmGroup::header(int r) const {
  static_assert(sizeof(Header) <= kHeaderBytes);
  return static_cast<Header*>(segments_[static_cast<size_t>(r)].data());
}

ShmGroup::ShmGroup(Store& store, int rank, int nranks, const ShmGroupOptions& options)
    : rank_(rank), nranks_(nranks), fifoBytes_(options.fifoBytes), stageSlot_(options.stageBytes / 2) {
  const size_t fifoSlot = sizeof(FifoControl) + fifoBytes_;
  const size_t fifoRegion = nranks > 1 ? fifoSlot * static_cast<size_t>(nranks) : 0;
  segmentBytes_ = kHeaderBytes + fifoRegion + kStageSlots * stageSlot_;
  try {
    mapSegments(store, options);
  } catch (...) {
    // Our own segment goes with segments_; those of peers that died before unlinking theirs (or
    // were killed by the launcher meanwhile) go too: nothing of a failed set-up stays in /dev/shm.
    segments_.clear();
    removeOrphanSegments();
    throw;
  }

  sendPipes_.resize(static_cast<size_t>(nranks));
  recvPipes_.resize(static_cast<size_t>(nranks));
  stages_.resize(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    auto* base = static_cast<std::byte*>(segments_[static_cast<size_t>(r)].data());
    stages_[static_cast<size_t>(r)] = base + kHeaderBytes + fifoRegion;
    if (r == rank || nranks == 1) continue;
    // Pipe rank -> r lives in r's segment, slot `rank`; pipe r -> rank lives in ours, slot `r`.
    std::byte* slotOut = base + kHeaderBytes + fifoSlot * static_cast<size_t>(rank);
    // Every rank reads every other in place, fast enough, or none does (agreePeerReads): payloads
    // sent by address are read by a receiver that may.
    sendPipes_[static_cast<size_t>(r)] =
        std::make_unique<ShmSendPipe>(reinterpret_cast<FifoControl*>(slotOut), slotOut + sizeof(FifoControl),
                                      fifoBytes_, peerReadsFast_ ? options.inPlaceMinBytes : 0);
    auto* ownBase = static_cast<std::byte*>(segments_[static_cast<size_t>(rank)].data());
    std::byte* slotIn = ownBase + kHeaderBytes + fifoSlot * static_cast<size_t>(r);
    recvPipes_[static_cast<size_t>(r)] =
        std::make_unique<ShmRecvPipe>(reinterpret_cast<FifoControl*>(slotIn), slotIn + sizeof(FifoControl),
                                      fifoBytes_, remotePids_[static_cast<size_t>(r)],
                                      strCat("rank ", static_cast<size_t>(r) < options.commRanks.size()
                                                          ? options.commRanks[static_cast<size_t>(r)]
                                                          : r));
  }
  logInfo(Subsys::Shm, "rank ", rank, ": shared memory ready, ", nranks, " segments of ",
          formatBytes(segmentBytes_), " (staging ", formatBytes(2 * stageSlot_), " per rank, ", kStageSlots,
          " slots of ", formatBytes(stageSlot_), ")");
}

void ShmGroup::mapSegments(Store& store, const ShmGroupOptions& options) {
  const int rank = rank_, nranks = nranks_;
  // Segments whose creator died before unlinking them (a job killed during set-up) go first.
  if (int removed = removeOrphanSegments(); removed > 0) {
    logInfo(Subsys::Shm, "rank ", rank, ": removed ", removed,
            " shared memory segment(s) left in /dev/shm by processes that exited");
  }
  // While waiting for the peers, a peer process that exits stops the wait at once.
  const auto watchPeers = [&] {
    for (int r = 0; r < nranks; ++r) {
      const int pid =
          r < static_cast<int>(options.peerPids.size()) ? options.peerPids[static_cast<size_t>(r)] : 0;
      if (r != rank && pid > 0 && processGone(pid)) {
        // A peer that failed publishes why before it exits: its report names the cause.
        if (options.throwIfPeerFailed) options.throwIfPeerFailed();
        fail(chorusRemoteError, strCat("rank ", rank, ": shared-memory setup stopped: rank ", r, " (pid ",
                                       pid, ") died before every rank had mapped every segment"));
      }
    }
  };
  const std::string own = segmentName(options.jobTag, rank);
  ownName_ = own;
  segments_.resize(static_cast<size_t>(nranks));
  try {
    segments_[static_cast<size_t>(rank)] = ShmSegment::create(own, segmentBytes_);
  } catch (const Error& e) {
    fail(e.code(), strCat("rank ", rank, ": ", e.what()));
  }
  auto* ownHeader = static_cast<Header*>(segments_[static_cast<size_t>(rank)].data());
  new (ownHeader) Header{};
  ownHeader->magic = kMagic;
  ownHeader->rank = rank;
  ownHeader->nranks = nranks;
  ownHeader->fifoBytes = fifoBytes_;
  ownHeader->stageBytes = 2 * stageSlot_;
  ownHeader->pid = static_cast<int32_t>(getpid());
  ownHeader->processNonce = processNonce();
  ownHeader->probeAddress = reinterpret_cast<uintptr_t>(peerProbeWord());
  // FIFO control words start at zero: the segment is fresh from posix_fallocate (zero-filled).

  const std::string keyBase = "shm/";
  store.setString(strCat(keyBase, "created/", rank), own);
  waitForRanks(store, keyBase + "created/", nranks, rank, options.timeout, "shared-memory setup", watchPeers);
  for (int r = 0; r < nranks; ++r) {
    if (r == rank) continue;
    const std::string name = store.getString(strCat(keyBase, "created/", r), options.timeout);
    try {
      segments_[static_cast<size_t>(r)] = ShmSegment::open(name, segmentBytes_);
    } catch (const Error&) {
      watchPeers();  // a peer that died (and whose segment is gone) is named as such
      throw;
    }
    Header* h = header(r);
    if (h->magic != kMagic || h->rank != r || h->nranks != nranks) {
      fail(chorusInternalError, strCat("rank ", rank, ": shared memory segment ", name,
                                       " does not belong to rank ", r, " of this communicator"));
    }
  }
  // Released with rank 0's verdict on in-place reads (probePeers), read back in agreePeerReads.
  if (rank == 0) header(0)->ranksPerCore = static_cast<uint32_t>(std::max(options.ranksPerCore, 1));
  probePeers(options.noPeerReads, options.peerReadsRegardless);
  // Everyone has mapped every segment: remove the names so nothing outlives the job, even kill -9.
  store.setString(strCat(keyBase, "mapped/", rank), "1");
  waitForRanks(store, keyBase + "mapped/", nranks, rank, options.timeout, "shared-memory setup", watchPeers);
  segments_[static_cast<size_t>(rank)].unlink();
  agreePeerReads();
}

void ShmGroup::probePeers(const std::string& noPeerReads, bool regardless) {
  remotePids_.assign(static_cast<size_t>(nranks_), 0);
  std::string why;
  bool ok = noPeerReads.empty();
  if (!ok) why = strCat("rank ", rank_, " offers no in-place reads: ", noPeerReads);
  bool anyRemote = false;
  for (int r = 0; r < nranks_; ++r) {
    const Header* h = header(r);
    if (h->pid == static_cast<int32_t>(getpid()) && h->processNonce == processNonce()) continue;
    remotePids_[static_cast<size_t>(r)] = h->pid;
    anyRemote = true;
    std::string cause;
    if (ok && !probePeerMemory(h->pid, h->probeAddress, &cause)) {
      ok = false;
      why = strCat("rank ", rank_, " cannot read rank ", r, "'s memory: ", cause);
    }
  }
  // The single-copy allreduce also writes its peers' outputs (process_vm_writev).
  if (std::string cause; ok && anyRemote && !probeOwnMemoryWrite(&cause)) {
    ok = false;
    why = strCat("rank ", rank_, " cannot write its peers' memory: ", cause);
  }
  Header* own = header(rank_);
  if (rank_ == 0) {
    // Released with the verdict below. Ranks of one process read each other with memcpy: nothing
    // to measure. (Every rank then has a peer of another process, or none has.)
    own->peerReadPermille = 0;
    if (ok && anyRemote && !regardless) {
      own->peerReadPermille = static_cast<uint32_t>(std::clamp(measurePeerReadSpeed() * 1000.0, 1.0, 1e6));
    }
  }
  const size_t n = std::min(why.size(), sizeof own->peerReadText - 1);
  std::memcpy(own->peerReadText, why.data(), n);
  own->peerReadText[n] = '\0';
  own->peerReads.store(ok ? 1 : 2, std::memory_order_release);
}

void ShmGroup::agreePeerReads() {
  // Acquires what rank 0 wrote before its verdict: its staging policy holds for all.
  ranksPerCore_ = header(0)->peerReads.load(std::memory_order_acquire) != 0
                      ? static_cast<int>(std::min<uint32_t>(header(0)->ranksPerCore, 1u << 20))
                      : 0;
  peerReadable_ = true;
  for (int r = 0; r < nranks_ && peerReadable_; ++r) {
    const Header* h = header(r);
    if (h->peerReads.load(std::memory_order_acquire) != 1) {
      peerReadable_ = false;
      peerReadNote_.assign(h->peerReadText, strnlen(h->peerReadText, sizeof h->peerReadText));
    }
  }
  // Acquired with rank 0's verdict above.
  const Header* first = header(0);
  peerReadSpeed_ = peerReadable_ ? first->peerReadPermille / 1000.0 : 0;
  peerReadsFast_ = peerReadable_;
  if (peerReadable_ && first->peerReadPermille != 0) {
    const std::string speed = strCat("cross-memory attach copies at ", first->peerReadPermille / 10,
                                     "% of memcpy's rate here (measured at set-up; single copy pays from ",
                                     static_cast<int>(kMinPeerReadSpeed * 100), "%)");
    if (!peerReadsPay(peerReadSpeed_, false)) {
      peerReadsFast_ = false;
      peerReadNote_ = strCat(speed, "; CHORUS_CMA=1 reads in place anyway");
      logInfo(Subsys::Shm, "rank ", rank_,
              ": collectives stage ordinary buffers, but for the allreduce, all-gather and reduce-scatter, "
              "whose first rank times single copy against staging: ",
              peerReadNote_);
    } else {
      logInfo(Subsys::Shm, "rank ", rank_, ": collectives read ordinary buffers in place: ", speed);
    }
  }
  if (!peerReadable_) {
    logInfo(Subsys::Shm, "rank ", rank_, ": collectives stage ordinary buffers: ", peerReadNote_);
  }
}

ShmGroup::~ShmGroup() = default;

void ShmGroup::setSyncFlag(uint64_t value, uint16_t call) {
  header(rank_)->syncFlag.store(value << 16 | call, std::memory_order_release);
}

uint64_t ShmGroup::syncFlag(int r, uint16_t* call) const {
  const uint64_t word = header(r)->syncFlag.load(std::memory_order_acquire);
  if (call) *call = static_cast<uint16_t>(word);
  return word >> 16;
}

void ShmGroup::publishStagedStreaming(bool streaming) {
  std::atomic<uint32_t>& word = header(rank_)->stagedStreaming;
  const uint32_t v = streaming ? 1 : 0;
  // Stored only when it changes: the peers poll this line for the flag.
  if (word.load(std::memory_order_relaxed) != v) word.store(v, std::memory_order_relaxed);
}

bool ShmGroup::stagedStreaming(int r) const {
  return header(r)->stagedStreaming.load(std::memory_order_relaxed) != 0;
}

void ShmGroup::publishReadPenalty(int sizeClass, double nsPerKiB) {
  if (sizeClass < 0 || sizeClass >= kReadPenaltyClasses || !(nsPerKiB >= 0)) return;
  const double fixed = std::min(nsPerKiB * 16.0, 4.0e9);
  const uint32_t v = static_cast<uint32_t>(fixed) + 1;
  std::atomic<uint32_t>& word = header(rank_)->readPenalty[sizeClass];
  if (word.load(std::memory_order_relaxed) != v) word.store(v, std::memory_order_relaxed);
}

double ShmGroup::readPenalty(int r, int sizeClass) const {
  if (sizeClass < 0 || sizeClass >= kReadPenaltyClasses) return -1;
  const uint32_t v = header(r)->readPenalty[sizeClass].load(std::memory_order_relaxed);
  return v == 0 ? -1 : static_cast<double>(v - 1) / 16.0;
}

void ShmGroup::publishProgress(uint64_t seq, int kind, bool done) {
  Header* h = header(rank_);
  h->progressKind.store(kind, std::memory_order_relaxed);
  h->progress.store(seq * 2 + (done ? 1 : 0), std::memory_order_release);
}

uint64_t ShmGroup::progress(int r, int* kind) const {
  const Header* h = header(r);
  const uint64_t p = h->progress.load(std::memory_order_acquire);
  *kind = h->progressKind.load(std::memory_order_relaxed);
  return p;
}

void ShmGroup::publishFailure(chorusResult_t code, const std::string& text) {
  Header* h = header(rank_);
  if (h->failCode.load(std::memory_order_acquire) != 0) return;
  size_t n = std::min(text.size(), kFailTextBytes - 1);
  std::memcpy(h->failText, text.data(), n);
  h->failText[n] = '\0';
  h->failCode.store(static_cast<uint32_t>(code == chorusSuccess ? chorusRemoteError : code),
                    std::memory_order_release);
}

void ShmGroup::publishFingerprint(const CallFingerprint& f) {
  // A seqlock without fences (ThreadSanitizer does not model them): the fields are stored with
  // release, so the invalidation before them is visible to whoever sees one of them.
  Header::CallSlot& s = header(rank_)->calls[f.seq & 1];
  s.seq.store(0, std::memory_order_relaxed);
  s.count.store(f.count, std::memory_order_release);
  s.kindType.store(uint64_t{static_cast<uint32_t>(f.kind)} << 32 | static_cast<uint32_t>(f.type),
                   std::memory_order_release);
  s.opRoot.store(uint64_t{static_cast<uint32_t>(f.op)} << 32 | static_cast<uint32_t>(f.root),
                 std::memory_order_release);
  s.seq.store(f.seq, std::memory_order_release);
}

bool ShmGroup::fingerprint(int r, uint64_t seq, CallFingerprint* f) const {
  // Acquire loads throughout: the second read of seq cannot move before the fields, and a field
  // of a newer write brings that write's invalidation of seq along.
  const Header::CallSlot& s = header(r)->calls[seq & 1];
  const uint64_t before = s.seq.load(std::memory_order_acquire);
  f->count = s.count.load(std::memory_order_acquire);
  const uint64_t kindType = s.kindType.load(std::memory_order_acquire);
  const uint64_t opRoot = s.opRoot.load(std::memory_order_acquire);
  const uint64_t after = s.seq.load(std::memory_order_acquire);
  f->seq = before;
  f->kind = static_cast<int32_t>(kindType >> 32);
  f->type = static_cast<int32_t>(static_cast<uint32_t>(kindType));
  f->op = static_cast<int32_t>(opRoot >> 32);
  f->root = static_cast<int32_t>(static_cast<uint32_t>(opRoot));
  return before == seq && after == before;
}

// A message is the 8-byte call word, then the data: line 0 holds the word and 48 data bytes, every
// later line 56 data bytes.
namespace {
constexpr size_t kLlFirstData = ShmGroup::kLlLinePayload - sizeof(uint64_t);
static_assert(ShmGroup::kLlRootedLines % 2 == 1);
size_t llLineCount(size_t bytes) {
  return 1 + (bytes > kLlFirstData
                  ? (bytes - kLlFirstData + ShmGroup::kLlLinePayload - 1) / ShmGroup::kLlLinePayload
                  : 0);
}
}  // namespace

void* ShmGroup::llSlotLines(int r, int slot) const {
  Header* h = header(r);
  return slot < kLlGatherSlots ? h->ll[slot] : h->llRooted[slot - kLlGatherSlots];
}

void ShmGroup::llPublish(int slot, uint64_t seq, uint64_t call, const void* data, size_t bytes) {
  auto* lines = static_cast<Header::LlLine*>(llSlotLines(rank_, slot));
  const auto* src = static_cast<const std::byte*>(data);
  size_t n = std::min(bytes, kLlFirstData);
  std::memcpy(lines[0].payload, &call, sizeof call);
  if (n) std::memcpy(lines[0].payload + sizeof call, src, n);
  lines[0].seq.store(seq, std::memory_order_release);
  src += n;
  bytes -= n;
  for (size_t i = 1; bytes > 0; ++i) {
    n = std::min(bytes, kLlLinePayload);
    std::memcpy(lines[i].payload, src, n);
    lines[i].seq.store(seq, std::memory_order_release);
    src += n;
    bytes -= n;
  }
}

bool ShmGroup::llArrived(int r, int slot, uint64_t seq, size_t bytes) const {
  const auto* lines = static_cast<const Header::LlLine*>(llSlotLines(r, slot));
  const size_t count = llLineCount(bytes);
  for (size_t i = 0; i < count; ++i) {
    if (lines[i].seq.load(std::memory_order_acquire) != seq) return false;
  }
  return true;
}

uint64_t ShmGroup::llCopy(int r, int slot, void* out, size_t bytes) const {
  const auto* lines = static_cast<const Header::LlLine*>(llSlotLines(r, slot));
  auto* dst = static_cast<std::byte*>(out);
  uint64_t call;
  std::memcpy(&call, lines[0].payload, sizeof call);
  size_t n = std::min(bytes, kLlFirstData);
  if (n) std::memcpy(dst, lines[0].payload + sizeof call, n);
  dst += n;
  bytes -= n;
  for (size_t i = 1; bytes > 0; ++i) {
    n = std::min(bytes, kLlLinePayload);
    std::memcpy(dst, lines[i].payload, n);
    dst += n;
    bytes -= n;
  }
  return call;
}

void ShmGroup::llPrepare(int slot, size_t bytes) const {
  // Publishing into lines the peers read last time first takes each line back from their caches,
  // one transfer per line on the critical path. Owning them ahead (PREFETCHW) pays from 7 lines:
  // a peer that is done first already polls line 0 of this slot, and taking that line from it
  // costs more than it saves for short messages. EPYC VM, 2 ranks, median us without / with
  // (bench/ab, CHORUS_ALGO unset: ll), vCPUs on one core complex: 256 B 0.161 / 0.174, 384 B
  // 0.185 / 0.186, 448 B 0.208 / 0.187, 512 B 0.210 / 0.196, 1 KiB 0.266 / 0.244; on two:
  // 256 B 0.467 / 0.471, 512 B 0.664 / 0.399, 1 KiB 0.848 / 0.422.
  constexpr size_t kFromLines = 7;
  const size_t count = llLineCount(bytes);
  if (count < kFromLines) return;
  auto* lines = static_cast<Header::LlLine*>(llSlotLines(rank_, slot));
  for (size_t i = 0; i < count; ++i) prefetchForWrite(&lines[i]);
}

void ShmGroup::llFinish(uint64_t seq) { header(rank_)->llFinished.store(seq, std::memory_order_release); }

uint64_t ShmGroup::llFinished(int r) const { return header(r)->llFinished.load(std::memory_order_acquire); }

void ShmGroup::llPrefetch(int r, int slot, size_t bytes) const {
  const auto* lines = static_cast<const Header::LlLine*>(llSlotLines(r, slot));
  const size_t count = llLineCount(bytes);
  for (size_t i = 0; i < count; ++i) __builtin_prefetch(&lines[i], 0, 3);
}

void ShmGroup::publishBuffers(uint64_t seq, const PublishedBuffers& b) {
  Header::BufferSlot& slot = header(rank_)->buffers[seq & 1];
  slot.b = b;
  slot.seq.store(seq, std::memory_order_release);
}

uint64_t ShmGroup::buffersSeq(int r, uint64_t seq) const {
  return header(r)->buffers[seq & 1].seq.load(std::memory_order_acquire);
}

bool ShmGroup::buffers(int r, uint64_t seq, PublishedBuffers* b) const {
  const Header::BufferSlot& slot = header(r)->buffers[seq & 1];
  if (slot.seq.load(std::memory_order_acquire) != seq) return false;
  *b = slot.b;
  return true;
}

int ShmGroup::findPeerFailure(chorusResult_t* code, std::string* text) {
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    Header* h = header(r);
    if (uint32_t c = h->failCode.load(std::memory_order_acquire); c != 0) {
      if (code) *code = static_cast<chorusResult_t>(c);
      if (text) *text = std::string(h->failText, strnlen(h->failText, kFailTextBytes));
      return r;
    }
  }
  return -1;
}

}  // namespace chorus::transport
