#include "transports/net_group.hpp"

#include <algorithm>

#include "base/error.hpp"

namespace chorus::transport {

const char* netKindName(NetKind k) {
  switch (k) {
    case NetKind::Ib:
      return "ib";
    case NetKind::Ucx:
      return "ucx";
    case NetKind::Tcp:
      return "tcp";
  }
  return "?";
}

bool parseNetKind(const std::string& s, NetKind* k) {
  for (NetKind c : kNetPreference) {
    if (s == netKindName(c)) {
      *k = c;
      return true;
    }
  }
  return false;
}

std::string formatNetKinds(const std::vector<NetKind>& kinds) {
  std::string out;
  for (NetKind k : kinds) out += strCat(out.empty() ? "" : ",", netKindName(k));
  return out;
}

std::vector<NetKind> parseNetKinds(const std::string& s) {
  std::vector<NetKind> kinds;
  size_t at = 0;
  while (at <= s.size() && !s.empty()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    NetKind k;
    if (!parseNetKind(s.substr(at, comma - at), &k))
      throw Error(chorusInternalError, strCat("unknown transport kind in \"", s, "\""));
    kinds.push_back(k);
    at = comma + 1;
  }
  return kinds;
}

bool chooseNetKind(const std::vector<NetKind>& mine, const std::vector<NetKind>& theirs, NetKind* kind) {
  for (NetKind k : kNetPreference) {
    if (std::find(mine.begin(), mine.end(), k) != mine.end() &&
        std::find(theirs.begin(), theirs.end(), k) != theirs.end()) {
      *kind = k;
      return true;
    }
  }
  return false;
}

NetGroup::NetGroup(std::vector<std::unique_ptr<NetTransport>> transports, std::vector<int> byPeer)
    : transports_(std::move(transports)), byPeer_(std::move(byPeer)) {
  for (const auto& t : transports_)
    local_ += strCat(local_.empty() ? "" : "; ", t->name(), ": ", t->describeLocal());
}

const char* NetGroup::name() const { return transports_.size() == 1 ? transports_.front()->name() : "mixed"; }

SendPipe& NetGroup::sendPipe(int peer) {
  return transports_[static_cast<size_t>(byPeer_[static_cast<size_t>(peer)])]->sendPipe(peer);
}
RecvPipe& NetGroup::recvPipe(int peer) {
  return transports_[static_cast<size_t>(byPeer_[static_cast<size_t>(peer)])]->recvPipe(peer);
}

void NetGroup::publishFailure(const std::string& text) {
  for (auto& t : transports_) t->publishFailure(text);
}

int NetGroup::findPeerFailure(std::string* text) {
  for (auto& t : transports_) {
    if (int r = t->findPeerFailure(text); r >= 0) return r;
  }
  return -1;
}

void NetGroup::waitReadable(std::chrono::microseconds timeout) {
  if (transports_.size() == 1) {
    transports_.front()->waitReadable(timeout);
    return;
  }
  // Several kinds: no common wait; each gets its share of the time.
  const auto share = timeout / static_cast<int64_t>(transports_.size());
  for (auto& t : transports_) t->waitReadable(share);
}

size_t NetGroup::memoryBytes() const {
  size_t total = 0;
  for (const auto& t : transports_) total += t->memoryBytes();
  return total;
}

const char* NetGroup::kindOf(int peer) const {
  const int i = byPeer_[static_cast<size_t>(peer)];
  return i < 0 ? "-" : transports_[static_cast<size_t>(i)]->name();
}

}  // namespace chorus::transport
