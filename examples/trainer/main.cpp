// chorus-train: trains the example model with data, tensor and pipeline parallelism and ZeRO.
//   chorusrun -n 8 chorus-train --dp 2 --tp 2 --pp 2 --zero 1 --accum 2 --micro-batches 4 --steps 20
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "trainer.hpp"

using chorus::trainer::TrainConfig;

namespace {
// Bytes per parameter the ZeRO paper gives for mixed-precision Adam (K = 12), and this run's
// equivalent: parameters and gradients in the training type (E bytes), optimizer state S bytes.
void printMemoryFormulas(const TrainConfig& c, int N, double stateBytes) {
  const double E = c.float64 ? 8 : 4;
  double ours = 0, paper = 0;
  switch (c.zero) {
    case 0:
      ours = 2 * E + stateBytes, paper = 16;
      break;
    case 1:
      ours = 2 * E + stateBytes / N, paper = 4 + 12.0 / N;
      break;
    case 2:
      ours = E + (E + stateBytes) / N, paper = 2 + 14.0 / N;
      break;
    default:
      ours = (2 * E + stateBytes) / N, paper = 16.0 / N;
      break;
  }
  std::printf(
      "resident memory formula (ZeRO-%d, N=%d data-parallel ranks): %.2f bytes/parameter for this run's %s "
      "%s; "
      "the ZeRO paper's, for mixed-precision Adam: %.2f\n",
      c.zero, N, ours, c.float64 ? "float64" : "float32", c.optimizer.c_str(), paper);
}
}  // namespace

int main(int argc, char** argv) {
  TrainConfig c;
  std::string schedule = "1f1b";
  double firstMiB = 1, bucketMiB = 25;
  bool singleBucket = false;
  CLI::App app{
      "Trains a residual MLP on synthetic data with Chorus's training primitives. Start it with chorusrun "
      "-n (dp*tp*pp)."};
  app.add_option("--dp", c.dp, "data-parallel ranks")->check(CLI::PositiveNumber);
  app.add_option("--tp", c.tp, "tensor-parallel ranks")->check(CLI::PositiveNumber);
  app.add_option("--pp", c.pp, "pipeline stages")->check(CLI::PositiveNumber);
  app.add_option("--zero", c.zero, "0: DDP buckets; 1, 2, 3: ZeRO stage")->check(CLI::Range(0, 3));
  app.add_option("--accum", c.accum, "gradient accumulation micro-steps per step")
      ->check(CLI::PositiveNumber);
  app.add_option("--micro-batches", c.microBatches, "pipeline micro-batches")->check(CLI::PositiveNumber);
  app.add_option("--schedule", schedule, "pipeline schedule")->check(CLI::IsMember({"gpipe", "1f1b"}));
  app.add_option("--steps", c.steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--lr", c.lr, "learning rate");
  app.add_option("--optimizer", c.optimizer, "sgd or adamw")->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--momentum", c.momentum, "SGD momentum");
  app.add_option("--weight-decay", c.weightDecay, "weight decay");
  app.add_option("--clip", c.clip, "clip gradients to this global norm (0: off)");
  app.add_option("--layers", c.layers, "residual blocks")->check(CLI::PositiveNumber);
  app.add_option("--dim", c.dim, "model width")->check(CLI::PositiveNumber);
  app.add_option("--hidden", c.hidden, "hidden width of each block")->check(CLI::PositiveNumber);
  app.add_option("--batch", c.batch, "global batch (rows per step)")->check(CLI::PositiveNumber);
  app.add_option("--seed", c.seed, "seed of the model, the data and the teacher");
  app.add_flag("--float64", c.float64, "train in float64 instead of float32");
  app.add_option("--first-bucket-mb", firstMiB, "DDP: capacity of the first bucket, MiB")
      ->check(CLI::Range(1.0 / 1024, 1024.0 * 1024));
  app.add_option("--bucket-mb", bucketMiB, "DDP: capacity of the other buckets, MiB")
      ->check(CLI::Range(1.0 / 1024, 1024.0 * 1024));
  app.add_flag("--single-bucket", singleBucket, "DDP: one bucket, reduced after the whole backward pass");
  app.add_option("--prefetch", c.zeroPrefetch, "ZeRO-3: layers gathered ahead")
      ->check(CLI::NonNegativeNumber);
  app.add_flag(
      "--quiet", [&](int64_t) { c.verbose = false; }, "print only the summary");
  c.verbose = true;
  CLI11_PARSE(app, argc, argv);
  c.schedule = schedule == "gpipe" ? chorus::train::PipelineSchedule::GPipe
                                   : chorus::train::PipelineSchedule::OneFOneB;
  c.firstBucketBytes = static_cast<size_t>(firstMiB * (1 << 20));
  c.bucketBytes = static_cast<size_t>(bucketMiB * (1 << 20));
  if (singleBucket) c.firstBucketBytes = c.bucketBytes = size_t{1} << 50;

  try {
    chorus::Communicator world = chorus::Communicator::fromEnvironment();
    if (world.rank() == 0)
      std::printf(
          "chorus-train: %d ranks = dp %d x pp %d x tp %d, ZeRO %d, %zu parameters, %s, %s, "
          "batch %d, accum %d, micro-batches %d (%s)\n",
          world.size(), c.dp, c.pp, c.tp, c.zero, chorus::trainer::modelParameters(c),
          c.float64 ? "float64" : "float32", c.optimizer.c_str(), c.batch, c.accum, c.microBatches,
          schedule.c_str());
    const chorus::trainer::TrainResult r = chorus::trainer::train(world, c);
    // One line per rank, gathered to every rank and printed by rank 0.
    constexpr int kFields = 7;
    const double mine[kFields] = {r.stepSeconds,
                                  r.hiddenShare,
                                  r.bubble,
                                  r.idealBubble,
                                  r.residentBytesPerParameter,
                                  r.transientBytesPerParameter,
                                  static_cast<double>(r.parametersHere)};
    std::vector<double> all(kFields * static_cast<size_t>(world.size()));
    world.allGather(mine, all.data(), kFields, chorus::DataType::Float64);
    if (world.rank() == 0) {
      std::printf("final loss %.8f (first %.8f)\n", r.losses.back(), r.losses.front());
      std::printf(
          "rank  step_ms  comm_hidden  bubble(measured/ideal)  params_here  resident_B/param  "
          "transient_B/param\n");
      for (int k = 0; k < world.size(); ++k) {
        const double* v = &all[kFields * static_cast<size_t>(k)];
        char hidden[32] = "-", bubble[48] = "-";
        if (v[1] >= 0) std::snprintf(hidden, sizeof hidden, "%.0f%%", v[1] * 100);
        if (v[2] >= 0) std::snprintf(bubble, sizeof bubble, "%.0f%% / %.0f%%", v[2] * 100, v[3] * 100);
        std::printf("%4d  %7.2f  %11s  %22s  %11.0f  %16.2f  %17.2f\n", k, v[0] * 1e3, hidden, bubble, v[6],
                    v[4], v[5]);
      }
      const double stateBytes = c.optimizer == "adamw" ? 2 * (c.float64 ? 8 : 4)
                                : c.momentum > 0       ? (c.float64 ? 8 : 4)
                                                       : 0;
      printMemoryFormulas(c, c.dp, stateBytes);
    }
    world.barrier();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-train: %s\n", e.what());
    return 1;
  }
}
