// Fault tests: a rank killed with SIGKILL, a rank that never arrives, abort from another thread,
// a peer's failure reaching the others, and shared memory too small. Each test is named after its
// fault, and each checks that no /dev/shm/chorus-* file it created is left behind.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/unique_id.hpp"
#include "chorus/chorus.h"
#include "chorus/chorus.hpp"
#include "spawn.hpp"

#ifndef FAULT_RANK_PROGRAM
#error "FAULT_RANK_PROGRAM must name the fault_rank_program binary"
#endif
#ifndef CHORUSRUN
#error "CHORUSRUN must name the chorusrun binary"
#endif

using namespace chorus;
using namespace chorus::spawntest;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

long long msBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

bool contains(const std::string& text, const std::string& word) {
  return text.find(word) != std::string::npos;
}

// True if `text` names rank `r`: "rank 2", "rank(s) 2", "ranks 0, 2", "rank: 2" ...
bool namesRank(const std::string& text, int r) {
  const size_t n = text.size();
  for (size_t pos = text.find("rank"); pos != std::string::npos; pos = text.find("rank", pos + 1)) {
    size_t i = pos + 4;
    if (text.compare(i, 3, "(s)") == 0) {
      i += 3;
    } else if (i < n && text[i] == 's') {
      ++i;
    }
    if (i < n && text[i] == ':') ++i;
    // A list of numbers separated by ", ".
    while (i < n && text[i] == ' ') {
      const size_t start = ++i;
      while (i < n && text[i] >= '0' && text[i] <= '9' && i - start < 9) ++i;
      if (i == start) break;
      if (std::stoi(text.substr(start, i - start)) == r && (i == n || text[i] < '0' || text[i] > '9'))
        return true;
      if (i < n && text[i] == ',') {
        ++i;
      } else {
        break;
      }
    }
  }
  return false;
}

TEST(NamesRank, RecognisesTheLibrarysPhrasings) {
  EXPECT_TRUE(namesRank("stopped: rank 1 (vm pid 12) died", 1));
  EXPECT_TRUE(namesRank("waiting for rank(s) 0, 2 to arrive", 2));
  EXPECT_TRUE(namesRank("waiting for rank(s) 2 to arrive", 2));
  EXPECT_FALSE(namesRank("rank 10 died", 1));
  EXPECT_FALSE(namesRank("rank 0: comm1 failed", 1));
  EXPECT_FALSE(namesRank("ranked 1", 1));
}

class Fault : public ::testing::Test {
 protected:
  void SetUp() override { shmBefore_ = chorusShmFiles(); }
  void TearDown() override {
    for (const auto& name : leakedShmFiles(shmBefore_))
      ADD_FAILURE() << "/dev/shm/" << name << " left behind";
  }
  std::set<std::string> shmBefore_;
};

// ---- Process faults ---------------------------------------------------------------------------------

// A 3-rank chorusrun job whose rank 0 attacks the job's store from a second thread all along (no
// secret, a wrong secret, a request in place of the handshake): every attack is refused, the ranks
// join and their checked allreduces are right, and the store logs the rejections.
TEST_F(Fault, ConnectionWithoutSecret_IsRejectedAndJobRunsOn) {
  TempDir dir("intruder-out");
  Env env = baseEnv();
  env.erase("CHORUS_SECRET");  // chorusrun makes one
  env["CHORUS_TIMEOUT"] = "60";
  std::vector<Process> job{
      spawn({CHORUSRUN, "-n", "3", FAULT_RANK_PROGRAM, "intruder", "0"}, env, dir.path(), "chorusrun")};
  ASSERT_TRUE(waitAll(job, 90s)) << "the job did not finish";
  const Process& p = job[0];
  ASSERT_TRUE(p.exitedWith(0)) << p.describe();
  const std::string out = p.out();
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(contains(out, "job_ok=1 rank=" + std::to_string(r))) << "rank " << r << ":\n" << out;
  }
  int attempts = -1, refused = -2;
  const size_t at = out.find("attempts=");
  ASSERT_NE(at, std::string::npos) << out;
  ASSERT_EQ(std::sscanf(out.c_str() + at, "attempts=%d refused=%d", &attempts, &refused), 2) << out;
  EXPECT_GE(attempts, 3);
  EXPECT_EQ(refused, attempts) << out;
  EXPECT_TRUE(contains(p.err(), "rejected a connection from 127.0.0.1")) << p.err();
}

// What a surviving fault_rank_program printed.
struct SurvivorReport {
  int result = -1;
  long long elapsedMs = -1;
  int async = -1;
  int again = -1;
  long long againMs = -1;
  std::string message;
};

std::optional<SurvivorReport> parseReport(const std::string& out) {
  SurvivorReport s;
  if (std::sscanf(out.c_str(), "result=%d elapsed_ms=%lld async=%d again=%d again_ms=%lld", &s.result,
                  &s.elapsedMs, &s.async, &s.again, &s.againMs) != 5) {
    return std::nullopt;
  }
  size_t m = out.find("message=");
  if (m == std::string::npos) return std::nullopt;
  s.message = out.substr(m + 8);
  return s;
}

// Starts 3 ranks of fault_rank_program `mode`, rank 1 the victim, meeting in the file store `store`;
// `extra` is added to each one's environment.
std::vector<Process> startFaultRanks(const std::string& mode, const TempDir& store, const TempDir& dir,
                                     const Env& extra) {
  std::vector<Process> procs;
  for (int r = 0; r < 3; ++r) {
    Env env = baseEnv();
    env["CHORUS_RANK"] = std::to_string(r);
    env["CHORUS_WORLD_SIZE"] = "3";
    env["CHORUS_STORE_FILE"] = store.path();
    for (const auto& [k, v] : extra) env[k] = v;
    procs.push_back(spawn({FAULT_RANK_PROGRAM, mode, "1"}, env, dir.path(), "rank" + std::to_string(r)));
  }
  return procs;
}

// Starts 3 ranks of fault_rank_program `mode` with rank 1 as the victim (file store, CHORUS_TIMEOUT
// `timeoutSeconds`), waits for the survivors first (the victim stays a zombie until then, so its pid
// cannot be reused while they watch it) and returns all three, finished.
std::vector<Process> runFaultJob(const std::string& mode, const std::string& timeoutSeconds,
                                 const TempDir& dir) {
  TempDir store("fault-store");
  std::vector<Process> procs = startFaultRanks(mode, store, dir, {{"CHORUS_TIMEOUT", timeoutSeconds}});
  std::vector<Process> order{procs[0], procs[2], procs[1]};
  EXPECT_TRUE(waitAll(order, 60s)) << "a rank was still running after 60 s";
  return {order[0], order[2], order[1]};
}

// How long the destroy that `out` reports took ("<key>=<ms>"), or -1 if it reports none.
long long destroyMs(const std::string& out, const std::string& key = "destroy_ms") {
  const size_t at = out.find(key + "=");
  return at == std::string::npos ? -1 : std::atoll(out.c_str() + at + key.size() + 1);
}

// A destroy is local: it returns at once, whatever state the peers are in (dead, stopped, gone).
void expectPromptDestroy(const std::string& out, const std::string& key = "destroy_ms") {
  const long long ms = destroyMs(out, key);
  EXPECT_GE(ms, 0) << "no " << key << " reported:\n" << out;
  EXPECT_LT(ms, 1000) << key << ": the destroy waited:\n" << out;
  if (key == "destroy_ms") {
    EXPECT_TRUE(contains(out, "destroy=0")) << out;
  }
}

// The reports of ranks 0 and 2 of a finished fault job whose victim is rank 1 (each checked to
// have exited 0 with a report).
std::vector<SurvivorReport> survivorReports(const std::vector<Process>& procs) {
  std::vector<SurvivorReport> reports;
  for (int r : {0, 2}) {
    const Process& p = procs[static_cast<size_t>(r)];
    EXPECT_TRUE(p.exitedWith(0)) << p.describe();
    auto rep = parseReport(p.out());
    EXPECT_TRUE(rep.has_value()) << p.describe();
    if (rep) reports.push_back(*rep);
  }
  return reports;
}

