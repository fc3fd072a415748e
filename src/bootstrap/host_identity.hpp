// Which host (and which process namespace) a rank runs in, as exchanged through the store.
// Locality is decided from these facts, never from launcher variables.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace chorus {

struct HostIdentity {
  std::string bootId;    // /proc/sys/kernel/random/boot_id
  std::string hostname;  // gethostname()
  uint64_t netns = 0;    // inode of /proc/self/ns/net
  uint64_t pidns = 0;    // inode of /proc/self/ns/pid
  uint64_t ipcns = 0;    // inode of /proc/self/ns/ipc
  int pid = 0;

  static HostIdentity local();
  std::string serialize() const;
  static std::optional<HostIdentity> parse(const std::string& text);

  /// Same kernel, same host name, same network namespace: shared memory works between them.
  bool sameHost(const HostIdentity& o) const {
    return bootId == o.bootId && hostname == o.hostname && netns == o.netns;
  }
  /// Process ids of the two are comparable (liveness can be watched).
  bool samePidNamespace(const HostIdentity& o) const { return sameHost(o) && pidns == o.pidns; }
  std::string describe() const;
};

}  // namespace chorus
