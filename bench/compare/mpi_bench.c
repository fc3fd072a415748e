// compare-openmpi / compare-mpich: MPI collectives timed exactly as chorus-perf times Chorus's, so
// that a driver can put the two side by side. One source, built with each MPI's compiler wrapper.
//
//   mpirun.openmpi --allow-run-as-root --oversubscribe -n 2 compare-openmpi <collective> [flags]
//   mpirun.mpich -n 2 compare-mpich <collective> [flags]
//
// collective: all_reduce (MPI_Allreduce), reduce_scatter (MPI_Reduce_scatter_block), all_gather
// (MPI_Allgather), broadcast (MPI_Bcast), reduce (MPI_Reduce), alltoall (MPI_Alltoall). Flags as
// chorus-perf: -b -e -i -f -n -w -c -d -o -r --json; -d float and -o sum only.
// Compiled with COMPARE_PEER_SYSTEM="<name>", the same program times another library's collectives
// (peer_backend.h; compare-oneccl, with ccl_bench.cpp) and keeps MPI for the rest: launch, ranks,
// barrier, maximum time, checks and header.
// Everything follows chorus-perf (see bench/chorus_perf.cpp):
//   size   bytes of the larger buffer (all_gather's receive, reduce_scatter's send buffer, either of
//          alltoall's), rounded down so that blocks are multiples of 4 elements; count: the per-rank
//          block for all_gather and reduce_scatter, the block per peer for alltoall, all elements
//          otherwise.
//   time   microseconds per operation: -w warm-ups, a barrier, -n timed iterations averaged, max
//          over ranks.
//   algbw  size / time (GB/s, G = 1e9); busbw = algbw * 2(n-1)/n (all_reduce), (n-1)/n (all_gather,
//          reduce_scatter, alltoall), 1 (broadcast, reduce).
//   #wrong with -c 1: wrong elements summed over ranks in one validation run.
// Only out-of-place is measured: the in-place columns print N/A (null in JSON). Broadcast is
// out-of-place as chorus-perf's: the root sends from its send buffer, the others receive into their
// receive buffer (the root's receive buffer is not written; its send buffer is what is checked).
// Exit status: 0, 1 if any result was wrong, 2 on a usage error.
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "peer_backend.h"

#if defined(COMPARE_PEER_SYSTEM)
#define SYSTEM_NAME COMPARE_PEER_SYSTEM
#elif defined(OPEN_MPI)
#define SYSTEM_NAME "openmpi"
#elif defined(MPICH)
#define SYSTEM_NAME "mpich"
#else
#define SYSTEM_NAME "mpi"
#endif
#define PROGRAM_NAME "compare-" SYSTEM_NAME

enum { kMaxBufferBytes = 1 << 30, kBlockAlign = 4, kLibraryLineMax = 512, kLibraryPartMax = 100 };

static const char* const kCollNames[] = {"all_reduce", "reduce_scatter", "all_gather",
                                         "broadcast",  "reduce",         "alltoall"};
enum { kColls = sizeof(kCollNames) / sizeof(kCollNames[0]) };
#define COLL_LIST "all_reduce, reduce_scatter, all_gather, broadcast, reduce or alltoall"

typedef struct {
  Coll coll;
  size_t minBytes;
  size_t maxBytes;
  size_t stepBytes;
  size_t stepFactor;
  int iters;
  int warmup;
  int check;
  int root;
  int json;
} Options;

typedef struct {
  size_t count;      // count argument of the call
  size_t sendElems;  // elements of the send buffer
  size_t recvElems;  // elements of the receive buffer
  size_t bytes;      // max(sendElems, recvElems) * sizeof(float)
} Shape;

typedef struct {
  double timeUs;
  double algbw;
  double busbw;
  int64_t wrong;  // -1: not checked
} HalfResult;

static int g_rank = 0;
static int g_size = 1;

// Prints a usage error on rank 0 (every rank parses the same arguments and fails alike).
static void usageError(const char* fmt, const char* arg) {
  if (g_rank != 0) return;
  fprintf(stderr, PROGRAM_NAME ": ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n");
}

