#include "transports/ucx/ucx_transport.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/socket_util.hpp"
#include "transports/peer_link.hpp"
#include "transports/ucx/ucx_api.hpp"

namespace chorus::transport {

namespace {

using Clock = std::chrono::steady_clock;

// Tags of the control messages beside the streams: the kind in the top 16 bits, the sender's rank
// in the low 32.
constexpr ucp_tag_t kKindMask = 0xFFFF'0000'0000'0000ULL;
constexpr ucp_tag_t kHelloTag = 0xC401'0000'0000'0000ULL;
constexpr ucp_tag_t kNoticeTag = 0xC402'0000'0000'0000ULL;
constexpr ucp_tag_t kCreditTag = 0xC403'0000'0000'0000ULL;
constexpr ucp_tag_t kRankMask = 0xFFFF'FFFFULL;
constexpr size_t kMaxControl = 4096;  // longest hello or failure notice taken in
constexpr size_t kElem = 8;
constexpr size_t kCreditRings = 8;  // a sender may have this many rings unread at its peer           //
                                    // stream receives complete in whole 8-byte elements

const UcxApi& ucx() { return *UcxApi::get(nullptr); }

std::string statusText(ucs_status_t s) { return ucx().status_string(s); }

// A send handed to UCX: the ring position it ends at, or a control message.
struct SendSlot {
  uint64_t end = 0;
  bool done = false;
  ucs_status_t status = UCS_OK;
};

void onSendDone(void* request, ucs_status_t status, void* user) {
  auto* slot = static_cast<SendSlot*>(user);
  slot->done = true;
  slot->status = status;
  ucx().request_free(request);
}

struct TagRecv {
  bool done = false;
  ucs_status_t status = UCS_OK;
};

void onTagRecvDone(void* request, ucs_status_t status, const ucp_tag_recv_info_t*, void* user) {
  auto* r = static_cast<TagRecv*>(user);
  r->done = true;
  r->status = status;
  ucx().request_free(request);
}

// Marks an immediate or failed result of a send; true if UCX still owns the request.
bool settle(ucs_status_ptr_t r, SendSlot& slot) {
  if (r == nullptr) {
    slot.done = true;
  } else if (UCS_PTR_IS_ERR(r)) {
    slot.done = true;
    slot.status = UCS_PTR_STATUS(r);
  } else {
    return true;
  }
  return false;
}

}  // namespace

bool ucxAvailable(std::string* why) { return UcxApi::get(why) != nullptr; }

// ---- One remote peer: its endpoint and both rings -------------------------------------------------

struct UcxPeer;

class UcxSendPipe final : public SendPipe {
 public:
  explicit UcxSendPipe(UcxPeer& p) : p_(p) {}
  std::span<std::byte> reserve() override;
  void commit(size_t n) override;
  void flush() override;

 private:
  UcxPeer& p_;
};

class UcxRecvPipe final : public RecvPipe {
 public:
  explicit UcxRecvPipe(UcxPeer& p) : p_(p) {}
  std::span<const std::byte> peek() override;
  void consume(size_t n) override;

 private:
  UcxPeer& p_;
};

// A credit on its way to the peer: the value must live until UCX has sent it.
struct CreditOut {
  uint64_t value = 0;
  SendSlot slot;
};

// The endpoint and both rings of one peer, with its failure and notice (PeerLink; its arrivals
// count credits too).
struct UcxPeer : PeerLink {
  UcxPeer(UcxTransport::Impl& t, int rank, size_t cap, uint64_t* arrivals)
      : PeerLink(rank, arrivals), t(t), cap(cap), sbuf(new std::byte[cap]), rbuf(new std::byte[cap]) {}

  UcxTransport::Impl& t;
  const size_t cap;
  ucp_ep_h ep = nullptr;

