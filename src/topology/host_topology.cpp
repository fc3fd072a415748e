#include "topology/host_topology.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/config.hpp"
#include "base/error.hpp"
#include "base/log.hpp"

#if CHORUS_HAVE_HWLOC
#include <hwloc.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define CHORUS_ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CHORUS_ASAN_BUILD 1
#endif
#endif
#ifndef CHORUS_ASAN_BUILD
#define CHORUS_ASAN_BUILD 0
#endif

namespace chorus::topo {
namespace {

using Json = nlohmann::ordered_json;

std::string localHostname() {
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

#if CHORUS_HAVE_HWLOC

// Owns an hwloc topology.
class Hwloc {
 public:
  Hwloc() {
    if (hwloc_topology_init(&t_) != 0) fail(chorusSystemError, "hwloc_topology_init failed");
  }
  ~Hwloc() { hwloc_topology_destroy(t_); }
  Hwloc(const Hwloc&) = delete;
  Hwloc& operator=(const Hwloc&) = delete;
  hwloc_topology_t get() const { return t_; }

 private:
  hwloc_topology_t t_ = nullptr;
};

std::string busId(hwloc_obj_t pci) {
  char text[32];
  std::snprintf(text, sizeof text, "%04x:%02x:%02x.%01x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return text;
}

const char* info(hwloc_obj_t obj, const char* name) {
  const char* v = obj ? hwloc_obj_get_info_by_name(obj, name) : nullptr;
  return v ? v : "";
}

// The NUMA node (logical index) whose CPUs contain `cpuset`, or -1.
int numaCovering(hwloc_topology_t t, hwloc_const_cpuset_t cpuset) {
  if (!cpuset || hwloc_bitmap_iszero(cpuset)) return -1;
  const int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    if (node->cpuset && hwloc_bitmap_isincluded(cpuset, node->cpuset))
      return static_cast<int>(node->logical_index);
  }
  return -1;
}

// Where an OS device sits: its PCI device, the bridge above that, its NUMA node and package.
void placeDevice(hwloc_topology_t t, hwloc_obj_t osdev, PciDevice& d) {
  hwloc_obj_t pci = osdev->parent;
  while (pci && pci->type != HWLOC_OBJ_PCI_DEVICE) pci = pci->parent;
  if (pci) {
    d.pciBusId = busId(pci);
    d.model = info(pci, "PCIDevice");
    for (hwloc_obj_t up = pci->parent; up && up->type == HWLOC_OBJ_BRIDGE; up = up->parent) {
      if (up->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI) {
        d.pciSwitch = busId(up);
        break;
      }
    }
  }
  hwloc_obj_t cpuside = hwloc_get_non_io_ancestor_obj(t, osdev);
  if (cpuside) {
    d.numaNode = numaCovering(t, cpuside->cpuset);
    hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, cpuside);
    if (!pkg && cpuside->type == HWLOC_OBJ_PACKAGE) pkg = cpuside;
    if (pkg) d.package = static_cast<int>(pkg->logical_index);
  }
}

HostTopology fromHwloc(hwloc_topology_t t, std::string source) {
  HostTopology h;
  h.source = std::move(source);
  h.thisSystem = hwloc_topology_is_thissystem(t) != 0;
  h.hostname = h.thisSystem ? localHostname() : info(hwloc_get_root_obj(t), "HostName");
  h.packages = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE);
  h.numaNodes = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  h.l3Domains = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_L3CACHE);
  h.cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  h.pus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
  if (hwloc_obj_t l2 = hwloc_get_obj_by_type(t, HWLOC_OBJ_L2CACHE, 0)) h.l2Bytes = l2->attr->cache.size;
  if (hwloc_obj_t l3 = hwloc_get_obj_by_type(t, HWLOC_OBJ_L3CACHE, 0)) h.l3Bytes = l3->attr->cache.size;
  for (int i = 0; i < h.pus; ++i) {
    hwloc_obj_t pu = hwloc_get_obj_by_type(t, HWLOC_OBJ_PU, static_cast<unsigned>(i));
    if (pu->os_index >= h.puNuma.size()) h.puNuma.resize(pu->os_index + 1, -1);
    h.puNuma[pu->os_index] = numaCovering(t, pu->cpuset);
  }

