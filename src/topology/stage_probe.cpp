#include "topology/stage_probe.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "base/config.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "base/util.hpp"
#include "kernels/cpu/reduce.hpp"

namespace chorus::topo {

namespace {

using Clock = std::chrono::steady_clock;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// One thread of the probe: its input (two blocks), its output (one block) and its staging area.
struct Side {
  std::vector<float> in, out, stage;
  std::atomic<uint64_t> arrived{0};  // barriers passed
};

// The two threads' meeting points: each counts the barriers it reached and waits for the other to
// reach as many, yielding once the wait gets long (other processes may want the cores), until
// `deadline` (then `failed` is set and both give up).
struct Meeting {
  Side side[2];
  std::atomic<bool> failed{false};
  Clock::time_point deadline;

  bool barrier(int me) {
    const uint64_t mine = side[me].arrived.fetch_add(1, std::memory_order_acq_rel) + 1;
    for (uint32_t spins = 0; side[1 - me].arrived.load(std::memory_order_acquire) < mine; ++spins) {
      if (failed.load(std::memory_order_relaxed)) return false;
      if (spins >= 1024) {
        if ((spins & 255) == 0 && Clock::now() > deadline) {
          failed.store(true);
          return false;
        }
        std::this_thread::yield();
      }
    }
    return !failed.load(std::memory_order_relaxed);
  }
};

// The staged 2-rank reduce-scatter with a staging size of stageBytes, as algo::reduceScatterDirect
// runs a long call (two slots of half that, alternately): per chunk, stage the block the peer
// reduces into the next slot, meet, reduce the own block of the
// input with the peer's staged one into the output.
bool reduceScatterStaged(Meeting& m, int me, size_t stageBytes, size_t blockElems) {
  Side& s = m.side[me];
  const Side& peer = m.side[1 - me];
  const size_t chunk = std::max<size_t>(stageBytes / 2 / 2 / sizeof(float) / 16 * 16, 16);
  const float* mine = s.in.data() + static_cast<size_t>(me) * blockElems;
  const float* theirs = s.in.data() + static_cast<size_t>(1 - me) * blockElems;
  int half = 0;
  for (size_t off = 0; off < blockElems; off += chunk, half ^= 1) {
    const size_t ce = std::min(chunk, blockElems - off);
    float* stageHalf = s.stage.data() + static_cast<size_t>(half) * (stageBytes / 2 / sizeof(float));
    kernels::copy(stageHalf, theirs + off, ce * sizeof(float), kernels::CopyMode::Cached);
    if (!m.barrier(me)) return false;
    const float* peerHalf = peer.stage.data() + static_cast<size_t>(half) * (stageBytes / 2 / sizeof(float));
    const void* srcs[2] = {mine + off, peerHalf};
    kernels::reduce(s.out.data() + off, srcs, 2, ce, DataType::Float32, ReduceOp::Sum, 0,
                    kernels::CopyMode::Cached);
  }
  return m.barrier(me);  // the peer is done reading this side's staging area
}

std::string readCpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t b = line.find_first_not_of(' ', colon + 1);
        return b == std::string::npos ? std::string() : line.substr(b);
      }
    }
  }
  return "unknown CPU";
}

