// Helpers shared by the API tests: running thread ranks, bfloat16 conversions, message checks.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.hpp"

namespace chorus::apitest {

/// Runs fn(comm, rank) on one thread per communicator and joins them. An unexpected chorus::Error
/// becomes a test failure naming the rank.
inline void runRanks(std::vector<Communicator>& comms, const std::function<void(Communicator&, int)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(comms.size());
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(comms[r], static_cast<int>(r));
      } catch (const Error& e) {
        ADD_FAILURE() << "rank " << r << " threw (code " << e.code() << "): " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

/// Config with a short timeout so that a hang fails the test instead of stalling it.
inline Config testConfig(int seconds = 20) {
  Config c;
  c.timeout = std::chrono::seconds(seconds);
  return c;
}

/// True if `text` contains every word of `words`.
inline ::testing::AssertionResult mentions(const std::string& text,
                                           std::initializer_list<const char*> words) {
  for (const char* w : words) {
    if (text.find(w) == std::string::npos) {
      return ::testing::AssertionFailure() << "message '" << text << "' does not mention '" << w << "'";
    }
  }
  return ::testing::AssertionSuccess();
}

// bfloat16 as its upper 16 bits of float32, rounded to nearest even (no NaN inputs here).
inline uint16_t toBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
inline float fromBf16(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

}  // namespace chorus::apitest
