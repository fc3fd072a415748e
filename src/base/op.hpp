// One operation as the engine sees it, after the API has validated it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
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

/// An AllToAllv's counts and displacements, in elements, one per rank each.
struct AllToAllvLayout {
  std::vector<size_t> sendCounts, sendDispls, recvCounts, recvDispls;
};

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
  /// AllToAllv only: the counts and displacements, fixed once the call is made. Behind one pointer
  /// so that every other call's Op stays small (it is built, zeroed and passed on every call).
  std::shared_ptr<const AllToAllvLayout> layout;
  /// Deadline for this call's waits (Communicator::setTimeout when it was issued); 0: Config::timeout.
  std::chrono::milliseconds timeout{0};

  std::span<const size_t> sendCounts() const {
    return layout ? layout->sendCounts : std::span<const size_t>();
  }
  std::span<const size_t> sendDispls() const {
    return layout ? layout->sendDispls : std::span<const size_t>();
  }
  std::span<const size_t> recvCounts() const {
    return layout ? layout->recvCounts : std::span<const size_t>();
  }
  std::span<const size_t> recvDispls() const {
    return layout ? layout->recvDispls : std::span<const size_t>();
  }
  bool isPointToPoint() const { return kind == OpKind::Send || kind == OpKind::Recv; }
  /// Bytes one rank contributes (the size used to pick an algorithm).
  size_t messageBytes() const { return count * dataTypeSize(type); }
  /// Bytes this operation reads from its send buffer and writes to its receive buffer on `rank` of
  /// `nranks` (the extent a copy of either must cover).
  std::pair<size_t, size_t> bufferBytes(int rank, int nranks) const;
};

}  // namespace chorus
