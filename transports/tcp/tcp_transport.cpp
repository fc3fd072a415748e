#include "transports/tcp/tcp_transport.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "base/error.hpp"
#include "base/log.hpp"
#include "transports/tcp/crc32c.hpp"
#include "transports/tcp/net_interfaces.hpp"

namespace chorus::transport {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kFrameData = 0x43484431;     // "CHD1"
constexpr uint32_t kFrameDataCrc = 0x43484332;  // "CHC2": data with a CRC-32C
constexpr uint32_t kFrameFailure = 0x43484633;  // "CHF3": the sender failed; payload is the reason
constexpr uint32_t kMaxFailureText = 4096;
constexpr char kHelloMagic[8] = {'C', 'H', 'O', 'R', 'U', 'S', 'N', '1'};

struct FrameHeader {
  uint32_t type;
  uint32_t length;
  uint32_t number;  // frame number (low 32 bits) in this direction
  uint32_t crc;
};
static_assert(sizeof(FrameHeader) == 16);

struct Hello {
  char magic[8];
  char comm[32];
  uint32_t rank;
  uint32_t stream;
};

void copyId(char (&dst)[32], const std::string& id) {
  std::memset(dst, 0, sizeof dst);
  std::memcpy(dst, id.data(), std::min(id.size(), sizeof dst));
}

}  // namespace

// ---- One peer: its sockets, both rings and the framing state --------------------------------------

