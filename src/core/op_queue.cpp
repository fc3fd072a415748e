#include "core/op_queue.hpp"

namespace chorus {

OpQueue::Turn::Turn(OpQueue& q) : q_(q) {
  std::unique_lock lk(q_.mu_);
  const uint64_t ticket = q_.nextTicket_++;
  if (q_.serving_ != ticket) q_.cv_.wait(lk, [&] { return q_.serving_ == ticket; });
}

OpQueue::Turn::~Turn() {
  {
    std::lock_guard lk(q_.mu_);
    ++q_.serving_;
  }
  q_.cv_.notify_all();
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
  queue_.push_back(Posted{nextTicket_++, std::move(job)});
  cv_.notify_all();
}

void OpQueue::workerLoop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || (!queue_.empty() && serving_ == queue_.front().ticket); });
    if (queue_.empty()) return;  // stopping, nothing left
    Posted p = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    p.job();
    lk.lock();
    ++serving_;
    cv_.notify_all();
  }
}

}  // namespace chorus
