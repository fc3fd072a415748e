// The CHORUS_ALGO grammar (tuning::parseRules), rule-based selection (tuning::select), and malformed
// overrides given through Config::algo and through the CHORUS_ALGO variable.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "api/api_test_util.hpp"
#include "base/op.hpp"
#include "chorus/chorus.h"
#include "chorus/chorus.hpp"
#include "tuning/tuning.hpp"

using namespace chorus;
using chorus::apitest::mentions;

namespace {

// parseRules(text) must throw chorusInvalidArgument whose message names every word of `words`.
void expectRejected(const std::string& text, std::initializer_list<const char*> words) {
  SCOPED_TRACE(text);
  try {
    auto rules = tuning::parseRules(text);
    ADD_FAILURE() << "accepted, " << rules.size() << " rule(s)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
    EXPECT_TRUE(mentions(e.what(), words));
    EXPECT_TRUE(mentions(e.what(), {"CHORUS_ALGO"}));
  }
}

Op opOf(OpKind kind, size_t count, DataType type = DataType::Float32) {
  Op op;
  op.kind = kind;
  op.count = count;
  op.type = type;
  return op;
}

TEST(ParseRules, EmptyTextGivesNoRules) {
  EXPECT_TRUE(tuning::parseRules("").empty());
  EXPECT_TRUE(tuning::parseRules(" , ,").empty());
}

TEST(ParseRules, SizeRangesWithSuffixes) {
  auto rules = tuning::parseRules("allreduce:0-4k:rd,allreduce:4k-inf:ring");
  ASSERT_EQ(rules.size(), 2u);
  EXPECT_EQ(rules[0].kind, OpKind::AllReduce);
  EXPECT_EQ(rules[0].lo, 0u);
  EXPECT_EQ(rules[0].hi, 4096u);
  EXPECT_EQ(rules[0].name, "rd");
  EXPECT_EQ(rules[1].lo, 4096u);
  EXPECT_EQ(rules[1].hi, SIZE_MAX);
  EXPECT_EQ(rules[1].name, "ring");

  rules =
      tuning::parseRules("broadcast:1m-1g:pipeline,reduce_scatter:64K-2M:ring,allgather:1kib-3MiB:direct");
  ASSERT_EQ(rules.size(), 3u);
  EXPECT_EQ(rules[0].kind, OpKind::Broadcast);
  EXPECT_EQ(rules[0].lo, size_t{1} << 20);
  EXPECT_EQ(rules[0].hi, size_t{1} << 30);
  EXPECT_EQ(rules[1].kind, OpKind::ReduceScatter);
  EXPECT_EQ(rules[1].lo, size_t{64} << 10);
  EXPECT_EQ(rules[1].hi, size_t{2} << 20);
  EXPECT_EQ(rules[2].kind, OpKind::AllGather);
  EXPECT_EQ(rules[2].lo, size_t{1} << 10);
  EXPECT_EQ(rules[2].hi, size_t{3} << 20);

  rules = tuning::parseRules("alltoall:100-max:pairwise,reduce:0-0:direct");
  ASSERT_EQ(rules.size(), 2u);
  EXPECT_EQ(rules[0].lo, 100u);
  EXPECT_EQ(rules[0].hi, SIZE_MAX);
  EXPECT_EQ(rules[1].lo, 0u);
  EXPECT_EQ(rules[1].hi, 0u);
}

TEST(ParseRules, NoRangeMeansEverySize) {
  auto rules = tuning::parseRules("barrier:pipes");
  ASSERT_EQ(rules.size(), 1u);
  EXPECT_EQ(rules[0].kind, OpKind::Barrier);
  EXPECT_EQ(rules[0].lo, 0u);
  EXPECT_EQ(rules[0].hi, SIZE_MAX);
}

TEST(ParseRules, AliasesAndWhitespace) {
  auto rules =
      tuning::parseRules(" all_reduce : ring , bcast:pipeline,all_gather:0-1k:ring ,alltoallv:pairwise");
  ASSERT_EQ(rules.size(), 4u);
  EXPECT_EQ(rules[0].kind, OpKind::AllReduce);
  EXPECT_EQ(rules[0].name, "ring");
  EXPECT_EQ(rules[1].kind, OpKind::Broadcast);
  EXPECT_EQ(rules[2].kind, OpKind::AllGather);
  EXPECT_EQ(rules[3].kind, OpKind::AllToAllv);
}

// UCC-like continuation: a "lo-hi:algo" entry keeps the previous entry's collective.
TEST(ParseRules, RangeEntriesContinueThePreviousCollective) {
  auto rules = tuning::parseRules("allreduce:0-64K:tree,64K-inf:ring,broadcast:0-4k:knomial,4k-inf:direct");
  ASSERT_EQ(rules.size(), 4u);
  EXPECT_EQ(rules[0].kind, OpKind::AllReduce);
  EXPECT_EQ(rules[0].name, "tree");
  EXPECT_EQ(rules[0].hi, size_t{64} << 10);
  EXPECT_EQ(rules[1].kind, OpKind::AllReduce);
  EXPECT_EQ(rules[1].name, "ring");
  EXPECT_EQ(rules[1].lo, size_t{64} << 10);
  EXPECT_EQ(rules[1].hi, SIZE_MAX);
  EXPECT_EQ(rules[2].kind, OpKind::Broadcast);
  EXPECT_EQ(rules[3].kind, OpKind::Broadcast);
  EXPECT_EQ(rules[3].name, "direct");
  Op small, large;
  small.kind = large.kind = OpKind::AllReduce;
  small.type = large.type = DataType::Uint8;
  small.count = 1024;
  large.count = size_t{1} << 20;
  EXPECT_STREQ(tuning::select(small, 4, true, rules).name, "tree");
  EXPECT_STREQ(tuning::select(large, 4, true, rules).name, "ring");
  // Without a collective before it, a range entry is an error naming it.
  expectRejected("0-64K:tree", {"'0-64K:tree'", "must follow an entry"});
  // The continued collective's algorithms are the ones checked.
  expectRejected("broadcast:0-1k:knomial,1k-inf:ring", {"'1k-inf:ring'", "unknown algorithm 'ring'"});
}

TEST(ParseRules, UnknownCollectiveNamesEntry) {
  expectRejected("allreduce:ring,allsum:ring", {"'allsum:ring'", "unknown collective 'allsum'"});
  expectRejected("ring", {"'ring'"});
}

TEST(ParseRules, UnknownAlgorithmNamesEntryAndKnownOnes) {
  expectRejected("allreduce:fastest",
                 {"'allreduce:fastest'", "unknown algorithm 'fastest'", "direct", "ring", "rd"});
  // An algorithm of another collective does not count.
  expectRejected("alltoall:ring", {"'alltoall:ring'", "unknown algorithm 'ring'", "pairwise"});
  expectRejected("broadcast:0-4k:rd", {"'broadcast:0-4k:rd'", "pipeline"});
}

TEST(ParseRules, MalformedRanges) {
  expectRejected("allreduce:4k:ring", {"'allreduce:4k:ring'", "lo-hi"});
  expectRejected("allreduce:8k-4k:ring", {"'allreduce:8k-4k:ring'", "range"});
  expectRejected("allreduce:x-4k:ring", {"'allreduce:x-4k:ring'", "range"});
  expectRejected("allreduce:0-4q:ring", {"'allreduce:0-4q:ring'", "range"});
  expectRejected("allreduce:-:ring", {"'allreduce:-:ring'", "range"});
  expectRejected("allreduce:0-99999999999999999999999:ring", {"range"});
  expectRejected("allreduce:0-1:2:ring", {"'allreduce:0-1:2:ring'", "':' fields"});
  expectRejected("allreduce", {"'allreduce'", "':' fields"});
}

TEST(Select, RulesPickAlgorithmBySize) {
  auto rules = tuning::parseRules("allreduce:0-4k:rd,allreduce:4k-inf:ring");
  EXPECT_STREQ(tuning::select(opOf(OpKind::AllReduce, 100), 4, true, rules).name, "rd");
  EXPECT_STREQ(tuning::select(opOf(OpKind::AllReduce, 1024), 4, true, rules).name, "rd")
      << "bounds are inclusive";
  EXPECT_STREQ(tuning::select(opOf(OpKind::AllReduce, 1025), 4, true, rules).name, "ring");
  EXPECT_STREQ(tuning::select(opOf(OpKind::AllReduce, 2048, DataType::BFloat16), 4, true, rules).name, "rd");
  // The first matching rule wins.
  rules = tuning::parseRules("broadcast:0-1m:pipeline,broadcast:direct");
  EXPECT_STREQ(tuning::select(opOf(OpKind::Broadcast, 10), 3, true, rules).name, "pipeline");
  EXPECT_STREQ(tuning::select(opOf(OpKind::Broadcast, 1 << 20), 3, true, rules).name, "direct");
  // Rules for other collectives do not apply.
  EXPECT_EQ(tuning::select(opOf(OpKind::Reduce, 10), 3, true, rules).kind, OpKind::Reduce);
}

TEST(Select, SharedMemoryAlgorithmNotUsedWithoutSharedMemory) {
  auto rules = tuning::parseRules("allreduce:direct,barrier:direct");
  EXPECT_STREQ(tuning::select(opOf(OpKind::AllReduce, 10), 2, true, rules).name, "direct");
  const algo::Algorithm& a = tuning::select(opOf(OpKind::AllReduce, 10), 2, false, rules);
  EXPECT_FALSE(a.needsSharedMemory) << a.name;
  EXPECT_EQ(a.kind, OpKind::AllReduce);
  EXPECT_FALSE(tuning::select(opOf(OpKind::Barrier, 0), 2, false, rules).needsSharedMemory);
}

TEST(Select, EveryRegistryEntryCanBeForced) {
  for (const algo::Algorithm& a : tuning::registry()) {
    const std::string text = std::string(opKindName(a.kind)) + ":" + a.name;
    SCOPED_TRACE(text);
    auto rules = tuning::parseRules(text);
    for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{300001}}) {
      EXPECT_EQ(&tuning::select(opOf(a.kind, count), 4, true, rules), &a) << "count " << count;
    }
  }
}

