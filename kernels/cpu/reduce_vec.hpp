// Vec<T>: the vector loads and stores of reduce_impl.hpp, per element type, for AVX2 (256-bit
// registers) and AVX-512 (512-bit). A fragment of reduce_impl.hpp: included by it only, inside its
// per-ISA anonymous namespace, after the operations and with <immintrin.h> included; it is
// compiled once per instruction set with the rest of that file.

// ---- AVX2 loads and stores ---------------------------------------------------------------------
// The vector loops move units of two registers: 16 elements of the float-like types (float32 in
// eight lanes each), 8 of float64. Within a unit the lanes need not be in element order, only in
// the same order for every type sharing an accumulator: bfloat16 puts the even elements of a unit
// in the first register and the odd ones in the second (one shift or mask per register, no lane
// crossing), and the float32 accumulator of a bfloat16 reduction simply keeps them that way. The
// loops of one reduction all walk the same unit grid (and leave the same remainder to scalar
// code), so the permutation is undone by the final bfloat16 store.

#if CHORUS_KERNELS_VECTOR_AVX512
// AVX-512: units of two 512-bit registers (32 float-like elements, 16 float64); bfloat16 splits
// even and odd elements as the AVX2 build does, every other type is in element order.
template <typename T>
struct Vec {
  static constexpr bool kOk = false;
};
template <>
struct Vec<float> {
  static constexpr bool kOk = true;
  using V = __m512;
  static constexpr size_t kUnit = 32;
  static void load(const float* p, V& lo, V& hi) {
    lo = _mm512_loadu_ps(p);
    hi = _mm512_loadu_ps(p + 16);
  }
  template <bool kExact = false>
  static void store(float* p, V lo, V hi) {
    _mm512_storeu_ps(p, lo);
    _mm512_storeu_ps(p + 16, hi);
  }
};
template <>
struct Vec<double> {
  static constexpr bool kOk = true;
  using V = __m512d;
  static constexpr size_t kUnit = 16;
  static void load(const double* p, V& lo, V& hi) {
    lo = _mm512_loadu_pd(p);
    hi = _mm512_loadu_pd(p + 8);
  }
  template <bool kExact = false>
  static void store(double* p, V lo, V hi) {
    _mm512_storeu_pd(p, lo);
    _mm512_storeu_pd(p + 8, hi);
  }
};
template <>
struct Vec<Half> {
  static constexpr bool kOk = true;
  using V = __m512;
  static constexpr size_t kUnit = 32;
  static void load(const Half* p, V& lo, V& hi) {
    lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
  }
  // vcvtps2ph rounds to nearest even and keeps subnormals (MXCSR's FTZ does not apply to it), as
  // F16C's does: the same results as the AVX2 and portable builds.
  template <bool kExact = false>
  static void store(Half* p, V lo, V hi) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 16), _mm512_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT));
  }
};
template <>
struct Vec<BFloat16> {
  static constexpr bool kOk = true;
  using V = __m512;
  static constexpr size_t kUnit = 32;
  // One 64-byte load: lo = elements 0, 2, ..., 30 (each 16-bit pattern moved to the top of its
  // 32-bit lane is its float32 value), hi = elements 1, 3, ..., 31 (already at the top; clear the
  // bottom). A shift and a mask, no lane crossing: on the EPYC (Zen 5) the in-order widening
  // (vpmovzxwd + vpslld per 16 elements) kept the shift ports busy for 4 cycles a unit.
  static void load(const BFloat16* p, V& lo, V& hi) {
    const __m512i x = _mm512_loadu_si512(p);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    hi = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(int32_t(0xffff0000u))));
  }
  // The odd 16-bit words of the result from hi, the even ones from lo.
  static constexpr __mmask32 kOddWords = 0xaaaaaaaau;
  // float32 -> bfloat16 in the top 16 bits of each lane (the bottom ones are garbage), as
  // floatToBf16: round to nearest even (a carry reaches the exponent, and infinity at the top);
  // NaN keeps sign and top payload, made quiet.
  static __m512i roundAny(V v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    return _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), u, _mm512_set1_epi32(0x00400000));
  }
