// libnccl.so.2 from Chorus: the host side of NCCL's device API (nccl_device.h, experimental in
// NCCL, with no ABI promise). Chorus has no device-initiated communication, so what needs a device
// communicator is refused with ncclInvalidUsage and a message naming the call. What the host can
// honestly answer is answered: properties (deviceApiSupport false), teams, and the peer pointers
// of a window (host windows: the peer's buffer as mapped into this process).
#include <nccl.h>

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)  // the device API's host side came with 2.28
#include <nccl_device.h>

#include <string>

#include "frameworks/nccl/shim.hpp"

using shim::fromChorus;
using shim::refuse;

// What 2.30 added to it (properties, windows' peer pointers, signals) is named where it exists.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
#define SHIM_PROPERTIES_NOTE "; ncclCommQueryProperties reports deviceApiSupport = 0"
#define SHIM_SIGNAL_NOTE ", ncclPutSignal"
#else
#define SHIM_PROPERTIES_NOTE ""
#define SHIM_SIGNAL_NOTE ""
#endif

namespace {

ncclResult_t noDeviceApi(const char* call) {
  return refuse(ncclInvalidUsage, std::string(call) +
                                      ": NCCL's device API (communication started from CUDA kernels) is not "
                                      "built in Chorus's libnccl" SHIM_PROPERTIES_NOTE
                                      ". Use the host calls (collectives" SHIM_SIGNAL_NOTE ")");
}

// The handle's ranks on this host: Chorus numbers them in rank order, so the LSA team is
// contiguous when the job places ranks host by host (as launchers do).
bool localRanks(const ncclComm* comm, int* count, int* index) {
  chorusComm_t cc = nullptr;
  ncclResult_t err;
  if (!shim::resolve(comm, "ncclTeamLsa", &cc, &err)) return false;
  return chorusCommLocalRanks(cc, count, index) == chorusSuccess;
}

}  // namespace

SHIM_EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t, ncclDevCommRequirements_t const*, ncclDevComm_t*) {
  START
  return noDeviceApi("ncclDevCommCreate");
  END
}
SHIM_ALIAS(ncclDevCommCreate)

SHIM_EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t, ncclDevComm_t const*) {
  START
  return noDeviceApi("ncclDevCommDestroy");
  END
}
SHIM_ALIAS(ncclDevCommDestroy)

SHIM_EXPORT ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t, int, ncclLsaBarrierHandle_t*,
                                                         ncclDevResourceRequirements_t*) {
  START
  return noDeviceApi("ncclLsaBarrierCreateRequirement");
  END
}
SHIM_ALIAS(ncclLsaBarrierCreateRequirement)

SHIM_EXPORT ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t, ncclTeam_t, int, ncclGinBarrierHandle_t*,
                                                         ncclDevResourceRequirements_t*) {
  START
  return noDeviceApi("ncclGinBarrierCreateRequirement");
  END
}
SHIM_ALIAS(ncclGinBarrierCreateRequirement)

// Teams (NCCL's {nRanks, rank, stride}). A bad handle gives the empty team, with the reason as
// the last error. (The aliases name their type: nccl_device.h overloads these for device code.)
SHIM_EXPORT ncclTeam_t ncclTeamWorld(ncclComm_t comm) {
  chorusComm_t cc = nullptr;
  ncclResult_t err;
  if (!shim::resolve(comm, "ncclTeamWorld", &cc, &err)) return ncclTeam_t{0, 0, 0};
  return ncclTeam_t{comm->nranks, comm->rank, 1};
}
SHIM_EXPORT ncclTeam_t pncclTeamWorld(ncclComm_t) __attribute__((alias("ncclTeamWorld")));

SHIM_EXPORT ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  int count = 0, index = 0;
  if (!localRanks(comm, &count, &index)) return ncclTeam_t{0, 0, 0};
  return ncclTeam_t{count, index, 1};
}
SHIM_EXPORT ncclTeam_t pncclTeamLsa(ncclComm_t) __attribute__((alias("ncclTeamLsa")));

// The ranks of the other hosts with this rank's local index (hosts of equal size).
SHIM_EXPORT ncclTeam_t ncclTeamRail(ncclComm_t comm) {
  int count = 0, index = 0;
  if (!localRanks(comm, &count, &index)) return ncclTeam_t{0, 0, 0};
  return ncclTeam_t{comm->nranks / count, comm->rank / count, count};
}
SHIM_EXPORT ncclTeam_t pncclTeamRail(ncclComm_t) __attribute__((alias("ncclTeamRail")));