// A communicator's cached choices give every size what the rules say, also where a rule's bound
// falls inside a power-of-two size class (1500 B lies in 1024-2047; the default 1 KiB bound is
// inclusive, so 1024 and 1025 B share a class), whichever size comes first.
TEST(Selector, ARuleBoundInsideASizeClassIsHonouredInBothOrders) {
  using Expect = std::vector<std::pair<size_t, std::string>>;
  // Asks a fresh selector for every size in order, twice (the second round answers from the cache).
  auto check = [](const std::string& rules, int nranks, const Expect& inOrder) {
    tuning::Selector sel(tuning::parseRules(rules), 0, nranks);
    for (int round = 0; round < 2; ++round) {
      for (const auto& [bytes, name] : inOrder) {
        const Op op = opOf(OpKind::AllReduce, bytes, DataType::Uint8);
        EXPECT_EQ(sel.choose(op, true, nullptr).name, name) << bytes << " B, round " << round;
      }
    }
  };
  const std::string user = "allreduce:0-1500:rd,allreduce:ring";
  check(user, 4, {{1500, "rd"}, {1501, "ring"}, {1024, "rd"}, {4096, "ring"}});
  check(user, 4, {{1501, "ring"}, {1500, "rd"}, {1024, "rd"}, {4096, "ring"}});
  check("", 2, {{1024, "ll"}, {1025, "oneshot"}, {16384, "oneshot"}, {16385, "direct"}});
  check("", 2, {{1025, "oneshot"}, {1024, "ll"}, {16385, "direct"}, {16384, "oneshot"}});
}

