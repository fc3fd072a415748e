// Communicator creation, splitting and teardown.
#include <sched.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <thread>

#include "algorithms/cost_model.hpp"
#include "base/config.hpp"
#include "base/error.hpp"
#include "base/log.hpp"
#include "base/rank_wait.hpp"
#include "bootstrap/watched_store.hpp"
#include "core/comm_impl.hpp"
#include "topology/comm_topology.hpp"
#include "topology/stage_probe.hpp"
#include "transports/factory.hpp"
#include "transports/shm/shm_group.hpp"

namespace chorus {

namespace {

std::string randomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      failSystem("getrandom");
    }
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (char c : raw) {
    out += hex[(static_cast<unsigned char>(c) >> 4) & 0xF];
    out += hex[static_cast<unsigned char>(c) & 0xF];
  }
  return out;
}

// The pids of `ranks` (all ranks if null), in that order, where this process can watch them (same
// pid namespace, another process), else 0.
std::vector<int> watchablePids(const std::vector<HostIdentity>& hosts, const HostIdentity& me,
                               const std::vector<int>* ranks) {
  std::vector<int> pids;
  const size_t n = ranks ? ranks->size() : hosts.size();
  for (size_t i = 0; i < n; ++i) {
    const HostIdentity& h = hosts[ranks ? static_cast<size_t>((*ranks)[i]) : i];
    pids.push_back(h.pid != me.pid && h.samePidNamespace(me) ? h.pid : 0);
  }
  return pids;
}

int openPidfd(int pid) {
#ifdef SYS_pidfd_open
  long fd = syscall(SYS_pidfd_open, pid, 0);
  return fd < 0 ? -1 : static_cast<int>(fd);
#else
  (void)pid;
  return -1;
#endif
}

}  // namespace

CommImpl::CommImpl(int rank, int size, const Config& config) : rank_(rank), size_(size), config_(config) {}

std::shared_ptr<CommImpl> CommImpl::create(std::shared_ptr<Store> store, int rank, int size,
                                           const Config& config, std::shared_ptr<void> keepAlive) {
  if (size < 1) failInvalid("communicator size ", size, " must be at least 1");
  if (rank < 0 || rank >= size) failInvalid("rank ", rank, " is out of range [0, ", size, ")");
  if (!store) failInvalid("rank ", rank, ": no store given for rendezvous");
  // Several communicators may rendezvous on one store: each rank counts the communicators it has
  // created there, and the n-th of every rank meet under the same prefix. Known first, so that a
  // failure of any later step (settings included) reaches the peers waiting there.
  int64_t generation = store->add(strCat("chorus/rank", rank, "/comms"), 1);
  std::shared_ptr<Store> shared = makePrefixStore(strCat("chorus/comm", generation, "/"), store);
  try {
    Config resolved = resolveConfig(config);
    // Rank 0's staging size holds for all (init adopts it), so only rank 0 may need to measure it.
    if (resolved.shmStageBytes == 0 && rank == 0) resolved.shmStageBytes = topo::localStageChoice().bytes;
    std::shared_ptr<CommImpl> comm(new CommImpl(rank, size, resolved));
    comm->selector_ = tuning::Selector(tuning::parseRules(resolved.algo), rank, size);
    comm->init(makeWatchedStore(shared, rank), std::move(keepAlive));
    return comm;
  } catch (const Error& e) {
    if (!isPeerFailureReport(e)) publishFailure(*shared, rank, e.what());
    throw;
  }
}

