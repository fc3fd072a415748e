// Which network interface and address a rank advertises to ranks on other hosts.
//
// The choice never comes from resolving the host name (Gloo's failure: a name that resolves to a
// loopback address, or to an address family the peers cannot reach). Interfaces are listed with
// getifaddrs() and filtered:
//   - CHORUS_SOCKET_IFNAME, NCCL's syntax: a comma list of name prefixes ("eth,ens"), "^" in front
//     to exclude those prefixes instead ("^docker,lo"), "=" in front for exact names ("=eth0").
//   - CHORUS_SOCKET_FAMILY: 4 or 6 (AF_INET/AF_INET6 accepted) restricts the address family.
//   - Without CHORUS_SOCKET_IFNAME, loopback, docker* and virbr* interfaces are skipped. A loopback
//     address is never advertised to another host, even when named explicitly.
// Among what remains the first interface (in the kernel's order) wins, IPv4 before IPv6, global
// IPv6 before link-local.
#pragma once

#include <sys/socket.h>

#include <string>
#include <vector>

#include "base/socket_util.hpp"

namespace chorus::transport {

struct NetInterface {
  std::string name;            // "eth0"
  net::SocketAddress address;  // port 0
  unsigned index = 0;          // if_nametoindex (the scope of an IPv6 link-local address)
  bool loopback = false;
  bool linkLocal = false;  // 169.254/16 or fe80::/10
};

/// Every configured address of every interface that is up (one entry per address).
std::vector<NetInterface> listInterfaces();

/// Whether `name` passes an NCCL-style interface filter ("" passes everything).
bool interfaceMatches(const std::string& filter, const std::string& name);

/// Parses CHORUS_SOCKET_FAMILY: "" -> AF_UNSPEC, "4"/"AF_INET" -> AF_INET, "6"/"AF_INET6" -> AF_INET6;
/// -1 if malformed.
int parseFamily(const std::string& text);

/// The address this rank advertises (rules above). Throws chorusSystemError listing the interfaces
/// that were seen and why each was passed over, when none qualifies.
/// `allowLoopback` (tests on one host only) lets a loopback address qualify.
NetInterface selectInterface(const std::vector<NetInterface>& candidates, const std::string& filter,
                             int family, bool allowLoopback = false);

/// "169.254.1.2" / "fe80::1" (numeric, no port, no brackets, no scope).
std::string addressText(const net::SocketAddress& a);

/// Parses a numeric address; an IPv6 link-local address gets `scope` as its scope id (the index of
/// this host's own interface: the peer's index means nothing here). False if malformed.
bool parseAddress(const std::string& text, uint16_t port, unsigned scope, net::SocketAddress* out);

}  // namespace chorus::transport
