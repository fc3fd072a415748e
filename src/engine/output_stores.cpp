// How ranks write the outputs they copy out of staging (see output_stores.hpp).
#include "engine/output_stores.hpp"

#include <bit>

#include "base/config.hpp"

namespace chorus::engine {

bool OutputStores::timed(OpKind kind, size_t outputBytes) const {
  return timed_ && outputBytes >= kTimedBytes &&
         (kind == OpKind::AllGather || kind == OpKind::AllReduce || kind == OpKind::AllToAll);
}

size_t OutputStores::indexOf(OpKind kind, size_t outputBytes) const {
  if (!timed(kind, outputBytes)) return kNone;
  const size_t cls = static_cast<size_t>(std::bit_width(outputBytes) - 1);
  return (kind == OpKind::AllGather ? 0 : kind == OpKind::AllReduce ? kClasses : 2 * kClasses) + cls;
}

kernels::CopyMode OutputStores::next(OpKind kind, size_t outputBytes, kernels::CopyMode preferred) {
  const size_t i = indexOf(kind, outputBytes);
  if (i == kNone) return preferred;
  std::optional<TimedChoice>& c = classes_[i];
  if (!c) c.emplace(wayOf(preferred));
  return modeOf(c->next());
}

void OutputStores::record(OpKind kind, size_t outputBytes, kernels::CopyMode mode, uint64_t ns) {
  const size_t i = indexOf(kind, outputBytes);
  if (i == kNone || !classes_[i]) return;
  classes_[i]->record(wayOf(mode), static_cast<double>(ns) * 1024.0 / static_cast<double>(outputBytes));
}

double OutputStores::nsPerKiB(OpKind kind, size_t outputBytes, kernels::CopyMode mode) const {
  const size_t i = indexOf(kind, outputBytes);
  return i != kNone && classes_[i] ? classes_[i]->cost(wayOf(mode)) : 0;
}

std::optional<kernels::CopyMode> OutputStores::current(OpKind kind, size_t outputBytes) const {
  const size_t i = indexOf(kind, outputBytes);
  if (i == kNone || !classes_[i]) return std::nullopt;
  return modeOf(classes_[i]->current());
}

bool outputStoresTimed() { return envConfig().ntStoreBytes == 0; }

}  // namespace chorus::engine
