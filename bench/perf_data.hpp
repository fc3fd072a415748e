// chorus-perf: data types and operations by name, 16-bit float conversions, and the data used to
// validate results (-c 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chorus/chorus.hpp"
#include "perf_coll.hpp"

namespace chorus_perf {

struct TypeDesc {
  chorus::DataType type;
  const char* name;  ///< nccl-tests' name: int8, ..., half, float, double, bfloat16
  size_t size;       ///< bytes per element
};
/// Every data type, in nccl-tests' order.
const std::vector<TypeDesc>& allTypes();
/// Accepts nccl-tests' names and a few aliases (fp16, float16, float32, fp32, float64, fp64, bf16).
std::optional<TypeDesc> typeFromName(const std::string& name);

struct OpDesc {
  chorus::ReduceOp op;
  const char* name;  ///< sum, prod, max, min, avg
};
/// Every reduction operation, in nccl-tests' order.
const std::vector<OpDesc>& allOps();
std::optional<OpDesc> opFromName(const std::string& name);

// IEEE binary16 and bfloat16 as bit patterns; float -> 16 bits rounds to nearest even.
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);
uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t b);

/// One validation run of one collective, seen from one rank.
struct CheckSpec {
  Coll coll = Coll::AllReduce;
  chorus::DataType type = chorus::DataType::Float32;
  chorus::ReduceOp op = chorus::ReduceOp::Sum;
  int root = 0;
  int rank = 0;
  int nranks = 1;
  Shape shape;
};

/// Writes a sentinel over the `shape.recvElems` elements at `recv`, then this rank's input over
/// the `shape.sendElems` elements at `send` (in that order, so in-place layouts work). Inputs are
/// small integers that every type represents exactly and every reduction keeps exact.
void prepareBuffers(const CheckSpec& spec, void* send, void* recv);

/// Whether this rank's output is defined (reduce: only the root's).
bool rankHasOutput(const CheckSpec& spec);

/// Number of the `shape.recvElems` elements at `recv` that differ from the exactly computed result
/// (integers: exact; floating point: more than 2 ulp of the output type apart). 0 where
/// rankHasOutput is false.
size_t countWrong(const CheckSpec& spec, const void* recv);

}  // namespace chorus_perf
