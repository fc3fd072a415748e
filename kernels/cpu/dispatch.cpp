// Run-time choice between the portable, AVX2 + F16C and AVX-512 kernels, made once per process.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#if defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#endif

#include "base/config.hpp"
#include "cpu/dispatch_internal.hpp"
#include "cpu/reduce.hpp"

namespace chorus::kernels {

namespace {

constexpr KernelImpl kPortable{
    "portable",           &portable::reduce, &portable::copy, &portable::streamCopy, &portable::cachedCopy,
    &portable::copyToBoth};
constexpr KernelImpl kAvx2{"avx2+f16c",       &avx2::reduce,     &avx2::copy,
                           &avx2::streamCopy, &avx2::cachedCopy, &avx2::copyToBoth};
constexpr KernelImpl kAvx512{
    "avx512", &avx512::reduce, &avx512::copy, &avx512::streamCopy, &avx512::cachedCopy, &avx512::copyToBoth};
constexpr KernelImpl kAvx512Bf16{"avx512+bf16",           &avx512bf16::reduce,     &avx512bf16::copy,
                                 &avx512bf16::streamCopy, &avx512bf16::cachedCopy, &avx512bf16::copyToBoth};

// The levels in order; CHORUS_CPU_KERNELS names the highest one allowed.
constexpr const char* kLevels[] = {"portable", "avx2", "avx512", "avx512bf16"};

const KernelImpl& choose() {
  const std::string& limit = envConfig().cpuKernels;
  const KernelImpl* byLevel[] = {&kPortable, avx2Kernels(), avx512Kernels(), avx512Bf16Kernels()};
  size_t top = std::size(kLevels) - 1;
  for (size_t i = 0; i < std::size(kLevels); ++i) {
    if (limit == kLevels[i]) top = i;
  }
  for (size_t i = top + 1; i-- > 0;) {
    if (byLevel[i] != nullptr) return *byLevel[i];
  }
  return kPortable;
}

}  // namespace

bool cpuSupportsAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();  // harmless if already done; needed if called before constructors ran
  // The "avx2" test includes the OS's support for the YMM state (XGETBV).
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
#if defined(__clang__)
  // Clang's __builtin_cpu_supports does not know "f16c": CPUID leaf 1, ECX bit 29.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && ((ecx >> 29) & 1u) != 0;
#else
  return __builtin_cpu_supports("f16c");
#endif
#else
  return false;
#endif
}

bool cpuSupportsAvx512() {
#if defined(__x86_64__) || defined(__i386__)
  // Each "avx512*" test includes the operating system's support for the ZMM and mask state.
  return cpuSupportsAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

bool cpuSupportsAvx512Bf16() {
#if defined(__x86_64__) || defined(__i386__)
  return cpuSupportsAvx512() && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

const KernelImpl& portableKernels() { return kPortable; }

const KernelImpl* avx2Kernels() { return cpuSupportsAvx2() ? &kAvx2 : nullptr; }
const KernelImpl* avx512Kernels() { return cpuSupportsAvx512() ? &kAvx512 : nullptr; }
const KernelImpl* avx512Bf16Kernels() { return cpuSupportsAvx512Bf16() ? &kAvx512Bf16 : nullptr; }

std::vector<const KernelImpl*> availableKernels() {
  std::vector<const KernelImpl*> all{&kPortable};
  for (const KernelImpl* k : {avx2Kernels(), avx512Kernels(), avx512Bf16Kernels()}) {
    if (k != nullptr) all.push_back(k);
  }
  return all;
}

const KernelImpl& activeKernels() {
  static const KernelImpl& chosen = choose();  // initialised once, thread-safe
  return chosen;
}

namespace {

struct StreamChoice {
  unsigned pages;
  const char* basis;
};

// One stream on AMD CPUs, four pages interleaved elsewhere: measured on the two machines this
// project runs on (docs/performance.md, "The streaming copy"): on the Xeon (Sapphire Rapids) four
// pages copied 24.5 GB/s where one stream did 17.0; on the EPYC (Zen 5) one stream copies 1.2x
// (vCPUs on one core complex) to 1.65x (on two, or one thread) as fast as four pages.
StreamChoice chooseStreamPages() {
  if (const int set = envConfig().ntCopyPages; set > 0)
    return {static_cast<unsigned>(set), "CHORUS_NT_COPY_PAGES"};
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_is("amd")) return {1, "AMD CPU"};
#endif
  return {4, "default"};
}

const StreamChoice& streamChoice() {
  static const StreamChoice chosen = chooseStreamPages();
  return chosen;
}

}  // namespace

unsigned streamPages() { return streamChoice().pages; }
const char* streamPagesBasis() { return streamChoice().basis; }

namespace {

void checkReduce(int nsrcs, DataType type, ReduceOp op) {
  if (nsrcs < 1) {
    throw Error(chorusInvalidArgument,
                "chorus::kernels::reduce: nsrcs must be >= 1, got " + std::to_string(nsrcs));
  }
  if (static_cast<unsigned>(type) >= static_cast<unsigned>(kNumDataTypes)) {
    throw Error(chorusInvalidArgument,
                "chorus::kernels::reduce: unknown data type " + std::to_string(static_cast<int>(type)));
  }
  if (static_cast<unsigned>(op) >= static_cast<unsigned>(kNumReduceOps)) {
    throw Error(chorusInvalidArgument,
                "chorus::kernels::reduce: unknown reduction op " + std::to_string(static_cast<int>(op)));
  }
}

}  // namespace

void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor) {
  checkReduce(nsrcs, type, op);
  if (count == 0) return;
  activeKernels().reduce(dst, srcs, nsrcs, count, type, op, avgDivisor);
}

