#include "base/config.hpp"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
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

EnvConfig readEnv() {
  EnvConfig c;
  auto note = [&c](const std::string& m) {
    if (c.parseError.empty()) c.parseError = m;
  };
  // CHORUS_DEBUG: NONE | WARN | INFO | TRACE (default WARN).
  if (const char* v = std::getenv("CHORUS_DEBUG")) {
    std::string s = v;
    for (auto& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (s == "NONE" || s == "0")
      c.logLevel = LogLevel::None;
    else if (s == "WARN")
      c.logLevel = LogLevel::Warn;
    else if (s == "INFO")
      c.logLevel = LogLevel::Info;
    else if (s == "TRACE")
      c.logLevel = LogLevel::Trace;
    else
      note(strCat("CHORUS_DEBUG='", v, "' is not one of NONE, WARN, INFO, TRACE"));
  }
  // CHORUS_DEBUG_SUBSYS: which subsystems INFO and TRACE messages come from (default ALL).
  if (const char* v = std::getenv("CHORUS_DEBUG_SUBSYS")) {
    if (!parseSubsystems(v, &c.logSubsystems)) {
      note(strCat(
          "CHORUS_DEBUG_SUBSYS='", v,
          "' is not a comma list of INIT, BOOTSTRAP, TOPO, TUNING, SHM, NET, ALL (a leading ^ excludes)"));
    }
  }
  // CHORUS_TIMEOUT: seconds (may be fractional) any single wait may take (default 300).
  if (const char* v = std::getenv("CHORUS_TIMEOUT")) {
    char* end = nullptr;
    double s = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(s > 0) || s > 1e7) {
      note(strCat("CHORUS_TIMEOUT='", v, "' is not a positive number of seconds"));
    } else {
      c.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(s * 1000.0)));
    }
  }
  // CHORUS_ALGO: algorithm overrides, grammar in algorithms/selection.cpp (default empty).
  if (const char* v = std::getenv("CHORUS_ALGO")) c.algo = v;
  // A size variable within [lo, hi]; otherwise noted with `rule`, and the default kept.
  auto sizeVar = [&](const char* name, size_t lo, size_t hi, const char* rule, size_t& out) {
    const char* v = std::getenv(name);
    if (!v) return;
    auto b = parseByteSize(v);
    if (!b || *b < lo || *b > hi)
      note(strCat(name, "='", v, "' must be ", rule));
    else
      out = *b;
  };
  // CHORUS_SHM_STAGE_BYTES: per-rank shared staging area for direct algorithms (default 1M, min 64K).
  sizeVar("CHORUS_SHM_STAGE_BYTES", size_t{64} << 10, size_t{1} << 30, "a size between 64K and 1G",
          c.shmStageBytes);
  // CHORUS_SHM_FIFO_BYTES: bytes of each point-to-point shared-memory FIFO (default 1M, min 4K).
  sizeVar("CHORUS_SHM_FIFO_BYTES", 4096, size_t{1} << 30, "a size between 4K and 1G", c.shmFifoBytes);
  // CHORUS_CUDA_STAGE_BYTES: device stage per rank for device buffers over CUDA IPC (default 8M,
  // 64K to 1G; rank 0's value holds). CHORUS_CUDA_LL_BYTES: largest LL allreduce (default 64K, max 1M).
  sizeVar("CHORUS_CUDA_STAGE_BYTES", size_t{64} << 10, size_t{1} << 30, "a size between 64K and 1G",
          c.cudaStageBytes);
  sizeVar("CHORUS_CUDA_LL_BYTES", 0, size_t{1} << 20, "a size of at most 1M (0 turns LL off)", c.cudaLlBytes);
  // CHORUS_CUDA_P2P_CHUNK_BYTES: one chunk (FIFO slot) of device send/recv over CUDA IPC (default
  // 64K, 4K to 16M; rank 0's value holds).
  sizeVar("CHORUS_CUDA_P2P_CHUNK_BYTES", 4096, size_t{16} << 20, "a size between 4K and 16M",
          c.cudaP2pChunkBytes);
  // CHORUS_CUDA_IPC: 1 (default) or 0, which stages every device call through host memory.
  if (const char* v = std::getenv("CHORUS_CUDA_IPC")) {
    const std::string s = v;
    if (s == "0")
      c.cudaIpc = false;
    else if (s != "1")
      note(strCat("CHORUS_CUDA_IPC='", v, "' must be 0 or 1"));
  }
  // CHORUS_CUDA_SHARED_GPU: "staged" (default) or "ipc": how processes sharing one GPU exchange
  // device buffers (their kernels are time-sliced unless MPS runs them side by side).
  if (const char* v = std::getenv("CHORUS_CUDA_SHARED_GPU")) {
    const std::string s = v;
    if (s == "ipc")
      c.cudaSharedGpuIpc = true;
    else if (s != "staged")
      note(strCat("CHORUS_CUDA_SHARED_GPU='", v, "' must be staged or ipc"));
  }
  // CHORUS_NT_STORE_BYTES: outputs of at least this many bytes per rank bypass the cache when the
  // direct algorithms write them (default 4M; "inf" never).
  if (const char* v = std::getenv("CHORUS_NT_STORE_BYTES")) {
    auto b = parseByteSize(v);
    if (!b) {
      note(strCat("CHORUS_NT_STORE_BYTES='", v, "' must be a size such as 16M, or inf"));
    } else {
      c.ntStoreBytes = *b;
    }
  }
  // CHORUS_ZERO_COPY: 0 turns off reading peers' chorusMemAlloc buffers in place (default 1).
  if (const char* v = std::getenv("CHORUS_ZERO_COPY")) {
    std::string s = v;
    if (s == "0")
      c.zeroCopy = false;
    else if (s != "1")
      note(strCat("CHORUS_ZERO_COPY='", v, "' must be 0 or 1"));
  }
  // CHORUS_VIRTUAL_HOSTS: split the ranks of one host into this many emulated hosts (contiguous
  // blocks of ranks), for testing and validating multi-host algorithms and the tuner on one machine.
  // Data still moves over shared-memory pipes, but only algorithms that work across hosts are used.
  if (const char* v = std::getenv("CHORUS_VIRTUAL_HOSTS")) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 0 || n > 65536)
      note(strCat("CHORUS_VIRTUAL_HOSTS='", v, "' must be a number of hosts (0 = off)"));
    else
      c.virtualHosts = static_cast<int>(n);
  }
  // CHORUS_NET: the kinds of transport between hosts this rank offers (a comma list of tcp, ucx,
  // ib); each pair of ranks uses the best kind both offer. Unset: chosen from what is there.
  if (const char* v = std::getenv("CHORUS_NET")) {
    std::string s = v;
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    bool ok = true;
    for (size_t at = 0; at < s.size();) {
      const size_t comma = std::min(s.find(',', at), s.size());
      const std::string item = s.substr(at, comma - at);
      ok = ok && (item == "tcp" || item == "ucx" || item == "ib");
      at = comma + 1;
    }
    if (ok && !s.ends_with(','))
      c.net = s;
    else
      note(strCat("CHORUS_NET='", v, "' is not a comma list of tcp, ucx, ib"));
  }
  // CHORUS_SOCKET_IFNAME: which interfaces the TCP transport may use (NCCL's syntax: prefixes, a
  // leading ^ excludes, a leading = matches exact names). CHORUS_SOCKET_FAMILY: 4 or 6.
  if (const char* v = std::getenv("CHORUS_SOCKET_IFNAME")) c.socketIfname = v;
  if (const char* v = std::getenv("CHORUS_SOCKET_FAMILY")) {
    std::string s = v;
    if (s == "4" || s == "AF_INET" || s == "ipv4" || s == "6" || s == "AF_INET6" || s == "ipv6" || s.empty())
      c.socketFamily = s;
    else
      note(strCat("CHORUS_SOCKET_FAMILY='", v, "' must be 4 or 6 (AF_INET or AF_INET6)"));
  }
  // CHORUS_SOCKET_NSTREAMS: TCP connections per pair of ranks on different hosts (default 1, max 16).
  if (const char* v = std::getenv("CHORUS_SOCKET_NSTREAMS")) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 1 || n > 16)
      note(strCat("CHORUS_SOCKET_NSTREAMS='", v, "' must be a number from 1 to 16"));
    else
      c.socketStreams = static_cast<int>(n);
  }
  // CHORUS_SOCKET_CHECKSUM: 1 adds a CRC-32C to every TCP frame, checked by the receiver (default 0).
  if (const char* v = std::getenv("CHORUS_SOCKET_CHECKSUM")) {
    std::string s = v;
    if (s == "1")
      c.socketChecksum = true;
    else if (s != "0")
      note(strCat("CHORUS_SOCKET_CHECKSUM='", v, "' must be 0 or 1"));
  }
  // CHORUS_SOCKET_BUFFER_BYTES: the TCP transport's ring per direction and peer (default 512K, min
  // 64K). Frames are half of it (at most 512K): small enough to be reduced while still in cache.
  if (const char* v = std::getenv("CHORUS_SOCKET_BUFFER_BYTES")) {
    auto b = parseByteSize(v);
    if (!b || *b < (size_t{64} << 10) || *b > (size_t{1} << 30))
      note(strCat("CHORUS_SOCKET_BUFFER_BYTES='", v, "' must be a size between 64K and 1G"));
    else
      c.socketBufferBytes = *b;
  }
  // CHORUS_IB_HCA: which RDMA device the verbs transport uses (a name prefix; default: the first
  // with an active port). CHORUS_IB_PORT: its port (default 1). CHORUS_IB_GID_INDEX: the GID on
  // RoCE (default 0).
  if (const char* v = std::getenv("CHORUS_IB_HCA")) c.ibHca = v;
  auto smallInt = [&](const char* name, int lo, int hi, int* out) {
    const char* v = std::getenv(name);
    if (!v) return;
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < lo || n > hi)
      note(strCat(name, "='", v, "' must be a number from ", lo, " to ", hi));
    else
      *out = static_cast<int>(n);
  };
  smallInt("CHORUS_IB_PORT", 1, 255, &c.ibPort);
  smallInt("CHORUS_IB_GID_INDEX", 0, 255, &c.ibGidIndex);
  // CHORUS_FLIGHT_RECORDER: when an operation fails, write the last operations of the communicator
  // to <value>.<communicator id>.<rank> (default: not written; they are always kept).
  if (const char* v = std::getenv("CHORUS_FLIGHT_RECORDER")) c.flightRecorderPath = v;
  // CHORUS_FLIGHT_RECORDER_ENTRIES: operations kept per communicator (default 256, 0 = none).
  if (const char* v = std::getenv("CHORUS_FLIGHT_RECORDER_ENTRIES")) {
    char* end = nullptr;
    unsigned long long n = std::strtoull(v, &end, 10);
    if (!*v || *end || n > 1'000'000) {
      note(strCat("CHORUS_FLIGHT_RECORDER_ENTRIES='", v, "' must be a number from 0 to 1000000"));
    } else {
      c.flightRecorderEntries = static_cast<size_t>(n);
    }
  }
  // CHORUS_CHECK: 1 compares every collective's arguments across ranks first (default 0).
  if (const char* v = std::getenv("CHORUS_CHECK")) {
    std::string s = v;
    if (s == "1")
      c.checkCalls = true;
    else if (s != "0")
      note(strCat("CHORUS_CHECK='", v, "' must be 0 or 1"));
  }
  return c;
}

}  // namespace

