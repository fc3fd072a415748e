// Exact correctness checks for collectives, shared by the thread and process test drivers.
//
// Inputs are small integers (exact in every dtype, fp16 and bf16 included, and in every sum,
// product, min or max over up to 8 ranks), so expected results are computed exactly in double;
// Avg is checked within 2 ulp of the output type (integers: truncated toward zero).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "chorus/chorus.hpp"

namespace chorus::testing {

// ---- 16-bit float conversions, written independently of the library's kernels ---------------------
inline float halfToFloat(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31)
    v = man ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}
inline uint16_t floatToHalf(float f) {  // exact for the small integers used here; RNE otherwise
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  float a = std::fabs(f);
  if (a == 0) return static_cast<uint16_t>(sign);
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int he = e + 14;              // biased exponent for 1.xxx * 2^(e-1)
  if (he >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (he <= 0) {
    auto man = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, 24)));
    return static_cast<uint16_t>(sign | man);
  }
  auto man = static_cast<uint32_t>(std::nearbyint(std::ldexp(m, 11)));  // 1024..2048
  if (man == 2048) {
    man = 1024;
    ++he;
  }
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(he) << 10) | (man & 0x3ff));
}
inline float bf16ToFloat(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

// ---- Typed storage ---------------------------------------------------------------------------------
template <typename T>
struct Traits {
  static T from(double v) { return static_cast<T>(v); }
  static double to(T v) { return static_cast<double>(v); }
  static constexpr bool isFloat = std::is_floating_point_v<T>;
  static constexpr bool isSigned = std::is_signed_v<T>;
};
template <>
struct Traits<Half> {
  static Half from(double v) { return Half{floatToHalf(static_cast<float>(v))}; }
  static double to(Half v) { return halfToFloat(v.bits); }
  static constexpr bool isFloat = true;
  static constexpr bool isSigned = true;
};
template <>
struct Traits<BFloat16> {
  static BFloat16 from(double v) { return BFloat16{floatToBf16(static_cast<float>(v))}; }
  static double to(BFloat16 v) { return bf16ToFloat(v.bits); }
  static constexpr bool isFloat = true;
  static constexpr bool isSigned = true;
};

/// Input value of rank r at global element index i, chosen so every op's result is exact.
inline double inputValue(ReduceOp op, bool isSigned, int r, size_t i) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: {
      double v = static_cast<double>((i * 7 + static_cast<size_t>(r) * 3) % 5);
      return isSigned ? v - 2 : v;
    }
    case ReduceOp::Prod: {
      double mag = ((i + static_cast<size_t>(r) * 3) % 11 == 0) ? 2 : 1;  // at most one rank in 8 doubles
      bool neg = isSigned && ((i + static_cast<size_t>(r)) % 3 == 0);
      return neg ? -mag : mag;
    }
    case ReduceOp::Min:
    case ReduceOp::Max: {
      double v = static_cast<double>((i * 13 + static_cast<size_t>(r) * 29) % 61);
      return isSigned ? v - 30 : v;
    }
  }
  return 0;
}

/// Exact reduction over ranks 0..n-1 of inputValue(., i); avg per the library's rules.
inline double expectedReduce(ReduceOp op, bool isSigned, bool isFloat, int n, size_t i) {
  double acc = inputValue(op, isSigned, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = inputValue(op, isSigned, r, i);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        acc += v;
        break;
      case ReduceOp::Prod:
        acc *= v;
        break;
      case ReduceOp::Min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::Max:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == ReduceOp::Avg) acc = isFloat ? acc / n : std::trunc(acc / n);
  return acc;
}

/// Distance in representable values of T between a and b (for the avg tolerance).
template <typename T>
double ulpDistance(double got, double want) {
  if (got == want) return 0;
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    uint16_t a = Traits<T>::from(got).bits, b = Traits<T>::from(want).bits;
    return std::fabs(static_cast<double>(a) - static_cast<double>(b));
  } else if constexpr (std::is_same_v<T, float>) {
    float a = static_cast<float>(got), b = static_cast<float>(want);
    int32_t ia, ib;
    std::memcpy(&ia, &a, 4);
    std::memcpy(&ib, &b, 4);
    return std::fabs(static_cast<double>(ia) - static_cast<double>(ib));
  } else if constexpr (std::is_same_v<T, double>) {
    int64_t ia, ib;
    std::memcpy(&ia, &got, 8);
    std::memcpy(&ib, &want, 8);
    return std::fabs(static_cast<double>(ia - ib));
  } else {
    return 1e9;
  }
}

/// Counts elements of `got` that differ from `want(i)`; records the first few in `report`.
template <typename T, typename Want>
size_t countWrong(const T* got, size_t count, Want&& want, bool approx, std::string* report) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    double w = want(i);
    double g = Traits<T>::to(got[i]);
    bool ok = approx ? (g == w || ulpDistance<T>(g, Traits<T>::to(Traits<T>::from(w))) <= 2) : g == w;
    if (!ok) {
      if (wrong < 3 && report)
        *report +=
            "[" + std::to_string(i) + "] got " + std::to_string(g) + " want " + std::to_string(w) + " ";
      ++wrong;
    }
  }
  return wrong;
}

enum class Coll { AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, AllToAll, AllToAllv, SendRecv };
const char* collName(Coll c);

struct Case {
  Coll coll;
  DataType type;
  ReduceOp op;
  size_t count;
  bool inPlace;
  int root;
};
std::string describe(const Case& c, int nranks);

/// Runs one case on this rank's communicator and returns the number of wrong elements (with a
/// description of the first ones in `report`). Every rank must call it with the same case.
size_t runCase(Communicator& comm, const Case& c, std::string* report);

/// Every case of the matrix for one collective: dtypes x ops x counts x in-place.
std::vector<Case> matrix(Coll coll, int nranks, const std::vector<size_t>& counts);

/// Allreduce and reduce-scatter where the ranks differ in working in place: rank r in place when r
/// is odd (`flip`: when even), float32 sum and avg, at sizes on both sides of each single-copy
/// choice (the choice must be the same on every rank). The case for this rank, for runCase.
std::vector<Case> mixedInPlaceCases(int rank, int nranks, bool flip);

/// True when CHORUS_TEST_QUICK=1: the sanitizer passes of scripts/test, which run shorter matrices.
bool quickTests();

/// Counts used by the matrix: {0, 1, 7, 1023, 1048579}, or a shorter list under quickTests().
std::vector<size_t> matrixCounts();

}  // namespace chorus::testing