namespace {

// A block of at most 16 KiB of output at a time reduced into a buffer in L1 (or into `also`, see
// viaAlso), then written to dst as copy(..., store) writes, and to `also` (when not null) as
// copy(..., alsoStore). Each block
// reads the sources at its offset before a destination is written there, so a destination that is
// one of the sources works as in reduce(). The buffer sits at the page offset of the destination
// memcpy writes (Handoff), if any: `rep movsb` slows down where its destination lies a few bytes
// past its source modulo 4 KiB; vector lines (Cached) and streaming stores do not care.
void reduceThroughL1(void* dst, CopyMode store, void* also, CopyMode alsoStore, const void* const* srcs,
                     int nsrcs, size_t count, DataType type, ReduceOp op, int avgDivisor) {
  constexpr size_t kBounceBytes = 16 * 1024;
  constexpr size_t kPage = 4096;
  const size_t elem = dataTypeSize(type);
  const KernelImpl& k = activeKernels();
  const void* memcpyDst = store == CopyMode::Handoff                 ? dst
                          : (also && alsoStore == CopyMode::Handoff) ? also
                                                                     : nullptr;
  alignas(kPage) std::byte area[kBounceBytes + kPage];
  std::byte* bounce = area + (reinterpret_cast<uintptr_t>(memcpyDst) & (kPage - 1));
  const size_t blockElems = kBounceBytes / elem;
  // Where `also` is written through the cache, its block is the buffer: reduced into it, then
  // copied from it (in L1) to dst; one pass through L1 less (the 2-rank allreduce's own slice,
  // 1.1-1.2x faster from 256 KiB to 2 MiB: docs/performance.md, "Its own slice straight to its
  // output"). Not where memcpy writes dst from another page offset (the buffer above is there).
  const bool viaAlso =
      also && alsoStore == CopyMode::Cached &&
      (store != CopyMode::Handoff ||
       ((reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(also)) & (kPage - 1)) == 0);
  constexpr int kInline = 64;
  const void* inlineSrcs[kInline];
  std::vector<const void*> manySrcs(nsrcs > kInline ? static_cast<size_t>(nsrcs) : 0);
  const void** moved = nsrcs > kInline ? manySrcs.data() : inlineSrcs;
  for (size_t off = 0; off < count; off += blockElems) {
    const size_t m = std::min(blockElems, count - off);
    for (int i = 0; i < nsrcs; ++i) moved[i] = static_cast<const std::byte*>(srcs[i]) + off * elem;
    if (viaAlso) {
      std::byte* a = static_cast<std::byte*>(also) + off * elem;
      k.reduce(a, moved, nsrcs, m, type, op, avgDivisor);
      copy(static_cast<std::byte*>(dst) + off * elem, a, m * elem, store);
      continue;
    }
    k.reduce(bounce, moved, nsrcs, m, type, op, avgDivisor);
    copy(static_cast<std::byte*>(dst) + off * elem, bounce, m * elem, store);
    if (also) copy(static_cast<std::byte*>(also) + off * elem, bounce, m * elem, alsoStore);
  }
}

}  // namespace

