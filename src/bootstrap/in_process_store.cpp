// Store for ranks that are threads of one process: a map guarded by a mutex, with a condition
// variable so that get() and wait() sleep until a writer changes something instead of polling.
#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "bootstrap/store_util.hpp"
#include "chorus/chorus.hpp"

namespace chorus {
namespace {

constexpr const char* kWhere = "in-process store";

class InProcessStore final : public Store {
 public:
  void set(const std::string& key, std::span<const std::byte> value) override {
    detail::validateKey(kWhere, key);
    detail::validateValue(kWhere, key, value.size());
    // Copy outside the lock: values can be megabytes and readers should not wait on the copy.
    std::vector<std::byte> copy(value.begin(), value.end());
    {
      std::lock_guard lock(mu_);
      map_[key] = std::move(copy);
    }
    changed_.notify_all();
  }

  std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) override {
    detail::validateKey(kWhere, key);
    const auto deadline = detail::deadlineAfter(timeout);
    std::unique_lock lock(mu_);
    for (;;) {
      if (auto it = map_.find(key); it != map_.end()) return it->second;
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && !map_.contains(key)) {
        detail::throwGetTimeout(kWhere, key, timeout);
      }
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    detail::validateKey(kWhere, key);
    detail::CounterUpdate update;
    {
      std::lock_guard lock(mu_);
      auto it = map_.find(key);
      update = detail::applyAdd(it == map_.end() ? nullptr : &it->second, delta);
      if (!update.refusal.empty()) {
        throw Error(chorusInvalidArgument,
                    std::string(kWhere) + ": " + detail::describeAdd(key, delta) + ": " + update.refusal);
      }
      map_[key] = detail::formatCounter(update.value);
    }
    changed_.notify_all();
    return update.value;
  }

  bool check(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) detail::validateKey(kWhere, key);
    std::lock_guard lock(mu_);
    return missingLocked(keys).empty();
  }

  bool erase(const std::string& key) override {
    detail::validateKey(kWhere, key);
    std::lock_guard lock(mu_);
    return map_.erase(key) > 0;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    for (const auto& key : keys) detail::validateKey(kWhere, key);
    const auto deadline = detail::deadlineAfter(timeout);
    std::unique_lock lock(mu_);
    for (;;) {
      auto missing = missingLocked(keys);
      if (missing.empty()) return;
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
        missing = missingLocked(keys);
        if (missing.empty()) return;
        detail::throwWaitTimeout(kWhere, keys, missing, timeout);
      }
    }
  }

 private:
  std::vector<std::string> missingLocked(const std::vector<std::string>& keys) const {
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (!map_.contains(key)) missing.push_back(key);
    }
    return missing;
  }

  std::mutex mu_;
  std::condition_variable changed_;
  std::unordered_map<std::string, std::vector<std::byte>> map_;
};

}  // namespace

std::shared_ptr<Store> makeInProcessStore() { return std::make_shared<InProcessStore>(); }

}  // namespace chorus
