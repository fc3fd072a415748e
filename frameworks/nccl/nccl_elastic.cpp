// libnccl.so.2 from Chorus: the calls that change a communicator's membership or state. Scalable
// init, revoke, and (NCCL 2.30) grow, suspend / resume and memory statistics.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "frameworks/nccl/shim.hpp"

using shim::fromChorus;
using shim::refuse;

namespace {

// FNV-1a over the ids, to compare the lists of every rank.
uint64_t fingerprint(const ncclUniqueId* ids, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; ++i)
    for (char ch : ids[i].internal) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h ^ static_cast<uint64_t>(n);
}

}  // namespace

// Chorus's store serves every rank from one id, so the first id is the rendezvous; the others
// must match on every rank (as NCCL requires), which is checked right after creation.
SHIM_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                  ncclUniqueId* commIds, ncclConfig_t* config) {
  START
  ncclResult_t out;
  if (!shim::configOk("ncclCommInitRankScalable", config, &out)) return out;
  if (!newcomm) return refuse(ncclInvalidArgument, "ncclCommInitRankScalable: newcomm is NULL");
  *newcomm = nullptr;
  if (commIds == nullptr || nId < 1 || nId > std::max(nranks, 1))
    return refuse(ncclInvalidArgument, "ncclCommInitRankScalable: nId " + std::to_string(nId) +
                                           " must be 1 to nranks (" + std::to_string(nranks) +
                                           ") with commIds non-NULL");
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, commIds[0], myrank, config); r != ncclSuccess)
    return r;
  const uint64_t mine = fingerprint(commIds, nId);
  std::vector<uint64_t> all(static_cast<size_t>(nranks));
  chorusResult_t r = chorusAllGather(&mine, all.data(), 1, chorusUint64, comm->c, nullptr);
  std::string differ;
  for (int i = 0; r == chorusSuccess && i < nranks; ++i)
    if (all[static_cast<size_t>(i)] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(i);
  if (r != chorusSuccess || !differ.empty()) {
    ncclCommDestroy(comm);
    if (r != chorusSuccess) return fromChorus(r);
    return refuse(ncclInvalidArgument,
                  "ncclCommInitRankScalable: rank(s) " + differ +
                      " passed other unique ids (or another nId) than rank 0; every rank must pass the same "
                      "list in the same order");
  }
  *newcomm = comm;
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclCommInitRankScalable)

// Stops the pending operations (they fail) and tells the peers; the communicator can then only be
// destroyed, shrunk or split (split goes through a shrink, which works on a revoked one).
SHIM_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  START
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return refuse(ncclInvalidArgument, "ncclCommRevoke: revokeFlags must be NCCL_REVOKE_DEFAULT (0), got " +
                                           std::to_string(revokeFlags));
  RESOLVE(comm, "ncclCommRevoke");
  if (comm->revoked) return ncclSuccess;
  const chorusResult_t r = chorusCommRevoke(cc);
  if (r == chorusSuccess) comm->revoked = true;
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclCommRevoke)

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)

namespace {
std::string rankText(const ncclComm* comm) { return "rank " + std::to_string(comm->rank); }
}  // namespace

SHIM_EXPORT ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId) {
  START
  if (!uniqueId) return refuse(ncclInvalidArgument, "ncclCommGetUniqueId: uniqueId is NULL");
  RESOLVE(comm, "ncclCommGetUniqueId");
  (void)cc;
  if (comm->growIdPending)
    return refuse(ncclInvalidUsage, "ncclCommGetUniqueId: " + rankText(comm) +
                                        ": the id made earlier has not been consumed by ncclCommGrow yet");
  chorusUniqueId id;
  const chorusResult_t r = chorusGetUniqueId(&id);
  if (r != chorusSuccess) return fromChorus(r);
  comm->growId = id;
  comm->growIdPending = true;
  std::memcpy(uniqueId, &id, sizeof id);
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclCommGetUniqueId)

