// The algorithm registry, the CHORUS_ALGO grammar and the built-in choice.
#include <cstring>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "base/config.hpp"
#include "base/error.hpp"

namespace chorus::algo {

namespace {

// AllReduce on one host: up to this size one synchronisation beats reading each byte once.
constexpr size_t kOneShotMaxBytes = 16384;
// ... and up to this size the low-latency lines beat staging (one cache-line transfer per line).
constexpr size_t kLowLatencyMaxBytes = 1024;

// One line per algorithm. Order within a collective does not matter; select() decides.
constexpr Algorithm kRegistry[] = {
    {OpKind::AllReduce, "direct",
     "each rank reduces its slice straight from every peer's shared staging area", true, allReduceDirect},
    {OpKind::AllReduce, "oneshot",
     "every rank reduces the whole message from all staging areas: one synchronisation per chunk", true,
     allReduceOneShot},
    {OpKind::AllReduce, "ll",
     "low latency: data and flag share each cache line; every rank reduces the whole message", true,
     allReduceLowLatency},
    {OpKind::AllReduce, "ring", "pipelined ring: reduce-scatter then all-gather over point-to-point pipes",
     false, allReduceRing},
    {OpKind::AllReduce, "rd", "recursive doubling (log2 n exchanges of the whole message)", false,
     allReduceRecursiveDoubling},
    {OpKind::AllReduce, "rhd",
     "recursive halving-doubling (Rabenseifner): reduce-scatter by halving, all-gather by doubling", false,
     allReduceHalvingDoubling},
    {OpKind::AllReduce, "tree",
     "double binary tree: each half reduced up and broadcast down its own tree, in pipelined chunks", false,
     allReduceTree},
    {OpKind::AllReduce, "hier",
     "hierarchical: ring reduce-scatter within each host, ring allreduce across hosts per local rank, ring "
     "all-gather within each host (the flat ring on one host)",
     false, allReduceHierarchical},
    {OpKind::ReduceScatter, "direct", "each rank reduces its block from every peer's staging area", true,
     reduceScatterDirect},
    {OpKind::ReduceScatter, "ring", "pipelined ring over point-to-point pipes", false, reduceScatterRing},
    {OpKind::AllGather, "direct", "every rank copies each peer's block out of its staging area", true,
     allGatherDirect},
    {OpKind::AllGather, "ring", "pipelined ring over point-to-point pipes", false, allGatherRing},
    {OpKind::Broadcast, "direct", "root stages chunks, every rank copies them out", true, broadcastDirect},
    {OpKind::Broadcast, "pipeline", "chain from the root, forwarding bytes as they arrive", false,
     broadcastPipeline},
    {OpKind::Broadcast, "knomial", "4-nomial tree from the root, forwarding bytes as they arrive", false,
     broadcastKnomial},
    {OpKind::Reduce, "direct", "root reduces every rank's staged chunk", true, reduceDirect},
    {OpKind::Reduce, "pipeline", "chain towards the root, reducing and forwarding as bytes arrive", false,
     reducePipeline},
    {OpKind::Reduce, "knomial", "4-nomial tree towards the root, reducing chunk by chunk", false,
     reduceKnomial},
    {OpKind::AllToAll, "direct", "every rank copies its block out of each peer's staging area", true,
     allToAllDirect},
    {OpKind::AllToAll, "pairwise", "all pairwise exchanges progressed together", false, allToAllPairwise},
    {OpKind::AllToAllv, "pairwise", "all pairwise exchanges progressed together", false, allToAllvPairwise},
    {OpKind::Barrier, "direct", "shared-memory arrival counters", true, barrierDirect},
    {OpKind::Barrier, "pipes", "dissemination barrier over point-to-point pipes", false, barrierPipes},
};

struct CollName {
  const char* name;
  OpKind kind;
};
constexpr CollName kCollNames[] = {
    {"allreduce", OpKind::AllReduce},
    {"all_reduce", OpKind::AllReduce},
    {"reducescatter", OpKind::ReduceScatter},
    {"reduce_scatter", OpKind::ReduceScatter},
    {"allgather", OpKind::AllGather},
    {"all_gather", OpKind::AllGather},
    {"broadcast", OpKind::Broadcast},
    {"bcast", OpKind::Broadcast},
    {"reduce", OpKind::Reduce},
    {"alltoall", OpKind::AllToAll},
    {"alltoallv", OpKind::AllToAllv},
    {"barrier", OpKind::Barrier},
};

const Algorithm* find(OpKind kind, const std::string& name) {
  for (const Algorithm& a : kRegistry) {
    if (a.kind == kind && name == a.name) return &a;
  }
  return nullptr;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

std::span<const Algorithm> registry() { return kRegistry; }

std::vector<Rule> parseRules(const std::string& text) {
  std::vector<Rule> rules;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string entry =
        trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    if (entry.empty()) continue;
    auto bad = [&](const std::string& why) {
      failInvalid("CHORUS_ALGO entry '", entry, "': ", why,
                  " (expected coll[:lo-hi]:algo or, after an entry, lo-hi:algo, e.g. "
                  "allreduce:0-64K:tree,64K-inf:ring or broadcast:pipeline)");
    };
    std::vector<std::string> parts;
    size_t p = 0;
    for (;;) {
      size_t c = entry.find(':', p);
      parts.push_back(trim(entry.substr(p, c == std::string::npos ? std::string::npos : c - p)));
      if (c == std::string::npos) break;
      p = c + 1;
    }
    if (parts.size() != 2 && parts.size() != 3) bad("wrong number of ':' fields");
    Rule rule;
    bool found = false;
    for (const CollName& c : kCollNames) {
      if (parts[0] == c.name) {
        rule.kind = c.kind;
        found = true;
      }
    }
    // "lo-hi:algo" continues the previous entry's collective, as in allreduce:0-64K:tree,64K-inf:ring.
    if (!found && parts.size() == 2 && parts[0].find('-') != std::string::npos) {
      if (rules.empty()) bad("a size range without a collective must follow an entry that names one");
      rule.kind = rules.back().kind;
      found = true;
      parts.insert(parts.begin(), std::string());
    }
    if (!found) bad(strCat("unknown collective '", parts[0], "'"));
    if (parts.size() == 3) {
      size_t dash = parts[1].find('-');
      if (dash == std::string::npos) bad("size range must be lo-hi");
      auto lo = parseByteSize(parts[1].substr(0, dash));
      auto hi = parseByteSize(parts[1].substr(dash + 1));
      if (!lo || !hi || *lo > *hi) bad("bad size range");
      rule.lo = *lo;
      rule.hi = *hi;
    }
    rule.name = parts.back();
    if (!find(rule.kind, rule.name)) {
      std::string known;
      for (const Algorithm& a : kRegistry) {
        if (a.kind == rule.kind) known += strCat(known.empty() ? "" : ", ", a.name);
      }
      bad(strCat("unknown algorithm '", rule.name, "' (known: ", known, ")"));
    }
    rules.push_back(rule);
  }
  return rules;
}

const Algorithm& select(const Op& op, int nranks, bool haveShm, const std::vector<Rule>& rules,
                        const CostModel* model) {
  const size_t bytes = op.messageBytes();
  for (const Rule& r : rules) {
    if (r.kind != op.kind || bytes < r.lo || bytes > r.hi) continue;
    const Algorithm* a = find(op.kind, r.name);
    if (a && (!a->needsSharedMemory || haveShm)) return *a;
  }
  if (!haveShm && model) {
    if (const Algorithm* a = cheapest(*model, op, nranks)) return *a;
  }
  // Built-in choice (the topology-aware cost model is a later layer): on one host the direct
  // shared-memory algorithms move each byte the fewest times; without shared memory, latency-bound
  // sizes use recursive doubling and bandwidth-bound sizes the ring.
  const char* name = nullptr;
  switch (op.kind) {
    case OpKind::AllReduce:
      if (haveShm)
        name = bytes <= kLowLatencyMaxBytes ? "ll" : bytes <= kOneShotMaxBytes ? "oneshot" : "direct";
      else
        name = bytes <= 16384 ? "rd" : "ring";
      break;
    case OpKind::ReduceScatter:
      name = haveShm ? "direct" : "ring";
      break;
    case OpKind::AllGather:
      name = haveShm ? "direct" : "ring";
      break;
    case OpKind::Broadcast:
      name = haveShm ? "direct" : "pipeline";
      break;
    case OpKind::Reduce:
      name = haveShm ? "direct" : "pipeline";
      break;
    case OpKind::AllToAll:
      name = haveShm ? "direct" : "pairwise";
      break;
    case OpKind::AllToAllv:
      name = "pairwise";
      break;
    case OpKind::Barrier:
      name = haveShm ? "direct" : "pipes";
      break;
    default:
      break;
  }
  const Algorithm* a = name ? find(op.kind, name) : nullptr;
  if (!a) fail(chorusInternalError, strCat("no algorithm for ", opKindName(op.kind)));
  return *a;
}

}  // namespace chorus::algo