  // Send ring: [sFreed, sPosted) is owned by UCX, [sPosted, sHead) committed but not yet flushed.
  // At most `cap` bytes may be unread by the peer (`credit` is how much it has read), so what UCX
  // holds for this rank on the peer's side is bounded too.
  std::unique_ptr<std::byte[]> sbuf;
  uint64_t sHead = 0, sPosted = 0, sFreed = 0;
  std::deque<SendSlot> inflight;
  uint64_t credit = 0;
  uint64_t creditIn = 0;  // the posted credit receive lands here
  bool creditActive = false;
  bool flushActive = false;  // an endpoint flush is in progress (bytes UCX still has to push)
  bool needFlush = false;    // a send was not complete at once: flush the endpoint once all are

  // Receive ring: [rTail, rHead) received and unread; one receive is posted into the free space.
  std::unique_ptr<std::byte[]> rbuf;
  uint64_t rHead = 0, rTail = 0;
  bool rActive = false;
  bool recvDead = false;  // UCX refused a receive: nothing more will arrive
  uint64_t creditSent = 0;
  std::deque<CreditOut> creditsOut;

  UcxSendPipe sendPipe{*this};
  UcxRecvPipe recvPipe{*this};

  PeerError brokenError() const {
    return PeerError(chorusRemoteError, strCat("the UCX connection with rank ", rank, " failed: ", broken,
                                               " (the peer exited, was killed, or cannot be reached)"));
  }
  // Unread data a peer may hold: a few rings (more would only grow UCX's buffers; fewer stalls the
  // stream on the credit round trip).
  size_t window() const { return kCreditRings * cap; }
  size_t sendRoom() const {
    return std::min<uint64_t>(cap - (sHead - sFreed),
                              window() - std::min<uint64_t>(window(), sHead - credit));
  }

  // Frees the ring space of completed sends (in order), and finished credit messages.
  void retire() {
    while (!inflight.empty() && inflight.front().done) {
      const SendSlot& s = inflight.front();
      if (s.status != UCS_OK && s.status != UCS_ERR_CANCELED)
        setBroken(strCat("send: ", statusText(s.status)));
      sFreed = s.end;
      inflight.pop_front();
    }
    while (!creditsOut.empty() && creditsOut.front().slot.done) creditsOut.pop_front();
  }

  void postSends() {
    while (sPosted < sHead && broken.empty()) {
      const size_t off = sPosted % cap;
      const size_t n = std::min<uint64_t>(sHead - sPosted, cap - off);
      SendSlot& slot = inflight.emplace_back();
      slot.end = sPosted + n;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.send = onSendDone;
      param.user_data = &slot;
      if (settle(ucx().stream_send_nbx(ep, sbuf.get() + off, n, &param), slot)) needFlush = true;
      sPosted += n;
    }
    retire();
  }

  static void onFlushDone(void* request, ucs_status_t, void* user) {
    static_cast<UcxPeer*>(user)->flushActive = false;
    ucx().request_free(request);
  }
  // A send UCX reports complete may still sit in its transport's buffers (a full socket): an
  // endpoint flush that does not finish at once hands the rest to the progress thread.
  bool startFlush() {
    if (flushActive || !broken.empty()) return flushActive;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = onFlushDone;
    param.user_data = this;
    ucs_status_ptr_t r = ucx().ep_flush_nbx(ep, &param);
    flushActive = r != nullptr && !UCS_PTR_IS_ERR(r);
    return flushActive;
  }

  static void onRecvDone(void* request, ucs_status_t status, size_t length, void* user) {
    auto* p = static_cast<UcxPeer*>(user);
    p->rActive = false;
    if (status == UCS_OK) {
      p->rHead += length;
      ++*p->arrivals;
    } else if (status != UCS_ERR_CANCELED) {
      p->setBroken(strCat("receive: ", statusText(status)));
    }
    ucx().request_free(request);
  }

