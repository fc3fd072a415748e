// The staging size measured on the machine (topology/stage_probe): the choice between the two
// sizes, the probe itself, and the cache file it is kept in.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "topology/stage_probe.hpp"

using namespace chorus::topo;

namespace {

constexpr size_t K = 1024;

StageProbeResult result(double ratio, bool ok = true) {
  StageProbeResult r;
  r.small = 512 * K;
  r.large = 1024 * K;
  r.ratio = ratio;
  r.ok = ok;
  return r;
}

// A fresh directory under the test's temporary directory, removed at the end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() / ("chorus-stage-probe-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST(StageProbe, TheLargerSizeOnlyWhereItWinsByTheMargin) {
  EXPECT_EQ(chooseStageBytes(result(0.5)), 1024 * K);
  EXPECT_EQ(chooseStageBytes(result(1.0 - kStageProbeMargin)), 1024 * K);
  EXPECT_EQ(chooseStageBytes(result(0.95)), 512 * K);  // within the margin: the rule's size
  EXPECT_EQ(chooseStageBytes(result(1.4)), 512 * K);
  EXPECT_EQ(chooseStageBytes(result(0.5, false)), 512 * K);  // a failed probe
  EXPECT_EQ(chooseStageBytes(result(0.0)), 512 * K);         // no figure
}

// Both sizes timed over the rounds asked for; the verdict is one of the two.
TEST(StageProbe, TimesBothSizes) {
  const StageProbeResult r = probeStageSizes(256 * K, 512 * K, 1024 * K, 3, std::chrono::seconds(30));
  ASSERT_TRUE(r.ok) << r.failure;
  EXPECT_EQ(r.rounds, 3);
  EXPECT_GT(r.smallUs, 0.0);
  EXPECT_GT(r.largeUs, 0.0);
  EXPECT_GT(r.ratio, 0.0);
  const size_t chosen = chooseStageBytes(r);
  EXPECT_TRUE(chosen == 256 * K || chosen == 512 * K) << chosen;
}

// The key names the CPU and the caches it was derived from.
TEST(StageProbe, TheMachineKeyNamesTheCaches) {
  CacheThresholds t;
  t.l2Bytes = 1 << 20;
  t.l3Bytes = 32 << 20;
  const std::string key = machineKey(t);
  EXPECT_NE(key.find("L2 1048576; L3 33554432; CPUs "), std::string::npos) << key;
  EXPECT_EQ(key.find('\n'), std::string::npos) << key;
}

TEST(StageCache, ReadsWhatWasWrittenForTheSameMachineOnly) {
  TempDir dir;
  const std::string file = (dir.path / "machine-probe").string();
  EXPECT_FALSE(readCachedStage(file, "cpu A").has_value());  // no file yet
  std::string why;
  ASSERT_TRUE(writeCachedStage(file, "cpu A", 1024 * K, "a note", &why)) << why;
  EXPECT_EQ(readCachedStage(file, "cpu A"), std::optional<size_t>(1024 * K));
  EXPECT_FALSE(readCachedStage(file, "cpu B").has_value());  // another machine's figure
  // No temporary file is left behind.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
}

TEST(StageCache, AMalformedFileReadsAsNoFigure) {
  TempDir dir;
  const std::string file = (dir.path / "machine-probe").string();
  for (const char* value :
       {"12x", "4096", "2147483648", "1000001", ""}) {  // junk, too small, too large, unaligned
    std::ofstream(file) << "key cpu A\nshm_stage_bytes " << value << "\n";
    EXPECT_FALSE(readCachedStage(file, "cpu A").has_value()) << value;
  }
  std::ofstream(file) << "shm_stage_bytes 1048576\n";  // no key
  EXPECT_FALSE(readCachedStage(file, "cpu A").has_value());
}

TEST(StageCache, AnUnwritableDirectoryIsReported) {
  TempDir dir;
  const std::string file = (dir.path / "missing" / "machine-probe").string();
  std::string why;
  EXPECT_FALSE(writeCachedStage(file, "cpu A", 1024 * K, "a note", &why));
  EXPECT_NE(why.find("cannot"), std::string::npos) << why;
}
