// The correctness matrix with ranks as threads of this process: every collective x dtype x op x
// count x in-place, for 1, 2, 3, 4 and 8 ranks.
#include <gtest/gtest.h>

#include <thread>

#include "check.hpp"

using namespace chorus;
using namespace chorus::testing;

namespace {

struct Param {
  Coll coll;
  int ranks;
};

class CollectivesThreads : public ::testing::TestWithParam<Param> {};

TEST_P(CollectivesThreads, MatrixIsExact) {
  const Param p = GetParam();
  Config config;
  config.timeout = std::chrono::seconds(120);
  auto comms = Communicator::createLocal(p.ranks, config);
  const auto cases = matrix(p.coll, p.ranks, matrixCounts());
  std::vector<std::thread> threads;
  std::vector<std::vector<std::string>> failures(static_cast<size_t>(p.ranks));
  for (int r = 0; r < p.ranks; ++r) {
    threads.emplace_back([&, r] {
      for (const Case& c : cases) {
        std::string report;
        size_t wrong = 0;
        try {
          wrong = runCase(comms[static_cast<size_t>(r)], c, &report);
        } catch (const Error& e) {
          failures[static_cast<size_t>(r)].push_back(describe(c, p.ranks) + ": threw " + e.what());
          return;
        }
        if (wrong) {
          failures[static_cast<size_t>(r)].push_back(describe(c, p.ranks) + ": rank " + std::to_string(r) +
                                                     " " + std::to_string(wrong) + " wrong " + report);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  size_t shown = 0;
  for (auto& list : failures) {
    for (auto& f : list) {
      if (shown++ < 20) ADD_FAILURE() << f;
    }
  }
  EXPECT_EQ(shown, 0u);
}

// Ranks may differ in working in place; whether a call reads its peers in place must not.
TEST(CollectivesThreadsMixed, RanksDifferInPlace) {
  for (int n : {2, 3}) {
    Config config;
    config.timeout = std::chrono::seconds(120);
    auto comms = Communicator::createLocal(n, config);
    std::vector<std::thread> threads;
    std::vector<std::string> failures(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          for (bool flip : {false, true}) {
            for (const Case& c : mixedInPlaceCases(r, n, flip)) {
              std::string report;
              if (runCase(comms[static_cast<size_t>(r)], c, &report)) {
                failures[static_cast<size_t>(r)] += describe(c, n) + ": wrong " + report + "; ";
              }
            }
          }
        } catch (const Error& e) {
          failures[static_cast<size_t>(r)] += std::string("threw ") + e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_EQ(failures[static_cast<size_t>(r)], "") << n << " ranks, rank " << r;
  }
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (Coll c : {Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather, Coll::Broadcast, Coll::Reduce,
                 Coll::AllToAll, Coll::AllToAllv, Coll::SendRecv}) {
    for (int n : {1, 2, 3, 4, 8}) out.push_back({c, n});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, CollectivesThreads, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& pi) {
                           return std::string(collName(pi.param.coll)) + "_" +
                                  std::to_string(pi.param.ranks) + "ranks";
                         });

}  // namespace
