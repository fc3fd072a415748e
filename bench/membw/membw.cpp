// chorus-membw: a STREAM-like probe of this machine's floor for Chorus's collectives: memory
// bandwidth (1 thread and T threads), in-cache (L2) bandwidth, core-to-core latency through a
// shared flag, spinning and blocking (futex), and the rate at which a block one core has just
// written moves to another (the handoff of every staged collective). Independent of the Chorus
// library.
//
//   chorus-membw [--bytes SIZE] [--cache-bytes SIZE] [--handoff-bytes SIZE] [--reps N] [-t N]
//                [--quick] [--json]
//
// Bandwidth is bytes counted as STREAM does (copy, scale, memcpy: 2 x 8 B per element; add,
// triad: 3 x 8 B) over the time of one pass, GB/s with G = 1e9; best of --reps passes after one
// warm-up, with the average and the spread. README.md says how to read the figures.
// Exit status: 0, 1 if the arrays do not hold what the kernels should have computed, 2 on a usage
// error or when the arrays cannot be allocated.
#include <sys/utsname.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "affinity.hpp"
#include "kernels.hpp"
#include "latency.hpp"

namespace chorus_membw {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

constexpr double kGiga = 1e9;
constexpr double kScalar = 3.0;  // STREAM's
constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * kKiB;
// The default arrays (4 x L3 each) take at most this much together.
constexpr size_t kDefaultTotalCap = 3 * 1024 * kMiB;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- Machine facts ------------------------------------------------------------------------------

struct Machine {
  std::string cpuModel = "unknown";
  long cpusOnline = 0;
  int physicalCores = 0;  // distinct (physical id, core id) in /proc/cpuinfo; 0 if not listed
  std::vector<int> affinity;
  size_t l1d = 0, l2 = 0, l3 = 0;  // bytes, 0 when sysfs does not say
  std::string l2SharedCpus, l3SharedCpus;
  uint64_t memTotal = 0, memAvailable = 0;
  std::string sysname, release, version, arch;
  std::string thp;  // /sys/kernel/mm/transparent_hugepage/enabled
  bool avx2 = false;
};

std::string readLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// sysfs cache sizes: "48K", "2048K", "260M".
size_t parseSysfsSize(const std::string& text) {
  if (text.empty()) return 0;
  size_t pos = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &pos);
  } catch (const std::exception&) {
    return 0;
  }
  const char unit = pos < text.size() ? text[pos] : ' ';
  if (unit == 'K') return value * kKiB;
  if (unit == 'M') return value * kMiB;
  if (unit == 'G') return value * kMiB * 1024;
  return value;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  const size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

