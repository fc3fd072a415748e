// The one interface of every transport, shared memory included: pipes to peers, failure notices,
// and an idle wait. A transport connects this rank to some of the communicator's ranks and numbers
// them its own way (a shared-memory group of one host by its index in the group, the transports
// between hosts by communicator rank); a PeerSet (transports/peer_set.hpp) routes each rank to the
// transport of its pair and translates the numbers.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "chorus/chorus.hpp"
#include "transports/pipe.hpp"

namespace chorus::transport {

/// A failure of the connection to one peer (the message names the peer and, where known, its address).
class PeerError : public Error {
 public:
  using Error::Error;
};

class Transport {
 public:
  virtual ~Transport() = default;
  /// "shm", "tcp", "ucx" or "ib".
  virtual const char* name() const = 0;
  virtual SendPipe& sendPipe(int peer) = 0;
  virtual RecvPipe& recvPipe(int peer) = 0;
  /// Best effort: tells every peer this rank failed with `code` (they report `text`); the first
  /// call wins. Transports whose notices carry no code have their peers report chorusRemoteError.
  virtual void publishFailure(chorusResult_t code, const std::string& text) = 0;
  /// Takes in what has arrived; returns a peer that sent a failure notice (and its code and text),
  /// or -1.
  virtual int findPeerFailure(chorusResult_t* code, std::string* text) = 0;
  /// Blocks until data may have arrived from a peer, or `timeout` passes; false (at once) when this
  /// transport has nothing to block on (shared memory: the caller naps instead).
  virtual bool waitReadable(std::chrono::microseconds timeout) = 0;
  /// What this rank advertises, for logs ("eth0 169.254.1.1:40211", a segment name).
  virtual const std::string& describeLocal() const = 0;
  /// Bytes of buffers held.
  virtual size_t memoryBytes() const = 0;
};

}  // namespace chorus::transport
