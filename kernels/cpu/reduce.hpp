// CPU reduction and copy kernels. Internal to libchorus (not installed).
//
// One portable implementation and one compiled for AVX2 + F16C (+FMA), chosen once at run time
// from the CPU's features (CHORUS_CPU_KERNELS=portable forces the portable one).
#pragma once

#include <cstddef>

#include "chorus/chorus.hpp"

namespace chorus::kernels {

/// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrcs-1][i], for i in [0, count).
///
/// - nsrcs >= 1 (nsrcs == 1 is a copy, with the Avg division below still applied).
/// - dst may be the same pointer as any srcs[k]; no other overlap is allowed.
/// - Integers wrap around (two's complement) on Sum/Prod overflow, never undefined behaviour.
/// - Float16/BFloat16 accumulate in float32 across all sources and round once (nearest even).
/// - ReduceOp::Avg reduces as Sum; when avgDivisor > 0 the result is then divided by avgDivisor
///   (integers: truncated toward zero; floats: computed in the accumulation type then rounded).
///   avgDivisor is ignored for other ops.
/// - NaN: Max/Min return the first NaN in source order (quieted for fp16/bf16); Sum/Prod/Avg with
///   a NaN give some NaN. Both implementations give bit-identical results for NaN-free inputs.
void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor);

/// How copy() writes its destination: which store instructions it uses.
enum class CopyMode {
  Auto,       ///< as Cached, switching to non-temporal stores for a single copy of 16 MiB or more
  Cached,     ///< through the cache: memcpy, or vector lines where destination and source lie at
              ///< different offsets within a 64-byte line (from 4 KiB; there glibc's `rep movsb`
              ///< ran up to 2x slower on Zen 4, 15-30x 1-15 bytes past): the destination ends up
              ///< in cache for a reader that follows
  Streaming,  ///< non-temporal stores: the destination bypasses the cache (no read-for-ownership)
  Handoff,    ///< copy(): memcpy; reduce(): through L1, then memcpy (for lines another core read last)
};

/// memcpy tuned for large buffers. Collectives copy a large output in many small pieces, so they
/// choose Streaming or Cached from the size of the whole output (outputCopyMode() in
/// src/algorithms/common.hpp).
void copy(void* dst, const void* src, size_t bytes, CopyMode mode = CopyMode::Auto);

/// reduce() with its stores chosen as copy()'s: Streaming reduces a block of at most 16 KiB of
/// output at a time into a buffer that stays in L1 and streams it to dst, so that a large output
/// costs no read-for-ownership of its lines (a quarter of a 2-source reduction's memory traffic).
/// Handoff reduces through the same kind of buffer, placed at dst's offset within a page, and
/// copies each block out with memcpy: where dst's lines sit in the cache of a core that does not
/// share this core's L3, memcpy's whole-line writes (`rep movsb`) take them several times faster
/// than the kernel's vector stores (docs/performance.md, "Writing what the peers read").
/// Cached and Auto: reduce() as above. The results are bit for bit reduce()'s; dst may be the same
/// pointer as any srcs[k], as there.
void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor, CopyMode store);

/// reduce() into two destinations: a block of at most 16 KiB of output at a time is reduced once
/// into a buffer in L1 and copied from there to `dst` (written as copy(..., store) writes) and to
/// `also` (as copy(..., alsoStore)); where `also` is Cached, reduced into `also` itself and copied
/// from there to `dst` (Handoff only where dst and also share their offset within a page). For a result that
/// goes both to this rank's output and to where its peers read it: one reduction and two writes, where
/// reduce() and a copy of its result would read the result back (from memory, if it was streamed). The
/// results are bit for bit reduce()'s; dst or also may be the same pointer as any srcs[k], as there; dst and
/// also must not overlap.
void reduceToBoth(void* dst, CopyMode store, void* also, CopyMode alsoStore, const void* const* srcs,
                  int nsrcs, size_t count, DataType type, ReduceOp op, int avgDivisor);

/// copy() into two destinations, each line of `src` loaded once: to `dst` as copy(..., store)
/// writes it and to `also` as copy(..., alsoStore) (Cached and Auto below copy()'s threshold by
/// the kernel's vector stores, whatever the offsets; Streaming with non-temporal stores; Handoff,
/// and two streaming destinations at different offsets within a line, by copy() into each, 16 KiB
/// at a time). For a block that goes both to this rank's output and to where its peers read it,
/// such as a staged all-gather's own block: one read of the input where two copies would read it
/// twice. dst, also and src must not overlap.
void copyToBoth(void* dst, CopyMode store, void* also, CopyMode alsoStore, const void* src, size_t bytes);

/// The implementation in use: "avx512+bf16", "avx512", "avx2+f16c" or "portable".
const char* simdLevel();

/// How many pages the streaming copy interleaves, chosen on first use: CHORUS_NT_COPY_PAGES if set
/// (1, 2, 4 or 8), else 1 on AMD CPUs and 4 on others (docs/performance.md, "The streaming copy").
unsigned streamPages();
/// Where streamPages() comes from: "CHORUS_NT_COPY_PAGES", "AMD CPU" or "default".
const char* streamPagesBasis();

}  // namespace chorus::kernels
