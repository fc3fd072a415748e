// Optimizers that update a range of a flat parameter vector, so that a ZeRO shard and a whole model
// use the same arithmetic.
#pragma once

#include <cstddef>
#include <vector>

#include "chorus/chorus.hpp"

namespace chorus::train {

enum class OptimizerKind {
  Sgd,    ///< p -= lr * (g + wd * p), with momentum buffer m = momentum * m + (g + wd * p) if momentum > 0
  AdamW,  ///< Adam with decoupled weight decay (Loshchilov & Hutter): p -= lr * (m^ / (sqrt(v^) + eps) + wd *
          ///< p)
};

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::Sgd;
  double lr = 0.01;
  double momentum = 0.0;     ///< SGD only
  double weightDecay = 0.0;  ///< SGD: L2 added to the gradient; AdamW: decoupled
  double beta1 = 0.9;        ///< AdamW only
  double beta2 = 0.999;      ///< AdamW only
  double eps = 1e-8;         ///< AdamW only
};

/// State (momentum, or Adam's two moments) for `numElements` parameters of type float32 or float64,
/// updated one range at a time. The state is in the parameters' type.
class Optimizer {
 public:
  Optimizer(const OptimizerOptions& options, DataType type, size_t numElements);

  /// Starts an optimizer step (Adam's bias correction counts these).
  void beginStep() { ++steps_; }
  /// Updates params[i] for i in [0, count) from grads[i], using state elements [stateOffset, stateOffset +
  /// count).
  void update(void* params, const void* grads, size_t count, size_t stateOffset);

  long steps() const { return steps_; }
  /// Bytes of state per parameter: 0 (plain SGD), 1 or 2 elements of the parameter type.
  size_t stateBytesPerElement() const;
  size_t stateBytes() const { return stateBytesPerElement() * numElements_; }
  const OptimizerOptions& options() const { return options_; }

 private:
  template <typename T>
  void updateTyped(T* params, const T* grads, size_t count, size_t stateOffset);

  OptimizerOptions options_;
  DataType type_;
  size_t numElements_;
  long steps_ = 0;
  std::vector<double> m64_, v64_;
  std::vector<float> m32_, v32_;
};

}  // namespace chorus::train
