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
#include <cstdint>
#include <span>

namespace chorus::transport {

class SendPipe {
 public:
  virtual ~SendPipe() = default;
  /// Contiguous writable space (possibly empty when the pipe is full). Valid until commit().
  virtual std::span<std::byte> reserve() = 0;
  /// Publishes the first n bytes written into the last reserve() span (n <= its size).
  virtual void commit(size_t n) = 0;
  /// Committed bytes may wait in this process until flush() (a transport that batches small
  /// commits into one network message); the engine flushes after every step that committed.
  virtual void flush() {}
  /// Whether write() can send straight from the caller's memory (a socket), sparing the copy
  /// through reserve()/commit(). The engine then sends large payloads with write() only.
  virtual bool direct() const { return false; }
  /// Takes up to n bytes (a multiple of `granule`, which it keeps) straight from `data`; returns
  /// how many it took, 0 when it cannot now (the caller retries later).
  virtual size_t write(const std::byte* data, size_t n, size_t granule) {
    (void)data, (void)n, (void)granule;
    return 0;
  }
  /// Single copy: where the receiver can read this process's memory in place (shared memory
  /// between ranks whose processes may read each other, shm_group.hpp), the smallest payload the
  /// engine may send as its address, which the receiver then copies from (RecvPipe::readInPlace);
  /// 0: never. Such a payload must stay untouched until inPlaceReadsDone() counts it.
  virtual size_t inPlaceMinBytes() const { return 0; }
  /// Numbers the next payload sent by address on this pipe (1, 2, ...).
  virtual uint64_t postInPlace() { return 0; }
  /// How many payloads sent by address the receiver has finished copying (acquire).
  virtual uint64_t inPlaceReadsDone() const { return 0; }
};

class RecvPipe {
 public:
  virtual ~RecvPipe() = default;
  /// Contiguous readable bytes (possibly empty). Valid until consume().
  virtual std::span<const std::byte> peek() = 0;
  /// Releases the first n bytes of the last peek() span back to the sender (n <= its size).
  virtual void consume(size_t n) = 0;
  /// Whether read() can receive straight into the caller's memory.
  virtual bool direct() const { return false; }
  /// Only when peek() is empty: receives up to n bytes (a multiple of `granule`) straight into
  /// `dst`; returns how many, 0 when none are ready.
  virtual size_t read(std::byte* dst, size_t n, size_t granule) {
    (void)dst, (void)n, (void)granule;
    return 0;
  }
  /// Copies `bytes` from address `remote` of the sender's memory (a payload it sent by address)
  /// to `dst`; false where this pipe cannot, whatever `bytes` (0 included: the engine asks so, and
  /// reports the stream as corrupt). Throws
  /// chorus::Error naming the sender where the system refuses the read.
  virtual bool readInPlace(std::byte* dst, uint64_t remote, size_t bytes) {
    (void)dst, (void)remote, (void)bytes;
    return false;
  }
  /// Tells the sender that one more of its payloads sent by address has been copied (release).
  virtual void finishInPlace() {}
};

}  // namespace chorus::transport
