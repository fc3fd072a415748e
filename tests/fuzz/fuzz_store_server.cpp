// Fuzz target: the TCP store server's request parsing, driven through a real TcpStoreServer.
//
// Each input is the byte stream of one client connection. The target sends it over loopback to a server
// started once per process, then reads the replies. Its oracle is an independent reading of the protocol
// in tcp_store_protocol.hpp: the server must answer exactly the complete, valid requests at the front of
// the stream, in well-formed replies with a status that op allows, and then either close the connection
// (the next request is malformed) or wait for the rest of an incomplete one. After every input a second,
// long-lived client must still be served: a bad client may only ever lose its own connection.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/tcp_store_protocol.hpp"
#include "chorus/store.hpp"

namespace {

using chorus::Store;
namespace proto = chorus::tcpstore;

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_store_server: %s\n", what);
  std::abort();
}

struct Expected {
  std::vector<uint8_t> ops;  // op of each request the server must answer, in order
  bool closes = false;       // the request after those is malformed: the server drops the connection
};

// The protocol as documented, written independently of the server.
Expected model(const uint8_t* data, size_t size) {
  Expected e;
  size_t at = 0;
  while (size - at >= proto::kRequestHeaderBytes) {
    const auto* p = reinterpret_cast<const std::byte*>(data + at);
    const uint8_t op = data[at];
    const uint32_t keyLen = proto::getU32(p + 1);
    const uint64_t valueLen = proto::getU64(p + 5);
    const bool keyOk = keyLen >= 1 && keyLen <= Store::kMaxKeyBytes;
    bool ok = false;
    switch (op) {
      case 1:
        ok = keyOk && valueLen <= Store::kMaxValueBytes;
        break;
      case 2:
      case 5:
        ok = keyOk && valueLen == 0;
        break;
      case 3:
        ok = keyOk && valueLen == 8;
        break;
      case 4:
        ok = keyLen == 0 && valueLen >= 4 && valueLen <= proto::kMaxPayloadBytes;
        break;
      default:
        ok = false;
    }
    if (!ok) {
      e.closes = true;
      return e;
    }
    const size_t rest = size - at - proto::kRequestHeaderBytes;
    if (keyLen + valueLen > rest) return e;  // incomplete: the server waits for more
    if (op == 4) {
      const uint8_t* v = data + at + proto::kRequestHeaderBytes;
      size_t k = 0;
      while (k < valueLen) {
        if (valueLen - k < 4) {
          e.closes = true;
          return e;
        }
        const uint32_t len = proto::getU32(reinterpret_cast<const std::byte*>(v + k));
        k += 4;
        if (len == 0 || len > Store::kMaxKeyBytes || len > valueLen - k) {
          e.closes = true;
          return e;
        }
        k += len;
      }
    }
    e.ops.push_back(op);
    at += proto::kRequestHeaderBytes + keyLen + valueLen;
  }
  return e;
}

struct Fixture {
  std::unique_ptr<chorus::TcpStoreServer> server;
  std::shared_ptr<Store> healthy;  // a well-behaved client that must keep working
  uint64_t round = 0;
};

Fixture& fixture() {
  static Fixture* f = [] {
    auto* x = new Fixture;
    x->server = std::make_unique<chorus::TcpStoreServer>("127.0.0.1", 0);
    x->healthy = chorus::makeTcpStore("127.0.0.1", x->server->port(), std::chrono::seconds(10));
    return x;
  }();
  return *f;
}

int connectTo(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) bug("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
    bug("connect failed");
  }
  // Close with a reset: thousands of connections a second must not pile up in TIME_WAIT.
  const linger lg{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  return fd;
}

// Number of whole replies in `in`; aborts on a malformed or out-of-place one.
size_t checkReplies(const std::vector<uint8_t>& in, const Expected& e, bool complete) {
  size_t at = 0, n = 0;
  while (in.size() - at >= proto::kReplyHeaderBytes) {
    const uint8_t status = in[at];
    const uint64_t len = proto::getU64(reinterpret_cast<const std::byte*>(in.data() + at + 1));
    if (len > proto::kMaxPayloadBytes) bug("reply payload length out of bounds");
    if (in.size() - at - proto::kReplyHeaderBytes < len) break;
    if (n >= e.ops.size()) bug("more replies than complete requests");
    const uint8_t op = e.ops[n];
    const bool okStatus = status == 0 || (status == 1 && op != 1 && op != 3) || (status == 2 && op == 3);
    if (!okStatus) bug("reply status not allowed for its request");
    if (status == 0 && op == 3 && len != 8) bug("ADD reply without an 8-byte value");
    if (status == 0 && op != 2 && op != 3 && len != 0) bug("unexpected reply payload");
    if (status == 1 && len != 0) bug("NOT_FOUND with a payload");
    at += proto::kReplyHeaderBytes + len;
    ++n;
  }
  if (complete && at != in.size()) bug("trailing partial reply");
  return n;
}

void exchange(uint16_t port, const uint8_t* data, size_t size, const Expected& e) {
  const int fd = connectTo(port);
  std::vector<uint8_t> in;
  size_t sent = 0;
  bool eof = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    const size_t replies = checkReplies(in, e, false);
    if (eof || (sent == size && replies == e.ops.size() && !e.closes)) break;
    if (std::chrono::steady_clock::now() > deadline) bug("server stopped answering (hang)");
    pollfd p{fd, static_cast<short>(POLLIN | (sent < size ? POLLOUT : 0)), 0};
    if (::poll(&p, 1, 100) < 0 && errno != EINTR) bug("poll failed");
    if (p.revents & POLLOUT) {
      const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        if (!e.closes) bug("send failed though every request so far is valid");
        sent = size;  // the server already dropped us
      }
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      uint8_t buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0) {
        in.insert(in.end(), buf, buf + n);
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        eof = true;
      }
    }
  }
  const size_t replies = checkReplies(in, e, true);
  if (eof && !e.closes) bug("server closed a connection whose requests were all valid");
  // A dropped client may miss replies: the server closes with unread bytes pending, which resets the
  // connection and can discard replies not yet read on our side.
  if (replies != e.ops.size() && !(eof && e.closes)) bug("wrong number of replies");
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture& f = fixture();
  const Expected e = model(data, size);
  exchange(f.server->port(), data, size, e);

  // The server keeps serving everyone else.
  const std::string value = std::to_string(++f.round);
  f.healthy->set("fuzz/health", std::as_bytes(std::span<const char>(value.data(), value.size())));
  const auto got = f.healthy->get("fuzz/health", std::chrono::seconds(5));
  if (std::string(reinterpret_cast<const char*>(got.data()), got.size()) != value) {
    bug("server no longer serves other clients correctly");
  }
  return 0;
}
