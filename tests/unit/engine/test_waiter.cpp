// engine::Waiter: the waiting policy chosen by ranks per core (CHORUS_WAIT overrides it), and
// every policy, spinning included, still ending a wait at its deadline with what was pending; the
// coarse clock that call deadlines start from.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "base/error.hpp"
#include "engine/waiter.hpp"

using namespace chorus;
using namespace chorus::engine;

namespace {

TEST(WaitPolicy, ChosenByRanksPerCoreUnlessSet) {
  EXPECT_EQ(waitPolicyFor("", 2, 2), WaitPolicy::Adaptive);
  EXPECT_EQ(waitPolicyFor("", 1, 16), WaitPolicy::Adaptive);
  EXPECT_EQ(waitPolicyFor("", 4, 2), WaitPolicy::Yield);
  EXPECT_EQ(waitPolicyFor("", 8, 2), WaitPolicy::Yield);
  EXPECT_EQ(waitPolicyFor("spin", 8, 2), WaitPolicy::Spin);
  EXPECT_EQ(waitPolicyFor("adaptive", 8, 2), WaitPolicy::Adaptive);
  EXPECT_EQ(waitPolicyFor("yield", 2, 2), WaitPolicy::Yield);
  EXPECT_EQ(waitPolicyFor("sleep", 2, 2), WaitPolicy::Sleep);
  EXPECT_STREQ(waitPolicyName(WaitPolicy::Yield), "yield");
}

// The coarse clock is the exact one to the tick: never ahead of it, and less than two ticks behind
// (CommImpl's deadlines add two), also right after a sleep, when the tick may not have run yet.
// Only timekeeping that itself falls behind (a vCPU the hypervisor holds) lags more: allowed for
// one read in a thousand, and never by 100 ms.
TEST(CoarseClock, TrailsTheExactClockByLessThanTwoTicks) {
  const auto tick = coarseTick();
  EXPECT_GT(tick, Clock::duration::zero());
  EXPECT_LE(tick, std::chrono::milliseconds(100));
  constexpr int kReads = 20000;
  int late = 0;
  for (int i = 0; i < kReads; ++i) {
    if (i % 1000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto before = Clock::now();
    const auto coarse = coarseNow();
    const auto after = Clock::now();
    ASSERT_LE(coarse, after) << "read " << i << ": the coarse clock is ahead of the exact one";
    ASSERT_LT(before - coarse, std::chrono::milliseconds(100)) << "read " << i;
    if (coarse + 2 * tick <= before) ++late;
  }
  EXPECT_LE(late, kReads / 1000) << late << " of " << kReads << " reads were two ticks or more behind";
}

struct CountingHealth : Health {
  int checks = 0;
  bool abortRequested() const override { return false; }
  void checkHealth(FunctionRef<bool(int)>) override { ++checks; }
};

class EveryPolicy : public ::testing::TestWithParam<WaitPolicy> {};

TEST_P(EveryPolicy, EndsAtItsDeadlineNamingWhatWasPending) {
  CountingHealth health;
  const auto timeout = std::chrono::milliseconds(60);
  const auto start = Clock::now();
  Waiter w(health, start + timeout, timeout, GetParam());
  try {
    for (;;) w.idle([] { return std::string("rank 0: waiting for rank 1"); }, [](int) { return true; });
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusTimeout);
    EXPECT_NE(std::string(e.what()).find("waiting for rank 1"), std::string::npos) << e.what();
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  EXPECT_GE(took.count(), 60);
  EXPECT_LT(took.count(), 2000);
  EXPECT_GE(health.checks, 2);  // the peers' health is checked while waiting, spinning or not
}

INSTANTIATE_TEST_SUITE_P(All, EveryPolicy,
                         ::testing::Values(WaitPolicy::Spin, WaitPolicy::Adaptive, WaitPolicy::Yield,
                                           WaitPolicy::Sleep),
                         [](const ::testing::TestParamInfo<WaitPolicy>& p) {
                           return std::string(waitPolicyName(p.param));
                         });

}  // namespace
