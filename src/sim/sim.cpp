#include "sim/sim.hpp"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <queue>
#include <unordered_map>

#include "algorithms/cost_model.hpp"
#include "base/error.hpp"
#include "base/util.hpp"

namespace chorus::sim {

namespace {

// ---- Recording: the algorithms run against a Context that moves no data ------------------------

struct Xfer {
  engine::TransferKind kind;
  int peer;
  int waitFor;  // index within its batch, -1 if none
  size_t bytes;
};

// A batch of transfers (one Context::run) preceded by local work on the rank's engine.
struct Stage {
  size_t first = 0, count = 0;
  double computeBeforeUs = 0;
};

struct Program {
  std::vector<Xfer> xfers;
  std::vector<Stage> stages;  // the last may have no transfers (trailing local work)
};

struct NotSimulated {
  std::string why;
};

// Buffers are never touched: every pointer the algorithms compute stays inside a range that no
// one dereferences.
std::byte* fakeBuffer(int which) { return reinterpret_cast<std::byte*>(uintptr_t{1} << (40 + which)); }

class RecordingContext final : public algo::Context {
 public:
  RecordingContext(int rank, int size, const topo::CommTopology& topo, const Machine& m, Program& out,
                   size_t maxTransfers)
      : rank_(rank),
        size_(size),
        topo_(topo),
        m_(m),
        out_(out),
        maxTransfers_(maxTransfers),
        model_(modelOf(m)) {}

  /// The library's cost model for the simulated machine, so that tuned parameters (the tree's
  /// chunk size) are chosen as a communicator on that machine would choose them.
  static algo::CostModel modelOf(const Machine& m) {
    algo::CostModel c;
    c.intra = {m.intra.name, m.intra.alphaUs, m.intra.sendGBps};
    c.inter = {m.inter.name, m.inter.alphaUs, m.inter.sendGBps};
    c.nicGBps = m.nicGBps;
    c.reduceGBps = m.reduceGBps;
    c.hosts = m.hosts;
    c.ranksPerHost = m.ranksPerHost;
    return c;
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  engine::ShmSync* sharedMemory() override { return nullptr; }  // the pipe algorithms only
  std::byte* scratch(size_t, int slot) override { return fakeBuffer(2 + slot); }
  void run(std::span<engine::Transfer> transfers) override {
    if (out_.xfers.size() + transfers.size() > maxTransfers_)
      throw NotSimulated{strCat("too large: rank ", rank_, "'s schedule holds more than ", maxTransfers_,
                                " messages (the simulator's state for all ranks is limited to about 4 GB)")};
    Stage st;
    st.first = out_.xfers.size();
    st.count = transfers.size();
    st.computeBeforeUs = pendingUs_;
    pendingUs_ = 0;
    for (const engine::Transfer& t : transfers)
      out_.xfers.push_back(Xfer{t.kind, t.peer, t.waitFor, t.bytes});
    out_.stages.push_back(st);
  }
  uint16_t tag() const override { return 1; }
  const topo::CommTopology& topology() const override { return topo_; }
  const algo::CostModel* costModel() const override { return &model_; }
  void localCopy(void*, const void*, size_t bytes) override {
    pendingUs_ += static_cast<double>(bytes) / (m_.copyGBps * 1e3);
  }
  void localReduce(void*, const void* const*, int nsrcs, size_t count, DataType type, ReduceOp,
                   int) override {
    const double bytes = static_cast<double>(count * dataTypeSize(type)) * std::max(1, nsrcs - 1);
    pendingUs_ += bytes / (m_.reduceGBps * 1e3);
  }
  void finish() {
    if (pendingUs_ > 0) out_.stages.push_back(Stage{out_.xfers.size(), 0, pendingUs_});
  }

 private:
  int rank_, size_;
  const topo::CommTopology& topo_;
  const Machine& m_;
  Program& out_;
  size_t maxTransfers_;
  algo::CostModel model_;
  double pendingUs_ = 0;
};

// ---- Replay: a discrete-event simulation, chunk by chunk ----------------------------------------

enum class Ev : uint8_t { StageStart, SendNic, SendChunkDone, Arrival, RecvChunkDone };

struct Event {
  double t;
  uint64_t seq;
  Ev type;
  bool nicPassed;  // Arrival: already through the receiving host's NIC
  int rank;
  size_t x;          // transfer (global index); Arrival: the stream key
  size_t bytes = 0;  // Arrival: the chunk's size
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

struct XState {
  double engineEnd = 0;    // sends: when the chunk in service leaves the engine
  size_t chunksDone = 0;   // sends: chunks through the engine; receives: chunks processed
  size_t bytesDone = 0;    // receives: bytes processed (what bound sends wait on)
  bool inService = false;  // a chunk of it is being served
  bool complete = false;
};

struct Stream {
  std::deque<size_t> arrived;  // sizes of the chunks arrived and not yet taken, in order
  std::deque<size_t> posted;   // receives (global index) waiting on this stream, in order
};

class Simulation {
 public:
  Simulation(const Machine& m, std::vector<Program>& programs) : m_(m), progs_(programs) {
    const int n = static_cast<int>(programs.size());
    base_.resize(static_cast<size_t>(n) + 1);
    for (int r = 0; r < n; ++r)
      base_[static_cast<size_t>(r) + 1] =
          base_[static_cast<size_t>(r)] + programs[static_cast<size_t>(r)].xfers.size();
    xs_.resize(base_.back());
    owner_.resize(base_.back());
    dependents_.resize(base_.back());
    pipePrev_.assign(base_.back(), SIZE_MAX);
    pipeNext_.assign(base_.back(), SIZE_MAX);
    waitG_.assign(base_.back(), SIZE_MAX);
    for (int r = 0; r < n; ++r) {
      const Program& p = programs[static_cast<size_t>(r)];
      for (const Stage& st : p.stages) {
        std::unordered_map<int, size_t> lastSendTo;
        for (size_t i = st.first; i < st.first + st.count; ++i) {
          const size_t g = base_[static_cast<size_t>(r)] + i;
          owner_[g] = r;
          const Xfer& x = p.xfers[i];
          if (x.kind == engine::TransferKind::Send) {
            if (x.waitFor >= 0) {
              waitG_[g] = base_[static_cast<size_t>(r)] + st.first + static_cast<size_t>(x.waitFor);
              dependents_[waitG_[g]].push_back(g);
            }
            auto it = lastSendTo.find(x.peer);
            if (it != lastSendTo.end()) {
              pipePrev_[g] = it->second;
              pipeNext_[it->second] = g;
            }
            lastSendTo[x.peer] = g;
          }
        }
      }
    }
    engineFree_.assign(static_cast<size_t>(n), 0);
    stage_.assign(static_cast<size_t>(n), 0);
    outstanding_.assign(static_cast<size_t>(n), 0);
    finish_.assign(static_cast<size_t>(n), 0);
    nicTx_.assign(static_cast<size_t>(m.hosts), 0);
    nicRx_.assign(static_cast<size_t>(m.hosts), 0);
    slow_ = m.cores > 0 && m.ranksPerHost > m.cores ? static_cast<double>(m.ranksPerHost) / m.cores : 1.0;
    latencyScale_ = slow_;
  }
  /// Engines slow down further when the message does not stay in cache.
  void setCacheFactor(double f) { slow_ /= f; }

