#include "base/error.hpp"

#include <cstdio>

namespace chorus {

namespace {
thread_local std::string tLastError;
}

void failSystem(const std::string& what, int err) {
  fail(chorusSystemError, strCat(what, ": ", errnoText(err)));
}

void setThreadLastError(const std::string& message) { tLastError = message; }
const std::string& threadLastError() { return tLastError; }

std::string formatBytes(size_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0 || v == static_cast<double>(static_cast<long long>(v))) {
    std::snprintf(buf, sizeof buf, "%lld %s", static_cast<long long>(v), units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  }
  return buf;
}

}  // namespace chorus