// Survivor checks shared by the SIGKILL tests: and each survivor's destroy returned at once.
void expectSurvivorsNameDeadRank(const std::vector<Process>& procs, long long boundMs) {
  EXPECT_TRUE(procs[1].killedBy(SIGKILL)) << "victim: " << procs[1].describe();
  for (int r : {0, 2}) {
    const Process& p = procs[static_cast<size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(p.exitedWith(0)) << p.describe();
    auto rep = parseReport(p.out());
    ASSERT_TRUE(rep.has_value()) << p.describe();
    EXPECT_EQ(rep->result, chorusRemoteError) << rep->message;
    EXPECT_LT(rep->elapsedMs, boundMs) << "the failure took too long to surface";
    EXPECT_TRUE(namesRank(rep->message, 1)) << "message does not name rank 1: " << rep->message;
    EXPECT_NE(rep->async, chorusSuccess) << "chorusCommGetAsyncError still reports success";
    EXPECT_NE(rep->again, chorusSuccess) << "a later call on the broken communicator succeeded";
    EXPECT_LT(rep->againMs, 1000) << "a later call on the broken communicator did not fail fast";
    expectPromptDestroy(p.out());
  }
}

// Rank 1 dies (SIGKILL) after init; ranks 0 and 2 get chorusRemoteError naming rank 1 well within
// CHORUS_TIMEOUT (30 s): death is detected, not waited out.
TEST_F(Fault, KillDashNine_SurvivorsNameDeadRank) {
  TempDir dir("fault-out");
  auto procs = runFaultJob("after-init", "30", dir);
  expectSurvivorsNameDeadRank(procs, 5000);
}

// Rank 1 dies; the survivors get the error, then form a 2-rank communicator without it
// (chorusCommShrink through the job's store) and an allreduce on it gives the right sum.
TEST_F(Fault, KillDashNine_SurvivorsShrinkAndContinue) {
  TempDir dir("fault-out");
  auto procs = runFaultJob("shrink", "30", dir);
  expectSurvivorsNameDeadRank(procs, 5000);
  for (int r : {0, 2}) {
    const Process& p = procs[static_cast<size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r));
    const std::string out = p.out();
    const size_t at = out.find("shrink=");
    ASSERT_NE(at, std::string::npos) << p.describe();
    int code = -1, newRank = -1, newSize = -1;
    float sum = 0;
    ASSERT_EQ(
        std::sscanf(out.c_str() + at, "shrink=%d rank=%d size=%d sum=%g", &code, &newRank, &newSize, &sum), 4)
        << out;
    EXPECT_EQ(code, chorusSuccess) << out;
    EXPECT_EQ(newSize, 2);
    EXPECT_EQ(newRank, r == 0 ? 0 : 1);
    EXPECT_EQ(sum, 4.0f) << "ranks 0 and 2 contribute 1 and 3";
    expectPromptDestroy(out, "destroy_shrunk_ms");
  }
}

// Thread ranks: rank 2 aborts; ranks 0 and 1 see the failure, shrink without rank 2, and go on;
// misuse of shrink is an error, not a hang.
TEST_F(Fault, Abort_SurvivorsShrinkAndContinue) {
  Config config;
  config.timeout = 20s;
  auto comms = Communicator::createLocal(3, config);
  comms[2].abort();
  std::vector<std::optional<Communicator>> smaller(2);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      float x = 1, y = 0;
      try {
        comms[r].allReduce(&x, &y, 1, DataType::Float32, ReduceOp::Sum);
      } catch (const Error&) {
        ++failures;
      }
      const int exclude[] = {2};
      smaller[r] = comms[r].shrink(exclude);
      std::vector<float> buf(100'000, static_cast<float>(r + 1));
      smaller[r]->allReduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
      if (buf.front() != 3.0f || buf.back() != 3.0f) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 2) << "both survivors' first call should fail, and the shrunk allreduce succeed";
  ASSERT_TRUE(smaller[0] && smaller[1]);
  EXPECT_EQ(smaller[0]->size(), 2);
  EXPECT_EQ(smaller[1]->rank(), 1);
  const int self[] = {0};
  EXPECT_THROW(comms[0].shrink(self), Error);
  const int bad[] = {7};
  EXPECT_THROW(comms[0].shrink(bad), Error);
}

// Rank 1 dies in the middle of a stream of 4 MiB allreduces and broadcasts (data in flight).
TEST_F(Fault, KillDashNineMidCollective_SurvivorsNameDeadRank) {
  TempDir dir("fault-out");
  auto procs = runFaultJob("mid-collective", "30", dir);
  expectSurvivorsNameDeadRank(procs, 150 + 5000);
}

// Rank 1 stops itself (SIGSTOP) in a stream of 4 MiB collectives: ranks 0 and 2 time out
// (CHORUS_TIMEOUT 2 s) naming rank 1, and destroy at once. Continued then, rank 1 finds its own
// deadline long past, but reports what happened meanwhile: the failure its peers published (it
// used to report its own timeout, waiting for ranks that had arrived and failed).
TEST_F(Fault, StoppedThenContinued_ReportsThePeersFailure) {
  TempDir dir("fault-out");
  TempDir store("fault-store");
  std::vector<Process> procs = startFaultRanks("stopped", store, dir, {{"CHORUS_TIMEOUT", "2"}});
  std::vector<Process> survivors{procs[0], procs[2]};
  const bool finished = waitAll(survivors, 30s);
  kill(procs[1].pid, SIGCONT);
  std::vector<Process> victim{procs[1]};
  ASSERT_TRUE(waitAll(victim, 30s)) << victim[0].describe();
  ASSERT_TRUE(finished) << "the survivors did not time out";
  for (const Process& p : survivors) {
    ASSERT_TRUE(p.exitedWith(0)) << p.describe();
    auto rep = parseReport(p.out());
    ASSERT_TRUE(rep.has_value()) << p.describe();
    EXPECT_EQ(rep->result, chorusTimeout) << rep->message;
    EXPECT_TRUE(namesRank(rep->message, 1)) << rep->message;
    expectPromptDestroy(p.out());
  }
  ASSERT_TRUE(victim[0].exitedWith(0)) << victim[0].describe();
  auto rep = parseReport(victim[0].out());
  ASSERT_TRUE(rep.has_value()) << victim[0].describe();
  EXPECT_NE(rep->result, chorusSuccess);
  EXPECT_TRUE(contains(rep->message, "stopped: rank 0 failed") ||
              contains(rep->message, "stopped: rank 2 failed"))
      << "rank 1 does not report its peers' failure: " << rep->message;
  const size_t where = rep->message.find("where each rank is");
  EXPECT_EQ(rep->message.find("where each rank is", where + 1), std::string::npos)
      << "the clause is repeated: " << rep->message;
  expectPromptDestroy(victim[0].out());
}

// Rank 1 dies before joining: the others' init fails within CHORUS_TIMEOUT (3 s) with a timeout,
// leaving nothing in /dev/shm.
TEST_F(Fault, KillDashNineBeforeInit_InitTimesOut) {
  TempDir dir("fault-out");
  auto procs = runFaultJob("before-init", "3", dir);
  EXPECT_TRUE(procs[1].killedBy(SIGKILL)) << "victim: " << procs[1].describe();
  const auto reports = survivorReports(procs);
  EXPECT_EQ(reports.size(), 2u);
  for (const SurvivorReport& rep : reports) {
    EXPECT_EQ(rep.result, chorusTimeout) << rep.message;
    EXPECT_GE(rep.elapsedMs, 2500);
    EXPECT_LT(rep.elapsedMs, 10000);
    EXPECT_TRUE(contains(rep.message, "timed out")) << rep.message;
  }
}

// chorus.h promises that a chorusTimeout message names the ranks: an init that times out waiting
// for a rank that never joined says which rank waited and which never came.
TEST_F(Fault, KillDashNineBeforeInit_MessageNamesMissingRank) {
  TempDir dir("fault-out");
  auto procs = runFaultJob("before-init", "3", dir);
  for (int r : {0, 2}) {
    auto rep = parseReport(procs[static_cast<size_t>(r)].out());
    ASSERT_TRUE(rep.has_value()) << procs[static_cast<size_t>(r)].describe();
    EXPECT_TRUE(namesRank(rep->message, 1)) << rep->message;
    EXPECT_TRUE(namesRank(rep->message, r)) << "message does not say which rank waited: " << rep->message;
  }
}

// ---- Shared-memory set-up faults: nothing is left in /dev/shm ---------------------------------------

// /dev/shm entries whose name says process `pid` created them.
std::vector<std::string> shmFilesOf(pid_t pid) {
  std::vector<std::string> found;
  const std::string tail = "-p" + std::to_string(pid);
  for (const auto& n : chorusShmFiles()) {
    if (n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0)
      found.push_back(n);
  }
  return found;
}

// Rank 1 of 3 is killed inside the creation of its segment, after reserving it (its name is in
// /dev/shm) and while the others wait for it: they stop at once (CHORUS_TIMEOUT is 30 s) naming
// rank 1 as dead, and its segment is gone: a survivor removed it.
TEST_F(Fault, KillDashNineInsideShmSetup_PeersNameItAndItsSegmentIsRemoved) {
  TempDir dir("fault-out");
  auto procs = runFaultJob("shm-setup", "30", dir);
  EXPECT_TRUE(procs[1].killedBy(SIGKILL)) << "victim: " << procs[1].describe();
  const auto reports = survivorReports(procs);
  EXPECT_EQ(reports.size(), 2u);
  for (const SurvivorReport& rep : reports) {
    EXPECT_EQ(rep.result, chorusRemoteError) << rep.message;
    EXPECT_LT(rep.elapsedMs, 500 + 3000) << "the death was waited out: " << rep.message;
    EXPECT_TRUE(namesRank(rep.message, 1)) << rep.message;
    EXPECT_TRUE(contains(rep.message, "died")) << rep.message;
  }
  EXPECT_TRUE(shmFilesOf(procs[1].pid).empty()) << "rank 1's segment is still in /dev/shm";
}