  Result run(size_t maxChunks) {
    size_t chunks = 0;
    for (size_t g = 0; g < xs_.size(); ++g) {
      if (xfer(g).kind == engine::TransferKind::Send) chunks += chunkCount(xfer(g).bytes);
    }
    if (chunks > maxChunks) {
      Result res;
      res.why = strCat("too large: the simulation would move ", chunks, " chunks (limit ", maxChunks,
                       "): use a larger chunk size or fewer ranks");
      return res;
    }
    for (int r = 0; r < static_cast<int>(progs_.size()); ++r) startStage(r, 0.0);
    while (!queue_.empty()) {
      const Event e = queue_.top();
      queue_.pop();
      now_ = e.t;
      switch (e.type) {
        case Ev::StageStart:
          beginStage(e.rank);
          break;
        case Ev::SendNic:
          sendNic(e);
          break;
        case Ev::SendChunkDone:
          sendChunkDone(e.x);
          break;
        case Ev::Arrival:
          arrival(e);
          break;
        case Ev::RecvChunkDone:
          recvChunkDone(e.x);
          break;
      }
    }
    Result res;
    res.simulated = true;
    res.transfers = xs_.size();
    res.chunks = chunks;
    for (int r = 0; r < static_cast<int>(progs_.size()); ++r) {
      if (stage_[static_cast<size_t>(r)] < progs_[static_cast<size_t>(r)].stages.size())
        fail(chorusInternalError, strCat("simulation: rank ", r, " never finished stage ",
                                         stage_[static_cast<size_t>(r)], " (unmatched transfers)"));
      res.us = std::max(res.us, finish_[static_cast<size_t>(r)]);
    }
    return res;
  }

