// Group calls: operations issued between groupStart and groupEnd on one thread run together.
#pragma once

#include <functional>
#include <memory>

#include "base/op.hpp"

namespace chorus {

class CommImpl;

namespace group {
/// True between the outermost start and its end on this thread.
bool active();
/// Queues a validated operation for the current group.
void add(std::shared_ptr<CommImpl> comm, Op op);
/// Runs `fn` at the current group's end, first of all (to launch kernels that peers driven by
/// this thread may wait for, before anything there waits).
void launch(std::function<void()> fn);
/// Runs `fn` at the current group's end, after the launch hooks and before its operations (e.g. to
/// stage device buffers into host memory once the kernels enqueued in the group are all launched).
void prepare(std::function<void()> fn);
/// Runs `fn` once the current group's operations have completed (not if they failed), e.g. to copy
/// staged results back to device memory.
void defer(std::function<void()> fn);
void start();
/// Runs the group at the outermost end; throws the first failure (after all finished).
void end();
}  // namespace group

}  // namespace chorus
