// chorus-info: what this build of Chorus has and would do on this machine: version, CPU kernels,
// transports, shared-memory space, configuration, the algorithm registry, the decisions for a
// communicator of -n ranks at a range of sizes, and the memory such a communicator allocates.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "algorithms/algorithm.hpp"
#include "chorus/chorus.hpp"
#include "core/config.hpp"
#include "core/util.hpp"
#include "kernels/cpu/reduce.hpp"
#include "transports/shm/shm_segment.hpp"

int main(int argc, char** argv) {
  CLI::App app{"chorus-info: what Chorus has and would do on this machine"};
  int ranks = 4;
  app.add_option("-n,--ranks", ranks, "ranks of the communicator to describe (as threads)")
      ->check(CLI::Range(1, 64));
  CLI11_PARSE(app, argc, argv);
  using namespace chorus;
  try {
    Config config = Config::fromEnvironment();
    std::printf("Chorus %d.%d.%d\n", CHORUS_MAJOR, CHORUS_MINOR, CHORUS_PATCH);
    std::printf("\nCPU kernels        %s\n", kernels::simdLevel());
    std::printf("\nTransports\n");
    std::printf("  shm              yes (POSIX shared memory, ranks of one host)\n");
    std::printf("  tcp, ucx, verbs  not built (multi-host transports are future work)\n");
    std::printf("  cuda             not built\n");
    std::printf("\n/dev/shm free      %s\n", formatBytes(transport::shmFreeBytes()).c_str());
    std::printf("\nConfiguration (environment, then defaults)\n");
    std::printf("  CHORUS_TIMEOUT          %lld ms\n", static_cast<long long>(config.timeout.count()));
    std::printf("  CHORUS_SHM_STAGE_BYTES  %s\n", formatBytes(config.shmStageBytes).c_str());
    std::printf("  CHORUS_SHM_FIFO_BYTES   %s\n", formatBytes(config.shmFifoBytes).c_str());
    std::printf("  CHORUS_CHECK            %d\n", config.checkCalls ? 1 : 0);
    std::printf("  CHORUS_ALGO             %s\n",
                config.algo.empty() ? "(built-in choice)" : config.algo.c_str());
    std::printf("\nAlgorithms\n");
    for (const algo::Algorithm& a : algo::registry()) {
      std::printf("  %-14s %-9s %s%s\n", opKindName(a.kind), a.name, a.description,
                  a.needsSharedMemory ? " [shm]" : "");
    }
    auto rules = algo::parseRules(config.algo);
    std::printf("\nDecisions for %d ranks on one host (bytes per rank -> algorithm)\n", ranks);
    const OpKind kinds[] = {OpKind::AllReduce, OpKind::ReduceScatter, OpKind::AllGather,
                            OpKind::Broadcast, OpKind::Reduce,        OpKind::AllToAll};
    const size_t sizes[] = {8, 4096, size_t{1} << 20, size_t{64} << 20};
    std::printf("  %-14s", "");
    for (size_t s : sizes) std::printf(" %10s", formatBytes(s).c_str());
    std::printf("\n");
    for (OpKind k : kinds) {
      std::printf("  %-14s", opKindName(k));
      for (size_t s : sizes) {
        Op op;
        op.kind = k;
        op.type = DataType::Uint8;
        op.count = s;
        std::printf(" %10s", algo::select(op, ranks, ranks > 1, rules).name);
      }
      std::printf("\n");
    }
    auto comms = Communicator::createLocal(ranks, config);
    std::printf("\nMemory of one communicator of %d ranks: %s per rank (shared segment)\n", ranks,
                formatBytes(comms[0].memoryBytes()).c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "chorus-info: %s\n", e.what());
    return 2;
  }
  return 0;
}
