// Two threads passing staging blocks, as a staged collective does (docs/perf/2026-12-06c-stage-slots).
//   g++ -O2 -march=native -std=c++20 handoff.cpp -o handoff -lpthread
//   ./handoff nt KiB N      each way of writing the block (stores, streaming, prefetchw, memcpy)
//   ./handoff slots KiB N   the writer rotating through 1-16 blocks, streaming, the reader flushing
#include <immintrin.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
using Clock = std::chrono::steady_clock;
static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}
struct alignas(128) C {
  std::atomic<uint64_t> v{0};
};
C arr[2];
void meet(int me, uint64_t& c) {
  ++c;
  arr[me].v.store(c, std::memory_order_release);
  while (arr[1 - me].v.load(std::memory_order_acquire) < c) _mm_pause();
}
static size_t B = 512 << 10;
void copyStores(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    _mm512_store_si512((void*)(d + i), _mm512_load_si512((const void*)(s + i)));
  }
}
void copyNT(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    _mm512_stream_si512((__m512i*)(d + i), _mm512_load_si512((const void*)(s + i)));
  }
  _mm_sfence();
}
template <int D>
void copyPW(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    if (i + D * 64 < n) _m_prefetchw(d + i + D * 64);
    _mm512_store_si512((void*)(d + i), _mm512_load_si512((const void*)(s + i)));
  }
}
void copyPWall(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) _m_prefetchw(d + i);
  copyStores(d, s, n);
}
double rt() {  // the cache-line round trip between CPUs 0 and 1, ns (median)
  std::atomic<int> x{0};
  std::vector<double> v;
  std::thread t([&] {
    pin(1);
    for (int i = 0; i < 400; i++) {
      while (x.load() != 2 * i + 1)
        ;
      x.store(2 * i + 2);
    }
  });
  pin(0);
  for (int i = 0; i < 400; i++) {
    auto a = Clock::now();
    x.store(2 * i + 1);
    while (x.load() != 2 * i + 2)
      ;
    v.push_back(std::chrono::duration<double, std::nano>(Clock::now() - a).count());
  }
  t.join();
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
// Each thread's buffers: a source block, `blocks` staging blocks and a destination block, page
// aligned, filled by the thread that will use them (allocate(me, ...) runs on thread me).
struct Buffers {
  char *src[2] = {}, *stg[2] = {}, *dst[2] = {};
  void allocate(int me, size_t blocks) {
    src[me] = (char*)aligned_alloc(4096, B);
    stg[me] = (char*)aligned_alloc(4096, B * blocks);
    dst[me] = (char*)aligned_alloc(4096, B);
    memset(src[me], me + 1, B);
    memset(stg[me], 0, B * blocks);
    memset(dst[me], 0, B);
  }
  ~Buffers() {
    for (int me = 0; me < 2; me++) {
      free(src[me]);
      free(stg[me]);
      free(dst[me]);
    }
  }
};
// One repetition: two threads pinned to CPUs 0 and 1, each with its buffers (`blocks` staging
// blocks), meet, then run `exchanges(me, buf, meetings)`; prints "rt BEFORE/AFTER ns" (the
// placement) ahead of what the caller prints.
template <typename F>
void runPair(size_t blocks, F&& exchanges) {
  const double before = rt();
  Buffers buf;
  arr[0].v = 0;
  arr[1].v = 0;
  auto body = [&](int me) {
    pin(me);
    uint64_t c = 0;
    buf.allocate(me, blocks);
    meet(me, c);
    exchanges(me, buf, c);
  };
  std::thread t0(body, 0), t1(body, 1);
  t0.join();
  t1.join();
  printf("rt %.0f/%.0f ns", before, rt());
}
int mainNt(int argc, char** argv) {
  if (argc > 1) B = strtoul(argv[1], 0, 0) << 10;
  const char* names[] = {"stores", "nt", "pw8", "pw32", "pw128", "pwall", "memcpy"};
  const int K = 7;
  for (int rep = 0; rep < (argc > 2 ? atoi(argv[2]) : 10); rep++) {
    std::vector<double> w[K], rd[K];
    runPair(1, [&](int me, Buffers& buf, uint64_t& c) {
      auto& src = buf.src;
      auto& stg = buf.stg;
      auto& dst = buf.dst;
      for (int i = 0; i < K * 30 + 2; i++) {
        int k = i % K;
        meet(me, c);
        auto a = Clock::now();
        switch (k) {
          case 0:
            copyStores(stg[me], src[me], B);
            break;
          case 1:
            copyNT(stg[me], src[me], B);
            break;
          case 2:
            copyPW<8>(stg[me], src[me], B);
            break;
          case 3:
            copyPW<32>(stg[me], src[me], B);
            break;
          case 4:
            copyPW<128>(stg[me], src[me], B);
            break;
          case 5:
            copyPWall(stg[me], src[me], B);
            break;
          case 6:
            memcpy(stg[me], src[me], B);
        }
        meet(me, c);
        auto b = Clock::now();
        memcpy(dst[me], stg[1 - me], B);
        meet(me, c);
        auto e = Clock::now();
        if (me == 0 && i >= K) {
          w[k].push_back(B / std::chrono::duration<double, std::micro>(b - a).count() / 1e3);
          rd[k].push_back(B / std::chrono::duration<double, std::micro>(e - b).count() / 1e3);
        }
      }
    });
    printf(":");
    for (int k = 0; k < K; k++) {
      std::sort(w[k].begin(), w[k].end());
      std::sort(rd[k].begin(), rd[k].end());
      printf(" %s w%.1f r%.1f;", names[k], w[k][w[k].size() / 2], rd[k][rd[k].size() / 2]);
    }
    printf("\n");
    fflush(stdout);
  }
  return 0;
}
void flushAfter(const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) _mm_clflushopt((void*)(s + i));
}
// variant: R rotating blocks, mode 0 stores 1 nt 2 stores+reader clflushopt
struct V {
  int R;
  int mode;
  const char* name;
};
int mainSlots(int argc, char** argv) {
  if (argc > 1) B = strtoul(argv[1], 0, 0) << 10;
  V vs[] = {{1, 0, "R1"},   {2, 0, "R2"},   {4, 0, "R4"},  {8, 0, "R8"},
            {16, 0, "R16"}, {1, 1, "R1nt"}, {1, 2, "R1fl"}};
  const int K = sizeof vs / sizeof vs[0];
  for (int rep = 0; rep < (argc > 2 ? atoi(argv[2]) : 10); rep++) {
    std::vector<double> tot[K], w[K];
    runPair(16, [&](int me, Buffers& buf, uint64_t& c) {
      auto& src = buf.src;
      auto& stg = buf.stg;
      auto& dst = buf.dst;
      for (int k = 0; k < K; k++) {
        for (int i = 0; i < 200; i++) {
          V v = vs[k];
          char* sm = stg[me] + (i % v.R) * B;
          const char* sp = stg[1 - me] + (i % v.R) * B;
          meet(me, c);
          auto a = Clock::now();
          if (v.mode == 1)
            copyNT(sm, src[me], B);
          else
            copyStores(sm, src[me], B);
          auto a2 = Clock::now();
          meet(me, c);
          memcpy(dst[me], sp, B);
          if (v.mode == 2) flushAfter(sp, B);
          meet(me, c);
          auto e = Clock::now();
          if (me == 0 && i >= 2 * v.R + 2) {
            tot[k].push_back(std::chrono::duration<double, std::micro>(e - a).count());
            w[k].push_back(std::chrono::duration<double, std::micro>(a2 - a).count());
          }
        }
      }
    });
    printf(", us per %zuK handoff (write):", B >> 10);
    for (int k = 0; k < K; k++) {
      std::sort(tot[k].begin(), tot[k].end());
      std::sort(w[k].begin(), w[k].end());
      printf(" %s %.1f(%.1f);", vs[k].name, tot[k][tot[k].size() / 2], w[k][w[k].size() / 2]);
    }
    printf("\n");
    fflush(stdout);
  }
  return 0;
}
int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: handoff nt|slots [KiB [N]]\n");
    return 2;
  }
  const bool nt = strcmp(argv[1], "nt") == 0;
  return nt ? mainNt(argc - 1, argv + 1) : mainSlots(argc - 1, argv + 1);
}
