// Helpers shared by the Store implementations: argument checks, error texts, deadlines and backoff.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chorus/store.hpp"

namespace chorus::detail {

using Clock = std::chrono::steady_clock;

/// now + timeout, clamped so that later arithmetic on the time point can never overflow (a caller
/// passing milliseconds::max() means "forever", which ten years approximates well enough).
Clock::time_point deadlineAfter(std::chrono::milliseconds timeout);

/// Sleeps between polls: each step doubles from `initial` up to `max`, never past the deadline.
class Backoff {
 public:
  Backoff(Clock::duration initial, Clock::duration max) : step_(initial), max_(max) {}
  /// Sleeps one step (cut short at the deadline). False, without sleeping, once the deadline has passed.
  bool sleep(Clock::time_point deadline);

 private:
  Clock::duration step_;
  Clock::duration max_;
};

/// 'key' quoted for error messages: control and non-ASCII bytes escaped, very long keys shortened.
std::string quoteKey(const std::string& key);
/// 'a', 'b', 'c'
std::string quoteKeys(const std::vector<std::string>& keys);

/// Throw chorusInvalidArgument (prefixed by `where`) for an empty or oversized key / oversized value.
void validateKey(const std::string& where, const std::string& key);
void validateValue(const std::string& where, const std::string& key, size_t bytes);

/// Counters written by add() are decimal ASCII, so getString() shows them and setString("n", "5")
/// followed by add("n", 1) works the same on every store (the TCP server included, which is why the
/// refusal is text rather than an exception: the server sends it back to its client).
struct CounterUpdate {
  int64_t value = 0;
  std::string refusal;  // why add() is refused (not a decimal integer, overflow); empty when it is fine
};
/// `current` is the key's value, or null when the key is missing (which counts as 0).
CounterUpdate applyAdd(const std::vector<std::byte>* current, int64_t delta);
std::vector<std::byte> formatCounter(int64_t value);
/// "add('key', 5)", to name the call in messages.
std::string describeAdd(const std::string& key, int64_t delta);

[[noreturn]] void throwGetTimeout(const std::string& where, const std::string& key,
                                  std::chrono::milliseconds timeout);
[[noreturn]] void throwWaitTimeout(const std::string& where, const std::vector<std::string>& keys,
                                   const std::vector<std::string>& missing,
                                   std::chrono::milliseconds timeout);

/// Store::wait for stores without a wake-up mechanism: polls check() with backoff until the deadline.
void pollWait(Store& store, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
              const std::string& where);

}  // namespace chorus::detail