 private:
  const Xfer& xfer(size_t g) const {
    const int r = owner_[g];
    return progs_[static_cast<size_t>(r)].xfers[g - base_[static_cast<size_t>(r)]];
  }
  size_t chunkCount(size_t bytes) const {
    return bytes == 0 ? 1 : (bytes + m_.chunkBytes - 1) / m_.chunkBytes;
  }
  size_t chunkSize(size_t bytes, size_t i) const {
    return std::min(m_.chunkBytes, bytes - std::min(bytes, i * m_.chunkBytes));
  }
  int hostOf(int r) const { return r / m_.ranksPerHost; }
  const LinkModel* link(int a, int b) const {
    if (a == b) return nullptr;
    return hostOf(a) == hostOf(b) ? &m_.intra : &m_.inter;
  }
  void push(double t, Ev type, int rank, size_t x, size_t bytes = 0, bool nicPassed = false) {
    queue_.push(Event{t, seq_++, type, nicPassed, rank, x, bytes});
  }
  uint64_t streamKey(int from, int to) const {
    return static_cast<uint64_t>(from) * progs_.size() + static_cast<uint64_t>(to);
  }

  // Stage s of rank r may begin once its local work is done.
  void startStage(int r, double t) {
    const auto& stages = progs_[static_cast<size_t>(r)].stages;
    size_t& s = stage_[static_cast<size_t>(r)];
    if (s >= stages.size()) {
      finish_[static_cast<size_t>(r)] = t;
      return;
    }
    double& eng = engineFree_[static_cast<size_t>(r)];
    const double start = std::max(t, eng) + stages[s].computeBeforeUs * slow_;
    eng = start;
    push(start, Ev::StageStart, r, 0);
  }

  void beginStage(int r) {
    const Stage& st = progs_[static_cast<size_t>(r)].stages[stage_[static_cast<size_t>(r)]];
    outstanding_[static_cast<size_t>(r)] = st.count;
    if (st.count == 0) return stageDone(r);
    const size_t b = base_[static_cast<size_t>(r)] + st.first;
    std::vector<uint64_t> touched;
    for (size_t g = b; g < b + st.count; ++g) {
      const Xfer& x = xfer(g);
      if (x.kind == engine::TransferKind::Send) {
        trySend(g);
      } else {
        const uint64_t k = streamKey(x.peer, r);
        streams_[k].posted.push_back(g);
        touched.push_back(k);
      }
    }
    for (uint64_t k : touched) pump(k);
  }

  void stageDone(int r) {
    ++stage_[static_cast<size_t>(r)];
    startStage(r, now_);
  }

  void transferDone(size_t g) {
    xs_[g].complete = true;
    const int r = owner_[g];
    if (--outstanding_[static_cast<size_t>(r)] == 0) stageDone(r);
  }

  // Sends the next chunk of send g if the pipe order, the engine and its bound receive allow.
  void trySend(size_t g) {
    XState& s = xs_[g];
    const Xfer& x = xfer(g);
    if (s.complete || s.inService) return;
    if (pipePrev_[g] != SIZE_MAX && !xs_[pipePrev_[g]].complete) return;
    const size_t i = s.chunksDone, c = chunkSize(x.bytes, i);
    const int r = owner_[g];
    if (const size_t dep = waitG_[g]; dep != SIZE_MAX) {
      const size_t need = std::min(x.bytes, (i + 1) * m_.chunkBytes);
      if (xs_[dep].bytesDone < need && !xs_[dep].complete) return;
    }
    s.inService = true;
    const LinkModel* l = link(r, x.peer);
    double& eng = engineFree_[static_cast<size_t>(r)];
    const double start = std::max(now_, eng);
    const double engineUs = l ? static_cast<double>(c) / (l->sendGBps * 1e3) * slow_ : 0.0;
    eng = start + engineUs;
    s.engineEnd = eng;
    if (l == &m_.inter && m_.nicGBps > 0) {
      // The host's NIC is booked when the chunk starts through the engine, in the order chunks
      // get there (an event at that time keeps the NIC first come, first served).
      push(start, Ev::SendNic, r, g, c);
    } else {
      push(eng, Ev::SendChunkDone, r, g);
    }
  }

  void sendNic(const Event& e) {
    double& nic = nicTx_[static_cast<size_t>(hostOf(e.rank))];
    nic = std::max(now_, nic) + static_cast<double>(e.bytes) / (m_.nicGBps * 1e3);
    push(std::max(nic, xs_[e.x].engineEnd), Ev::SendChunkDone, e.rank, e.x);
  }

