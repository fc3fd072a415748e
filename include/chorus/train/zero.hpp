// ZeRO stages 1, 2 and 3 (Rajbhandari et al.): optimizer state, gradients and parameters sharded
// across the data-parallel group.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "chorus/chorus.hpp"
#include "chorus/train/optimizer.hpp"

namespace chorus::train {

struct ZeroParameter {
  std::string name;
  size_t count = 0;
  /// False where another rank of the norm group holds the same parameter and counts it (a bias
  /// replicated across tensor-parallel ranks, on tensor ranks other than 0).
  bool countInNorm = true;
};

/// A unit of gathering: the parameters one layer needs, stored as one flat vector in this order.
struct ZeroLayer {
  std::vector<ZeroParameter> params;
};

struct ZeroOptions {
  int stage = 1;  ///< 1: optimizer state sharded; 2: and gradients; 3: and parameters
  OptimizerOptions optimizer;
  /// Clip gradients to this global norm (0: no clipping). A step whose gradients hold an inf or NaN
  /// on any rank is skipped.
  double maxGradNorm = 0;
  /// Where the norm is summed: every rank holding a distinct part of the model (with tensor or
  /// pipeline parallelism, the whole grid). Default: the data-parallel group.
  Communicator* normGroup = nullptr;
  /// Stage 3: how many layers ahead to gather while the current one computes.
  int prefetchLayers = 1;
  /// Stages 2-3: most gradient reductions in flight; the oldest is waited for beyond this, which
  /// bounds the full-size gradient buffers held at once to this many plus the one being computed.
  int maxReductionsInFlight = 2;
};

/// Bytes this rank holds, measured.
struct ZeroMemory {
  size_t parameterElements = 0;   ///< parameters of this rank's part of the model (before sharding)
  size_t parameterBytes = 0;      ///< resident parameters (stage 3: the shard)
  size_t gradientBytes = 0;       ///< resident gradients (stages 2-3: the shard)
  size_t optimizerBytes = 0;      ///< optimizer state (the shard)
  size_t peakTransientBytes = 0;  ///< most bytes of gathered layers and unreduced gradients held at once
  double bytesPerParameter() const {
    return parameterElements
               ? static_cast<double>(parameterBytes + gradientBytes + optimizerBytes + peakTransientBytes) /
                     static_cast<double>(parameterElements)
               : 0.0;
  }
};

/// Each layer's flat vector is padded to a multiple of N (the data-parallel size) and split into N
/// equal slices; rank r owns slice r of every layer: its optimizer state (all stages), its reduced
/// gradient (stages 2-3) and its parameters (stage 3). One step:
///
///     for each layer, forward:  p = zero.acquire(l, +1); ...; zero.release(l);
///     for each layer, backward: p = zero.acquire(l, -1); g = zero.gradients(l); ... (add into g);
///                               zero.release(l); zero.reduceGradients(l);
///     zero.step();
///
/// reduceGradients starts the layer's reduction asynchronously, so it overlaps the next layer's
/// backward: stage 1 allreduces the whole gradient (ReduceOp::Avg); stages 2-3 reduce-scatter it (half
/// the bytes of an allreduce, not an allreduce emulating one) and add the slice into this rank's
/// gradient shard, after which the full gradient buffer is freed. With gradient accumulation, stage 1
/// reduces at the last micro-step only; stages 2-3 may reduce at every micro-step (their shards
/// accumulate), which keeps the full gradient from living across micro-steps.
/// step() waits for the reductions, clips by the global norm, updates this rank's slice, and (stages
/// 1-2) all-gathers the updated parameters. Stage 3 gathers a layer's parameters in acquire(),
/// prefetching the next prefetchLayers layers in the given direction, and frees them in release().
///
/// All ranks of the group must make the same calls in the same order. Parameters are float32 or float64.
class ZeroOptimizer {
 public:
  ZeroOptimizer(Communicator& dataParallel, DataType type, std::vector<ZeroLayer> layers,
                const ZeroOptions& options);
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  int stage() const;
  size_t layerCount() const;
  /// Elements of layer `layer` (without padding) and the offset of its parameter `param` in them.
  size_t layerElements(int layer) const;
  size_t parameterOffset(int layer, int param) const;

  /// Sets a layer's parameters (every rank passes the same full values).
  void setLayer(int layer, const void* values);
  /// The layer's full parameters, valid until release(layer) (stages 1-2: always resident).
  void* acquire(int layer, int direction);
  void release(int layer);
  /// The layer's full gradient buffer for this step, zeroed when first used; add gradients into it.
  void* gradients(int layer);
  /// The layer's gradient is final (for this micro-step): start its reduction.
  void reduceGradients(int layer);

  struct StepResult {
    double gradNorm = 0;         ///< before clipping
    double clipCoefficient = 1;  ///< what the gradients were scaled by
    bool skipped = false;        ///< an inf or NaN somewhere: parameters unchanged
  };
  StepResult step();

  /// Copies the layer's full, current parameters into `out` (stage 3 gathers them; collective).
  void readLayer(int layer, void* out);
  /// Copies the layer's reduced (and clipped) gradient of the last step into `out`, full size,
  /// gathered from the ranks' slices (collective). Call after step() and before the next gradients().
  void readGradients(int layer, void* out);

  ZeroMemory memory() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chorus::train
