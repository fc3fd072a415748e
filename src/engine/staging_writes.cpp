// How reductions into the staging area are written (see staging_writes.hpp).
#include "engine/staging_writes.hpp"

#include "base/config.hpp"

namespace chorus::engine {

kernels::CopyMode StagingWrites::next(size_t bytes) {
  switch (policy_) {
    case Policy::Stores:
      return kernels::CopyMode::Cached;
    case Policy::Memcpy:
      return kernels::CopyMode::Handoff;
    case Policy::Auto:
      break;
  }
  return timed(bytes) ? modeOf(choice_.next()) : kernels::CopyMode::Cached;
}

void StagingWrites::record(kernels::CopyMode mode, size_t bytes, uint64_t ns) {
  if (!timed(bytes)) return;
  choice_.record(mode == kernels::CopyMode::Handoff ? kMemcpy : kStores,
                 static_cast<double>(ns) * 1024.0 / static_cast<double>(bytes));
}

StagingWrites::Policy stagingWritesPolicy() {
  const std::string& s = envConfig().stageWrite;
  if (s == "stores") return StagingWrites::Policy::Stores;
  if (s == "memcpy") return StagingWrites::Policy::Memcpy;
  return StagingWrites::Policy::Auto;
}

}  // namespace chorus::engine
