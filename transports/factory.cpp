#include "transports/factory.hpp"

#include <algorithm>
#include <filesystem>

#include "base/config.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "transports/shm/shm_group.hpp"
#include "transports/tcp/net_interfaces.hpp"
#include "transports/tcp/tcp_transport.hpp"
#if CHORUS_HAVE_UCX
#include "transports/ucx/ucx_transport.hpp"
#endif
#if CHORUS_HAVE_VERBS
#include "transports/ib/ib_transport.hpp"
#endif

namespace chorus::transport {

const char* netKindName(NetKind k) {
  switch (k) {
    case NetKind::Ib:
      return "ib";
    case NetKind::Ucx:
      return "ucx";
    case NetKind::Tcp:
      return "tcp";
  }
  return "?";
}

bool parseNetKind(const std::string& s, NetKind* k) {
  for (NetKind c : kNetPreference) {
    if (s == netKindName(c)) {
      *k = c;
      return true;
    }
  }
  return false;
}

std::string formatNetKinds(const std::vector<NetKind>& kinds) {
  std::string out;
  for (NetKind k : kinds) out += strCat(out.empty() ? "" : ",", netKindName(k));
  return out;
}

std::vector<NetKind> parseNetKinds(const std::string& s) {
  std::vector<NetKind> kinds;
  size_t at = 0;
  while (at <= s.size() && !s.empty()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    NetKind k;
    if (!parseNetKind(s.substr(at, comma - at), &k))
      throw Error(chorusInternalError, strCat("unknown transport kind in \"", s, "\""));
    kinds.push_back(k);
    at = comma + 1;
  }
  return kinds;
}

bool chooseNetKind(const std::vector<NetKind>& mine, const std::vector<NetKind>& theirs, NetKind* kind) {
  for (NetKind k : kNetPreference) {
    if (std::find(mine.begin(), mine.end(), k) != mine.end() &&
        std::find(theirs.begin(), theirs.end(), k) != theirs.end()) {
      *kind = k;
      return true;
    }
  }
  return false;
}

namespace {

// RDMA hardware the kernel knows (InfiniBand, RoCE, iWARP): where UCX can do better than TCP.
[[maybe_unused]] bool haveRdmaDevices() {
  std::error_code ec;
  auto it = std::filesystem::directory_iterator("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

#if CHORUS_HAVE_VERBS
IbOptions ibOptions(const std::string& id, std::chrono::milliseconds timeout) {
  const EnvConfig& env = envConfig();
  IbOptions ib;
  ib.commId = id;
  ib.ringBytes = env.socketBufferBytes;
  ib.timeout = timeout;
  ib.hca = env.ibHca;
  ib.port = env.ibPort;
  ib.gidIndex = env.ibGidIndex;
  return ib;
}
#endif

// The kinds of transport this rank offers to ranks on other hosts, in preference order.
std::vector<NetKind> netOffers(int rank, const std::string& net, std::chrono::milliseconds timeout) {
  std::string ucxWhy = "this build has no UCX transport (configured with CHORUS_WITH_UCX=OFF)";
  // UCX is loaded only when it may be used: named in CHORUS_NET, or RDMA devices exist.
  bool ucx = false;
#if CHORUS_HAVE_UCX
  if (net.find("ucx") != std::string::npos || (net.empty() && haveRdmaDevices())) ucx = ucxAvailable(&ucxWhy);
#endif
  std::string ibWhy = "this build has no RDMA verbs transport (configured with CHORUS_WITH_VERBS=OFF)";
  bool ib = false;
#if CHORUS_HAVE_VERBS
  ib = ibAvailable(ibOptions("", timeout), &ibWhy);
#else
  (void)timeout;
#endif
  if (!net.empty()) {
    std::vector<NetKind> kinds;
    for (NetKind k : parseNetKinds(net)) {
      if (k == NetKind::Ucx && !ucx)
        fail(chorusInvalidUsage, strCat("rank ", rank, ": CHORUS_NET=", net, " names ucx, but ", ucxWhy));
      if (k == NetKind::Ib && !ib)
        fail(chorusInvalidUsage, strCat("rank ", rank, ": CHORUS_NET=", net, " names ib, but ", ibWhy));
      kinds.push_back(k);
    }
    return kinds;
  }
  // Automatic: RDMA verbs where a device is up; UCX only where there is RDMA hardware for it (over
  // Ethernet alone Chorus's own TCP transport is the faster: docs/networking.md); TCP always.
  std::vector<NetKind> kinds;
  if (ib) kinds.push_back(NetKind::Ib);
  if (ucx) kinds.push_back(NetKind::Ucx);
  kinds.push_back(NetKind::Tcp);
  if (rank == 0 && !ib) logInfo(Subsys::Net, "RDMA verbs transport not used: ", ibWhy);
  return kinds;
}

// `loopback` (TCP only): listen on this host's loopback interface, for peers that all share it.
std::unique_ptr<Transport> makeNetTransport(NetKind kind, Store& store, int rank, int size,
                                            const std::vector<bool>& peers, const ConnectOptions& options,
                                            bool loopback = false) {
  const EnvConfig& env = envConfig();
#if CHORUS_HAVE_VERBS
  if (kind == NetKind::Ib)
    return std::make_unique<IbTransport>(store, rank, size, peers,
                                         ibOptions(options.commId, options.timeout));
#endif
#if CHORUS_HAVE_UCX
  if (kind == NetKind::Ucx) {
    UcxOptions ucx;
    ucx.commId = options.commId;
    ucx.ringBytes = env.socketBufferBytes;
    ucx.timeout = options.timeout;
    return std::make_unique<UcxTransport>(store, rank, size, peers, ucx);
  }
#endif
  if (kind != NetKind::Tcp)
    fail(chorusInternalError, strCat("no ", netKindName(kind), " transport in this build"));
  TcpOptions tcp;
  tcp.commId = options.commId;
  tcp.streams = env.socketStreams;
  tcp.ringBytes = env.socketBufferBytes;
  tcp.frameBytes = std::min<size_t>(size_t{512} << 10, env.socketBufferBytes / 2);
  tcp.checksum = env.socketChecksum;
  tcp.ifname = env.socketIfname;
  tcp.family = parseFamily(env.socketFamily);
  tcp.timeout = options.timeout;
  tcp.loopbackOnly = loopback;
  auto t = std::make_unique<TcpTransport>(store, rank, size, peers, tcp);
  if (rank == 0) {
    logInfo(Subsys::Net, "TCP: ", tcp.streams, " stream(s) per pair, ", formatBytes(tcp.ringBytes), " rings",
            tcp.checksum ? ", CRC-32C on every frame" : "", "; rank 0 advertises ", t->describeLocal());
  }
  return t;
}

// The shared-memory group of `ranks` (this host's, in rank order), over `store`.
std::unique_ptr<ShmGroup> makeShmGroup(Store& store, const std::string& tag, const std::vector<int>& ranks,
                                       int rank, const ConnectOptions& options) {
  ShmGroupOptions shm;
  shm.jobTag = tag;
  shm.fifoBytes = options.fifoBytes;
  shm.stageBytes = options.stageBytes;
  shm.ranksPerCore = options.ranksPerCore;
  shm.timeout = options.timeout;
  shm.throwIfPeerFailed = options.throwIfPeerFailed;
  shm.noPeerReads = options.noPeerReads;
  shm.inPlaceMinBytes = options.inPlaceMinBytes;
  shm.peerReadsRegardless = options.peerReadsRegardless;
  int index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const size_t r = static_cast<size_t>(ranks[i]);
    shm.peerPids.push_back(r < options.peerPids.size() ? options.peerPids[r] : 0);
    shm.commRanks.push_back(ranks[i]);
    if (ranks[i] == rank) index = static_cast<int>(i);
  }
  return std::make_unique<ShmGroup>(store, index, static_cast<int>(ranks.size()), shm);
}

// Config::transport "tcp": no shared memory; one TCP transport to every other rank, over loopback
// when every rank is on this host (thread ranks of one process included), else over the interface
// chosen as between hosts (the peers on this host reach it as well).
std::unique_ptr<PeerSet> connectOverTcp(Store& store, int rank, int size, const ConnectOptions& options) {
  const auto n = static_cast<size_t>(size);
  std::vector<PeerSet::Member> members;
  if (size > 1) {
    const bool oneHost =
        std::find(options.remote.begin(), options.remote.end(), true) == options.remote.end();
    std::vector<bool> peers(n, true);
    peers[static_cast<size_t>(rank)] = false;
    PeerSet::Member m;
    m.number.assign(n, -1);
    for (int r = 0; r < size; ++r) {
      if (r != rank) m.number[static_cast<size_t>(r)] = r;
    }
    m.betweenHosts = true;  // sockets: the idle wait can block on them
    try {
      m.transport = makeNetTransport(NetKind::Tcp, store, rank, size, peers, options, oneHost);
    } catch (const Error& e) {
      fail(e.code(), strCat("rank ", rank, ": setting up the tcp transport (Config::transport=tcp",
                            oneHost ? ", over loopback" : "", "): ", e.what()));
    }
    logInfo(Subsys::Net, "rank ", rank, ": Config::transport=tcp: its ", size - 1, " peer(s) over tcp (",
            m.transport->describeLocal(), "), no shared memory");
    members.push_back(std::move(m));
  }
  return std::make_unique<PeerSet>(rank, size, std::move(members), nullptr);
}

}  // namespace

bool netKindUsable(NetKind kind, std::string* why) {
  switch (kind) {
    case NetKind::Tcp:
      *why = "yes";
      return true;
    case NetKind::Ucx:
      *why = "not built (configured with CHORUS_WITH_UCX=OFF)";
#if CHORUS_HAVE_UCX
      if (ucxAvailable(why)) {
        *why = "yes (between hosts with CHORUS_NET=ucx, or automatically where RDMA devices exist)";
        return true;
      }
      *why = strCat("built, but not usable here: ", *why);
#endif
      return false;
    case NetKind::Ib:
      *why = "not built (configured with CHORUS_WITH_VERBS=OFF)";
#if CHORUS_HAVE_VERBS
      if (ibAvailable(ibOptions("", std::chrono::milliseconds(0)), why)) {
        *why = "yes (between hosts, preferred where both ends have an active RDMA port)";
        return true;
      }
      *why = strCat("built, not used here: ", *why);
#endif
      return false;
  }
  return false;
}

std::unique_ptr<PeerSet> connectPeers(std::shared_ptr<Store> store, int rank, int size,
                                      const ConnectOptions& options) {
  if (options.tcpOnly) return connectOverTcp(*store, rank, size, options);
  const auto n = static_cast<size_t>(size);
  std::vector<int> local;  // this host's ranks
  for (int r = 0; r < size; ++r) {
    if (!options.remote[static_cast<size_t>(r)]) local.push_back(r);
  }
  std::vector<PeerSet::Member> members;
  ShmGroup* everyRank = nullptr;
  if (local.size() > 1) {
    // Alone on one host the group's store and tag are the communicator's; across hosts each host's
    // group meets under its first rank.
    const bool alone = local.size() == n;
    std::unique_ptr<ShmGroup> group;
    if (alone) {
      group = makeShmGroup(*store, options.commId, local, rank, options);
    } else {
      auto hostStore = makePrefixStore(strCat("host", local.front(), "/"), store);
      group = makeShmGroup(*hostStore, strCat(options.commId, "h", local.front()), local, rank, options);
    }
    if (alone) everyRank = group.get();
    PeerSet::Member m;
    m.number.assign(n, -1);
    for (size_t i = 0; i < local.size(); ++i) m.number[static_cast<size_t>(local[i])] = static_cast<int>(i);
    m.transport = std::move(group);
    members.push_back(std::move(m));
  }
  if (local.size() == n) return std::make_unique<PeerSet>(rank, size, std::move(members), everyRank);

  // Each pair of ranks on different hosts uses the best kind of transport both offer.
  const std::vector<NetKind> mine = netOffers(rank, options.net, options.timeout);
  store->setString(strCat("netkinds/", rank), formatNetKinds(mine));
  std::vector<int> kindOfPeer(n, -1);  // a NetKind, where remote
  for (int r = 0; r < size; ++r) {
    if (!options.remote[static_cast<size_t>(r)]) continue;
    const std::string theirs = store->getString(strCat("netkinds/", r), options.timeout);
    NetKind k;
    if (!chooseNetKind(mine, parseNetKinds(theirs), &k)) {
      fail(chorusInvalidUsage,
           strCat("rank ", rank, " (offers ", formatNetKinds(mine), ") and rank ", r, " (offers ", theirs,
                  ") have no transport in common; check CHORUS_NET"));
    }
    kindOfPeer[static_cast<size_t>(r)] = static_cast<int>(k);
  }
  std::string summary;
  // Every rank sets the kinds up in the same order, each collective over the pairs that use it.
  for (NetKind k : kNetPreference) {
    std::vector<bool> peers(n, false);
    PeerSet::Member m;
    m.number.assign(n, -1);
    m.betweenHosts = true;
    int count = 0;
    for (int r = 0; r < size; ++r) {
      if (kindOfPeer[static_cast<size_t>(r)] == static_cast<int>(k)) {
        peers[static_cast<size_t>(r)] = true;
        m.number[static_cast<size_t>(r)] = r;
        ++count;
      }
    }
    if (count == 0) continue;
    try {
      m.transport = makeNetTransport(k, *store, rank, size, peers, options);
    } catch (const Error& e) {
      fail(e.code(), strCat("rank ", rank, ": setting up the ", netKindName(k), " transport: ", e.what()));
    }
    summary += strCat(summary.empty() ? "" : ", ", count, " over ", netKindName(k), " (",
                      m.transport->describeLocal(), ")");
    members.push_back(std::move(m));
  }
  logInfo(Subsys::Net, "rank ", rank, " offers ", formatNetKinds(mine), "; its ",
          size - static_cast<int>(local.size()), " peer(s) on other hosts: ", summary);
  return std::make_unique<PeerSet>(rank, size, std::move(members), nullptr);
}

}  // namespace chorus::transport
