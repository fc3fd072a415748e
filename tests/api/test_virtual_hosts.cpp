// Emulated hosts (CHORUS_VIRTUAL_HOSTS): the ranks of this machine split into blocks that play
// separate hosts, so the multi-host algorithms and the cost-model tuner run here.
// Each test sets Config::virtualHosts for its communicators (no environment, no re-executed child).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "chorus/chorus.hpp"
#include "core/comm_impl.hpp"
#include "topology/comm_topology.hpp"
#include "tuning/tuning.hpp"

using namespace chorus;

namespace {

Config configFor(const std::string& algo, int hosts) {
  Config c;
  c.timeout = std::chrono::seconds(30);
  c.algo = algo;
  c.virtualHosts = hosts;
  return c;
}

// Runs fn(comm, rank) on one thread per rank; returns the number of ranks that threw.
template <typename Fn>
int runRanks(std::vector<Communicator>& comms, Fn&& fn) {
  std::vector<std::thread> threads;
  std::vector<int> failed(comms.size(), 0);
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(comms[r], static_cast<int>(r));
      } catch (const Error& e) {
        std::fprintf(stderr, "rank %zu threw: %s\n", r, e.what());
        failed[r] = 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  int n = 0;
  for (int f : failed) n += f;
  return n;
}

// Input of rank r at element i: small integers, so sums are exact in float32.
float inputOf(int r, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(r) * 3) % 5) - 2);
}

// Allreduce of `count` float32 elements with `algo` forced (empty: the tuner's choice) on `n` ranks,
// out of place with sum and in place with avg; returns the number of wrong elements on all ranks.
long checkAllReduce(int n, int hosts, const std::string& algo, size_t count) {
  auto comms = Communicator::createLocal(n, configFor(algo.empty() ? "" : "allreduce:" + algo, hosts));
  std::vector<long> wrong(static_cast<size_t>(n), 0);
  int threw = runRanks(comms, [&](Communicator& c, int r) {
    std::vector<float> in(count), out(count, 99.0f), io(count);
    for (size_t i = 0; i < count; ++i) in[i] = io[i] = inputOf(r, i);
    c.allReduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
    c.allReduce(io.data(), io.data(), count, DataType::Float32, ReduceOp::Avg);
    for (size_t i = 0; i < count; ++i) {
      float sum = 0;
      for (int q = 0; q < n; ++q) sum += inputOf(q, i);
      const float avg = sum / static_cast<float>(n);
      if (out[i] != sum || std::abs(io[i] - avg) > 1e-6f * std::max(1.0f, std::abs(avg))) {
        if (wrong[static_cast<size_t>(r)]++ < 2)
          std::fprintf(stderr, "%d ranks, %s, count %zu: rank %d [%zu] sum %g (want %g) avg %g (want %g)\n",
                       n, algo.c_str(), count, r, i, out[i], sum, io[i], avg);
      }
    }
  });
  long total = threw * 1000000L;
  for (long w : wrong) total += w;
  return total;
}

