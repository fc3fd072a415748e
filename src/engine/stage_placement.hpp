// Where in a rank's staging area each chunk of the direct algorithms goes (transports/shm holds
// the area: transport::kStageSlots slots of half the staging size, back to back). Every rank asks
// for the same chunks in the same order, so all agree on every place without a word exchanged.
//
// One rule keeps the data safe: a chunk never overlaps the chunk before it, which a slower peer may
// still be reading (shm_group.hpp). Within that rule the places are chosen for speed. A rank
// rewriting staging lines that a peer read last and still holds in its L2 writes them several
// times slower than lines the peer has let go (docs/performance.md, "Staging slots"):
//   - a long allreduce's or all-gather's chunks alternate between slots 0 and 1: between two uses of
//     a slot its peers read a whole chunk of the other, which pushes most of the first out of their
//     L2;
//   - a short call's chunks, and every call's of the collectives that gain from it (the broadcast,
//     reduce, reduce-scatter and all-to-all: algo::stagingPacks), are packed one after another
//     through the whole area, so back-to-back calls walk through all of it before they write a
//     line again, however small they are.
#pragma once

#include <cstddef>

namespace chorus::engine {

class StagePlacement {
 public:
  /// Granularity of packed chunks: a page, so a chunk's lines keep the offsets within a page that
  /// a slot's have (memcpy's speed depends on where the destination lies against the source).
  static constexpr size_t kAlign = 4096;

  /// An area of `slots` (3 or more) slots of `slotBytes` each.
  StagePlacement(size_t slotBytes, int slots) : slot_(slotBytes), slots_(slots) {}

  /// The byte offset of a long call's next chunk: slot 0 or 1, the other one than the chunk before
  /// took; after a packed chunk the first slot it does not overlap (2 or 3 only where a packed
  /// chunk covers parts of slots 0 and 1).
  size_t nextSlot() {
    int k = 0;
    if (lastSlot_ >= 0) {
      k = lastSlot_ == 0 ? 1 : 0;
    } else {
      while (k + 1 < slots_ && overlapsLast(static_cast<size_t>(k) * slot_, slot_)) ++k;
    }
    lastSlot_ = k;
    return remember(static_cast<size_t>(k) * slot_, slot_);
  }

  /// The byte offset of a short call's next chunk of `bytes` (at most one slot): right after the
  /// chunk before, rounded up to kAlign; back at the start where the area ends.
  size_t nextPacked(size_t bytes) {
    const size_t rounded = bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
    const size_t len = rounded <= slot_ ? rounded : bytes;  // a slot that is no multiple of kAlign
    const size_t end = lastOff_ + lastLen_;
    size_t at = end + len <= area() ? end : 0;
    // Wrapped onto the chunk before: it starts within `len` of 0, so it ends within two slots and
    // there is room after it (the area has three slots or more).
    if (overlapsLast(at, len)) at = end;
    lastSlot_ = -1;
    return remember(at, len);
  }

  size_t area() const { return slot_ * static_cast<size_t>(slots_); }

 private:
  bool overlapsLast(size_t at, size_t len) const {
    return lastLen_ != 0 && at < lastOff_ + lastLen_ && lastOff_ < at + len;
  }
  size_t remember(size_t at, size_t len) {
    lastOff_ = at;
    lastLen_ = len;
    return at;
  }

  size_t slot_;
  int slots_;
  int lastSlot_ = 1;  // the slot of the chunk before, if a long call's; -1 after a packed chunk
  size_t lastOff_ = 0, lastLen_ = 0;
};

}  // namespace chorus::engine
