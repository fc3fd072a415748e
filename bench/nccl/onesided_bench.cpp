// nccl-onesided-bench: one-sided transfers through Chorus's libnccl.so.2 (ncclPutSignal +
// ncclWaitSignal over a window) against two-sided ones (ncclSend / ncclRecv) through the same
// library, between 2 processes forked here, with a one-thread memcpy of the same bytes as the floor.
// Measured in one run, so the ratios compare like with like.
//
//   nccl-onesided-bench [max bytes, default 64M] [iterations, default 50]
//
// Per size: the half round trip of a ping-pong (latency) and the rate of a one-way stream
// (rank 0 writes `iterations` messages, rank 1 waits for each), as a markdown table.
#include <nccl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

#define OK(call)                                                                                             \
  do {                                                                                                       \
    ncclResult_t r_ = (call);                                                                                \
    if (r_ != ncclSuccess) {                                                                                 \
      std::fprintf(stderr, "%s failed: %s: %s\n", #call, ncclGetErrorString(r_), ncclGetLastError(nullptr)); \
      std::_Exit(1);                                                                                         \
    }                                                                                                        \
  } while (0)

using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Shared {
  std::atomic<int> ready;
  ncclUniqueId id;
  // Rank 0's figures per size index: put latency, send latency (us), put rate, send rate (GB/s).
  double results[64][4];
};

void barrier(ncclComm_t comm) {
  char b = 0;
  OK(ncclAllReduce(&b, &b, 1, ncclInt8, ncclSum, comm, nullptr));
}

void rank(int me, Shared* shared, size_t maxBytes, int iters) {
  if (me == 0) {
    OK(ncclGetUniqueId(&shared->id));
    shared->ready.store(1);
  }
  while (!shared->ready.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ncclComm_t comm = nullptr;
  OK(ncclCommInitRank(&comm, 2, shared->id, me));
  const int peer = 1 - me;
  char* win = nullptr;
  OK(ncclMemAlloc(reinterpret_cast<void**>(&win), maxBytes));
  ncclWindow_t w = nullptr;
  OK(ncclCommWindowRegister(comm, win, maxBytes, &w, 0));
  std::vector<char> src(maxBytes, static_cast<char>(me + 1)), dst(maxBytes);
  ncclWaitSignalDesc_t fromPeer{1, peer, 0, 0};
  int index = 0;
  for (size_t bytes = 8; bytes <= maxBytes; bytes *= 8, ++index) {
    const int n = bytes >= (size_t{8} << 20) ? std::max(iters / 5, 4) : iters;
    double* out = shared->results[index];
    // Ping-pong, one-sided: a put with a signal, answered by one.
    for (int pass = 0; pass < 2; ++pass) {  // the first warms up
      barrier(comm);
      const auto t = Clock::now();
      for (int i = 0; i < n; ++i) {
        if (me == 0) {
          OK(ncclPutSignal(src.data(), bytes, ncclInt8, peer, w, 0, 0, 0, 0, comm, nullptr));
          OK(ncclWaitSignal(1, &fromPeer, comm, nullptr));
        } else {
          OK(ncclWaitSignal(1, &fromPeer, comm, nullptr));
          OK(ncclPutSignal(src.data(), bytes, ncclInt8, peer, w, 0, 0, 0, 0, comm, nullptr));
        }
      }
      if (me == 0) out[0] = secondsSince(t) / n / 2 * 1e6;
    }
    // Ping-pong, two-sided.
    for (int pass = 0; pass < 2; ++pass) {
      barrier(comm);
      const auto t = Clock::now();
      for (int i = 0; i < n; ++i) {
        if (me == 0) {
          OK(ncclSend(src.data(), bytes, ncclInt8, peer, comm, nullptr));
          OK(ncclRecv(dst.data(), bytes, ncclInt8, peer, comm, nullptr));
        } else {
          OK(ncclRecv(dst.data(), bytes, ncclInt8, peer, comm, nullptr));
          OK(ncclSend(src.data(), bytes, ncclInt8, peer, comm, nullptr));
        }
      }
      if (me == 0) out[1] = secondsSince(t) / n / 2 * 1e6;
    }
    // One-way streams: rank 0 writes, rank 1 consumes each message (a put is acknowledged by a
    // signal back before the next one may overwrite it: the same flow control a receive gives).
    for (int pass = 0; pass < 2; ++pass) {
      barrier(comm);
      const auto t = Clock::now();
      for (int i = 0; i < n; ++i) {
        if (me == 0) {
          OK(ncclPutSignal(src.data(), bytes, ncclInt8, peer, w, 0, 0, 0, 0, comm, nullptr));
          if (i + 1 < n) OK(ncclWaitSignal(1, &fromPeer, comm, nullptr));
        } else {
          OK(ncclWaitSignal(1, &fromPeer, comm, nullptr));
          if (i + 1 < n) OK(ncclSignal(peer, 0, 0, 0, comm, nullptr));
        }
      }
      barrier(comm);
      if (me == 0) out[2] = static_cast<double>(bytes) * n / secondsSince(t) / 1e9;
    }
    for (int pass = 0; pass < 2; ++pass) {
      barrier(comm);
      const auto t = Clock::now();
      for (int i = 0; i < n; ++i) {
        if (me == 0)
          OK(ncclSend(src.data(), bytes, ncclInt8, peer, comm, nullptr));
        else
          OK(ncclRecv(dst.data(), bytes, ncclInt8, peer, comm, nullptr));
      }
      barrier(comm);
      if (me == 0) out[3] = static_cast<double>(bytes) * n / secondsSince(t) / 1e9;
    }
    if (me == 1 && bytes >= 8 && win[0] != 1) {
      std::fprintf(stderr, "rank 1: the window does not hold rank 0's data\n");
      std::_Exit(1);
    }
  }
  OK(ncclCommWindowDeregister(comm, w));
  OK(ncclCommDestroy(comm));
  OK(ncclMemFree(win));
}

double memcpyRate(size_t bytes, int n) {
  std::vector<char> a(bytes, 1), b(bytes);
  std::memcpy(b.data(), a.data(), bytes);
  const auto t = Clock::now();
  for (int i = 0; i < n; ++i) {
    std::memcpy(b.data(), a.data(), bytes);
    asm volatile("" : : "r"(b.data()) : "memory");
  }
  return static_cast<double>(bytes) * n / secondsSince(t) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t maxBytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : size_t{64} << 20;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 50;
  if (maxBytes < 8 || iters < 1) {
    std::fprintf(stderr, "usage: %s [max bytes >= 8] [iterations >= 1]\n", argv[0]);
    return 2;
  }
  setenv("CUDA_VISIBLE_DEVICES", "", 1);  // host memory
  auto* shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (shared == MAP_FAILED) return 2;
  new (shared) Shared{};
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      rank(r, shared, maxBytes, iters);
      std::_Exit(0);
    }
  }
  int bad = 0;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    bad += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  if (bad) return 1;
  std::printf(
      "| bytes | put+signal us | send/recv us | latency ratio | put GB/s | send GB/s | rate ratio | memcpy "
      "GB/s | put / memcpy |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  int index = 0;
  for (size_t bytes = 8; bytes <= maxBytes; bytes *= 8, ++index) {
    const double* r = shared->results[index];
    const double floor = memcpyRate(bytes, std::max(2, static_cast<int>((size_t{256} << 20) / bytes)));
    std::printf("| %zu | %.2f | %.2f | %.2fx | %.3f | %.3f | %.2fx | %.2f | %.0f%% |\n", bytes, r[0], r[1],
                r[1] / r[0], r[2], r[3], r[2] / r[3], floor, 100 * r[2] / floor);
  }
  return 0;
}
