#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cpu/reduce.hpp"
using namespace chorus;
using clk = std::chrono::steady_clock;
int main(int argc, char** argv) {
  size_t bytes = size_t(atoi(argv[1])) << 20;
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  bool huge = argc > 3 && atoi(argv[3]);
  size_t n = bytes / 4;
  struct B {
    float *a, *b, *d;
  };
  std::vector<B> bs(threads);
  for (auto& x : bs) {
    x.a = (float*)aligned_alloc(1 << 21, bytes);
    x.b = (float*)aligned_alloc(1 << 21, bytes);
    x.d = (float*)aligned_alloc(1 << 21, bytes);
    if (huge)
      for (void* p : {(void*)x.a, (void*)x.b, (void*)x.d}) madvise(p, bytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < n; ++i) {
      x.a[i] = 1;
      x.b[i] = 2;
      x.d[i] = 0;
    }
  }
  const char* names[] = {"oop streaming",      "oop cached",     "in place cached",
                         "in place streaming", "copy streaming", "copy cached"};
  for (int rep = 0; rep < 5; ++rep)
    for (int m = 0; m < 6; ++m) {
      auto t0 = clk::now();
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
          B& x = bs[t];
          const void* srcs[2] = {x.a, x.b};
          void* dst = m < 2 ? (void*)x.d : (void*)x.a;
          kernels::CopyMode mode =
              (m == 0 || m == 3) ? kernels::CopyMode::Streaming : kernels::CopyMode::Cached;
          if (m >= 4) {
            for (int it = 0; it < 4; ++it)
              kernels::copy(x.d, x.a, bytes,
                            m == 4 ? kernels::CopyMode::Streaming : kernels::CopyMode::Cached);
            return;
          }
          for (int it = 0; it < 4; ++it)
            kernels::reduce(dst, srcs, 2, n, DataType::Float32, ReduceOp::Sum, 0, mode);
        });
      for (auto& t : ts) t.join();
      double s = std::chrono::duration<double>(clk::now() - t0).count() / 4;
      printf("%-20s %8.2f ms  %6.1f GB/s (%d streams)\n", names[m], s * 1e3,
             (m >= 4 ? 2.0 : 3.0) * bytes * threads / s / 1e9, m >= 4 ? 2 : 3);
    }
}
