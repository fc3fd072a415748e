// Algorithms and the registry that names them.
//
// An algorithm is a function of (Context, Op): it turns one collective into transfers over the
// pipes (engine/transfer.hpp) or into staged copies through the shared-memory area (direct
// algorithms), using only what the Context offers. Adding an algorithm is one file (the function
// and, for a pipe algorithm, its cost formula over the CostModel) and one line in the registry
// (src/tuning/registry.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/op.hpp"
#include "engine/shm_sync.hpp"
#include "engine/transfer.hpp"
#include "engine/waiter.hpp"
#include "topology/comm_topology.hpp"

namespace chorus::algo {

struct CostModel;

/// What an algorithm may use: the pipes to every peer and local data movement, and for the direct
/// algorithms the shared-memory capability. Implemented by the communicator for the duration of one
/// operation, and by the simulator (src/sim) for the pipe algorithms.
class Context {
 public:
  virtual ~Context() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// The shared-memory capability (staging areas, synchronisation, low-latency lines, buffer
  /// exchange), which only the direct algorithms ask for: nullptr when the ranks do not all share
  /// one host (and in the simulator, which runs the pipe algorithms only).
  virtual engine::ShmSync* sharedMemory() = 0;
  /// Scratch memory owned by the communicator, at least `bytes`, 64-byte aligned. Slots 0 and 1
  /// are distinct buffers; contents are not preserved between operations.
  virtual std::byte* scratch(size_t bytes, int slot = 0) = 0;
  /// Runs transfers to completion (deadline, abort and peer-death checks included).
  virtual void run(std::span<engine::Transfer> transfers) = 0;
  /// Tag that identifies this operation's messages on the pipes.
  virtual uint16_t tag() const = 0;
  /// Hosts and rank placement (hierarchical algorithms group ranks by host).
  virtual const topo::CommTopology& topology() const = 0;
  /// The cost model of this communicator's links, from which algorithms take tuned parameters (the
  /// tree's chunk size); nullptr: use built-in defaults.
  virtual const CostModel* costModel() const { return nullptr; }

  // Local data movement of the pipe algorithms goes through these two, so that the simulator
  // (src/sim), whose Context moves no data, sees it and charges its time.
  /// dst = src, `bytes` bytes (the ranges may overlap).
  virtual void localCopy(void* dst, const void* src, size_t bytes);
  /// dst = op(srcs[0..nsrcs)), `count` elements (kernels::reduce).
  virtual void localReduce(void* dst, const void* const* srcs, int nsrcs, size_t count, DataType type,
                           ReduceOp op, int avgDivisor);
};

using AlgorithmFn = void (*)(Context& ctx, const Op& op);
/// Predicted microseconds of an algorithm running `op` on `n` (> 1) ranks; negative where it does not
/// apply (the hierarchical allreduce on one host).
using CostFn = double (*)(const CostModel& model, const Op& op, int n);
/// What the choice of an algorithm for `op` adds to the tuning log (the tree's chunk size).
using NoteFn = std::string (*)(const CostModel& model, const Op& op, int n);

struct Algorithm {
  OpKind kind;
  const char* name;
  const char* description;
  bool needsSharedMemory;
  AlgorithmFn run;
  /// The cost formula (pipe algorithms, beside the algorithm in its file); null for the
  /// shared-memory ones, which the default rules choose by size (src/tuning/rules.cpp).
  CostFn cost = nullptr;
  NoteFn note = nullptr;
};

// The algorithms (one file each).
void allReduceDirect(Context&, const Op&);
void allReduceOneShot(Context&, const Op&);
void allReduceLowLatency(Context&, const Op&);
void allReduceRing(Context&, const Op&);
void allReduceRecursiveDoubling(Context&, const Op&);
void allReduceHalvingDoubling(Context&, const Op&);  // Rabenseifner (patterns::halvingDoublingSchedule)
void allReduceTree(Context&, const Op&);             // double binary tree (patterns::doubleBinaryTree)
void allReduceHierarchical(Context&, const Op&);     // per-host rings and one ring per rail (ring.hpp)
void reduceScatterDirect(Context&, const Op&);
void reduceScatterRing(Context&, const Op&);
void allGatherDirect(Context&, const Op&);
void allGatherRing(Context&, const Op&);
void broadcastDirect(Context&, const Op&);
void broadcastLowLatency(Context&, const Op&);
void broadcastPipeline(Context&, const Op&);
void broadcastKnomial(Context&, const Op&);  // 4-nomial tree (patterns::knomialTree)
void reduceDirect(Context&, const Op&);
void reduceLowLatency(Context&, const Op&);
void reducePipeline(Context&, const Op&);
void reduceKnomial(Context&, const Op&);  // 4-nomial tree (patterns::knomialTree)
void allToAllDirect(Context&, const Op&);
void allToAllPairwise(Context&, const Op&);
void allToAllvPairwise(Context&, const Op&);
void barrierDirect(Context&, const Op&);
void barrierPipes(Context&, const Op&);

// Their cost formulas (each in its algorithm's file).
double allReduceRingUs(const CostModel&, const Op&, int n);
double allReduceRecursiveDoublingUs(const CostModel&, const Op&, int n);
double allReduceHalvingDoublingUs(const CostModel&, const Op&, int n);
double allReduceTreeUs(const CostModel&, const Op&, int n);
std::string allReduceTreeNote(const CostModel&, const Op&, int n);
double allReduceHierarchicalUs(const CostModel&, const Op&, int n);
double reduceScatterRingUs(const CostModel&, const Op&, int n);
double allGatherRingUs(const CostModel&, const Op&, int n);
double broadcastPipelineUs(const CostModel&, const Op&, int n);
double broadcastKnomialUs(const CostModel&, const Op&, int n);
double reducePipelineUs(const CostModel&, const Op&, int n);
double reduceKnomialUs(const CostModel&, const Op&, int n);
double allToAllPairwiseUs(const CostModel&, const Op&, int n);
double allToAllvPairwiseUs(const CostModel&, const Op&, int n);
double barrierPipesUs(const CostModel&, const Op&, int n);

/// Elements of a partition of `count` into `parts` nearly equal slices, each a multiple of
/// `granule` elements except possibly the last non-empty one: slice i is [offset(i), offset(i+1)).
struct Slices {
  size_t count, parts, per;
  Slices(size_t count_, size_t parts_, size_t granule)
      : count(count_), parts(parts_), per(alignUpElems((count_ + parts_ - 1) / parts_, granule)) {}
  size_t offset(size_t i) const { return i * per < count ? i * per : count; }
  size_t length(size_t i) const { return offset(i + 1) - offset(i); }
  static size_t alignUpElems(size_t v, size_t g) { return g ? (v + g - 1) / g * g : v; }
};

}  // namespace chorus::algo
