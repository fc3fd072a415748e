// The device communicator's kernels over CUDA IPC (device_state.hpp): a collective as one kernel
// over the peers' mapped workspaces; sends and receives (one call, a group's worth, or an
// all-to-all-v) as one kernel moving chunks through FIFOs in the receivers' workspaces.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "core/comm_impl.hpp"
#include "core/group.hpp"
#include "device/device_state.hpp"

namespace chorus::device::detail {

namespace {

ipc::Kind ipcKind(OpKind k) {
  switch (k) {
    case OpKind::ReduceScatter:
      return ipc::Kind::ReduceScatter;
    case OpKind::AllGather:
      return ipc::Kind::AllGather;
    case OpKind::Broadcast:
      return ipc::Kind::Broadcast;
    case OpKind::Reduce:
      return ipc::Kind::Reduce;
    case OpKind::AllToAll:
      return ipc::Kind::AllToAll;
    default:
      return ipc::Kind::AllReduce;
  }
}

// The sends and receives of this thread's current group, per communicator, until the group ends
// (thread-local, as the group is).
thread_local std::vector<std::pair<DeviceComm*, std::shared_ptr<P2pList>>> tGroupP2p;

}  // namespace

void DeviceComm::launch(CommImpl& comm, const Op& op, cudaStream_t stream) {
  throwIfFailed();
  const bool captured = capturing(stream);
  if (!captured) orderAfterPrevious(stream);
  ipc::Call c;
  c.kind = ipcKind(op.kind);
  c.type = op.type;
  c.op = op.op;
  c.root = op.root < 0 ? 0 : op.root;
  c.send = op.send;
  c.recv = op.recv;
  c.count = op.count;
  c.rank = rank_;
  c.nranks = size_;
  for (int r = 0; r < size_; ++r) c.ws[r] = ws_[r];
  c.layout = layout_;
  c.maxBlocks = maxBlocks_;
  c.llMaxBytes = llMax_;
  c.abortFlag = devWords_;
  c.errorWord = devWords_ + 1;
  c.errorDetail = devWords_ + 4;
  const auto t = op.timeout.count() > 0 ? op.timeout : comm.config().timeout;
  c.timeoutNs = static_cast<uint64_t>(t.count()) * 1'000'000ull;
  timeoutMs_ = t.count();  // for the message, should this call time out
  ipc::launch(c, stream);
  if (!captured) markDone(stream);
}

void DeviceComm::p2p(const std::shared_ptr<CommImpl>& comm, const Op& op, cudaStream_t stream) {
  if (!group::active()) {
    launchP2p(*comm, P2pList{{op, stream}});
    return;
  }
  // In a group, all of this communicator's sends and receives run as one kernel at the group's
  // end (after its collectives, as on the host), launched before anything there waits, so that
  // the two ends of an exchange never wait for each other's next kernel.
  auto it = std::find_if(tGroupP2p.begin(), tGroupP2p.end(), [&](const auto& e) { return e.first == this; });
  if (it == tGroupP2p.end()) {
    auto list = std::make_shared<P2pList>();
    group::launch([this, comm, list] {
      std::erase_if(tGroupP2p, [&](const auto& e) { return e.second == list; });
      const OnDevice on(device_);
      launchP2p(*comm, *list);
    });
    tGroupP2p.emplace_back(this, list);
    it = tGroupP2p.end() - 1;
  }
  // Refused here, on the call that goes over, rather than at the group's end.
  if (it->second->size() >= static_cast<size_t>(ipc::kMaxP2pOps)) {
    fail(chorusInvalidUsage,
         strCat("rank ", rank_, ": ", opKindName(op.kind), ": a group holds at most ", ipc::kMaxP2pOps,
                " sends and receives of device buffers per communicator (they run as one "
                "kernel)"));
  }
  it->second->emplace_back(op, stream);
}

void DeviceComm::launchP2p(CommImpl& comm, const P2pList& ops) {
  throwIfFailed();
  if (ops.empty()) return;
  if (ops.size() > static_cast<size_t>(ipc::kMaxP2pOps)) {
    fail(chorusInvalidUsage, strCat("rank ", rank_, ": a group holds ", ops.size(),
                                    " sends and receives of device buffers on one communicator; at most ",
                                    ipc::kMaxP2pOps, " run together"));
  }
  ipc::P2pCall c;
  ipc::P2pArgs& a = c.args;
  for (int r = 0; r < size_; ++r) a.ws[r] = static_cast<ipc::Byte*>(ws_[r]);
  a.layout = layout_;
  a.rank = rank_;
  a.nranks = size_;
  a.channelsCap = p2pCap_;
  for (const auto& [op, s] : ops) {
    const bool send = op.kind == OpKind::Send;
    a.ops[a.nOps++] = ipc::P2pOp{static_cast<ipc::Byte*>(send ? const_cast<void*>(op.send) : op.recv),
                                 op.messageBytes(), op.peer, send ? 1 : 0};
  }
  if (ipc::planP2pLanes(a) == 0) return;  // empty messages only
  c.abortFlag = devWords_;
  c.errorWord = devWords_ + 1;
  c.errorDetail = devWords_ + 4;
  const auto t = ops.front().first.timeout.count() > 0 ? ops.front().first.timeout : comm.config().timeout;
  c.timeoutNs = static_cast<uint64_t>(t.count()) * 1'000'000ull;
  timeoutMs_ = t.count();
  const cudaStream_t stream = ops.front().second;
  std::vector<cudaStream_t> others;
  for (const auto& [op, s] : ops) {
    if (s != stream && std::find(others.begin(), others.end(), s) == others.end()) others.push_back(s);
  }
  const bool captured = capturing(stream);
  for (cudaStream_t s : others) {
    if (capturing(s) != captured)
      fail(chorusInvalidUsage, strCat("rank ", rank_,
                                      ": the sends and receives of a group are on streams of which some are "
                                      "being captured into a CUDA graph and some are not"));
  }
  if (!captured) orderAfterPrevious(stream);
  for (cudaStream_t s : others) {  // the kernel starts once every stream of the group got there
    check(cudaEventRecord(join_.e, s), rank_, "cudaEventRecord");
    check(cudaStreamWaitEvent(stream, join_.e, 0), rank_, "cudaStreamWaitEvent");
  }
  ipc::launchP2p(c, stream);
  if (!captured) markDone(stream);
  if (!others.empty()) {  // and every stream goes on once it is done
    check(cudaEventRecord(join_.e, stream), rank_, "cudaEventRecord");
    for (cudaStream_t s : others) check(cudaStreamWaitEvent(s, join_.e, 0), rank_, "cudaStreamWaitEvent");
  }
}

void DeviceComm::allToAllv(CommImpl& comm, const Op& op, cudaStream_t stream) {
  P2pList list;
  const size_t e = dataTypeSize(op.type);
  for (int q = 0; q < size_; ++q) {
    const auto Q = static_cast<size_t>(q);
    Op send = op, recv = op;  // an empty block's buffer and displacement are never used
    send.kind = OpKind::Send;
    send.peer = q;
    send.count = op.sendCounts()[Q];
    if (send.count > 0) send.send = static_cast<const std::byte*>(op.send) + op.sendDispls()[Q] * e;
    recv.kind = OpKind::Recv;
    recv.peer = q;
    recv.count = op.recvCounts()[Q];
    if (recv.count > 0) recv.recv = static_cast<std::byte*>(op.recv) + op.recvDispls()[Q] * e;
    for (Op* o : {&send, &recv}) {
      o->layout.reset();
      if (o->count > 0) list.emplace_back(std::move(*o), stream);
    }
  }
  launchP2p(comm, list);
}

}  // namespace chorus::device::detail
