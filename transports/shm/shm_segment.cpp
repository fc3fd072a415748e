#include "transports/shm/shm_segment.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <utility>

#include "base/error.hpp"

namespace chorus::transport {

size_t shmFreeBytes() {
  struct statvfs st {};
  if (statvfs("/dev/shm", &st) != 0) return 0;
  return static_cast<size_t>(st.f_bavail) * static_cast<size_t>(st.f_frsize);
}

namespace {

// Holds an exclusive flock on the /dev/shm directory while a segment reserves its pages, so that
// ranks creating segments at once reserve one after another: without it, several partial
// reservations can fill a /dev/shm that has room for some of them, and more ranks fail than must
// (each one then reports more free space than it needed, as the others gave theirs back). The lock
// is released when the process dies. Waits at most kLockWait; past that (a holder that is stuck in
// the kernel) the reservation goes ahead unserialised, which is only less exact, never wrong.
class ShmReserveLock {
 public:
  ShmReserveLock() {
    fd_ = ::open("/dev/shm", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) return;
    const auto deadline = std::chrono::steady_clock::now() + kLockWait;
    while (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if ((errno != EWOULDBLOCK && errno != EINTR) || std::chrono::steady_clock::now() >= deadline) {
        close(fd_);
        fd_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  ~ShmReserveLock() {
    if (fd_ >= 0) close(fd_);  // closing the last descriptor releases the flock
  }
  ShmReserveLock(const ShmReserveLock&) = delete;
  ShmReserveLock& operator=(const ShmReserveLock&) = delete;

 private:
  static constexpr std::chrono::seconds kLockWait{5};
  int fd_ = -1;
};

}  // namespace

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) failSystem(strCat("shm_open(", name, ", O_CREAT|O_EXCL)"));
  ShmSegment seg;
  seg.name_ = name;
  seg.owner_ = true;
  // posix_fallocate really reserves tmpfs pages: ENOSPC surfaces now, not as SIGBUS on first touch.
  // The reservation alone decides (no free-space check first); ranks take turns (ShmReserveLock) so
  // that none fails on another's partial reservation that is given back a moment later.
  int rc = 0;
  size_t freeAfterFailure = 0;
  {
    ShmReserveLock turn;
    rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc != 0) {
      close(fd);
      shm_unlink(name.c_str());
      freeAfterFailure = shmFreeBytes();  // still in our turn: what the failed reservation gave back
    }
  }
  if (rc != 0) {
    if (rc == ENOSPC) {
      fail(chorusSystemError,
           strCat("shared memory segment ", name, " needs ", formatBytes(bytes), " but /dev/shm is full (",
                  errnoText(rc), "; ", formatBytes(freeAfterFailure),
                  " free now); enlarge /dev/shm (docker: --shm-size) or lower CHORUS_SHM_STAGE_BYTES / "
                  "CHORUS_SHM_FIFO_BYTES"));
    }
    failSystem(strCat("posix_fallocate(", name, ", ", bytes, " bytes)"), rc);
  }
  // Mapped whole at once (MAP_POPULATE): a first collective that touched the pages one fault at
  // a time ran several times slower than the next, and timed choices took it for the path's cost.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    failSystem(strCat("mmap(", name, ", ", bytes, " bytes)"), err);
  }
  seg.data_ = p;
  seg.size_ = bytes;
  return seg;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) failSystem(strCat("shm_open(", name, ")"));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    failSystem(strCat("fstat(", name, ")"), err);
  }
  if (static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    fail(chorusInternalError, strCat("shared memory segment ", name, " has ", st.st_size, " bytes, expected ",
                                     bytes, " (ranks disagree on the shared-memory layout)"));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);  // as create()'s
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) failSystem(strCat("mmap(", name, ", ", bytes, " bytes)"), err);
  ShmSegment seg;
  seg.name_ = name;
  seg.data_ = p;
  seg.size_ = bytes;
  return seg;
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept
    : name_(std::move(o.name_)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      owner_(std::exchange(o.owner_, false)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    reset();
    name_ = std::move(o.name_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    owner_ = std::exchange(o.owner_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() { reset(); }

void ShmSegment::unlink() {
  if (owner_) {
    shm_unlink(name_.c_str());
    owner_ = false;
  }
}

void ShmSegment::reset() {
  unlink();
  if (data_) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace chorus::transport
