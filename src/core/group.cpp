#include "core/group.hpp"

#include <exception>
#include <vector>

#include "base/error.hpp"
#include "core/comm_impl.hpp"

namespace chorus::group {

namespace {
struct State {
  int depth = 0;
  std::vector<std::pair<std::shared_ptr<CommImpl>, Op>> ops;
  std::vector<std::function<void()>> launched;
  std::vector<std::function<void()>> prepared;
  std::vector<std::function<void()>> deferred;
};
thread_local State tState;
}  // namespace

// The operations of one outermost group, run together.
void runGroup(std::vector<std::pair<std::shared_ptr<CommImpl>, Op>> ops);

bool active() { return tState.depth > 0; }

void add(std::shared_ptr<CommImpl> comm, Op op) { tState.ops.emplace_back(std::move(comm), std::move(op)); }

void launch(std::function<void()> fn) { tState.launched.push_back(std::move(fn)); }

void prepare(std::function<void()> fn) { tState.prepared.push_back(std::move(fn)); }

void defer(std::function<void()> fn) { tState.deferred.push_back(std::move(fn)); }

void start() { ++tState.depth; }

void end() {
  if (tState.depth == 0) fail(chorusInvalidUsage, "groupEnd without a matching groupStart");
  if (--tState.depth > 0) return;
  auto ops = std::move(tState.ops);
  tState.ops.clear();
  auto launched = std::move(tState.launched);
  tState.launched.clear();
  auto prepared = std::move(tState.prepared);
  tState.prepared.clear();
  auto deferred = std::move(tState.deferred);
  tState.deferred.clear();
  // Every launch hook runs (each launches kernels that peers may wait for), then the prepare
  // hooks unless one failed; the first failure then stops the group.
  std::exception_ptr failed;
  for (auto& fn : launched) {
    try {
      fn();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  for (auto& fn : prepared) {
    if (failed) break;
    try {
      fn();
    } catch (...) {
      failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  runGroup(std::move(ops));
  for (auto& fn : deferred) fn();
}

void runGroup(std::vector<std::pair<std::shared_ptr<CommImpl>, Op>> ops) {
  // Per communicator, in the order of first use.
  std::vector<std::pair<std::shared_ptr<CommImpl>, std::vector<Op>>> perComm;
  for (auto& [comm, op] : ops) {
    auto it = perComm.begin();
    while (it != perComm.end() && it->first != comm) ++it;
    if (it == perComm.end()) {
      perComm.emplace_back(comm, std::vector<Op>{});
      it = perComm.end() - 1;
    }
    it->second.push_back(std::move(op));
  }
  if (perComm.empty()) return;
  if (perComm.size() == 1) {
    perComm[0].first->submit(std::move(perComm[0].second), false)->rethrow();
    return;
  }
  // Several communicators of this process (ranks as threads): each runs its part on its own
  // worker so that they can progress together.
  std::vector<std::shared_ptr<WorkState>> works;
  for (auto& [comm, list] : perComm) works.push_back(comm->submit(std::move(list), true));
  for (auto& w : works) {
    std::unique_lock lk(w->mu);
    w->cv.wait(lk, [&] { return w->done; });
  }
  for (auto& w : works) w->rethrow();
}

}  // namespace chorus::group
