// Validation of one operation's arguments, before anything is sent: a pure function of the call and
// the communicator's rank and size.
#pragma once

#include "base/op.hpp"

namespace chorus {

/// Throws chorusInvalidArgument, naming the call, the rank and the problem, when `op` is malformed
/// for rank `rank` of a communicator of `size` ranks: datatype or op out of range, NULL buffers with
/// a non-zero count, root or peer out of range, byte counts that overflow (counts x ranks x element
/// size), send and receive buffers overlapping without being exactly in place.
void validateOp(const Op& op, int rank, int size);

}  // namespace chorus
