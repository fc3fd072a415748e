#include "fake_verbs.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

namespace chorus::transport::fake {

namespace {

struct Region {
  uintptr_t addr;
  size_t length;
  int access;
};

struct Qp {
  ibv_qp* qp;
  ibv_cq* sendCq;
  ibv_cq* recvCq;
  ibv_qp_state state = IBV_QPS_RESET;
  uint32_t dest = 0;
  int maxSend = 0;
  int maxRecv = 0;
  int maxInline = 0;
  bool sigAll = false;
  int outstanding = 0;  // signaled send work requests whose completion was not polled yet
  std::deque<uint64_t> recvs;
  std::deque<ibv_wc> waiting;  // immediates that arrived before a receive was posted
};

struct World {
  std::mutex mu;
  std::vector<Device> devices;
  int listErrno = 0;
  std::vector<std::unique_ptr<ibv_device>> deviceObjects;
  std::map<ibv_context*, int> contexts;  // -> device index
  std::map<uint32_t, Region> regions;    // by key (lkey == rkey)
  std::map<ibv_cq*, std::deque<ibv_wc>> cqs;
  std::map<uint32_t, Qp> qps;  // by number
  std::map<ibv_cq*, std::map<uint32_t, int>> cqOwners;
  uint32_t nextKey = 100;
  uint32_t nextQpn = 0x40;
  Stats stats;
};

World& world() {
  static World w;
  return w;
}

Qp* findQp(World& w, ibv_qp* qp) {
  auto it = w.qps.find(qp->qp_num);
  return it == w.qps.end() ? nullptr : &it->second;
}

void complete(World& w, ibv_cq* cq, const ibv_wc& wc) { w.cqs[cq].push_back(wc); }

ibv_wc sendWc(uint64_t id, ibv_wc_status status, uint32_t qpn) {
  ibv_wc wc{};
  wc.wr_id = id;
  wc.status = status;
  wc.opcode = IBV_WC_RDMA_WRITE;
  wc.qp_num = qpn;
  return wc;
}

// Puts a queue pair in the error state: its posted receives complete as flushed.
void toError(World& w, Qp& q) {
  q.state = IBV_QPS_ERR;
  for (uint64_t id : q.recvs) {
    ibv_wc wc{};
    wc.wr_id = id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = q.qp->qp_num;
    complete(w, q.recvCq, wc);
  }
  q.recvs.clear();
}

void deliverWaiting(World& w, Qp& q) {
  while (!q.waiting.empty() && !q.recvs.empty()) {
    ibv_wc wc = q.waiting.front();
    q.waiting.pop_front();
    wc.wr_id = q.recvs.front();
    q.recvs.pop_front();
    complete(w, q.recvCq, wc);
  }
}

// Copies into registered remote memory; 8 aligned bytes are stored atomically, as a DMA write of a
// word is (the transport reads its credit word without a lock).
bool remoteWrite(World& w, uint64_t addr, uint32_t rkey, const void* src, size_t n) {
  auto it = w.regions.find(rkey);
  if (it == w.regions.end() || !(it->second.access & IBV_ACCESS_REMOTE_WRITE)) return false;
  const Region& r = it->second;
  if (addr < r.addr || addr + n > r.addr + r.length) return false;
  if (n == 8 && addr % 8 == 0) {
    uint64_t v;
    std::memcpy(&v, src, 8);
    __atomic_store_n(reinterpret_cast<uint64_t*>(addr), v, __ATOMIC_RELEASE);
  } else if (n) {
    std::memcpy(reinterpret_cast<void*>(addr), src, n);
  }
  return true;
}

// ---- The calls ------------------------------------------------------------------------------------

ibv_device** getDeviceList(int* num) {
  World& w = world();
  std::lock_guard lk(w.mu);
  if (w.listErrno) {
    errno = w.listErrno;
    return nullptr;
  }
  auto** list = new ibv_device*[w.devices.size() + 1];
  for (size_t i = 0; i < w.devices.size(); ++i) list[i] = w.deviceObjects[i].get();
  list[w.devices.size()] = nullptr;
  if (num) *num = static_cast<int>(w.devices.size());
  return list;
}

void freeDeviceList(ibv_device** list) { delete[] list; }

int deviceIndex(World& w, ibv_device* d) {
  for (size_t i = 0; i < w.deviceObjects.size(); ++i) {
    if (w.deviceObjects[i].get() == d) return static_cast<int>(i);
  }
  return -1;
}

const char* getDeviceName(ibv_device* d) {
  World& w = world();
  std::lock_guard lk(w.mu);
  return w.devices[static_cast<size_t>(deviceIndex(w, d))].name.c_str();
}

ibv_context* openDevice(ibv_device* d) {
  World& w = world();
  std::lock_guard lk(w.mu);
  auto* ctx = new ibv_context{};
  ctx->device = d;
  w.contexts[ctx] = deviceIndex(w, d);
  return ctx;
}

int closeDevice(ibv_context* ctx) {
  World& w = world();
  std::lock_guard lk(w.mu);
  w.contexts.erase(ctx);
  delete ctx;
  return 0;
}

int queryPort(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) {
  World& w = world();
  std::lock_guard lk(w.mu);
  if (port != 1) return EINVAL;
  const Device& d = w.devices[static_cast<size_t>(w.contexts.at(ctx))];
  *attr = ibv_port_attr{};
  attr->state = d.active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  attr->active_mtu = IBV_MTU_4096;
  attr->lid = static_cast<uint16_t>(7 + w.contexts.at(ctx));
  attr->link_layer = d.ethernet ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  return 0;
}

int queryGid(ibv_context*, uint8_t, int index, ibv_gid* gid) {
  if (index < 0 || index > 3) return EINVAL;
  std::memset(gid, 0, sizeof *gid);
  gid->raw[15] = static_cast<uint8_t>(index + 1);
  return 0;
}

ibv_pd* allocPd(ibv_context* ctx) {
  auto* pd = new ibv_pd{};
  pd->context = ctx;
  return pd;
}

int deallocPd(ibv_pd* pd) {
  delete pd;
  return 0;
}

ibv_mr* regMr(ibv_pd* pd, void* addr, size_t length, int access) {
  World& w = world();
  std::lock_guard lk(w.mu);
  auto* mr = new ibv_mr{};
  mr->context = pd->context;
  mr->pd = pd;
  mr->addr = addr;
  mr->length = length;
  mr->lkey = mr->rkey = w.nextKey++;
  w.regions[mr->lkey] = Region{reinterpret_cast<uintptr_t>(addr), length, access};
  return mr;
}

int deregMr(ibv_mr* mr) {
  World& w = world();
  std::lock_guard lk(w.mu);
  w.regions.erase(mr->lkey);
  delete mr;
  return 0;
}

ibv_cq* createCq(ibv_context* ctx, int, void*, ibv_comp_channel*, int) {
  World& w = world();
  std::lock_guard lk(w.mu);
  auto* cq = new ibv_cq{};
  cq->context = ctx;
  w.cqs[cq];
  return cq;
}

int destroyCq(ibv_cq* cq) {
  World& w = world();
  std::lock_guard lk(w.mu);
  w.cqs.erase(cq);
  delete cq;
  return 0;
}

ibv_qp* createQp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  World& w = world();
  std::lock_guard lk(w.mu);
  if (attr->qp_type != IBV_QPT_RC) {
    errno = EINVAL;
    return nullptr;
  }
  auto* qp = new ibv_qp{};
  qp->context = pd->context;
  qp->pd = pd;
  qp->qp_num = w.nextQpn++;
  qp->qp_type = IBV_QPT_RC;
  Qp q{};
  q.qp = qp;
  q.sendCq = attr->send_cq;
  q.recvCq = attr->recv_cq;
  q.maxSend = static_cast<int>(attr->cap.max_send_wr);
  q.maxRecv = static_cast<int>(attr->cap.max_recv_wr);
  q.maxInline = static_cast<int>(attr->cap.max_inline_data);
  q.sigAll = attr->sq_sig_all != 0;
  w.qps[qp->qp_num] = q;
  return qp;
}

int destroyQp(ibv_qp* qp) {
  World& w = world();
  std::lock_guard lk(w.mu);
  w.qps.erase(qp->qp_num);
  delete qp;
  return 0;
}

int modifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  World& w = world();
  std::lock_guard lk(w.mu);
  Qp* q = findQp(w, qp);
  if (!q || !(mask & IBV_QP_STATE)) return EINVAL;
  // The transitions a real queue pair allows, each with the attributes it needs.
  const ibv_qp_state to = attr->qp_state;
  if (to == IBV_QPS_INIT && (q->state != IBV_QPS_RESET || !(mask & IBV_QP_PORT))) return EINVAL;
  if (to == IBV_QPS_RTR && (q->state != IBV_QPS_INIT || !(mask & IBV_QP_DEST_QPN) || !(mask & IBV_QP_AV)))
    return EINVAL;
  if (to == IBV_QPS_RTS && (q->state != IBV_QPS_RTR || !(mask & IBV_QP_SQ_PSN))) return EINVAL;
  if (to == IBV_QPS_RTR) q->dest = attr->dest_qp_num;
  q->state = to;
  return 0;
}

