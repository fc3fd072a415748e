// Device-buffer calls (a stream given) where they cannot run: no CUDA device on this machine, or a
// build without CUDA. Every rank gets a clear error naming the cause, nothing hangs or crashes, and
// the communicator still works for host buffers. (tests/gpu covers the machines with a GPU.)
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "core/device.hpp"

namespace {

TEST(DeviceCalls, WithoutAUsableGpuEveryRankGetsTheCause) {
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v == nullptr || std::string(v) != "") {
    // Hide any GPU this machine has, so that the test means the same everywhere.
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
  }
  constexpr int kRanks = 2;
  std::vector<chorusComm_t> comms(kRanks);
  ASSERT_EQ(chorusCommInitAll(comms.data(), kRanks, nullptr), chorusSuccess) << chorusGetLastError(nullptr);
  std::vector<std::string> errors(kRanks);
  std::vector<chorusResult_t> codes(kRanks);
  std::vector<float> after(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> buf(64, 1.0f);
      void* fakeStream = reinterpret_cast<void*>(uintptr_t{0x1000});  // never used: no device to use it on
      codes[r] =
          chorusAllReduce(buf.data(), buf.data(), buf.size(), chorusFloat32, chorusSum, comms[r], fakeStream);
      errors[r] = chorusGetLastError(comms[r]);
      // The communicator still runs host calls.
      if (chorusAllReduce(buf.data(), buf.data(), buf.size(), chorusFloat32, chorusSum, comms[r], nullptr) ==
          chorusSuccess)
        after[r] = buf[0];
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(codes[r] == chorusInvalidUsage || codes[r] == chorusInvalidArgument) << codes[r];
    if (chorus::device::built()) {
      EXPECT_NE(errors[r].find("need a CUDA device on every rank"), std::string::npos) << errors[r];
    } else {
      EXPECT_NE(errors[r].find("no CUDA support"), std::string::npos) << errors[r];
    }
    EXPECT_EQ(after[r], 2.0f);
  }
  for (auto c : comms) chorusCommDestroy(c);
}

}  // namespace
