// The flight recorder: the last N operations of one communicator on this rank (what was called,
// with which algorithm, when it started and ended, how it ended), kept always and written out when
// an operation fails if CHORUS_FLIGHT_RECORDER names a file. With every rank's file side by side a
// hang shows which rank stopped where: the ranks that finished #7 and the one still in #6.
// Times are read from the exact clock only where a file is named (`precise`), the only place they
// are seen; otherwise from the coarse one (engine::coarseNow: 3 ns a read against 21 on the
// development VM; the two exact reads a call were 16% of a 2-rank 8-byte allreduce), to the tick.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/op.hpp"
#include "chorus/chorus.h"

namespace chorus {

struct FlightEntry {
  uint64_t seq = 0;  // collective sequence number (0 for a group of sends/receives)
  OpKind kind = OpKind::AllReduce;
  size_t count = 0;  // elements; transfers for a send/receive group
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  int root = -1;
  const char* algorithm = nullptr;  // static string from the registry
  std::chrono::steady_clock::time_point start{};
  std::chrono::steady_clock::duration took{};  // valid once status is not chorusInProgress
  chorusResult_t status = chorusInProgress;
};

class FlightRecorder {
 public:
  /// Keeps the last `capacity` entries (0 disables recording). `precise`: times from the exact
  /// clock (Clock::now), else from the coarse one (engine::coarseNow).
  FlightRecorder(size_t capacity, bool precise);

  /// The clock for this recorder's times, and for the start of the operations it records.
  std::chrono::steady_clock::time_point now() const;
  bool precise() const { return precise_; }

  /// Records the start (at `now`) of an operation; returns the entry to fill in (valid until the
  /// next begin), or nullptr when recording is off.
  FlightEntry* begin(std::chrono::steady_clock::time_point now);
  /// Ends the entry of the last begin() (no-op if already ended or nothing was begun).
  void end(chorusResult_t status);

  /// Every entry, oldest first, one line each.
  std::string format() const;
  size_t size() const { return filled_; }
  /// Writes `header` (lines starting with '#') and the entries, oldest first, to `file`; returns
  /// what to add to the failure's message: where it was written, or why it could not be.
  std::string writeFile(const std::string& file, const std::string& header) const;

 private:
  std::vector<FlightEntry> ring_;
  size_t next_ = 0;    // slot of the next begin()
  size_t filled_ = 0;  // entries in use
  FlightEntry* open_ = nullptr;
  bool precise_;
};

/// One line describing an entry; `toWall` converts its steady start to wall-clock time.
std::string formatFlightEntry(const FlightEntry& e, std::chrono::system_clock::duration toWall);

}  // namespace chorus