  // Keeps one receive posted into the free space of the ring (none while the ring is full). Also
  // after the endpoint failed: what UCX received before the failure is still read.
  void postRecv() {
    while (!rActive && !recvDead) {
      const size_t off = rHead % cap;
      const size_t n = std::min<uint64_t>(cap - (rHead - rTail), cap - off) / kElem * kElem;
      if (n == 0) return;
      ucp_request_param_t param{};
      param.op_attr_mask =
          UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
      param.cb.recv_stream = onRecvDone;
      param.user_data = this;
      param.datatype = ucp_dt_make_contig(kElem);
      size_t length = 0;
      ucs_status_ptr_t r = ucx().stream_recv_nbx(ep, rbuf.get() + off, n / kElem, &length, &param);
      if (r == nullptr) {
        if (length == 0) return;
        rHead += length;
        ++*arrivals;
      } else if (UCS_PTR_IS_ERR(r)) {
        recvDead = true;
        setBroken(strCat("receive: ", statusText(UCS_PTR_STATUS(r))));
      } else {
        rActive = true;
      }
    }
  }

  static void onCreditDone(void* request, ucs_status_t status, const ucp_tag_recv_info_t*, void* user) {
    auto* p = static_cast<UcxPeer*>(user);
    p->creditActive = false;
    if (status == UCS_OK) {
      p->credit = std::max(p->credit, p->creditIn);
      ++*p->arrivals;
    }
    ucx().request_free(request);
  }
  // Keeps a receive posted for this peer's credits (how much of this rank's stream it has read).
  void postCreditRecv(ucp_worker_h worker, ucp_tag_t tag) {
    while (!creditActive && broken.empty()) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.recv = onCreditDone;
      param.user_data = this;
      ucs_status_ptr_t r = ucx().tag_recv_nbx(worker, &creditIn, sizeof creditIn,
                                              tag | static_cast<ucp_tag_t>(rank), ~ucp_tag_t{0}, &param);
      if (r == nullptr) {
        credit = std::max(credit, creditIn);
        ++*arrivals;
      } else if (UCS_PTR_IS_ERR(r)) {
        return;
      } else {
        creditActive = true;
      }
    }
  }
  // Tells the peer how much of its stream this rank has read, when it is worth a message.
  void maybeCredit(ucp_tag_t tag, int self) {
    const uint64_t unsent = rTail - creditSent;
    if (unsent < window() / 4 || !broken.empty()) return;
    CreditOut& c = creditsOut.emplace_back();
    c.value = rTail;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = onSendDone;
    param.user_data = &c.slot;
    settle(ucx().tag_send_nbx(ep, &c.value, sizeof c.value, tag | static_cast<ucp_tag_t>(self), &param),
           c.slot);
    creditSent = rTail;
  }
};

// ---- The worker and its peers ---------------------------------------------------------------------

// A control message (hello, failure notice) being received.
struct ControlIn {
  TagRecv done;
  std::vector<char> data;
  int from = -1;
};

struct UcxTransport::Impl {
  UcxOptions o;
  int rank = 0;
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  int efd = -1;  // the worker's event fd (-1 where UCX offers no wake-up)
  net::Fd wake;  // the progress thread tells an idle engine that something arrived
  std::vector<std::unique_ptr<UcxPeer>> peers;  // by rank; null where not a peer of this transport
  std::mutex mu;                                // serialises every use of the worker
  uint64_t arrivals = 0;                        // data, credits and failures taken in so far
  uint64_t seen = 0;                            // `arrivals` when the engine last waited
  uint64_t told = 0;                            // `arrivals` when the progress thread last woke the engine

  bool failed = false;              // publishFailure was called: nothing more is sent
  std::deque<std::string> texts;    // control payloads UCX may still be sending
  std::deque<SendSlot> controlOut;  // their completions
  std::vector<std::unique_ptr<ControlIn>> controlIn;

  std::mutex kickMu;
  std::condition_variable kickCv;
  bool kicked = false;
  std::atomic<bool> stop{false};
  std::thread progress;

  ~Impl();

  void progressLocked() {
    while (ucx().worker_progress(worker) != 0) {
    }
    for (auto& p : peers) {
      if (!p) continue;
      p->retire();
      p->postCreditRecv(worker, kCreditTag);
    }
  }
  bool sendsPending() const {
    for (const auto& p : peers) {
      if (p && (!p->inflight.empty() || p->flushActive || !p->creditsOut.empty())) return true;
    }
    return false;
  }
  void kick() {
    {
      std::lock_guard lk(kickMu);
      kicked = true;
    }
    kickCv.notify_one();
  }
  void progressLoop();