// "8", "64K", "1M", "2G" (powers of 1024; lower case accepted). Returns 0 on success.
static int parseSize(const char* text, const char* flag, size_t* out) {
  if (text[0] == '-' || text[0] == '\0') {
    usageError("invalid size for %s", flag);
    return -1;
  }
  char* end = NULL;
  errno = 0;
  const unsigned long long value = strtoull(text, &end, 0);
  if (errno != 0 || end == text) {
    usageError("invalid size for %s", flag);
    return -1;
  }
  unsigned shift = 0;
  if (strcmp(end, "K") == 0 || strcmp(end, "k") == 0) {
    shift = 10;
  } else if (strcmp(end, "M") == 0 || strcmp(end, "m") == 0) {
    shift = 20;
  } else if (strcmp(end, "G") == 0 || strcmp(end, "g") == 0) {
    shift = 30;
  } else if (*end != '\0') {
    usageError("invalid size for %s", flag);
    return -1;
  }
  if (value > (~0ull >> shift)) {
    usageError("size too large for %s", flag);
    return -1;
  }
  *out = (size_t)(value << shift);
  return 0;
}

// An integer in [lo, hi]. Returns 0 on success.
static int parseInt(const char* text, const char* flag, long long lo, long long hi, long long* out) {
  char* end = NULL;
  errno = 0;
  const long long value = strtoll(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0' || value < lo || value > hi) {
    usageError("invalid value for %s", flag);
    return -1;
  }
  *out = value;
  return 0;
}

static int collReduces(Coll c) { return c == ALL_REDUCE || c == REDUCE_SCATTER || c == REDUCE; }
static int collRooted(Coll c) { return c == BROADCAST || c == REDUCE; }

static double busFactor(Coll c, int nranks) {
  const double n = nranks;
  switch (c) {
    case ALL_REDUCE:
      return 2.0 * (n - 1) / n;
    case REDUCE_SCATTER:
    case ALL_GATHER:
    case ALL_TO_ALL:
      return (n - 1) / n;
    case BROADCAST:
    case REDUCE:
      return 1.0;
  }
  return 1.0;
}

static Shape shapeFor(Coll c, size_t sizeBytes, int nranks) {
  const size_t elems = sizeBytes / sizeof(float);
  const size_t n = (size_t)nranks;
  Shape s = {0, 0, 0, 0};
  switch (c) {
    case ALL_REDUCE:
    case BROADCAST:
    case REDUCE:
      s.count = elems;
      s.sendElems = elems;
      s.recvElems = elems;
      break;
    case ALL_GATHER:
      s.count = elems / (kBlockAlign * n) * kBlockAlign;
      s.sendElems = s.count;
      s.recvElems = s.count * n;
      break;
    case REDUCE_SCATTER:
      s.count = elems / (kBlockAlign * n) * kBlockAlign;
      s.sendElems = s.count * n;
      s.recvElems = s.count;
      break;
    case ALL_TO_ALL:
      s.count = elems / (kBlockAlign * n) * kBlockAlign;
      s.sendElems = s.count * n;
      s.recvElems = s.count * n;
      break;
  }
  s.bytes = (s.sendElems > s.recvElems ? s.sendElems : s.recvElems) * sizeof(float);
  return s;
}

// ---- Validation data: small integers, exact in float, whose sums stay exact -------------------

