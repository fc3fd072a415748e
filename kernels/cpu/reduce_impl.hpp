// Templated CPU reduction kernels, compiled once per instruction set.
//
// Included by reduce_portable.cpp (the baseline target: SSE2 on x86-64), reduce_avx2.cpp
// (-mavx2 -mf16c -mfma), reduce_avx512.cpp (AVX-512 F/BW/VL/DQ as well) and reduce_avx512bf16.cpp
// (and AVX512_BF16). Each defines CHORUS_KERNELS_ISA, the namespace its copy lives in, before
// including this file. Apart from the entry points, everything is in an anonymous namespace and
// no standard-library template is used: the translation units are compiled for different
// targets, and an inline function or template instantiation shared between them would be kept only
// once by the linker, possibly in its AVX2 form, which the portable path would then run on CPUs
// without AVX2. (memcpy/memmove are out-of-line libc calls; type traits generate no code.)
// The AVX2 and AVX-512 builds share every loop; only the register type of Vec<T> and the vec()
// overloads of the operations differ.
//
// Semantics (see reduce.hpp for the contract):
// - The reduction order is fixed: ((s0 op s1) op s2) op ... whatever dst aliases, and both
//   implementations do the same IEEE operations in the same order, so for inputs without NaN their
//   results are bitwise identical (no FMA contraction: there is no multiply-add in these kernels).
// - Integers: Sum/Prod in the unsigned type of the same width (wrap-around), Max/Min signed or
//   unsigned as the type is. Avg divides the wrapped sum, truncating toward zero.
// - Float16/BFloat16: every source is widened to float32, the whole reduction (and the Avg division)
//   runs in float32 and the result is rounded once to nearest even. float32 -> half/bfloat16 of a
//   NaN keeps the sign and the top payload bits and sets the quiet bit (as F16C's vcvtps2ph does);
//   half -> float32 of a NaN sets the quiet bit too (as vcvtph2ps does).
// - Max/Min on floating types propagate NaN: if any source element is NaN the result is the first
//   NaN in source order (srcs[0] first), bit for bit for float32/float64 and quieted for
//   float16/bfloat16. Without NaN, max(a, b) = a > b ? a : b and min(a, b) = a < b ? a : b, so of
//   two equal values (+0 and -0) the later source's wins. The same in both implementations.
// - Sum/Prod/Avg with a NaN input give a NaN; which payload is unspecified.
// - nsrcs == 1 without an Avg division is a plain copy (NaN payloads untouched).
// - nsrcs > 2 works on blocks of kBlockBytes: acc = s0 op s1, acc op= s2 ... in a stack
//   buffer of the accumulation type that stays in L1, then dst = acc op s[n-1] (rounded/divided),
//   so each source is read once and dst written once, whichever source dst aliases.
#ifndef CHORUS_KERNELS_CPU_REDUCE_IMPL_HPP_
#define CHORUS_KERNELS_CPU_REDUCE_IMPL_HPP_

#ifndef CHORUS_KERNELS_ISA
#error "define CHORUS_KERNELS_ISA (portable, avx2, avx512 or avx512bf16) before including reduce_impl.hpp"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "chorus/chorus.hpp"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define CHORUS_KERNELS_VECTOR_AVX2 1
#else
#define CHORUS_KERNELS_VECTOR_AVX2 0
#endif
#if CHORUS_KERNELS_VECTOR_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__)
#define CHORUS_KERNELS_VECTOR_AVX512 1
#else
#define CHORUS_KERNELS_VECTOR_AVX512 0
#endif
// vcvtne2ps2bf16: 32 float32 -> bfloat16 in one instruction (guarded: it flushes subnormals).
#if CHORUS_KERNELS_VECTOR_AVX512 && defined(__AVX512BF16__)
#define CHORUS_KERNELS_NATIVE_BF16 1
#else
#define CHORUS_KERNELS_NATIVE_BF16 0
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// "No dependence between iterations of the next loop", which lets d == a (see binary()) vectorise.
#if defined(__clang__)
#define CHORUS_KERNELS_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#else
#define CHORUS_KERNELS_IVDEP _Pragma("GCC ivdep")
#endif

namespace chorus::kernels::CHORUS_KERNELS_ISA {

// Entry points (declared for the dispatcher in dispatch_internal.hpp). They assume valid arguments
// (nsrcs >= 1, a known type and op); dispatch.cpp checks them.
void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor);
void copy(void* dst, const void* src, size_t bytes, unsigned pages);
void streamCopy(void* dst, const void* src, size_t bytes, unsigned pages);
void cachedCopy(void* dst, const void* src, size_t bytes, unsigned pages);
void copyToBoth(void* a, bool streamA, void* b, bool streamB, const void* src, size_t bytes);

