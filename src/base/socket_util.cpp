#include "base/socket_util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "chorus/chorus.hpp"

namespace chorus::net {

void Fd::reset(int fd) {
  if (fd_ >= 0) {
    // Linux releases the descriptor even when close() reports EINTR, so retrying could close a
    // descriptor another thread has just been given.
    ::close(fd_);
  }
  fd_ = fd;
}

std::string errnoText(const std::string& what, int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf; thread safe either way.
  const char* text = strerror_r(err, buf, sizeof(buf));
  return what + ": " + text;
}

std::string SocketAddress::toString() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (family() == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
  } else if (family() == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
  }
  return formatHostPort(host, port());
}

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

std::string formatHostPort(const std::string& host, uint16_t port) {
  const bool bare6 = host.find(':') != std::string::npos && !host.starts_with('[');
  return (bare6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::vector<SocketAddress> resolve(const std::string& host, uint16_t port, bool passive) {
  std::string node = host;
  if (node.size() >= 2 && node.front() == '[' && node.back() == ']') node = node.substr(1, node.size() - 2);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  // No AI_ADDRCONFIG: it hides ::1 on hosts whose only IPv6 address is the loopback one.
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string service = std::to_string(port);
  addrinfo* list = nullptr;
  const int rc = getaddrinfo(node.empty() ? nullptr : node.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    const std::string reason = rc == EAI_SYSTEM ? errnoText("getaddrinfo", errno) : gai_strerror(rc);
    throw Error(chorusSystemError, "cannot resolve " + formatHostPort(host, port) + ": " + reason);
  }
  std::vector<SocketAddress> out;
  for (const addrinfo* ai = list; ai; ai = ai->ai_next) {
    if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) ||
        ai->ai_addrlen > sizeof(sockaddr_storage)) {
      continue;
    }
    SocketAddress a;
    std::memcpy(&a.storage, ai->ai_addr, ai->ai_addrlen);
    a.length = ai->ai_addrlen;
    out.push_back(a);
  }
  freeaddrinfo(list);
  if (out.empty()) {
    throw Error(chorusSystemError,
                "cannot resolve " + formatHostPort(host, port) + ": no IPv4 or IPv6 address");
  }
  return out;
}

int pollTimeoutMs(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  constexpr int64_t kDay = 24 * 3600 * 1000;
  return static_cast<int>(std::min<int64_t>(ms, kDay));
}

void setNonBlocking(int fd, bool nonBlocking) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0) throw Error(chorusSystemError, errnoText("fcntl(F_GETFL)", errno));
  const int wanted = nonBlocking ? flags | O_NONBLOCK : flags & ~O_NONBLOCK;
  if (wanted != flags && fcntl(fd, F_SETFL, wanted) < 0) {
    throw Error(chorusSystemError, errnoText("fcntl(F_SETFL)", errno));
  }
}

void setNoDelay(int fd) {
  const int one = 1;
  // Request/reply traffic: waiting to coalesce small writes only adds latency.
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) {
    throw Error(chorusSystemError, errnoText("setsockopt(TCP_NODELAY)", errno));
  }
}

namespace {

SocketAddress socketName(int fd, bool peer) {
  SocketAddress a;
  a.length = sizeof(a.storage);
  auto* sa = reinterpret_cast<sockaddr*>(&a.storage);
  const int rc = peer ? getpeername(fd, sa, &a.length) : getsockname(fd, sa, &a.length);
  if (rc < 0) throw Error(chorusSystemError, errnoText(peer ? "getpeername" : "getsockname", errno));
  return a;
}

bool sameAddress(const SocketAddress& a, const SocketAddress& b) {
  return a.length == b.length && std::memcmp(&a.storage, &b.storage, a.length) == 0;
}

// Waits for `events` on fd; false if the deadline passed first.
bool pollFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, pollTimeoutMs(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (Clock::now() >= deadline) return false;
      continue;  // poll's millisecond rounding woke us a little early
    }
    if (errno != EINTR) throw Error(chorusSystemError, errnoText("poll", errno));
  }
}

// Result of one non-blocking connect attempt: 0 on success, else the errno; ETIMEDOUT for the deadline.
int connectOne(const SocketAddress& addr, Clock::time_point deadline, Fd& out) {
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return errno;
  if (::connect(fd.get(), addr.get(), addr.length) < 0) {
    if (errno != EINPROGRESS && errno != EINTR) return errno;
    if (!pollFor(fd.get(), POLLOUT, deadline)) return ETIMEDOUT;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) < 0) return errno;
    if (err != 0) return err;
  }
  // Dialling a free local port inside the ephemeral range can, rarely, pick that same port as the
  // source and "connect" to itself (TCP simultaneous open). That is no server: treat it as refused.
  if (sameAddress(socketName(fd.get(), false), socketName(fd.get(), true))) return ECONNREFUSED;
  setNonBlocking(fd.get(), false);
  setNoDelay(fd.get());
  out = std::move(fd);
  return 0;
}