  // NUMA latencies, when the firmware (or the XML) gives them.
  {
    unsigned nr = 1;
    hwloc_distances_s* dist = nullptr;
    if (hwloc_distances_get_by_type(t, HWLOC_OBJ_NUMANODE, &nr, &dist, HWLOC_DISTANCES_KIND_MEANS_LATENCY,
                                    0) == 0 &&
        nr == 1) {
      const unsigned n = dist->nbobjs;
      h.numaDistance.assign(n, std::vector<int>(n, 0));
      for (unsigned a = 0; a < n; ++a) {
        for (unsigned b = 0; b < n; ++b) {
          h.numaDistance[dist->objs[a]->logical_index][dist->objs[b]->logical_index] =
              static_cast<int>(dist->values[a * n + b]);
        }
      }
      hwloc_distances_release(t, dist);
    }
  }

  // GPUs: CUDA co-processors (with their NVML twin); NICs: one per RDMA device (port), with the
  // network interface that pairs with it on the same PCI function; plain network interfaces on PCI
  // (Ethernet, virtio) count as NICs too.
  std::map<hwloc_obj_t, std::vector<hwloc_obj_t>> byPci;  // OS devices by their PCI device, in order
  for (hwloc_obj_t o = hwloc_get_next_osdev(t, nullptr); o; o = hwloc_get_next_osdev(t, o)) {
    hwloc_obj_t pci = o->parent;
    while (pci && pci->type != HWLOC_OBJ_PCI_DEVICE) pci = pci->parent;
    byPci[pci].push_back(o);
  }
  std::map<hwloc_obj_t, int> gpuIndexOfOsdev;
  for (hwloc_obj_t o = hwloc_get_next_osdev(t, nullptr); o; o = hwloc_get_next_osdev(t, o)) {
    const auto type = o->attr->osdev.type;
    const std::string name = o->name ? o->name : "";
    if (type == HWLOC_OBJ_OSDEV_COPROC && std::strcmp(info(o, "CoProcType"), "CUDA") == 0) {
      PciDevice d;
      d.kind = "gpu";
      d.name = name;
      d.osNames.push_back(name);
      placeDevice(t, o, d);
      hwloc_obj_t pci = o->parent;
      while (pci && pci->type != HWLOC_OBJ_PCI_DEVICE) pci = pci->parent;
      for (hwloc_obj_t sib : byPci[pci]) {
        if (sib != o && sib->name && std::strncmp(sib->name, "nvml", 4) == 0) d.osNames.push_back(sib->name);
      }
      if (const char* model = info(o, "GPUModel"); *model) d.model = model;
      gpuIndexOfOsdev[o] = static_cast<int>(h.gpus.size());
      h.gpus.push_back(std::move(d));
    }
  }
  for (auto& [pci, devs] : byPci) {
    std::vector<hwloc_obj_t> rdma, net;
    for (hwloc_obj_t o : devs) {
      if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) rdma.push_back(o);
      if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK) net.push_back(o);
    }
    const auto& mains = rdma.empty() ? net : rdma;
    for (size_t i = 0; i < mains.size(); ++i) {
      PciDevice d;
      d.kind = "nic";
      d.name = mains[i]->name ? mains[i]->name : "";
      d.osNames.push_back(d.name);
      if (!rdma.empty() && i < net.size() && net[i]->name) d.osNames.push_back(net[i]->name);
      placeDevice(t, mains[i], d);
      h.nics.push_back(std::move(d));
    }
  }
  std::sort(h.nics.begin(), h.nics.end(), [](const PciDevice& a, const PciDevice& b) {
    return a.pciBusId != b.pciBusId ? a.pciBusId < b.pciBusId : a.name < b.name;
  });

  // NVLink bandwidth between GPUs (attached by NVML-aware tools, or in the XML).
  {
    unsigned nr = 1;
    hwloc_distances_s* dist = nullptr;
    if (!h.gpus.empty() && hwloc_distances_get_by_name(t, "NVLinkBandwidth", &nr, &dist, 0) == 0 && nr == 1) {
      const unsigned n = dist->nbobjs;
      h.nvlinkBandwidth.assign(h.gpus.size(), std::vector<double>(h.gpus.size(), 0.0));
      for (unsigned a = 0; a < n; ++a) {
        for (unsigned b = 0; b < n; ++b) {
          auto ia = gpuIndexOfOsdev.find(dist->objs[a]);
          auto ib = gpuIndexOfOsdev.find(dist->objs[b]);
          if (ia == gpuIndexOfOsdev.end() || ib == gpuIndexOfOsdev.end()) continue;
          h.nvlinkBandwidth[static_cast<size_t>(ia->second)][static_cast<size_t>(ib->second)] =
              static_cast<double>(dist->values[a * n + b]);
        }
      }
      hwloc_distances_release(t, dist);
    }
  }
  return h;
}

