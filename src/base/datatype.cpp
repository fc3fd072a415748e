#include <cstdio>

#include "base/error.hpp"
#include "chorus/chorus.hpp"

namespace chorus {

size_t dataTypeSize(DataType t) {
  switch (t) {
    case DataType::Int8:
    case DataType::Uint8:
      return 1;
    case DataType::Float16:
    case DataType::BFloat16:
      return 2;
    case DataType::Int32:
    case DataType::Uint32:
    case DataType::Float32:
      return 4;
    case DataType::Int64:
    case DataType::Uint64:
    case DataType::Float64:
      return 8;
  }
  failInvalid("unknown datatype ", static_cast<int>(t));
}

const char* dataTypeName(DataType t) {
  switch (t) {
    case DataType::Int8:
      return "int8";
    case DataType::Uint8:
      return "uint8";
    case DataType::Int32:
      return "int32";
    case DataType::Uint32:
      return "uint32";
    case DataType::Int64:
      return "int64";
    case DataType::Uint64:
      return "uint64";
    case DataType::Float16:
      return "float16";
    case DataType::BFloat16:
      return "bfloat16";
    case DataType::Float32:
      return "float32";
    case DataType::Float64:
      return "float64";
  }
  thread_local char unknown[32];
  std::snprintf(unknown, sizeof unknown, "unknown(%d)", static_cast<int>(t));
  return unknown;
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Prod:
      return "prod";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Avg:
      return "avg";
  }
  return "unknown";
}

}  // namespace chorus
