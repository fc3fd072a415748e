// Internal view of the CPU kernel dispatch: both implementations, callable directly (for tests and
// benchmarks). Not installed; the library itself goes through reduce.hpp.
#pragma once

#include <cstddef>

#include "chorus/chorus.hpp"

namespace chorus::kernels {

using ReduceFn = void (*)(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type,
                          ReduceOp op, int avgDivisor);
using CopyFn = void (*)(void* dst, const void* src, size_t bytes);

/// One implementation of the kernels. Its functions take the arguments of reduce()/copy() in
/// reduce.hpp but do not check them: nsrcs >= 1 and a known type and op are the caller's job.
struct KernelImpl {
  const char* name;  // "portable" or "avx2+f16c"
  ReduceFn reduce;
  CopyFn copy;        // CopyMode::Auto
  CopyFn streamCopy;  // CopyMode::Streaming
};

// The implementations themselves (reduce_portable.cpp, reduce_avx2.cpp).
namespace portable {
void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor);
void copy(void* dst, const void* src, size_t bytes);
void streamCopy(void* dst, const void* src, size_t bytes);
}  // namespace portable
namespace avx2 {
void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor);
void copy(void* dst, const void* src, size_t bytes);
void streamCopy(void* dst, const void* src, size_t bytes);
}  // namespace avx2

/// Whether this CPU can run the AVX2 implementation (AVX2, F16C and FMA; x86 only).
bool cpuSupportsAvx2();

/// The portable implementation (always available).
const KernelImpl& portableKernels();

/// The AVX2 + F16C implementation, or nullptr when the CPU lacks it.
const KernelImpl* avx2Kernels();

/// The implementation reduce()/copy() use: chosen on first use (thread-safe), AVX2 when the CPU
/// has it unless CHORUS_CPU_KERNELS=portable.
const KernelImpl& activeKernels();

}  // namespace chorus::kernels
