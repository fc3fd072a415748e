// The CHORUS_ALGO grammar, and the default choice written in it.
#include "base/config.hpp"
#include "base/error.hpp"
#include "tuning/tuning.hpp"

namespace chorus::tuning {

using namespace chorus::algo;

namespace {

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

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

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
    if (!findAlgorithm(rule.kind, rule.name)) {
      std::string known;
      for (const Algorithm& a : registry()) {
        if (a.kind == rule.kind) known += strCat(known.empty() ? "" : ", ", a.name);
      }
      bad(strCat("unknown algorithm '", rule.name, "' (known: ", known, ")"));
    }
    rules.push_back(rule);
  }
  return rules;
}

const std::vector<Rule>& defaultRules(bool haveShm) {
  // On one host the direct shared-memory algorithms move each byte the fewest times; allreduce
  // uses the low-latency lines up to 1 KiB (one cache-line transfer per line beats staging) and
  // the one-shot reduction up to 16 KiB (one synchronisation beats reading each byte once);
  // broadcast and reduce use them up to 256 bytes (2 ranks on the AVX-512 EPYC VM: 8 B 1.4-1.6x
  // faster, 512 B even, 2 KiB 1.2-2x slower; docs/performance.md, "Rooted calls in the
  // low-latency lines").
  static const std::vector<Rule> shm = parseRules(
      "allreduce:0-1k:ll,0-16k:oneshot,allreduce:direct,reducescatter:direct,allgather:direct,"
      "broadcast:0-256:ll,broadcast:direct,reduce:0-256:ll,reduce:direct,alltoall:direct,alltoallv:pairwise,"
      "barrier:direct");
  // Without shared memory and without a cost model: recursive doubling while latency-bound, rings
  // and chains beyond.
  static const std::vector<Rule> pipes = parseRules(
      "allreduce:0-16k:rd,allreduce:ring,reducescatter:ring,allgather:ring,broadcast:pipeline,"
      "reduce:pipeline,alltoall:pairwise,alltoallv:pairwise,barrier:pipes");
  return haveShm ? shm : pipes;
}

}  // namespace chorus::tuning