// A segment left by a process that has exited (a whole job killed during set-up, with no survivor
// and no chorusrun) is removed by the next communicator created on the machine; one whose creator
// still runs is left alone.
TEST_F(Fault, OrphanSegment_RemovedByTheNextCommunicator) {
  pid_t gone = fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  struct stat ns {};
  ASSERT_EQ(stat("/proc/self/ns/pid", &ns), 0);
  const std::string suffix = "-0-n" + std::to_string(ns.st_ino) + "-p";
  const std::string orphan = "chorus-orphantest" + suffix + std::to_string(gone);
  const std::string alive = "chorus-alivetest" + suffix + "1";  // pid 1 runs as long as the machine
  for (const auto& n : {orphan, alive}) {
    std::ofstream("/dev/shm/" + n) << "x";
    ASSERT_TRUE(std::filesystem::exists("/dev/shm/" + n)) << n;
  }
  {
    Config config;
    config.timeout = 10s;
    auto comms = Communicator::createLocal(2, config);
  }
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + orphan)) << "the orphan was not removed";
  EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + alive)) << "a live process's segment was removed";
  std::filesystem::remove("/dev/shm/" + alive);
}

// Runs `command` in a private mount namespace whose /dev/shm is a fresh tmpfs of `size` (unshare -m),
// then prints "left: <names>" of what is in that /dev/shm afterwards; exits with the command's status.
std::optional<Process> spawnWithPrivateShm(const std::string& size, const std::vector<std::string>& command,
                                           const Env& env, const TempDir& dir) {
  const std::string script = "mount -t tmpfs -o size=" + size +
                             " chorus-test-shm /dev/shm || exit 99; \"$@\"; rc=$?; echo \"left: $(ls "
                             "/dev/shm | tr '\\n' ' ')\"; exit $rc";
  std::vector<std::string> argv{"/usr/bin/unshare", "-m", "/bin/sh", "-c", script, "sh"};
  argv.insert(argv.end(), command.begin(), command.end());
  if (access(argv[0].c_str(), X_OK) != 0) return std::nullopt;
  std::vector<Process> probe{
      spawn({"/usr/bin/unshare", "-m", "/bin/sh", "-c", "mount -t tmpfs -o size=1m t /dev/shm"}, baseEnv(),
            dir.path(), "probe")};
  if (!waitAll(probe, 30s) || !probe[0].exitedWith(0)) return std::nullopt;
  return spawn(argv, env, dir.path(), "job");
}

// What the private /dev/shm held after the job ("left: ..."), or "?" if the line is missing.
std::string leftInPrivateShm(const Process& p) {
  const std::string out = p.out();
  const size_t at = out.rfind("left: ");
  if (at == std::string::npos) return "?";
  std::string left = out.substr(at + 6);
  while (!left.empty() && (left.back() == '\n' || left.back() == ' ')) left.pop_back();
  return left;
}

// Under chorusrun, rank 1 of 4 is killed inside its segment's creation; chorusrun stops the others
// (SIGTERM) while they wait in set-up, before any could unlink its segment. Then chorusrun removes
// what they left: the job's private /dev/shm is empty.
TEST(ShmSetupFaults, KillDashNineInsideSetupUnderChorusrun_NothingLeft) {
  TempDir dir("shm-ns");
  Env env = baseEnv();
  env["CHORUS_TIMEOUT"] = "30";
  auto job =
      spawnWithPrivateShm("64m", {CHORUSRUN, "-n", "4", FAULT_RANK_PROGRAM, "shm-setup", "1"}, env, dir);
  if (!job) GTEST_SKIP() << "cannot mount a tmpfs on /dev/shm in a private mount namespace here (unshare -m)";
  std::vector<Process> procs{*job};
  ASSERT_TRUE(waitAll(procs, 60s)) << procs[0].describe();
  EXPECT_FALSE(procs[0].exitedWith(0)) << procs[0].describe();
  EXPECT_TRUE(contains(procs[0].err(), "rank 1")) << procs[0].describe();
  EXPECT_EQ(leftInPrivateShm(procs[0]), "") << procs[0].describe();
}

// A /dev/shm with room for 2 of 4 segments: the 2 ranks that do not fit fail with a message saying
// so, the 2 that fit stop at once with that message (not after CHORUS_TIMEOUT, 30 s), and the
// segments of those that fit are gone: the next job finds the same room. Ranks reserve one after
// another, so exactly 2 fail for room (not a third on another's partial reservation), and the free
// space each names is less than it needed.
TEST(ShmSetupFaults, DevShmTooSmallForSomeRanks_AllStopAtOnceNothingLeft) {
  TempDir dir("shm-ns");
  Env env = baseEnv();
  env["CHORUS_TIMEOUT"] = "30";
  env["CHORUS_SHM_STAGE_BYTES"] = "2097152";  // 4 slots of 1 MiB + 4 FIFOs of 256 KiB: ~5 MiB a segment
  env["CHORUS_SHM_FIFO_BYTES"] = "262144";
  auto job =
      spawnWithPrivateShm("12m", {CHORUSRUN, "-n", "4", FAULT_RANK_PROGRAM, "shm-setup", "-1"}, env, dir);
  if (!job) GTEST_SKIP() << "cannot mount a tmpfs on /dev/shm in a private mount namespace here (unshare -m)";
  std::vector<Process> procs{*job};
  ASSERT_TRUE(waitAll(procs, 60s)) << procs[0].describe();
  ASSERT_TRUE(procs[0].exitedWith(0)) << procs[0].describe();
  const std::string out = procs[0].out();
  int reports = 0, tooSmall = 0;
  for (size_t at = out.find("result="); at != std::string::npos; at = out.find("result=", at + 1)) {
    auto rep = parseReport(out.substr(at));
    ASSERT_TRUE(rep.has_value()) << out;
    ++reports;
    EXPECT_NE(rep->result, chorusSuccess) << rep->message;
    EXPECT_LT(rep->elapsedMs, 5000) << "waited for a rank that had failed: " << rep->message;
    EXPECT_TRUE(contains(rep->message, "/dev/shm")) << rep->message;
    if (rep->result == chorusSystemError) {
      ++tooSmall;
      static const std::regex kFigures(
          R"(needs ([0-9.]+) MiB but /dev/shm is full .*; ([0-9.]+) MiB free now)");
      std::smatch m;
      ASSERT_TRUE(std::regex_search(rep->message, m, kFigures)) << rep->message;
      EXPECT_LT(std::stod(m[2].str()), std::stod(m[1].str()))
          << "failed with room to spare: " << rep->message;
    }
  }
  EXPECT_EQ(reports, 4) << out;
  EXPECT_EQ(tooSmall, 2) << "two segments fit, two do not: " << out;
  EXPECT_EQ(leftInPrivateShm(procs[0]), "") << out;
}

// ---- Thread-rank faults -----------------------------------------------------------------------------

struct Outcome {
  bool threw = false;
  chorusResult_t code = chorusSuccess;
  std::string message;
  Clock::time_point end;
};

// Runs an allreduce of 1000 floats on `c`, recording how it ended.
Outcome allReduceOutcome(Communicator& c) {
  std::vector<float> in(1000, 1.0f), out(1000);
  Outcome o;
  try {
    c.allReduce(in.data(), out.data(), in.size(), DataType::Float32, ReduceOp::Sum);
  } catch (const Error& e) {
    o.threw = true;
    o.code = e.code();
    o.message = e.what();
  }
  o.end = Clock::now();
  return o;
}

Config shortTimeout(std::chrono::milliseconds t) {
  Config c;
  c.timeout = t;
  return c;
}