// Per-address failures of a connect or listen, as "what: error" when the name had one address (the
// usual numeric case) and "addr: what: error; ..." when it had several.
class Failures {
 public:
  void add(const SocketAddress& addr, const std::string& what, int err) {
    entries_.push_back({addr.toString(), errnoText(what, err)});
  }
  std::string text() const {
    if (entries_.size() == 1) return entries_[0].second;
    std::string out;
    for (const auto& [addr, error] : entries_) out += (out.empty() ? "" : "; ") + addr + ": " + error;
    return out;
  }

 private:
  std::vector<std::pair<std::string, std::string>> entries_;
};

}  // namespace

SocketAddress localAddress(int fd) { return socketName(fd, false); }
SocketAddress peerAddress(int fd) { return socketName(fd, true); }

Fd connectTcp(const std::string& host, uint16_t port, Clock::time_point deadline) {
  const auto addrs = resolve(host, port);
  Failures failures;
  for (const auto& addr : addrs) {
    Fd fd;
    const int err = connectOne(addr, deadline, fd);
    if (err == 0) return fd;
    failures.add(addr, "connect", err);
    if (err == ETIMEDOUT && Clock::now() >= deadline) {
      throw Error(chorusTimeout, formatHostPort(host, port) + ": " + failures.text() + " (deadline passed)");
    }
  }
  throw Error(chorusSystemError, formatHostPort(host, port) + ": " + failures.text());
}

Fd listenTcp(const std::string& host, uint16_t port, int backlog) {
  const auto addrs = resolve(host, port, /*passive=*/true);
  Failures failures;
  for (const auto& addr : addrs) {
    const auto fail = [&](const char* what) { failures.add(addr, what, errno); };
    Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
      fail("socket");
      continue;
    }
    const int one = 1, zero = 0;
    // A restarted server must be able to take its port back while old connections sit in TIME_WAIT.
    if (setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0) {
      fail("setsockopt(SO_REUSEADDR)");
      continue;
    }
    if (addr.family() == AF_INET6) {
      // Best effort: lets "::" serve IPv4 clients too regardless of the system's bindv6only default.
      setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    if (::bind(fd.get(), addr.get(), addr.length) < 0) {
      fail("bind");
      continue;
    }
    if (::listen(fd.get(), backlog) < 0) {
      fail("listen");
      continue;
    }
    return fd;
  }
  throw Error(chorusSystemError, "cannot listen on " + formatHostPort(host, port) + ": " + failures.text());
}

void sendAll(int fd, std::span<const std::span<const std::byte>> buffers, Clock::time_point deadline,
             const std::string& where) {
  std::vector<iovec> iov;
  size_t total = 0;
  for (const auto& b : buffers) {
    if (b.empty()) continue;
    iov.push_back({const_cast<std::byte*>(b.data()), b.size()});
    total += b.size();
  }
  size_t sent = 0;
  size_t first = 0;  // first iovec with bytes left
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = &iov[first];
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    // MSG_NOSIGNAL: a vanished peer must become an exception, not a SIGPIPE that kills the process.
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        if (!pollFor(fd, POLLOUT, deadline)) {
          throw Error(chorusTimeout, where + ": timed out sending (" + std::to_string(sent) + " of " +
                                         std::to_string(total) + " bytes sent)");
        }
        continue;
      }
      if (err == EPIPE || err == ECONNRESET) {
        throw Error(chorusRemoteError, errnoText(where + ": connection lost while sending", err));
      }
      throw Error(chorusSystemError, errnoText(where + ": send", err));
    }
    sent += static_cast<size_t>(n);
    size_t left = static_cast<size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (first < iov.size()) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
}

void sendAll(int fd, std::span<const std::byte> data, Clock::time_point deadline, const std::string& where) {
  const std::span<const std::byte> one[] = {data};
  sendAll(fd, one, deadline, where);
}

void recvAll(int fd, std::span<std::byte> data, Clock::time_point deadline, const std::string& where) {
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::recv(fd, data.data() + got, data.size() - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      throw Error(chorusRemoteError, where + ": connection closed by peer (received " + std::to_string(got) +
                                         " of " + std::to_string(data.size()) + " bytes)");
    }
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (!pollFor(fd, POLLIN, deadline)) {
        throw Error(chorusTimeout, where + ": timed out receiving (" + std::to_string(got) + " of " +
                                       std::to_string(data.size()) + " bytes received)");
      }
      continue;
    }
    if (err == ECONNRESET)
      throw Error(chorusRemoteError, errnoText(where + ": connection reset by peer", err));
    throw Error(chorusSystemError, errnoText(where + ": recv", err));
  }
}

}  // namespace chorus::net
