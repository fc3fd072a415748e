// Tests of the CPU reduction kernels (kernels/cpu): every implementation (portable, AVX2 + F16C,
// AVX-512 and AVX-512 with AVX512_BF16, each where the CPU has it) against a scalar reference,
// exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cpu/dispatch_internal.hpp"
#include "cpu/reduce.hpp"

namespace chorus::kernels {
namespace {

// ---- Implementations under test ------------------------------------------------------------------

enum class ImplKind { Portable, Avx2, Avx512, Avx512Bf16 };

const KernelImpl* implOf(ImplKind k) {
  switch (k) {
    case ImplKind::Portable:
      return &portableKernels();
    case ImplKind::Avx2:
      return avx2Kernels();
    case ImplKind::Avx512:
      return avx512Kernels();
    case ImplKind::Avx512Bf16:
      return avx512Bf16Kernels();
  }
  return nullptr;
}

const char* implName(ImplKind k) {
  static const char* const kNames[] = {"portable", "avx2", "avx512", "avx512bf16"};
  return kNames[static_cast<int>(k)];
}

std::vector<const KernelImpl*> availableImpls() { return availableKernels(); }

const char* typeName(DataType t) {
  static const char* const kNames[] = {"int8",   "uint8",   "int32",   "uint32",  "int64",
                                       "uint64", "float16", "float32", "float64", "bfloat16"};
  return kNames[static_cast<int>(t)];
}

const char* opName(ReduceOp op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  return kNames[static_cast<int>(op)];
}

// ---- Reference conversions for half and bfloat16 (deliberately unlike the kernels': tables of every
// finite value and a search for the nearest) --------------------------------------------------------

double halfBitsValue(uint16_t h) {  // finite values; 0x7c00 (infinity) maps to 2^16 for rounding
  const int e = (h >> 10) & 31;
  const int m = h & 1023;
  const double v = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(double(1024 + m), e - 25);
  return (h & 0x8000) ? -v : v;
}

double bf16BitsValue(uint16_t b) {  // 0x7f80 (infinity) maps to 2^128 for rounding
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  if ((b & 0x7fff) == 0x7f80) return (b & 0x8000) ? -std::ldexp(1.0, 128) : std::ldexp(1.0, 128);
  return f;
}

// Magnitudes of the non-negative patterns 0 .. infPattern, increasing with the bit pattern.
std::vector<double> magnitudeTable(uint16_t infPattern, double (*value)(uint16_t)) {
  std::vector<double> t(infPattern + 1);
  for (uint32_t b = 0; b <= infPattern; ++b) t[b] = value(uint16_t(b));
  return t;
}

// Round x (not NaN) to the nearest pattern, ties to the even pattern, |x| >= the "infinity"
// magnitude giving infinity.
uint16_t roundWithTable(double x, const std::vector<double>& table) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(x);
  const size_t inf = table.size() - 1;
  if (ax >= table[inf]) return uint16_t(sign | inf);
  const size_t hi = size_t(std::lower_bound(table.begin(), table.end(), ax) - table.begin());
  if (table[hi] == ax) return uint16_t(sign | hi);
  const size_t lo = hi - 1;
  const double dlo = ax - table[lo], dhi = table[hi] - ax;
  const size_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return uint16_t(sign | pick);
}

const std::vector<double>& halfTable() {
  static const std::vector<double> t = magnitudeTable(0x7c00, halfBitsValue);
  return t;
}
const std::vector<double>& bf16Table() {
  static const std::vector<double> t = magnitudeTable(0x7f80, bf16BitsValue);
  return t;
}

uint16_t refToHalf(double x) { return roundWithTable(x, halfTable()); }
uint16_t refToBf16(double x) { return roundWithTable(x, bf16Table()); }

// Half/bfloat16 -> float as the kernels must see it, for NaN-free finite or infinite values.
float refHalfToFloat(uint16_t h) {
  if ((h & 0x7fff) == 0x7c00) return (h & 0x8000) ? -INFINITY : INFINITY;
  return float(halfBitsValue(h));
}
float refBf16ToFloat(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- Typed helpers --------------------------------------------------------------------------------

template <typename T>
double toDouble(T x) {
  if constexpr (std::is_same_v<T, Half>) {
    return halfBitsValue(x.bits);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return bf16BitsValue(x.bits);
  } else {
    return double(x);
  }
}

template <typename T>
T fromDouble(double v) {
  if constexpr (std::is_same_v<T, Half>) {
    return Half{refToHalf(v)};
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{refToBf16(v)};
  } else {
    return T(v);
  }
}

template <typename T>
uint64_t bitsOf(T x) {
  uint64_t b = 0;
  std::memcpy(&b, &x, sizeof(T));
  return b;
}

// Distance in units in the last place between two non-NaN floating values (sign-magnitude bits).
template <typename T>
uint64_t ulpDistance(T a, T b) {
  constexpr int kBits = int(sizeof(T) * 8);
  const auto ordered = [](uint64_t bits) -> int64_t {
    const uint64_t signBit = uint64_t(1) << (kBits - 1);
    const int64_t mag = int64_t(bits & (signBit - 1));
    return (bits & signBit) ? -mag : mag;
  };
  const int64_t d = ordered(bitsOf(a)) - ordered(bitsOf(b));
  return uint64_t(d < 0 ? -d : d);
}

template <typename T>
std::string show(T x) {
  char buf[96];
  if constexpr (std::is_integral_v<T>) {
    if constexpr (std::is_signed_v<T>) {
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(x));
    } else {
      std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(x));
    }
  } else {
    std::snprintf(buf, sizeof buf, "%.17g (bits 0x%llx)", toDouble(x),
                  static_cast<unsigned long long>(bitsOf(x)));
  }
  return buf;
}

// A source value: integers anywhere in their range (so that Sum and Prod wrap), floating types
// integers small enough that every partial result is exact in float32.
template <typename T>
T randomValue(std::mt19937_64& rng, ReduceOp op) {
  if constexpr (std::is_integral_v<T>) {
    return T(rng());
  } else {
    const int range = op == ReduceOp::Prod ? 3 : std::is_same_v<T, BFloat16> ? 256 : 1000;
    const int v = int(rng() % uint64_t(2 * range + 1)) - range;
    return fromDouble<T>(double(v));
  }
}

// The reduction of element i, computed one element at a time.
template <typename T>
T reference(const std::vector<std::vector<T>>& s, size_t i, ReduceOp op, int avgDivisor) {
  const bool divide = op == ReduceOp::Avg && avgDivisor > 0;
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    T acc = s[0][i];
    for (size_t k = 1; k < s.size(); ++k) {
      const T x = s[k][i];
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg:
          acc = T(U(uint64_t(U(acc)) + uint64_t(U(x))));
          break;
        case ReduceOp::Prod:
          acc = T(U(uint64_t(U(acc)) * uint64_t(U(x))));
          break;
        case ReduceOp::Max:
          acc = std::max(acc, x);
          break;
        case ReduceOp::Min:
          acc = std::min(acc, x);
          break;
      }
    }
    if (divide) {
      if constexpr (std::is_signed_v<T>) {
        acc = T(int64_t(acc) / int64_t(avgDivisor));
      } else {
        acc = T(uint64_t(acc) / uint64_t(avgDivisor));
      }
    }
    return acc;
  } else {
    double acc = toDouble(s[0][i]);
    for (size_t k = 1; k < s.size(); ++k) {
      const double x = toDouble(s[k][i]);
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg:
          acc += x;
          break;
        case ReduceOp::Prod:
          acc *= x;
          break;
        case ReduceOp::Max:
          acc = acc != acc ? acc : (acc > x ? acc : x);
          break;
        case ReduceOp::Min:
          acc = acc != acc ? acc : (acc < x ? acc : x);
          break;
      }
    }
    if (divide) acc /= avgDivisor;
    return fromDouble<T>(acc);
  }
}

// ---- The full matrix: implementation x type x op, each over nsrcs, counts and buffer layouts ---