// TunerChoicesAgreeWithMeasuredTimes: true when the choices agree.
bool tunerChoicesAgree() {
  const int hosts = 2, n = 4;
  // float32 elements: 256 B (every rank's block of halving-doubling non-empty) and 16 MiB.
  const size_t sizes[2] = {64, size_t{4} << 20};
  std::string choice[2];
  {
    auto comms = Communicator::createLocal(n, configFor("", hosts));
    const algo::CostModel& model = *comms[0].impl()->costModel();
    for (int s = 0; s < 2; ++s) {
      Op op;
      op.kind = OpKind::AllReduce;
      op.type = DataType::Float32;
      op.count = sizes[s];
      choice[s] = tuning::select(op, n, false, {}, &model).name;
    }
  }
  if (choice[0] == choice[1]) {
    std::fprintf(stderr, "the same choice for both sizes: %s\n", choice[0].c_str());
    return false;
  }
  // Both choices run at both sizes, alternating call by call so that drift hits both alike;
  // t[s][a] is rank 0's median microseconds at size s for the choice made for size a.
  auto a0 = Communicator::createLocal(n, configFor("allreduce:" + choice[0], hosts));
  auto a1 = Communicator::createLocal(n, configFor("allreduce:" + choice[1], hosts));
  double t[2][2];
  for (int s = 0; s < 2; ++s) {
    const size_t count = sizes[s];
    const int reps = s == 0 ? 400 : 9;
    std::vector<double> us[2];
    runRanks(a0, [&](Communicator&, int r) {
      Communicator* comm[2] = {&a0[static_cast<size_t>(r)], &a1[static_cast<size_t>(r)]};
      std::vector<float> in(count, 1.0f), out(count);
      for (int i = 0; i < 2 * reps + 4; ++i) {
        Communicator& c = *comm[i % 2];
        c.barrier();
        auto t0 = std::chrono::steady_clock::now();
        c.allReduce(in.data(), out.data(), count, DataType::Float32, ReduceOp::Sum);
        auto t1 = std::chrono::steady_clock::now();
        if (r == 0 && i >= 4) us[i % 2].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    });
    for (int a = 0; a < 2; ++a) {
      std::nth_element(us[a].begin(), us[a].begin() + static_cast<long>(us[a].size() / 2), us[a].end());
      t[s][a] = us[a][us[a].size() / 2];
    }
  }
  std::fprintf(stderr, "choices: 256 B -> %s, 16 MiB -> %s\n", choice[0].c_str(), choice[1].c_str());
  std::fprintf(stderr, "256 B: %s %.1f us, %s %.1f us; 16 MiB: %s %.0f us, %s %.0f us\n", choice[0].c_str(),
               t[0][0], choice[1].c_str(), t[0][1], choice[0].c_str(), t[1][0], choice[1].c_str(), t[1][1]);
  const bool ok = t[0][0] < t[0][1] && t[1][1] < t[1][0];
  std::fprintf(stderr, "%s\n", ok ? "agree" : "DISAGREE");
  std::fflush(stderr);
  return ok;
}

// With `hosts` emulated hosts and each rank count of `ranks`, checks the topology and every pipe
// allreduce; appends what it found to `*log` and returns the number of wrong results.
long multiHostAllReduces(int hosts, std::initializer_list<int> ranks, std::string* log) {
  long bad = 0;
  for (int n : ranks) {
    {
      auto comms = Communicator::createLocal(n, configFor("", hosts));
      const topo::CommTopology& t = comms[0].impl()->topology();
      const bool ok = static_cast<int>(t.hosts.size()) == hosts &&
                      t.link(0, n - 1) == topo::LinkClass::CrossHost &&
                      comms[0].impl()->costModel()->hosts == hosts;
      *log += std::to_string(n) + " ranks: " + t.shape() + "; " + (ok ? "ok" : "WRONG") + "\n";
      if (!ok) ++bad;
    }
    for (const char* algo : {"hier", "ring", "rd", "rhd", "tree", ""}) {
      for (size_t count : {size_t{1}, size_t{1000}, size_t{300001}})
        bad += checkAllReduce(n, hosts, algo, count);
    }
  }
  return bad;
}

}  // namespace

// With emulated hosts, every pipe allreduce (hierarchical included) and the tuner's own choice give
// exact results (sum, and avg in place) for even and uneven host shapes (5 ranks on 2 hosts: 3 + 2,
// where the hierarchical algorithm runs as the flat ring), and the topology shows the hosts.
TEST(VirtualHosts, TwoHostsAllReducesAreExact) {
  std::string log;
  EXPECT_EQ(multiHostAllReduces(2, {2, 4, 5, 6}, &log), 0) << log;
  EXPECT_NE(log.find("4 ranks: 2 hosts x 2 ranks; ok"), std::string::npos) << log;
  EXPECT_NE(log.find("5 ranks: 2 hosts: 3 + 2 ranks; ok"), std::string::npos) << log;
}

TEST(VirtualHosts, ThreeHostsAllReducesAreExact) {
  std::string log;
  EXPECT_EQ(multiHostAllReduces(3, {3, 6, 8}, &log), 0) << log;
  EXPECT_NE(log.find("6 ranks: 3 hosts x 2 ranks; ok"), std::string::npos) << log;
  EXPECT_NE(log.find("8 ranks: 3 hosts: 3 + 3 + 2 ranks; ok"), std::string::npos) << log;
}

// Config::virtualHosts is per communicator: one of this process's communicators emulates hosts,
// another made at the same time does not.
TEST(VirtualHosts, SetPerCommunicatorNotPerProcess) {
  auto split = Communicator::createLocal(4, configFor("", 2));
  auto whole = Communicator::createLocal(4, configFor("", 0));
  EXPECT_EQ(split[0].impl()->topology().hosts.size(), 2u);
  EXPECT_EQ(whole[0].impl()->topology().hosts.size(), 1u);
  EXPECT_EQ(split[0].impl()->config().virtualHosts, 2);
}

// The must-show of the tuner: on 2 emulated hosts x 2 ranks the cost model picks different
// allreduce algorithms for a 256-byte and a 16 MiB message, and running both choices at both sizes
// (alternating, medians of repeated calls) agrees with each choice: each is the faster at its own
// size. The measured gaps are about 2x both ways.
TEST(VirtualHosts, TunerChoicesAgreeWithMeasuredTimes) { EXPECT_TRUE(tunerChoicesAgree()); }
