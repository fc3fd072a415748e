// chorus-perf: the collectives it measures, their buffer shapes and bus-bandwidth factors.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "chorus/chorus.hpp"

namespace chorus_perf {

enum class Coll { AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, AllToAll, SendRecv };

/// "all_reduce" -> Coll::AllReduce, ...; nullopt for an unknown name.
std::optional<Coll> collFromName(const std::string& name);
const char* collName(Coll c);
/// Whether the collective takes a reduction operation (all_reduce, reduce_scatter, reduce).
bool collReduces(Coll c);
/// Whether the collective has a root (broadcast, reduce).
bool collRooted(Coll c);
/// busbw = algbw * busFactor (nccl-tests' convention, see docs in chorus_perf.cpp).
double busFactor(Coll c, int nranks);

/// Buffer layout of one benchmark size, in elements.
///
/// As nccl-tests: for all_gather, reduce_scatter and alltoall the requested size is the whole
/// (larger) buffer of nranks blocks; the per-rank block `count` is rounded down to a multiple of
/// 4 elements. `bytes` (the size column, and what algbw divides) is the larger of the two buffers;
/// `count` (the count column) is the count argument passed to the call: per-rank block for those
/// three, all elements otherwise.
struct Shape {
  size_t count = 0;      ///< count argument of the call
  size_t sendElems = 0;  ///< elements of the send buffer
  size_t recvElems = 0;  ///< elements of the receive buffer
  size_t bytes = 0;      ///< max(sendElems, recvElems) * type size
  /// In-place: sendbuf = recvbuf + sendInplaceOffset * rank, recvbuf = recvbuf + recvInplaceOffset * rank
  /// (elements), with one buffer holding max(sendElems, recvElems).
  size_t sendInplaceOffset = 0;
  size_t recvInplaceOffset = 0;
};
Shape shapeFor(Coll c, size_t sizeBytes, size_t typeSize, int nranks);

/// Issues one operation: blocking on host buffers, enqueued on `stream` when it is not null (device
/// buffers). sendrecv: send to rank+1, receive from rank-1, in one group.
void runColl(chorus::Communicator& comm, Coll c, const void* send, void* recv, size_t count,
             chorus::DataType type, chorus::ReduceOp op, int root, chorus::CudaStream stream = {});

}  // namespace chorus_perf
