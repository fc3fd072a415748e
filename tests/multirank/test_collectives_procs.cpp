// The correctness matrix with ranks as processes: run under `chorusrun -n N`. Every process runs
// the same tests in the same order and checks its own results.
#include <gtest/gtest.h>

#include <memory>

#include "check.hpp"

using namespace chorus;
using namespace chorus::testing;

namespace {

Communicator& comm() {
  static std::unique_ptr<Communicator> c = [] {
    Config config;
    config.timeout = std::chrono::seconds(120);
    return std::make_unique<Communicator>(Communicator::fromEnvironment(config));
  }();
  return *c;
}

class CollectivesProcesses : public ::testing::TestWithParam<Coll> {};

TEST_P(CollectivesProcesses, MatrixIsExact) {
  Communicator& c = comm();
  ASSERT_GE(c.size(), 2) << "run this test under chorusrun -n 2 (or more)";
  size_t failures = 0;
  for (const Case& k : matrix(GetParam(), c.size(), matrixCounts())) {
    std::string report;
    size_t wrong = runCase(c, k, &report);
    if (wrong && failures++ < 20)
      ADD_FAILURE() << describe(k, c.size()) << ": " << wrong << " wrong " << report;
  }
  EXPECT_EQ(failures, 0u);
}

// Ranks may differ in working in place; whether a call reads its peers in place must not.
TEST(CollectivesProcessesMixed, RanksDifferInPlace) {
  Communicator& c = comm();
  ASSERT_GE(c.size(), 2) << "run this test under chorusrun -n 2 (or more)";
  for (bool flip : {false, true}) {
    for (const Case& k : mixedInPlaceCases(c.rank(), c.size(), flip)) {
      std::string report;
      EXPECT_EQ(runCase(c, k, &report), 0u) << "rank " << c.rank() << ": " << describe(k, c.size()) << report;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, CollectivesProcesses,
                         ::testing::Values(Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather,
                                           Coll::Broadcast, Coll::Reduce, Coll::AllToAll, Coll::AllToAllv,
                                           Coll::SendRecv),
                         [](const ::testing::TestParamInfo<Coll>& pi) {
                           return std::string(collName(pi.param));
                         });

}  // namespace
