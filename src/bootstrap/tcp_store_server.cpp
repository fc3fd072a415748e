// TcpStoreServer: one background thread multiplexing every client with poll().
//
// The wire format (op byte, u32 key length, key, u64 value length, value; replies: status byte, u64
// length, payload) is documented in tcp_store_protocol.hpp, shared with the client.
//
// Robustness rules, since any process that can reach the port can talk to it:
//  - Nothing but the handshake is served until the client has proved the job secret (when the store
//    has one); a connection that fails the handshake, or has not finished it within
//    kHandshakeTimeout, is closed and counted in rejectedConnections().
//  - Client sockets are non-blocking and each has its own input and output buffer, so a slow, stuck or
//    half-sent client never delays the others.
//  - Every length is checked against the protocol bounds as soon as the 13-byte header is in, before
//    any memory is reserved for the body; a bad header, unknown op or malformed body closes that
//    client only.
//  - A client is not read from while a reply to it is still unsent. Memory per client is therefore
//    bounded by one request plus one reply, however fast it pipelines and however slowly it reads.
//  - Nothing a client does can throw out of the thread: failures while serving a client drop it.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "base/socket_util.hpp"
#include "bootstrap/auth.hpp"
#include "bootstrap/store_util.hpp"
#include "bootstrap/tcp_store_protocol.hpp"
#include "chorus/chorus.hpp"

namespace chorus {
namespace {

using tcpstore::Auth;
using tcpstore::Op;
using tcpstore::Status;
using tcpstore::Verdict;

// Rejections are logged up to this many times per server; the count goes on.
constexpr uint64_t kLoggedRejections = 10;

constexpr size_t kReadChunk = 64 * 1024;
// Buffers that grew for a large value are given back once idle, so a client that once sent 64 MiB
// does not pin it for the rest of the job.
constexpr size_t kKeepBufferBytes = 1 << 20;

struct Client {
  enum class Phase { Handshake, Serving, Closing };
  net::Fd fd;
  Phase phase = Phase::Handshake;
  detail::Clock::time_point handshakeDeadline{};
  auth::Nonce serverNonce{};
  std::vector<std::byte> in;  // in[0, inLen) received and not yet handled
  size_t inLen = 0;
  std::vector<std::byte> out;  // out[outSent, out.size()) still to send
  size_t outSent = 0;
  bool closed = false;

  bool replyPending() const { return outSent < out.size(); }
};

struct Frame {
  Op op;
  uint32_t keyLen;
  uint64_t valueLen;
  size_t total() const { return tcpstore::kRequestHeaderBytes + keyLen + valueLen; }
};

// Parses and bounds-checks a request header; false if this client must be dropped.
bool parseHeader(const std::byte* p, Frame& frame) {
  const auto op = static_cast<uint8_t>(p[0]);
  frame.op = static_cast<Op>(op);
  frame.keyLen = tcpstore::getU32(p + 1);
  frame.valueLen = tcpstore::getU64(p + 5);
  const bool keyOk = frame.keyLen >= 1 && frame.keyLen <= Store::kMaxKeyBytes;
  switch (frame.op) {
    case Op::Set:
      return keyOk && frame.valueLen <= Store::kMaxValueBytes;
    case Op::TryGet:
    case Op::Erase:
      return keyOk && frame.valueLen == 0;
    case Op::Add:
      return keyOk && frame.valueLen == 8;
    case Op::Check:
      return frame.keyLen == 0 && frame.valueLen >= 4 && frame.valueLen <= tcpstore::kMaxPayloadBytes;
  }
  return false;
}

class ServerLoop {
 public:
  ServerLoop(net::Fd listener, int wakeFd, std::string where, std::string secret,
             std::atomic<uint64_t>* rejected)
      : listener_(std::move(listener)),
        wakeFd_(wakeFd),
        where_(std::move(where)),
        secret_(std::move(secret)),
        rejected_(rejected) {}