enum class Layout { Separate, Unaligned, AliasFirst, AliasLast };
const char* layoutName(Layout l) {
  switch (l) {
    case Layout::Separate:
      return "separate";
    case Layout::Unaligned:
      return "unaligned";
    case Layout::AliasFirst:
      return "dst==srcs[0]";
    case Layout::AliasLast:
      return "dst==srcs[last]";
  }
  return "?";
}

constexpr size_t kGuard = 16;  // elements after dst that must stay untouched

template <typename T>
void checkCase(const KernelImpl& impl, ReduceOp op, int nsrcs, size_t count, Layout layout,
               std::mt19937_64& rng) {
  const size_t off = layout == Layout::Unaligned ? 1 : 0;  // one element off the allocation's alignment
  std::vector<std::vector<T>> src(static_cast<size_t>(nsrcs), std::vector<T>(count + off + kGuard));
  std::vector<std::vector<T>> ref(static_cast<size_t>(nsrcs), std::vector<T>(count));  // pristine sources
  for (int k = 0; k < nsrcs; ++k) {
    for (size_t i = 0; i < count + off + kGuard; ++i) src[size_t(k)][i] = randomValue<T>(rng, op);
    std::copy(src[size_t(k)].begin() + long(off), src[size_t(k)].begin() + long(off + count),
              ref[size_t(k)].begin());
  }
  const int avgDivisor = nsrcs;

  std::vector<T> separate(count + off + kGuard);
  for (auto& x : separate) x = randomValue<T>(rng, op);
  std::vector<const void*> srcs;
  for (int k = 0; k < nsrcs; ++k) srcs.push_back(src[size_t(k)].data() + off);
  std::vector<T>* dstBuf = &separate;
  if (layout == Layout::AliasFirst) dstBuf = &src[0];
  if (layout == Layout::AliasLast) dstBuf = &src[size_t(nsrcs - 1)];
  T* dst = dstBuf->data() + off;
  const std::vector<T> guard(dstBuf->begin() + long(off + count), dstBuf->end());
  const std::vector<T> before(dstBuf->begin(), dstBuf->begin() + long(off));

  impl.reduce(dst, srcs.data(), nsrcs, count, dataTypeOf<T>(), op, avgDivisor);

  const bool fuzzy = !std::is_integral_v<T> && op == ReduceOp::Avg;
  int failures = 0;
  for (size_t i = 0; i < count && failures < 5; ++i) {
    const T want = reference(ref, i, op, avgDivisor);
    const bool ok = fuzzy ? ulpDistance(dst[i], want) <= 2 : bitsOf(dst[i]) == bitsOf(want);
    if (!ok) {
      ++failures;
      ADD_FAILURE() << impl.name << " " << typeName(dataTypeOf<T>()) << " " << opName(op)
                    << " nsrcs=" << nsrcs << " count=" << count << " " << layoutName(layout) << ": element "
                    << i << " is " << show(dst[i]) << ", want " << show(want);
    }
  }
  for (size_t i = 0; i < guard.size(); ++i) {
    ASSERT_EQ(bitsOf(guard[i]), bitsOf((*dstBuf)[off + count + i]))
        << impl.name << " wrote past the end (element " << count + i << ")";
  }
  for (size_t i = 0; i < before.size(); ++i) {
    ASSERT_EQ(bitsOf(before[i]), bitsOf((*dstBuf)[i])) << impl.name << " wrote before the start";
  }
}

template <typename T>
void checkMatrix(const KernelImpl& impl, ReduceOp op) {
  std::mt19937_64 rng(0x5eed0000u + unsigned(dataTypeOf<T>()) * 16u + unsigned(op));
  // 16411 > the 16384-element block of the 8-bit types; 4099 crosses the others' blocks. With 5
  // sources the middle three go through one three-source pass; with 8, one such pass and two
  // single-source ones.
  for (int nsrcs : {1, 2, 3, 5, 8}) {
    for (size_t count : {0, 1, 7, 31, 33, 1023, 4099, 16411}) {
      for (Layout layout : {Layout::Separate, Layout::Unaligned, Layout::AliasFirst, Layout::AliasLast}) {
        if (layout == Layout::AliasLast && nsrcs == 1) continue;  // same as AliasFirst
        checkCase<T>(impl, op, nsrcs, count, layout, rng);
      }
    }
  }
}

using MatrixParam = std::tuple<ImplKind, DataType, ReduceOp>;

class ReduceMatrix : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(ReduceMatrix, MatchesReference) {
  const auto [kind, type, op] = GetParam();
  const KernelImpl* impl = implOf(kind);
  if (impl == nullptr) GTEST_SKIP() << "this CPU cannot run the " << implName(kind) << " kernels";
  switch (type) {
    case DataType::Int8:
      return checkMatrix<int8_t>(*impl, op);
    case DataType::Uint8:
      return checkMatrix<uint8_t>(*impl, op);
    case DataType::Int32:
      return checkMatrix<int32_t>(*impl, op);
    case DataType::Uint32:
      return checkMatrix<uint32_t>(*impl, op);
    case DataType::Int64:
      return checkMatrix<int64_t>(*impl, op);
    case DataType::Uint64:
      return checkMatrix<uint64_t>(*impl, op);
    case DataType::Float16:
      return checkMatrix<Half>(*impl, op);
    case DataType::Float32:
      return checkMatrix<float>(*impl, op);
    case DataType::Float64:
      return checkMatrix<double>(*impl, op);
    case DataType::BFloat16:
      return checkMatrix<BFloat16>(*impl, op);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypesOps, ReduceMatrix,
    ::testing::Combine(
        ::testing::Values(ImplKind::Portable, ImplKind::Avx2, ImplKind::Avx512, ImplKind::Avx512Bf16),
        ::testing::Values(DataType::Int8, DataType::Uint8, DataType::Int32, DataType::Uint32, DataType::Int64,
                          DataType::Uint64, DataType::Float16, DataType::Float32, DataType::Float64,
                          DataType::BFloat16),
        ::testing::Values(ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg)),
    [](const ::testing::TestParamInfo<MatrixParam>& p) {
      return std::string(implName(std::get<0>(p.param))) + "_" + typeName(std::get<1>(p.param)) + "_" +
             opName(std::get<2>(p.param));
    });

// ---- Targeted cases ---------------------------------------------------------------------------------

// Reduces the per-source values `vals` (one element each, replicated over `count` elements so that
// both the vector loops and the scalar tails see them) with every implementation; checks that all
// elements equal `want`.
template <typename T>
void expectReduce(std::vector<T> vals, ReduceOp op, T want, int avgDivisor = 0, size_t count = 37) {
  for (const KernelImpl* impl : availableImpls()) {
    std::vector<std::vector<T>> bufs;
    std::vector<const void*> srcs;
    for (const T& v : vals) bufs.emplace_back(count, v);
    for (auto& b : bufs) srcs.push_back(b.data());
    std::vector<T> dst(count);
    impl->reduce(dst.data(), srcs.data(), int(srcs.size()), count, dataTypeOf<T>(), op, avgDivisor);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(bitsOf(dst[i]), bitsOf(want)) << impl->name << " " << opName(op) << " element " << i << ": "
                                              << show(dst[i]) << ", want " << show(want);
    }
    // In place, into the first source: the same result.
    impl->reduce(bufs[0].data(), srcs.data(), int(srcs.size()), count, dataTypeOf<T>(), op, avgDivisor);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(bitsOf(bufs[0][i]), bitsOf(want)) << impl->name << " in place, element " << i;
    }
  }
}

