#include <algorithm>

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

namespace {

// The bytes inside [lo, hi] where a rule of `kind` among `rules` starts or stops applying (a
// message of at least that many bytes falls on the other side), added to `cuts`.
void addCuts(OpKind kind, size_t lo, size_t hi, const std::vector<Rule>& rules, std::vector<size_t>& cuts) {
  for (const Rule& r : rules) {
    if (r.kind != kind) continue;
    if (r.lo > lo && r.lo <= hi) cuts.push_back(r.lo);
    if (r.hi >= lo && r.hi < hi) cuts.push_back(r.hi + 1);
  }
}

}  // namespace

const Algorithm& Selector::choose(const Op& op, bool haveShm, const algo::CostModel* model) {
  const size_t bytes = op.messageBytes();
  // The same call as the last one (a training or serving loop repeats its calls): no map lookup.
  if (last_ && op.kind == lastKind_ && op.type == lastType_ && bytes == lastBytes_ && haveShm == lastShm_)
    return *last_;
  const int sizeClass = bytes == 0 ? 0 : 64 - __builtin_clzll(bytes);
  const auto key = std::make_tuple(static_cast<int>(op.kind), sizeClass, static_cast<int>(op.type));
  const size_t lo = sizeClass ? size_t{1} << (sizeClass - 1) : 0;  // the class: [lo, hi] bytes
  const size_t hi = sizeClass ? (sizeClass == 64 ? SIZE_MAX : (size_t{1} << sizeClass) - 1) : 0;
  auto it = decisions_.find(key);
  if (it == decisions_.end()) {
    // A class's messages share one decision unless a rule's bound falls inside it (the default
    // 1 KiB and 16 KiB bounds are inclusive, so they do; so can CHORUS_ALGO's): then each part
    // between the bounds gets its own, so that every size gets exactly what its rules say.
    Decision d;
    addCuts(op.kind, lo, hi, rules_, d.cuts);
    if (haveShm || model == nullptr)
      addCuts(op.kind, lo, hi, defaultRules(haveShm), d.cuts);  // else the model
    std::sort(d.cuts.begin(), d.cuts.end());
    d.cuts.erase(std::unique(d.cuts.begin(), d.cuts.end()), d.cuts.end());
    d.parts.assign(d.cuts.size() + 1, nullptr);
    it = decisions_.emplace(key, std::move(d)).first;
  }
  Decision& d = it->second;
  size_t part = 0;
  while (part < d.cuts.size() && bytes >= d.cuts[part]) ++part;
  if (!d.parts[part])
    d.parts[part] = &decide(op, haveShm, model, part ? d.cuts[part - 1] : lo,
                            part < d.cuts.size() ? d.cuts[part] - 1 : hi);
  last_ = d.parts[part];
  lastKind_ = op.kind;
  lastType_ = op.type;
  lastBytes_ = bytes;
  lastShm_ = haveShm;
  return *last_;
}

const Algorithm& Selector::decide(const Op& op, bool haveShm, const algo::CostModel* model, size_t from,
                                  size_t to) {
  const Algorithm& a = select(op, nranks_, haveShm, rules_, model);
  logInfo(Subsys::Tuning, "rank ", rank_, ": ", opKindName(op.kind), " ", dataTypeName(op.type), " ",
          formatBytes(from), " to ", formatBytes(to), " per rank -> ", a.name,
          a.note && model ? a.note(*model, op, nranks_) : std::string(), " (", a.description, ")");
  return a;
}

}  // namespace chorus::tuning
