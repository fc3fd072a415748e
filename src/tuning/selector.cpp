#include "algorithms/cost_model.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "tuning/tuning.hpp"

namespace chorus::tuning {

using algo::Algorithm;

const Algorithm* cheapest(const algo::CostModel& model, const Op& op, int n) {
  const Algorithm* best = nullptr;
  double bestUs = 0;
  for (const Algorithm& a : registry()) {
    if (a.kind != op.kind) continue;
    const double us = model.predictUs(a, op, n);
    if (us < 0) continue;
    if (!best || us < bestUs) {
      best = &a;
      bestUs = us;
    }
  }
  return best;
}

namespace {

const Algorithm* firstMatch(const Op& op, bool haveShm, const std::vector<Rule>& rules) {
  const size_t bytes = op.messageBytes();
  for (const Rule& r : rules) {
    if (r.kind != op.kind || bytes < r.lo || bytes > r.hi) continue;
    const Algorithm* a = findAlgorithm(op.kind, r.name);
    if (a && (!a->needsSharedMemory || haveShm)) return a;
  }
  return nullptr;
}

}  // namespace

const Algorithm& select(const Op& op, int nranks, bool haveShm, const std::vector<Rule>& rules,
                        const algo::CostModel* model) {
  if (const Algorithm* a = firstMatch(op, haveShm, rules)) return *a;
  if (!haveShm && model) {
    if (const Algorithm* a = cheapest(*model, op, nranks)) return *a;
  }
  if (const Algorithm* a = firstMatch(op, haveShm, defaultRules(haveShm))) return *a;
  fail(chorusInternalError, strCat("no algorithm for ", opKindName(op.kind)));
}

const Algorithm& Selector::choose(const Op& op, bool haveShm, const algo::CostModel* model) {
  const size_t bytes = op.messageBytes();
  const int sizeClass = bytes == 0 ? 0 : 64 - __builtin_clzll(bytes);
  const auto key = std::make_tuple(static_cast<int>(op.kind), sizeClass, static_cast<int>(op.type));
  if (auto it = decisions_.find(key); it != decisions_.end()) return *it->second;
  const Algorithm& a = select(op, nranks_, haveShm, rules_, model);
  decisions_[key] = &a;
  logInfo(Subsys::Tuning, "rank ", rank_, ": ", opKindName(op.kind), " ", dataTypeName(op.type), " up to ",
          formatBytes(sizeClass ? (size_t{1} << sizeClass) - 1 : 0), " per rank -> ", a.name,
          a.note && model ? a.note(*model, op, nranks_) : std::string(), " (", a.description, ")");
  return a;
}

}  // namespace chorus::tuning