namespace {

// Bytes of accumulator per block when nsrcs > 2 (float32: 4096 elements; half of a 32 KiB L1D).
constexpr size_t kBlockBytes = 16 * 1024;

// copy() switches to non-temporal stores from this size on. Measured on the development machine
// (AMD EPYC Milan VM, 512 KiB L2 per core, 32 MiB L3, glibc 2.36), bytes read + written per second
// of a repeated copy, memcpy against a 64-byte streaming-store loop:
//   size     memcpy      streaming   (bench_kernels copy/*: memcpy vs copy() at 16 MiB and up)
//   8 MiB    54-70 GB/s  46 GB/s     source and destination stay in L3: memcpy wins
//   16 MiB   30-40 GB/s  43-45 GB/s
//   32 MiB   20 GB/s     35-41 GB/s
//   64 MiB   17-19 GB/s  32-39 GB/s
// so streaming pays once source plus destination no longer fit in L3. It also evicts the
// destination from cache, which would hurt a reader that follows at once; below the threshold
// that reader finds it in L3.
constexpr size_t kNonTemporalThreshold = 16u << 20;

// cachedCopy() copies by vector lines from this size on where the destination and the source lie
// at different offsets within a 64-byte line, and with memcpy otherwise. glibc (2.36, Debian 12)
// copies 2 KiB up to the L2 size with `rep movsb`, which on the AVX-512 EPYC VM (Zen 4) ran a
// 128 KiB copy in L2 at 21-38 ns/KiB for such offsets against 18-20 for the same offset, and at
// 295-570 ns/KiB where the destination lay 1 to 15 bytes past the source modulo 4 KiB; vector
// lines ran 18-22 at every offset (docs/performance.md, "Copies at odd offsets").
constexpr size_t kLineCopyFrom = 4096;

inline size_t minSize(size_t a, size_t b) { return a < b ? a : b; }

// ---- Scalar conversions (branch-free so that the portable build vectorises them) ---------------

inline uint32_t bitsOf(float f) { return __builtin_bit_cast(uint32_t, f); }
inline float floatOf(uint32_t u) { return __builtin_bit_cast(float, u); }

// IEEE binary16 -> binary32, exact. NaN: payload kept, quiet bit set (as vcvtph2ps).
inline float halfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t mag = h & 0x7fffu;  // exponent and mantissa
  // Normal: move the 10 mantissa bits to the top of float's 23 and re-bias the exponent (15 -> 127).
  const uint32_t normal = (mag << 13) + (uint32_t(127 - 15) << 23);
  // Infinity/NaN: all-ones exponent, same payload; NaN made quiet.
  const uint32_t special = (mag << 13) | 0x7f800000u | (mag > 0x7c00u ? 0x00400000u : 0u);
  // Zero/subnormal: mantissa * 2^-24, exact in float.
  const uint32_t tiny = bitsOf(float(int32_t(mag)) * 0x1p-24f);
  const uint32_t r = mag >= 0x7c00u ? special : (mag < 0x0400u ? tiny : normal);
  return floatOf(r | sign);
}