  void sendChunkDone(size_t g) {
    XState& s = xs_[g];
    const Xfer& x = xfer(g);
    const int r = owner_[g];
    s.inService = false;
    const size_t i = s.chunksDone++;
    const LinkModel* l = link(r, x.peer);
    const uint64_t k = streamKey(r, x.peer);
    const double arrive = now_ + (l ? l->alphaUs * latencyScale_ : 0.0);
    push(arrive, Ev::Arrival, x.peer, k, chunkSize(x.bytes, i));
    if (s.chunksDone == chunkCount(x.bytes)) {
      const size_t next = pipeNext_[g];
      transferDone(g);
      if (next != SIZE_MAX) trySend(next);
    } else {
      trySend(g);
    }
  }

  // A chunk reaches its receiver; one between hosts passes the receiving host's NIC first.
  void arrival(const Event& e) {
    const uint64_t key = e.x;
    const int from = static_cast<int>(key / progs_.size()), to = static_cast<int>(key % progs_.size());
    if (!e.nicPassed && hostOf(from) != hostOf(to) && m_.nicGBps > 0) {
      double& nic = nicRx_[static_cast<size_t>(hostOf(to))];
      nic = std::max(now_, nic) + static_cast<double>(e.bytes) / (m_.nicGBps * 1e3);
      push(nic, Ev::Arrival, to, key, e.bytes, true);
      return;
    }
    streams_[key].arrived.push_back(e.bytes);
    pump(key);
  }

  // Receives on stream k take the chunks that have arrived, one chunk in service at a time.
  void pump(uint64_t k) {
    Stream& st = streams_[k];
    if (st.posted.empty() || st.arrived.empty()) return;
    const size_t g = st.posted.front();
    XState& s = xs_[g];
    if (s.inService) return;
    const int r = owner_[g];
    const Xfer& x = xfer(g);
    const size_t c = chunkSize(x.bytes, s.chunksDone);
    if (st.arrived.front() != c) {
      fail(chorusInternalError,
           strCat("simulation: rank ", r, " expects a chunk of ", c, " bytes (message of ", x.bytes,
                  " bytes) from rank ", x.peer, " but it sent ", st.arrived.front()));
    }
    st.arrived.pop_front();
    s.inService = true;
    const LinkModel* l = link(x.peer, r);
    double us = static_cast<double>(c) / ((l ? l->recvGBps : m_.copyGBps) * 1e3);
    if (x.kind == engine::TransferKind::RecvReduce) us += static_cast<double>(c) / (m_.reduceGBps * 1e3);
    double& eng = engineFree_[static_cast<size_t>(r)];
    eng = std::max(now_, eng) + us * slow_;
    push(eng, Ev::RecvChunkDone, r, g);
  }

  void recvChunkDone(size_t g) {
    XState& s = xs_[g];
    const Xfer& x = xfer(g);
    const int r = owner_[g];
    s.inService = false;
    s.bytesDone += chunkSize(x.bytes, s.chunksDone);
    ++s.chunksDone;
    const uint64_t k = streamKey(x.peer, r);
    if (s.chunksDone == chunkCount(x.bytes)) {
      streams_[k].posted.pop_front();
      transferDone(g);
    }
    for (size_t d : dependents_[g]) trySend(d);
    pump(k);
  }

