// The transport interface the engine drives: a one-directional byte pipe to one peer.
//
// Each pipe carries a stream of messages framed by the engine (src/engine/transfer.cpp). Pipes are
// polled, never blocking: the engine progresses many pipes at once and decides how to wait.
//
// Alignment contract: the capacity of a pipe's buffer is a multiple of 64 bytes and the engine
// only ever commits/consumes whole elements and starts every message at a multiple of 8 bytes of
// the stream, so a span returned by reserve()/peek() never splits an element of size <= 8.
#pragma once

#include <cstddef>
#include <span>

namespace chorus::transport {

class SendPipe {
 public:
  virtual ~SendPipe() = default;
  /// Contiguous writable space (possibly empty when the pipe is full). Valid until commit().
  virtual std::span<std::byte> reserve() = 0;
  /// Publishes the first n bytes written into the last reserve() span (n <= its size).
  virtual void commit(size_t n) = 0;
};

class RecvPipe {
 public:
  virtual ~RecvPipe() = default;
  /// Contiguous readable bytes (possibly empty). Valid until consume().
  virtual std::span<const std::byte> peek() = 0;
  /// Releases the first n bytes of the last peek() span back to the sender (n <= its size).
  virtual void consume(size_t n) = 0;
};

}  // namespace chorus::transport
