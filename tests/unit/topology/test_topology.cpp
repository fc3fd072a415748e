// Topology discovery: the 8-GPU, 8-NIC, 2-socket node of tests/data read from its hwloc XML, this
// machine, the JSON round trip other ranks rely on, and a communicator's placement and link classes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "chorus/chorus.hpp"
#include "core/comm_impl.hpp"
#include "topology/cache_thresholds.hpp"
#include "topology/comm_topology.hpp"
#include "topology/host_topology.hpp"

#ifndef CHORUS_TEST_DATA
#error "CHORUS_TEST_DATA must name tests/data"
#endif

namespace chorus::topo {
namespace {

const std::string kDgx = std::string(CHORUS_TEST_DATA) + "/topologies/dgx8-2socket-8gpu-8nic.xml";

TEST(Topology, EightGpuNodeFromXml) {
  if (!haveHwloc()) GTEST_SKIP() << "built without hwloc";
  const HostTopology h = loadXml(kDgx);
  EXPECT_FALSE(h.thisSystem);
  EXPECT_EQ(h.packages, 2);
  EXPECT_EQ(h.numaNodes, 2);
  EXPECT_EQ(h.l3Domains, 8);
  EXPECT_EQ(h.cores, 56);
  EXPECT_EQ(h.pus, 112);
  ASSERT_EQ(h.numaDistance.size(), 2u);
  EXPECT_EQ(h.numaDistance[0], (std::vector<int>{10, 21}));
  EXPECT_EQ(h.numaDistance[1], (std::vector<int>{21, 10}));

  ASSERT_EQ(h.gpus.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    const PciDevice& g = h.gpus[i];
    SCOPED_TRACE(g.name);
    EXPECT_EQ(g.name, "cuda" + std::to_string(i));
    EXPECT_EQ(g.osNames, (std::vector<std::string>{g.name, "nvml" + std::to_string(i)}));
    EXPECT_EQ(g.numaNode, i < 4 ? 0 : 1);
    EXPECT_EQ(g.package, i < 4 ? 0 : 1);
    EXPECT_EQ(g.model, "NVIDIA H200");
    EXPECT_FALSE(g.pciSwitch.empty());
  }
  ASSERT_EQ(h.nics.size(), 8u);
  std::set<std::string> switches;
  for (size_t i = 0; i < 8; ++i) {
    const PciDevice& n = h.nics[i];
    SCOPED_TRACE(n.name);
    EXPECT_EQ(n.name, "mlx5_" + std::to_string(i));
    EXPECT_EQ(n.osNames, (std::vector<std::string>{n.name, "ib" + std::to_string(i)}));
    EXPECT_EQ(n.numaNode, i < 4 ? 0 : 1);
    switches.insert(n.pciSwitch);
  }
  EXPECT_EQ(switches.size(), 4u) << "two NIC ports per PCIe switch, four switches";
  // GPUs 0 and 1 share a switch with NIC ports 0 and 1.
  EXPECT_EQ(h.gpus[0].pciSwitch, h.gpus[1].pciSwitch);
  EXPECT_EQ(h.gpus[0].pciSwitch, h.nics[0].pciSwitch);
  EXPECT_NE(h.gpus[0].pciSwitch, h.gpus[2].pciSwitch);

  ASSERT_EQ(h.nvlinkBandwidth.size(), 8u);
  for (size_t a = 0; a < 8; ++a) {
    for (size_t b = 0; b < 8; ++b)
      EXPECT_EQ(h.nvlinkBandwidth[a][b], a == b ? 0.0 : 450000.0) << a << "," << b;
  }
  // PUs 0-55 on NUMA 0, 56-111 on NUMA 1 (the XML numbers PUs package by package).
  EXPECT_EQ(h.numaOf({0, 1, 2}), 0);
  EXPECT_EQ(h.numaOf({60, 61}), 1);
  EXPECT_EQ(h.numaOf({0, 60}), -1);
}

TEST(Topology, JsonRoundTripKeepsEverything) {
  if (!haveHwloc()) GTEST_SKIP() << "built without hwloc";
  const HostTopology h = loadXml(kDgx);
  const HostTopology back = HostTopology::fromJson(nlohmann::json::parse(h.toJson().dump()));
  EXPECT_EQ(back.toJson().dump(), h.toJson().dump());
  EXPECT_EQ(back.describe(), h.describe());
}

TEST(Topology, MalformedJsonIsAnErrorNotACrash) {
  for (const char* text : {"{}", "[]", R"({"source": 3})", "null"}) {
    try {
      HostTopology::fromJson(nlohmann::json::parse(text));
      ADD_FAILURE() << "accepted " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), chorusRemoteError) << text;
    }
  }
}

