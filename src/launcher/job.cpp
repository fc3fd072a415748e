#include "launcher/job.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/child_process.hpp"
#include "launcher/output_relay.hpp"
#include "transports/shm/shm_names.hpp"

extern char** environ;

namespace chorus::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// Signals chorusrun catches (or, SIGPIPE, ignores) while the job runs, and those it forwards.
constexpr auto& kCaughtSignals = kSignalsResetInChild;
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr size_t kNumCaught = std::size(kCaughtSignals);

// After the last rank exits, how long to keep reading pipes still held open by its descendants.
constexpr auto kDrainAfterExit = std::chrono::seconds(1);
constexpr size_t kReadChunk = size_t{64} << 10;

// Write end of the self-pipe that the signal handler reports signal numbers through.
std::atomic<int> gSignalPipeWrite{-1};

void onSignal(int signo) {
  int savedErrno = errno;
  unsigned char byte = static_cast<unsigned char>(signo);
  [[maybe_unused]] ssize_t n = ::write(gSignalPipeWrite.load(std::memory_order_relaxed), &byte, 1);
  errno = savedErrno;
}

void message(const std::string& text) { writeAll(STDERR_FILENO, "chorusrun: " + text + "\n"); }

std::string errnoText(int err) { return std::strerror(err); }

std::string signalText(int signo) {
  const char* name = ::strsignal(signo);
  std::string text = "signal " + std::to_string(signo);
  if (name != nullptr) text += " (" + std::string(name) + ")";
  return text;
}

std::string secondsText(double seconds) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", seconds);
  return std::string(buf) + (seconds == 1 ? " second" : " seconds");
}

struct Stream {
  int fd = -1;
  LineRelay relay;
};

struct Rank {
  Rank(int r, const std::string& prefix)
      : rank(r),
        streams{Stream{-1, LineRelay(STDOUT_FILENO, prefix)}, Stream{-1, LineRelay(STDERR_FILENO, prefix)}} {}

  int rank;
  pid_t pid = -1;
  bool running = false;
  Stream streams[2];  // the child's stdout and stderr
};

class Job {
 public:
  explicit Job(const JobOptions& options) : opt_(options) {}
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  int run();

 private:
  bool setUp();
  void launch();
  StartedChild spawn(Rank& rank, const ResolvedProgram& program, char* const* argv);
  std::vector<std::string> rankEnvironment(int rank) const;

  void superviseUntilDone();
  void reap();
  void onRankExit(Rank& rank, int status);
  void handleSignalPipe();
  void readStream(Stream& stream);
  void drainAvailable(Rank& rank);
  void closeStream(Stream& stream);

  void startStop(int signo);
  void signalAll(int signo);
  void killAll();
  bool anyRunning() const;
  bool anyStreamOpen() const;
  void fail(int status) {
    if (!result_) result_ = status;
  }

  const JobOptions& opt_;
  std::vector<Rank> ranks_;
  int signalRead_ = -1;
  int signalWrite_ = -1;
  int devNull_ = -1;
  struct sigaction savedActions_[kNumCaught] = {};
  bool handlersInstalled_ = false;
  struct rlimit childFileLimit_ {};

  std::optional<int> result_;  // first failure's exit status
  bool stopping_ = false;
  bool killed_ = false;
  bool descendantsLeft_ = false;  // unreaped children (ranks or orphans adopted from them) remain
  std::optional<Clock::time_point> timeoutDeadline_;
  Clock::time_point killDeadline_{};
};

Job::~Job() {
  for (Rank& r : ranks_)
    for (Stream& s : r.streams) closeStream(s);
  if (handlersInstalled_) {
    for (size_t i = 0; i < kNumCaught; ++i) ::sigaction(kCaughtSignals[i], &savedActions_[i], nullptr);
  }
  gSignalPipeWrite = -1;
  closeFd(signalRead_);
  closeFd(signalWrite_);
  closeFd(devNull_);
}