// The existing ranks keep their ranks; the new ones take rank..nRanks-1. The existing ranks learn
// the root's id from one all-gather over the old communicator, then every rank joins a new
// Chorus communicator of nRanks on that id. The old communicator stays usable.
SHIM_EXPORT ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                                      ncclComm_t* newcomm, ncclConfig_t* config) {
  START
  ncclResult_t out;
  if (!shim::configOk("ncclCommGrow", config, &out)) return out;
  if (!newcomm) return refuse(ncclInvalidArgument, "ncclCommGrow: newcomm is NULL");
  *newcomm = nullptr;
  if (shim::groupDepth() > 0) return refuse(ncclInvalidUsage, "ncclCommGrow cannot be called inside a group");
  chorusUniqueId id;
  int newRank = rank;
  if (comm == nullptr) {  // a new rank
    if (!uniqueId)
      return refuse(ncclInvalidArgument, "ncclCommGrow: a new rank (comm NULL) must pass the uniqueId");
    if (rank < 0 || rank >= nRanks)
      return refuse(ncclInvalidArgument, "ncclCommGrow: a new rank's rank " + std::to_string(rank) +
                                             " is not in [0, " + std::to_string(nRanks) + ")");
    std::memcpy(&id, uniqueId, sizeof id);
  } else {
    RESOLVE(comm, "ncclCommGrow");
    if (rank != -1)
      return refuse(ncclInvalidArgument, "ncclCommGrow: " + rankText(comm) +
                                             ": existing ranks pass rank -1, got " + std::to_string(rank));
    if (nRanks <= comm->nranks)
      return refuse(ncclInvalidArgument, "ncclCommGrow: " + rankText(comm) + ": nRanks " +
                                             std::to_string(nRanks) + " does not exceed the communicator's " +
                                             std::to_string(comm->nranks));
    // 0: no id; 1: the id from this rank's ncclCommGetUniqueId; 2: some other id.
    struct Offer {
      int32_t kind;
      chorusUniqueId id;
    } mine{}, none{};
    if (uniqueId) {
      std::memcpy(&mine.id, uniqueId, sizeof mine.id);
      mine.kind = comm->growIdPending && std::memcmp(&mine.id, &comm->growId, sizeof mine.id) == 0 ? 1 : 2;
    }
    std::vector<Offer> all(static_cast<size_t>(comm->nranks), none);
    const chorusResult_t r = chorusAllGather(&mine, all.data(), sizeof(Offer), chorusUint8, cc, nullptr);
    if (r != chorusSuccess) return fromChorus(r);
    std::string roots, bad;
    const Offer* root = nullptr;
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i].kind == 0) continue;
      roots += (roots.empty() ? "" : ", ") + std::to_string(i);
      if (all[i].kind == 2) bad += (bad.empty() ? "" : ", ") + std::to_string(i);
      root = &all[i];
    }
    if (!bad.empty())
      return refuse(ncclInvalidArgument, "ncclCommGrow: rank(s) " + bad +
                                             " passed an id their ncclCommGetUniqueId did not make (or one "
                                             "already consumed)");
    if (root == nullptr || roots.find(',') != std::string::npos)
      return refuse(
          ncclInvalidUsage,
          "ncclCommGrow: exactly one existing rank (the root) passes the id from ncclCommGetUniqueId; "
          "the others pass NULL. Passed by: " +
              (roots.empty() ? std::string("none") : roots));
    id = root->id;
    newRank = comm->rank;
    if (uniqueId) comm->growIdPending = false;
  }
  chorusComm_t c = nullptr;
  const chorusResult_t r = chorusCommInitRank(&c, nRanks, id, newRank);
  if (r == chorusSuccess) *newcomm = shim::wrap(c);
  return fromChorus(r);
  END
}
SHIM_ALIAS(ncclCommGrow)

