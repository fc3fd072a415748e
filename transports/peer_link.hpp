// What the transports between hosts over RDMA verbs and UCX (ib/, ucx/) keep alike about the
// connection to each peer: whether it broke and why, and the failure notice the peer sent. How a
// connection breaks, and how a notice travels, is each transport's own.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace chorus::transport {

struct PeerLink {
  PeerLink(int rank, uint64_t* arrivals) : rank(rank), arrivals(arrivals) {}

  const int rank;
  uint64_t* arrivals;    // the transport's count of what arrived (data, failures): news ends an idle wait
  std::string broken;    // why the connection failed; empty while it works
  bool noticed = false;  // the peer sent a failure notice:
  std::string notice;    // its text

  /// Keeps the first reason given. An idle wait returns: the engine's next read reports it.
  void setBroken(std::string why) {
    if (!broken.empty()) return;
    broken = std::move(why);
    ++*arrivals;
  }
};

/// The first of `peers` (pointers to PeerLinks, null where not a peer) that sent a failure notice:
/// its rank, with the notice in `*text`; -1 where none has.
template <class Peers>
int firstNoticed(const Peers& peers, std::string* text) {
  for (const auto& p : peers) {
    if (p && p->noticed) {
      *text = p->notice;
      return p->rank;
    }
  }
  return -1;
}

}  // namespace chorus::transport
