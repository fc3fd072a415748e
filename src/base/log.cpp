#include "base/log.hpp"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <mutex>

#include "base/config.hpp"

namespace chorus {

namespace {
struct SubsysName {
  Subsys s;
  const char* name;
};
constexpr SubsysName kNames[] = {{Subsys::Init, "INIT"}, {Subsys::Bootstrap, "BOOTSTRAP"},
                                 {Subsys::Topo, "TOPO"}, {Subsys::Tuning, "TUNING"},
                                 {Subsys::Shm, "SHM"},   {Subsys::Net, "NET"}};
}  // namespace

const char* subsysName(Subsys s) {
  for (const auto& n : kNames) {
    if (n.s == s) return n.name;
  }
  return "?";
}

bool parseSubsystems(const std::string& text, unsigned* mask) {
  std::string s;
  for (char ch : text) {
    if (ch != ' ' && ch != '\t') s += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  }
  const bool exclude = !s.empty() && s[0] == '^';
  if (exclude) s.erase(0, 1);
  unsigned named = 0;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string name = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? s.size() + 1 : comma + 1;
    if (name.empty()) continue;
    if (name == "ALL") {
      named |= kAllSubsystems;
      continue;
    }
    bool found = false;
    for (const auto& n : kNames) {
      if (name == n.name) {
        named |= static_cast<unsigned>(n.s);
        found = true;
      }
    }
    if (!found) return false;
  }
  *mask = exclude ? (kAllSubsystems & ~named) : named;
  return true;
}

LogLevel logLevel() { return envConfig().logLevel; }

bool logEnabled(LogLevel level, Subsys s) {
  const EnvConfig& c = envConfig();
  return c.logLevel >= level && (c.logSubsystems & static_cast<unsigned>(s)) != 0;
}

void logMessage(LogLevel level, const char* subsys, const std::string& message) {
  static std::mutex mu;
  static char host[64] = {0};
  static std::once_flag once;
  std::call_once(once, [] {
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '?';
  });
  const char* name = level == LogLevel::Warn ? "WARN" : level == LogLevel::Info ? "INFO" : "TRACE";
  std::lock_guard lk(mu);
  std::fprintf(stderr, "%s:%d:chorus %s%s%s %s\n", host, static_cast<int>(getpid()), name, subsys ? " " : "",
               subsys ? subsys : "", message.c_str());
}

}  // namespace chorus