#if CHORUS_KERNELS_NATIVE_BF16
  // vcvtne2ps2bf16 rounds and quiets NaN exactly as roundAny() but turns float32 subnormals into
  // zero: used only where neither register holds one (vfpclassps class 0x20: denormal; one test of
  // both masks).
  static bool noSubnormal(V lo, V hi) {
    return _kortestz_mask16_u8(_mm512_fpclass_ps_mask(lo, 0x20), _mm512_fpclass_ps_mask(hi, 0x20));
  }
  // vcvtne2ps2bf16(hi, lo) gives lo's 16 results (the even elements) then hi's (the odd ones);
  // word k of the unit comes from word k / 2 + (k odd ? 16 : 0).
  static __m512i interleave(__m512i evenThenOdd) {
    const __m512i index = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,  //
                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(index, evenThenOdd);
  }
#endif
  // kExact (Max/Min: every value is a widened bfloat16): nothing to round.
  template <bool kExact = false>
  static void store(BFloat16* p, V lo, V hi) {
    const __m512i ulo = _mm512_castps_si512(lo);
    const __m512i uhi = _mm512_castps_si512(hi);
    __m512i out;
#if CHORUS_KERNELS_NATIVE_BF16
    if (!kExact && __builtin_expect(noSubnormal(lo, hi), 1)) {
      _mm512_storeu_si512(p, interleave(__builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(hi, lo))));
      return;
    }
