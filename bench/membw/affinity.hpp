// CPU affinity helpers of chorus-membw.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <vector>

namespace chorus_membw {

// The CPUs this process may run on (its affinity mask at start), in increasing order.
inline std::vector<int> affinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// Pins the calling thread to one CPU; false if the kernel refused.
inline bool pinThisThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

}  // namespace chorus_membw
