// A fault inside shared-memory set-up, without a hook in the library: fault_rank_program defines
// posix_fallocate, which the statically linked library calls right after creating its segment's
// name in /dev/shm. Once armed, the call reserves the pages, waits `delay` ms (the peers create
// theirs meanwhile and wait for this rank) and kills the process: the segment is left in
// /dev/shm, as by a rank killed between creating its segment and every rank mapping it.
// No system header declares posix_fallocate here, so this definition is the only one in sight.
//
// open() is defined here too, for a peer that dies in the zero-copy path: once armed, opening a
// peer's chorusMemAlloc buffer (/proc/<pid>/fd/<n>) kills this process (the victim) or first waits
// 300 ms (the others), so the others look for the victim's buffer after it has died.
//
// process_vm_readv() likewise, for a peer that dies in the single-copy path: once armed, a read of
// more than the 8-byte set-up probe kills the victim or first waits (the others: 300 ms, or as
// armed).
#include <dlfcn.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include <atomic>
#include <cstdarg>
#include <cstring>

namespace {
std::atomic<long> armedDelayMs{-1};
std::atomic<int> openFault{0};      // 0: none, 1: die, 2: wait 300 ms first
std::atomic<int> readFault{0};      // the same, for process_vm_readv
std::atomic<long> readWaitMs{300};  // how long a reader that does not die waits first

void sleepMs(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000};
  nanosleep(&ts, nullptr);
}

template <typename Fn>
int faultyOpen(const char* name, const char* path, int flags, va_list args) {
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
  const mode_t mode = (flags & 0100 /* O_CREAT */) ? static_cast<mode_t>(va_arg(args, int)) : 0;
  if (const int f = openFault.load();
      f != 0 && std::strncmp(path, "/proc/", 6) == 0 && std::strstr(path, "/fd/") != nullptr) {
    if (f == 1) raise(SIGKILL);
    sleepMs(300);
  }
  return real(path, flags, mode);
}
}  // namespace

void armFallocateFault(long delayMs) { armedDelayMs.store(delayMs); }
void armPeerBufferFault(bool die) { openFault.store(die ? 1 : 2); }
void armPeerReadFault(bool die, long waitMs) {
  readWaitMs.store(waitMs);
  readFault.store(die ? 1 : 2);
}

extern "C" ssize_t process_vm_readv(pid_t pid, const iovec* local, unsigned long nlocal, const iovec* remote,
                                    unsigned long nremote, unsigned long flags) {
  using Fn = ssize_t (*)(pid_t, const iovec*, unsigned long, const iovec*, unsigned long, unsigned long);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "process_vm_readv"));
  if (const int f = readFault.load(); f != 0 && nlocal > 0 && local[0].iov_len > 8) {
    if (f == 1) raise(SIGKILL);
    sleepMs(readWaitMs.load());
  }
  return real(pid, local, nlocal, remote, nremote, flags);
}

extern "C" int open(const char* path, int flags, ...) {
  va_list args;
  va_start(args, flags);
  const int fd = faultyOpen<int (*)(const char*, int, ...)>("open", path, flags, args);
  va_end(args);
  return fd;
}

// glibc's open64 is open on 64-bit systems: one definition serves both names.
extern "C" int open64(const char* path, int flags, ...) __attribute__((alias("open")));

extern "C" int posix_fallocate(int fd, off_t offset, off_t len) {
  using Fn = int (*)(int, off_t, off_t);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "posix_fallocate"));
  const int rc = real(fd, offset, len);
  if (const long delay = armedDelayMs.exchange(-1); delay >= 0) {
    sleepMs(delay);
    raise(SIGKILL);
  }
  return rc;
}
