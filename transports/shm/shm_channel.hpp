// Single-producer single-consumer byte FIFO in shared memory: the shared-memory pipe.
//
// The FIFO lives in the receiver's segment. The sender advances `head` after writing bytes, the
// receiver advances `tail` after reading them; both are monotonic byte counts (never wrap), so
// head - tail is the fill level. Each side caches the other's counter to touch the shared cache
// line only when its cached view says it must.
#pragma once

#include <atomic>
#include <cstdint>

#include "transports/pipe.hpp"

namespace chorus::transport {

struct alignas(64) FifoControl {
  std::atomic<uint64_t> head;  // bytes produced; written by the sender only
  char pad0[64 - sizeof(std::atomic<uint64_t>)];
  std::atomic<uint64_t> tail;  // bytes consumed; written by the receiver only
  char pad1[64 - sizeof(std::atomic<uint64_t>)];
};
static_assert(sizeof(FifoControl) == 128);

class ShmSendPipe final : public SendPipe {
 public:
  ShmSendPipe(FifoControl* ctrl, std::byte* data, size_t capacity)
      : ctrl_(ctrl), data_(data), capacity_(capacity) {}
  std::span<std::byte> reserve() override;
  void commit(size_t n) override;

 private:
  FifoControl* ctrl_;
  std::byte* data_;
  size_t capacity_;
  uint64_t head_ = 0;        // our own counter (we are its only writer)
  uint64_t cachedTail_ = 0;  // last tail we read
};

class ShmRecvPipe final : public RecvPipe {
 public:
  ShmRecvPipe(FifoControl* ctrl, const std::byte* data, size_t capacity)
      : ctrl_(ctrl), data_(data), capacity_(capacity) {}
  std::span<const std::byte> peek() override;
  void consume(size_t n) override;

 private:
  FifoControl* ctrl_;
  const std::byte* data_;
  size_t capacity_;
  uint64_t tail_ = 0;
  uint64_t cachedHead_ = 0;
};

}  // namespace chorus::transport
