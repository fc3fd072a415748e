// One operation as the engine sees it, after the API has validated it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "chorus/chorus.hpp"

namespace chorus {

enum class OpKind : uint8_t {
  AllReduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  Reduce,
  AllToAll,
  AllToAllv,
  Send,
  Recv,
  Barrier,
};

const char* opKindName(OpKind k);
/// Whether a collective of kind `k` reduces (its ReduceOp matters).
constexpr bool isReducing(OpKind k) {
  return k == OpKind::AllReduce || k == OpKind::ReduceScatter || k == OpKind::Reduce;
}

struct Op {
  OpKind kind = OpKind::Barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  /// Elements: per rank for AllGather (send count), ReduceScatter (recv count), AllToAll (per peer).
  size_t count = 0;
  DataType type = DataType::Uint8;
  ReduceOp op = ReduceOp::Sum;
  int root = -1;
  int peer = -1;
  std::vector<size_t> sendCounts, sendDispls, recvCounts, recvDispls;  // AllToAllv only
  /// Deadline for this call's waits (Communicator::setTimeout when it was issued); 0: Config::timeout.
  std::chrono::milliseconds timeout{0};

  bool isPointToPoint() const { return kind == OpKind::Send || kind == OpKind::Recv; }
  /// Bytes one rank contributes (the size used to pick an algorithm).
  size_t messageBytes() const { return count * dataTypeSize(type); }
  /// Bytes this operation reads from its send buffer and writes to its receive buffer on `rank` of
  /// `nranks` (the extent a copy of either must cover).
  std::pair<size_t, size_t> bufferBytes(int rank, int nranks) const;
};

}  // namespace chorus