// IEEE binary32 -> binary16, round to nearest even; overflow to infinity. NaN: sign and the top 10
// payload bits kept, quiet bit set (as vcvtps2ph).
inline uint16_t floatToHalf(float f) {
  const uint32_t u = bitsOf(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t nan = 0x7e00u | ((a >> 13) & 0x03ffu);
  // Normal result: re-bias the exponent, add just under half an ulp plus the lowest kept bit
  // (ties go to even), drop 13 bits. A carry out of the mantissa correctly bumps the exponent.
  const uint32_t normal = ((a - (uint32_t(127 - 15) << 23)) + 0x0fffu + ((a >> 13) & 1u)) >> 13;
  // Subnormal result (|f| < 2^-14): adding 0.5f, whose ulp is 2^-24 (the half subnormal step),
  // rounds |f| to a multiple of 2^-24 (nearest even); the low bits are then that multiple (0..1024;
  // 1024 is the smallest normal half, also correct).
  const uint32_t tiny = bitsOf(floatOf(a) + 0.5f) - bitsOf(0.5f);
  uint32_t r = a < 0x38800000u ? tiny : normal;
  r = a >= 0x477ff000u ? 0x7c00u : r;  // 65520 and above round to infinity (infinity included)
  r = a > 0x7f800000u ? nan : r;
  return uint16_t(r | sign);
}

inline float bf16ToFloat(uint16_t b) { return floatOf(uint32_t(b) << 16); }

// binary32 -> bfloat16, round to nearest even (overflow to infinity falls out of the carry). NaN:
// sign and top payload bits kept, quiet bit set.
inline uint16_t floatToBf16(float f) {
  const uint32_t u = bitsOf(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x0040u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// ---- Element types: storage <-> accumulation ------------------------------------------------------

template <typename T>
struct Elem {
  using Acc = T;
  static Acc load(T x) { return x; }
  static T store(Acc a) { return a; }
};
template <>
struct Elem<Half> {
  using Acc = float;
  static float load(Half x) { return halfToFloat(x.bits); }
  static Half store(float a) { return Half{floatToHalf(a)}; }
};
template <>
struct Elem<BFloat16> {
  using Acc = float;
  static float load(BFloat16 x) { return bf16ToFloat(x.bits); }
  static BFloat16 store(float a) { return BFloat16{floatToBf16(a)}; }
};

// ---- Operations (scalar, and AVX2 for float/double) ------------------------------------------------

template <typename A>
inline constexpr bool kIsInt = std::is_integral_v<A>;

// kSelects: the result is always one of the operands, so it needs no rounding (see binary()).
struct OpSum {
  static constexpr bool kSelects = false;
  template <typename A>
  static A apply(A a, A b) {
    if constexpr (kIsInt<A>) {
      using U = std::make_unsigned_t<A>;
      return A(U(U(a) + U(b)));
    } else {
      return a + b;
    }
  }
#if CHORUS_KERNELS_VECTOR_AVX2
  static __m256 vec(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  static __m256d vec(__m256d a, __m256d b) { return _mm256_add_pd(a, b); }
#endif
#if CHORUS_KERNELS_VECTOR_AVX512
  static __m512 vec(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
  static __m512d vec(__m512d a, __m512d b) { return _mm512_add_pd(a, b); }
#endif
};

struct OpProd {
  static constexpr bool kSelects = false;
  template <typename A>
  static A apply(A a, A b) {
    if constexpr (kIsInt<A>) {
      using U = std::make_unsigned_t<A>;
      // 8-bit operands promote to int; 255 * 255 still fits, so no signed overflow.
      return A(U(U(a) * U(b)));
    } else {
      return a * b;
    }
  }
#if CHORUS_KERNELS_VECTOR_AVX2
  static __m256 vec(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
  static __m256d vec(__m256d a, __m256d b) { return _mm256_mul_pd(a, b); }
#endif
#if CHORUS_KERNELS_VECTOR_AVX512
  static __m512 vec(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
  static __m512d vec(__m512d a, __m512d b) { return _mm512_mul_pd(a, b); }
#endif
};

struct OpMax {
  static constexpr bool kSelects = true;
  template <typename A>
  static A apply(A a, A b) {
    if constexpr (kIsInt<A>) {
      return a > b ? a : b;
    } else {
      return a != a ? a : (a > b ? a : b);  // NaN in a (the earlier sources) wins; then NaN in b
    }
  }
#if CHORUS_KERNELS_VECTOR_AVX2
  // vmaxps(a, b) is a > b ? a : b (so b when either is NaN); then a where a is NaN.
  static __m256 vec(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static __m256d vec(__m256d a, __m256d b) {
    return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
#endif
#if CHORUS_KERNELS_VECTOR_AVX512
  // The same with a mask: vmaxps returns b when either is NaN; then a where a is NaN.
  static __m512 vec(__m512 a, __m512 b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_max_ps(a, b), a);
  }
  static __m512d vec(__m512d a, __m512d b) {
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), _mm512_max_pd(a, b), a);
  }
#endif
};

struct OpMin {
  static constexpr bool kSelects = true;
  template <typename A>
  static A apply(A a, A b) {
    if constexpr (kIsInt<A>) {
      return a < b ? a : b;
    } else {
      return a != a ? a : (a < b ? a : b);
    }
  }
#if CHORUS_KERNELS_VECTOR_AVX2
  static __m256 vec(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static __m256d vec(__m256d a, __m256d b) {
    return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
#endif
#if CHORUS_KERNELS_VECTOR_AVX512
  static __m512 vec(__m512 a, __m512 b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_min_ps(a, b), a);
  }
  static __m512d vec(__m512d a, __m512d b) {
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), _mm512_min_pd(a, b), a);
  }
#endif
};

// ---- Finishing step applied to the last combination (Avg's division, or nothing) ----------------

struct NoFinish {
  static constexpr bool kIdentity = true;
  template <typename A>
  A operator()(A a) const {
    return a;
  }
#if CHORUS_KERNELS_VECTOR_AVX2
  __m256 vec(__m256 v) const { return v; }
  __m256d vec(__m256d v) const { return v; }
#endif
#if CHORUS_KERNELS_VECTOR_AVX512
  __m512 vec(__m512 v) const { return v; }
  __m512d vec(__m512d v) const { return v; }
#endif
};

// Division by avgDivisor (> 0) in the accumulation type A.
template <typename A>
struct DivFinish {
  static constexpr bool kIdentity = false;
  int divisor;
  A operator()(A a) const {
    if constexpr (!kIsInt<A>) {
      return a / A(divisor);
    } else if constexpr (sizeof(A) == 1) {
      // A quotient a/d that is not an integer lies at least 1/d from one, farther than the rounding
      // error of a float quotient (< |a|/d * 2^-24) as |a| < 2^24: truncating the float quotient
      // is exact (and vectorises, unlike integer division). A divisor above 2^24 may round but
      // still exceeds |a| <= 255, so the result is 0 either way.
      return A(int32_t(float(int32_t(a)) / float(divisor)));
    } else if constexpr (std::is_same_v<A, int32_t>) {
      // The same with double's 53 bits: exact for |a| < 2^52, and the divisor is exact.
      return A(int32_t(double(a) / double(divisor)));
    } else if constexpr (std::is_same_v<A, uint32_t>) {
      // The same for uint32, with the conversions done through int32 (which vectorise):
      // a = (a ^ 2^31) + 2^31 exactly; a quotient q >= 2^31 is truncated as (q - 2^31) + 2^31.
      const double q = (double(int32_t(a ^ 0x80000000u)) + 2147483648.0) / double(divisor);
      const bool high = q >= 2147483648.0;
      return A(uint32_t(int32_t(q - (high ? 2147483648.0 : 0.0))) + (high ? 0x80000000u : 0u));
    } else {
      return A(a / A(divisor));  // 64-bit: integer division (divisor > 0: no INT64_MIN / -1)
    }
  }
#if CHORUS_KERNELS_VECTOR_AVX2
  __m256 vec(__m256 v) const { return _mm256_div_ps(v, _mm256_set1_ps(float(divisor))); }
  __m256d vec(__m256d v) const { return _mm256_div_pd(v, _mm256_set1_pd(double(divisor))); }
#endif
#if CHORUS_KERNELS_VECTOR_AVX512
  __m512 vec(__m512 v) const { return _mm512_div_ps(v, _mm512_set1_ps(float(divisor))); }
  __m512d vec(__m512d v) const { return _mm512_div_pd(v, _mm512_set1_pd(double(divisor))); }
#endif
};

// Avg over a power-of-two divisor 2^k in a floating type: a * 2^-k. Both that product and the
// quotient a / 2^k are the correctly rounded value of the same real number (2^-k is exact), so the
// bits are the same, subnormal, infinite and NaN results included; a multiply issues every cycle
// where a division takes several (2-source avg in L2 on the EPYC: bfloat16 120 -> 181 GB/s,
// float32 with AVX2 161 -> 196).
template <typename A>
struct ScaleFinish {
  static_assert(!kIsInt<A>);
  static constexpr bool kIdentity = false;
  A scale;
  A operator()(A a) const { return a * scale; }
#if CHORUS_KERNELS_VECTOR_AVX2
  __m256 vec(__m256 v) const { return _mm256_mul_ps(v, _mm256_set1_ps(float(scale))); }
  __m256d vec(__m256d v) const { return _mm256_mul_pd(v, _mm256_set1_pd(double(scale))); }
#endif
#if CHORUS_KERNELS_VECTOR_AVX512
  __m512 vec(__m512 v) const { return _mm512_mul_ps(v, _mm512_set1_ps(float(scale))); }
  __m512d vec(__m512d v) const { return _mm512_mul_pd(v, _mm512_set1_pd(double(scale))); }
#endif
};

// ---- Vector loads and stores: Vec<T> (reduce_vec.hpp) -----------------------------------------

#include "cpu/reduce_vec.hpp"  // a fragment of this file (see there), inside this namespace

template <typename T>
inline constexpr bool kFloat16 = std::is_same_v<T, Half>;

// Op::vec(a, b), except for a float16 sum under AVX-512, which adds with a fused multiply-add
// (a * 1 + b: one rounding of the same exact sum, so the same bits; which NaN comes out of a sum is
// unspecified either way). On the EPYC (Zen 5) a float16 unit is bound by its conversions
// (vcvtph2ps, vcvtps2ph), which issue on the same two ports as additions, while multiply-adds
// issue on two others, idle here. (bfloat16 gained nothing measurable: docs/performance.md.)
template <typename Op, bool kHalf, typename V>
inline V combine(V a, V b) {
#if CHORUS_KERNELS_VECTOR_AVX512
  if constexpr (kHalf && std::is_same_v<Op, OpSum>) {  // accumulated in float32: V is __m512
    return _mm512_fmadd_ps(a, _mm512_set1_ps(1.0f), b);
  }
#endif
  return Op::vec(a, b);
}

// ---- Portable float16: chunks with a fast path ---------------------------------------------------
// Without F16C the exact branch-free conversions above cost some twenty SSE2 instructions per
// element. Most data are zeros and normal numbers, for which widening is a shift and an add and
// narrowing one rounding add; so the portable build converts float16 in chunks with the short
// loops, which also note whether any element needed the general conversion, and only then convert
// that chunk again the general way. The results are the same either way.

#if !CHORUS_KERNELS_VECTOR_AVX2
constexpr size_t kHalfChunk = 512;

template <typename T>
inline constexpr bool kIsHalf = std::is_same_v<T, Half>;

// Widens m halfs into out and returns out; an accumulator (float) is returned as it is. The short
// loop also notes whether any element needed the general one (subnormal, infinity or NaN), in
// which case the chunk, still intact in the source, is converted again.
inline const float* widen(const Half* p, size_t m, float* out) {
  uint32_t unusual = 0;
  for (size_t j = 0; j < m; ++j) {
    const uint32_t h = p[j].bits;
    const uint32_t mag = h & 0x7fffu;
    unusual |= uint32_t(mag - 1u < 0x03ffu) | uint32_t(mag >= 0x7c00u);
    const uint32_t normal = mag == 0 ? 0u : (mag << 13) + (uint32_t(127 - 15) << 23);
    out[j] = floatOf(normal | ((h & 0x8000u) << 16));
  }
  if (unusual != 0) {
    for (size_t j = 0; j < m; ++j) out[j] = halfToFloat(p[j].bits);
  }
  return out;
}
inline const float* widen(const float* p, size_t, float*) { return p; }

// Narrows m floats (a private buffer, so it can be read twice) into out the same way: the short
// loop covers zeros and results that round to normal halves.
inline void narrow(const float* r, size_t m, Half* out) {
  uint32_t unusual = 0;
  CHORUS_KERNELS_IVDEP
  for (size_t j = 0; j < m; ++j) {
    const uint32_t u = bitsOf(r[j]);
    const uint32_t a = u & 0x7fffffffu;
    unusual |= uint32_t(a - 0x38800000u >= 0x477ff000u - 0x38800000u) & uint32_t(a != 0);
    const uint32_t normal = ((a - (uint32_t(127 - 15) << 23)) + 0x0fffu + ((a >> 13) & 1u)) >> 13;
    out[j].bits = uint16_t((a == 0 ? 0u : normal) | ((u >> 16) & 0x8000u));
  }
  if (unusual != 0) {
    CHORUS_KERNELS_IVDEP
    for (size_t j = 0; j < m; ++j) out[j].bits = floatToHalf(r[j]);
  }
}

// binary() for float16 operands or results, a chunk at a time through float buffers.
template <typename Op, typename Fin, typename TO, typename TA, typename TB>
inline void binaryHalf(TO* d, const TA* a, const TB* b, size_t n, Fin fin) {
  alignas(64) float bufA[kHalfChunk], bufB[kHalfChunk], bufR[kHalfChunk];
  for (size_t base = 0; base < n; base += kHalfChunk) {
    const size_t m = minSize(kHalfChunk, n - base);
    const float* x = widen(a + base, m, bufA);
    const float* y = widen(b + base, m, bufB);
    if constexpr (kIsHalf<TO>) {
      for (size_t j = 0; j < m; ++j) bufR[j] = fin(Op::apply(x[j], y[j]));
      narrow(bufR, m, d + base);
    } else {
      float* out = d + base;  // the float accumulator, possibly the same as x
      CHORUS_KERNELS_IVDEP
      for (size_t j = 0; j < m; ++j) out[j] = fin(Op::apply(x[j], y[j]));
    }
  }
}
#endif

// ---- Element loops ------------------------------------------------------------------------------
// d[i] = finish(a[i] op b[i]) for i in [0, n), each side converted from its storage type to the
// accumulation type and the result back. d may be the same pointer as a or b (not otherwise
// overlapping), which is why the loops carry `ivdep` instead of relying on run-time alias checks:
// the checks reject d == a and would fall back to scalar code for the common in-place case.

template <typename Op, typename Fin, typename TO, typename TA, typename TB>
inline void binary(TO* d, const TA* a, const TB* b, size_t n, Fin fin) {
  size_t i = 0;
#if CHORUS_KERNELS_VECTOR_AVX2
  if constexpr (Vec<TO>::kOk && Vec<TA>::kOk && Vec<TB>::kOk) {
    constexpr size_t U = Vec<TA>::kUnit;
    static_assert(Vec<TB>::kUnit == U && Vec<TO>::kUnit == U);
    // Max/Min without a division return one of the (widened) operands: nothing to round.
    constexpr bool kExact = Op::kSelects && Fin::kIdentity;
    constexpr bool kHalf = kFloat16<TO> || kFloat16<TA> || kFloat16<TB>;
    for (; i + 2 * U <= n; i += 2 * U) {
      typename Vec<TA>::V a0, a1, a2, a3;
      typename Vec<TB>::V b0, b1, b2, b3;
      Vec<TA>::load(a + i, a0, a1);
      Vec<TB>::load(b + i, b0, b1);
      Vec<TA>::load(a + i + U, a2, a3);
      Vec<TB>::load(b + i + U, b2, b3);
      Vec<TO>::template store<kExact>(d + i, fin.vec(combine<Op, kHalf>(a0, b0)),
                                      fin.vec(combine<Op, kHalf>(a1, b1)));
      Vec<TO>::template store<kExact>(d + i + U, fin.vec(combine<Op, kHalf>(a2, b2)),
                                      fin.vec(combine<Op, kHalf>(a3, b3)));
    }
    if (i + U <= n) {
      typename Vec<TA>::V a0, a1;
      typename Vec<TB>::V b0, b1;
      Vec<TA>::load(a + i, a0, a1);
      Vec<TB>::load(b + i, b0, b1);
      Vec<TO>::template store<kExact>(d + i, fin.vec(combine<Op, kHalf>(a0, b0)),
                                      fin.vec(combine<Op, kHalf>(a1, b1)));
      i += U;
    }
  }
#else
  if constexpr (kIsHalf<TO> || kIsHalf<TA> || kIsHalf<TB>) {
    binaryHalf<Op>(d, a, b, n, fin);
    return;
  }
#endif
  CHORUS_KERNELS_IVDEP
  for (; i < n; ++i) {
    d[i] = Elem<TO>::store(fin(Op::apply(Elem<TA>::load(a[i]), Elem<TB>::load(b[i]))));
  }
}

// d[i] = finish(a[i]) (nsrcs == 1 with an Avg division).
template <typename Fin, typename T>
inline void unary(T* d, const T* a, size_t n, Fin fin) {
  size_t i = 0;
#if CHORUS_KERNELS_VECTOR_AVX2
  if constexpr (Vec<T>::kOk) {
    for (; i + Vec<T>::kUnit <= n; i += Vec<T>::kUnit) {
      typename Vec<T>::V lo, hi;
      Vec<T>::load(a + i, lo, hi);
      Vec<T>::store(d + i, fin.vec(lo), fin.vec(hi));
    }
  }
#endif
  CHORUS_KERNELS_IVDEP
  for (; i < n; ++i) d[i] = Elem<T>::store(fin(Elem<T>::load(a[i])));
}

template <typename T>
inline const T* src(const void* const* srcs, int k) {
  return static_cast<const T*>(srcs[k]);
}

// acc[i] = acc[i] op s[i]: the middle sources of a block. Not inlined so that GCC's unroll-and-jam
// cannot fuse consecutive sources into one loop, which it then fails to vectorise.
template <typename Op, typename Acc, typename T>
__attribute__((noinline)) void accumulate(Acc* acc, const T* s, size_t m) {
  binary<Op>(acc, acc, s, m, NoFinish{});
}

// acc[i] = ((acc[i] op s1[i]) op s2[i]) op s3[i]: three middle sources in one pass, a third of the
// accumulator loads and stores (L1 store bandwidth is what limits many sources otherwise).
template <typename Op, typename Acc, typename T>
__attribute__((noinline)) void accumulate3(Acc* acc, const T* s1, const T* s2, const T* s3, size_t m) {
  size_t i = 0;
#if CHORUS_KERNELS_VECTOR_AVX2
  if constexpr (Vec<T>::kOk) {
    constexpr size_t U = Vec<T>::kUnit;
    for (; i + U <= m; i += U) {
      typename Vec<Acc>::V a0, a1, x0, x1, y0, y1, z0, z1;
      Vec<Acc>::load(acc + i, a0, a1);
      Vec<T>::load(s1 + i, x0, x1);
      Vec<T>::load(s2 + i, y0, y1);
      Vec<T>::load(s3 + i, z0, z1);
      constexpr bool kHalf = kFloat16<T>;
      Vec<Acc>::store(acc + i, combine<Op, kHalf>(combine<Op, kHalf>(combine<Op, kHalf>(a0, x0), y0), z0),
                      combine<Op, kHalf>(combine<Op, kHalf>(combine<Op, kHalf>(a1, x1), y1), z1));
    }
  }
#else
  if constexpr (kIsHalf<T>) {  // the chunked float16 path, one source at a time
    binary<Op>(acc, acc, s1, m, NoFinish{});
    binary<Op>(acc, acc, s2, m, NoFinish{});
    binary<Op>(acc, acc, s3, m, NoFinish{});
    return;
  }
#endif
  CHORUS_KERNELS_IVDEP
  for (; i < m; ++i) {
    acc[i] = Op::apply(Op::apply(Op::apply(acc[i], Elem<T>::load(s1[i])), Elem<T>::load(s2[i])),
                       Elem<T>::load(s3[i]));
  }
}

template <typename T, typename Op, typename Fin>
void reduceWith(T* dst, const void* const* srcs, int nsrcs, size_t count, Fin fin) {
  using Acc = typename Elem<T>::Acc;
  if (nsrcs == 1) {
    unary(dst, src<T>(srcs, 0), count, fin);
    return;
  }
  if (nsrcs == 2) {
    binary<Op>(dst, src<T>(srcs, 0), src<T>(srcs, 1), count, fin);
    return;
  }
  constexpr size_t kBlock = kBlockBytes / sizeof(Acc);
  alignas(64) Acc acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = minSize(kBlock, count - base);
    binary<Op>(acc, src<T>(srcs, 0) + base, src<T>(srcs, 1) + base, m, NoFinish{});
    int k = 2;
    for (; k + 3 <= nsrcs - 1; k += 3) {
      accumulate3<Op>(acc, src<T>(srcs, k) + base, src<T>(srcs, k + 1) + base, src<T>(srcs, k + 2) + base, m);
    }
    for (; k < nsrcs - 1; ++k) accumulate<Op>(acc, src<T>(srcs, k) + base, m);
    binary<Op>(dst + base, acc, src<T>(srcs, nsrcs - 1) + base, m, fin);
  }
}

template <typename T>
void reduceTyped(void* dstv, const void* const* srcs, int nsrcs, size_t count, ReduceOp op, int avgDivisor) {
  using Acc = typename Elem<T>::Acc;
  T* dst = static_cast<T*>(dstv);
  const bool divide = op == ReduceOp::Avg && avgDivisor > 0;
  if (nsrcs == 1 && !divide) {
    if (dstv != srcs[0]) std::memcpy(dstv, srcs[0], count * sizeof(T));
    return;
  }
  switch (op) {
    case ReduceOp::Sum:
      return reduceWith<T, OpSum>(dst, srcs, nsrcs, count, NoFinish{});
    case ReduceOp::Prod:
      return reduceWith<T, OpProd>(dst, srcs, nsrcs, count, NoFinish{});
    case ReduceOp::Max:
      return reduceWith<T, OpMax>(dst, srcs, nsrcs, count, NoFinish{});
    case ReduceOp::Min:
      return reduceWith<T, OpMin>(dst, srcs, nsrcs, count, NoFinish{});
    case ReduceOp::Avg:
      if (!divide) return reduceWith<T, OpSum>(dst, srcs, nsrcs, count, NoFinish{});
      if constexpr (!kIsInt<Acc>) {
        if ((avgDivisor & (avgDivisor - 1)) == 0) {
          return reduceWith<T, OpSum>(dst, srcs, nsrcs, count, ScaleFinish<Acc>{Acc(1) / Acc(avgDivisor)});
        }
      }
      return reduceWith<T, OpSum>(dst, srcs, nsrcs, count, DivFinish<Acc>{avgDivisor});
  }
}

}  // namespace

#if defined(__SSE2__)
namespace {

// One 64-byte line, loaded and stored with non-temporal stores (d 64-byte aligned).
inline void streamLine(unsigned char* d, const unsigned char* s) {
#if CHORUS_KERNELS_VECTOR_AVX512
  _mm512_stream_si512(reinterpret_cast<__m512i*>(d), _mm512_loadu_si512(s));
#elif CHORUS_KERNELS_VECTOR_AVX2
  const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
  _mm256_stream_si256(reinterpret_cast<__m256i*>(d), x0);
  _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), x1);
#else
  const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
  const __m128i x2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
  const __m128i x3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
  _mm_stream_si128(reinterpret_cast<__m128i*>(d), x0);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), x1);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), x2);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), x3);
