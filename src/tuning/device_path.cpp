// The choice of path for a call on a CUDA stream (tuning.hpp). Pure: the device code supplies its
// abilities and the buffer check, and runs the path this returns.
#include "tuning/tuning.hpp"

namespace chorus::tuning {

namespace {

bool hasCollectiveKernel(OpKind k) {
  return k == OpKind::AllReduce || k == OpKind::ReduceScatter || k == OpKind::AllGather ||
         k == OpKind::Broadcast || k == OpKind::Reduce || k == OpKind::AllToAll;
}

}  // namespace

const char* devicePathName(DevicePath path) {
  switch (path) {
    case DevicePath::Nothing:
      return "nothing";
    case DevicePath::PointToPointKernel:
      return "p2p-kernel";
    case DevicePath::AllToAllvKernel:
      return "alltoallv-kernel";
    case DevicePath::CollectiveKernel:
      return "ipc-kernel";
    case DevicePath::ThroughHost:
      return "through-host";
  }
  return "unknown";
}

DevicePath devicePath(const Op& op, int rank, int nranks, const DeviceAbilities& can,
                      const IsDeviceBuffer& onDevice) {
  if (can.pointToPointKernels && op.isPointToPoint()) {
    // The peer takes the same path when it passes device memory too (which device calls require).
    if (op.count == 0) return DevicePath::Nothing;
    if (onDevice(op.kind == OpKind::Send)) return DevicePath::PointToPointKernel;
  }
  if (can.pointToPointKernels && op.kind == OpKind::AllToAllv) {
    const auto [in, out] = op.bufferBytes(rank, nranks);
    if (in == 0 && out == 0)
      return DevicePath::Nothing;  // every peer sends this rank nothing, expects nothing
    if ((in == 0 || onDevice(true)) && (out == 0 || onDevice(false))) return DevicePath::AllToAllvKernel;
  }
  if (can.collectiveKernels && hasCollectiveKernel(op.kind)) {
    const bool sends = op.kind != OpKind::Broadcast || op.root == rank;
    const bool receives = op.kind != OpKind::Reduce || op.root == rank;
    // The kernel path needs device memory on every rank, which the API requires of device calls
    // (host memory with a stream is staged, on every rank alike).
    if ((!sends || onDevice(true)) && (!receives || onDevice(false)))
      return op.count > 0 ? DevicePath::CollectiveKernel : DevicePath::Nothing;
  }
  return DevicePath::ThroughHost;
}

}  // namespace chorus::tuning
