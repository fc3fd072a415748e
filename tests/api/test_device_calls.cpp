// Device-buffer calls (a stream given) where they cannot run: no CUDA device on this machine, or a
// build without CUDA. Every rank gets a clear error naming the cause at once (without waiting for
// its peers), nothing hangs or crashes, and the communicator still works for host buffers.
// (tests/gpu covers the machines with a GPU.) Also the order of the group hooks device calls use.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "chorus/chorus.hpp"
#include "core/device.hpp"
#include "core/group.hpp"

namespace {

TEST(DeviceCalls, WithoutAUsableGpuEveryRankGetsTheCause) {
  setenv("CUDA_VISIBLE_DEVICES", "", 1);  // hide any GPU, so that the test means the same everywhere
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
      EXPECT_NE(errors[r].find("need a CUDA device"), std::string::npos) << errors[r];
    } else {
      EXPECT_NE(errors[r].find("no CUDA support"), std::string::npos) << errors[r];
    }
    EXPECT_EQ(after[r], 2.0f);
    int device = 0;
    EXPECT_EQ(chorusCommCuDevice(comms[r], &device), chorusSuccess);
    EXPECT_EQ(device, -1) << "no usable device";
  }
  for (auto c : comms) chorusCommDestroy(c);
}

TEST(DeviceCalls, CppOverloadsTakeTheSamePath) {
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  auto comms = chorus::Communicator::createLocal(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> buf(16, 1.0f);
      try {
        comms[r].reduceScatter(buf.data(), buf.data() + 8 * r, 8, chorus::DataType::Float32,
                               chorus::ReduceOp::Sum,
                               chorus::CudaStream{reinterpret_cast<void*>(uintptr_t{0x1000})});
      } catch (const chorus::Error& e) {
        errors[r] = e.what();
      }
      // A null CudaStream is the host path.
      comms[r].allReduce(buf.data(), buf.data(), 16, chorus::DataType::Float32, chorus::ReduceOp::Sum,
                         chorus::CudaStream{});
      EXPECT_EQ(buf[15], 2.0f);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("CUDA"), std::string::npos) << errors[r];
}

TEST(DeviceCalls, ADeviceListWithoutAGpuIsRefused) {
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  chorusComm_t comms[2] = {nullptr, nullptr};
  const int devices[2] = {0, 0};
  EXPECT_EQ(chorusCommInitAll(comms, 2, devices), chorusInvalidUsage);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("CUDA"), std::string::npos)
      << chorusGetLastError(nullptr);
  EXPECT_EQ(comms[0], nullptr);
}

// The order device calls rely on at a group's end: every launch hook (kernels that peers driven by
// this thread wait for) before anything that may wait, even when one of them fails.
TEST(DeviceCalls, GroupEndRunsEveryLaunchHookFirst) {
  using chorus::Error;
  namespace group = chorus::group;
  std::vector<std::string> order;
  group::start();
  group::prepare([&] { order.push_back("prepare"); });
  group::defer([&] { order.push_back("defer"); });
  group::launch([&] { order.push_back("launch 1"); });
  group::launch([&] { order.push_back("launch 2"); });
  group::end();
  EXPECT_EQ(order, (std::vector<std::string>{"launch 1", "launch 2", "prepare", "defer"}));

  order.clear();
  group::start();
  group::prepare([&] { order.push_back("prepare"); });
  group::launch([&] {
    order.push_back("launch 1");
    throw Error(chorusInvalidUsage, "launch 1 failed");
  });
  group::launch([&] { order.push_back("launch 2"); });
  group::defer([&] { order.push_back("defer"); });
  try {
    group::end();
    ADD_FAILURE() << "the failure was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("launch 1 failed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(order, (std::vector<std::string>{"launch 1", "launch 2"}));
  EXPECT_FALSE(group::active());
}

}  // namespace