#endif
}

constexpr size_t kPageBytes = 4096;

}  // namespace
#endif

#if defined(__SSE2__)
namespace {

// One 64-byte line, loaded and stored through the cache (d 64-byte aligned). In 32-byte halves
// also where AVX-512 is there: a source at another offset within a line splits every 64-byte load
// across two lines, and on the AVX-512 EPYC VM a 128 KiB copy with the destination 40 bytes past
// the source ran at 57 GB/s with 64-byte loads against 103 with 32-byte ones (bench_kernels
// copy/*/cached/past40).
inline void copyLine(unsigned char* d, const unsigned char* s) {
#if CHORUS_KERNELS_VECTOR_AVX512 || CHORUS_KERNELS_VECTOR_AVX2
  const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
  _mm256_store_si256(reinterpret_cast<__m256i*>(d), x0);
  _mm256_store_si256(reinterpret_cast<__m256i*>(d + 32), x1);
#else
  const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
  const __m128i x2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
  const __m128i x3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
  _mm_store_si128(reinterpret_cast<__m128i*>(d), x0);
  _mm_store_si128(reinterpret_cast<__m128i*>(d + 16), x1);
  _mm_store_si128(reinterpret_cast<__m128i*>(d + 32), x2);
  _mm_store_si128(reinterpret_cast<__m128i*>(d + 48), x3);
#endif
}

// Streams whole 64-byte lines, blocks of kPages pages at a time, a line of each page in turn.
// Returns the bytes done (a multiple of the block); the caller streams the rest a line at a time.
template <unsigned kPages>
size_t streamBlocks(unsigned char* d, const unsigned char* s, size_t body) {
  constexpr size_t kBlock = kPages * kPageBytes;
  size_t i = 0;
  for (; i + kBlock <= body; i += kBlock) {
    for (size_t o = 0; o < kPageBytes; o += 64) {
      for (unsigned k = 0; k < kPages; ++k)
        streamLine(d + i + k * kPageBytes + o, s + i + k * kPageBytes + o);
    }
  }
  return i;
}

}  // namespace
#endif

