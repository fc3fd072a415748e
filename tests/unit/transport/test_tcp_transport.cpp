// The TCP transport's pieces: interface selection, CRC-32C, and two transports in one process
// (ranks as threads, over loopback) moving data through their pipes, with several streams, small
// rings that wrap, checksums, a failure notice and a peer that goes away.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/store.hpp"
#include "pipe_test_util.hpp"
#include "transports/tcp/crc32c.hpp"
#include "transports/tcp/net_interfaces.hpp"
#include "transports/tcp/tcp_transport.hpp"

using namespace chorus;
using namespace chorus::transport;
using namespace chorus::transport::pipetest;

namespace {

NetInterface fakeInterface(const std::string& name, const std::string& address, bool loopback = false) {
  NetInterface n;
  n.name = name;
  EXPECT_TRUE(parseAddress(address, 0, 7, &n.address)) << address;
  n.loopback = loopback;
  n.linkLocal = address.starts_with("169.254") || address.starts_with("fe80");
  return n;
}

TEST(NetInterfaces, FilterSyntaxIsNccls) {
  EXPECT_TRUE(interfaceMatches("", "eth0"));
  EXPECT_TRUE(interfaceMatches("eth", "eth0"));
  EXPECT_TRUE(interfaceMatches("ib,eth", "eth1"));
  EXPECT_FALSE(interfaceMatches("ib,ens", "eth1"));
  EXPECT_FALSE(interfaceMatches("^eth", "eth0"));
  EXPECT_TRUE(interfaceMatches("^docker,lo", "eth0"));
  EXPECT_FALSE(interfaceMatches("^docker,lo", "docker0"));
  EXPECT_TRUE(interfaceMatches("=eth0", "eth0"));
  EXPECT_FALSE(interfaceMatches("=eth0", "eth01"));
  EXPECT_FALSE(interfaceMatches("^=eth0", "eth0"));
  EXPECT_TRUE(interfaceMatches("^=eth0", "eth01"));
}

TEST(NetInterfaces, SelectionSkipsLoopbackAndPrefersIpv4) {
  const std::vector<NetInterface> list = {
      fakeInterface("lo", "127.0.0.1", true), fakeInterface("lo", "::1", true),
      fakeInterface("docker0", "172.17.0.1"), fakeInterface("eth0", "fe80::1"),
      fakeInterface("eth0", "2001:db8::5"),   fakeInterface("eth1", "169.254.3.4"),
  };
  EXPECT_EQ(addressText(selectInterface(list, "", AF_UNSPEC).address), "169.254.3.4");
  EXPECT_EQ(addressText(selectInterface(list, "", AF_INET6).address), "2001:db8::5");
  EXPECT_EQ(addressText(selectInterface(list, "docker", AF_UNSPEC).address), "172.17.0.1");
  EXPECT_EQ(selectInterface(list, "=eth0", AF_UNSPEC).name, "eth0");
  // Loopback is never chosen, even when named; the error lists what was seen and why.
  try {
    selectInterface(list, "lo", AF_UNSPEC);
    FAIL() << "loopback was selected";
  } catch (const Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("lo 127.0.0.1 (loopback)"), std::string::npos) << text;
    EXPECT_NE(text.find("eth1 169.254.3.4 (not matched by CHORUS_SOCKET_IFNAME)"), std::string::npos) << text;
  }
  EXPECT_THROW(selectInterface({}, "", AF_UNSPEC), Error);
}

TEST(NetInterfaces, AddressesParseAndLinkLocalIpv6TakesOurScope) {
  net::SocketAddress a;
  ASSERT_TRUE(parseAddress("fe80::77:2", 4000, 9, &a));
  ASSERT_EQ(a.family(), AF_INET6);
  EXPECT_EQ(reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_scope_id, 9u);
  EXPECT_EQ(a.port(), 4000);
  ASSERT_TRUE(parseAddress("2001:db8::1", 1, 9, &a));
  EXPECT_EQ(reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_scope_id, 0u);
  ASSERT_TRUE(parseAddress("169.254.0.9", 80, 9, &a));
  EXPECT_EQ(a.toString(), "169.254.0.9:80");
  EXPECT_FALSE(parseAddress("host.example", 1, 0, &a));
  EXPECT_EQ(parseFamily("6"), AF_INET6);
  EXPECT_EQ(parseFamily("AF_INET"), AF_INET);
  EXPECT_EQ(parseFamily("7"), -1);
}

