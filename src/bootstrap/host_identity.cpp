#include "bootstrap/host_identity.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "base/util.hpp"

namespace chorus {

namespace {
uint64_t nsInode(const char* path) {
  struct stat st {};
  if (stat(path, &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}
}  // namespace

HostIdentity HostIdentity::local() {
  HostIdentity h;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, h.bootId);
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) == 0) h.hostname = name;
  h.netns = nsInode("/proc/self/ns/net");
  h.pidns = nsInode("/proc/self/ns/pid");
  h.ipcns = nsInode("/proc/self/ns/ipc");
  h.pid = static_cast<int>(getpid());
  return h;
}

std::string HostIdentity::serialize() const {
  // Fields never contain '\n' (boot id is a UUID; host names cannot hold newlines).
  return strCat("v1\n", bootId, "\n", hostname, "\n", netns, "\n", pidns, "\n", ipcns, "\n", pid, "\n");
}

std::optional<HostIdentity> HostIdentity::parse(const std::string& text) {
  std::istringstream in(text);
  std::string version;
  HostIdentity h;
  if (!std::getline(in, version) || version != "v1") return std::nullopt;
  if (!std::getline(in, h.bootId) || !std::getline(in, h.hostname)) return std::nullopt;
  if (!(in >> h.netns >> h.pidns >> h.ipcns >> h.pid)) return std::nullopt;
  return h;
}

std::string HostIdentity::describe() const { return strCat(hostname, " pid ", pid); }

}  // namespace chorus