class TcpConnection {
 public:
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

void TcpConnection::pushLocked() {
  if (sendShut_) return;
  {
    std::lock_guard lk(errMu_);
    if (!sendError_.empty()) return;
  }
  const size_t streams = out_.size();
  const uint64_t head = sendHead_.load(std::memory_order_acquire);
  for (;;) {
    bool progressed = false;
    // Deal new frames to idle streams, in order.
    for (;;) {
      OutFrame& f = out_[nextOutFrame_ % streams];
      const uint64_t avail = head - nextOutOffset_;
      if (f.active || avail == 0) break;
      f.length = static_cast<uint32_t>(std::min<uint64_t>(avail, frameBytes_));
      f.offset = nextOutOffset_;
      f.sent = 0;
      f.active = true;
      f.header.type = checksum_ ? kFrameDataCrc : kFrameData;
      f.header.length = f.length;
      f.header.number = static_cast<uint32_t>(nextOutFrame_);
      f.header.crc = 0;
      if (checksum_) {
        const size_t pos = static_cast<size_t>(f.offset % cap_);
        const size_t first = std::min<size_t>(f.length, cap_ - pos);
        f.header.crc = crc32c(crc32c(0, sendRing_.get() + pos, first), sendRing_.get(), f.length - first);
      }
      ++nextOutFrame_;
      nextOutOffset_ += f.length;
    }
    for (size_t s = 0; s < streams; ++s) {
      OutFrame& f = out_[s];
      if (!f.active) continue;
      iovec iov[3];
      int n = 0;
      if (f.sent < sizeof(FrameHeader)) {
        iov[n++] = {reinterpret_cast<char*>(&f.header) + f.sent, sizeof(FrameHeader) - f.sent};
      }
      const size_t payloadDone = f.sent > sizeof(FrameHeader) ? f.sent - sizeof(FrameHeader) : 0;
      const size_t pos = static_cast<size_t>((f.offset + payloadDone) % cap_);
      const size_t left = f.length - payloadDone;
      const size_t first = std::min(left, cap_ - pos);
      if (first) iov[n++] = {sendRing_.get() + pos, first};
      if (left > first) iov[n++] = {sendRing_.get(), left - first};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      const ssize_t w = ::sendmsg(socks_[s].get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        recordSendError(errno);
        return;
      }
      f.sent += static_cast<size_t>(w);
      progressed = progressed || w > 0;
      if (f.sent == sizeof(FrameHeader) + f.length) f.active = false;
    }
    if (!progressed) break;
  }
  // Bytes before the oldest frame still being sent are free again.
  uint64_t tail = nextOutOffset_;
  for (const OutFrame& f : out_) {
    if (f.active) tail = std::min(tail, f.offset);
  }
  sendTail_.store(tail, std::memory_order_release);
}

bool TcpConnection::startInFrame(InFrame& f) {
  const size_t s = static_cast<size_t>(nextInFrame_ % in_.size());
  const ssize_t r = ::recv(socks_[s].get(), reinterpret_cast<char*>(&f.header) + f.headerGot,
                           sizeof(FrameHeader) - f.headerGot, MSG_DONTWAIT);
  if (r == 0) {
    // No frame numbered nextInFrame_ will come: the peer sent everything before it and closed.
    // Frames still arriving on other streams are read to the end first (noteEnd()).
    if (f.headerGot > 0)
      setRecvBroken("the peer closed the connection in the middle of a message (it exited or was killed)");
    else
      peerEnded_ = true;
    return false;
  }
  if (r < 0) {
    noteRecvError();
    return false;
  }
  f.headerGot += static_cast<size_t>(r);
  if (f.headerGot < sizeof(FrameHeader)) return true;
  const FrameHeader& h = f.header;
  if (h.number != static_cast<uint32_t>(nextInFrame_)) {
    setRecvBroken(strCat("frame ", nextInFrame_, " arrived numbered ", h.number, " on stream ", s,
                         " (corrupt stream or mismatched peers)"));
    return false;
  }
  if (h.type == kFrameFailure) {
    if (h.length > kMaxFailureText) {
      setRecvBroken(strCat("failure notice of ", h.length, " bytes (at most ", kMaxFailureText, ")"));
      return false;
    }
    f.failureNotice = true;
  } else if (h.type == kFrameData || h.type == kFrameDataCrc) {
    if (h.length == 0 || h.length > frameBytes_) {
      setRecvBroken(strCat("frame ", nextInFrame_, " has length ", h.length, " (expected 1 to ", frameBytes_,
                           "; peers must agree on CHORUS_SOCKET_FRAME_BYTES)"));
      return false;
    }
    f.failureNotice = false;
  } else {
    setRecvBroken(strCat("frame ", nextInFrame_, " has unknown type 0x", std::hex, h.type,
                         " (not a Chorus peer, or a corrupt stream)"));
    return false;
  }
  return true;
}

bool TcpConnection::readPayload(size_t s, InFrame& f) {
  if (f.got < f.length) {
    ssize_t r;
    if (f.failureNotice) {
      f.text.resize(f.length);
      r = ::recv(socks_[s].get(), f.text.data() + f.got, f.length - f.got, MSG_DONTWAIT);
    } else {
      const size_t pos = static_cast<size_t>((f.offset + f.got) % cap_);
      const size_t left = f.length - f.got;
      const size_t first = std::min(left, cap_ - pos);
      iovec iov[2] = {{recvRing_.get() + pos, first}, {recvRing_.get(), left - first}};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = left > first ? 2 : 1;
      r = ::recvmsg(socks_[s].get(), &msg, MSG_DONTWAIT);
    }
    if (r == 0) {
      setRecvBroken("the peer closed the connection in the middle of a message (it exited or was killed)");
      return false;
    }
    if (r < 0) {
      noteRecvError();
      return false;
    }
    f.got += static_cast<uint32_t>(r);
    if (f.got < f.length) return true;
  }
  f.active = false;
  f.headerGot = 0;
  if (f.failureNotice) {
    failureText_ = f.text;
    if (state_.load() == kOpen) state_.store(kPeerFailed);
    return true;
  }
  if (f.header.type == kFrameDataCrc) {
    const size_t pos = static_cast<size_t>(f.offset % cap_);
    const size_t first = std::min<size_t>(f.length, cap_ - pos);
    const uint32_t crc = crc32c(crc32c(0, recvRing_.get() + pos, first), recvRing_.get(), f.length - first);
    if (crc != f.header.crc) {
      setRecvBroken(strCat("checksum mismatch in frame ", f.header.number, " (", f.length,
                           " bytes): data corrupted in transit"));
      return false;
    }
  }
  return true;
}

bool TcpConnection::pullHeaders() {
  const size_t streams = in_.size();
  bool progressed = false;
  // Start frames in order: frame k's header is read from stream k % streams.
  while (state_.load() == kOpen && !peerEnded_) {
    InFrame& f = in_[nextInFrame_ % streams];
    if (f.active) break;
    if (f.headerGot < sizeof(FrameHeader)) {
      const size_t before = f.headerGot;
      const bool ok = startInFrame(f);
      progressed = progressed || f.headerGot != before;
      if (!ok || f.headerGot < sizeof(FrameHeader)) break;
    }
    if (!f.failureNotice) {
      const uint64_t used = nextInOffset_ + f.header.length - recvTail_.load(std::memory_order_acquire);
      if (used > cap_) break;  // wait for the engine to consume
    }
    f.offset = nextInOffset_;
    f.length = f.header.length;
    f.got = 0;
    f.active = true;
    ++nextInFrame_;
    if (!f.failureNotice) nextInOffset_ += f.length;
    progressed = true;
  }
  noteEnd();
  return progressed;
}

void TcpConnection::publishHead() {
  uint64_t head = nextInOffset_;
  for (const InFrame& f : in_) {
    // A checksummed frame becomes visible only once verified.
    if (f.active && !f.failureNotice)
      head = std::min<uint64_t>(head, f.offset + (f.header.type == kFrameDataCrc ? 0 : f.got));
  }
  recvHead_.store(head, std::memory_order_release);
}

void TcpConnection::pull() {
  const size_t streams = in_.size();
  for (;;) {
    if (state_.load() != kOpen) break;
    bool progressed = pullHeaders();
    for (size_t s = 0; s < streams && state_.load() == kOpen; ++s) {
      InFrame& f = in_[s];
      if (!f.active) continue;
      const uint32_t before = f.got;
      readPayload(s, f);
      if (!f.active) progressed = true;
      progressed = progressed || f.got != before;
    }
    if (!progressed) break;
  }
  noteEnd();
  publishHead();
}

size_t TcpConnection::read(std::byte* dst, size_t n, size_t granule) {
  const uint64_t tail = recvTail_.load(std::memory_order_relaxed);
  if (recvHead_.load(std::memory_order_acquire) != tail) return 0;  // use peek() first
  pullHeaders();
  // The frame whose payload comes next in the stream, if it is being read and unchecked.
  InFrame* next = nullptr;
  size_t stream = 0;
  for (size_t s = 0; s < in_.size(); ++s) {
    InFrame& f = in_[s];
    if (f.active && !f.failureNotice && f.offset + f.got == tail) {
      next = &f;
      stream = s;
    }
  }
  if (!next || next->header.type == kFrameDataCrc) {
    // A checksummed frame is read through the ring (checked before use); otherwise nothing is
    // ready yet.
    if (next) pull();
    if (recvHead_.load(std::memory_order_acquire) == tail) throwIfRecvFailed();
    return 0;
  }
  InFrame& f = *next;
  const size_t want = std::min<size_t>(n, f.length - f.got);
  const ssize_t r = ::recv(socks_[stream].get(), dst, want, MSG_DONTWAIT);
  if (r == 0) {
    setRecvBroken("the peer closed the connection in the middle of a message (it exited or was killed)");
    throwIfRecvFailed();
  }
  if (r < 0) {
    noteRecvError();
    throwIfRecvFailed();
    return 0;
  }
  // Whole granules count; the bytes of a partial one also go to the ring, where the engine
  // finds them with the rest of that element.
  const auto got = static_cast<size_t>(r);
  const size_t whole = got - got % granule;
  for (size_t i = whole; i < got; ++i) recvRing_[static_cast<size_t>((tail + i) % cap_)] = dst[i];
  f.got += static_cast<uint32_t>(got);
  if (f.got == f.length) {
    f.active = false;
    f.headerGot = 0;
  }
  recvTail_.store(tail + whole, std::memory_order_release);
  publishHead();
  return whole;
}

size_t TcpConnection::write(const std::byte* data, size_t n, size_t granule) {
  throwIfSendFailed();
  std::lock_guard lk(sendMu_);
  if (sendShut_) return 0;
  pushLocked();
  const uint64_t head = sendHead_.load(std::memory_order_relaxed);
  OutFrame& f = out_[nextOutFrame_ % out_.size()];
  // In order: everything committed before must have been dealt into frames, and the stream of
  // the next frame must be free.
  if (nextOutOffset_ != head || f.active) return 0;
  const uint64_t used = head - sendTail_.load(std::memory_order_relaxed);
  size_t len = std::min<size_t>({n, frameBytes_, cap_ - static_cast<size_t>(used)});
  len -= len % granule;
  if (len == 0) return 0;
  f.header.type = checksum_ ? kFrameDataCrc : kFrameData;
  f.header.length = static_cast<uint32_t>(len);
  f.header.number = static_cast<uint32_t>(nextOutFrame_);
  f.header.crc = checksum_ ? crc32c(0, data, len) : 0;
  iovec iov[2] = {{&f.header, sizeof(FrameHeader)}, {const_cast<std::byte*>(data), len}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  const ssize_t w = ::sendmsg(socks_[nextOutFrame_ % out_.size()].get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (w <= 0) {
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) recordSendError(errno);
    return 0;
  }
  // The frame is on its way: what the socket did not take is copied to the ring, from where the
  // engine or the progress thread finishes it.
  f.offset = head;
  f.length = static_cast<uint32_t>(len);
  f.sent = static_cast<size_t>(w);
  f.active = f.sent < sizeof(FrameHeader) + len;
  const size_t payloadSent = f.sent > sizeof(FrameHeader) ? f.sent - sizeof(FrameHeader) : 0;
  for (size_t done = payloadSent; done < len;) {
    const size_t pos = static_cast<size_t>((head + done) % cap_);
    const size_t k = std::min(len - done, cap_ - pos);
    std::memcpy(sendRing_.get() + pos, data + done, k);
    done += k;
  }
  ++nextOutFrame_;
  nextOutOffset_ = head + len;
  sendHead_.store(head + len, std::memory_order_seq_cst);
  uint64_t tail = nextOutOffset_;
  for (const OutFrame& o : out_) {
    if (o.active) tail = std::min(tail, o.offset);
  }
  sendTail_.store(tail, std::memory_order_release);
  if (f.active && !armed_.load(std::memory_order_seq_cst)) requestHelp();
  return len;
}

void TcpConnection::sendFailure(const std::string& text, Clock::time_point deadline) {
  std::lock_guard lk(sendMu_);
  if (sendShut_) return;
  // The notice is the next frame; the frames already dealt must be finished first.
  const size_t streams = out_.size();
  auto anyActive = [&] { return std::any_of(out_.begin(), out_.end(), [](auto& o) { return o.active; }); };
  while (anyActive() && Clock::now() < deadline && !sendFailed()) pushLocked();
  if (!anyActive()) {
    const std::string body = text.substr(0, kMaxFailureText);
    FrameHeader h{kFrameFailure, static_cast<uint32_t>(body.size()), static_cast<uint32_t>(nextOutFrame_), 0};
    const std::span<const std::byte> parts[2] = {std::as_bytes(std::span(&h, 1)),
                                                 std::as_bytes(std::span(body))};
    try {
      net::setNonBlocking(socks_[nextOutFrame_ % streams].get(), false);
      net::sendAll(socks_[nextOutFrame_ % streams].get(), parts, deadline, "failure notice");
    } catch (const Error&) {
      // Best effort: the peer learns of the failure from the closed connection instead.
    }
  }
  for (auto& s : socks_) ::shutdown(s.get(), SHUT_WR);
  sendShut_ = true;
}

void TcpConnection::drain(Clock::time_point deadline) {
  std::unique_lock lk(sendMu_);
  while (!sendShut_) {
    pushLocked();
    {
      std::lock_guard e(errMu_);
      if (!sendError_.empty()) break;
    }
    if (sendTail_.load() == sendHead_.load() || Clock::now() >= deadline) break;
    std::vector<pollfd> fds;
    for (size_t s = 0; s < socks_.size(); ++s) {
      if (out_[s].active) fds.push_back({socks_[s].get(), POLLOUT, 0});
    }
    lk.unlock();
    ::poll(fds.data(), fds.size(), 10);
    lk.lock();
  }
  if (!sendShut_) {
    for (auto& s : socks_) ::shutdown(s.get(), SHUT_WR);
    sendShut_ = true;
  }
}

// ---- The transport -----------------------------------------------------------------------------

TcpTransport::TcpTransport(Store& store, int rank, int nranks, const std::vector<bool>& remote,
                           const TcpOptions& options)
    : options_(options) {
  if (options_.streams < 1) options_.streams = 1;
  // Multiples of 64 bytes (pipe.hpp's alignment contract: an element never straddles the wrap).
  options_.frameBytes = std::max<size_t>(64, options_.frameBytes & ~size_t{63});
  options_.ringBytes = std::max(options_.ringBytes & ~size_t{63}, 2 * options_.frameBytes);
  const auto deadline = Clock::now() + options_.timeout;
  const NetInterface iface =
      selectInterface(listInterfaces(), options_.ifname, options_.family, options_.allowLoopback);

  // Listen on the chosen address.
  net::SocketAddress bindAddr = iface.address;
  net::Fd listener(::socket(bindAddr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!listener) failSystem(strCat("rank ", rank, ": socket"));
  const int one = 1;
  setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listener.get(), bindAddr.get(), bindAddr.length) < 0) {
    fail(chorusSystemError,
         net::errnoText(strCat("rank ", rank, ": bind to ", iface.name, " ", addressText(bindAddr)), errno));
  }
  if (::listen(listener.get(), 1024) < 0) failSystem(strCat("rank ", rank, ": listen"));
  const uint16_t port = net::localAddress(listener.get()).port();
  local_ = strCat(iface.name, " ", net::formatHostPort(addressText(iface.address), port));
  store.setString(strCat("net/", rank), strCat(addressText(iface.address), " ", port));
  logInfo(Subsys::Net, "rank ", rank, ": TCP transport listening on ", local_, ", ", options_.streams,
          " stream(s) per peer");

  conns_.resize(static_cast<size_t>(nranks));
  std::vector<std::string> addresses(static_cast<size_t>(nranks));
  for (int p = 0; p < nranks; ++p) {
    if (p == rank || !remote[static_cast<size_t>(p)]) continue;
    const std::string text = store.getString(strCat("net/", p), options_.timeout);
    char host[128] = {0};
    unsigned portNum = 0;
    if (std::sscanf(text.c_str(), "%127s %u", host, &portNum) != 2 || portNum > 65535) {
      fail(chorusRemoteError,
           strCat("rank ", rank, ": malformed network address from rank ", p, ": '", text, "'"));
    }
    addresses[static_cast<size_t>(p)] = net::formatHostPort(host, static_cast<uint16_t>(portNum));
    conns_[static_cast<size_t>(p)] =
        std::make_unique<TcpConnection>(p, addresses[static_cast<size_t>(p)], options_);
    if (p < rank) continue;
    // This rank connects to the higher ranks (the kernel completes a connection before it is accepted).
    net::SocketAddress addr;
    if (!parseAddress(host, static_cast<uint16_t>(portNum), iface.index, &addr)) {
      fail(chorusRemoteError,
           strCat("rank ", rank, ": rank ", p, " advertised the address '", host, "', which is not numeric"));
    }
    for (int s = 0; s < options_.streams; ++s) {
      net::Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (!fd) failSystem(strCat("rank ", rank, ": socket"));
      net::setNonBlocking(fd.get(), true);
      int rc = ::connect(fd.get(), addr.get(), addr.length);
      if (rc < 0 && errno == EINPROGRESS) {
        pollfd pfd{fd.get(), POLLOUT, 0};
        rc = ::poll(&pfd, 1, net::pollTimeoutMs(deadline));
        int err = rc == 0 ? ETIMEDOUT : 0;
        socklen_t len = sizeof err;
        if (rc > 0) getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err ? -1 : 0;
        errno = err;
      }
      if (rc < 0) {
        fail(errno == ETIMEDOUT ? chorusTimeout : chorusSystemError,
             net::errnoText(strCat("rank ", rank, ": connecting to rank ", p, " at ",
                                   addresses[static_cast<size_t>(p)], " from ", local_),
                            errno));
      }
      net::setNonBlocking(fd.get(), false);
      Hello hello{};
      std::memcpy(hello.magic, kHelloMagic, 8);
      copyId(hello.comm, options_.commId);
      hello.rank = static_cast<uint32_t>(rank);
      hello.stream = static_cast<uint32_t>(s);
      net::sendAll(fd.get(), std::as_bytes(std::span(&hello, 1)), deadline,
                   strCat("rank ", rank, ": hello to rank ", p));
      conns_[static_cast<size_t>(p)]->socks_[static_cast<size_t>(s)] = std::move(fd);
    }
  }
  // Accept the lower remote ranks.
  size_t expected = 0;
  for (int p = 0; p < rank; ++p)
    expected += remote[static_cast<size_t>(p)] ? static_cast<size_t>(options_.streams) : 0;
  while (expected > 0) {
    pollfd pfd{listener.get(), POLLIN, 0};
    const int rc = ::poll(&pfd, 1, net::pollTimeoutMs(deadline));
    if (rc == 0 || Clock::now() >= deadline) {
      std::string missing;
      for (int p = 0; p < rank; ++p) {
        if (!conns_[static_cast<size_t>(p)]) continue;
        for (auto& s : conns_[static_cast<size_t>(p)]->socks_) {
          if (!s) {
            missing += strCat(missing.empty() ? "" : ", ", p);
            break;
          }
        }
      }
      fail(chorusTimeout, strCat("rank ", rank, ": timed out after ", options_.timeout.count(),
                                 " ms waiting for rank(s) ", missing, " to connect to ", local_));
    }
    net::Fd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      failSystem(strCat("rank ", rank, ": accept"));
    }
    Hello hello{};
    try {
      // A connection that says nothing is dropped after 5 s, not waited for until the deadline.
      net::recvAll(fd.get(), std::as_writable_bytes(std::span(&hello, 1)),
                   std::min(deadline, Clock::now() + std::chrono::seconds(5)),
                   strCat("rank ", rank, ": hello"));
    } catch (const Error& e) {
      logWarn("rank ", rank, ": dropped an incoming connection: ", e.what());
      continue;
    }
    char id[32];
    copyId(id, options_.commId);
    const int p = static_cast<int>(hello.rank);
    if (std::memcmp(hello.magic, kHelloMagic, 8) != 0 || std::memcmp(hello.comm, id, 32) != 0 || p < 0 ||
        p >= rank || !conns_[static_cast<size_t>(p)] ||
        hello.stream >= static_cast<uint32_t>(options_.streams) ||
        conns_[static_cast<size_t>(p)]->socks_[hello.stream]) {
      logWarn("rank ", rank, ": refused a connection from ", net::peerAddress(fd.get()).toString(),
              " (not an expected rank of this communicator)");
      continue;
    }
    conns_[static_cast<size_t>(p)]->socks_[hello.stream] = std::move(fd);
    --expected;
  }

