// TCP store specifics: many clients, server lifetime, hostile input, start-up order, addresses; and
// the socket helpers underneath.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <future>
#include <thread>

#include "base/socket_util.hpp"
#include "bootstrap/tcp_store_protocol.hpp"
#include "chorus/chorus.hpp"
#include "store_test_util.hpp"

namespace chorus::test {
namespace {

using tcpstore::Op;

std::vector<std::byte> request(uint8_t op, uint32_t keyLen, uint64_t valueLen, const std::string& body = {}) {
  std::vector<std::byte> out(tcpstore::kRequestHeaderBytes + body.size());
  out[0] = static_cast<std::byte>(op);
  tcpstore::putU32(out.data() + 1, keyLen);
  tcpstore::putU64(out.data() + 5, valueLen);
  std::memcpy(out.data() + tcpstore::kRequestHeaderBytes, body.data(), body.size());
  return out;
}

// A raw connection past the handshake (the server has no secret), ready for hand-made requests.
net::Fd rawConnect(uint16_t port) {
  auto fd = net::connectTcp("127.0.0.1", port, Clock::now() + 5s);
  EXPECT_EQ(rawHandshake(fd.get(), "").verdict, 0);
  return fd;
}

void expectServing(uint16_t port, const std::string& tag) {
  auto s = makeTcpStore("127.0.0.1", port, 5s);
  s->setString("alive/" + tag, tag);
  EXPECT_EQ(s->getString("alive/" + tag, 1s), tag) << tag;
}

TEST(TcpStore, ThirtyTwoClientsOnOneServer) {
  TcpStoreServer server("127.0.0.1", 0);
  constexpr int kClients = 32, kAdds = 100;
  std::vector<std::string> keys;
  for (int r = 0; r < kClients; ++r) keys.push_back("rank/" + std::to_string(r));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int r = 0; r < kClients; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto s = makeTcpStore("127.0.0.1", server.port(), 10s);
        s->setString(keys[r], "info of " + std::to_string(r));
        for (int i = 0; i < kAdds; ++i) s->add("counter", 1);
        s->wait(keys, 20s);
        for (int p = 0; p < kClients; ++p) {
          if (s->getString(keys[p], 1s) != "info of " + std::to_string(p)) ++failures;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "client " << r << ": " << e.what();
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(makeTcpStore("127.0.0.1", server.port())->add("counter", 0), kClients * kAdds);
}

TEST(TcpStore, ServerDestroyedWhileClientWaits) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  auto client = makeTcpStore("127.0.0.1", server->port(), 5s);
  client->setString("k", "v");
  const auto start = Clock::now();
  auto waiting = std::async(std::launch::async, [&] {
    return expectError(chorusRemoteError, [&] { client->get("never/set", 30s); });
  });
  std::this_thread::sleep_for(100ms);
  server.reset();
  ASSERT_EQ(waiting.wait_for(10s), std::future_status::ready) << "client hung after the server went away";
  const auto msg = waiting.get();
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_NE(msg.find("TCP store 127.0.0.1:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("get('never/set')"), std::string::npos) << msg;
  // Later calls fail fast with the reason instead of touching a dead stream.
  const auto again = expectError(chorusRemoteError, [&] { client->setString("k", "v2"); });
  EXPECT_NE(again.find("earlier failure"), std::string::npos) << again;
}

TEST(TcpStore, MalformedInputClosesOnlyThatConnection) {
  TcpStoreServer server("127.0.0.1", 0);
  auto good = makeTcpStore("127.0.0.1", server.port(), 5s);
  good->setString("before", "1");
  // A client stuck halfway through a header must not stall anybody.
  auto stalled = rawConnect(server.port());
  const auto halfHeader = request(1, 3, 1);
  net::sendAll(stalled.get(), std::span(halfHeader).first(7), Clock::now() + 1s, "stalled");

  const uint64_t tooBig = Store::kMaxValueBytes + 1;
  const struct {
    const char* what;
    std::vector<std::byte> bytes;
  } cases[] = {
      {"unknown op", request(0xEE, 1, 0, "k")},
      {"op zero", request(0, 1, 0, "k")},
      {"empty key", request(1, 0, 1, "v")},
      {"oversized key length", request(1, Store::kMaxKeyBytes + 1, 0)},
      {"huge key length", request(2, 0xFFFFFFFFu, 0)},
      {"oversized value length", request(1, 1, tooBig)},
      {"huge value length", request(1, 1, ~uint64_t{0})},
      {"value on tryget", request(2, 1, 3, "kabc")},
      {"short add delta", request(3, 1, 7, "k1234567")},
      {"check with a key", request(4, 1, 4, "k\x01\x00\x00\x00")},
      {"check without keys", request(4, 0, 0)},
      {"check entry past the end", request(4, 0, 5, std::string("\x09\x00\x00\x00k", 5))},
      {"check entry of length 0", request(4, 0, 4, std::string(4, '\0'))},
      {"text instead of a request", request('G', 0x20544547, 0x312e312f50545448ULL, "\r\n\r\n")},
  };
  for (const auto& c : cases) {
    auto fd = rawConnect(server.port());
    net::sendAll(fd.get(), c.bytes, Clock::now() + 1s, c.what);
    EXPECT_TRUE(closedByServer(fd.get(), 2s)) << c.what;
    expectServing(server.port(), c.what);
  }
  EXPECT_EQ(good->getString("before", 1s), "1");
  EXPECT_FALSE(closedByServer(stalled.get(), 10ms));
}

TEST(TcpStore, ClientDisconnectingMidMessageIsDropped) {
  TcpStoreServer server("127.0.0.1", 0);
  {
    auto fd = rawConnect(server.port());
    net::sendAll(fd.get(), request(1, 3, 1 << 20, "key" + std::string(1000, 'x')), Clock::now() + 1s,
                 "partial");
  }
  {
    auto fd = rawConnect(server.port());
    const auto header = request(2, 3, 0);
    net::sendAll(fd.get(), std::span(header).first(5), Clock::now() + 1s, "partial header");
  }
  {
    // Gone without reading the (large) reply it asked for.
    auto fd = rawConnect(server.port());
    auto big = request(1, 3, 4 << 20, "big" + std::string(4 << 20, 'b'));
    auto get = request(2, 3, 0, "big");
    big.insert(big.end(), get.begin(), get.end());
    net::sendAll(fd.get(), big, Clock::now() + 5s, "unread reply");
  }
  expectServing(server.port(), "after-disconnects");
  EXPECT_FALSE(makeTcpStore("127.0.0.1", server.port())->check({"key"}));
}

TEST(TcpStore, PipelinedRequestsAreAnsweredInOrder) {
  TcpStoreServer server("127.0.0.1", 0);
  auto fd = rawConnect(server.port());
  std::vector<std::byte> batch;
  for (const auto& r :
       {request(1, 1, 2, "kv1"), request(2, 1, 0, "k"), request(2, 1, 0, "z"), request(5, 1, 0, "k")}) {
    batch.insert(batch.end(), r.begin(), r.end());
  }
  net::sendAll(fd.get(), batch, Clock::now() + 1s, "pipelined");
  const auto readReply = [&] {
    std::byte header[tcpstore::kReplyHeaderBytes];
    net::recvAll(fd.get(), header, Clock::now() + 2s, "reply");
    std::vector<std::byte> payload(tcpstore::getU64(header + 1));
    net::recvAll(fd.get(), payload, Clock::now() + 2s, "reply");
    return std::make_pair(static_cast<int>(header[0]), stringOf(payload));
  };
  EXPECT_EQ(readReply(), std::make_pair(0, std::string()));      // set
  EXPECT_EQ(readReply(), std::make_pair(0, std::string("v1")));  // tryget k
  EXPECT_EQ(readReply(), std::make_pair(1, std::string()));      // tryget z: not found
  EXPECT_EQ(readReply(), std::make_pair(0, std::string()));      // erase k: existed
}

TEST(TcpStore, ClientStartedBeforeServerConnectsOnceItIsUp) {
  const uint16_t port = unusedPort();
  auto client = std::async(std::launch::async, [port] { return makeTcpStore("127.0.0.1", port, 10s); });
  std::this_thread::sleep_for(300ms);
  TcpStoreServer server("127.0.0.1", port);
  ASSERT_EQ(client.wait_for(5s), std::future_status::ready);
  auto s = client.get();
  s->setString("k", "v");
  EXPECT_EQ(s->getString("k", 1s), "v");
}

TEST(TcpStore, ConnectTimeoutNamesTheAddress) {
  const uint16_t port = unusedPort();
  const auto start = Clock::now();
  const auto msg = expectError(chorusTimeout, [&] { makeTcpStore("127.0.0.1", port, 200ms); });
  EXPECT_GE(Clock::now() - start, 200ms);
  EXPECT_LT(Clock::now() - start, 3s);
  EXPECT_NE(msg.find("TCP store 127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("refused"), std::string::npos) << msg;
}

TEST(TcpStore, ServerReportsAnAddressInUse) {
  TcpStoreServer first("127.0.0.1", 0);
  const auto msg = expectError(chorusSystemError, [&] { TcpStoreServer second("127.0.0.1", first.port()); });
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(first.port())), std::string::npos) << msg;
  EXPECT_NE(msg.find("in use"), std::string::npos) << msg;
}

TEST(TcpStore, IPv6AndHostNames) {
  std::unique_ptr<TcpStoreServer> server;
  try {
    server = std::make_unique<TcpStoreServer>("::", 0);
  } catch (const Error& e) {
    GTEST_SKIP() << "no IPv6 here: " << e.what();
  }
  // "::" serves both families.
  for (const char* host : {"::1", "[::1]", "127.0.0.1", "localhost"}) {
    auto s = makeTcpStore(host, server->port(), 5s);
    s->setString(std::string("via/") + host, host);
    EXPECT_EQ(s->getString(std::string("via/") + host, 1s), host);
  }
  const auto msg =
      expectError(chorusTimeout, [&] { makeTcpStore("::1", server->port())->get("absent", 20ms); });
  EXPECT_NE(msg.find("TCP store [::1]:"), std::string::npos) << msg;
}

TEST(TcpStore, ServerShutsDownWithIdleAndBusyClients) {
  for (int round = 0; round < 5; ++round) {
    auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
    auto idle = rawConnect(server->port());
    auto client = makeTcpStore("127.0.0.1", server->port(), 5s);
    client->setString("k", "v");
    server.reset();  // must not hang on the connected clients
    EXPECT_TRUE(closedByServer(idle.get(), 2s));
  }
}

TEST(SocketUtil, ExactTransfersHonourDeadlinesAndPeerClose) {
  auto listener = net::listenTcp("127.0.0.1", 0);
  const uint16_t port = net::localAddress(listener.get()).port();
  auto client = net::connectTcp("127.0.0.1", port, Clock::now() + 5s);
  pollfd p{listener.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  net::Fd peer(::accept(listener.get(), nullptr, nullptr));
  ASSERT_TRUE(peer.valid());
  EXPECT_EQ(net::peerAddress(client.get()).toString(), "127.0.0.1:" + std::to_string(port));

  std::byte buf[16];
  auto msg =
      expectError(chorusTimeout, [&] { net::recvAll(client.get(), buf, Clock::now() + 50ms, "side A"); });
  EXPECT_NE(msg.find("side A: timed out"), std::string::npos) << msg;

  const std::string text = "0123456789abcdef";
  const std::string head = text.substr(0, 3), tail = text.substr(3);
  const std::span<const std::byte> parts[] = {bytesOf(head), {}, bytesOf(tail)};
  net::sendAll(peer.get(), parts, Clock::now() + 1s, "side B");
  net::recvAll(client.get(), buf, Clock::now() + 1s, "side A");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(buf), 16), text);

  net::sendAll(peer.get(), bytesOf("abc"), Clock::now() + 1s, "side B");
  peer.reset();
  msg = expectError(chorusRemoteError, [&] { net::recvAll(client.get(), buf, Clock::now() + 1s, "side A"); });
  EXPECT_NE(msg.find("received 3 of 16"), std::string::npos) << msg;
  // Writing into a closed connection is an error, not SIGPIPE.
  msg = expectError(chorusRemoteError, [&] {
    for (int i = 0; i < 100; ++i) net::sendAll(client.get(), bytesOf(text), Clock::now() + 1s, "side A");
  });
}

TEST(SocketUtil, ResolveAndFormat) {
  EXPECT_EQ(net::formatHostPort("::1", 80), "[::1]:80");
  EXPECT_EQ(net::formatHostPort("[::1]", 80), "[::1]:80");
  EXPECT_EQ(net::formatHostPort("host", 80), "host:80");
  const auto v4 = net::resolve("127.0.0.1", 29500);
  ASSERT_EQ(v4.size(), 1u);
  EXPECT_EQ(v4[0].toString(), "127.0.0.1:29500");
  EXPECT_EQ(net::resolve("[::1]", 7)[0].toString(), "[::1]:7");
  // Wildcard for listening when no host is given.
  EXPECT_FALSE(net::resolve("", 0, /*passive=*/true).empty());
}

}  // namespace
}  // namespace chorus::test
