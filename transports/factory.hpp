// The transport factory: which transport each pair of ranks uses, and the only place that builds
// one. Ranks of one host share memory; between hosts each rank offers the kinds it can use and a
// pair uses the first kind of the preference order (ib, ucx, tcp) both offer. Whether UCX and verbs
// were built in is known here and nowhere above.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chorus/store.hpp"
#include "transports/peer_set.hpp"

namespace chorus::transport {

enum class NetKind { Ib, Ucx, Tcp };
constexpr NetKind kNetPreference[] = {NetKind::Ib, NetKind::Ucx, NetKind::Tcp};
const char* netKindName(NetKind k);
/// Parses "ib", "ucx" or "tcp"; false otherwise.
bool parseNetKind(const std::string& s, NetKind* k);

/// "ucx,tcp" <-> a list of kinds (in preference order). Unknown names are an error.
std::string formatNetKinds(const std::vector<NetKind>& kinds);
std::vector<NetKind> parseNetKinds(const std::string& s);

/// The kind a pair uses: the first of kNetPreference both lists contain; false if none.
bool chooseNetKind(const std::vector<NetKind>& mine, const std::vector<NetKind>& theirs, NetKind* kind);

/// Whether this build has the transport of `kind` and it can be used on this machine; `*why` says
/// how (or why not), for chorus-info.
bool netKindUsable(NetKind kind, std::string* why);

struct ConnectOptions {
  std::string commId;         // the communicator's random id (names segments and connections)
  std::vector<bool> remote;   // by rank: on another host than this rank
  std::vector<int> peerPids;  // by rank: a process this one can watch (same pid namespace), else 0
  size_t fifoBytes = 0;       // shared-memory pipe and staging sizes (the same on every rank)
  size_t stageBytes = 0;
  /// The host's ranks per core, rounded up: which staged calls are packed through all staging slots
  /// (ShmGroupOptions; group rank 0's value holds).
  int ranksPerCore = 1;
  std::chrono::milliseconds timeout{0};
  /// The kinds this rank offers between hosts ("tcp", "ucx,tcp"); empty: chosen from what is there.
  std::string net;
  /// Testing and measurements (Config::transport "tcp"): no shared memory; every other rank through
  /// the TCP transport (over loopback when every rank is on this host), whatever `net` says.
  bool tcpOnly = false;
  /// Why this rank offers no in-place reads of its host peers' ordinary memory ("" = it offers them).
  std::string noPeerReads;
  /// Where they are read: point-to-point payloads from this size on are sent by address (0: never).
  size_t inPlaceMinBytes = 0;
  /// Read host peers in place however slow cross-memory attach is (ShmGroupOptions).
  bool peerReadsRegardless = false;
  /// Throws the failure a peer published, if one did (called when a peer is found gone in set-up).
  std::function<void()> throwIfPeerFailed;
};

/// Collective over the communicator's `size` ranks: connects this rank to every other one (the
/// ranks of its host through one shared-memory group, the others through the transport of each
/// pair; with `tcpOnly` every one through TCP). Environment: CHORUS_SOCKET_* and CHORUS_IB_*
/// (docs/networking.md).
std::unique_ptr<PeerSet> connectPeers(std::shared_ptr<Store> store, int rank, int size,
                                      const ConnectOptions& options);

}  // namespace chorus::transport
