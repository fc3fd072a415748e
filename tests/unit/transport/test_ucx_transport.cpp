// The UCX transport: two transports in one process (ranks as threads) moving data through their
// pipes over UCX's tcp transport, with small rings that wrap, a failure notice,
// a peer that goes away and sends that finish without the engine. Also the per-pair choice of a
// transport kind (transports/factory).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/store.hpp"
#include "pipe_test_util.hpp"
#include "transports/factory.hpp"
#include "transports/ucx/ucx_transport.hpp"

using namespace chorus;
using namespace chorus::transport;
using namespace chorus::transport::pipetest;

namespace {

// UCX's memory hooks (libucm patches mmap, madvise and friends) crash under ThreadSanitizer's
// interceptors; this transport's stream sends from its own rings do not need them. Off before
// UCX is loaded, unless the environment says otherwise.
const bool kUcmHooksOff = [] {
  setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 0);
  setenv("UCX_MEM_MALLOC_HOOKS", "no", 0);
  return true;
}();

TEST(NetChoice, PairsTakeTheBestKindBothOffer) {
  NetKind k;
  ASSERT_TRUE(chooseNetKind({NetKind::Ucx, NetKind::Tcp}, {NetKind::Ucx, NetKind::Tcp}, &k));
  EXPECT_EQ(k, NetKind::Ucx);
  ASSERT_TRUE(chooseNetKind({NetKind::Ucx, NetKind::Tcp}, {NetKind::Tcp}, &k));
  EXPECT_EQ(k, NetKind::Tcp);
  ASSERT_TRUE(chooseNetKind({NetKind::Tcp, NetKind::Ib}, {NetKind::Ib, NetKind::Ucx, NetKind::Tcp}, &k));
  EXPECT_EQ(k, NetKind::Ib);  // preference order, not list order
  EXPECT_FALSE(chooseNetKind({NetKind::Ucx}, {NetKind::Tcp}, &k));
  EXPECT_EQ(formatNetKinds({NetKind::Ib, NetKind::Ucx, NetKind::Tcp}), "ib,ucx,tcp");
  EXPECT_EQ(parseNetKinds("ucx,tcp"), (std::vector<NetKind>{NetKind::Ucx, NetKind::Tcp}));
  EXPECT_TRUE(parseNetKinds("").empty());
  EXPECT_THROW(parseNetKinds("tcp,carrier-pigeon"), Error);
}

bool skipWithoutUcx() {
  std::string why;
  if (ucxAvailable(&why)) return false;
  std::printf("UCX cannot be loaded here: %s\n", why.c_str());
  return true;
}

// Two ranks as threads, each with a UcxTransport.
struct Pair : TransportPair<UcxTransport, UcxOptions> {
  static UcxOptions options(const std::string& tls, size_t ringBytes) {
    UcxOptions o;
    o.commId = "test";
    o.tls = tls;
    o.ringBytes = ringBytes;
    o.timeout = std::chrono::seconds(30);
    return o;
  }
  explicit Pair(const std::string& tls, size_t ringBytes = 512 << 10)
      : TransportPair(options(tls, ringBytes)) {}
};

// Reads from rank 0 until `bytes` arrived or the peer is reported; returns the error text.
std::string readAll(Transport& t, size_t bytes, size_t* got, size_t* wrong) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  try {
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = t.recvPipe(0).peek();
      for (size_t k = 0; k < r.size(); ++k) *wrong += r[k] != std::byte{pattern(*got + k, 0)};
      t.recvPipe(0).consume(r.size());
      *got += r.size();
      if (*got >= bytes && bytes) break;
      if (r.empty()) t.waitReadable(std::chrono::microseconds(500));
    }
  } catch (const PeerError& e) {
    return e.what();
  }
  return "";
}