void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor, CopyMode store) {
  checkReduce(nsrcs, type, op);
  constexpr size_t kBounceBytes = 16 * 1024;
  const bool bounced = store == CopyMode::Handoff ||
                       (store == CopyMode::Streaming && count * dataTypeSize(type) > kBounceBytes);
  if (!bounced) {
    if (count != 0) activeKernels().reduce(dst, srcs, nsrcs, count, type, op, avgDivisor);
    return;
  }
  reduceThroughL1(dst, store, nullptr, store, srcs, nsrcs, count, type, op, avgDivisor);
}

void reduceToBoth(void* dst, CopyMode store, void* also, CopyMode alsoStore, const void* const* srcs,
                  int nsrcs, size_t count, DataType type, ReduceOp op, int avgDivisor) {
  checkReduce(nsrcs, type, op);
  reduceThroughL1(dst, store, also, alsoStore, srcs, nsrcs, count, type, op, avgDivisor);
}

void copy(void* dst, const void* src, size_t bytes, CopyMode mode) {
  if (bytes == 0) return;
  switch (mode) {
    case CopyMode::Auto:
      return activeKernels().copy(dst, src, bytes, streamPages());
    case CopyMode::Cached:
      return activeKernels().cachedCopy(dst, src, bytes, 0);
    case CopyMode::Handoff:  // memcpy's whole-line writes, whatever the offsets (reduce.hpp)
      std::memcpy(dst, src, bytes);
      return;
    case CopyMode::Streaming:
      return activeKernels().streamCopy(dst, src, bytes, streamPages());
  }
}

void copyToBoth(void* dst, CopyMode store, void* also, CopyMode alsoStore, const void* src, size_t bytes) {
  if (bytes == 0) return;
  // Auto as copy() takes it: streaming from its threshold (kNonTemporalThreshold in reduce_impl.hpp).
  constexpr size_t kAutoStreamingBytes = size_t{16} << 20;
  const auto streams = [bytes](CopyMode m) {
    return m == CopyMode::Streaming || (m == CopyMode::Auto && bytes >= kAutoStreamingBytes);
  };
  const bool streamDst = streams(store), streamAlso = streams(alsoStore);
  const bool lineApart = ((reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(also)) & 63) != 0;
  if (store == CopyMode::Handoff || alsoStore == CopyMode::Handoff ||
      (streamDst && streamAlso && lineApart)) {
    // memcpy's writes asked for, or two streaming destinations at different offsets within a
    // line: copy() into each, a block at a time, the second reading the block from L1.
    constexpr size_t kBlock = 16 * 1024;
    const CopyMode d = streamDst                    ? CopyMode::Streaming
                       : store == CopyMode::Handoff ? store
                                                    : CopyMode::Cached;
    const CopyMode a = streamAlso                       ? CopyMode::Streaming
                       : alsoStore == CopyMode::Handoff ? alsoStore
                                                        : CopyMode::Cached;
    for (size_t off = 0; off < bytes; off += kBlock) {
      const size_t m = std::min(kBlock, bytes - off);
      copy(static_cast<std::byte*>(dst) + off, static_cast<const std::byte*>(src) + off, m, d);
      copy(static_cast<std::byte*>(also) + off, static_cast<const std::byte*>(src) + off, m, a);
    }
    return;
  }
  if (streamAlso && !streamDst) return activeKernels().copyToBoth(also, true, dst, false, src, bytes);
  activeKernels().copyToBoth(dst, streamDst, also, streamAlso, src, bytes);
}

const char* simdLevel() { return activeKernels().name; }

}  // namespace chorus::kernels
