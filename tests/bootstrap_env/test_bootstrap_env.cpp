// Joining a job from launcher environment variables (chorusCommInitFromEnv and
// Communicator::fromEnvironment), with real processes: chorusrun, torchrun-style, Open MPI-style and
// Slurm-style variables with MASTER_ADDR/MASTER_PORT, a file store, and no variables at all.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "spawn.hpp"

#ifndef ENV_RANK_PROGRAM
#error "ENV_RANK_PROGRAM must name the env_rank_program binary"
#endif
#ifndef CHORUSRUN_PROGRAM
#error "CHORUSRUN_PROGRAM must name the chorusrun binary"
#endif

using namespace chorus::spawntest;
using namespace std::chrono_literals;

namespace {

constexpr auto kJobTimeout = 60s;

class BootstrapEnv : public ::testing::Test {
 protected:
  void SetUp() override { shmBefore_ = chorusShmFiles(); }
  void TearDown() override {
    auto leaked = leakedShmFiles(shmBefore_);
    for (const auto& name : leaked) ADD_FAILURE() << "/dev/shm/" << name << " left behind";
  }

  // Environment of every rank: the basics plus a short Chorus timeout.
  static Env rankEnv() {
    Env env = baseEnv();
    env["CHORUS_TIMEOUT"] = "20";
    return env;
  }

  // Starts `n` ranks of env_rank_program, rank r with rankEnv() + vars(r); all must print
  // "ok rank r of n" and exit 0.
  template <typename Vars>
  void runRanks(int n, Vars&& vars, const std::string& api = "c") {
    TempDir out("bootstrap-out");
    std::vector<Process> procs;
    for (int r = 0; r < n; ++r) {
      Env env = rankEnv();
      for (const auto& [k, v] : vars(r)) env[k] = v;
      procs.push_back(
          spawn({ENV_RANK_PROGRAM, api, std::to_string(n)}, env, out.path(), "rank" + std::to_string(r)));
    }
    EXPECT_TRUE(waitAll(procs, kJobTimeout)) << "ranks still running after " << kJobTimeout.count() << " s";
    for (int r = 0; r < n; ++r) {
      const Process& p = procs[static_cast<size_t>(r)];
      EXPECT_TRUE(p.exitedWith(0)) << "rank " << r << ": " << p.describe();
      EXPECT_EQ(p.out(), "ok rank " + std::to_string(r) + " of " + std::to_string(n) + "\n") << p.describe();
    }
  }

  // Starts one process with rankEnv() + vars and returns it finished.
  Process runOne(const Env& vars, const TempDir& out, const std::string& expectedSize = "0") {
    Env env = rankEnv();
    for (const auto& [k, v] : vars) env[k] = v;
    Process p = spawn({ENV_RANK_PROGRAM, "c", expectedSize}, env, out.path(), "single");
    EXPECT_TRUE(waitFor(p, std::chrono::steady_clock::now() + kJobTimeout)) << "still running";
    return p;
  }

  std::set<std::string> shmBefore_;
};

// (a) chorusrun sets CHORUS_RANK / CHORUS_WORLD_SIZE / CHORUS_STORE_ADDR for 4 ranks.
TEST_F(BootstrapEnv, ChorusrunFourRanks) {
  TempDir out("bootstrap-out");
  std::vector<Process> procs;
  procs.push_back(spawn({CHORUSRUN_PROGRAM, "--timeout", "60", "-n", "4", ENV_RANK_PROGRAM, "c", "4"},
                        rankEnv(), out.path(), "chorusrun"));
  ASSERT_TRUE(waitAll(procs, kJobTimeout + 10s));
  const Process& p = procs[0];
  EXPECT_TRUE(p.exitedWith(0)) << p.describe();
  const std::string text = p.out();
  for (int r = 0; r < 4; ++r) {
    std::string line = "[" + std::to_string(r) + "] ok rank " + std::to_string(r) + " of 4\n";
    EXPECT_NE(text.find(line), std::string::npos) << "missing '" << line << "' in\n" << p.describe();
  }
}

// (a') the same through the C++ entry point, Communicator::fromEnvironment.
TEST_F(BootstrapEnv, ChorusrunThreeRanksCppApi) {
  TempDir out("bootstrap-out");
  std::vector<Process> procs;
  procs.push_back(spawn({CHORUSRUN_PROGRAM, "--timeout", "60", "-n", "3", ENV_RANK_PROGRAM, "cpp", "3"},
                        rankEnv(), out.path(), "chorusrun"));
  ASSERT_TRUE(waitAll(procs, kJobTimeout + 10s));
  EXPECT_TRUE(procs[0].exitedWith(0)) << procs[0].describe();
  for (int r = 0; r < 3; ++r) {
    std::string line = "[" + std::to_string(r) + "] ok rank " + std::to_string(r) + " of 3\n";
    EXPECT_NE(procs[0].out().find(line), std::string::npos) << procs[0].describe();
  }
}

// (b) torchrun-style variables only; rank 0 serves the store on MASTER_PORT.
TEST_F(BootstrapEnv, TorchrunVariablesWithoutChorusrun) {
  const std::string port = std::to_string(freePort());
  runRanks(3, [&](int r) {
    return Env{{"RANK", std::to_string(r)}, {"WORLD_SIZE", "3"},          {"LOCAL_RANK", std::to_string(r)},
               {"LOCAL_WORLD_SIZE", "3"},   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}};
  });
}

