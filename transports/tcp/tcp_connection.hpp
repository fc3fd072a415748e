// One peer of the TCP transport: its sockets, both rings and the framing state (tcp_transport.hpp
// describes the framing, the progress thread and how failures are reported).
#pragma once

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "base/socket_util.hpp"
#include "transports/tcp/tcp_transport.hpp"
#include "transports/transport.hpp"

namespace chorus::transport {

class TcpConnection {
 public:
  using Clock = std::chrono::steady_clock;

  TcpConnection(int peer, std::string peerAddress, const TcpOptions& o)
      : peer_(peer),
        peerAddress_(std::move(peerAddress)),
        cap_(o.ringBytes),
        frameBytes_(o.frameBytes),
        checksum_(o.checksum),
        sendRing_(new std::byte[o.ringBytes]),
        recvRing_(new std::byte[o.ringBytes]),
        out_(static_cast<size_t>(o.streams)),
        in_(static_cast<size_t>(o.streams)),
        sendSide_(*this),
        recvSide_(*this) {
    socks_.resize(static_cast<size_t>(o.streams));
  }

  std::vector<net::Fd> socks_;

  SendPipe& sendPipe() { return sendSide_; }
  RecvPipe& recvPipe() { return recvSide_; }
  size_t ringBytes() const { return 2 * cap_; }
  int peer() const { return peer_; }

  /// Sends what it can without blocking. Called by the engine thread (try-lock) and the progress
  /// thread. Never throws: a socket error is recorded and reported to the engine.
  /// Pushes; returns the streams that still have a frame to finish (bit s for stream s).
  uint64_t push() {
    std::lock_guard lk(sendMu_);
    pushLocked();
    if (sendShut_ || sendFailed()) return 0;  // nothing more will leave: stop watching
    uint64_t mask = 0;
    for (size_t s = 0; s < out_.size(); ++s) mask |= out_[s].active ? uint64_t{1} << s : 0;
    return mask;
  }
  /// Which streams the progress thread watches for writability (its own state).
  uint64_t watched_ = 0;
  /// Set by the progress thread when a socket reported an error or hang-up: it no longer watches
  /// this connection (epoll reports those conditions whatever the interest, so it must let go).
  bool dead_ = false;
  void tryPush() {
    if (sendMu_.try_lock()) {
      pushLocked();
      sendMu_.unlock();
    }
  }
  bool sendPending() const {
    return sendTail_.load(std::memory_order_acquire) != sendHead_.load(std::memory_order_seq_cst);
  }
  /// Progress-thread arming: true when the engine asked for help and the thread has not yet
  /// registered interest in the sockets being writable.
  std::atomic<bool> armed_{false};
  std::atomic<bool> armRequested_{false};

  /// Reads what it can without blocking (engine thread only). Never throws.
  void pull();
  /// True when the receive ring can take another frame (worth waiting for readability).
  /// The sockets worth waiting on (engine thread): those of frames being read, and the one the
  /// next header comes from if the ring has room for its frame. Returns how many it added.
  size_t addPollFds(std::vector<pollfd>& fds) const {
    if (state_.load() != kOpen) return 0;
    const size_t before = fds.size();
    const size_t next = static_cast<size_t>(nextInFrame_ % in_.size());
    for (size_t s = 0; s < in_.size(); ++s) {
      const bool room = nextInOffset_ + frameBytes_ - recvTail_.load(std::memory_order_relaxed) <= cap_;
      if (in_[s].active || (s == next && !peerEnded_ && room)) fds.push_back({socks_[s].get(), POLLIN, 0});
    }
    return fds.size() - before;
  }
  /// The failure notice this peer sent, if any.
  bool peerFailed(std::string* text) const {
    if (state_.load() != kPeerFailed) return false;
    *text = failureText_;
    return true;
  }

  /// Best effort, bounded by `deadline`: sends the failure notice, then shuts the sending side.
  void sendFailure(const std::string& text, Clock::time_point deadline);
  /// Pushes everything committed (until `deadline`), then shuts down the sending side.
  void drain(Clock::time_point deadline);

  /// Set by the engine side to ask the progress thread to finish a push.
  std::function<void()> requestHelp;

 private:
  enum State : int { kOpen, kClosed, kPeerFailed, kBroken };
  struct FrameHeader {
    uint32_t type;
    uint32_t length;
    uint32_t number;  // frame number (low 32 bits) in this direction
    uint32_t crc;
  };
  static_assert(sizeof(FrameHeader) == 16);

  class SendSide final : public SendPipe {
   public:
    explicit SendSide(TcpConnection& c) : c_(c) {}
    std::span<std::byte> reserve() override { return c_.reserve(); }
    void commit(size_t n) override { c_.commit(n); }
    void flush() override { c_.flush(); }
    bool direct() const override { return true; }
    size_t write(const std::byte* data, size_t n, size_t granule) override {
      return c_.write(data, n, granule);
    }

   private:
    TcpConnection& c_;
  };
  class RecvSide final : public RecvPipe {
   public:
    explicit RecvSide(TcpConnection& c) : c_(c) {}
    std::span<const std::byte> peek() override { return c_.peek(); }
    void consume(size_t n) override { c_.consume(n); }
    bool direct() const override { return true; }
    size_t read(std::byte* dst, size_t n, size_t granule) override { return c_.read(dst, n, granule); }

   private:
    TcpConnection& c_;
  };

