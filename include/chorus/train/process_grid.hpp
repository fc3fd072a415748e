// ProcessGrid: a communicator split into data-, pipeline- and tensor-parallel groups.
#pragma once

#include <memory>

#include "chorus/chorus.hpp"

namespace chorus::train {

/// The ranks of `world` arranged as dp x pp x tp, tensor-parallel innermost, then data-parallel, then
/// pipeline (Megatron's order, so the ranks of one tensor-parallel group are neighbours, usually on
/// one host):
///
///     world rank = (ppRank * dp + dpRank) * tp + tpRank
///
/// Every group is its own communicator (split from `world`), so operations on different groups
/// never share a sequence. A group of one rank is a one-rank communicator.
class ProcessGrid {
 public:
  /// Collective over `world`, whose size must be dp * pp * tp (chorus::Error otherwise). `world`
  /// must outlive the grid.
  ProcessGrid(Communicator& world, int dp, int pp, int tp);
  ProcessGrid(ProcessGrid&&) noexcept;
  ProcessGrid& operator=(ProcessGrid&&) noexcept;
  ~ProcessGrid();

  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int tp() const { return tp_; }
  int dpRank() const { return dpRank_; }
  int ppRank() const { return ppRank_; }
  int tpRank() const { return tpRank_; }
  bool firstStage() const { return ppRank_ == 0; }
  bool lastStage() const { return ppRank_ == pp_ - 1; }

  /// The world rank of coordinates (dpRank, ppRank, tpRank).
  int worldRank(int dpRank, int ppRank, int tpRank) const { return (ppRank * dp_ + dpRank) * tp_ + tpRank; }

  Communicator& world() { return *world_; }
  /// Same pipeline stage and tensor rank: the replicas of this rank's parameters (rank = dpRank).
  Communicator& dataParallel() { return *dpComm_; }
  /// Same data-parallel and tensor rank: the stages of one pipeline (rank = ppRank).
  Communicator& pipeline() { return *ppComm_; }
  /// Same data-parallel rank and stage: the shards of one layer (rank = tpRank).
  Communicator& tensorParallel() { return *tpComm_; }
  /// Same data-parallel rank: one whole copy of the model, pp x tp ranks (rank = ppRank * tp + tpRank).
  Communicator& modelParallel() { return *mpComm_; }

 private:
  Communicator* world_;
  int dp_, pp_, tp_;
  int dpRank_, ppRank_, tpRank_;
  std::unique_ptr<Communicator> dpComm_, ppComm_, tpComm_, mpComm_;
};

}  // namespace chorus::train
