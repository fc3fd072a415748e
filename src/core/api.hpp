// The path every public call takes, shared by the C++ and C APIs.
#pragma once

#include <memory>

#include "chorus/chorus.hpp"
#include "core/op.hpp"

namespace chorus {

class CommImpl;

namespace api {
Op makeOp(OpKind kind, const void* send, void* recv, size_t count, DataType type, ReduceOp op = ReduceOp::Sum,
          int root = -1, int peer = -1);
/// Validates, then queues into the current group or runs to completion; throws on failure.
void runBlocking(const std::shared_ptr<CommImpl>& impl, Op op);
/// Validates, then starts asynchronously.
Work runAsync(const std::shared_ptr<CommImpl>& impl, Op op);
}  // namespace api

}  // namespace chorus
