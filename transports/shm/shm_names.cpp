#include "transports/shm/shm_names.hpp"

#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace chorus::transport {

namespace {

// Inode of this process's pid namespace (0 if /proc cannot tell).
unsigned long long pidNamespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
}

constexpr const char* kPrefix = "chorus-";

// Parses the "-n<ns>-p<pid>" ending of a segment name; false if the name has none.
bool parseCreator(const char* name, unsigned long long* ns, long* pid) {
  const char* n = nullptr;  // the last "-n"
  for (const char* at = name; (at = std::strstr(at, "-n")) != nullptr; ++at) n = at;
  if (n == nullptr) return false;
  char* end = nullptr;
  errno = 0;
  *ns = std::strtoull(n + 2, &end, 10);
  if (errno != 0 || end == n + 2 || end[0] != '-' || end[1] != 'p') return false;
  const char* p = end + 2;
  *pid = std::strtol(p, &end, 10);
  return errno == 0 && end != p && *end == '\0' && *pid > 0;
}

}  // namespace

std::string segmentName(const std::string& tag, int rank) {
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "-%d-n%llu-p%ld", rank, pidNamespace(), static_cast<long>(getpid()));
  return std::string("/") + kPrefix + tag + suffix;
}

bool processGone(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  // Exited but not yet reaped: the state after the command name in /proc/<pid>/stat is Z (or X).
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')');
  return close != nullptr && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

int removeOrphanSegments() {
  const unsigned long long ours = pidNamespace();
  if (ours == 0) return 0;  // without /proc, a creator's pid means nothing here
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  const long self = static_cast<long>(getpid());
  int removed = 0;
  while (const dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, kPrefix, std::strlen(kPrefix)) != 0) continue;
    unsigned long long ns = 0;
    long pid = 0;
    if (!parseCreator(e->d_name, &ns, &pid) || ns != ours || pid == self) continue;
    if (!processGone(static_cast<int>(pid))) continue;
    if (shm_unlink((std::string("/") + e->d_name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace chorus::transport