// The default choice is data in the CHORUS_ALGO grammar: its boundaries (inclusive upper bounds)
// as the size rules measured on real machines put them, and an algorithm for every collective.
TEST(Select, DefaultRulesAreTheBuiltInSizeRules) {
  auto name = [](OpKind k, size_t bytes, bool shm) {
    return std::string(tuning::select(opOf(k, bytes, DataType::Uint8), 4, shm, {}).name);
  };
  EXPECT_EQ(name(OpKind::AllReduce, 8, true), "ll");
  EXPECT_EQ(name(OpKind::AllReduce, 1024, true), "ll");
  EXPECT_EQ(name(OpKind::AllReduce, 1025, true), "oneshot");
  EXPECT_EQ(name(OpKind::AllReduce, 16384, true), "oneshot");
  EXPECT_EQ(name(OpKind::AllReduce, 16385, true), "direct");
  EXPECT_EQ(name(OpKind::AllReduce, 16384, false), "rd");
  EXPECT_EQ(name(OpKind::AllReduce, 16385, false), "ring");
  EXPECT_EQ(name(OpKind::Broadcast, 1 << 20, false), "pipeline");
  for (OpKind rooted : {OpKind::Broadcast, OpKind::Reduce}) {
    EXPECT_EQ(name(rooted, 8, true), "ll");
    EXPECT_EQ(name(rooted, 256, true), "ll");
    EXPECT_EQ(name(rooted, 257, true), "direct");
  }
  EXPECT_EQ(name(OpKind::AllToAllv, 64, true), "pairwise");
  for (bool shm : {true, false}) {
    std::set<OpKind> covered;
    for (const tuning::Rule& r : tuning::defaultRules(shm)) {
      covered.insert(r.kind);
      const algo::Algorithm* a = tuning::findAlgorithm(r.kind, r.name);
      ASSERT_NE(a, nullptr) << r.name;
      EXPECT_TRUE(shm || !a->needsSharedMemory) << r.name << " needs shared memory";
    }
    EXPECT_EQ(covered.size(), 8u) << "every collective has a default (shm " << shm << ")";
  }
}

