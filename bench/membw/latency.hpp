// Core-to-core latency of chorus-membw: a flag ping-pong between two pinned threads, spinning and
// blocking (futex).
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

}  // namespace chorus_membw
