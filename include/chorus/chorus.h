/*
 * Chorus C API: collective communication over host and CUDA device memory.
 *
 * NCCL-shaped: the same call shapes and argument order as nccl.h with the prefix `chorus`.
 * Every call returns a chorusResult_t; on failure chorusGetLastError() (per thread) and
 * chorusGetLastError(comm)-style per-communicator text say what went wrong and where
 * (which rank, which peer, which call).
 *
 * Host buffers: pass a NULL stream; the call returns when the operation is complete
 * (or, between chorusGroupStart and chorusGroupEnd, when the group completes).
 *
 * Device buffers (builds with CUDA; docs/gpu.md): pass a cudaStream_t (cudaStreamPerThread for a
 * default stream: NULL always means host buffers here). The call is enqueued on the stream and
 * returns, as with NCCL; calls on one communicator run in call order, even on different streams;
 * collectives and send/receive between the ranks of one host run as kernels and can be captured
 * in a CUDA graph (in a group, its sends and receives run as one kernel when the group ends).
 * Operations staged through host memory (other hosts, the barrier) are enqueued too, but cannot
 * be captured, and in a group they run when the group ends. A kernel that waits past the timeout
 * for a peer, or is stopped by chorusCommAbort, reports it through chorusCommGetAsyncError. Every
 * rank makes the same calls with the same kind of memory.
 *
 * This header compiles as C99 and as C++.
 */
#ifndef CHORUS_CHORUS_H_
#define CHORUS_CHORUS_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define CHORUS_API
#else
#define CHORUS_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define CHORUS_MAJOR 0
#define CHORUS_MINOR 1
#define CHORUS_PATCH 0
/** Version as one integer: major*10000 + minor*100 + patch. */
#define CHORUS_VERSION_CODE (CHORUS_MAJOR * 10000 + CHORUS_MINOR * 100 + CHORUS_PATCH)

/** Result codes. Values 0..7 match NCCL's ncclResult_t. */
typedef enum {
  chorusSuccess = 0,
  chorusUnhandledCudaError = 1,
  chorusSystemError = 2,     /**< an OS call failed (shm, sockets, memory); message has errno text */
  chorusInternalError = 3,   /**< a bug in Chorus */
  chorusInvalidArgument = 4, /**< bad pointer, count, dtype, op, root or peer */
  chorusInvalidUsage = 5,    /**< wrong call sequence: destroyed communicator, unbalanced group */
  chorusRemoteError = 6,     /**< a peer failed, died or aborted */
  chorusInProgress = 7,      /**< asynchronous operation not yet complete */
  chorusTimeout = 8,         /**< a wait passed its deadline (CHORUS_TIMEOUT); message names the ranks */
  chorusNumResults = 9
} chorusResult_t;

/** Element types. fp16/bf16 reductions accumulate in fp32. */
typedef enum {
  chorusInt8 = 0,
  chorusChar = 0,
  chorusUint8 = 1,
  chorusInt32 = 2,
  chorusInt = 2,
  chorusUint32 = 3,
  chorusInt64 = 4,
  chorusUint64 = 5,
  chorusFloat16 = 6,
  chorusHalf = 6,
  chorusFloat32 = 7,
  chorusFloat = 7,
  chorusFloat64 = 8,
  chorusDouble = 8,
  chorusBfloat16 = 9,
  chorusNumTypes = 10
} chorusDataType_t;

/** Reduction operations. Avg is the sum divided by the number of ranks (integers: truncated). */
typedef enum {
  chorusSum = 0,
  chorusProd = 1,
  chorusMax = 2,
  chorusMin = 3,
  chorusAvg = 4,
  chorusNumOps = 5
} chorusRedOp_t;

/** Opaque communicator handle. Handles stay recognisable after destroy: using one returns
 *  chorusInvalidUsage instead of touching freed memory. */
typedef struct chorusComm* chorusComm_t;

#define CHORUS_UNIQUE_ID_BYTES 128
/** Rendezvous token made by chorusGetUniqueId on one rank and passed to all others. */
typedef struct {
  char internal[CHORUS_UNIQUE_ID_BYTES];
} chorusUniqueId;

/** chorusCommSplit color meaning "this rank joins no new communicator". */
#define CHORUS_SPLIT_NOCOLOR (-1)

