#include "transports/shm/peer_memory.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>

#include "base/error.hpp"

namespace chorus::transport {

namespace {

const uint64_t probeWord = kPeerProbeValue;

std::string errnoCause(int err) {
  std::string text = std::strerror(err);
  switch (err) {
    case EPERM:
      return text +
             " (EPERM: ptrace rules refuse it: another user, or /proc/sys/kernel/yama/ptrace_scope > 0)";
    case ESRCH:
      return text + " (ESRCH: the process exited)";
    case EFAULT:
      return text + " (EFAULT: the range is not mapped in that process)";
    case ENOSYS:
      return text + " (ENOSYS: the kernel, or a seccomp filter, does not offer process_vm_readv)";
    default:
      return text;
  }
}

// One process_vm_readv; the bytes it moved, or -1 with errno set.
ssize_t readOnce(int pid, void* local, uint64_t remote, size_t bytes) {
  iovec l{local, bytes};
  iovec r{reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), bytes};
  return process_vm_readv(static_cast<pid_t>(pid), &l, 1, &r, 1, 0);
}

// One process_vm_writev; the bytes it moved, or -1 with errno set.
ssize_t writeOnce(int pid, uint64_t remote, const void* local, size_t bytes) {
  iovec l{const_cast<void*>(local), bytes};
  iovec r{reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), bytes};
  return process_vm_writev(static_cast<pid_t>(pid), &l, 1, &r, 1, 0);
}

// Runs `once` (one read, or with `reading` false one write, of up to the bytes left from a byte
// offset) until `bytes` have moved, failing as readPeerMemory and writePeerMemory say.
template <typename Once>
void moveAll(int pid, size_t bytes, const char* what, bool reading, Once once) {
  const char* call = reading ? "process_vm_readv" : "process_vm_writev";
  size_t done = 0;
  while (done < bytes) {
    const ssize_t got = once(done, bytes - done);
    if (got <= 0) {
      const int err = got < 0 ? errno : EFAULT;
      if (err == EINTR) continue;
      if (err == ESRCH) {
        fail(chorusRemoteError,
             strCat(what, " (pid ", pid, ") died while this rank ", reading ? "read" : "wrote",
                    " its buffer in place (", call, ": ESRCH)"));
      }
      fail(chorusSystemError,
           strCat(what, ": ", reading ? "reading " : "writing ", bytes - done, " bytes of process ", pid,
                  " in place (", call, ") failed: ", errnoCause(err)));
    }
    done += static_cast<size_t>(got);
  }
}

}  // namespace

const uint64_t* peerProbeWord() { return &probeWord; }

uint64_t processNonce() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    return (uint64_t{rd()} << 32 | rd()) ^ static_cast<uint64_t>(getpid());
  }();
  return nonce;
}

bool probePeerMemory(int pid, uint64_t address, std::string* why) {
  uint64_t value = 0;
  const ssize_t got = readOnce(pid, &value, address, sizeof value);
  if (got == static_cast<ssize_t>(sizeof value) && value == kPeerProbeValue) return true;
  if (why) {
    *why = got < 0 ? strCat("process ", pid, " refused it: ", errnoCause(errno))
                   : strCat("process ", pid, " answered the probe with the wrong bytes");
  }
  return false;
}

double measurePeerReadSpeed(size_t bytes) {
  bytes = std::max<size_t>(bytes, 4096);
  const auto src = std::make_unique<std::byte[]>(bytes);
  const auto dst = std::make_unique<std::byte[]>(bytes);
  std::memset(src.get(), 1, bytes);  // both touched, so no page fault is timed
  std::memset(dst.get(), 2, bytes);
  const int self = static_cast<int>(getpid());
  using Clock = std::chrono::steady_clock;
  double copy = 1e30, read = 1e30;
  for (int round = 0; round < 6; ++round) {  // the first round of each only warms up
    auto t0 = Clock::now();
    std::memcpy(dst.get(), src.get(), bytes);
    asm volatile("" ::: "memory");  // the copy is not elided: dst is read after the reads below
    auto t1 = Clock::now();
    if (readOnce(self, dst.get(), reinterpret_cast<uintptr_t>(src.get()), bytes) !=
        static_cast<ssize_t>(bytes)) {
      return 0;
    }
    auto t2 = Clock::now();
    if (round == 0) continue;
    copy = std::min(copy, std::chrono::duration<double>(t1 - t0).count());
    read = std::min(read, std::chrono::duration<double>(t2 - t1).count());
  }
  return read > 0 ? copy / read : 0;
}

void readPeerMemory(int pid, void* local, uint64_t remote, size_t bytes, const char* what) {
  auto* out = static_cast<std::byte*>(local);
  moveAll(pid, bytes, what, true,
          [&](size_t at, size_t left) { return readOnce(pid, out + at, remote + at, left); });
}

void writePeerMemory(int pid, uint64_t remote, const void* local, size_t bytes, const char* what) {
  const auto* in = static_cast<const std::byte*>(local);
  moveAll(pid, bytes, what, false,
          [&](size_t at, size_t left) { return writeOnce(pid, remote + at, in + at, left); });
}

bool probeOwnMemoryWrite(std::string* why) {
  volatile uint64_t word = 0;
  const uint64_t value = kPeerProbeValue;
  const ssize_t got =
      writeOnce(static_cast<int>(getpid()), reinterpret_cast<uintptr_t>(&word), &value, sizeof value);
  if (got == static_cast<ssize_t>(sizeof value) && word == kPeerProbeValue) return true;
  if (why) {
    *why = got < 0 ? strCat("process_vm_writev is refused here: ", errnoCause(errno))
                   : std::string("process_vm_writev did not write the probe word");
  }
  return false;
}

}  // namespace chorus::transport
