// Throwing helpers and per-thread last-error text for the C API.
#pragma once

#include <string>

#include "base/util.hpp"
#include "chorus/chorus.hpp"

namespace chorus {

[[noreturn]] inline void fail(chorusResult_t code, const std::string& message) { throw Error(code, message); }

template <typename... Args>
[[noreturn]] void failInvalid(const Args&... args) {
  fail(chorusInvalidArgument, strCat(args...));
}

/// Throws chorusSystemError with errno text: "<what>: <strerror> (errno N)".
[[noreturn]] void failSystem(const std::string& what, int err = errno);

/// Last error text of the calling thread (set by the C API on every failure).
void setThreadLastError(const std::string& message);
const std::string& threadLastError();

}  // namespace chorus
