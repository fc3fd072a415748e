// The calls of core/device.hpp over CUDA: each communicator's device state (device_state.hpp), set
// up on its first device call, and the path each call takes: a kernel over CUDA IPC
// (device_ipc.cpp) or staging through pinned host memory (device_staged.cpp).
#include <cuda_runtime.h>

#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "core/api.hpp"
#include "core/comm_impl.hpp"
#include "core/device.hpp"
#include "device/device_state.hpp"
#include "tuning/tuning.hpp"

namespace chorus::device {

namespace detail {

// Device memory of this rank's device (kernels can use it), or any other memory cudaMemcpy takes.
bool onDevice(const void* p, int device, int rank, const char* what, OpKind kind) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (attr.type == cudaMemoryTypeDevice && attr.device != device) {
    fail(chorusInvalidArgument,
         strCat("rank ", rank, ": ", opKindName(kind), ": the ", what, " buffer is on device ", attr.device,
                " but this rank uses device ", device, " (cudaSetDevice before the call)"));
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

}  // namespace detail

namespace {

using detail::cudaText;
using detail::DeviceComm;
using detail::OnDevice;
using detail::onDevice;

// The communicator's device state, set up (collectively) on first use.
DeviceComm& stateOf(CommImpl& comm, int device = -1) {
  std::lock_guard lk(comm.deviceMutex());
  auto& slot = comm.deviceState();
  if (!slot) {
    auto d = std::make_shared<DeviceComm>(comm, device);
    comm.setAbortHook([w = std::weak_ptr<DeviceComm>(d)] {
      if (auto p = w.lock()) p->abortKernels();
    });
    slot = d;
  }
  return *static_cast<DeviceComm*>(slot.get());
}

}  // namespace

bool built() { return true; }

bool available(std::string* state) {
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    if (state)
      *state =
          strCat("built, not usable here: ", e != cudaSuccess ? cudaText(e) : std::string("no CUDA device"));
    return false;
  }
  if (state) {
    *state = strCat("yes: ", n, " device(s):");
    for (int d = 0; d < n; ++d) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, d) == cudaSuccess) {
        *state += strCat(d == 0 ? " " : "; ", prop.name, " (sm_", prop.major, prop.minor, ", ",
                         prop.totalGlobalMem >> 30, " GiB)");
      } else {
        (void)cudaGetLastError();
      }
    }
  }
  return true;
}

void enqueue(const std::shared_ptr<CommImpl>& comm, Op op, void* streamv) {
  CommImpl& c = *comm;
  api::prepare(c, op);
  c.checkUsable();
  DeviceComm& d = stateOf(c);
  d.throwIfFailed();
  const OnDevice on(d.device());
  auto stream = static_cast<cudaStream_t>(streamv);
  const tuning::DeviceAbilities can{.collectiveKernels = d.ipc(), .pointToPointKernels = d.p2pKernels()};
  const auto onThisDevice = [&](bool send) {
    return send ? onDevice(op.send, d.device(), c.rank(), "send", op.kind)
                : onDevice(op.recv, d.device(), c.rank(), "receive", op.kind);
  };
  switch (tuning::devicePath(op, c.rank(), c.size(), can, onThisDevice)) {
    case tuning::DevicePath::Nothing:
      return;
    case tuning::DevicePath::PointToPointKernel:
      d.p2p(comm, op, stream);
      return;
    case tuning::DevicePath::AllToAllvKernel:
      d.allToAllv(c, op, stream);
      return;
    case tuning::DevicePath::CollectiveKernel:
      d.launch(c, op, stream);
      return;
    case tuning::DevicePath::ThroughHost:
      break;
  }
  d.staged(comm, std::move(op), stream);
}

void bindDevices(const std::vector<std::shared_ptr<CommImpl>>& comms, const int* devices) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(comms.size());
  for (size_t i = 0; i < comms.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        if (devices[i] < 0) failInvalid("rank ", i, ": device ", devices[i], " in devlist is negative");
        stateOf(*comms[i], devices[i]);
      } catch (...) {
        errors[i] = std::current_exception();
        comms[i]->abort();  // the others' set-up fails at once instead of waiting
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

int deviceOf(CommImpl& comm) {
  {
    std::lock_guard lk(comm.deviceMutex());
    if (const auto& state = comm.deviceState()) return static_cast<DeviceComm*>(state.get())->device();
  }
  int n = 0, d = -1;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return d;
}

chorusResult_t asyncError(CommImpl& comm, std::string* message) {
  std::shared_ptr<State> state;
  {
    std::lock_guard lk(comm.deviceMutex());
    state = comm.deviceState();
  }
  if (!state) return chorusSuccess;
  return static_cast<DeviceComm*>(state.get())->error(message);
}

}  // namespace chorus::device
