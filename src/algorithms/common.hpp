// Small helpers shared by the algorithm files.
#pragma once

#include <cstddef>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "core/error.hpp"
#include "kernels/cpu/reduce.hpp"

namespace chorus::algo {

inline int mod(int a, int n) { return ((a % n) + n) % n; }

inline const std::byte* at(const void* base, size_t elems, size_t elemSize) {
  return static_cast<const std::byte*>(base) + elems * elemSize;
}
inline std::byte* at(void* base, size_t elems, size_t elemSize) {
  return static_cast<std::byte*>(base) + elems * elemSize;
}

/// Elements per 64-byte cache line (slices start on cache lines so ranks never write one line).
inline size_t cacheLineElems(size_t elemSize) { return 64 / elemSize; }

/// Largest chunk of `blocks` equal blocks, in elements per block, that fits one staging half.
inline size_t stageChunkElems(const transport::ShmGroup& shm, size_t elemSize, size_t blocks) {
  size_t per = shm.stageHalfBytes() / elemSize / blocks;
  size_t line = cacheLineElems(elemSize);
  return per >= line ? per / line * line : (per ? per : 1);
}

/// The divisor for Avg at the point where a reduction completes (0 = no division).
inline int avgDivisor(const Op& op, int nranks) { return op.op == ReduceOp::Avg ? nranks : 0; }

}  // namespace chorus::algo