TEST(Crc32c, KnownValuesAndIncremental) {
  const char* check = "123456789";
  EXPECT_EQ(crc32c(0, check, 9), 0xE3069283u);  // the standard check value
  EXPECT_EQ(crc32c(crc32c(0, check, 4), check + 4, 5), 0xE3069283u);
  std::vector<unsigned char> zeros(32, 0);
  EXPECT_EQ(crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
}

// Two ranks as threads, each with a TcpTransport over loopback.
struct Pair : chorus::transport::pipetest::TransportPair<TcpTransport, TcpOptions> {
  static TcpOptions loopback(TcpOptions o) {
    o.commId = "test";
    o.ifname = "=lo";
    o.family = AF_INET;
    o.allowLoopback = true;
    o.timeout = std::chrono::seconds(30);
    return o;
  }
  explicit Pair(TcpOptions o) : TransportPair(loopback(std::move(o))) {}
};

class TcpPair : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(TcpPair, BothDirectionsAreExactAcrossWrapsAndStreams) {
  TcpOptions o;
  o.streams = std::get<0>(GetParam());
  o.checksum = std::get<1>(GetParam());
  o.ringBytes = 64 << 10;
  o.frameBytes = 16 << 10;
  Pair p(o);
  const size_t bytes = 6 << 20;
  size_t wrong[2] = {0, 0};
  std::thread other([&] { exchange(*p.t[1], 1, bytes, 40'000, 1, &wrong[1]); });
  exchange(*p.t[0], 0, bytes, 40'000, 1, &wrong[0]);
  other.join();
  EXPECT_EQ(wrong[0], 0u);
  EXPECT_EQ(wrong[1], 0u);
  EXPECT_EQ(p.t[0]->streams(), o.streams);
  EXPECT_GE(p.t[0]->memoryBytes(), 2 * o.ringBytes);
}

INSTANTIATE_TEST_SUITE_P(StreamsAndChecksum, TcpPair,
                         ::testing::Combine(::testing::Values(1, 3), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& pi) {
                           return "streams" + std::to_string(std::get<0>(pi.param)) +
                                  (std::get<1>(pi.param) ? "_crc" : "");
                         });

// The engine's large-payload path: write() straight from the caller's memory and read() straight
// into it (granule 4), mixed with small pieces through the ring, in both directions.
void exchangeDirect(TcpTransport& t, int self, size_t bytes, size_t* wrong, size_t* direct) {
  const int peer = 1 - self;
  SendPipe& out = t.sendPipe(peer);
  RecvPipe& in = t.recvPipe(peer);
  std::vector<std::byte> src(bytes), dst(bytes);
  for (size_t i = 0; i < bytes; ++i) src[i] = std::byte{pattern(i, self)};
  size_t sent = 0, got = 0, round = 0;
  while (sent < bytes || got < bytes) {
    if (sent < bytes) {
      if (round++ % 3 == 0) {  // a small piece through the ring
        auto s = out.reserve();
        const size_t n = std::min<size_t>({s.size(), bytes - sent, 4 * (1 + round % 50)});
        std::memcpy(s.data(), src.data() + sent, n);
        if (n) out.commit(n);
        out.flush();
        sent += n;
      } else {
        sent += out.write(src.data() + sent, (bytes - sent) & ~size_t{3}, 4);
      }
    }
    if (got < bytes) {
      auto s = in.peek();
      if (!s.empty()) {
        const size_t n = std::min(s.size(), bytes - got);
        std::memcpy(dst.data() + got, s.data(), n);
        in.consume(n);
        got += n;
      } else {
        const size_t n = in.read(dst.data() + got, bytes - got, 4);
        EXPECT_EQ(n % 4, 0u);
        got += n;
        *direct += n;
      }
    }
  }
  for (size_t i = 0; i < bytes; ++i) *wrong += dst[i] != std::byte{pattern(i, peer)};
}

TEST(TcpTransport, DirectWritesAndReadsKeepTheStreamInOrder) {
  for (bool checksum : {false, true}) {
    TcpOptions o;
    o.streams = 2;
    o.checksum = checksum;
    o.ringBytes = 128 << 10;
    o.frameBytes = 32 << 10;
    const size_t bytes = (8 << 20) + 4;
    // Whether a read finds the ring empty and a large frame next (and so reads in place) depends on
    // scheduling: under load a whole exchange can go through the ring. Every exchange must be exact;
    // without checksums, one of up to 4 must have read in place.
    size_t directTotal = 0;
    for (int attempt = 0; attempt < (checksum ? 1 : 4) && (checksum || directTotal == 0); ++attempt) {
      Pair p(o);
      size_t wrong[2] = {0, 0}, direct[2] = {0, 0};
      std::thread other([&] { exchangeDirect(*p.t[1], 1, bytes, &wrong[1], &direct[1]); });
      exchangeDirect(*p.t[0], 0, bytes, &wrong[0], &direct[0]);
      other.join();
      EXPECT_EQ(wrong[0] + wrong[1], 0u) << "checksum " << checksum << ", exchange " << attempt;
      directTotal += direct[0] + direct[1];
    }
    if (checksum) {
      EXPECT_EQ(directTotal, 0u) << "checksummed frames must be checked first";
    } else {
      EXPECT_GT(directTotal, 0u) << "no byte was read in place in 4 exchanges";
    }
  }
}

TEST(TcpTransport, FailureNoticeReachesThePeerWithItsText) {
  Pair p(TcpOptions{});
  // Some data first: it is delivered before the notice is reported.
  auto s = p.t[0]->sendPipe(1).reserve();
  ASSERT_GE(s.size(), 8u);
  std::memset(s.data(), 0x5A, 8);
  p.t[0]->sendPipe(1).commit(8);
  p.t[0]->sendPipe(1).flush();
  p.t[0]->publishFailure(chorusTimeout, "rank 0: allreduce #3 timed out");
  size_t got = 0;
  std::string text;
  try {
    for (int i = 0; i < 2'000'000 && got < 9; ++i) {
      auto r = p.t[1]->recvPipe(0).peek();
      got += r.size();
      p.t[1]->recvPipe(0).consume(r.size());
    }
  } catch (const PeerError& e) {
    text = e.what();
  }
  EXPECT_EQ(got, 8u);
  EXPECT_NE(text.find("rank 0 failed: rank 0: allreduce #3 timed out"), std::string::npos) << text;
  std::string notice;
  chorusResult_t code = chorusSuccess;
  EXPECT_EQ(p.t[1]->findPeerFailure(&code, &notice), 0);
  EXPECT_EQ(code, chorusRemoteError);  // the notices carry no code
  EXPECT_EQ(notice, "rank 0: allreduce #3 timed out");
}

TEST(TcpTransport, APeerThatGoesAwayIsNamedNotWaitedFor) {
  Pair p(TcpOptions{});
  p.t[0].reset();  // rank 0 destroys its transport (as a process that exits would)
  std::string text;
  try {
    for (int i = 0; i < 2'000'000; ++i) {
      if (!p.t[1]->recvPipe(0).peek().empty()) break;
    }
  } catch (const PeerError& e) {
    text = e.what();
  }
  EXPECT_NE(text.find("rank 0 (127.0.0.1:"), std::string::npos) << text;
  EXPECT_NE(text.find("closed its connection"), std::string::npos) << text;
  std::string notice;
  chorusResult_t code = chorusSuccess;
  EXPECT_EQ(p.t[1]->findPeerFailure(&code, &notice), -1);  // closing is not a failure notice
}

TEST(TcpTransport, APeerThatClosesAfterItsLastFramesIsReadToTheEnd) {
  // Several streams: the last frames are still arriving on some streams when the end of another
  // is seen. Everything sent must be delivered before the close is reported.
  TcpOptions o;
  o.streams = 3;
  o.ringBytes = 8 << 20;
  o.frameBytes = 16 << 10;
  Pair p(o);
  const size_t bytes = 1 << 20;
  commitPattern(p.t[0]->sendPipe(1), bytes);
  p.t[0].reset();  // drains, then closes every stream
  size_t got = 0, wrong = 0;
  std::string text;
  try {
    for (int i = 0; i < 20'000'000 && got <= bytes; ++i) {
      auto r = p.t[1]->recvPipe(0).peek();
      for (size_t k = 0; k < r.size(); ++k) wrong += r[k] != std::byte{pattern(got + k, 0)};
      p.t[1]->recvPipe(0).consume(r.size());
      got += r.size();
    }
  } catch (const PeerError& e) {
    text = e.what();
  }
  EXPECT_EQ(got, bytes);
  EXPECT_EQ(wrong, 0u);
  EXPECT_NE(text.find("closed its connection"), std::string::npos) << text;
}

TEST(TcpTransport, SendsFinishAfterTheEngineStopsCalling) {
  // The engine commits more than the socket takes at once and never calls again: the progress
  // thread must push the rest.
  TcpOptions o;
  o.ringBytes = 8 << 20;
  Pair p(o);
  const size_t bytes = 6 << 20;
  commitPattern(p.t[0]->sendPipe(1), bytes);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 1 reads only now
  size_t got = 0, wrong = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got < bytes && std::chrono::steady_clock::now() < deadline) {
    auto r = p.t[1]->recvPipe(0).peek();
    for (size_t i = 0; i < r.size(); ++i) wrong += r[i] != std::byte{pattern(got + i, 0)};
    p.t[1]->recvPipe(0).consume(r.size());
    got += r.size();
  }
  EXPECT_EQ(got, bytes);
  EXPECT_EQ(wrong, 0u);
}

}  // namespace