TEST(ReduceIntegers, WrapAround) {
  expectReduce<int8_t>({127, 1}, ReduceOp::Sum, -128);
  expectReduce<int8_t>({-128, -1}, ReduceOp::Sum, 127);
  expectReduce<uint8_t>({255, 1}, ReduceOp::Sum, 0);
  expectReduce<int8_t>({16, 16}, ReduceOp::Prod, 0);
  expectReduce<int8_t>({-128, -1}, ReduceOp::Prod, -128);
  expectReduce<int8_t>({100, 100, 100}, ReduceOp::Sum, 44);  // 300 mod 256
  expectReduce<int32_t>({std::numeric_limits<int32_t>::max(), 1}, ReduceOp::Sum,
                        std::numeric_limits<int32_t>::min());
  expectReduce<int32_t>({65536, 65536}, ReduceOp::Prod, 0);
  expectReduce<int32_t>({std::numeric_limits<int32_t>::min(), -1}, ReduceOp::Prod,
                        std::numeric_limits<int32_t>::min());
  expectReduce<uint32_t>({0xffffffffu, 2}, ReduceOp::Sum, 1u);
  expectReduce<int64_t>({std::numeric_limits<int64_t>::max(), 1}, ReduceOp::Sum,
                        std::numeric_limits<int64_t>::min());
  expectReduce<int64_t>({int64_t(1) << 32, int64_t(1) << 32}, ReduceOp::Prod, 0);
  expectReduce<int64_t>({std::numeric_limits<int64_t>::min(), -1}, ReduceOp::Prod,
                        std::numeric_limits<int64_t>::min());
  expectReduce<uint64_t>({~uint64_t(0), ~uint64_t(0)}, ReduceOp::Prod, uint64_t(1));
  expectReduce<int8_t>({-128, 127}, ReduceOp::Max, 127);
  expectReduce<uint8_t>({200, 100}, ReduceOp::Min, 100);
  expectReduce<int64_t>({std::numeric_limits<int64_t>::min(), 0}, ReduceOp::Min,
                        std::numeric_limits<int64_t>::min());
  expectReduce<uint64_t>({~uint64_t(0), 0}, ReduceOp::Max, ~uint64_t(0));
}

TEST(ReduceIntegers, AvgTruncatesTowardZero) {
  expectReduce<int32_t>({-3, -4}, ReduceOp::Avg, -3, 2);  // -7 / 2 = -3.5 -> -3
  expectReduce<int32_t>({3, 4}, ReduceOp::Avg, 3, 2);
  expectReduce<int8_t>({-1, -1, -1}, ReduceOp::Avg, -1, 3);
  expectReduce<int8_t>({-1, -1}, ReduceOp::Avg, 0, 3);
  expectReduce<int8_t>({127, 1}, ReduceOp::Avg, -64, 2);     // the sum wraps to -128 first
  expectReduce<uint8_t>({255, 255}, ReduceOp::Avg, 127, 2);  // 510 wraps to 254
  expectReduce<int32_t>({std::numeric_limits<int32_t>::min()}, ReduceOp::Avg, -715827882, 3);
  expectReduce<uint32_t>({0xffffffffu, 0u}, ReduceOp::Avg, 0x7fffffffu, 2);
  expectReduce<uint32_t>({0xfffffffeu}, ReduceOp::Avg, 0xfffffffeu, 1);
  expectReduce<int64_t>({std::numeric_limits<int64_t>::min(), 0}, ReduceOp::Avg,
                        std::numeric_limits<int64_t>::min() / 3, 3);
  expectReduce<int64_t>({-7, 0}, ReduceOp::Avg, -1, 4);
  expectReduce<uint64_t>({~uint64_t(0)}, ReduceOp::Avg, ~uint64_t(0) / 7, 7);
  expectReduce<int32_t>({5, 6}, ReduceOp::Avg, 0, 1000000);
  expectReduce<int8_t>({-128}, ReduceOp::Avg, -42, 3);
  expectReduce<int8_t>({-128}, ReduceOp::Avg, -128, 1);
  expectReduce<int8_t>({127}, ReduceOp::Avg, 0, 128);
  expectReduce<int8_t>({127}, ReduceOp::Avg, 1, 127);
  expectReduce<uint8_t>({255}, ReduceOp::Avg, 1, 255);
  expectReduce<uint8_t>({255}, ReduceOp::Avg, 0, (1 << 24) + 1);
  expectReduce<int8_t>({-128}, ReduceOp::Avg, 0, std::numeric_limits<int>::max());
  expectReduce<int32_t>({std::numeric_limits<int32_t>::max()}, ReduceOp::Avg, 1,
                        std::numeric_limits<int>::max());
  expectReduce<int32_t>({std::numeric_limits<int32_t>::max() - 1}, ReduceOp::Avg, 0,
                        std::numeric_limits<int>::max());
  expectReduce<uint32_t>({0xffffffffu}, ReduceOp::Avg, 2u, std::numeric_limits<int>::max());
  expectReduce<uint32_t>({0xfffffffdu}, ReduceOp::Avg, 1u, std::numeric_limits<int>::max());
  // Avg without a divisor is the sum.
  expectReduce<int32_t>({5, 6}, ReduceOp::Avg, 11, 0);
  expectReduce<float>({1.5f, 2.0f}, ReduceOp::Avg, 3.5f, 0);
}

TEST(ReduceFloats, AvgDividesInAccumulationType) {
  expectReduce<float>({1.0f, 2.0f, 4.0f}, ReduceOp::Avg, 7.0f / 3.0f, 3);
  expectReduce<double>({1.0, 2.0, 4.0}, ReduceOp::Avg, 7.0 / 3.0, 3);
  // fp16: float32 7/3 rounded once to half.
  expectReduce<Half>({Half{0x3c00}, Half{0x4000}, Half{0x4400}}, ReduceOp::Avg, Half{refToHalf(7.0f / 3.0f)},
                     3);
  expectReduce<BFloat16>({BFloat16{0x3f80}, BFloat16{0x4000}, BFloat16{0x4080}}, ReduceOp::Avg,
                         BFloat16{refToBf16(7.0f / 3.0f)}, 3);
}

// Avg is the sum divided once, in the accumulation type, bit for bit: with a power-of-two divisor
// the kernels multiply by its exact reciprocal instead (the same correctly rounded value), so the
// operands cover the classes where the two could differ: subnormal quotients, sums that overflow to
// infinity, infinities, zeros of either sign. NaN is left to ReduceNaN.
template <typename T>
T randomAvgOperand(std::mt19937_64& rng) {
  const uint64_t r = rng();
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    constexpr int kMantBits = std::is_same_v<T, float> ? 23 : 52;
    constexpr uint64_t kMaxExp = std::is_same_v<T, float> ? 255 : 2047;
    const uint64_t exps[] = {0, 0, 1, 2, 3, kMaxExp / 2, kMaxExp / 2 + 1, kMaxExp - 2, kMaxExp - 1, kMaxExp};
    const uint64_t e = exps[(r >> 56) % std::size(exps)];
    const uint64_t mant = e == kMaxExp ? 0 : r & ((uint64_t(1) << kMantBits) - 1);  // infinity, not NaN
    const uint64_t bits = ((r >> 63) << (sizeof(T) * 8 - 1)) | (e << kMantBits) | mant;
    T x;
    std::memcpy(&x, &bits, sizeof(T));
    return x;
  } else {
    const uint16_t nanExp = std::is_same_v<T, Half> ? 0x7c00 : 0x7f80;
    uint16_t bits = uint16_t(r);
    if ((bits & nanExp) == nanExp) bits = uint16_t(bits & ~uint16_t(~nanExp & 0x7fff));  // NaN -> infinity
    return T{bits};
  }
}

template <typename T>
bool isNaN(T x) {
  if constexpr (std::is_same_v<T, Half>) {
    return (x.bits & 0x7fff) > 0x7c00;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return (x.bits & 0x7fff) > 0x7f80;
  } else {
    return std::isnan(x);
  }
}

