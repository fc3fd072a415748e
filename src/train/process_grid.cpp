#include "chorus/train/process_grid.hpp"

#include <string>

namespace chorus::train {

namespace {
std::unique_ptr<Communicator> splitOff(Communicator& world, int color, int key, const char* what) {
  auto c = world.split(color, key);
  if (!c)
    throw Error(chorusInternalError,
                std::string("ProcessGrid: the ") + what + " split returned no communicator");
  return std::make_unique<Communicator>(std::move(*c));
}
}  // namespace

ProcessGrid::ProcessGrid(Communicator& world, int dp, int pp, int tp)
    : world_(&world), dp_(dp), pp_(pp), tp_(tp) {
  if (dp < 1 || pp < 1 || tp < 1 || static_cast<long>(dp) * pp * tp != world.size())
    throw Error(chorusInvalidArgument,
                "ProcessGrid: dp x pp x tp = " + std::to_string(dp) + " x " + std::to_string(pp) + " x " +
                    std::to_string(tp) + " does not match the communicator's " +
                    std::to_string(world.size()) + " ranks (rank " + std::to_string(world.rank()) + ")");
  const int r = world.rank();
  tpRank_ = r % tp;
  dpRank_ = (r / tp) % dp;
  ppRank_ = r / (tp * dp);
  // Colors identify the group; keys order the ranks inside it.
  dpComm_ = splitOff(world, ppRank_ * tp + tpRank_, dpRank_, "data-parallel");
  ppComm_ = splitOff(world, dpRank_ * tp + tpRank_, ppRank_, "pipeline");
  tpComm_ = splitOff(world, ppRank_ * dp + dpRank_, tpRank_, "tensor-parallel");
  mpComm_ = splitOff(world, dpRank_, ppRank_ * tp + tpRank_, "model-parallel");
}

ProcessGrid::ProcessGrid(ProcessGrid&&) noexcept = default;
ProcessGrid& ProcessGrid::operator=(ProcessGrid&&) noexcept = default;
ProcessGrid::~ProcessGrid() = default;

}  // namespace chorus::train
