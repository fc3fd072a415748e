#include "base/config.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "base/error.hpp"

namespace chorus {

std::optional<size_t> parseByteSize(const std::string& text) {
  if (text == "inf" || text == "max") return std::numeric_limits<size_t>::max();
  if (text.empty()) return std::nullopt;
  size_t pos = 0;
  unsigned long long v = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    unsigned long long next = v * 10 + static_cast<unsigned long long>(text[pos] - '0');
    if (next / 10 != v) return std::nullopt;
    v = next;
    ++pos;
  }
  if (pos == 0) return std::nullopt;
  int shift = 0;
  if (pos < text.size()) {
    switch (text[pos]) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      case 't':
      case 'T':
        shift = 40;
        break;
      default:
        return std::nullopt;
    }
    ++pos;
    if (pos < text.size() && (text[pos] == 'i' || text[pos] == 'I')) ++pos;
    if (pos < text.size() && (text[pos] == 'b' || text[pos] == 'B')) ++pos;
  }
  if (pos != text.size()) return std::nullopt;
  if (shift && v > (std::numeric_limits<unsigned long long>::max() >> shift)) return std::nullopt;
  return static_cast<size_t>(v << shift);
}

namespace {

// ---- Parsers shared by the table's entries: each returns false when the text is malformed. -----

bool parseFlag(const std::string& s, bool* out) {
  if (s != "0" && s != "1") return false;
  *out = s == "1";
  return true;
}

bool parseLong(const std::string& s, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || errno || *end != '\0' || n < lo || n > hi) return false;
  *out = n;
  return true;
}

// What the entries below are made of: a setting of EnvConfig of one kind, with its bounds.
template <size_t EnvConfig::*M, size_t Lo, size_t Hi>
bool sizeIn(const std::string& s, EnvConfig& c) {
  auto b = parseByteSize(s);
  if (!b || *b < Lo || *b > Hi) return false;
  c.*M = *b;
  return true;
}
template <size_t EnvConfig::*M>
std::string showSize(const EnvConfig& c) {
  return std::to_string(c.*M);
}
template <int EnvConfig::*M, long Lo, long Hi>
bool intIn(const std::string& s, EnvConfig& c) {
  long n = 0;
  if (!parseLong(s, Lo, Hi, &n)) return false;
  c.*M = static_cast<int>(n);
  return true;
}
template <int EnvConfig::*M>
std::string showInt(const EnvConfig& c) {
  return std::to_string(c.*M);
}
template <bool EnvConfig::*M>
bool flag(const std::string& s, EnvConfig& c) {
  return parseFlag(s, &(c.*M));
}
template <bool EnvConfig::*M>
std::string showFlag(const EnvConfig& c) {
  return c.*M ? "1" : "0";
}
template <std::string EnvConfig::*M>
bool text(const std::string& s, EnvConfig& c) {
  c.*M = s;
  return true;
}
template <std::string EnvConfig::*M>
std::string showText(const EnvConfig& c) {
  return c.*M;
}

constexpr size_t K = size_t{1} << 10, M = size_t{1} << 20, G = size_t{1} << 30;

// Every setting Chorus reads from the environment: its name, what is wrong with an invalid value
// (the end of the error message), how it is parsed into EnvConfig and shown by chorusConfigGet.
// docs/configuration.md documents each (test_config checks that the two lists agree).
struct Setting {
  const char* name;
  const char* rule;
  bool (*parse)(const std::string& text, EnvConfig& c);
  std::string (*show)(const EnvConfig& c);
};

