// Helpers shared by the store tests.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

#include "base/socket_util.hpp"
#include "bootstrap/auth.hpp"
#include "bootstrap/tcp_store_protocol.hpp"
#include "chorus/chorus.hpp"

namespace chorus::test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

/// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "chorus-store-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Runs `fn`, expecting it to throw chorus::Error with `code`; returns the message ("" on failure).
inline std::string expectError(chorusResult_t code, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected chorus::Error with code " << code;
  return "";
}

/// A local port nobody listens on right now.
inline uint16_t unusedPort() {
  auto fd = net::listenTcp("127.0.0.1", 0);
  return net::localAddress(fd.get()).port();
}

inline std::span<const std::byte> bytesOf(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

inline std::string stringOf(const std::vector<std::byte>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

/// True if the server closes the connection within `within` (EOF or reset), false if it stays open.
inline bool closedByServer(int fd, std::chrono::milliseconds within) {
  const auto deadline = Clock::now() + within;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, net::pollTimeoutMs(deadline)) <= 0) return false;
    std::byte buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    if (Clock::now() >= deadline) return false;
  }
}

/// What a raw client learnt from the handshake it drove byte by byte (tcp_store_protocol.hpp).
struct RawHandshake {
  std::array<std::byte, tcpstore::kServerHelloBytes> serverHello{};
  std::array<std::byte, tcpstore::kClientHelloBytes> clientHello{};
  int verdict = -1;  // -1: the server closed without a verdict
  std::array<std::byte, tcpstore::kVerdictBytes> verdictBytes{};
};

/// Reads the server hello, then sends `clientHello` as given, or (when it is empty) a hello that
/// proves `secret` (none for an empty secret) on the server's nonce; reads the verdict.
inline RawHandshake rawHandshake(int fd, const std::string& secret,
                                 std::span<const std::byte> clientHello = {}) {
  RawHandshake h;
  const auto deadline = Clock::now() + 5s;
  net::recvAll(fd, h.serverHello, deadline, "server hello");
  if (clientHello.empty()) {
    auth::Nonce serverNonce, clientNonce = auth::randomNonce();
    std::memcpy(serverNonce.data(), h.serverHello.data() + 16, serverNonce.size());
    std::memcpy(h.clientHello.data(), tcpstore::kClientHelloMagic, 8);
    h.clientHello[8] = std::byte{secret.empty() ? uint8_t{0} : uint8_t{1}};
    std::memcpy(h.clientHello.data() + 16, clientNonce.data(), clientNonce.size());
    if (!secret.empty()) {
      const auto proof = auth::prove(secret, tcpstore::kClientLabel, serverNonce, clientNonce);
      std::memcpy(h.clientHello.data() + 48, proof.data(), proof.size());
    }
    clientHello = h.clientHello;
  }
  net::sendAll(fd, clientHello, deadline, "client hello");
  try {
    net::recvAll(fd, h.verdictBytes, deadline, "verdict");
    h.verdict = static_cast<int>(h.verdictBytes[8]);
  } catch (const Error&) {
    h.verdict = -1;
  }
  return h;
}

}  // namespace chorus::test
