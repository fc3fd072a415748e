// The correctness matrix with ranks as processes: run under `chorusrun -n N`. Every process runs
// the same tests in the same order and checks its own results.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "algorithms/common.hpp"
#include "base/config.hpp"
#include "check.hpp"
#include "core/comm_impl.hpp"
#include "engine/shm_sync.hpp"
#include "topology/cache_thresholds.hpp"
#include "transports/shm/shm_group.hpp"

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

// Whether heap buffers are read in place is one verdict for the host: under CHORUS_CMA=auto the
// first rank measures cross-memory attach's speed at set-up and every rank reads that figure, so
// all ranks agree, and read in place exactly where it is fast enough; CHORUS_CMA=1 or a size reads
// in place without measuring.
TEST(SingleCopySetUp, EveryRankAgreesOnTheMeasuredSpeed) {
  Communicator& c = comm();
  engine::ShmSync* sm = c.impl()->sharedMemory();
  if (!sm) GTEST_SKIP() << "no shared memory between these ranks";
  const transport::ShmGroup& g = sm->group();
  const double mine[3] = {g.peerMemoryReadable() ? 1.0 : 0.0, g.peerReadsFast() ? 1.0 : 0.0,
                          g.peerReadSpeed()};
  std::vector<double> all(3 * static_cast<size_t>(c.size()));
  c.allGather(mine, all.data(), 3, DataType::Float64);
  for (int r = 0; r < c.size(); ++r) {
    EXPECT_EQ(all[3 * static_cast<size_t>(r)], mine[0]) << "rank " << r << " decided otherwise";
    EXPECT_EQ(all[3 * static_cast<size_t>(r) + 1], mine[1])
        << "rank " << r << " decided otherwise on the speed";
    EXPECT_EQ(all[3 * static_cast<size_t>(r) + 2], mine[2]) << "rank " << r << " saw another speed";
  }
  const EnvConfig& env = envConfig();
  const std::string why = g.peerMemoryNote();
  EXPECT_LE(mine[1], mine[0]) << "fast but not readable";
  if (!env.cma) {
    EXPECT_EQ(mine[0], 0.0);
  } else if (env.cmaAlways) {
    EXPECT_EQ(mine[2], 0.0) << "measured although CHORUS_CMA forces single copy";
    EXPECT_EQ(mine[1], mine[0]) << "CHORUS_CMA=1 reads in place whatever the speed";
  } else if (mine[2] > 0) {
    EXPECT_LT(mine[2], 20.0);
    EXPECT_EQ(mine[0], 1.0) << "measured, so readable: " << why;
    EXPECT_EQ(mine[1] == 1.0, mine[2] >= transport::kMinPeerReadSpeed) << why;
    if (mine[1] == 0.0) {
      EXPECT_NE(why.find("cross-memory attach copies at"), std::string::npos) << why;
    }
  } else {
    EXPECT_EQ(mine[0], 0.0) << "read in place without a measured speed";  // refused, or ranks outnumber cores
  }
}

// Which staged calls are packed through the whole staging area (algo::stagingPacks) follows the
// host's ranks per core: rank 0 counts them and every rank takes its verdict, since all must put
// each chunk in the same place. Here all ranks are on this host: ranks / cores, rounded up.
TEST(StageSlotsSetUp, EveryRankTakesRankZerosVerdict) {
  Communicator& c = comm();
  engine::ShmSync* sm = c.impl()->sharedMemory();
  if (!sm) GTEST_SKIP() << "no shared memory between these ranks";
  const transport::ShmGroup& g = sm->group();
  const int32_t mine = g.ranksPerCore();
  std::vector<int32_t> all(static_cast<size_t>(c.size()));
  c.allGather(&mine, all.data(), 1, DataType::Int32);
  for (int r = 0; r < c.size(); ++r) EXPECT_EQ(all[static_cast<size_t>(r)], mine) << "rank " << r;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ASSERT_EQ(sched_getaffinity(0, sizeof cpus, &cpus), 0);
  EXPECT_EQ(mine, (c.size() + CPU_COUNT(&cpus) - 1) / CPU_COUNT(&cpus))
      << c.size() << " ranks on " << CPU_COUNT(&cpus) << " cores";
}

