// Smallest useful Chorus program: 4 ranks as threads, one allreduce, checked.
#include <chorus/chorus.hpp>
#include <cstdio>
#include <thread>
#include <vector>

int main() {
  const int n = 4;
  auto comms = chorus::Communicator::createLocal(n);
  std::vector<int> ok(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> data(1000, static_cast<float>(r + 1));
      comms[r].allReduce(std::span<float>(data), chorus::ReduceOp::Sum);
      ok[r] = data[0] == 10.0f && data[999] == 10.0f;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!ok[r]) {
      std::printf("rank %d: wrong result\n", r);
      return 1;
    }
  }
  std::printf("consumer: allreduce over %d ranks ok\n", n);
  return 0;
}
