#include "core/flight_recorder.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "base/util.hpp"
#include "engine/waiter.hpp"

namespace chorus {

FlightRecorder::FlightRecorder(size_t capacity, bool precise) : ring_(capacity), precise_(precise) {}

std::chrono::steady_clock::time_point FlightRecorder::now() const {
  return precise_ ? std::chrono::steady_clock::now() : engine::coarseNow();
}

FlightEntry* FlightRecorder::begin(std::chrono::steady_clock::time_point now) {
  if (ring_.empty()) return nullptr;
  FlightEntry* e = &ring_[next_];
  *e = FlightEntry{};
  e->start = now;
  if (++next_ == ring_.size()) next_ = 0;
  if (filled_ < ring_.size()) ++filled_;
  open_ = e;
  return e;
}

void FlightRecorder::end(chorusResult_t status) {
  if (!open_) return;
  open_->status = status;
  open_->took = now() - open_->start;
  open_ = nullptr;
}

std::string FlightRecorder::format() const {
  // Steady times become wall-clock times (as of now) so that files of several ranks line up.
  const auto toWall = std::chrono::system_clock::now().time_since_epoch() -
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(
                          std::chrono::steady_clock::now().time_since_epoch());
  std::string out;
  const size_t first = (next_ + ring_.size() - filled_) % (ring_.empty() ? 1 : ring_.size());
  for (size_t i = 0; i < filled_; ++i) {
    out += formatFlightEntry(ring_[(first + i) % ring_.size()], toWall);
    out += '\n';
  }
  return out;
}

std::string formatFlightEntry(const FlightEntry& e, std::chrono::system_clock::duration toWall) {
  const auto wall =
      std::chrono::duration_cast<std::chrono::system_clock::duration>(e.start.time_since_epoch()) + toWall;
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(wall).count();
  const std::time_t secs = static_cast<std::time_t>(us / 1'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char when[48];
  std::strftime(when, sizeof when, "%H:%M:%S", &tm);
  std::string what =
      e.kind == OpKind::Send || e.kind == OpKind::Recv
          ? strCat("sends/receives (", e.count, " transfers)")
          : strCat(opKindName(e.kind), " #", e.seq, " count ", e.count, " ", dataTypeName(e.type));
  if (isReducing(e.kind)) what += strCat(" ", reduceOpName(e.op));
  if (e.kind == OpKind::Broadcast || e.kind == OpKind::Reduce) what += strCat(" root ", e.root);
  if (e.algorithm) what += strCat(" [", e.algorithm, "]");
  char frac[16];
  std::snprintf(frac, sizeof frac, ".%06lld", static_cast<long long>(us % 1'000'000));
  std::string status =
      e.status == chorusInProgress
          ? std::string("IN PROGRESS")
          : strCat(e.status == chorusSuccess ? "ok" : "FAILED (code " + std::to_string(e.status) + ")",
                   " in ", std::chrono::duration_cast<std::chrono::microseconds>(e.took).count(), " us");
  return strCat(when, frac, " UTC  ", what, "  ", status);
}

std::string FlightRecorder::writeFile(const std::string& file, const std::string& header) const {
  FILE* f = std::fopen(file.c_str(), "w");
  if (!f) return strCat(" (cannot write the flight recorder to ", file, ": ", std::strerror(errno), ")");
  std::fprintf(f, "%s# the last %zu operations of this rank, oldest first:\n%s", header.c_str(), size(),
               format().c_str());
  std::fclose(f);
  return strCat(" (flight recorder written to ", file, ")");
}

}  // namespace chorus