// NCCL_SUSPEND_MEM frees everything the Chorus communicator holds (shared-memory segments,
// staging, network buffers, device workspaces) by destroying it; rank 0 first hands every rank the
// id of the rendezvous that ncclCommResume re-creates it on. flags 0 suspends without freeing.
SHIM_EXPORT ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  START
  if (flags & ~NCCL_SUSPEND_MEM)
    return refuse(ncclInvalidArgument, "ncclCommSuspend: unknown flags " + std::to_string(flags));
  RESOLVE(comm, "ncclCommSuspend");
  if (shim::groupDepth() > 0)
    return refuse(ncclInvalidUsage, "ncclCommSuspend cannot be called inside a group");
  if (comm->revoked)
    return refuse(ncclInvalidUsage, "ncclCommSuspend: " + rankText(comm) + ": the communicator was revoked");
  if (comm->windows > 0)
    return refuse(ncclInvalidUsage, "ncclCommSuspend: " + rankText(comm) + ": " +
                                        std::to_string(comm->windows) +
                                        " window(s) are registered; deregister them first");
  if (flags & NCCL_SUSPEND_MEM) {
    chorusUniqueId id{};
    chorusResult_t r = comm->rank == 0 ? chorusGetUniqueId(&id) : chorusSuccess;
    // Every rank takes part in the broadcast, so a failure on rank 0 reaches the others too.
    const chorusResult_t b = chorusBroadcast(&id, &id, sizeof id, chorusUint8, 0, cc, nullptr);
    if (r != chorusSuccess) return fromChorus(r);
    if (b != chorusSuccess) return fromChorus(b);
    comm->resumeId = id;
    comm->c = nullptr;
    r = chorusCommDestroy(cc);
    if (r != chorusSuccess) return fromChorus(r);
  }
  comm->suspended = true;
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclCommSuspend)

SHIM_EXPORT ncclResult_t ncclCommResume(ncclComm_t comm) {
  START
  if (comm == nullptr || !shim::known(comm) || comm->destroyed || !comm->suspended) {
    chorusComm_t cc = nullptr;
    ncclResult_t err;
    if (!shim::resolve(comm, "ncclCommResume", &cc, &err)) return err;
    return refuse(ncclInvalidUsage,
                  "ncclCommResume: " + rankText(comm) + ": the communicator is not suspended");
  }
  if (comm->c == nullptr) {
    chorusComm_t c = nullptr;
    const chorusResult_t r = chorusCommInitRank(&c, comm->nranks, comm->resumeId, comm->rank);
    if (r != chorusSuccess) return fromChorus(r);
    comm->c = c;
  }
  comm->suspended = false;
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclCommResume)

// What a suspend with NCCL_SUSPEND_MEM frees is everything the communicator holds: Chorus keeps
// no memory that outlives it (reported as "GPU memory" because that is NCCL's name; on host ranks
// it is host memory, the figure chorus-info shows per rank).
SHIM_EXPORT ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value) {
  START
  if (!value) return refuse(ncclInvalidArgument, "ncclCommMemStats: value is NULL");
  size_t held = 0;
  bool suspended = false;
  if (comm && shim::known(comm) && !comm->destroyed && comm->suspended) {
    suspended = true;
    if (comm->c) chorusCommMemoryBytes(comm->c, &held);
  } else {
    RESOLVE(comm, "ncclCommMemStats");
    if (chorusResult_t r = chorusCommMemoryBytes(cc, &held); r != chorusSuccess) return fromChorus(r);
  }
  switch (stat) {
    case ncclStatGpuMemSuspend:
    case ncclStatGpuMemTotal:
      *value = held;
      return ncclSuccess;
    case ncclStatGpuMemSuspended:
      *value = suspended ? 1 : 0;
      return ncclSuccess;
    case ncclStatGpuMemPersist:
      *value = 0;
      return ncclSuccess;
  }
  return refuse(ncclInvalidArgument,
                "ncclCommMemStats: unknown stat " + std::to_string(static_cast<int>(stat)));
  END
}
SHIM_ALIAS(ncclCommMemStats)

#endif  // NCCL 2.30