  void run() {
    try {
      loop();
    } catch (const std::exception& e) {
      // Only poll() itself failing gets here. Closing every socket (when this object dies) makes the
      // clients fail with a clear error instead of hanging.
      std::fprintf(stderr, "chorus: %s stopped: %s\n", where_.c_str(), e.what());
    }
  }

 private:
  void loop() {
    std::vector<pollfd> fds;
    for (;;) {
      const auto now = detail::Clock::now();
      const bool accepting = now >= acceptPausedUntil_;
      fds.clear();
      fds.push_back({wakeFd_, POLLIN, 0});
      fds.push_back({accepting ? listener_.get() : -1, POLLIN, 0});
      for (const auto& c : clients_) {
        fds.push_back({c->fd.get(), static_cast<short>(c->replyPending() ? POLLOUT : POLLIN), 0});
      }
      // Wake for the earliest of: accepting again, a handshake running out of time.
      auto wakeAt = accepting ? detail::Clock::time_point::max() : acceptPausedUntil_;
      for (const auto& c : clients_) {
        if (c->phase == Client::Phase::Handshake) wakeAt = std::min(wakeAt, c->handshakeDeadline);
      }
      const int timeoutMs = wakeAt == detail::Clock::time_point::max() ? -1 : net::pollTimeoutMs(wakeAt);
      const int rc = ::poll(fds.data(), fds.size(), timeoutMs);
      if (rc < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        if (errno == ENOMEM) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        throw Error(chorusSystemError, net::errnoText("poll", errno));
      }
      if (fds[0].revents) return;  // destructor asked us to stop
      // Clients first: accept() appends to clients_, which must not shift the indices used here.
      const auto afterPoll = detail::Clock::now();
      for (size_t i = 0; i < clients_.size(); ++i) {
        Client& c = *clients_[i];
        if (fds[i + 2].revents) serve(c, fds[i + 2].revents);
        if (!c.closed && c.phase == Client::Phase::Handshake && afterPoll >= c.handshakeDeadline) {
          reject(c, "no handshake within " +
                        std::to_string(std::chrono::seconds(tcpstore::kHandshakeTimeout).count()) + " s");
          c.closed = true;
        } else if (c.closed && c.phase == Client::Phase::Handshake) {
          reject(c, "closed before completing the handshake");
        }
      }
      std::erase_if(clients_, [](const std::unique_ptr<Client>& c) { return c->closed; });
      if (fds[1].revents) acceptAll();
    }
  }

