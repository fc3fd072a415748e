#include "core/op_queue.hpp"

namespace chorus {

OpQueue::Turn::Turn(OpQueue& q) : q_(q) {
  const uint64_t ticket = q_.nextTicket_.fetch_add(1);
  if (q_.serving_.load() == ticket) return;
  std::unique_lock lk(q_.mu_);
  ++q_.sleepers_;
  q_.cv_.wait(lk, [&] { return q_.serving_.load() == ticket; });
  --q_.sleepers_;
}

OpQueue::Turn::~Turn() {
  q_.serving_.fetch_add(1);
  q_.wakeSleepers();
}

void OpQueue::wakeSleepers() {
  if (sleepers_.load() == 0) return;
  // Taking the lock orders this wake-up after a sleeper's last look at serving_ (it holds mu_ from
  // that look until it sleeps), so the wake-up cannot fall between the two.
  { std::lock_guard lk(mu_); }
  cv_.notify_all();
}

OpQueue::~OpQueue() { stop(); }

void OpQueue::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void OpQueue::post(std::function<void()> job) {
  std::lock_guard lk(mu_);
  if (!worker_.joinable()) worker_ = std::thread([this] { workerLoop(); });
  queue_.push_back(Posted{nextTicket_.fetch_add(1), std::move(job)});
  cv_.notify_all();
}

void OpQueue::workerLoop() {
  std::unique_lock lk(mu_);
  for (;;) {
    ++sleepers_;
    cv_.wait(lk, [&] { return stop_ || (!queue_.empty() && serving_.load() == queue_.front().ticket); });
    --sleepers_;
    if (queue_.empty()) return;  // stopping, nothing left
    Posted p = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    p.job();
    serving_.fetch_add(1);
    wakeSleepers();
    lk.lock();
  }
}

}  // namespace chorus
