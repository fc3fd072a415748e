// The public C++ Communicator: builds an Op and hands it to core/api.cpp (checks, then the host or
// device path, or the current group).
#include "base/error.hpp"
#include "bootstrap/env_init.hpp"
#include "core/api.hpp"
#include "core/comm_impl.hpp"
#include "core/group.hpp"
#include "topology/stage_probe.hpp"
#include "transports/shm/shm_memory.hpp"

namespace chorus {

Config Config::fromEnvironment() {
  Config c = resolveConfig(Config{});
  if (c.shmStageBytes == 0) c.shmStageBytes = topo::localStageChoice().bytes;
  return c;
}

using api::live;
using api::makeOp;
using api::runAsync;
using api::runBlocking;

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
  runBlocking(impl_, api::makeAllToAllv(send, sendCounts, sendDispls, recv, recvCounts, recvDispls, type));
}
void Communicator::send(const void* buf, size_t count, DataType type, int peer) {
  runBlocking(impl_, makeOp(OpKind::Send, buf, nullptr, count, type, ReduceOp::Sum, -1, peer));
}
void Communicator::recv(void* buf, size_t count, DataType type, int peer) {
  runBlocking(impl_, makeOp(OpKind::Recv, nullptr, buf, count, type, ReduceOp::Sum, -1, peer));
}
// Device buffers: the same operations, enqueued on a stream (a null one: host buffers).
namespace {
void onStream(const std::shared_ptr<CommImpl>& impl, Op&& op, CudaStream stream) {
  api::run(impl, std::move(op), stream.handle);
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
  auto child = api::split(live(impl_), color, key, "split");
  if (!child) return std::nullopt;
  return Communicator(std::move(child));
}

Communicator Communicator::shrink(std::span<const int> excludeRanks) {
  return Communicator(api::shrink(live(impl_), excludeRanks, "shrink"));
}

void Communicator::abort() { live(impl_).abort(); }
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
