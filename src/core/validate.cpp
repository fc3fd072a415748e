#include "core/validate.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "base/error.hpp"

namespace chorus {

namespace {

bool overlaps(const void* a, size_t abytes, const void* b, size_t bbytes) {
  auto pa = reinterpret_cast<uintptr_t>(a);
  auto pb = reinterpret_cast<uintptr_t>(b);
  return abytes && bbytes && pa < pb + bbytes && pb < pa + abytes;
}

// The checks run on every call, so the passing path is compares only: every message is built in a
// cold function of its own (inlined, the message building made validateOp a quarter of an empty
// call's time, docs/performance.md "Empty calls").
struct Where {
  const Op& op;
  int rank, size;
  std::string text() const { return strCat(opKindName(op.kind), " on rank ", rank, " of ", size); }
};

[[noreturn, gnu::cold, gnu::noinline]] void failOverflow(const Op& op, size_t count, size_t k, size_t elem) {
  constexpr size_t kMax = size_t{1} << 47;
  failInvalid(opKindName(op.kind), ": count ", count, (k > 1 ? strCat(" x ", k, " ranks") : std::string()),
              " x ", elem, " bytes overflows the largest supported message (", kMax, " bytes)");
}
[[noreturn, gnu::cold, gnu::noinline]] void failNull(const Where& w, const char* which) {
  failInvalid(w.text(), ": ", which, " is NULL but count is ", w.op.count);
}
[[noreturn, gnu::cold, gnu::noinline]] void failOverlap(const Where& w, bool partial) {
  failInvalid(w.text(), partial ? ": send and receive buffers overlap without being in place"
                                : ": send and receive buffers overlap");
}
[[noreturn, gnu::cold, gnu::noinline]] void failDescription(const Where& w) {
  const Op& op = w.op;
  const int t = static_cast<int>(op.type);
  if (t < 0 || t >= kNumDataTypes) failInvalid(w.text(), ": unknown datatype ", t);
  const int o = static_cast<int>(op.op);
  if (isReducing(op.kind) && (o < 0 || o >= kNumReduceOps))
    failInvalid(w.text(), ": unknown reduction op ", o);
  if (op.kind == OpKind::Broadcast || op.kind == OpKind::Reduce)
    failInvalid(w.text(), ": root ", op.root, " is out of range [0, ", w.size, ")");
  if (op.kind == OpKind::Send || op.kind == OpKind::Recv)
    failInvalid(w.text(), ": peer ", op.peer, " is out of range [0, ", w.size, ")");
  failInvalid(w.text(), ": counts and displacements must each have ", w.size, " entries");
}

// count * k * elem, or a clear error if it does not fit.
inline size_t checkedBytes(const Op& op, size_t count, size_t k, size_t elem) {
  constexpr size_t kMax = size_t{1} << 47;  // the pipe framing carries 48-bit lengths
  size_t elems = 0, bytes = 0;              // overflow tests, not divisions
  if (__builtin_mul_overflow(count, k, &elems) || __builtin_mul_overflow(elems, elem, &bytes) || bytes > kMax)
      [[unlikely]] {
    failOverflow(op, count, k, elem);
  }
  return bytes;
}

inline void needPtr(const Where& w, const void* p, size_t bytes, const char* which) {
  if (bytes && p == nullptr) [[unlikely]]
    failNull(w, which);
}

inline void noPartialOverlap(const Where& w, size_t sbytes, size_t rbytes, bool inPlace) {
  if (!inPlace && overlaps(w.op.send, sbytes, w.op.recv, rbytes)) [[unlikely]]
    failOverlap(w, true);
}

}  // namespace

void validateOp(const Op& op, int rank, int size) {
  if (op.kind == OpKind::Barrier) return;
  const Where w{op, rank, size};
  const int t = static_cast<int>(op.type);
  if (t < 0 || t >= kNumDataTypes) [[unlikely]]
    failDescription(w);
  if (isReducing(op.kind)) {
    const int o = static_cast<int>(op.op);
    if (o < 0 || o >= kNumReduceOps) [[unlikely]]
      failDescription(w);
  }
  const size_t elem = dataTypeSize(op.type);
  const auto n = static_cast<size_t>(size);
  switch (op.kind) {
    case OpKind::AllReduce: {
      size_t b = checkedBytes(op, op.count, 1, elem);
      needPtr(w, op.send, b, "sendbuff");
      needPtr(w, op.recv, b, "recvbuff");
      noPartialOverlap(w, b, b, op.send == op.recv);
      break;
    }
    case OpKind::ReduceScatter: {
      // A rank's block and the whole by multiplication: a division costs more than the rest here.
      const size_t b = checkedBytes(op, op.count, n, elem), one = op.count * elem;
      needPtr(w, op.send, b, "sendbuff");
      needPtr(w, op.recv, one, "recvbuff");
      bool inPlace = static_cast<const std::byte*>(op.send) + static_cast<size_t>(rank) * one == op.recv;
      noPartialOverlap(w, b, one, inPlace);
      break;
    }
    case OpKind::AllGather: {
      const size_t b = checkedBytes(op, op.count, n, elem), one = op.count * elem;
      needPtr(w, op.send, one, "sendbuff");
      needPtr(w, op.recv, b, "recvbuff");
      bool inPlace = static_cast<const std::byte*>(op.recv) + static_cast<size_t>(rank) * one == op.send;
      noPartialOverlap(w, one, b, inPlace);
      break;
    }
    case OpKind::Broadcast:
    case OpKind::Reduce: {
      if (op.root < 0 || op.root >= size) [[unlikely]]
        failDescription(w);
      size_t b = checkedBytes(op, op.count, 1, elem);
      bool isRoot = op.root == rank;
      if (op.kind == OpKind::Broadcast) {
        if (isRoot) needPtr(w, op.send, b, "sendbuff (root)");
        needPtr(w, op.recv, b, "recvbuff");
      } else {
        needPtr(w, op.send, b, "sendbuff");
        if (isRoot) needPtr(w, op.recv, b, "recvbuff (root)");
      }
      if (isRoot) noPartialOverlap(w, b, b, op.send == op.recv);
      break;
    }
    case OpKind::AllToAll: {
      size_t b = checkedBytes(op, op.count, n, elem);
      needPtr(w, op.send, b, "sendbuff");
      needPtr(w, op.recv, b, "recvbuff");
      noPartialOverlap(w, b, b, op.send == op.recv);
      break;
    }
    case OpKind::AllToAllv: {
      if (op.sendCounts().size() != n || op.sendDispls().size() != n || op.recvCounts().size() != n ||
          op.recvDispls().size() != n) [[unlikely]] {
        failDescription(w);
      }
      size_t sMax = 0, rMax = 0;
      for (size_t j = 0; j < n; ++j) {
        size_t se = checkedBytes(op, op.sendCounts()[j], 1, elem),
               re = checkedBytes(op, op.recvCounts()[j], 1, elem);
        size_t sd = checkedBytes(op, op.sendDispls()[j], 1, elem),
               rd = checkedBytes(op, op.recvDispls()[j], 1, elem);
        if (se) sMax = std::max(sMax, sd + se);
        if (re) rMax = std::max(rMax, rd + re);
      }
      needPtr(w, op.send, sMax, "sendbuff");
      needPtr(w, op.recv, rMax, "recvbuff");
      if (overlaps(op.send, sMax, op.recv, rMax)) failOverlap(w, false);
      break;
    }
    case OpKind::Send:
    case OpKind::Recv: {
      if (op.peer < 0 || op.peer >= size) [[unlikely]]
        failDescription(w);
      size_t b = checkedBytes(op, op.count, 1, elem);
      needPtr(w, op.kind == OpKind::Send ? op.send : op.recv, b, "buffer");
      break;
    }
    case OpKind::Barrier:
      break;
  }
}

}  // namespace chorus
