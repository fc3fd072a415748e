#include "transports/shm/shm_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "base/error.hpp"

namespace chorus::transport {

size_t shmFreeBytes() {
  struct statvfs st {};
  if (statvfs("/dev/shm", &st) != 0) return 0;
  return static_cast<size_t>(st.f_bavail) * static_cast<size_t>(st.f_frsize);
}

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) failSystem(strCat("shm_open(", name, ", O_CREAT|O_EXCL)"));
  ShmSegment seg;
  seg.name_ = name;
  seg.owner_ = true;
  // posix_fallocate really reserves tmpfs pages: ENOSPC surfaces now, not as SIGBUS on first touch.
  // The reservation alone decides (no free-space check first): ranks reserving at once see each
  // other's partial reservations, which a failing one gives back.
  int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    close(fd);
    shm_unlink(name.c_str());
    if (rc == ENOSPC) {
      fail(chorusSystemError,
           strCat("shared memory segment ", name, " needs ", formatBytes(bytes), " but /dev/shm is full (",
                  errnoText(rc), "; ", formatBytes(shmFreeBytes()),
                  " free now); enlarge /dev/shm (docker: --shm-size) or lower CHORUS_SHM_STAGE_BYTES / "
                  "CHORUS_SHM_FIFO_BYTES"));
    }
    failSystem(strCat("posix_fallocate(", name, ", ", bytes, " bytes)"), rc);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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
