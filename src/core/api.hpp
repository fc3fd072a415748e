// The path every public call takes, shared by the C++ and C APIs.
#pragma once

#include <memory>

#include "base/op.hpp"
#include "chorus/chorus.hpp"

namespace chorus {

class CommImpl;

namespace api {
Op makeOp(OpKind kind, const void* send, void* recv, size_t count, DataType type, ReduceOp op = ReduceOp::Sum,
          int root = -1, int peer = -1);
/// Validates, then queues into the current group or runs to completion; throws on failure.
void runBlocking(const std::shared_ptr<CommImpl>& impl, Op op);
/// The error that broke the communicator, else the one a device kernel reported (its text then
/// becomes the communicator's last error), else chorusSuccess.
chorusResult_t asyncError(CommImpl& impl);
/// Validates, then starts asynchronously.
Work runAsync(const std::shared_ptr<CommImpl>& impl, Op op);
}  // namespace api

}  // namespace chorus
