// Behaviour every Store must share, run against the in-process, file and TCP stores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <future>
#include <thread>

#include "chorus/chorus.hpp"
#include "store_test_util.hpp"

namespace chorus::test {
namespace {

// A backend owns whatever the store needs (directory, server) and hands out more handles on the same
// store: for the file and TCP stores these are independent clients, as other ranks would have.
struct InProcessBackend {
  static constexpr const char* kName = "InProcess";
  std::shared_ptr<Store> shared = makeInProcessStore();
  std::shared_ptr<Store> open() { return shared; }
  std::string where() const { return "in-process store"; }
};

struct FileBackend {
  static constexpr const char* kName = "File";
  TempDir dir;
  std::shared_ptr<Store> open() { return makeFileStore(dir.path().string()); }
  std::string where() const { return "file store " + dir.path().string(); }
};

struct TcpBackend {
  static constexpr const char* kName = "Tcp";
  TcpStoreServer server{"127.0.0.1", 0};
  std::shared_ptr<Store> open() { return makeTcpStore("127.0.0.1", server.port(), 5s); }
  std::string where() const { return "TCP store 127.0.0.1:" + std::to_string(server.port()); }
};

template <typename Backend>
class StoreTest : public ::testing::Test {
 protected:
  Backend backend;
  std::shared_ptr<Store> store = backend.open();
};

struct BackendName {
  template <typename T>
  static std::string GetName(int) {
    return T::kName;
  }
};

using Backends = ::testing::Types<InProcessBackend, FileBackend, TcpBackend>;
TYPED_TEST_SUITE(StoreTest, Backends, BackendName);

TYPED_TEST(StoreTest, SetThenGet) {
  auto& s = *this->store;
  s.setString("rank/0/info", "hello");
  EXPECT_EQ(s.getString("rank/0/info", 1s), "hello");
  // Values are bytes, not C strings; empty values exist.
  const std::string binary("a\0b\xff\n", 5);
  s.setString("binary", binary);
  EXPECT_EQ(s.getString("binary", 1s), binary);
  s.setString("empty", "");
  EXPECT_EQ(s.getString("empty", 1s), "");
  EXPECT_TRUE(s.check({"empty"}));
  // Keys are bytes too.
  const std::string oddKey("k\0/..\xfe", 6);
  s.setString(oddKey, "odd");
  EXPECT_EQ(s.getString(oddKey, 1s), "odd");
  // Another handle on the same store sees it.
  EXPECT_EQ(this->backend.open()->getString("rank/0/info", 1s), "hello");
}

TYPED_TEST(StoreTest, SetOverwrites) {
  auto& s = *this->store;
  s.setString("k", "first value, longer");
  s.setString("k", "second");
  EXPECT_EQ(s.getString("k", 1s), "second");
}

TYPED_TEST(StoreTest, GetBlocksUntilAnotherThreadSets) {
  auto writer = this->backend.open();
  const auto start = Clock::now();
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    writer->setString("late", "arrived");
  });
  EXPECT_EQ(this->store->getString("late", 10s), "arrived");
  EXPECT_GE(Clock::now() - start, 90ms);
  t.join();
}

TYPED_TEST(StoreTest, GetTimesOutNamingTheKey) {
  const auto start = Clock::now();
  const auto msg = expectError(chorusTimeout, [&] { this->store->get("rank/3/info", 100ms); });
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(msg, this->backend.where() + ": get('rank/3/info') timed out after 100 ms");
  EXPECT_GE(elapsed, 100ms);
  EXPECT_LT(elapsed, 2s);
  // The store is still usable after a timeout.
  this->store->setString("rank/3/info", "x");
  EXPECT_EQ(this->store->getString("rank/3/info", 1s), "x");
}

