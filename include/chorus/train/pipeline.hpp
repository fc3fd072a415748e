// Pipeline parallelism: GPipe and 1F1B schedules, run over send/recv between neighbouring stages.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "chorus/chorus.hpp"

namespace chorus::train {

enum class PipelineSchedule {
  GPipe,     ///< every micro-batch's forward, then every backward: m activations held per stage
  OneFOneB,  ///< p - s - 1 warm-up forwards, then one forward one backward: at most p - s held
};

struct PipelineAction {
  enum class Kind { Forward, Backward } kind;
  int microBatch;
};

/// The order in which stage `stage` of `stages` runs its m micro-batches' forward and backward steps.
/// Backward steps run in micro-batch order in both schedules, so both accumulate gradients in the same
/// order (and give bitwise the same result).
std::vector<PipelineAction> pipelineActions(PipelineSchedule schedule, int stages, int stage,
                                            int microBatches);

/// The bubble of an ideal pipeline: (p - 1) / (m + p - 1) of each stage's time is idle.
inline double idealBubble(int stages, int microBatches) {
  return static_cast<double>(stages - 1) / static_cast<double>(microBatches + stages - 1);
}

struct PipelineStats {
  /// Time inside the forward and backward callbacks, including any communication they do themselves
  /// (tensor-parallel allreduces, ZeRO-3 gathers), so bubble() is a lower bound when they do.
  double busySeconds = 0;
  /// Time of the whole schedule on this stage: from the start of run() to its last step (a later
  /// stage, whose last backward comes before the earlier stages' last ones, stops its clock sooner).
  double totalSeconds = 0;
  int peakInFlight = 0;  ///< most micro-batches whose forward ran and backward had not
  /// The measured bubble: the share of this stage's time not spent computing.
  double bubble() const { return totalSeconds > 0 ? 1.0 - busySeconds / totalSeconds : 0.0; }
};

/// Runs one stage of a pipeline whose stages are the ranks of `pipeline` (stage = rank).
/// Activations (`boundaryCount` elements of `type` per micro-batch, the same at every stage boundary)
/// go forward by send/recv, their gradients backward. A send and the next step's receive are issued
/// as one group, as Megatron's send_forward_recv_backward does, so neighbours that both send first
/// cannot deadlock; every wait is bounded by the communicator's timeout.
class PipelineStage {
 public:
  /// forward(mb, in, out): `in` is the previous stage's activation (nullptr on the first stage, which
  /// reads its own input); `out` receives this stage's (ignored on the last stage, which computes the
  /// loss). The callback keeps whatever backward needs, keyed by micro-batch.
  using ForwardFn = std::function<void(int microBatch, const void* in, void* out)>;
  /// backward(mb, gradOut, gradIn): `gradOut` is the gradient of this stage's output (nullptr on the
  /// last stage); write the gradient of its input to `gradIn` (nullptr on the first stage).
  using BackwardFn = std::function<void(int microBatch, const void* gradOut, void* gradIn)>;

  PipelineStage(Communicator& pipeline, DataType type, size_t boundaryCount);

  PipelineStats run(PipelineSchedule schedule, int microBatches, const ForwardFn& forward,
                    const BackwardFn& backward);

 private:
  Communicator* pp_;
  DataType type_;
  size_t count_;
};

}  // namespace chorus::train
