// chorus-sim: predicts the time and bus bandwidth of each collective algorithm on H hosts x G ranks
// with given link classes, by replaying the library's own schedules (src/sim), and prints where the
// algorithms cross over. docs/scaling.md shows its use and its validation against measurements.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "base/config.hpp"
#include "base/error.hpp"
#include "base/util.hpp"
#include "sim/sim.hpp"
#include "tuning/tuning.hpp"

using namespace chorus;

namespace {

const std::map<std::string, OpKind> kColls = {
    {"allreduce", OpKind::AllReduce}, {"reducescatter", OpKind::ReduceScatter},
    {"allgather", OpKind::AllGather}, {"broadcast", OpKind::Broadcast},
    {"reduce", OpKind::Reduce},       {"alltoall", OpKind::AllToAll},
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-sim: predicted time and busbw of each algorithm on H hosts x G ranks"};
  int hosts = 1, perHost = 8, cores = -1;
  std::string intra = "nvlink", inter = "ib400", coll = "allreduce", algos, minB = "8", maxB = "1G", chunk;
  double factor = 4, intraAlpha = -1, intraBw = -1, interAlpha = -1, interBw = -1, nicBw = -1;
  bool csv = false;
  app.add_option("-H,--hosts", hosts, "hosts")->check(CLI::Range(1, 65536));
  app.add_option("-G,--ranks-per-host", perHost, "ranks per host")->check(CLI::Range(1, 1024));
  app.add_option("--intra", intra, "link class within a host: shm, nvlink, pcie");
  app.add_option("--inter", inter, "link class between hosts: ib400, ib100, tcp10, emulated");
  app.add_option("-c,--coll", coll, "allreduce, reducescatter, allgather, broadcast, reduce, alltoall");
  app.add_option("-a,--algos", algos,
                 "comma-separated algorithms (default: every pipe algorithm of the collective)");
  app.add_option("-b,--minbytes", minB, "smallest size per rank (k/m/g suffixes)");
  app.add_option("-e,--maxbytes", maxB, "largest size per rank");
  app.add_option("-f,--stepfactor", factor, "size multiplier")->check(CLI::Range(1.01, 1024.0));
  app.add_option("--chunk", chunk, "pipelining chunk (default from the intra class)");
  app.add_option("--cores", cores, "cores per host (0: one per rank; default from the intra class)");
  app.add_option("--intra-alpha", intraAlpha, "override: intra latency, us");
  app.add_option("--intra-bw", intraBw, "override: intra send rate of a rank, GB/s");
  app.add_option("--inter-alpha", interAlpha, "override: inter latency, us");
  app.add_option("--inter-bw", interBw, "override: inter send rate of a rank, GB/s");
  app.add_option("--nic-bw", nicBw, "override: NIC rate of a host per direction, GB/s (0: unlimited)");
  app.add_flag("--csv", csv, "print size,algorithm,us,busbw lines");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // one line per size as it is simulated
  try {
    sim::Machine m;
    m.hosts = hosts;
    m.ranksPerHost = perHost;
    if (!sim::intraPreset(intra, m))
      failInvalid("unknown intra link class '", intra, "' (", sim::presetNames(), ")");
    if (!sim::interPreset(inter, m))
      failInvalid("unknown inter link class '", inter, "' (", sim::presetNames(), ")");
    if (intraAlpha >= 0) m.intra.alphaUs = intraAlpha;
    if (intraBw > 0) m.intra.sendGBps = intraBw;
    if (interAlpha >= 0) m.inter.alphaUs = interAlpha;
    if (interBw > 0) m.inter.sendGBps = interBw;
    if (nicBw >= 0) m.nicGBps = nicBw;
    if (cores >= 0) m.cores = cores;
    if (!chunk.empty()) {
      auto c = parseByteSize(chunk);
      if (!c || *c < 64) failInvalid("--chunk '", chunk, "' must be a size of at least 64 bytes");
      m.chunkBytes = *c;
    }
    auto it = kColls.find(coll);
    if (it == kColls.end()) failInvalid("unknown collective '", coll, "'");
    const OpKind kind = it->second;
    auto lo = parseByteSize(minB), hi = parseByteSize(maxB);
    if (!lo || !hi || *lo > *hi || *lo == 0) failInvalid("bad size range ", minB, "..", maxB);
    std::vector<const algo::Algorithm*> chosen;
    for (const algo::Algorithm& a : tuning::registry()) {
      if (a.kind != kind || a.needsSharedMemory) continue;
      if (!algos.empty() && ("," + algos + ",").find("," + std::string(a.name) + ",") == std::string::npos)
        continue;
      chosen.push_back(&a);
    }
    if (chosen.empty()) failInvalid("no pipe algorithm of ", coll, " matches '", algos, "'");
    const int n = m.size();
    if (!csv) {
      std::printf("# chorus-sim: %s on %d host(s) x %d ranks = %d ranks\n", coll.c_str(), hosts, perHost, n);
      std::printf(
          "# intra %s: alpha %.1f us, %.1f GB/s send, %.1f GB/s recv; inter %s: alpha %.1f us, %.1f GB/s"
          " per rank, NIC %.1f GB/s per host; reduce %.1f GB/s; chunk %s; cores %d\n",
          m.intra.name.c_str(), m.intra.alphaUs, m.intra.sendGBps, m.intra.recvGBps, m.inter.name.c_str(),
          m.inter.alphaUs, m.inter.sendGBps, m.nicGBps, m.reduceGBps, formatBytes(m.chunkBytes).c_str(),
          m.cores);
      std::printf("# time in us and busbw in GB/s (nccl-tests' definition) per algorithm; * = fastest\n");
      std::printf("%12s", "size");
      for (const auto* a : chosen) std::printf(" %12s %8s", (std::string(a->name) + " us").c_str(), "busbw");
      std::printf("  fastest\n");
    } else {
      std::printf("bytes,algorithm,us,busbw\n");
    }
    std::string prevBest;
    std::vector<std::string> crossovers, notes;
    for (double s = static_cast<double>(*lo); s <= static_cast<double>(*hi) * 1.0001; s *= factor) {
      const size_t bytes = std::max<size_t>(4, static_cast<size_t>(s) / 4 * 4);
      Op op;
      op.kind = kind;
      op.type = DataType::Float32;
      op.op = ReduceOp::Sum;
      op.count = bytes / 4;
      std::vector<double> us(chosen.size(), -1);
      size_t best = SIZE_MAX;
      for (size_t i = 0; i < chosen.size(); ++i) {
        const sim::Result r = sim::simulate(*chosen[i], op, m);
        if (!r.simulated) {
          notes.push_back(strCat(chosen[i]->name, " at ", formatBytes(bytes), ": not simulated, ", r.why));
          continue;
        }
        us[i] = r.us;
        if (best == SIZE_MAX || r.us < us[best]) best = i;
      }
      if (csv) {
        for (size_t i = 0; i < chosen.size(); ++i)
          std::printf("%zu,%s,%.3f,%.3f\n", bytes, chosen[i]->name, us[i],
                      sim::busBandwidth(kind, bytes, n, us[i]));
        continue;
      }
      std::printf("%12s", formatBytes(bytes).c_str());
      for (size_t i = 0; i < chosen.size(); ++i) {
        if (us[i] < 0)
          std::printf(" %12s %7s ", "-", "-");
        else
          std::printf(" %12.1f %7.2f%s", us[i], sim::busBandwidth(kind, bytes, n, us[i]),
                      i == best ? "*" : " ");
      }
      std::printf("  %s\n", best == SIZE_MAX ? "-" : chosen[best]->name);
      if (best != SIZE_MAX) {
        if (!prevBest.empty() && prevBest != chosen[best]->name)
          crossovers.push_back(
              strCat(chosen[best]->name, " overtakes ", prevBest, " at ", formatBytes(bytes)));
        prevBest = chosen[best]->name;
      }
    }
    if (!csv) {
      std::printf("# crossovers: %s\n", crossovers.empty() ? "none" : "");
      for (const auto& c : crossovers) std::printf("#   %s\n", c.c_str());
      for (const auto& note : notes) std::printf("# %s\n", note.c_str());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "chorus-sim: %s\n", e.what());
    return 2;
  }
  return 0;
}