template <typename T>
void expectAvgIsTheDivision() {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  std::mt19937_64 rng(11);
  constexpr size_t kCount = 4099;  // whole vector units and a scalar tail
  for (int nsrcs : {2, 3}) {
    std::vector<std::vector<T>> s(static_cast<size_t>(nsrcs), std::vector<T>(kCount));
    for (auto& v : s) {
      for (auto& x : v) x = randomAvgOperand<T>(rng);
    }
    std::vector<const void*> srcs;
    for (const auto& v : s) srcs.push_back(v.data());
    const auto widen = [](T x) -> Acc {
      if constexpr (std::is_same_v<T, Half>) {
        return refHalfToFloat(x.bits);
      } else if constexpr (std::is_same_v<T, BFloat16>) {
        return refBf16ToFloat(x.bits);
      } else {
        return x;
      }
    };
    for (int divisor : {1, 2, 4, 8, 64, 1 << 20, 3, 6}) {
      std::vector<Acc> want(kCount);  // in the accumulation type; NaN where infinities cancel
      for (size_t i = 0; i < kCount; ++i) {
        Acc acc = widen(s[0][i]);
        for (int k = 1; k < nsrcs; ++k) acc = acc + widen(s[size_t(k)][i]);
        want[i] = acc / Acc(divisor);
      }
      for (const KernelImpl* impl : availableImpls()) {
        std::vector<T> out(kCount);
        impl->reduce(out.data(), srcs.data(), nsrcs, kCount, dataTypeOf<T>(), ReduceOp::Avg, divisor);
        for (size_t i = 0; i < kCount; ++i) {
          const std::string where =
              std::string(impl->name) + " " + typeName(dataTypeOf<T>()) + " nsrcs=" + std::to_string(nsrcs) +
              " divisor=" + std::to_string(divisor) + " element " + std::to_string(i) + ": " + show(out[i]);
          if (std::isnan(want[i])) {
            ASSERT_TRUE(isNaN(out[i])) << where << ", want NaN";
          } else {
            const T w = fromDouble<T>(double(want[i]));
            ASSERT_EQ(bitsOf(out[i]), bitsOf(w)) << where << ", want " << show(w);
          }
        }
      }
    }
  }
}

TEST(ReduceFloats, AvgIsTheDivisionBitForBit) {
  expectAvgIsTheDivision<float>();
  expectAvgIsTheDivision<double>();
  expectAvgIsTheDivision<Half>();
  expectAvgIsTheDivision<BFloat16>();
}

// fp16/bf16 accumulate all sources in float32 and round once.
TEST(ReduceHalf, AccumulatesInFloat32) {
  // 8 x (1 + 2^-9): partial sums such as 5v = 5 + 5*2^-9 fall between halves (spacing 2^-8 in
  // [4, 8)), the total 8 + 2^-6 is a half. Rounding after every addition would end at 8 + 2^-7.
  const uint16_t v = 0x3c02;
  const double total = 8 * halfBitsValue(v);
  ASSERT_EQ(halfBitsValue(refToHalf(total)), total);
  uint16_t stepwise = v;  // what rounding after every addition would give
  for (int k = 1; k < 8; ++k) stepwise = refToHalf(halfBitsValue(stepwise) + halfBitsValue(v));
  ASSERT_NE(stepwise, refToHalf(total));
  expectReduce<Half>(std::vector<Half>(8, Half{v}), ReduceOp::Sum, Half{refToHalf(total)});
  expectReduce<Half>(std::vector<Half>(8, Half{v}), ReduceOp::Avg, Half{v}, 8);
  // Cancellation: 2048 + 1 - 2048 = 1 (2049 is not a half).
  expectReduce<Half>({Half{0x6800}, Half{0x3c00}, Half{0xe800}}, ReduceOp::Sum, Half{0x3c00});
  // Beyond the half range in between: 60000 + 60000 - 60000 = 60000 (120000 would be infinity).
  const uint16_t h60k = refToHalf(60000);
  expectReduce<Half>({Half{h60k}, Half{h60k}, Half{uint16_t(h60k | 0x8000)}}, ReduceOp::Sum, Half{h60k});
}

TEST(ReduceBFloat16, AccumulatesInFloat32) {
  // 8 x (1 + 2^-6): partial sums such as 5v = 5 + 5*2^-6 fall between bfloat16s (spacing 2^-5 in
  // [4, 8)), the total 8 + 2^-3 is one. Rounding after every addition would end at 8 + 2^-4.
  const uint16_t v = 0x3f82;
  const double total = 8 * bf16BitsValue(v);
  ASSERT_EQ(bf16BitsValue(refToBf16(total)), total);
  uint16_t stepwise = v;
  for (int k = 1; k < 8; ++k) stepwise = refToBf16(bf16BitsValue(stepwise) + bf16BitsValue(v));
  ASSERT_NE(stepwise, refToBf16(total));
  expectReduce<BFloat16>(std::vector<BFloat16>(8, BFloat16{v}), ReduceOp::Sum, BFloat16{refToBf16(total)});
  // 256 + 1 - 256 = 1 (257 is not a bfloat16).
  expectReduce<BFloat16>({BFloat16{0x4380}, BFloat16{0x3f80}, BFloat16{0xc380}}, ReduceOp::Sum,
                         BFloat16{0x3f80});
}

TEST(ReduceHalf, RoundsToNearestEven) {
  expectReduce<Half>({Half{0x3c00}, Half{0x1000}}, ReduceOp::Sum, Half{0x3c00});  // 1 + 2^-11: tie, down
  expectReduce<Half>({Half{0x3c01}, Half{0x1000}}, ReduceOp::Sum, Half{0x3c02});  // tie, up to even
  expectReduce<Half>({Half{0x3c00}, Half{0x1001}}, ReduceOp::Sum, Half{0x3c01});  // just above the tie
  expectReduce<Half>({Half{0x7bff}, Half{0x4b80}}, ReduceOp::Sum, Half{0x7bff});  // 65504 + 15
  expectReduce<Half>({Half{0x7bff}, Half{0x4c00}}, ReduceOp::Sum, Half{0x7c00});  // 65504 + 16: tie -> inf
  expectReduce<Half>({Half{0xfbff}, Half{0xfbff}}, ReduceOp::Sum, Half{0xfc00});
  expectReduce<Half>({Half{0x0001}, Half{0x3800}}, ReduceOp::Prod, Half{0x0000});  // 2^-25: tie -> 0
  expectReduce<Half>({Half{0x0003}, Half{0x3800}}, ReduceOp::Prod, Half{0x0002});  // 1.5 * 2^-24: tie -> 2
  expectReduce<Half>({Half{0x03ff}, Half{0x0001}}, ReduceOp::Sum, Half{0x0400});   // subnormal -> normal
}

TEST(ReduceBFloat16, RoundsToNearestEven) {
  expectReduce<BFloat16>({BFloat16{0x3f80}, BFloat16{0x3b80}}, ReduceOp::Sum, BFloat16{0x3f80});  // 1 + 2^-8
  expectReduce<BFloat16>({BFloat16{0x3f81}, BFloat16{0x3b80}}, ReduceOp::Sum, BFloat16{0x3f82});
  expectReduce<BFloat16>({BFloat16{0x3f80}, BFloat16{0x3b81}}, ReduceOp::Sum, BFloat16{0x3f81});
  expectReduce<BFloat16>({BFloat16{0x7f7f}, BFloat16{0x7f7f}}, ReduceOp::Sum, BFloat16{0x7f80});  // -> inf
  expectReduce<BFloat16>({BFloat16{0x0001}, BFloat16{0x3f00}}, ReduceOp::Prod,
                         BFloat16{0x0000});  // subnormal tie
  expectReduce<BFloat16>({BFloat16{0x0003}, BFloat16{0x3f00}}, ReduceOp::Prod, BFloat16{0x0002});
}

