// Tuning: which algorithm runs a collective. One place for the registry (registry.cpp: one line
// per algorithm, with its cost formula), the CHORUS_ALGO grammar and the default choice written in
// it (rules.cpp), and the selector with its decision cache (selector.cpp). The order of a choice:
// the user's rules (CHORUS_ALGO, Config::algo); then, where the ranks do not share one host's
// memory, the cost model's cheapest prediction (algorithms/cost_model.hpp); then the default rules.
#pragma once

#include <cstddef>
#include <cstdint>
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

/// A communicator's choices: select() cached per (collective, size class, datatype), each new
/// decision logged once (CHORUS_DEBUG=INFO, subsystem TUNING).
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
  std::map<std::tuple<int, int, int>, const algo::Algorithm*> decisions_;
};

}  // namespace chorus::tuning
