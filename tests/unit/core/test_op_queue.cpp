// src/core/op_queue: blocking calls and posted jobs run strictly in ticket order, whether a
// blocking call's turn comes at once (no lock taken) or it must sleep until earlier work is done.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/op_queue.hpp"

namespace chorus {
namespace {

using namespace std::chrono_literals;

// A blocking call issued while a posted job runs waits for it, then runs before later posts.
TEST(OpQueue, BlockingCallWaitsForEarlierPostsAndPrecedesLaterOnes) {
  OpQueue q;
  std::vector<int> order;
  std::atomic<bool> started{false};
  std::atomic<bool> release{false};
  q.post([&] {
    started = true;
    while (!release) std::this_thread::sleep_for(1ms);
    order.push_back(1);
  });
  while (!started) std::this_thread::sleep_for(1ms);
  std::thread blocker([&] { q.runInTurn([&] { order.push_back(2); }); });
  std::this_thread::sleep_for(20ms);  // the blocking call is asleep behind job 1 by now
  release = true;
  blocker.join();
  q.post([&] { order.push_back(3); });
  q.stop();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

// Many threads mixing blocking calls and posts: every piece of work runs alone (never two at once)
// and all of it runs; each thread's own work runs in the order it issued it.
TEST(OpQueue, ThreadsMixingBlockingAndPostedWorkRunOneAtATime) {
  OpQueue q;
  constexpr int kThreads = 4, kEach = 2000;
  std::atomic<int> running{0};
  std::atomic<int> overlaps{0};
  std::vector<std::vector<int>> seen(kThreads);
  std::vector<int> done(kThreads, 0);  // written only inside the queue's work
  auto work = [&](int t, int i) {
    if (running.fetch_add(1) != 0) ++overlaps;
    seen[static_cast<size_t>(t)].push_back(i);
    ++done[static_cast<size_t>(t)];
    running.fetch_sub(1);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        if (i % 3 == 0)
          q.post([&work, t, i] { work(t, i); });
        else
          q.runInTurn([&] { work(t, i); });
      }
    });
  }
  for (auto& th : threads) th.join();
  q.stop();
  EXPECT_EQ(overlaps.load(), 0);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(done[static_cast<size_t>(t)], kEach) << "thread " << t;
    for (int i = 0; i < kEach; ++i) ASSERT_EQ(seen[static_cast<size_t>(t)][static_cast<size_t>(i)], i);
  }
}

}  // namespace
}  // namespace chorus