TYPED_TEST(StoreTest, ConcurrentAddsAreExact) {
  constexpr int kThreads = 8, kAdds = 1000;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    // Half the threads share the fixture's handle (its internal locking), half use their own.
    auto handle = t % 2 ? this->backend.open() : this->store;
    threads.emplace_back([&seen, t, handle] {
      for (int i = 0; i < kAdds; ++i) seen[t].push_back(handle->add("counter", 1));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(this->store->add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(this->store->getString("counter", 1s), std::to_string(kThreads * kAdds));
  // Atomic: every intermediate value was handed out exactly once.
  std::vector<int64_t> all;
  for (const auto& v : seen) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  for (int64_t i = 0; i < kThreads * kAdds; ++i) ASSERT_EQ(all[i], i + 1);
}

TYPED_TEST(StoreTest, AddSemantics) {
  auto& s = *this->store;
  EXPECT_EQ(s.add("n", 5), 5);  // missing counts as 0
  EXPECT_EQ(s.add("n", -7), -2);
  EXPECT_EQ(s.getString("n", 1s), "-2");
  s.setString("m", "41");
  EXPECT_EQ(s.add("m", 1), 42);
  s.setString("text", "not a number");
  auto msg = expectError(chorusInvalidArgument, [&] { s.add("text", 1); });
  EXPECT_NE(msg.find("'text'"), std::string::npos) << msg;
  EXPECT_EQ(s.getString("text", 1s), "not a number");
  s.setString("big", std::to_string(INT64_MAX));
  msg = expectError(chorusInvalidArgument, [&] { s.add("big", 1); });
  EXPECT_NE(msg.find("overflow"), std::string::npos) << msg;
}

TYPED_TEST(StoreTest, CheckAndErase) {
  auto& s = *this->store;
  EXPECT_TRUE(s.check({}));
  EXPECT_FALSE(s.check({"a"}));
  s.setString("a", "1");
  EXPECT_TRUE(s.check({"a"}));
  EXPECT_FALSE(s.check({"a", "b"}));
  s.setString("b", "2");
  EXPECT_TRUE(s.check({"a", "b"}));
  EXPECT_TRUE(s.erase("a"));
  EXPECT_FALSE(s.erase("a"));
  EXPECT_FALSE(s.check({"a", "b"}));
  EXPECT_TRUE(s.check({"b"}));
  expectError(chorusTimeout, [&] { s.get("a", 10ms); });
}

TYPED_TEST(StoreTest, WaitNamesTheMissingKeys) {
  auto& s = *this->store;
  s.setString("present", "1");
  s.wait({"present"}, 1s);
  s.wait({}, 0ms);
  const auto msg = expectError(chorusTimeout, [&] { s.wait({"present", "gone/1", "gone/2"}, 100ms); });
  EXPECT_EQ(msg.rfind(this->backend.where() + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find("missing 2 of 3: 'gone/1', 'gone/2'"), std::string::npos) << msg;

  auto writer = this->backend.open();
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    writer->setString("gone/1", "x");
    writer->setString("gone/2", "y");
  });
  s.wait({"present", "gone/1", "gone/2"}, 10s);
  t.join();
}

TYPED_TEST(StoreTest, PrefixStoresAreIsolated) {
  auto a = makePrefixStore("job/a/", this->store);
  auto b = makePrefixStore("job/b/", this->backend.open());
  a->setString("x", "from a");
  b->setString("x", "from b");
  EXPECT_EQ(a->getString("x", 1s), "from a");
  EXPECT_EQ(b->getString("x", 1s), "from b");
  EXPECT_EQ(this->store->getString("job/a/x", 1s), "from a");
  EXPECT_FALSE(this->store->check({"x"}));

  a->setString("only-a", "1");
  EXPECT_TRUE(a->check({"only-a"}));
  EXPECT_FALSE(b->check({"only-a"}));
  EXPECT_EQ(a->add("n", 3), 3);
  EXPECT_EQ(b->add("n", 10), 10);
  EXPECT_TRUE(b->erase("x"));
  EXPECT_EQ(a->getString("x", 1s), "from a");

  // Errors name the key as stored, prefix included.
  const auto msg = expectError(chorusTimeout, [&] { b->wait({"only-a"}, 20ms); });
  EXPECT_NE(msg.find("'job/b/only-a'"), std::string::npos) << msg;
  expectError(chorusInvalidArgument, [&] { a->setString("", "v"); });
}

TYPED_TEST(StoreTest, LargeValueRoundTrip) {
  // A pattern that does not repeat on any power-of-two period, so misplaced chunks show up.
  std::vector<std::byte> pattern(4093);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  std::vector<std::byte> big(size_t{8} << 20);
  for (size_t at = 0; at < big.size(); at += pattern.size()) {
    std::memcpy(big.data() + at, pattern.data(), std::min(pattern.size(), big.size() - at));
  }
  this->store->set("big", big);
  const auto back = this->backend.open()->get("big", 10s);
  ASSERT_EQ(back.size(), big.size());
  EXPECT_TRUE(back == big);
}

TYPED_TEST(StoreTest, RejectsBadKeysAndValues) {
  auto& s = *this->store;
  std::string msg = expectError(chorusInvalidArgument, [&] { s.setString("", "v"); });
  EXPECT_NE(msg.find("empty key"), std::string::npos) << msg;
  const std::string tooLong(Store::kMaxKeyBytes + 1, 'k');
  msg = expectError(chorusInvalidArgument, [&] { s.get(tooLong, 1s); });
  EXPECT_NE(msg.find("4097 bytes"), std::string::npos) << msg;
  expectError(chorusInvalidArgument, [&] { s.add(tooLong, 1); });
  expectError(chorusInvalidArgument, [&] { s.check({"ok", ""}); });
  std::vector<std::byte> huge(Store::kMaxValueBytes + 1);
  msg = expectError(chorusInvalidArgument, [&] { s.set("huge", huge); });
  EXPECT_NE(msg.find("'huge'"), std::string::npos) << msg;

  // The largest key is fine (for the file store: longer than any file name).
  const std::string longest(Store::kMaxKeyBytes, 'L');
  s.setString(longest, "long");
  EXPECT_EQ(s.getString(longest, 1s), "long");
  EXPECT_TRUE(s.check({longest}));
  EXPECT_FALSE(s.check({std::string(Store::kMaxKeyBytes, 'M')}));
  EXPECT_TRUE(s.erase(longest));
  EXPECT_FALSE(s.check({longest}));
}

// Store::wait's default (for stores that do not override it) polls check().
class ForwardingStore : public Store {
 public:
  explicit ForwardingStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  void set(const std::string& k, std::span<const std::byte> v) override { inner_->set(k, v); }
  std::vector<std::byte> get(const std::string& k, std::chrono::milliseconds t) override {
    return inner_->get(k, t);
  }
  int64_t add(const std::string& k, int64_t d) override { return inner_->add(k, d); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  bool erase(const std::string& k) override { return inner_->erase(k); }

 private:
  std::shared_ptr<Store> inner_;
};

TEST(StoreDefaults, WaitPollsCheckAndNamesMissingKeys) {
  ForwardingStore s(makeInProcessStore());
  s.setString("a", "1");
  const auto msg = expectError(chorusTimeout, [&] { s.wait({"a", "b"}, 50ms); });
  EXPECT_NE(msg.find("missing 1 of 2: 'b'"), std::string::npos) << msg;
  std::thread t([&] {
    std::this_thread::sleep_for(30ms);
    s.setString("b", "2");
  });
  s.wait({"a", "b"}, 10s);
  t.join();
}

TEST(FileStore, CreatesMissingDirectories) {
  TempDir dir;
  const auto nested = dir.path() / "x" / "y";
  auto s = makeFileStore(nested.string());
  s->setString("k", "v");
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  EXPECT_EQ(makeFileStore(nested.string())->getString("k", 1s), "v");
}

TEST(FileStore, ReportsAnUnusableDirectory) {
  TempDir dir;
  const auto file = dir.path() / "plain-file";
  std::ofstream(file) << "in the way";
  const auto msg = expectError(chorusSystemError, [&] { makeFileStore((file / "sub").string()); });
  EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
}

}  // namespace
}  // namespace chorus::test
