// One rank of a job in which one rank dies, for the process-level fault tests.
//
// Usage: fault_rank_program MODE VICTIM
//   after-init      the victim kills itself (SIGKILL) once every rank has initialised; the others
//                   then call allreduce.
//   mid-collective  every rank loops over large allreduces; the victim kills itself from another
//                   thread ~150 ms into the loop.
//   before-init     the victim kills itself before joining; the others try to join.
//   shrink          as after-init; then the survivors form a communicator without the victim
//                   (chorusCommShrink) and allreduce on it, printing a second line
//                   shrink=<code> rank=<new rank> size=<new size> sum=<allreduce of rank+1> message=<text>
// Rank and size come from the environment (CHORUS_RANK / CHORUS_WORLD_SIZE + a store).
//
// A survivor prints one line
//   result=<code> elapsed_ms=<ms> async=<code> again=<code> again_ms=<ms> message=<text>
// (elapsed: from the start of the failing call, or for mid-collective from the start of the loop)
// and exits 0; the driver judges the values. Exit 2: init failed where it should not; 3: the
// failure never came.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"

namespace {

using Clock = std::chrono::steady_clock;

long long msSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

int envInt(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

void report(chorusResult_t result, long long elapsed, chorusComm_t comm, const std::string& message) {
  chorusResult_t async = chorusSuccess;
  chorusResult_t again = chorusSuccess;
  long long againMs = -1;
  if (comm) {
    chorusCommGetAsyncError(comm, &async);
    // A later call on the broken communicator fails fast.
    float x = 1, y = 0;
    auto t0 = Clock::now();
    again = chorusAllReduce(&x, &y, 1, chorusFloat32, chorusSum, comm, nullptr);
    againMs = msSince(t0);
  }
  std::string oneLine = message;
  for (char& c : oneLine) {
    if (c == '\n') c = ' ';
  }
  std::printf("result=%d elapsed_ms=%lld async=%d again=%d again_ms=%lld message=%s\n",
              static_cast<int>(result), elapsed, static_cast<int>(async), static_cast<int>(again), againMs,
              oneLine.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: fault_rank_program after-init|mid-collective|before-init VICTIM\n");
    return 64;
  }
  const std::string mode = argv[1];
  const int victim = std::atoi(argv[2]);
  const int myRank = envInt("CHORUS_RANK");

  if (mode == "before-init") {
    if (myRank == victim) raise(SIGKILL);
    chorusComm_t comm = nullptr;
    auto t0 = Clock::now();
    chorusResult_t r = chorusCommInitFromEnv(&comm);
    long long elapsed = msSince(t0);
    std::string message = chorusGetLastError(nullptr);
    if (r == chorusSuccess) {
      std::fprintf(stderr, "rank %d: init succeeded without rank %d\n", myRank, victim);
      return 3;
    }
    report(r, elapsed, nullptr, message);
    return 0;
  }

  chorusComm_t comm = nullptr;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    std::fprintf(stderr, "rank %d: init failed: %s\n", myRank, chorusGetLastError(nullptr));
    return 2;
  }
  // Every rank has finished joining (and watches every other) before anyone dies.
  if (chorusBarrier(comm, nullptr) != chorusSuccess) {
    std::fprintf(stderr, "rank %d: barrier failed: %s\n", myRank, chorusGetLastError(comm));
    return 2;
  }

  if (mode == "after-init" || mode == "shrink") {
    if (myRank == victim) raise(SIGKILL);
    std::vector<float> in(1000, 1.0f), out(1000);
    auto t0 = Clock::now();
    chorusResult_t r =
        chorusAllReduce(in.data(), out.data(), in.size(), chorusFloat32, chorusSum, comm, nullptr);
    long long elapsed = msSince(t0);
    if (r == chorusSuccess) {
      std::fprintf(stderr, "rank %d: allreduce succeeded without rank %d\n", myRank, victim);
      return 3;
    }
    report(r, elapsed, comm, chorusGetLastError(comm));
    if (mode == "shrink") {
      chorusComm_t smaller = nullptr;
      chorusResult_t s = chorusCommShrink(comm, &victim, 1, &smaller);
      int newRank = -1, newSize = -1;
      float sum = -1;
      if (s == chorusSuccess) {
        chorusCommUserRank(smaller, &newRank);
        chorusCommCount(smaller, &newSize);
        float mine = static_cast<float>(myRank + 1);
        s = chorusAllReduce(&mine, &sum, 1, chorusFloat32, chorusSum, smaller, nullptr);
      }
      std::printf("shrink=%d rank=%d size=%d sum=%g message=%s\n", static_cast<int>(s), newRank, newSize,
                  static_cast<double>(sum), s == chorusSuccess ? "" : chorusGetLastError(smaller));
      std::fflush(stdout);
      if (smaller) chorusCommDestroy(smaller);
      chorusCommDestroy(comm);
    }
    return 0;
  }

  if (mode == "mid-collective") {
    if (myRank == victim) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        raise(SIGKILL);
      }).detach();
    }
    std::vector<float> in(1 << 20, 1.0f), out(1 << 20);
    auto t0 = Clock::now();
    for (int iter = 0; msSince(t0) < 30000; ++iter) {
      // Alternate between allreduce and broadcast (from a rotating root).
      chorusResult_t r =
          iter % 2 == 0
              ? chorusAllReduce(in.data(), out.data(), in.size(), chorusFloat32, chorusSum, comm, nullptr)
              : chorusBroadcast(in.data(), out.data(), in.size(), chorusFloat32, iter % 3, comm, nullptr);
      if (r != chorusSuccess) {
        report(r, msSince(t0), comm, chorusGetLastError(comm));
        return 0;
      }
    }
    std::fprintf(stderr, "rank %d: 30 s of collectives without noticing rank %d die\n", myRank, victim);
    return 3;
  }

  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 64;
}
