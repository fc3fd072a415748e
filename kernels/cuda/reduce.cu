// CUDA reduction kernels (kernels/cuda/cuda_kernels.hpp): every dtype and op, 16-byte loads and
// stores with several in flight per thread, float16/bfloat16 accumulated in float32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda_kernels.hpp"
#include "reduce_ops.cuh"

namespace chorus::kernels::cuda {

namespace {

[[noreturn]] void fail(cudaError_t e, const char* call) {
  throw Error(e == cudaErrorMemoryAllocation ? chorusSystemError : chorusUnhandledCudaError,
              std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}
void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) fail(e, call);
}

using namespace ops;  // Elem, OpSum, ..., divide (reduce_ops.cuh)

template <typename T>
struct Sources {
  const T* p[kMaxSources];
};

template <typename T, typename Op, bool kDiv>
__device__ __forceinline__ T combine(const Sources<T>& s, int n, size_t i, int divisor) {
  using E = Elem<T>;
  typename E::Acc acc = E::load(s.p[0][i]);
  for (int k = 1; k < n; ++k) acc = Op::apply(acc, E::load(s.p[k][i]));
  if constexpr (kDiv) acc = divide(acc, divisor);
  return E::store(acc);
}

// 16 bytes of T, loaded and stored as one uint4.
template <typename T>
union Pack {
  static constexpr int kN = 16 / sizeof(T);
  uint4 raw;
  T v[kN];
};

constexpr int kUnroll = 4;  // 16-byte packs per thread per step: 4 loads per source in flight
constexpr int kThreads = 512;

// The aligned body: packs [0, packs), kUnroll per thread per iteration, grid-stride.
template <typename T, typename Op, bool kDiv>
__global__ void __launch_bounds__(kThreads)
    reducePacks(T* dst, Sources<T> s, int n, size_t packs, int divisor) {
  using E = Elem<T>;
  using P = Pack<T>;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * kUnroll;
  for (size_t base = (static_cast<size_t>(blockIdx.x) * blockDim.x) * kUnroll + threadIdx.x; base < packs;
       base += stride) {
    P acc[kUnroll];
    typename E::Acc a[kUnroll][P::kN];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = base + static_cast<size_t>(u) * blockDim.x;
      if (j < packs) {
        acc[u].raw = __ldg(reinterpret_cast<const uint4*>(s.p[0]) + j);
#pragma unroll
        for (int e = 0; e < P::kN; ++e) a[u][e] = E::load(acc[u].v[e]);
      }
    }
    for (int k = 1; k < n; ++k) {
      P in[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t j = base + static_cast<size_t>(u) * blockDim.x;
        if (j < packs) in[u].raw = __ldg(reinterpret_cast<const uint4*>(s.p[k]) + j);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int e = 0; e < P::kN; ++e) a[u][e] = Op::apply(a[u][e], E::load(in[u].v[e]));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = base + static_cast<size_t>(u) * blockDim.x;
      if (j < packs) {
        P out;
#pragma unroll
        for (int e = 0; e < P::kN; ++e) {
          typename E::Acc v = a[u][e];
          if constexpr (kDiv) v = divide(v, divisor);
          out.v[e] = E::store(v);
        }
        reinterpret_cast<uint4*>(dst)[j] = out.raw;
      }
    }
  }
}

// Elements [first, count) one at a time: the tail, or everything when a pointer is not 16-byte aligned.
template <typename T, typename Op, bool kDiv>
__global__ void __launch_bounds__(kThreads)
    reduceScalar(T* dst, Sources<T> s, int n, size_t first, size_t count, int divisor) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = first + static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    dst[i] = combine<T, Op, kDiv>(s, n, i, divisor);
}

// Streaming multiprocessors per device ordinal, cached once known (a failed query is not cached).
constexpr int kMaxDevices = 64;
std::atomic<int> gSmCount[kMaxDevices];

int smCount() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();
    return 1;
  }
  if (const int known = gSmCount[dev].load(std::memory_order_relaxed)) return known;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) {
    (void)cudaGetLastError();
    return 1;
  }
  gSmCount[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

// Enough blocks to fill every SM once at the kernel's occupancy (blocksPerSm), no more: the loops
// are grid-stride.
unsigned gridFor(size_t work, int blocksPerSm) {
  const size_t blocks = (work + kThreads - 1) / kThreads;
  const size_t cap = static_cast<size_t>(smCount()) * static_cast<size_t>(blocksPerSm > 0 ? blocksPerSm : 1);
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
}

// Resident blocks per SM of `kernel` at kThreads threads (1 if the query fails).
template <typename K>
int occupancy(K kernel) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0) != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();
    return 1;
  }
  return n;
}

