// One rank of a job described by launcher environment variables.
//
// Usage: env_rank_program [c|cpp] [EXPECTED_SIZE]
//   c   (default) joins with chorusCommInitFromEnv, cpp with Communicator::fromEnvironment.
// Runs an allreduce of rank+1 (and of a 4099-element vector), checks the sum n(n+1)/2, prints
// "ok rank R of N" and exits 0. On failure prints the reason to stderr and exits non-zero:
// 2 init failed, 3 wrong size, 4 collective failed, 5 wrong result.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "chorus/chorus.hpp"

namespace {

int check(int rank, int size, const std::vector<int64_t>& sums, int expectedSize) {
  if (expectedSize > 0 && size != expectedSize) {
    std::fprintf(stderr, "rank %d: world size %d, expected %d\n", rank, size, expectedSize);
    return 3;
  }
  const int64_t want = static_cast<int64_t>(size) * (size + 1) / 2;
  for (size_t i = 0; i < sums.size(); ++i) {
    if (sums[i] != want * static_cast<int64_t>(i + 1)) {
      std::fprintf(stderr, "rank %d: element %zu is %lld, expected %lld\n", rank, i,
                   static_cast<long long>(sums[i]),
                   static_cast<long long>(want * static_cast<int64_t>(i + 1)));
      return 5;
    }
  }
  std::printf("ok rank %d of %d\n", rank, size);
  std::fflush(stdout);
  return 0;
}

std::vector<int64_t> inputs(int rank) {
  std::vector<int64_t> v(4099);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(rank + 1) * static_cast<int64_t>(i + 1);
  return v;
}

int runC(int expectedSize) {
  chorusComm_t comm = nullptr;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    std::fprintf(stderr, "chorusCommInitFromEnv failed: %s\n", chorusGetLastError(nullptr));
    return 2;
  }
  int rank = -1, size = -1;
  if (chorusCommUserRank(comm, &rank) != chorusSuccess || chorusCommCount(comm, &size) != chorusSuccess) {
    std::fprintf(stderr, "rank/count failed: %s\n", chorusGetLastError(nullptr));
    return 2;
  }
  std::vector<int64_t> in = inputs(rank), out(in.size(), -1);
  int64_t one = rank + 1, sum = -1;
  if (chorusAllReduce(&one, &sum, 1, chorusInt64, chorusSum, comm, nullptr) != chorusSuccess ||
      chorusAllReduce(in.data(), out.data(), in.size(), chorusInt64, chorusSum, comm, nullptr) !=
          chorusSuccess) {
    std::fprintf(stderr, "rank %d: allreduce failed: %s\n", rank, chorusGetLastError(comm));
    return 4;
  }
  if (sum != static_cast<int64_t>(size) * (size + 1) / 2) {
    std::fprintf(stderr, "rank %d: sum of rank+1 is %lld\n", rank, static_cast<long long>(sum));
    return 5;
  }
  // Every rank has its result before any rank leaves (and stops serving the store or exits).
  if (chorusBarrier(comm, nullptr) != chorusSuccess) {
    std::fprintf(stderr, "rank %d: barrier failed: %s\n", rank, chorusGetLastError(comm));
    return 4;
  }
  int rc = check(rank, size, out, expectedSize);
  chorusCommDestroy(comm);
  return rc;
}

int runCpp(int expectedSize) {
  try {
    chorus::Communicator comm = chorus::Communicator::fromEnvironment();
    std::vector<int64_t> in = inputs(comm.rank()), out(in.size(), -1);
    comm.allReduce(in.data(), out.data(), in.size(), chorus::DataType::Int64, chorus::ReduceOp::Sum);
    comm.barrier();
    return check(comm.rank(), comm.size(), out, expectedSize);
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "chorus error %d: %s\n", static_cast<int>(e.code()), e.what());
    return 4;
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool cpp = argc > 1 && std::strcmp(argv[1], "cpp") == 0;
  int expectedSize = argc > 2 ? std::atoi(argv[2]) : 0;
  return cpp ? runCpp(expectedSize) : runC(expectedSize);
}
