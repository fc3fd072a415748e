// AVX2 + F16C (+FMA) CPU kernels: this file is compiled with -mavx2 -mf16c -mfma (see
// kernels/CMakeLists.txt) and only called when the CPU has those features (dispatch.cpp).
// Float types use the explicit AVX2/F16C loops of reduce_impl.hpp; integer types are
// auto-vectorised for AVX2.
#if !defined(__AVX2__) || !defined(__F16C__)
#if defined(__x86_64__) || defined(__i386__)
#error "reduce_avx2.cpp must be compiled with -mavx2 -mf16c"
#endif
#endif
#define CHORUS_KERNELS_ISA avx2
#include "cpu/reduce_impl.hpp"
