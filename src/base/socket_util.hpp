// Small TCP socket toolkit for the bootstrap and anything else that needs plain sockets: an owning
// descriptor, name resolution, connect/listen, and exact-size transfers bounded by a deadline.
//
// Every failure throws chorus::Error: chorusTimeout when the deadline passes, chorusRemoteError when
// the peer closed or reset the connection, chorusSystemError (with strerror text) for anything else.
// Messages start with the caller's `where` text so they say which connection failed.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace chorus::net {

using Clock = std::chrono::steady_clock;

/// Owns one file descriptor (socket, eventfd, ...) and closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  /// Gives up ownership without closing.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  /// Closes the current descriptor (if any) and takes ownership of `fd`.
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

/// One resolved socket address (IPv4 or IPv6).
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  /// Numeric "1.2.3.4:80" or "[::1]:80".
  std::string toString() const;
  uint16_t port() const;
};

/// "host:port", with brackets around an IPv6 literal.
std::string formatHostPort(const std::string& host, uint16_t port);

/// Resolves a numeric address or a name to TCP addresses (IPv4 and IPv6, in getaddrinfo's order).
/// `passive` with an empty host gives the wildcard addresses for listening. "[::1]" is accepted.
/// Throws chorusSystemError naming host:port when nothing resolves.
std::vector<SocketAddress> resolve(const std::string& host, uint16_t port, bool passive = false);

/// Connects to the first address of host:port that accepts, giving up at `deadline` (chorusTimeout).
/// One attempt per address: callers that must wait for a server to come up retry around this.
/// The socket is returned in blocking mode with TCP_NODELAY and close-on-exec set.
Fd connectTcp(const std::string& host, uint16_t port, Clock::time_point deadline);

/// Listens on host:port (port 0: an ephemeral port) with SO_REUSEADDR; IPv6 wildcards also accept
/// IPv4. The socket is non-blocking and close-on-exec. Throws chorusSystemError naming the address.
Fd listenTcp(const std::string& host, uint16_t port, int backlog = 512);

/// Address the socket is bound to / connected to.
SocketAddress localAddress(int fd);
SocketAddress peerAddress(int fd);

void setNonBlocking(int fd, bool nonBlocking);
void setNoDelay(int fd);

/// Sends every byte of every buffer (gathered, without copying them together), or throws.
void sendAll(int fd, std::span<const std::span<const std::byte>> buffers, Clock::time_point deadline,
             const std::string& where);
void sendAll(int fd, std::span<const std::byte> data, Clock::time_point deadline, const std::string& where);
/// Receives exactly data.size() bytes, or throws (a peer that closes early is chorusRemoteError).
void recvAll(int fd, std::span<std::byte> data, Clock::time_point deadline, const std::string& where);

/// Milliseconds until the deadline for poll(): rounded up, at least 0, at most about a day.
int pollTimeoutMs(Clock::time_point deadline);

/// "what: strerror(err)"
std::string errnoText(const std::string& what, int err);

}  // namespace chorus::net