/** Library version as CHORUS_VERSION_CODE. */
CHORUS_API chorusResult_t chorusGetVersion(int* version);

/** Allocates `size` (> 0) bytes of host memory, page aligned and zeroed, that the other ranks on
 *  this host can read in place (ncclMemAlloc's counterpart). A collective of 64 KiB or more whose
 *  buffers come from here on every rank skips the copy through shared staging: allreduce needs its
 *  send and receive buffers there, allgather, reducescatter and broadcast only the send buffer.
 *  Any mix works; only speed differs. Free with chorusMemFree. */
CHORUS_API chorusResult_t chorusMemAlloc(void** ptr, size_t size);

/** Frees memory from chorusMemAlloc (NULL is a no-op). Peers keep a mapping of it until they
 *  evict it, so the pages return to the system once those go too. */
CHORUS_API chorusResult_t chorusMemFree(void* ptr);

/** Static text for a result code (never NULL). */
CHORUS_API const char* chorusGetErrorString(chorusResult_t result);

/** Text of the last error: of `comm` if non-NULL and valid, else of the calling thread.
 *  Empty string when there was none. The pointer is valid until the next Chorus call on this thread. */
CHORUS_API const char* chorusGetLastError(chorusComm_t comm);

/** Makes a rendezvous id. The calling process serves the bootstrap store for it until exit
 *  on an ephemeral port of CHORUS_BOOTSTRAP_ADDR if set, else of 127.0.0.1 (then only ranks on this
 *  host can join: set CHORUS_BOOTSTRAP_ADDR to an address the other hosts reach). */
CHORUS_API chorusResult_t chorusGetUniqueId(chorusUniqueId* uniqueId);

/** Joins communicator `uniqueId` as `rank` of `nranks`. Collective over all ranks. */
CHORUS_API chorusResult_t chorusCommInitRank(chorusComm_t* comm, int nranks, chorusUniqueId uniqueId,
                                             int rank);

/** Creates `ndev` communicators in this process, one rank per thread of the caller's choosing
 *  (ranks 0..ndev-1). `devlist` NULL: host buffers (device calls then use the calling thread's
 *  device). Otherwise rank i's device calls run on CUDA device devlist[i], set up now, so that one
 *  thread may drive every rank in a group (builds without CUDA refuse a devlist). */
CHORUS_API chorusResult_t chorusCommInitAll(chorusComm_t* comms, int ndev, const int* devlist);

/** Joins the job described by the environment: CHORUS_RANK/CHORUS_WORLD_SIZE/CHORUS_STORE_ADDR
 *  (set by chorusrun), or torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or Slurm's
 *  SLURM_PROCID/SLURM_NTASKS, or Open MPI's OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE
 *  (the latter two with MASTER_ADDR/MASTER_PORT or CHORUS_STORE_ADDR). See docs/bootstrap.md. */
CHORUS_API chorusResult_t chorusCommInitFromEnv(chorusComm_t* comm);

/** Splits `comm` by `color` (ranks with equal color form one communicator, ordered by `key`,
 *  then by parent rank). Collective over `comm`. color CHORUS_SPLIT_NOCOLOR gives *newcomm = NULL. */
CHORUS_API chorusResult_t chorusCommSplit(chorusComm_t comm, int color, int key, chorusComm_t* newcomm);

/** Forms a new communicator of the ranks of `comm` not in excludeRanks[0..excludeCount), keeping
 *  their order (ncclCommShrink without flags). Called by every surviving rank with the same list;
 *  works on a communicator broken by a failed or killed rank (it rendezvous through the bootstrap
 *  store, not through the dead ranks), so survivors can go on. The store must outlive the failure
 *  (chorusrun's, a TCP or file store, not one hosted by an excluded rank). A rank that is itself
 *  in the list gets chorusInvalidArgument. */
CHORUS_API chorusResult_t chorusCommShrink(chorusComm_t comm, const int* excludeRanks, int excludeCount,
                                           chorusComm_t* newcomm);

/** Frees the communicator once its pending operations are finished. Not collective. */
CHORUS_API chorusResult_t chorusCommDestroy(chorusComm_t comm);

