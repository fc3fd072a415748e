// One-sided transfers over windows: see core/window.hpp.
#include "core/window.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "base/error.hpp"
#include "core/api.hpp"
#include "core/comm_impl.hpp"
#include "core/group.hpp"
#include "topology/comm_topology.hpp"
#include "transports/shm/shm_memory.hpp"

struct chorusWindow {
  chorus::onesided::State* owner = nullptr;
  int id = 0;  // registration number on the communicator, for messages
  std::vector<std::byte*> base;
  std::vector<size_t> size;
  // Peers' allocations mapped for this window; never evicted (the pointers handed out stay valid).
  chorus::transport::PeerMappings mappings{SIZE_MAX};
};

namespace chorus::onesided {
namespace {

using transport::SharedBufferRef;

// What each rank contributes to a registration.
struct Entry {
  SharedBufferRef buffer;   // invalid when not in chorusMemAlloc memory
  SharedBufferRef signals;  // the rank's signal table (valid on every rank)
  uint64_t bytes = 0;       // registered size
  int32_t pid = 0;
  int32_t ok = 0;  // 1: the buffer lies in chorusMemAlloc memory
};

std::mutex gWindowsMu;
std::unordered_set<chorusWindow*>& liveWindows() {
  static auto* set = new std::unordered_set<chorusWindow*>();
  return *set;
}

chorusWindow* live(chorusWindow_t win, const char* call) {
  if (win == nullptr) failInvalid(call, ": window is NULL");
  std::lock_guard lk(gWindowsMu);
  if (!liveWindows().count(win))
    failInvalid(call, ": not a registered window (deregistered, or its communicator was destroyed)");
  return win;
}

std::vector<Entry> gatherEntries(const std::shared_ptr<CommImpl>& impl, const Entry& mine) {
  std::vector<Entry> all(static_cast<size_t>(impl->size()));
  api::runBlocking(impl, api::makeOp(OpKind::AllGather, &mine, all.data(), sizeof(Entry), DataType::Uint8));
  return all;
}

}  // namespace

class State {
 public:
  State(int rank, int size)
      : rank_(rank), size_(size), consumed_(static_cast<size_t>(size) * CHORUS_SIGNALS) {
    table_ = static_cast<uint64_t*>(transport::sharedAlloc(tableBytes()));
  }
  ~State() {
    for (int fd : pidfds_)
      if (fd >= 0) close(fd);
    for (chorusWindow* w : windows_) {
      std::lock_guard lk(gWindowsMu);
      liveWindows().erase(w);
      delete w;
    }
    try {
      transport::sharedFree(table_);
    } catch (...) {
    }
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  size_t tableBytes() const { return static_cast<size_t>(size_) * CHORUS_SIGNALS * sizeof(uint64_t); }
  uint64_t* table() const { return table_; }
  // Called once, in the first registration, with every rank's entry.
  void connect(const std::vector<Entry>& all) {
    peerTables_.resize(all.size());
    pids_.resize(all.size());
    pidfds_.assign(all.size(), -1);
    for (size_t r = 0; r < all.size(); ++r) {
      peerTables_[r] = reinterpret_cast<uint64_t*>(tableMappings_.map(all[r].signals, static_cast<int>(r)));
      pids_[r] = all[r].pid;
#ifdef SYS_pidfd_open
      // Readable once the process has ended, zombie or not (kill(pid, 0) still finds a zombie).
      if (all[r].pid != getpid()) pidfds_[r] = static_cast<int>(syscall(SYS_pidfd_open, all[r].pid, 0));
#endif
    }
    connected_ = true;
  }
  bool connected() const { return connected_; }

  void add(chorusWindow* w) {
    w->id = nextId_++;
    windows_.push_back(w);
    std::lock_guard lk(gWindowsMu);
    liveWindows().insert(w);
  }
  void remove(chorusWindow* w) {
    std::erase(windows_, w);
    {
      std::lock_guard lk(gWindowsMu);
      liveWindows().erase(w);
    }
    delete w;
  }

  void raise(int peer, int signal) {
    std::atomic_ref<uint64_t> slot(peerTables_[static_cast<size_t>(peer)][slotOf(rank_, signal)]);
    slot.fetch_add(1, std::memory_order_release);
  }
  uint64_t arrived(int peer, int signal) const {
    return std::atomic_ref<uint64_t>(table_[slotOf(peer, signal)]).load(std::memory_order_acquire);
  }
  uint64_t& consumed(int peer, int signal) { return consumed_[slotOf(peer, signal)]; }
  bool peerDied(int peer) const {
    const int32_t pid = pids_[static_cast<size_t>(peer)];
    if (pid == getpid()) return false;
    if (const int fd = pidfds_[static_cast<size_t>(peer)]; fd >= 0) {
      struct pollfd p {
        fd, POLLIN, 0
      };
      return poll(&p, 1, 0) > 0;
    }
    return kill(pid, 0) != 0 && errno == ESRCH;
  }
  int32_t pid(int peer) const { return pids_[static_cast<size_t>(peer)]; }

 private:
  static size_t slotOf(int src, int signal) {
    return static_cast<size_t>(src) * CHORUS_SIGNALS + static_cast<size_t>(signal);
  }
  int rank_;
  int size_;
  uint64_t* table_ = nullptr;  // [source rank][signal], raised by the peers
  std::vector<uint64_t> consumed_;
  transport::PeerMappings tableMappings_{SIZE_MAX};
  std::vector<uint64_t*> peerTables_;
  std::vector<int32_t> pids_;
  std::vector<int> pidfds_;  // of peers in other processes, -1 where pidfd_open is not available
  bool connected_ = false;
  std::vector<chorusWindow*> windows_;
  int nextId_ = 0;
};

chorusWindow_t registerWindow(const std::shared_ptr<CommImpl>& impl, std::shared_ptr<State>& state,
                              void* buff, size_t size) {
  const int rank = impl->rank();
  if (group::active()) fail(chorusInvalidUsage, "chorusWindowRegister cannot be called inside a group");
  if (size > 0 && buff == nullptr) failInvalid("chorusWindowRegister: rank ", rank, ": buff is NULL");
  impl->checkUsable();
  // Every rank sees the same placement, so every rank refuses alike.
  const topo::CommTopology& topology = impl->topology();
  for (int r = 0; r < impl->size(); ++r) {
    if (topology.ranks[static_cast<size_t>(r)].host != topology.ranks[static_cast<size_t>(rank)].host) {
      fail(chorusInvalidUsage, strCat("chorusWindowRegister: rank ", r, " is on another host than rank ",
                                      rank, " (", topology.shape(),
                                      "): windows need every rank on one host; one-sided transfers over "
                                      "the network are not built"));
    }
  }
  if (!state) state = std::make_shared<State>(rank, impl->size());
  Entry mine;
  mine.buffer = size > 0 ? transport::findShared(buff, size) : SharedBufferRef{};
  mine.ok = size == 0 || mine.buffer.valid() ? 1 : 0;
  mine.signals = transport::findShared(state->table(), state->tableBytes());
  mine.bytes = size;
  mine.pid = static_cast<int32_t>(getpid());
  const std::vector<Entry> all = gatherEntries(impl, mine);
  std::string bad;
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].ok) bad += strCat(bad.empty() ? "" : ", ", r);
  if (!bad.empty()) {
    failInvalid("chorusWindowRegister: the buffer of rank(s) ", bad,
                " is not in memory from chorusMemAlloc (ncclMemAlloc): windows must be, so that the peers "
                "can map it");
  }
  if (!state->connected()) state->connect(all);
  auto* w = new chorusWindow;
  w->owner = state.get();
  w->base.resize(all.size());
  w->size.resize(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    w->size[r] = all[r].bytes;
    if (static_cast<int>(r) == rank)
      w->base[r] = static_cast<std::byte*>(buff);
    else if (all[r].bytes > 0)
      w->base[r] = w->mappings.map(all[r].buffer, static_cast<int>(r));
  }
  state->add(w);
  return w;
}

