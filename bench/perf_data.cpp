// chorus-perf: types, operations, 16-bit floats and validation data.
#include "perf_data.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace chorus_perf {

// ---- Names ---------------------------------------------------------------------------------------

const std::vector<TypeDesc>& allTypes() {
  using chorus::DataType;
  static const std::vector<TypeDesc> types = {
      {DataType::Int8, "int8", 1},         {DataType::Uint8, "uint8", 1},   {DataType::Int32, "int32", 4},
      {DataType::Uint32, "uint32", 4},     {DataType::Int64, "int64", 8},   {DataType::Uint64, "uint64", 8},
      {DataType::Float16, "half", 2},      {DataType::Float32, "float", 4}, {DataType::Float64, "double", 8},
      {DataType::BFloat16, "bfloat16", 2},
  };
  return types;
}

std::optional<TypeDesc> typeFromName(const std::string& name) {
  struct Alias {
    const char* alias;
    const char* name;
  };
  static constexpr Alias kAliases[] = {{"char", "int8"},      {"fp16", "half"},     {"float16", "half"},
                                       {"fp32", "float"},     {"float32", "float"}, {"fp64", "double"},
                                       {"float64", "double"}, {"bf16", "bfloat16"}};
  std::string canonical = name;
  for (const auto& a : kAliases) {
    if (name == a.alias) canonical = a.name;
  }
  for (const auto& t : allTypes()) {
    if (canonical == t.name) return t;
  }
  return std::nullopt;
}

const std::vector<OpDesc>& allOps() {
  using chorus::ReduceOp;
  static const std::vector<OpDesc> ops = {
      {ReduceOp::Sum, "sum"}, {ReduceOp::Prod, "prod"}, {ReduceOp::Max, "max"},
      {ReduceOp::Min, "min"}, {ReduceOp::Avg, "avg"},
  };
  return ops;
}

std::optional<OpDesc> opFromName(const std::string& name) {
  for (const auto& o : allOps()) {
    if (name == o.name) return o;
  }
  return std::nullopt;
}

// ---- 16-bit floats -------------------------------------------------------------------------------

uint16_t floatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t mag = x & 0x7FFFFFFFu;
  if (mag >= 0x7F800000u) {  // infinity or NaN (kept quiet)
    return static_cast<uint16_t>(sign | 0x7C00u | (mag > 0x7F800000u ? 0x0200u : 0u));
  }
  if (mag >= 0x477FF000u) {  // >= 65520: rounds to infinity
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (mag < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), in units of 2^-24
    const float scaled = std::bit_cast<float>(mag) * 16777216.0f;      // exact: a power of two
    const auto units = static_cast<uint32_t>(std::nearbyint(scaled));  // ties to even
    return static_cast<uint16_t>(sign | units);  // 1024 units carries into the smallest normal
  }
  const uint32_t exponent = (mag >> 23) - 127 + 15;
  uint32_t h = (exponent << 10) | ((mag & 0x7FFFFFu) >> 13);
  const uint32_t rest = mag & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may bump the exponent
  return static_cast<uint16_t>(sign | h);
}

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exponent == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mant << 13));
}

uint16_t floatToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// ---- Validation data -----------------------------------------------------------------------------

