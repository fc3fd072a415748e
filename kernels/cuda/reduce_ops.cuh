// Element types and reduction operators shared by the CUDA kernels (reduce.cu, ipc_collectives.cu):
// float16/bfloat16 accumulate in float32, integers wrap around, Max/Min keep the first NaN, Avg
// divides in the accumulation type. The CPU kernels (kernels/cpu/reduce.hpp) have the same semantics.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "chorus/chorus.hpp"

namespace chorus::kernels::cuda::ops {

// ---- Element traits: storage type T, accumulation type Acc --------------------------------------

template <typename T>
struct Elem {
  using Acc = T;
  __device__ static Acc load(T x) { return x; }
  __device__ static T store(Acc a) { return a; }
};
template <>
struct Elem<__half> {
  using Acc = float;
  __device__ static float load(__half x) { return __half2float(x); }
  __device__ static __half store(float a) { return __float2half_rn(a); }
};
template <>
struct Elem<__nv_bfloat16> {
  using Acc = float;
  __device__ static float load(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 store(float a) { return __float2bfloat16_rn(a); }
};

template <typename A>
constexpr bool kIsInt = std::is_integral_v<A>;

// Integers wrap around: Sum and Prod in the unsigned type of the same width.
struct OpSum {
  template <typename A>
  __device__ static A apply(A a, A b) {
    if constexpr (kIsInt<A>) {
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct OpProd {
  template <typename A>
  __device__ static A apply(A a, A b) {
    if constexpr (kIsInt<A>) {
      using U = std::make_unsigned_t<A>;
      // uint8 * uint8 promotes to int: multiply in unsigned int to keep the wrap-around defined.
      using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
      return static_cast<A>(
          static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
    } else {
      return a * b;
    }
  }
};
// NaN in a (the earlier sources) wins; then NaN in b (a > b is false).
struct OpMax {
  template <typename A>
  __device__ static A apply(A a, A b) {
    if constexpr (kIsInt<A>)
      return a > b ? a : b;
    else
      return a != a ? a : (a > b ? a : b);
  }
};
struct OpMin {
  template <typename A>
  __device__ static A apply(A a, A b) {
    if constexpr (kIsInt<A>)
      return a < b ? a : b;
    else
      return a != a ? a : (a < b ? a : b);
  }
};

// Avg's division: in the accumulation type; integers truncate toward zero, as C++ division does.
template <typename A>
__device__ A divide(A a, int d) {
  // 32-bit division for types of 32 bits or less: 64-bit integer division is emulated on GPUs.
  if constexpr (kIsInt<A> && sizeof(A) <= 4) {
    if constexpr (std::is_signed_v<A>)
      return static_cast<A>(static_cast<int32_t>(a) / d);
    else
      return static_cast<A>(static_cast<uint32_t>(a) / static_cast<uint32_t>(d));
  } else if constexpr (kIsInt<A>) {
    if constexpr (std::is_signed_v<A>)
      return static_cast<A>(static_cast<int64_t>(a) / d);
    else
      return static_cast<A>(static_cast<uint64_t>(a) / static_cast<uint64_t>(d));
  } else {
    return a / static_cast<A>(d);
  }
}

/// Calls f.template operator()<T>() with the storage type T of `type` (host code); false for an
/// unknown type.
template <typename F>
bool withStorageType(DataType type, F&& f) {
  switch (type) {
    case DataType::Int8:
      f.template operator()<int8_t>();
      return true;
    case DataType::Uint8:
      f.template operator()<uint8_t>();
      return true;
    case DataType::Int32:
      f.template operator()<int32_t>();
      return true;
    case DataType::Uint32:
      f.template operator()<uint32_t>();
      return true;
    case DataType::Int64:
      f.template operator()<int64_t>();
      return true;
    case DataType::Uint64:
      f.template operator()<uint64_t>();
      return true;
    case DataType::Float16:
      f.template operator()<__half>();
      return true;
    case DataType::BFloat16:
      f.template operator()<__nv_bfloat16>();
      return true;
    case DataType::Float32:
      f.template operator()<float>();
      return true;
    case DataType::Float64:
      f.template operator()<double>();
      return true;
  }
  return false;
}

}  // namespace chorus::kernels::cuda::ops
