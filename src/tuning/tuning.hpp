// Tuning: which algorithm runs a collective. One place for the registry (registry.cpp: one line
// per algorithm, with its cost formula), the CHORUS_ALGO grammar and the default choice written in
// it (rules.cpp), and the selector with its decision cache (selector.cpp). The order of a choice:
// the user's rules (CHORUS_ALGO, Config::algo); then, where the ranks do not share one host's
// memory, the cost model's cheapest prediction (algorithms/cost_model.hpp); then the default rules.
// A call on a CUDA stream is decided here too (devicePath, device_path.cpp): which device path runs
// it, and when that is the path through host memory, the same select() picks the host algorithm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "algorithms/algorithm.hpp"

namespace chorus::tuning {

/// Every algorithm built in.
std::span<const algo::Algorithm> registry();
/// The algorithm of `kind` named `name`, or nullptr.
const algo::Algorithm* findAlgorithm(OpKind kind, const std::string& name);

/// One rule: for `kind`, messages of [lo, hi] bytes per rank use algorithm `name`.
struct Rule {
  OpKind kind;
  size_t lo = 0;
  size_t hi = SIZE_MAX;
  std::string name;
};

/// Parses the CHORUS_ALGO grammar: comma-separated `coll[:lo-hi]:algo` (sizes with k/m/g suffixes,
/// `inf` for no upper bound; `lo-hi:algo` alone continues the previous entry's collective), e.g.
/// "allreduce:0-4k:rd,4k-inf:ring,broadcast:pipeline". Throws chorusInvalidArgument naming the bad
/// entry.
std::vector<Rule> parseRules(const std::string& text);
/// The default choice, in the same grammar: with the ranks' shared memory (`haveShm`) or without.
const std::vector<Rule>& defaultRules(bool haveShm);

/// The modelled algorithm of op.kind with the lowest prediction (never a shared-memory one), or
/// nullptr when the model covers none.
const algo::Algorithm* cheapest(const algo::CostModel& model, const Op& op, int n);

/// The algorithm for `op` on `nranks` ranks: the first of `rules` that matches and can run
/// (`haveShm`: all ranks share a host), else without shared memory the cheapest prediction of
/// `model` when one is given, else the first matching default rule.
const algo::Algorithm& select(const Op& op, int nranks, bool haveShm, const std::vector<Rule>& rules,
                              const algo::CostModel* model = nullptr);

/// A communicator's choices: select() cached per (collective, power-of-two size class, datatype),
/// each new decision logged once (CHORUS_DEBUG=INFO, subsystem TUNING). A class that a rule's
/// bound splits keeps one decision per part, so that every size gets exactly what the rules say.
class Selector {
 public:
  Selector() = default;
  Selector(std::vector<Rule> rules, int rank, int nranks)
      : rules_(std::move(rules)), rank_(rank), nranks_(nranks) {}
  const algo::Algorithm& choose(const Op& op, bool haveShm, const algo::CostModel* model);

 private:
  std::vector<Rule> rules_;
  int rank_ = 0;
  int nranks_ = 1;
  // Per class: the bytes where a rule's bound cuts it (usually none), and the decision for each
  // part between them, made at its first message.
  struct Decision {
    std::vector<size_t> cuts;
    std::vector<const algo::Algorithm*> parts;
  };
  std::map<std::tuple<int, int, int>, Decision> decisions_;
  // The last call's decision and what it was for.
  const algo::Algorithm* last_ = nullptr;
  OpKind lastKind_ = OpKind::Barrier;
  DataType lastType_ = DataType::Uint8;
  size_t lastBytes_ = 0;
  bool lastShm_ = false;
  // select() for a part [from, to] of a class met for the first time, logged.
  const algo::Algorithm& decide(const Op& op, bool haveShm, const algo::CostModel* model, size_t from,
                                size_t to);
};

/// How a call on a CUDA stream runs (src/device).
enum class DevicePath {
  Nothing,             ///< no rank moves a byte (an empty call): done at once
  PointToPointKernel,  ///< a send or receive through the peer's mapped device memory (CUDA IPC)
  AllToAllvKernel,     ///< alltoallv as point-to-point kernels
  /// The CUDA IPC collective kernels (which use their LL protocol for steps up to the configured
  /// CHORUS_CUDA_LL_BYTES, agreed at set-up)
  CollectiveKernel,
  ThroughHost,  ///< staged through host memory and run by the host collectives (select())
};
const char* devicePathName(DevicePath path);

/// What the communicator's device set-up made possible, the same on every rank.
struct DeviceAbilities {
  bool collectiveKernels = false;    ///< CUDA IPC collectives among all ranks
  bool pointToPointKernels = false;  ///< CUDA IPC sends and receives
};

/// Whether this rank's send buffer (`send`) or receive buffer (!send) is device memory. Asked only
/// when the choice depends on it, so a buffer the call does not use is never looked at; it may
/// throw (e.g. a buffer on another rank's device).
using IsDeviceBuffer = std::function<bool(bool send)>;

/// The path for `op` on `rank` of `nranks`. Every rank of a collective takes the same path, since
/// device calls pass device memory on every rank (or host memory on every rank, then staged).
DevicePath devicePath(const Op& op, int rank, int nranks, const DeviceAbilities& can,
                      const IsDeviceBuffer& onDevice);

}  // namespace chorus::tuning
