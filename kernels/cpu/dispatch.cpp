// Run-time choice between the portable and the AVX2 + F16C kernels, made once per process.
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#endif

#include "base/config.hpp"
#include "cpu/dispatch_internal.hpp"
#include "cpu/reduce.hpp"

namespace chorus::kernels {

namespace {

constexpr KernelImpl kPortable{"portable", &portable::reduce, &portable::copy, &portable::streamCopy};
constexpr KernelImpl kAvx2{"avx2+f16c", &avx2::reduce, &avx2::copy, &avx2::streamCopy};

const KernelImpl& choose() {
  if (envConfig().cpuKernels == "portable") return kPortable;
  return cpuSupportsAvx2() ? kAvx2 : kPortable;
}

}  // namespace

bool cpuSupportsAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();  // harmless if already done; needed if called before constructors ran
  // The "avx2" test includes the OS's support for the YMM state (XGETBV).
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
#if defined(__clang__)
  // Clang's __builtin_cpu_supports does not know "f16c": CPUID leaf 1, ECX bit 29.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && ((ecx >> 29) & 1u) != 0;
#else
  return __builtin_cpu_supports("f16c");
#endif
#else
  return false;
#endif
}

const KernelImpl& portableKernels() { return kPortable; }

const KernelImpl* avx2Kernels() { return cpuSupportsAvx2() ? &kAvx2 : nullptr; }

const KernelImpl& activeKernels() {
  static const KernelImpl& chosen = choose();  // initialised once, thread-safe
  return chosen;
}

void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor) {
  if (nsrcs < 1) {
    throw Error(chorusInvalidArgument,
                "chorus::kernels::reduce: nsrcs must be >= 1, got " + std::to_string(nsrcs));
  }
  if (static_cast<unsigned>(type) >= static_cast<unsigned>(kNumDataTypes)) {
    throw Error(chorusInvalidArgument,
                "chorus::kernels::reduce: unknown data type " + std::to_string(static_cast<int>(type)));
  }
  if (static_cast<unsigned>(op) >= static_cast<unsigned>(kNumReduceOps)) {
    throw Error(chorusInvalidArgument,
                "chorus::kernels::reduce: unknown reduction op " + std::to_string(static_cast<int>(op)));
  }
  if (count == 0) return;
  activeKernels().reduce(dst, srcs, nsrcs, count, type, op, avgDivisor);
}

void copy(void* dst, const void* src, size_t bytes, CopyMode mode) {
  if (bytes == 0) return;
  switch (mode) {
    case CopyMode::Auto:
      return activeKernels().copy(dst, src, bytes);
    case CopyMode::Cached:
      std::memcpy(dst, src, bytes);
      return;
    case CopyMode::Streaming:
      return activeKernels().streamCopy(dst, src, bytes);
  }
}

const char* simdLevel() { return activeKernels().name; }

}  // namespace chorus::kernels