#endif
    // One compare finds a NaN in either register; NaN payloads need roundAny().
    if (__builtin_expect(_mm512_cmp_ps_mask(lo, hi, _CMP_UNORD_Q) == 0, 1)) {
      // t = the truncated results (top halves), in element order.
      const __m512i t = _mm512_mask_blend_epi16(kOddWords, _mm512_srli_epi32(ulo, 16), uhi);
      if constexpr (kExact) {
        out = t;
      } else {
        // Round all 32 at once in 16-bit lanes, as the AVX2 store: low = the discarded bottom
        // halves; round up iff low + (t & 1) > 0x8000 (above half an ulp, or exactly half with an
        // odd t), a signed saturating add on low - 0x8000. A carry out of the mantissa moves to the
        // exponent (to infinity at the top).
        const __m512i low = _mm512_mask_blend_epi16(kOddWords, ulo, _mm512_slli_epi32(uhi, 16));
        const __m512i lsb = _mm512_and_si512(t, _mm512_set1_epi16(1));
        const __m512i excess =
            _mm512_adds_epi16(_mm512_xor_si512(low, _mm512_set1_epi16(int16_t(0x8000))), lsb);
        out = _mm512_mask_add_epi16(t, _mm512_cmpgt_epi16_mask(excess, _mm512_setzero_si512()), t,
                                    _mm512_set1_epi16(1));
      }
    } else {
      out = _mm512_mask_blend_epi16(kOddWords, _mm512_srli_epi32(roundAny(lo), 16), roundAny(hi));
    }
    _mm512_storeu_si512(p, out);
  }
};
#elif CHORUS_KERNELS_VECTOR_AVX2
template <typename T>
struct Vec {
  static constexpr bool kOk = false;
};
template <>
struct Vec<float> {
  static constexpr bool kOk = true;
  using V = __m256;
  static constexpr size_t kUnit = 16;
  static void load(const float* p, V& lo, V& hi) {
    lo = _mm256_loadu_ps(p);
    hi = _mm256_loadu_ps(p + 8);
  }
  template <bool kExact = false>
  static void store(float* p, V lo, V hi) {
    _mm256_storeu_ps(p, lo);
    _mm256_storeu_ps(p + 8, hi);
  }
};
template <>
struct Vec<double> {
  static constexpr bool kOk = true;
  using V = __m256d;
  static constexpr size_t kUnit = 8;
  static void load(const double* p, V& lo, V& hi) {
    lo = _mm256_loadu_pd(p);
    hi = _mm256_loadu_pd(p + 4);
  }
  template <bool kExact = false>
  static void store(double* p, V lo, V hi) {
    _mm256_storeu_pd(p, lo);
    _mm256_storeu_pd(p + 4, hi);
  }
};
template <>
struct Vec<Half> {
  static constexpr bool kOk = true;
  using V = __m256;
  static constexpr size_t kUnit = 16;
  static void load(const Half* p, V& lo, V& hi) {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
  template <bool kExact = false>
  static void store(Half* p, V lo, V hi) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8), _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT));
  }
};
template <>
struct Vec<BFloat16> {
  static constexpr bool kOk = true;
  using V = __m256;
  static constexpr size_t kUnit = 16;
  // The words move within their 32-bit lanes by byte shuffles, not shifts: on Zen 1 a 256-bit
  // shift costs two shuffles (a 2-source sum 23% faster, docs/performance.md); by published port
  // tables the two cost the same on Zen 3 and later and Ice Lake and later, and shuffles have
  // one port to the shifts' two on Intel cores before Ice Lake (not measured).
  // up(): each lane's bottom word to its top, zero below; down(): the top word to the bottom.
  static __m256i up(__m256i x) {
    return _mm256_shuffle_epi8(x, _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 4, 5, -1, -1, 8, 9, -1, -1, 12, 13,
                                                   -1, -1, 0, 1, -1, -1, 4, 5, -1, -1, 8, 9, -1, -1, 12, 13));
  }
  static __m256i down(__m256i x) {
    return _mm256_shuffle_epi8(
        x, _mm256_setr_epi8(2, 3, -1, -1, 6, 7, -1, -1, 10, 11, -1, -1, 14, 15, -1, -1, 2, 3, -1, -1, 6, 7,
                            -1, -1, 10, 11, -1, -1, 14, 15, -1, -1));
  }
  // lo: elements 0, 2, ..., 14 (each 16-bit pattern moved to the top of its 32-bit lane is its
  // float32 value); hi: elements 1, 3, ..., 15 (already at the top; clear the bottom).
  static void load(const BFloat16* p, V& lo, V& hi) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(up(x));
    hi = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(int32_t(0xffff0000u))));
  }
  // float32 -> bfloat16 in the top 16 bits of each lane (the bottom ones are garbage), rounded to
  // nearest even; NaN keeps sign and top payload and is made quiet.
  static __m256i roundAny(V v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    const __m256i nan = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    return _mm256_blendv_epi8(r, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  }
  // kExact: every value is already a bfloat16 widened (Max/Min select one), so no rounding.
  template <bool kExact = false>
  static void store(BFloat16* p, V lo, V hi) {
    const __m256i ulo = _mm256_castps_si256(lo);
    const __m256i uhi = _mm256_castps_si256(hi);
    __m256i out;
    // One compare finds a NaN in either register; NaN payloads need the slower rounding below.
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(lo, hi, _CMP_UNORD_Q)) == 0, 1)) {
      // t = the truncated results (top halves), in element order.
      const __m256i t = _mm256_blend_epi16(down(ulo), uhi, 0xaa);
      if constexpr (kExact) {
        out = t;
      } else {
        // Round all 16 at once in 16-bit lanes: low = the discarded bottom halves. Round up iff
        // low + (t & 1) > 0x8000, i.e. above half an ulp, or exactly half with an odd t; computed
        // as a signed saturating add on low - 0x8000. A carry out of the mantissa moves to the
        // exponent (to infinity at the top).
        const __m256i low = _mm256_blend_epi16(ulo, up(uhi), 0xaa);
        const __m256i lsb = _mm256_and_si256(t, _mm256_set1_epi16(1));
        const __m256i excess =
            _mm256_adds_epi16(_mm256_xor_si256(low, _mm256_set1_epi16(int16_t(0x8000))), lsb);
        out = _mm256_sub_epi16(t, _mm256_cmpgt_epi16(excess, _mm256_setzero_si256()));  // t + 1 where up
      }
    } else {
      out = _mm256_blend_epi16(_mm256_srli_epi32(roundAny(lo), 16), roundAny(hi), 0xaa);  // odd words from hi
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), out);
  }
};
#endif