SHIM_EXPORT int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  chorusComm_t cc = nullptr;
  ncclResult_t err;
  if (!shim::resolve(comm, "ncclTeamRankToWorld", &cc, &err)) return -1;
  return comm->rank + (rank - team.rank) * team.stride;
}
SHIM_EXPORT int pncclTeamRankToWorld(ncclComm_t, ncclTeam_t, int)
    __attribute__((alias("ncclTeamRankToWorld")));

SHIM_EXPORT int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  int count = 0, index = 0;
  if (!localRanks(comm, &count, &index)) return -1;
  const int world = comm->rank + (rank - team.rank) * team.stride;
  const int lsa = world - (comm->rank - index);
  return lsa >= 0 && lsa < count ? lsa : -1;
}
SHIM_EXPORT int pncclTeamRankToLsa(ncclComm_t, ncclTeam_t, int) __attribute__((alias("ncclTeamRankToLsa")));

// Sizing of the device LL all-to-all: there is none, so 0 slots, with the reason as the last error.
SHIM_EXPORT int ncclLLA2ACalcSlots(int, int) {
  noDeviceApi("ncclLLA2ACalcSlots");
  return 0;
}
SHIM_ALIAS(ncclLLA2ACalcSlots)

SHIM_EXPORT ncclResult_t ncclLLA2ACreateRequirement(int, int, ncclLLA2AHandle_t*,
                                                    ncclDevResourceRequirements_t*) {
  START
  return noDeviceApi("ncclLLA2ACreateRequirement");
  END
}
SHIM_ALIAS(ncclLLA2ACreateRequirement)

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)

namespace {

ncclResult_t noMultimem(const char* call) {
  return refuse(ncclInvalidUsage, std::string(call) +
                                      ": Chorus's libnccl has no multimem (NVLink SHARP) memory; "
                                      "ncclCommQueryProperties reports multimemSupport = 0");
}

}  // namespace

SHIM_EXPORT ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props) {
  START
  if (!props) return refuse(ncclInvalidArgument, "ncclCommQueryProperties: props is NULL");
  if (props->magic != NCCL_API_MAGIC || props->size < sizeof(ncclCommProperties_t))
    return refuse(ncclInvalidArgument,
                  "ncclCommQueryProperties: props was not set from NCCL_COMM_PROPERTIES_INITIALIZER");
  RESOLVE(comm, "ncclCommQueryProperties");
  int local = 0, index = 0, device = -1;
  if (chorusResult_t r = chorusCommLocalRanks(cc, &local, &index); r != chorusSuccess) return fromChorus(r);
  if (chorusResult_t r = chorusCommCuDevice(cc, &device); r != chorusSuccess) return fromChorus(r);
  props->rank = comm->rank;
  props->nRanks = comm->nranks;
  props->cudaDev = device;
  props->nvmlDev = device;
  props->deviceApiSupport = false;
  props->multimemSupport = false;
  props->ginType = NCCL_GIN_TYPE_NONE;
  props->nLsaTeams = comm->nranks / (local > 0 ? local : 1);
  props->hostRmaSupport = local == comm->nranks;  // windows need every rank on one host
  props->railedGinType = NCCL_GIN_TYPE_NONE;
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclCommQueryProperties)

SHIM_EXPORT ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t, size_t, void**) {
  START
  return noMultimem("ncclGetLsaMultimemDevicePointer");
  END
}
SHIM_ALIAS(ncclGetLsaMultimemDevicePointer)

SHIM_EXPORT ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t, size_t, ncclMultimemHandle_t, void**) {
  START
  return noMultimem("ncclGetMultimemDevicePointer");
  END
}
SHIM_ALIAS(ncclGetMultimemDevicePointer)

// Windows are host memory here: the pointer is the peer's buffer mapped into this process, for
// the CPU (every rank of a window is on this host, so LSA ranks are the window's ranks).
SHIM_EXPORT ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank,
                                                 void** outPtr) {
  START
  return shim::windowPointer("ncclGetLsaDevicePointer", window, offset, lsaRank, outPtr);
  END
}
SHIM_ALIAS(ncclGetLsaDevicePointer)

SHIM_EXPORT ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer,
                                                  void** outPtr) {
  START
  return shim::windowPointer("ncclGetPeerDevicePointer", window, offset, peer, outPtr);
  END
}
SHIM_ALIAS(ncclGetPeerDevicePointer)

#endif  // NCCL 2.30
#endif  // NCCL 2.28
