// Global-norm gradient clipping across shards and groups, and the found-inf check.
#pragma once

#include <cstddef>

#include "chorus/chorus.hpp"

namespace chorus::train {

/// Squares of gradients, summed locally. Add each parameter element on exactly one rank of the
/// group later passed to globalGradNorm: a ZeRO shard on its owner only; a parameter replicated across
/// tensor-parallel ranks (a row-parallel bias, a layer norm) on tensor rank 0 only. Counting a
/// replicated parameter on every rank overstates the norm (a known tensor-parallel clipping bug).
struct LocalNorm {
  double squares = 0;      ///< sum of g*g over the counted elements, in float64
  bool nonFinite = false;  ///< any counted element inf or NaN

  /// Adds `count` elements of float32 or float64 gradients.
  void add(const void* grads, size_t count, DataType type);
};

struct GlobalNorm {
  double norm = 0;        ///< sqrt of the sum of squares over the group
  bool foundInf = false;  ///< some rank saw an inf or NaN (agreed with MAX, so every rank agrees)
  /// The factor to scale gradients by: min(1, maxNorm / (norm + 1e-6)); 1 when maxNorm <= 0.
  double clipCoefficient(double maxNorm) const;
};

/// Sums the squares over `group` and agrees on found-inf with MAX (one group call of two
/// allreduces). Collective over `group`.
GlobalNorm globalGradNorm(Communicator& group, const LocalNorm& local);

/// grads[i] *= factor, float32 or float64.
void scaleGradients(void* grads, size_t count, DataType type, double factor);

}  // namespace chorus::train
