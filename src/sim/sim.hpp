// chorus-sim's engine: predicts the time of a collective on H hosts x G ranks by running the
// library's own algorithm functions (src/algorithms) against a Context that moves no data but
// records, rank by rank, every list of transfers and every local copy or reduction, and then
// replaying those programs in a discrete-event simulation of the machine's links.
//
// The machine model, chunk by chunk (messages are cut into chunks of `chunkBytes`, as the pipes
// move them):
// - every rank has one engine (the thread or kernel that moves its data): each chunk it sends
//   costs bytes / sendGBps of the link's class on it, each chunk it receives bytes / recvGBps, plus
//   bytes / reduceGBps when the receive reduces; local copies and reductions run on it too;
// - a chunk arrives alphaUs after it was sent; a send bound to a receive (ring and chain pipelining)
//   sends each chunk once that many bytes have been received;
// - chunks between hosts also pass the sending host's NIC and the receiving host's NIC, each a
//   server of nicGBps shared by all the host's ranks;
// - with more ranks on a host than `cores`, every engine of the host runs cores/ranks as fast and
//   every message takes ranks/cores times as long to be noticed (the receiver must be scheduled);
// - messages larger than `cacheBytes` per rank run at outOfCacheFactor of the engine rates.
// Each server serves requests in the order they come (first come, first served).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"

namespace chorus::sim {

/// One class of link between two ranks.
struct LinkModel {
  std::string name;
  double alphaUs = 1.0;  // from a chunk leaving the sender's engine to its arrival
  double sendGBps = 5;   // sender engine rate (1e9 bytes/s)
  double recvGBps = 5;   // receiver engine rate
};

struct Machine {
  int hosts = 1;
  int ranksPerHost = 2;
  LinkModel intra{"shm", 1.0, 5, 5};
  LinkModel inter{"nic", 5.0, 50, 50};
  double nicGBps = 50;     // per host and direction, shared by its ranks (0: no limit)
  double reduceGBps = 10;  // a rank's engine reducing incoming or local data
  double copyGBps = 10;    // a rank's engine copying locally
  size_t chunkBytes = size_t{512} << 10;
  int cores = 0;  // per host; 0: at least one per rank
  /// Engines run at `outOfCacheFactor` of their rates when a rank's message exceeds `cacheBytes`
  /// (CPU ranks: the data no longer stays in the core's cache between steps). 0: no cache effect.
  size_t cacheBytes = 0;
  double outOfCacheFactor = 1.0;

  int size() const { return hosts * ranksPerHost; }
  /// The communicator topology the algorithms see: contiguous blocks of ranksPerHost ranks per host.
  topo::CommTopology topology() const;
};

/// Named machines for the command line: shm (this development VM's shared-memory pipes), nvlink
/// (8 H100-class GPUs), pcie (GPUs over PCIe), and the NICs ib400 (400 Gb/s per GPU, 8 per host),
/// ib100 and tcp10 (one per host). Returns false when a name is unknown.
bool intraPreset(const std::string& name, Machine& m);
bool interPreset(const std::string& name, Machine& m);
std::string presetNames();

struct Result {
  double us = 0;           // until the last rank finishes
  size_t transfers = 0;    // recorded messages, all ranks
  size_t chunks = 0;       // simulated chunks
  bool simulated = false;  // false: the algorithm does not run here (shared-memory algorithms)
  std::string why;         // when not simulated
};

/// Simulates `a` on `op` (count, type, root) on machine `m`. Not simulated (Result::why says so):
/// algorithms that need the shared-memory area (direct, ll, ...), and runs whose recorded schedules
/// or chunk count exceed the simulator's limits (`maxChunks`; about 40 Mi messages over all ranks).
Result simulate(const algo::Algorithm& a, const Op& op, const Machine& m,
                size_t maxChunks = size_t{400} << 20);

/// Bus bandwidth in GB/s, as nccl-tests defines it, of `kind` moving `bytes` per rank in `us` on n ranks.
double busBandwidth(OpKind kind, size_t bytes, int n, double us);

}  // namespace chorus::sim
