// The engine's unit of work: a message to or from one peer over that peer's pipe.
//
// Algorithms describe a step as a list of Transfers and runTransfers() drives them all at once,
// copying or reducing straight between user/scratch buffers and the pipes. Transfers on the same
// pipe run in list order; a Send may be bound to the progress of another transfer (`waitFor`),
// which is how ring and chain algorithms forward bytes as soon as they arrive (pipelining at the
// granularity of whatever the pipe holds, with no extra copies).
//
// Framing: each message is an 8-byte header (tag, length) + payload + padding to 8 bytes, so every
// message starts 8-aligned in the stream. A receiver that expects a different length or tag fails
// with an error naming the peer instead of corrupting data.
//
// Single copy: where the pipe offers it (SendPipe::inPlaceMinBytes: shared memory between ranks
// that may read each other's memory), a Send of at least that many bytes whose data is all there
// (no `waitFor`) goes as its header, flagged, and the payload's address in its place; the receiver
// copies (or reduces) the payload straight from the sender's buffer and tells the sender, whose
// transfer completes then. One copy per byte instead of two, and no pipe-sized pipelining.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "chorus/chorus.hpp"
#include "engine/waiter.hpp"
#include "transports/pipe.hpp"

namespace chorus::engine {

enum class TransferKind : uint8_t { Send, Recv, RecvReduce };

struct Transfer {
  TransferKind kind = TransferKind::Send;
  int peer = -1;
  size_t bytes = 0;
  /// Send: the data. RecvReduce: the local operand (may equal dst).
  const std::byte* src = nullptr;
  /// Recv: where the data lands. RecvReduce: where src (op) incoming lands.
  std::byte* dst = nullptr;
  /// Granularity of partial progress (the element size; 1 for raw bytes).
  size_t elemSize = 1;
  DataType dtype = DataType::Uint8;
  ReduceOp op = ReduceOp::Sum;
  int avgDivisor = 0;
  /// Send only: index (in the same list) of a transfer whose completed bytes bound this one's.
  int waitFor = -1;
  /// Tag both sides must agree on (which operation the message belongs to).
  uint16_t tag = 0;

  // Progress, owned by the engine.
  size_t done = 0;
  /// 0 header, 1 payload, 2 padding, 3 complete; single copy: 4 the payload's address, 5 (a send)
  /// waiting for the receiver to have copied it.
  uint8_t phase = 0;
  uint64_t ticket = 0;  // a send by address: its number on the pipe (SendPipe::postInPlace)
  bool complete() const { return phase == 3; }

  static Transfer send(int peer, const void* data, size_t bytes, size_t elemSize, uint16_t tag) {
    Transfer t;
    t.kind = TransferKind::Send;
    t.peer = peer;
    t.src = static_cast<const std::byte*>(data);
    t.bytes = bytes;
    t.elemSize = elemSize;
    t.tag = tag;
    return t;
  }
  static Transfer recv(int peer, void* data, size_t bytes, size_t elemSize, uint16_t tag) {
    Transfer t;
    t.kind = TransferKind::Recv;
    t.peer = peer;
    t.dst = static_cast<std::byte*>(data);
    t.bytes = bytes;
    t.elemSize = elemSize;
    t.tag = tag;
    return t;
  }
  static Transfer recvReduce(int peer, void* dst, const void* local, size_t bytes, DataType type, ReduceOp op,
                             int avgDivisor, uint16_t tag);
};

/// The 8-byte message header: the tag (salted) in the top 16 bits, then whether the payload is
/// sent by address (one bit), the payload length in the low 47.
struct MessageHeader {
  static constexpr uint64_t kLengthBits = 48;
  static constexpr uint64_t kByAddress = uint64_t{1} << 47;
  static constexpr uint64_t kLengthMask = kByAddress - 1;
  static constexpr uint16_t kTagSalt = 0xC3A5;

  uint16_t tag = 0;
  size_t length = 0;  // < 2^47
  bool byAddress = false;

  /// Lengths are truncated to 47 bits (a message is never that large).
  static uint64_t encode(uint16_t tag, size_t bytes, bool byAddress = false) {
    return (uint64_t{static_cast<uint16_t>(tag ^ kTagSalt)} << kLengthBits) | (byAddress ? kByAddress : 0) |
           (bytes & kLengthMask);
  }
  /// Any 64-bit value decodes; the receiver compares the result with what it expects.
  static MessageHeader decode(uint64_t h) {
    return {static_cast<uint16_t>((h >> kLengthBits) ^ kTagSalt), static_cast<size_t>(h & kLengthMask),
            (h & kByAddress) != 0};
  }
};

/// Where the pipes of the peers are.
class PipeSet {
 public:
  virtual ~PipeSet() = default;
  virtual transport::SendPipe& sendPipe(int peer) = 0;
  virtual transport::RecvPipe& recvPipe(int peer) = 0;
};

/// Runs every transfer to completion. Transfers to/from `self` are matched in order (send with
/// recv) and done by local copy. `what` names the operation in errors ("allreduce #12 (ring)").
void runTransfers(std::span<Transfer> transfers, PipeSet& pipes, int self, Waiter& waiter,
                  const std::function<std::string()>& what);

}  // namespace chorus::engine
