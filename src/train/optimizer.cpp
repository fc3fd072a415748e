#include "chorus/train/optimizer.hpp"

#include <cmath>
#include <string>
#include <type_traits>

namespace chorus::train {

namespace {
template <typename T>
T* stateAt(std::vector<double>& d, std::vector<float>& f, size_t offset) {
  if constexpr (std::is_same_v<T, double>)
    return d.data() + offset;
  else
    return f.data() + offset;
}
}  // namespace

Optimizer::Optimizer(const OptimizerOptions& options, DataType type, size_t numElements)
    : options_(options), type_(type), numElements_(numElements) {
  if (type != DataType::Float32 && type != DataType::Float64)
    throw Error(chorusInvalidArgument,
                std::string("Optimizer: parameters must be float32 or float64, not ") + dataTypeName(type));
  if (!(options.lr >= 0) || !(options.momentum >= 0) || !(options.beta1 >= 0 && options.beta1 < 1) ||
      !(options.beta2 >= 0 && options.beta2 < 1) || !(options.eps > 0))
    throw Error(chorusInvalidArgument, "Optimizer: lr, momentum, betas (in [0,1)) or eps (> 0) out of range");
  const size_t n = stateBytesPerElement() / dataTypeSize(type) * numElements;
  const size_t half = options.kind == OptimizerKind::AdamW ? n / 2 : n;
  if (type == DataType::Float64) {
    m64_.assign(half, 0.0);
    if (options.kind == OptimizerKind::AdamW) v64_.assign(half, 0.0);
  } else {
    m32_.assign(half, 0.0f);
    if (options.kind == OptimizerKind::AdamW) v32_.assign(half, 0.0f);
  }
}

size_t Optimizer::stateBytesPerElement() const {
  const size_t e = dataTypeSize(type_);
  if (options_.kind == OptimizerKind::AdamW) return 2 * e;
  return options_.momentum > 0 ? e : 0;
}

void Optimizer::update(void* params, const void* grads, size_t count, size_t stateOffset) {
  if (count > numElements_ || stateOffset > numElements_ - count)
    throw Error(chorusInvalidArgument, "Optimizer::update: elements [" + std::to_string(stateOffset) + ", " +
                                           std::to_string(stateOffset + count) + ") are outside its " +
                                           std::to_string(numElements_));
  if (steps_ == 0) throw Error(chorusInvalidUsage, "Optimizer::update before beginStep");
  if (type_ == DataType::Float64)
    updateTyped(static_cast<double*>(params), static_cast<const double*>(grads), count, stateOffset);
  else
    updateTyped(static_cast<float*>(params), static_cast<const float*>(grads), count, stateOffset);
}

template <typename T>
void Optimizer::updateTyped(T* p, const T* g, size_t count, size_t off) {
  const T lr = static_cast<T>(options_.lr), wd = static_cast<T>(options_.weightDecay);
  if (options_.kind == OptimizerKind::Sgd) {
    if (options_.momentum > 0) {
      T* m = stateAt<T>(m64_, m32_, off);
      const T mu = static_cast<T>(options_.momentum);
      for (size_t i = 0; i < count; ++i) {
        const T d = g[i] + wd * p[i];
        m[i] = steps_ == 1 ? d : mu * m[i] + d;  // PyTorch: the first step's buffer is the gradient itself
        p[i] -= lr * m[i];
      }
    } else {
      for (size_t i = 0; i < count; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    }
    return;
  }
  T* m = stateAt<T>(m64_, m32_, off);
  T* v = stateAt<T>(v64_, v32_, off);
  const T b1 = static_cast<T>(options_.beta1), b2 = static_cast<T>(options_.beta2);
  const T eps = static_cast<T>(options_.eps);
  const T c1 = static_cast<T>(1.0 - std::pow(options_.beta1, static_cast<double>(steps_)));
  const T c2 = static_cast<T>(1.0 - std::pow(options_.beta2, static_cast<double>(steps_)));
  for (size_t i = 0; i < count; ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    p[i] -= lr * wd * p[i];
    p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
  }
}

}  // namespace chorus::train
