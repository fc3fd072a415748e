// The bandwidth kernels of chorus-membw. They live in their own translation unit, compiled so that
// the compiler keeps the copy loop a loop instead of turning it into a call to memcpy (see
// CMakeLists.txt); glibc's memcpy is measured separately.
#pragma once

#include <cstddef>

namespace chorus_membw {

enum class Kernel { Copy, Scale, Add, Triad, Memcpy, NtMemcpy };

// Element i of the arrays a, b, c (doubles), as STREAM defines the kernels:
//   copy:      c = a           scale: b = s * c
//   add:       c = a + b       triad: a = b + s * c
//   memcpy:    c = a (glibc memcpy)
//   nt_memcpy: c = a (AVX2 loads, non-temporal 32-byte stores, sfence)
const char* kernelName(Kernel k);

// Arrays each element of the kernel reads or writes (8 bytes each): the bytes STREAM counts.
// Write-allocate traffic (the read of the destination line before a normal store) is not counted.
int kernelArrays(Kernel k);

// Whether nt_memcpy can run here (AVX2, with the OS saving YMM state).
bool ntMemcpySupported();
// Pages nt_memcpy interleaves: as the library's streaming copy (CHORUS_NT_COPY_PAGES, else 1 on AMD
// CPUs and 4 on others).
size_t ntPages();

// Runs `k` once on elements [begin, end) of a, b and c; `s` is the scalar of scale and triad.
void runKernel(Kernel k, double* a, double* b, double* c, size_t begin, size_t end, double s);

// Copies `bytes` (a multiple of 8) with the loop of `copy`: the compiler's vector loads and stores,
// not glibc's memcpy (which may use `rep movsb` or non-temporal stores instead).
void storeCopy(void* dst, const void* src, size_t bytes);

// What element i of each array holds after `k` ran (a scalar model of runKernel, for the check).
void modelKernel(Kernel k, double& a, double& b, double& c, double s);

}  // namespace chorus_membw