// An exclusive lock on `path`, taken by polling until `deadline`: its descriptor, or -1 with
// `*held` saying whether another process held it that long (else the file could not be opened).
int lockFile(const std::string& path, Clock::time_point deadline, bool* held) {
  *held = false;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if ((errno != EWOULDBLOCK && errno != EINTR) || Clock::now() > deadline) {
      *held = errno == EWOULDBLOCK;
      ::close(fd);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return fd;
}

bool makeDirs(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  struct stat st {};
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

StageChoice decideStage() {
  const CacheThresholds& t = localCacheThresholds();
  StageChoice rule{t.stageBytes, t.basis};
  if (!envConfig().stageProbe) {
    rule.basis += " (CHORUS_STAGE_PROBE=0)";
    return rule;
  }
  bool thisMachine = false;
  try {
    thisMachine = localHost().thisSystem;
  } catch (const Error&) {
  }
  if (!thisMachine) {
    rule.basis += " (not this machine's topology: not measured)";
    return rule;
  }
  const std::string dir = probeCacheDir();
  const std::string file = dir.empty() ? std::string() : dir + "/machine-probe";
  const std::string key = machineKey(t);
  if (!file.empty()) {
    if (auto cached = readCachedStage(file, key)) return {*cached, strCat("measured, cached in ", file)};
  }
  if (kSanitized) {
    rule.basis += " (a sanitizer build does not probe)";
    return rule;
  }
  const size_t small = t.stageBytes, large = std::min<size_t>(2 * t.stageBytes, size_t{16} << 20);
  // One probe: its size, what it measured, and whether it did (a failed probe keeps the rule).
  struct Probed {
    size_t bytes;
    std::string note;
    bool ok;
  };
  auto probe = [&] {
    const StageProbeResult r = probeStageSizes(small, large, std::max<size_t>(size_t{2} << 20, 2 * large), 7,
                                               std::chrono::milliseconds(2000));
    Probed p{chooseStageBytes(r),
             r.ok ? strCat("reduce-scatter, 2 threads: ", formatBytes(small), " ", r.smallUs, " us, ",
                           formatBytes(large), " ", r.largeUs, " us, paired ratio ", r.ratio, " over ",
                           r.rounds, " rounds")
                  : strCat("probe failed: ", r.failure),
             r.ok};
    logInfo(Subsys::Init, "staging area: ", formatBytes(p.bytes), " (", p.note, ")");
    return p;
  };
  // A failed probe's figure is the rule's, which it says; not cached, so the next process tries again.
  auto failed = [&](const Probed& p) {
    return StageChoice{p.bytes, strCat(rule.basis, " (", p.note, "; not cached)")};
  };
  // Measured but not kept, for `why`.
  auto uncached = [&](const std::string& why) {
    const Probed p = probe();
    return p.ok ? StageChoice{p.bytes, strCat("measured (", p.note, "); not cached: ", why)} : failed(p);
  };
  if (file.empty()) return uncached("no cache directory (CHORUS_CACHE_DIR, HOME)");
  if (!makeDirs(dir)) return uncached(strCat("cannot create ", dir, ": ", std::strerror(errno)));
  // Processes starting together take turns: the first measures, the others read what it wrote.
  bool held = false;
  const int lock = lockFile(file + ".lock", Clock::now() + std::chrono::seconds(3), &held);
  if (lock < 0 && held) {
    rule.basis += strCat(" (", file, ".lock held by another process past 3 s)");
    return rule;
  }
  if (lock < 0) return uncached(strCat("cannot open ", file, ".lock: ", std::strerror(errno)));
  StageChoice out;
  if (auto cached = readCachedStage(file, key)) {
    out = {*cached, strCat("measured, cached in ", file)};
  } else if (const Probed p = probe(); !p.ok) {
    out = failed(p);
  } else {
    std::string why;
    out = {p.bytes, writeCachedStage(file, key, p.bytes, p.note, &why)
                        ? strCat("measured (", p.note, "), cached in ", file)
                        : strCat("measured (", p.note, "); not cached: ", why)};
  }
  ::close(lock);
  return out;
}

}  // namespace

StageProbeResult probeStageSizes(size_t small, size_t large, size_t messageBytes, int rounds,
                                 std::chrono::milliseconds deadline) {
  StageProbeResult r;
  r.small = small;
  r.large = large;
  Meeting m;
  m.deadline = Clock::now() + deadline;
  const size_t blockElems = messageBytes / 2 / sizeof(float);
  try {
    for (Side& s : m.side) {
      // Data, not zeros: the pages exist and the kernels see numbers.
      s.in.assign(2 * blockElems, 1.5f);
      s.out.assign(blockElems, 0.0f);
      s.stage.assign(std::max(small, large) / sizeof(float), 0.0f);
    }
  } catch (const std::bad_alloc&) {
    r.failure = strCat("no memory for 2 x ", formatBytes(2 * messageBytes + std::max(small, large)));
    return r;
  }
  const size_t sizes[2] = {small, large};
  std::vector<double> times[2], ratios;
  constexpr int kReps = 3;  // calls per size and round; their median is the round's figure
  auto run = [&](int me) {
    for (int round = -1; round < rounds; ++round) {  // round -1 warms up
      double us[2] = {0, 0};
      for (int j = 0; j < 2; ++j) {
        const int which = (round & 1) ? 1 - j : j;
        std::vector<double> reps;
        for (int k = 0; k < kReps; ++k) {
          if (!m.barrier(me)) return;
          const auto start = Clock::now();
          if (!reduceScatterStaged(m, me, sizes[which], blockElems)) return;
          reps.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
        }
        us[which] = median(reps);
      }
      if (me == 0 && round >= 0) {
        times[0].push_back(us[0]);
        times[1].push_back(us[1]);
        ratios.push_back(us[1] / us[0]);
      }
    }
  };
  std::thread other;
  try {
    other = std::thread(run, 1);
  } catch (const std::system_error& e) {
    r.failure = strCat("no thread: ", e.what());
    return r;
  }
  run(0);
  other.join();
  if (m.failed.load()) {
    r.failure = strCat("the two threads did not meet within ", deadline.count(), " ms");
    return r;
  }
  r.smallUs = median(times[0]);
  r.largeUs = median(times[1]);
  r.ratio = median(ratios);
  r.rounds = rounds;
  r.ok = true;
  return r;
}

size_t chooseStageBytes(const StageProbeResult& r) {
  return r.ok && r.ratio > 0 && r.ratio <= 1.0 - kStageProbeMargin ? r.large : r.small;
}

std::string machineKey(const CacheThresholds& t) {
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  return strCat(readCpuModel(), "; L2 ", t.l2Bytes, "; L3 ", t.l3Bytes, "; CPUs ", cpus, "; kernels ",
                kernels::simdLevel());
}

std::string probeCacheDir() {
  const EnvConfig& env = envConfig();
  if (!env.cacheDir.empty()) return env.cacheDir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x == '/') return strCat(x, "/chorus");
  if (const char* h = std::getenv("HOME"); h && *h == '/') return strCat(h, "/.cache/chorus");
  return {};
}