static uint64_t mix(uint64_t rank, uint64_t index) {
  uint64_t x = index * 0x9E3779B97F4A7C15ull + (rank + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 32;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

// Inputs of reductions: 0..range-1 with range = clamp(120 / n, 1, 15) + 1 (as chorus-perf).
static uint64_t reduceRange(int nranks) {
  int k = 120 / (nranks > 1 ? nranks : 1);
  if (k < 1) k = 1;
  if (k > 15) k = 15;
  return (uint64_t)k + 1;
}

static float reduceValue(int rank, size_t index, uint64_t range) {
  return (float)(mix((uint64_t)rank, index) % range);
}

// Data moved by all_gather, broadcast and alltoall: 0..112.
static float copyValue(int rank, size_t index) { return (float)(mix((uint64_t)rank, index) % 113); }

static void prepareBuffers(const Options* o, const Shape* s, float* send, float* recv) {
  memset(recv, 0xFF, s->recvElems * sizeof(float));  // NaN: never an expected value
  if (o->coll == BROADCAST && g_rank != o->root) return;
  const uint64_t range = reduceRange(g_size);
  for (size_t i = 0; i < s->sendElems; ++i) {
    send[i] = collReduces(o->coll) ? reduceValue(g_rank, i, range) : copyValue(g_rank, i);
  }
}

static int64_t countWrong(const Options* o, const Shape* s, const float* send, const float* recv) {
  const uint64_t range = reduceRange(g_size);
  int64_t wrong = 0;
  switch (o->coll) {
    case REDUCE:
      if (g_rank != o->root) break;  // only the root's receive buffer is written
      /* fall through */
    case ALL_REDUCE:
    case REDUCE_SCATTER: {
      const size_t base = o->coll == REDUCE_SCATTER ? (size_t)g_rank * s->count : 0;
      for (size_t i = 0; i < s->recvElems; ++i) {
        float want = 0.0f;
        for (int r = 0; r < g_size; ++r) want += reduceValue(r, base + i, range);
        wrong += !(recv[i] == want);
      }
      break;
    }
    case ALL_GATHER:
      for (size_t i = 0; i < s->recvElems; ++i) {
        wrong += !(recv[i] == copyValue((int)(i / s->count), i % s->count));
      }
      break;
    case BROADCAST: {
      const float* out = g_rank == o->root ? send : recv;
      for (size_t i = 0; i < s->recvElems; ++i) wrong += !(out[i] == copyValue(o->root, i));
      break;
    }
    case ALL_TO_ALL:  // block j came from rank j's block for this rank
      for (size_t i = 0; i < s->recvElems; ++i) {
        wrong += !(recv[i] == copyValue((int)(i / s->count), (size_t)g_rank * s->count + i % s->count));
      }
      break;
  }
  return wrong;
}

// ---- Running -----------------------------------------------------------------------------------

#if defined(COMPARE_PEER_SYSTEM)
static void runColl(const Options* o, const Shape* s, float* send, float* recv) {
  const int failed = o->coll == BROADCAST
                         ? peerRun(BROADCAST, NULL, g_rank == o->root ? send : recv, s->count, o->root)
                         : peerRun(o->coll, send, recv, s->count, o->root);
  if (failed) MPI_Abort(MPI_COMM_WORLD, 2);
}
#else
static void runColl(const Options* o, const Shape* s, float* send, float* recv) {
  const int count = (int)s->count;
  switch (o->coll) {
    case ALL_REDUCE:
      MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      return;
    case REDUCE_SCATTER:
      MPI_Reduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      return;
    case ALL_GATHER:
      MPI_Allgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD);
      return;
    case BROADCAST:
      MPI_Bcast(g_rank == o->root ? send : recv, count, MPI_FLOAT, o->root, MPI_COMM_WORLD);
      return;
    case REDUCE:
      MPI_Reduce(send, recv, count, MPI_FLOAT, MPI_SUM, o->root, MPI_COMM_WORLD);
      return;
    case ALL_TO_ALL:
      MPI_Alltoall(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD);
      return;
  }
}
#endif

static double nowUs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1.0e6 + (double)ts.tv_nsec / 1.0e3;
}

static HalfResult runHalf(const Options* o, const Shape* s, float* send, float* recv) {
  HalfResult h = {0.0, 0.0, 0.0, -1};
  // The checked run's data whether or not it is checked (zeros stream faster than data on some
  // machines; chorus-perf does the same).
  prepareBuffers(o, s, send, recv);
  if (o->check) {
    runColl(o, s, send, recv);
    int64_t wrong = countWrong(o, s, send, recv);
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    h.wrong = wrong;
  }
  for (int i = 0; i < o->warmup; ++i) runColl(o, s, send, recv);
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = nowUs();
  for (int i = 0; i < o->iters; ++i) runColl(o, s, send, recv);
  double us = (nowUs() - start) / o->iters;
  MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  h.timeUs = us;
  h.algbw = us > 0 ? (double)s->bytes / us / 1.0e3 : 0.0;
  h.busbw = h.algbw * busFactor(o->coll, g_size);
  return h;
}

// ---- Output ------------------------------------------------------------------------------------

// One line naming the MPI library: the MPI standard's version, then the lines of
// MPI_Get_library_version() joined by "; " with their blanks collapsed, leaving out the long ones
// (MPICH's configure line and compiler flags).
static void mpiLibraryLine(char* out, size_t size) {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(version, &length);
  version[length < MPI_MAX_LIBRARY_VERSION_STRING ? length : MPI_MAX_LIBRARY_VERSION_STRING - 1] = '\0';
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  size_t used = (size_t)snprintf(out, size, "MPI %d.%d", major, minor);
  for (char* line = version; *line && used + 1 < size;) {
    char* next = strchr(line, '\n');
    if (next) *next = '\0';
    char collapsed[kLibraryLineMax];
    size_t len = 0;
    for (const char* c = line; *c && len + 1 < sizeof(collapsed); ++c) {
      const int blank = *c == ' ' || *c == '\t' || *c == '\r';
      if (blank && (len == 0 || collapsed[len - 1] == ' ')) continue;
      collapsed[len++] = blank ? ' ' : *c;
    }
    while (len > 0 && collapsed[len - 1] == ' ') --len;
    collapsed[len] = '\0';
    if (len > 0 && len <= kLibraryPartMax) {
      used += (size_t)snprintf(out + used, size - used, "; %s", collapsed);
    }
    if (!next) break;
    line = next + 1;
  }
}

