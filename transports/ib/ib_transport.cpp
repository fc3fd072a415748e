#include "transports/ib/ib_transport.hpp"

#include <arpa/inet.h>
#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "base/error.hpp"
#include "base/log.hpp"
#include "transports/ib/verbs_api.hpp"
#include "transports/peer_link.hpp"

namespace chorus::transport {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kNoticeFlag = 0x8000'0000u;  // immediate data of a failure notice
constexpr size_t kNoticeBytes = 4096;
constexpr int kSendDepth = 128;
constexpr int kRecvDepth =
    128;  // as deep as the send queue: a write with immediate never waits for a receive
constexpr int kSendReserve = 4;  // send slots kept for credits, notices and probes
constexpr auto kProbeEvery = std::chrono::seconds(1);

enum WrKind : uint64_t { kRecv = 1, kData = 2, kCredit = 3, kNotice = 4, kProbe = 5, kHello = 6 };
uint64_t wrId(WrKind k, int peer) { return (static_cast<uint64_t>(k) << 32) | static_cast<uint32_t>(peer); }
WrKind wrKind(uint64_t id) { return static_cast<WrKind>(id >> 32); }
int wrPeer(uint64_t id) { return static_cast<int>(id & 0xFFFF'FFFFu); }

// Per peer, registered and remotely writable: what the peer tells this rank.
struct alignas(64) Ctrl {
  uint64_t credit;  // bytes of this rank's send ring the peer has consumed
  char pad[56];
  char notice[kNoticeBytes];
};

// What each side publishes for the other, through the store.
struct Endpoint {
  char comm[32];
  uint32_t qpn;
  uint32_t psn;
  uint16_t lid;
  uint8_t gid[16];
  uint64_t ringAddr;
  uint64_t ringBytes;
  uint64_t ctrlAddr;
  uint32_t ringRkey;
  uint32_t ctrlRkey;
  uint8_t linkLayer;
  uint8_t mtu;  // enum ibv_mtu
};

std::string wcStatusText(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_RETRY_EXC_ERR:
      return "transport retry counter exceeded (the peer's queue pair is gone or unreachable)";
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return "receiver-not-ready retries exceeded";
    case IBV_WC_WR_FLUSH_ERR:
      return "work request flushed (the queue pair is in the error state)";
    case IBV_WC_REM_ACCESS_ERR:
      return "remote access error (wrong key or address)";
    case IBV_WC_LOC_PROT_ERR:
      return "local protection error";
    default:
      return strCat("completion status ", static_cast<int>(s));
  }
}

void* allocRegion(size_t bytes) {
  void* p = std::aligned_alloc(4096, alignUp(bytes, 4096));
  if (!p) throw Error(chorusSystemError, strCat("cannot allocate ", formatBytes(bytes), " for RDMA buffers"));
  std::memset(p, 0, alignUp(bytes, 4096));
  return p;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Opens the first device matching `hca` whose port is active. Null with the reason otherwise.
ibv_context* openDevice(const VerbsApi& v, const IbOptions& o, ibv_port_attr* port, std::string* name,
                        std::string* why) {
  int n = 0;
  errno = 0;
  ibv_device** list = v.get_device_list(&n);
  if (!list) {
    *why = strCat("ibv_get_device_list: ", errnoText(errno ? errno : ENODEV));
    return nullptr;
  }
  std::string seen;
  ibv_context* chosen = nullptr;
  for (int i = 0; i < n && !chosen; ++i) {
    const std::string dev = v.get_device_name(list[i]);
    if (!o.hca.empty() && !dev.starts_with(o.hca)) {
      seen += strCat(seen.empty() ? "" : ", ", dev, " (not matched by CHORUS_IB_HCA)");
      continue;
    }
    ibv_context* ctx = v.open_device(list[i]);
    if (!ctx) {
      seen += strCat(seen.empty() ? "" : ", ", dev, " (cannot open: ", errnoText(errno), ")");
      continue;
    }
    ibv_port_attr attr{};
    if (v.query_port(ctx, static_cast<uint8_t>(o.port), &attr) != 0 || attr.state != IBV_PORT_ACTIVE) {
      seen += strCat(seen.empty() ? "" : ", ", dev, " (port ", o.port, " is not active)");
      v.close_device(ctx);
      continue;
    }
    *port = attr;
    *name = dev;
    chosen = ctx;
  }
  v.free_device_list(list);
  if (!chosen) *why = n == 0 ? std::string("no RDMA devices") : strCat("no usable RDMA device: ", seen);
  return chosen;
}

}  // namespace

bool ibAvailable(const IbOptions& options, std::string* why) {
  const VerbsApi* v = options.verbs ? options.verbs : VerbsApi::system(why);
  if (!v) return false;
  ibv_port_attr port{};
  std::string name;
  ibv_context* ctx = openDevice(*v, options, &port, &name, why);
  if (!ctx) return false;
  v->close_device(ctx);
  return true;
}

// ---- One peer -------------------------------------------------------------------------------------

struct IbPeer;

class IbSendPipe final : public SendPipe {
 public:
  explicit IbSendPipe(IbPeer& p) : p_(p) {}
  std::span<std::byte> reserve() override;
  void commit(size_t n) override;
  void flush() override;

 private:
  IbPeer& p_;
};

class IbRecvPipe final : public RecvPipe {
 public:
  explicit IbRecvPipe(IbPeer& p) : p_(p) {}
  std::span<const std::byte> peek() override;
  void consume(size_t n) override;

 private:
  IbPeer& p_;
};

// The queue pair and both rings of one peer, with its failure and notice (PeerLink).
struct IbPeer : PeerLink {
  IbPeer(IbTransport::Impl& t, int rank, uint64_t* arrivals) : PeerLink(rank, arrivals), t(t) {}
  IbTransport::Impl& t;
  ibv_qp* qp = nullptr;
  Ctrl* ctrl = nullptr;  // this peer's slot in the transport's control block
  Endpoint remote{};
  uint32_t psn = 0;  // this side's first packet sequence number
  int sqUsed = 0;    // send work requests not yet completed

  // Send ring (the size of the peer's receive ring): [sDone, sPosted) written, not yet completed.
  std::unique_ptr<void, FreeDeleter> sbuf;
  ibv_mr* smr = nullptr;
  size_t scap = 0;
  uint64_t sHead = 0, sPosted = 0, sDone = 0;
  std::deque<uint64_t> ends;  // end position of each data write in flight

  // Receive ring: the peer writes into it; [rTail, rHead) arrived and unread.
  std::unique_ptr<void, FreeDeleter> rbuf;
  ibv_mr* rmr = nullptr;
  size_t rcap = 0;
  uint64_t rHead = 0, rTail = 0, creditSent = 0;

  IbSendPipe sendPipe{*this};
  IbRecvPipe recvPipe{*this};

  std::byte* sdata() const { return static_cast<std::byte*>(sbuf.get()); }
  std::byte* rdata() const { return static_cast<std::byte*>(rbuf.get()); }
  uint64_t credit() const { return std::atomic_ref<uint64_t>(ctrl->credit).load(std::memory_order_acquire); }
  PeerError brokenError() const {
    return PeerError(chorusRemoteError, strCat("the RDMA connection with rank ", rank, " failed: ", broken));
  }
};

// ---- The transport --------------------------------------------------------------------------------

struct IbTransport::Impl {
  const VerbsApi* v = nullptr;
  IbOptions o;
  int rank = 0;
  std::string device;
  ibv_port_attr port{};
  ibv_gid gid{};
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  std::unique_ptr<void, FreeDeleter> ctrlBlock;
  ibv_mr* ctrlMr = nullptr;
  std::unique_ptr<void, FreeDeleter> noticeOut;
  ibv_mr* noticeMr = nullptr;
  std::vector<std::unique_ptr<IbPeer>> peers;
  std::mutex mu;
  bool failed = false;
  Clock::time_point lastProbe = Clock::now();
  uint64_t arrivals = 0;  // receive completions and failures so far
  uint64_t seen = 0;      // `arrivals` when the engine last waited

  ~Impl();

  // Set-up phases, in order (the constructor's).
  /// Opens the device and port of the options (and the GID on RoCE).
  void openPort();
  /// The protection domain, the completion queue, the control block and the notice buffer.
  void allocate(int nranks, const std::vector<bool>& isPeer);
  /// A queue pair and receive ring for every peer, each published in the store ("ib/<rank>/<peer>").
  void createPeers(Store& store, int nranks, const std::vector<bool>& isPeer);
  IbPeer& createPeer(int r, int slot, size_t rcap);
  void publishEndpoint(Store& store, IbPeer& p);
  /// Reads every peer's endpoint, brings the queue pair to RTS and says so ("ib/ready/<rank>/<peer>").
  void connectPeers(Store& store);
  void readEndpoint(Store& store, IbPeer& p);
  void connectQp(IbPeer& p);
  /// Waits until every peer's queue pair is ready to receive.
  void awaitReady(Store& store);
  /// Proves the path to every peer with a zero-byte write.
  void hello();

  bool ethernet() const { return port.link_layer == IBV_LINK_LAYER_ETHERNET; }
  void check(bool ok, const char* call) const {
    if (!ok)
      throw Error(chorusSystemError, strCat(device, ": ", call, ": ", errnoText(errno ? errno : EINVAL)));
  }

  IbPeer* peer(int r) {
    return r >= 0 && static_cast<size_t>(r) < peers.size() ? peers[static_cast<size_t>(r)].get() : nullptr;
  }

  void postRecv(IbPeer& p) {
    ibv_recv_wr wr{};
    wr.wr_id = wrId(kRecv, p.rank);
    ibv_recv_wr* bad = nullptr;
    if (int rc = v->post_recv(p.qp, &wr, &bad); rc != 0)
      p.setBroken(strCat("ibv_post_recv: ", errnoText(rc)));
  }

  // Takes in completions: arrivals, finished writes, errors.
  void pollLocked() {
    ibv_wc wc[16];
    for (;;) {
      const int n = v->poll_cq(cq, 16, wc);
      if (n <= 0) return;
      for (int i = 0; i < n; ++i) {
        const ibv_wc& c = wc[i];
        IbPeer* p = peer(wrPeer(c.wr_id));
        if (!p) continue;
        const WrKind kind = wrKind(c.wr_id);
        if (kind != kRecv) --p->sqUsed;
        if (c.status != IBV_WC_SUCCESS) {
          p->setBroken(wcStatusText(c.status));
          if (kind == kData && !p->ends.empty()) p->ends.pop_front();
          continue;
        }
        if (kind == kRecv) {
          const uint32_t imm = ntohl(c.imm_data);
          if (imm & kNoticeFlag) {
            p->noticed = true;
            p->notice.assign(p->ctrl->notice, std::min<size_t>(imm & ~kNoticeFlag, kNoticeBytes));
          } else {
            p->rHead += imm;
          }
          ++arrivals;
          postRecv(*p);
        } else if (kind == kData && !p->ends.empty()) {
          p->sDone = p->ends.front();
          p->ends.pop_front();
        }
      }
    }
  }

  // Waits for a free send slot (completions come from the HCA, not from the peer's CPU).
  bool sendSlot(IbPeer& p, int keep, Clock::time_point deadline) {
    while (p.sqUsed >= kSendDepth - keep && p.broken.empty()) {
      pollLocked();
      if (Clock::now() > deadline) p.setBroken("no send completion in time (the peer's HCA does not answer)");
    }
    return p.broken.empty();
  }

  bool post(IbPeer& p, ibv_send_wr& wr) {
    ibv_send_wr* bad = nullptr;
    if (int rc = v->post_send(p.qp, &wr, &bad); rc != 0) {
      p.setBroken(strCat("ibv_post_send: ", errnoText(rc)));
      return false;
    }
    ++p.sqUsed;
    return true;
  }

  // RDMA write of `bytes` at `local` (lkey) to the peer's (addr, rkey), with immediate data if set.
  bool write(IbPeer& p, WrKind kind, const void* local, uint32_t bytes, uint32_t lkey, uint64_t addr,
             uint32_t rkey, const uint32_t* imm, bool inlined) {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(local);
    sge.length = bytes;
    sge.lkey = lkey;
    ibv_send_wr wr{};
    wr.wr_id = wrId(kind, p.rank);
    wr.sg_list = bytes ? &sge : nullptr;
    wr.num_sge = bytes ? 1 : 0;
    wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED | (inlined ? IBV_SEND_INLINE : 0);
    if (imm) wr.imm_data = htonl(*imm);
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
    return post(p, wr);
  }

  void postData(IbPeer& p, Clock::time_point deadline) {
    while (p.sPosted < p.sHead && p.broken.empty()) {
      if (!sendSlot(p, kSendReserve, deadline)) return;
      const size_t off = p.sPosted % p.scap;
      const auto n = static_cast<uint32_t>(std::min<uint64_t>(p.sHead - p.sPosted, p.scap - off));
      if (!write(p, kData, p.sdata() + off, n, p.smr->lkey, p.remote.ringAddr + off, p.remote.ringRkey, &n,
                 false))
        return;
      p.sPosted += n;
      p.ends.push_back(p.sPosted);
    }
  }

  // Tells the peer how much of its ring this rank consumed, when it is worth a write.
  void maybeCredit(IbPeer& p) {
    const uint64_t unsent = p.rTail - p.creditSent;
    if (unsent == 0 || (unsent < p.rcap / 8 && p.rTail != p.rHead) || !p.broken.empty()) return;
    if (!sendSlot(p, 1, Clock::now() + o.timeout)) return;
    const uint64_t value = p.rTail;
    if (write(p, kCredit, &value, sizeof value, 0, p.remote.ctrlAddr + offsetof(Ctrl, credit),
              p.remote.ctrlRkey, nullptr, true))
      p.creditSent = value;
  }
};

IbTransport::Impl::~Impl() {
  if (!v) return;
  {
    std::lock_guard lk(mu);
    const auto deadline =
        Clock::now() + std::min<std::chrono::milliseconds>(o.timeout, std::chrono::seconds(30));
    for (auto& p : peers) {
      if (p && p->qp && !failed) postData(*p, deadline);
    }
    auto busy = [&] {
      return std::any_of(peers.begin(), peers.end(),
                         [](auto& p) { return p && p->qp && p->broken.empty() && p->sqUsed > 0; });
    };
    while (busy() && Clock::now() < deadline) pollLocked();
  }
  for (auto& p : peers) {
    if (!p) continue;
    if (p->qp) v->destroy_qp(p->qp);
    if (p->smr) v->dereg_mr(p->smr);
    if (p->rmr) v->dereg_mr(p->rmr);
  }
  if (ctrlMr) v->dereg_mr(ctrlMr);
  if (noticeMr) v->dereg_mr(noticeMr);
  if (cq) v->destroy_cq(cq);
  if (pd) v->dealloc_pd(pd);
  if (ctx) v->close_device(ctx);
}

// ---- Pipes ----------------------------------------------------------------------------------------

std::span<std::byte> IbSendPipe::reserve() {
  std::lock_guard lk(p_.t.mu);
  auto room = [&] { return p_.scap - (p_.sHead - std::min(p_.credit(), p_.sDone)); };
  if (room() == 0) p_.t.pollLocked();
  if (!p_.broken.empty()) throw p_.brokenError();
  const size_t off = p_.sHead % p_.scap;
  return {p_.sdata() + off, std::min<size_t>(room(), p_.scap - off)};
}

void IbSendPipe::commit(size_t n) { p_.sHead += n; }

void IbSendPipe::flush() {
  std::lock_guard lk(p_.t.mu);
  if (!p_.t.failed) p_.t.postData(p_, Clock::now() + p_.t.o.timeout);
}

std::span<const std::byte> IbRecvPipe::peek() {
  std::lock_guard lk(p_.t.mu);
  if (p_.rHead == p_.rTail) {
    p_.t.pollLocked();
    if (p_.rHead == p_.rTail) {
      if (!p_.broken.empty()) throw p_.brokenError();
      return {};
    }
  }
  const size_t off = p_.rTail % p_.rcap;
  return {p_.rdata() + off, std::min<size_t>(p_.rHead - p_.rTail, p_.rcap - off)};
}

void IbRecvPipe::consume(size_t n) {
  std::lock_guard lk(p_.t.mu);
  p_.rTail += n;
  p_.t.maybeCredit(p_);
}

// ---- Set-up ---------------------------------------------------------------------------------------

void IbTransport::Impl::openPort() {
  std::string why;
  ctx = openDevice(*v, o, &port, &device, &why);
  if (!ctx) throw Error(chorusSystemError, why);
  if (ethernet() && v->query_gid(ctx, static_cast<uint8_t>(o.port), o.gidIndex, &gid) != 0) {
    throw Error(chorusSystemError, strCat(device, ": ibv_query_gid(index ", o.gidIndex,
                                          "): ", errnoText(errno), " (check CHORUS_IB_GID_INDEX)"));
  }
}

void IbTransport::Impl::allocate(int nranks, const std::vector<bool>& isPeer) {
  pd = v->alloc_pd(ctx);
  check(pd != nullptr, "ibv_alloc_pd");
  int count = 0;
  for (int r = 0; r < nranks; ++r) count += r != rank && isPeer[static_cast<size_t>(r)];
  cq = v->create_cq(ctx, count * (kSendDepth + kRecvDepth) + 16, nullptr, nullptr, 0);
  check(cq != nullptr, "ibv_create_cq");
  ctrlBlock.reset(allocRegion(sizeof(Ctrl) * static_cast<size_t>(std::max(count, 1))));
  ctrlMr = v->reg_mr(pd, ctrlBlock.get(), sizeof(Ctrl) * static_cast<size_t>(std::max(count, 1)),
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  check(ctrlMr != nullptr, "ibv_reg_mr (control block)");
  noticeOut.reset(allocRegion(kNoticeBytes));
  noticeMr = v->reg_mr(pd, noticeOut.get(), kNoticeBytes, IBV_ACCESS_LOCAL_WRITE);
  check(noticeMr != nullptr, "ibv_reg_mr (notice)");
}

void IbTransport::Impl::createPeers(Store& store, int nranks, const std::vector<bool>& isPeer) {
  // A write's length travels as immediate data whose top bit marks a notice: rings stay below 1 GiB.
  if (o.ringBytes > (size_t{1} << 30))
    throw Error(chorusInvalidArgument, strCat("RDMA ring of ", formatBytes(o.ringBytes), " (at most 1 GiB)"));
  const size_t rcap = std::max<size_t>(alignUp(o.ringBytes, 64), 4096);
  peers.resize(static_cast<size_t>(nranks));
  int slot = 0;
  for (int r = 0; r < nranks; ++r) {
    if (r == rank || !isPeer[static_cast<size_t>(r)]) continue;
    publishEndpoint(store, createPeer(r, slot++, rcap));
  }
}

IbPeer& IbTransport::Impl::createPeer(int r, int slot, size_t rcap) {
  // Owned by the transport at once: a failure below releases what was made (Impl::~Impl).
  peers[static_cast<size_t>(r)] = std::make_unique<IbPeer>(*this, r, &arrivals);
  IbPeer* p = peers[static_cast<size_t>(r)].get();
  p->ctrl = static_cast<Ctrl*>(ctrlBlock.get()) + slot;
  p->rcap = rcap;
  p->rbuf.reset(allocRegion(rcap));
  p->rmr = v->reg_mr(pd, p->rbuf.get(), rcap, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  check(p->rmr != nullptr, "ibv_reg_mr (receive ring)");
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = kSendDepth;
  init.cap.max_recv_wr = kRecvDepth;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = 64;
  p->qp = v->create_qp(pd, &init);
  check(p->qp != nullptr, "ibv_create_qp");
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(o.port);
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  check(v->modify_qp(p->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
        "ibv_modify_qp (INIT)");
  return *p;
}

void IbTransport::Impl::publishEndpoint(Store& store, IbPeer& p) {
  Endpoint mine{};
  std::memset(mine.comm, 0, sizeof mine.comm);
  std::memcpy(mine.comm, o.commId.data(), std::min(o.commId.size(), sizeof mine.comm));
  mine.qpn = p.qp->qp_num;
  uint32_t psn = 0;
  if (::getrandom(&psn, sizeof psn, 0) != sizeof psn)
    psn = static_cast<uint32_t>(Clock::now().time_since_epoch().count());
  mine.psn = psn & 0xFFFFFF;
  mine.lid = port.lid;
  std::memcpy(mine.gid, gid.raw, sizeof mine.gid);
  mine.linkLayer = port.link_layer;
  mine.mtu = static_cast<uint8_t>(port.active_mtu);
  mine.ringAddr = reinterpret_cast<uintptr_t>(p.rbuf.get());
  mine.ringBytes = p.rcap;
  mine.ringRkey = p.rmr->rkey;
  mine.ctrlAddr = reinterpret_cast<uintptr_t>(p.ctrl);
  mine.ctrlRkey = ctrlMr->rkey;
  store.set(strCat("ib/", rank, "/", p.rank),
            std::span(reinterpret_cast<const std::byte*>(&mine), sizeof mine));
  p.psn = mine.psn;
}

void IbTransport::Impl::connectPeers(Store& store) {
  for (auto& p : peers) {
    if (!p) continue;
    readEndpoint(store, *p);
    connectQp(*p);
    if (!p->broken.empty()) throw p->brokenError();
    store.setString(strCat("ib/ready/", rank, "/", p->rank), "1");
  }
}

void IbTransport::Impl::readEndpoint(Store& store, IbPeer& p) {
  std::vector<std::byte> got;
  try {
    got = store.get(strCat("ib/", p.rank, "/", rank), o.timeout);
  } catch (const Error& e) {
    throw Error(e.code(), strCat("rank ", p.rank, " did not publish its RDMA endpoint: ", e.what()));
  }
  if (got.size() != sizeof(Endpoint))
    throw Error(chorusInternalError,
                strCat("rank ", p.rank, " published an RDMA endpoint of ", got.size(), " bytes"));
  std::memcpy(&p.remote, got.data(), sizeof(Endpoint));
  if (std::string(p.remote.comm, strnlen(p.remote.comm, sizeof p.remote.comm)) !=
      o.commId.substr(0, sizeof p.remote.comm))
    throw Error(chorusInternalError,
                strCat("rank ", p.rank, "'s RDMA endpoint belongs to another communicator"));
  if (p.remote.linkLayer != port.link_layer) {
    throw Error(chorusInvalidUsage,
                strCat(device, " is ", ethernet() ? "RoCE (Ethernet)" : "InfiniBand", " but rank ", p.rank,
                       "'s device is not: no RDMA path between them (set CHORUS_NET=tcp, or CHORUS_IB_HCA)"));
  }
}

void IbTransport::Impl::connectQp(IbPeer& p) {
  p.scap = p.remote.ringBytes;
  p.sbuf.reset(allocRegion(p.scap));
  p.smr = v->reg_mr(pd, p.sbuf.get(), p.scap, IBV_ACCESS_LOCAL_WRITE);
  check(p.smr != nullptr, "ibv_reg_mr (send ring)");
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = std::min(port.active_mtu, static_cast<ibv_mtu>(p.remote.mtu));
  a.dest_qp_num = p.remote.qpn;
  a.rq_psn = p.remote.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = static_cast<uint8_t>(o.port);
  if (ethernet()) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, p.remote.gid, sizeof p.remote.gid);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(o.gidIndex);
    a.ah_attr.grh.hop_limit = 255;
  } else {
    a.ah_attr.dlid = p.remote.lid;
  }
  check(v->modify_qp(p.qp, &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0,
        "ibv_modify_qp (RTR)");
  for (int i = 0; i < kRecvDepth; ++i) postRecv(p);
  ibv_qp_attr s{};
  s.qp_state = IBV_QPS_RTS;
  s.timeout = 14;  // 4.096 us * 2^14 = 67 ms per try
  s.retry_cnt = 7;
  s.rnr_retry = 7;
  s.sq_psn = p.psn;
  s.max_rd_atomic = 1;
  check(v->modify_qp(p.qp, &s,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC) == 0,
        "ibv_modify_qp (RTS)");
}

void IbTransport::Impl::awaitReady(Store& store) {
  // Nobody writes into a queue pair that is not ready to receive.
  for (auto& p : peers) {
    if (!p) continue;
    try {
      store.getString(strCat("ib/ready/", p->rank, "/", rank), o.timeout);
    } catch (const Error& e) {
      throw Error(e.code(), strCat("rank ", p->rank, " did not connect its RDMA queue pair: ", e.what()));
    }
  }
}

void IbTransport::Impl::hello() {
  // A zero-byte write with immediate to every peer proves the path now, not in the first collective.
  const auto deadline = Clock::now() + o.timeout;
  for (auto& p : peers) {
    if (!p) continue;
    const uint32_t zero = 0;
    write(*p, kHello, nullptr, 0, 0, p->remote.ringAddr, p->remote.ringRkey, &zero, false);
  }
  for (auto& p : peers) {
    if (!p) continue;
    while (p->sqUsed > 0 && p->broken.empty() && Clock::now() < deadline) pollLocked();
    if (!p->broken.empty() || p->sqUsed > 0) {
      throw Error(chorusSystemError,
                  strCat("no RDMA path to rank ", p->rank, " from ", device, ": ",
                         p->broken.empty() ? std::string("no completion in time") : p->broken));
    }
  }
}

IbTransport::IbTransport(Store& store, int rank, int nranks, const std::vector<bool>& peers,
                         const IbOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& t = *impl_;
  t.o = options;
  t.rank = rank;
  std::string why;
  const VerbsApi* v = options.verbs ? options.verbs : VerbsApi::system(&why);
  if (!v) throw Error(chorusSystemError, why);
  t.v = v;
  t.openPort();
  t.allocate(nranks, peers);
  t.createPeers(store, nranks, peers);
  t.connectPeers(store);
  t.awaitReady(store);
  t.hello();
  t.seen = t.arrivals;
  local_ = strCat(
      t.device, " port ", options.port,
      t.ethernet() ? strCat(" (RoCE, GID index ", options.gidIndex, ")") : strCat(" (LID ", t.port.lid, ")"));
}

IbTransport::~IbTransport() = default;

SendPipe& IbTransport::sendPipe(int peer) { return impl_->peer(peer)->sendPipe; }
RecvPipe& IbTransport::recvPipe(int peer) { return impl_->peer(peer)->recvPipe; }

void IbTransport::publishFailure(chorusResult_t, const std::string& text) {
  Impl& t = *impl_;
  std::lock_guard lk(t.mu);
  if (t.failed) return;
  t.failed = true;
  const auto n = static_cast<uint32_t>(std::min(text.size(), kNoticeBytes));
  std::memcpy(t.noticeOut.get(), text.data(), n);
  const uint32_t imm = kNoticeFlag | n;
  const auto deadline = Clock::now() + std::chrono::milliseconds(200);
  for (auto& p : t.peers) {
    if (!p || !p->broken.empty() || !t.sendSlot(*p, 0, deadline)) continue;
    t.write(*p, kNotice, t.noticeOut.get(), n, t.noticeMr->lkey, p->remote.ctrlAddr + offsetof(Ctrl, notice),
            p->remote.ctrlRkey, &imm, false);
  }
  auto busy = [&] {
    return std::any_of(t.peers.begin(), t.peers.end(),
                       [](auto& p) { return p && p->broken.empty() && p->sqUsed > 0; });
  };
  while (busy() && Clock::now() < deadline) t.pollLocked();
}

int IbTransport::findPeerFailure(chorusResult_t* code, std::string* text) {
  *code = chorusRemoteError;  // the notices carry the text only
  Impl& t = *impl_;
  std::lock_guard lk(t.mu);
  t.pollLocked();
  // A peer that died while this rank only receives from it is found by writing to it.
  if (Clock::now() - t.lastProbe >= kProbeEvery) {
    t.lastProbe = Clock::now();
    for (auto& p : t.peers) {
      if (p && p->broken.empty() && p->sqUsed < kSendDepth - 1)
        t.write(*p, kProbe, nullptr, 0, 0, p->remote.ctrlAddr, p->remote.ctrlRkey, nullptr, false);
    }
  }
  return firstNoticed(t.peers, text);
}

bool IbTransport::waitReadable(std::chrono::microseconds timeout) {
  Impl& t = *impl_;
  {
    std::lock_guard lk(t.mu);
    t.pollLocked();
    // Only what is new since the last wait ends it: unread data of a peer the engine is not
    // reading now would otherwise make every wait return at once.
    if (t.arrivals != t.seen) {
      t.seen = t.arrivals;
      return true;
    }
  }
  // Completions are polled (no completion channel): short sleeps keep the latency low.
  std::this_thread::sleep_for(std::min<std::chrono::microseconds>(timeout, std::chrono::microseconds(50)));
  return true;
}

size_t IbTransport::memoryBytes() const {
  size_t total = 0;
  for (const auto& p : impl_->peers) total += p ? p->rcap + p->scap + sizeof(Ctrl) : 0;
  return total;
}

}  // namespace chorus::transport
