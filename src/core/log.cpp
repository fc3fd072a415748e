#include "core/log.hpp"

#include <unistd.h>

#include <cstdio>
#include <mutex>

#include "core/config.hpp"

namespace chorus {

LogLevel logLevel() { return envConfig().logLevel; }

void logMessage(LogLevel level, const std::string& message) {
  static std::mutex mu;
  static char host[64] = {0};
  static std::once_flag once;
  std::call_once(once, [] {
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '?';
  });
  const char* name = level == LogLevel::Warn ? "WARN" : level == LogLevel::Info ? "INFO" : "TRACE";
  std::lock_guard lk(mu);
  std::fprintf(stderr, "%s:%d:chorus %s %s\n", host, static_cast<int>(getpid()), name, message.c_str());
}

}  // namespace chorus