// bfloat16 results that are float32 subnormals: the native conversion (vcvtneps2bf16, in the
// avx512+bf16 kernels) would flush them to zero, so they take the integer rounding; a vector with
// one such lane among normal ones included. Every implementation agrees with the portable one.
TEST(ReduceBFloat16, SubnormalResultsKeptByEveryImplementation) {
  expectReduce<BFloat16>({BFloat16{0x0001}, BFloat16{0x0001}}, ReduceOp::Sum, BFloat16{0x0002}, 0, 100);
  expectReduce<BFloat16>({BFloat16{0x8003}, BFloat16{0x0001}}, ReduceOp::Sum, BFloat16{0x8002}, 0, 100);
  expectReduce<BFloat16>({BFloat16{0x0040}, BFloat16{0x0040}}, ReduceOp::Avg, BFloat16{0x0040}, 2, 100);
  constexpr size_t kCount = 1000;
  for (size_t lane : {size_t(0), size_t(17), size_t(31), size_t(64), size_t(999)}) {
    std::vector<BFloat16> a(kCount, BFloat16{0x3f80}), b(kCount, BFloat16{0x3e00});
    a[lane] = BFloat16{0x0005};
    b[lane] = BFloat16{0x0002};
    const void* srcs[2] = {a.data(), b.data()};
    std::vector<BFloat16> want(kCount), got(kCount);
    portableKernels().reduce(want.data(), srcs, 2, kCount, DataType::BFloat16, ReduceOp::Sum, 0);
    ASSERT_EQ(want[lane].bits, 0x0007);
    for (const KernelImpl* impl : availableImpls()) {
      impl->reduce(got.data(), srcs, 2, kCount, DataType::BFloat16, ReduceOp::Sum, 0);
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(got[i].bits, want[i].bits) << impl->name << " element " << i;
    }
  }
}

// Every fp16/bf16 pattern through max(x, x): widening then narrowing is the identity, except that a
// NaN comes back quiet.
TEST(ReduceHalf, AllPatternsRoundTrip) {
  for (const KernelImpl* impl : availableImpls()) {
    for (DataType type : {DataType::Float16, DataType::BFloat16}) {
      const uint16_t quiet = type == DataType::Float16 ? 0x0200 : 0x0040;
      const uint16_t expMask = type == DataType::Float16 ? 0x7c00 : 0x7f80;
      std::vector<uint16_t> all(65536), out(65536), avg(65536);
      for (uint32_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);
      const void* srcs[2] = {all.data(), all.data()};
      impl->reduce(out.data(), srcs, 2, all.size(), type, ReduceOp::Max, 0);
      impl->reduce(avg.data(), srcs, 1, all.size(), type, ReduceOp::Avg, 1);
      for (uint32_t i = 0; i < 65536; ++i) {
        const bool nan = (i & expMask) == expMask && (i & ~(expMask | 0x8000u)) != 0;
        const uint16_t want = nan ? uint16_t(i | quiet) : uint16_t(i);
        ASSERT_EQ(out[i], want) << impl->name << " " << typeName(type) << " max pattern 0x" << std::hex << i;
        ASSERT_EQ(avg[i], want) << impl->name << " " << typeName(type) << " avg/1 pattern 0x" << std::hex
                                << i;
      }
    }
  }
}

// Random pairs of arbitrary (non-NaN) patterns, subnormals and infinities included: the kernels'
// float32 arithmetic and rounding against the table-based reference.
TEST(ReduceHalf, RandomPairsMatchReference) {
  std::mt19937_64 rng(12345);
  constexpr size_t kN = 1 << 16;
  for (DataType type : {DataType::Float16, DataType::BFloat16}) {
    const bool isHalf = type == DataType::Float16;
    const uint16_t expMask = isHalf ? 0x7c00 : 0x7f80;
    std::vector<uint16_t> a(kN), b(kN);
    for (size_t i = 0; i < kN; ++i) {
      do a[i] = uint16_t(rng());
      while ((a[i] & expMask) == expMask && (a[i] & ~(expMask | 0x8000)) != 0);
      do b[i] = uint16_t(rng());
      while ((b[i] & expMask) == expMask && (b[i] & ~(expMask | 0x8000)) != 0);
    }
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg}) {
      std::vector<uint16_t> want(kN);
      for (size_t i = 0; i < kN; ++i) {
        const float x = isHalf ? refHalfToFloat(a[i]) : refBf16ToFloat(a[i]);
        const float y = isHalf ? refHalfToFloat(b[i]) : refBf16ToFloat(b[i]);
        float r = 0;
        switch (op) {
          case ReduceOp::Sum:
            r = x + y;
            break;
          case ReduceOp::Prod:
            r = x * y;
            break;
          case ReduceOp::Max:
            r = x > y ? x : y;
            break;
          case ReduceOp::Min:
            r = x < y ? x : y;
            break;
          case ReduceOp::Avg:
            r = (x + y) / 3.0f;
            break;
        }
        if (std::isnan(r)) {  // inf - inf, 0 * inf: any NaN will do
          want[i] = 0xffff;
          continue;
        }
        want[i] = isHalf ? refToHalf(r) : refToBf16(r);
      }
      for (const KernelImpl* impl : availableImpls()) {
        std::vector<uint16_t> out(kN);
        const void* srcs[2] = {a.data(), b.data()};
        impl->reduce(out.data(), srcs, 2, kN, type, op, 3);
        for (size_t i = 0; i < kN; ++i) {
          if (want[i] == 0xffff) {
            ASSERT_TRUE((out[i] & expMask) == expMask && (out[i] & ~(expMask | 0x8000)) != 0)
                << std::hex << out[i];
            continue;
          }
          ASSERT_EQ(out[i], want[i]) << impl->name << " " << typeName(type) << " " << opName(op) << std::hex
                                     << " a=0x" << a[i] << " b=0x" << b[i];
        }
      }
    }
  }
}

// ---- NaN: Max/Min give the first NaN in source order (quieted for fp16/bf16), in both
// implementations; Sum/Prod/Avg give some NaN. --------------------------------------------------------

template <typename T>
T nanWithPayload(unsigned which) {  // distinct NaNs, quiet and signalling, both signs
  if constexpr (std::is_same_v<T, float>) {
    const uint32_t pats[] = {0x7fc00001u, 0xffc12345u, 0x7f800003u, 0x7fa00000u};
    float f;
    std::memcpy(&f, &pats[which % 4], 4);
    return f;
  } else if constexpr (std::is_same_v<T, double>) {
    const uint64_t pats[] = {0x7ff8000000000001ull, 0xfff8000012345678ull, 0x7ff0000000000003ull,
                             0x7ff4000000000000ull};
    double d;
    std::memcpy(&d, &pats[which % 4], 8);
    return d;
  } else if constexpr (std::is_same_v<T, Half>) {
    const uint16_t pats[] = {0x7e01, 0xfe35, 0x7c03, 0x7d00};
    return Half{pats[which % 4]};
  } else {
    const uint16_t pats[] = {0x7fc1, 0xffe5, 0x7f83, 0x7fa0};
    return BFloat16{pats[which % 4]};
  }
}

template <typename T>
bool isNan(T x) {
  if constexpr (std::is_same_v<T, Half>) {
    return (x.bits & 0x7c00) == 0x7c00 && (x.bits & 0x3ff) != 0;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return (x.bits & 0x7f80) == 0x7f80 && (x.bits & 0x7f) != 0;
  } else {
    return std::isnan(x);
  }
}

template <typename T>
T quieted(T x) {
  if constexpr (std::is_same_v<T, Half>) {
    return Half{uint16_t(x.bits | 0x0200)};
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{uint16_t(x.bits | 0x0040)};
  } else {
    return x;  // float32/float64 Max/Min pass the NaN through untouched
  }
}

template <typename T>
void checkNanPropagation() {
  std::mt19937_64 rng(99);
  constexpr size_t kCount = 77;  // vector body plus scalar tail
  const auto impls = availableImpls();
  for (int nsrcs : {2, 3, 8}) {
    for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min, ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Avg}) {
      std::vector<std::vector<T>> s(static_cast<size_t>(nsrcs), std::vector<T>(kCount));
      for (auto& v : s) {
        for (auto& x : v) x = randomValue<T>(rng, ReduceOp::Sum);
      }
      // Element i: NaNs in a pseudo-random subset of the sources, with different payloads.
      for (size_t i = 0; i < kCount; ++i) {
        const uint64_t mask = rng() & ((uint64_t(1) << nsrcs) - 1);
        for (int k = 0; k < nsrcs; ++k) {
          if (mask >> k & 1) s[size_t(k)][i] = nanWithPayload<T>(unsigned(rng()));
        }
      }
      std::vector<const void*> srcs;
      for (auto& v : s) srcs.push_back(v.data());
      std::vector<std::vector<T>> outs;
      for (const KernelImpl* impl : impls) {
        std::vector<T> out(kCount);
        impl->reduce(out.data(), srcs.data(), nsrcs, kCount, dataTypeOf<T>(), op, nsrcs);
        for (size_t i = 0; i < kCount; ++i) {
          int first = -1;
          for (int k = 0; k < nsrcs && first < 0; ++k) {
            if (isNan(s[size_t(k)][i])) first = k;
          }
          if (first < 0) continue;
          ASSERT_TRUE(isNan(out[i])) << impl->name << " " << opName(op) << " element " << i;
          if (op == ReduceOp::Max || op == ReduceOp::Min) {
            ASSERT_EQ(bitsOf(out[i]), bitsOf(quieted(s[size_t(first)][i])))
                << impl->name << " " << typeName(dataTypeOf<T>()) << " " << opName(op) << " nsrcs=" << nsrcs
                << " element " << i << ": not the first NaN (source " << first << ")";
          }
        }
        outs.push_back(std::move(out));
      }
      if (op == ReduceOp::Max || op == ReduceOp::Min) {
        for (size_t j = 1; j < outs.size(); ++j) {
          for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(bitsOf(outs[0][i]), bitsOf(outs[j][i]));
        }
      }
    }
  }
}

