// The device communicator's staged path (device_state.hpp): a call that no kernel over CUDA IPC
// runs is copied into pinned host memory, run by the host path on the communicator's worker, and
// copied back, all in order on the call's stream.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

#include "core/comm_impl.hpp"
#include "core/group.hpp"
#include "device/device_state.hpp"

namespace chorus::device::detail {

namespace {

// [p, p + bytes) lies inside [base, base + baseBytes).
bool inside(const void* p, size_t bytes, const void* base, size_t baseBytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto b = reinterpret_cast<uintptr_t>(base);
  return bytes > 0 && a >= b && a + bytes <= b + baseBytes;
}

}  // namespace

cudaEvent_t DeviceComm::takeEvent() {
  if (!freeEvents_.free.empty()) {
    cudaEvent_t e = freeEvents_.free.back();
    freeEvents_.free.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), rank_, "cudaEventCreate");
  return e;
}

// Staged operations whose copy back is done give back their buffers and events (in call order:
// one stream's work completes in order, and later calls wait for earlier ones).
void DeviceComm::reapInFlight() {
  const uint32_t finished = std::atomic_ref<uint32_t>(reinterpret_cast<uint32_t*>(words_->get())[2]).load();
  while (!inFlight_.empty()) {
    const InFlight& f = inFlight_.front();
    // Both: the stream may give up on the host (abort) before the host has run the operation.
    if (static_cast<int32_t>(finished - f.ticket) < 0) return;
    const cudaError_t e = cudaEventQuery(f.copiedBack);
    if (e != cudaSuccess) {
      if (e != cudaErrorNotReady) (void)cudaGetLastError();  // a broken context: keep them
      return;
    }
    freeEvents_.free.insert(freeEvents_.free.end(), {f.copiedIn, f.copiedBack});
    inFlight_.pop_front();
  }
}

// The pinned buffers of a staged call, and `op` pointed at them instead of the caller's.
DeviceComm::Staging DeviceComm::stage(Op& op) {
  const auto [inBytes, outBytes] = op.bufferBytes(rank_, size_);
  // One pinned buffer when the call is in place (one buffer inside the other), else two. A
  // non-root of Reduce still gets a receive buffer (unused, never copied back).
  const size_t outAlloc = op.kind == OpKind::Reduce ? op.count * dataTypeSize(op.type) : outBytes;
  std::shared_ptr<Pinned> out = pool_->acquire(outAlloc);
  std::shared_ptr<Pinned> in;
  std::byte* hostSend = nullptr;
  std::byte* hostRecv = out->get();
  if (inside(op.send, inBytes, op.recv, outBytes)) {
    hostSend = out->get() + (static_cast<const std::byte*>(op.send) - static_cast<const std::byte*>(op.recv));
  } else if (inBytes > 0) {
    in = pool_->acquire(inBytes);
    hostSend = in->get();
    if (inside(op.recv, outBytes, op.send, inBytes)) {
      hostRecv = in->get() + (static_cast<std::byte*>(op.recv) - static_cast<const std::byte*>(op.send));
      out.reset();
    }
  }
  const void* devSend = op.send;
  void* devRecv = op.recv;
  const bool hasRecv = op.recv != nullptr;
  // A non-root of Broadcast passes its receive buffer as the (unread) send buffer.
  op.send = hostSend ? hostSend : (op.send ? hostRecv : nullptr);
  op.recv = hasRecv ? hostRecv : nullptr;
  return {inBytes, outBytes, std::move(in), std::move(out), devSend, devRecv, hostSend, hostRecv};
}

void DeviceComm::staged(const std::shared_ptr<CommImpl>& comm, Op op, cudaStream_t stream) {
  if (capturing(stream)) {
    fail(chorusInvalidUsage, strCat("rank ", rank_, ": ", opKindName(op.kind),
                                    " on device buffers is staged through host memory here and cannot be "
                                    "captured in a CUDA graph (only collectives over CUDA IPC can)"));
  }
  {
    // Buffers of the calls that are done back in the pool first, so that this one reuses them.
    const std::lock_guard lk(stagedMu_);
    reapInFlight();
  }
  const Staging s = stage(op);
  // The input once the stream (and this communicator's previous call) has produced it; the output
  // back on the stream. Both on the call's stream: a copy on the legacy stream would wait for
  // every blocking stream, a peer's waiting kernel among them.
  // `comm` keeps this DeviceComm (its device state) alive until the lambdas have run.
  auto copyIn = [this, comm, devSend = s.devSend, hostSend = s.hostSend, inBytes = s.inBytes, stream] {
    const OnDevice on(device_);
    orderAfterPrevious(stream);
    if (inBytes > 0)
      check(cudaMemcpyAsync(hostSend, devSend, inBytes, cudaMemcpyDefault, stream), rank_,
            "staging copy to host");
    check(cudaStreamSynchronize(stream), rank_, "cudaStreamSynchronize before a staged call");
  };
  auto copyBack = [this, comm, in = s.in, out = s.out, hostRecv = s.hostRecv, devRecv = s.devRecv,
                   outBytes = s.outBytes, stream] {
    const OnDevice on(device_);
    if (outBytes > 0)
      check(cudaMemcpyAsync(devRecv, hostRecv, outBytes, cudaMemcpyDefault, stream), rank_,
            "staging copy to device");
    markDone(stream);
    check(cudaStreamSynchronize(stream), rank_, "cudaStreamSynchronize after a staged call");
  };
  if (group::active()) {
    // At the group's end: kernels launched in the group (for peers driven by this thread too) are
    // all enqueued by then. The group returns when done.
    group::add(comm, std::move(op));
    group::prepare(std::move(copyIn));
    group::defer(std::move(copyBack));
    return;
  }
  // Host memory on the caller's side: copies between host buffers are synchronous, so the call
  // runs to completion, as in a group.
  const bool callerOnDevice =
      (s.inBytes == 0 || onDevice(s.devSend, device_, rank_, "send", OpKind::Barrier)) &&
      (s.outBytes == 0 || onDevice(s.devRecv, device_, rank_, "receive", OpKind::Barrier));
  if (!callerOnDevice) {
    copyIn();
    comm->runInTurn(op);
    copyBack();
    return;
  }
  enqueueStaged(comm, std::move(op), s, stream);
}