bool Job::setUp() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    message("cannot create a pipe: " + errnoText(errno));
    return false;
  }
  signalRead_ = fds[0];
  signalWrite_ = fds[1];
  gSignalPipeWrite = signalWrite_;

  devNull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devNull_ < 0) {
    message("cannot open /dev/null: " + errnoText(errno));
    return false;
  }

  // Each rank needs two pipes (three while starting); raise the soft limit on open files if needed
  // and give the children the original one back.
  ::getrlimit(RLIMIT_NOFILE, &childFileLimit_);
  rlim_t needed = static_cast<rlim_t>(opt_.worldSize) * 2 + 64;
  if (childFileLimit_.rlim_cur != RLIM_INFINITY && childFileLimit_.rlim_cur < needed) {
    struct rlimit raised = childFileLimit_;
    raised.rlim_cur = std::min(needed, childFileLimit_.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &raised);
  }

  for (size_t i = 0; i < kNumCaught; ++i) {
    struct sigaction sa {};
    sa.sa_handler = kCaughtSignals[i] == SIGPIPE ? SIG_IGN : onSignal;
    ::sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (kCaughtSignals[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    ::sigaction(kCaughtSignals[i], &sa, &savedActions_[i]);
  }
  handlersInstalled_ = true;

  // Orphaned descendants of the ranks become children of chorusrun, so that a stopped job's
  // processes are reaped (and waited for) here rather than by init.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  return true;
}

std::vector<std::string> Job::rankEnvironment(int rank) const {
  static constexpr std::string_view kOwnVariables[] = {"CHORUS_RANK",       "CHORUS_WORLD_SIZE",
                                                       "CHORUS_LOCAL_RANK", "CHORUS_LOCAL_SIZE",
                                                       "CHORUS_STORE_ADDR", "CHORUS_SECRET"};
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::string_view key = entry.substr(0, entry.find('='));
    if (std::find(std::begin(kOwnVariables), std::end(kOwnVariables), key) != std::end(kOwnVariables))
      continue;
    env.emplace_back(entry);
  }
  std::string size = std::to_string(opt_.worldSize);
  env.push_back("CHORUS_RANK=" + std::to_string(rank));
  env.push_back("CHORUS_WORLD_SIZE=" + size);
  env.push_back("CHORUS_LOCAL_RANK=" + std::to_string(rank));
  env.push_back("CHORUS_LOCAL_SIZE=" + size);
  if (!opt_.storeAddress.empty()) env.push_back("CHORUS_STORE_ADDR=" + opt_.storeAddress);
  if (!opt_.secret.empty()) env.push_back("CHORUS_SECRET=" + opt_.secret);
  return env;
}

StartedChild Job::spawn(Rank& rank, const ResolvedProgram& program, char* const* argv) {
  std::vector<std::string> envStrings = rankEnvironment(rank.rank);
  std::vector<char*> envp;
  for (std::string& e : envStrings) envp.push_back(e.data());
  envp.push_back(nullptr);

  ChildSpec spec;
  spec.program = &program;
  spec.argv = argv;
  spec.envp = envp.data();
  // A terminal stays with chorusrun: a rank in its own process group reading it would be stopped.
  spec.stdinFd = (rank.rank == 0 && !::isatty(STDIN_FILENO)) ? STDIN_FILENO : devNull_;
  spec.fileLimit = &childFileLimit_;
  StartedChild child = startChild(spec);
  if (child.pid > 0) {
    rank.pid = child.pid;
    rank.running = true;
    rank.streams[0].fd = child.stdoutFd;
    rank.streams[1].fd = child.stderrFd;
  }
  return child;
}

