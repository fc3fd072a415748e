// libnccl.so.2 from Chorus: the collectives, point-to-point calls and groups (ncclGroupStart/End)
// over Chorus's. Host buffers with a NULL stream, or device buffers on a stream (Chorus's device
// path); gather and scatter, built from grouped sends and receives, take host buffers only.
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "chorus/chorus.h"
#include "frameworks/nccl/shim.hpp"

using shim::fromChorus;
using shim::hostOnly;
using shim::isDeviceMemory;
using shim::refuse;
using shim::typeOk;
using shim::typeSize;

namespace {

// The caller's ncclGroupStart/End nesting on this thread, and the local copies that gather and
// scatter must make once the caller's outermost group has run (their sources may be filled by
// earlier calls of the group).
thread_local int tGroupDepth = 0;
thread_local std::vector<std::function<void()>> tAfterGroup;

void afterGroup(std::function<void()> fn) {
  if (tGroupDepth > 0)
    tAfterGroup.push_back(std::move(fn));
  else
    fn();
}

bool opOk(const char* call, const ncclRedOp_t& op, ncclResult_t* out) {
  const int value = static_cast<int>(shim::rawValue(op));
  if (value >= 0 && value < static_cast<int>(ncclNumOps)) return true;
  *out = refuse(ncclInvalidArgument, std::string(call) + ": reduction op " + std::to_string(value) +
                                         " is not a built-in op (ncclRedOpCreatePreMulSum is not supported)");
  return false;
}

}  // namespace

namespace shim {

int groupDepth() { return tGroupDepth; }

// Gather and scatter (grouped sends and receives, and a copy of the root's own block) take host
// buffers with a NULL stream only.
bool hostOnly(const char* call, cudaStream_t stream, const void* a, const void* b, ncclResult_t* out) {
  std::string why;
  if (stream != nullptr)
    why =
        "a CUDA stream was given; this Chorus libnccl runs gather and scatter on host buffers with a NULL "
        "stream only";
  else if (isDeviceMemory(a) || isDeviceMemory(b))
    why = "a device buffer was given; this Chorus libnccl runs gather and scatter on host buffers only";
  if (why.empty()) return true;
  *out = refuse(ncclInvalidUsage, std::string(call) + ": " + why);
  return false;
}

}  // namespace shim

// ---- Collectives ----------------------------------------------------------------------------

#define CHECK_HOST(call, stream, a, b)                     \
  do {                                                     \
    ncclResult_t out_;                                     \
    if (!hostOnly(call, stream, a, b, &out_)) return out_; \
    if (!typeOk(call, datatype, &out_)) return out_;       \
  } while (0)
// Host buffers (NULL stream) or device buffers on a stream: Chorus takes both. NCCL's stream 0 with
// device buffers becomes the per-thread default stream (Chorus reads NULL as host buffers; the
// legacy stream would serialize ranks that are threads sharing a GPU).
#define CHECK_TYPE(call)                             \
  do {                                               \
    ncclResult_t out_;                               \
    if (!typeOk(call, datatype, &out_)) return out_; \
  } while (0)
cudaStream_t streamFor(cudaStream_t stream, const void* a, const void* b) {
  if (stream == nullptr && (isDeviceMemory(a) || isDeviceMemory(b))) return cudaStreamPerThread;
  return stream;
}
#define CHECK_OP(call)                       \
  do {                                       \
    ncclResult_t out_;                       \
    if (!opOk(call, op, &out_)) return out_; \
  } while (0)

#define CT(t) static_cast<chorusDataType_t>(t)
#define CO(o) static_cast<chorusRedOp_t>(o)

SHIM_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream) {
  START
  RESOLVE(comm, "ncclAllReduce");
  CHECK_TYPE("ncclAllReduce");
  CHECK_OP("ncclAllReduce");
  return fromChorus(chorusAllReduce(sendbuff, recvbuff, count, CT(datatype), CO(op), cc,
                                    streamFor(stream, sendbuff, recvbuff)));
  END
}
SHIM_ALIAS(ncclAllReduce)

SHIM_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                           cudaStream_t stream) {
  START
  RESOLVE(comm, "ncclReduceScatter");
  CHECK_TYPE("ncclReduceScatter");
  CHECK_OP("ncclReduceScatter");
  return fromChorus(chorusReduceScatter(sendbuff, recvbuff, recvcount, CT(datatype), CO(op), cc,
                                        streamFor(stream, sendbuff, recvbuff)));
  END
}
SHIM_ALIAS(ncclReduceScatter)

SHIM_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  START
  RESOLVE(comm, "ncclAllGather");
  CHECK_TYPE("ncclAllGather");
  return fromChorus(chorusAllGather(sendbuff, recvbuff, sendcount, CT(datatype), cc,
                                    streamFor(stream, sendbuff, recvbuff)));
  END
}
SHIM_ALIAS(ncclAllGather)

SHIM_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  START
  RESOLVE(comm, "ncclBroadcast");
  CHECK_TYPE("ncclBroadcast");
  return fromChorus(chorusBroadcast(sendbuff, recvbuff, count, CT(datatype), root, cc,
                                    streamFor(stream, sendbuff, recvbuff)));
  END
}
SHIM_ALIAS(ncclBroadcast)

SHIM_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                   ncclComm_t comm, cudaStream_t stream) {
  START
  RESOLVE(comm, "ncclBcast");
  CHECK_TYPE("ncclBcast");
  return fromChorus(
      chorusBroadcast(buff, buff, count, CT(datatype), root, cc, streamFor(stream, buff, nullptr)));
  END
}
SHIM_ALIAS(ncclBcast)