HostTopology discoverWithHwloc(const std::string& xml) {
  Hwloc t;
  hwloc_topology_set_io_types_filter(t.get(), HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
#if CHORUS_ASAN_BUILD
  // hwloc's PCI plugin (libpciaccess) leaks about 1 KiB once and is unloaded before LeakSanitizer
  // looks, so the report cannot be suppressed by name; and plugins unloaded at topology destruction
  // make LeakSanitizer's tracer crash at exit in about half the runs of a process. AddressSanitizer
  // builds discover the machine without these plugins (the tests read devices from XML files).
  if (xml.empty()) {
    for (const char* plugin : {"pci", "opencl", "gl"}) {
      hwloc_topology_set_components(t.get(), HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, plugin);
    }
  }
#endif
  if (!xml.empty()) {
    if (hwloc_topology_set_xml(t.get(), xml.c_str()) != 0) {
      fail(chorusInvalidArgument,
           strCat("CHORUS_TOPO_FILE '", xml, "': hwloc cannot read it as an XML topology (",
                  std::strerror(errno), ")"));
    }
  }
  if (hwloc_topology_load(t.get()) != 0) {
    fail(chorusSystemError,
         xml.empty()
             ? strCat("hwloc could not discover this machine: ", std::strerror(errno))
             : strCat("CHORUS_TOPO_FILE '", xml, "': hwloc could not load it: ", std::strerror(errno)));
  }
  return fromHwloc(t.get(), xml.empty() ? "hwloc" : "hwloc XML " + xml);
}

#endif  // CHORUS_HAVE_HWLOC

#if !CHORUS_HAVE_HWLOC
// Without hwloc: one package and NUMA node holding the CPUs the kernel lists, no devices.
HostTopology discoverFallback() {
  HostTopology h;
  h.source = "sysfs";
  h.hostname = localHostname();
  const long online = ::sysconf(_SC_NPROCESSORS_CONF);
  h.packages = 1;
  h.numaNodes = 1;
  h.l3Domains = 1;
  h.pus = static_cast<int>(std::max(1L, online));
  h.cores = h.pus;
  h.l2Bytes = static_cast<uint64_t>(std::max(0L, ::sysconf(_SC_LEVEL2_CACHE_SIZE)));
  h.l3Bytes = static_cast<uint64_t>(std::max(0L, ::sysconf(_SC_LEVEL3_CACHE_SIZE)));
  h.puNuma.assign(static_cast<size_t>(h.pus), 0);
  return h;
}
#endif

Json deviceJson(const PciDevice& d) {
  return Json{{"kind", d.kind},           {"name", d.name},           {"os_names", d.osNames},
              {"pci_bus_id", d.pciBusId}, {"model", d.model},         {"numa_node", d.numaNode},
              {"package", d.package},     {"pci_switch", d.pciSwitch}};
}

PciDevice deviceFromJson(const nlohmann::json& j) {
  PciDevice d;
  d.kind = j.at("kind").get<std::string>();
  d.name = j.at("name").get<std::string>();
  d.osNames = j.at("os_names").get<std::vector<std::string>>();
  d.pciBusId = j.at("pci_bus_id").get<std::string>();
  d.model = j.at("model").get<std::string>();
  d.numaNode = j.at("numa_node").get<int>();
  d.package = j.at("package").get<int>();
  d.pciSwitch = j.at("pci_switch").get<std::string>();
  return d;
}

}  // namespace