TEST(ReduceNaN, Float32) { checkNanPropagation<float>(); }
TEST(ReduceNaN, Float64) { checkNanPropagation<double>(); }
TEST(ReduceNaN, Float16) { checkNanPropagation<Half>(); }
TEST(ReduceNaN, BFloat16) { checkNanPropagation<BFloat16>(); }

TEST(ReduceNaN, SignedZerosAndInfinities) {
  // Equal values: the later source's wins (max(a, b) = a > b ? a : b), in both implementations.
  expectReduce<float>({0.0f, -0.0f}, ReduceOp::Max, -0.0f);
  expectReduce<float>({-0.0f, 0.0f}, ReduceOp::Max, 0.0f);
  expectReduce<double>({0.0, -0.0}, ReduceOp::Min, -0.0);
  expectReduce<float>({INFINITY, 1.0f}, ReduceOp::Max, INFINITY);
  expectReduce<float>({-INFINITY, 1.0f}, ReduceOp::Min, -INFINITY);
  expectReduce<Half>({Half{0x7c00}, Half{0x3c00}}, ReduceOp::Max, Half{0x7c00});
}

// ---- Bitwise agreement of the two implementations on ordinary random floats ----------------------

TEST(ReduceAgreement, ImplementationsBitwiseEqualOnRandomFloats) {
  const auto impls = availableImpls();
  if (impls.size() < 2) GTEST_SKIP() << "only one implementation on this CPU";
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
  constexpr size_t kCount = 5003;
  for (int nsrcs : {2, 3, 8}) {
    for (DataType type : {DataType::Float32, DataType::Float16, DataType::BFloat16}) {
      std::vector<std::vector<uint32_t>> s(static_cast<size_t>(nsrcs), std::vector<uint32_t>(kCount));
      for (auto& v : s) {
        for (auto& x : v) {
          const float f = dist(rng);
          std::memcpy(&x, &f, 4);
          // Random 16-bit patterns below the NaN range work for both fp16 and bf16 (the low half).
          if (type != DataType::Float32) x &= 0x7bff;
        }
      }
      // Pack 16-bit types densely.
      std::vector<std::vector<uint16_t>> s16(static_cast<size_t>(nsrcs), std::vector<uint16_t>(kCount));
      for (size_t k = 0; k < s.size(); ++k) {
        for (size_t i = 0; i < kCount; ++i) s16[k][i] = uint16_t(s[k][i] ^ (i & 1 ? 0x8000 : 0));
      }
      std::vector<const void*> srcs;
      for (size_t k = 0; k < s.size(); ++k) {
        srcs.push_back(type == DataType::Float32 ? static_cast<const void*>(s[k].data()) : s16[k].data());
      }
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg}) {
        std::vector<uint32_t> out0(kCount);
        impls[0]->reduce(out0.data(), srcs.data(), nsrcs, kCount, type, op, 7);
        for (size_t k = 1; k < impls.size(); ++k) {
          std::vector<uint32_t> out(kCount);
          impls[k]->reduce(out.data(), srcs.data(), nsrcs, kCount, type, op, 7);
          ASSERT_EQ(out0, out) << impls[k]->name << " " << typeName(type) << " " << opName(op)
                               << " nsrcs=" << nsrcs;
        }
      }
    }
  }
}

// ---- copy() ---------------------------------------------------------------------------------------

TEST(Copy, AllSizesAndAlignments) {
  std::mt19937_64 rng(3);
  const size_t big = (size_t(16) << 20) + 4099;  // past the non-temporal threshold
  std::vector<unsigned char> src(big + 64), dst(big + 64);
  for (auto& c : src) c = static_cast<unsigned char>(rng());
  for (const KernelImpl* impl : availableImpls()) {
    for (size_t size : {size_t(0), size_t(1), size_t(31), size_t(63), size_t(64), size_t(65), size_t(4097),
                        size_t(1) << 20, big}) {
      for (size_t so : {0, 1, 8}) {
        for (size_t doff : {0, 5, 32}) {  // cachedCopy: vector lines where doff != so (from 4 KiB)
          for (CopyFn fn : {impl->copy, impl->streamCopy, impl->cachedCopy}) {
            for (unsigned pages : {1u, 2u, 4u, 8u}) {  // streamed lines: one stream or pages interleaved
              const char* kind = fn == impl->copy         ? "copy"
                                 : fn == impl->streamCopy ? "streamCopy"
                                                          : "cachedCopy";
              std::fill(dst.begin(), dst.end(), static_cast<unsigned char>(0xa5));
              fn(dst.data() + doff, src.data() + so, size, pages);
              ASSERT_EQ(std::memcmp(dst.data() + doff, src.data() + so, size), 0)
                  << impl->name << " " << kind << " size " << size << " offsets " << so << "/" << doff
                  << " pages " << pages;
              for (size_t i = 0; i < doff; ++i) ASSERT_EQ(dst[i], 0xa5) << kind;
              for (size_t i = doff + size; i < std::min(dst.size(), doff + size + 64); ++i)
                ASSERT_EQ(dst[i], 0xa5) << kind;
            }
          }
        }
      }
    }
  }
}

// Every mode of the public copy() at offsets where the destination lies 0, 3, 8 or 56 bytes past
// the source within a line (Cached takes vector lines there from 4 KiB): the bytes exactly, nothing
// written around them.
TEST(Copy, EveryModeAtOddOffsets) {
  std::mt19937_64 rng(5);
  const size_t most = size_t(1) << 20;
  std::vector<unsigned char> src(most + 128), dst(most + 128);
  for (auto& c : src) c = static_cast<unsigned char>(rng());
  for (CopyMode mode : {CopyMode::Auto, CopyMode::Cached, CopyMode::Streaming, CopyMode::Handoff}) {
    for (size_t size : {size_t(4095), size_t(4096), size_t(4097), size_t(100003), most}) {
      for (size_t so : {0, 9}) {
        for (size_t past : {0, 3, 8, 56}) {
          const size_t doff = so + past;
          std::fill(dst.begin(), dst.end(), static_cast<unsigned char>(0x5a));
          chorus::kernels::copy(dst.data() + doff, src.data() + so, size, mode);
          ASSERT_EQ(std::memcmp(dst.data() + doff, src.data() + so, size), 0)
              << "mode " << static_cast<int>(mode) << " size " << size << " offsets " << so << "/" << doff;
          for (size_t i = 0; i < doff; ++i) ASSERT_EQ(dst[i], 0x5a);
          for (size_t i = doff + size; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0x5a);
        }
      }
    }
  }
}

