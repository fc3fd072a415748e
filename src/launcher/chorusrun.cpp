// chorusrun: starts N local ranks of a program, serves their TCP store, relays their output and
// stops the whole job when one rank fails. See `chorusrun --help`.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "base/log.hpp"
#include "bootstrap/auth.hpp"
#include "chorus/store.hpp"
#include "launcher/job.hpp"

namespace {

constexpr int kExitUsage = 2;
constexpr int kMaxRanks = 1024;
constexpr double kMaxSeconds = 1e9;

constexpr const char* kFooter =
    R"(Each rank runs `program args...` in a process group of its own, with chorusrun's environment plus
  CHORUS_RANK, CHORUS_LOCAL_RANK       the rank, 0..N-1
  CHORUS_WORLD_SIZE, CHORUS_LOCAL_SIZE N
  CHORUS_STORE_ADDR                    127.0.0.1:<port> of the TCP store chorusrun serves for the job
  CHORUS_SECRET                        the job secret that store requires (kept from chorusrun's own
                                       environment if set there, else 256 random bits; none in a
                                       build without OpenSSL)
Everything after the program name is passed to the program; `--` may end chorusrun's options.

Output: each line a rank writes to stdout or stderr is written to chorusrun's stdout or stderr, whole
lines only (lines of different ranks never mix), prefixed with "[<rank>] " unless --no-prefix is
given. A last line without a newline is completed; lines over 64 KiB are split. Processes that the
ranks leave behind get one more second to finish their output after the last rank exits.
Rank 0 reads chorusrun's standard input unless that is a terminal; the other ranks read /dev/null.

Stopping: when a rank exits with a non-zero status or is killed by a signal, chorusrun says so on
stderr, sends SIGTERM to the process groups of all ranks and SIGKILL --grace-seconds later.
The same happens when --timeout passes. SIGINT, SIGTERM and SIGHUP sent to chorusrun are forwarded
to the ranks' process groups, followed by SIGKILL after the grace period; a second such signal
kills the ranks at once.

Exit status:
  0      every rank exited with status 0
  S      the exit status of the first rank that failed (128+N if it was killed by signal N)
  124    the job exceeded --timeout
  127    the program could not be executed
  128+N  chorusrun received signal N
  1      chorusrun itself failed (store, pipes, fork)
  2      bad command line)";

// CLI11's usage line cannot show a program with its arguments after the options.
class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App* /*app*/, std::string name) const override {
    return "Usage: " + name + " [OPTIONS] -n N [--] program [args...]\n";
  }
};

// Makes sure descriptors 0, 1 and 2 are open, so that pipes never take their numbers.
void ensureStandardDescriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) ::open("/dev/null", O_RDWR);
  }
}

int usageError(const std::string& text) {
  std::fprintf(stderr, "chorusrun: %s\nRun with --help for more information.\n", text.c_str());
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  ensureStandardDescriptors();

  CLI::App app{"Starts N local ranks of a program as one Chorus job and serves the job's TCP store.",
               "chorusrun"};
  app.formatter(std::make_shared<UsageFormatter>());
  app.footer(kFooter);
  app.prefix_command();  // the first positional argument and everything after it are the program's

  chorus::launcher::JobOptions options;
  bool noPrefix = false;
  app.add_option("-n,--np", options.worldSize,
                 "Number of ranks to start (1.." + std::to_string(kMaxRanks) + ")")
      ->required()
      ->type_name("N")
      ->check(CLI::Range(1, kMaxRanks).description(""));
  app.add_flag("--no-prefix", noPrefix, "Do not prefix output lines with \"[<rank>] \"");
  app.add_option("--grace-seconds", options.graceSeconds,
                 "Seconds between SIGTERM (or a forwarded signal) and SIGKILL when stopping the ranks")
      ->capture_default_str()
      ->type_name("SECONDS")
      ->check(CLI::Range(0.0, kMaxSeconds).description(""));
  app.add_option("--timeout", options.timeoutSeconds,
                 "Stop the job and exit with status 124 after this many seconds (0: no limit)")
      ->capture_default_str()
      ->type_name("SECONDS")
      ->check(CLI::Range(0.0, kMaxSeconds).description(""));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }

  options.command = app.remaining();
  if (!options.command.empty() && options.command.front() == "--") {
    options.command.erase(options.command.begin());
  } else if (!options.command.empty() && options.command.front().size() > 1 &&
             options.command.front()[0] == '-') {
    return usageError("unknown option '" + options.command.front() + "'");
  }
  if (options.command.empty()) return usageError("no program given");
  options.prefixOutput = !noPrefix;

  // The store server's thread may write to clients that went away; that must not kill chorusrun.
  ::signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<chorus::TcpStoreServer> store;
  try {
    // The job secret: the caller's CHORUS_SECRET if set (to share it with ranks started elsewhere),
    // else a new random one. Only processes that prove it may use the store. A build without
    // OpenSSL cannot prove one: its store takes any local process (said at INFO).
    options.secret = chorus::secretFromEnvironment();
    if (options.secret.empty()) {
      if (chorus::auth::available()) {
        options.secret = chorus::generateSecret();
      } else {
        // Said at INFO only: the ranks' own output on stderr stays theirs alone.
        chorus::logInfo(chorus::Subsys::Bootstrap,
                        "chorusrun: this build has no authentication (built without OpenSSL): the job's TCP "
                        "store on 127.0.0.1 takes any local process");
      }
    }
    store = std::make_unique<chorus::TcpStoreServer>("127.0.0.1", 0, options.secret);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorusrun: cannot start the job's TCP store: %s\n", e.what());
    return 1;
  }
  options.storeAddress = "127.0.0.1:" + std::to_string(store->port());

  return chorus::launcher::runJob(options);
}