void CommImpl::init(std::shared_ptr<Store> store, std::shared_ptr<void> keepAlive) {
  keepAlive_ = std::move(keepAlive);
  const auto timeout = config_.timeout;
  store_ = std::move(store);

  HostIdentity me = HostIdentity::local();
  store_->setString(strCat("host/", rank_), me.serialize());
  std::string id;
  if (rank_ == 0) {
    id = randomHex(12);
    store_->setString(
        "params", strCat(id, " ", config_.shmStageBytes, " ", config_.shmFifoBytes, " ", size_, " ",
                         config_.checkCalls ? 1 : 0, " ", config_.zeroCopy, " ", config_.virtualHosts, " ",
                         config_.transport.empty() ? "-" : config_.transport));
  }
  waitForRanks(*store_, "host/", size_, rank_, timeout, "communicator init");
  std::string params = store_->getString("params", timeout);
  {
    // Every rank adopts rank 0's shared-memory sizes (the segment layout must agree) and its
    // transport setting (every pair must make the same choice; "-" stands for "").
    char idBuf[64] = {0}, transportBuf[16] = {0};
    unsigned long long stage = 0, fifo = 0;
    int n = 0, check = 0, zeroCopy = 0, virtualHosts = 0;
    if (std::sscanf(params.c_str(), "%63s %llu %llu %d %d %d %d %15s", idBuf, &stage, &fifo, &n, &check,
                    &zeroCopy, &virtualHosts, transportBuf) != 8) {
      fail(chorusRemoteError, strCat("rank ", rank_, ": malformed communicator parameters from rank 0"));
    }
    if (n != size_) {
      failInvalid("rank ", rank_, " joined a communicator of ", size_, " ranks but rank 0 created one of ",
                  n);
    }
    id = idBuf;
    config_.shmStageBytes = stage;
    config_.shmFifoBytes = fifo;
    config_.checkCalls = check != 0;
    config_.zeroCopy = zeroCopy;
    config_.virtualHosts = virtualHosts;
    config_.transport = std::string(transportBuf) == "-" ? "" : transportBuf;
    zeroCopy_ = zeroCopy != 0;
    virtualHosts_ = virtualHosts;
  }
  hosts_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    std::string text = r == rank_ ? me.serialize() : store_->getString(strCat("host/", r), timeout);
    auto h = HostIdentity::parse(text);
    if (!h) fail(chorusRemoteError, strCat("rank ", rank_, ": malformed host identity from rank ", r));
    hosts_[static_cast<size_t>(r)] = *h;
  }
  {
    // Hosts in order of their first rank; then what each host is made of and where each rank runs.
    std::vector<int> hostOf(static_cast<size_t>(size_), -1);
    int hostCount = 0;
    for (int r = 0; r < size_; ++r) {
      for (int q = 0; q < r && hostOf[static_cast<size_t>(r)] < 0; ++q) {
        if (hosts_[static_cast<size_t>(q)].sameHost(hosts_[static_cast<size_t>(r)])) {
          hostOf[static_cast<size_t>(r)] = hostOf[static_cast<size_t>(q)];
        }
      }
      if (hostOf[static_cast<size_t>(r)] < 0) hostOf[static_cast<size_t>(r)] = hostCount++;
    }
    if (virtualHosts_ > 1 && hostCount == 1) {
      // CHORUS_VIRTUAL_HOSTS: contiguous blocks of ranks play separate hosts.
      const int h = std::min(virtualHosts_, size_);
      for (int r = 0; r < size_; ++r)
        hostOf[static_cast<size_t>(r)] = static_cast<int>(int64_t{r} * h / size_);
      hostCount = h;
      emulatedHosts_ = h > 1;
    }
    try {
      topology_ = std::make_shared<const topo::CommTopology>(
          topo::CommTopology::exchange(*store_, rank_, hostOf, timeout));
    } catch (const Error& e) {
      fail(e.code(), strCat("rank ", rank_, ": topology discovery: ", e.what()));
    }
    if (rank_ == 0) logInfo(Subsys::Topo, "topology: ", topology_->describe());
    model_ =
        std::make_shared<const algo::CostModel>(algo::CostModel::forTopology(*topology_, emulatedHosts_));
    if (rank_ == 0) logInfo(Subsys::Tuning, "cost model: ", model_->describe());
  }
  commId_ = id;
  // More ranks on this host than cores we may run on: waiting ranks yield at once instead of
  // spinning, and ordinary buffers are staged (single copy makes every rank wait for all).
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  int localRanks = 0;
  for (const HostIdentity& h : hosts_) localRanks += h.sameHost(me) ? 1 : 0;
  {
    transport::ConnectOptions options;
    options.commId = id;
    options.remote.resize(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r)
      options.remote[static_cast<size_t>(r)] = !hosts_[static_cast<size_t>(r)].sameHost(me);
    options.peerPids = watchablePids(hosts_, me, nullptr);
    options.fifoBytes = config_.shmFifoBytes;
    options.stageBytes = config_.shmStageBytes;
    // Which staged calls are packed through all four staging slots follows the ranks per core
    // (algo::stagingPacks: measured with 2, 4 and 8 ranks on 2 cores). Rank 0's verdict holds for
    // all.
    options.ranksPerCore = (localRanks + cores - 1) / std::max(cores, 1);
    options.timeout = timeout;
    options.net = config_.net;
    options.tcpOnly = config_.transport == "tcp";
    options.noPeerReads =
        !envConfig().cma ? std::string("CHORUS_CMA=0")
        : localRanks > cores && !envConfig().cmaAlways  // CHORUS_CMA=1 or a size forces it
            ? strCat(localRanks, " ranks share its ", cores, " cores (measured: staging is faster then)")
            : std::string();
    // From there on the receiver copies payloads straight from the sender's buffer (transfer.cpp).
    options.inPlaceMinBytes = envConfig().inPlaceSendMinBytes(config_.shmFifoBytes);
    options.peerReadsRegardless = envConfig().cmaAlways;
    options.throwIfPeerFailed = [this] { throwIfPeerFailed(*store_); };
    peers_ = transport::connectPeers(store_, rank_, size_, options);
    if (transport::ShmGroup* group = peers_->shm()) {
      shmSync_ = std::make_unique<engine::ShmSync>(
          *group, [this] { return makeWaiter(); }, [this] { return runningWhat(); }, zeroCopy_);
    }
  }
  waitPolicy_ = engine::waitPolicyFor(envConfig().waitPolicy, localRanks, cores);
  if (rank_ == 0) {
    logInfo(Subsys::Init, "waiting: ", engine::waitPolicyName(waitPolicy_), " (", localRanks,
            " ranks of this host on ", cores, " cores)");
  }
  peerPidfds_.assign(static_cast<size_t>(size_), -1);
  for (int r = 0; r < size_; ++r) {
    const HostIdentity& h = hosts_[static_cast<size_t>(r)];
    if (r != rank_ && h.pid != me.pid && h.samePidNamespace(me))
      peerPidfds_[static_cast<size_t>(r)] = openPidfd(h.pid);
  }
  logInfo(Subsys::Init, "rank ", rank_, " of ", size_, ": communicator ", id, " ready (timeout ",
          timeout.count(), " ms)");
}