Machine readMachine() {
  Machine m;
  m.cpusOnline = sysconf(_SC_NPROCESSORS_ONLN);
  m.affinity = affinityCpus();
  m.avx2 = ntMemcpySupported();

  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, physicalId;
  std::set<std::pair<std::string, std::string>> cores;
  bool haveModel = false;
  while (std::getline(cpuinfo, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (key == "model name" && !haveModel) {
      m.cpuModel = value;
      haveModel = true;
    } else if (key == "physical id") {
      physicalId = value;
    } else if (key == "core id") {
      cores.emplace(physicalId, value);
    }
  }
  m.physicalCores = static_cast<int>(cores.size());

  for (int index = 0; index < 16; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    const std::string level = readLine(dir + "level");
    if (level.empty()) continue;
    const std::string type = readLine(dir + "type");
    const size_t size = parseSysfsSize(readLine(dir + "size"));
    if (level == "1" && type == "Data") {
      m.l1d = size;
    } else if (level == "2" && type != "Instruction") {
      m.l2 = size;
      m.l2SharedCpus = readLine(dir + "shared_cpu_list");
    } else if (level == "3" && type != "Instruction") {
      m.l3 = size;
      m.l3SharedCpus = readLine(dir + "shared_cpu_list");
    }
  }

  std::ifstream meminfo("/proc/meminfo");
  while (std::getline(meminfo, line)) {
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %llu kB", &kb) == 1) m.memTotal = kb * kKiB;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kb) == 1) m.memAvailable = kb * kKiB;
  }

  struct utsname u {};
  if (uname(&u) == 0) {
    m.sysname = u.sysname;
    m.release = u.release;
    m.version = u.version;
    m.arch = u.machine;
  }
  m.thp = readLine("/sys/kernel/mm/transparent_hugepage/enabled");
  return m;
}

// ---- Sizes --------------------------------------------------------------------------------------

// "4096", "64K", "1M", "2G" (powers of 1024; lower case accepted).
size_t parseSize(const std::string& text, const char* flag) {
  size_t pos = 0;
  unsigned long long value = 0;
  if (text.empty() || text[0] == '-') throw UsageError(std::string("invalid size for ") + flag);
  try {
    value = std::stoull(text, &pos, 10);
  } catch (const std::exception&) {
    throw UsageError(std::string("invalid size for ") + flag + ": '" + text + "'");
  }
  const std::string suffix = text.substr(pos);
  unsigned shift = 0;
  if (suffix == "K" || suffix == "k") {
    shift = 10;
  } else if (suffix == "M" || suffix == "m") {
    shift = 20;
  } else if (suffix == "G" || suffix == "g") {
    shift = 30;
  } else if (!suffix.empty()) {
    throw UsageError(std::string("invalid size for ") + flag + ": '" + text + "'");
  }
  if (value > (SIZE_MAX >> shift)) throw UsageError(std::string("size too large for ") + flag);
  return static_cast<size_t>(value) << shift;
}

std::string formatBytes(size_t bytes) {
  char buf[64];
  if (bytes >= kMiB && bytes % kMiB == 0) {
    std::snprintf(buf, sizeof(buf), "%zu MiB", bytes / kMiB);
  } else if (bytes >= kKiB && bytes % kKiB == 0) {
    std::snprintf(buf, sizeof(buf), "%zu KiB", bytes / kKiB);
  } else if (bytes >= kMiB) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / kMiB);
  } else {
    std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  }
  return buf;
}

// ---- Bandwidth ----------------------------------------------------------------------------------

struct FreeDeleter {
  void operator()(double* p) const { std::free(p); }
};
using ArrayPtr = std::unique_ptr<double[], FreeDeleter>;

ArrayPtr allocArray(size_t elements) {
  const size_t bytes = (elements * sizeof(double) + 4095) / 4096 * 4096;
  auto* p = static_cast<double*>(std::aligned_alloc(4096, bytes));
  if (p == nullptr) throw std::runtime_error("cannot allocate " + formatBytes(bytes));
  return ArrayPtr(p);
}

struct Arrays {
  ArrayPtr a, b, c;
  size_t capacity = 0;  // elements of each
};

Arrays allocArrays(size_t elements) {
  Arrays arr;
  arr.a = allocArray(elements);
  arr.b = allocArray(elements);
  arr.c = allocArray(elements);
  arr.capacity = elements;
  return arr;
}

struct KernelTimes {
  Kernel kernel;
  size_t bytesPerPass = 0;      // counted bytes of one pass over all threads' slices
  size_t inner = 1;             // passes per timed repetition
  std::vector<double> seconds;  // per timed repetition (the warm-up is not in here)

  double bestGBps() const {
    return inner * bytesPerPass / *std::min_element(seconds.begin(), seconds.end()) / kGiga;
  }
  double worstGBps() const {
    return inner * bytesPerPass / *std::max_element(seconds.begin(), seconds.end()) / kGiga;
  }
  double avgGBps() const {
    double sum = 0;
    for (double s : seconds) sum += s;
    return inner * bytesPerPass / (sum / seconds.size()) / kGiga;
  }
  // (slowest - fastest) / fastest repetition, percent.
  double spreadPct() const {
    const double lo = *std::min_element(seconds.begin(), seconds.end());
    const double hi = *std::max_element(seconds.begin(), seconds.end());
    return (hi - lo) / lo * 100.0;
  }
};

struct StreamRun {
  int threads = 0;
  std::vector<int> cpus;
  size_t arrayBytes = 0;  // bytes of each array used (all threads' slices together)
  std::vector<KernelTimes> kernels;
  bool checkOk = true;
  std::string checkMessage;
};