int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  World& w = world();
  std::lock_guard lk(w.mu);
  Qp* q = findQp(w, qp);
  for (; wr; wr = wr->next) {
    if (!q || q->state != IBV_QPS_RTS) {
      if (q && q->state == IBV_QPS_ERR) {
        // Posting to a queue pair in error is allowed; the request completes as flushed.
        ++q->outstanding;
        complete(w, q->sendCq, sendWc(wr->wr_id, IBV_WC_WR_FLUSH_ERR, qp->qp_num));
        continue;
      }
      *bad = wr;
      return EINVAL;
    }
    const bool signaled = q->sigAll || (wr->send_flags & IBV_SEND_SIGNALED);
    if (signaled && q->outstanding >= q->maxSend) {
      *bad = wr;
      return ENOMEM;
    }
    size_t bytes = 0;
    for (int i = 0; i < wr->num_sge; ++i) bytes += wr->sg_list[i].length;
    if ((wr->send_flags & IBV_SEND_INLINE) && bytes > static_cast<size_t>(q->maxInline)) {
      *bad = wr;
      return EINVAL;
    }
    if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM) {
      *bad = wr;
      return EINVAL;
    }
    // Gather the payload (checking local keys unless inline).
    std::vector<char> payload;
    payload.reserve(bytes);
    bool localOk = true;
    for (int i = 0; i < wr->num_sge; ++i) {
      const ibv_sge& s = wr->sg_list[i];
      if (!(wr->send_flags & IBV_SEND_INLINE)) {
        auto it = w.regions.find(s.lkey);
        localOk = localOk && it != w.regions.end() && s.addr >= it->second.addr &&
                  s.addr + s.length <= it->second.addr + it->second.length;
      }
      const char* src = reinterpret_cast<const char*>(s.addr);
      payload.insert(payload.end(), src, src + s.length);
    }
    if (signaled) {
      ++q->outstanding;
      w.stats.maxSendQueue = std::max<long>(w.stats.maxSendQueue, q->outstanding);
    }
    ibv_wc_status status = IBV_WC_SUCCESS;
    auto peer = w.qps.find(q->dest);
    if (!localOk) {
      status = IBV_WC_LOC_PROT_ERR;
    } else if (peer == w.qps.end() ||
               (peer->second.state != IBV_QPS_RTR && peer->second.state != IBV_QPS_RTS)) {
      status = IBV_WC_RETRY_EXC_ERR;  // nobody acknowledges: the retries run out
    } else if (!remoteWrite(w, wr->wr.rdma.remote_addr, wr->wr.rdma.rkey, payload.data(), payload.size())) {
      status = IBV_WC_REM_ACCESS_ERR;
    }
    if (status != IBV_WC_SUCCESS) {
      // An error completes even an unsignaled request and stops the queue pair.
      if (!signaled) ++q->outstanding;
      complete(w, q->sendCq, sendWc(wr->wr_id, status, qp->qp_num));
      toError(w, *q);
      continue;
    }
    ++w.stats.writes;
    if (wr->send_flags & IBV_SEND_INLINE) ++w.stats.inlineWrites;
    if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
      ++w.stats.writesWithImm;
      Qp& d = peer->second;
      ibv_wc wc{};
      wc.status = IBV_WC_SUCCESS;
      wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
      wc.wc_flags = IBV_WC_WITH_IMM;
      wc.imm_data = wr->imm_data;
      wc.qp_num = d.qp->qp_num;
      wc.byte_len = static_cast<uint32_t>(payload.size());
      d.waiting.push_back(wc);
      deliverWaiting(w, d);
    }
    if (signaled) complete(w, q->sendCq, sendWc(wr->wr_id, IBV_WC_SUCCESS, qp->qp_num));
  }
  return 0;
}

