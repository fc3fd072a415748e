#include "chorus/train/clip.hpp"

#include <cmath>
#include <cstdint>
#include <string>

namespace chorus::train {

namespace {
void requireFloat(DataType type, const char* call) {
  if (type != DataType::Float32 && type != DataType::Float64)
    throw Error(chorusInvalidArgument,
                std::string(call) + ": gradients must be float32 or float64, not " + dataTypeName(type));
}
template <typename T>
void addSquares(const T* g, size_t n, double& acc, bool& nonFinite) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  if (!std::isfinite(s)) nonFinite = true;
  acc += s;
}
}  // namespace

void LocalNorm::add(const void* grads, size_t count, DataType type) {
  requireFloat(type, "LocalNorm::add");
  if (type == DataType::Float64)
    addSquares(static_cast<const double*>(grads), count, squares, nonFinite);
  else
    addSquares(static_cast<const float*>(grads), count, squares, nonFinite);
}

double GlobalNorm::clipCoefficient(double maxNorm) const {
  if (maxNorm <= 0 || foundInf) return 1.0;
  const double c = maxNorm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

GlobalNorm globalGradNorm(Communicator& group, const LocalNorm& local) {
  double squares = local.nonFinite ? 0.0 : local.squares;
  int32_t flag = local.nonFinite ? 1 : 0;
  {
    Group g;
    group.allReduce(&squares, &squares, 1, DataType::Float64, ReduceOp::Sum);
    group.allReduce(&flag, &flag, 1, DataType::Int32, ReduceOp::Max);
    g.end();
  }
  GlobalNorm out;
  out.foundInf = flag != 0;
  out.norm = out.foundInf ? INFINITY : std::sqrt(squares);
  return out;
}

void scaleGradients(void* grads, size_t count, DataType type, double factor) {
  requireFloat(type, "scaleGradients");
  if (factor == 1.0) return;
  if (type == DataType::Float64) {
    auto* g = static_cast<double*>(grads);
    for (size_t i = 0; i < count; ++i) g[i] *= factor;
  } else {
    auto* g = static_cast<float*>(grads);
    const float f = static_cast<float>(factor);
    for (size_t i = 0; i < count; ++i) g[i] *= f;
  }
}

}  // namespace chorus::train