  struct OutFrame {
    FrameHeader header{};
    uint64_t offset = 0;  // stream position of the payload
    uint32_t length = 0;
    size_t sent = 0;  // header and payload bytes written
    bool active = false;
  };
  struct InFrame {
    FrameHeader header{};
    size_t headerGot = 0;
    uint64_t offset = 0;
    uint32_t length = 0;
    uint32_t got = 0;
    bool active = false;
    bool failureNotice = false;
    std::string text;
  };

  std::span<std::byte> reserve() {
    throwIfSendFailed();
    const uint64_t head = sendHead_.load(std::memory_order_relaxed);
    uint64_t used = head - sendTail_.load(std::memory_order_acquire);
    if (cap_ - used < 64) {
      tryPush();
      used = head - sendTail_.load(std::memory_order_acquire);
    }
    const size_t pos = static_cast<size_t>(head % cap_);
    const size_t n = std::min<size_t>(cap_ - used, cap_ - pos);
    return {sendRing_.get() + pos, n};
  }
  void commit(size_t n) {
    sendHead_.store(sendHead_.load(std::memory_order_relaxed) + n, std::memory_order_seq_cst);
  }
  void flush() {
    tryPush();
    if (sendPending() && !armed_.load(std::memory_order_seq_cst)) requestHelp();
  }
  size_t write(const std::byte* data, size_t n, size_t granule);
  size_t read(std::byte* dst, size_t n, size_t granule);
  std::span<const std::byte> peek() {
    const uint64_t tail = recvTail_.load(std::memory_order_relaxed);
    uint64_t head = recvHead_.load(std::memory_order_acquire);
    // Less than a header or an element: read more (the engine cannot use a partial one).
    if (head - tail < 8) {
      pull();
      head = recvHead_.load(std::memory_order_acquire);
      if (head == tail) throwIfRecvFailed();
    }
    const size_t pos = static_cast<size_t>(tail % cap_);
    return {recvRing_.get() + pos, std::min<size_t>(static_cast<size_t>(head - tail), cap_ - pos)};
  }
  void consume(size_t n) {
    recvTail_.store(recvTail_.load(std::memory_order_relaxed) + n, std::memory_order_release);
  }

  void pushLocked();
  bool sendFailed() {
    std::lock_guard lk(errMu_);
    return !sendError_.empty();
  }
  void recordSendError(int err) {
    std::lock_guard lk(errMu_);
    if (sendError_.empty()) sendError_ = net::errnoText("send", err);
  }
  void throwIfSendFailed() {
    std::lock_guard lk(errMu_);
    if (!sendError_.empty()) {
      throw PeerError(chorusRemoteError,
                      strCat("the connection to rank ", peer_, " (", peerAddress_, ") failed: ", sendError_,
                             "; rank ", peer_, " exited, was killed or failed"));
    }
  }
  void throwIfRecvFailed() {
    switch (state_.load()) {
      case kOpen:
        return;
      case kPeerFailed:
        throw PeerError(chorusRemoteError, strCat("rank ", peer_, " failed: ", failureText_));
      case kClosed:
        throw PeerError(chorusRemoteError,
                        strCat("rank ", peer_, " (", peerAddress_,
                               ") closed its connection while this rank expected data from it: it exited, ",
                               "was killed or destroyed the communicator"));
      default:
        throw PeerError(chorusRemoteError, strCat("the connection from rank ", peer_, " (", peerAddress_,
                                                  ") broke: ", recvError_));
    }
  }
  /// After a recv() that returned -1: nothing to read yet, or the connection is broken.
  void noteRecvError() {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      setRecvBroken(net::errnoText("recv", errno));
  }
  void setRecvBroken(std::string why) {
    if (state_.load() != kOpen) return;
    recvError_ = std::move(why);
    state_.store(kBroken);
  }
  bool startInFrame(InFrame& f);
  /// Reads frame headers (in order) without payloads; returns whether any byte was read.
  bool pullHeaders();
  /// Once the peer closed and every frame it sent has arrived, the connection is closed.
  void noteEnd() {
    if (peerEnded_ && state_.load() == kOpen &&
        std::none_of(in_.begin(), in_.end(), [](auto& x) { return x.active; }))
      state_.store(kClosed);
  }
  /// Publishes how far the ring holds contiguous, usable bytes.
  void publishHead();
  bool readPayload(size_t s, InFrame& f);

  const int peer_;
  const std::string peerAddress_;
  const size_t cap_;
  const size_t frameBytes_;
  const bool checksum_;
  std::unique_ptr<std::byte[]> sendRing_;
  std::unique_ptr<std::byte[]> recvRing_;

  // Send side. sendHead_: written by the engine. sendTail_: by whoever holds sendMu_.
  std::mutex sendMu_;
  std::atomic<uint64_t> sendHead_{0};
  std::atomic<uint64_t> sendTail_{0};
  std::vector<OutFrame> out_;  // per stream, under sendMu_
  uint64_t nextOutFrame_ = 0;
  uint64_t nextOutOffset_ = 0;
  bool sendShut_ = false;
  std::mutex errMu_;
  std::string sendError_;

  // Receive side: the engine thread only.
  std::atomic<uint64_t> recvHead_{0};
  std::atomic<uint64_t> recvTail_{0};
  std::vector<InFrame> in_;
  uint64_t nextInFrame_ = 0;
  uint64_t nextInOffset_ = 0;
  std::atomic<int> state_{kOpen};
  bool peerEnded_ = false;  // EOF where the next frame's header was due
  std::string failureText_;
  std::string recvError_;

  SendSide sendSide_;
  RecvSide recvSide_;
};

}  // namespace chorus::transport
