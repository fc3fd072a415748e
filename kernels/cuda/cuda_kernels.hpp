// CUDA reduction kernels and the few runtime calls their tests and benchmarks need. Internal to
// libchorus (not installed). This header includes no CUDA header: streams are void* (cudaStream_t),
// and every function throws chorus::Error with CUDA's message when a call fails.
#pragma once

#include <cstddef>
#include <string>

#include "chorus/chorus.hpp"

namespace chorus::kernels::cuda {

/// Usable CUDA devices: 0 without a driver or a GPU (never throws). `why` (if not null) gets the
/// reason when 0.
int deviceCount(std::string* why = nullptr);

/// dst[i] = srcs[0][i] op ... op srcs[nsrcs-1][i] on device memory, enqueued on `stream`, with the
/// semantics of the CPU kernels (kernels/cpu/reduce.hpp): integers wrap around, float16/bfloat16
/// accumulate in float32 and round once to nearest even, Avg divides by avgDivisor (> 0), Max/Min
/// return the first NaN in source order. For NaN-free inputs the result is bit-identical to the CPU
/// kernels' whenever the reduction produces no NaN (NaN payloads and signs may differ).
/// 1 <= nsrcs <= kMaxSources; dst may equal a source.
inline constexpr int kMaxSources = 8;
void reduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type, ReduceOp op,
            int avgDivisor, void* stream);

// Thin runtime wrappers for tests and benchmarks.
void* deviceAlloc(size_t bytes);
void deviceFree(void* p) noexcept;
void copyToDevice(void* dst, const void* src, size_t bytes);
void copyToHost(void* dst, const void* src, size_t bytes);
void copyOnDevice(void* dst, const void* src, size_t bytes, void* stream);
/// Copies ordered on `stream` (for host memory the runtime may return before the transfer is done:
/// synchronize the stream before reading or reusing the host side).
void copyAsync(void* dst, const void* src, size_t bytes, void* stream);
void synchronize();
/// cudaSetDevice; a new non-blocking stream; waiting for one; destroying one.
void setDevice(int device);
void* streamCreate();
void streamSynchronize(void* stream);
void streamDestroy(void* stream) noexcept;

/// Device time of `fn()`, called `iters` times between two events on `stream` (milliseconds per call).
template <typename Fn>
double timeOnDevice(void* stream, int iters, Fn&& fn);
struct EventTimer {
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(void* stream);
  /// Milliseconds since start(), after synchronizing on the stop event.
  double stop(void* stream);
  void* begin_ = nullptr;
  void* end_ = nullptr;
};
template <typename Fn>
double timeOnDevice(void* stream, int iters, Fn&& fn) {
  EventTimer t;
  t.start(stream);
  for (int i = 0; i < iters; ++i) fn();
  return t.stop(stream) / iters;
}

/// Device name and memory, for reports ("" without a device).
std::string deviceName();

}  // namespace chorus::kernels::cuda