TEST(Topology, BadXmlFileIsNamed) {
  if (!haveHwloc()) GTEST_SKIP() << "built without hwloc";
  try {
    loadXml("/nonexistent/machine.xml");
    ADD_FAILURE() << "loaded a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/machine.xml"), std::string::npos) << e.what();
  }
}

TEST(Topology, ThisMachine) {
  const HostTopology& h = localHost();
  EXPECT_TRUE(h.thisSystem);
  EXPECT_GE(h.pus, 1);
  EXPECT_GE(h.cores, 1);
  EXPECT_GE(h.numaNodes, 1);
  EXPECT_GE(h.packages, 1);
  const auto pus = boundPus();
  ASSERT_FALSE(pus.empty());
  EXPECT_GE(h.numaOf(pus), h.numaNodes == 1 ? 0 : -1);
}

TEST(Topology, CpuListsAreCompact) {
  EXPECT_EQ(formatCpuList({}), "none");
  EXPECT_EQ(formatCpuList({3}), "3");
  EXPECT_EQ(formatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(formatCpuList({5, 4, 4, 6}), "4-6");
}

TEST(Topology, CommunicatorPlacementAndLinks) {
  auto comms = Communicator::createLocal(3);
  for (const auto& c : comms) {
    const CommTopology& t = c.impl()->topology();
    ASSERT_EQ(t.size(), 3);
    ASSERT_EQ(t.hosts.size(), 1u);
    EXPECT_EQ(t.shape(), "1 host x 3 ranks");
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(t.ranks[static_cast<size_t>(r)].host, 0);
      EXPECT_EQ(t.ranks[static_cast<size_t>(r)].localRank, r);
      EXPECT_FALSE(t.ranks[static_cast<size_t>(r)].pus.empty());
      EXPECT_EQ(t.localSize(r), 3);
      EXPECT_EQ(t.link(r, r), LinkClass::Self);
    }
    const LinkClass expected = t.hosts[0].numaNodes == 1 ? LinkClass::SameNuma : t.link(0, 1);
    EXPECT_EQ(t.link(0, 1), expected);
    const auto j = t.toJson();
    EXPECT_EQ(j["links"][0][0], "self");
    EXPECT_EQ(j["ranks"].size(), 3u);
  }
}

TEST(Topology, LinkClassesOfAHandMadeTwoHostJob) {
  // 2 hosts of the 8-GPU node, 2 ranks each: one rank per NUMA node on each host.
  if (!haveHwloc()) GTEST_SKIP() << "built without hwloc";
  CommTopology t;
  t.hosts = {loadXml(kDgx), loadXml(kDgx)};
  t.ranks = {{0, 0, {0}, 0}, {0, 1, {60}, 1}, {1, 0, {1}, 0}, {1, 1, {2}, 0}};
  EXPECT_EQ(t.shape(), "2 hosts x 2 ranks");
  EXPECT_EQ(t.link(0, 1), LinkClass::CrossNuma);
  EXPECT_EQ(t.link(2, 3), LinkClass::SameNuma);
  EXPECT_EQ(t.link(0, 2), LinkClass::CrossHost);
  EXPECT_EQ(t.link(1, 1), LinkClass::Self);
  t.ranks.push_back({1, 2, {3}, 0});
  EXPECT_EQ(t.shape(), "2 hosts: 2 + 3 ranks");
}