// Single copy or staging for the allreduce, all-gather and reduce-scatter
// (engine/single_copy_choice.hpp): rank 0 decides, its verdict travels in the buffer exchange, and
// every rank follows it call by call. Timed (the default), rank 0 tries each way twice per class
// first, so 22 calls of one size take both paths, and more where the timings say, also where
// cross-memory attach is slow here (staging first): every rank must have taken the same ones,
// every result exact. Under CHORUS_CMA=<size> every such call reads in place; under the ranges
// policy none does where cross-memory attach is slow.
TEST(SingleCopyChoiceProcesses, EveryRankTakesRankZerosPath) {
  Communicator& c = comm();
  ASSERT_GE(c.size(), 2) << "run this test under chorusrun -n 2 (or more)";
  engine::ShmSync* sm = c.impl()->sharedMemory();
  if (!sm) GTEST_SKIP() << "no shared memory between these ranks";
  engine::SingleCopyChoice& choice = sm->singleCopyChoice();
  const uint64_t pulled0 = choice.pulledCalls(), staged0 = choice.stagedCalls();
  constexpr int kCalls = 2 * 2 * engine::TimedChoice::kWarmUp + engine::TimedChoice::kExplore + 2;
  constexpr size_t kCount = 128 * 1024;  // 512 KiB of float32 (the all-gather's block)
  constexpr int kClasses = 6;            // allreduce, all-gather, reduce-scatter; out of place, in place
  for (Coll coll : {Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter}) {
    for (bool inPlace : {false, true}) {
      for (int i = 0; i < kCalls; ++i) {
        const Case k{coll, DataType::Float32, i % 2 ? ReduceOp::Avg : ReduceOp::Sum, kCount, inPlace, 0};
        std::string report;
        ASSERT_EQ(runCase(c, k, &report), 0u)
            << "rank " << c.rank() << ": " << describe(k, c.size()) << ", call " << i << ": " << report;
      }
    }
  }
  const double mine[2] = {static_cast<double>(choice.pulledCalls() - pulled0),
                          static_cast<double>(choice.stagedCalls() - staged0)};
  std::vector<double> all(2 * static_cast<size_t>(c.size()));
  c.allGather(mine, all.data(), 2, DataType::Float64);
  for (int r = 0; r < c.size(); ++r) {
    EXPECT_EQ(all[2 * static_cast<size_t>(r)], mine[0]) << "rank " << r << " pulled in other calls";
    EXPECT_EQ(all[2 * static_cast<size_t>(r) + 1], mine[1]) << "rank " << r << " staged in other calls";
  }
  if (!sm->peerReadsTimed()) {
    EXPECT_EQ(mine[0] + mine[1], 0.0) << "no buffer exchange without single copy";
    return;
  }
  EXPECT_EQ(mine[0] + mine[1], 1.0 * kClasses * kCalls) << "every call asked rank 0";
  if (envConfig().cmaMinBytes) {
    EXPECT_EQ(mine[1], 0.0) << "CHORUS_CMA=<size> forces single copy";
  } else if (choice.policy() == engine::SingleCopyChoice::Policy::Ranges && !sm->peerReadsEnabled()) {
    EXPECT_EQ(mine[0], 0.0) << "the ranges read in place where cross-memory attach is slow";
  } else if (choice.policy() == engine::SingleCopyChoice::Policy::Timed) {
    EXPECT_GE(mine[0], 1.0 * kClasses * engine::TimedChoice::kWarmUp) << "read in place too seldom";
    EXPECT_GE(mine[1], 1.0 * kClasses * engine::TimedChoice::kWarmUp) << "staged too seldom";
  }
}

