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

/// Implemented by the communicator: is it still safe to keep waiting?
class Health {
 public:
  virtual ~Health() = default;
  /// Cheap check, called often (an atomic load).
  virtual bool abortRequested() const = 0;
  /// Thorough check, called every few milliseconds while idle: throws chorus::Error when the
  /// communicator was aborted, a peer published a failure, or a peer process died.
  virtual void checkHealth() = 0;
};

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class Waiter {
 public:
  /// `spinPolls`: idle polls spent spinning before yielding (0 when ranks outnumber cores: a
  /// spinning rank would only burn the time slice of the peer it waits for).
  Waiter(Health& health, Clock::time_point deadline, std::chrono::milliseconds timeout, uint32_t spinPolls = 256)
      : health_(health), deadline_(deadline), timeout_(timeout), spinPolls_(spinPolls) {}

  /// Call after a poll that made progress.
  void progressed() { idleCount_ = 0; }

  /// Call after a poll that made no progress. `describe` says what is pending (for errors).
  template <typename Describe>
  void idle(Describe&& describe) {
    if (++idleCount_ <= spinPolls_) {
      cpuRelax();
      return;
    }
    slowIdle(&invoke<std::remove_reference_t<Describe>>, &describe);
  }

 private:
  template <typename F>
  static std::string invoke(const void* f) {
    return (*static_cast<const F*>(f))();
  }
  void slowIdle(std::string (*describe)(const void*), const void* ctx);

  Health& health_;
  Clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
  uint32_t spinPolls_;
  uint32_t idleCount_ = 0;
  Clock::time_point idleSince_{};
  Clock::time_point lastHealthCheck_{};
};

}  // namespace chorus::engine
