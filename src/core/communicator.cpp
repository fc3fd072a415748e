// The public C++ Communicator: builds an Op, validates it, then runs it (or queues it in a group).
#include "base/error.hpp"
#include "bootstrap/env_init.hpp"
#include "core/api.hpp"
#include "core/comm_impl.hpp"
#include "core/device.hpp"
#include "core/group.hpp"
#include "transports/shm/shm_memory.hpp"

namespace chorus {

namespace {

CommImpl& live(const std::shared_ptr<CommImpl>& impl) {
  if (!impl) fail(chorusInvalidUsage, "use of a moved-from or destroyed Communicator");
  return *impl;
}

}  // namespace

Op api::makeOp(OpKind kind, const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root,
               int peer) {
  Op o;
  o.kind = kind;
  o.send = send;
  o.recv = recv;
  o.count = count;
  o.type = type;
  o.op = op;
  o.root = root;
  o.peer = peer;
  return o;
}

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, const Config& config)
    : impl_(CommImpl::create(std::move(store), rank, size, config)) {}

Communicator::Communicator(std::shared_ptr<CommImpl> impl) : impl_(std::move(impl)) {}

Communicator Communicator::fromEnvironment(const Config& config) {
  EnvRendezvous rv = rendezvousFromEnvironment();
  return Communicator(CommImpl::create(rv.store, rv.rank, rv.size, config, rv.keepAlive));
}

std::vector<Communicator> Communicator::createLocal(int size, const Config& config) {
  std::vector<Communicator> out;
  for (auto& impl : CommImpl::createLocal(size, config)) out.emplace_back(std::move(impl));
  return out;
}

Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;
Communicator::~Communicator() = default;

int Communicator::rank() const { return live(impl_).rank(); }

void Communicator::setTimeout(std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) failInvalid("setTimeout: timeout ", timeout.count(), " ms is negative");
  live(impl_).setCallTimeout(timeout);
}

std::chrono::milliseconds Communicator::timeout() const {
  const CommImpl& c = live(impl_);
  const auto perCall = c.callTimeout();
  return perCall.count() > 0 ? perCall : c.config().timeout;
}
int Communicator::size() const { return live(impl_).size(); }

void api::runBlocking(const std::shared_ptr<CommImpl>& impl, Op op) {
  CommImpl& c = live(impl);
  c.validate(op);
  op.timeout = c.callTimeout();
  if (group::active()) {
    group::add(impl, std::move(op));
    return;
  }
  c.checkUsable();
  c.runBlocking(op);
}

Work api::runAsync(const std::shared_ptr<CommImpl>& impl, Op op) {
  CommImpl& c = live(impl);
  c.validate(op);
  op.timeout = c.callTimeout();
  if (group::active())
    fail(chorusInvalidUsage, "asynchronous calls cannot be part of a group; use the blocking form");
  c.checkUsable();
  return Work(c.submit({std::move(op)}, true));
}

using api::makeOp;
using api::runAsync;
using api::runBlocking;

void Communicator::allReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op) {
  runBlocking(impl_, makeOp(OpKind::AllReduce, send, recv, count, type, op));
}
void Communicator::reduceScatter(const void* send, void* recv, size_t recvCount, DataType type, ReduceOp op) {
  runBlocking(impl_, makeOp(OpKind::ReduceScatter, send, recv, recvCount, type, op));
}
void Communicator::allGather(const void* send, void* recv, size_t sendCount, DataType type) {
  runBlocking(impl_, makeOp(OpKind::AllGather, send, recv, sendCount, type));
}
void Communicator::broadcast(const void* send, void* recv, size_t count, DataType type, int root) {
  runBlocking(impl_, makeOp(OpKind::Broadcast, send, recv, count, type, ReduceOp::Sum, root));
}
void Communicator::reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root) {
  runBlocking(impl_, makeOp(OpKind::Reduce, send, recv, count, type, op, root));
}
void Communicator::allToAll(const void* send, void* recv, size_t count, DataType type) {
  runBlocking(impl_, makeOp(OpKind::AllToAll, send, recv, count, type));
}
void Communicator::allToAllv(const void* send, std::span<const size_t> sendCounts,
                             std::span<const size_t> sendDispls, void* recv,
                             std::span<const size_t> recvCounts, std::span<const size_t> recvDispls,
                             DataType type) {
  Op o = makeOp(OpKind::AllToAllv, send, recv, 0, type);
  o.sendCounts.assign(sendCounts.begin(), sendCounts.end());
  o.sendDispls.assign(sendDispls.begin(), sendDispls.end());
  o.recvCounts.assign(recvCounts.begin(), recvCounts.end());
  o.recvDispls.assign(recvDispls.begin(), recvDispls.end());
  runBlocking(impl_, std::move(o));
}
void Communicator::send(const void* buf, size_t count, DataType type, int peer) {
  runBlocking(impl_, makeOp(OpKind::Send, buf, nullptr, count, type, ReduceOp::Sum, -1, peer));
}
void Communicator::recv(void* buf, size_t count, DataType type, int peer) {
  runBlocking(impl_, makeOp(OpKind::Recv, nullptr, buf, count, type, ReduceOp::Sum, -1, peer));
}
// Device buffers: the same operations, enqueued on a stream (a null one: host buffers).
namespace {
void onStream(const std::shared_ptr<CommImpl>& impl, Op op, CudaStream stream) {
  if (stream.handle != nullptr)
    device::enqueue(impl, std::move(op), stream.handle);
  else
    runBlocking(impl, std::move(op));
}
}  // namespace

