// Logging to stderr, filtered by CHORUS_DEBUG (NONE, WARN, INFO, TRACE; default WARN).
#pragma once

#include <string>

#include "core/util.hpp"

namespace chorus {

enum class LogLevel { None = 0, Warn = 1, Info = 2, Trace = 3 };

LogLevel logLevel();
void logMessage(LogLevel level, const std::string& message);

template <typename... Args>
void logInfo(const Args&... args) {
  if (logLevel() >= LogLevel::Info) logMessage(LogLevel::Info, strCat(args...));
}
template <typename... Args>
void logWarn(const Args&... args) {
  if (logLevel() >= LogLevel::Warn) logMessage(LogLevel::Warn, strCat(args...));
}
template <typename... Args>
void logTrace(const Args&... args) {
  if (logLevel() >= LogLevel::Trace) logMessage(LogLevel::Trace, strCat(args...));
}

}  // namespace chorus
