// A POSIX shared-memory segment (RAII): created and sized by its owner, mapped by peers, unlinked
// from /dev/shm as soon as every rank has mapped it so that nothing outlives the job.
#pragma once

#include <cstddef>
#include <string>

namespace chorus::transport {

class ShmSegment {
 public:
  /// Creates `name` (fails if it exists) with `bytes` reserved up front: a full /dev/shm gives a
  /// clear chorusSystemError here instead of SIGBUS later.
  static ShmSegment create(const std::string& name, size_t bytes);
  /// Maps an existing segment of exactly `bytes`.
  static ShmSegment open(const std::string& name, size_t bytes);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& o) noexcept;
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  /// Unmaps; unlinks too if this process created it and has not unlinked yet.
  ~ShmSegment();

  /// Removes the name from /dev/shm (the memory stays while mapped). Idempotent.
  void unlink();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void reset();
  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;
};

/// Free bytes in the file system that holds POSIX shared memory (/dev/shm).
size_t shmFreeBytes();

}  // namespace chorus::transport
