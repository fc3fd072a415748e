// The simulator replays the library's own algorithm schedules: every pipe algorithm must replay to
// completion (every message matched) on many machine shapes, and predictions must follow closed
// forms and the link classes.
#include <gtest/gtest.h>

#include <string>

#include "algorithms/algorithm.hpp"
#include "base/error.hpp"
#include "sim/sim.hpp"
#include "tuning/tuning.hpp"

using namespace chorus;

namespace {

Op opOf(OpKind kind, size_t count, int root = 0) {
  Op op;
  op.kind = kind;
  op.type = DataType::Float32;
  op.op = ReduceOp::Sum;
  op.count = count;
  op.root = root;
  return op;
}

const algo::Algorithm& find(OpKind kind, const std::string& name) {
  for (const algo::Algorithm& a : tuning::registry()) {
    if (a.kind == kind && name == a.name) return a;
  }
  throw std::runtime_error("no algorithm " + name);
}

sim::Machine gpuCluster(int hosts, int perHost) {
  sim::Machine m;
  m.hosts = hosts;
  m.ranksPerHost = perHost;
  EXPECT_TRUE(sim::intraPreset("nvlink", m));
  EXPECT_TRUE(sim::interPreset("ib400", m));
  return m;
}

}  // namespace

// Two ranks, one chunk per message: the ring is a send and a reducing receive, then a send bound to
// that receive and a plain receive, so its time is 2 alpha + B/2 (2/send + 2/recv + 1/reduce).
TEST(Sim, TwoRankRingMatchesClosedForm) {
  sim::Machine m;
  m.hosts = 1;
  m.ranksPerHost = 2;
  m.intra = {"test", 2.0, 4.0, 8.0};
  m.reduceGBps = 16.0;
  m.chunkBytes = size_t{1} << 30;
  m.cores = 0;
  const size_t bytes = size_t{1} << 20;
  const sim::Result r = sim::simulate(find(OpKind::AllReduce, "ring"), opOf(OpKind::AllReduce, bytes / 4), m);
  ASSERT_TRUE(r.simulated);
  const double half = bytes / 2.0 / 1e3;  // bytes -> us at 1 GB/s
  const double want = 2 * 2.0 + half * (2 / 4.0 + 2 / 8.0 + 1 / 16.0);
  EXPECT_NEAR(r.us, want, want * 1e-9);
  EXPECT_EQ(r.transfers, 8u);  // 2 ranks x (2 sends + 2 receives)
  // Twice the cores' worth of ranks: engines run at half speed and messages take twice as long.
  m.cores = 1;
  const sim::Result slow =
      sim::simulate(find(OpKind::AllReduce, "ring"), opOf(OpKind::AllReduce, bytes / 4), m);
  EXPECT_NEAR(slow.us, 2 * want, want * 1e-9);
}

// Every pipe algorithm of every collective replays to completion (an unmatched message would leave
// a rank waiting, which simulate() reports as an error) on 1-3 hosts of 1-4 ranks, for empty, tiny,
// unaligned and pipelined sizes; shared-memory algorithms say why they are not simulated.
TEST(Sim, EveryPipeAlgorithmReplaysToCompletion) {
  for (int hosts = 1; hosts <= 3; ++hosts) {
    for (int perHost = 1; perHost <= 4; ++perHost) {
      sim::Machine m = gpuCluster(hosts, perHost);
      m.chunkBytes = 4096;
      const int n = hosts * perHost;
      for (const algo::Algorithm& a : tuning::registry()) {
        if (a.kind == OpKind::AllToAllv) continue;  // needs per-peer counts
        for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{65536}}) {
          SCOPED_TRACE(testing::Message() << opKindName(a.kind) << " " << a.name << " on " << hosts << "x"
                                          << perHost << ", count " << count);
          const sim::Result r = sim::simulate(a, opOf(a.kind, count, n - 1), m);
          if (a.needsSharedMemory) {
            EXPECT_FALSE(r.simulated);
            EXPECT_FALSE(r.why.empty());
            continue;
          }
          ASSERT_TRUE(r.simulated) << r.why;
          EXPECT_GE(r.us, 0.0);
          if (n > 1 && count > 0 && a.kind != OpKind::Barrier) {
            EXPECT_GT(r.us, 0.0);
          }
        }
      }
    }
  }
}

// On 4 hosts of 8 GPUs (NVLink within, a 400 Gb/s NIC per GPU across), recursive doubling wins an
// 8-byte allreduce and the hierarchical allreduce a 256 MiB one, with well above one NIC's bus
// bandwidth: each NIC carries an eighth of the data.
TEST(Sim, HierarchicalWinsLargeMessagesAcrossGpuHosts) {
  const sim::Machine m = gpuCluster(4, 8);
  auto us = [&](const char* name, size_t bytes) {
    const sim::Result r = sim::simulate(find(OpKind::AllReduce, name), opOf(OpKind::AllReduce, bytes / 4), m);
    EXPECT_TRUE(r.simulated);
    return r.us;
  };
  EXPECT_LT(us("rd", 8), us("ring", 8));
  EXPECT_LT(us("rd", 8), us("hier", 8));
  const size_t big = size_t{256} << 20;
  const double hier = us("hier", big);
  EXPECT_LT(hier, us("ring", big));
  EXPECT_LT(hier, us("rhd", big));
  EXPECT_GT(sim::busBandwidth(OpKind::AllReduce, big, 32, hier), 2 * m.inter.sendGBps);
}

// A flat ring across hosts with one 100 Gb/s NIC each approaches the NIC's rate in bus bandwidth.
TEST(Sim, FlatRingAcrossHostsIsBoundByTheNic) {
  sim::Machine m = gpuCluster(4, 1);
  ASSERT_TRUE(sim::interPreset("ib100", m));
  const size_t bytes = size_t{1} << 30;
  const sim::Result r = sim::simulate(find(OpKind::AllReduce, "ring"), opOf(OpKind::AllReduce, bytes / 4), m);
  const double busbw = sim::busBandwidth(OpKind::AllReduce, bytes, 4, r.us);
  EXPECT_LT(busbw, m.nicGBps * 1.0001);
  EXPECT_GT(busbw, m.nicGBps * 0.9);
}

// Past the simulator's limits a run is not simulated, and the result says why.
TEST(Sim, LimitsAreReportedNotExceeded) {
  sim::Machine m = gpuCluster(2, 2);
  m.chunkBytes = 64;
  const sim::Result chunks =
      sim::simulate(find(OpKind::AllReduce, "ring"), opOf(OpKind::AllReduce, size_t{1} << 24), m, 1000);
  EXPECT_FALSE(chunks.simulated);
  EXPECT_NE(chunks.why.find("limit 1000"), std::string::npos) << chunks.why;
  // 4,096 ranks of a flat ring: 16,380 messages per rank, beyond the recording limit.
  const sim::Result ring =
      sim::simulate(find(OpKind::AllReduce, "ring"), opOf(OpKind::AllReduce, 1 << 20), gpuCluster(512, 8));
  EXPECT_FALSE(ring.simulated);
  EXPECT_NE(ring.why.find("too large"), std::string::npos) << ring.why;
}