// Outside a group, enqueued like a kernel and the call returns: on the stream, the copy to host
// memory, a one-thread kernel that holds the stream until the host has run the operation, and
// the copy back. The host runs it on the communicator's worker, in call order with every other
// operation of the communicator, once the copy to host memory is done.
void DeviceComm::enqueueStaged(const std::shared_ptr<CommImpl>& comm, Op op, const Staging& s,
                               cudaStream_t stream) {
  const OnDevice on(device_);
  const std::lock_guard lk(stagedMu_);
  reapInFlight();
  auto* words = reinterpret_cast<uint32_t*>(words_->get());
  const uint32_t ticket = ++stagedTicket_;
  inFlight_.push_back({s.in, s.out, takeEvent(), takeEvent(), ticket});
  const cudaEvent_t copiedIn = inFlight_.back().copiedIn, copiedBack = inFlight_.back().copiedBack;
  // Should anything below fail once the wait kernel may be enqueued, the stream must not wait for
  // a host operation that will never run: released here (and the error thrown).
  struct Release {
    uint32_t* words;
    uint32_t ticket;
    bool armed = true;
    ~Release() {
      if (!armed) return;
      std::atomic_ref<uint32_t>(words[3]).store(ticket, std::memory_order_release);
      std::atomic_ref<uint32_t>(words[2]).store(ticket, std::memory_order_release);
    }
  } release{words, ticket};
  orderAfterPrevious(stream);
  if (s.inBytes > 0)
    check(cudaMemcpyAsync(s.hostSend, s.devSend, s.inBytes, cudaMemcpyDefault, stream), rank_,
          "staging copy to host");
  check(cudaEventRecord(copiedIn, stream), rank_, "cudaEventRecord");
  const auto t = op.timeout.count() > 0 ? op.timeout : comm->config().timeout;
  timeoutMs_ = t.count();
  // From when the host begins: the wait for the copy, then the operation, each within the timeout.
  ipc::launchWaitForHost(devWords_ + 2, devWords_ + 3, ticket, devWords_, devWords_ + 1,
                         2 * static_cast<uint64_t>(t.count()) * 1'000'000ull, stream);
  if (s.outBytes > 0)
    check(cudaMemcpyAsync(s.devRecv, s.hostRecv, s.outBytes, cudaMemcpyDefault, stream), rank_,
          "staging copy to device");
  check(cudaEventRecord(copiedBack, stream), rank_, "cudaEventRecord");
  markDone(stream);
  // Not `comm` in the hooks: the worker must never hold the last reference to its communicator.
  CommImpl::Hooks hooks;
  hooks.before = [copiedIn, words, ticket, t, rank = rank_, device = device_] {
    std::atomic_ref<uint32_t>(words[3]).store(ticket, std::memory_order_release);
    if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();  // no context made on device 0
    const auto deadline = std::chrono::steady_clock::now() + t;
    cudaError_t e;
    while ((e = cudaEventQuery(copiedIn)) == cudaErrorNotReady) {
      if (std::atomic_ref<uint32_t>(words[0]).load() != 0)
        fail(chorusRemoteError, strCat("rank ", rank, ": the communicator was aborted"));
      if (std::chrono::steady_clock::now() > deadline) {
        fail(chorusTimeout, strCat("rank ", rank,
                                   ": the input of a staged operation did not reach host memory "
                                   "within ",
                                   t.count() / 1000.0, " s (its stream did not get there)"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    check(e, rank, "waiting for the staging copy to host memory");
  };
  // Also after a failure (reported by asyncError): the stream goes on rather than wait.
  hooks.after = [words, ticket](chorusResult_t) {
    std::atomic_ref<uint32_t>(words[2]).store(ticket, std::memory_order_release);
  };
  comm->submit({std::move(op)}, true, std::move(hooks));
  release.armed = false;
}

}  // namespace chorus::device::detail
