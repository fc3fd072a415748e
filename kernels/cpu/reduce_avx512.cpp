// AVX-512 CPU kernels: this file is compiled with AVX-512 F/BW/VL/DQ on top of the AVX2 flags
// (kernels/CMakeLists.txt) and only called when the CPU has them (dispatch.cpp). The loops of
// reduce_impl.hpp on 512-bit registers; bfloat16 is rounded with integer instructions.
#if defined(__x86_64__) || defined(__i386__)
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512DQ__)
#error "reduce_avx512.cpp must be compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq"
#endif
#endif
#define CHORUS_KERNELS_ISA avx512
#include "cpu/reduce_impl.hpp"
