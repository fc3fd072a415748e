// Starting one rank's process: PATH lookup, pipes, fork and exec.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <string>

namespace chorus::launcher {

/// Signals whose disposition chorusrun changes; a child gets their defaults back before exec.
inline constexpr int kSignalsResetInChild[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE};

/// What execvp's PATH search would run, found before fork so that the child only makes
/// async-signal-safe calls. `error` is the errno to report when nothing can be run.
struct ResolvedProgram {
  std::string path;
  int error = 0;
};

ResolvedProgram resolveProgram(const std::string& name);

/// Closes `fd` when it is open (>= 0) and sets it to -1.
void closeFd(int& fd);

struct ChildSpec {
  const ResolvedProgram* program = nullptr;
  char* const* argv = nullptr;               // null-terminated
  char* const* envp = nullptr;               // null-terminated
  int stdinFd = 0;                           // becomes the child's standard input
  const struct rlimit* fileLimit = nullptr;  // RLIMIT_NOFILE for the child
};

struct StartedChild {
  pid_t pid = -1;     // > 0 once forked, also when exec then failed (the child exits 127)
  int stdoutFd = -1;  // non-blocking, close-on-exec read ends of the child's stdout and stderr
  int stderrFd = -1;
  int error = 0;                // errno of the step that failed; 0 when the program runs
  const char* failedStep = "";  // "exec", "creating pipes" or "fork"
};

/// Forks a child that runs in a process group of its own with stdout and stderr on new pipes, and
/// returns once it has exec'd the program (or failed to). If chorusrun dies first, the child gets
/// SIGTERM.
StartedChild startChild(const ChildSpec& spec);

}  // namespace chorus::launcher