// Rank 2 never calls the allreduce: ranks 0 and 1 fail after about Config::timeout (2 s) with a
// message naming rank 2. The rank whose deadline passes first reports chorusTimeout; the other may
// instead see that failure first (chorusRemoteError, "rank N failed: ... rank(s) 2 ..."): both name 2.
TEST_F(Fault, MissingRank_TimeoutNamesIt) {
  auto comms = Communicator::createLocal(3, shortTimeout(2s));
  Outcome outcomes[2];
  const auto start = Clock::now();
  std::thread t0([&] { outcomes[0] = allReduceOutcome(comms[0]); });
  std::thread t1([&] { outcomes[1] = allReduceOutcome(comms[1]); });
  t0.join();
  t1.join();
  int timeouts = 0;
  for (int r = 0; r < 2; ++r) {
    const Outcome& o = outcomes[r];
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(o.threw) << "allreduce completed without rank 2";
    EXPECT_TRUE(o.code == chorusTimeout || o.code == chorusRemoteError) << o.code << ": " << o.message;
    if (o.code == chorusTimeout) ++timeouts;
    EXPECT_TRUE(namesRank(o.message, 2)) << o.message;
    const long long ms = msBetween(start, o.end);
    EXPECT_GE(ms, 1900) << "failed before the timeout: " << o.message;
    EXPECT_LT(ms, 4000) << "took far longer than the 2 s timeout";
    EXPECT_NE(comms[static_cast<size_t>(r)].asyncError(), chorusSuccess);
  }
  EXPECT_GE(timeouts, 1) << "no rank reported chorusTimeout";
  // A later call fails fast with the original cause.
  auto t = Clock::now();
  Outcome again = allReduceOutcome(comms[0]);
  EXPECT_TRUE(again.threw);
  EXPECT_LT(msBetween(t, again.end), 500);
  EXPECT_TRUE(namesRank(again.message, 2)) << again.message;
}

// Per-call timeout: with CHORUS_TIMEOUT-like Config::timeout at 120 s, rank 0 sets 400 ms for its
// next calls (setTimeout); its allreduce without rank 1 fails after about 400 ms, naming rank 1.
TEST_F(Fault, MissingRank_PerCallTimeoutNamesIt) {
  auto comms = Communicator::createLocal(2, shortTimeout(120s));
  comms[0].setTimeout(400ms);
  EXPECT_EQ(comms[0].timeout(), 400ms);
  EXPECT_EQ(comms[1].timeout(), 120s);
  const auto start = Clock::now();
  const Outcome o = allReduceOutcome(comms[0]);
  ASSERT_TRUE(o.threw) << "allreduce completed without rank 1";
  EXPECT_EQ(o.code, chorusTimeout) << o.message;
  EXPECT_TRUE(namesRank(o.message, 1)) << o.message;
  const long long ms = msBetween(start, o.end);
  EXPECT_GE(ms, 400) << "failed before its timeout (the call's start is read from the coarse clock): "
                     << o.message;
  EXPECT_LT(ms, 3000) << "the per-call timeout of 400 ms was not used";
}

// A per-call timeout applies to the calls issued after it, longer or shorter than Config::timeout,
// and zero restores Config::timeout: with Config::timeout 300 ms, a 3 s per-call timeout lets rank 0
// wait 1 s for a late rank 1; after setTimeout(0) the next such wait times out again.
TEST_F(Fault, Timeout_PerCallDeadlineAppliesToLaterCalls) {
  auto comms = Communicator::createLocal(2, shortTimeout(300ms));
  comms[0].setTimeout(3s);
  comms[1].setTimeout(3s);
  Outcome early;
  std::thread waiter([&] { early = allReduceOutcome(comms[0]); });
  std::this_thread::sleep_for(1s);
  const Outcome late = allReduceOutcome(comms[1]);
  waiter.join();
  EXPECT_FALSE(early.threw) << early.message;
  EXPECT_FALSE(late.threw) << late.message;
  comms[0].setTimeout(0ms);
  EXPECT_EQ(comms[0].timeout(), 300ms);
  EXPECT_THROW(comms[0].setTimeout(-1ms), Error);
  const auto start = Clock::now();
  const Outcome o = allReduceOutcome(comms[0]);
  EXPECT_EQ(o.code, chorusTimeout) << o.message;
  EXPECT_LT(msBetween(start, o.end), 2500);
}

// ---- Mismatched calls on chorusMemAlloc buffers, check mode off -----------------------------------
// The zero-copy exchange carries each rank's call: a mismatch is a named error on every rank, where
// a rank used to read a peer's buffer past its end (SIGSEGV).

// Waits (60 s) for ranks that each report one line and exit 0; their reports, nullopt where a
// rank did not (with the failure recorded).
std::vector<std::optional<SurvivorReport>> reportsOf(std::vector<Process>& procs) {
  EXPECT_TRUE(waitAll(procs, 60s)) << "a rank was still running after 60 s";
  std::vector<std::optional<SurvivorReport>> reports;
  for (const Process& p : procs) {
    std::optional<SurvivorReport> rep;
    if (p.exitedWith(0)) rep = parseReport(p.out());
    EXPECT_TRUE(rep.has_value()) << p.describe();
    reports.push_back(std::move(rep));
  }
  return reports;
}

// `extra`: more environment for every rank. The reports, for further checks.
std::vector<std::optional<SurvivorReport>> expectMismatchNamed(const std::string& mode,
                                                               const char* victimCall,
                                                               const Env& extra = {}) {
  TempDir dir("mismatch");
  TempDir store("mismatch-store");
  Env env{{"CHORUS_TIMEOUT", "20"}, {"CHORUS_CHECK", "0"}};
  for (const auto& [k, v] : extra) env[k] = v;
  std::vector<Process> procs = startFaultRanks(mode, store, dir, env);
  std::vector<std::optional<SurvivorReport>> reports = reportsOf(procs);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto& rep = reports[static_cast<size_t>(r)];
    EXPECT_TRUE(rep.has_value());
    if (!rep) continue;
    EXPECT_EQ(rep->result, chorusInvalidUsage) << rep->message;
    EXPECT_TRUE(contains(rep->message, "collective call mismatch")) << rep->message;
    // Each rank names a rank in the other call; ranks 0 and 2 name rank 1 and its call.
    if (r != 1) {
      EXPECT_TRUE(namesRank(rep->message, 1)) << rep->message;
      EXPECT_TRUE(contains(rep->message, victimCall)) << rep->message;
    }
  }
  return reports;
}

TEST_F(Fault, MismatchedCountOnMemAllocBuffers_NamedErrorNotCrash) {
  expectMismatchNamed("mismatch-count", "count 524288");
}

TEST_F(Fault, MismatchedKindOnMemAllocBuffers_NamedErrorNotCrash) {
  expectMismatchNamed("mismatch-kind", "broadcast");
}

// Starts `mode` with rank 1 as the victim, killed (SIGKILL) as it reads its peers' buffers; the
// survivors (ranks 0 and 2) must report chorusRemoteError naming rank 1 as dead. Their reports.
std::vector<std::optional<SurvivorReport>> expectVictimNamedDead(const std::string& mode, const Env& env) {
  TempDir dir(mode);
  TempDir store(mode + "-store");
  std::vector<Process> procs = startFaultRanks(mode, store, dir, env);
  std::vector<Process> survivors{procs[0], procs[2]};
  std::vector<std::optional<SurvivorReport>> reports = reportsOf(survivors);
  std::vector<Process> victim{procs[1]};
  EXPECT_TRUE(waitAll(victim, 10s));
  EXPECT_TRUE(victim[0].killedBy(SIGKILL)) << victim[0].describe();
  for (const auto& rep : reports) {
    EXPECT_TRUE(rep.has_value());
    if (!rep) continue;
    EXPECT_EQ(rep->result, chorusRemoteError) << rep->message;
    EXPECT_TRUE(namesRank(rep->message, 1) && contains(rep->message, "died")) << rep->message;
  }
  return reports;
}

// Rank 1 is killed on the zero-copy path after the buffer exchange, as it maps its peers' buffers;
// ranks 0 and 2 then cannot map rank 1's: they say it died (chorusRemoteError), where they used to
// blame permissions or /proc's hidepid (chorusSystemError).
TEST_F(Fault, KillDashNineZeroCopyPeer_NamedAsDeadNotAsPermissions) {
  for (const auto& rep :
       expectVictimNamedDead("zero-copy-death", {{"CHORUS_TIMEOUT", "20"}, {"CHORUS_CHECK", "0"}})) {
    if (rep) {
      EXPECT_FALSE(contains(rep->message, "hidepid")) << rep->message;
    }
  }
}

// The same on the single-copy path (heap buffers read in place by cross-memory attach, forced with
// CHORUS_CMA since 3 ranks share 2 cores here): rank 1 dies as it reads its peers' buffers, which
// the others read 300 ms later; they say it died. And a mismatched count is a named error on every
// rank: the exchange carries the call, so nobody reads past a peer's buffer.
TEST_F(Fault, KillDashNineSingleCopyPeer_NamedAsDead) {
  expectVictimNamedDead("single-copy-death",
                        {{"CHORUS_TIMEOUT", "20"}, {"CHORUS_CHECK", "0"}, {"CHORUS_CMA", "16K"}});
}

