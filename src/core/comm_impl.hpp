// The communicator behind both APIs.
//
// Execution model: every operation gets a ticket when submitted and operations run strictly in
// ticket order. Blocking calls run on the caller's thread when their turn comes (no hand-off
// latency); asynchronous calls run on one worker thread per communicator, started on first use
// (core/op_queue.hpp). Any failure inside an operation breaks the communicator (the peers' protocol state is
// unknown): later calls fail fast with the original cause, and the peers are told through shared memory.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "base/config.hpp"
#include "base/op.hpp"
#include "bootstrap/host_identity.hpp"
#include "chorus/chorus.hpp"
#include "core/flight_recorder.hpp"
#include "core/op_queue.hpp"
#include "core/work_state.hpp"
#include "engine/shm_sync.hpp"
#include "engine/transfer.hpp"
#include "engine/waiter.hpp"
#include "tuning/tuning.hpp"

namespace chorus {

namespace topo {
struct CommTopology;
}
namespace device {
class State;
}
namespace transport {
class PeerSet;
}  // namespace transport

class CommImpl final : public algo::Context, public engine::PipeSet, public engine::Health {
 public:
  /// Collective over all ranks. `keepAlive` holds what must live as long as the communicator
  /// (e.g. the store server this rank hosts).
  static std::shared_ptr<CommImpl> create(std::shared_ptr<Store> store, int rank, int size,
                                          const Config& config, std::shared_ptr<void> keepAlive = {});
  /// `size` ranks as threads of this process (rendezvous through an in-process store).
  static std::vector<std::shared_ptr<CommImpl>> createLocal(int size, const Config& config);
  ~CommImpl() override;
  CommImpl(const CommImpl&) = delete;
  CommImpl& operator=(const CommImpl&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  /// Throws chorusInvalidArgument when `op` is malformed for this communicator.
  void validate(const Op& op) const;
  /// Runs `ops` as one group (collectives in order, then all point-to-point transfers together).
  /// Blocking when !async: returns completed state. Never throws: errors are in the state.
  std::shared_ptr<WorkState> submit(std::vector<Op> ops, bool async);
  /// Hooks around a task's operations, run on the thread that runs them: `before` (a failure it
  /// throws fails the task), then the operations, then `after` with the outcome (always, even when
  /// `before` failed; it must not throw). E.g. device buffers staged through host memory: wait for
  /// the copy from the device, run, release the copy back.
  struct Hooks {
    std::function<void()> before;
    std::function<void(chorusResult_t)> after;
  };
  std::shared_ptr<WorkState> submit(std::vector<Op> ops, bool async, Hooks hooks);
  /// One blocking operation without a WorkState (the form of submit() a blocking call uses): waits for its
  /// turn, runs the operation on this thread and throws chorus::Error if it failed.
  void runInTurn(const Op& op);

  std::shared_ptr<CommImpl> split(int color, int key);
  /// The ranks not in `exclude`, rendezvous through the store only (works when broken).
  std::shared_ptr<CommImpl> shrink(std::span<const int> exclude);

  /// Fails the operation in flight and all later ones; tells the peers. Thread-safe.
  void abort();
  chorusResult_t asyncError() const { return static_cast<chorusResult_t>(failCode_.load()); }
  std::string lastError() const;
  void setLastError(const std::string& message);
  /// Throws when the communicator is broken or aborted.
  void checkUsable() const;
  size_t memoryBytes() const;
  /// State of the device-buffer calls (core/device.hpp), made on their first use; guard with
  /// deviceMutex(). Destroyed with the communicator.
  std::shared_ptr<device::State>& deviceState() { return deviceState_; }
  std::mutex& deviceMutex() { return deviceMu_; }
  /// Run when the communicator breaks or is aborted, e.g. to stop device kernels that wait for
  /// peers. Thread-safe.
  void setAbortHook(std::function<void()> hook);
  const Config& config() const { return config_; }
  /// Hosts, rank placement and link classes, found at creation (src/topology).
  const topo::CommTopology& topology() const override { return *topology_; }
  /// The cost model of the pipe algorithms for this communicator's links.
  const algo::CostModel* costModel() const override { return model_.get(); }
  /// Timeout given to calls issued from now on (0: config().timeout). Thread-safe.
  void setCallTimeout(std::chrono::milliseconds timeout) { callTimeoutMs_.store(timeout.count()); }
  std::chrono::milliseconds callTimeout() const { return std::chrono::milliseconds(callTimeoutMs_.load()); }

  // algo::Context
  /// nullptr with emulated hosts: the shared-memory algorithms see several hosts, as on real ones.
  engine::ShmSync* sharedMemory() override { return emulatedHosts_ ? nullptr : shmSync_.get(); }
  std::byte* scratch(size_t bytes, int slot = 0) override;
  void run(std::span<engine::Transfer> transfers) override;
  uint16_t tag() const override { return tag_; }

  // engine::PipeSet
  transport::SendPipe& sendPipe(int peer) override;
  transport::RecvPipe& recvPipe(int peer) override;

  // engine::Health
  bool abortRequested() const override { return abortRequested_.load(std::memory_order_relaxed); }
  void checkHealth(engine::FunctionRef<bool(int)> waitingOn) override;
  void waitIdle(std::chrono::microseconds duration) override;

 private:
  CommImpl(int rank, int size, const Config& config);
  void init(std::shared_ptr<Store> store, std::shared_ptr<void> keepAlive);
  /// A peer (on this host or another) that published a failure: its rank, or -1.
  int findPeerFailure(chorusResult_t* code, std::string* text);

  struct Task {
    std::vector<Op> ops;
    std::shared_ptr<WorkState> work;
    Hooks hooks;
  };
  void runTask(Task& task);
  /// Runs ops (their turn has come); a failure marks the communicator broken and is returned.
  std::pair<chorusResult_t, std::string> runOps(std::span<const Op> ops);
  /// Ends the current operation with an error: flight recorder, progress report on a timeout,
  /// broken state published to the peers. Returns what the caller reports.
  std::pair<chorusResult_t, std::string> failOperation(chorusResult_t code, std::string message);
  void executeGroup(std::span<const Op> ops);
  void executeCollective(const Op& op);
  void executeLocally(const Op& op);
  void markFailed(chorusResult_t code, const std::string& message);
  engine::Waiter makeWaiter();

  const int rank_;
  const int size_;
  Config config_;
  std::atomic<int64_t> callTimeoutMs_{0};
  tuning::Selector selector_;  // the user's rules (Config::algo) and the decisions made
  std::shared_ptr<Store> store_;
  std::shared_ptr<void> keepAlive_;
  std::unique_ptr<transport::PeerSet> peers_;  // every connection (transports/factory.hpp)
  // The shared-memory protocol over peers_'s group of every rank, where all share a host.
  std::unique_ptr<engine::ShmSync> shmSync_;
  std::vector<HostIdentity> hosts_;
  std::shared_ptr<const topo::CommTopology> topology_;
  std::shared_ptr<const algo::CostModel> model_;  // from the topology's link classes
  int virtualHosts_ = 0;                          // CHORUS_VIRTUAL_HOSTS, as rank 0 read it
  bool emulatedHosts_ = false;                    // ranks of this host split into emulated hosts
  std::vector<int> peerPidfds_;                   // -1 where not watched
  engine::WaitPolicy waitPolicy_ = engine::WaitPolicy::Adaptive;  // engine::waitPolicyFor

  // Per-operation state, touched only by the thread running the current ticket.
  uint64_t collSeq_ = 0;
  uint64_t splitSeq_ = 0;
  uint64_t shrinkSeq_ = 0;
  uint16_t tag_ = 0;
  transport::CallFingerprint call_;      // the collective being run
  uint64_t callHash_ = 0;                // its hash (tag_ is 16 bits of it)
  engine::Clock::time_point opStart_{};  // when the running group of operations began
  engine::Clock::time_point opDeadline_{};
  std::chrono::milliseconds opTimeout_{0};  // what opDeadline_ is after opStart_
  // What is running now, for error messages (text built only when needed).
  const Op* curOp_ = nullptr;
  bool zeroCopy_ = true;  // rank 0's CHORUS_ZERO_COPY
  std::string commId_;    // random id made by rank 0 (names shm segments, flight recorder files)
  FlightRecorder flight_{envConfig().flightRecorderEntries, !envConfig().flightRecorderPath.empty()};
  const char* curAlgo_ = nullptr;
  size_t groupTransfers_ = 0;
  std::string runningWhat() const;
  /// "allreduce #3 (1000 x float32, ring)": call `op`, number `seq` (algorithm may be NULL).
  static std::string callWhat(const Op& op, uint64_t seq, const char* algorithm);
  struct Scratch {
    std::byte* ptr = nullptr;
    size_t bytes = 0;
  } scratch_[2];

  // Failure state.
  std::atomic<bool> abortRequested_{false};
  std::atomic<int> failCode_{chorusSuccess};
  mutable std::mutex errMu_;
  std::string failMessage_;
  std::string lastError_;
  std::atomic<size_t> scratchBytes_{0};

  std::mutex deviceMu_;
  std::shared_ptr<device::State> deviceState_;
  std::mutex hookMu_;
  std::function<void()> abortHook_;

  // Ordering and the async worker; declared last, so that its worker stops before the rest goes.
  OpQueue opQueue_;
};

}  // namespace chorus
