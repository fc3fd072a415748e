// Client of TcpStoreServer (protocol in tcp_store_protocol.hpp). One connection per client object,
// shared by its threads under a mutex that is held for one request/reply exchange at a time, so a
// thread polling get() never blocks the others for longer than one round trip.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "base/config.hpp"
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

class TcpStore final : public Store {
 public:
  TcpStore(const std::string& host, uint16_t port, std::chrono::milliseconds timeout, std::string secret)
      : where_("TCP store " + net::formatHostPort(host, port)),
        // The connect timeout is about how long the server may take to appear; once connected, a
        // single exchange gets at least this long so a short connect timeout cannot fail big transfers.
        ioTimeout_(std::max<std::chrono::milliseconds>(timeout, std::chrono::seconds(30))),
        secret_(std::move(secret)) {
    auth::validateSecret(secret_, where_ + ": the job secret");
    connect(host, port, timeout);
    handshake(std::min(timeout, ioTimeout_));
  }

  void set(const std::string& key, std::span<const std::byte> value) override {
    detail::validateKey(where_, key);
    detail::validateValue(where_, key, value.size());
    expect(call("set(" + detail::quoteKey(key) + ")", Op::Set, key, value), {Status::Ok});
  }

  std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) override {
    detail::validateKey(where_, key);
    const auto deadline = detail::deadlineAfter(timeout);
    const std::string what = "get(" + detail::quoteKey(key) + ")";
    detail::Backoff backoff(std::chrono::microseconds(100), std::chrono::milliseconds(20));
    for (;;) {
      auto reply = call(what, Op::TryGet, key, {});
      if (expect(reply, {Status::Ok, Status::NotFound}) == Status::Ok) return std::move(reply.payload);
      if (!backoff.sleep(deadline)) detail::throwGetTimeout(where_, key, timeout);
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    detail::validateKey(where_, key);
    std::byte encoded[8];
    tcpstore::putU64(encoded, static_cast<uint64_t>(delta));
    const std::string what = detail::describeAdd(key, delta);
    auto reply = call(what, Op::Add, key, encoded);
    expect(reply, {Status::Ok});
    if (reply.payload.size() != 8) {
      throw Error(chorusRemoteError, where_ + ": " + what + ": malformed reply (" +
                                         std::to_string(reply.payload.size()) + "-byte counter)");
    }
    return static_cast<int64_t>(tcpstore::getU64(reply.payload.data()));
  }

  bool check(const std::vector<std::string>& keys) override {
    if (keys.empty()) return true;
    std::vector<std::byte> list;
    for (const auto& key : keys) {
      detail::validateKey(where_, key);
      const size_t at = list.size();
      list.resize(at + 4 + key.size());
      tcpstore::putU32(list.data() + at, static_cast<uint32_t>(key.size()));
      std::copy_n(reinterpret_cast<const std::byte*>(key.data()), key.size(), list.data() + at + 4);
    }
    if (list.size() > tcpstore::kMaxPayloadBytes) {
      throw Error(chorusInvalidArgument, where_ + ": check() of " + std::to_string(keys.size()) +
                                             " keys is too large for one request");
    }
    const auto reply = call("check([" + detail::quoteKeys(keys) + "])", Op::Check, {}, list);
    return expect(reply, {Status::Ok, Status::NotFound}) == Status::Ok;
  }

  bool erase(const std::string& key) override {
    detail::validateKey(where_, key);
    const auto reply = call("erase(" + detail::quoteKey(key) + ")", Op::Erase, key, {});
    return expect(reply, {Status::Ok, Status::NotFound}) == Status::Ok;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    detail::pollWait(*this, keys, timeout, where_);
  }

 private:
  struct Reply {
    std::string what;
    Status status;
    std::vector<std::byte> payload;
  };

  void connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
    // The server may start after its clients (each rank launches on its own), so keep trying.
    const auto deadline = detail::deadlineAfter(timeout);
    detail::Backoff backoff(std::chrono::milliseconds(10), std::chrono::milliseconds(500));
    std::string lastError;
    for (;;) {
      try {
        fd_ = net::connectTcp(host, port, deadline);
        return;
      } catch (const Error& e) {
        lastError = e.what();
      }
      if (!backoff.sleep(deadline)) break;
    }
    throw Error(chorusTimeout, where_ + ": could not connect within " + std::to_string(timeout.count()) +
                                   " ms (last error: " + lastError + ")");
  }

  // Proves the job secret to the server and has it prove the secret back (tcp_store_protocol.hpp).
  // Failures here are final: retrying cannot make a wrong secret right.
  // Within `timeout`: a server that accepts and says nothing is as good as none.
  void handshake(std::chrono::milliseconds timeout) {
    const auto deadline = detail::deadlineAfter(timeout);
    const std::string context = where_ + ": handshake";
    try {
      std::byte hello[tcpstore::kServerHelloBytes];
      net::recvAll(fd_.get(), hello, deadline, context);
      if (std::memcmp(hello, tcpstore::kServerHelloMagic, 8) != 0) {
        throw Error(chorusRemoteError,
                    context + ": the server is not a Chorus TCP store (unexpected greeting)");
      }
      const auto serverAuth = static_cast<Auth>(hello[8]);
      auth::Nonce serverNonce;
      std::memcpy(serverNonce.data(), hello + 16, serverNonce.size());

      const Auth mine = secret_.empty() ? Auth::None : Auth::HmacSha256;
      const auth::Nonce clientNonce = auth::randomNonce();
      std::byte reply[tcpstore::kClientHelloBytes] = {};
      std::memcpy(reply, tcpstore::kClientHelloMagic, 8);
      reply[8] = static_cast<std::byte>(mine);
      std::memcpy(reply + 16, clientNonce.data(), clientNonce.size());
      if (mine == Auth::HmacSha256) {
        const auto proof = auth::prove(secret_, tcpstore::kClientLabel, serverNonce, clientNonce);
        std::memcpy(reply + 48, proof.data(), proof.size());
      }
      net::sendAll(fd_.get(), reply, deadline, context);

      std::byte verdict[tcpstore::kVerdictBytes];
      net::recvAll(fd_.get(), verdict, deadline, context);
      if (std::memcmp(verdict, tcpstore::kVerdictMagic, 8) != 0) {
        throw Error(chorusRemoteError, context + ": malformed verdict from the server");
      }
      switch (static_cast<Verdict>(verdict[8])) {
        case Verdict::Accepted:
          break;
        case Verdict::WrongSecret:
          throw Error(chorusInvalidUsage, context +
                                              ": the store refused this process's job secret "
                                              "(CHORUS_SECRET differs from the job's)");
        case Verdict::SecretRequired:
          throw Error(chorusInvalidUsage, context +
                                              ": the store requires the job secret and this process "
                                              "has none (set CHORUS_SECRET as the job's launcher did)");
        case Verdict::UnexpectedSecret:
          throw Error(chorusInvalidUsage, context +
                                              ": this process has a job secret (CHORUS_SECRET) but the "
                                              "store has none: it is not this job's store");
        default:
          throw Error(chorusRemoteError, context + ": the store refused the connection (verdict " +
                                             std::to_string(static_cast<int>(verdict[8])) + ")");
      }
      if (mine == Auth::HmacSha256) {
        auth::Proof proof;
        std::memcpy(proof.data(), verdict + 16, proof.size());
        if (serverAuth != Auth::HmacSha256 ||
            !auth::equalProofs(proof,
                               auth::prove(secret_, tcpstore::kServerLabel, serverNonce, clientNonce))) {
          throw Error(chorusInvalidUsage,
                      context + ": the server did not prove the job secret: it is not this job's store");
        }
      }
    } catch (const Error&) {
      fd_.reset();
      throw;
    }
  }

  // One exchange. Any transport failure leaves the stream at an unknown position, so the connection
  // is closed and every later call fails fast with the original reason.
  Reply call(std::string what, Op op, const std::string& key, std::span<const std::byte> value) {
    std::byte header[tcpstore::kRequestHeaderBytes];
    header[0] = static_cast<std::byte>(op);
    tcpstore::putU32(header + 1, static_cast<uint32_t>(key.size()));
    tcpstore::putU64(header + 5, value.size());
    const std::span<const std::byte> parts[] = {
        header, std::as_bytes(std::span<const char>(key.data(), key.size())), value};

    std::lock_guard lock(mu_);
    const std::string context = where_ + ": " + what;
    if (!fd_) {
      throw Error(chorusRemoteError,
                  context + ": connection unusable after an earlier failure (" + broken_ + ")");
    }
    try {
      const auto deadline = detail::deadlineAfter(ioTimeout_);
      net::sendAll(fd_.get(), parts, deadline, context);
      std::byte replyHeader[tcpstore::kReplyHeaderBytes];
      net::recvAll(fd_.get(), replyHeader, deadline, context);
      const auto status = static_cast<uint8_t>(replyHeader[0]);
      const uint64_t length = tcpstore::getU64(replyHeader + 1);
      if (status > static_cast<uint8_t>(Status::Invalid) || length > tcpstore::kMaxPayloadBytes) {
        throw Error(chorusRemoteError, context + ": malformed reply from server (status " +
                                           std::to_string(status) + ", length " + std::to_string(length) +
                                           ")");
      }
      Reply reply{std::move(what), static_cast<Status>(status), std::vector<std::byte>(length)};
      net::recvAll(fd_.get(), reply.payload, deadline, context);
      return reply;
    } catch (const Error& e) {
      broken_ = e.what();
      fd_.reset();
      throw;
    }
  }

  // Returns the status if it is one of `allowed`; turns INVALID into the server's explanation.
  Status expect(const Reply& reply, std::initializer_list<Status> allowed) const {
    if (std::find(allowed.begin(), allowed.end(), reply.status) != allowed.end()) return reply.status;
    if (reply.status == Status::Invalid) {
      throw Error(chorusInvalidArgument,
                  where_ + ": " + reply.what + ": " +
                      std::string(reinterpret_cast<const char*>(reply.payload.data()), reply.payload.size()));
    }
    throw Error(chorusRemoteError, where_ + ": " + reply.what + ": unexpected reply status " +
                                       std::to_string(static_cast<int>(reply.status)));
  }

  const std::string where_;
  const std::chrono::milliseconds ioTimeout_;
  const std::string secret_;  // empty: no authentication
  std::mutex mu_;
  net::Fd fd_;          // guarded by mu_; invalid once broken
  std::string broken_;  // guarded by mu_; why fd_ was closed
};

}  // namespace

std::string secretFromEnvironment() {
  const std::optional<std::string> value = launchVariable("CHORUS_SECRET");
  if (!value) return {};
  const std::string& secret = *value;
  if (secret.size() < auth::kMinSecretBytes || secret.size() > auth::kMaxSecretBytes) {
    throw Error(chorusInvalidArgument, "CHORUS_SECRET must be " + std::to_string(auth::kMinSecretBytes) +
                                           " to " + std::to_string(auth::kMaxSecretBytes) +
                                           " bytes long (it is " + std::to_string(secret.size()) + ")");
  }
  return secret;
}

std::string generateSecret() { return auth::randomHex(32); }

std::shared_ptr<Store> makeTcpStore(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                                    const std::string& secret) {
  return std::make_shared<TcpStore>(host, port, timeout, secret);
}

}  // namespace chorus