// And on point-to-point messages sent by address (transfer.cpp), in a ring shift: rank 2 reads the
// dead rank's buffer, rank 0 waits for it to have read its own; both say it died. Rank 2 fails and
// exits before rank 0 reads rank 2's buffer (rank 0 waits 1.5 s first): rank 0 then reports what
// rank 2 published (that rank 1 died), not that rank 2 went away.
TEST_F(Fault, KillDashNineSingleCopySendRecvPeer_NamedAsDead) {
  const auto reports = expectVictimNamedDead(
      "single-copy-p2p-death", {{"CHORUS_TIMEOUT", "20"}, {"CHORUS_CHECK", "0"}, {"CHORUS_CMA", "16K"}});
  ASSERT_EQ(reports.size(), 2u);
  if (reports[0]) {
    EXPECT_TRUE(contains(reports[0]->message, "rank 2 failed: ")) << reports[0]->message;
    EXPECT_FALSE(contains(reports[0]->message, "rank 2 (pid")) << reports[0]->message;
  }
}

// Single copy needs every rank: where rank 1 declines (CHORUS_CMA=0), every rank stages, says why
// in its SHM log, and the results stay exact.
TEST_F(Fault, SingleCopyDeclinedByOneRank_EveryRankStages) {
  TempDir dir("single-copy-declined");
  TempDir store("single-copy-declined-store");
  std::vector<Process> procs =
      startFaultRanks("single-copy-declined", store, dir,
                      {{"CHORUS_CMA", "16K"}, {"CHORUS_DEBUG", "INFO"}, {"CHORUS_DEBUG_SUBSYS", "SHM"}});
  ASSERT_TRUE(waitAll(procs, 60s));
  for (int r = 0; r < 3; ++r) {
    const Process& p = procs[static_cast<size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(p.exitedWith(0)) << p.describe();
    EXPECT_TRUE(contains(p.out(), "ok=1 rank=" + std::to_string(r))) << p.out();
    EXPECT_TRUE(contains(p.err(),
                         "collectives stage ordinary buffers: rank 1 offers no in-place reads: CHORUS_CMA=0"))
        << p.err();
  }
}

TEST_F(Fault, MismatchedCountOnSingleCopy_NamedErrorNotCrash) {
  for (const auto& rep :
       expectMismatchNamed("single-copy-mismatch", "count 131072", {{"CHORUS_CMA", "16K"}})) {
    if (rep) {
      EXPECT_LT(rep->elapsedMs, 5000) << rep->message;
    }
  }
}

// The probe's cases on processes and heap buffers, check mode off (the default): rank 1 allreduces
// 2000 floats where the others allreduce 1000, or broadcasts 1024 where they allreduce them. These
// returned success with wrong data on some ranks; now every rank fails at once (CHORUS_TIMEOUT 20
// s), and the messages name rank 1's call.
void expectHeapMismatchNamed(const std::string& mode, const char* victimCall) {
  TempDir dir("mismatch-heap");
  TempDir store("mismatch-heap-store");
  std::vector<Process> procs =
      startFaultRanks(mode, store, dir, {{"CHORUS_TIMEOUT", "20"}, {"CHORUS_CHECK", "0"}});
  const std::vector<std::optional<SurvivorReport>> reports = reportsOf(procs);
  bool named = false;
  for (const auto& rep : reports) {
    ASSERT_TRUE(rep.has_value());
    EXPECT_TRUE(rep->result == chorusInvalidUsage || rep->result == chorusRemoteError) << rep->message;
    EXPECT_TRUE(contains(rep->message, "mismatch")) << rep->message;
    EXPECT_LT(rep->elapsedMs, 5000) << rep->message;
    named = named || contains(rep->message, victimCall);
  }
  EXPECT_TRUE(named) << "no rank named rank 1's " << victimCall;
}

TEST_F(Fault, MismatchedCountOnHeapBuffers_ErrorNotWrongData) {
  expectHeapMismatchNamed("mismatch-count-heap", "count 2000");
}

TEST_F(Fault, MismatchedKindOnHeapBuffers_ErrorNotWrongData) {
  expectHeapMismatchNamed("mismatch-kind-heap", "broadcast");
}

// A malformed setting on rank 1 only: rank 1 fails at once naming it, and publishes its failure,
// so ranks 0 and 2 stop at once with rank 1's message (they waited out CHORUS_TIMEOUT, then
// reported rank 1 as not started).
TEST_F(Fault, BadSettingOnOneRank_PeersFailAtOnceWithItsMessage) {
  TempDir dir("bad-setting");
  TempDir store("bad-setting-store");
  std::vector<Process> procs = startFaultRanks("bad-setting", store, dir, {{"CHORUS_TIMEOUT", "30"}});
  const std::vector<std::optional<SurvivorReport>> reports = reportsOf(procs);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto& rep = reports[static_cast<size_t>(r)];
    ASSERT_TRUE(rep.has_value());
    EXPECT_TRUE(contains(rep->message, "CHORUS_SHM_FIFO_BYTES='banana'")) << rep->message;
    EXPECT_LT(rep->elapsedMs, 5000) << rep->message;
    if (r == 1) {
      EXPECT_EQ(rep->result, chorusInvalidArgument) << rep->message;
    } else {
      EXPECT_EQ(rep->result, chorusRemoteError) << rep->message;
      EXPECT_TRUE(contains(rep->message, "rank 1 failed")) << rep->message;
    }
  }
}

// ---- Init against a unique id whose store is gone, silent or another program ---------------------
// (chorusCommInitRank takes CHORUS_TIMEOUT for the connection and handshake; no peer is blamed.)

std::string hexOf(const chorusUniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (char c : id.internal) {
    out += digits[(static_cast<unsigned char>(c) >> 4) & 0xF];
    out += digits[static_cast<unsigned char>(c) & 0xF];
  }
  return out;
}

// A real id, pointed at another port or carrying another secret. `real`: the id to alter (by default
// one of this process's, whose store nobody then reaches).
chorusUniqueId alteredId(std::optional<uint16_t> port, std::optional<std::string> secret,
                         std::optional<chorusUniqueId> given = std::nullopt) {
  chorusUniqueId real{};
  if (given)
    real = *given;
  else
    EXPECT_EQ(chorusGetUniqueId(&real), chorusSuccess);
  auto address = parseUniqueId(real);
  EXPECT_TRUE(address.has_value());
  if (port) address->port = *port;
  if (secret) address->secret = *secret;
  chorusUniqueId out;
  EXPECT_TRUE(formatUniqueId(*address, &out));
  return out;
}

// A socket listening on 127.0.0.1 that accepts nothing: connections complete and then hear nothing.
struct SilentListener {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  uint16_t port = 0;
  SilentListener() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(listen(fd, 8), 0);
    EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port = ntohs(addr.sin_port);
  }
  ~SilentListener() { close(fd); }
};

// Joins `id` as rank 1 of 2 in a process with CHORUS_TIMEOUT=`timeout` and returns its report.
SurvivorReport joinId(const chorusUniqueId& id, const std::string& timeout) {
  TempDir dir("join-id");
  Env env = baseEnv();
  env["CHORUS_TIMEOUT"] = timeout;
  Process p = spawn({FAULT_RANK_PROGRAM, "join-id", hexOf(id)}, env, dir.path(), "join");
  EXPECT_TRUE(waitFor(p, Clock::now() + 90s)) << "init still waiting after 90 s";
  EXPECT_TRUE(p.exitedWith(0)) << p.describe();
  auto rep = parseReport(p.out());
  EXPECT_TRUE(rep.has_value()) << p.describe();
  return rep.value_or(SurvivorReport{});
}

// Nothing listens on the id's port: init gives up after CHORUS_TIMEOUT (it waited 60 s whatever
// CHORUS_TIMEOUT said), and says which store and what to check.
TEST(InitFaults, UnreachableStoreTakesTheTimeout) {
  const SurvivorReport rep = joinId(alteredId(static_cast<uint16_t>(freePort()), std::nullopt), "2");
  EXPECT_EQ(rep.result, chorusTimeout) << rep.message;
  EXPECT_GE(rep.elapsedMs, 1900) << rep.message;
  EXPECT_LT(rep.elapsedMs, 8000) << rep.message;
  EXPECT_TRUE(contains(rep.message, "did not answer within 2000 ms")) << rep.message;
  EXPECT_TRUE(contains(rep.message, "still running")) << rep.message;
}

// The port accepts and then says nothing: the handshake is bounded by CHORUS_TIMEOUT too (it had
// at least 30 s).
TEST(InitFaults, SilentStoreTakesTheTimeout) {
  SilentListener silent;
  const SurvivorReport rep = joinId(alteredId(silent.port, std::nullopt), "3");
  EXPECT_EQ(rep.result, chorusTimeout) << rep.message;
  EXPECT_GE(rep.elapsedMs, 2900) << rep.message;
  EXPECT_LT(rep.elapsedMs, 9000) << rep.message;
  EXPECT_TRUE(contains(rep.message, "did not answer within 3000 ms")) << rep.message;
}

