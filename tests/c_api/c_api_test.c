/*
 * The C API as a C99 program sees it: chorus.h must compile as strict C99 (-std=c99 -pedantic),
 * and every call a C user makes must work from C.
 *
 * Covered: chorusGetVersion, error strings, chorusCommInitAll with 2 and 3 ranks driven from one
 * thread through chorusGroupStart/chorusGroupEnd, chorusCommCount/UserRank, chorusCommSplit (with key
 * reversal and CHORUS_SPLIT_NOCOLOR), chorusGetLastError after a bad call, chorusCommDestroy and use
 * after destroy, and chorusGetUniqueId + chorusCommInitRank with two pthreads.
 *
 * Exit status: 0 when every check passed, 1 otherwise (each failed check is printed to stderr).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chorus/chorus.h"

#define MAX_RANKS 3
#define COUNT 1000

static pthread_mutex_t g_failures_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_failures = 0;

static void note_failure(const char* file, int line, const char* what, const char* detail) {
  pthread_mutex_lock(&g_failures_mu);
  ++g_failures;
  fprintf(stderr, "%s:%d: check failed: %s%s%s\n", file, line, what, detail ? " -- " : "",
          detail ? detail : "");
  pthread_mutex_unlock(&g_failures_mu);
}

#define CHECK(cond)                                             \
  do {                                                          \
    if (!(cond)) note_failure(__FILE__, __LINE__, #cond, NULL); \
  } while (0)

/* Expects chorusSuccess; on failure prints the call and the thread's last error text. */
#define CHECK_OK(call)                                                   \
  do {                                                                   \
    chorusResult_t res_ = (call);                                        \
    if (res_ != chorusSuccess) {                                         \
      note_failure(__FILE__, __LINE__, #call, chorusGetLastError(NULL)); \
    }                                                                    \
  } while (0)

/* Expects result `code` and a last-error text (per thread) containing `word`. */
#define CHECK_FAILS(call, code, word)                                                                \
  do {                                                                                               \
    chorusResult_t res_ = (call);                                                                    \
    if (res_ != (code)) {                                                                            \
      note_failure(__FILE__, __LINE__, #call " returns " #code, chorusGetErrorString(res_));         \
    } else if (strstr(chorusGetLastError(NULL), (word)) == NULL) {                                   \
      note_failure(__FILE__, __LINE__, #call " message names '" word "'", chorusGetLastError(NULL)); \
    }                                                                                                \
  } while (0)

/* Input of rank r at element i: small integers, so every sum is exact in float. */
static float input_value(int rank, int i) { return (float)((rank + 1) * (i % 7 + 1)); }

static void test_version(void) {
  int version = -1;
  CHECK_OK(chorusGetVersion(&version));
  CHECK(version == CHORUS_VERSION_CODE);
  CHECK(version == CHORUS_MAJOR * 10000 + CHORUS_MINOR * 100 + CHORUS_PATCH);
  CHECK_FAILS(chorusGetVersion(NULL), chorusInvalidArgument, "NULL");
}

static void test_error_strings(void) {
  int r, s;
  for (r = 0; r < chorusNumResults; ++r) {
    const char* text = chorusGetErrorString((chorusResult_t)r);
    CHECK(text != NULL && text[0] != '\0');
    for (s = 0; s < r; ++s) CHECK(strcmp(text, chorusGetErrorString((chorusResult_t)s)) != 0);
  }
  CHECK(strstr(chorusGetErrorString(chorusSuccess), "no error") != NULL);
  CHECK(strstr(chorusGetErrorString(chorusInvalidArgument), "invalid argument") != NULL);
  CHECK(strstr(chorusGetErrorString(chorusTimeout), "timed out") != NULL);
  CHECK(chorusGetErrorString((chorusResult_t)99) != NULL);
  CHECK(chorusGetErrorString((chorusResult_t)-1) != NULL);
}

/* One allreduce per communicator inside one group, all issued from this thread. */
static void group_allreduce(chorusComm_t* comms, int n, float send[][COUNT], float recv[][COUNT]) {
  int r;
  CHECK_OK(chorusGroupStart());
  for (r = 0; r < n; ++r) {
    CHECK_OK(chorusAllReduce(send[r], recv[r], COUNT, chorusFloat32, chorusSum, comms[r], NULL));
  }
  CHECK_OK(chorusGroupEnd());
}

/* Checks recv[r][i] == sum over `members` (parent ranks) of input_value(member, i). */
static void check_sums(const char* what, float recv[][COUNT], int n, const int* members, int nmembers) {
  int r, i, m, wrong = 0;
  for (r = 0; r < n; ++r) {
    for (i = 0; i < COUNT; ++i) {
      float want = 0;
      for (m = 0; m < nmembers; ++m) want += input_value(members[m], i);
      if (recv[r][i] != want) {
        if (wrong < 3)
          fprintf(stderr, "%s: rank %d element %d is %g, expected %g\n", what, r, i, recv[r][i], want);
        ++wrong;
      }
    }
  }
  CHECK(wrong == 0);
}

struct split_args {
  chorusComm_t parent;
  int color;
  int key;
  chorusComm_t child;
  chorusResult_t result;
};

static void* split_thread(void* p) {
  struct split_args* a = (struct split_args*)p;
  a->result = chorusCommSplit(a->parent, a->color, a->key, &a->child);
  return NULL;
}

/* chorusCommSplit is collective, so every parent rank calls it on its own thread. */
static void split_all(chorusComm_t* comms, int n, const int* colors, const int* keys,
                      chorusComm_t* children) {
  pthread_t threads[MAX_RANKS];
  struct split_args args[MAX_RANKS];
  int r;
  for (r = 0; r < n; ++r) {
    args[r].parent = comms[r];
    args[r].color = colors[r];
    args[r].key = keys[r];
    args[r].child = (chorusComm_t)&args[r]; /* must be overwritten (NULL for NOCOLOR) */
    args[r].result = chorusInternalError;
    CHECK(pthread_create(&threads[r], NULL, split_thread, &args[r]) == 0);
  }
  for (r = 0; r < n; ++r) {
    CHECK(pthread_join(threads[r], NULL) == 0);
    CHECK(args[r].result == chorusSuccess);
    children[r] = args[r].child;
  }
}

static void test_init_all(int n) {
  static float send[MAX_RANKS][COUNT], recv[MAX_RANKS][COUNT];
  chorusComm_t comms[MAX_RANKS], children[MAX_RANKS];
  int members[MAX_RANKS];
  int colors[MAX_RANKS], keys[MAX_RANKS];
  int r, i, count, rank, nchildren;
  chorusResult_t asyncError;

  fprintf(stderr, "-- chorusCommInitAll with %d ranks\n", n);
  CHECK_OK(chorusCommInitAll(comms, n, NULL));
  if (g_failures) return;
  for (r = 0; r < n; ++r) {
    count = -1;
    rank = -1;
    CHECK_OK(chorusCommCount(comms[r], &count));
    CHECK_OK(chorusCommUserRank(comms[r], &rank));
    CHECK(count == n);
    CHECK(rank == r);
    CHECK_OK(chorusCommGetAsyncError(comms[r], &asyncError));
    CHECK(asyncError == chorusSuccess);
    for (i = 0; i < COUNT; ++i) {
      send[r][i] = input_value(r, i);
      recv[r][i] = -1;
    }
    members[r] = r;
  }

  /* One allreduce per communicator, every communicator driven from this one thread. */
  group_allreduce(comms, n, send, recv);
  check_sums("group allreduce", recv, n, members, n);

  /* Nested groups run at the outermost end; in place works too. */
  CHECK_OK(chorusGroupStart());
  CHECK_OK(chorusGroupStart());
  for (r = 0; r < n; ++r) {
    memcpy(recv[r], send[r], sizeof recv[r]);
    CHECK_OK(chorusAllReduce(recv[r], recv[r], COUNT, chorusFloat32, chorusSum, comms[r], NULL));
  }
  CHECK_OK(chorusGroupEnd());
  CHECK_OK(chorusGroupEnd());
  check_sums("nested in-place group allreduce", recv, n, members, n);

  /* A bad call fails with a message, on the thread and on the communicator, and breaks nothing. */
  CHECK_FAILS(chorusAllReduce(send[0], recv[0], COUNT, (chorusDataType_t)42, chorusSum, comms[0], NULL),
              chorusInvalidArgument, "datatype");
  CHECK(strstr(chorusGetLastError(comms[0]), "datatype") != NULL);
  group_allreduce(comms, n, send, recv);
  check_sums("allreduce after a bad call", recv, n, members, n);

  /* Split: even and odd parent ranks, keys reversing the order. */
  for (r = 0; r < n; ++r) {
    colors[r] = r % 2;
    keys[r] = -r;
  }
  split_all(comms, n, colors, keys, children);
  for (r = 0; r < n; ++r) {
    int want_size = 0, want_rank = 0, q;
    for (q = 0; q < n; ++q) {
      if (q % 2 == r % 2) {
        ++want_size;
        if (q > r) ++want_rank; /* larger parent rank, smaller key: earlier */
      }
    }
    CHECK(children[r] != NULL);
    if (!children[r]) continue;
    CHECK_OK(chorusCommCount(children[r], &count));
    CHECK_OK(chorusCommUserRank(children[r], &rank));
    CHECK(count == want_size);
    CHECK(rank == want_rank);
  }
  if (g_failures) return;
  /* Both children of a 2- or 3-rank parent in one group: rank r gets the sum over its color. */
  group_allreduce(children, n, send, recv);
  for (r = 0; r < n; ++r) {
    int color_members[MAX_RANKS], q, k = 0;
    for (q = 0; q < n; ++q) {
      if (q % 2 == r % 2) color_members[k++] = q;
    }
    check_sums("allreduce on split children", &recv[r], 1, color_members, k);
  }
  for (r = 0; r < n; ++r) CHECK_OK(chorusCommDestroy(children[r]));

  /* Split with CHORUS_SPLIT_NOCOLOR on rank 0: it gets NULL; the others form one communicator. */
  for (r = 0; r < n; ++r) {
    colors[r] = r == 0 ? CHORUS_SPLIT_NOCOLOR : 5;
    keys[r] = r;
  }
  split_all(comms, n, colors, keys, children);
  CHECK(children[0] == NULL);
  nchildren = 0;
  for (r = 1; r < n; ++r) {
    CHECK(children[r] != NULL);
    if (!children[r]) continue;
    CHECK_OK(chorusCommCount(children[r], &count));
    CHECK_OK(chorusCommUserRank(children[r], &rank));
    CHECK(count == n - 1);
    CHECK(rank == r - 1);
    members[nchildren++] = r;
  }
  if (g_failures) return;
  group_allreduce(children + 1, n - 1, send + 1, recv + 1);
  check_sums("allreduce after NOCOLOR split", recv + 1, n - 1, members, nchildren);
  for (r = 1; r < n; ++r) CHECK_OK(chorusCommDestroy(children[r]));

  /* Destroy, then every use fails with chorusInvalidUsage and says so. */
  for (r = 0; r < n; ++r) CHECK_OK(chorusCommDestroy(comms[r]));
  CHECK_FAILS(chorusCommCount(comms[0], &count), chorusInvalidUsage, "destroyed");
  CHECK_FAILS(chorusAllReduce(send[0], recv[0], COUNT, chorusFloat32, chorusSum, comms[0], NULL),
              chorusInvalidUsage, "destroyed");
  CHECK_FAILS(chorusCommDestroy(comms[0]), chorusInvalidUsage, "destroyed");
}

struct rank_args {
  chorusUniqueId id;
  int rank;
  int nranks;
  int64_t result[COUNT];
  int ok;
};

static void* init_rank_thread(void* p) {
  struct rank_args* a = (struct rank_args*)p;
  chorusComm_t comm = NULL;
  int64_t send[COUNT];
  int i, count = -1, rank = -1;
  a->ok = 0;
  if (chorusCommInitRank(&comm, a->nranks, a->id, a->rank) != chorusSuccess) {
    fprintf(stderr, "rank %d: chorusCommInitRank failed: %s\n", a->rank, chorusGetLastError(NULL));
    return NULL;
  }
  if (chorusCommCount(comm, &count) != chorusSuccess || count != a->nranks ||
      chorusCommUserRank(comm, &rank) != chorusSuccess || rank != a->rank) {
    fprintf(stderr, "rank %d: count %d / rank %d wrong\n", a->rank, count, rank);
    return NULL;
  }
  for (i = 0; i < COUNT; ++i) send[i] = (int64_t)(a->rank + 1) * 1000000007LL + i;
  if (chorusAllReduce(send, a->result, COUNT, chorusInt64, chorusSum, comm, NULL) != chorusSuccess) {
    fprintf(stderr, "rank %d: chorusAllReduce failed: %s\n", a->rank, chorusGetLastError(comm));
    return NULL;
  }
  if (chorusBarrier(comm, NULL) != chorusSuccess || chorusCommDestroy(comm) != chorusSuccess) {
    fprintf(stderr, "rank %d: barrier/destroy failed: %s\n", a->rank, chorusGetLastError(NULL));
    return NULL;
  }
  a->ok = 1;
  return NULL;
}

static void test_unique_id(void) {
  static struct rank_args args[2];
  pthread_t threads[2];
  chorusUniqueId id;
  int r, i, wrong = 0;

  fprintf(stderr, "-- chorusGetUniqueId + chorusCommInitRank with 2 threads\n");
  CHECK_FAILS(chorusGetUniqueId(NULL), chorusInvalidArgument, "NULL");
  memset(&id, 0, sizeof id);
  CHECK_OK(chorusGetUniqueId(&id));
  for (r = 0; r < 2; ++r) {
    args[r].id = id;
    args[r].rank = r;
    args[r].nranks = 2;
    CHECK(pthread_create(&threads[r], NULL, init_rank_thread, &args[r]) == 0);
  }
  for (r = 0; r < 2; ++r) {
    CHECK(pthread_join(threads[r], NULL) == 0);
    CHECK(args[r].ok);
    for (i = 0; i < COUNT; ++i) {
      if (args[r].result[i] != 3 * 1000000007LL + 2 * i) ++wrong;
    }
  }
  CHECK(wrong == 0);

  /* Bad arguments to chorusCommInitRank fail at once with a message. */
  {
    chorusComm_t comm = NULL;
    CHECK_FAILS(chorusCommInitRank(&comm, 2, id, 2), chorusInvalidArgument, "rank");
    CHECK(comm == NULL);
    CHECK_FAILS(chorusCommInitRank(&comm, 0, id, 0), chorusInvalidArgument, "nranks");
    CHECK_FAILS(chorusCommInitRank(NULL, 2, id, 0), chorusInvalidArgument, "NULL");
  }
}

int main(void) {
  test_version();
  test_error_strings();
  test_init_all(2);
  test_init_all(3);
  test_unique_id();
  if (g_failures) {
    fprintf(stderr, "FAILED: %d check(s)\n", g_failures);
    return 1;
  }
  printf("c_api_test: all checks passed\n");
  return 0;
}
