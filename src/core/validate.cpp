#include "core/validate.hpp"

#include <algorithm>
#include <cstdint>

#include "base/error.hpp"

namespace chorus {

namespace {

bool overlaps(const void* a, size_t abytes, const void* b, size_t bbytes) {
  auto pa = reinterpret_cast<uintptr_t>(a);
  auto pb = reinterpret_cast<uintptr_t>(b);
  return abytes && bbytes && pa < pb + bbytes && pb < pa + abytes;
}

// count * k * elemSize, or a clear error if it does not fit.
size_t checkedBytes(size_t count, size_t k, size_t elem, const char* call) {
  constexpr size_t kMax = size_t{1} << 47;  // the pipe framing carries 48-bit lengths
  size_t elems = 0, bytes = 0;              // overflow tests, not divisions: this runs on every call
  if (__builtin_mul_overflow(count, k, &elems) || __builtin_mul_overflow(elems, elem, &bytes) ||
      bytes > kMax) {
    failInvalid(call, ": count ", count, (k > 1 ? strCat(" x ", k, " ranks") : std::string()), " x ", elem,
                " bytes overflows the largest supported message (", kMax, " bytes)");
  }
  return bytes;
}

}  // namespace

void validateOp(const Op& op, int rank, int size) {
  const char* call = opKindName(op.kind);
  auto where = [&] { return strCat(call, " on rank ", rank, " of ", size); };
  if (op.kind == OpKind::Barrier) return;
  int t = static_cast<int>(op.type);
  if (t < 0 || t >= kNumDataTypes) failInvalid(where(), ": unknown datatype ", t);
  if (isReducing(op.kind)) {
    int o = static_cast<int>(op.op);
    if (o < 0 || o >= kNumReduceOps) failInvalid(where(), ": unknown reduction op ", o);
  }
  const size_t elem = dataTypeSize(op.type);
  const auto n = static_cast<size_t>(size);
  auto needPtr = [&](const void* p, size_t bytes, const char* which) {
    if (bytes && p == nullptr) failInvalid(where(), ": ", which, " is NULL but count is ", op.count);
  };
  auto noPartialOverlap = [&](size_t sbytes, size_t rbytes, bool inPlace) {
    if (!inPlace && overlaps(op.send, sbytes, op.recv, rbytes)) {
      failInvalid(where(), ": send and receive buffers overlap without being in place");
    }
  };
  switch (op.kind) {
    case OpKind::AllReduce: {
      size_t b = checkedBytes(op.count, 1, elem, call);
      needPtr(op.send, b, "sendbuff");
      needPtr(op.recv, b, "recvbuff");
      noPartialOverlap(b, b, op.send == op.recv);
      break;
    }
    case OpKind::ReduceScatter: {
      size_t b = checkedBytes(op.count, n, elem, call);
      needPtr(op.send, b, "sendbuff");
      needPtr(op.recv, b / n, "recvbuff");
      bool inPlace = static_cast<const std::byte*>(op.send) + static_cast<size_t>(rank) * (b / n) == op.recv;
      noPartialOverlap(b, b / n, inPlace);
      break;
    }
    case OpKind::AllGather: {
      size_t b = checkedBytes(op.count, n, elem, call);
      needPtr(op.send, b / n, "sendbuff");
      needPtr(op.recv, b, "recvbuff");
      bool inPlace = static_cast<const std::byte*>(op.recv) + static_cast<size_t>(rank) * (b / n) == op.send;
      noPartialOverlap(b / n, b, inPlace);
      break;
    }
    case OpKind::Broadcast:
    case OpKind::Reduce: {
      if (op.root < 0 || op.root >= size)
        failInvalid(where(), ": root ", op.root, " is out of range [0, ", size, ")");
      size_t b = checkedBytes(op.count, 1, elem, call);
      bool isRoot = op.root == rank;
      if (op.kind == OpKind::Broadcast) {
        if (isRoot) needPtr(op.send, b, "sendbuff (root)");
        needPtr(op.recv, b, "recvbuff");
      } else {
        needPtr(op.send, b, "sendbuff");
        if (isRoot) needPtr(op.recv, b, "recvbuff (root)");
      }
      if (isRoot) noPartialOverlap(b, b, op.send == op.recv);
      break;
    }
    case OpKind::AllToAll: {
      size_t b = checkedBytes(op.count, n, elem, call);
      needPtr(op.send, b, "sendbuff");
      needPtr(op.recv, b, "recvbuff");
      noPartialOverlap(b, b, op.send == op.recv);
      break;
    }
    case OpKind::AllToAllv: {
      if (op.sendCounts().size() != n || op.sendDispls().size() != n || op.recvCounts().size() != n ||
          op.recvDispls().size() != n) {
        failInvalid(where(), ": counts and displacements must each have ", n, " entries");
      }
      size_t sMax = 0, rMax = 0;
      for (size_t j = 0; j < n; ++j) {
        size_t se = checkedBytes(op.sendCounts()[j], 1, elem, call),
               re = checkedBytes(op.recvCounts()[j], 1, elem, call);
        size_t sd = checkedBytes(op.sendDispls()[j], 1, elem, call),
               rd = checkedBytes(op.recvDispls()[j], 1, elem, call);
        if (se) sMax = std::max(sMax, sd + se);
        if (re) rMax = std::max(rMax, rd + re);
      }
      needPtr(op.send, sMax, "sendbuff");
      needPtr(op.recv, rMax, "recvbuff");
      if (overlaps(op.send, sMax, op.recv, rMax)) failInvalid(where(), ": send and receive buffers overlap");
      break;
    }
    case OpKind::Send:
    case OpKind::Recv: {
      if (op.peer < 0 || op.peer >= size)
        failInvalid(where(), ": peer ", op.peer, " is out of range [0, ", size, ")");
      size_t b = checkedBytes(op.count, 1, elem, call);
      needPtr(op.kind == OpKind::Send ? op.send : op.recv, b, "buffer");
      break;
    }
    case OpKind::Barrier:
      break;
  }
}

}  // namespace chorus
