// Internal view of the CPU kernel dispatch: both implementations, callable directly (for tests and
// benchmarks). Not installed; the library itself goes through reduce.hpp.
#pragma once

#include <cstddef>
#include <vector>

#include "chorus/chorus.hpp"

namespace chorus::kernels {

using ReduceFn = void (*)(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type,
                          ReduceOp op, int avgDivisor);
/// `pages`: how many pages a streaming copy interleaves (1, 2, 4 or 8; streamPages()).
using CopyFn = void (*)(void* dst, const void* src, size_t bytes, unsigned pages);
/// copyToBoth() of reduce.hpp with its stores decided: streaming into `a` where `streamA` (the
/// dispatcher passes a streaming destination as `a`), into `b` where `streamB` (only with
/// `streamA`, and b at a's offset within a 64-byte line), else through the cache.
using CopyToBothFn = void (*)(void* a, bool streamA, void* b, bool streamB, const void* src, size_t bytes);

/// One implementation of the kernels. Its functions take the arguments of reduce()/copy() in
/// reduce.hpp but do not check them: nsrcs >= 1 and a known type and op are the caller's job.
struct KernelImpl {
  const char* name;  // "portable", "avx2+f16c", "avx512" or "avx512+bf16"
  ReduceFn reduce;
  CopyFn copy;        // CopyMode::Auto
  CopyFn streamCopy;  // CopyMode::Streaming
  CopyFn cachedCopy;  // CopyMode::Cached and Handoff: memcpy, by vector lines at odd offsets
  CopyToBothFn copyToBoth;
};

// The implementations themselves (reduce_portable.cpp, reduce_avx2.cpp, reduce_avx512.cpp,
// reduce_avx512bf16.cpp).
namespace portable {
void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor);
void copy(void* dst, const void* src, size_t bytes, unsigned pages);
void streamCopy(void* dst, const void* src, size_t bytes, unsigned pages);
void cachedCopy(void* dst, const void* src, size_t bytes, unsigned pages);
void copyToBoth(void* a, bool streamA, void* b, bool streamB, const void* src, size_t bytes);
}  // namespace portable
namespace avx2 {
void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor);
void copy(void* dst, const void* src, size_t bytes, unsigned pages);
void streamCopy(void* dst, const void* src, size_t bytes, unsigned pages);
void cachedCopy(void* dst, const void* src, size_t bytes, unsigned pages);
void copyToBoth(void* a, bool streamA, void* b, bool streamB, const void* src, size_t bytes);
}  // namespace avx2
namespace avx512 {
void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor);
void copy(void* dst, const void* src, size_t bytes, unsigned pages);
void streamCopy(void* dst, const void* src, size_t bytes, unsigned pages);
void cachedCopy(void* dst, const void* src, size_t bytes, unsigned pages);
void copyToBoth(void* a, bool streamA, void* b, bool streamB, const void* src, size_t bytes);
}  // namespace avx512
namespace avx512bf16 {
void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor);
void copy(void* dst, const void* src, size_t bytes, unsigned pages);
void streamCopy(void* dst, const void* src, size_t bytes, unsigned pages);
void cachedCopy(void* dst, const void* src, size_t bytes, unsigned pages);
void copyToBoth(void* a, bool streamA, void* b, bool streamB, const void* src, size_t bytes);
}  // namespace avx512bf16

/// Whether this CPU can run the AVX2 implementation (AVX2, F16C and FMA; x86 only).
bool cpuSupportsAvx2();
/// Whether it can run the AVX-512 one: AVX2's features and AVX-512 F, BW, VL and DQ, with the
/// operating system saving the 512-bit state.
bool cpuSupportsAvx512();
/// Whether it can run the AVX-512 one with AVX512_BF16 as well.
bool cpuSupportsAvx512Bf16();

/// The portable implementation (always available).
const KernelImpl& portableKernels();

/// The AVX2 + F16C implementation, or nullptr when the CPU lacks it.
const KernelImpl* avx2Kernels();
/// The AVX-512 implementations, or nullptr when the CPU lacks them.
const KernelImpl* avx512Kernels();
const KernelImpl* avx512Bf16Kernels();

/// Every implementation this CPU runs, portable first, then from the least to the most demanding.
std::vector<const KernelImpl*> availableKernels();

/// The implementation reduce()/copy() use, chosen on first use (thread-safe): the most demanding
/// one the CPU runs, at most the level CHORUS_CPU_KERNELS names (portable, avx2, avx512,
/// avx512bf16; default auto: no limit).
const KernelImpl& activeKernels();

}  // namespace chorus::kernels
