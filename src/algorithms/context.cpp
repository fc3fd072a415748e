// The default local data movement of algo::Context: the CPU kernels.
#include <cstdint>
#include <cstring>

#include "algorithms/algorithm.hpp"
#include "kernels/cpu/reduce.hpp"

namespace chorus::algo {

void Context::localCopy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (d < s + bytes && s < d + bytes)
    std::memmove(dst, src, bytes);
  else
    kernels::copy(dst, src, bytes);
}

void Context::localReduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type,
                          ReduceOp op, int avgDivisor) {
  kernels::reduce(dst, srcs, nsrcs, count, type, op, avgDivisor);
}

}  // namespace chorus::algo
