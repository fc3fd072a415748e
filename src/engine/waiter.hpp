// How the engine waits: spin, then yield, then sleep — never blocking without a deadline.
//
// Spinning gives the lowest latency when every rank has a core; yielding and then sleeping keeps
// oversubscribed jobs (4 ranks on 2 cores) from collapsing. While idle the waiter periodically asks
// the communicator whether it was aborted or a peer died, and enforces the deadline, throwing an
// Error that says what was still pending.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace chorus::engine {

using Clock = std::chrono::steady_clock;

/// Clock::now() as of the kernel's last timer tick (CLOCK_MONOTONIC_COARSE, the clock steady_clock
/// reads, but without reading the time-stamp counter): 3 ns a read instead of 21 on the development
/// VM. Never ahead of the exact time; behind it by about a tick (up to 1.2 ticks measured there,
/// where timekeeping runs a little after the tick), so a deadline from it adds two ticks.
Clock::time_point coarseNow();
/// The coarse clock's resolution, the kernel's timer tick (1-10 ms).
Clock::duration coarseTick();

/// A non-owning reference to a callable (valid while the callable lives).
template <typename Sig>
class FunctionRef;
template <typename R, typename... A>
class FunctionRef<R(A...)> {
 public:
  template <typename F>
  FunctionRef(F& f)
      : obj_(&f), call_([](const void* o, A... a) -> R { return (*static_cast<const F*>(o))(a...); }) {}
  R operator()(A... a) const { return call_(obj_, a...); }

 private:
  const void* obj_;
  R (*call_)(const void*, A...);
};

/// Implemented by the communicator: is it still safe to keep waiting?
class Health {
 public:
  virtual ~Health() = default;
  /// Cheap check, called often (an atomic load).
  virtual bool abortRequested() const = 0;
  /// Thorough check, called every few milliseconds while idle: throws chorus::Error when the
  /// communicator was aborted, a peer published a failure, or the process of a peer that
  /// `waitingOn(rank)` says we still need has died (a peer that finished and exited is fine).
  virtual void checkHealth(FunctionRef<bool(int)> waitingOn) = 0;
  /// How an idle waiter sleeps (a transport with sockets waits for them instead).
  virtual void waitIdle(std::chrono::microseconds duration);
};

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// How a rank passes the time while it waits for its peers (CHORUS_WAIT; the communicator picks
/// one by ranks per core, waitPolicyFor):
///   Spin:     pause instructions only, never giving up the core (deadline and health still checked);
///   Adaptive: spin kSpinPolls polls, yield for 2 ms, then sleep 20-500 us (the default with a
///             core per rank);
///   Yield:    sched_yield from the first idle poll, for 2 ms, then sleep (ranks outnumber cores:
///             a spinning rank only burns the time slice of the peer it waits for);
///   Sleep:    sleep from the first idle poll.
enum class WaitPolicy { Spin, Adaptive, Yield, Sleep };
const char* waitPolicyName(WaitPolicy p);
/// The policy for `ranks` ranks of this host on `cores` cores: `setting` (CHORUS_WAIT) when not
/// "" or "auto"; else Adaptive with a core per rank, Yield otherwise (docs/performance.md,
/// "Waiting").
WaitPolicy waitPolicyFor(const std::string& setting, int ranks, int cores);

class Waiter {
 public:
  static constexpr uint32_t kSpinPolls = 256;
  Waiter(Health& health, Clock::time_point deadline, std::chrono::milliseconds timeout,
         WaitPolicy policy = WaitPolicy::Adaptive)
      : health_(health),
        deadline_(deadline),
        timeout_(timeout),
        policy_(policy),
        spinPolls_(policy == WaitPolicy::Adaptive ? kSpinPolls : 0) {}

  /// Call after a poll that made progress.
  void progressed() { idleCount_ = 0; }

  /// After an error reading a peer's memory: throws the failure a peer published (or the abort)
  /// if there is one, since a peer that failed first and then exited explains the error better
  /// than its exit does. Returns otherwise.
  void explainPeerError() {
    auto none = [](int) { return false; };
    health_.checkHealth(FunctionRef<bool(int)>(none));
  }

  /// Call after a poll that made no progress. `describe()` says what is pending (for errors);
  /// `waitingOn(rank)` whether that rank is one we still need something from.
  template <typename Describe, typename WaitingOn>
  void idle(Describe&& describe, WaitingOn&& waitingOn) {
    if (++idleCount_ <= spinPolls_) {
      cpuRelax();
      return;
    }
    slowIdle(FunctionRef<std::string()>(describe), FunctionRef<bool(int)>(waitingOn));
  }

 private:
  void slowIdle(FunctionRef<std::string()> describe, FunctionRef<bool(int)> waitingOn);

  Health& health_;
  Clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
  WaitPolicy policy_;
  uint32_t spinPolls_;
  uint32_t idleCount_ = 0;
  Clock::time_point idleSince_{};
  Clock::time_point lastHealthCheck_{};
};

}  // namespace chorus::engine