// copyToBoth: both destinations get the bytes exactly and nothing around them, from every
// implementation with each way of storing it takes (streaming into a; into b as well where b lies at
// a's offset within a line), and through the public entry point with every pair of modes, the
// fallbacks (Handoff; two streaming destinations at different offsets in a line; Auto past copy()'s
// threshold) included.
TEST(Copy, ToBothEveryImplementationModeAndOffset) {
  std::mt19937_64 rng(11);
  const size_t most = size_t(1) << 20;
  std::vector<unsigned char> srcBuf(most + 256), aBuf(most + 256), bBuf(most + 256);
  for (auto& c : srcBuf) c = static_cast<unsigned char>(rng());
  // Line-aligned bases, so that the offsets below are offsets within a line.
  const auto lineUp = [](std::vector<unsigned char>& v) {
    return v.data() + ((64 - (reinterpret_cast<uintptr_t>(v.data()) & 63)) & 63);
  };
  unsigned char *src = lineUp(srcBuf), *a = lineUp(aBuf), *b = lineUp(bBuf);
  const size_t room = most + 128;
  const auto check = [&](size_t so, size_t ao, size_t bo, size_t size, const std::string& what) {
    ASSERT_EQ(std::memcmp(a + ao, src + so, size), 0) << what;
    ASSERT_EQ(std::memcmp(b + bo, src + so, size), 0) << what;
    for (size_t i = 0; i < ao; ++i) ASSERT_EQ(a[i], 0xa5) << what;
    for (size_t i = ao + size; i < std::min(room, ao + size + 128); ++i) ASSERT_EQ(a[i], 0xa5) << what;
    for (size_t i = 0; i < bo; ++i) ASSERT_EQ(b[i], 0x5a) << what;
    for (size_t i = bo + size; i < std::min(room, bo + size + 128); ++i) ASSERT_EQ(b[i], 0x5a) << what;
  };
  const auto clear = [&] {  // all that a call may touch, and the guard bytes after it
    std::fill(a, a + room, static_cast<unsigned char>(0xa5));
    std::fill(b, b + room, static_cast<unsigned char>(0x5a));
  };
  const size_t sizes[] = {0, 1, 63, 64, 65, 255, 256, 257, 4097, 100003, most};
  for (const KernelImpl* impl : availableImpls()) {
    for (size_t size : sizes) {
      for (size_t so : {0, 9}) {
        for (size_t ao : {0, 5, 40}) {
          for (size_t bo : {ao, (ao + 24) % 64}) {
            for (int ways = 0; ways < 3; ++ways) {  // plain both, streaming into a, streaming both
              const bool streamA = ways >= 1, streamB = ways == 2 && bo == ao;
              clear();
              impl->copyToBoth(a + ao, streamA, b + bo, streamB, src + so, size);
              check(so, ao, bo, size,
                    std::string(impl->name) + " size " + std::to_string(size) + " offsets " +
                        std::to_string(so) + "/" + std::to_string(ao) + "/" + std::to_string(bo) + " ways " +
                        std::to_string(ways));
            }
          }
        }
      }
    }
  }
  const CopyMode modes[] = {CopyMode::Auto, CopyMode::Cached, CopyMode::Streaming, CopyMode::Handoff};
  for (CopyMode am : modes) {
    for (CopyMode bm : modes) {
      for (size_t size : {size_t(4097), size_t(100003), most}) {
        for (size_t bo : {0, 3, 56}) {
          clear();
          chorus::kernels::copyToBoth(a + 8, am, b + bo, bm, src + 1, size);
          check(1, 8, bo, size,
                "modes " + std::to_string(static_cast<int>(am)) + "/" + std::to_string(static_cast<int>(bm)) +
                    " size " + std::to_string(size) + " b at " + std::to_string(bo));
        }
      }
    }
  }
  // Auto streams from copy()'s threshold (16 MiB), here into both at different offsets in a line.
  const size_t big = (size_t(16) << 20) + 4099;
  std::vector<unsigned char> bigSrc(big + 64), bigA(big + 64, 1), bigB(big + 64, 2);
  for (auto& c : bigSrc) c = static_cast<unsigned char>(rng());
  chorus::kernels::copyToBoth(bigA.data() + 3, CopyMode::Auto, bigB.data() + 7, CopyMode::Auto, bigSrc.data(),
                              big);
  ASSERT_EQ(std::memcmp(bigA.data() + 3, bigSrc.data(), big), 0);
  ASSERT_EQ(std::memcmp(bigB.data() + 7, bigSrc.data(), big), 0);
  EXPECT_EQ(bigA[2], 1);
  EXPECT_EQ(bigA[big + 3], 1);
  EXPECT_EQ(bigB[6], 2);
  EXPECT_EQ(bigB[big + 7], 2);
}

// ---- The public entry points and the dispatcher -----------------------------------------------------

TEST(Dispatch, SimdLevelMatchesCpu) {
  const char* forced = std::getenv("CHORUS_CPU_KERNELS");
  const bool portableForced = forced != nullptr && std::string(forced) == "portable";
  const std::string want = portableForced            ? "portable"
                           : cpuSupportsAvx512Bf16() ? "avx512+bf16"
                           : cpuSupportsAvx512()     ? "avx512"
                           : cpuSupportsAvx2()       ? "avx2+f16c"
                                                     : "portable";
  EXPECT_EQ(simdLevel(), want);
  EXPECT_STREQ(activeKernels().name, simdLevel());
}

// The streaming copy interleaves 1 page on AMD CPUs, 4 on others, unless CHORUS_NT_COPY_PAGES says.
TEST(Dispatch, StreamPagesFollowTheCpu) {
  if (std::getenv("CHORUS_NT_COPY_PAGES") != nullptr) GTEST_SKIP() << "CHORUS_NT_COPY_PAGES is set";
#if defined(__x86_64__) || defined(__i386__)
  const bool amd = __builtin_cpu_is("amd");
#else
  const bool amd = false;
#endif
  EXPECT_EQ(streamPages(), amd ? 1u : 4u);
  EXPECT_STREQ(streamPagesBasis(), amd ? "AMD CPU" : "default");
}

TEST(DispatchDeathTest, EnvironmentSetsStreamPages) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the choice is made once
  EXPECT_EXIT(
      {
        setenv("CHORUS_NT_COPY_PAGES", "2", 1);
        std::fprintf(stderr, "pages=%u from %s\n", streamPages(), streamPagesBasis());
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "pages=2 from CHORUS_NT_COPY_PAGES");
}

