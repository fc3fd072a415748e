#include "engine/waiter.hpp"

#include <sched.h>
#include <time.h>

#include "base/error.hpp"

namespace chorus::engine {

namespace {
// After this long idle, yield turns into sleeping (growing from kMinSleep to kMaxSleep).
constexpr auto kYieldFor = std::chrono::microseconds(2000);
constexpr auto kMinSleep = std::chrono::microseconds(20);
constexpr auto kMaxSleep = std::chrono::microseconds(500);
constexpr auto kHealthEvery = std::chrono::milliseconds(10);
}  // namespace

Clock::time_point coarseNow() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(ts.tv_sec) +
                                                                       std::chrono::nanoseconds(ts.tv_nsec)));
}

Clock::duration coarseTick() {
  static const Clock::duration tick = [] {
    struct timespec res {};
    clock_getres(CLOCK_MONOTONIC_COARSE, &res);
    return std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(res.tv_sec) +
                                                       std::chrono::nanoseconds(res.tv_nsec));
  }();
  return tick;
}

const char* waitPolicyName(WaitPolicy p) {
  switch (p) {
    case WaitPolicy::Spin:
      return "spin";
    case WaitPolicy::Adaptive:
      return "adaptive";
    case WaitPolicy::Yield:
      return "yield";
    case WaitPolicy::Sleep:
      return "sleep";
  }
  return "?";
}

WaitPolicy waitPolicyFor(const std::string& setting, int ranks, int cores) {
  if (setting == "spin") return WaitPolicy::Spin;
  if (setting == "adaptive") return WaitPolicy::Adaptive;
  if (setting == "yield") return WaitPolicy::Yield;
  if (setting == "sleep") return WaitPolicy::Sleep;
  return ranks > cores ? WaitPolicy::Yield : WaitPolicy::Adaptive;
}

void Waiter::slowIdle(FunctionRef<std::string()> describe, FunctionRef<bool(int)> waitingOn) {
  if (health_.abortRequested()) health_.checkHealth(waitingOn);
  Clock::time_point now = Clock::now();
  if (idleCount_ == spinPolls_ + 1) {
    idleSince_ = now;
    if (lastHealthCheck_ == Clock::time_point{}) lastHealthCheck_ = now;
  }
  if (now - lastHealthCheck_ >= kHealthEvery) {
    lastHealthCheck_ = now;
    health_.checkHealth(waitingOn);
  }
  if (now >= deadline_) {
    // A peer that failed (or died) meanwhile explains more than the wait: after this rank was
    // stopped (SIGSTOP) past its deadline, say, the peers' published failure is the news.
    health_.checkHealth(waitingOn);
    fail(chorusTimeout, strCat(describe(), " (timed out after ", timeout_.count(),
                               " ms; CHORUS_TIMEOUT or Config::timeout sets the limit)"));
  }
  if (policy_ == WaitPolicy::Spin) {
    cpuRelax();
    return;
  }
  auto idleFor = now - idleSince_;
  if (idleFor < kYieldFor && policy_ != WaitPolicy::Sleep) {
    sched_yield();
    return;
  }
  auto sleepFor = kMinSleep * (1 + (idleFor - kYieldFor) / std::chrono::milliseconds(5));
  if (sleepFor > kMaxSleep) sleepFor = kMaxSleep;
  health_.waitIdle(std::chrono::duration_cast<std::chrono::microseconds>(sleepFor));
}

void Health::waitIdle(std::chrono::microseconds duration) {
  struct timespec ts {};
  ts.tv_nsec = std::chrono::duration_cast<std::chrono::nanoseconds>(duration).count();
  nanosleep(&ts, nullptr);
}

}  // namespace chorus::engine
