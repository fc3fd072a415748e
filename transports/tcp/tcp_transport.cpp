#include "transports/tcp/tcp_transport.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "base/error.hpp"
#include "base/log.hpp"
#include "transports/tcp/net_interfaces.hpp"
#include "transports/tcp/tcp_connection.hpp"

namespace chorus::transport {

namespace {

constexpr char kHelloMagic[8] = {'C', 'H', 'O', 'R', 'U', 'S', 'N', '1'};

struct Hello {
  char magic[8];
  char comm[32];
  uint32_t rank;
  uint32_t stream;
};

void copyId(char (&dst)[32], const std::string& id) {
  std::memset(dst, 0, sizeof dst);
  std::memcpy(dst, id.data(), std::min(id.size(), sizeof dst));
}

}  // namespace

// ---- The transport -----------------------------------------------------------------------------

TcpTransport::TcpTransport(Store& store, int rank, int nranks, const std::vector<bool>& remote,
                           const TcpOptions& options)
    : options_(options) {
  if (options_.streams < 1) options_.streams = 1;
  // Multiples of 64 bytes (pipe.hpp's alignment contract: an element never straddles the wrap).
  options_.frameBytes = std::max<size_t>(64, options_.frameBytes & ~size_t{63});
  options_.ringBytes = std::max(options_.ringBytes & ~size_t{63}, 2 * options_.frameBytes);
  const auto deadline = Clock::now() + options_.timeout;
  std::vector<NetInterface> candidates = listInterfaces();
  if (options_.loopbackOnly) std::erase_if(candidates, [](const NetInterface& n) { return !n.loopback; });
  const NetInterface iface =
      selectInterface(candidates, options_.loopbackOnly ? std::string() : options_.ifname, options_.family,
                      options_.allowLoopback || options_.loopbackOnly);
  const net::Fd listener = listen(store, rank, iface);
  connectAll(store, rank, nranks, remote, iface, deadline);
  acceptAll(listener, rank, remote, deadline);
  startProgress(rank);
}

net::Fd TcpTransport::listen(Store& store, int rank, const NetInterface& iface) {
  // Listen on the chosen address.
  net::SocketAddress bindAddr = iface.address;
  net::Fd listener(::socket(bindAddr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!listener) failSystem(strCat("rank ", rank, ": socket"));
  const int one = 1;
  setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listener.get(), bindAddr.get(), bindAddr.length) < 0) {
    fail(chorusSystemError,
         net::errnoText(strCat("rank ", rank, ": bind to ", iface.name, " ", addressText(bindAddr)), errno));
  }
  if (::listen(listener.get(), 1024) < 0) failSystem(strCat("rank ", rank, ": listen"));
  const uint16_t port = net::localAddress(listener.get()).port();
  local_ = strCat(iface.name, " ", net::formatHostPort(addressText(iface.address), port));
  store.setString(strCat("net/", rank), strCat(addressText(iface.address), " ", port));
  logInfo(Subsys::Net, "rank ", rank, ": TCP transport listening on ", local_, ", ", options_.streams,
          " stream(s) per peer");
  return listener;
}

void TcpTransport::connectAll(Store& store, int rank, int nranks, const std::vector<bool>& remote,
                              const NetInterface& iface, Clock::time_point deadline) {
  conns_.resize(static_cast<size_t>(nranks));
  for (int p = 0; p < nranks; ++p) {
    if (p == rank || !remote[static_cast<size_t>(p)]) continue;
    const std::string text = store.getString(strCat("net/", p), options_.timeout);
    char host[128] = {0};
    unsigned portNum = 0;
    if (std::sscanf(text.c_str(), "%127s %u", host, &portNum) != 2 || portNum > 65535) {
      fail(chorusRemoteError,
           strCat("rank ", rank, ": malformed network address from rank ", p, ": '", text, "'"));
    }
    const std::string address = net::formatHostPort(host, static_cast<uint16_t>(portNum));
    conns_[static_cast<size_t>(p)] = std::make_unique<TcpConnection>(p, address, options_);
    if (p < rank) continue;
    // This rank connects to the higher ranks (the kernel completes a connection before it is accepted).
    net::SocketAddress addr;
    if (!parseAddress(host, static_cast<uint16_t>(portNum), iface.index, &addr)) {
      fail(chorusRemoteError,
           strCat("rank ", rank, ": rank ", p, " advertised the address '", host, "', which is not numeric"));
    }
    for (int s = 0; s < options_.streams; ++s) {
      conns_[static_cast<size_t>(p)]->socks_[static_cast<size_t>(s)] =
          connectStream(addr, rank, p, s, address, deadline);
    }
  }
}