// Thread `tid` of `threads` works on elements [begin, end), slices of whole cache lines.
std::pair<size_t, size_t> slice(size_t n, size_t threads, size_t tid) {
  const size_t perThread = (n / threads + 7) / 8 * 8;
  const size_t begin = std::min(n, tid * perThread);
  const size_t end = tid + 1 == threads ? n : std::min(n, begin + perThread);
  return {begin, end};
}

// Runs each kernel of `kernels`, in order, `reps` + 1 times (the first a warm-up), on the first
// `n` elements of the arrays, with one thread pinned to each CPU of `cpus`. A repetition of a
// kernel is `inner` passes, enough to move `minBytesPerRep` (passes over cache-sized arrays are
// too short to time one by one). Afterwards compares a sample of elements with what the kernels
// should have computed.
StreamRun runStream(Arrays& arr, size_t n, const std::vector<int>& cpus, const std::vector<Kernel>& kernels,
                    int reps, size_t minBytesPerRep) {
  const size_t nthreads = cpus.size();
  StreamRun run;
  run.threads = static_cast<int>(nthreads);
  run.cpus = cpus;
  run.arrayBytes = n * sizeof(double);
  for (Kernel k : kernels) {
    KernelTimes t{k};
    t.bytesPerPass = static_cast<size_t>(kernelArrays(k)) * n * sizeof(double);
    t.inner = std::max<size_t>(1, (minBytesPerRep + t.bytesPerPass - 1) / t.bytesPerPass);
    t.seconds.assign(static_cast<size_t>(reps) + 1, 0.0);
    run.kernels.push_back(std::move(t));
  }

  double* const a = arr.a.get();
  double* const b = arr.b.get();
  double* const c = arr.c.get();
  std::barrier sync(static_cast<std::ptrdiff_t>(nthreads));
  auto body = [&](size_t tid) {
    pinThisThread(cpus[tid]);
    const auto [begin, end] = slice(n, nthreads, tid);
    for (size_t i = begin; i < end; ++i) {  // first touch by the thread that uses the slice
      a[i] = 1.0;
      b[i] = 2.0;
      c[i] = 0.0;
    }
    for (int rep = 0; rep <= reps; ++rep) {
      for (KernelTimes& kt : run.kernels) {
        sync.arrive_and_wait();
        const Clock::time_point start = Clock::now();
        for (size_t pass = 0; pass < kt.inner; ++pass) {
          runKernel(kt.kernel, a, b, c, begin, end, kScalar);
          asm volatile("" ::: "memory");  // each pass really reads and writes memory
        }
        sync.arrive_and_wait();  // every thread's slice is done
        if (tid == 0)
          kt.seconds[static_cast<size_t>(rep)] = std::chrono::duration<double>(Clock::now() - start).count();
      }
    }
  };
  std::vector<std::thread> workers;
  for (size_t tid = 0; tid < nthreads; ++tid) workers.emplace_back(body, tid);
  for (auto& w : workers) w.join();
  for (KernelTimes& kt : run.kernels) kt.seconds.erase(kt.seconds.begin());  // the warm-up

  // Every kernel is idempotent given its inputs, so the inner passes do not change the model.
  double ea = 1.0, eb = 2.0, ec = 0.0;
  for (int rep = 0; rep <= reps; ++rep) {
    for (Kernel k : kernels) modelKernel(k, ea, eb, ec, kScalar);
  }
  auto matches = [](double got, double want) {
    return got == want || std::fabs(got - want) <= 1e-12 * std::fabs(want);
  };
  std::vector<size_t> sample;
  for (size_t i = 0; i < n; i += std::max<size_t>(1, n / 4099)) sample.push_back(i);
  sample.push_back(n - 1);
  for (size_t i : sample) {
    if (!matches(a[i], ea) || !matches(b[i], eb) || !matches(c[i], ec)) {
      char buf[256];
      std::snprintf(buf, sizeof(buf), "element %zu: a b c = %.17g %.17g %.17g, expected %.17g %.17g %.17g", i,
                    a[i], b[i], c[i], ea, eb, ec);
      run.checkOk = false;
      run.checkMessage = buf;
      break;
    }
  }
  return run;
}

