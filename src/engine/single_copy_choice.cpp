// Single copy or staging for the allreduce, all-gather and reduce-scatter, timed by rank 0 (see
// single_copy_choice.hpp).
#include "engine/single_copy_choice.hpp"

#include <bit>

#include "base/config.hpp"
#include "base/log.hpp"

namespace chorus::engine {

namespace {
// The verdict's bits: read in place when no rank works in place, when one does; time the call
// (a staged one ends with a synchronisation), when no rank works in place, when one does.
constexpr uint32_t kPull[2] = {1, 2}, kTime[2] = {4, 8};
}  // namespace

int SingleCopyChoice::indexOf(OpKind kind, size_t bytes, bool anyInPlace) {
  const int slot = slotOf(kind);
  if (slot < 0) return -1;
  const int log = bytes ? std::bit_width(bytes) - 1 : 0;
  return (slot * kClasses + log) * 2 + (anyInPlace ? 1 : 0);
}

uint32_t SingleCopyChoice::verdict(OpKind kind, size_t bytes, bool pullOutOfPlace, bool pullInPlace) {
  const bool ranges[2] = {pullOutOfPlace, pullInPlace};
  uint32_t v = 0;
  for (int inPlace = 0; inPlace < 2; ++inPlace) {
    bool pull = ranges[inPlace];
    const int i = indexOf(kind, bytes, inPlace != 0);
    if (policy_ == Policy::Timed && i >= 0) {
      std::optional<TimedChoice>& c = classes_[static_cast<size_t>(i)];
      if (!c) c.emplace(pull ? 1 : 0);
      pull = c->next() == 1;
      // Single copy is timed always; staging while warming up, when tried, and one in kStagedSample.
      const bool sample = pull || !c->warm() || c->current() == 1 ||
                          ++stagedAsked_[static_cast<size_t>(i)] % kStagedSample == 0;
      if (sample) v |= kTime[inPlace];
    }
    if (pull) v |= kPull[inPlace];
  }
  return v;
}

SingleCopyChoice::Way SingleCopyChoice::follow(uint32_t verdict, bool anyInPlace) {
  const int k = anyInPlace ? 1 : 0;
  const Way w{(verdict & kPull[k]) != 0, (verdict & kTime[k]) != 0};
  ++calls_[w.single ? 1 : 0];
  return w;
}

void SingleCopyChoice::record(OpKind kind, size_t bytes, bool anyInPlace, bool single, uint64_t ns) {
  const int i = indexOf(kind, bytes, anyInPlace);
  if (policy_ != Policy::Timed || bytes == 0 || i < 0 || !classes_[static_cast<size_t>(i)])
    return;  // not rank 0
  TimedChoice& t = *classes_[static_cast<size_t>(i)];
  const bool wasWarm = t.warm();
  const int before = t.current();
  t.record(single ? 1 : 0, static_cast<double>(ns) * 1024.0 / static_cast<double>(bytes));
  if (t.warm() && (!wasWarm || t.current() != before)) {
    logInfo(Subsys::Tuning, opKindName(kind), " of ", formatBytes(size_t{1} << (std::bit_width(bytes) - 1)),
            " and up", anyInPlace ? ", a rank in place" : "", ": ",
            t.current() == 1 ? "single copy" : "staging", " (rank 0's estimates: single copy ",
            static_cast<uint64_t>(t.cost(1)), " ns/KiB, staging ", static_cast<uint64_t>(t.cost(0)), ")");
  }
}

double SingleCopyChoice::nsPerKiB(OpKind kind, size_t bytes, bool anyInPlace, bool pulled) const {
  const int i = indexOf(kind, bytes, anyInPlace);
  const std::optional<TimedChoice>* c = i < 0 ? nullptr : &classes_[static_cast<size_t>(i)];
  return c && *c ? (*c)->cost(pulled ? 1 : 0) : 0.0;
}

SingleCopyChoice::Policy singleCopyChoicePolicy() {
  const EnvConfig& env = envConfig();
  return env.singleCopyChoice == "ranges" || env.cmaMinBytes ? SingleCopyChoice::Policy::Ranges
                                                             : SingleCopyChoice::Policy::Timed;
}

}  // namespace chorus::engine
