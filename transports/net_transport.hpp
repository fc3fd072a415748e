// The interface of a transport between hosts (TCP, UCX): pipes to the ranks of other hosts, failure
// notices, and an idle wait. CommImpl routes each remote peer to one of them (transports/net_select).
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

class NetTransport {
 public:
  virtual ~NetTransport() = default;
  /// "tcp" or "ucx".
  virtual const char* name() const = 0;
  virtual SendPipe& sendPipe(int peer) = 0;
  virtual RecvPipe& recvPipe(int peer) = 0;
  /// Best effort: tells every peer this rank failed (they report `text`), then stops sending.
  virtual void publishFailure(const std::string& text) = 0;
  /// Takes in what has arrived; returns a peer that sent a failure notice (and its text), or -1.
  virtual int findPeerFailure(std::string* text) = 0;
  /// Blocks until data may have arrived from a peer, or `timeout` passes.
  virtual void waitReadable(std::chrono::microseconds timeout) = 0;
  /// What this rank advertises, for logs ("eth0 169.254.1.1:40211").
  virtual const std::string& describeLocal() const = 0;
  /// Bytes of buffers held.
  virtual size_t memoryBytes() const = 0;
};

}  // namespace chorus::transport
