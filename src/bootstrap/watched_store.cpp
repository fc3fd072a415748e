// A store whose waits end when a rank has published its failure: see watched_store.hpp.
#include "bootstrap/watched_store.hpp"

#include <algorithm>
#include <chrono>

#include "base/util.hpp"
#include "bootstrap/store_util.hpp"
#include "chorus/chorus.hpp"

namespace chorus {
namespace {

constexpr const char* kFailureKey = "failed";
constexpr const char* kReportPrefix = "communicator creation stopped: ";
constexpr std::chrono::milliseconds kPoll{200};

class WatchedStore final : public Store {
 public:
  WatchedStore(std::shared_ptr<Store> inner, int rank) : inner_(std::move(inner)), rank_(rank) {}

  void set(const std::string& key, std::span<const std::byte> value) override { inner_->set(key, value); }
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(key, delta); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  bool erase(const std::string& key) override { return inner_->erase(key); }

  std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::vector<std::byte> value;
    watch(timeout, [&](std::chrono::milliseconds slice) { value = inner_->get(key, slice); });
    return value;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    watch(timeout, [&](std::chrono::milliseconds slice) { inner_->wait(keys, slice); });
  }

 private:
  // Runs `step` in slices of kPoll until it succeeds; between slices, looks for a failure. The last
  // slice gets what remains, so a timeout is the inner store's own error.
  template <typename Step>
  void watch(std::chrono::milliseconds timeout, Step step) {
    const auto deadline = detail::deadlineAfter(timeout);
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - detail::Clock::now());
      if (left <= kPoll) {
        step(std::max(left, std::chrono::milliseconds(0)));
        return;
      }
      try {
        step(kPoll);
        return;
      } catch (const Error& e) {
        if (e.code() != chorusTimeout) throw;
      }
      throwIfFailed();
    }
  }

 public:
  // Throws the published failure, if there is one.
  void throwIfFailed() {
    if (inner_->check({kFailureKey})) {
      throw Error(chorusRemoteError, strCat("rank ", rank_, ": ", kReportPrefix,
                                            inner_->getString(kFailureKey, std::chrono::seconds(5))));
    }
  }

 private:
  std::shared_ptr<Store> inner_;
  int rank_;
};

}  // namespace

std::shared_ptr<Store> makeWatchedStore(std::shared_ptr<Store> inner, int rank) {
  return std::make_shared<WatchedStore>(std::move(inner), rank);
}

void publishFailure(Store& inner, int rank, const std::string& message) {
  try {
    if (!inner.check({kFailureKey}))
      inner.setString(kFailureKey, strCat("rank ", rank, " failed: ", message));
  } catch (...) {
    // The store is unreachable too: the peers find out by their own timeout.
  }
}

void throwIfPeerFailed(Store& store) {
  if (auto* watched = dynamic_cast<WatchedStore*>(&store)) watched->throwIfFailed();
}

bool isPeerFailureReport(const Error& e) {
  return e.code() == chorusRemoteError && std::string(e.what()).find(kReportPrefix) != std::string::npos;
}

}  // namespace chorus
