// Ring schedules over any group of ranks, as transfer lists: the flat ring allreduce runs them over
// all ranks, the hierarchical allreduce over the ranks of one host and over the ranks of equal local
// index across hosts. Each send is bound to the receive that produced its bytes, so slices flow
// around the ring as they arrive (pipelined at the granularity of the pipe's free space).
#pragma once

#include <span>
#include <vector>

#include "algorithms/common.hpp"

namespace chorus::algo {

/// A ring: the ranks in ring order and this rank's position in it.
struct Ring {
  std::span<const int> ranks;
  int me = 0;
  int size() const { return static_cast<int>(ranks.size()); }
  int next() const { return ranks[static_cast<size_t>(mod(me + 1, size()))]; }
  int prev() const { return ranks[static_cast<size_t>(mod(me - 1, size()))]; }
};

/// The slices a ring splits `count` elements into: slice i is the i-th of ring.size() nearly equal
/// parts, each starting on a cache line.
inline Slices ringSlices(const Ring& ring, size_t count, size_t elem) {
  return Slices(count, static_cast<size_t>(ring.size()), cacheLineElems(elem));
}

/// The slice a rank holds fully reduced after ringReduceScatter: position p holds slice p + 1.
inline int ringOwnedSlice(const Ring& ring, int position) { return mod(position + 1, ring.size()); }

/// Appends the reduce-scatter of `count` elements over `ring`: `in` is this rank's input (read by
/// the first send and as the local operand of each reduction), `out` receives the partial results;
/// afterwards slice ringOwnedSlice(me) of `out` is reduced over the whole ring (divided by
/// `avgDivisor` when non-zero). `lastRecv` is the index in `ts` of the last receive (-1 if none).
void appendRingReduceScatter(std::vector<engine::Transfer>& ts, const Ring& ring, const Op& op,
                             const void* in, void* out, size_t count, int avgDivisor, uint16_t tag,
                             int& lastRecv);

/// Appends the all-gather that follows appendRingReduceScatter: every rank passes on the slice it
/// owns, so that afterwards all of `buf` (count elements) holds every slice. The first send waits
/// for `lastRecv` when it is >= 0 (the end of the reduce-scatter in the same list).
void appendRingAllGather(std::vector<engine::Transfer>& ts, const Ring& ring, void* buf, size_t count,
                         size_t elem, uint16_t tag, int& lastRecv);

}  // namespace chorus::algo