std::vector<std::shared_ptr<CommImpl>> CommImpl::createLocal(int size, const Config& config) {
  if (size < 1) failInvalid("createLocal: size ", size, " must be at least 1");
  auto store = makeInProcessStore();
  const auto n = static_cast<size_t>(size);
  std::vector<std::shared_ptr<CommImpl>> impls(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        impls[r] = create(store, static_cast<int>(r), size, config);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return impls;
}

CommImpl::~CommImpl() {
  opQueue_.stop();  // the worker finishes what is queued before anything it uses goes
  for (int fd : peerPidfds_) {
    if (fd >= 0) close(fd);
  }
  for (auto& s : scratch_) std::free(s.ptr);
}

std::shared_ptr<CommImpl> CommImpl::shrink(std::span<const int> exclude) {
  std::vector<bool> excluded(static_cast<size_t>(size_), false);
  for (int r : exclude) {
    if (r < 0 || r >= size_)
      failInvalid("shrink on rank ", rank_, ": rank ", r, " to exclude is not in [0, ", size_, ")");
    if (excluded[static_cast<size_t>(r)])
      failInvalid("shrink on rank ", rank_, ": rank ", r, " is excluded twice");
    excluded[static_cast<size_t>(r)] = true;
  }
  if (excluded[static_cast<size_t>(rank_)]) {
    failInvalid("shrink on rank ", rank_, ": this rank is in the list of ranks to exclude");
  }
  int newRank = 0, newSize = 0;
  std::string list;
  for (int r = 0; r < size_; ++r) {
    if (excluded[static_cast<size_t>(r)]) {
      list += strCat(list.empty() ? "" : ",", r);
      continue;
    }
    if (r == rank_) newRank = newSize;
    ++newSize;
  }
  // The n-th shrink of every survivor meets under one prefix; the excluded list is part of it, so
  // survivors that disagree on it never join one communicator (they time out naming the others).
  const uint64_t seq = shrinkSeq_++;
  logInfo(Subsys::Init, "rank ", rank_, ": shrinking a communicator of ", size_, " ranks without rank(s) ",
          list, ": new rank ", newRank, " of ", newSize);
  auto childStore = makePrefixStore(strCat("shrink", seq, "/without", list, "/"), store_);
  return create(childStore, newRank, newSize, config_, keepAlive_);
}

std::shared_ptr<CommImpl> CommImpl::split(int color, int key) {
  if (color < CHORUS_SPLIT_NOCOLOR)
    failInvalid("split on rank ", rank_, ": color ", color, " must be >= 0 or CHORUS_SPLIT_NOCOLOR");
  std::vector<int64_t> all(static_cast<size_t>(size_) * 2);
  int64_t mine[2] = {color, key};
  Op gather;
  gather.kind = OpKind::AllGather;
  gather.send = mine;
  gather.recv = all.data();
  gather.count = 2;
  gather.type = DataType::Int64;
  auto work = submit({gather}, false);
  work->rethrow();
  const uint64_t seq = splitSeq_++;
  if (color == CHORUS_SPLIT_NOCOLOR) return nullptr;
  std::vector<std::pair<int64_t, int>> members;  // (key, parent rank)
  for (int r = 0; r < size_; ++r) {
    if (all[static_cast<size_t>(r) * 2] == color)
      members.emplace_back(all[static_cast<size_t>(r) * 2 + 1], r);
  }
  std::sort(members.begin(), members.end());
  int newRank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == rank_) newRank = static_cast<int>(i);
  }
  auto childStore = makePrefixStore(strCat("split", seq, "/color", color, "/"), store_);
  return create(childStore, newRank, static_cast<int>(members.size()), config_, keepAlive_);
}

}  // namespace chorus
