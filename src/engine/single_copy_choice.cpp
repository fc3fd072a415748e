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

size_t SingleCopyChoice::classOf(size_t bytes, bool anyInPlace) {
  const size_t log = bytes ? static_cast<size_t>(std::bit_width(bytes) - 1) : 0;
  return 2 * log + (anyInPlace ? 1 : 0);
}

uint32_t SingleCopyChoice::verdict(size_t bytes, bool pullOutOfPlace, bool pullInPlace) {
  const bool ranges[2] = {pullOutOfPlace, pullInPlace};
  uint32_t v = 0;
  for (int inPlace = 0; inPlace < 2; ++inPlace) {
    bool pull = ranges[inPlace];
    if (policy_ == Policy::Timed) {
      std::optional<TimedChoice>& c = classes_[classOf(bytes, inPlace != 0)];
      if (!c) c.emplace(pull ? 1 : 0);
      pull = c->next() == 1;
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

void SingleCopyChoice::record(size_t bytes, bool anyInPlace, bool pulled, uint64_t ns) {
  if (policy_ != Policy::Timed || bytes == 0) return;
  std::optional<TimedChoice>& c = classes_[classOf(bytes, anyInPlace)];
  if (!c) return;  // not asked for a verdict (not rank 0)
  const bool wasWarm = c->warm();
  const int before = c->current();
  c->record(pulled ? 1 : 0, static_cast<double>(ns) * 1024.0 / static_cast<double>(bytes));
  if (c->warm() && (!wasWarm || c->current() != before)) {
    logInfo(Subsys::Tuning, "allreduce of ", formatBytes(size_t{1} << (classOf(bytes, false) / 2)), " and up",
            anyInPlace ? ", a rank in place" : "", ": ", c->current() == 1 ? "single copy" : "staging",
            " (rank 0's estimates: single copy ", static_cast<uint64_t>(c->cost(1)), " ns/KiB, staging ",
            static_cast<uint64_t>(c->cost(0)), ")");
  }
}

double SingleCopyChoice::nsPerKiB(size_t bytes, bool anyInPlace, bool pulled) const {
  const std::optional<TimedChoice>& c = classes_[classOf(bytes, anyInPlace)];
  return c ? c->cost(pulled ? 1 : 0) : 0.0;
}

SingleCopyChoice::Policy singleCopyChoicePolicy() {
  const EnvConfig& env = envConfig();
  return env.singleCopyChoice == "ranges" || env.cmaMinBytes ? SingleCopyChoice::Policy::Ranges
                                                             : SingleCopyChoice::Policy::Timed;
}

}  // namespace chorus::engine