const Setting kSettings[] = {
    // Logging: NONE | WARN | INFO | TRACE (default WARN), and which subsystems INFO/TRACE come from.
    {"CHORUS_DEBUG", "is not one of NONE, WARN, INFO, TRACE",
     [](const std::string& s, EnvConfig& c) {
       std::string u;
       for (char ch : s) u += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
       if (u == "NONE" || u == "0")
         c.logLevel = LogLevel::None;
       else if (u == "WARN")
         c.logLevel = LogLevel::Warn;
       else if (u == "INFO")
         c.logLevel = LogLevel::Info;
       else if (u == "TRACE")
         c.logLevel = LogLevel::Trace;
       else
         return false;
       return true;
     },
     [](const EnvConfig& c) -> std::string {
       switch (c.logLevel) {
         case LogLevel::None:
           return "NONE";
         case LogLevel::Warn:
           return "WARN";
         case LogLevel::Info:
           return "INFO";
         case LogLevel::Trace:
           return "TRACE";
       }
       return "?";
     }},
    {"CHORUS_DEBUG_SUBSYS",
     "is not a comma list of INIT, BOOTSTRAP, TOPO, TUNING, SHM, NET, ALL (a leading ^ excludes)",
     [](const std::string& s, EnvConfig& c) { return parseSubsystems(s, &c.logSubsystems); },
     [](const EnvConfig& c) {
       if (c.logSubsystems == kAllSubsystems) return std::string("ALL");
       std::string out;
       for (unsigned bit = 1; bit & kAllSubsystems; bit <<= 1)
         if (c.logSubsystems & bit)
           out += strCat(out.empty() ? "" : ",", subsysName(static_cast<Subsys>(bit)));
       return out;
     }},
    // Seconds (fractions allowed) any single wait may take (default 300).
    {"CHORUS_TIMEOUT", "is not a positive number of seconds",
     [](const std::string& s, EnvConfig& c) {
       char* end = nullptr;
       const double v = std::strtod(s.c_str(), &end);
       if (s.empty() || *end != '\0' || !(v > 0) || v > 1e7) return false;
       c.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(v * 1000.0)));
       return true;
     },
     [](const EnvConfig& c) { return strCat(static_cast<double>(c.timeout.count()) / 1000.0); }},
    // Algorithm overrides, grammar in tuning/rules.cpp (checked at communicator creation).
    {"CHORUS_ALGO", "", text<&EnvConfig::algo>, showText<&EnvConfig::algo>},
    // Per-rank shared staging area of the direct algorithms, and each point-to-point FIFO.
    {"CHORUS_SHM_STAGE_BYTES", "must be a size between 64K and 1G",
     sizeIn<&EnvConfig::shmStageBytes, 64 * K, G>, showSize<&EnvConfig::shmStageBytes>},
    {"CHORUS_SHM_FIFO_BYTES", "must be a size between 4K and 1G", sizeIn<&EnvConfig::shmFifoBytes, 4 * K, G>,
     showSize<&EnvConfig::shmFifoBytes>},
    // 1: compare every collective's arguments across ranks first.
    {"CHORUS_CHECK", "must be 0 or 1", flag<&EnvConfig::checkCalls>, showFlag<&EnvConfig::checkCalls>},
    // Outputs of at least this many bytes per rank bypass the cache ("inf": never).
    // Unset (0 here): from the machine's caches; a set 0 streams every output.
    {"CHORUS_NT_STORE_BYTES", "must be a size such as 16M, or inf",
     [](const std::string& s, EnvConfig& c) {
       if (!sizeIn<&EnvConfig::ntStoreBytes, 0, SIZE_MAX>(s, c)) return false;
       c.ntStoreBytes = std::max<size_t>(c.ntStoreBytes, 1);
       return true;
     },
     showSize<&EnvConfig::ntStoreBytes>},
    // 0: never read peers' chorusMemAlloc buffers in place. Config::zeroCopy.
    {"CHORUS_ZERO_COPY", "must be 0 or 1", flag<&EnvConfig::zeroCopy>, showFlag<&EnvConfig::zeroCopy>},
    // Single copy of ordinary buffers between processes: 0 off; auto (each collective's own
    // threshold, where cross-memory attach is fast enough here, measured at set-up); 1 (each
    // collective's own threshold, whatever the speed); or a size: the smallest message read in
    // place, for every collective, whatever the speed.
    {"CHORUS_CMA", "must be 0, 1, auto or a size such as 256K",
     [](const std::string& s, EnvConfig& c) {
       c.cma = s != "0";
       c.cmaAlways = s != "0" && s != "auto";
       c.cmaMinBytes = 0;
       if (s == "0" || s == "1" || s == "auto") return true;
       auto b = parseByteSize(s);
       if (!b || *b < 2) return false;
       c.cmaMinBytes = *b;
       return true;
     },
     [](const EnvConfig& c) {
       return !c.cma          ? std::string("0")
              : c.cmaMinBytes ? std::to_string(c.cmaMinBytes)
              : c.cmaAlways   ? std::string("1")
                              : std::string("auto");
     }},
    // Testing: the ranks of one host play this many hosts (0 = off). Config::virtualHosts.
    {"CHORUS_VIRTUAL_HOSTS", "must be a number of hosts (0 = off)", intIn<&EnvConfig::virtualHosts, 0, 65536>,
     showInt<&EnvConfig::virtualHosts>},
    // The kinds of transport between hosts this rank offers. Config::net.
    {"CHORUS_NET", "is not a comma list of tcp, ucx, ib",
     [](const std::string& s, EnvConfig& c) {
       auto n = parseNetList(s);
       if (!n) return false;
       c.net = *n;
       return true;
     },
     showText<&EnvConfig::net>},
    // The TCP transport: interfaces (NCCL's syntax), address family, streams per pair, per-frame
    // CRC-32C, ring bytes per direction and peer (frames are half of it, at most 512K).
    {"CHORUS_SOCKET_IFNAME", "", text<&EnvConfig::socketIfname>, showText<&EnvConfig::socketIfname>},
    {"CHORUS_SOCKET_FAMILY", "must be 4 or 6 (AF_INET or AF_INET6)",
     [](const std::string& s, EnvConfig& c) {
       if (s != "4" && s != "AF_INET" && s != "ipv4" && s != "6" && s != "AF_INET6" && s != "ipv6" &&
           !s.empty())
         return false;
       c.socketFamily = s;
       return true;
     },
     showText<&EnvConfig::socketFamily>},
    {"CHORUS_SOCKET_NSTREAMS", "must be a number from 1 to 16", intIn<&EnvConfig::socketStreams, 1, 16>,
     showInt<&EnvConfig::socketStreams>},
    {"CHORUS_SOCKET_CHECKSUM", "must be 0 or 1", flag<&EnvConfig::socketChecksum>,
     showFlag<&EnvConfig::socketChecksum>},
    {"CHORUS_SOCKET_BUFFER_BYTES", "must be a size between 64K and 1G",
     sizeIn<&EnvConfig::socketBufferBytes, 64 * K, G>, showSize<&EnvConfig::socketBufferBytes>},
    // The RDMA verbs transport: device name prefix, port, GID index (RoCE).
    {"CHORUS_IB_HCA", "", text<&EnvConfig::ibHca>, showText<&EnvConfig::ibHca>},
    {"CHORUS_IB_PORT", "must be a number from 1 to 255", intIn<&EnvConfig::ibPort, 1, 255>,
     showInt<&EnvConfig::ibPort>},
    {"CHORUS_IB_GID_INDEX", "must be a number from 0 to 255", intIn<&EnvConfig::ibGidIndex, 0, 255>,
     showInt<&EnvConfig::ibGidIndex>},
    // Device buffers over CUDA IPC (rank 0's values hold): each rank's stage, the largest LL
    // allreduce (0: no LL), one chunk of send/recv, 0 to stage every call through host memory, and
    // whether processes sharing a GPU use IPC anyway.
    {"CHORUS_CUDA_STAGE_BYTES", "must be a size between 64K and 1G",
     sizeIn<&EnvConfig::cudaStageBytes, 64 * K, G>, showSize<&EnvConfig::cudaStageBytes>},
    {"CHORUS_CUDA_LL_BYTES", "must be a size of at most 1M (0 turns LL off)",
     sizeIn<&EnvConfig::cudaLlBytes, 0, M>, showSize<&EnvConfig::cudaLlBytes>},
    {"CHORUS_CUDA_P2P_CHUNK_BYTES", "must be a size between 4K and 16M",
     sizeIn<&EnvConfig::cudaP2pChunkBytes, 4 * K, 16 * M>, showSize<&EnvConfig::cudaP2pChunkBytes>},
    {"CHORUS_CUDA_IPC", "must be 0 or 1", flag<&EnvConfig::cudaIpc>, showFlag<&EnvConfig::cudaIpc>},
    {"CHORUS_CUDA_SHARED_GPU", "must be staged or ipc",
     [](const std::string& s, EnvConfig& c) {
       if (s != "ipc" && s != "staged") return false;
       c.cudaSharedGpuIpc = s == "ipc";
       return true;
     },
     [](const EnvConfig& c) { return std::string(c.cudaSharedGpuIpc ? "ipc" : "staged"); }},
    // The flight recorder: file prefix written on failure, and operations kept per communicator.
    {"CHORUS_FLIGHT_RECORDER", "", text<&EnvConfig::flightRecorderPath>,
     showText<&EnvConfig::flightRecorderPath>},
    {"CHORUS_FLIGHT_RECORDER_ENTRIES", "must be a number from 0 to 1000000",
     [](const std::string& s, EnvConfig& c) {
       long n = 0;
       if (!parseLong(s, 0, 1'000'000, &n)) return false;
       c.flightRecorderEntries = static_cast<size_t>(n);
       return true;
     },
     showSize<&EnvConfig::flightRecorderEntries>},
    // The most demanding CPU kernels to use, of portable < avx2 < avx512 < avx512bf16; the
    // default, auto, is the best the CPU runs.
    {"CHORUS_CPU_KERNELS", "must be portable, avx2, avx512, avx512bf16 or auto",
     [](const std::string& s, EnvConfig& c) {
       if (s != "portable" && s != "avx2" && s != "avx512" && s != "avx512bf16" && s != "auto") return false;
       c.cpuKernels = s;
       return true;
     },
     showText<&EnvConfig::cpuKernels>},
    // Pages the streaming (non-temporal) copy interleaves: 1, 2, 4 or 8; unset: by CPU vendor.
    {"CHORUS_NT_COPY_PAGES", "must be 1, 2, 4 or 8",
     [](const std::string& s, EnvConfig& c) {
       if (s != "1" && s != "2" && s != "4" && s != "8") return false;
       c.ntCopyPages = s[0] - '0';
       return true;
     },
     showInt<&EnvConfig::ntCopyPages>},
    // How reductions into the staging area are written: auto (streaming where the copies stream,
    // else each rank times stores and memcpy), stores, memcpy, streaming.
    {"CHORUS_STAGE_WRITE", "must be auto, stores, memcpy or streaming",
     [](const std::string& s, EnvConfig& c) {
       if (s != "auto" && s != "stores" && s != "memcpy" && s != "streaming") return false;
       c.stageWrite = s == "auto" ? std::string() : s;
       return true;
     },
     [](const EnvConfig& c) { return c.stageWrite.empty() ? std::string("auto") : c.stageWrite; }},
    // How copies into the staging area are written: auto (each rank times both), plain, streaming.
    {"CHORUS_STAGE_COPY", "must be auto, plain or streaming",
     [](const std::string& s, EnvConfig& c) {
       if (s != "auto" && s != "plain" && s != "streaming") return false;
       c.stageCopy = s == "auto" ? std::string() : s;
       return true;
     },
     [](const EnvConfig& c) { return c.stageCopy.empty() ? std::string("auto") : c.stageCopy; }},
    // Single copy or staging for the allreduce: timed (by rank 0, the default) or the size ranges.
    {"CHORUS_SINGLE_COPY_CHOICE", "must be timed or ranges",
     [](const std::string& s, EnvConfig& c) {
       if (s != "timed" && s != "ranges") return false;
       c.singleCopyChoice = s == "timed" ? std::string() : s;
       return true;
     },
     [](const EnvConfig& c) {
       return c.singleCopyChoice.empty() ? std::string("timed") : c.singleCopyChoice;
     }},
    // 1: the staging size, where unset, measured on this machine (and cached); 0: L2 / 2.
    {"CHORUS_STAGE_PROBE", "must be 0 or 1", flag<&EnvConfig::stageProbe>, showFlag<&EnvConfig::stageProbe>},
    // The directory of what was measured on this machine (an absolute path).
    {"CHORUS_CACHE_DIR", "must be an absolute path",
     [](const std::string& s, EnvConfig& c) {
       if (s.empty() || s[0] != '/') return false;
       c.cacheDir = s;
       return true;
     },
     showText<&EnvConfig::cacheDir>},
    // How waiting ranks pass the time: auto (by ranks per core), spin, yield or sleep.
    {"CHORUS_WAIT", "must be auto, spin, adaptive, yield or sleep",
     [](const std::string& s, EnvConfig& c) {
       if (s != "auto" && s != "spin" && s != "adaptive" && s != "yield" && s != "sleep") return false;
       c.waitPolicy = s == "auto" ? std::string() : s;
       return true;
     },
     [](const EnvConfig& c) { return c.waitPolicy.empty() ? std::string("auto") : c.waitPolicy; }},
    // An hwloc XML file used as this host's topology, and a file the topology found is written to.
    {"CHORUS_TOPO_FILE", "", text<&EnvConfig::topoFile>, showText<&EnvConfig::topoFile>},
    {"CHORUS_TOPO_DUMP_FILE", "", text<&EnvConfig::topoDumpFile>, showText<&EnvConfig::topoDumpFile>},
};

