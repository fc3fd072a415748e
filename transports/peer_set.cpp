#include "transports/peer_set.hpp"

#include "base/error.hpp"
#include "transports/shm/shm_group.hpp"

namespace chorus::transport {

PeerSet::PeerSet(int rank, int size, std::vector<Member> members, ShmGroup* shm)
    : members_(std::move(members)), route_(static_cast<size_t>(size)), shm_(shm) {
  for (size_t i = 0; i < members_.size(); ++i) {
    Member& m = members_[i];
    if (m.betweenHosts) {
      spansHosts_ = true;
      blocking_.push_back(m.transport.get());
    }
    for (size_t r = 0; r < m.number.size() && r < route_.size(); ++r) {
      if (m.number[r] < 0 || static_cast<int>(r) == rank) continue;
      Route& route = route_[r];
      if (route.member >= 0)
        fail(chorusInternalError, strCat("rank ", rank, ": rank ", r, " is reached by two transports"));
      route.send = &m.transport->sendPipe(m.number[r]);
      route.recv = &m.transport->recvPipe(m.number[r]);
      route.member = static_cast<int>(i);
    }
  }
  for (size_t r = 0; r < route_.size(); ++r) {
    if (route_[r].member < 0 && static_cast<int>(r) != rank)
      fail(chorusInternalError, strCat("rank ", rank, ": no transport reaches rank ", r));
  }
}

const char* PeerSet::kindOf(int peer) const {
  const int m = route_[static_cast<size_t>(peer)].member;
  return m < 0 ? "-" : members_[static_cast<size_t>(m)].transport->name();
}

void PeerSet::publishFailure(chorusResult_t code, const std::string& text) {
  for (Member& m : members_) m.transport->publishFailure(code, text);
}

int PeerSet::findPeerFailure(chorusResult_t* code, std::string* text) {
  for (Member& m : members_) {
    const int found = m.transport->findPeerFailure(code, text);
    if (found < 0) continue;
    for (size_t r = 0; r < m.number.size(); ++r) {
      if (m.number[r] == found) return static_cast<int>(r);
    }
  }
  return -1;
}

bool PeerSet::waitReadable(std::chrono::microseconds timeout) {
  // Shared memory has nothing to block on; several kinds between hosts have no common wait, so each
  // gets its share of the time.
  if (blocking_.empty()) return false;
  const auto share = timeout / static_cast<int64_t>(blocking_.size());
  bool waited = false;
  for (Transport* t : blocking_) waited = t->waitReadable(share) || waited;
  return waited;
}

size_t PeerSet::memoryBytes() const {
  size_t total = 0;
  for (const Member& m : members_) total += m.transport->memoryBytes();
  return total;
}

std::string PeerSet::describe() const {
  std::string out;
  for (const Member& m : members_)
    out += strCat(out.empty() ? "" : "; ", m.transport->name(), ": ", m.transport->describeLocal());
  return out;
}

}  // namespace chorus::transport