// Copy with non-temporal stores: align the destination to 64 bytes, stream whole 64-byte lines,
// fence, copy the tail. `pages` (1, 2, 4 or 8; dispatch.cpp chooses it per CPU) > 1 goes blocks of
// that many pages a line of each page in turn, as glibc's large memcpy does: on the Xeon measured
// four store streams kept more of the write-combining buffers and DRAM rows busy than one; on the
// EPYC (Zen 5) one stream is the fastest (docs/performance.md, "The streaming copy").
void streamCopy(void* dstv, const void* srcv, size_t bytes, unsigned pages) {
#if defined(__SSE2__)
  auto* d = static_cast<unsigned char*>(dstv);
  const auto* s = static_cast<const unsigned char*>(srcv);
  const size_t head = minSize((64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63, bytes);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const size_t body = bytes & ~size_t(63);
  size_t i = 0;
  switch (pages) {
    case 2:
      i = streamBlocks<2>(d, s, body);
      break;
    case 4:
      i = streamBlocks<4>(d, s, body);
      break;
    case 8:
      i = streamBlocks<8>(d, s, body);
      break;
    default:  // 1: one stream
      break;
  }
  for (; i < body; i += 64) streamLine(d + i, s + i);
  _mm_sfence();
  std::memcpy(d + body, s + body, bytes - body);
#else
  (void)pages;
  std::memcpy(dstv, srcv, bytes);
#endif
}

void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor) {
  if (count == 0) return;
  switch (type) {
    case DataType::Int8:
      return reduceTyped<int8_t>(dst, srcs, nsrcs, count, op, avgDivisor);
    case DataType::Uint8:
      return reduceTyped<uint8_t>(dst, srcs, nsrcs, count, op, avgDivisor);
    case DataType::Int32:
      return reduceTyped<int32_t>(dst, srcs, nsrcs, count, op, avgDivisor);
    case DataType::Uint32:
      return reduceTyped<uint32_t>(dst, srcs, nsrcs, count, op, avgDivisor);
    case DataType::Int64:
      return reduceTyped<int64_t>(dst, srcs, nsrcs, count, op, avgDivisor);
    case DataType::Uint64:
      return reduceTyped<uint64_t>(dst, srcs, nsrcs, count, op, avgDivisor);
    case DataType::Float16:
      return reduceTyped<Half>(dst, srcs, nsrcs, count, op, avgDivisor);
    case DataType::Float32:
      return reduceTyped<float>(dst, srcs, nsrcs, count, op, avgDivisor);
    case DataType::Float64:
      return reduceTyped<double>(dst, srcs, nsrcs, count, op, avgDivisor);
    case DataType::BFloat16:
      return reduceTyped<BFloat16>(dst, srcs, nsrcs, count, op, avgDivisor);
  }
}