// (b') the same through Communicator::fromEnvironment.
TEST_F(BootstrapEnv, TorchrunVariablesCppApi) {
  const std::string port = std::to_string(freePort());
  runRanks(
      2,
      [&](int r) {
        return Env{{"RANK", std::to_string(r)},
                   {"WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", port}};
      },
      "cpp");
}

// (c) Open MPI's variables with MASTER_ADDR/MASTER_PORT.
TEST_F(BootstrapEnv, OpenMpiVariables) {
  const std::string port = std::to_string(freePort());
  runRanks(3, [&](int r) {
    return Env{{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
               {"OMPI_COMM_WORLD_SIZE", "3"},
               {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)},
               {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", port}};
  });
}

// Slurm's variables, same rendezvous.
TEST_F(BootstrapEnv, SlurmVariables) {
  const std::string port = std::to_string(freePort());
  runRanks(2, [&](int r) {
    return Env{{"SLURM_PROCID", std::to_string(r)},
               {"SLURM_NTASKS", "2"},
               {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", port}};
  });
}

// (d) a file store in a shared directory instead of a TCP store.
TEST_F(BootstrapEnv, FileStore) {
  TempDir store("bootstrap-store");
  runRanks(3, [&](int r) {
    return Env{
        {"CHORUS_RANK", std::to_string(r)}, {"CHORUS_WORLD_SIZE", "3"}, {"CHORUS_STORE_FILE", store.path()}};
  });
}

// (d') CHORUS_STORE_FILE also serves torchrun-style ranks (no MASTER_ADDR needed).
TEST_F(BootstrapEnv, FileStoreWithTorchrunRanks) {
  TempDir store("bootstrap-store");
  runRanks(2, [&](int r) {
    return Env{{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"CHORUS_STORE_FILE", store.path()}};
  });
}

// (e) no launcher variables: a communicator of one rank.
TEST_F(BootstrapEnv, NoVariablesGivesOneRank) {
  TempDir out("bootstrap-out");
  Process p = runOne({}, out, "1");
  EXPECT_TRUE(p.exitedWith(0)) << p.describe();
  EXPECT_EQ(p.out(), "ok rank 0 of 1\n") << p.describe();
}

// A rank variable without its size variable is not a launcher: still one rank.
TEST_F(BootstrapEnv, RankWithoutSizeIsIgnored) {
  TempDir out("bootstrap-out");
  Process p = runOne({{"RANK", "3"}}, out, "1");
  EXPECT_TRUE(p.exitedWith(0)) << p.describe();
  EXPECT_EQ(p.out(), "ok rank 0 of 1\n") << p.describe();
}

// Malformed variables fail at once with a message naming the variable.
TEST_F(BootstrapEnv, MalformedVariableIsNamed) {
  TempDir out("bootstrap-out");
  Process p =
      runOne({{"RANK", "one"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}}, out);
  EXPECT_TRUE(p.exitedWith(2)) << p.describe();
  EXPECT_NE(p.err().find("RANK='one'"), std::string::npos) << p.describe();

  p = runOne({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}}, out);
  EXPECT_TRUE(p.exitedWith(2)) << p.describe();
  EXPECT_NE(p.err().find("RANK='2'"), std::string::npos) << p.describe();

  p = runOne({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "70000"}},
             out);
  EXPECT_TRUE(p.exitedWith(2)) << p.describe();
  EXPECT_NE(p.err().find("MASTER_PORT"), std::string::npos) << p.describe();

  p = runOne({{"CHORUS_RANK", "0"}, {"CHORUS_WORLD_SIZE", "2"}, {"CHORUS_STORE_ADDR", "no-port"}}, out);
  EXPECT_TRUE(p.exitedWith(2)) << p.describe();
  EXPECT_NE(p.err().find("CHORUS_STORE_ADDR"), std::string::npos) << p.describe();
}

// Rank variables without any store say which variables would provide one.
TEST_F(BootstrapEnv, MissingStoreIsExplained) {
  TempDir out("bootstrap-out");
  Process p = runOne({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, out);
  EXPECT_TRUE(p.exitedWith(2)) << p.describe();
  for (const char* word : {"OMPI_COMM_WORLD_RANK", "MASTER_ADDR", "CHORUS_STORE_ADDR"}) {
    EXPECT_NE(p.err().find(word), std::string::npos) << word << "\n" << p.describe();
  }
}

}  // namespace
