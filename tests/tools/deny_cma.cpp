// deny_cma [--writes-only] PROGRAM ARGS...: runs PROGRAM with cross-memory attach refused, as
// Yama's ptrace_scope or another user's process refuses it: a seccomp filter makes
// process_vm_readv and process_vm_writev (with --writes-only: process_vm_writev alone) fail with
// EPERM in PROGRAM and everything it starts. Exits 77 (CTest's skip) where this kernel or sandbox
// takes no seccomp filter.
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#if defined(__x86_64__)
#define DENY_CMA_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define DENY_CMA_ARCH AUDIT_ARCH_AARCH64
#else
#error "deny_cma: no seccomp architecture for this target"
#endif

int main(int argc, char** argv) {
  const bool writesOnly = argc > 1 && std::strcmp(argv[1], "--writes-only") == 0;
  if (writesOnly) {
    --argc;
    ++argv;
  }
  if (argc < 2) {
    std::fprintf(stderr, "usage: deny_cma [--writes-only] PROGRAM [ARGS...]\n");
    return 2;
  }
  sock_filter filter[] = {
      // Another architecture's system call numbers mean other calls: let them through.
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, DENY_CMA_ARCH, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      // Reads: to the refusal (2 ahead), or with --writes-only to the next test, which lets them through.
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv,
               static_cast<unsigned char>(writesOnly ? 0 : 2), 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_writev, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
    std::fprintf(stderr, "deny_cma: no seccomp filter here (%s): skipped\n", std::strerror(errno));
    return 77;
  }
  execvp(argv[1], argv + 1);
  std::fprintf(stderr, "deny_cma: cannot run %s: %s\n", argv[1], std::strerror(errno));
  return 127;
}