const EnvConfig& envConfig() {
  static const EnvConfig config = readEnv();
  return config;
}

std::string configValue(const std::string& name) {
  const EnvConfig& c = envConfig();
  auto flag = [](bool b) { return std::string(b ? "1" : "0"); };
  auto num = [](auto v) { return std::to_string(v); };
  if (name == "CHORUS_DEBUG") {
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
  }
  if (name == "CHORUS_DEBUG_SUBSYS") {
    if (c.logSubsystems == kAllSubsystems) return "ALL";
    std::string out;
    for (unsigned bit = 1; bit & kAllSubsystems; bit <<= 1)
      if (c.logSubsystems & bit) out += strCat(out.empty() ? "" : ",", subsysName(static_cast<Subsys>(bit)));
    return out;
  }
  if (name == "CHORUS_TIMEOUT") return strCat(static_cast<double>(c.timeout.count()) / 1000.0);
  if (name == "CHORUS_ALGO") return c.algo;
  if (name == "CHORUS_SHM_STAGE_BYTES") return num(c.shmStageBytes);
  if (name == "CHORUS_SHM_FIFO_BYTES") return num(c.shmFifoBytes);
  if (name == "CHORUS_CHECK") return flag(c.checkCalls);
  if (name == "CHORUS_NT_STORE_BYTES") return num(c.ntStoreBytes);
  if (name == "CHORUS_ZERO_COPY") return flag(c.zeroCopy);
  if (name == "CHORUS_VIRTUAL_HOSTS") return num(c.virtualHosts);
  if (name == "CHORUS_NET") return c.net;
  if (name == "CHORUS_SOCKET_IFNAME") return c.socketIfname;
  if (name == "CHORUS_SOCKET_FAMILY") return c.socketFamily;
  if (name == "CHORUS_SOCKET_NSTREAMS") return num(c.socketStreams);
  if (name == "CHORUS_SOCKET_CHECKSUM") return flag(c.socketChecksum);
  if (name == "CHORUS_SOCKET_BUFFER_BYTES") return num(c.socketBufferBytes);
  if (name == "CHORUS_IB_HCA") return c.ibHca;
  if (name == "CHORUS_IB_PORT") return num(c.ibPort);
  if (name == "CHORUS_IB_GID_INDEX") return num(c.ibGidIndex);
  if (name == "CHORUS_CUDA_STAGE_BYTES") return num(c.cudaStageBytes);
  if (name == "CHORUS_CUDA_LL_BYTES") return num(c.cudaLlBytes);
  if (name == "CHORUS_CUDA_P2P_CHUNK_BYTES") return num(c.cudaP2pChunkBytes);
  if (name == "CHORUS_CUDA_IPC") return flag(c.cudaIpc);
  if (name == "CHORUS_CUDA_SHARED_GPU") return c.cudaSharedGpuIpc ? "ipc" : "staged";
  if (name == "CHORUS_FLIGHT_RECORDER") return c.flightRecorderPath;
  if (name == "CHORUS_FLIGHT_RECORDER_ENTRIES") return num(c.flightRecorderEntries);
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
  if (c.shmStageBytes < (size_t{64} << 10)) failInvalid("Config::shmStageBytes must be at least 64 KiB");
  if (c.shmFifoBytes < 4096) failInvalid("Config::shmFifoBytes must be at least 4 KiB");
  // Sizes must keep 64-byte alignment of every region in the shared segment.
  c.shmStageBytes = alignUp(c.shmStageBytes, 128);
  c.shmFifoBytes = alignUp(c.shmFifoBytes, 64);
  return c;
}

Config Config::fromEnvironment() { return resolveConfig(Config{}); }

}  // namespace chorus