// memcpy, or where the destination and the source lie at different offsets within a line (from
// kLineCopyFrom): align the destination to 64 bytes, copy whole lines through the cache four at a
// time, then the tail.
void cachedCopy(void* dstv, const void* srcv, size_t bytes, unsigned /*pages*/) {
#if defined(__SSE2__)
  auto* d = static_cast<unsigned char*>(dstv);
  const auto* s = static_cast<const unsigned char*>(srcv);
  if (bytes < kLineCopyFrom ||
      ((reinterpret_cast<uintptr_t>(d) - reinterpret_cast<uintptr_t>(s)) & 63) == 0) {
    if (bytes != 0) std::memcpy(d, s, bytes);
    return;
  }
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const size_t body = bytes & ~size_t(63);
  size_t i = 0;
  for (; i + 256 <= body; i += 256) {
    copyLine(d + i, s + i);
    copyLine(d + i + 64, s + i + 64);
    copyLine(d + i + 128, s + i + 128);
    copyLine(d + i + 192, s + i + 192);
  }
  for (; i < body; i += 64) copyLine(d + i, s + i);
  std::memcpy(d + body, s + body, bytes - body);
#else
  if (bytes != 0) std::memcpy(dstv, srcv, bytes);
#endif
}

#if defined(__SSE2__)
namespace {

// One 64-byte line of s to a (64-byte aligned) and to b, loaded once: streaming stores into a
// where kStreamA, into b where kStreamB (b then 64-byte aligned too), else through the cache. In
// 32-byte halves where there are 256-bit registers, as copyLine.
template <bool kStreamA, bool kStreamB>
inline void copyLineToBoth(unsigned char* a, unsigned char* b, const unsigned char* s) {
#if CHORUS_KERNELS_VECTOR_AVX512 || CHORUS_KERNELS_VECTOR_AVX2
  for (size_t h = 0; h < 64; h += 32) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + h));
    if constexpr (kStreamA)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(a + h), x);
    else
      _mm256_store_si256(reinterpret_cast<__m256i*>(a + h), x);
    if constexpr (kStreamB)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(b + h), x);
    else
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + h), x);
  }