  // All sockets non-blocking, without Nagle; the progress thread watches them for writability.
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  event_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_ || !event_) failSystem(strCat("rank ", rank, ": epoll/eventfd"));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = ~uint64_t{0};
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, event_.get(), &ev);
  for (auto& c : conns_) {
    if (!c) continue;
    for (auto& s : c->socks_) {
      net::setNonBlocking(s.get(), true);
      net::setNoDelay(s.get());
      epoll_event e{};
      e.events = 0;
      e.data.u64 = static_cast<uint64_t>(c->peer());
      epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, s.get(), &e);
    }
    TcpConnection* conn = c.get();
    c->requestHelp = [this, conn] {
      conn->armRequested_.store(true);
      wakeProgress();
    };
  }
  progress_ = std::thread([this] { progressLoop(); });
}

TcpTransport::~TcpTransport() {
  stop_.store(true);
  wakeProgress();
  if (progress_.joinable()) progress_.join();
  const auto deadline =
      Clock::now() + std::min<std::chrono::milliseconds>(options_.timeout, std::chrono::seconds(30));
  for (auto& c : conns_) {
    if (c) c->drain(deadline);
  }
}

void TcpTransport::wakeProgress() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(event_.get(), &one, sizeof one);
}

void TcpTransport::progressLoop() {
  std::vector<epoll_event> events(64);
  // Watch exactly the streams that have a frame to finish: an idle stream is always writable.
  auto watch = [&](TcpConnection& c, uint64_t mask) {
    for (size_t s = 0; s < c.socks_.size(); ++s) {
      const uint64_t bit = uint64_t{1} << s;
      if ((c.watched_ & bit) == (mask & bit)) continue;
      epoll_event e{};
      e.events = (mask & bit) ? static_cast<uint32_t>(EPOLLOUT) : 0u;
      e.data.u64 = static_cast<uint64_t>(c.peer());
      epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.socks_[s].get(), &e);
    }
    c.watched_ = mask;
  };
  auto service = [&](TcpConnection& c) {
    uint64_t mask = c.push();
    if (mask == 0) {
      watch(c, 0);
      // Re-check after disarming: the engine may have committed more while it saw us armed.
      c.armed_.store(false, std::memory_order_seq_cst);
      if (!c.sendPending() || c.armed_.exchange(true)) return;
      mask = c.push();
      if (mask == 0) {
        c.armed_.store(false, std::memory_order_seq_cst);
        return;
      }
    }
    watch(c, mask);
  };
  while (!stop_.load()) {
    const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), 1000);
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[static_cast<size_t>(i)].data.u64;
      if (key == ~uint64_t{0}) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(event_.get(), &v, sizeof v);
        for (auto& c : conns_) {
          if (c && c->armRequested_.exchange(false) && !c->dead_) {
            c->armed_.store(true);
            service(*c);
          }
        }
        continue;
      }
      TcpConnection& c = *conns_[static_cast<size_t>(key)];
      if (events[static_cast<size_t>(i)].events & (EPOLLERR | EPOLLHUP)) {
        // A dead connection: stop watching it for good (the engine reports the error when it
        // next uses it; a push now would only fail).
        for (auto& sock : c.socks_) epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, sock.get(), nullptr);
        c.dead_ = true;
        c.watched_ = 0;
        continue;
      }
      service(c);
    }
  }
}

