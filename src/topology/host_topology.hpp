// What one host is made of, as far as collectives care: packages, NUMA nodes, L3 domains, cores, the
// CPUs this process may run on, GPUs and NICs with their PCI addresses and NUMA locality, and the
// distance matrices the firmware or the vendor tools attached (NUMA latency, NVLink bandwidth).
//
// Discovered with hwloc (I/O devices kept), or read from an hwloc XML file named by CHORUS_TOPO_FILE
// (a machine that is not this one: its CPU binding is unknown and reported as every CPU). Builds
// without hwloc (CHORUS_WITH_HWLOC=OFF) fall back to what sched_getaffinity and sysfs tell.
// CHORUS_TOPO_DUMP_FILE=<path> writes what was found, as JSON.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace chorus::topo {

struct PciDevice {
  std::string kind;                  // "gpu" or "nic"
  std::string name;                  // the main OS device: cuda0, mlx5_0, eth0 ...
  std::vector<std::string> osNames;  // every OS device on it: cuda0 nvml0 / mlx5_0 ib0 ...
  std::string pciBusId;              // dddd:bb:dd.f
  std::string model;                 // hwloc's PCI model string, if any
  int numaNode = -1;                 // logical index of the nearest NUMA node, -1 if unknown
  int package = -1;                  // logical index of the package it hangs off, -1 if unknown
  std::string pciSwitch;             // bus id of the closest PCI bridge above it ("" if at a root port)
};

struct HostTopology {
  std::string source;  // "hwloc", "hwloc XML <path>", "sysfs"
  std::string hostname;
  int packages = 0;
  int numaNodes = 0;
  int l3Domains = 0;
  int cores = 0;
  int pus = 0;
  /// Bytes of the first L2 and L3 cache (per core and per L3 domain on the machines this runs on);
  /// 0 where the topology does not say.
  uint64_t l2Bytes = 0;
  uint64_t l3Bytes = 0;
  std::vector<int> puNuma;                     // NUMA node (logical) of each PU (by OS index); -1 if unknown
  std::vector<std::vector<int>> numaDistance;  // numaNodes x numaNodes, relative latency; empty if unknown
  std::vector<PciDevice> gpus;
  std::vector<PciDevice> nics;
  std::vector<std::vector<double>> nvlinkBandwidth;  // gpus x gpus in the order of `gpus`; empty if none
  bool thisSystem = true;                            // false for a topology read from a file

  nlohmann::ordered_json toJson() const;
  /// Throws chorus::Error(chorusRemoteError) on malformed JSON (it comes from another rank).
  static HostTopology fromJson(const nlohmann::json& j);
  /// Several lines, indented by `indent`.
  std::string describe(const std::string& indent = "  ") const;
  /// NUMA node of a set of PUs (OS indices): the node if they all share one, else -1.
  int numaOf(const std::vector<int>& pus) const;
};

/// This host, discovered once per process (CHORUS_TOPO_FILE and CHORUS_TOPO_DUMP_FILE honoured).
/// Throws chorus::Error with the cause when hwloc cannot load (e.g. a bad CHORUS_TOPO_FILE).
const HostTopology& localHost();

/// Loads `path` (an hwloc XML file) without caching. Throws chorus::Error naming the file.
HostTopology loadXml(const std::string& path);

/// The OS indices of the PUs the calling thread may run on.
std::vector<int> boundPus();

/// "0-3,8,10-11"
std::string formatCpuList(const std::vector<int>& pus);

/// True when this build discovers with hwloc.
bool haveHwloc();

}  // namespace chorus::topo