TEST(UcxTransport, BothDirectionsAreExactAcrossWraps) {
  if (skipWithoutUcx()) GTEST_SKIP() << "UCX cannot be loaded";
  Pair p("tcp", 64 << 10);
  const size_t bytes = 6 << 20;
  size_t wrong[2] = {0, 0};
  std::thread other([&] { exchange(*p.t[1], 1, bytes, 40'000, 8, &wrong[1]); });
  exchange(*p.t[0], 0, bytes, 40'000, 8, &wrong[0]);
  other.join();
  EXPECT_EQ(wrong[0], 0u);
  EXPECT_EQ(wrong[1], 0u);
  EXPECT_EQ(p.t[0]->memoryBytes(), 2u * (64 << 10));
  EXPECT_NE(p.t[0]->describeLocal().find("tcp"), std::string::npos) << p.t[0]->describeLocal();
}

TEST(UcxTransport, ASenderStopsAtTheReceiversRingUntilItReads) {
  // UCX would buffer any amount for a receiver that does not read: credits hold the sender to 8
  // rings of unread data, and reading releases it.
  if (skipWithoutUcx()) GTEST_SKIP() << "UCX cannot be loaded";
  const size_t ring = 64 << 10;
  Pair p("tcp", ring);
  SendPipe& out = p.t[0]->sendPipe(1);
  auto fill = [&](uint64_t from, size_t limit) {
    size_t sent = 0;
    for (int i = 0; i < 20'000 && sent < limit; ++i) {
      auto s = out.reserve();
      const size_t n = std::min(s.size(), limit - sent);
      for (size_t k = 0; k < n; ++k) s[k] = std::byte{pattern(from + sent + k, 0)};
      out.commit(n);
      out.flush();
      sent += n;
      p.t[1]->waitReadable(std::chrono::microseconds(0));  // the receiver's UCX takes data in, unread
    }
    return sent;
  };
  EXPECT_EQ(fill(0, 16 * ring), 8 * ring);  // no more than 8 rings unread
  size_t got = 0, wrong = 0;
  EXPECT_EQ(readAll(*p.t[1], 8 * ring, &got, &wrong), "");
  EXPECT_EQ(got, 8 * ring);
  // Once read (and credited), the sender goes on.
  size_t more = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (more < ring && std::chrono::steady_clock::now() < deadline)
    more += fill(8 * ring + more, ring - more);
  EXPECT_EQ(more, ring);
  EXPECT_EQ(readAll(*p.t[1], 9 * ring, &got, &wrong), "");
  EXPECT_EQ(got, 9 * ring);
  EXPECT_EQ(wrong, 0u);
}

TEST(UcxTransport, SharedMemoryAloneIsRefusedClearly) {
  // UCX's shared-memory transports cannot report a failed peer, which Chorus's endpoints require:
  // with nothing else allowed, setting up fails with UCX's reason instead of hanging later.
  if (skipWithoutUcx()) GTEST_SKIP() << "UCX cannot be loaded";
  try {
    Pair p("posix");
    FAIL() << "a UCX pair over shared memory alone was set up";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ucp_ep_create to rank"), std::string::npos) << e.what();
  }
}

TEST(UcxTransport, FailureNoticeReachesThePeerWithItsText) {
  if (skipWithoutUcx()) GTEST_SKIP() << "UCX cannot be loaded";
  Pair p("tcp");
  p.t[0]->publishFailure(chorusTimeout, "rank 0: allreduce #3 timed out");
  std::string notice;
  chorusResult_t code = chorusSuccess;
  int from = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (from < 0 && std::chrono::steady_clock::now() < deadline)
    from = p.t[1]->findPeerFailure(&code, &notice);
  EXPECT_EQ(from, 0);
  EXPECT_EQ(notice, "rank 0: allreduce #3 timed out");
  EXPECT_EQ(p.t[0]->findPeerFailure(&code, &notice), -1);
}

TEST(UcxTransport, APeerThatClosesAfterItsLastDataIsReadToTheEndThenNamed) {
  if (skipWithoutUcx()) GTEST_SKIP() << "UCX cannot be loaded";
  Pair p("tcp", 4 << 20);
  const size_t bytes = 2 << 20;
  commitPattern(p.t[0]->sendPipe(1), bytes);
  p.t[0].reset();  // completes its sends, then closes (as a process that exits would)
  size_t got = 0, wrong = 0;
  std::string text = readAll(*p.t[1], bytes, &got, &wrong);
  EXPECT_EQ(got, bytes);
  EXPECT_EQ(wrong, 0u);
  // Nothing more will come: the next read names the peer instead of waiting.
  text = readAll(*p.t[1], 0, &got, &wrong);
  EXPECT_NE(text.find("the UCX connection with rank 0 failed"), std::string::npos) << text;
  std::string notice;
  chorusResult_t code = chorusSuccess;
  EXPECT_EQ(p.t[1]->findPeerFailure(&code, &notice), -1);  // closing is not a failure notice
}

TEST(UcxTransport, SendsFinishAfterTheEngineStopsCalling) {
  if (skipWithoutUcx()) GTEST_SKIP() << "UCX cannot be loaded";
  Pair p("tcp", 8 << 20);
  const size_t bytes = 6 << 20;
  commitPattern(p.t[0]->sendPipe(1), bytes);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 1 reads only now
  size_t got = 0, wrong = 0;
  EXPECT_EQ(readAll(*p.t[1], bytes, &got, &wrong), "");
  EXPECT_EQ(got, bytes);
  EXPECT_EQ(wrong, 0u);
}

}  // namespace
