// Rendezvous from launcher environment variables (chorusrun, torchrun, Slurm, Open MPI, MPICH).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "chorus/store.hpp"

namespace chorus {

struct EnvRendezvous {
  std::shared_ptr<Store> store;
  int rank = 0;
  int size = 1;
  std::shared_ptr<void> keepAlive;  // the store server, on the rank that hosts it
  std::string source;               // which launcher's variables were used
};

/// Reads, in order of precedence:
///  1. CHORUS_RANK, CHORUS_WORLD_SIZE with CHORUS_STORE_ADDR=host:port (a store served elsewhere,
///     e.g. by chorusrun) or CHORUS_STORE_FILE=<directory> (a file store);
///  2. RANK, WORLD_SIZE (torchrun), 3. SLURM_PROCID, SLURM_NTASKS, 4. OMPI_COMM_WORLD_RANK,
///     OMPI_COMM_WORLD_SIZE, 5. PMI_RANK, PMI_SIZE (MPICH): with CHORUS_STORE_ADDR or
///     CHORUS_STORE_FILE if set, else MASTER_ADDR/MASTER_PORT, where rank 0 serves the store (on
///     MASTER_PORT, or MASTER_PORT+1 under torchrun, whose own store holds MASTER_PORT;
///     CHORUS_STORE_PORT overrides);
///  6. nothing set: a single rank.
/// Throws chorusInvalidArgument naming a malformed or missing variable.
EnvRendezvous rendezvousFromEnvironment();

/// Splits "host:port" / "[v6]:port"; throws chorusInvalidArgument naming `what` when malformed.
std::pair<std::string, uint16_t> parseHostPort(const std::string& text, const std::string& what);

}  // namespace chorus
