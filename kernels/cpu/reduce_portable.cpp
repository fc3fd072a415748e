// Portable CPU kernels: compiled for the baseline target (SSE2 on x86-64), relying on the
// compiler's auto-vectorisation of the loops in reduce_impl.hpp.
#define CHORUS_KERNELS_ISA portable
#include "cpu/reduce_impl.hpp"
