// chorus-cuda-bench: the CUDA reduction kernels against a device-to-device copy of the same bytes
// (the roofline), per type and size. Bytes counted are those read plus those written: a copy of n
// elements moves 2n, a two-source reduction 3n. Without a device it says so and exits 77.
//
//   chorus-cuda-bench [--max-mib 1024] [--iters 20] [--sources 2]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/cuda_kernels.hpp"

using namespace chorus;
namespace cu = chorus::kernels::cuda;

int main(int argc, char** argv) {
  size_t maxMiB = 1024;
  int iters = 20, sources = 2;
  CLI::App app{"CUDA reduction kernels against a device-to-device copy"};
  app.add_option("--max-mib", maxMiB, "largest output size, MiB")->check(CLI::Range(1, 16384));
  app.add_option("--iters", iters, "timed calls per size")->check(CLI::PositiveNumber);
  app.add_option("--sources", sources, "sources per reduction")->check(CLI::Range(1, cu::kMaxSources));
  CLI11_PARSE(app, argc, argv);
  std::string why;
  if (cu::deviceCount(&why) == 0) {
    std::fprintf(stderr, "chorus-cuda-bench: no CUDA device (%s)\n", why.c_str());
    return 77;
  }
  try {
    std::printf("# %s, %d sources, %d calls per size\n\n", cu::deviceName().c_str(), sources, iters);
    std::printf("| type | output | copy GB/s | reduce GB/s | reduce / copy |\n|---|---|---|---|---|\n");
    const DataType types[] = {DataType::Float32, DataType::BFloat16, DataType::Float16, DataType::Float64,
                              DataType::Int32};
    const size_t maxBytes = maxMiB << 20;
    std::vector<void*> bufs(sources + 1);
    for (auto& b : bufs) b = cu::deviceAlloc(maxBytes);
    void* copyDst = cu::deviceAlloc(maxBytes);
    for (DataType type : types) {
      for (size_t bytes = size_t{1} << 20; bytes <= maxBytes; bytes <<= 2) {
        const size_t count = bytes / dataTypeSize(type);
        std::vector<const void*> srcs(bufs.begin() + 1, bufs.end());
        // Warm up both, then time.
        cu::copyOnDevice(copyDst, bufs[1], bytes, nullptr);
        cu::reduce(bufs[0], srcs.data(), sources, count, type, ReduceOp::Sum, 0, nullptr);
        cu::synchronize();
        const double copyMs =
            cu::timeOnDevice(nullptr, iters, [&] { cu::copyOnDevice(copyDst, bufs[1], bytes, nullptr); });
        const double redMs = cu::timeOnDevice(nullptr, iters, [&] {
          cu::reduce(bufs[0], srcs.data(), sources, count, type, ReduceOp::Sum, 0, nullptr);
        });
        const double copyGBs = 2.0 * bytes / (copyMs * 1e6);
        const double redGBs = (sources + 1.0) * bytes / (redMs * 1e6);
        std::printf("| %s | %zu MiB | %.0f | %.0f | %.0f%% |\n", dataTypeName(type), bytes >> 20, copyGBs,
                    redGBs, 100.0 * redGBs / copyGBs);
      }
    }
    for (auto* b : bufs) cu::deviceFree(b);
    cu::deviceFree(copyDst);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-cuda-bench: %s\n", e.what());
    return 1;
  }
}
