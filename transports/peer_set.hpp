// Every connection of one rank: for each peer, the transport of its pair. The communicator reaches
// its peers only through this (pipes, failure notices, the idle wait), whatever they travel over;
// transports/factory.hpp makes it.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "transports/transport.hpp"

namespace chorus::transport {

class ShmGroup;

class PeerSet {
 public:
  /// One transport and the ranks it connects this rank to: `number[r]` is rank r's number in the
  /// transport (its group rank for shared memory, r itself between hosts), -1 where it does not
  /// reach r. `betweenHosts`: the transport reaches other hosts (and can block in waitReadable);
  /// false for the shared memory of this host.
  struct Member {
    std::unique_ptr<Transport> transport;
    std::vector<int> number;
    bool betweenHosts = false;
  };
  /// `shm`: the member that joins every rank of the communicator in one shared-memory group, if
  /// one does (the direct algorithms' capability), else null. Every rank but `rank` must be reached
  /// by exactly one member (a communicator of one rank has none).
  PeerSet(int rank, int size, std::vector<Member> members, ShmGroup* shm);
  PeerSet(const PeerSet&) = delete;
  PeerSet& operator=(const PeerSet&) = delete;

  SendPipe& sendPipe(int peer) { return *route_[static_cast<size_t>(peer)].send; }
  RecvPipe& recvPipe(int peer) { return *route_[static_cast<size_t>(peer)].recv; }
  /// The shared memory of every rank: staging area, sync flags, low-latency lines, buffer exchange.
  /// Null when some rank is on another host.
  ShmGroup* shm() const { return shm_; }
  /// Whether some peer is on another host.
  bool spansHosts() const { return spansHosts_; }
  /// The transport of the pair with `peer` ("shm", "tcp", ...; "-" for this rank).
  const char* kindOf(int peer) const;

  /// Tells every peer this rank failed (each transport, best effort).
  void publishFailure(chorusResult_t code, const std::string& text);
  /// A peer that published a failure: its rank (and code and text), or -1.
  int findPeerFailure(chorusResult_t* code, std::string* text);
  /// Waits until data may have arrived, or `timeout` passes, on the transports that can block
  /// (sharing the time between several); false at once when none can (the caller naps).
  bool waitReadable(std::chrono::microseconds timeout);
  size_t memoryBytes() const;
  /// "shm: /chorus-...; tcp: eth0 10.0.0.1:4000", for logs.
  std::string describe() const;

 private:
  struct Route {
    SendPipe* send = nullptr;
    RecvPipe* recv = nullptr;
    int member = -1;
  };
  std::vector<Member> members_;
  std::vector<Route> route_;  // by rank
  std::vector<Transport*> blocking_;
  ShmGroup* shm_;
  bool spansHosts_ = false;
};

}  // namespace chorus::transport