  void acceptAll() {
    for (;;) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK) return;
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
          // The pending connection stays queued and the listener stays readable: stop polling it for
          // a moment rather than spin until descriptors or memory free up.
          acceptPausedUntil_ = detail::Clock::now() + std::chrono::milliseconds(100);
          return;
        }
        continue;  // ECONNABORTED, EINTR, network errors: that one connection is gone; try the next
      }
      auto client = std::make_unique<Client>();
      client->fd.reset(fd);
      try {
        net::setNoDelay(fd);
      } catch (const Error&) {
        // Latency only; the connection works without it.
      }
      try {
        greet(*client);
      } catch (...) {
        continue;  // no randomness or memory for this one: drop it, keep serving the others
      }
      clients_.push_back(std::move(client));
    }
  }

  void serve(Client& c, short revents) {
    try {
      if (revents & POLLNVAL) {
        c.closed = true;
      } else if (c.replyPending()) {
        // Not reading now, so only writability or an error on the socket can wake us.
        if (revents & (POLLERR | POLLHUP)) {
          c.closed = true;
        } else if (flush(c)) {
          handleBuffered(c);
        }
      } else if (revents & (POLLIN | POLLERR | POLLHUP)) {
        // Read even on POLLHUP: recv() then returns the last bytes, 0 or the error.
        if (receive(c)) handleBuffered(c);
      }
    } catch (...) {
      c.closed = true;  // e.g. bad_alloc for a large value: lose this client, keep the server
    }
  }

  // One recv() per wake-up keeps clients fair. False if the client is gone.
  bool receive(Client& c) {
    Frame frame{};
    size_t want = tcpstore::kRequestHeaderBytes;
    if (c.phase == Client::Phase::Handshake) {
      want = tcpstore::kClientHelloBytes;
    } else if (c.inLen >= tcpstore::kRequestHeaderBytes) {
      parseHeader(c.in.data(), frame);  // already validated by handleBuffered
      want = frame.total();
    }
    // Grow by doubling only as bytes actually arrive: a header merely announcing 64 MiB must not make
    // us allocate it, and doubling keeps the zero-filling of vector::resize linear overall.
    if (c.in.size() < kReadChunk || (c.inLen == c.in.size() && c.in.size() < want)) {
      c.in.resize(std::min(std::max(want, kReadChunk), std::max(kReadChunk, c.in.size() * 2)));
    }
    if (c.inLen == c.in.size()) {
      c.closed = true;  // cannot happen: a full buffer holds a complete request, handled before reading
      return false;
    }
    const ssize_t n = ::recv(c.fd.get(), c.in.data() + c.inLen, c.in.size() - c.inLen, MSG_DONTWAIT);
    if (n > 0) {
      c.inLen += static_cast<size_t>(n);
      return true;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    c.closed = true;  // orderly close (possibly mid-request) or a reset: either way, drop it
    return false;
  }

  // Sends what it can; true once every reply byte is out.
  bool flush(Client& c) {
    while (c.replyPending()) {
      const ssize_t n =
          ::send(c.fd.get(), c.out.data() + c.outSent, c.out.size() - c.outSent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        c.outSent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      c.closed = true;
      return false;
    }
    c.out.clear();
    c.outSent = 0;
    if (c.out.capacity() > kKeepBufferBytes) c.out.shrink_to_fit();
    if (c.phase == Client::Phase::Closing) {
      c.closed = true;  // the refusal is out: now hang up
      return false;
    }
    return true;
  }

  // Handles every complete request in the input buffer, one reply at a time.
  void handleBuffered(Client& c) {
    if (c.phase == Client::Phase::Handshake) {
      if (c.replyPending() || c.inLen < tcpstore::kClientHelloBytes) return;
      checkHello(c);
      consume(c, tcpstore::kClientHelloBytes);
      flush(c);
    }
    while (c.phase == Client::Phase::Serving && !c.closed && !c.replyPending() &&
           c.inLen >= tcpstore::kRequestHeaderBytes) {
      Frame frame{};
      if (!parseHeader(c.in.data(), frame)) {
        c.closed = true;
        return;
      }
      if (c.inLen < frame.total()) return;
      if (!handle(c, frame)) {
        c.closed = true;
        return;
      }
      consume(c, frame.total());
      flush(c);
    }
  }

  // Drops the first `bytes` of the input buffer (a handled message).
  static void consume(Client& c, size_t bytes) {
    const size_t rest = c.inLen - bytes;
    std::memmove(c.in.data(), c.in.data() + bytes, rest);
    c.inLen = rest;
    if (c.in.size() > kKeepBufferBytes && c.inLen <= kReadChunk) {
      c.in.resize(kReadChunk);
      c.in.shrink_to_fit();
    }
  }

  Auth auth() const { return secret_.empty() ? Auth::None : Auth::HmacSha256; }

  // Queues the server hello: the first bytes every connection receives.
  void greet(Client& c) {
    c.serverNonce = auth::randomNonce();
    c.handshakeDeadline = detail::Clock::now() + tcpstore::kHandshakeTimeout;
    c.out.assign(tcpstore::kServerHelloBytes, std::byte{0});
    std::memcpy(c.out.data(), tcpstore::kServerHelloMagic, 8);
    c.out[8] = static_cast<std::byte>(auth());
    std::memcpy(c.out.data() + 16, c.serverNonce.data(), auth::kNonceBytes);
    c.outSent = 0;
  }

  // Judges the client hello at the front of the input buffer and queues the verdict.
  void checkHello(Client& c) {
    const std::byte* p = c.in.data();
    Verdict verdict = Verdict::Accepted;
    auth::Nonce clientNonce{};
    auth::Proof clientProof{};
    std::memcpy(clientNonce.data(), p + 16, auth::kNonceBytes);
    std::memcpy(clientProof.data(), p + 48, auth::kProofBytes);
    const bool reservedZero = std::all_of(p + 9, p + 16, [](std::byte b) { return b == std::byte{0}; });
    const auto clientAuth = static_cast<uint8_t>(p[8]);
    if (std::memcmp(p, tcpstore::kClientHelloMagic, 8) != 0 || !reservedZero ||
        clientAuth > static_cast<uint8_t>(Auth::HmacSha256)) {
      verdict = Verdict::Malformed;
    } else if (static_cast<Auth>(clientAuth) != auth()) {
      verdict = auth() == Auth::None ? Verdict::UnexpectedSecret : Verdict::SecretRequired;
    } else if (auth() == Auth::HmacSha256 &&
               !auth::equalProofs(clientProof,
                                  auth::prove(secret_, tcpstore::kClientLabel, c.serverNonce, clientNonce))) {
      verdict = Verdict::WrongSecret;
    }
    c.out.assign(tcpstore::kVerdictBytes, std::byte{0});
    c.outSent = 0;
    std::memcpy(c.out.data(), tcpstore::kVerdictMagic, 8);
    c.out[8] = static_cast<std::byte>(verdict);
    if (verdict == Verdict::Accepted) {
      if (auth() == Auth::HmacSha256) {
        const auto proof = auth::prove(secret_, tcpstore::kServerLabel, c.serverNonce, clientNonce);
        std::memcpy(c.out.data() + 16, proof.data(), proof.size());
      }
      c.phase = Client::Phase::Serving;
      return;
    }
    static const char* const kReasons[] = {"", "wrong job secret", "no job secret",
                                           "a job secret where the store has none", "not a Chorus client"};
    reject(c, kReasons[static_cast<int>(verdict)]);
    c.phase = Client::Phase::Closing;
  }

  // Counts (and, for the first few, logs) a connection refused before it was served.
  void reject(Client& c, const std::string& reason) {
    c.phase = Client::Phase::Closing;
    const uint64_t n = rejected_->fetch_add(1) + 1;
    if (n > kLoggedRejections) return;
    std::string peer = "an unknown address";
    try {
      peer = net::peerAddress(c.fd.get()).toString();
    } catch (const Error&) {
    }
    std::fprintf(stderr, "chorus: %s: rejected a connection from %s: %s%s\n", where_.c_str(), peer.c_str(),
                 reason.c_str(), n == kLoggedRejections ? " (further rejections are not logged)" : "");
  }

  void reply(Client& c, Status status, std::span<const std::byte> payload = {}) {
    const size_t at = c.out.size();
    c.out.resize(at + tcpstore::kReplyHeaderBytes + payload.size());
    c.out[at] = static_cast<std::byte>(status);
    tcpstore::putU64(c.out.data() + at + 1, payload.size());
    if (!payload.empty()) {
      std::memcpy(c.out.data() + at + tcpstore::kReplyHeaderBytes, payload.data(), payload.size());
    }
  }

  void replyText(Client& c, Status status, const std::string& text) {
    reply(c, status, std::as_bytes(std::span<const char>(text.data(), text.size())));
  }

  // Executes one complete request; false if it is malformed (the client is then dropped).
  bool handle(Client& c, const Frame& frame) {
    const std::byte* body = c.in.data() + tcpstore::kRequestHeaderBytes;
    const std::string key(reinterpret_cast<const char*>(body), frame.keyLen);
    const std::span<const std::byte> value(body + frame.keyLen, frame.valueLen);
    switch (frame.op) {
      case Op::Set:
        map_[key].assign(value.begin(), value.end());
        reply(c, Status::Ok);
        return true;
      case Op::TryGet: {
        const auto it = map_.find(key);
        if (it == map_.end()) {
          reply(c, Status::NotFound);
        } else {
          reply(c, Status::Ok, it->second);
        }
        return true;
      }
      case Op::Add: {
        const auto delta = static_cast<int64_t>(tcpstore::getU64(value.data()));
        const auto it = map_.find(key);
        const auto update = detail::applyAdd(it == map_.end() ? nullptr : &it->second, delta);
        if (!update.refusal.empty()) {
          replyText(c, Status::Invalid, update.refusal);
          return true;
        }
        map_[key] = detail::formatCounter(update.value);
        std::byte encoded[8];
        tcpstore::putU64(encoded, static_cast<uint64_t>(update.value));
        reply(c, Status::Ok, encoded);
        return true;
      }
      case Op::Check: {
        bool all = true;
        size_t at = 0;
        while (at < value.size()) {
          if (value.size() - at < 4) return false;
          const uint32_t len = tcpstore::getU32(value.data() + at);
          at += 4;
          if (len == 0 || len > Store::kMaxKeyBytes || len > value.size() - at) return false;
          if (all) all = map_.contains(std::string(reinterpret_cast<const char*>(value.data() + at), len));
          at += len;
        }
        reply(c, all ? Status::Ok : Status::NotFound);
        return true;
      }
      case Op::Erase:
        reply(c, map_.erase(key) ? Status::Ok : Status::NotFound);
        return true;
    }
    return false;
  }

  net::Fd listener_;
  const int wakeFd_;  // owned by TcpStoreServer::Impl, which outlives the thread
  const std::string where_;
  const std::string secret_;               // empty: no authentication
  std::atomic<uint64_t>* const rejected_;  // owned by TcpStoreServer::Impl
  detail::Clock::time_point acceptPausedUntil_{};
  std::vector<std::unique_ptr<Client>> clients_;
  std::unordered_map<std::string, std::vector<std::byte>> map_;
};

}  // namespace