static void printHeader(const Options* o) {
  typedef struct {
    int32_t pid;
    char host[60];
  } RankInfo;
  RankInfo mine;
  memset(&mine, 0, sizeof(mine));
  mine.pid = (int32_t)getpid();
  if (gethostname(mine.host, sizeof(mine.host) - 1) != 0) strcpy(mine.host, "unknown");
  RankInfo* all = calloc((size_t)g_size, sizeof(RankInfo));
  if (!all) MPI_Abort(MPI_COMM_WORLD, 2);
  MPI_Gather(&mine, (int)sizeof(RankInfo), MPI_BYTE, all, (int)sizeof(RankInfo), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (g_rank != 0) {
    free(all);
    return;
  }
  if (o->stepFactor > 1) {
    printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(factor)", o->minBytes, o->maxBytes,
           o->stepFactor);
  } else {
    printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(bytes)", o->minBytes, o->maxBytes,
           o->stepBytes);
  }
  printf(" warmup iters: %d iters: %d agg iters: 1 validation: %d graph: 0\n", o->warmup, o->iters, o->check);

  printf("#\n# System: %s\n", SYSTEM_NAME);
  char library[kLibraryLineMax];
#if defined(COMPARE_PEER_SYSTEM)
  peerLibrary(library, sizeof(library));
  printf("# Library: %s\n", library);
  mpiLibraryLine(library, sizeof(library));
  printf("# MPI (launch, barrier, timing, checks): %s\n", library);
#else
  mpiLibraryLine(library, sizeof(library));
  printf("# Library: %s\n", library);
#endif

  printf("#\n# Using devices\n");
  for (int r = 0; r < g_size; ++r) {
    all[r].host[sizeof(all[r].host) - 1] = '\0';
    int local = 0;  // ranks before this one on the same host: its "device"
    for (int q = 0; q < r; ++q) local += strcmp(all[q].host, all[r].host) == 0;
    printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [cpu] host memory\n", r, 0, (int)all[r].pid,
           all[r].host, local);
  }
  printf("#\n");
  printf("#%62s%-35s%s\n", "", "out-of-place", "in-place");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type",
         "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s\n", "(B)", "(elements)", "", "", "",
         "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)");
  fflush(stdout);
  free(all);
}

static void formatTime(double us, char* buf, size_t len) {
  if (us >= 10000.0) {
    snprintf(buf, len, "%7.0f", us);
  } else if (us >= 100.0) {
    snprintf(buf, len, "%7.1f", us);
  } else {
    snprintf(buf, len, "%7.2f", us);
  }
}

// A double as JSON: the shortest of %.15g..%.17g that reads back exactly, with ".0" added to whole
// numbers (as nlohmann::json writes them); null when not finite.
static void jsonDouble(double v, char* buf, size_t len) {
  if (!isfinite(v)) {
    snprintf(buf, len, "null");
    return;
  }
  for (int precision = 15; precision <= 17; ++precision) {
    snprintf(buf, len, "%.*g", precision, v);
    if (strtod(buf, NULL) == v) break;
  }
  if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", len - strlen(buf) - 1);
}