// Output stores (engine/output_stores.hpp): in the band where all ranks' buffers reach the
// non-temporal threshold but one rank's output does not, each rank times its staged copies out
// with streaming and plain stores, and may change between calls; every result must stay exact.
// Where every call is staged (no single copy here), both ways have been timed after 22 calls.
TEST(OutputStoresProcesses, BothWaysAreExact) {
  Communicator& c = comm();
  ASSERT_GE(c.size(), 2) << "run this test under chorusrun -n 2 (or more)";
  engine::ShmSync* sm = c.impl()->sharedMemory();
  if (!sm) GTEST_SKIP() << "no shared memory between these ranks";
  const size_t n = static_cast<size_t>(c.size()), nt = topo::ntStoreBytes();
  // allreduce: inputs and outputs of all ranks, 2 x bytes x n, just reach the threshold; the
  // all-gather's block b: n ranks x (n + 1) blocks each; the all-to-all's block per peer b:
  // n ranks x 2n blocks each.
  const size_t arCount = std::max<size_t>(nt / (2 * n) / 4, engine::OutputStores::kTimedBytes / 4);
  const size_t agCount = std::max<size_t>((nt + 4 * n * (n + 1) - 1) / (4 * n * (n + 1)),
                                          engine::OutputStores::kTimedBytes / 4 / n + 1);
  const size_t aaCount =
      std::max<size_t>((nt + 8 * n * n - 1) / (8 * n * n), engine::OutputStores::kTimedBytes / 4 / n + 1);
  constexpr int kCalls = 2 * 2 * engine::TimedChoice::kWarmUp + engine::TimedChoice::kExplore + 2;
  for (Coll coll : {Coll::AllReduce, Coll::AllGather, Coll::AllToAll}) {
    const size_t count = coll == Coll::AllReduce ? arCount : coll == Coll::AllGather ? agCount : aaCount;
    for (int i = 0; i < kCalls; ++i) {
      const Case k{coll, DataType::Float32, i % 2 ? ReduceOp::Avg : ReduceOp::Sum, count, false, 0};
      std::string report;
      ASSERT_EQ(runCase(c, k, &report), 0u)
          << "rank " << c.rank() << ": " << describe(k, c.size()) << ", call " << i << ": " << report;
    }
  }
  const engine::OutputStores& stores = sm->outputStores();
  const struct {
    OpKind kind;
    size_t output;
  } classes[] = {{OpKind::AllReduce, arCount * 4},
                 {OpKind::AllGather, agCount * 4 * n},
                 {OpKind::AllToAll, aaCount * 4 * n}};
  for (const auto& k : classes) {
    const double streaming = stores.nsPerKiB(k.kind, k.output, kernels::CopyMode::Streaming);
    const double plain = stores.nsPerKiB(k.kind, k.output, kernels::CopyMode::Cached);
    if (!engine::outputStoresTimed()) {
      EXPECT_FALSE(stores.current(k.kind, k.output).has_value()) << "timed under CHORUS_NT_STORE_BYTES";
    } else if (!sm->peerReadsEnabled() && k.output < nt) {
      EXPECT_GT(streaming, 0.0) << "streaming stores never timed for " << k.output << " bytes";
      EXPECT_GT(plain, 0.0) << "plain stores never timed for " << k.output << " bytes";
    }
  }
}

// A communicator of its own over every rank of comm(), whose copies into staging nothing has timed
// yet; none, with `why`, where the ranks are not all on one host with shared memory (the staged
// algorithms are a host's) or the copies into staging are not timed (CHORUS_STAGE_COPY set). Every
// rank answers alike.
std::optional<Communicator> freshHostComm(std::string& why) {
  Communicator& world = comm();
  engine::ShmSync* one = world.impl()->sharedMemory();
  if (world.size() < 2 || !one || one->group().size() != world.size()) {
    why = "the ranks are not all on one host with shared memory (run under chorusrun -n 2 or more)";
    return std::nullopt;
  }
  std::optional<Communicator> c = world.split(0, world.rank());
  if (!c) {
    ADD_FAILURE() << "rank " << world.rank() << ": split(0, rank) gave no communicator";
  } else if (engine::ShmSync* sm = c->impl()->sharedMemory();
             !sm->stagingWrites().copyTimed(sm->group().stageSlotBytes())) {
    why = "copies into staging not timed (CHORUS_STAGE_COPY=" + envConfig().stageCopy + ")";
    c.reset();
  }
  return c;
}

