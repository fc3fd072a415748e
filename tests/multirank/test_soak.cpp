// Soak: many random collectives (random kind, dtype, op, root, size, in place or not), every result
// checked, on ranks as threads, alternating between two communicators of the same ranks: one with
// the built-in algorithms and one forced onto the pipe-based ones (ring, pipeline, pairwise).
//
// CHORUS_SOAK_OPS sets the number of operations (default 1000, the short CI version; 500, the first
// half of the same sequence, under CHORUS_TEST_QUICK=1, as the ASan+UBSan pass of scripts/test runs);
// CHORUS_SOAK_MAX_BYTES the largest message (default 4 MiB); CHORUS_SOAK_SEED the seed;
// CHORUS_SOAK_RANKS the number of ranks (default 4).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "check.hpp"

using namespace chorus;
using namespace chorus::testing;

namespace {

size_t envSize(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? static_cast<size_t>(std::strtoull(v, nullptr, 10)) : fallback;
}

struct Step {
  Case c;
  int comm;  // 0: built-in algorithms, 1: pipe-based algorithms
};

std::vector<Step> randomSteps(size_t n, size_t maxBytes, int nranks, uint64_t seed) {
  static const Coll colls[] = {Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather, Coll::Broadcast,
                               Coll::Reduce,    Coll::AllToAll,      Coll::AllToAllv, Coll::SendRecv};
  static const DataType types[] = {DataType::Int8,    DataType::Uint8,  DataType::Int32,   DataType::Uint32,
                                   DataType::Int64,   DataType::Uint64, DataType::Float16, DataType::BFloat16,
                                   DataType::Float32, DataType::Float64};
  static const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg};
  std::mt19937_64 rng(seed);
  std::vector<Step> steps;
  for (size_t i = 0; i < n; ++i) {
    Step s;
    s.c.coll = colls[rng() % 8];
    s.c.type = types[rng() % 10];
    s.c.op = ops[rng() % 5];
    // Sizes spread over orders of magnitude: mostly small, some up to maxBytes.
    size_t bytes = size_t{1} << (rng() % 23);
    bytes = std::min(maxBytes, bytes + rng() % (bytes + 1));
    s.c.count = bytes / dataTypeSize(s.c.type);
    if (s.c.coll == Coll::ReduceScatter || s.c.coll == Coll::AllGather || s.c.coll == Coll::AllToAll ||
        s.c.coll == Coll::AllToAllv) {
      s.c.count /= static_cast<size_t>(nranks);
    }
    s.c.inPlace = s.c.coll != Coll::AllToAllv && s.c.coll != Coll::SendRecv && rng() % 2 == 0;
    s.c.root = static_cast<int>(rng() % static_cast<uint64_t>(nranks));
    s.comm = static_cast<int>(rng() % 2);
    steps.push_back(s);
  }
  return steps;
}

TEST(Soak, RandomCollectivesAllChecked) {
  const int n = static_cast<int>(envSize("CHORUS_SOAK_RANKS", 4));
  ASSERT_GE(n, 1);
  const size_t ops = envSize("CHORUS_SOAK_OPS", quickTests() ? 500 : 1000);
  const size_t maxBytes = envSize("CHORUS_SOAK_MAX_BYTES", size_t{4} << 20);
  const uint64_t seed = envSize("CHORUS_SOAK_SEED", 20261129);
  Config builtIn;
  builtIn.timeout = std::chrono::seconds(120);
  Config pipes = builtIn;
  pipes.algo =
      "allreduce:ring,reducescatter:ring,allgather:ring,broadcast:pipeline,reduce:pipeline,"
      "alltoall:pairwise,barrier:pipes";
  std::vector<Communicator> comms[2] = {Communicator::createLocal(n, builtIn),
                                        Communicator::createLocal(n, pipes)};
  const auto steps = randomSteps(ops, maxBytes, n, seed);
  std::vector<std::string> failures(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      for (size_t i = 0; i < steps.size(); ++i) {
        const Step& s = steps[i];
        std::string report;
        try {
          size_t wrong = runCase(comms[s.comm][static_cast<size_t>(r)], s.c, &report);
          if (wrong) {
            failures[static_cast<size_t>(r)] = "op " + std::to_string(i) + " " + describe(s.c, n) + ": " +
                                               std::to_string(wrong) + " wrong " + report;
            return;
          }
        } catch (const Error& e) {
          failures[static_cast<size_t>(r)] =
              "op " + std::to_string(i) + " " + describe(s.c, n) + ": " + e.what();
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(failures[static_cast<size_t>(r)].empty())
        << "rank " << r << ": " << failures[static_cast<size_t>(r)];
}

}  // namespace
