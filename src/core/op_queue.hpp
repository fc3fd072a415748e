// The order in which a communicator runs its operations: each gets a ticket when submitted, and
// tickets run strictly in order. Blocking calls run on the caller's thread when their turn comes
// (no hand-off latency); asynchronous ones run on one worker thread, started on first use.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace chorus {

class OpQueue {
 public:
  OpQueue() = default;
  /// Runs what is queued, then stops the worker (stop()).
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  /// Runs `job` on this thread once everything submitted before it has run.
  template <typename Job>
  void runInTurn(Job&& job) {
    Turn turn(*this);
    job();
  }
  /// Queues `job` for the worker after everything submitted before it; returns at once.
  void post(std::function<void()> job);
  /// Lets the worker finish what is queued and joins it; nothing may be submitted after.
  void stop();

 private:
  // Takes a ticket and waits for it to be served; served (the next ticket may run) when destroyed.
  class Turn {
   public:
    explicit Turn(OpQueue& q);
    ~Turn();
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    OpQueue& q_;
  };
  struct Posted {
    uint64_t ticket;
    std::function<void()> job;
  };
  void workerLoop();

  // Wakes every thread waiting on cv_, if any (sleepers_ counts them): a blocking call whose turn
  // came at once neither waited nor wakes anyone, and takes no lock (Turn).
  void wakeSleepers();

  std::mutex mu_;
  std::condition_variable cv_;
  // Tickets are taken and served without the lock; a thread that must wait sleeps on cv_ under mu_
  // after counting itself in sleepers_. Seq_cst on both sides: a thread serving the next ticket
  // either sees the sleeper or the sleeper sees the new ticket before it sleeps.
  std::atomic<uint64_t> nextTicket_{0};
  std::atomic<uint64_t> serving_{0};
  std::atomic<int> sleepers_{0};
  std::deque<Posted> queue_;
  std::thread worker_;
  bool stop_ = false;
};

}  // namespace chorus