  const Machine& m_;
  std::vector<Program>& progs_;
  std::vector<size_t> base_;
  std::vector<XState> xs_;
  std::vector<int> owner_;
  std::vector<std::vector<size_t>> dependents_;
  std::vector<size_t> pipePrev_, pipeNext_;
  std::vector<double> engineFree_, finish_, nicTx_, nicRx_;
  std::vector<size_t> stage_, outstanding_;
  std::unordered_map<uint64_t, Stream> streams_;
  std::vector<size_t> waitG_;  // sends: the receive (global index) they are bound to
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  double now_ = 0, slow_ = 1, latencyScale_ = 1;
  uint64_t seq_ = 0;
};

}  // namespace

topo::CommTopology Machine::topology() const {
  topo::CommTopology t;
  t.hosts.resize(static_cast<size_t>(hosts));
  for (int h = 0; h < hosts; ++h) {
    t.hosts[static_cast<size_t>(h)].hostname = strCat("sim", h);
    t.hosts[static_cast<size_t>(h)].numaNodes = 1;
  }
  t.ranks.resize(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) {
    t.ranks[static_cast<size_t>(r)].host = r / ranksPerHost;
    t.ranks[static_cast<size_t>(r)].localRank = r % ranksPerHost;
  }
  return t;
}

Result simulate(const algo::Algorithm& a, const Op& op, const Machine& m, size_t maxChunks) {
  if (m.hosts < 1 || m.ranksPerHost < 1)
    failInvalid("simulate: ", m.hosts, " hosts x ", m.ranksPerHost, " ranks");
  if (m.chunkBytes < 64) failInvalid("simulate: chunk size ", m.chunkBytes, " is below 64 bytes");
  Result res;
  if (a.needsSharedMemory) {
    res.why = "needs the shared-memory area of one host";
    return res;
  }
  const int n = m.size();
  const topo::CommTopology topo = m.topology();
  std::vector<Program> programs(static_cast<size_t>(n));
  Op o = op;
  o.send = fakeBuffer(0);
  o.recv = fakeBuffer(1);
  // Each recorded message costs about 100 bytes of simulator state: keep all ranks' schedules
  // within a few GB.
  const size_t maxTransfers = (size_t{40} << 20) / static_cast<size_t>(n) + 64;
  try {
    for (int r = 0; r < n; ++r) {
      RecordingContext ctx(r, n, topo, m, programs[static_cast<size_t>(r)], maxTransfers);
      a.run(ctx, o);
      ctx.finish();
    }
  } catch (const NotSimulated& e) {
    res.why = e.why;
    return res;
  }
  Simulation sim(m, programs);
  if (m.cacheBytes > 0 && op.messageBytes() > m.cacheBytes && m.outOfCacheFactor > 0)
    sim.setCacheFactor(m.outOfCacheFactor);
  return sim.run(maxChunks);
}

double busBandwidth(OpKind kind, size_t bytes, int n, double us) {
  if (us <= 0) return 0;
  const double algbw = static_cast<double>(bytes) / (us * 1e3);  // GB/s
  const double fn = n;
  switch (kind) {
    case OpKind::AllReduce:
      return algbw * 2 * (fn - 1) / fn;
    case OpKind::ReduceScatter:
    case OpKind::AllGather:
    case OpKind::AllToAll:
      return algbw * (fn - 1) / fn;
    default:
      return algbw;
  }
}

}  // namespace chorus::sim

namespace chorus::sim {

// Presets. "shm" is this project's development VM (2 cores, ranks as threads over the shared-memory
// pipes), calibrated with bench/sim/validate; the GPU and NIC presets take vendor link rates
// (NVLink 4: 18 links x 25 GB/s per direction per H100; PCIe 4.0 x16: about 24 GB/s; a 400 Gb/s
// NIC about 48 GB/s of payload) and leave the receiving side to the sender's copy (GPU kernels
// write into the peer's buffer and reduce at memory speed).
bool intraPreset(const std::string& name, Machine& m) {
  if (name == "shm") {
    m.intra = {"shm", 0.6, 16.0, 16.0};
    m.reduceGBps = 16.0;
    m.copyGBps = 16.0;
    m.cacheBytes = size_t{2} << 20;  // L2 per core
    m.outOfCacheFactor = 0.75;
    m.chunkBytes = size_t{64} << 10;
    m.cores = 2;
  } else if (name == "nvlink") {
    m.intra = {"nvlink", 3.0, 450.0, 3000.0};
    m.reduceGBps = 3000.0;
    m.copyGBps = 3000.0;
    m.chunkBytes = size_t{512} << 10;
    m.cores = 0;
  } else if (name == "pcie") {
    m.intra = {"pcie", 5.0, 24.0, 3000.0};
    m.reduceGBps = 3000.0;
    m.copyGBps = 3000.0;
    m.chunkBytes = size_t{512} << 10;
    m.cores = 0;
  } else {
    return false;
  }
  return true;
}

bool interPreset(const std::string& name, Machine& m) {
  if (name == "ib400") {  // one 400 Gb/s NIC per rank (8 per host of 8 GPUs)
    m.inter = {"ib400", 6.0, 48.0, 3000.0};
    m.nicGBps = 48.0 * std::max(m.ranksPerHost, 1);
  } else if (name == "ib100") {  // one 100 Gb/s NIC per host
    m.inter = {"ib100", 6.0, 12.0, 3000.0};
    m.nicGBps = 12.0;
  } else if (name == "tcp10") {  // 10 GbE, kernel TCP
    m.inter = {"tcp10", 25.0, 1.1, 2.0};
    m.nicGBps = 1.1;
  } else if (name == "emulated") {  // CHORUS_VIRTUAL_HOSTS: the hosts share the intra links
    m.inter = m.intra;
    m.inter.name = "emulated";
    m.nicGBps = 0;
  } else {
    return false;
  }
  return true;
}

std::string presetNames() { return "intra: shm, nvlink, pcie; inter: ib400, ib100, tcp10, emulated"; }

}  // namespace chorus::sim