net::Fd TcpTransport::connectStream(const net::SocketAddress& addr, int rank, int p, int s,
                                    const std::string& address, Clock::time_point deadline) {
  net::Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) failSystem(strCat("rank ", rank, ": socket"));
  net::setNonBlocking(fd.get(), true);
  int rc = ::connect(fd.get(), addr.get(), addr.length);
  if (rc < 0 && errno == EINPROGRESS) {
    pollfd pfd{fd.get(), POLLOUT, 0};
    rc = ::poll(&pfd, 1, net::pollTimeoutMs(deadline));
    int err = rc == 0 ? ETIMEDOUT : 0;
    socklen_t len = sizeof err;
    if (rc > 0) getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err ? -1 : 0;
    errno = err;
  }
  if (rc < 0) {
    fail(errno == ETIMEDOUT ? chorusTimeout : chorusSystemError,
         net::errnoText(strCat("rank ", rank, ": connecting to rank ", p, " at ", address, " from ", local_),
                        errno));
  }
  net::setNonBlocking(fd.get(), false);
  Hello hello{};
  std::memcpy(hello.magic, kHelloMagic, 8);
  copyId(hello.comm, options_.commId);
  hello.rank = static_cast<uint32_t>(rank);
  hello.stream = static_cast<uint32_t>(s);
  net::sendAll(fd.get(), std::as_bytes(std::span(&hello, 1)), deadline,
               strCat("rank ", rank, ": hello to rank ", p));
  return fd;
}

void TcpTransport::acceptAll(const net::Fd& listener, int rank, const std::vector<bool>& remote,
                             Clock::time_point deadline) {
  // Accept the lower remote ranks.
  size_t expected = 0;
  for (int p = 0; p < rank; ++p)
    expected += remote[static_cast<size_t>(p)] ? static_cast<size_t>(options_.streams) : 0;
  while (expected > 0) {
    pollfd pfd{listener.get(), POLLIN, 0};
    const int rc = ::poll(&pfd, 1, net::pollTimeoutMs(deadline));
    if (rc == 0 || Clock::now() >= deadline) {
      std::string missing;
      for (int p = 0; p < rank; ++p) {
        if (!conns_[static_cast<size_t>(p)]) continue;
        for (auto& s : conns_[static_cast<size_t>(p)]->socks_) {
          if (!s) {
            missing += strCat(missing.empty() ? "" : ", ", p);
            break;
          }
        }
      }
      fail(chorusTimeout, strCat("rank ", rank, ": timed out after ", options_.timeout.count(),
                                 " ms waiting for rank(s) ", missing, " to connect to ", local_));
    }
    net::Fd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      failSystem(strCat("rank ", rank, ": accept"));
    }
    Hello hello{};
    try {
      // A connection that says nothing is dropped after 5 s, not waited for until the deadline.
      net::recvAll(fd.get(), std::as_writable_bytes(std::span(&hello, 1)),
                   std::min(deadline, Clock::now() + std::chrono::seconds(5)),
                   strCat("rank ", rank, ": hello"));
    } catch (const Error& e) {
      logWarn("rank ", rank, ": dropped an incoming connection: ", e.what());
      continue;
    }
    char id[32];
    copyId(id, options_.commId);
    const int p = static_cast<int>(hello.rank);
    if (std::memcmp(hello.magic, kHelloMagic, 8) != 0 || std::memcmp(hello.comm, id, 32) != 0 || p < 0 ||
        p >= rank || !conns_[static_cast<size_t>(p)] ||
        hello.stream >= static_cast<uint32_t>(options_.streams) ||
        conns_[static_cast<size_t>(p)]->socks_[hello.stream]) {
      logWarn("rank ", rank, ": refused a connection from ", net::peerAddress(fd.get()).toString(),
              " (not an expected rank of this communicator)");
      continue;
    }
    conns_[static_cast<size_t>(p)]->socks_[hello.stream] = std::move(fd);
    --expected;
  }
}

void TcpTransport::startProgress(int rank) {
  // All sockets non-blocking, without Nagle; the progress thread watches them for writability.
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  event_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_ || !event_) failSystem(strCat("rank ", rank, ": epoll/eventfd"));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = ~uint64_t{0};
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, event_.get(), &ev);
  for (auto& c : conns_) {
    if (!c) continue;
    for (auto& s : c->socks_) {
      net::setNonBlocking(s.get(), true);
      net::setNoDelay(s.get());
      epoll_event e{};
      e.events = 0;
      e.data.u64 = static_cast<uint64_t>(c->peer());
      epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, s.get(), &e);
    }
    TcpConnection* conn = c.get();
    c->requestHelp = [this, conn] {
      conn->armRequested_.store(true);
      wakeProgress();
    };
  }
  progress_ = std::thread([this] { progressLoop(); });
}