struct TcpStoreServer::Impl {
  net::Fd wake;
  uint16_t port = 0;
  std::atomic<uint64_t> rejected{0};
  std::thread thread;
};

TcpStoreServer::TcpStoreServer(const std::string& bindAddress, uint16_t port, const std::string& secret)
    : impl_(std::make_unique<Impl>()) {
  const std::string where = "TCP store server " + net::formatHostPort(bindAddress, port);
  auth::validateSecret(secret, where + ": the job secret");
  net::Fd listener;
  try {
    listener = net::listenTcp(bindAddress, port);
  } catch (const Error& e) {
    throw Error(e.code(), "TCP store server: " + std::string(e.what()));
  }
  impl_->port = net::localAddress(listener.get()).port();
  impl_->wake.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl_->wake) throw Error(chorusSystemError, net::errnoText(where + ": eventfd", errno));
  auto loop = std::make_unique<ServerLoop>(
      std::move(listener), impl_->wake.get(),
      "TCP store server " + net::formatHostPort(bindAddress, impl_->port), secret, &impl_->rejected);
  impl_->thread = std::thread([loop = std::move(loop)] { loop->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  const uint64_t one = 1;
  // An eventfd write only fails when the counter would overflow, which one write cannot cause.
  [[maybe_unused]] const ssize_t n = ::write(impl_->wake.get(), &one, sizeof(one));
  impl_->thread.join();
}

uint16_t TcpStoreServer::port() const { return impl_->port; }

uint64_t TcpStoreServer::rejectedConnections() const { return impl_->rejected.load(); }

}  // namespace chorus