/** Stops every pending operation on `comm` (they fail with chorusRemoteError), tells the peers,
 *  and frees the communicator. Returns without waiting for peers. */
CHORUS_API chorusResult_t chorusCommAbort(chorusComm_t comm);

/** Deadline, in seconds, for each operation this rank issues on `comm` from now on, instead of
 *  CHORUS_TIMEOUT; 0 restores that. A call that passes it fails with chorusTimeout naming the ranks
 *  that have not arrived. Negative, NaN or over 1e9 seconds: chorusInvalidArgument. */
CHORUS_API chorusResult_t chorusCommSetTimeout(chorusComm_t comm, double seconds);

/** Sticky error state: chorusSuccess, or the error that broke the communicator. */
CHORUS_API chorusResult_t chorusCommGetAsyncError(chorusComm_t comm, chorusResult_t* asyncError);

CHORUS_API chorusResult_t chorusCommCount(const chorusComm_t comm, int* count);
CHORUS_API chorusResult_t chorusCommUserRank(const chorusComm_t comm, int* rank);
/** The CUDA device of the communicator's device calls: the one its first device call (or
 *  chorusCommInitAll's devlist) bound it to, else the calling thread's current device; -1 where
 *  no CUDA device is usable (or in a build without CUDA). */
CHORUS_API chorusResult_t chorusCommCuDevice(const chorusComm_t comm, int* device);

/** Bytes of memory the communicator holds: shared-memory segments, network buffers and scratch
 *  (what chorus-info reports as memory per rank). */
CHORUS_API chorusResult_t chorusCommMemoryBytes(const chorusComm_t comm, size_t* bytes);

/** The ranks of `comm` on this host: how many (*count) and this rank's index among them (*index),
 *  ranks of a host numbered in rank order. */
CHORUS_API chorusResult_t chorusCommLocalRanks(const chorusComm_t comm, int* count, int* index);

/** Stops every pending operation on `comm` (they fail with chorusRemoteError) and tells the peers,
 *  like chorusCommAbort, but keeps the handle: later operations fail at once, while
 *  chorusCommShrink (with no ranks excluded, or the failed ones) still forms a working
 *  communicator from it. Free it with chorusCommDestroy. Not collective. */
CHORUS_API chorusResult_t chorusCommRevoke(chorusComm_t comm);

/** The effective value of the setting `name` (a CHORUS_* variable of docs/configuration.md, e.g.
 *  "CHORUS_TIMEOUT") as text, after parsing: the default where the variable is unset (a malformed
 *  value reads as the default too; creating a communicator then fails naming it). *value stays valid until
 * the next call on this thread. Unknown name: chorusInvalidArgument. */
CHORUS_API chorusResult_t chorusConfigGet(const char* name, const char** value);

/* ---- One-sided transfers over windows (ncclPutSignal's counterpart), between the ranks of one
 * host. A window is every rank's buffer of one registration; a rank writes into a peer's buffer
 * and raises one of the peer's signals, which the peer waits for. ------------------------------ */

typedef struct chorusWindow* chorusWindow_t;
/** Signal slots per source rank: chorusPutSignal's and chorusWaitSignal's `signal` is below this. */
#define CHORUS_SIGNALS 256

/** Registers [buff, buff + size) of every rank as one window. Collective over `comm`, whose ranks
 *  must all be on this host; each rank's buffer must lie in memory from chorusMemAlloc (size may
 *  differ between ranks, 0 allowed). A rank whose buffer is not such fails every rank with a
 *  message naming it. */
CHORUS_API chorusResult_t chorusWindowRegister(chorusComm_t comm, void* buff, size_t size,
                                               chorusWindow_t* win);
/** Frees the window. Collective (a barrier first: no peer still writes into this rank's buffer). */
CHORUS_API chorusResult_t chorusWindowDeregister(chorusComm_t comm, chorusWindow_t win);
/** Rank `peer`'s buffer of the window as mapped into this process, and its size (peer may be this
 *  rank: its own buffer). Valid until the window is deregistered. */
CHORUS_API chorusResult_t chorusWindowPeerPointer(chorusWindow_t win, int peer, void** ptr, size_t* size);
/** Copies `bytes` from `src` into rank `peer`'s window buffer at `offset`, then raises signal
 *  `signal` of that peer for this rank (signal -1: none). win may be NULL when bytes is 0 (a signal
 *  alone). Returns once the data is written; the peer sees it after its chorusWaitSignal. */