SendPipe& TcpTransport::sendPipe(int peer) { return conns_[static_cast<size_t>(peer)]->sendPipe(); }
RecvPipe& TcpTransport::recvPipe(int peer) { return conns_[static_cast<size_t>(peer)]->recvPipe(); }

void TcpTransport::publishFailure(chorusResult_t, const std::string& text) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(200);
  for (auto& c : conns_) {
    if (c) c->sendFailure(text, deadline);
  }
}

int TcpTransport::findPeerFailure(chorusResult_t* code, std::string* text) {
  *code = chorusRemoteError;  // the notices carry the text only
  for (auto& c : conns_) {
    if (!c) continue;
    c->pull();
    if (c->peerFailed(text)) return c->peer();
  }
  return -1;
}

bool TcpTransport::waitReadable(std::chrono::microseconds timeout) {
  std::vector<pollfd> fds;
  std::vector<std::pair<TcpConnection*, size_t>> owners;  // connection, its number of fds
  for (auto& c : conns_) {
    if (!c) continue;
    if (size_t n = c->addPollFds(fds)) owners.emplace_back(c.get(), n);
  }
  if (fds.empty()) {
    std::this_thread::sleep_for(timeout);
    return true;
  }
  // poll() has millisecond resolution; ppoll takes the sleep as given.
  timespec ts{0, static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count())};
  if (::ppoll(fds.data(), fds.size(), &ts, nullptr) <= 0) return true;
  // Take in what arrived, also for peers no transfer reads right now: their rings fill and stop
  // being waited on, instead of making every later wait return at once.
  size_t at = 0;
  for (auto& [conn, n] : owners) {
    bool ready = false;
    for (size_t i = at; i < at + n; ++i) ready = ready || fds[i].revents != 0;
    at += n;
    if (ready) conn->pull();
  }
  return true;
}

size_t TcpTransport::memoryBytes() const {
  size_t total = 0;
  for (const auto& c : conns_) total += c ? c->ringBytes() : 0;
  return total;
}

}  // namespace chorus::transport
