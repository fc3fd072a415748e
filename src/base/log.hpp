// Logging to stderr, filtered by CHORUS_DEBUG (NONE, WARN, INFO, TRACE; default WARN) and, for INFO
// and TRACE, by subsystem: CHORUS_DEBUG_SUBSYS is a comma list of INIT, BOOTSTRAP, TOPO, TUNING, SHM
// or ALL (the default); a leading ^ turns it into the subsystems not to log, as in NCCL.
#pragma once

#include <string>

#include "base/util.hpp"

namespace chorus {

enum class LogLevel { None = 0, Warn = 1, Info = 2, Trace = 3 };

/// What a message is about. Bits of a mask.
enum class Subsys : unsigned {
  Init = 1u << 0,       // communicator creation, split, shrink
  Bootstrap = 1u << 1,  // stores and rendezvous
  Topo = 1u << 2,       // topology discovery
  Tuning = 1u << 3,     // algorithm decisions
  Shm = 1u << 4,        // shared-memory transport
  Net = 1u << 5,        // network transports
};
constexpr unsigned kAllSubsystems = 0x3F;
const char* subsysName(Subsys s);
/// Parses a CHORUS_DEBUG_SUBSYS value into a mask; false (mask untouched) if a name is unknown.
bool parseSubsystems(const std::string& text, unsigned* mask);

LogLevel logLevel();
bool logEnabled(LogLevel level, Subsys s);
void logMessage(LogLevel level, const char* subsys, const std::string& message);

template <typename... Args>
void logInfo(Subsys s, const Args&... args) {
  if (logEnabled(LogLevel::Info, s)) logMessage(LogLevel::Info, subsysName(s), strCat(args...));
}
template <typename... Args>
void logTrace(Subsys s, const Args&... args) {
  if (logEnabled(LogLevel::Trace, s)) logMessage(LogLevel::Trace, subsysName(s), strCat(args...));
}
/// Warnings are shown at WARN and above whatever the subsystem filter.
template <typename... Args>
void logWarn(const Args&... args) {
  if (logLevel() >= LogLevel::Warn) logMessage(LogLevel::Warn, nullptr, strCat(args...));
}

}  // namespace chorus
