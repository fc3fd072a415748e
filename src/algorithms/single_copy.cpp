// Where reading a peer's ordinary buffer in place beats staging it. Staging costs two copies per
// byte (into the sender's staging area, out into the receiver's buffer), but both run at memcpy
// speed in cache, on both cores at once, chunk after chunk. Cross-memory attach (process_vm_readv)
// costs one copy, but a system call, page pinning, a kernel copy at 35-80% of memcpy's speed (one
// thread here: 63% for 1 MiB, 76% for 16 MiB, 35% for 256 MiB), plain stores where staging
// streams large outputs, and one synchronisation of every rank before any data moves.
//
// Measured with chorus-perf on the 2-core Xeon VM, 2 ranks, float32, CHORUS_CMA=0 against forced
// single copy (docs/performance.md, "Single copy", has the table):
//   all_gather: wins from 16 KiB blocks (1.3x at 32 KiB total, 1.8x at 256 KiB, 1.35x at 2 MiB,
//               1.3x at 16 MiB), even at 32 MiB, loses from 48 MiB (no streaming stores).
//   broadcast:  out of place wins from 64 KiB (1.9x) to 16 MiB (1.5x); but with the root in place
//               (torch's broadcast) staging is a pipelined single copy already, and from 1 MiB it
//               wins (1 MiB: 63 against 94 us): the buffer exchange is a barrier, which stops a
//               root running a chunk ahead into the next call. Only the root knows it is in place,
//               and learning it costs that barrier, so broadcast reads in place below 1 MiB only.
//   all_to_all: even at 32 KiB blocks, wins from 128 KiB blocks (2.1x at 256 KiB, 1.4x at 16
//               MiB, 1.2x at 64 MiB); not when a rank works in place (the algorithm checks).
//   4 ranks on 2 cores: single copy loses everywhere (1.1-2x): ranks waiting for each other at the
//               buffer exchange share cores. The communicator offers no in-place reads then.
#include "algorithms/common.hpp"

namespace chorus::algo {

bool singleCopyPays(OpKind kind, size_t messageBytes, size_t outputBytes) {
  const EnvConfig& env = envConfig();
  if (!env.cma) return false;
  const bool hasPath = kind == OpKind::AllGather || kind == OpKind::Broadcast || kind == OpKind::AllToAll;
  if (env.cmaMinBytes) return hasPath && messageBytes >= env.cmaMinBytes;
  constexpr size_t K = 1024, M = K * K;
  switch (kind) {
    case OpKind::AllGather:
      return messageBytes >= 16 * K && outputBytes <= 32 * M;
    case OpKind::Broadcast:
      return messageBytes >= 64 * K && outputBytes < 1 * M;
    case OpKind::AllToAll:
      return messageBytes >= 128 * K;
    default:
      return false;
  }
}

}  // namespace chorus::algo
