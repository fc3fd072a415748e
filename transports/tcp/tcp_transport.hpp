// The TCP transport: pipes to ranks on other hosts over one or more TCP streams per pair of ranks.
//
// Each pair of ranks on different hosts shares `streams` sockets (both directions on each). A pipe
// is a ring buffer in this process: the engine writes into the send ring and reads from the
// receive ring exactly as it does with a shared-memory FIFO; the sockets move bytes between the
// rings of the two ranks.
//
// Framing: the sender cuts what the engine committed into frames of at most `frameBytes` and deals
// them to the streams in turn (frame k on stream k % streams). A frame is a 16-byte header (type,
// length, frame number, optional CRC-32C of the payload) and the payload. The receiver reads frame
// k from stream k % streams into ring position (sum of earlier lengths), so the frames of several
// streams land in parallel and in order; a header with a wrong type, number or length, or a
// payload whose checksum differs, fails with an error naming the peer.
//
// Progress: the engine pushes from its own thread on every commit (no hand-off on the latency
// path) and pulls when it finds the receive ring empty. What it cannot push because the socket is
// full is pushed by one progress thread per transport (epoll on the sockets that have data left,
// woken through an eventfd), so a message the engine considers sent always reaches the peer even
// if this rank stops calling the library.
//
// Failures: a peer that closes or resets its sockets while this rank expects data from it, or
// that sends a failure notice (publishFailure), makes the engine's next read from it throw
// chorus::Error naming that rank and its address.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/socket_util.hpp"
#include "chorus/chorus.hpp"
#include "chorus/store.hpp"
#include "transports/transport.hpp"

namespace chorus::transport {

struct TcpOptions {
  std::string commId;  // the communicator's random id: connections of other communicators are refused
  int streams = 1;     // sockets per pair of ranks
  size_t ringBytes = size_t{512} << 10;  // per direction and peer (at least 2 frames)
  size_t frameBytes = size_t{256} << 10;
  bool checksum = false;
  std::string ifname;  // CHORUS_SOCKET_IFNAME filter
  int family = 0;      // AF_UNSPEC, AF_INET or AF_INET6
  std::chrono::milliseconds timeout{300'000};
  /// Tests only: accept the loopback interface (never advertised to another host otherwise).
  bool allowLoopback = false;
  /// Tests and measurements with every peer on this host (Config::transport "tcp"): listen on a
  /// loopback address only; `ifname` does not apply.
  bool loopbackOnly = false;
};

class TcpConnection;
struct NetInterface;

class TcpTransport final : public Transport {
 public:
  /// Collective over every rank r with remote[r] true (and this rank): listens on the selected
  /// interface, publishes the address in `store` ("net/<rank>"), connects to the higher remote
  /// ranks and accepts the lower ones. Throws chorus::Error naming the peer on failure or timeout.
  TcpTransport(Store& store, int rank, int nranks, const std::vector<bool>& remote,
               const TcpOptions& options);
  /// Flushes what the engine committed (bounded by the timeout), then closes every socket.
  ~TcpTransport() override;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  const char* name() const override { return "tcp"; }
  SendPipe& sendPipe(int peer) override;
  RecvPipe& recvPipe(int peer) override;
  bool connected(int peer) const { return conns_[static_cast<size_t>(peer)] != nullptr; }

  /// Best effort: tells every peer this rank failed (they report `text`), then stops sending.
  void publishFailure(chorusResult_t code, const std::string& text) override;
  /// Reads what has arrived on every connection; returns a peer that sent a failure notice (and
  /// its text), or -1.
  int findPeerFailure(chorusResult_t* code, std::string* text) override;
  /// Blocks until a socket with room in its receive ring is readable, or `timeout` passes.
  bool waitReadable(std::chrono::microseconds timeout) override;

  /// "eth0 169.254.1.1:40211" (the interface and address this rank advertises).
  const std::string& describeLocal() const override { return local_; }
  /// Bytes of ring buffers held.
  size_t memoryBytes() const override;
  int streams() const { return options_.streams; }

 private:
  using Clock = std::chrono::steady_clock;

  // The constructor's phases, in order.
  /// Listens on `iface`, publishes the address in the store ("net/<rank>") and sets local_.
  net::Fd listen(Store& store, int rank, const NetInterface& iface);
  /// Reads each remote rank's address and makes its connection; connects to the higher ranks.
  void connectAll(Store& store, int rank, int nranks, const std::vector<bool>& remote,
                  const NetInterface& iface, Clock::time_point deadline);
  /// One stream to rank `p`: connects, then says hello (this rank, stream `s`).
  net::Fd connectStream(const net::SocketAddress& addr, int rank, int p, int s, const std::string& address,
                        Clock::time_point deadline);
  /// Accepts every stream of the lower remote ranks.
  void acceptAll(const net::Fd& listener, int rank, const std::vector<bool>& remote,
                 Clock::time_point deadline);
  /// Sets the sockets up for the progress thread and starts it.
  void startProgress(int rank);

  void progressLoop();
  void wakeProgress();

  TcpOptions options_;
  std::string local_;
  std::vector<std::unique_ptr<TcpConnection>> conns_;  // by rank; null where not remote
  net::Fd epoll_;
  net::Fd event_;
  std::atomic<bool> stop_{false};
  std::thread progress_;
};

}  // namespace chorus::transport