static void printRow(const Options* o, const Shape* s, const HalfResult* h) {
  const char* redop = collReduces(o->coll) ? "sum" : "none";
  const int root = collRooted(o->coll) ? o->root : -1;
  char time[32], wrong[32];
  formatTime(h->timeUs, time, sizeof(time));
  if (h->wrong < 0) {
    snprintf(wrong, sizeof(wrong), "N/A");
  } else {
    snprintf(wrong, sizeof(wrong), "%" PRId64, h->wrong);
  }
  printf("%12zu  %12zu  %8s  %6s  %6i", s->bytes, s->count, "float", redop, root);
  printf("  %7s  %6.2f  %6.2f  %5s", time, h->algbw, h->busbw, wrong);
  printf("  %7s  %6s  %6s  %5s\n", "N/A", "N/A", "N/A", "N/A");
  if (o->json) {
    char t[40], alg[40], bus[40], w[32];
    jsonDouble(h->timeUs, t, sizeof(t));
    jsonDouble(h->algbw, alg, sizeof(alg));
    jsonDouble(h->busbw, bus, sizeof(bus));
    if (h->wrong < 0) {
      snprintf(w, sizeof(w), "null");
    } else {
      snprintf(w, sizeof(w), "%" PRId64, h->wrong);
    }
    printf(
        "{\"collective\":\"%s\",\"size\":%zu,\"count\":%zu,\"type\":\"float\",\"redop\":\"%s\",\"root\":%d,"
        "\"oop_time_us\":%s,\"oop_algbw\":%s,\"oop_busbw\":%s,\"oop_wrong\":%s,\"ip_time_us\":null,"
        "\"ip_algbw\":null,\"ip_busbw\":null,\"ip_wrong\":null,\"ranks\":%d,\"system\":\"%s\"}\n",
        kCollNames[o->coll], s->bytes, s->count, redop, root, t, alg, bus, w, g_size, SYSTEM_NAME);
  }
  fflush(stdout);
}

// ---- Command line ------------------------------------------------------------------------------

static void printUsage(void) {
  printf(
      "Usage: %s <collective> [flags]   (started by mpirun)\n"
      "  collective              " COLL_LIST
      "\n"
      "  -b, --minbytes SIZE     smallest size, suffixes K M G (default 32M)\n"
      "  -e, --maxbytes SIZE     largest size (default 32M, at most 1G)\n"
      "  -i, --stepbytes SIZE    additive step when no factor > 1 is given (default 1M)\n"
      "  -f, --stepfactor N      multiplicative step (default 1: use -i)\n"
      "  -n, --iters N           timed iterations (default 20)\n"
      "  -w, --warmup_iters N    warm-up iterations (default 5)\n"
      "  -c, --check 0|1         validate results (default 1)\n"
      "  -d, --datatype float    data type (float only)\n"
      "  -o, --op sum            reduction (sum only)\n"
      "  -r, --root N            root of broadcast and reduce (default 0)\n"
      "      --json              also print each row as a JSON object\n",
      PROGRAM_NAME);
}

