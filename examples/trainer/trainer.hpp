// The worked example of the training primitives: a residual MLP trained on synthetic data with any
// mix of data, tensor and pipeline parallelism and ZeRO, whose result can be compared with one process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "chorus/chorus.hpp"
#include "chorus/train/pipeline.hpp"
#include "chorus/train/zero.hpp"

namespace chorus::trainer {

/// The model: `layers` residual blocks x + W2 tanh(W1 x + b1) + b2 on `dim` features, `hidden` wide,
/// W1 column-parallel and W2 row-parallel over the tensor-parallel group; the loss is
/// 0.5 * |out - target|^2 averaged over the global batch, the target a fixed random teacher
/// tanh(T x). Every value comes from `seed`, so any grid computes the same model.
struct TrainConfig {
  int dp = 1, tp = 1, pp = 1;
  int zero = 0;          ///< 0: DDP (Reducer); 1-3: ZeroOptimizer
  int accum = 1;         ///< gradient accumulation micro-steps per step
  int microBatches = 1;  ///< pipeline micro-batches per micro-step
  train::PipelineSchedule schedule = train::PipelineSchedule::OneFOneB;
  int steps = 10;
  int layers = 4, dim = 32, hidden = 64;
  int batch = 32;  ///< global batch (rows per step over all data-parallel ranks)
  uint64_t seed = 1;
  bool float64 = false;
  std::string optimizer = "sgd";  ///< "sgd" or "adamw"
  double lr = 0.05, momentum = 0, weightDecay = 0;
  double clip = 0;  ///< global gradient norm to clip to (0: off)
  size_t firstBucketBytes = size_t{1} << 20, bucketBytes = size_t{25} << 20;
  bool findUnused = false;
  bool unusedParameter = false;  ///< register a parameter the model never uses (for the error test)
  int zeroPrefetch = 1;
  bool verbose = false;  ///< print per step on world rank 0
};

struct TrainResult {
  std::vector<double> losses;            ///< per step, over the global batch
  std::vector<double> parameters;        ///< the whole model after training, unsharded (every rank)
  std::vector<double> firstGrads;        ///< the whole model's reduced gradient of step 1 (before clipping)
  double stepSeconds = 0;                ///< mean over steps after the first
  double hiddenShare = -1;               ///< DDP: communication hidden behind backward, last step (-1: n/a)
  double bubble = -1, idealBubble = -1;  ///< pipeline: measured on this stage, and (p-1)/(m+p-1)
  /// Bytes per parameter of this rank's part of the model: resident (parameters, gradients, optimizer
  /// state) and the most held transiently (DDP: bucket copies; ZeRO: gathered layers, unreduced gradients).
  double residentBytesPerParameter = 0, transientBytesPerParameter = 0;
  size_t parametersHere = 0;     ///< parameters of this rank's part of the model
  train::ZeroMemory zeroMemory;  ///< zero > 0
};

/// Trains on `world` (size dp * tp * pp); collective. Throws chorus::Error for bad settings.
TrainResult train(Communicator& world, const TrainConfig& config);

/// Elements of the whole, unsharded model.
size_t modelParameters(const TrainConfig& config);

}  // namespace chorus::trainer
