// The CUDA reduction kernels against the CPU kernels, bit for bit, for every type and op. Skips,
// saying why, where no CUDA device is usable (tests/gpu/run.sh runs it on a machine with one).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/reduce.hpp"
#include "cuda/cuda_kernels.hpp"

namespace chorus::kernels::cuda {
namespace {

class CudaReduce : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (deviceCount(&why) == 0)
      GTEST_SKIP() << "no CUDA device here (" << why
                   << "); tests/gpu/run.sh runs these on a machine with one";
  }
};

// Random elements whose reductions produce no NaN (its payload and sign are the CPU's own): half
// and bfloat16 magnitudes between 2^-5 and 2^5, or 2^-10 and 2^10 (never zero, so a product that
// rounds to infinity is never multiplied by zero); float32 and float64 of at most about 1000.
void fill(std::vector<std::byte>& buf, DataType type, std::mt19937_64& rng) {
  const size_t es = dataTypeSize(type), n = buf.size() / es;
  for (size_t i = 0; i < n; ++i) {
    uint64_t bits = rng();
    std::byte* p = buf.data() + i * es;
    switch (type) {
      case DataType::Float16:  // sign, exponent 10..20 (bias 15), mantissa
        bits = (bits & 0x83ff) | ((10 + (bits >> 16) % 11) << 10);
        break;
      case DataType::BFloat16:  // sign, exponent 117..137 (bias 127), mantissa
        bits = (bits & 0x807f) | ((117 + (bits >> 16) % 21) << 7);
        break;
      case DataType::Float32: {
        const float f = static_cast<float>(static_cast<int64_t>(bits % 2000001) - 1000000) / 1024.0f;
        std::memcpy(&bits, &f, 4);
        break;
      }
      case DataType::Float64: {
        const double d = static_cast<double>(static_cast<int64_t>(bits % 2000001) - 1000000) / 3.0;
        std::memcpy(&bits, &d, 8);
        break;
      }
      default:
        break;
    }
    std::memcpy(p, &bits, es);
  }
}

// Index of the first element that differs, or the element count when none does.
size_t firstDifference(const std::vector<std::byte>& a, const std::vector<std::byte>& b, size_t es) {
  for (size_t i = 0; i < a.size() / es; ++i)
    if (std::memcmp(a.data() + i * es, b.data() + i * es, es) != 0) return i;
  return a.size() / es;
}

struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) : p(deviceAlloc(bytes ? bytes : 1)) {}
  ~DeviceBuffer() { deviceFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* p;
};

TEST_F(CudaReduce, EveryTypeOpAndSourceCountMatchesTheCpuKernels) {
  std::mt19937_64 rng(42);
  const DataType types[] = {DataType::Int8,    DataType::Uint8,  DataType::Int32,   DataType::Uint32,
                            DataType::Int64,   DataType::Uint64, DataType::Float16, DataType::BFloat16,
                            DataType::Float32, DataType::Float64};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};
  for (DataType type : types) {
    const size_t es = dataTypeSize(type);
    for (ReduceOp op : ops) {
      for (int nsrcs : {1, 2, 3, kMaxSources}) {
        // Lengths around the 16-byte packs and the unrolled steps; offset 1 element: unaligned path.
        for (size_t count : {size_t{1}, size_t{7}, size_t{1023}, (size_t{1} << 20) + 3}) {
          for (size_t offset : {size_t{0}, size_t{1}}) {
            SCOPED_TRACE(std::string(dataTypeName(type)) + " " + reduceOpName(op) + " nsrcs " +
                         std::to_string(nsrcs) + " count " + std::to_string(count) + " offset " +
                         std::to_string(offset));
            const size_t bytes = (count + offset) * es;
            std::vector<std::vector<std::byte>> host(nsrcs, std::vector<std::byte>(bytes));
            std::vector<const void*> hostSrcs, devSrcs;
            std::vector<std::unique_ptr<DeviceBuffer>> dev;
            for (auto& h : host) {
              fill(h, type, rng);
              dev.push_back(std::make_unique<DeviceBuffer>(bytes));
              copyToDevice(dev.back()->p, h.data(), bytes);
              hostSrcs.push_back(h.data() + offset * es);
              devSrcs.push_back(static_cast<std::byte*>(dev.back()->p) + offset * es);
            }
            std::vector<std::byte> want(count * es), got(count * es);
            const int divisor = nsrcs == 3 ? 3 : 4;  // Avg's division, also by a non-power of two
            kernels::reduce(want.data(), hostSrcs.data(), nsrcs, count, type, op, divisor);
            DeviceBuffer out(bytes);
            void* dst = static_cast<std::byte*>(out.p) + offset * es;
            reduce(dst, devSrcs.data(), nsrcs, count, type, op, divisor, nullptr);
            synchronize();
            copyToHost(got.data(), dst, count * es);
            ASSERT_EQ(firstDifference(got, want, es), count) << "first differing element";
          }
        }
      }
    }
  }
}

