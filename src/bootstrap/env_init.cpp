#include "bootstrap/env_init.hpp"

#include <cstdlib>
#include <optional>

#include "base/config.hpp"
#include "base/error.hpp"
#include "base/log.hpp"

namespace chorus {

namespace {

std::optional<std::string> env(const char* name) { return launchVariable(name); }

long parseInt(const std::string& text, const char* name, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  if (errno || end == text.c_str() || *end != '\0' || v < lo || v > hi) {
    failInvalid("environment variable ", name, "='", text, "' is not an integer in [", lo, ", ", hi, "]");
  }
  return v;
}

}  // namespace

std::pair<std::string, uint16_t> parseHostPort(const std::string& text, const std::string& what) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    failInvalid(what, "='", text, "' is not host:port");
  }
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  long port = parseInt(text.substr(colon + 1), what.c_str(), 1, 65535);
  return {host, static_cast<uint16_t>(port)};
}

EnvRendezvous rendezvousFromEnvironment() {
  struct Launcher {
    const char* rankVar;
    const char* sizeVar;
    const char* name;
  };
  static const Launcher launchers[] = {
      {"CHORUS_RANK", "CHORUS_WORLD_SIZE", "chorus"},
      {"RANK", "WORLD_SIZE", "torchrun"},
      {"SLURM_PROCID", "SLURM_NTASKS", "slurm"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "openmpi"},
      {"PMI_RANK", "PMI_SIZE", "mpich"},
  };
  EnvRendezvous rv;
  const Launcher* found = nullptr;
  for (const Launcher& l : launchers) {
    if (env(l.rankVar) && env(l.sizeVar)) {
      found = &l;
      break;
    }
  }
  if (!found) {
    rv.store = makeInProcessStore();
    rv.source = "none (single rank)";
    return rv;
  }
  rv.source = found->name;
  rv.size = static_cast<int>(parseInt(*env(found->sizeVar), found->sizeVar, 1, 1 << 20));
  rv.rank = static_cast<int>(parseInt(*env(found->rankVar), found->rankVar, 0, rv.size - 1));
  const auto timeout = std::chrono::milliseconds(300'000);

  // The job secret (CHORUS_SECRET, set by chorusrun) guards the TCP store both ways.
  const std::string secret = secretFromEnvironment();
  if (auto addr = env("CHORUS_STORE_ADDR")) {
    auto [host, port] = parseHostPort(*addr, "CHORUS_STORE_ADDR");
    rv.store = makeTcpStore(host, port, timeout, secret);
  } else if (auto dir = env("CHORUS_STORE_FILE")) {
    rv.store = makeFileStore(*dir);
  } else {
    auto masterAddr = env("MASTER_ADDR");
    auto masterPort = env("MASTER_PORT");
    if (!masterAddr || !masterPort) {
      failInvalid("rank ", rv.rank, ": ", found->rankVar, "/", found->sizeVar,
                  " are set but no store is: set CHORUS_STORE_ADDR=host:port, CHORUS_STORE_FILE=<dir>, or "
                  "MASTER_ADDR and MASTER_PORT");
    }
    long port = parseInt(*masterPort, "MASTER_PORT", 1, 65535);
    if (auto p = env("CHORUS_STORE_PORT")) {
      port = parseInt(*p, "CHORUS_STORE_PORT", 1, 65535);
    } else if (env("TORCHELASTIC_RUN_ID")) {
      port = port == 65535 ? 65534 : port + 1;  // torchrun's own TCPStore listens on MASTER_PORT
    }
    if (rv.rank == 0) {
      auto server = std::make_shared<TcpStoreServer>(*masterAddr, static_cast<uint16_t>(port), secret);
      rv.keepAlive = server;
    }
    rv.store = makeTcpStore(*masterAddr, static_cast<uint16_t>(port), timeout, secret);
  }
  logInfo(Subsys::Bootstrap, "rank ", rv.rank, " of ", rv.size, ": rendezvous from ", rv.source,
          " variables");
  return rv;
}

}  // namespace chorus