// Out of place, the staged all-gather and the root of a staged broadcast write their own input to
// their output in the same pass as into staging (algo::stageCopy's `own`, from
// algo::kOwnInSamePassFrom bytes a chunk), and time those copies apart from the copies into
// staging alone (StagingWrites::plainCopyNsPerKiB(true) and its streaming twin); in place nothing
// goes beside, and a broadcast's other ranks stage nothing. A communicator of its own starts with
// none of them timed.
TEST(StagingCopiesProcesses, OwnOutputGoesInTheSamePass) {
  std::string why;
  std::optional<Communicator> c = freshHostComm(why);
  if (!c) GTEST_SKIP() << why;
  engine::ShmSync* sm = c->impl()->sharedMemory();
  if (sm->peerReadsEnabled()) GTEST_SKIP() << "heap buffers are read in place here (single copy), not staged";
  const int me = c->rank(), last = c->size() - 1;
  const engine::StagingWrites& writes = sm->stagingWrites();
  const auto timed = [&](bool withOwn) {
    return writes.plainCopyNsPerKiB(withOwn) > 0 || writes.streamingCopyNsPerKiB(withOwn) > 0;
  };
  const size_t count = 64 * 1024;  // 256 KiB of float32: chunks of at least kOwnInSamePassFrom
  ASSERT_GE(std::min(count * 4, sm->group().stageSlotBytes()), algo::kOwnInSamePassFrom);
  const auto run = [&](Coll coll, bool inPlace, int root) {
    for (int i = 0; i < 3; ++i) {
      const Case k{coll, DataType::Float32, ReduceOp::Sum, count, inPlace, root};
      std::string report;
      ASSERT_EQ(runCase(*c, k, &report), 0u) << "rank " << me << ": " << describe(k, c->size()) << report;
    }
  };
  run(Coll::Broadcast, true, 0);
  run(Coll::AllGather, true, -1);
  EXPECT_FALSE(timed(true)) << "rank " << me << ": in place, a copy went beside an own output";
  EXPECT_TRUE(timed(false)) << "rank " << me << ": the copies into staging were not timed";
  run(Coll::Broadcast, false, last);
  EXPECT_EQ(timed(true), me == last) << "rank " << me << ": broadcast from rank " << last << " out of place";
  run(Coll::AllGather, false, -1);
  EXPECT_TRUE(timed(true)) << "rank " << me << ": all-gather out of place";
}

// The staged reduce: the other ranks stage their inputs, the root reduces its own straight from its
// input (in place too) and stages nothing, so only the others time copies into staging.
TEST(StagingCopiesProcesses, ReduceRootStagesNothing) {
  std::string why;
  std::optional<Communicator> c = freshHostComm(why);
  if (!c) GTEST_SKIP() << why;
  engine::ShmSync* sm = c->impl()->sharedMemory();
  const int me = c->rank(), root = c->size() - 1;
  const engine::StagingWrites& writes = sm->stagingWrites();
  for (bool inPlace : {false, true}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      const Case k{Coll::Reduce, DataType::Float32, op, 64 * 1024, inPlace, root};
      std::string report;
      ASSERT_EQ(runCase(*c, k, &report), 0u) << "rank " << me << ": " << describe(k, c->size()) << report;
    }
  }
  const bool timed = writes.plainCopyNsPerKiB() > 0 || writes.streamingCopyNsPerKiB() > 0;
  EXPECT_EQ(timed, me != root) << "rank " << me << ": copies into staging of a reduce to rank " << root;
}

INSTANTIATE_TEST_SUITE_P(All, CollectivesProcesses,
                         ::testing::Values(Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather,
                                           Coll::Broadcast, Coll::Reduce, Coll::AllToAll, Coll::AllToAllv,
                                           Coll::SendRecv),
                         [](const ::testing::TestParamInfo<Coll>& pi) {
                           return std::string(collName(pi.param));
                         });

}  // namespace