// More elements than one sweep of the grid covers, so the grid-stride loop goes round.
TEST_F(CudaReduce, LargeInputsGoRoundTheGrid) {
  std::mt19937_64 rng(7);
  const size_t n = (size_t{1} << 23) + 5, bytes = n * 8;
  std::vector<std::vector<std::byte>> host(3, std::vector<std::byte>(bytes));
  std::vector<std::unique_ptr<DeviceBuffer>> dev;
  std::vector<const void*> hostSrcs, devSrcs;
  for (auto& h : host) {
    fill(h, DataType::Float64, rng);
    dev.push_back(std::make_unique<DeviceBuffer>(bytes));
    copyToDevice(dev.back()->p, h.data(), bytes);
    hostSrcs.push_back(h.data());
    devSrcs.push_back(dev.back()->p);
  }
  std::vector<std::byte> want(bytes), got(bytes);
  kernels::reduce(want.data(), hostSrcs.data(), 3, n, DataType::Float64, ReduceOp::Sum, 0);
  DeviceBuffer out(bytes);
  reduce(out.p, devSrcs.data(), 3, n, DataType::Float64, ReduceOp::Sum, 0, nullptr);
  synchronize();
  copyToHost(got.data(), out.p, bytes);
  ASSERT_EQ(firstDifference(got, want, 8), n);
}

TEST_F(CudaReduce, InPlaceIntoTheFirstSource) {
  const size_t n = 4099;
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i), b[i] = 0.5f;
  DeviceBuffer da(n * 4), db(n * 4);
  copyToDevice(da.p, a.data(), n * 4);
  copyToDevice(db.p, b.data(), n * 4);
  const void* srcs[2] = {da.p, db.p};
  reduce(da.p, srcs, 2, n, DataType::Float32, ReduceOp::Sum, 0, nullptr);
  synchronize();
  copyToHost(a.data(), da.p, n * 4);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i], static_cast<float>(i) + 0.5f);
}

TEST(CudaReduceArguments, SourceCountIsChecked) {
  const void* srcs[1] = {nullptr};
  EXPECT_THROW(reduce(nullptr, srcs, 0, 1, DataType::Float32, ReduceOp::Sum, 0, nullptr), Error);
  EXPECT_THROW(reduce(nullptr, srcs, kMaxSources + 1, 1, DataType::Float32, ReduceOp::Sum, 0, nullptr),
               Error);
}

TEST(CudaDevices, CountingNeverThrows) {
  std::string why;
  const int n = deviceCount(&why);
  EXPECT_GE(n, 0);
  if (n == 0) {
    EXPECT_FALSE(why.empty());
  }
  std::printf("CUDA devices: %d%s%s\n", n, n ? ", " : " (", n ? deviceName().c_str() : (why + ")").c_str());
}

}  // namespace
}  // namespace chorus::kernels::cuda
