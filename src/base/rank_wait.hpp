// Waiting for every rank's key during initialisation, with errors that name the missing ranks.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "base/util.hpp"
#include "chorus/chorus.hpp"
#include "chorus/store.hpp"

namespace chorus {

/// Waits until `<prefix><r>` exists for every rank r < nranks. On timeout throws chorusTimeout
/// "rank <self> of <n>: <stage> timed out after T ms waiting for rank(s) a, b (CHORUS_TIMEOUT)".
/// With `between`, waits in slices of 200 ms and calls it after each slice that ended without all
/// keys: it throws to stop the wait (a peer that died, say).
inline void waitForRanks(Store& store, const std::string& prefix, int nranks, int self,
                         std::chrono::milliseconds timeout, const std::string& stage,
                         const std::function<void()>& between = {}) {
  std::vector<std::string> keys;
  for (int r = 0; r < nranks; ++r) keys.push_back(strCat(prefix, r));
  try {
    if (!between) {
      store.wait(keys, timeout);
    } else {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        const bool last = left <= std::chrono::milliseconds(200);
        try {
          store.wait(keys,
                     last ? std::max(left, std::chrono::milliseconds(0)) : std::chrono::milliseconds(200));
          break;
        } catch (const Error& e) {
          if (e.code() != chorusTimeout || last) throw;
        }
        between();
      }
    }
  } catch (const Error& e) {
    if (e.code() != chorusTimeout) throw;
    std::string missing;
    for (int r = 0; r < nranks; ++r) {
      if (!store.check({keys[static_cast<size_t>(r)]})) missing += strCat(missing.empty() ? "" : ", ", r);
    }
    throw Error(chorusTimeout,
                strCat("rank ", self, " of ", nranks, ": ", stage, " timed out after ", timeout.count(),
                       " ms waiting for rank(s) ", missing,
                       " (did they start, with the same store? CHORUS_TIMEOUT sets the limit)"));
  }
}

}  // namespace chorus