// Returns 0 to run, 2 on a usage error, -1 after --help.
static int parseArgs(int argc, char** argv, Options* o) {
  static const struct option kLong[] = {{"minbytes", required_argument, NULL, 'b'},
                                        {"maxbytes", required_argument, NULL, 'e'},
                                        {"stepbytes", required_argument, NULL, 'i'},
                                        {"stepfactor", required_argument, NULL, 'f'},
                                        {"iters", required_argument, NULL, 'n'},
                                        {"warmup_iters", required_argument, NULL, 'w'},
                                        {"check", required_argument, NULL, 'c'},
                                        {"datatype", required_argument, NULL, 'd'},
                                        {"op", required_argument, NULL, 'o'},
                                        {"root", required_argument, NULL, 'r'},
                                        {"json", no_argument, NULL, 'J'},
                                        {"help", no_argument, NULL, 'h'},
                                        {NULL, 0, NULL, 0}};
  const char* minText = "32M";
  const char* maxText = "32M";
  const char* stepText = "1M";
  int maxGiven = 0;
  long long v = 0;
  opterr = g_rank == 0;  // getopt's own messages from rank 0 only
  for (;;) {
    const int c = getopt_long(argc, argv, "b:e:i:f:n:w:c:d:o:r:h", kLong, NULL);
    if (c == -1) break;
    switch (c) {
      case 'b':
        minText = optarg;
        break;
      case 'e':
        maxText = optarg;
        maxGiven = 1;
        break;
      case 'i':
        stepText = optarg;
        break;
      case 'f':
        if (parseInt(optarg, "-f", 1, 1 << 20, &v)) return 2;
        o->stepFactor = (size_t)v;
        break;
      case 'n':
        if (parseInt(optarg, "-n", 1, 1 << 30, &v)) return 2;
        o->iters = (int)v;
        break;
      case 'w':
        if (parseInt(optarg, "-w", 0, 1 << 30, &v)) return 2;
        o->warmup = (int)v;
        break;
      case 'c':
        if (parseInt(optarg, "-c", 0, 1, &v)) return 2;
        o->check = (int)v;
        break;
      case 'd':
        if (strcmp(optarg, "float") != 0 && strcmp(optarg, "float32") != 0 && strcmp(optarg, "fp32") != 0) {
          usageError("only -d float is supported (got '%s')", optarg);
          return 2;
        }
        break;
      case 'o':
        if (strcmp(optarg, "sum") != 0) {
          usageError("only -o sum is supported (got '%s')", optarg);
          return 2;
        }
        break;
      case 'r':
        if (parseInt(optarg, "-r", INT_MIN, INT_MAX, &v)) return 2;
        o->root = (int)v;
        break;
      case 'J':
        o->json = 1;
        break;
      case 'h':
        if (g_rank == 0) printUsage();
        return -1;
      default:
        return 2;  // getopt printed the reason
    }
  }
  if (optind != argc - 1) {
    usageError("%s",
               optind >= argc ? "a collective is required: " COLL_LIST : "exactly one collective expected");
    return 2;
  }
  const char* name = argv[optind];
  int found = 0;
  for (int c = 0; c < kColls; ++c) {
    if (strcmp(name, kCollNames[c]) == 0) {
      o->coll = (Coll)c;
      found = 1;
    }
  }
  if (!found) {
    usageError("unknown collective '%s' (" COLL_LIST ")", name);
    return 2;
  }
  size_t maxBytes = 0;
  if (parseSize(minText, "-b", &o->minBytes) || parseSize(maxText, "-e", &maxBytes) ||
      parseSize(stepText, "-i", &o->stepBytes)) {
    return 2;
  }
  o->maxBytes = maxGiven || maxBytes >= o->minBytes ? maxBytes : o->minBytes;
  if (o->minBytes > o->maxBytes) {
    usageError("%s", "invalid sizes: minbytes > maxbytes");
    return 2;
  }
  if (o->maxBytes > kMaxBufferBytes) {
    usageError("%s", "maxbytes above 1G (the largest buffer allowed)");
    return 2;
  }
  if (o->stepFactor <= 1 && o->stepBytes == 0) {
    usageError("%s", "stepbytes must be > 0 without a step factor");
    return 2;
  }
  if (o->stepFactor > 1 && o->minBytes == 0) {
    usageError("%s", "minbytes must be > 0 with a step factor");
    return 2;
  }
  if (collRooted(o->coll) && (o->root < 0 || o->root >= g_size)) {
    char text[64];
    snprintf(text, sizeof(text), "root %d out of range for %d ranks", o->root, g_size);
    usageError("%s", text);
    return 2;
  }
  return 0;
}

// Host buffer aligned to 64 bytes, zeroed (so its pages are touched before timing).
static float* allocBuffer(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded < 64) rounded = 64;
  float* p = aligned_alloc(64, rounded);
  if (p) memset(p, 0, rounded);
  return p;
}

static void finish(void) {
#if defined(COMPARE_PEER_SYSTEM)
  peerFinalize();
#endif
  MPI_Finalize();
}

int main(int argc, char** argv) {
#if defined(COMPARE_PEER_SYSTEM)
  peerInit(&argc, &argv);
#else
  MPI_Init(&argc, &argv);
#endif
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);

  Options o = {ALL_REDUCE, 32u << 20, 32u << 20, 1u << 20, 1, 20, 5, 1, 0, 0};
  const int parsed = parseArgs(argc, argv, &o);
  if (parsed != 0) {
    finish();
    return parsed < 0 ? 0 : 2;
  }

  float* send = allocBuffer(o.maxBytes);
  float* recv = allocBuffer(o.maxBytes);
  if (!send || !recv) {
    fprintf(stderr, PROGRAM_NAME ": cannot allocate %zu bytes\n", o.maxBytes);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }

  printHeader(&o);
  int64_t errors = 0;
  double bwSum = 0.0;
  int64_t bwCount = 0;
  for (size_t size = o.minBytes; size <= o.maxBytes;) {
    const Shape s = shapeFor(o.coll, size, g_size);
    const HalfResult h = runHalf(&o, &s, send, recv);
    if (h.wrong > 0) ++errors;
    bwSum += h.busbw;
    ++bwCount;
    if (g_rank == 0) printRow(&o, &s, &h);
    const size_t next = o.stepFactor > 1 ? size * o.stepFactor : size + o.stepBytes;
    if (next <= size) break;  // overflow
    size = next;
  }
  if (g_rank == 0) {
    printf("# Out of bounds values : %" PRId64 " %s\n", errors, errors ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g\n", bwCount ? bwSum / (double)bwCount : 0.0);
    printf("#\n");
    fflush(stdout);
  }
  free(send);
  free(recv);
  finish();
  return errors ? 1 : 0;
}
