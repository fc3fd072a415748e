// The path every public call takes, shared by the C++ and C APIs (core/api.cpp): the Op it builds,
// the checks every call makes first, and where the call then goes (host or device, now or in the
// current group).
#pragma once

#include <memory>
#include <span>

#include "base/op.hpp"
#include "chorus/chorus.hpp"

namespace chorus {

class CommImpl;

namespace api {
inline Op makeOp(OpKind kind, const void* send, void* recv, size_t count, DataType type,
                 ReduceOp op = ReduceOp::Sum, int root = -1, int peer = -1) {
  return Op{kind, send, recv, count, type, op, root, peer};
}
/// An AllToAllv, with copies of the counts and displacements (one per rank each).
Op makeAllToAllv(const void* send, std::span<const size_t> sendCounts, std::span<const size_t> sendDispls,
                 void* recv, std::span<const size_t> recvCounts, std::span<const size_t> recvDispls,
                 DataType type);
/// `impl` itself; throws chorusInvalidUsage where it is null (a moved-from or destroyed Communicator).
CommImpl& live(const std::shared_ptr<CommImpl>& impl);
/// What every call does first: validates `op` (throws chorusInvalidArgument naming the problem) and
/// gives it the communicator's per-call timeout.
void prepare(CommImpl& impl, Op& op);
/// With a stream (a cudaStream_t): device buffers, enqueued on it (core/device.hpp). Without (null):
/// host buffers, as runBlocking. Throws on failure.
void run(const std::shared_ptr<CommImpl>& impl, Op&& op, void* stream);
/// Validates, then queues into the current group or runs to completion; throws on failure.
void runBlocking(const std::shared_ptr<CommImpl>& impl, Op&& op);
/// The error that broke the communicator, else the one a device kernel reported (its text then
/// becomes the communicator's last error), else chorusSuccess.
chorusResult_t asyncError(CommImpl& impl);
/// Validates, then starts asynchronously.
Work runAsync(const std::shared_ptr<CommImpl>& impl, Op&& op);
/// Split and shrink, refused inside a group ("<call> cannot be called inside a group"); split also
/// refuses a communicator that is no longer usable. Null from split where this rank's color is
/// undefined.
std::shared_ptr<CommImpl> split(CommImpl& impl, int color, int key, const char* call);
std::shared_ptr<CommImpl> shrink(CommImpl& impl, std::span<const int> excludeRanks, const char* call);
}  // namespace api

}  // namespace chorus