bool haveHwloc() { return CHORUS_HAVE_HWLOC != 0; }

Json HostTopology::toJson() const {
  Json j;
  j["source"] = source;
  j["hostname"] = hostname;
  j["this_system"] = thisSystem;
  j["packages"] = packages;
  j["numa_nodes"] = numaNodes;
  j["l3_domains"] = l3Domains;
  j["cores"] = cores;
  j["pus"] = pus;
  j["l2_bytes"] = l2Bytes;
  j["l3_bytes"] = l3Bytes;
  j["pu_numa"] = puNuma;
  j["numa_distance"] = numaDistance;
  Json g = Json::array(), n = Json::array();
  for (const auto& d : gpus) g.push_back(deviceJson(d));
  for (const auto& d : nics) n.push_back(deviceJson(d));
  j["gpus"] = std::move(g);
  j["nics"] = std::move(n);
  j["nvlink_bandwidth"] = nvlinkBandwidth;
  return j;
}

HostTopology HostTopology::fromJson(const nlohmann::json& j) {
  try {
    HostTopology h;
    h.source = j.at("source").get<std::string>();
    h.hostname = j.at("hostname").get<std::string>();
    h.thisSystem = j.at("this_system").get<bool>();
    h.packages = j.at("packages").get<int>();
    h.numaNodes = j.at("numa_nodes").get<int>();
    h.l3Domains = j.at("l3_domains").get<int>();
    h.cores = j.at("cores").get<int>();
    h.pus = j.at("pus").get<int>();
    h.l2Bytes = j.value("l2_bytes", uint64_t{0});  // absent from ranks of older builds
    h.l3Bytes = j.value("l3_bytes", uint64_t{0});
    h.puNuma = j.at("pu_numa").get<std::vector<int>>();
    h.numaDistance = j.at("numa_distance").get<std::vector<std::vector<int>>>();
    for (const auto& d : j.at("gpus")) h.gpus.push_back(deviceFromJson(d));
    for (const auto& d : j.at("nics")) h.nics.push_back(deviceFromJson(d));
    h.nvlinkBandwidth = j.at("nvlink_bandwidth").get<std::vector<std::vector<double>>>();
    return h;
  } catch (const nlohmann::json::exception& e) {
    fail(chorusRemoteError, strCat("malformed host topology: ", e.what()));
  }
}

int HostTopology::numaOf(const std::vector<int>& pus) const {
  int node = -2;
  for (int pu : pus) {
    const int n = pu >= 0 && static_cast<size_t>(pu) < puNuma.size() ? puNuma[static_cast<size_t>(pu)] : -1;
    if (node == -2) {
      node = n;
    } else if (node != n) {
      return -1;
    }
  }
  return node == -2 ? -1 : node;
}

