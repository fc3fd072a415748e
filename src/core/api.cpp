// The path every public call takes (core/api.hpp): the C++ Communicator and the C functions build
// an Op and hand it here, which checks it and sends it to the device path or the host path.
#include "core/api.hpp"

#include "base/error.hpp"
#include "core/comm_impl.hpp"
#include "core/device.hpp"
#include "core/group.hpp"
#include "core/work_state.hpp"

namespace chorus::api {

namespace {

void refuseInGroup(const char* call) {
  if (group::active()) fail(chorusInvalidUsage, strCat(call, " cannot be called inside a group"));
}

// A collective of count 0 moves nothing and needs nobody: it returns at once, as NCCL discards
// such calls, without the turn, the call's number or its fingerprint (docs/reliability.md;
// docs/performance.md, "Empty calls"). Barrier has no count, and an alltoallv whose counts are
// all zero here may still be a peer's partner in its synchronisations: both always run. Check mode
// (CHORUS_CHECK) runs them too, so that a peer passing another count is named.
bool discardable(const CommImpl& c, const Op& op) {
  if (op.count != 0 || c.config().checkCalls) return false;
  switch (op.kind) {
    case OpKind::AllReduce:
    case OpKind::ReduceScatter:
    case OpKind::AllGather:
    case OpKind::Broadcast:
    case OpKind::Reduce:
    case OpKind::AllToAll:
      return true;
    default:
      return false;
  }
}

}  // namespace

Op makeAllToAllv(const void* send, std::span<const size_t> sendCounts, std::span<const size_t> sendDispls,
                 void* recv, std::span<const size_t> recvCounts, std::span<const size_t> recvDispls,
                 DataType type) {
  Op o = makeOp(OpKind::AllToAllv, send, recv, 0, type);
  auto layout = std::make_shared<AllToAllvLayout>();
  layout->sendCounts.assign(sendCounts.begin(), sendCounts.end());
  layout->sendDispls.assign(sendDispls.begin(), sendDispls.end());
  layout->recvCounts.assign(recvCounts.begin(), recvCounts.end());
  layout->recvDispls.assign(recvDispls.begin(), recvDispls.end());
  o.layout = std::move(layout);
  return o;
}

CommImpl& live(const std::shared_ptr<CommImpl>& impl) {
  if (!impl) fail(chorusInvalidUsage, "use of a moved-from or destroyed Communicator");
  return *impl;
}

void prepare(CommImpl& impl, Op& op) {
  impl.validate(op);
  op.timeout = impl.callTimeout();
}

void run(const std::shared_ptr<CommImpl>& impl, Op&& op, void* stream) {
  if (stream != nullptr) {
    live(impl);  // throws for a moved-from Communicator (the C API has checked its handle already)
    device::enqueue(impl, std::move(op), stream);
  } else {
    runBlocking(impl, std::move(op));
  }
}

void runBlocking(const std::shared_ptr<CommImpl>& impl, Op&& op) {
  CommImpl& c = live(impl);
  prepare(c, op);
  if (discardable(c, op)) {
    c.checkUsable();
    return;
  }
  if (group::active()) {
    group::add(impl, std::move(op));
    return;
  }
  c.checkUsable();
  c.runInTurn(op);
}

Work runAsync(const std::shared_ptr<CommImpl>& impl, Op&& op) {
  CommImpl& c = live(impl);
  prepare(c, op);
  if (group::active())
    fail(chorusInvalidUsage, "asynchronous calls cannot be part of a group; use the blocking form");
  c.checkUsable();
  if (discardable(c, op)) {
    auto done = std::make_shared<WorkState>();
    done->complete(chorusSuccess);
    return Work(std::move(done));
  }
  return Work(c.submit({std::move(op)}, true));
}

chorusResult_t asyncError(CommImpl& impl) {
  if (const chorusResult_t code = impl.asyncError(); code != chorusSuccess) return code;
  std::string text;
  const chorusResult_t code = device::asyncError(impl, &text);
  if (code != chorusSuccess) impl.setLastError(text);
  return code;
}

std::shared_ptr<CommImpl> split(CommImpl& impl, int color, int key, const char* call) {
  refuseInGroup(call);
  impl.checkUsable();
  return impl.split(color, key);
}

std::shared_ptr<CommImpl> shrink(CommImpl& impl, std::span<const int> excludeRanks, const char* call) {
  refuseInGroup(call);
  return impl.shrink(excludeRanks);
}

}  // namespace chorus::api