// Another program answers on the id's port: an invalid id, not "a peer failed".
TEST(InitFaults, ForeignServerIsAnInvalidIdNotARemoteError) {
  SilentListener listener;
  std::thread http([&] {
    const int peer = accept(listener.fd, nullptr, nullptr);
    const char banner[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n________";
    EXPECT_GT(send(peer, banner, sizeof banner, MSG_NOSIGNAL), 0);
    std::this_thread::sleep_for(500ms);
    close(peer);
  });
  const SurvivorReport rep = joinId(alteredId(listener.port, std::nullopt), "20");
  http.join();
  EXPECT_EQ(rep.result, chorusInvalidArgument) << rep.message;
  EXPECT_TRUE(contains(rep.message, "did not take the id")) << rep.message;
  EXPECT_TRUE(contains(rep.message, "not a Chorus TCP store")) << rep.message;
  EXPECT_LT(rep.elapsedMs, 5000) << rep.message;
}

// The id's secret was altered: the message says so, instead of blaming CHORUS_SECRET. (The store
// serves from another process: its handshake thread would otherwise outlive this test's process,
// using OpenSSL while the process's exit frees it.)
TEST(InitFaults, AlteredSecretIsNamedAsTheIds) {
  TempDir dir("serve-id");
  Process server = spawn({FAULT_RANK_PROGRAM, "serve-id", "60"}, baseEnv(), dir.path(), "server");
  std::string hex;
  for (auto until = Clock::now() + 20s; Clock::now() < until; std::this_thread::sleep_for(10ms)) {
    hex = server.out();
    if (hex.size() > 2 * CHORUS_UNIQUE_ID_BYTES) break;
  }
  ASSERT_GT(hex.size(), 2 * CHORUS_UNIQUE_ID_BYTES) << server.describe();
  chorusUniqueId served{};
  for (size_t i = 0; i < sizeof served.internal; ++i)
    served.internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  const SurvivorReport rep = joinId(alteredId(std::nullopt, std::string(32, 'a'), served), "20");
  kill(server.pid, SIGTERM);
  waitFor(server, Clock::now() + 10s);
  EXPECT_EQ(rep.result, chorusInvalidArgument) << rep.message;
  EXPECT_TRUE(contains(rep.message, "refused the secret carried in the id")) << rep.message;
  EXPECT_FALSE(contains(rep.message, "CHORUS_SECRET")) << rep.message;
}

// The C form checks its argument.
TEST(PerCallTimeout, CApiRejectsBadValues) {
  chorusComm_t comm = nullptr;
  ASSERT_EQ(chorusCommInitAll(&comm, 1, nullptr), chorusSuccess);
  EXPECT_EQ(chorusCommSetTimeout(comm, -1.0), chorusInvalidArgument);
  EXPECT_EQ(chorusCommSetTimeout(comm, std::nan("")), chorusInvalidArgument);
  EXPECT_EQ(chorusCommSetTimeout(comm, 2e9), chorusInvalidArgument);
  EXPECT_EQ(chorusCommSetTimeout(comm, 0.25), chorusSuccess);
  EXPECT_EQ(chorusCommSetTimeout(nullptr, 1.0), chorusInvalidArgument);
  EXPECT_EQ(chorusCommDestroy(comm), chorusSuccess);
}

// Stricter form of the above, as the [core] issue states it: both ranks that arrived report
// chorusTimeout, whichever deadline passes first (a peer's published timeout stays a timeout).
TEST_F(Fault, MissingRank_EveryWaitingRankReportsTimeout) {
  auto comms = Communicator::createLocal(3, shortTimeout(2s));
  Outcome outcomes[2];
  std::thread t0([&] { outcomes[0] = allReduceOutcome(comms[0]); });
  std::thread t1([&] { outcomes[1] = allReduceOutcome(comms[1]); });
  t0.join();
  t1.join();
  for (const Outcome& o : outcomes) {
    EXPECT_EQ(o.code, chorusTimeout) << o.message;
    EXPECT_TRUE(namesRank(o.message, 2)) << o.message;
  }
}

// A rank blocked in an allreduce (its peer never arrives) returns within 1 s after abort() is
// called from another thread; afterwards asyncError() reports the failure and calls fail fast.
TEST_F(Fault, Abort_FromAnotherThread) {
  auto comms = Communicator::createLocal(2, shortTimeout(30s));
  Outcome outcome;
  std::thread blocked([&] { outcome = allReduceOutcome(comms[0]); });
  std::this_thread::sleep_for(300ms);
  const auto abortAt = Clock::now();
  comms[0].abort();
  blocked.join();
  ASSERT_TRUE(outcome.threw) << "allreduce completed without its peer";
  EXPECT_LT(msBetween(abortAt, outcome.end), 1000) << "abort took too long to stop the blocked call";
  EXPECT_EQ(outcome.code, chorusRemoteError) << outcome.message;
  EXPECT_TRUE(contains(outcome.message, "abort")) << outcome.message;
  EXPECT_NE(comms[0].asyncError(), chorusSuccess);
  // Later calls fail fast.
  for (int i = 0; i < 3; ++i) {
    auto t = Clock::now();
    Outcome again = allReduceOutcome(comms[0]);
    EXPECT_TRUE(again.threw);
    EXPECT_NE(again.code, chorusSuccess);
    EXPECT_LT(msBetween(t, again.end), 200) << again.message;
  }
  std::vector<float> buf(16, 1.0f);
  EXPECT_THROW(comms[0].barrier(), Error);
  EXPECT_THROW(comms[0].broadcast(buf.data(), buf.data(), buf.size(), DataType::Float32, 0), Error);
  // The peer hears of it: its next call fails fast, naming rank 0.
  auto t = Clock::now();
  Outcome peer = allReduceOutcome(comms[1]);
  EXPECT_TRUE(peer.threw);
  EXPECT_EQ(peer.code, chorusRemoteError) << peer.message;
  EXPECT_TRUE(namesRank(peer.message, 0)) << peer.message;
  EXPECT_LT(msBetween(t, peer.end), 1000);
}

// The same with an asynchronous operation: its Work fails within 1 s of abort().
TEST_F(Fault, Abort_FromAnotherThreadFailsPendingWork) {
  auto comms = Communicator::createLocal(2, shortTimeout(30s));
  std::vector<float> in(1000, 1.0f), out(1000);
  Work w = comms[0].allReduceAsync(in.data(), out.data(), in.size(), DataType::Float32, ReduceOp::Sum);
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(w.test());
  const auto abortAt = Clock::now();
  std::thread([&] { comms[0].abort(); }).join();
  bool done = false;
  try {
    done = w.wait(std::chrono::milliseconds(1000));
    ADD_FAILURE() << "Work::wait did not throw (done=" << done << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusRemoteError) << e.what();
    EXPECT_LT(msBetween(abortAt, Clock::now()), 1000);
  }
  EXPECT_EQ(w.status(), chorusRemoteError);
  EXPECT_NE(w.errorMessage(), "");
  // Later asynchronous calls fail at once rather than returning a Work that never finishes.
  EXPECT_THROW(
      (void)comms[0].allReduceAsync(in.data(), out.data(), in.size(), DataType::Float32, ReduceOp::Sum),
      Error);
}

// Rank 1 aborts while ranks 0 and 2 wait in an allreduce: both fail within 1 s, naming rank 1.
TEST_F(Fault, PeerFailurePropagates) {
  auto comms = Communicator::createLocal(3, shortTimeout(30s));
  Outcome outcomes[3];
  std::thread t0([&] { outcomes[0] = allReduceOutcome(comms[0]); });
  std::thread t2([&] { outcomes[2] = allReduceOutcome(comms[2]); });
  std::this_thread::sleep_for(300ms);
  const auto abortAt = Clock::now();
  std::thread([&] { comms[1].abort(); }).join();
  t0.join();
  t2.join();
  for (int r : {0, 2}) {
    const Outcome& o = outcomes[r];
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(o.threw) << "allreduce completed without rank 1";
    EXPECT_EQ(o.code, chorusRemoteError) << o.message;
    EXPECT_TRUE(namesRank(o.message, 1)) << o.message;
    EXPECT_LT(msBetween(abortAt, o.end), 1000) << "the failure took too long to reach rank " << r;
    EXPECT_NE(comms[static_cast<size_t>(r)].asyncError(), chorusSuccess);
  }
}

