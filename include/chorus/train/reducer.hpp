// DDP gradient reducer: bucketed, asynchronous allreduce of gradients overlapping the backward pass.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "chorus/chorus.hpp"

namespace chorus::train {

struct ReducerOptions {
  /// Capacity of the first bucket (the gradients that arrive first), so communication starts early.
  size_t firstBucketBytes = size_t{1} << 20;
  /// Capacity of every other bucket. A parameter larger than its bucket's capacity gets a bucket of its own.
  size_t bucketBytes = size_t{25} << 20;
  /// After the first synchronising iteration, rebuild the buckets in the order gradients really
  /// arrived (rank 0's order, broadcast, so every rank has the same layout).
  bool rebuildBuckets = true;
  /// Parameters that produced no gradient in an iteration: false (default) makes finishBackward throw
  /// naming them; true reduces zeros in their place and reports those unused on every rank through
  /// unusedParameters() (one more small allreduce per iteration).
  bool findUnusedParameters = false;
};

/// One gradient: its name (for errors), the caller's buffer, its element count and type. Buckets
/// hold one type each.
struct GradientSpec {
  std::string name;
  void* grad = nullptr;
  size_t count = 0;
  DataType type = DataType::Float32;
};

/// Averages gradients across `comm` as DistributedDataParallel does. Per iteration:
///
///     reducer.prepareForBackward();
///     ... backward: after each parameter's gradient is final, reducer.markGradReady(i);
///     reducer.finishBackward();  // every gradient now holds the average over the ranks
///
/// Buckets start in reverse registration order (backward produces the last layers' gradients
/// first): the first holds up to firstBucketBytes, the others up to bucketBytes. A bucket's allreduce
/// (ReduceOp::Avg) starts asynchronously as soon as it and every bucket before it are full, so it
/// overlaps the rest of the backward pass, and every rank issues the buckets in the same order even
/// when its gradients arrive in another order.
///
/// Gradient accumulation: setRequireSync(false) for the micro-steps that only accumulate (the
/// reducer then does nothing); the caller adds gradients into its buffers and divides the loss by
/// the number of micro-steps. setRequireSync(true) for the last one.
///
/// Errors: a parameter marked twice, or one left unmarked (see findUnusedParameters), throws
/// chorus::Error naming it; in the second case the reducer also aborts the communicator, so that the
/// other ranks fail at once instead of waiting for a bucket this rank will never send.
class Reducer {
 public:
  /// `comm` and the gradient buffers must outlive the reducer.
  Reducer(Communicator& comm, std::vector<GradientSpec> params, const ReducerOptions& options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  void setRequireSync(bool sync);
  bool requireSync() const;

  void prepareForBackward();
  void markGradReady(size_t index);
  void finishBackward();

  /// Parameter indices of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucketLayout() const;
  /// With findUnusedParameters: those no rank produced a gradient for in the last synchronised
  /// iteration (their gradient is zero; an optimizer may skip them).
  std::vector<size_t> unusedParameters() const;

  struct Stats {
    size_t buckets = 0;
    size_t bytes = 0;
    /// Time the buckets' allreduces were running: they run one after another, so bucket i runs
    /// from max(its launch, bucket i-1's completion) to its completion. Completions are seen when
    /// markGradReady or finishBackward looks, so this can exceed the true time by one such gap.
    std::chrono::duration<double> commBusy{0};
    /// The part of commBusy after the backward pass ended (finishBackward waiting for it).
    std::chrono::duration<double> exposed{0};
    /// 1 - exposed / commBusy: the share of communication time hidden behind the backward pass.
    double hiddenShare() const {
      return commBusy.count() > 0 ? 1.0 - exposed.count() / commBusy.count() : 0.0;
    }
  };
  /// Figures of the last synchronised iteration.
  Stats lastStats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chorus::train
