// Starting test programs as separate processes with an exact environment, for tests that need
// real ranks (bootstrap from launcher variables, process death). Used by tests/bootstrap_env and
// tests/reliability.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace chorus::spawntest {

using Env = std::map<std::string, std::string>;

/// The parts of this process's environment a child needs to run at all (and sanitizer settings);
/// nothing else, so that no launcher variable leaks in from the test's own environment.
inline Env baseEnv() {
  Env env;
  for (const char* name : {"PATH", "HOME", "TMPDIR", "LD_LIBRARY_PATH", "ASAN_OPTIONS", "UBSAN_OPTIONS",
                           "LSAN_OPTIONS", "TSAN_OPTIONS"}) {
    if (const char* v = std::getenv(name)) env[name] = v;
  }
  return env;
}

/// A fresh private directory, removed by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/chorus-" + tag + "-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice for an ephemeral bind).
inline int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw std::runtime_error("bind/getsockname failed");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// One started process; stdout and stderr go to files under `dir`.
struct Process {
  pid_t pid = -1;
  std::string outPath, errPath;
  bool exited = false;
  int status = 0;  // waitpid status once exited

  std::string out() const { return readFile(outPath); }
  std::string err() const { return readFile(errPath); }
  bool exitedWith(int code) const { return exited && WIFEXITED(status) && WEXITSTATUS(status) == code; }
  bool killedBy(int sig) const { return exited && WIFSIGNALED(status) && WTERMSIG(status) == sig; }
  std::string describe() const {
    std::string s = "pid " + std::to_string(pid) + ": ";
    if (!exited)
      s += "still running";
    else if (WIFEXITED(status))
      s += "exit status " + std::to_string(WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
      s += "killed by signal " + std::to_string(WTERMSIG(status));
    return s + "\n--- stdout ---\n" + out() + "--- stderr ---\n" + err();
  }
};

/// Starts argv[0] (a path) with exactly `env`, output in `dir`/<name>.out and .err.
inline Process spawn(const std::vector<std::string>& argv, const Env& env, const std::string& dir,
                     const std::string& name) {
  Process p;
  p.outPath = dir + "/" + name + ".out";
  p.errPath = dir + "/" + name + ".err";
  std::vector<std::string> envStrings;
  for (const auto& [k, v] : env) envStrings.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (auto& e : envStrings) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int out = open(p.outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(p.errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = open("/dev/null", O_RDONLY);
    if (out < 0 || err < 0 || in < 0) _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  p.pid = pid;
  return p;
}

/// Waits for `p` until `deadline`; kills it (SIGKILL) and reaps it if it is still running then.
/// Returns whether it exited on its own.
inline bool waitFor(Process& p, std::chrono::steady_clock::time_point deadline) {
  while (!p.exited) {
    pid_t r = waitpid(p.pid, &p.status, WNOHANG);
    if (r == p.pid) {
      p.exited = true;
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(p.pid, SIGKILL);
      waitpid(p.pid, &p.status, 0);
      return false;  // p.exited stays false: it had to be killed
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

/// Waits for all, in order, sharing one deadline `timeout` from now.
inline bool waitAll(std::vector<Process>& procs, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool all = true;
  for (auto& p : procs) all = waitFor(p, deadline) && all;
  return all;
}

/// Names of /dev/shm entries starting with "chorus-" (Chorus's shared-memory segments).
inline std::set<std::string> chorusShmFiles() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, "chorus-", 7) == 0) names.insert(e->d_name);
    }
    closedir(d);
  }
  return names;
}

/// Entries of chorusShmFiles() not in `before` that are still there after `settle` (a segment of a
/// communicator being created concurrently by another test disappears within moments; a leak stays).
inline std::set<std::string> leakedShmFiles(
    const std::set<std::string>& before, std::chrono::milliseconds settle = std::chrono::milliseconds(2000)) {
  auto deadline = std::chrono::steady_clock::now() + settle;
  for (;;) {
    std::set<std::string> leaked;
    for (const auto& n : chorusShmFiles()) {
      if (!before.count(n)) leaked.insert(n);
    }
    if (leaked.empty() || std::chrono::steady_clock::now() >= deadline) return leaked;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace chorus::spawntest
