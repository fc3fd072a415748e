// The environment reader (src/base/config.cpp): one table row per variable, parsed from a lookup
// the test controls (no setenv), with the first malformed value named; chorusConfigGet's text;
// per-communicator fields of Config over the environment; and the table against the docs.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "base/config.hpp"
#include "chorus/chorus.hpp"

using namespace chorus;

namespace {

EnvConfig readFrom(const std::map<std::string, std::string>& vars) {
  return readEnvironment([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(Config, UnsetVariablesKeepTheDefaults) {
  const EnvConfig c = readFrom({});
  const EnvConfig d;
  EXPECT_TRUE(c.parseError.empty());
  EXPECT_EQ(c.timeout, d.timeout);
  EXPECT_EQ(c.shmStageBytes, d.shmStageBytes);
  EXPECT_EQ(c.zeroCopy, d.zeroCopy);
  EXPECT_EQ(c.net, "");
}

// CHORUS_CMA: auto reads in place where cross-memory attach is fast enough (measured at set-up);
// 1 whatever its speed, with each collective's own thresholds; 0 never.
TEST(Config, CmaSettings) {
  const EnvConfig a = readFrom({{"CHORUS_CMA", "auto"}});
  EXPECT_TRUE(a.cma);
  EXPECT_FALSE(a.cmaAlways);
  EXPECT_EQ(a.cmaMinBytes, 0u);
  const EnvConfig one = readFrom({{"CHORUS_CMA", "1"}});
  EXPECT_TRUE(one.cma);
  EXPECT_TRUE(one.cmaAlways);
  EXPECT_EQ(one.cmaMinBytes, 0u);
  const EnvConfig off = readFrom({{"CHORUS_CMA", "0"}});
  EXPECT_FALSE(off.cma);
  EXPECT_FALSE(off.cmaAlways);
  const EnvConfig unset = readFrom({});
  EXPECT_TRUE(unset.cma);
  EXPECT_FALSE(unset.cmaAlways);
}

TEST(Config, EveryKindParses) {
  const EnvConfig c = readFrom({{"CHORUS_DEBUG", "info"},
                                {"CHORUS_DEBUG_SUBSYS", "^TOPO"},
                                {"CHORUS_TIMEOUT", "2.5"},
                                {"CHORUS_SHM_STAGE_BYTES", "4M"},
                                {"CHORUS_NT_STORE_BYTES", "inf"},
                                {"CHORUS_ZERO_COPY", "0"},
                                {"CHORUS_CMA", "64K"},
                                {"CHORUS_WAIT", "yield"},
                                {"CHORUS_VIRTUAL_HOSTS", "3"},
                                {"CHORUS_NET", "UCX,tcp"},
                                {"CHORUS_SOCKET_FAMILY", "6"},
                                {"CHORUS_SOCKET_NSTREAMS", "4"},
                                {"CHORUS_CUDA_SHARED_GPU", "ipc"},
                                {"CHORUS_FLIGHT_RECORDER_ENTRIES", "0"},
                                {"CHORUS_CPU_KERNELS", "portable"},
                                {"CHORUS_NT_COPY_PAGES", "8"},
                                {"CHORUS_TOPO_FILE", "/tmp/t.xml"},
                                {"CHORUS_STAGE_PROBE", "0"},
                                {"CHORUS_STAGE_WRITE", "streaming"},
                                {"CHORUS_STAGE_COPY", "plain"},
                                {"CHORUS_CACHE_DIR", "/tmp/chorus-cache"}});
  EXPECT_TRUE(c.parseError.empty()) << c.parseError;
  EXPECT_EQ(c.logLevel, LogLevel::Info);
  EXPECT_EQ(c.timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(c.shmStageBytes, size_t{4} << 20);
  EXPECT_EQ(c.ntStoreBytes, SIZE_MAX);
  EXPECT_FALSE(c.zeroCopy);
  EXPECT_TRUE(c.cma);
  EXPECT_TRUE(c.cmaAlways);  // a size reads in place whatever cross-memory attach's speed
  EXPECT_EQ(c.cmaMinBytes, size_t{64} << 10);
  EXPECT_EQ(c.waitPolicy, "yield");
  EXPECT_EQ(c.stageWrite, "streaming");
  EXPECT_EQ(c.stageCopy, "plain");
  EXPECT_EQ(c.virtualHosts, 3);
  EXPECT_EQ(c.net, "ucx,tcp");
  EXPECT_EQ(c.socketFamily, "6");
  EXPECT_EQ(c.socketStreams, 4);
  EXPECT_TRUE(c.cudaSharedGpuIpc);
  EXPECT_EQ(c.flightRecorderEntries, 0u);
  EXPECT_EQ(c.cpuKernels, "portable");
  EXPECT_EQ(c.ntCopyPages, 8);
  EXPECT_EQ(c.topoFile, "/tmp/t.xml");
  EXPECT_FALSE(c.stageProbe);
  EXPECT_EQ(c.cacheDir, "/tmp/chorus-cache");
  EXPECT_TRUE(readFrom({}).stageProbe);
}

// A malformed or out-of-range value is named with what is wanted, the default is kept, and the
// first problem is the one reported.
TEST(Config, MalformedValuesAreNamedWithWhatIsWrong) {
  struct Case {
    const char* name;
    const char* value;
    const char* message;
  };
  const Case cases[] = {
      {"CHORUS_DEBUG", "LOUD", "CHORUS_DEBUG='LOUD' is not one of NONE, WARN, INFO, TRACE"},
      {"CHORUS_TIMEOUT", "-1", "CHORUS_TIMEOUT='-1' is not a positive number of seconds"},
      {"CHORUS_TIMEOUT", "3s", "CHORUS_TIMEOUT='3s' is not a positive number of seconds"},
      {"CHORUS_SHM_STAGE_BYTES", "1k", "CHORUS_SHM_STAGE_BYTES='1k' must be a size between 64K and 1G"},
      {"CHORUS_SHM_FIFO_BYTES", "lots", "CHORUS_SHM_FIFO_BYTES='lots' must be a size between 4K and 1G"},
      {"CHORUS_CHECK", "yes", "CHORUS_CHECK='yes' must be 0 or 1"},
      {"CHORUS_STAGE_PROBE", "on", "CHORUS_STAGE_PROBE='on' must be 0 or 1"},
      {"CHORUS_CACHE_DIR", "cache", "CHORUS_CACHE_DIR='cache' must be an absolute path"},
      {"CHORUS_WAIT", "busy", "CHORUS_WAIT='busy' must be auto, spin, adaptive, yield or sleep"},
      {"CHORUS_CMA", "often", "CHORUS_CMA='often' must be 0, 1, auto or a size such as 256K"},
      {"CHORUS_VIRTUAL_HOSTS", "-2", "CHORUS_VIRTUAL_HOSTS='-2' must be a number of hosts (0 = off)"},
      {"CHORUS_NET", "tcp,", "CHORUS_NET='tcp,' is not a comma list of tcp, ucx, ib"},
      {"CHORUS_NET", "rdma", "CHORUS_NET='rdma' is not a comma list of tcp, ucx, ib"},
      {"CHORUS_SOCKET_NSTREAMS", "17", "CHORUS_SOCKET_NSTREAMS='17' must be a number from 1 to 16"},
      {"CHORUS_IB_PORT", "0", "CHORUS_IB_PORT='0' must be a number from 1 to 255"},
      {"CHORUS_CUDA_LL_BYTES", "2M",
       "CHORUS_CUDA_LL_BYTES='2M' must be a size of at most 1M (0 turns LL off)"},
      {"CHORUS_CPU_KERNELS", "avx9",
       "CHORUS_CPU_KERNELS='avx9' must be portable, avx2, avx512, avx512bf16 or auto"},
      {"CHORUS_NT_COPY_PAGES", "3", "CHORUS_NT_COPY_PAGES='3' must be 1, 2, 4 or 8"},
      {"CHORUS_STAGE_WRITE", "nt", "CHORUS_STAGE_WRITE='nt' must be auto, stores, memcpy or streaming"},
      {"CHORUS_STAGE_COPY", "stores", "CHORUS_STAGE_COPY='stores' must be auto, plain or streaming"},
  };
  const EnvConfig d;
  for (const Case& k : cases) {
    const EnvConfig c = readFrom({{k.name, k.value}});
    EXPECT_EQ(c.parseError, k.message);
    EXPECT_EQ(c.timeout, d.timeout) << k.name;
    EXPECT_EQ(c.shmStageBytes, d.shmStageBytes) << k.name;
    EXPECT_EQ(c.net, d.net) << k.name;
  }
  // Two problems: the first of the table's order is reported.
  EXPECT_EQ(readFrom({{"CHORUS_CHECK", "2"}, {"CHORUS_TIMEOUT", "x"}}).parseError,
            "CHORUS_TIMEOUT='x' is not a positive number of seconds");
}

TEST(Config, ConfigValueShowsEverySettingAndRefusesOthers) {
  for (const std::string& name : settingNames()) EXPECT_NO_THROW(configValue(name)) << name;
  EXPECT_EQ(configValue("CHORUS_CUDA_SHARED_GPU"), "staged");
  try {
    configValue("CHORUS_SECRET");  // read at each use, never shown
    FAIL() << "CHORUS_SECRET was shown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
  }
}

TEST(Config, LaunchVariablesMustBeListed) {
  EXPECT_NO_THROW(launchVariable("CHORUS_SECRET"));
  try {
    launchVariable("CHORUS_SOMETHING_NEW");
    FAIL() << "an unlisted variable was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInternalError);
  }
}

// Fields of Config set per communicator win over the environment; unset ones take it; bad ones are
// refused with the field named.
TEST(Config, PerCommunicatorFieldsOverTheEnvironment) {
  Config user;
  user.zeroCopy = 0;
  user.virtualHosts = 2;
  user.net = "TCP";
  const Config c = resolveConfig(user);
  EXPECT_EQ(c.zeroCopy, 0);
  EXPECT_EQ(c.virtualHosts, 2);
  EXPECT_EQ(c.net, "tcp");
  const Config unset = resolveConfig(Config{});
  EXPECT_EQ(unset.zeroCopy, envConfig().zeroCopy ? 1 : 0);
  EXPECT_EQ(unset.virtualHosts, envConfig().virtualHosts);
  Config bad;
  bad.net = "carrier-pigeon";
  try {
    resolveConfig(bad);
    FAIL() << "a bad Config::net was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("Config::net='carrier-pigeon'"), std::string::npos) << e.what();
  }
  Config tcp;
  tcp.transport = "tcp";
  EXPECT_EQ(resolveConfig(tcp).transport, "tcp");
  EXPECT_EQ(unset.transport, "");
  Config badTransport;
  badTransport.transport = "shm";
  try {
    resolveConfig(badTransport);
    FAIL() << "a bad Config::transport was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("Config::transport='shm'"), std::string::npos) << e.what();
  }
}

// docs/configuration.md's table lists exactly the variables the reader parses.
TEST(Config, DocsListEveryVariableTheReaderParses) {
  std::ifstream in(std::string(CHORUS_DOCS_DIR) + "/configuration.md");
  ASSERT_TRUE(in) << "cannot read docs/configuration.md";
  std::set<std::string> documented;
  const std::regex row(R"(^\| `(CHORUS_[A-Z0-9_]+)` \|)");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) documented.insert(m[1]);
  }
  std::set<std::string> parsed;
  for (const std::string& name : settingNames()) parsed.insert(name);
  documented.erase("CHORUS_SECRET");  // documented beside the settings, read at each use
  for (const std::string& name : parsed) EXPECT_TRUE(documented.count(name)) << name << " is not documented";
  for (const std::string& name : documented)
    EXPECT_TRUE(parsed.count(name)) << name << " is documented but not read";
}

}  // namespace
