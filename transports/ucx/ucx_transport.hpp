// The UCX transport: pipes to ranks on other hosts over UCP streams (UCX picks the wire: rc, ud,
// dc on RDMA hardware; tcp, or shared memory where the "hosts" share a machine).
//
// One UCP worker per communicator, one endpoint per remote peer, created from worker addresses
// exchanged through the store. Each pipe direction is a ring buffer in this process, as with TCP:
// the engine writes into the send ring and a flush hands the committed bytes to
// ucp_stream_send_nbx; the receive ring always has one ucp_stream_recv_nbx posted into its free
// space (in 8-byte elements, so a received span never splits an element). Failure notices and the
// init handshake travel as tagged messages beside the streams.
//
// UCX is loaded at run time (ucx_api.hpp). Its worker is used from the engine's thread and from one
// progress thread (which completes sends the engine already considers done), serialised by a mutex.
//
// Failures: an endpoint error (the peer exited, was killed, or its host went away) makes the next
// read from that peer, once everything that arrived before has been read, throw PeerError naming
// the rank; a failure notice is reported by findPeerFailure.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/store.hpp"
#include "transports/transport.hpp"

namespace chorus::transport {

struct UcxOptions {
  std::string commId;                    // checked in the init handshake
  size_t ringBytes = size_t{512} << 10;  // per direction and peer
  std::chrono::milliseconds timeout{300'000};
  /// UCX_TLS for this worker ("" keeps UCX's own choice and the UCX_TLS environment variable).
  std::string tls;
};

/// Whether UCX can be loaded here; if not, why (for logs and CHORUS_NET=ucx errors).
bool ucxAvailable(std::string* why);

class UcxTransport final : public Transport {
 public:
  /// Collective over every rank r with peers[r] true (and this rank): creates the worker,
  /// publishes its address ("ucx/<rank>"), connects to each peer and exchanges a hello with it.
  /// Throws chorus::Error naming the missing or failing peers.
  UcxTransport(Store& store, int rank, int nranks, const std::vector<bool>& peers, const UcxOptions& options);
  /// Completes what the engine committed (bounded by the timeout), then closes every endpoint.
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  const char* name() const override { return "ucx"; }
  SendPipe& sendPipe(int peer) override;
  RecvPipe& recvPipe(int peer) override;
  void publishFailure(chorusResult_t code, const std::string& text) override;
  int findPeerFailure(chorusResult_t* code, std::string* text) override;
  bool waitReadable(std::chrono::microseconds timeout) override;
  const std::string& describeLocal() const override { return local_; }
  size_t memoryBytes() const override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::string local_;
};

}  // namespace chorus::transport
