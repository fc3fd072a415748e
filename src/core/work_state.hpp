// Shared completion state behind chorus::Work.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>

#include "chorus/chorus.hpp"

namespace chorus {

struct Work::State {
  mutable std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  chorusResult_t code = chorusInProgress;
  std::string message;

  void complete(chorusResult_t c, std::string msg = {}) {
    {
      std::lock_guard lk(mu);
      done = true;
      code = c;
      message = std::move(msg);
    }
    cv.notify_all();
  }
  /// Throws the stored error if the work failed.
  void rethrow() const {
    std::lock_guard lk(mu);
    if (done && code != chorusSuccess) throw Error(code, message);
  }
};

using WorkState = Work::State;

}  // namespace chorus
