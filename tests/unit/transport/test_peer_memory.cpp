// Cross-memory attach (transports/shm/peer_memory): the probe every rank runs at set-up, and the
// read and write the single-copy collectives use, against a child process: allowed, refused
// (another user), and a process that has exited.
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "transports/shm/peer_memory.hpp"

using namespace chorus;
using namespace chorus::transport;

namespace {

// A child that waits to be killed; its memory is a copy of ours at the fork.
struct Child {
  pid_t pid = -1;
  Child() {
    pid = fork();
    if (pid == 0) {
      for (;;) pause();
    }
  }
  ~Child() { stop(); }
  void stop() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(PeerMemory, ReadsAPeerProcessExactly) {
  std::vector<uint32_t> data(300'001);  // over a page boundary many times, not a page multiple
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint32_t>(i * 2654435761u);
  Child child;
  ASSERT_GT(child.pid, 0);
  std::string why;
  ASSERT_TRUE(probePeerMemory(child.pid, reinterpret_cast<uintptr_t>(peerProbeWord()), &why)) << why;
  std::vector<uint32_t> got(data.size());
  readPeerMemory(child.pid, got.data(), reinterpret_cast<uintptr_t>(data.data()), data.size() * 4, "rank 1");
  EXPECT_EQ(got, data);
}

// The single-copy allreduce writes its reduced slice into each peer's output: every byte lands,
// over page boundaries, and no byte beyond the range moves.
TEST(PeerMemory, WritesAPeerProcessExactly) {
  std::vector<uint32_t> target(300'003, 7u);  // the child's copy is what the write changes
  Child child;
  ASSERT_GT(child.pid, 0);
  std::string why;
  ASSERT_TRUE(probeOwnMemoryWrite(&why)) << why;
  std::vector<uint32_t> data(300'001);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint32_t>(i * 2654435761u);
  writePeerMemory(child.pid, reinterpret_cast<uintptr_t>(target.data() + 1), data.data(), data.size() * 4,
                  "rank 1");
  std::vector<uint32_t> got(target.size());
  readPeerMemory(child.pid, got.data(), reinterpret_cast<uintptr_t>(target.data()), got.size() * 4, "rank 1");
  EXPECT_EQ(got.front(), 7u);
  EXPECT_EQ(got.back(), 7u);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), got.begin() + 1));
  EXPECT_EQ(target[1], 7u) << "the write changed this process, not the child";
}

TEST(PeerMemory, AWriteToAnUnmappedRangeIsANamedError) {
  Child child;
  const float in[4] = {1, 2, 3, 4};
  try {
    writePeerMemory(child.pid, 8, in, sizeof in, "rank 1");
    FAIL() << "writing address 8 succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusSystemError);
    EXPECT_TRUE(contains(e.what(), "rank 1") && contains(e.what(), "writing") && contains(e.what(), "EFAULT"))
        << e.what();
  }
  const pid_t pid = child.pid;
  child.stop();
  try {
    writePeerMemory(pid, reinterpret_cast<uintptr_t>(&in[0]), in, sizeof in, "rank 1");
    FAIL() << "writing an exited process succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusRemoteError);
    EXPECT_TRUE(contains(e.what(), "rank 1") && contains(e.what(), "died")) << e.what();
  }
}

TEST(PeerMemory, TheProbeChecksTheWordNotOnlyTheCall) {
  const uint64_t other = kPeerProbeValue + 1;
  Child child;
  std::string why;
  EXPECT_FALSE(probePeerMemory(child.pid, reinterpret_cast<uintptr_t>(&other), &why));
  EXPECT_TRUE(contains(why, "wrong bytes")) << why;
}

TEST(PeerMemory, AnUnmappedRangeIsANamedErrorNotACrash) {
  Child child;
  float out[4];
  try {
    readPeerMemory(child.pid, out, 8, sizeof out, "rank 1");
    FAIL() << "reading address 8 succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusSystemError);
    EXPECT_TRUE(contains(e.what(), "rank 1") && contains(e.what(), "EFAULT")) << e.what();
  }
}

TEST(PeerMemory, AnExitedProcessIsNamedAsDead) {
  Child child;
  const pid_t pid = child.pid;
  child.stop();
  std::string why;
  EXPECT_FALSE(probePeerMemory(pid, reinterpret_cast<uintptr_t>(peerProbeWord()), &why));
  EXPECT_TRUE(contains(why, "ESRCH")) << why;
  float out[4];
  try {
    readPeerMemory(pid, out, reinterpret_cast<uintptr_t>(peerProbeWord()), sizeof out, "rank 1");
    FAIL() << "reading an exited process succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusRemoteError);
    EXPECT_TRUE(contains(e.what(), "rank 1") && contains(e.what(), "died")) << e.what();
  }
}

// A process of another user may not read ours (ptrace rules): the probe says so, which is what
// makes a communicator stage instead (ShmGroup::peerMemoryNote). Needs root to change users.
TEST(PeerMemory, AnotherUserIsRefusedWithTheReason) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  const passwd* nobody = getpwnam("nobody");
  if (nobody == nullptr) GTEST_SKIP() << "no user 'nobody'";
  const pid_t parent = getpid();
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    if (setgid(nobody->pw_gid) != 0 || setuid(nobody->pw_uid) != 0) _exit(2);
    std::string why;
    const bool ok = probePeerMemory(parent, reinterpret_cast<uintptr_t>(peerProbeWord()), &why);
    const std::string line = (ok ? "ok " : "refused ") + why;
    (void)!write(fds[1], line.data(), line.size());
    _exit(0);
  }
  close(fds[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_TRUE(got.starts_with("refused ")) << got;
  EXPECT_TRUE(contains(got, "EPERM")) << got;
}

}  // namespace