  // Set-up phases, in order (the constructor's).
  /// Creates the UCP context (UCX_TLS from the options; wake-up events where offered) and the worker.
  void createWorker(const UcxApi& api);
  /// Publishes the worker's address in the store ("ucx/<rank>").
  void publishAddress(const UcxApi& api, Store& store);
  /// Creates an endpoint to the published address of every peer.
  void connectPeers(const UcxApi& api, Store& store, int nranks, const std::vector<bool>& isPeer);
  /// Exchanges a hello with every peer (bounded by the timeout).
  void exchangeHellos(int nranks);
  /// Posts the first receives of every peer's stream and credits.
  void startReceiving();

  // Sends a control message (kind | this rank) to `p`.
  void sendControl(UcxPeer& p, ucp_tag_t kind, std::string text) {
    const std::string& t = texts.emplace_back(std::move(text));
    SendSlot& slot = controlOut.emplace_back();
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = onSendDone;
    param.user_data = &slot;
    settle(ucx().tag_send_nbx(p.ep, t.data(), t.size(), kind | static_cast<ucp_tag_t>(rank), &param), slot);
  }
  bool controlPending() const {
    return std::any_of(controlOut.begin(), controlOut.end(), [](const SendSlot& s) { return !s.done; });
  }
  // Starts receiving every control message of `kind` that arrived; calls onMessage(from, text) for
  // each one received in full (now or by an earlier call). Never waits.
  template <class F>
  void takeControl(ucp_tag_t kind, F&& onMessage) {
    for (;;) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h msg = ucx().tag_probe_nb(worker, kind, kKindMask, 1, &info);
      if (!msg) break;
      auto& in = controlIn.emplace_back(std::make_unique<ControlIn>());
      in->from = static_cast<int>(info.sender_tag & kRankMask);
      in->data.resize(info.length);
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.recv = onTagRecvDone;
      param.user_data = &in->done;
      ucs_status_ptr_t r = ucx().tag_msg_recv_nbx(worker, in->data.data(), in->data.size(), msg, &param);
      if (r == nullptr) {
        in->done.done = true;
      } else if (UCS_PTR_IS_ERR(r)) {
        in->done.done = true;
        in->done.status = UCS_PTR_STATUS(r);
      }
    }
    std::erase_if(controlIn, [&](const std::unique_ptr<ControlIn>& in) {
      if (!in->done.done) return false;
      if (in->done.status != UCS_OK) {
        onMessage(in->from, strCat("(unreadable: ", statusText(in->done.status), ")"));
      } else {
        onMessage(in->from, std::string(in->data.data(), std::min(in->data.size(), kMaxControl)));
      }
      return true;
    });
  }
  UcxPeer* peer(int r) {
    return r >= 0 && static_cast<size_t>(r) < peers.size() ? peers[static_cast<size_t>(r)].get() : nullptr;
  }
};

UcxTransport::Impl::~Impl() {
  stop.store(true);
  kick();
  if (progress.joinable()) progress.join();
  if (!worker) {
    if (ctx) ucx().cleanup(ctx);
    return;
  }
  const auto deadline =
      Clock::now() + std::min<std::chrono::milliseconds>(o.timeout, std::chrono::seconds(30));
  // Everything the engine committed leaves first (it may not have been flushed by a failing rank),
  // within the peer's credits: a peer that stopped reading is not waited for past the deadline.
  auto allBroken = [&] {
    return std::all_of(peers.begin(), peers.end(), [](auto& p) { return !p || !p->broken.empty(); });
  };
  for (;;) {
    bool more = false;
    for (auto& p : peers) {
      if (!p || !p->ep || failed || !p->broken.empty()) continue;
      if (p->sPosted < p->sHead) p->postSends();
      more = more || p->sPosted < p->sHead || !p->inflight.empty() || p->startFlush();
    }
    if ((!more && !controlPending()) || allBroken() || Clock::now() >= deadline) break;
    progressLocked();
  }
  std::vector<void*> closing;
  for (auto& p : peers) {
    if (!p || !p->ep) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = p->broken.empty() ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucx().ep_close_nbx(p->ep, &param);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
    p->ep = nullptr;
  }
  while (!closing.empty() && Clock::now() < deadline) {
    ucx().worker_progress(worker);
    std::erase_if(closing, [](void* r) {
      if (ucx().request_check_status(r) == UCS_INPROGRESS) return false;
      ucx().request_free(r);
      return true;
    });
  }
  if (!closing.empty()) {
    logWarn("rank ", rank, ": ", closing.size(), " UCX endpoint(s) did not close in time");
  }
  ucx().worker_destroy(worker);
  ucx().cleanup(ctx);
}