#else
  for (size_t h = 0; h < 64; h += 16) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + h));
    if constexpr (kStreamA)
      _mm_stream_si128(reinterpret_cast<__m128i*>(a + h), x);
    else
      _mm_store_si128(reinterpret_cast<__m128i*>(a + h), x);
    if constexpr (kStreamB)
      _mm_stream_si128(reinterpret_cast<__m128i*>(b + h), x);
    else
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b + h), x);
  }
#endif
}

template <bool kStreamA, bool kStreamB>
void copyBodyToBoth(unsigned char* a, unsigned char* b, const unsigned char* s, size_t body) {
  size_t i = 0;
  for (; i + 256 <= body; i += 256) {
    for (size_t l = 0; l < 256; l += 64) copyLineToBoth<kStreamA, kStreamB>(a + i + l, b + i + l, s + i + l);
  }
  for (; i < body; i += 64) copyLineToBoth<kStreamA, kStreamB>(a + i, b + i, s + i);
}

}  // namespace
#endif

// src to a and to b, each line of src loaded once: align a to 64 bytes (both destinations get the
// head), write whole lines to both, then the tail. The dispatcher passes a streaming destination
// as `a`, and streams into b only where b lies at a's offset within a line.
void copyToBoth(void* av, bool streamA, void* bv, bool streamB, const void* srcv, size_t bytes) {
#if defined(__SSE2__)
  auto* a = static_cast<unsigned char*>(av);
  auto* b = static_cast<unsigned char*>(bv);
  const auto* s = static_cast<const unsigned char*>(srcv);
  const size_t head = minSize((64 - (reinterpret_cast<uintptr_t>(a) & 63)) & 63, bytes);
  std::memcpy(a, s, head);
  std::memcpy(b, s, head);
  a += head;
  b += head;
  s += head;
  bytes -= head;
  const size_t body = bytes & ~size_t(63);
  if (streamA && streamB) {
    copyBodyToBoth<true, true>(a, b, s, body);
  } else if (streamA) {
    copyBodyToBoth<true, false>(a, b, s, body);
  } else {
    copyBodyToBoth<false, false>(a, b, s, body);
  }
  if (streamA) _mm_sfence();
  std::memcpy(a + body, s + body, bytes - body);
  std::memcpy(b + body, s + body, bytes - body);
#else
  (void)streamA;
  (void)streamB;
  std::memcpy(av, srcv, bytes);
  std::memcpy(bv, srcv, bytes);
#endif
}

void copy(void* dst, const void* src, size_t bytes, unsigned pages) {
  if (bytes >= kNonTemporalThreshold) {
    streamCopy(dst, src, bytes, pages);
  } else {
    cachedCopy(dst, src, bytes, pages);
  }
}

}  // namespace chorus::kernels::CHORUS_KERNELS_ISA

#undef CHORUS_KERNELS_IVDEP
#undef CHORUS_KERNELS_VECTOR_AVX2
#undef CHORUS_KERNELS_VECTOR_AVX512
#undef CHORUS_KERNELS_NATIVE_BF16

#endif  // CHORUS_KERNELS_CPU_REDUCE_IMPL_HPP_
