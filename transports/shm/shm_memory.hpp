// Memory that peers on the same host can map: the allocator behind chorusMemAlloc, and the cache
// of peers' allocations mapped into this process.
//
// An allocation is an anonymous memfd mapped MAP_SHARED: nothing appears in /dev/shm, and the
// memory is returned to the system when the owner frees it and the last peer mapping goes. A peer
// maps it by opening /proc/<owner pid>/fd/<fd> (same user, ptrace-read permission). Collectives
// whose buffers all lie in such allocations skip the copy through the staging area: each rank
// reads its peers' buffers in place (see algorithms/allreduce_direct.cpp).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>

namespace chorus::transport {

/// Where a buffer lives, in terms a peer process can map: (pid, fd, id) names the allocation.
struct SharedBufferRef {
  int32_t pid = 0;       // owning process; 0 = not in a shared allocation
  int32_t fd = -1;       // the memfd in the owner
  uint64_t id = 0;       // allocation number in the owner (never reused)
  uint64_t size = 0;     // bytes of the allocation
  uint64_t offset = 0;   // of the buffer within the allocation
  uint64_t address = 0;  // of the buffer in the owner (valid for peers in the same process)
  bool valid() const { return pid != 0; }
};

/// Allocates `bytes` (> 0) of peer-mappable memory, page aligned and zeroed. Throws chorus::Error
/// (chorusSystemError naming the cause) if the system refuses.
void* sharedAlloc(size_t bytes);
/// Frees memory from sharedAlloc. Throws chorusInvalidArgument for a pointer it did not return.
void sharedFree(void* ptr);
/// The allocation holding [ptr, ptr + bytes), or an invalid ref if there is none.
SharedBufferRef findShared(const void* ptr, size_t bytes);

/// Peers' allocations mapped into this process, least recently used evicted past a bound. A
/// mapping keeps the memory alive even after the owner frees it, so stale entries are harmless.
/// The bound must exceed the mappings one operation uses at once (two per peer): the pointers an
/// operation got stay valid until it maps more than `capacity` others.
class PeerMappings {
 public:
  explicit PeerMappings(size_t capacity = 64) : capacity_(capacity) {}
  ~PeerMappings();
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;

  /// The buffer `ref` names, mapped here; `peerRank` only words the error. Throws chorusSystemError
  /// naming the peer and the cause if it cannot be mapped.
  std::byte* map(const SharedBufferRef& ref, int peerRank);

 private:
  struct Entry {
    int32_t pid;
    uint64_t id;
    std::byte* base;
    size_t size;
  };
  size_t capacity_;
  std::mutex mu_;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace chorus::transport
