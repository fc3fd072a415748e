// bench/compare/peer_backend.h: what mpi_bench.c needs of a peer library that is not MPI itself.
//
// mpi_bench.c compiled with COMPARE_PEER_SYSTEM="<name>" (e.g. "oneccl") keeps MPI for everything
// but the timed collectives: the launch, the ranks, the barrier before the timed loop, the maximum
// time over ranks, the sum of the wrong elements and the header. The collectives are the peer's,
// through the four functions below, which the peer's own source defines (ccl_bench.cpp for oneCCL).
// Without COMPARE_PEER_SYSTEM, mpi_bench.c calls MPI's collectives and none of these.
#ifndef CHORUS_BENCH_COMPARE_PEER_BACKEND_H
#define CHORUS_BENCH_COMPARE_PEER_BACKEND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, REDUCE, ALL_TO_ALL } Coll;

// Initialises MPI (MPI_Init or MPI_Init_thread, as the library needs) and then the library, with a
// communicator of every rank of MPI_COMM_WORLD. On failure it prints why and calls MPI_Abort.
void peerInit(int* argc, char*** argv);

// One collective on float32 with sum, completed before it returns. count as MPI's: all elements
// for ALL_REDUCE, BROADCAST and REDUCE (the sum in the root's `recv`), the per-rank block for
// REDUCE_SCATTER (elements received) and ALL_GATHER (elements sent), the block per peer for
// ALL_TO_ALL. BROADCAST works in place on `recv` (the root's data there; `send` is NULL), as
// MPI_Bcast. Returns 0, or non-zero after printing the library's error.
int peerRun(Coll coll, const float* send, float* recv, size_t count, int root);

// The text after "# Library: " in the header: the library, its version and its configuration.
void peerLibrary(char* out, size_t size);

// Releases the communicator and the library; MPI_Finalize follows.
void peerFinalize(void);

#ifdef __cplusplus
}
#endif

#endif  // CHORUS_BENCH_COMPARE_PEER_BACKEND_H