// Every pipe algorithm has a cost formula beside it, and no shared-memory one has.
TEST(Registry, PipeAlgorithmsHaveCostFormulas) {
  for (const algo::Algorithm& a : tuning::registry())
    EXPECT_EQ(a.cost == nullptr, a.needsSharedMemory) << a.name;
}

TEST(Registry, EveryCollectiveHasUniquelyNamedAlgorithms) {
  std::set<std::pair<int, std::string>> seen;
  std::set<int> kinds;
  for (const algo::Algorithm& a : tuning::registry()) {
    EXPECT_TRUE(seen.insert({static_cast<int>(a.kind), a.name}).second) << "duplicate " << a.name;
    EXPECT_NE(a.run, nullptr) << a.name;
    EXPECT_NE(std::string(a.description), "") << a.name;
    kinds.insert(static_cast<int>(a.kind));
  }
  for (OpKind k : {OpKind::AllReduce, OpKind::ReduceScatter, OpKind::AllGather, OpKind::Broadcast,
                   OpKind::Reduce, OpKind::AllToAll, OpKind::AllToAllv, OpKind::Barrier}) {
    EXPECT_TRUE(kinds.count(static_cast<int>(k))) << opKindName(k) << " has no algorithm";
  }
}

TEST(AlgoConfig, MalformedConfigAlgoNamesEntry) {
  Config config = apitest::testConfig();
  config.algo = "allreduce:ring,broadcast:0-1k:warp";
  try {
    auto comms = Communicator::createLocal(2, config);
    FAIL() << "created a communicator with a malformed Config::algo";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
    EXPECT_TRUE(mentions(e.what(), {"'broadcast:0-1k:warp'", "warp"}));
  }
}

// The environment is read once per process, so the variable is set in a fresh process: the
// "threadsafe" death-test style re-executes this test binary for the statement.
TEST(AlgoConfig, MalformedChorusAlgoVariableNamesEntry) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("CHORUS_ALGO", "allreduce:ring,reduce:0-1k-2k:direct", 1);
        chorusComm_t comms[2] = {};
        chorusResult_t result = chorusCommInitAll(comms, 2, nullptr);
        std::string message = chorusGetLastError(nullptr);
        std::fprintf(stderr, "result=%d message=%s\n", static_cast<int>(result), message.c_str());
        bool ok =
            result == chorusInvalidArgument && message.find("'reduce:0-1k-2k:direct'") != std::string::npos;
        std::fflush(stderr);
        _exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "result=4 message=.*CHORUS_ALGO entry 'reduce:0-1k-2k:direct'");
}