CHORUS_API chorusResult_t chorusPutSignal(const void* src, size_t bytes, int peer, chorusWindow_t win,
                                          size_t offset, int signal, chorusComm_t comm);
/** Waits until rank `peer` has raised signal `signal` of this rank `count` more times than earlier
 *  waits consumed, and consumes them. Times out after the communicator's timeout, naming the peer;
 *  fails at once when the peer dies. Signals exist from the communicator's first window on. */
CHORUS_API chorusResult_t chorusWaitSignal(int peer, int signal, uint64_t count, chorusComm_t comm);

/* ---- Collectives. `stream`: NULL for host buffers, a cudaStream_t for device buffers. ------ */
/* A count of 0 checks the arguments and returns at once, without the peers (NCCL discards such
 * calls too); barrier and alltoallv always run. */

/** recvbuff[i] = op over ranks of sendbuff[i], count elements. In place when sendbuff == recvbuff. */
CHORUS_API chorusResult_t chorusAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                          chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                          void* stream);

/** sendbuff holds nranks*recvcount elements; rank r receives the reduction of block r.
 *  In place when recvbuff == sendbuff + rank*recvcount elements. */
CHORUS_API chorusResult_t chorusReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                              chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                              void* stream);

/** recvbuff (nranks*sendcount elements) gets every rank's sendbuff in rank order.
 *  In place when sendbuff == recvbuff + rank*sendcount elements. */
CHORUS_API chorusResult_t chorusAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                          chorusDataType_t datatype, chorusComm_t comm, void* stream);

/** Copies root's sendbuff to every rank's recvbuff. */
CHORUS_API chorusResult_t chorusBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                          chorusDataType_t datatype, int root, chorusComm_t comm,
                                          void* stream);

/** Reduces every rank's sendbuff into root's recvbuff (recvbuff ignored on other ranks). */
CHORUS_API chorusResult_t chorusReduce(const void* sendbuff, void* recvbuff, size_t count,
                                       chorusDataType_t datatype, chorusRedOp_t op, int root,
                                       chorusComm_t comm, void* stream);

/** Block j (count elements) of sendbuff goes to rank j, landing in block r of its recvbuff.
 *  In place when sendbuff == recvbuff. */
CHORUS_API chorusResult_t chorusAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                                         chorusDataType_t datatype, chorusComm_t comm, void* stream);

/** Uneven all-to-all: sendcounts[j] elements from sendbuff+sdispls[j] go to rank j and land at
 *  recvbuff+rdispls[r] there (counts and displacements in elements). Buffers must not overlap. */
CHORUS_API chorusResult_t chorusAllToAllv(const void* sendbuff, const size_t* sendcounts,
                                          const size_t* sdispls, void* recvbuff, const size_t* recvcounts,
                                          const size_t* rdispls, chorusDataType_t datatype, chorusComm_t comm,
                                          void* stream);

/** Point to point. Outside a group, Send returns once the data is handed to the transport
 *  (it may block until the peer receives when the message exceeds the transport's buffer; with a
 *  stream, the send's kernel may wait so on the device). Messages between two ranks match in
 *  order; the receiver's count must equal the sender's. */
CHORUS_API chorusResult_t chorusSend(const void* sendbuff, size_t count, chorusDataType_t datatype, int peer,
                                     chorusComm_t comm, void* stream);
CHORUS_API chorusResult_t chorusRecv(void* recvbuff, size_t count, chorusDataType_t datatype, int peer,
                                     chorusComm_t comm, void* stream);

/** Returns when every rank has entered the barrier. */
CHORUS_API chorusResult_t chorusBarrier(chorusComm_t comm, void* stream);

/** Group calls: operations issued between Start and End (nesting allowed) are started together
 *  at the outermost End, which returns when all are complete. Sends and receives in one group
 *  progress concurrently (no deadlock from ordering); operations on several communicators of one
 *  process (chorusCommInitAll) run concurrently, one per communicator. */
CHORUS_API chorusResult_t chorusGroupStart(void);
CHORUS_API chorusResult_t chorusGroupEnd(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CHORUS_CHORUS_H_ */
