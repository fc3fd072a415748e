// Calls on device buffers (a non-NULL stream). Implemented in src/device (device_api.cpp) where
// CUDA is built, and in core/device_none.cpp (every call refused) where it is not, so that the core
// never includes a CUDA header.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/op.hpp"
#include "chorus/chorus.hpp"

namespace chorus {

class CommImpl;

namespace device {

/// What the device path keeps per communicator (CommImpl::deviceState): src/device's communicator
/// where CUDA is built, never made otherwise.
class State {
 public:
  virtual ~State() = default;
};

/// True when this build can run device-buffer calls (a GPU may still be missing at run time).
bool built();

/// Whether device-buffer calls can run in this process, and what there is ("yes: 1 device: NVIDIA
/// H200 (sm_90, 139 GiB)", or why not). Never throws.
bool available(std::string* state);

/// Checks `op` as every call does (api::prepare; a build without CUDA refuses it before that), then
/// runs it on `stream`, a cudaStream_t: collectives of device buffers
/// whose ranks share a host are enqueued as one kernel and return at once; anything else is staged
/// through pinned host memory and returns when done. Inside a group, kernels are enqueued at once and
/// staged operations join the group. Throws chorus::Error.
void enqueue(const std::shared_ptr<CommImpl>& comm, Op op, void* stream);

/// Sets up device-buffer calls of `comms` (ranks of this process, as chorusCommInitAll makes them)
/// on devices[i] each, together. Throws chorus::Error.
void bindDevices(const std::vector<std::shared_ptr<CommImpl>>& comms, const int* devices);

/// The CUDA device `comm`'s device calls use (bound, or else the calling thread's current one); -1
/// where none is usable. Never throws.
int deviceOf(CommImpl& comm);

/// The failure a device kernel of `comm` reported (chorusSuccess if none); its text in `message`.
chorusResult_t asyncError(CommImpl& comm, std::string* message);

}  // namespace device
}  // namespace chorus
