// The training primitives one at a time: ProcessGrid, Reducer, clipping, optimizers, pipeline
// schedules and tensor-parallel layers. Ranks are threads of this process.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "api/api_test_util.hpp"
#include "chorus/train/clip.hpp"
#include "chorus/train/optimizer.hpp"
#include "chorus/train/pipeline.hpp"
#include "chorus/train/process_grid.hpp"
#include "chorus/train/reducer.hpp"
#include "chorus/train/tensor_parallel.hpp"
#include "chorus/train/zero.hpp"

namespace chorus::train {
namespace {

using apitest::mentions;
using apitest::runRanks;
using apitest::testConfig;

std::vector<int> members(Communicator& group, int worldRank) {
  std::vector<int> all(group.size());
  group.allGather(&worldRank, all.data(), 1, DataType::Int32);
  return all;
}

TEST(ProcessGrid, TensorInnermostThenDataThenPipeline) {
  auto comms = Communicator::createLocal(8, testConfig());
  runRanks(comms, [](Communicator& world, int r) {
    ProcessGrid g(world, 2, 2, 2);
    EXPECT_EQ(g.tpRank(), r % 2);
    EXPECT_EQ(g.dpRank(), (r / 2) % 2);
    EXPECT_EQ(g.ppRank(), r / 4);
    EXPECT_EQ(g.worldRank(g.dpRank(), g.ppRank(), g.tpRank()), r);
    const int base = r - r % 2;
    EXPECT_EQ(members(g.tensorParallel(), r), (std::vector<int>{base, base + 1}));
    const int dpBase = (r / 4) * 4 + r % 2;
    EXPECT_EQ(members(g.dataParallel(), r), (std::vector<int>{dpBase, dpBase + 2}));
    const int ppBase = r % 4;
    EXPECT_EQ(members(g.pipeline(), r), (std::vector<int>{ppBase, ppBase + 4}));
    EXPECT_EQ(g.modelParallel().size(), 4);
    EXPECT_EQ(g.pipeline().rank(), g.ppRank());
    EXPECT_EQ(g.dataParallel().rank(), g.dpRank());
  });
}

TEST(ProcessGrid, WrongShapeIsRefused) {
  auto comms = Communicator::createLocal(1, testConfig());
  try {
    ProcessGrid g(comms[0], 2, 1, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
    EXPECT_TRUE(mentions(e.what(), {"dp x pp x tp = 2 x 1 x 1", "1 ranks"}));
  }
}

// n parameters of `count` floats; the gradient of parameter i on rank r is r * 100 + i + j / count.
struct Params {
  std::vector<std::vector<float>> grads;
  std::vector<GradientSpec> specs;
  Params(int n, size_t count) : grads(n, std::vector<float>(count)) {
    for (int i = 0; i < n; ++i)
      specs.push_back({"p" + std::to_string(i), grads[i].data(), count, DataType::Float32});
  }
  void fill(int rank) {
    for (size_t i = 0; i < grads.size(); ++i)
      for (size_t j = 0; j < grads[i].size(); ++j)
        grads[i][j] = static_cast<float>(rank * 100 + i) + static_cast<float>(j % 8) / 8;
  }
  // Average over `size` ranks of the above, exact in float for these values.
  float expected(int size, size_t i, size_t j) const {
    float s = 0;
    for (int r = 0; r < size; ++r) s += static_cast<float>(r * 100 + i) + static_cast<float>(j % 8) / 8;
    return s / static_cast<float>(size);
  }
};

TEST(Reducer, BucketsInReverseOrderFirstSmall) {
  auto comms = Communicator::createLocal(1, testConfig());
  Params p(10, 65536);  // 256 KiB each
  Reducer red(comms[0], p.specs);
  // First bucket up to 1 MiB: the last four parameters; the other six fit in one 25 MiB bucket.
  EXPECT_EQ(red.bucketLayout(), (std::vector<std::vector<size_t>>{{9, 8, 7, 6}, {5, 4, 3, 2, 1, 0}}));
  ReducerOptions small;
  small.firstBucketBytes = 300 << 10;
  small.bucketBytes = 600 << 10;
  Reducer red2(comms[0], p.specs, small);
  EXPECT_EQ(red2.bucketLayout(),
            (std::vector<std::vector<size_t>>{{9}, {8, 7}, {6, 5}, {4, 3}, {2, 1}, {0}}));
}

TEST(Reducer, AveragesInAnyArrivalOrderAndRebuildsFromRank0) {
  auto comms = Communicator::createLocal(3, testConfig());
  runRanks(comms, [](Communicator& c, int rank) {
    Params p(6, 1000);
    ReducerOptions o;
    o.firstBucketBytes = 8000;
    o.bucketBytes = 8000;
    Reducer red(c, p.specs, o);
    for (int iter = 0; iter < 3; ++iter) {
      p.fill(rank);
      red.prepareForBackward();
      // Every rank a different order: rank 0 ascending, rank 1 descending, rank 2 odd then even.
      std::vector<size_t> order(6);
      std::iota(order.begin(), order.end(), 0);
      if (rank == 1) std::reverse(order.begin(), order.end());
      if (rank == 2) order = {1, 3, 5, 0, 2, 4};
      for (size_t i : order) red.markGradReady(i);
      red.finishBackward();
      for (size_t i = 0; i < 6; ++i)
        for (size_t j = 0; j < 1000; ++j)
          ASSERT_EQ(p.grads[i][j], p.expected(3, i, j)) << "iteration " << iter;
      if (iter == 0) {
        // Rebuilt in rank 0's arrival order (ascending), two parameters per bucket.
        EXPECT_EQ(red.bucketLayout(), (std::vector<std::vector<size_t>>{{0, 1}, {2, 3}, {4, 5}}));
      }
    }
    EXPECT_EQ(red.lastStats().buckets, 3u);
    EXPECT_EQ(red.lastStats().bytes, 6u * 4000);
  });
}

TEST(Reducer, AccumulationStepsDoNotCommunicate) {
  auto comms = Communicator::createLocal(2, testConfig());
  runRanks(comms, [](Communicator& c, int rank) {
    Params p(2, 16);
    Reducer red(c, p.specs);
    p.fill(rank);
    red.setRequireSync(false);
    red.prepareForBackward();
    red.markGradReady(0);
    red.markGradReady(1);
    red.finishBackward();
    EXPECT_EQ(p.grads[1][0], static_cast<float>(rank * 100 + 1));  // untouched
    red.setRequireSync(true);
    red.prepareForBackward();
    red.markGradReady(1);
    red.markGradReady(0);
    red.finishBackward();
    EXPECT_EQ(p.grads[1][0], p.expected(2, 1, 0));
  });
}

TEST(Reducer, UnusedParameterIsNamedOnEveryRankWithoutWaitingForTheTimeout) {
  auto comms = Communicator::createLocal(2, testConfig(60));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> errors(2);
  runRanks(comms, [&](Communicator& c, int rank) {
    Params p(3, 64);
    Reducer red(c, p.specs);
    p.fill(rank);
    red.prepareForBackward();
    red.markGradReady(2);
    red.markGradReady(0);
    try {
      red.finishBackward();
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(mentions(errors[r], {"rank", "'p1'", "produced no gradient", "findUnusedParameters"})) << r;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(Reducer, UnusedOnOneRankFailsThePeersAtOnce) {
  auto comms = Communicator::createLocal(2, testConfig(60));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> errors(2);
  runRanks(comms, [&](Communicator& c, int rank) {
    Params p(3, 64);
    ReducerOptions o;
    o.firstBucketBytes = o.bucketBytes = 64 * 4;  // one parameter per bucket
    Reducer red(c, p.specs, o);
    p.fill(rank);
    try {
      red.prepareForBackward();
      red.markGradReady(2);
      if (rank == 0) red.markGradReady(1);
      red.markGradReady(0);
      red.finishBackward();
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
  });
  EXPECT_TRUE(mentions(errors[1], {"rank 1", "'p1'"})) << errors[1];
  EXPECT_FALSE(errors[0].empty()) << "rank 0 should fail, not complete";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(Reducer, FindUnusedParametersReducesZerosAndReportsGloballyUnused) {
  auto comms = Communicator::createLocal(2, testConfig());
  runRanks(comms, [](Communicator& c, int rank) {
    Params p(3, 8);
    ReducerOptions o;
    o.findUnusedParameters = true;
    Reducer red(c, p.specs, o);
    p.fill(rank);
    red.prepareForBackward();
    red.markGradReady(0);
    if (rank == 1) red.markGradReady(1);  // p1 used on rank 1 only, p2 nowhere
    red.finishBackward();
    EXPECT_EQ(red.unusedParameters(), std::vector<size_t>{2});
    EXPECT_EQ(p.grads[1][0], 101.0f / 2);  // rank 0 contributed zeros
    EXPECT_EQ(p.grads[2][0], 0.0f);
    EXPECT_EQ(p.grads[0][3], p.expected(2, 0, 3));
  });
}

TEST(Reducer, RanksRegisteringDifferentParametersAreRefused) {
  auto comms = Communicator::createLocal(2, testConfig());
  std::vector<std::string> errors(2);
  runRanks(comms, [&](Communicator& c, int rank) {
    Params p(rank == 0 ? 3 : 4, 8);
    try {
      Reducer red(c, p.specs);
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
  });
  for (auto& e : errors) EXPECT_TRUE(mentions(e, {"different parameters", "from 3 to 4"})) << e;
}

TEST(Reducer, MarkingTwiceIsAnError) {
  auto comms = Communicator::createLocal(1, testConfig());
  Params p(2, 4);
  Reducer red(comms[0], p.specs);
  red.prepareForBackward();
  red.markGradReady(0);
  try {
    red.markGradReady(0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(mentions(e.what(), {"'p0'", "twice"}));
  }
  red.markGradReady(1);
  red.finishBackward();
}

TEST(Zero, MisuseIsAnErrorNotACorruption) {
  auto comms = Communicator::createLocal(2, testConfig());
  runRanks(comms, [](Communicator& c, int) {
    for (int stage = 1; stage <= 3; ++stage) {
      ZeroOptions o;
      o.stage = stage;
      std::vector<ZeroLayer> layers(2);
      layers[0].params = {{"a.w", 10}, {"a.b", 3}};
      layers[1].params = {{"b.w", 7}};
      ZeroOptimizer z(c, DataType::Float32, layers, o);
      EXPECT_EQ(z.layerElements(0), 13u);
      EXPECT_EQ(z.parameterOffset(0, 1), 10u);
      std::vector<float> init(13, 1.0f);
      z.setLayer(0, init.data());
      z.setLayer(1, init.data());
      for (int l = 1; l >= 0; --l) {
        z.acquire(l, -1);
        if (stage == 3) {
          EXPECT_THROW(z.setLayer(l, init.data()), Error);  // gathered
        }
        static_cast<float*>(z.gradients(l))[0] = 1.0f;
        z.release(l);
        if (l == 1) {
          z.reduceGradients(l);
          if (stage >= 2) {
            EXPECT_THROW(z.reduceGradients(l), Error);  // twice without gradients()
          }
        }
      }
      try {
        z.step();  // layer 0 was never reduced
        FAIL() << "stage " << stage;
      } catch (const Error& e) {
        EXPECT_TRUE(mentions(e.what(), {"layer 0", "'a.w'", "no reduceGradients"})) << e.what();
      }
    }
  });
}

TEST(Clip, ReplicatedParametersCountOnceAndInfIsAgreed) {
  auto comms = Communicator::createLocal(2, testConfig());
  runRanks(comms, [](Communicator& c, int rank) {
    // A shard that differs per rank, and a replicated bias (the same on both ranks).
    std::vector<double> shard = {rank == 0 ? 3.0 : 4.0}, bias = {12.0};
    LocalNorm local;
    local.add(shard.data(), 1, DataType::Float64);
    if (rank == 0) local.add(bias.data(), 1, DataType::Float64);
    GlobalNorm n = globalGradNorm(c, local);
    EXPECT_DOUBLE_EQ(n.norm, 13.0);  // sqrt(9 + 16 + 144), not sqrt(9 + 16 + 288)
    EXPECT_FALSE(n.foundInf);
    EXPECT_NEAR(n.clipCoefficient(6.5), 0.5, 1e-7);
    EXPECT_EQ(n.clipCoefficient(100), 1.0);
    std::vector<float> g = {1.0f, rank == 1 ? std::numeric_limits<float>::infinity() : 2.0f};
    LocalNorm l2;
    l2.add(g.data(), 2, DataType::Float32);
    EXPECT_TRUE(globalGradNorm(c, l2).foundInf);
  });
}

TEST(Optimizer, OneStepOfEachMatchesTheFormulas) {
  OptimizerOptions a;
  a.kind = OptimizerKind::AdamW;
  a.lr = 0.1;
  a.weightDecay = 0.01;
  Optimizer adam(a, DataType::Float64, 1);
  double p = 1.0, g = 0.5;
  adam.beginStep();
  adam.update(&p, &g, 1, 0);
  // m^ = 0.5, v^ = 0.25: p = 1 - 0.1 * 0.01 * 1 - 0.1 * 0.5 / (0.5 + 1e-8)
  EXPECT_NEAR(p, 1.0 - 0.001 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);
  OptimizerOptions s;
  s.lr = 0.5;
  s.momentum = 0.9;
  Optimizer sgd(s, DataType::Float32, 2);
  float q[2] = {1, 1}, h[2] = {1, 2};
  sgd.beginStep();
  sgd.update(q, h, 2, 0);
  EXPECT_FLOAT_EQ(q[1], 0.0f);  // the first buffer is the gradient
  sgd.beginStep();
  sgd.update(q, h, 2, 0);
  EXPECT_FLOAT_EQ(q[1], 0.0f - 0.5f * (0.9f * 2 + 2));
  EXPECT_EQ(sgd.stateBytes(), 8u);
  EXPECT_THROW(Optimizer(s, DataType::Int32, 1), Error);
}

TEST(Pipeline, SchedulesAndTheIdealBubble) {
  using K = PipelineAction::Kind;
  auto text = [](const std::vector<PipelineAction>& v) {
    std::string s;
    for (auto& a : v) s += (a.kind == K::Forward ? "F" : "B") + std::to_string(a.microBatch) + " ";
    return s;
  };
  EXPECT_EQ(text(pipelineActions(PipelineSchedule::OneFOneB, 4, 0, 6)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(text(pipelineActions(PipelineSchedule::OneFOneB, 4, 3, 3)), "F0 B0 F1 B1 F2 B2 ");
  EXPECT_EQ(text(pipelineActions(PipelineSchedule::GPipe, 2, 1, 2)), "F0 F1 B0 B1 ");
  EXPECT_DOUBLE_EQ(idealBubble(4, 8), 3.0 / 11.0);
  EXPECT_THROW(pipelineActions(PipelineSchedule::GPipe, 2, 2, 1), Error);
}

TEST(Pipeline, StagesPassActivationsAndGradientsWithoutDeadlock) {
  for (PipelineSchedule sched : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB}) {
    auto comms = Communicator::createLocal(3, testConfig());
    runRanks(comms, [&](Communicator& c, int stage) {
      // Each stage adds (stage + 1) to its input; backward multiplies the gradient by 2.
      PipelineStage ps(c, DataType::Float64, 1000);
      std::vector<double> seen(5, -1), grads(5, -1);
      const auto st = ps.run(
          sched, 5,
          [&](int mb, const void* in, void* out) {
            const double v = in ? static_cast<const double*>(in)[999] : mb * 10.0;
            seen[mb] = v;
            if (out)
              for (int i = 0; i < 1000; ++i) static_cast<double*>(out)[i] = v + stage + 1;
          },
          [&](int mb, const void* gout, void* gin) {
            const double g = gout ? static_cast<const double*>(gout)[0] : 1.0;
            grads[mb] = g;
            if (gin)
              for (int i = 0; i < 1000; ++i) static_cast<double*>(gin)[i] = 2 * g;
          });
      for (int mb = 0; mb < 5; ++mb) {
        EXPECT_EQ(seen[mb], mb * 10.0 + (stage == 0 ? 0 : stage == 1 ? 1 : 3));
        EXPECT_EQ(grads[mb], stage == 2 ? 1.0 : stage == 1 ? 2.0 : 4.0);
      }
      EXPECT_EQ(st.peakInFlight, sched == PipelineSchedule::GPipe ? 5 : 3 - stage);
    });
  }
}

TEST(TensorParallel, ColumnThenRowEqualsTheDenseLayers) {
  const size_t in = 6, hidden = 8, out = 5, batch = 3;
  std::vector<double> w1(hidden * in), b1(hidden), w2(out * hidden), b2(out), x(batch * in), dy(batch * out);
  for (size_t i = 0; i < w1.size(); ++i) w1[i] = std::sin(0.3 * i);
  for (size_t i = 0; i < b1.size(); ++i) b1[i] = 0.1 * i;
  for (size_t i = 0; i < w2.size(); ++i) w2[i] = std::cos(0.7 * i);
  for (size_t i = 0; i < b2.size(); ++i) b2[i] = -0.2 * i;
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(1.1 * i + 0.5);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = std::cos(0.9 * i);
  // Dense reference: y = (x w1^T + b1) w2^T + b2 and the gradients.
  std::vector<double> h(batch * hidden), y(batch * out), dh(batch * hidden), dx(batch * in);
  std::vector<double> dw1(w1.size()), db1(hidden), dw2(w2.size()), db2(out);
  linearForward(x.data(), batch, in, w1.data(), b1.data(), hidden, h.data());
  linearForward(h.data(), batch, hidden, w2.data(), b2.data(), out, y.data());
  linearBackward(h.data(), dy.data(), batch, hidden, w2.data(), out, dw2.data(), db2.data(), dh.data());
  linearBackward(x.data(), dh.data(), batch, in, w1.data(), hidden, dw1.data(), db1.data(), dx.data());

  auto comms = Communicator::createLocal(2, testConfig());
  runRanks(comms, [&](Communicator& c, int rank) {
    ColumnParallelLinear<double> col(c, in, hidden);
    RowParallelLinear<double> row(c, hidden, out);
    std::vector<double> lw1(col.weightCount()), lb1(col.biasCount()), lw2(row.weightCount()),
        lb2(row.biasCount());
    col.shard(w1.data(), b1.data(), lw1.data(), lb1.data());
    row.shard(w2.data(), b2.data(), lw2.data(), lb2.data());
    std::vector<double> hl(batch * 4), yl(batch * out), dhl(batch * 4), dxl(batch * in);
    std::vector<double> gw1(lw1.size()), gb1(lb1.size()), gw2(lw2.size()), gb2(lb2.size());
    col.forward(x.data(), batch, lw1.data(), lb1.data(), hl.data());
    row.forward(hl.data(), batch, lw2.data(), lb2.data(), yl.data());
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(yl[i], y[i], 1e-12);
    row.backward(hl.data(), dy.data(), batch, lw2.data(), gw2.data(), gb2.data(), dhl.data());
    col.backward(x.data(), dhl.data(), batch, lw1.data(), gw1.data(), gb1.data(), dxl.data());
    for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dxl[i], dx[i], 1e-12);
    for (size_t o = 0; o < 4; ++o)
      for (size_t i = 0; i < in; ++i) EXPECT_NEAR(gw1[o * in + i], dw1[(rank * 4 + o) * in + i], 1e-12);
    for (size_t o = 0; o < out; ++o) {
      EXPECT_NEAR(gb2[o], db2[o], 1e-12);
      for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(gw2[o * 4 + i], dw2[o * hidden + rank * 4 + i], 1e-12);
    }
  });
}

}  // namespace
}  // namespace chorus::train
