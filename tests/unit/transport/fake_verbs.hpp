// An in-process fake of the ibverbs calls the RDMA transport makes (transports/ib/verbs_api.hpp):
// devices with ports, protection domains, memory regions with keys, completion queues and RC queue
// pairs whose RDMA writes (with and without immediate data, inline or not) copy into the peer's
// registered memory at once. What real hardware would refuse, the fake refuses the same way: a
// write to a queue pair that is gone completes with IBV_WC_RETRY_EXC_ERR and puts the writer in the
// error state; a wrong key or an address outside a region gives IBV_WC_REM_ACCESS_ERR; posting on
// a queue pair that is not ready to send fails with EINVAL; more work requests than the queue pair
// holds fail with ENOMEM. A write with immediate data waits for a posted receive (RNR).
#pragma once

#include <string>
#include <vector>

#include "transports/ib/verbs_api.hpp"

namespace chorus::transport::fake {

struct Device {
  std::string name = "fake_mlx5_0";
  bool active = true;  // port 1's state
  bool ethernet = false;
};

/// Sets the fake machine's devices (all state from earlier tests is forgotten). `listErrno` != 0:
/// ibv_get_device_list fails with it, as on a kernel without RDMA support (ENOSYS).
void reset(std::vector<Device> devices, int listErrno = 0);
/// The fake's function table.
const VerbsApi* api();
/// Counters for tests.
struct Stats {
  long writes = 0;         // RDMA writes executed
  long writesWithImm = 0;  // of which with immediate data
  long inlineWrites = 0;
  long maxSendQueue = 0;  // the most send work requests outstanding on one queue pair
};
Stats stats();

}  // namespace chorus::transport::fake