std::string formatCpuList(const std::vector<int>& pus) {
  std::vector<int> s = pus;
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    while (j + 1 < s.size() && s[j + 1] == s[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? std::to_string(s[i]) : strCat(s[i], "-", s[j]);
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

std::string HostTopology::describe(const std::string& indent) const {
  std::string out = strCat(indent, "host ", hostname.empty() ? "(unnamed)" : hostname, " (", source,
                           thisSystem ? "" : ", not this machine", ")\n");
  out += strCat(indent, "  ", packages, " package(s), ", numaNodes, " NUMA node(s), ", l3Domains,
                " L3 domain(s), ", cores, " cores, ", pus, " hardware threads\n");
  out += strCat(indent, "  caches: L2 ", l2Bytes ? formatBytes(l2Bytes) : std::string("unknown"), ", L3 ",
                l3Bytes ? formatBytes(l3Bytes) : std::string("unknown"), "\n");
  for (int n = 0; n < numaNodes; ++n) {
    std::vector<int> cpus;
    for (size_t pu = 0; pu < puNuma.size(); ++pu) {
      if (puNuma[pu] == n) cpus.push_back(static_cast<int>(pu));
    }
    out += strCat(indent, "  NUMA ", n, ": CPUs ", formatCpuList(cpus));
    if (static_cast<size_t>(n) < numaDistance.size()) {
      out += "; distances";
      for (int d : numaDistance[static_cast<size_t>(n)]) out += strCat(" ", d);
    }
    out += "\n";
  }
  const auto listDevices = [&](const char* title, const std::vector<PciDevice>& devs) {
    out += strCat(indent, "  ", devs.size(), " ", title, devs.empty() ? "\n" : ":\n");
    for (const auto& d : devs) {
      std::string names;
      for (const auto& n : d.osNames) names += (names.empty() ? "" : "/") + n;
      out += strCat(indent, "    ", names, "  pci ", d.pciBusId.empty() ? "?" : d.pciBusId, "  NUMA ",
                    d.numaNode, "  package ", d.package,
                    d.pciSwitch.empty() ? std::string() : strCat("  switch ", d.pciSwitch),
                    d.model.empty() ? std::string() : strCat("  ", d.model), "\n");
    }
  };
  listDevices("GPU(s)", gpus);
  listDevices("NIC(s)", nics);
  if (!nvlinkBandwidth.empty()) {
    out += strCat(indent, "  NVLink bandwidth between GPUs (as reported, MB/s):\n", indent, "    ",
                  std::string(8, ' '));
    for (const auto& g : gpus) {
      char cell[32];
      std::snprintf(cell, sizeof cell, " %8s", g.name.c_str());
      out += cell;
    }
    out += "\n";
    for (size_t a = 0; a < gpus.size(); ++a) {
      char head[32];
      std::snprintf(head, sizeof head, "%8s", gpus[a].name.c_str());
      out += strCat(indent, "    ", head);
      for (size_t b = 0; b < gpus.size(); ++b) {
        char cell[32];
        std::snprintf(cell, sizeof cell, " %8.0f", nvlinkBandwidth[a][b]);
        out += cell;
      }
      out += "\n";
    }
  }
  return out;
}

HostTopology loadXml(const std::string& path) {
#if CHORUS_HAVE_HWLOC
  return discoverWithHwloc(path);
#else
  fail(chorusInvalidUsage,
       strCat("CHORUS_TOPO_FILE '", path, "': this build has no hwloc (CHORUS_WITH_HWLOC=OFF)"));
#endif
}

const HostTopology& localHost() {
  static std::mutex mu;
  static std::optional<HostTopology> cached;
  std::lock_guard lk(mu);
  if (cached) return *cached;
  const std::string& file = envConfig().topoFile;
#if CHORUS_HAVE_HWLOC
  HostTopology h = discoverWithHwloc(file);
#else
  if (!file.empty()) loadXml(file);  // throws: no hwloc
  HostTopology h = discoverFallback();
#endif
  if (const std::string& dump = envConfig().topoDumpFile; !dump.empty()) {
    std::ofstream out(dump);
    out << h.toJson().dump(2) << "\n";
    if (!out) logWarn("CHORUS_TOPO_DUMP_FILE '", dump, "': could not write the topology");
  }
  cached = std::move(h);
  return *cached;
}

std::vector<int> boundPus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> pus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return pus;
  for (int i = 0; i < CPU_SETSIZE; ++i) {
    if (CPU_ISSET(i, &set)) pus.push_back(i);
  }
  return pus;
}

}  // namespace chorus::topo