namespace {

// Storage and exact encoding of one element type.
template <typename T>
struct IntTraits {
  using S = T;
  static constexpr bool kFloat = false;
  static S fromInt(int64_t v) { return static_cast<S>(v); }  // modular, as the library's integer ops
};

struct F32Traits {
  using S = float;
  static constexpr bool kFloat = true;
  static S encode(double v) { return static_cast<float>(v); }
  static bool isNan(S s) { return std::isnan(s); }
  static int64_t ordered(S s) {
    const auto b = std::bit_cast<uint32_t>(s);
    const int64_t m = b & 0x7FFFFFFFu;
    return (b >> 31) ? -m : m;
  }
};

struct F64Traits {
  using S = double;
  static constexpr bool kFloat = true;
  static S encode(double v) { return v; }
  static bool isNan(S s) { return std::isnan(s); }
  static int64_t ordered(S s) {
    const auto b = std::bit_cast<uint64_t>(s);
    const auto m = static_cast<int64_t>(b & 0x7FFFFFFFFFFFFFFFull);
    return (b >> 63) ? -m : m;
  }
};

struct F16Traits {
  using S = uint16_t;
  static constexpr bool kFloat = true;
  static S encode(double v) { return floatToHalf(static_cast<float>(v)); }
  static bool isNan(S s) { return (s & 0x7FFFu) > 0x7C00u; }
  static int64_t ordered(S s) {
    const int64_t m = s & 0x7FFFu;
    return (s & 0x8000u) ? -m : m;
  }
};

struct BF16Traits {
  using S = uint16_t;
  static constexpr bool kFloat = true;
  static S encode(double v) { return floatToBf16(static_cast<float>(v)); }
  static bool isNan(S s) { return (s & 0x7FFFu) > 0x7F80u; }
  static int64_t ordered(S s) {
    const int64_t m = s & 0x7FFFu;
    return (s & 0x8000u) ? -m : m;
  }
};

template <typename F>
void withTraits(chorus::DataType t, F&& f) {
  using chorus::DataType;
  switch (t) {
    case DataType::Int8:
      return f(IntTraits<int8_t>{});
    case DataType::Uint8:
      return f(IntTraits<uint8_t>{});
    case DataType::Int32:
      return f(IntTraits<int32_t>{});
    case DataType::Uint32:
      return f(IntTraits<uint32_t>{});
    case DataType::Int64:
      return f(IntTraits<int64_t>{});
    case DataType::Uint64:
      return f(IntTraits<uint64_t>{});
    case DataType::Float16:
      return f(F16Traits{});
    case DataType::Float32:
      return f(F32Traits{});
    case DataType::Float64:
      return f(F64Traits{});
    case DataType::BFloat16:
      return f(BF16Traits{});
  }
}

template <typename Tr>
typename Tr::S encodeInt(int64_t v) {
  if constexpr (Tr::kFloat) {
    return Tr::encode(static_cast<double>(v));
  } else {
    return Tr::fromInt(v);
  }
}

// A well-mixed 64-bit hash of (rank, index).
inline uint64_t mix(uint64_t rank, uint64_t index) {
  uint64_t x = index * 0x9E3779B97F4A7C15ull + (rank + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 32;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

// Data moved by non-reducing collectives: 0..112, exact in every type.
inline int64_t copyValue(int rank, size_t index) {
  return static_cast<int64_t>(mix(static_cast<uint64_t>(rank), index) % 113);
}

// Inputs of reductions. Sum, min, max, avg: 0..k with k*nranks <= 120 where possible, so sums stay
// exact in int8 and bfloat16. Prod: 1, except that one rank in two (at most) contributes 2 at an
// index, so products are 1 or 2.
struct ReduceInput {
  chorus::ReduceOp op;
  int nranks;
  uint64_t range;  // values are 0..range-1

  ReduceInput(chorus::ReduceOp o, int n)
      : op(o), nranks(n), range(static_cast<uint64_t>(std::clamp(120 / std::max(n, 1), 1, 15)) + 1) {}

  int64_t value(int rank, size_t index) const {
    if (op == chorus::ReduceOp::Prod) {
      const uint64_t twoAt = mix(0xC0FFEEull, index) % (2 * static_cast<uint64_t>(nranks));
      return twoAt == static_cast<uint64_t>(rank) ? 2 : 1;
    }
    return static_cast<int64_t>(mix(static_cast<uint64_t>(rank), index) % range);
  }

  // Exact reduction over all ranks (avg: the sum; the caller divides).
  int64_t reduce(size_t index) const {
    if (op == chorus::ReduceOp::Prod) {
      const uint64_t twoAt = mix(0xC0FFEEull, index) % (2 * static_cast<uint64_t>(nranks));
      return twoAt < static_cast<uint64_t>(nranks) ? 2 : 1;
    }
    int64_t acc = value(0, index);
    for (int r = 1; r < nranks; ++r) {
      const int64_t v = value(r, index);
      switch (op) {
        case chorus::ReduceOp::Max:
          acc = std::max(acc, v);
          break;
        case chorus::ReduceOp::Min:
          acc = std::min(acc, v);
          break;
        default:  // Sum, Avg
          acc += v;
          break;
      }
    }
    return acc;
  }
};

template <typename Tr>
void fillInput(const CheckSpec& s, typename Tr::S* send) {
  const size_t n = s.shape.sendElems;
  if (collReduces(s.coll)) {
    const ReduceInput in(s.op, s.nranks);
    for (size_t i = 0; i < n; ++i) send[i] = encodeInt<Tr>(in.value(s.rank, i));
  } else {
    for (size_t i = 0; i < n; ++i) send[i] = encodeInt<Tr>(copyValue(s.rank, i));
  }
}

// Compares one output element against the exact result `exact` (avg: the exact sum).
template <typename Tr>
bool isWrong(typename Tr::S got, int64_t exact, bool average, int nranks) {
  if constexpr (Tr::kFloat) {
    const double want = average ? static_cast<double>(exact) / nranks : static_cast<double>(exact);
    if (Tr::isNan(got)) return true;
    const int64_t distance = Tr::ordered(got) - Tr::ordered(Tr::encode(want));
    return distance > 2 || distance < -2;
  } else {
    const int64_t want = average ? exact / nranks : exact;  // truncates toward zero
    return got != Tr::fromInt(want);
  }
}

template <typename Tr>
size_t countWrongT(const CheckSpec& s, const typename Tr::S* out) {
  const size_t n = s.shape.recvElems;
  const size_t count = s.shape.count;
  const bool average = s.op == chorus::ReduceOp::Avg;
  size_t wrong = 0;
  switch (s.coll) {
    case Coll::AllReduce:
    case Coll::Reduce:
    case Coll::ReduceScatter: {
      const ReduceInput in(s.op, s.nranks);
      const size_t base = s.coll == Coll::ReduceScatter ? static_cast<size_t>(s.rank) * count : 0;
      for (size_t i = 0; i < n; ++i) wrong += isWrong<Tr>(out[i], in.reduce(base + i), average, s.nranks);
      break;
    }
    case Coll::AllGather:
      for (size_t i = 0; i < n; ++i) {
        wrong += isWrong<Tr>(out[i], copyValue(static_cast<int>(i / count), i % count), false, s.nranks);
      }
      break;
    case Coll::AllToAll: {
      const size_t mine = static_cast<size_t>(s.rank) * count;
      for (size_t i = 0; i < n; ++i) {
        wrong +=
            isWrong<Tr>(out[i], copyValue(static_cast<int>(i / count), mine + i % count), false, s.nranks);
      }
      break;
    }
    case Coll::Broadcast:
      for (size_t i = 0; i < n; ++i) wrong += isWrong<Tr>(out[i], copyValue(s.root, i), false, s.nranks);
      break;
    case Coll::SendRecv: {
      const int from = (s.rank - 1 + s.nranks) % s.nranks;
      for (size_t i = 0; i < n; ++i) wrong += isWrong<Tr>(out[i], copyValue(from, i), false, s.nranks);
      break;
    }
  }
  return wrong;
}

}  // namespace

bool rankHasOutput(const CheckSpec& spec) { return spec.coll != Coll::Reduce || spec.rank == spec.root; }

void prepareBuffers(const CheckSpec& spec, void* send, void* recv) {
  size_t typeSize = 1;
  for (const auto& t : allTypes()) {
    if (t.type == spec.type) typeSize = t.size;
  }
  // 0xFF bytes: NaN for floating types, -1 or the maximum for integers; never an expected value.
  std::memset(recv, 0xFF, spec.shape.recvElems * typeSize);
  // A broadcast's input is the root's alone: other ranks leave their (in-place: output) buffer.
  if (spec.coll == Coll::Broadcast && spec.rank != spec.root) return;
  withTraits(spec.type, [&](auto tr) {
    using Tr = decltype(tr);
    fillInput<Tr>(spec, static_cast<typename Tr::S*>(send));
  });
}

size_t countWrong(const CheckSpec& spec, const void* recv) {
  if (!rankHasOutput(spec)) return 0;
  size_t wrong = 0;
  withTraits(spec.type, [&](auto tr) {
    using Tr = decltype(tr);
    wrong = countWrongT<Tr>(spec, static_cast<const typename Tr::S*>(recv));
  });
  return wrong;
}

}  // namespace chorus_perf