template <typename T, typename Op, bool kDiv>
void launch(void* dstv, const void* const* srcs, int nsrcs, size_t count, int divisor, cudaStream_t stream) {
  Sources<T> s{};
  bool aligned = (reinterpret_cast<uintptr_t>(dstv) % 16) == 0;
  for (int k = 0; k < nsrcs; ++k) {
    s.p[k] = static_cast<const T*>(srcs[k]);
    aligned = aligned && (reinterpret_cast<uintptr_t>(srcs[k]) % 16) == 0;
  }
  T* dst = static_cast<T*>(dstv);
  size_t done = 0;
  // Per instantiation, for the device current on first use.
  static const int packsPerSm = occupancy(reducePacks<T, Op, kDiv>);
  static const int scalarPerSm = occupancy(reduceScalar<T, Op, kDiv>);
  (void)cudaGetLastError();  // an error some earlier call left behind is not this launch's
  if (aligned) {
    const size_t packs = count / Pack<T>::kN;
    if (packs > 0) {
      reducePacks<T, Op, kDiv><<<gridFor((packs + kUnroll - 1) / kUnroll, packsPerSm), kThreads, 0, stream>>>(
          dst, s, nsrcs, packs, divisor);
      check(cudaGetLastError(), "reduce kernel launch");
    }
    done = packs * Pack<T>::kN;
  }
  if (done < count) {
    reduceScalar<T, Op, kDiv>
        <<<gridFor(count - done, scalarPerSm), kThreads, 0, stream>>>(dst, s, nsrcs, done, count, divisor);
    check(cudaGetLastError(), "reduce kernel launch");
  }
}

template <typename T>
void dispatchOp(void* dst, const void* const* srcs, int nsrcs, size_t count, ReduceOp op, int divisor,
                cudaStream_t stream) {
  switch (op) {
    case ReduceOp::Sum:
      return launch<T, OpSum, false>(dst, srcs, nsrcs, count, divisor, stream);
    case ReduceOp::Prod:
      return launch<T, OpProd, false>(dst, srcs, nsrcs, count, divisor, stream);
    case ReduceOp::Max:
      return launch<T, OpMax, false>(dst, srcs, nsrcs, count, divisor, stream);
    case ReduceOp::Min:
      return launch<T, OpMin, false>(dst, srcs, nsrcs, count, divisor, stream);
    case ReduceOp::Avg:
      if (divisor > 0) return launch<T, OpSum, true>(dst, srcs, nsrcs, count, divisor, stream);
      return launch<T, OpSum, false>(dst, srcs, nsrcs, count, divisor, stream);
  }
  throw Error(chorusInvalidArgument,
              "cuda::reduce: unknown reduction op " + std::to_string(static_cast<int>(op)));
}

}  // namespace

int deviceCount(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount found no device";
  return n;
}

void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor, void* streamv) {
  if (nsrcs < 1 || nsrcs > kMaxSources)
    throw Error(chorusInvalidArgument, "cuda::reduce: " + std::to_string(nsrcs) + " sources (1 to " +
                                           std::to_string(kMaxSources) + ")");
  if (count == 0) return;
  auto stream = static_cast<cudaStream_t>(streamv);
  const bool known = withStorageType(
      type, [&]<typename T>() { dispatchOp<T>(dst, srcs, nsrcs, count, op, avgDivisor, stream); });
  if (!known)
    throw Error(chorusInvalidArgument,
                "cuda::reduce: unknown data type " + std::to_string(static_cast<int>(type)));
}

void* deviceAlloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}
void deviceFree(void* p) noexcept {
  if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}
void copyToDevice(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}
void copyToHost(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}
void copyOnDevice(void* dst, const void* src, size_t bytes, void* stream) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync on the device");
}
void copyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync");
}
void synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
void setDevice(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }
void* streamCreate() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}
void streamSynchronize(void* stream) {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}
void streamDestroy(void* stream) noexcept {
  if (stream && cudaStreamDestroy(static_cast<cudaStream_t>(stream)) != cudaSuccess) (void)cudaGetLastError();
}

EventTimer::EventTimer() {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  if (const cudaError_t e = cudaEventCreate(&b); e != cudaSuccess) {
    cudaEventDestroy(a);
    fail(e, "cudaEventCreate");
  }
  begin_ = a;
  end_ = b;
}
EventTimer::~EventTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(begin_));
  cudaEventDestroy(static_cast<cudaEvent_t>(end_));
}
void EventTimer::start(void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(begin_), static_cast<cudaStream_t>(stream)),
        "cudaEventRecord");
}
double EventTimer::stop(void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(end_), static_cast<cudaStream_t>(stream)),
        "cudaEventRecord");
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(end_)), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(begin_), static_cast<cudaEvent_t>(end_)),
        "cudaEventElapsedTime");
  return ms;
}

std::string deviceName() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
         std::to_string(prop.totalGlobalMem >> 30) + " GiB)";
}

}  // namespace chorus::kernels::cuda
