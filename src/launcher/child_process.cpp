#include "launcher/child_process.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string_view>

#include "base/config.hpp"
#include "launcher/job.hpp"

namespace chorus::launcher {
namespace {

// Everything the child needs between fork and exec, prepared by the parent.
struct ExecArgs {
  const ChildSpec* spec;
  int stdoutFd;
  int stderrFd;
  int execStatusFd;  // close-on-exec pipe: receives errno when exec fails
  const sigset_t* signalMask;
  pid_t parent;
};

// Runs in the forked child of a possibly multi-threaded process: only async-signal-safe calls.
[[noreturn]] void execChild(const ExecArgs& a) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != a.parent) ::_exit(128 + SIGTERM);
  if (a.spec->stdinFd != STDIN_FILENO) ::dup2(a.spec->stdinFd, STDIN_FILENO);
  ::dup2(a.stdoutFd, STDOUT_FILENO);
  ::dup2(a.stderrFd, STDERR_FILENO);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigemptyset(&dfl.sa_mask);
  for (int sig : kSignalsResetInChild) ::sigaction(sig, &dfl, nullptr);
  ::sigprocmask(SIG_SETMASK, a.signalMask, nullptr);
  if (a.spec->fileLimit != nullptr) ::setrlimit(RLIMIT_NOFILE, a.spec->fileLimit);
  int error = a.spec->program->error;
  if (error == 0) {
    ::execve(a.spec->program->path.c_str(), a.spec->argv, a.spec->envp);
    error = errno;
  }
  [[maybe_unused]] ssize_t n = ::write(a.execStatusFd, &error, sizeof error);
  ::_exit(kExitCannotExecute);
}

}  // namespace

void closeFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

ResolvedProgram resolveProgram(const std::string& name) {
  if (name.empty()) return {name, ENOENT};
  if (name.find('/') != std::string::npos) return {name, 0};
  const std::optional<std::string> pathEnv = launchVariable("PATH");
  std::string_view searchPath = pathEnv ? std::string_view(*pathEnv) : "/usr/local/bin:/usr/bin:/bin";
  int error = ENOENT;
  while (true) {
    size_t colon = searchPath.find(':');
    std::string_view dir = searchPath.substr(0, colon);
    std::string candidate = (dir.empty() ? std::string(".") : std::string(dir)) + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      if (::access(candidate.c_str(), X_OK) == 0) return {candidate, 0};
      error = EACCES;
    }
    if (colon == std::string_view::npos) break;
    searchPath.remove_prefix(colon + 1);
  }
  return {name, error};
}

StartedChild startChild(const ChildSpec& spec) {
  StartedChild result;
  int outPipe[2] = {-1, -1}, errPipe[2] = {-1, -1}, execPipe[2] = {-1, -1};
  auto closeAll = [&] {
    for (int* p : {outPipe, errPipe, execPipe}) {
      closeFd(p[0]);
      closeFd(p[1]);
    }
  };
  if (::pipe2(outPipe, O_CLOEXEC) != 0 || ::pipe2(errPipe, O_CLOEXEC) != 0 ||
      ::pipe2(execPipe, O_CLOEXEC) != 0) {
    result.error = errno;
    result.failedStep = "creating pipes";
    closeAll();
    return result;
  }

  // Block every signal across fork so that no handler of chorusrun runs in the child before exec.
  sigset_t all, previous;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  ExecArgs args{&spec, outPipe[1], errPipe[1], execPipe[1], &previous, ::getpid()};
  pid_t pid = ::fork();
  if (pid == 0) execChild(args);
  int forkError = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);

  closeFd(outPipe[1]);
  closeFd(errPipe[1]);
  closeFd(execPipe[1]);
  if (pid < 0) {
    result.error = forkError;
    result.failedStep = "fork";
    closeAll();
    return result;
  }
  // The child does this too; doing it here as well means the group exists before it is signalled.
  ::setpgid(pid, pid);
  result.pid = pid;
  std::swap(result.stdoutFd, outPipe[0]);
  std::swap(result.stderrFd, errPipe[0]);
  for (int fd : {result.stdoutFd, result.stderrFd}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);

  // End of file: the exec succeeded and closed the pipe. An int: exec failed with that errno.
  int childError = 0;
  ssize_t n;
  do {
    n = ::read(execPipe[0], &childError, sizeof childError);
  } while (n < 0 && errno == EINTR);
  closeAll();
  if (n == static_cast<ssize_t>(sizeof childError)) {
    result.error = childError;
    result.failedStep = "exec";
  }
  return result;
}

}  // namespace chorus::launcher
