#include "bootstrap/unique_id.hpp"

#include <sys/random.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "bootstrap/env_init.hpp"
#include "core/error.hpp"

namespace chorus {

namespace {
constexpr const char* kMagic = "chorus-uid-1";

// Servers live until the process exits: ranks may join long after the id was made.
std::mutex gServersMu;
std::vector<std::unique_ptr<TcpStoreServer>>* gServers = new std::vector<std::unique_ptr<TcpStoreServer>>();
}  // namespace

void makeUniqueId(chorusUniqueId* id) {
  // CHORUS_BOOTSTRAP_ADDR chooses the address to listen on and advertise. The default is loopback:
  // this build's ranks all share one host (network transports come with their own issue).
  std::string host = "127.0.0.1";
  if (const char* v = std::getenv("CHORUS_BOOTSTRAP_ADDR"); v && *v) host = v;
  auto server = std::make_unique<TcpStoreServer>(host, 0);
  uint16_t port = server->port();
  {
    std::lock_guard lk(gServersMu);
    gServers->push_back(std::move(server));
  }
  unsigned long long nonce = 0;
  if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce) failSystem("getrandom");
  std::memset(id->internal, 0, sizeof id->internal);
  int n =
      std::snprintf(id->internal, sizeof id->internal, "%s %s %u %016llx", kMagic, host.c_str(), port, nonce);
  if (n < 0 || static_cast<size_t>(n) >= sizeof id->internal)
    failInvalid("bootstrap address '", host, "' is too long");
}

std::optional<UniqueIdAddress> parseUniqueId(const chorusUniqueId& id) {
  char text[CHORUS_UNIQUE_ID_BYTES + 1];
  std::memcpy(text, id.internal, CHORUS_UNIQUE_ID_BYTES);
  text[CHORUS_UNIQUE_ID_BYTES] = '\0';
  char magic[32] = {0}, host[100] = {0}, nonce[32] = {0};
  unsigned port = 0;
  if (std::sscanf(text, "%31s %99s %u %31s", magic, host, &port, nonce) != 4 ||
      std::strcmp(magic, kMagic) != 0 || port == 0 || port > 65535) {
    return std::nullopt;
  }
  return UniqueIdAddress{host, static_cast<uint16_t>(port), nonce};
}

std::shared_ptr<Store> storeForUniqueId(const chorusUniqueId& id) {
  const auto address = parseUniqueId(id);
  if (!address) failInvalid("chorusUniqueId is not one made by chorusGetUniqueId");
  auto store = makeTcpStore(address->host, address->port);
  return makePrefixStore(strCat("uid/", address->nonce, "/"), store);
}

}  // namespace chorus