// A rank that enters its call after a peer has already failed stops at once, naming the call as
// the peers in it do ("#1", not "#0"); an alltoallv names what it moves (its count field is 0).
TEST_F(Fault, PeerFailureBeforeTheCall_NamedAsThePeersNameIt) {
  chorusComm_t comms[3] = {};
  ASSERT_EQ(chorusCommInitAll(comms, 3, nullptr), chorusSuccess) << chorusGetLastError(nullptr);
  std::string messages[3];
  auto body = [&](int r) {
    std::vector<float> in(15, 1.0f), out(15);
    const std::vector<size_t> counts(3, 5), displs{0, 5, 10};
    EXPECT_EQ(chorusAllToAllv(in.data(), counts.data(), displs.data(), out.data(), counts.data(),
                              displs.data(), chorusFloat32, comms[r], nullptr),
              chorusRemoteError);
    messages[r] = chorusGetLastError(comms[r]);
  };
  std::thread t2(body, 2);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(chorusCommAbort(comms[1]), chorusSuccess);
  body(0);  // after the abort: the check before the call finds it
  t2.join();
  for (int r : {0, 2}) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(contains(messages[r], "alltoallv #1 (15 x float32 sent, 15 received")) << messages[r];
    EXPECT_FALSE(contains(messages[r], "#0")) << messages[r];
    EXPECT_TRUE(namesRank(messages[r], 1)) << messages[r];
    EXPECT_EQ(chorusCommDestroy(comms[r]), chorusSuccess);
  }
}

// Through the C API: chorusCommAbort on a rank that is not in the call, and the others' pending
// chorusAllReduce fails naming it.
TEST_F(Fault, PeerFailurePropagates_CApi) {
  chorusComm_t comms[3] = {};
  ASSERT_EQ(chorusCommInitAll(comms, 3, nullptr), chorusSuccess) << chorusGetLastError(nullptr);
  chorusResult_t results[3] = {chorusSuccess, chorusSuccess, chorusSuccess};
  std::string messages[3];
  auto body = [&](int r) {
    std::vector<float> in(100, 1.0f), out(100);
    results[r] =
        chorusAllReduce(in.data(), out.data(), in.size(), chorusFloat32, chorusSum, comms[r], nullptr);
    messages[r] = chorusGetLastError(comms[r]);
  };
  std::thread t0(body, 0), t2(body, 2);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(chorusCommAbort(comms[1]), chorusSuccess);
  t0.join();
  t2.join();
  for (int r : {0, 2}) {
    EXPECT_EQ(results[r], chorusRemoteError) << messages[r];
    EXPECT_TRUE(namesRank(messages[r], 1)) << messages[r];
    chorusResult_t async = chorusSuccess;
    EXPECT_EQ(chorusCommGetAsyncError(comms[r], &async), chorusSuccess);
    EXPECT_EQ(async, chorusRemoteError);
    EXPECT_EQ(chorusCommDestroy(comms[r]), chorusSuccess);
  }
  // The aborted handle is gone.
  int n = 0;
  EXPECT_EQ(chorusCommCount(comms[1], &n), chorusInvalidUsage);
}

// The shared-memory staging area cannot fit in /dev/shm: creation fails with chorusSystemError
// saying so (before reserving anything), and nothing is left in /dev/shm.
TEST_F(Fault, ShmTooSmall_CreationFailsClearly) {
  struct statvfs st {};
  ASSERT_EQ(statvfs("/dev/shm", &st), 0) << "no /dev/shm";
  const size_t freeBytes = static_cast<size_t>(st.f_bavail) * static_cast<size_t>(st.f_frsize);
  Config config = shortTimeout(5s);
  config.shmStageBytes = (freeBytes + (size_t{1} << 30)) & ~size_t{4095};
  const auto start = Clock::now();
  try {
    auto comms = Communicator::createLocal(2, config);
    FAIL() << "created a communicator whose segments need " << config.shmStageBytes << " bytes each, with "
           << freeBytes << " bytes free in /dev/shm";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusSystemError) << e.what();
    EXPECT_TRUE(contains(e.what(), "/dev/shm")) << e.what();
    EXPECT_TRUE(contains(e.what(), "CHORUS_SHM_STAGE_BYTES")) << "no hint what to change: " << e.what();
  }
  EXPECT_LT(msBetween(start, Clock::now()), 5000);
}

}  // namespace

// ---- Mismatched calls (CHORUS_CHECK / Config::checkCalls) -------------------------------------------

