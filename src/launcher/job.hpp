// Starting and supervising the local ranks of a chorusrun job.
#pragma once

#include <string>
#include <vector>

namespace chorus::launcher {

struct JobOptions {
  /// Number of ranks (CHORUS_WORLD_SIZE).
  int worldSize = 1;
  /// Program and its arguments; the program is looked up in PATH unless it contains a '/'.
  std::vector<std::string> command;
  /// host:port of the job's store, exported as CHORUS_STORE_ADDR (not exported when empty).
  std::string storeAddress;
  std::string secret;  // CHORUS_SECRET for every rank (empty: none)
  /// Prefix each relayed line with "[<rank>] ".
  bool prefixOutput = true;
  /// Seconds between the first stop signal and SIGKILL.
  double graceSeconds = 3;
  /// Seconds the whole job may run; 0 means no limit.
  double timeoutSeconds = 0;
};

/// Exit statuses of runJob besides a rank's own status.
inline constexpr int kExitTimeout = 124;
inline constexpr int kExitCannotExecute = 127;

/// Runs the job to completion and returns chorusrun's exit status: 0 when every rank succeeded,
/// otherwise the status of the first failure (128 + signal for a rank killed by a signal or for a
/// signal received by chorusrun itself, kExitTimeout when the job timed out).
/// Installs handlers for SIGCHLD, SIGINT, SIGTERM and SIGHUP and ignores SIGPIPE for its duration.
int runJob(const JobOptions& options);

}  // namespace chorus::launcher