// ---- The cost model of the pipe algorithms ------------------------------------------------------

const char* modelChoice(OpKind kind, size_t bytes, int n, const std::string& linkClass = "shm-numa") {
  const algo::CostModel model = algo::CostModel::forLinkClass(linkClass);
  return tuning::select(opOf(kind, bytes, DataType::Uint8), n, /*haveShm=*/false, {}, &model).name;
}

// Without shared memory the model decides: log-depth algorithms for small messages, bandwidth-optimal
// ones for large; never a shared-memory algorithm.
TEST(CostModel, LatencyAlgorithmsSmallBandwidthAlgorithmsLarge) {
  for (int n : {4, 8, 16, 64}) {
    SCOPED_TRACE(n);
    EXPECT_STREQ(modelChoice(OpKind::AllReduce, 8, n), "rd");
    EXPECT_STREQ(modelChoice(OpKind::AllReduce, size_t{64} << 20, n), "rhd");
    EXPECT_STREQ(modelChoice(OpKind::Broadcast, 8, n), "knomial");
    EXPECT_STREQ(modelChoice(OpKind::Broadcast, size_t{64} << 20, n), "pipeline");
    EXPECT_STREQ(modelChoice(OpKind::Reduce, 8, n), "knomial");
    EXPECT_STREQ(modelChoice(OpKind::Reduce, size_t{64} << 20, n), "pipeline");
  }
  // Beyond a power of two, halving-doubling pays for folding the extra ranks: the ring wins large.
  EXPECT_STREQ(modelChoice(OpKind::AllReduce, size_t{64} << 20, 6), "ring");
  for (OpKind k : {OpKind::AllReduce, OpKind::ReduceScatter, OpKind::AllGather, OpKind::Broadcast,
                   OpKind::Reduce, OpKind::AllToAll, OpKind::Barrier}) {
    for (size_t bytes : {size_t{0}, size_t{8}, size_t{1} << 20}) {
      const char* name = modelChoice(k, bytes, 5);
      for (const auto& a : tuning::registry()) {
        if (a.kind == k && std::string(a.name) == name) {
          EXPECT_FALSE(a.needsSharedMemory) << name;
        }
      }
    }
  }
}

// The allreduce crossover from recursive doubling to halving-doubling moves to larger messages when
// each message costs more (the network class), and predictions grow with the message.
TEST(CostModel, CrossoverFollowsTheLinkClass) {
  const auto crossover = [](const std::string& link) {
    for (size_t b = 8; b <= (size_t{1} << 30); b *= 2) {
      if (std::string(modelChoice(OpKind::AllReduce, b, 8, link)) != "rd") return b;
    }
    return size_t{0};
  };
  const size_t local = crossover("shm-numa"), network = crossover("network");
  EXPECT_GT(local, 0u);
  EXPECT_GT(network, local);
  const algo::CostModel m = algo::CostModel::forLinkClass("shm-numa");
  for (const auto& a : tuning::registry()) {
    const double small = m.predictUs(a, opOf(a.kind, 1024, DataType::Uint8), 8);
    const double large = m.predictUs(a, opOf(a.kind, size_t{1} << 24, DataType::Uint8), 8);
    if (a.needsSharedMemory || std::string(a.name) == "hier") {
      EXPECT_LT(small, 0) << a.name;  // no formula, or (hierarchical) not on one host
    } else if (a.kind != OpKind::AllToAllv && a.kind != OpKind::Barrier) {
      EXPECT_GT(large, small) << opKindName(a.kind) << " " << a.name;
    }
  }
}

