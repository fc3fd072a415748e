#include "transports/tcp/net_interfaces.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstring>
#include <memory>

#include "base/error.hpp"

namespace chorus::transport {

namespace {

bool isLinkLocal(const net::SocketAddress& a) {
  if (a.family() == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a.storage);
    return (ntohl(in->sin_addr.s_addr) >> 16) == 0xA9FE;  // 169.254/16
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a.storage);
  return IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr);
}

bool isLoopbackAddress(const net::SocketAddress& a) {
  if (a.family() == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a.storage);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a.storage);
  return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
}

}  // namespace

std::vector<NetInterface> listInterfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) fail(chorusSystemError, net::errnoText("getifaddrs", errno));
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> guard(list, freeifaddrs);
  std::vector<NetInterface> out;
  for (ifaddrs* ifa = list; ifa; ifa = ifa->ifa_next) {
    if (!ifa->ifa_addr || !(ifa->ifa_flags & IFF_UP)) continue;
    const int family = ifa->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    NetInterface ni;
    ni.name = ifa->ifa_name;
    ni.address.length = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&ni.address.storage, ifa->ifa_addr, ni.address.length);
    ni.index = if_nametoindex(ifa->ifa_name);
    ni.loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0 || isLoopbackAddress(ni.address);
    ni.linkLocal = isLinkLocal(ni.address);
    out.push_back(std::move(ni));
  }
  return out;
}

bool interfaceMatches(const std::string& filter, const std::string& name) {
  if (filter.empty()) return true;
  std::string f = filter;
  const bool exclude = f.starts_with('^');
  if (exclude) f.erase(0, 1);
  const bool exact = f.starts_with('=');
  if (exact) f.erase(0, 1);
  bool hit = false;
  size_t start = 0;
  while (start <= f.size()) {
    size_t end = f.find(',', start);
    if (end == std::string::npos) end = f.size();
    const std::string item = f.substr(start, end - start);
    if (!item.empty() && (exact ? name == item : name.starts_with(item))) hit = true;
    start = end + 1;
  }
  return exclude ? !hit : hit;
}

int parseFamily(const std::string& text) {
  if (text.empty()) return AF_UNSPEC;
  if (text == "4" || text == "AF_INET" || text == "ipv4") return AF_INET;
  if (text == "6" || text == "AF_INET6" || text == "ipv6") return AF_INET6;
  return -1;
}

NetInterface selectInterface(const std::vector<NetInterface>& candidates, const std::string& filter,
                             int family, bool allowLoopback) {
  const NetInterface* best = nullptr;
  auto rank = [](const NetInterface& n) {  // lower is better
    if (n.address.family() == AF_INET) return 0;
    return n.linkLocal ? 2 : 1;
  };
  std::string seen;
  for (const NetInterface& n : candidates) {
    const char* why = nullptr;
    if (n.loopback && !allowLoopback)
      why = "loopback";
    else if (family != AF_UNSPEC && n.address.family() != family)
      why = "other address family";
    else if (!filter.empty() && !interfaceMatches(filter, n.name))
      why = "not matched by CHORUS_SOCKET_IFNAME";
    else if (filter.empty() && (n.name.starts_with("docker") || n.name.starts_with("virbr")))
      why = "container bridge (name it in CHORUS_SOCKET_IFNAME to use it)";
    seen += strCat(seen.empty() ? "" : ", ", n.name, " ", addressText(n.address), why ? " (" : "",
                   why ? why : "", why ? ")" : "");
    if (why) continue;
    if (!best || rank(n) < rank(*best)) best = &n;
  }
  if (!best) {
    fail(chorusSystemError, strCat("no network interface to reach other hosts: CHORUS_SOCKET_IFNAME='",
                                   filter, "', CHORUS_SOCKET_FAMILY=",
                                   family == AF_INET    ? "4"
                                   : family == AF_INET6 ? "6"
                                                        : "any",
                                   "; interfaces seen: ", seen.empty() ? "none" : seen));
  }
  return *best;
}

std::string addressText(const net::SocketAddress& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a.family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr, host, sizeof(host));
  } else if (a.family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr, host, sizeof(host));
  }
  return host;
}

bool parseAddress(const std::string& text, uint16_t port, unsigned scope, net::SocketAddress* out) {
  *out = net::SocketAddress{};
  sockaddr_in in{};
  if (inet_pton(AF_INET, text.c_str(), &in.sin_addr) == 1) {
    in.sin_family = AF_INET;
    in.sin_port = htons(port);
    std::memcpy(&out->storage, &in, sizeof in);
    out->length = sizeof in;
    return true;
  }
  sockaddr_in6 in6{};
  if (inet_pton(AF_INET6, text.c_str(), &in6.sin6_addr) == 1) {
    in6.sin6_family = AF_INET6;
    in6.sin6_port = htons(port);
    if (IN6_IS_ADDR_LINKLOCAL(&in6.sin6_addr)) in6.sin6_scope_id = scope;
    std::memcpy(&out->storage, &in6, sizeof in6);
    out->length = sizeof in6;
    return true;
  }
  return false;
}

}  // namespace chorus::transport