// Variables read afresh at each use, not settings of EnvConfig: where and how a job meets (a
// process may set them between communicators), and secrets (never shown by chorusConfigGet).
const char* const kLaunchVariables[] = {
    "CHORUS_SECRET",          // the job's store secret (src/bootstrap/tcp_store.cpp)
    "CHORUS_BOOTSTRAP_ADDR",  // the address a unique id's store listens on (src/bootstrap/unique_id.cpp)
    // The environment rendezvous (src/bootstrap/env_init.cpp, docs/bootstrap.md).
    "CHORUS_RANK", "CHORUS_WORLD_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "CHORUS_STORE_ADDR",
    "CHORUS_STORE_FILE", "CHORUS_STORE_PORT", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "PATH",  // where chorusrun looks for the program it launches
};

}  // namespace

std::optional<std::string> parseNetList(const std::string& text) {
  std::string s = text;
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (s.empty() || s.ends_with(',')) return std::nullopt;
  for (size_t at = 0; at < s.size();) {
    const size_t comma = std::min(s.find(',', at), s.size());
    const std::string item = s.substr(at, comma - at);
    if (item != "tcp" && item != "ucx" && item != "ib") return std::nullopt;
    at = comma + 1;
  }
  return s;
}

EnvConfig readEnvironment(const std::function<const char*(const char*)>& lookup) {
  EnvConfig c;
  for (const Setting& s : kSettings) {
    const char* v = lookup(s.name);
    if (v == nullptr) continue;
    if (!s.parse(v, c) && c.parseError.empty()) c.parseError = strCat(s.name, "='", v, "' ", s.rule);
  }
  return c;
}