TEST(DispatchDeathTest, EnvironmentForcesPortable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the choice is made once
  EXPECT_EXIT(
      {
        setenv("CHORUS_CPU_KERNELS", "portable", 1);
        std::fprintf(stderr, "level=%s\n", simdLevel());
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "level=portable");
}

// CHORUS_CPU_KERNELS=avx2 caps the choice at AVX2 on a CPU with AVX-512.
TEST(DispatchDeathTest, EnvironmentCapsTheLevel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string want = cpuSupportsAvx2() ? "avx2\\+f16c" : "portable";  // a regular expression
  EXPECT_EXIT(
      {
        setenv("CHORUS_CPU_KERNELS", "avx2", 1);
        std::fprintf(stderr, "level=%s.\n", simdLevel());
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "level=" + want + "\\.");
}

TEST(Dispatch, ReduceAndCopyThroughPublicApi) {
  std::vector<float> a(1000, 1.5f), b(1000, 2.0f), out(1000);
  const void* srcs[2] = {a.data(), b.data()};
  reduce(out.data(), srcs, 2, out.size(), DataType::Float32, ReduceOp::Sum, 0);
  for (float x : out) ASSERT_EQ(x, 3.5f);
  std::vector<float> c(1000);
  copy(c.data(), out.data(), c.size() * sizeof(float));
  EXPECT_EQ(c, out);
  for (CopyMode mode : {CopyMode::Auto, CopyMode::Cached, CopyMode::Streaming, CopyMode::Handoff}) {
    std::vector<float> d(1000);
    copy(d.data() + 1, out.data(), 999 * sizeof(float), mode);
    EXPECT_TRUE(std::equal(d.begin() + 1, d.end(), out.begin())) << static_cast<int>(mode);
  }
  reduce(nullptr, nullptr, 1, 0, DataType::Float32, ReduceOp::Sum, 0);  // nothing to do
  copy(nullptr, nullptr, 0);
}

// reduce(..., CopyMode::Streaming) goes a 16 KiB block at a time through a buffer and streams it
// out, CopyMode::Handoff through a buffer at the destination's page offset and memcpy: both bit for
// bit what reduce() writes, for every element size, source count, a length shorter than a line,
// one that ends mid-block, an unaligned destination and a destination that is one of the sources.
TEST(Dispatch, BouncedReduceEqualsReduce) {  // and reduceToBoth
  std::mt19937 rng(7);
  constexpr size_t kBlockBytes = 16 * 1024;
  for (DataType type :
       {DataType::Int8, DataType::Float16, DataType::BFloat16, DataType::Float32, DataType::Float64}) {
    const size_t elem = dataTypeSize(type), block = kBlockBytes / elem;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
      for (int nsrcs : {1, 2, 3, 5}) {
        for (size_t count : {size_t{3}, size_t{17}, block, block + 1, 3 * block + 13}) {
          for (size_t shift : {size_t{0}, size_t{1}}) {  // the destination's offset in elements
            std::vector<std::vector<unsigned char>> bufs(static_cast<size_t>(nsrcs));
            std::vector<const void*> srcs;
            for (auto& b : bufs) {
              b.resize(count * elem);
              if (type == DataType::Int8) {
                for (auto& x : b) x = static_cast<unsigned char>(rng());
              } else {  // finite values, so that no NaN payload is left unspecified
                std::uniform_real_distribution<float> d(-100.0f, 100.0f);
                for (size_t i = 0; i < count; ++i) {
                  const float v = d(rng);
                  if (elem == 4) std::memcpy(&b[i * 4], &v, 4);
                  if (elem == 8) {
                    const double w = v;
                    std::memcpy(&b[i * 8], &w, 8);
                  }
                  if (elem == 2) {  // the top half of a float: a bfloat16, and a finite half below 2
                    uint32_t u;
                    std::memcpy(&u, &v, 4);
                    const uint16_t h =
                        type == DataType::BFloat16 ? uint16_t(u >> 16) : uint16_t((u >> 16) & 0x3bff);
                    std::memcpy(&b[i * 2], &h, 2);
                  }
                }
              }
              srcs.push_back(b.data());
            }
            const int divisor = op == ReduceOp::Avg ? nsrcs + 1 : 0;
            std::vector<unsigned char> want(count * elem);
            reduce(want.data(), srcs.data(), nsrcs, count, type, op, divisor);
            const std::vector<unsigned char> last = bufs.back();
            for (CopyMode mode : {CopyMode::Streaming, CopyMode::Handoff}) {
              std::vector<unsigned char> got((count + shift) * elem);
              reduce(got.data() + shift * elem, srcs.data(), nsrcs, count, type, op, divisor, mode);
              ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin() + static_cast<long>(shift * elem)))
                  << dataTypeName(type) << " op " << static_cast<int>(op) << " nsrcs " << nsrcs << " count "
                  << count << " shift " << shift << " mode " << static_cast<int>(mode);
              // In place: the destination is the last source.
              reduce(bufs.back().data(), srcs.data(), nsrcs, count, type, op, divisor, mode);
              ASSERT_EQ(bufs.back(), want) << dataTypeName(type) << " in place, nsrcs " << nsrcs << " count "
                                           << count << " mode " << static_cast<int>(mode);
              bufs.back() = last;
            }
            // reduceToBoth: the same bytes in both destinations, each at its own offset (the
            // second one element further: different page offsets), every pair of ways, and in
            // place into either destination.
            const CopyMode ways[] = {CopyMode::Cached, CopyMode::Handoff, CopyMode::Streaming,
                                     CopyMode::Auto};
            for (CopyMode a : ways) {
              for (CopyMode b : ways) {
                std::vector<unsigned char> one((count + shift) * elem), two((count + shift + 1) * elem);
                std::byte* d1 = reinterpret_cast<std::byte*>(one.data()) + shift * elem;
                std::byte* d2 = reinterpret_cast<std::byte*>(two.data()) + (shift + 1) * elem;
                reduceToBoth(d1, a, d2, b, srcs.data(), nsrcs, count, type, op, divisor);
                ASSERT_TRUE(
                    std::equal(want.begin(), want.end(), one.begin() + static_cast<long>(shift * elem)))
                    << dataTypeName(type) << " both, first, nsrcs " << nsrcs << " count " << count << " ways "
                    << static_cast<int>(a) << "/" << static_cast<int>(b);
                ASSERT_TRUE(
                    std::equal(want.begin(), want.end(), two.begin() + static_cast<long>((shift + 1) * elem)))
                    << dataTypeName(type) << " both, second, nsrcs " << nsrcs << " count " << count
                    << " ways " << static_cast<int>(a) << "/" << static_cast<int>(b);
              }
            }
            std::vector<unsigned char> other(count * elem);
            reduceToBoth(other.data(), CopyMode::Streaming, bufs.back().data(), CopyMode::Handoff,
                         srcs.data(), nsrcs, count, type, op, divisor);
            ASSERT_EQ(bufs.back(), want) << dataTypeName(type) << " both, in place, nsrcs " << nsrcs;
            ASSERT_EQ(other, want) << dataTypeName(type) << " both, beside in place, nsrcs " << nsrcs;
            bufs.back() = last;
            // In place into a second destination written through the cache (reduced into it, then
            // copied to the first), the first written each way.
            for (CopyMode a : ways) {
              std::fill(other.begin(), other.end(), static_cast<unsigned char>(0));
              reduceToBoth(other.data(), a, bufs.back().data(), CopyMode::Cached, srcs.data(), nsrcs, count,
                           type, op, divisor);
              ASSERT_EQ(bufs.back(), want) << dataTypeName(type) << " both, in place second, nsrcs " << nsrcs
                                           << " way " << static_cast<int>(a);
              ASSERT_EQ(other, want) << dataTypeName(type) << " both, beside in place second, nsrcs " << nsrcs
                                     << " way " << static_cast<int>(a);
              bufs.back() = last;
            }
            reduceToBoth(bufs.back().data(), CopyMode::Cached, other.data(), CopyMode::Cached, srcs.data(),
                         nsrcs, count, type, op, divisor);
            ASSERT_EQ(bufs.back(), want) << dataTypeName(type) << " both, in place first, nsrcs " << nsrcs;
            bufs.back() = last;
          }
        }
      }
    }
  }
  float x = 0;
  const void* one[1] = {&x};
  EXPECT_THROW(reduce(&x, one, 0, 1, DataType::Float32, ReduceOp::Sum, 0, CopyMode::Streaming), Error);
  EXPECT_THROW(reduceToBoth(&x, CopyMode::Cached, &x + 1, CopyMode::Cached, one, 0, 1, DataType::Float32,
                            ReduceOp::Sum, 0),
               Error);
  EXPECT_THROW(reduce(&x, one, 1, 1 << 20, static_cast<DataType>(kNumDataTypes), ReduceOp::Sum, 0,
                      CopyMode::Streaming),
               Error);
}

TEST(Dispatch, RejectsBadArguments) {
  float x = 0;
  const void* srcs[1] = {&x};
  try {
    reduce(&x, srcs, 0, 1, DataType::Float32, ReduceOp::Sum, 0);
    FAIL() << "nsrcs == 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
  }
  EXPECT_THROW(reduce(&x, srcs, 1, 1, static_cast<DataType>(kNumDataTypes), ReduceOp::Sum, 0), Error);
  EXPECT_THROW(reduce(&x, srcs, 1, 1, DataType::Float32, static_cast<ReduceOp>(-1), 0), Error);
}

TEST(Dispatch, ConcurrentFirstUse) {
  // Meaningful when this test runs first in its process (as under ctest, one test per process).
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&bad] {
      std::vector<int32_t> a(4099, 3), b(4099, 4), out(4099);
      const void* srcs[2] = {a.data(), b.data()};
      reduce(out.data(), srcs, 2, out.size(), DataType::Int32, ReduceOp::Prod, 0);
      for (int32_t v : out) {
        if (v != 12) ++bad;
      }
      if (std::string(simdLevel()) != activeKernels().name) ++bad;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace chorus::kernels
