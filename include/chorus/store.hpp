// Chorus bootstrap stores: a small key-value service that ranks use to find each other.
//
// A Store is shared by all ranks of a job. Keys are strings (at most kMaxKeyBytes), values are
// byte strings (at most kMaxValueBytes). Every blocking call takes a deadline and throws
// chorus::Error(chorusTimeout) naming the keys it waited for when it passes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "chorus/chorus.h"

namespace chorus {

class CHORUS_API Store {
 public:
  static constexpr size_t kMaxKeyBytes = 4096;
  static constexpr size_t kMaxValueBytes = size_t{64} << 20;

  virtual ~Store() = default;

  /// Sets key to value (overwrites).
  virtual void set(const std::string& key, std::span<const std::byte> value) = 0;
  /// Returns the value once the key exists; throws chorusTimeout after `timeout`.
  virtual std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// Atomically adds delta to the integer stored at key (missing key counts as 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  /// True if every key exists now (does not wait).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  /// Removes a key; true if it existed.
  virtual bool erase(const std::string& key) = 0;

  /// Waits until every key exists; throws chorusTimeout naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  // Convenience for string values.
  void setString(const std::string& key, const std::string& value);
  std::string getString(const std::string& key, std::chrono::milliseconds timeout);
};

/// Store for ranks that are threads of one process.
CHORUS_API std::shared_ptr<Store> makeInProcessStore();

/// Store in a directory shared by all ranks (a local or network file system). Created if missing.
CHORUS_API std::shared_ptr<Store> makeFileStore(const std::string& directory);

/// The job secret from CHORUS_SECRET; empty when unset. Throws chorus::Error(chorusInvalidArgument)
/// for a secret shorter than 16 or longer than 1024 bytes.
CHORUS_API std::string secretFromEnvironment();

/// A new random job secret (64 hex digits: 256 bits from the kernel's random source).
CHORUS_API std::string generateSecret();

/// Client of a TCP store server at host:port. Connecting retries until `timeout`.
///
/// When `secret` is non-empty the client proves it to the server with HMAC-SHA256 over fresh nonces
/// (the secret never crosses the wire) and requires the server to prove it back; a server with another
/// secret or none is refused with chorus::Error(chorusInvalidUsage). With an empty secret it joins
/// only a server that has none. The default is the environment's CHORUS_SECRET, which chorusrun sets.
CHORUS_API std::shared_ptr<Store> makeTcpStore(const std::string& host, uint16_t port,
                                               std::chrono::milliseconds timeout = std::chrono::seconds(60),
                                               const std::string& secret = secretFromEnvironment());

/// Every key of `inner` seen through this store is prefixed by `prefix`.
CHORUS_API std::shared_ptr<Store> makePrefixStore(std::string prefix, std::shared_ptr<Store> inner);

/// A TCP store server running on a background thread of this process until destroyed.
class CHORUS_API TcpStoreServer {
 public:
  /// Listens on `bindAddress` ("0.0.0.0", "127.0.0.1", "::" ...) and `port` (0 = ephemeral).
  /// Throws chorus::Error(chorusSystemError) naming the address when it cannot listen.
  ///
  /// With a non-empty `secret`, only clients that prove it (see makeTcpStore) are served; every other
  /// connection is closed after the handshake, or after 10 s without one, and counted in
  /// rejectedConnections(). The default is the environment's CHORUS_SECRET.
  TcpStoreServer(const std::string& bindAddress, uint16_t port,
                 const std::string& secret = secretFromEnvironment());
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  /// The port actually bound.
  uint16_t port() const;
  /// Connections closed without being served: wrong or missing secret, malformed or no handshake.
  uint64_t rejectedConnections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chorus
