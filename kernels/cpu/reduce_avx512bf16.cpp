// AVX-512 CPU kernels with AVX512_BF16: as reduce_avx512.cpp, but float32 -> bfloat16 uses
// vcvtne2ps2bf16 (guarded against the subnormals it flushes, see Vec<BFloat16> in reduce_vec.hpp).
// Called only when the CPU has AVX512_BF16 (dispatch.cpp).
#if defined(__x86_64__) || defined(__i386__)
#if !defined(__AVX512F__) || !defined(__AVX512BF16__)
#error "reduce_avx512bf16.cpp must be compiled with the AVX-512 flags and -mavx512bf16"
#endif
#endif
#define CHORUS_KERNELS_ISA avx512bf16
#include "cpu/reduce_impl.hpp"