// Thresholds from the machine's caches (topology/cache_thresholds): an 8-core part with 512 KiB
// of L2 (an EPYC-like synthetic topology), one whose topology names no caches, and the clamps.
TEST(CacheThresholds, FromTheL2OfAnXmlTopology) {
  if (!haveHwloc()) GTEST_SKIP() << "built without hwloc";
  const HostTopology h =
      loadXml(std::string(CHORUS_TEST_DATA) + "/topologies/synthetic-8core-l2-512k-l3-32m.xml");
  EXPECT_EQ(h.l2Bytes, uint64_t{512} << 10);
  EXPECT_EQ(h.l3Bytes, uint64_t{32} << 20);
  const CacheThresholds t = cacheThresholdsFor(h);
  EXPECT_EQ(t.ntStoreBytes, size_t{32} << 20);  // the L3
  EXPECT_EQ(t.stageBytes, size_t{256} << 10);
  EXPECT_EQ(t.basis, "from L2 512 KiB and L3 32 MiB");
  // The sizes survive the JSON exchange between ranks.
  EXPECT_EQ(HostTopology::fromJson(h.toJson()).l2Bytes, h.l2Bytes);

  const HostTopology none =
      loadXml(std::string(CHORUS_TEST_DATA) + "/topologies/synthetic-4core-no-caches.xml");
  EXPECT_EQ(none.l2Bytes, 0u);
  const CacheThresholds d = cacheThresholdsFor(none);
  EXPECT_EQ(d.ntStoreBytes, size_t{4} << 20);
  EXPECT_EQ(d.stageBytes, size_t{1} << 20);
  EXPECT_EQ(d.basis, "L2 unknown: defaults");
}

TEST(CacheThresholds, TheFormulasAndTheirBounds) {
  auto with = [](uint64_t l2, uint64_t l3 = 0) {
    HostTopology h;
    h.l2Bytes = l2;
    h.l3Bytes = l3;
    return cacheThresholdsFor(h);
  };
  EXPECT_EQ(with(uint64_t{1} << 20, uint64_t{32} << 20).ntStoreBytes, size_t{32} << 20);  // the EPYC VM
  EXPECT_EQ(with(uint64_t{1} << 20, uint64_t{32} << 20).basis, "from L2 1 MiB and L3 32 MiB");
  EXPECT_EQ(with(uint64_t{2} << 20, uint64_t{260} << 20).ntStoreBytes, size_t{64} << 20);  // the Xeon VM
  EXPECT_EQ(with(uint64_t{4} << 20, uint64_t{4} << 20).ntStoreBytes, size_t{8} << 20);     // 2 x L2 > L3
  EXPECT_EQ(with(uint64_t{2} << 20).ntStoreBytes, size_t{4} << 20);  // L3 unknown: 2 x L2
  EXPECT_EQ(with(uint64_t{2} << 20).basis, "from L2 2 MiB");
  EXPECT_EQ(with(uint64_t{2} << 20).stageBytes, size_t{1} << 20);
  EXPECT_EQ(with(uint64_t{1280} << 10).stageBytes, size_t{512} << 10);  // 1.25 MiB: rounded down
  EXPECT_EQ(with(uint64_t{64} << 10).ntStoreBytes, size_t{1} << 20);    // clamped below
  EXPECT_EQ(with(uint64_t{64} << 10).stageBytes, size_t{256} << 10);
  EXPECT_EQ(with(uint64_t{256} << 20).ntStoreBytes, size_t{64} << 20);  // clamped above
  EXPECT_EQ(with(uint64_t{256} << 20).stageBytes, size_t{8} << 20);
}

// A JSON topology from a rank of an older build, without cache sizes, still reads.
TEST(CacheThresholds, JsonWithoutCacheSizesReads) {
  HostTopology h;
  h.source = "sysfs";
  h.packages = h.numaNodes = h.l3Domains = 1;
  h.cores = h.pus = 2;
  h.puNuma = {0, 0};
  nlohmann::json j = h.toJson();
  j.erase("l2_bytes");
  j.erase("l3_bytes");
  EXPECT_EQ(HostTopology::fromJson(j).l2Bytes, 0u);
}

}  // namespace
}  // namespace chorus::topo