int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  World& w = world();
  std::lock_guard lk(w.mu);
  Qp* q = findQp(w, qp);
  for (; wr; wr = wr->next) {
    if (!q || q->state == IBV_QPS_RESET || static_cast<int>(q->recvs.size()) >= q->maxRecv) {
      *bad = wr;
      return q ? ENOMEM : EINVAL;
    }
    q->recvs.push_back(wr->wr_id);
  }
  if (q) deliverWaiting(w, *q);
  return 0;
}

int pollCq(ibv_cq* cq, int n, ibv_wc* out) {
  World& w = world();
  std::lock_guard lk(w.mu);
  auto& queue = w.cqs[cq];
  int k = 0;
  while (k < n && !queue.empty()) {
    out[k] = queue.front();
    queue.pop_front();
    if (out[k].opcode == IBV_WC_RDMA_WRITE) {
      auto it = w.qps.find(out[k].qp_num);
      if (it != w.qps.end()) --it->second.outstanding;
    }
    ++k;
  }
  return k;
}

const VerbsApi kApi = {getDeviceList, freeDeviceList, getDeviceName, openDevice, closeDevice,
                       queryPort,     queryGid,       allocPd,       deallocPd,  regMr,
                       deregMr,       createCq,       destroyCq,     createQp,   destroyQp,
                       modifyQp,      postSend,       postRecv,      pollCq};

}  // namespace

void reset(std::vector<Device> devices, int listErrno) {
  World& w = world();
  std::lock_guard lk(w.mu);
  w.devices = std::move(devices);
  w.listErrno = listErrno;
  w.deviceObjects.clear();
  for (size_t i = 0; i < w.devices.size(); ++i) w.deviceObjects.push_back(std::make_unique<ibv_device>());
  w.stats = Stats{};
}

const VerbsApi* api() { return &kApi; }

Stats stats() {
  World& w = world();
  std::lock_guard lk(w.mu);
  return w.stats;
}

}  // namespace chorus::transport::fake
