// Core-to-core latency (see latency.hpp).
#include "latency.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "affinity.hpp"
#include "kernels.hpp"

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

namespace {

// Two threads meeting: each publishes how many times it has arrived (on a line of its own) and
// waits for the other to have arrived as often.
struct PairBarrier {
  struct alignas(kFlagAlign) Count {
    std::atomic<uint64_t> value{0};
  };
  Count arrived[2];
  void arriveAndWait(int me, uint64_t& count) {
    ++count;
    arrived[me].value.store(count, std::memory_order_release);
    while (arrived[1 - me].value.load(std::memory_order_acquire) < count) relax(true);
  }
};

// Bytes of a block that carry the exchange's stamp: its first and last 8.
void stamp(std::byte* block, size_t bytes, uint64_t value) {
  std::memcpy(block, &value, sizeof(value));
  std::memcpy(block + bytes - sizeof(value), &value, sizeof(value));
}

// A buffer that starts on a page boundary (so its page offset is 0), filled on allocation by the
// thread that calls allocate().
class PageBuffer {
 public:
  void allocate(size_t bytes, std::byte fill) {
    constexpr size_t kPage = 4096;
    data_.reset(static_cast<std::byte*>(std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage)));
    if (!data_) throw std::bad_alloc();
    std::memset(data_.get(), static_cast<int>(fill), bytes);
  }
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
};

bool stamped(const std::byte* block, size_t bytes, uint64_t value) {
  uint64_t head, tail;
  std::memcpy(&head, block, sizeof(head));
  std::memcpy(&tail, block + bytes - sizeof(tail), sizeof(tail));
  return head == value && tail == value;
}

}  // namespace

Handoff handoffCopyGBps(int cpuA, int cpuB, size_t blockBytes, size_t exchanges, double budgetSeconds) {
  Handoff result;
  blockBytes = std::max<size_t>(blockBytes / 64 * 64, 64);
  result.blockBytes = blockBytes;
  // Per thread: a private source, the staging buffer the other reads, a private destination; each
  // from the start of a page (a block's first line at the same page offset in all three).
  struct Buffers {
    PageBuffer source, staging, destination;
  };
  Buffers buf[2];
  PairBarrier barrier;
  std::vector<double> writes, storeWrites, reads;
  writes.reserve(exchanges);
  storeWrites.reserve(exchanges);
  reads.reserve(2 * exchanges);
  std::atomic<bool> ok{true};
  std::atomic<bool> stop{false};
  const double counted = 4.0 * static_cast<double>(blockBytes);  // 2 threads x (read + written)

  auto body = [&](int me, int cpu) {
    pinThisThread(cpu);
    Buffers& mine = buf[me];
    // Each thread first touches its own buffers (so that their pages sit near its CPU where memory
    // is NUMA).
    mine.source.allocate(blockBytes, std::byte{static_cast<unsigned char>(0x40 + me)});
    mine.staging.allocate(blockBytes, std::byte{0});
    mine.destination.allocate(blockBytes, std::byte{0});
    uint64_t arrivals = 0;
    barrier.arriveAndWait(me, arrivals);  // every buffer allocated
    const Buffers& peer = buf[1 - me];
    const auto deadline = Clock::now() + std::chrono::duration<double>(budgetSeconds);
    // Two untimed exchanges first: the staging lines then sit in the other core's cache, as
    // between the chunks of a collective. Then memcpy and vector stores in turn.
    for (size_t i = 0; i < 2 * exchanges + 2; ++i) {
      const uint64_t value = (static_cast<uint64_t>(i) << 1) | static_cast<uint64_t>(me);
      const bool vectorStores = i % 2 == 1;
      stamp(mine.source.data(), blockBytes, value);
      barrier.arriveAndWait(me, arrivals);  // start
      const auto start = Clock::now();
      if (vectorStores) {
        storeCopy(mine.staging.data(), mine.source.data(), blockBytes);
      } else {
        std::memcpy(mine.staging.data(), mine.source.data(), blockBytes);
      }
      barrier.arriveAndWait(me, arrivals);  // both blocks staged
      const auto staged = Clock::now();
      std::memcpy(mine.destination.data(), peer.staging.data(), blockBytes);
      barrier.arriveAndWait(me, arrivals);  // both blocks read
      const auto done = Clock::now();
      const uint64_t peerValue = (static_cast<uint64_t>(i) << 1) | static_cast<uint64_t>(1 - me);
      if (!stamped(mine.destination.data(), blockBytes, peerValue)) ok = false;
      if (me == 0 && i >= 2) {
        (vectorStores ? storeWrites : writes)
            .push_back(counted / std::chrono::duration<double>(staged - start).count() / 1e9);
        reads.push_back(counted / std::chrono::duration<double>(done - staged).count() / 1e9);
        if (done > deadline) stop.store(true, std::memory_order_relaxed);
      }
      barrier.arriveAndWait(me, arrivals);  // both threads agree on whether to stop
      if (stop.load(std::memory_order_relaxed) && vectorStores) break;
    }
    // The whole block, not only its stamps: the destination is the other's source.
    if (std::memcmp(mine.destination.data(), peer.source.data(), blockBytes) != 0) ok = false;
  };
  std::thread a(body, 0, cpuA);
  std::thread b(body, 1, cpuB);
  a.join();
  b.join();
  result.write = summarize(std::move(writes));
  result.storeWrite = summarize(std::move(storeWrites));
  result.read = summarize(std::move(reads));
  result.ok = ok;
  return result;
}

}  // namespace chorus_membw
