// The operation's own facts: its name, and how much of its buffers it touches on a rank.
#include "base/op.hpp"

#include <algorithm>
#include <utility>

namespace chorus {

const char* opKindName(OpKind k) {
  switch (k) {
    case OpKind::AllReduce:
      return "allreduce";
    case OpKind::ReduceScatter:
      return "reducescatter";
    case OpKind::AllGather:
      return "allgather";
    case OpKind::Broadcast:
      return "broadcast";
    case OpKind::Reduce:
      return "reduce";
    case OpKind::AllToAll:
      return "alltoall";
    case OpKind::AllToAllv:
      return "alltoallv";
    case OpKind::Send:
      return "send";
    case OpKind::Recv:
      return "recv";
    case OpKind::Barrier:
      return "barrier";
  }
  return "unknown";
}

std::pair<size_t, size_t> Op::bufferBytes(int rank, int nranks) const {
  const size_t e = dataTypeSize(type);
  const size_t c = count * e;
  const auto N = static_cast<size_t>(nranks);
  switch (kind) {
    case OpKind::AllReduce:
      return {c, c};
    case OpKind::ReduceScatter:
      return {c * N, c};
    case OpKind::AllGather:
      return {c, c * N};
    case OpKind::Broadcast:
      return {rank == root ? c : 0, c};
    case OpKind::Reduce:
      return {c, rank == root ? c : 0};
    case OpKind::AllToAll:
      return {c * N, c * N};
    case OpKind::AllToAllv: {
      size_t in = 0, out = 0;
      for (size_t r = 0; r < N; ++r) {  // an empty block's displacement is never used
        if (sendCounts()[r] > 0) in = std::max(in, (sendDispls()[r] + sendCounts()[r]) * e);
        if (recvCounts()[r] > 0) out = std::max(out, (recvDispls()[r] + recvCounts()[r]) * e);
      }
      return {in, out};
    }
    case OpKind::Send:
      return {c, 0};
    case OpKind::Recv:
      return {0, c};
    case OpKind::Barrier:
      return {0, 0};
  }
  return {0, 0};
}

}  // namespace chorus