// ---- Options and output -------------------------------------------------------------------------

struct Options {
  size_t arrayBytes = 0;    // per array, memory test
  size_t cacheBytes = 0;    // per array and thread, cache test
  size_t handoffBytes = 0;  // block of the core-to-core handoff
  int reps = 10;
  int threads = 0;
  bool quick = false;
  bool json = false;
  double memFraction = 0.25;
  std::string arraySizeNote;  // how the default was chosen
};

struct Latency {
  bool ran = false;
  int cpuA = -1, cpuB = -1;
  Distribution spin, spinPause, futex;
  Handoff handoff;
};

Json distributionJson(const Distribution& d) {
  return Json{{"median", d.median}, {"min", d.min}, {"p90", d.p90}, {"samples", d.samples}};
}

Json runJson(const StreamRun& run) {
  Json kernels = Json::object();
  for (const KernelTimes& kt : run.kernels) {
    double sum = 0;
    for (double s : kt.seconds) sum += s;
    kernels[kernelName(kt.kernel)] = Json{
        {"best_gbps", kt.bestGBps()},
        {"avg_gbps", kt.avgGBps()},
        {"worst_gbps", kt.worstGBps()},
        {"spread_pct", kt.spreadPct()},
        {"bytes_per_pass", kt.bytesPerPass},
        {"passes_per_rep", kt.inner},
        {"min_time_s", *std::min_element(kt.seconds.begin(), kt.seconds.end()) / kt.inner},
        {"avg_time_s", sum / kt.seconds.size() / kt.inner},
        {"max_time_s", *std::max_element(kt.seconds.begin(), kt.seconds.end()) / kt.inner},
    };
  }
  return Json{{"threads", run.threads},
              {"cpus", run.cpus},
              {"array_bytes", run.arrayBytes},
              {"check", run.checkOk ? "ok" : run.checkMessage},
              {"kernels", kernels}};
}

void printTable(const char* title, const std::vector<StreamRun>& runs) {
  std::printf("\n%s\n", title);
  std::printf("%-10s %7s %12s %12s %12s %12s %9s\n", "test", "threads", "array", "best GB/s", "avg GB/s",
              "worst GB/s", "spread %");
  for (const StreamRun& run : runs) {
    for (const KernelTimes& kt : run.kernels) {
      std::printf("%-10s %7d %12s %12.2f %12.2f %12.2f %9.1f\n", kernelName(kt.kernel), run.threads,
                  formatBytes(run.arrayBytes).c_str(), kt.bestGBps(), kt.avgGBps(), kt.worstGBps(),
                  kt.spreadPct());
    }
  }
}

void printLatencyRow(const char* name, const Distribution& d, double scale) {
  std::printf("%-28s %10.1f %10.1f %10.1f %9zu\n", name, d.median * scale, d.min * scale, d.p90 * scale,
              d.samples);
}

