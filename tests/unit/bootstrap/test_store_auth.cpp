// The TCP store's job secret: who gets in, who is turned away, and that turning someone away never
// disturbs the clients that belong (tcp_store_protocol.hpp, auth.hpp).
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "base/socket_util.hpp"
#include "bootstrap/auth.hpp"
#include "bootstrap/tcp_store_protocol.hpp"
#include "chorus/chorus.hpp"
#include "store_test_util.hpp"

namespace chorus::test {
namespace {

const std::string kSecret = "0123456789abcdef-job-secret";

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Accepts one connection on `listener` (within 5 s) on a thread and hands it to `talk`.
std::thread serveOnce(const net::Fd& listener, std::function<void(int fd)> talk) {
  return std::thread([&listener, talk = std::move(talk)] {
    pollfd p{listener.get(), POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) return;
    net::Fd peer(::accept(listener.get(), nullptr, nullptr));
    net::setNonBlocking(peer.get(), false);
    try {
      talk(peer.get());
      closedByServer(peer.get(), 5s);  // until the client hangs up
    } catch (const Error&) {
    }
  });
}

net::Fd connectRaw(uint16_t port) { return net::connectTcp("127.0.0.1", port, Clock::now() + 5s); }

// A store of the job, set up before any intruder shows up, that must keep working throughout.
struct Job {
  TcpStoreServer server{"127.0.0.1", 0, kSecret};
  std::shared_ptr<Store> member = makeTcpStore("127.0.0.1", server.port(), 5s, kSecret);
  Job() { member->setString("job/key", "job value"); }
  void expectUndisturbed(const std::string& tag) {
    EXPECT_EQ(member->getString("job/key", 1s), "job value") << tag;
    auto another = makeTcpStore("127.0.0.1", server.port(), 5s, kSecret);
    another->setString("job/" + tag, tag);
    EXPECT_EQ(member->getString("job/" + tag, 1s), tag) << tag;
  }
};

TEST(StoreAuth, MembersWithTheSecretAreServed) {
  Job job;
  job.expectUndisturbed("member");
  EXPECT_EQ(job.server.rejectedConnections(), 0u);
}

TEST(StoreAuth, ClientWithoutSecretIsRejected) {
  Job job;
  const auto msg =
      expectError(chorusInvalidUsage, [&] { makeTcpStore("127.0.0.1", job.server.port(), 5s, ""); });
  EXPECT_TRUE(contains(msg, "requires the job secret")) << msg;
  EXPECT_TRUE(contains(msg, "TCP store 127.0.0.1:")) << msg;
  EXPECT_EQ(job.server.rejectedConnections(), 1u);
  job.expectUndisturbed("after-no-secret");
}

TEST(StoreAuth, ClientWithWrongSecretIsRejected) {
  Job job;
  const auto msg = expectError(chorusInvalidUsage, [&] {
    makeTcpStore("127.0.0.1", job.server.port(), 5s, "another-job-secret-0123");
  });
  EXPECT_TRUE(contains(msg, "refused this process's job secret")) << msg;
  EXPECT_EQ(job.server.rejectedConnections(), 1u);
  job.expectUndisturbed("after-wrong-secret");
}

TEST(StoreAuth, ClientWithSecretRefusesStoreWithoutOne) {
  TcpStoreServer open("127.0.0.1", 0, "");
  const auto msg =
      expectError(chorusInvalidUsage, [&] { makeTcpStore("127.0.0.1", open.port(), 5s, kSecret); });
  EXPECT_TRUE(contains(msg, "not this job's store")) << msg;
}

TEST(StoreAuth, StoreThatCannotProveTheSecretIsRefused) {
  // A fake store that greets and accepts everyone but cannot know the secret.
  auto listener = net::listenTcp("127.0.0.1", 0);
  const uint16_t port = net::localAddress(listener.get()).port();
  std::thread fake = serveOnce(listener, [](int fd) {
    std::array<std::byte, tcpstore::kServerHelloBytes> hello{};
    std::memcpy(hello.data(), tcpstore::kServerHelloMagic, 8);
    hello[8] = std::byte{1};
    std::array<std::byte, tcpstore::kClientHelloBytes> clientHello{};
    std::array<std::byte, tcpstore::kVerdictBytes> verdict{};
    std::memcpy(verdict.data(), tcpstore::kVerdictMagic, 8);  // "accepted", with a zero proof
    net::sendAll(fd, hello, Clock::now() + 5s, "fake hello");
    net::recvAll(fd, clientHello, Clock::now() + 5s, "fake read");
    net::sendAll(fd, verdict, Clock::now() + 5s, "fake verdict");
  });
  const auto msg = expectError(chorusInvalidUsage, [&] { makeTcpStore("127.0.0.1", port, 5s, kSecret); });
  fake.join();
  EXPECT_TRUE(contains(msg, "did not prove the job secret")) << msg;
}

TEST(StoreAuth, NonChorusServerIsNamed) {
  auto listener = net::listenTcp("127.0.0.1", 0);
  const uint16_t port = net::localAddress(listener.get()).port();
  std::thread http = serveOnce(listener, [](int fd) {
    const std::string banner = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n____";
    net::sendAll(fd, bytesOf(banner), Clock::now() + 5s, "banner");
  });
  const auto msg = expectError(chorusRemoteError, [&] { makeTcpStore("127.0.0.1", port, 5s, kSecret); });
  http.join();
  EXPECT_TRUE(contains(msg, "not a Chorus TCP store")) << msg;
}

TEST(StoreAuth, RequestsBeforeTheHandshakeAreNeverServed) {
  Job job;
  auto fd = connectRaw(job.server.port());
  // A well-formed SET sent where the client hello belongs: the server must neither execute it nor
  // answer it as a request.
  std::vector<std::byte> set(tcpstore::kClientHelloBytes, std::byte{0});
  set[0] = static_cast<std::byte>(tcpstore::Op::Set);
  tcpstore::putU32(set.data() + 1, 6);
  tcpstore::putU64(set.data() + 5, tcpstore::kClientHelloBytes - 13 - 6);
  std::memcpy(set.data() + 13, "job/in", 6);
  const auto h = rawHandshake(fd.get(), "", set);
  EXPECT_EQ(h.verdict, static_cast<int>(tcpstore::Verdict::Malformed));
  EXPECT_TRUE(closedByServer(fd.get(), 2s));
  EXPECT_FALSE(job.member->check({"job/in"}));
  job.expectUndisturbed("after-raw-request");
}

TEST(StoreAuth, ForgedAndReplayedProofsAreRejected) {
  Job job;
  // A member's real hello, recorded.
  auto first = connectRaw(job.server.port());
  const auto good = rawHandshake(first.get(), kSecret);
  ASSERT_EQ(good.verdict, 0);
  // Replaying it on a new connection fails: the server's nonce is new.
  auto replay = connectRaw(job.server.port());
  const auto replayed = rawHandshake(replay.get(), "", good.clientHello);
  EXPECT_EQ(replayed.verdict, static_cast<int>(tcpstore::Verdict::WrongSecret));
  EXPECT_TRUE(closedByServer(replay.get(), 2s));
  // A hello claiming the secret with a made-up proof fails too.
  auto forged = connectRaw(job.server.port());
  auto hello = good.clientHello;
  hello[60] ^= std::byte{1};
  EXPECT_EQ(rawHandshake(forged.get(), "", hello).verdict, static_cast<int>(tcpstore::Verdict::WrongSecret));
  EXPECT_EQ(job.server.rejectedConnections(), 2u);
  // The recorded member connection itself is fully served.
  std::vector<std::byte> tryget(tcpstore::kRequestHeaderBytes + 7);
  tryget[0] = static_cast<std::byte>(tcpstore::Op::TryGet);
  tcpstore::putU32(tryget.data() + 1, 7);
  std::memcpy(tryget.data() + 13, "job/key", 7);
  net::sendAll(first.get(), tryget, Clock::now() + 2s, "tryget");
  std::byte reply[tcpstore::kReplyHeaderBytes + 9];
  net::recvAll(first.get(), reply, Clock::now() + 2s, "reply");
  EXPECT_EQ(static_cast<int>(reply[0]), 0);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(reply + tcpstore::kReplyHeaderBytes), 9), "job value");
  job.expectUndisturbed("after-forgery");
}