// Across hosts the model sees the host shape. On 8 hosts x 8 ranks with GPU-class links (NVLink-like
// within a host, one 50 GB/s NIC per rank across hosts), recursive doubling wins tiny messages,
// halving-doubling the middle, and the hierarchical allreduce large ones: it crosses hosts in
// 2 (H-1) steps carrying an eighth of the message each, and does the rest over the fast links. With
// CPU-class links (shared memory barely faster than the network) the largest messages go to the
// flat ring, which crosses each NIC once per step without serialising three phases.
TEST(CostModel, HierarchicalWinsWhenHostsHaveFastLinks) {
  algo::CostModel m;
  m.hosts = 8;
  m.ranksPerHost = 8;
  const auto choice = [&](size_t bytes) {
    return std::string(
        tuning::select(opOf(OpKind::AllReduce, bytes, DataType::Uint8), 64, false, {}, &m).name);
  };
  m.nicGBps = m.inter.GBps;
  EXPECT_EQ(choice(8), "rd");
  EXPECT_EQ(choice(size_t{256} << 20), "ring");
  m.intra = {"nvlink", 3.0, 150.0};
  m.inter = {"ib", 6.0, 50.0};
  m.nicGBps = 400;
  m.reduceGBps = 1000;
  EXPECT_EQ(choice(8), "rd");
  EXPECT_EQ(choice(size_t{2} << 20), "rhd");
  EXPECT_EQ(choice(size_t{32} << 20), "hier");
  EXPECT_EQ(choice(size_t{512} << 20), "hier");
  // Hosts of unequal size: no hierarchical prediction.
  const algo::Algorithm* hier = nullptr;
  for (const auto& a : tuning::registry()) {
    if (a.kind == OpKind::AllReduce && std::string(a.name) == "hier") hier = &a;
  }
  ASSERT_NE(hier, nullptr);
  m.ranksPerHost = 0;
  EXPECT_LT(m.predictUs(*hier, opOf(OpKind::AllReduce, 1 << 20, DataType::Uint8), 64), 0);
  EXPECT_NE(choice(size_t{512} << 20), "hier");
}

// The tree's chunk size is the pipelining optimum: it grows with the message, and with the cost of
// a round (alpha, or a scheduler's round on oversubscribed cores), and stays in its bounds.
TEST(CostModel, TreeChunkFollowsMessageSizeAndRoundCost) {
  algo::CostModel m;
  size_t prev = 0;
  for (size_t bytes = 1024; bytes <= (size_t{1} << 30); bytes *= 4) {
    const size_t c = m.treeChunkBytes(bytes, 8);
    EXPECT_GE(c, prev) << bytes;
    EXPECT_GE(c, algo::CostModel::kMinTreeChunk);
    EXPECT_LE(c, algo::CostModel::kMaxTreeChunk);
    EXPECT_EQ(c & (c - 1), 0u) << c;
    prev = c;
  }
  const size_t plain = m.treeChunkBytes(size_t{16} << 20, 4);
  m.roundUs = 25;
  EXPECT_GT(m.treeChunkBytes(size_t{16} << 20, 4), plain);
  // The chosen chunk is never predicted slower than the chunks next to it.
  const double big = static_cast<double>(size_t{64} << 20);
  const size_t c = m.treeChunkBytes(size_t{64} << 20, 16);
  const double at = m.treeUs(big, 16, static_cast<double>(c));
  EXPECT_LE(at, m.treeUs(big, 16, static_cast<double>(c / 2)));
  EXPECT_LE(at, m.treeUs(big, 16, static_cast<double>(c * 2)));
}

// Rules still come first, and with shared memory the built-in size rules decide.
TEST(CostModel, RulesAndSharedMemoryComeFirst) {
  const algo::CostModel model;
  const auto rules = tuning::parseRules("allreduce:ring");
  EXPECT_STREQ(tuning::select(opOf(OpKind::AllReduce, 2), 4, false, rules, &model).name, "ring");
  EXPECT_STREQ(tuning::select(opOf(OpKind::AllReduce, 2), 4, true, {}, &model).name, "ll");
  EXPECT_STREQ(tuning::select(opOf(OpKind::AllReduce, 1 << 20), 4, true, {}, &model).name, "direct");
}

// The device path (tuning::devicePath): decided from the abilities and the buffers, asking about a
// buffer only when the choice needs it (a call's unused buffer is never looked at).
struct Asked {
  std::vector<bool> calls;
  bool sendOnDevice = true, recvOnDevice = true;
  tuning::IsDeviceBuffer check() {
    return [this](bool send) {
      calls.push_back(send);
      return send ? sendOnDevice : recvOnDevice;
    };
  }
};

