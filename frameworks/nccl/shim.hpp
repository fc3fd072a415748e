// What the files of libnccl.so.2 (frameworks/nccl) share: the communicator behind ncclComm_t,
// result and error mapping, and the export macros.
#pragma once

#include <nccl.h>

#include <cstring>
#include <string>
#include <type_traits>

#include "chorus/chorus.h"

/// NCCL's communicator: a Chorus communicator plus what the NCCL API adds over it (suspend and
/// resume re-create the Chorus communicator under the same handle; grow ids; revoke). Handles are
/// never freed, so a destroyed one is recognised.
struct ncclComm {
  chorusComm_t c = nullptr;  // null while suspended and once destroyed
  int rank = -1;
  int nranks = 0;
  bool destroyed = false;
  bool suspended = false;
  bool revoked = false;
  chorusUniqueId resumeId{};   // made by rank 0 at suspend, the rendezvous of the resume
  bool growIdPending = false;  // ncclCommGetUniqueId made an id not yet consumed by a grow
  chorusUniqueId growId{};     //
  int windows = 0;             // registered windows (suspend refuses while any is)
};

namespace shim {

/// Records `message` as the calling thread's last error (ncclGetLastError) and returns `code`.
ncclResult_t refuse(ncclResult_t code, const std::string& message);
/// Chorus's result as NCCL's (Chorus's message becomes the latest error).
ncclResult_t fromChorus(chorusResult_t r);
/// What an exception inside an exported function becomes.
ncclResult_t fromException() noexcept;

/// A new handle for `c` (rank and size read from it).
ncclComm_t wrap(chorusComm_t c);
/// The Chorus communicator of `comm` for `call`, or false with *err set (NULL, unknown, destroyed
/// or suspended handles).
bool resolve(const ncclComm* comm, const char* call, chorusComm_t* out, ncclResult_t* err);
/// Whether `comm` is a handle this library made (destroyed or not).
bool known(const ncclComm* comm);

/// config is NULL or was set from NCCL_CONFIG_INITIALIZER; otherwise false with *out set.
bool configOk(const char* call, const ncclConfig_t* config, ncclResult_t* out);

/// cudaPointerGetAttributes says device or managed memory (false without CUDA or a GPU).
bool isDeviceMemory(const void* p);
/// Host buffers with a NULL stream (gather, scatter, registration); otherwise false with *out set.
bool hostOnly(const char* call, cudaStream_t stream, const void* a, const void* b, ncclResult_t* out);
/// The integer a caller passed for an enum parameter, read without loading it as the enum: a caller
/// may pass any int, and loading a value outside a C++ enum's range is undefined (clang's
/// -fsanitize=enum reports it). The checks below read their arguments so.
template <typename E>
std::underlying_type_t<E> rawValue(const E& e) {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}
/// A data type Chorus takes; otherwise false with *out set (float8 types are refused).
bool typeOk(const char* call, const ncclDataType_t& t, ncclResult_t* out);
/// Bytes of one element of `t`.
size_t typeSize(ncclDataType_t t);
/// Rank `peer`'s buffer of window `win` at `offset`, in this process (host windows).
ncclResult_t windowPointer(const char* call, ncclWindow_t win, size_t offset, int peer, void** out);
/// The caller's ncclGroupStart/End nesting depth on this thread.
int groupDepth();

}  // namespace shim

#define SHIM_EXPORT extern "C" __attribute__((visibility("default")))
// pnccl* are NCCL's profiling aliases of the same functions.
#define SHIM_ALIAS(name) SHIM_EXPORT decltype(name) p##name __attribute__((alias(#name)));

#define START try {
#define END                       \
  }                               \
  catch (...) {                   \
    return shim::fromException(); \
  }

// Declares `cc`, the Chorus communicator of `comm`, or returns the refusal.
#define RESOLVE(comm, call)                                  \
  chorusComm_t cc = nullptr;                                 \
  do {                                                       \
    ncclResult_t err_;                                       \
    if (!shim::resolve(comm, call, &cc, &err_)) return err_; \
  } while (0)