int run(const Options& o, const Machine& m) {
  // One thread per CPU of the affinity mask by default; thread i on CPU i of the mask (wrapping).
  std::vector<int> cpus = m.affinity.empty() ? std::vector<int>{0} : m.affinity;
  const int nthreads = o.threads > 0 ? o.threads : static_cast<int>(cpus.size());
  std::vector<int> threadCpus;
  for (int i = 0; i < nthreads; ++i) threadCpus.push_back(cpus[static_cast<size_t>(i) % cpus.size()]);
  std::vector<std::vector<int>> configs{{threadCpus[0]}};
  if (nthreads > 1) configs.push_back(threadCpus);

  std::vector<Kernel> memKernels{Kernel::Copy, Kernel::Scale, Kernel::Add, Kernel::Triad, Kernel::Memcpy};
  if (m.avx2) memKernels.push_back(Kernel::NtMemcpy);
  const std::vector<Kernel> cacheKernels{Kernel::Copy, Kernel::Triad, Kernel::Memcpy};
  const size_t minBytesPerRep = o.quick ? 4 * kMiB : 256 * kMiB;

  // Memory: the same three arrays for every thread count.
  std::vector<StreamRun> memRuns;
  {
    const size_t n = std::max<size_t>(o.arrayBytes / sizeof(double) / 8 * 8, 8 * threadCpus.size());
    Arrays arr = allocArrays(n);
    for (const auto& config : configs) memRuns.push_back(runStream(arr, n, config, memKernels, o.reps, 0));
  }
  // Cache: each thread's slice of each array is --cache-bytes.
  std::vector<StreamRun> cacheRuns;
  {
    const size_t perThread = std::max<size_t>(o.cacheBytes / sizeof(double) / 8 * 8, 8);
    Arrays arr = allocArrays(perThread * threadCpus.size());
    for (const auto& config : configs) {
      cacheRuns.push_back(
          runStream(arr, perThread * config.size(), config, cacheKernels, o.reps, minBytesPerRep));
    }
  }
  // Latency between the first two CPUs of the mask.
  Latency lat;
  if (cpus.size() >= 2) {
    lat.ran = true;
    lat.cpuA = cpus[0];
    lat.cpuB = cpus[1];
    const size_t batches = o.quick ? 200 : 2000;
    const double budget = o.quick ? 0.3 : 3.0;
    lat.spin = spinRoundTripNs(lat.cpuA, lat.cpuB, false, batches, 100, budget);
    lat.spinPause = spinRoundTripNs(lat.cpuA, lat.cpuB, true, batches, 100, budget);
    lat.futex = futexRoundTripUs(lat.cpuA, lat.cpuB, o.quick ? 200 : 20000, budget);
    lat.handoff =
        handoffCopyGBps(lat.cpuA, lat.cpuB, o.handoffBytes, o.quick ? 50 : 2000, o.quick ? 0.3 : 2.0);
  }

  bool ok = true;
  if (lat.ran && !lat.handoff.ok) {
    std::fprintf(stderr,
                 "chorus-membw: wrong result: a handed-off block did not hold what CPU %d or %d wrote\n",
                 lat.cpuA, lat.cpuB);
    ok = false;
  }
  for (const auto* runs : {&memRuns, &cacheRuns}) {
    for (const StreamRun& r : *runs) {
      if (!r.checkOk) {
        std::fprintf(stderr, "chorus-membw: wrong result (%d threads, %s arrays): %s\n", r.threads,
                     formatBytes(r.arrayBytes).c_str(), r.checkMessage.c_str());
        ok = false;
      }
    }
  }

  if (o.json) {
    Json j;
    j["tool"] = "chorus-membw";
    j["units"] = Json{{"bandwidth", "GB/s, G = 1e9, STREAM byte counting"}, {"spin", "ns"}, {"futex", "us"}};
    j["machine"] = Json{{"cpu_model", m.cpuModel},
                        {"cpus_online", m.cpusOnline},
                        {"physical_cores", m.physicalCores},
                        {"affinity_cpus", m.affinity},
                        {"l1d_bytes", m.l1d},
                        {"l2_bytes", m.l2},
                        {"l2_shared_cpus", m.l2SharedCpus},
                        {"l3_bytes", m.l3},
                        {"l3_shared_cpus", m.l3SharedCpus},
                        {"mem_total_bytes", m.memTotal},
                        {"mem_available_bytes", m.memAvailable},
                        {"kernel", m.sysname + " " + m.release},
                        {"kernel_version", m.version},
                        {"arch", m.arch},
                        {"transparent_hugepage", m.thp},
                        {"avx2", m.avx2}};
    j["config"] = Json{{"array_bytes", o.arrayBytes},
                       {"array_size_note", o.arraySizeNote},
                       {"cache_bytes_per_thread", o.cacheBytes},
                       {"nt_memcpy_pages", ntPages()},
                       {"reps", o.reps},
                       {"threads", nthreads},
                       {"quick", o.quick}};
    Json mem = Json::array(), cache = Json::array();
    for (const StreamRun& r : memRuns) mem.push_back(runJson(r));
    for (const StreamRun& r : cacheRuns) cache.push_back(runJson(r));
    j["memory"] = mem;
    j["cache"] = cache;
    if (lat.ran) {
      Json spinOneWay = distributionJson(lat.spin);
      for (const char* key : {"median", "min", "p90"}) spinOneWay[key] = spinOneWay[key].get<double>() / 2;
      j["latency"] = Json{{"cpus", {lat.cpuA, lat.cpuB}},
                          {"spin_round_trip_ns", distributionJson(lat.spin)},
                          {"spin_one_way_ns", spinOneWay},
                          {"spin_pause_round_trip_ns", distributionJson(lat.spinPause)},
                          {"futex_round_trip_us", distributionJson(lat.futex)},
                          {"handoff", Json{{"block_bytes", lat.handoff.blockBytes},
                                           {"write_gbps", distributionJson(lat.handoff.write)},
                                           {"store_write_gbps", distributionJson(lat.handoff.storeWrite)},
                                           {"read_gbps", distributionJson(lat.handoff.read)},
                                           {"check", lat.handoff.ok ? "ok" : "failed"}}}};
    } else {
      j["latency"] = nullptr;
    }
    j["check"] = ok ? "ok" : "failed";
    std::printf("%s\n", j.dump(2).c_str());
    return ok ? 0 : 1;
  }

  std::printf(
      "chorus-membw: STREAM-like bandwidth (GB/s, G = 1e9; bytes read + written as STREAM counts "
      "them) and core-to-core latency\n");
  std::printf(
      "machine: %s; %ld CPUs online, %zu in the affinity mask, %d cores; L1d %s, L2 %s, L3 %s; %s %s\n",
      m.cpuModel.c_str(), m.cpusOnline, m.affinity.size(), m.physicalCores, formatBytes(m.l1d).c_str(),
      formatBytes(m.l2).c_str(), formatBytes(m.l3).c_str(), m.sysname.c_str(), m.release.c_str());
  std::printf("best of %d repetitions after a warm-up; spread = (slowest - fastest) / fastest repetition\n",
              o.reps);
  char title[256];
  std::snprintf(title, sizeof(title), "memory bandwidth: 3 arrays of %s (%s)",
                formatBytes(o.arrayBytes).c_str(), o.arraySizeNote.c_str());
  printTable(title, memRuns);
  std::snprintf(title, sizeof(title), "in-cache bandwidth: %s per array and thread (L2 %s per core)",
                formatBytes(o.cacheBytes).c_str(), formatBytes(m.l2).c_str());
  printTable(title, cacheRuns);
  if (lat.ran) {
    std::printf("\nlatency between CPU %d and CPU %d %10s %10s %10s %9s\n", lat.cpuA, lat.cpuB, "median",
                "min", "p90", "samples");
    printLatencyRow("spin round trip (ns)", lat.spin, 1.0);
    printLatencyRow("spin one way (ns)", lat.spin, 0.5);
    printLatencyRow("spin+pause round trip (ns)", lat.spinPause, 1.0);
    printLatencyRow("futex round trip (us)", lat.futex, 1.0);
    const std::string handoffTitle = "handoff of " + formatBytes(lat.handoff.blockBytes) + " (GB/s)";
    std::printf("\n%-28s %10s %10s %10s %9s\n", handoffTitle.c_str(), "median", "min", "p90", "samples");
    printLatencyRow("write (own staging, memcpy)", lat.handoff.write, 1.0);
    printLatencyRow("write (vector stores)", lat.handoff.storeWrite, 1.0);
    printLatencyRow("read (the other's staging)", lat.handoff.read, 1.0);
  } else {
    std::printf("\nlatency: skipped (fewer than 2 CPUs in the affinity mask)\n");
  }
  std::printf("\ncheck: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace chorus_membw

int main(int argc, char** argv) {
  using namespace chorus_membw;
  Options o;
  std::string bytesText, cacheText, handoffText;

  CLI::App app{"chorus-membw: STREAM-like memory bandwidth, L2 bandwidth and core-to-core latency",
               "chorus-membw"};
  auto* bytesOpt =
      app.add_option("--bytes", bytesText,
                     "bytes of each of the 3 arrays of the memory test, suffixes K M G (default: 4 "
                     "x L3, the 3 together at most 3 GiB and --mem-fraction of MemAvailable)");
  auto* cacheOpt = app.add_option("--cache-bytes", cacheText,
                                  "bytes of each array per thread in the in-cache test (default: L2 / 4, so "
                                  "that triad's 3 arrays fit in L2)");
  auto* handoffOpt = app.add_option("--handoff-bytes", handoffText,
                                    "block handed from one core to the other (default: L2 / 2 as a power of "
                                    "two, 256K to 8M, as Chorus stages)");
  auto* repsOpt = app.add_option("-n,--reps", o.reps, "timed repetitions, best reported (default 10)")
                      ->check(CLI::Range(1, 1000));
  app.add_option("-t,--threads", o.threads,
                 "threads of the multi-thread run (default: CPUs in the affinity mask)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--mem-fraction", o.memFraction,
                 "largest share of MemAvailable the 3 arrays may take (default 0.25)")
      ->check(CLI::Range(0.01, 0.95));
  app.add_flag("--quick", o.quick, "smoke test: 8 MiB arrays, 2 repetitions, short latency runs");
  app.add_flag("--json", o.json, "print one JSON object instead of the table");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    const Machine m = readMachine();
    if (o.quick && repsOpt->count() == 0) o.reps = 2;

    // Per array: what --mem-fraction of MemAvailable allows for the three arrays.
    const size_t limit = static_cast<size_t>(static_cast<double>(m.memAvailable) * o.memFraction) / 3;
    if (bytesOpt->count() > 0) {
      o.arrayBytes = parseSize(bytesText, "--bytes");
      o.arraySizeNote = "--bytes";
    } else if (o.quick) {
      o.arrayBytes = 8 * kMiB;
      o.arraySizeNote = "--quick";
    } else if (m.l3 > 0) {
      o.arrayBytes = 4 * m.l3;
      o.arraySizeNote = "4 x L3";
    } else {
      o.arrayBytes = kDefaultTotalCap / 3;
      o.arraySizeNote = "L3 unknown";
    }
    if (o.arrayBytes < 64 * kKiB) throw UsageError("--bytes: at least 64K per array");
    if (bytesOpt->count() == 0 && o.arrayBytes > kDefaultTotalCap / 3) {
      o.arrayBytes = kDefaultTotalCap / 3 / kMiB * kMiB;
      o.arraySizeNote += ", capped to 3 GiB for the 3 arrays";
    }
    if (m.memAvailable > 0 && o.arrayBytes > limit) {
      if (bytesOpt->count() > 0) {
        throw UsageError("--bytes: 3 arrays of " + formatBytes(o.arrayBytes) + " exceed --mem-fraction of " +
                         "MemAvailable (" + formatBytes(limit) + " per array)");
      }
      o.arrayBytes = limit / kMiB * kMiB;
      o.arraySizeNote += ", capped to --mem-fraction of MemAvailable";
    }

    if (cacheOpt->count() > 0) {
      o.cacheBytes = parseSize(cacheText, "--cache-bytes");
    } else {
      o.cacheBytes = m.l2 > 0 ? m.l2 / 4 : 256 * kKiB;
      if (o.quick) o.cacheBytes = std::min<size_t>(o.cacheBytes, 128 * kKiB);
    }
    if (o.cacheBytes < 4 * kKiB || o.cacheBytes > 1024 * kMiB) {
      throw UsageError("--cache-bytes: between 4K and 1G");
    }
    if (handoffOpt->count() > 0) {
      o.handoffBytes = parseSize(handoffText, "--handoff-bytes");
    } else {
      // As Chorus stages: half the L2, a power of two from 256 KiB to 8 MiB (topo::CacheThresholds).
      size_t p = 256 * kKiB;
      while (p * 2 <= m.l2 / 2 && p < 8 * kMiB) p *= 2;
      o.handoffBytes = p;
    }
    if (o.handoffBytes < 4 * kKiB || o.handoffBytes > 256 * kMiB) {
      throw UsageError("--handoff-bytes: between 4K and 256M");
    }
    return run(o, m);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "chorus-membw: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-membw: %s\n", e.what());
    return 2;
  }
}
