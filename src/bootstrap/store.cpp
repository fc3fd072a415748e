// Store defaults shared by every implementation, the helpers of store_util.hpp, and the prefix store.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <thread>

#include "bootstrap/store_util.hpp"
#include "chorus/chorus.hpp"

namespace chorus {
namespace detail {

Clock::time_point deadlineAfter(std::chrono::milliseconds timeout) {
  constexpr auto kForever = std::chrono::hours(24 * 365 * 10);
  if (timeout < std::chrono::milliseconds::zero()) timeout = std::chrono::milliseconds::zero();
  if (timeout > kForever) timeout = kForever;
  return Clock::now() + timeout;
}

bool Backoff::sleep(Clock::time_point deadline) {
  const auto now = Clock::now();
  if (now >= deadline) return false;
  std::this_thread::sleep_for(std::min<Clock::duration>(step_, deadline - now));
  step_ = std::min<Clock::duration>(step_ * 2, max_);
  return true;
}

std::string quoteKey(const std::string& key) {
  // Keys are arbitrary bytes; a message must stay printable and short enough to read.
  constexpr size_t kShown = 200;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (size_t i = 0; i < key.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (key.size() > kShown) out += "...(" + std::to_string(key.size()) + " bytes)";
  out += "'";
  return out;
}

std::string quoteKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) out += ", ";
    out += quoteKey(keys[i]);
  }
  return out;
}

void validateKey(const std::string& where, const std::string& key) {
  if (key.empty()) throw Error(chorusInvalidArgument, where + ": empty key");
  if (key.size() > Store::kMaxKeyBytes) {
    throw Error(chorusInvalidArgument, where + ": key " + quoteKey(key) + " is " +
                                           std::to_string(key.size()) + " bytes, more than the limit of " +
                                           std::to_string(Store::kMaxKeyBytes));
  }
}

void validateValue(const std::string& where, const std::string& key, size_t bytes) {
  if (bytes > Store::kMaxValueBytes) {
    throw Error(chorusInvalidArgument, where + ": value for " + quoteKey(key) + " is " +
                                           std::to_string(bytes) + " bytes, more than the limit of " +
                                           std::to_string(Store::kMaxValueBytes));
  }
}

CounterUpdate applyAdd(const std::vector<std::byte>* current, int64_t delta) {
  int64_t old = 0;
  if (current) {
    const char* first = reinterpret_cast<const char*>(current->data());
    const char* last = first + current->size();
    const auto [end, ec] = std::from_chars(first, last, old);
    if (current->empty() || ec != std::errc() || end != last) {
      constexpr size_t kShown = 32;
      const std::string shown(first, first + std::min(current->size(), kShown));
      return {0, "existing value is not a decimal integer (" + std::to_string(current->size()) +
                     " bytes, starting " + quoteKey(shown) + ")"};
    }
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(old, delta, &sum)) {
    return {0, "overflows the current value " + std::to_string(old)};
  }
  return {sum, {}};
}

std::string describeAdd(const std::string& key, int64_t delta) {
  return "add(" + quoteKey(key) + ", " + std::to_string(delta) + ")";
}

std::vector<std::byte> formatCounter(int64_t value) {
  const std::string text = std::to_string(value);
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

void throwGetTimeout(const std::string& where, const std::string& key, std::chrono::milliseconds timeout) {
  throw Error(chorusTimeout, where + ": get(" + quoteKey(key) + ") timed out after " +
                                 std::to_string(timeout.count()) + " ms");
}

void throwWaitTimeout(const std::string& where, const std::vector<std::string>& keys,
                      const std::vector<std::string>& missing, std::chrono::milliseconds timeout) {
  throw Error(chorusTimeout, where + ": wait([" + quoteKeys(keys) + "]) timed out after " +
                                 std::to_string(timeout.count()) + " ms; missing " +
                                 std::to_string(missing.size()) + " of " + std::to_string(keys.size()) +
                                 ": " + quoteKeys(missing));
}

void pollWait(Store& store, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
              const std::string& where) {
  const auto deadline = deadlineAfter(timeout);
  Backoff backoff(std::chrono::microseconds(100), std::chrono::milliseconds(10));
  for (;;) {
    if (store.check(keys)) return;
    if (!backoff.sleep(deadline)) break;
  }
  // Name each missing key; one that turned up during this last look counts as arrived in time.
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (!store.check({key})) missing.push_back(key);
  }
  if (missing.empty()) return;
  throwWaitTimeout(where, keys, missing, timeout);
}

}  // namespace detail

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  detail::pollWait(*this, keys, timeout, "store");
}

void Store::setString(const std::string& key, const std::string& value) {
  set(key, std::as_bytes(std::span<const char>(value.data(), value.size())));
}

std::string Store::getString(const std::string& key, std::chrono::milliseconds timeout) {
  const auto value = get(key, timeout);
  return std::string(reinterpret_cast<const char*>(value.data()), value.size());
}

namespace {

// Every key goes through with the prefix in front; errors come from the inner store, so they name the
// full key as it is actually stored.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
      : prefix_(std::move(prefix)), inner_(std::move(inner)) {}

  void set(const std::string& key, std::span<const std::byte> value) override {
    inner_->set(full(key), value);
  }
  std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_->get(full(key), timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(full(key), delta); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(full(keys)); }
  bool erase(const std::string& key) override { return inner_->erase(full(key)); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner_->wait(full(keys), timeout);
  }

 private:
  std::string full(const std::string& key) const {
    // An empty key would otherwise silently name the prefix itself.
    if (key.empty())
      throw Error(chorusInvalidArgument, "prefix store " + detail::quoteKey(prefix_) + ": empty key");
    return prefix_ + key;
  }
  std::vector<std::string> full(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& key : keys) out.push_back(full(key));
    return out;
  }

  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace

std::shared_ptr<Store> makePrefixStore(std::string prefix, std::shared_ptr<Store> inner) {
  if (!inner) throw Error(chorusInvalidArgument, "makePrefixStore: inner store is null");
  return std::make_shared<PrefixStore>(std::move(prefix), std::move(inner));
}

}  // namespace chorus