void deregisterWindow(const std::shared_ptr<CommImpl>& impl, State* state, chorusWindow_t win) {
  chorusWindow* w = live(win, "chorusWindowDeregister");
  if (w->owner != state)
    fail(chorusInvalidUsage, "chorusWindowDeregister: the window was registered on another communicator");
  if (group::active()) fail(chorusInvalidUsage, "chorusWindowDeregister cannot be called inside a group");
  api::runBlocking(impl, api::makeOp(OpKind::Barrier, nullptr, nullptr, 0, DataType::Uint8));
  state->remove(w);
}

void peerPointer(chorusWindow_t win, int peer, void** ptr, size_t* size) {
  chorusWindow* w = live(win, "chorusWindowPeerPointer");
  if (!ptr) failInvalid("chorusWindowPeerPointer: ptr is NULL");
  if (peer < 0 || peer >= static_cast<int>(w->base.size()))
    failInvalid("chorusWindowPeerPointer: peer ", peer, " is not a rank of the window's ", w->base.size());
  *ptr = w->base[static_cast<size_t>(peer)];
  if (size) *size = w->size[static_cast<size_t>(peer)];
}

namespace {
void checkPeerSignal(CommImpl& impl, State* state, const char* call, int peer, int signal) {
  if (!state || !state->connected())
    fail(chorusInvalidUsage, strCat(call, ": rank ", impl.rank(),
                                    ": the communicator has no window yet (signals exist from the first "
                                    "chorusWindowRegister on)"));
  if (peer < 0 || peer >= impl.size())
    failInvalid(call, ": rank ", impl.rank(), ": peer ", peer, " is not a rank of ", impl.size());
  if (signal < 0 || signal >= CHORUS_SIGNALS)
    failInvalid(call, ": rank ", impl.rank(), ": signal ", signal, " is not in [0, ", CHORUS_SIGNALS, ")");
}
}  // namespace

