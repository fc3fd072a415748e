// Single copy or staging for the allreduce, timed by rank 0 (see single_copy_choice.hpp).
#include "engine/single_copy_choice.hpp"

#include <bit>

#include "base/config.hpp"
#include "base/log.hpp"

namespace chorus::engine {

namespace {
// The verdict's bits: pull when no rank works in place; pull when one does.
constexpr uint32_t kPullOutOfPlace = 1, kPullInPlace = 2;
}  // namespace

const std::optional<TimedChoice>* SingleCopyChoice::find(OpKind kind, size_t bytes, bool anyInPlace) const {
  const int slot = slotOf(kind);
  if (slot < 0) return nullptr;
  const int log = bytes ? std::bit_width(bytes) - 1 : 0;
  return &classes_[static_cast<size_t>((slot * kClasses + log) * 2 + (anyInPlace ? 1 : 0))];
}

uint32_t SingleCopyChoice::verdict(OpKind kind, size_t bytes, bool pullOutOfPlace, bool pullInPlace) {
  const bool ranges[2] = {pullOutOfPlace, pullInPlace};
  uint32_t v = 0;
  for (int inPlace = 0; inPlace < 2; ++inPlace) {
    bool pull = ranges[inPlace];
    std::optional<TimedChoice>* c = find(kind, bytes, inPlace != 0);
    if (policy_ == Policy::Timed && c) {
      if (!*c) c->emplace(pull ? 1 : 0);
      pull = (*c)->next() == 1;
    }
    if (pull) v |= inPlace ? kPullInPlace : kPullOutOfPlace;
  }
  return v;
}

bool SingleCopyChoice::follow(uint32_t verdict, bool anyInPlace) {
  const bool pull = (verdict & (anyInPlace ? kPullInPlace : kPullOutOfPlace)) != 0;
  ++calls_[pull ? 1 : 0];
  return pull;
}

void SingleCopyChoice::record(OpKind kind, size_t bytes, bool anyInPlace, bool pulled, uint64_t ns) {
  std::optional<TimedChoice>* c = find(kind, bytes, anyInPlace);
  if (policy_ != Policy::Timed || bytes == 0 || !c || !*c) return;  // (not rank 0: no verdict asked)
  TimedChoice& t = **c;
  const bool wasWarm = t.warm();
  const int before = t.current();
  t.record(pulled ? 1 : 0, static_cast<double>(ns) * 1024.0 / static_cast<double>(bytes));
  if (t.warm() && (!wasWarm || t.current() != before)) {
    logInfo(Subsys::Tuning, opKindName(kind), " of ", formatBytes(size_t{1} << (std::bit_width(bytes) - 1)),
            " and up", anyInPlace ? ", a rank in place" : "", ": ",
            t.current() == 1 ? "single copy" : "staging", " (rank 0's estimates: single copy ",
            static_cast<uint64_t>(t.cost(1)), " ns/KiB, staging ", static_cast<uint64_t>(t.cost(0)), ")");
  }
}

double SingleCopyChoice::nsPerKiB(OpKind kind, size_t bytes, bool anyInPlace, bool pulled) const {
  const std::optional<TimedChoice>* c = find(kind, bytes, anyInPlace);
  return c && *c ? (*c)->cost(pulled ? 1 : 0) : 0.0;
}

SingleCopyChoice::Policy singleCopyChoicePolicy() {
  const EnvConfig& env = envConfig();
  return env.singleCopyChoice == "ranges" || env.cmaMinBytes ? SingleCopyChoice::Policy::Ranges
                                                             : SingleCopyChoice::Policy::Timed;
}

}  // namespace chorus::engine