void Job::launch() {
  std::vector<std::string> command = opt_.command;
  std::vector<char*> argv;
  for (std::string& a : command) argv.push_back(a.data());
  argv.push_back(nullptr);
  ResolvedProgram program = resolveProgram(command.front());

  for (Rank& rank : ranks_) {
    handleSignalPipe();
    if (stopping_) return;
    StartedChild child = spawn(rank, program, argv.data());
    if (child.error == 0) continue;
    bool othersRunning =
        std::any_of(ranks_.begin(), ranks_.end(), [&](const Rank& r) { return r.running && &r != &rank; });
    std::string what = rank.pid > 0
                           ? "rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) +
                                 "): cannot execute '" + opt_.command.front() + "'"
                           : "cannot start rank " + std::to_string(rank.rank) + " (" + child.failedStep + ")";
    message(what + ": " + errnoText(child.error) + (othersRunning ? "; stopping the other ranks" : ""));
    fail(rank.pid > 0 ? kExitCannotExecute : 1);
    startStop(SIGTERM);
    return;
  }
}

bool Job::anyRunning() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
}

bool Job::anyStreamOpen() const {
  return std::any_of(ranks_.begin(), ranks_.end(),
                     [](const Rank& r) { return r.streams[0].fd >= 0 || r.streams[1].fd >= 0; });
}

void Job::signalAll(int signo) {
  // Every rank that was started, including those that exited: their descendants may live on in the
  // rank's process group.
  for (const Rank& r : ranks_) {
    if (r.pid <= 0) continue;
    if (::kill(-r.pid, signo) != 0 && r.running) ::kill(r.pid, signo);
  }
}

void Job::startStop(int signo) {
  if (!stopping_) {
    stopping_ = true;
    killDeadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(opt_.graceSeconds));
  }
  signalAll(signo);
}

void Job::killAll() {
  killed_ = true;
  signalAll(SIGKILL);
}

void Job::closeStream(Stream& stream) {
  if (stream.fd < 0) return;
  stream.relay.finish();
  closeFd(stream.fd);
}

void Job::readStream(Stream& stream) {
  char buf[kReadChunk];
  ssize_t n = ::read(stream.fd, buf, sizeof buf);
  if (n > 0) {
    stream.relay.feed(std::string_view(buf, static_cast<size_t>(n)));
  } else if (n == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
    closeStream(stream);
  }
}

void Job::drainAvailable(Rank& rank) {
  // What the rank wrote before exiting goes out before any message about its exit. Bounded, since
  // a descendant may keep writing.
  for (Stream& s : rank.streams) {
    for (int i = 0; i < 64 && s.fd >= 0; ++i) {
      pollfd p{s.fd, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
      readStream(s);
    }
  }
}

void Job::reap() {
  // chorusrun is a child subreaper: besides the ranks, this reaps their orphaned descendants.
  while (true) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) {
      descendantsLeft_ = pid == 0;
      break;
    }
    auto it =
        std::find_if(ranks_.begin(), ranks_.end(), [&](const Rank& r) { return r.running && r.pid == pid; });
    if (it == ranks_.end()) continue;
    it->running = false;
    drainAvailable(*it);
    onRankExit(*it, status);
  }
}

void Job::onRankExit(Rank& rank, int status) {
  int code = 0;
  std::string how;
  if (WIFEXITED(status)) {
    code = WEXITSTATUS(status);
    how = "exited with status " + std::to_string(code);
  } else if (WIFSIGNALED(status)) {
    code = 128 + WTERMSIG(status);
    how = "killed by " + signalText(WTERMSIG(status));
    if (WCOREDUMP(status)) how += ", core dumped";
  }
  if (code == 0 || stopping_) return;
  fail(code);
  message("rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) + ") " + how +
          (anyRunning() ? "; stopping the other ranks" : ""));
  startStop(SIGTERM);
}

void Job::handleSignalPipe() {
  unsigned char buf[64];
  ssize_t n;
  while ((n = ::read(signalRead_, buf, sizeof buf)) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      int signo = buf[i];
      if (std::find(std::begin(kForwardedSignals), std::end(kForwardedSignals), signo) ==
          std::end(kForwardedSignals)) {
        continue;  // SIGCHLD: the loop reaps on every wake-up
      }
      if (!stopping_) {
        fail(128 + signo);
        message("received " + signalText(signo) + "; forwarding it to the ranks");
        startStop(signo);
      } else if (!killed_) {
        message("received " + signalText(signo) + " while stopping; killing the ranks");
        killAll();
      }
    }
  }
}