TEST(StoreAuth, ConnectionWithoutHandshakeIsDroppedAfterTenSeconds) {
  Job job;
  auto silent = connectRaw(job.server.port());
  std::array<std::byte, tcpstore::kServerHelloBytes> hello{};
  net::recvAll(silent.get(), hello, Clock::now() + 2s, "hello");
  job.expectUndisturbed("while-silent");  // a silent client blocks nobody
  const auto start = Clock::now();
  EXPECT_TRUE(closedByServer(silent.get(), 15s));
  EXPECT_LT(Clock::now() - start, 12s);
  EXPECT_EQ(job.server.rejectedConnections(), 1u);
  job.expectUndisturbed("after-silent");
}

TEST(StoreAuth, SecretsAreValidated) {
  EXPECT_TRUE(contains(expectError(chorusInvalidArgument, [] { TcpStoreServer s("127.0.0.1", 0, "short"); }),
                       "16 to 1024 bytes"));
  EXPECT_TRUE(contains(
      expectError(chorusInvalidArgument, [] { makeTcpStore("127.0.0.1", 1, 1s, std::string(2000, 'x')); }),
      "16 to 1024 bytes"));
  const char* saved = std::getenv("CHORUS_SECRET");
  const std::string keep = saved ? saved : "";
  ::setenv("CHORUS_SECRET", "too-short", 1);
  EXPECT_TRUE(contains(expectError(chorusInvalidArgument, [] { secretFromEnvironment(); }), "CHORUS_SECRET"));
  ::setenv("CHORUS_SECRET", kSecret.c_str(), 1);
  EXPECT_EQ(secretFromEnvironment(), kSecret);
  if (saved) {
    ::setenv("CHORUS_SECRET", keep.c_str(), 1);
  } else {
    ::unsetenv("CHORUS_SECRET");
  }
  const std::string a = generateSecret(), b = generateSecret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(StoreAuth, ProofDependsOnSecretLabelAndBothNonces) {
  const auto n1 = auth::randomNonce(), n2 = auth::randomNonce();
  const auto p = auth::prove(kSecret, "label", n1, n2);
  EXPECT_TRUE(auth::equalProofs(p, auth::prove(kSecret, "label", n1, n2)));
  EXPECT_FALSE(auth::equalProofs(p, auth::prove(kSecret + "x", "label", n1, n2)));
  EXPECT_FALSE(auth::equalProofs(p, auth::prove(kSecret, "other", n1, n2)));
  EXPECT_FALSE(auth::equalProofs(p, auth::prove(kSecret, "label", n2, n1)));
}

}  // namespace
}  // namespace chorus::test
