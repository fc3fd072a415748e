#include "bootstrap/unique_id.hpp"

#include <sys/random.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "base/config.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "bootstrap/auth.hpp"
#include "bootstrap/env_init.hpp"

namespace chorus {

namespace {
constexpr const char* kMagic = "chorus-uid-2";

// Servers live until the process exits: ranks may join long after the id was made.
std::mutex gServersMu;
std::vector<std::unique_ptr<TcpStoreServer>>* gServers = new std::vector<std::unique_ptr<TcpStoreServer>>();

// The secret field of an id whose store takes any client: made by a build without OpenSSL, which
// cannot prove a secret.
constexpr const char* kNoSecret = "-";
std::string storeSecret(const UniqueIdAddress& address) {
  return address.secret == kNoSecret ? std::string() : address.secret;
}

bool plainField(const std::string& text) {
  return !text.empty() && text.find_first_of(" \t\n") == std::string::npos;
}
}  // namespace

bool formatUniqueId(const UniqueIdAddress& address, chorusUniqueId* id) {
  std::memset(id->internal, 0, sizeof id->internal);
  if (!plainField(address.host) || !plainField(address.nonce) || !plainField(address.secret) ||
      address.port == 0) {
    return false;
  }
  const int n =
      std::snprintf(id->internal, sizeof id->internal, "%s %s %u %s %s", kMagic, address.host.c_str(),
                    unsigned{address.port}, address.nonce.c_str(), address.secret.c_str());
  return n > 0 && static_cast<size_t>(n) < sizeof id->internal;
}

void makeUniqueId(chorusUniqueId* id) {
  // CHORUS_BOOTSTRAP_ADDR chooses the address to listen on and advertise. The default is loopback:
  // this build's ranks all share one host (network transports come with their own issue).
  UniqueIdAddress address;
  address.host = "127.0.0.1";
  if (auto v = launchVariable("CHORUS_BOOTSTRAP_ADDR")) address.host = *v;
  // A secret of its own per id: whoever holds the id may join, nobody else can talk to the store.
  // A build without OpenSSL has none to prove: its store takes any client that reaches it.
  if (auth::available()) {
    address.secret = auth::randomHex(16);
  } else {
    address.secret = kNoSecret;
    static std::once_flag once;
    std::call_once(once, [&] {
      logWarn(
          "chorusGetUniqueId: this build has no authentication (built without OpenSSL): the "
          "id's store on ",
          address.host, " takes any process that reaches it");
    });
  }
  address.nonce = auth::randomHex(8);
  if (address.host.size() > 64) failInvalid("CHORUS_BOOTSTRAP_ADDR '", address.host, "' is too long");
  auto server = std::make_unique<TcpStoreServer>(address.host, 0, storeSecret(address));
  address.port = server->port();
  if (!formatUniqueId(address, id))
    failInvalid("bootstrap address '", address.host, "' does not fit a chorusUniqueId");
  std::lock_guard lk(gServersMu);
  gServers->push_back(std::move(server));
}

std::optional<UniqueIdAddress> parseUniqueId(const chorusUniqueId& id) {
  char text[CHORUS_UNIQUE_ID_BYTES + 1];
  std::memcpy(text, id.internal, CHORUS_UNIQUE_ID_BYTES);
  text[CHORUS_UNIQUE_ID_BYTES] = '\0';
  char magic[32] = {0}, host[100] = {0}, nonce[32] = {0}, secret[100] = {0};
  unsigned port = 0;
  if (std::sscanf(text, "%31s %99s %u %31s %99s", magic, host, &port, nonce, secret) != 5 ||
      std::strcmp(magic, kMagic) != 0 || port == 0 || port > 65535) {
    return std::nullopt;
  }
  return UniqueIdAddress{host, static_cast<uint16_t>(port), nonce, secret};
}

std::shared_ptr<Store> storeForUniqueId(const chorusUniqueId& id, std::chrono::milliseconds timeout) {
  const auto address = parseUniqueId(id);
  if (!address) failInvalid("chorusUniqueId is not one made by chorusGetUniqueId");
  const std::string where = strCat("the unique id's store (", address->host, ":", address->port, ")");
  if (!auth::available() && address->secret != kNoSecret)
    failInvalid(
        "chorusUniqueId carries a secret, but this Chorus build has no authentication (built "
        "without OpenSSL) to prove it to ",
        where, ": the id was made by a build with it; use builds of one kind in a job");
  std::shared_ptr<Store> store;
  try {
    store = makeTcpStore(address->host, address->port, timeout, storeSecret(*address));
  } catch (const Error& e) {
    // The secret is the id's own, so a refusal means the id does not belong to that server; no
    // peer is involved in any of these.
    if (e.code() == chorusTimeout)
      throw Error(chorusTimeout, strCat(where, " did not answer within ", timeout.count(),
                                        " ms (CHORUS_TIMEOUT): is the process that made the id with "
                                        "chorusGetUniqueId still running, and reachable from here? (",
                                        e.what(), ")"));
    if (e.code() == chorusInvalidUsage)
      failInvalid(where,
                  " refused the secret carried in the id: the id was altered, or names another "
                  "job's store (its process exited and the port was reused)");
    if (e.code() == chorusRemoteError)
      failInvalid(where, " did not take the id: ", e.what(),
                  ". The id is stale (its process exited and the port was reused) or was not made by "
                  "chorusGetUniqueId");
    throw;
  }
  return makePrefixStore(strCat("uid/", address->nonce, "/"), store);
}

}  // namespace chorus
