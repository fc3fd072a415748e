// Core-to-core latency (see latency.hpp).
#include "latency.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "affinity.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace chorus_membw {
namespace {

using Clock = std::chrono::steady_clock;

// 128 bytes apart, not only 64: Intel's adjacent-line prefetcher fetches cache lines in pairs, which
// would make two flags on neighbouring lines share traffic.
constexpr size_t kFlagAlign = 128;

struct SpinFlags {
  alignas(kFlagAlign) std::atomic<uint64_t> ping{0};
  alignas(kFlagAlign) std::atomic<uint64_t> pong{0};
};

struct FutexWords {
  alignas(kFlagAlign) uint32_t ping = 0;
  alignas(kFlagAlign) uint32_t pong = 0;
};

constexpr uint64_t kSpinStop = UINT64_MAX;
constexpr uint32_t kFutexStop = UINT32_MAX;

inline void relax(bool pause) {
#if defined(__x86_64__) || defined(__i386__)
  if (pause) _mm_pause();
#else
  (void)pause;
#endif
}

Distribution summarize(std::vector<double> v) {
  Distribution d;
  d.samples = v.size();
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  d.min = v.front();
  d.median = v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  d.p90 = v[std::min(v.size() - 1, v.size() * 9 / 10)];
  return d;
}

void futexWait(uint32_t* word, uint32_t expected) {
  // Returns at once (EAGAIN) if *word no longer holds `expected`; spurious returns are fine, as
  // every caller re-checks the word.
  syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futexWake(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0); }

}  // namespace

Distribution spinRoundTripNs(int cpuA, int cpuB, bool pause, size_t batches, size_t perBatch,
                             double budgetSeconds) {
  SpinFlags flags;
  std::vector<double> samples;
  samples.reserve(batches);

  std::thread echo([&] {
    pinThisThread(cpuB);
    uint64_t expect = 1;
    for (;;) {
      uint64_t seen;
      while ((seen = flags.ping.load(std::memory_order_acquire)) < expect) relax(pause);
      if (seen == kSpinStop) break;
      flags.pong.store(seen, std::memory_order_release);
      expect = seen + 1;
    }
  });
  std::thread initiator([&] {
    pinThisThread(cpuA);
    uint64_t seq = 0;
    auto roundTrip = [&] {
      ++seq;
      flags.ping.store(seq, std::memory_order_release);
      while (flags.pong.load(std::memory_order_acquire) != seq) relax(pause);
    };
    for (size_t i = 0; i < perBatch * 10; ++i) roundTrip();  // warm-up: both threads running
    const auto deadline = Clock::now() + std::chrono::duration<double>(budgetSeconds);
    for (size_t batch = 0; batch < batches; ++batch) {
      const auto start = Clock::now();
      for (size_t i = 0; i < perBatch; ++i) roundTrip();
      const auto stop = Clock::now();
      samples.push_back(std::chrono::duration<double, std::nano>(stop - start).count() /
                        static_cast<double>(perBatch));
      if (stop > deadline) break;
    }
    flags.ping.store(kSpinStop, std::memory_order_release);
  });
  initiator.join();
  echo.join();
  return summarize(std::move(samples));
}

Distribution futexRoundTripUs(int cpuA, int cpuB, size_t samplesWanted, double budgetSeconds) {
  FutexWords words;
  std::atomic_ref<uint32_t> ping(words.ping);
  std::atomic_ref<uint32_t> pong(words.pong);
  std::vector<double> samples;
  samples.reserve(samplesWanted);

  std::thread echo([&] {
    pinThisThread(cpuB);
    uint32_t expect = 1;
    for (;;) {
      uint32_t seen;
      while ((seen = ping.load(std::memory_order_acquire)) < expect) futexWait(&words.ping, seen);
      if (seen == kFutexStop) break;
      pong.store(seen, std::memory_order_release);
      futexWake(&words.pong);
      expect = seen + 1;
    }
  });
  std::thread initiator([&] {
    pinThisThread(cpuA);
    uint32_t seq = 0;
    auto roundTrip = [&] {
      ++seq;
      ping.store(seq, std::memory_order_release);
      futexWake(&words.ping);
      uint32_t seen;
      while ((seen = pong.load(std::memory_order_acquire)) != seq) futexWait(&words.pong, seen);
    };
    for (int i = 0; i < 100; ++i) roundTrip();  // warm-up
    const auto deadline = Clock::now() + std::chrono::duration<double>(budgetSeconds);
    for (size_t i = 0; i < samplesWanted; ++i) {
      const auto start = Clock::now();
      roundTrip();
      const auto stop = Clock::now();
      samples.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
      if (stop > deadline) break;
    }
    ping.store(kFutexStop, std::memory_order_release);
    futexWake(&words.ping);
  });
  initiator.join();
  echo.join();
  return summarize(std::move(samples));
}

}  // namespace chorus_membw
