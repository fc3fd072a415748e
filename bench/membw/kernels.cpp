// Bandwidth kernels (see kernels.hpp). CMakeLists.txt compiles this file with
// -fno-tree-loop-distribute-patterns (GCC) or -fno-builtin (Clang) so that copyLoop stays a loop.
#include "kernels.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CHORUS_MEMBW_X86 1
#endif

namespace chorus_membw {
namespace {

// noinline: each call is one pass over memory the caller owns, so no pass can be merged with the
// next or dropped; the stores go to memory the compiler cannot see the end of.
__attribute__((noinline)) void copyLoop(double* __restrict c, const double* __restrict a, size_t n) {
  for (size_t i = 0; i < n; ++i) c[i] = a[i];
}

__attribute__((noinline)) void scaleLoop(double* __restrict b, const double* __restrict c, size_t n,
                                         double s) {
  for (size_t i = 0; i < n; ++i) b[i] = s * c[i];
}

__attribute__((noinline)) void addLoop(double* __restrict c, const double* __restrict a,
                                       const double* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

__attribute__((noinline)) void triadLoop(double* __restrict a, const double* __restrict b,
                                         const double* __restrict c, size_t n, double s) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

__attribute__((noinline)) void memcpyPass(double* c, const double* a, size_t n) {
  std::memcpy(c, a, n * sizeof(double));
}

#ifdef CHORUS_MEMBW_X86
__attribute__((target("avx2"), always_inline)) inline void ntLine(char* d, const char* s) {
  const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
  _mm256_stream_si256(reinterpret_cast<__m256i*>(d), x0);
  _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), x1);
}

// Copies with non-temporal stores: the destination lines are written straight to memory without
// being read first (no write-allocate) and without filling the caches. As kernels::copy with
// CopyMode::Streaming (kernels/cpu/reduce_impl.hpp): one store stream, or blocks of ntPages()
// pages a 64-byte line of each page in turn, as glibc's large memcpy does.
__attribute__((target("avx2"), noinline)) void ntCopyAvx2(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  size_t head = (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64;
  if (head > bytes) head = bytes;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  constexpr size_t kPage = 4096;
  const size_t pages = ntPages();
  size_t i = 0;
  if (pages > 1) {
    for (; i + pages * kPage <= bytes; i += pages * kPage) {
      for (size_t o = 0; o < kPage; o += 64) {
        for (size_t k = 0; k < pages; ++k) ntLine(d + i + k * kPage + o, s + i + k * kPage + o);
      }
    }
  }
  for (; i + 64 <= bytes; i += 64) ntLine(d + i, s + i);
  _mm_sfence();  // orders the weakly-ordered streaming stores before what follows
  std::memcpy(d + i, s + i, bytes - i);
}
#endif

}  // namespace

const char* kernelName(Kernel k) {
  switch (k) {
    case Kernel::Copy:
      return "copy";
    case Kernel::Scale:
      return "scale";
    case Kernel::Add:
      return "add";
    case Kernel::Triad:
      return "triad";
    case Kernel::Memcpy:
      return "memcpy";
    case Kernel::NtMemcpy:
      return "nt_memcpy";
  }
  return "?";
}

int kernelArrays(Kernel k) { return k == Kernel::Add || k == Kernel::Triad ? 3 : 2; }

// The library's choice (kernels/cpu/dispatch.cpp): CHORUS_NT_COPY_PAGES (1, 2, 4 or 8) if set, else
// one stream on AMD CPUs and four pages on others.
size_t ntPages() {
  static const size_t pages = [] {
    const char* set = std::getenv("CHORUS_NT_COPY_PAGES");
    if (set != nullptr && (std::strcmp(set, "1") == 0 || std::strcmp(set, "2") == 0 ||
                           std::strcmp(set, "4") == 0 || std::strcmp(set, "8") == 0)) {
      return static_cast<size_t>(set[0] - '0');
    }
#ifdef CHORUS_MEMBW_X86
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd")) return size_t{1};
#endif
    return size_t{4};
  }();
  return pages;
}

bool ntMemcpySupported() {
#ifdef CHORUS_MEMBW_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

void storeCopy(void* dst, const void* src, size_t bytes) {
  copyLoop(static_cast<double*>(dst), static_cast<const double*>(src), bytes / sizeof(double));
}

void runKernel(Kernel k, double* a, double* b, double* c, size_t begin, size_t end, double s) {
  if (end <= begin) return;
  const size_t n = end - begin;
  switch (k) {
    case Kernel::Copy:
      copyLoop(c + begin, a + begin, n);
      break;
    case Kernel::Scale:
      scaleLoop(b + begin, c + begin, n, s);
      break;
    case Kernel::Add:
      addLoop(c + begin, a + begin, b + begin, n);
      break;
    case Kernel::Triad:
      triadLoop(a + begin, b + begin, c + begin, n, s);
      break;
    case Kernel::Memcpy:
      memcpyPass(c + begin, a + begin, n);
      break;
    case Kernel::NtMemcpy:
#ifdef CHORUS_MEMBW_X86
      ntCopyAvx2(c + begin, a + begin, n * sizeof(double));
#else
      memcpyPass(c + begin, a + begin, n);
#endif
      break;
  }
}

void modelKernel(Kernel k, double& a, double& b, double& c, double s) {
  switch (k) {
    case Kernel::Copy:
    case Kernel::Memcpy:
    case Kernel::NtMemcpy:
      c = a;
      break;
    case Kernel::Scale:
      b = s * c;
      break;
    case Kernel::Add:
      c = a + b;
      break;
    case Kernel::Triad:
      a = b + s * c;
      break;
  }
}

}  // namespace chorus_membw