TcpTransport::~TcpTransport() {
  stop_.store(true);
  wakeProgress();
  if (progress_.joinable()) progress_.join();
  const auto deadline =
      Clock::now() + std::min<std::chrono::milliseconds>(options_.timeout, std::chrono::seconds(30));
  for (auto& c : conns_) {
    if (c) c->drain(deadline);
  }
}

void TcpTransport::wakeProgress() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(event_.get(), &one, sizeof one);
}

void TcpTransport::progressLoop() {
  std::vector<epoll_event> events(64);
  // Watch exactly the streams that have a frame to finish: an idle stream is always writable.
  auto watch = [&](TcpConnection& c, uint64_t mask) {
    for (size_t s = 0; s < c.socks_.size(); ++s) {
      const uint64_t bit = uint64_t{1} << s;
      if ((c.watched_ & bit) == (mask & bit)) continue;
      epoll_event e{};
      e.events = (mask & bit) ? static_cast<uint32_t>(EPOLLOUT) : 0u;
      e.data.u64 = static_cast<uint64_t>(c.peer());
      epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.socks_[s].get(), &e);
    }
    c.watched_ = mask;
  };
  auto service = [&](TcpConnection& c) {
    uint64_t mask = c.push();
    if (mask == 0) {
      watch(c, 0);
      // Re-check after disarming: the engine may have committed more while it saw us armed.
      c.armed_.store(false, std::memory_order_seq_cst);
      if (!c.sendPending() || c.armed_.exchange(true)) return;
      mask = c.push();
      if (mask == 0) {
        c.armed_.store(false, std::memory_order_seq_cst);
        return;
      }
    }
    watch(c, mask);
  };
  while (!stop_.load()) {
    const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), 1000);
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[static_cast<size_t>(i)].data.u64;
      if (key == ~uint64_t{0}) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(event_.get(), &v, sizeof v);
        for (auto& c : conns_) {
          if (c && c->armRequested_.exchange(false) && !c->dead_) {
            c->armed_.store(true);
            service(*c);
          }
        }
        continue;
      }
      TcpConnection& c = *conns_[static_cast<size_t>(key)];
      if (events[static_cast<size_t>(i)].events & (EPOLLERR | EPOLLHUP)) {
        // A dead connection: stop watching it for good (the engine reports the error when it
        // next uses it; a push now would only fail).
        for (auto& sock : c.socks_) epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, sock.get(), nullptr);
        c.dead_ = true;
        c.watched_ = 0;
        continue;
      }
      service(c);
    }
  }
}

SendPipe& TcpTransport::sendPipe(int peer) { return conns_[static_cast<size_t>(peer)]->sendPipe(); }
RecvPipe& TcpTransport::recvPipe(int peer) { return conns_[static_cast<size_t>(peer)]->recvPipe(); }

void TcpTransport::publishFailure(chorusResult_t, const std::string& text) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(200);
  for (auto& c : conns_) {
    if (c) c->sendFailure(text, deadline);
  }
}

int TcpTransport::findPeerFailure(chorusResult_t* code, std::string* text) {
  *code = chorusRemoteError;  // the notices carry the text only
  for (auto& c : conns_) {
    if (!c) continue;
    c->pull();
    if (c->peerFailed(text)) return c->peer();
  }
  return -1;
}

bool TcpTransport::waitReadable(std::chrono::microseconds timeout) {
  std::vector<pollfd> fds;
  std::vector<std::pair<TcpConnection*, size_t>> owners;  // connection, its number of fds
  for (auto& c : conns_) {
    if (!c) continue;
    if (size_t n = c->addPollFds(fds)) owners.emplace_back(c.get(), n);
  }
  if (fds.empty()) {
    std::this_thread::sleep_for(timeout);
    return true;
  }
  // poll() has millisecond resolution; ppoll takes the sleep as given.
  timespec ts{0, static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count())};
  if (::ppoll(fds.data(), fds.size(), &ts, nullptr) <= 0) return true;
  // Take in what arrived, also for peers no transfer reads right now: their rings fill and stop
  // being waited on, instead of making every later wait return at once.
  size_t at = 0;
  for (auto& [conn, n] : owners) {
    bool ready = false;
    for (size_t i = at; i < at + n; ++i) ready = ready || fds[i].revents != 0;
    at += n;
    if (ready) conn->pull();
  }
  return true;
}

size_t TcpTransport::memoryBytes() const {
  size_t total = 0;
  for (const auto& c : conns_) total += c ? c->ringBytes() : 0;
  return total;
}

}  // namespace chorus::transport
