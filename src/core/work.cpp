#include "base/error.hpp"
#include "core/work_state.hpp"

namespace chorus {

Work::Work() = default;

bool Work::wait(std::chrono::milliseconds timeout) {
  if (!state_) return true;
  std::unique_lock lk(state_->mu);
  if (!state_->cv.wait_for(lk, timeout, [&] { return state_->done; })) return false;
  lk.unlock();
  state_->rethrow();
  return true;
}

void Work::wait() {
  if (!state_) return;
  {
    std::unique_lock lk(state_->mu);
    state_->cv.wait(lk, [&] { return state_->done; });
  }
  state_->rethrow();
}

bool Work::test() const {
  if (!state_) return true;
  std::lock_guard lk(state_->mu);
  return state_->done;
}

chorusResult_t Work::status() const {
  if (!state_) return chorusSuccess;
  std::lock_guard lk(state_->mu);
  return state_->done ? state_->code : chorusInProgress;
}

std::string Work::errorMessage() const {
  if (!state_) return {};
  std::lock_guard lk(state_->mu);
  return state_->message;
}

}  // namespace chorus
