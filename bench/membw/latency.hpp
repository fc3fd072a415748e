// Core-to-core latency of chorus-membw: a flag ping-pong between two pinned threads, spinning and
// blocking (futex); and the rate at which a freshly written block moves from one core to the other.
#pragma once

#include <cstddef>

namespace chorus_membw {

// Median, minimum and 90th percentile of a set of samples, and how many there were.
struct Distribution {
  double median = 0;
  double min = 0;
  double p90 = 0;
  size_t samples = 0;
};

// Round trips through two std::atomic<uint64_t> flags, each on its own cache line: thread A (on
// cpuA) stores a sequence number into `ping` and spins until thread B (on cpuB) echoes it into
// `pong`. Each sample is the mean of `perBatch` round trips (so the clock's own cost is spread
// out); at most `batches` samples, stopping early after `budgetSeconds`. With `pause` the spin
// loops execute the x86 PAUSE instruction between polls, as Chorus's engine does. Nanoseconds.
Distribution spinRoundTripNs(int cpuA, int cpuB, bool pause, size_t batches, size_t perBatch,
                             double budgetSeconds);

// The same exchange, but each side sleeps in FUTEX_WAIT until the other's FUTEX_WAKE: the cost of a
// blocking wake-up. Each sample is one round trip (two wake-ups); at most `samples`, stopping early
// after `budgetSeconds`. Microseconds.
Distribution futexRoundTripUs(int cpuA, int cpuB, size_t samples, double budgetSeconds);

// A block handed from one core to the other, as a staged collective hands its data over: threads on
// cpuA and cpuB each copy `blockBytes` from a private source into their own staging buffer (whose
// lines the other read in the exchange before), meet at a spin barrier, copy the other's staging
// buffer into a private destination, and meet again. Exchanges alternate how the staging buffer is
// written: glibc's memcpy (`write`) or a loop of vector stores (`storeWrite`, kernels.hpp's
// storeCopy, the way a reduction kernel writes its output); the read is always memcpy. Every
// buffer starts on a page of its own: memcpy's `rep movsb` slows down where the destination sits
// a few bytes past the source modulo 4 KiB (docs/performance.md, "Known gaps"). Per exchange, both
// threads together: a write rate is 2 x 2 x blockBytes (STREAM's counting: read + written) over the
// time from the start to the first barrier, `read` the same over the time from the first barrier
// to the second; GB/s (G = 1e9). At most `exchanges` samples, stopping early after
// `budgetSeconds`. `ok` is false if a destination does not hold what the other thread wrote in the
// same exchange.
struct Handoff {
  size_t blockBytes = 0;
  Distribution write, storeWrite, read;
  bool ok = true;
};
Handoff handoffCopyGBps(int cpuA, int cpuB, size_t blockBytes, size_t exchanges, double budgetSeconds);

}  // namespace chorus_membw
