// How reductions into the staging area are written (see staging_writes.hpp).
#include "engine/staging_writes.hpp"

#include "base/config.hpp"
#include "base/log.hpp"

namespace chorus::engine {

kernels::CopyMode StagingWrites::next(size_t bytes) {
  switch (policy_) {
    case Policy::Stores:
      return kernels::CopyMode::Cached;
    case Policy::Memcpy:
      return kernels::CopyMode::Handoff;
    case Policy::Streaming:
      return kernels::CopyMode::Streaming;
    case Policy::Auto:
      break;
  }
  if (bytes < kTimedBytes) return kernels::CopyMode::Cached;
  // Where the copies into staging stream, the peers' lines are far from this core: reductions
  // stream too (2-rank allreduce of 2 MiB, two core complexes: 437 us with both streaming, 786
  // with the copies streaming and the reductions timed between stores and memcpy).
  if (copiesStream()) return kernels::CopyMode::Streaming;
  return modeOf(choice_.next());
}

void StagingWrites::record(kernels::CopyMode mode, size_t bytes, uint64_t ns) {
  if (!timed(bytes) || mode == kernels::CopyMode::Streaming) return;
  choice_.record(mode == kernels::CopyMode::Handoff ? kMemcpy : kStores,
                 static_cast<double>(ns) * 1024.0 / static_cast<double>(bytes));
}

kernels::CopyMode StagingWrites::nextCopy(size_t bytes) {
  switch (copyPolicy_) {
    case CopyPolicy::Plain:
      return kernels::CopyMode::Cached;
    case CopyPolicy::Streaming:
      return kernels::CopyMode::Streaming;
    case CopyPolicy::Auto:
      break;
  }
  if (!copyTimed(bytes)) return kernels::CopyMode::Cached;
  return copies_.next() == kStreaming ? kernels::CopyMode::Streaming : kernels::CopyMode::Cached;
}

void StagingWrites::recordCopy(kernels::CopyMode mode, size_t bytes, uint64_t ns) {
  if (!copyTimed(bytes)) return;
  const bool wasWarm = copies_.warm();
  const int before = copies_.current();
  const bool streaming = mode == kernels::CopyMode::Streaming;
  copies_.record(streaming ? kStreaming : kPlain, static_cast<double>(ns) * 1024.0 /
                                                      static_cast<double>(bytes) *
                                                      (streaming ? kStreamingReadFactor : 1.0));
  if (copies_.warm() && (!wasWarm || copies_.current() != before)) {
    logInfo(Subsys::Tuning, "copies into staging: ", copies_.current() == kStreaming ? "streaming" : "plain",
            " stores (this rank's estimates: plain ", static_cast<uint64_t>(copies_.cost(kPlain)),
            " ns/KiB, streaming ", static_cast<uint64_t>(copies_.cost(kStreaming)), ")");
  }
}

StagingWrites::Policy stagingWritesPolicy() {
  const std::string& s = envConfig().stageWrite;
  if (s == "stores") return StagingWrites::Policy::Stores;
  if (s == "memcpy") return StagingWrites::Policy::Memcpy;
  if (s == "streaming") return StagingWrites::Policy::Streaming;
  return StagingWrites::Policy::Auto;
}

StagingWrites::CopyPolicy stagingCopiesPolicy() {
  const std::string& s = envConfig().stageCopy;
  if (s == "plain") return StagingWrites::CopyPolicy::Plain;
  if (s == "streaming") return StagingWrites::CopyPolicy::Streaming;
  return StagingWrites::CopyPolicy::Auto;
}

}  // namespace chorus::engine