namespace {

// Runs `call(rank, comm)` on every thread rank of a check-mode communicator and returns each outcome.
template <typename Call>
std::vector<Outcome> runMismatch(int n, Call call, bool checkMode = true) {
  Config config = shortTimeout(10s);
  config.checkCalls = checkMode;
  auto comms = Communicator::createLocal(n, config);
  std::vector<Outcome> outcomes(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Outcome& o = outcomes[static_cast<size_t>(r)];
      try {
        call(r, comms[static_cast<size_t>(r)]);
      } catch (const Error& e) {
        o.threw = true;
        o.code = e.code();
        o.message = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return outcomes;
}

}  // namespace

// Rank 2 passes a different count: every rank gets chorusInvalidUsage naming rank 2, at once.
TEST_F(Fault, MismatchedCount_NamedErrorNotHang) {
  auto outcomes = runMismatch(3, [](int r, Communicator& c) {
    std::vector<float> buf(200, 1.0f);
    c.allReduce(buf.data(), buf.data(), r == 2 ? 200 : 100, DataType::Float32, ReduceOp::Sum);
  });
  for (int r = 0; r < 3; ++r) {
    const Outcome& o = outcomes[static_cast<size_t>(r)];
    ASSERT_TRUE(o.threw) << "rank " << r << " completed a mismatched allreduce";
    EXPECT_EQ(o.code, chorusInvalidUsage) << o.message;
    EXPECT_TRUE(contains(o.message, "mismatch")) << o.message;
    if (r != 2) {
      EXPECT_TRUE(namesRank(o.message, 2)) << o.message;
    }
  }
}

// Rank 1 calls broadcast while rank 0 calls allreduce: both get an error naming the other's call.
TEST_F(Fault, MismatchedCollective_NamedErrorNotHang) {
  auto outcomes = runMismatch(2, [](int r, Communicator& c) {
    std::vector<int32_t> buf(64, 1);
    if (r == 0) {
      c.allReduce(buf.data(), buf.data(), buf.size(), DataType::Int32, ReduceOp::Sum);
    } else {
      c.broadcast(buf.data(), buf.data(), buf.size(), DataType::Int32, 0);
    }
  });
  EXPECT_TRUE(contains(outcomes[0].message, "broadcast")) << outcomes[0].message;
  EXPECT_TRUE(contains(outcomes[1].message, "allreduce")) << outcomes[1].message;
  for (const Outcome& o : outcomes) EXPECT_EQ(o.code, chorusInvalidUsage) << o.message;
}

// Without check mode (the default), mismatched calls are still errors, never a silent success: the
// call travels with every message (its hash is the tag) and with the first synchronisation (its
// fingerprint in shared memory). One rank differs in count, kind, type, op or root, over each
// path: low-latency lines (8 B), staged direct (4 KiB), ring/pipes and staging (1 MiB). Every
// rank fails well before the timeout (10 s), and each message says what the calls were.
TEST_F(Fault, MismatchedCallsWithoutCheckMode_ErrorsNotSilentResults) {
  struct Case {
    const char* what;
    size_t count;
    std::function<void(int, Communicator&, std::vector<float>&)> call;
    const char* named;  // what some rank's message must name of the odd call
  };
  auto allReduce = [](size_t count, int odd, size_t oddCount, ReduceOp oddOp = ReduceOp::Sum) {
    return [=](int r, Communicator& c, std::vector<float>& buf) {
      c.allReduce(buf.data(), buf.data(), r == odd ? oddCount : count, DataType::Float32,
                  r == odd ? oddOp : ReduceOp::Sum);
    };
  };
  const std::vector<Case> cases = {
      {"count 1000 vs 2000", 1000, allReduce(1000, 1, 2000), "count 2000"},
      {"count 2 vs 1 (8 B)", 2, allReduce(2, 1, 1), "count 1"},
      {"op sum vs max, 1 MiB", 262144, allReduce(262144, 2, 262144, ReduceOp::Max), "max"},
      {"broadcast vs allreduce, 1024", 1024,
       [](int r, Communicator& c, std::vector<float>& buf) {
         if (r == 1) {
           c.broadcast(buf.data(), buf.data(), 1024, DataType::Float32, 0);
         } else {
           c.allReduce(buf.data(), buf.data(), 1024, DataType::Float32, ReduceOp::Sum);
         }
       },
       "broadcast"},
      {"broadcast root 0 vs 1, 1 MiB", 262144,
       [](int r, Communicator& c, std::vector<float>& buf) {
         c.broadcast(buf.data(), buf.data(), buf.size(), DataType::Float32, r == 2 ? 1 : 0);
       },
       "root 1"},
      {"float32 vs int32 allgather", 1024,
       [](int r, Communicator& c, std::vector<float>& buf) {
         c.allGather(buf.data(), buf.data() + 1024, 1024, r == 0 ? DataType::Int32 : DataType::Float32);
       },
       "int32"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    const auto start = Clock::now();
    auto outcomes = runMismatch(
        3,
        [&](int r, Communicator& c) {
          std::vector<float> buf(k.count * 4, 1.0f);
          k.call(r, c, buf);
        },
        false);
    EXPECT_LT(msBetween(start, Clock::now()), 5000) << "a rank waited for the timeout";
    bool named = false;
    for (int r = 0; r < 3; ++r) {
      const Outcome& o = outcomes[static_cast<size_t>(r)];
      ASSERT_TRUE(o.threw) << "rank " << r << " returned success from a mismatched call";
      EXPECT_TRUE(o.code == chorusInvalidUsage || o.code == chorusRemoteError) << o.message;
      EXPECT_TRUE(contains(o.message, "mismatch") || contains(o.message, "different operations"))
          << "rank " << r << ": " << o.message;
      named = named || contains(o.message, k.named);
    }
    EXPECT_TRUE(named) << "no rank named the odd call (" << k.named << "): " << outcomes[0].message << " | "
                       << outcomes[1].message << " | " << outcomes[2].message;
  }
}

// The low-latency broadcast and reduce (up to 256 B) let the ranks that wait for nobody (the
// broadcast's root, the reduce's other ranks) return at once: a mismatch there fails the ranks that
// waited for the odd one in that call, and every other rank at its next collective call (here a
// staged one), which first compares the peers' calls of the message before (ShmSync::llAwaitAll), naming the
// mismatched call; never a timeout, and no rank goes on past its next call. Also where the odd
// rank's count puts it on the staged path (a rank of the low-latency one then finds the odd rank
// synchronising where it never does).
TEST_F(Fault, MismatchedSmallRootedCalls_FailByTheNextCall) {
  struct Case {
    const char* what;
    int ranks;
    std::function<void(int, Communicator&, std::vector<float>&)> call;
    const char* named;
  };
  const std::vector<Case> cases = {
      {"broadcast root 0 vs 1, 8 B", 3,
       [](int r, Communicator& c, std::vector<float>& buf) {
         c.broadcast(buf.data(), buf.data(), 2, DataType::Float32, r == 2 ? 1 : 0);
       },
       "root 1"},
      {"broadcast, each rank its own root, 8 B", 2,
       [](int r, Communicator& c, std::vector<float>& buf) {
         c.broadcast(buf.data(), buf.data(), 2, DataType::Float32, r);
       },
       "root 1"},
      {"reduce root 0 vs 1, 8 B", 3,
       [](int r, Communicator& c, std::vector<float>& buf) {
         c.reduce(buf.data(), buf.data() + 2, 2, DataType::Float32, ReduceOp::Sum, r == 2 ? 1 : 0);
       },
       "root 1"},
      {"broadcast 8 B vs 4 KiB", 3,
       [](int r, Communicator& c, std::vector<float>& buf) {
         c.broadcast(buf.data(), buf.data(), r == 2 ? 1024 : 2, DataType::Float32, 0);
       },
       "count"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    const auto start = Clock::now();
    std::vector<int> callsDone(static_cast<size_t>(k.ranks), 0);
    auto outcomes = runMismatch(
        k.ranks,
        [&](int r, Communicator& c) {
          std::vector<float> buf(4096, 1.0f);
          k.call(r, c, buf);
          ++callsDone[static_cast<size_t>(r)];
          // 4 KiB: not in the low-latency lines, so only the check at the call's start finds it.
          c.allReduce(buf.data() + 2048, buf.data() + 2048, 1024, DataType::Float32, ReduceOp::Sum);
          ++callsDone[static_cast<size_t>(r)];
        },
        false);
    EXPECT_LT(msBetween(start, Clock::now()), 5000) << "a rank waited for the timeout";
    bool named = false;
    for (int r = 0; r < k.ranks; ++r) {
      const Outcome& o = outcomes[static_cast<size_t>(r)];
      ASSERT_TRUE(o.threw) << "rank " << r << " went on past its next call";
      EXPECT_LT(callsDone[static_cast<size_t>(r)], 2) << "rank " << r;
      EXPECT_TRUE(o.code == chorusInvalidUsage || o.code == chorusRemoteError) << o.message;
      EXPECT_TRUE(contains(o.message, "mismatch")) << "rank " << r << ": " << o.message;
      named = named || contains(o.message, k.named);
    }
    EXPECT_TRUE(named) << "no rank named the odd call (" << k.named << "): " << outcomes[0].message;
  }
}

// Check mode changes nothing when the calls agree.
TEST_F(Fault, CheckMode_MatchingCallsSucceed) {
  auto outcomes = runMismatch(3, [](int r, Communicator& c) {
    std::vector<float> buf(1000, static_cast<float>(r + 1));
    c.allReduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Sum);
    c.broadcast(buf.data(), buf.data(), buf.size(), DataType::Float32, 1);
    if (buf[999] != 6.0f) throw Error(chorusInternalError, "wrong result");
  });
  for (const Outcome& o : outcomes) EXPECT_FALSE(o.threw) << o.message;
}

// A rank that stops calling: the timeout says where every rank is (from the progress published in
// shared memory), and CHORUS_FLIGHT_RECORDER gets each waiting rank's last operations written out,
// ending with the one that failed. Runs in a child process: the environment is read once per process.
TEST(FlightRecorder, Timeout_ReportsWhereEachRankIsAndWritesTheRecorder) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The death-test child runs this body again: it must find the directory the parent made.
  std::string dir;
  if (const char* inherited = std::getenv("CHORUS_TEST_FLIGHT_DIR")) {
    dir = inherited;
  } else {
    char made[] = "/tmp/chorus-flight-XXXXXX";
    ASSERT_NE(mkdtemp(made), nullptr);
    dir = made;
    setenv("CHORUS_TEST_FLIGHT_DIR", made, 1);
  }
  const std::string prefix = dir + "/fr";
  EXPECT_EXIT(
      {
        setenv("CHORUS_FLIGHT_RECORDER", prefix.c_str(), 1);
        Config config;
        config.timeout = 1500ms;
        auto comms = Communicator::createLocal(3, config);
        std::string messages[2];
        std::vector<std::thread> threads;
        for (int r = 0; r < 3; ++r) {
          threads.emplace_back([&, r] {
            std::vector<float> buf(1000, 1.0f);
            for (int i = 0; i < 3; ++i)
              comms[r].allReduce(buf.data(), buf.data(), 1000, DataType::Float32, ReduceOp::Sum);
            comms[r].broadcast(buf.data(), buf.data(), 1000, DataType::Float32, 1);
            if (r == 2) return;  // rank 2 never calls the next allreduce
            try {
              comms[r].allReduce(buf.data(), buf.data(), 1000, DataType::Float32, ReduceOp::Max);
            } catch (const Error& e) {
              messages[r] = e.what();
            }
          });
        }
        for (auto& t : threads) t.join();
        for (const std::string& m : messages) std::fprintf(stderr, "MESSAGE %s\n", m.c_str());
        std::exit(0);
      },
      ::testing::ExitedWithCode(0),
      // Both waiting ranks: timed out in allreduce #5, rank 2 seen finished with broadcast #4.
      "MESSAGE rank 0: allreduce #5.*where each rank is: .*rank 2 finished broadcast #4.*flight recorder "
      "written to[^\n]*\nMESSAGE rank 1: allreduce #5.*rank 2 finished broadcast #4");
  // Each waiting rank's file: the header, then 5 operations, the last one failed.
  int files = 0;
  for (int r = 0; r < 3; ++r) {
    std::string found;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.size() > 2 && name.compare(name.size() - 2, 2, "." + std::to_string(r)) == 0)
        found = entry.path();
    }
    if (r == 2) {
      EXPECT_TRUE(found.empty()) << "rank 2 did not fail, yet wrote " << found;
      continue;
    }
    ASSERT_FALSE(found.empty()) << "no flight recorder file for rank " << r;
    ++files;
    std::ifstream in(found);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(contains(text, "rank " + std::to_string(r) + " of 3")) << text;
    EXPECT_TRUE(contains(text, "allreduce #3 count 1000 float32 sum [")) << text;
    EXPECT_TRUE(contains(text, "broadcast #4 count 1000 float32 root 1")) << text;
    EXPECT_TRUE(contains(text, "allreduce #5 count 1000 float32 max")) << text;
    EXPECT_TRUE(contains(text, "FAILED (code 8)")) << text;
  }
  EXPECT_EQ(files, 2);
  std::filesystem::remove_all(dir);
  unsetenv("CHORUS_TEST_FLIGHT_DIR");
}
