// Fuzz target: the TCP store server's handshake and request parsing, driven through a real
// TcpStoreServer that requires a job secret.
//
// The first input byte picks who connects; the rest is the byte stream of one client connection, sent
// over loopback to a server started once per process:
//  - even: a member. The target first completes the handshake with the secret, then sends the stream
//    and reads the replies. The oracle is an independent reading of the protocol in
//    tcp_store_protocol.hpp: the server must answer exactly the complete, valid requests at the front of
//    the stream, in well-formed replies with a status that op allows, and then either close the
//    connection (the next request is malformed) or wait for the rest of an incomplete one.
//  - odd: an intruder. The stream is sent from the very start, where the client hello belongs. Without
//    the secret the server may send nothing but its hello and a refusing verdict, then must close once
//    a whole hello (80 bytes) has arrived; it must never execute or answer a request.
// After every input a second, long-lived member must still be served, and must not see any key the
// intruders tried to set: a bad client may only ever lose its own connection.
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
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/auth.hpp"
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

const std::string kSecret = "fuzz-store-server-secret";

// Keys of the complete SET requests at the front of a stream, read as requests.
std::vector<std::string> setKeys(const uint8_t* data, size_t size) {
  std::vector<std::string> keys;
  const Expected e = model(data, size);
  size_t at = 0;
  for (uint8_t op : e.ops) {
    const auto* p = reinterpret_cast<const std::byte*>(data + at);
    const uint32_t keyLen = proto::getU32(p + 1);
    const uint64_t valueLen = proto::getU64(p + 5);
    if (op == 1)
      keys.emplace_back(reinterpret_cast<const char*>(data + at + proto::kRequestHeaderBytes), keyLen);
    at += proto::kRequestHeaderBytes + keyLen + valueLen;
  }
  return keys;
}

struct Fixture {
  std::unique_ptr<chorus::TcpStoreServer> server;
  std::shared_ptr<Store> healthy;  // a well-behaved client that must keep working
  uint64_t round = 0;
};

Fixture& fixture() {
  static Fixture* f = [] {
    auto* x = new Fixture;
    x->server = std::make_unique<chorus::TcpStoreServer>("127.0.0.1", 0, kSecret);
    x->healthy = chorus::makeTcpStore("127.0.0.1", x->server->port(), std::chrono::seconds(10), kSecret);
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

// One poll round on a connection: sends what it can of data[sent, size) and reads what has arrived
// into `in` (eof once the server has closed). False if a send failed: the server dropped us.
bool pump(int fd, const uint8_t* data, size_t size, size_t& sent, std::vector<uint8_t>& in, bool& eof,
          int pollMs) {
  pollfd p{fd, static_cast<short>(POLLIN | (sent < size ? POLLOUT : 0)), 0};
  if (::poll(&p, 1, pollMs) < 0 && errno != EINTR) bug("poll failed");
  bool sendOk = true;
  if (p.revents & POLLOUT) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n > 0) sent += static_cast<size_t>(n);
    if (n < 0 && errno != EAGAIN && errno != EINTR) sendOk = false;
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
  return sendOk;
}

// Reads exactly `size` bytes from the non-blocking `fd` within 5 s, or aborts.
void readExactly(int fd, uint8_t* out, size_t size, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  size_t got = 0;
  while (got < size) {
    if (std::chrono::steady_clock::now() > deadline) bug(what);
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) < 0 && errno != EINTR) bug("poll failed");
    const ssize_t n = ::recv(fd, out + got, size - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) bug(what);
  }
}

void sendExactly(int fd, const uint8_t* data, size_t size) {
  size_t sent = 0;
  while (sent < size) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, 5000) <= 0) bug("handshake send stalled");
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n > 0) sent += static_cast<size_t>(n);
    if (n < 0 && errno != EAGAIN && errno != EINTR) bug("handshake send failed");
  }
}