std::optional<size_t> readCachedStage(const std::string& file, const std::string& key) {
  std::ifstream f(file);
  if (!f) return std::nullopt;
  std::string line, haveKey;
  std::optional<size_t> bytes;
  while (std::getline(f, line)) {
    if (line.rfind("key ", 0) == 0) haveKey = line.substr(4);
    if (line.rfind("shm_stage_bytes ", 0) == 0) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(line.c_str() + 16, &end, 10);
      if (end && *end == '\0' && v >= (size_t{64} << 10) && v <= (size_t{1} << 30) && v % 128 == 0) bytes = v;
    }
  }
  if (haveKey != key) return std::nullopt;
  return bytes;
}

bool writeCachedStage(const std::string& file, const std::string& key, size_t bytes, const std::string& note,
                      std::string* why) {
  const std::string tmp = strCat(file, ".", ::getpid(), ".tmp");
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << "# What Chorus measured on this machine; delete this file to measure again (docs/performance.md).\n"
      << "key " << key << "\n"
      << "shm_stage_bytes " << bytes << "\n"
      << "# " << note << "\n";
    f.flush();
    if (!f) {
      if (why) *why = strCat("cannot write ", tmp);
      std::remove(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0) {
    if (why) *why = strCat("cannot rename ", tmp, " to ", file, ": ", std::strerror(errno));
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

const StageChoice& localStageChoice() {
  static const StageChoice choice = decideStage();
  return choice;
}

}  // namespace chorus::topo
