// Fuzz target: the text parsers of configuration and bootstrap data, each fed the whole input.
//
//  - parseByteSize (every CHORUS_* size variable): a parsed size, written back in decimal and with its
//    largest exact binary suffix, parses to the same value.
//  - parseRules (CHORUS_ALGO): accepts or throws chorus::Error; accepted rules, written back in the
//    canonical `coll:lo-hi:algo` form, parse to the same rules.
//  - HostIdentity::parse (identities exchanged through the store): serialize(parse(x)) parses to the
//    same identity.
//  - parseUniqueId (the first 128 bytes, as a chorusUniqueId): a decoded id, re-encoded, decodes the same.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "base/config.hpp"
#include "base/op.hpp"
#include "bootstrap/host_identity.hpp"
#include "bootstrap/unique_id.hpp"
#include "chorus/chorus.hpp"
#include "tuning/tuning.hpp"

namespace {

using namespace chorus;

[[noreturn]] void bug(const char* what, const std::string& input) {
  std::fprintf(stderr, "fuzz_config_parsers: %s (input '%s')\n", what, input.c_str());
  std::abort();
}

std::string sizeText(size_t v) {
  return v == std::numeric_limits<size_t>::max() ? std::string("inf") : std::to_string(v);
}

void byteSize(const std::string& text) {
  const std::optional<size_t> v = parseByteSize(text);
  if (!v) return;
  if (parseByteSize(sizeText(*v)) != v) bug("parseByteSize: decimal round trip", text);
  if (*v == std::numeric_limits<size_t>::max() || *v == 0) return;
  static const char* const kSuffix[] = {"", "k", "M", "G", "T"};
  int shift = 0;
  while (shift < 4 && (*v >> (10 * shift)) % 1024 == 0) ++shift;
  const std::string scaled = std::to_string(*v >> (10 * shift)) + kSuffix[shift] + (shift ? "iB" : "");
  if (parseByteSize(scaled) != v) bug("parseByteSize: suffixed round trip", text);
}

void rules(const std::string& text) {
  std::vector<tuning::Rule> parsed;
  try {
    parsed = tuning::parseRules(text);
  } catch (const Error&) {
    return;
  }
  std::string canonical;
  for (const tuning::Rule& r : parsed) {
    // parseRules only makes rules for collectives, whose CHORUS_ALGO names are opKindName's.
    if (r.kind == OpKind::Send || r.kind == OpKind::Recv) bug("parseRules: rule for send/recv", text);
    const char* coll = opKindName(r.kind);
    canonical += std::string(canonical.empty() ? "" : ",") + coll + ":" + std::to_string(r.lo) + "-" +
                 sizeText(r.hi) + ":" + r.name;
  }
  std::vector<tuning::Rule> again;
  try {
    again = tuning::parseRules(canonical);
  } catch (const Error&) {
    bug("parseRules: canonical form rejected", text);
  }
  if (again.size() != parsed.size()) bug("parseRules: round trip changed the rule count", text);
  for (size_t i = 0; i < parsed.size(); ++i) {
    if (again[i].kind != parsed[i].kind || again[i].lo != parsed[i].lo || again[i].hi != parsed[i].hi ||
        again[i].name != parsed[i].name) {
      bug("parseRules: round trip changed a rule", text);
    }
  }
}

void hostIdentity(const std::string& text) {
  const std::optional<HostIdentity> h = HostIdentity::parse(text);
  if (!h) return;
  const std::optional<HostIdentity> again = HostIdentity::parse(h->serialize());
  if (!again || again->bootId != h->bootId || again->hostname != h->hostname || again->netns != h->netns ||
      again->pidns != h->pidns || again->ipcns != h->ipcns || again->pid != h->pid) {
    bug("HostIdentity: serialize/parse round trip", text);
  }
}

void uniqueId(const uint8_t* data, size_t size) {
  chorusUniqueId id;
  std::memset(id.internal, 0, sizeof id.internal);
  std::memcpy(id.internal, data, std::min(size, sizeof id.internal));
  const std::optional<UniqueIdAddress> a = parseUniqueId(id);
  if (!a) return;
  if (a->port == 0 || a->host.empty() || a->nonce.empty() || a->secret.empty()) {
    bug("parseUniqueId: accepted an empty field", "");
  }
  chorusUniqueId again;
  if (!formatUniqueId(*a, &again)) return;  // fields filled a whole id
  const std::optional<UniqueIdAddress> b = parseUniqueId(again);
  if (!b || b->host != a->host || b->port != a->port || b->nonce != a->nonce || b->secret != a->secret) {
    bug("parseUniqueId: round trip", "");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  byteSize(text);
  rules(text);
  hostIdentity(text);
  uniqueId(data, size);
  return 0;
}
