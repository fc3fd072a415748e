// Builds without CUDA: every device-buffer call is refused with the reason.
#include "base/error.hpp"
#include "core/comm_impl.hpp"
#include "core/device.hpp"

namespace chorus::device {

bool built() { return false; }

bool available(std::string* state) {
  if (state) *state = "not built (configured with CHORUS_WITH_CUDA=OFF, or nvcc was not found)";
  return false;
}

void enqueue(const std::shared_ptr<CommImpl>& comm, Op op, void* stream) {
  (void)stream;
  fail(chorusInvalidArgument, strCat("rank ", comm->rank(), ": ", opKindName(op.kind),
                                     ": a stream was given but this build of Chorus has no CUDA support "
                                     "(pass a NULL stream for host buffers)"));
}

void bindDevices(const std::vector<std::shared_ptr<CommImpl>>& comms, const int* devices) {
  (void)comms;
  (void)devices;
  fail(chorusInvalidUsage,
       "chorusCommInitAll: a device list was given but this build of Chorus has no CUDA "
       "support (pass NULL for host buffers)");
}

int deviceOf(CommImpl& comm) {
  (void)comm;
  return -1;
}

chorusResult_t asyncError(CommImpl& comm, std::string* message) {
  (void)comm;
  (void)message;
  return chorusSuccess;
}

}  // namespace chorus::device
