#include "transports/shm/shm_channel.hpp"

#include <algorithm>
#include <cstring>

#include "base/tsan_sync.hpp"
#include "transports/shm/peer_memory.hpp"

namespace chorus::transport {

std::span<std::byte> ShmSendPipe::reserve() {
  uint64_t used = head_ - cachedTail_;
  // Reload the tail not only when the cached view is full but whenever it leaves less than the
  // largest unit the engine commits whole (an 8-byte header or element): the cached tail can sit
  // inside an earlier message of smaller elements, leaving 1..7 bytes that a sender of 8-byte units
  // never fills exactly, so a full-only check would never reload it and the sender would stall.
  if (capacity_ - used < 8) {
    // Acquire pairs with the receiver's release in consume(): it finished reading those bytes.
    cachedTail_ = ctrl_->tail.load(std::memory_order_acquire);
    used = head_ - cachedTail_;
    if (used == capacity_) return {};
  }
  size_t pos = static_cast<size_t>(head_ % capacity_);
  size_t n = std::min<size_t>(capacity_ - used, capacity_ - pos);
  return {data_ + pos, n};
}

void ShmSendPipe::commit(size_t n) {
  // Ranks of one process map this FIFO at different addresses: tell ThreadSanitizer of the edge
  // (a payload sent by address is read at its owner's address, base/tsan_sync.hpp).
  tsanReleaseShm();
  head_ += n;
  // Release publishes the bytes written before it to the receiver's acquire load of head.
  ctrl_->head.store(head_, std::memory_order_release);
}

std::span<const std::byte> ShmRecvPipe::peek() {
  uint64_t avail = cachedHead_ - tail_;
  if (avail == 0) {
    cachedHead_ = ctrl_->head.load(std::memory_order_acquire);
    avail = cachedHead_ - tail_;
    if (avail == 0) return {};
  }
  size_t pos = static_cast<size_t>(tail_ % capacity_);
  size_t n = std::min<size_t>(avail, capacity_ - pos);
  return {data_ + pos, n};
}

void ShmRecvPipe::consume(size_t n) {
  tail_ += n;
  ctrl_->tail.store(tail_, std::memory_order_release);
}

uint64_t ShmSendPipe::inPlaceReadsDone() const {
  const uint64_t done = ctrl_->readsDone.load(std::memory_order_acquire);
  tsanAcquireShm();
  return done;
}

bool ShmRecvPipe::readInPlace(std::byte* dst, uint64_t remote, size_t bytes) {
  if (bytes == 0) return true;
  tsanAcquireShm();  // the address came through the FIFO (see commit)
  if (senderPid_ == 0) {
    std::memcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(remote)), bytes);
  } else {
    readPeerMemory(senderPid_, dst, remote, bytes, sender_.c_str());
  }
  return true;
}

void ShmRecvPipe::finishInPlace() {
  // Release: our reads of the sender's buffer are done before it may reuse it.
  tsanReleaseShm();
  ctrl_->readsDone.store(++readsDone_, std::memory_order_release);
}

}  // namespace chorus::transport