void UcxTransport::Impl::progressLoop() {
  while (!stop.load()) {
    bool pending;
    {
      std::lock_guard lk(mu);
      progressLocked();
      for (auto& p : peers) {
        // The last bytes of a large send may still sit in UCX's transport (a full socket).
        if (p && p->needFlush && p->inflight.empty()) {
          p->needFlush = false;
          p->startFlush();
        }
      }
      pending = sendsPending() || controlPending();
      if (arrivals != told) {
        // Taken in here, not by the engine: an engine waiting on the worker's fd may not see it.
        told = arrivals;
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t w = ::write(wake.get(), &one, sizeof one);
      }
    }
    if (!pending) {
      std::unique_lock k(kickMu);
      kickCv.wait_for(k, std::chrono::milliseconds(100), [&] { return kicked || stop.load(); });
      kicked = false;
      continue;
    }
    if (efd < 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    ucs_status_t armed;
    {
      std::lock_guard lk(mu);
      armed = ucx().worker_arm(worker);
    }
    if (armed == UCS_OK) {
      pollfd pf{efd, POLLIN, 0};
      ::poll(&pf, 1, 1);
    }
  }
}

// ---- Pipes ----------------------------------------------------------------------------------------

std::span<std::byte> UcxSendPipe::reserve() {
  std::lock_guard lk(p_.t.mu);
  p_.retire();
  if (p_.sendRoom() == 0) p_.t.progressLocked();
  if (!p_.broken.empty()) throw p_.brokenError();
  const size_t off = p_.sHead % p_.cap;
  return {p_.sbuf.get() + off, std::min<size_t>(p_.sendRoom(), p_.cap - off)};
}

void UcxSendPipe::commit(size_t n) { p_.sHead += n; }

void UcxSendPipe::flush() {
  bool pending;
  {
    std::lock_guard lk(p_.t.mu);
    if (p_.t.failed) return;
    p_.postSends();
    pending = !p_.inflight.empty();
  }
  if (pending) p_.t.kick();
}

std::span<const std::byte> UcxRecvPipe::peek() {
  std::lock_guard lk(p_.t.mu);
  if (p_.rHead == p_.rTail) {
    p_.t.progressLocked();
    p_.postRecv();
    if (p_.rHead == p_.rTail) {
      // A failed endpoint is reported once a fresh receive finds nothing left of what it delivered.
      if (!p_.broken.empty()) throw p_.brokenError();
      return {};
    }
  }
  const size_t off = p_.rTail % p_.cap;
  const size_t n = std::min<uint64_t>(p_.rHead - p_.rTail, p_.cap - off);
  return {p_.rbuf.get() + off, n};
}

void UcxRecvPipe::consume(size_t n) {
  bool pending;
  {
    std::lock_guard lk(p_.t.mu);
    p_.rTail += n;
    p_.postRecv();
    p_.maybeCredit(kCreditTag, p_.t.rank);
    pending = !p_.creditsOut.empty();
  }
  if (pending) p_.t.kick();
}

// ---- The transport --------------------------------------------------------------------------------

void UcxTransport::Impl::createWorker(const UcxApi& api) {
  ucp_config_t* config = nullptr;
  ucs_status_t st = api.config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) throw Error(chorusSystemError, strCat("ucp_config_read: ", statusText(st)));
  if (!o.tls.empty()) {
    st = api.config_modify(config, "TLS", o.tls.c_str());
    if (st != UCS_OK) {
      api.config_release(config);
      throw Error(chorusInvalidArgument, strCat("UCX refuses TLS=", o.tls, ": ", statusText(st)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_STREAM | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  st = api.init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &ctx);
  if (st != UCS_OK) {
    // Transports without wake-up events: the progress thread and idle waits poll instead.
    params.features &= ~static_cast<uint64_t>(UCP_FEATURE_WAKEUP);
    st = api.init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &ctx);
  }
  api.config_release(config);
  if (st != UCS_OK) throw Error(chorusSystemError, strCat("ucp_init: ", statusText(st)));

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = api.worker_create(ctx, &wp, &worker);
  if (st != UCS_OK) throw Error(chorusSystemError, strCat("ucp_worker_create: ", statusText(st)));
  if ((params.features & UCP_FEATURE_WAKEUP) && api.worker_get_efd(worker, &efd) != UCS_OK) efd = -1;
}

void UcxTransport::Impl::publishAddress(const UcxApi& api, Store& store) {
  ucp_address_t* address = nullptr;
  size_t addressLength = 0;
  const ucs_status_t st = api.worker_get_address(worker, &address, &addressLength);
  if (st != UCS_OK) throw Error(chorusSystemError, strCat("ucp_worker_get_address: ", statusText(st)));
  store.set(strCat("ucx/", rank), std::span(reinterpret_cast<const std::byte*>(address), addressLength));
  api.worker_release_address(worker, address);
}

void UcxTransport::Impl::connectPeers(const UcxApi& api, Store& store, int nranks,
                                      const std::vector<bool>& isPeer) {
  const size_t cap = std::max<size_t>(alignUp(o.ringBytes, 64), 4096);
  peers.resize(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    if (r == rank || !isPeer[static_cast<size_t>(r)]) continue;
    std::vector<std::byte> remote;
    try {
      remote = store.get(strCat("ucx/", r), o.timeout);
    } catch (const Error& e) {
      throw Error(e.code(), strCat("rank ", r, " did not publish its UCX worker address: ", e.what()));
    }
    auto p = std::make_unique<UcxPeer>(*this, r, cap, &arrivals);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(remote.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t status) {
      static_cast<UcxPeer*>(arg)->setBroken(statusText(status));
    };
    ep.err_handler.arg = p.get();
    const ucs_status_t st = api.ep_create(worker, &ep, &p->ep);
    if (st != UCS_OK)
      throw Error(chorusSystemError, strCat("ucp_ep_create to rank ", r, ": ", statusText(st)));
    peers[static_cast<size_t>(r)] = std::move(p);
  }
}

void UcxTransport::Impl::exchangeHellos(int nranks) {
  // Hello: proves every endpoint carries messages both ways (and wires them up now, not in the
  // first collective).
  std::vector<bool> heard(static_cast<size_t>(nranks), false);
  int waiting = 0;
  for (auto& p : peers) {
    if (!p) continue;
    sendControl(*p, kHelloTag, o.commId);
    ++waiting;
  }
  const auto deadline = Clock::now() + o.timeout;
  while (waiting > 0 || controlPending()) {
    progressLocked();
    takeControl(kHelloTag, [&](int from, const std::string& text) {
      UcxPeer* p = peer(from);
      if (!p || heard[static_cast<size_t>(from)] || text != o.commId) {
        throw Error(chorusInternalError,
                    strCat("UCX hello from rank ", from, " does not belong to communicator ", o.commId));
      }
      heard[static_cast<size_t>(from)] = true;
      --waiting;
    });
    for (auto& p : peers) {
      if (p && !p->broken.empty()) throw p->brokenError();
    }
    if (Clock::now() > deadline) {
      std::string missing;
      for (auto& p : peers) {
        if (p && !heard[static_cast<size_t>(p->rank)])
          missing += strCat(missing.empty() ? "" : ", ", p->rank);
      }
      throw Error(chorusTimeout, strCat("no UCX hello from rank(s) ", missing.empty() ? "-" : missing,
                                        " within ", o.timeout.count(), " ms"));
    }
    if (waiting > 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  texts.clear();
  controlOut.clear();
}

void UcxTransport::Impl::startReceiving() {
  for (auto& p : peers) {
    if (!p) continue;
    p->postRecv();
    p->postCreditRecv(worker, kCreditTag);
  }
  seen = told = arrivals;
}

UcxTransport::UcxTransport(Store& store, int rank, int nranks, const std::vector<bool>& peers,
                           const UcxOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& t = *impl_;
  t.o = options;
  t.rank = rank;
  std::string why;
  const UcxApi* api = UcxApi::get(&why);
  if (!api) throw Error(chorusSystemError, why);
  t.createWorker(*api);
  t.publishAddress(*api, store);
  t.connectPeers(*api, store, nranks, peers);
  t.wake = net::Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!t.wake) throw Error(chorusSystemError, strCat("eventfd: ", errnoText(errno)));
  t.exchangeHellos(nranks);
  t.startReceiving();
  local_ = strCat("UCX ", api->get_version_string(), " (",
                  options.tls.empty() ? "UCX's own transports" : options.tls,
                  t.efd < 0 ? ", no wake-up events" : "", ")");
  t.progress = std::thread([&t] { t.progressLoop(); });
}

UcxTransport::~UcxTransport() = default;

SendPipe& UcxTransport::sendPipe(int peer) { return impl_->peer(peer)->sendPipe; }
RecvPipe& UcxTransport::recvPipe(int peer) { return impl_->peer(peer)->recvPipe; }

void UcxTransport::publishFailure(chorusResult_t, const std::string& text) {
  Impl& t = *impl_;
  std::lock_guard lk(t.mu);
  if (t.failed) return;
  t.failed = true;
  for (auto& p : t.peers) {
    if (p && p->broken.empty()) t.sendControl(*p, kNoticeTag, text.substr(0, kMaxControl));
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(200);
  while (t.controlPending() && Clock::now() < deadline) t.progressLocked();
}

int UcxTransport::findPeerFailure(chorusResult_t* code, std::string* text) {
  *code = chorusRemoteError;  // the notices carry the text only
  Impl& t = *impl_;
  std::lock_guard lk(t.mu);
  t.progressLocked();
  t.takeControl(kNoticeTag, [&](int from, const std::string& got) {
    if (UcxPeer* p = t.peer(from); p && !p->noticed) {
      p->noticed = true;
      p->notice = got;
    }
  });
  return firstNoticed(t.peers, text);
}

bool UcxTransport::waitReadable(std::chrono::microseconds timeout) {
  Impl& t = *impl_;
  {
    std::lock_guard lk(t.mu);
    t.progressLocked();
    for (auto& p : t.peers) {
      if (p) p->postRecv();
    }
    // Only what is new since the last wait ends it: unread data of a peer the engine is not
    // reading now would otherwise make every wait return at once.
    if (t.arrivals != t.seen) {
      t.seen = t.arrivals;
      return true;
    }
    if (t.efd >= 0 && ucx().worker_arm(t.worker) != UCS_OK) return true;
  }
  // The worker's events, or the progress thread saying it took something in.
  pollfd pf[2] = {{t.wake.get(), POLLIN, 0}, {t.efd, POLLIN, 0}};
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          t.efd < 0 ? std::min<std::chrono::microseconds>(timeout, std::chrono::microseconds(200)) : timeout)
          .count();
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  if (::ppoll(pf, t.efd < 0 ? 1 : 2, &ts, nullptr) > 0 && (pf[0].revents & POLLIN)) {
    uint64_t v;
    [[maybe_unused]] ssize_t r = ::read(t.wake.get(), &v, sizeof v);
  }
  return true;
}

size_t UcxTransport::memoryBytes() const {
  size_t total = 0;
  for (const auto& p : impl_->peers) total += p ? 2 * p->cap : 0;
  return total;
}

}  // namespace chorus::transport
