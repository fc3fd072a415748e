// How reductions into the staging area are written (see staging_writes.hpp).
#include "engine/staging_writes.hpp"

#include <algorithm>
#include <bit>

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

kernels::CopyMode StagingWrites::nextCopy(size_t bytes, bool withOwn) {
  switch (copyPolicy_) {
    case CopyPolicy::Plain:
      return kernels::CopyMode::Cached;
    case CopyPolicy::Streaming:
      return kernels::CopyMode::Streaming;
    case CopyPolicy::Auto:
      break;
  }
  if (!copyTimed(bytes)) return kernels::CopyMode::Cached;
  return copyChoice(withOwn).next() == kStreaming ? kernels::CopyMode::Streaming : kernels::CopyMode::Cached;
}

void StagingWrites::recordCopy(kernels::CopyMode mode, size_t bytes, uint64_t ns, double readersPenalty,
                               bool withOwn) {
  if (!copyTimed(bytes)) return;
  TimedChoice& copies = withOwn ? copiesWithOwn_ : copies_;
  const bool wasWarm = copies.warm();
  const int before = copies.current();
  const bool streaming = mode == kernels::CopyMode::Streaming;
  double cost = static_cast<double>(ns) * 1024.0 / static_cast<double>(bytes);
  const double penalty = readersPenalty >= 0 ? readersPenalty : readPenaltyNsPerKiB(bytes);
  if (streaming) cost = penalty >= 0 ? cost + penalty : cost * kStreamingReadFactor;
  copies.record(streaming ? kStreaming : kPlain, cost);
  if (copies.warm() && (!wasWarm || copies.current() != before)) {
    logInfo(Subsys::Tuning, withOwn ? "copies into staging beside the own output: " : "copies into staging: ",
            copies.current() == kStreaming ? "streaming" : "plain", " stores (this rank's estimates: plain ",
            static_cast<uint64_t>(copies.cost(kPlain)), " ns/KiB, streaming ",
            static_cast<uint64_t>(copies.cost(kStreaming)),
            penalty >= 0 ? strCat(" with the readers' ", static_cast<uint64_t>(penalty), " ns/KiB more")
                         : std::string(" counted 1.5x for the readers"),
            ")");
  }
}

int StagingWrites::readClass(size_t bytes) {
  if (bytes < kTimedBytes) return -1;
  const int c = std::bit_width(bytes / kTimedBytes) - 1;
  return c < kReadClasses ? c : kReadClasses - 1;
}

bool StagingWrites::readTimed(bool streamed, size_t bytes) {
  const int c = readClass(bytes);
  if (c < 0 || copyPolicy_ != CopyPolicy::Auto) return false;
  const bool changed = streamed != lastReadStreamed_;
  lastReadStreamed_ = streamed;
  const int way = streamed ? kStreaming : kPlain;
  if (changed || reads_[0][c].samples[way] < TimedChoice::kWarmUp || ++readsUntimed_ >= kReadSample) {
    readsUntimed_ = 0;
    return true;
  }
  return false;
}

void StagingWrites::recordRead(bool streamed, size_t bytes, uint64_t ns, bool reduction) {
  const int c = readClass(bytes);
  if (c < 0 || copyPolicy_ != CopyPolicy::Auto) return;
  ReadCost& r = reads_[reduction ? 1 : 0][c];
  const int way = streamed ? kStreaming : kPlain;
  const double cost = static_cast<double>(ns) * 1024.0 / static_cast<double>(bytes);
  double& estimate = r.nsPerKiB[way];
  // As TimedChoice's estimates: the least of the first samples, then half way to each new one,
  // a sample far above (a descheduled reader) counting as twice the estimate.
  if (r.samples[way]++ < TimedChoice::kWarmUp)
    estimate = r.samples[way] == 1 ? cost : std::min(estimate, cost);
  else
    estimate += (std::min(cost, 2 * estimate) - estimate) / 2;
}

double StagingWrites::readPenaltyNsPerKiB(size_t bytes) const {
  const int c = readClass(bytes);
  if (c < 0) return -1;
  double sum = 0;
  int kinds = 0;
  for (const ReadCost* byClass : reads_) {
    const ReadCost& r = byClass[c];
    if (r.samples[kPlain] == 0 || r.samples[kStreaming] == 0) continue;
    sum += std::max(0.0, r.nsPerKiB[kStreaming] - r.nsPerKiB[kPlain]);
    ++kinds;
  }
  return kinds ? sum / kinds : -1;
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
