// The example trainer under data, tensor and pipeline parallelism and ZeRO gives the model one process
// gives on the same global batch. Ranks are threads of this process.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "api/api_test_util.hpp"
#include "trainer.hpp"

namespace chorus::trainer {
namespace {

using apitest::mentions;
using apitest::runRanks;
using apitest::testConfig;

TrainConfig base(bool f64) {
  TrainConfig c;
  c.layers = 4;
  c.dim = 16;
  c.hidden = 32;
  c.batch = 32;
  c.steps = 20;
  c.lr = 0.1;
  c.float64 = f64;
  return c;
}

TrainResult runGrid(const TrainConfig& c) {
  const int n = c.dp * c.tp * c.pp;
  auto comms = Communicator::createLocal(n, testConfig(120));
  std::vector<TrainResult> results(n);
  runRanks(comms, [&](Communicator& world, int r) { results[r] = train(world, c); });
  for (int r = 1; r < n; ++r)
    EXPECT_EQ(results[r].parameters, results[0].parameters) << "rank " << r << " differs";
  return results[0];
}

TrainConfig oneProcess(TrainConfig c) {
  c.dp = c.tp = c.pp = 1;
  c.accum = c.microBatches = 1;
  c.zero = 0;
  return c;
}

// max |a - b| / max |b|: the error relative to the vector's scale.
double relErr(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

double tolerance(const TrainConfig& c, double f32) { return c.float64 ? 1e-12 : f32; }

void expectSameModel(const TrainResult& got, const TrainResult& want, double tol) {
  ASSERT_FALSE(got.parameters.empty());
  std::printf("relative error: parameters %.2e, step-1 gradients %.2e, losses %.2e (tolerance %.0e)\n",
              relErr(got.parameters, want.parameters), relErr(got.firstGrads, want.firstGrads),
              relErr(got.losses, want.losses), tol);
  EXPECT_LE(relErr(got.parameters, want.parameters), tol);
  EXPECT_LE(relErr(got.firstGrads, want.firstGrads), tol);
  EXPECT_LE(relErr(got.losses, want.losses), tol * 10);
  // The model learned something, so equality is not two models that never moved.
  EXPECT_LT(want.losses.back(), want.losses.front() * 0.9);
  EXPECT_NE(got.parameters, TrainResult{}.parameters);
}

class Precision : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Train, Precision, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Float64" : "Float32";
                         });

TEST_P(Precision, Ddp4RanksWithAccumulation2EqualsOneProcess) {
  TrainConfig c = base(GetParam());
  c.dp = 4;
  c.accum = 2;
  expectSameModel(runGrid(c), runGrid(oneProcess(c)), tolerance(c, 1e-6));
}

TEST_P(Precision, ZeroStagesEqualDdpWithAdamWAndClipping) {
  TrainConfig c = base(GetParam());
  c.dp = 4;
  c.accum = 2;
  c.steps = 12;
  c.optimizer = "adamw";
  c.lr = 0.01;
  c.weightDecay = 0.01;
  c.clip = 0.05;  // below the gradients' norm, so clipping acts in every step
  const TrainResult ddp = runGrid(c);
  size_t optimizerBytes = 0;
  for (int stage = 1; stage <= 3; ++stage) {
    SCOPED_TRACE("ZeRO-" + std::to_string(stage));
    c.zero = stage;
    const TrainResult z = runGrid(c);
    std::printf("ZeRO-%d against DDP: relative error: parameters %.2e, losses %.2e\n", stage,
                relErr(z.parameters, ddp.parameters), relErr(z.losses, ddp.losses));
    EXPECT_LE(relErr(z.parameters, ddp.parameters), tolerance(c, 1e-5));
    EXPECT_LE(relErr(z.losses, ddp.losses), tolerance(c, 1e-5));
    EXPECT_LE(relErr(z.firstGrads, ddp.firstGrads), tolerance(c, 1e-5));
    // Memory: the shard is a quarter (4 data-parallel ranks).
    const train::ZeroMemory& m = z.zeroMemory;
    const size_t es = c.float64 ? 8 : 4, n = m.parameterElements;
    EXPECT_EQ(n, modelParameters(c));
    if (stage == 1) optimizerBytes = m.optimizerBytes;
    EXPECT_EQ(m.optimizerBytes, optimizerBytes);
    EXPECT_EQ(m.optimizerBytes, 2 * es * n / 4);
    EXPECT_EQ(m.gradientBytes, stage == 1 ? es * n : es * n / 4);
    EXPECT_EQ(m.parameterBytes, stage == 3 ? es * n / 4 : es * n);
    // Stage 3 at most: two gathered layers (one prefetched), the gradient being computed, two
    // being reduced (maxReductionsInFlight) and their output shards.
    if (stage == 3) {
      const size_t layer = es * n / c.layers;
      EXPECT_LE(m.peakTransientBytes, 2 * layer + 3 * layer + 2 * layer / 4);
      EXPECT_GE(m.peakTransientBytes, 2 * layer);
    }
  }
}

TEST_P(Precision, TensorParallel2EqualsOneProcess) {
  TrainConfig c = base(GetParam());
  c.tp = 2;
  expectSameModel(runGrid(c), runGrid(oneProcess(c)), tolerance(c, 1e-6));
}

TEST_P(Precision, PipelineGPipeAnd1F1BEqualOneProcess) {
  TrainConfig c = base(GetParam());
  c.pp = 2;
  c.microBatches = 4;
  const TrainResult ref = runGrid(oneProcess(c));
  c.schedule = train::PipelineSchedule::GPipe;
  const TrainResult gpipe = runGrid(c);
  expectSameModel(gpipe, ref, tolerance(c, 1e-6));
  c.schedule = train::PipelineSchedule::OneFOneB;
  const TrainResult ofob = runGrid(c);
  expectSameModel(ofob, ref, tolerance(c, 1e-6));
  EXPECT_EQ(ofob.parameters, gpipe.parameters);  // the same arithmetic in another order of steps
  EXPECT_GT(gpipe.bubble, 0);
  EXPECT_DOUBLE_EQ(gpipe.idealBubble, 1.0 / 5.0);
}

TEST_P(Precision, ThreeDimensional2x2x2EqualsOneProcess) {
  TrainConfig c = base(GetParam());
  c.dp = c.pp = c.tp = 2;
  c.accum = 2;
  c.microBatches = 2;
  c.steps = 10;
  expectSameModel(runGrid(c), runGrid(oneProcess(c)), tolerance(c, 1e-6));
}

TEST_P(Precision, ThreeDimensionalWithZero3AndClippingEqualsOneProcess) {
  TrainConfig c = base(GetParam());
  c.dp = c.pp = c.tp = 2;
  c.microBatches = 2;
  c.steps = 8;
  c.optimizer = "adamw";
  c.lr = 0.01;
  c.clip = 0.05;
  c.zero = 3;
  // Clipping counts every parameter once across the grid: b2 is replicated over tensor ranks.
  expectSameModel(runGrid(c), runGrid(oneProcess(c)), tolerance(c, 1e-5));
}

TEST(Train, UnusedParameterGivesTheNamedErrorNotAHang) {
  TrainConfig c = base(false);
  c.dp = 2;
  c.unusedParameter = true;
  auto comms = Communicator::createLocal(2, testConfig(60));
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  runRanks(comms, [&](Communicator& world, int r) {
    try {
      train(world, c);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (auto& e : errors) EXPECT_TRUE(mentions(e, {"'head.unused_scale'", "produced no gradient"})) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(Train, BadGridSettingsAreRefused) {
  TrainConfig c = base(false);
  c.pp = 3;
  auto comms = Communicator::createLocal(3, testConfig());
  std::vector<std::string> errors(3);
  runRanks(comms, [&](Communicator& world, int r) {
    try {
      train(world, c);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (auto& e : errors) EXPECT_TRUE(mentions(e, {"4 layers", "3 stages"})) << e;
}

}  // namespace
}  // namespace chorus::trainer