// The member's side of the handshake, written from the protocol description.
void handshake(int fd) {
  uint8_t hello[proto::kServerHelloBytes];
  readExactly(fd, hello, sizeof hello, "no server hello");
  if (std::memcmp(hello, proto::kServerHelloMagic, 8) != 0 || hello[8] != 1) bug("bad server hello");
  chorus::auth::Nonce serverNonce, clientNonce = chorus::auth::randomNonce();
  std::memcpy(serverNonce.data(), hello + 16, serverNonce.size());
  uint8_t mine[proto::kClientHelloBytes] = {};
  std::memcpy(mine, proto::kClientHelloMagic, 8);
  mine[8] = 1;
  std::memcpy(mine + 16, clientNonce.data(), clientNonce.size());
  const auto proof = chorus::auth::prove(kSecret, proto::kClientLabel, serverNonce, clientNonce);
  std::memcpy(mine + 48, proof.data(), proof.size());
  sendExactly(fd, mine, sizeof mine);
  uint8_t verdict[proto::kVerdictBytes];
  readExactly(fd, verdict, sizeof verdict, "no verdict");
  if (std::memcmp(verdict, proto::kVerdictMagic, 8) != 0 || verdict[8] != 0) bug("member refused");
  chorus::auth::Proof serverProof;
  std::memcpy(serverProof.data(), verdict + 16, serverProof.size());
  if (!chorus::auth::equalProofs(
          serverProof, chorus::auth::prove(kSecret, proto::kServerLabel, serverNonce, clientNonce))) {
    bug("server proof wrong");
  }
}

// An intruder's stream: hello, at most a refusing verdict, and a close once a whole hello is in.
void intrude(uint16_t port, const uint8_t* data, size_t size) {
  const int fd = connectTo(port);
  std::vector<uint8_t> in;
  size_t sent = 0;
  bool eof = false;
  const bool mustClose = size >= proto::kClientHelloBytes;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  const auto settle = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (eof) break;
    if (!mustClose && sent == size && in.size() >= proto::kServerHelloBytes && now > settle) break;
    if (now > deadline) bug(mustClose ? "intruder not disconnected" : "no server hello");
    if (!pump(fd, data, size, sent, in, eof, 10)) sent = size;  // dropped already
  }
  if (in.size() > proto::kServerHelloBytes + proto::kVerdictBytes)
    bug("intruder received more than a refusal");
  if (in.size() >= proto::kServerHelloBytes && std::memcmp(in.data(), proto::kServerHelloMagic, 8) != 0) {
    bug("bad server hello to an intruder");
  }
  if (in.size() > proto::kServerHelloBytes) {
    if (!mustClose) bug("verdict before a whole client hello");
    const uint8_t* verdict = in.data() + proto::kServerHelloBytes;
    const size_t have = in.size() - proto::kServerHelloBytes;
    if (std::memcmp(verdict, proto::kVerdictMagic, std::min<size_t>(have, 8)) != 0) bug("bad verdict");
    if (have > 8 && verdict[8] == 0) bug("intruder without the secret accepted");
  }
  ::close(fd);
}

void exchange(uint16_t port, const uint8_t* data, size_t size, const Expected& e) {
  const int fd = connectTo(port);
  handshake(fd);
  std::vector<uint8_t> in;
  size_t sent = 0;
  bool eof = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    const size_t replies = checkReplies(in, e, false);
    if (eof || (sent == size && replies == e.ops.size() && !e.closes)) break;
    if (std::chrono::steady_clock::now() > deadline) bug("server stopped answering (hang)");
    if (!pump(fd, data, size, sent, in, eof, 100)) {
      if (!e.closes) bug("send failed though every request so far is valid");
      sent = size;  // the server already dropped us
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
  if (size == 0) return 0;
  const bool intruder = data[0] & 1;
  ++data;
  --size;
  if (intruder) {
    // Had the server taken the stream (or what follows a hello) as requests, these keys would be set.
    // Members' inputs set keys too, so compare each with its state before the intrusion.
    std::vector<std::pair<std::string, std::optional<std::vector<std::byte>>>> before;
    for (size_t offset : {size_t{0}, proto::kClientHelloBytes}) {
      const size_t skip = std::min(offset, size);
      for (std::string& key : setKeys(data + skip, size - skip)) {
        std::optional<std::vector<std::byte>> value;
        if (f.healthy->check({key})) value = f.healthy->get(key, std::chrono::seconds(5));
        before.emplace_back(std::move(key), std::move(value));
      }
    }
    intrude(f.server->port(), data, size);
    for (const auto& [key, value] : before) {
      std::optional<std::vector<std::byte>> now;
      if (f.healthy->check({key})) now = f.healthy->get(key, std::chrono::seconds(5));
      if (now != value) bug("an intruder's SET was executed");
    }
  } else {
    exchange(f.server->port(), data, size, model(data, size));
  }

  // The server keeps serving everyone else.
  const std::string value = std::to_string(++f.round);
  f.healthy->set("fuzz/health", std::as_bytes(std::span<const char>(value.data(), value.size())));
  const auto got = f.healthy->get("fuzz/health", std::chrono::seconds(5));
  if (std::string(reinterpret_cast<const char*>(got.data()), got.size()) != value) {
    bug("server no longer serves other clients correctly");
  }
  return 0;
}