void Job::superviseUntilDone() {
  std::optional<Clock::time_point> drainDeadline;
  std::vector<pollfd> fds;
  std::vector<Stream*> fdStreams;
  while (true) {
    reap();
    Clock::time_point now = Clock::now();
    if (!stopping_ && timeoutDeadline_ && now >= *timeoutDeadline_) {
      fail(kExitTimeout);
      message("the job exceeded its timeout of " + secondsText(opt_.timeoutSeconds) + "; stopping the ranks");
      startStop(SIGTERM);
    }
    if (stopping_ && !killed_ && now >= killDeadline_) {
      if (anyRunning()) {
        message("ranks still running " + secondsText(opt_.graceSeconds) +
                " after the stop signal; killing them");
      }
      killAll();
    }
    if (!anyRunning()) {
      // Left behind by the ranks: pipes still open, and when stopping, any descendant at all. Those
      // are waited for until SIGKILL has been sent, then for kDrainAfterExit.
      if (!anyStreamOpen() && !(stopping_ && descendantsLeft_)) break;
      if (!stopping_ || killed_) {
        if (!drainDeadline) drainDeadline = now + kDrainAfterExit;
        if (now >= *drainDeadline) break;
      }
    }

    std::optional<Clock::time_point> wake = drainDeadline;
    auto earliest = [&](Clock::time_point t) { wake = wake ? std::min(*wake, t) : t; };
    if (!stopping_ && timeoutDeadline_) earliest(*timeoutDeadline_);
    if (stopping_ && !killed_) earliest(killDeadline_);
    int timeoutMs = -1;
    if (wake) {
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(*wake - now).count();
      timeoutMs = static_cast<int>(std::clamp<decltype(ms)>(ms, 0, 60'000));
    }

    fds.clear();
    fdStreams.clear();
    fds.push_back({signalRead_, POLLIN, 0});
    fdStreams.push_back(nullptr);
    for (Rank& r : ranks_) {
      for (Stream& s : r.streams) {
        if (s.fd < 0) continue;
        fds.push_back({s.fd, POLLIN, 0});
        fdStreams.push_back(&s);
      }
    }
    int ready = ::poll(fds.data(), fds.size(), timeoutMs);
    if (ready < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      message("poll failed: " + errnoText(errno) + "; killing the ranks");
      fail(1);
      stopping_ = true;
      killAll();
      // Without poll, wait for the ranks directly; output left in the pipes is still relayed below.
      for (Rank& r : ranks_) {
        if (r.running) ::waitpid(r.pid, nullptr, 0);
        r.running = false;
      }
      break;
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (fdStreams[i] == nullptr) {
        handleSignalPipe();
      } else {
        readStream(*fdStreams[i]);
      }
    }
  }
  for (Rank& r : ranks_) {
    drainAvailable(r);
    for (Stream& s : r.streams) closeStream(s);
  }
}

int Job::run() {
  if (opt_.command.empty()) {
    message("no program to run");
    return 1;
  }
  if (!setUp()) return 1;
  ranks_.reserve(static_cast<size_t>(opt_.worldSize));
  for (int r = 0; r < opt_.worldSize; ++r) {
    ranks_.emplace_back(r, opt_.prefixOutput ? "[" + std::to_string(r) + "] " : std::string());
  }
  if (opt_.timeoutSeconds > 0) {
    timeoutDeadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(opt_.timeoutSeconds));
  }
  launch();
  superviseUntilDone();
  // Ranks stopped (or killed) while creating a communicator may have left shared-memory segments.
  if (int removed = transport::removeOrphanSegments(); removed > 0) {
    message("removed " + std::to_string(removed) +
            " shared-memory segment(s) that exited ranks left in /dev/shm");
  }
  return result_.value_or(0);
}

}  // namespace

int runJob(const JobOptions& options) {
  Job job(options);
  return job.run();
}

}  // namespace chorus::launcher