void putSignal(CommImpl& impl, State* state, const void* src, size_t bytes, int peer, chorusWindow_t win,
               size_t offset, int signal) {
  const char* call = "chorusPutSignal";
  impl.checkUsable();
  if (!state || !state->connected())
    fail(chorusInvalidUsage,
         strCat(call, ": rank ", impl.rank(), ": the communicator has no window yet (register one first)"));
  if (peer < 0 || peer >= impl.size())
    failInvalid(call, ": rank ", impl.rank(), ": peer ", peer, " is not a rank of ", impl.size());
  if (signal != -1) checkPeerSignal(impl, state, call, peer, signal);
  if (bytes > 0) {
    chorusWindow* w = live(win, call);
    if (w->owner != state)
      fail(chorusInvalidUsage, strCat(call, ": the window belongs to another communicator"));
    if (src == nullptr) failInvalid(call, ": rank ", impl.rank(), ": src is NULL");
    const size_t have = w->size[static_cast<size_t>(peer)];
    if (offset > have || bytes > have - offset)
      failInvalid(call, ": rank ", impl.rank(), ": ", bytes, " bytes at offset ", offset,
                  " do not fit in rank ", peer, "'s buffer of window #", w->id, " (", have, " bytes)");
    std::memcpy(w->base[static_cast<size_t>(peer)] + offset, src, bytes);
  }
  if (signal != -1) state->raise(peer, signal);
}

void waitSignal(CommImpl& impl, State* state, int peer, int signal, uint64_t count) {
  const char* call = "chorusWaitSignal";
  checkPeerSignal(impl, state, call, peer, signal);
  uint64_t& consumed = state->consumed(peer, signal);
  const uint64_t want = consumed + count;
  std::chrono::milliseconds timeout = impl.callTimeout();
  if (timeout.count() == 0) timeout = impl.config().timeout;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t spins = 0; state->arrived(peer, signal) < want; ++spins) {
    if (spins < 2000) continue;
    impl.checkUsable();
    if (state->peerDied(peer))
      fail(chorusRemoteError,
           strCat(call, ": rank ", impl.rank(), ": rank ", peer, " (pid ", state->pid(peer),
                  ") died before raising signal ", signal, " ", count, " time(s)"));
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited > timeout) {
      fail(chorusTimeout,
           strCat(call, ": rank ", impl.rank(), " waited ",
                  std::chrono::duration_cast<std::chrono::milliseconds>(waited).count(), " ms for signal ",
                  signal, " from rank ", peer, " ", count, " time(s); ",
                  state->arrived(peer, signal) - consumed, " arrived (timeout ", timeout.count(), " ms)"));
    }
    if (spins < 20000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  consumed = want;
}

void release(std::shared_ptr<State>& state) { state.reset(); }

}  // namespace chorus::onesided