SHIM_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                                    cudaStream_t stream) {
  START
  RESOLVE(comm, "ncclReduce");
  CHECK_TYPE("ncclReduce");
  CHECK_OP("ncclReduce");
  return fromChorus(chorusReduce(sendbuff, recvbuff, count, CT(datatype), CO(op), root, cc,
                                 streamFor(stream, sendbuff, recvbuff)));
  END
}
SHIM_ALIAS(ncclReduce)

SHIM_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  START
  RESOLVE(comm, "ncclAlltoAll");
  CHECK_TYPE("ncclAlltoAll");
  return fromChorus(
      chorusAllToAll(sendbuff, recvbuff, count, CT(datatype), cc, streamFor(stream, sendbuff, recvbuff)));
  END
}
SHIM_ALIAS(ncclAlltoAll)

SHIM_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  START
  RESOLVE(comm, "ncclSend");
  CHECK_TYPE("ncclSend");
  return fromChorus(
      chorusSend(sendbuff, count, CT(datatype), peer, cc, streamFor(stream, sendbuff, nullptr)));
  END
}
SHIM_ALIAS(ncclSend)

SHIM_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  START
  RESOLVE(comm, "ncclRecv");
  CHECK_TYPE("ncclRecv");
  return fromChorus(
      chorusRecv(recvbuff, count, CT(datatype), peer, cc, streamFor(stream, recvbuff, nullptr)));
  END
}
SHIM_ALIAS(ncclRecv)

SHIM_EXPORT ncclResult_t ncclGroupStart() {
  START
  const chorusResult_t r = chorusGroupStart();
  if (r == chorusSuccess) ++tGroupDepth;
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclGroupStart)

SHIM_EXPORT ncclResult_t ncclGroupEnd() {
  START
  if (tGroupDepth == 0) return refuse(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  const chorusResult_t r = chorusGroupEnd();
  if (--tGroupDepth == 0) {
    auto pending = std::move(tAfterGroup);
    tAfterGroup.clear();
    if (r == chorusSuccess)
      for (auto& fn : pending) fn();
  }
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclGroupEnd)

// Gather and scatter as NCCL 2.28 defines them: the root receives (sends) `count` elements per
// rank, in rank order; built from grouped sends and receives, the root's own block copied once the
// caller's outermost group has run. `many` is the root's buffer of n blocks (gather's recvbuff,
// scatter's sendbuff), `one` every rank's own block (gather's sendbuff, scatter's recvbuff).
static ncclResult_t rooted(const char* call, bool toRoot, void* one, void* many, size_t count,
                           ncclDataType_t datatype, int root, chorusComm_t cc) {
  int rank = 0, n = 0;
  chorusResult_t r = chorusCommUserRank(cc, &rank);
  if (r == chorusSuccess) r = chorusCommCount(cc, &n);
  if (r != chorusSuccess) return fromChorus(r);
  if (root < 0 || root >= n)
    return refuse(ncclInvalidArgument, std::string(call) + ": root " + std::to_string(root) + " of " +
                                           std::to_string(n) + " ranks");
  const size_t bytes = count * typeSize(datatype);
  if (count > 0 && (one == nullptr || (rank == root && many == nullptr)))
    return refuse(ncclInvalidArgument, std::string(call) + ": NULL buffer on rank " + std::to_string(rank));
  char* blocks = static_cast<char*>(many);
  chorusGroupStart();
  chorusResult_t first = chorusSuccess;
  if (rank == root) {
    for (int p = 0; p < n && first == chorusSuccess; ++p) {
      if (p == rank) continue;
      first = toRoot ? chorusRecv(blocks + p * bytes, count, CT(datatype), p, cc, nullptr)
                     : chorusSend(blocks + p * bytes, count, CT(datatype), p, cc, nullptr);
    }
  } else {
    first = toRoot ? chorusSend(one, count, CT(datatype), root, cc, nullptr)
                   : chorusRecv(one, count, CT(datatype), root, cc, nullptr);
  }
  const chorusResult_t end = chorusGroupEnd();
  if (first != chorusSuccess) return fromChorus(first);
  if (end != chorusSuccess) return fromChorus(end);
  if (rank == root && bytes > 0 && blocks + rank * bytes != one) {
    char* mine = blocks + rank * bytes;
    if (toRoot)
      afterGroup([mine, one, bytes] { std::memmove(mine, one, bytes); });
    else
      afterGroup([mine, one, bytes] { std::memmove(one, mine, bytes); });
  }
  return ncclSuccess;
}

SHIM_EXPORT ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  START
  RESOLVE(comm, "ncclGather");
  CHECK_HOST("ncclGather", stream, sendbuff, recvbuff);
  return rooted("ncclGather", true, const_cast<void*>(sendbuff), recvbuff, count, datatype, root, cc);
  END
}
SHIM_ALIAS(ncclGather)

// The sendbuff is only read (const_cast to share rooted()).
SHIM_EXPORT ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  START
  RESOLVE(comm, "ncclScatter");
  CHECK_HOST("ncclScatter", stream, sendbuff, recvbuff);
  return rooted("ncclScatter", false, recvbuff, const_cast<void*>(sendbuff), count, datatype, root, cc);
  END
}
SHIM_ALIAS(ncclScatter)
