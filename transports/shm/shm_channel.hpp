// Single-producer single-consumer byte FIFO in shared memory: the shared-memory pipe.
//
// The FIFO lives in the receiver's segment. The sender advances `head` after writing bytes, the
// receiver advances `tail` after reading them; both are monotonic byte counts (never wrap), so
// head - tail is the fill level. Each side caches the other's counter to touch the shared cache
// line only when its cached view says it must.
//
// Single copy: where the receiver may read the sender's memory (shm_group.hpp), the engine can
// send a large payload as its address; the receiver copies it straight from the sender's buffer
// (cross-memory attach, or memcpy between ranks of one process) and then advances `readsDone`,
// which releases the sender's buffer.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "transports/pipe.hpp"

namespace chorus::transport {

struct alignas(64) FifoControl {
  std::atomic<uint64_t> head;  // bytes produced; written by the sender only
  char pad0[64 - sizeof(std::atomic<uint64_t>)];
  std::atomic<uint64_t> tail;  // bytes consumed; written by the receiver only
  char pad1[64 - sizeof(std::atomic<uint64_t>)];
  std::atomic<uint64_t> readsDone;  // payloads sent by address and copied; written by the receiver
  char pad2[64 - sizeof(std::atomic<uint64_t>)];
};
static_assert(sizeof(FifoControl) == 192);

class ShmSendPipe final : public SendPipe {
 public:
  /// `inPlaceMinBytes`: payloads from this size on may be sent by address (0: none; the receiver
  /// must be able to read this process's memory).
  ShmSendPipe(FifoControl* ctrl, std::byte* data, size_t capacity, size_t inPlaceMinBytes = 0)
      : ctrl_(ctrl), data_(data), capacity_(capacity), inPlaceMinBytes_(inPlaceMinBytes) {}
  std::span<std::byte> reserve() override;
  void commit(size_t n) override;
  size_t inPlaceMinBytes() const override { return inPlaceMinBytes_; }
  uint64_t postInPlace() override { return ++posted_; }
  uint64_t inPlaceReadsDone() const override;

 private:
  FifoControl* ctrl_;
  std::byte* data_;
  size_t capacity_;
  size_t inPlaceMinBytes_;
  uint64_t head_ = 0;        // our own counter (we are its only writer)
  uint64_t cachedTail_ = 0;  // last tail we read
  uint64_t posted_ = 0;      // payloads sent by address
};

class ShmRecvPipe final : public RecvPipe {
 public:
  /// `senderPid`: the sender's process id, 0 when it is this process (its memory is addressable
  /// here); `sender` names it in errors ("rank 3").
  ShmRecvPipe(FifoControl* ctrl, const std::byte* data, size_t capacity, int senderPid = 0,
              std::string sender = {})
      : ctrl_(ctrl), data_(data), capacity_(capacity), senderPid_(senderPid), sender_(std::move(sender)) {}
  std::span<const std::byte> peek() override;
  void consume(size_t n) override;
  bool readInPlace(std::byte* dst, uint64_t remote, size_t bytes) override;
  void finishInPlace() override;

 private:
  FifoControl* ctrl_;
  const std::byte* data_;
  size_t capacity_;
  int senderPid_;
  std::string sender_;
  uint64_t tail_ = 0;
  uint64_t cachedHead_ = 0;
  uint64_t readsDone_ = 0;
};

}  // namespace chorus::transport