TEST(DevicePath, KernelsWhenAbleAndOnDeviceElseThroughHost) {
  const tuning::DeviceAbilities all{.collectiveKernels = true, .pointToPointKernels = true};
  Op ar = opOf(OpKind::AllReduce, 1024);
  Asked a;
  EXPECT_EQ(tuning::devicePath(ar, 0, 4, all, a.check()), tuning::DevicePath::CollectiveKernel);
  EXPECT_EQ(a.calls, (std::vector<bool>{true, false}));
  Asked none;
  EXPECT_EQ(tuning::devicePath(ar, 0, 4, {}, none.check()), tuning::DevicePath::ThroughHost);
  EXPECT_TRUE(none.calls.empty());
  Asked host;
  host.recvOnDevice = false;
  EXPECT_EQ(tuning::devicePath(ar, 0, 4, all, host.check()), tuning::DevicePath::ThroughHost);
  ar.count = 0;
  EXPECT_EQ(tuning::devicePath(ar, 0, 4, all, Asked{}.check()), tuning::DevicePath::Nothing);
  EXPECT_STREQ(tuning::devicePathName(tuning::DevicePath::ThroughHost), "through-host");
}

TEST(DevicePath, RootedCallsAskOnlyForTheBuffersTheRankUses) {
  const tuning::DeviceAbilities ipc{.collectiveKernels = true};
  Op bc = opOf(OpKind::Broadcast, 64);
  bc.root = 1;
  Asked nonRoot;
  nonRoot.sendOnDevice = false;  // a non-root's send buffer is not used
  EXPECT_EQ(tuning::devicePath(bc, 0, 2, ipc, nonRoot.check()), tuning::DevicePath::CollectiveKernel);
  EXPECT_EQ(nonRoot.calls, (std::vector<bool>{false}));
  Op red = opOf(OpKind::Reduce, 64);
  red.root = 0;
  Asked leaf;
  leaf.recvOnDevice = false;  // a non-root's receive buffer is not used
  EXPECT_EQ(tuning::devicePath(red, 1, 2, ipc, leaf.check()), tuning::DevicePath::CollectiveKernel);
  EXPECT_EQ(leaf.calls, (std::vector<bool>{true}));
}

TEST(DevicePath, PointToPointAndAllToAllv) {
  const tuning::DeviceAbilities p2p{.pointToPointKernels = true};
  Op send = opOf(OpKind::Send, 16);
  Asked s;
  EXPECT_EQ(tuning::devicePath(send, 0, 2, p2p, s.check()), tuning::DevicePath::PointToPointKernel);
  EXPECT_EQ(s.calls, (std::vector<bool>{true}));
  Op recv = opOf(OpKind::Recv, 16);
  Asked r;
  r.recvOnDevice = false;
  EXPECT_EQ(tuning::devicePath(recv, 0, 2, p2p, r.check()), tuning::DevicePath::ThroughHost);
  recv.count = 0;
  EXPECT_EQ(tuning::devicePath(recv, 0, 2, p2p, Asked{}.check()), tuning::DevicePath::Nothing);
  // alltoallv: a rank that sends nothing is not asked about its send buffer.
  Op v;
  v.kind = OpKind::AllToAllv;
  v.type = DataType::Float32;
  v.layout = std::make_shared<AllToAllvLayout>(AllToAllvLayout{{0, 0}, {0, 0}, {0, 3}, {0, 1}});
  Asked onlyRecv;
  onlyRecv.sendOnDevice = false;
  EXPECT_EQ(tuning::devicePath(v, 0, 2, p2p, onlyRecv.check()), tuning::DevicePath::AllToAllvKernel);
  EXPECT_EQ(onlyRecv.calls, (std::vector<bool>{false}));
  EXPECT_EQ(v.bufferBytes(0, 2), (std::pair<size_t, size_t>{0, 16}));
  v.layout = std::make_shared<AllToAllvLayout>(AllToAllvLayout{{0, 0}, {0, 0}, {0, 0}, {0, 1}});
  EXPECT_EQ(tuning::devicePath(v, 0, 2, p2p, Asked{}.check()), tuning::DevicePath::Nothing);
}

}  // namespace
