#include "transports/shm/shm_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "base/error.hpp"
#include "transports/shm/shm_names.hpp"

namespace chorus::transport {

namespace {

struct Allocation {
  int fd;
  uint64_t id;
  size_t size;
};

// Every live allocation of this process, by base address.
struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Allocation> byBase;
  uint64_t nextId = 1;
};

// MemAvailable from /proc/meminfo in bytes (0 if unknown).
size_t memAvailable() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  }
  std::fclose(f);
  return static_cast<size_t>(kb) * 1024;
}

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: frees may run during static destruction
  return *r;
}

}  // namespace

void* sharedAlloc(size_t bytes) {
  if (bytes == 0) failInvalid("chorusMemAlloc: size must be > 0");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // memfd pages come from no size-limited filesystem: reserving more than the machine has would
  // run it out of memory (and into the OOM killer) instead of failing.
  const size_t available = memAvailable();
  if (available != 0 && bytes > available) {
    fail(chorusSystemError, strCat("chorusMemAlloc: ", formatBytes(bytes), " requested but only ",
                                   formatBytes(available), " of memory is available"));
  }
  const size_t size = (bytes + page - 1) / page * page;
  int fd = memfd_create("chorus-mem", MFD_CLOEXEC);
  if (fd < 0) fail(chorusSystemError, strCat("chorusMemAlloc: memfd_create failed: ", std::strerror(errno)));
  // Reserve the pages now: an exhausted system fails here with a message, not with SIGBUS later.
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(size)); err != 0) {
    close(fd);
    fail(chorusSystemError, strCat("chorusMemAlloc: cannot reserve ", formatBytes(size),
                                   " of shared memory: ", std::strerror(err)));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    close(fd);
    fail(chorusSystemError,
         strCat("chorusMemAlloc: mmap of ", formatBytes(size), " failed: ", std::strerror(err)));
  }
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  r.byBase[reinterpret_cast<uintptr_t>(p)] = Allocation{fd, r.nextId++, size};
  return p;
}

void sharedFree(void* ptr) {
  if (ptr == nullptr) return;
  Registry& r = registry();
  Allocation a;
  {
    std::lock_guard lk(r.mu);
    auto it = r.byBase.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == r.byBase.end()) failInvalid("chorusMemFree: ", ptr, " was not returned by chorusMemAlloc");
    a = it->second;
    r.byBase.erase(it);
  }
  munmap(ptr, a.size);
  close(a.fd);
}

SharedBufferRef findShared(const void* ptr, size_t bytes) {
  SharedBufferRef ref;
  Registry& r = registry();
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lk(r.mu);
  if (r.byBase.empty()) return ref;
  auto it = r.byBase.upper_bound(p);
  if (it == r.byBase.begin()) return ref;
  --it;
  const uintptr_t base = it->first;
  const Allocation& a = it->second;
  if (p - base > a.size || bytes > a.size - (p - base)) return ref;
  ref.pid = static_cast<int32_t>(getpid());
  ref.fd = a.fd;
  ref.id = a.id;
  ref.size = a.size;
  ref.offset = p - base;
  ref.address = p;
  return ref;
}

PeerMappings::~PeerMappings() {
  for (const Entry& e : entries_) munmap(e.base, e.size);
}

std::byte* PeerMappings::map(const SharedBufferRef& ref, int peerRank) {
  if (ref.pid == static_cast<int32_t>(getpid())) return reinterpret_cast<std::byte*>(ref.address);
  std::lock_guard lk(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->pid == ref.pid && it->id == ref.id) {
      entries_.splice(entries_.begin(), entries_, it);
      return it->base + ref.offset;
    }
  }
  const std::string path = strCat("/proc/", ref.pid, "/fd/", ref.fd);
  const auto what = [&] {
    return strCat("cannot map rank ", peerRank, "'s chorusMemAlloc buffer (", path, ")");
  };
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0 && processGone(ref.pid)) {
    fail(chorusRemoteError, strCat(what(), ": rank ", peerRank, " (pid ", ref.pid, ") died"));
  }
  if (fd < 0) {
    fail(chorusSystemError, strCat(what(), ": ", std::strerror(errno),
                                   " (processes of different users, or /proc mounted with hidepid? "
                                   "CHORUS_ZERO_COPY=0 turns the in-place path off)"));
  }
  void* p = mmap(nullptr, ref.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) fail(chorusSystemError, strCat(what(), ": mmap: ", std::strerror(err)));
  entries_.push_front(Entry{ref.pid, ref.id, static_cast<std::byte*>(p), ref.size});
  if (entries_.size() > capacity_) {
    munmap(entries_.back().base, entries_.back().size);
    entries_.pop_back();
  }
  return static_cast<std::byte*>(p) + ref.offset;
}

}  // namespace chorus::transport
