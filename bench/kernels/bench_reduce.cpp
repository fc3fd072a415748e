// Bandwidth of the CPU reduction kernels, every implementation this CPU runs, against memcpy.
//
// GB/s counts bytes read plus bytes written (10^9 bytes per second): a 2-source reduce of N bytes
// per source moves 3N, a memcpy of N bytes 2N. Sizes are per source buffer: 64 KiB stays in L2
// (3 x 64 KiB < 512 KiB), 64 MiB goes to DRAM (3 x 64 MiB > the 32 MiB L3). Rates use CPU time
// (Google Benchmark's default), which is the same as wall time on an idle machine and less
// disturbed on a shared one; compare medians of --benchmark_repetitions.
//
//   bench_kernels --benchmark_filter='(float32|bfloat16|float16)/sum/2src|memcpy'
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu/dispatch_internal.hpp"
#include "cpu/reduce.hpp"

namespace {

using chorus::DataType;
using chorus::ReduceOp;
using chorus::kernels::KernelImpl;

constexpr size_t kL2Bytes = size_t(64) << 10;
constexpr size_t kDramBytes = size_t(64) << 20;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Buffers kept across benchmarks: (slot, size) -> 64-byte aligned memory, filled with 0x3c bytes
// (a normal, moderate value in every floating type: products neither overflow nor go subnormal).
void* buffer(int slot, size_t bytes) {
  static std::map<std::pair<int, size_t>, std::unique_ptr<void, FreeDeleter>> pool;
  auto& p = pool[{slot, bytes}];
  if (!p) {
    p.reset(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    std::memset(p.get(), 0x3c, bytes);
  }
  return p.get();
}

const char* opName(ReduceOp op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  return kNames[static_cast<int>(op)];
}

std::string sizeName(size_t bytes) {
  return bytes >= (size_t(1) << 20) ? std::to_string(bytes >> 20) + "MiB"
                                    : std::to_string(bytes >> 10) + "KiB";
}

void setRate(benchmark::State& state, size_t bytesPerIteration) {
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytesPerIteration));
  state.counters["GB/s"] =
      benchmark::Counter(double(bytesPerIteration) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void benchReduce(benchmark::State& state, const KernelImpl* impl, DataType type, ReduceOp op, int nsrcs,
                 size_t bytesPerSource) {
  const size_t count = bytesPerSource / dataTypeSize(type);
  std::vector<const void*> srcs;
  for (int k = 0; k < nsrcs; ++k) srcs.push_back(buffer(k, bytesPerSource));
  void* dst = buffer(100, bytesPerSource);
  for (auto _ : state) {
    impl->reduce(dst, srcs.data(), nsrcs, count, type, op, nsrcs);
    benchmark::ClobberMemory();
  }
  setRate(state, size_t(nsrcs + 1) * count * dataTypeSize(type));
}

void benchMemcpy(benchmark::State& state, size_t bytes) {
  const void* src = buffer(0, bytes);
  void* dst = buffer(100, bytes);
  for (auto _ : state) {
    std::memcpy(dst, src, bytes);
    benchmark::ClobberMemory();
  }
  setRate(state, 2 * bytes);
}

void benchCopy(benchmark::State& state, const KernelImpl* impl, size_t bytes) {
  const void* src = buffer(0, bytes);
  void* dst = buffer(100, bytes);
  for (auto _ : state) {
    impl->copy(dst, src, bytes, chorus::kernels::streamPages());
    benchmark::ClobberMemory();
  }
  setRate(state, 2 * bytes);
}

// A copy whose destination lies `past` bytes beyond the source's offset within a page: memcpy
// against the kernels' Cached copy (vector lines where the two lie at different offsets in a line).
void benchCopyPast(benchmark::State& state, const KernelImpl* impl, size_t bytes, size_t past) {
  const auto* src = static_cast<const unsigned char*>(buffer(0, bytes + 4096));
  auto* dst = static_cast<unsigned char*>(buffer(100, bytes + 4096)) + past;
  for (auto _ : state) {
    if (impl == nullptr) {
      std::memcpy(dst, src, bytes);
    } else {
      impl->cachedCopy(dst, src, bytes, 0);
    }
    benchmark::ClobberMemory();
  }
  setRate(state, 2 * bytes);
}

void benchStreamCopy(benchmark::State& state, const KernelImpl* impl, size_t bytes, unsigned pages) {
  const void* src = buffer(0, bytes);
  void* dst = buffer(100, bytes);
  for (auto _ : state) {
    impl->streamCopy(dst, src, bytes, pages);
    benchmark::ClobberMemory();
  }
  setRate(state, 2 * bytes);
}

void registerAll() {
  const std::vector<const KernelImpl*> impls = chorus::kernels::availableKernels();
  const DataType types[] = {DataType::Float32, DataType::BFloat16, DataType::Float16, DataType::Float64,
                            DataType::Int8,    DataType::Uint8,    DataType::Int32,   DataType::Uint32,
                            DataType::Int64,   DataType::Uint64};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};

  for (size_t bytes : {kL2Bytes, kDramBytes}) {
    benchmark::RegisterBenchmark(("memcpy/" + sizeName(bytes)).c_str(), benchMemcpy, bytes);
    for (const KernelImpl* impl : impls) {
      for (DataType type : types) {
        for (ReduceOp op : ops) {
          const std::string name = std::string("reduce/") + impl->name + "/" + dataTypeName(type) + "/" +
                                   opName(op) + "/2src/" + sizeName(bytes);
          benchmark::RegisterBenchmark(name.c_str(), benchReduce, impl, type, op, 2, bytes);
        }
      }
    }
  }
  // Many sources (the blocked path): 8 x 32 KiB + dst fits in L2; 8 x 16 MiB does not fit in L3.
  for (size_t bytes : {size_t(32) << 10, size_t(16) << 20}) {
    for (const KernelImpl* impl : impls) {
      for (DataType type : {DataType::Float32, DataType::BFloat16, DataType::Float16}) {
        const std::string name =
            std::string("reduce/") + impl->name + "/" + dataTypeName(type) + "/sum/8src/" + sizeName(bytes);
        benchmark::RegisterBenchmark(name.c_str(), benchReduce, impl, type, ReduceOp::Sum, 8, bytes);
      }
    }
  }
  // Copies of 128 KiB in L2 with the destination 0, 8, 16 or 40 bytes past the source within a
  // page: memcpy (`rep movsb` in glibc 2.36 from 2 KiB) against the kernels' Cached copy.
  for (size_t past : {size_t(0), size_t(8), size_t(16), size_t(40)}) {
    const size_t bytes = size_t(128) << 10;
    const std::string tail = "/past" + std::to_string(past) + "/" + sizeName(bytes);
    benchmark::RegisterBenchmark(("copy/memcpy" + tail).c_str(), benchCopyPast, nullptr, bytes, past);
    for (const KernelImpl* impl : impls) {
      benchmark::RegisterBenchmark((std::string("copy/") + impl->name + "/cached" + tail).c_str(),
                                   benchCopyPast, impl, bytes, past);
    }
  }
  // copy(): memcpy below the non-temporal threshold (16 MiB), streaming stores from it on.
  for (size_t bytes :
       {size_t(64) << 10, size_t(8) << 20, size_t(16) << 20, size_t(32) << 20, size_t(64) << 20}) {
    benchmark::RegisterBenchmark(("copy/memcpy/" + sizeName(bytes)).c_str(), benchMemcpy, bytes);
    for (const KernelImpl* impl : impls) {
      benchmark::RegisterBenchmark((std::string("copy/") + impl->name + "/" + sizeName(bytes)).c_str(),
                                   benchCopy, impl, bytes);
      // Non-temporal stores at every size (CopyMode::Streaming, which the collectives choose for
      // outputs of CHORUS_NT_STORE_BYTES and more), one store stream and 2 or 4 pages interleaved
      // (CHORUS_NT_COPY_PAGES).
      for (unsigned pages : {1u, 2u, 4u}) {
        benchmark::RegisterBenchmark((std::string("copy/") + impl->name + "/streaming/" +
                                      std::to_string(pages) + "p/" + sizeName(bytes))
                                         .c_str(),
                                     benchStreamCopy, impl, bytes, pages);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  registerAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