std::vector<std::string> settingNames() {
  std::vector<std::string> names;
  for (const Setting& s : kSettings) names.emplace_back(s.name);
  return names;
}

std::optional<std::string> launchVariable(const char* name) {
  bool known = false;
  for (const char* v : kLaunchVariables) known = known || std::strcmp(v, name) == 0;
  if (!known)
    fail(chorusInternalError, strCat("launchVariable: ", name, " is not listed in src/base/config.cpp"));
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

const EnvConfig& envConfig() {
  static const EnvConfig config = readEnvironment([](const char* name) { return std::getenv(name); });
  return config;
}

std::string configValue(const std::string& name) {
  for (const Setting& s : kSettings) {
    if (name == s.name) return s.show(envConfig());
  }
  failInvalid("chorusConfigGet: '", name, "' is not a Chorus setting (docs/configuration.md)");
}

Config resolveConfig(const Config& user) {
  const EnvConfig& env = envConfig();
  if (!env.parseError.empty()) failInvalid(env.parseError);
  Config c = user;
  if (c.timeout.count() <= 0) c.timeout = env.timeout;
  if (c.algo.empty()) c.algo = env.algo;
  if (c.shmStageBytes == 0) c.shmStageBytes = env.shmStageBytes;
  if (c.shmFifoBytes == 0) c.shmFifoBytes = env.shmFifoBytes;
  c.checkCalls = c.checkCalls || env.checkCalls;
  if (c.zeroCopy < 0) c.zeroCopy = env.zeroCopy ? 1 : 0;
  if (c.zeroCopy > 1) failInvalid("Config::zeroCopy must be -1 (from the environment), 0 or 1");
  if (c.virtualHosts < 0) c.virtualHosts = env.virtualHosts;
  if (c.net.empty()) {
    c.net = env.net;
  } else if (auto n = parseNetList(c.net)) {
    c.net = *n;
  } else {
    failInvalid("Config::net='", c.net, "' is not a comma list of tcp, ucx, ib");
  }
  if (!c.transport.empty() && c.transport != "tcp")
    failInvalid("Config::transport='", c.transport, "' is not \"\" (shared memory on one host) or \"tcp\"");
  if (c.shmStageBytes != 0 && c.shmStageBytes < (size_t{64} << 10))
    failInvalid("Config::shmStageBytes must be at least 64 KiB (or 0: from the machine)");
  if (c.shmFifoBytes < 4096) failInvalid("Config::shmFifoBytes must be at least 4 KiB");
  // Sizes must keep 64-byte alignment of every region in the shared segment.
  c.shmStageBytes = alignUp(c.shmStageBytes, 128);
  c.shmFifoBytes = alignUp(c.shmFifoBytes, 64);
  return c;
}

}  // namespace chorus
