#include "transports/tcp/tcp_connection.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>

#include "transports/tcp/crc32c.hpp"

namespace chorus::transport {

namespace {

constexpr uint32_t kFrameData = 0x43484431;     // "CHD1"
constexpr uint32_t kFrameDataCrc = 0x43484332;  // "CHC2": data with a CRC-32C
constexpr uint32_t kFrameFailure = 0x43484633;  // "CHF3": the sender failed; payload is the reason
constexpr uint32_t kMaxFailureText = 4096;

}  // namespace

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

}  // namespace chorus::transport