void Communicator::allReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                             CudaStream stream) {
  onStream(impl_, makeOp(OpKind::AllReduce, send, recv, count, type, op), stream);
}
void Communicator::reduceScatter(const void* send, void* recv, size_t recvCount, DataType type, ReduceOp op,
                                 CudaStream stream) {
  onStream(impl_, makeOp(OpKind::ReduceScatter, send, recv, recvCount, type, op), stream);
}
void Communicator::allGather(const void* send, void* recv, size_t sendCount, DataType type,
                             CudaStream stream) {
  onStream(impl_, makeOp(OpKind::AllGather, send, recv, sendCount, type), stream);
}
void Communicator::broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                             CudaStream stream) {
  onStream(impl_, makeOp(OpKind::Broadcast, send, recv, count, type, ReduceOp::Sum, root), stream);
}
void Communicator::reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root,
                          CudaStream stream) {
  onStream(impl_, makeOp(OpKind::Reduce, send, recv, count, type, op, root), stream);
}
void Communicator::allToAll(const void* send, void* recv, size_t count, DataType type, CudaStream stream) {
  onStream(impl_, makeOp(OpKind::AllToAll, send, recv, count, type), stream);
}
void Communicator::send(const void* buf, size_t count, DataType type, int peer, CudaStream stream) {
  onStream(impl_, makeOp(OpKind::Send, buf, nullptr, count, type, ReduceOp::Sum, -1, peer), stream);
}
void Communicator::recv(void* buf, size_t count, DataType type, int peer, CudaStream stream) {
  onStream(impl_, makeOp(OpKind::Recv, nullptr, buf, count, type, ReduceOp::Sum, -1, peer), stream);
}
void Communicator::barrier(CudaStream stream) {
  onStream(impl_, makeOp(OpKind::Barrier, nullptr, nullptr, 0, DataType::Uint8), stream);
}

void Communicator::barrier() {
  runBlocking(impl_, makeOp(OpKind::Barrier, nullptr, nullptr, 0, DataType::Uint8));
}

Work Communicator::allReduceAsync(const void* send, void* recv, size_t count, DataType type, ReduceOp op) {
  return runAsync(impl_, makeOp(OpKind::AllReduce, send, recv, count, type, op));
}
Work Communicator::reduceScatterAsync(const void* send, void* recv, size_t recvCount, DataType type,
                                      ReduceOp op) {
  return runAsync(impl_, makeOp(OpKind::ReduceScatter, send, recv, recvCount, type, op));
}
Work Communicator::allGatherAsync(const void* send, void* recv, size_t sendCount, DataType type) {
  return runAsync(impl_, makeOp(OpKind::AllGather, send, recv, sendCount, type));
}
Work Communicator::broadcastAsync(const void* send, void* recv, size_t count, DataType type, int root) {
  return runAsync(impl_, makeOp(OpKind::Broadcast, send, recv, count, type, ReduceOp::Sum, root));
}
Work Communicator::reduceAsync(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                               int root) {
  return runAsync(impl_, makeOp(OpKind::Reduce, send, recv, count, type, op, root));
}
Work Communicator::allToAllAsync(const void* send, void* recv, size_t count, DataType type) {
  return runAsync(impl_, makeOp(OpKind::AllToAll, send, recv, count, type));
}
Work Communicator::barrierAsync() {
  return runAsync(impl_, makeOp(OpKind::Barrier, nullptr, nullptr, 0, DataType::Uint8));
}

std::optional<Communicator> Communicator::split(int color, int key) {
  CommImpl& c = live(impl_);
  if (group::active()) fail(chorusInvalidUsage, "split cannot be called inside a group");
  c.checkUsable();
  auto child = c.split(color, key);
  if (!child) return std::nullopt;
  return Communicator(std::move(child));
}

Communicator Communicator::shrink(std::span<const int> excludeRanks) {
  CommImpl& c = live(impl_);
  if (group::active()) fail(chorusInvalidUsage, "shrink cannot be called inside a group");
  return Communicator(c.shrink(excludeRanks));
}

void Communicator::abort() { live(impl_).abort(); }
chorusResult_t api::asyncError(CommImpl& impl) {
  if (const chorusResult_t code = impl.asyncError(); code != chorusSuccess) return code;
  std::string text;
  const chorusResult_t code = device::asyncError(impl, &text);
  if (code != chorusSuccess) impl.setLastError(text);
  return code;
}

chorusResult_t Communicator::asyncError() const { return api::asyncError(live(impl_)); }
std::string Communicator::lastError() const { return live(impl_).lastError(); }
size_t Communicator::memoryBytes() const { return live(impl_).memoryBytes(); }

void Communicator::checkSpan(size_t expected, size_t got, const char* call) {
  if (expected != got)
    failInvalid(call, ": span sizes disagree (expected ", expected, " elements, got ", got, ")");
}

void* memAlloc(size_t bytes) { return transport::sharedAlloc(bytes); }
void memFree(void* ptr) { transport::sharedFree(ptr); }

void groupStart() { group::start(); }
void groupEnd() { group::end(); }

}  // namespace chorus
