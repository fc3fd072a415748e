#include "trainer.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "chorus/train/clip.hpp"
#include "chorus/train/optimizer.hpp"
#include "chorus/train/process_grid.hpp"
#include "chorus/train/reducer.hpp"
#include "chorus/train/tensor_parallel.hpp"

namespace chorus::trainer {

namespace {
using Clock = std::chrono::steady_clock;

// A value in [-1, 1) from a seed and three indices (splitmix64).
double uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ (a + 1) * 0xBF58476D1CE4E5B9ull ^
               (b + 7) * 0x94D049BB133111EBull ^ (c + 13) * 0x2545F4914F6CDD1Dull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

// Offsets of a block's parameters in the unsharded model: W1 (hidden x dim), b1, W2 (dim x hidden), b2.
struct FullBlock {
  size_t w1, b1, w2, b2, size;
};
FullBlock fullBlock(const TrainConfig& c, int block) {
  const size_t d = c.dim, h = c.hidden, per = 2 * d * h + h + d;
  const size_t base = per * static_cast<size_t>(block);
  return {base, base + h * d, base + h * d + h, base + h * d + h + d * h, per};
}

template <typename T>
class Run {
 public:
  Run(Communicator& world, const TrainConfig& c) : c_(c), grid_(world, c.dp, c.pp, c.tp) {
    validate();
    blocksHere_ = c.layers / c.pp;
    firstBlock_ = grid_.ppRank() * blocksHere_;
    col_ = std::make_unique<train::ColumnParallelLinear<T>>(grid_.tensorParallel(), c.dim, c.hidden);
    row_ = std::make_unique<train::RowParallelLinear<T>>(grid_.tensorParallel(), c.hidden, c.dim);
    hl_ = col_->localOutFeatures();
    // Local layout of a block: w1 (hl x d), b1 (hl), w2 (d x hl), b2 (d).
    blockSize_ = col_->weightCount() + col_->biasCount() + row_->weightCount() + row_->biasCount();
    rowsPerMicro_ = c.batch / (c.dp * c.accum * c.microBatches);
    teacher_.resize(static_cast<size_t>(c.dim) * c.dim);
    for (size_t i = 0; i < teacher_.size(); ++i)
      teacher_[i] = uniform(c.seed, 1000, 0, i) * 1.5 / std::sqrt(static_cast<double>(c.dim));
    setUpParameters();
  }

  TrainResult run();

 private:
  void validate() const {
    auto bad = [](const std::string& why) { throw Error(chorusInvalidArgument, "chorus-train: " + why); };
    if (c_.layers < 1 || c_.dim < 1 || c_.hidden < 1 || c_.steps < 1 || c_.accum < 1 || c_.microBatches < 1)
      bad("layers, dim, hidden, steps, accum and micro-batches must be positive");
    if (c_.layers % c_.pp)
      bad(std::to_string(c_.layers) + " layers do not split evenly into " + std::to_string(c_.pp) +
          " stages");
    // In 64 bits: the product of three ints can overflow an int.
    const int64_t split = static_cast<int64_t>(c_.dp) * c_.accum * c_.microBatches;
    if (c_.batch < 1 || c_.batch % split != 0)
      bad("the global batch " + std::to_string(c_.batch) +
          " does not divide by dp x accum x micro-batches = " + std::to_string(split));
    if (c_.zero < 0 || c_.zero > 3) bad("--zero must be 0, 1, 2 or 3");
    if (c_.optimizer != "sgd" && c_.optimizer != "adamw") bad("--optimizer must be sgd or adamw");
  }
  DataType type() const { return dataTypeOf<T>(); }
  T* w1(T* blk) const { return blk; }
  T* b1(T* blk) const { return blk + col_->weightCount(); }
  T* w2(T* blk) const { return b1(blk) + col_->biasCount(); }
  T* b2(T* blk) const { return w2(blk) + row_->weightCount(); }

  // This rank's slice of block `b`'s initial values.
  std::vector<T> initialBlock(int b) const {
    const size_t d = c_.dim, h = c_.hidden;
    std::vector<T> w1f(h * d), b1f(h), w2f(d * h), b2f(d);
    const double s1 = 1.0 / std::sqrt(static_cast<double>(d)), s2 = 1.0 / std::sqrt(static_cast<double>(h));
    for (size_t i = 0; i < w1f.size(); ++i) w1f[i] = static_cast<T>(s1 * uniform(c_.seed, b, 0, i));
    for (size_t i = 0; i < h; ++i) b1f[i] = static_cast<T>(0.1 * uniform(c_.seed, b, 1, i));
    for (size_t i = 0; i < w2f.size(); ++i) w2f[i] = static_cast<T>(s2 * uniform(c_.seed, b, 2, i));
    for (size_t i = 0; i < d; ++i) b2f[i] = static_cast<T>(0.1 * uniform(c_.seed, b, 3, i));
    std::vector<T> local(blockSize_);
    col_->shard(w1f.data(), b1f.data(), w1(local.data()), b1(local.data()));
    row_->shard(w2f.data(), b2f.data(), w2(local.data()), b2(local.data()));
    return local;
  }

  void setUpParameters();
  T* acquire(int lb, int dir) {
    return c_.zero ? static_cast<T*>(zero_->acquire(lb, dir)) : params_[lb].data();
  }
  void release(int lb) {
    if (c_.zero) zero_->release(lb);
  }
  T* grads(int lb) { return c_.zero ? static_cast<T*>(zero_->gradients(lb)) : grads_[lb].data(); }
  void gradsDone(int lb, bool lastMicroStep);

  void makeBatch(int step, int accumStep, int mb, std::vector<T>& x, std::vector<T>& y) const;
  void forward(int step, int accumStep, int mb, const void* in, void* out);
  void backward(int mb, const void* gradOut, void* gradIn, bool lastMicroStep);
  void optimizerStep(bool firstStep, TrainResult& r);
  // Adds this rank's part of the model (params or grads, by block) into the unsharded `full`.
  void scatterToFull(int lb, const T* local, std::vector<double>& full) const;
  std::vector<double> collect(bool gradients);

  TrainConfig c_;
  train::ProcessGrid grid_;
  int blocksHere_ = 0, firstBlock_ = 0;
  std::unique_ptr<train::ColumnParallelLinear<T>> col_;
  std::unique_ptr<train::RowParallelLinear<T>> row_;
  size_t hl_ = 0, blockSize_ = 0;
  int rowsPerMicro_ = 0;
  std::vector<double> teacher_;
  // zero == 0: the parameters, gradients, optimizer and reducer live here.
  std::vector<std::vector<T>> params_, grads_;
  std::vector<T> unusedParam_, unusedGrad_;
  std::unique_ptr<train::Reducer> reducer_;
  std::unique_ptr<train::Optimizer> optim_;
  std::unique_ptr<train::ZeroOptimizer> zero_;
  // Per micro-batch: each block's input and hidden activation; the last stage's output gradient.
  struct Saved {
    std::vector<std::vector<T>> x, a;
    std::vector<T> dOut;
  };
  std::vector<Saved> saved_;
  double lossSum_ = 0;
};

template <typename T>
void Run<T>::setUpParameters() {
  train::OptimizerOptions oo;
  oo.kind = c_.optimizer == "adamw" ? train::OptimizerKind::AdamW : train::OptimizerKind::Sgd;
  oo.lr = c_.lr;
  oo.momentum = c_.momentum;
  oo.weightDecay = c_.weightDecay;
  const char* names[4] = {"w1", "b1", "w2", "b2"};
  const size_t counts[4] = {col_->weightCount(), col_->biasCount(), row_->weightCount(), row_->biasCount()};
  if (c_.zero == 0) {
    std::vector<train::GradientSpec> specs;
    for (int lb = 0; lb < blocksHere_; ++lb) {
      params_.push_back(initialBlock(firstBlock_ + lb));
      grads_.emplace_back(blockSize_, T(0));
    }
    for (int lb = 0; lb < blocksHere_; ++lb) {
      size_t off = 0;
      for (int k = 0; k < 4; ++k) {
        specs.push_back({"block" + std::to_string(firstBlock_ + lb) + "." + names[k], grads_[lb].data() + off,
                         counts[k], type()});
        off += counts[k];
      }
    }
    if (c_.unusedParameter) {
      unusedParam_.assign(c_.dim, T(0));
      unusedGrad_.assign(c_.dim, T(0));
      specs.push_back({"head.unused_scale", unusedGrad_.data(), unusedGrad_.size(), type()});
    }
    train::ReducerOptions ro;
    ro.firstBucketBytes = c_.firstBucketBytes;
    ro.bucketBytes = c_.bucketBytes;
    ro.findUnusedParameters = c_.findUnused;
    reducer_ = std::make_unique<train::Reducer>(grid_.dataParallel(), std::move(specs), ro);
    optim_ = std::make_unique<train::Optimizer>(oo, type(), blockSize_ * blocksHere_);
    return;
  }
  std::vector<train::ZeroLayer> layers;
  for (int lb = 0; lb < blocksHere_; ++lb) {
    train::ZeroLayer L;
    for (int k = 0; k < 4; ++k)
      L.params.push_back({"block" + std::to_string(firstBlock_ + lb) + "." + names[k], counts[k],
                          k != 3 || grid_.tpRank() == 0});
    layers.push_back(std::move(L));
  }
  train::ZeroOptions zo;
  zo.stage = c_.zero;
  zo.optimizer = oo;
  zo.maxGradNorm = c_.clip;
  zo.normGroup = &grid_.world();
  zo.prefetchLayers = c_.zeroPrefetch;
  zero_ = std::make_unique<train::ZeroOptimizer>(grid_.dataParallel(), type(), std::move(layers), zo);
  for (int lb = 0; lb < blocksHere_; ++lb) zero_->setLayer(lb, initialBlock(firstBlock_ + lb).data());
}

template <typename T>
void Run<T>::makeBatch(int step, int accumStep, int mb, std::vector<T>& x, std::vector<T>& y) const {
  const size_t d = c_.dim;
  const int rowsPerRank = c_.batch / c_.dp;
  const int first = grid_.dpRank() * rowsPerRank + accumStep * (rowsPerRank / c_.accum) + mb * rowsPerMicro_;
  x.resize(static_cast<size_t>(rowsPerMicro_) * d);
  y.resize(x.size());
  std::vector<double> xr(d);
  for (int r = 0; r < rowsPerMicro_; ++r) {
    for (size_t j = 0; j < d; ++j) {
      xr[j] = uniform(c_.seed, 2000 + step, first + r, j);
      x[r * d + j] = static_cast<T>(xr[j]);
    }
    for (size_t j = 0; j < d; ++j) {
      double acc = 0;
      for (size_t i = 0; i < d; ++i) acc += teacher_[j * d + i] * xr[i];
      y[r * d + j] = static_cast<T>(std::tanh(acc));
    }
  }
}

template <typename T>
void Run<T>::forward(int step, int accumStep, int mb, const void* in, void* out) {
  const size_t d = c_.dim, rows = rowsPerMicro_;
  Saved& sv = saved_[mb];
  sv.x.assign(blocksHere_, {});
  sv.a.assign(blocksHere_, {});
  std::vector<T> cur(rows * d), target;
  if (grid_.firstStage() || grid_.lastStage()) {
    std::vector<T> x;
    makeBatch(step, accumStep, mb, x, target);
    if (grid_.firstStage()) cur = x;
  }
  if (!grid_.firstStage()) std::memcpy(cur.data(), in, rows * d * sizeof(T));
  std::vector<T> z(rows * hl_), r(rows * d);
  for (int lb = 0; lb < blocksHere_; ++lb) {
    T* p = acquire(lb, +1);
    sv.x[lb] = cur;
    col_->forward(cur.data(), rows, w1(p), b1(p), z.data());
    for (T& v : z) v = std::tanh(v);
    row_->forward(z.data(), rows, w2(p), b2(p), r.data());
    for (size_t i = 0; i < cur.size(); ++i) cur[i] += r[i];
    sv.a[lb] = z;
    release(lb);
  }
  if (!grid_.lastStage()) {
    std::memcpy(out, cur.data(), cur.size() * sizeof(T));
    return;
  }
  // Loss 0.5 |out - y|^2 per row; this rank's gradient is the mean over its rows (the data-parallel
  // average then makes it the global batch's mean).
  const T scale = static_cast<T>(static_cast<double>(c_.dp) / c_.batch);
  sv.dOut.resize(cur.size());
  double loss = 0;
  for (size_t i = 0; i < cur.size(); ++i) {
    const T e = cur[i] - target[i];
    loss += 0.5 * static_cast<double>(e) * static_cast<double>(e);
    sv.dOut[i] = e * scale;
  }
  if (grid_.tpRank() == 0) lossSum_ += loss;
}

template <typename T>
void Run<T>::backward(int mb, const void* gradOut, void* gradIn, bool lastMicroStep) {
  const size_t d = c_.dim, rows = rowsPerMicro_;
  Saved& sv = saved_[mb];
  std::vector<T> dcur(rows * d), da(rows * hl_), dx(rows * d);
  if (grid_.lastStage())
    dcur = sv.dOut;
  else
    std::memcpy(dcur.data(), gradOut, dcur.size() * sizeof(T));
  for (int lb = blocksHere_ - 1; lb >= 0; --lb) {
    T* p = acquire(lb, -1);
    T* g = grads(lb);
    row_->backward(sv.a[lb].data(), dcur.data(), rows, w2(p), w2(g), b2(g), da.data());
    for (size_t i = 0; i < da.size(); ++i) da[i] *= T(1) - sv.a[lb][i] * sv.a[lb][i];
    col_->backward(sv.x[lb].data(), da.data(), rows, w1(p), w1(g), b1(g), dx.data());
    for (size_t i = 0; i < dcur.size(); ++i) dcur[i] += dx[i];
    release(lb);
    if (mb == c_.microBatches - 1) gradsDone(lb, lastMicroStep);
  }
  if (!grid_.firstStage()) std::memcpy(gradIn, dcur.data(), dcur.size() * sizeof(T));
  sv = Saved{};
}

template <typename T>
void Run<T>::gradsDone(int lb, bool lastMicroStep) {
  if (c_.zero == 0) {
    if (!lastMicroStep) return;
    for (int k = 3; k >= 0; --k) reducer_->markGradReady(static_cast<size_t>(lb) * 4 + k);
  } else if (c_.zero >= 2 || lastMicroStep) {
    zero_->reduceGradients(lb);
  }
}

template <typename T>
void Run<T>::scatterToFull(int lb, const T* local, std::vector<double>& full) const {
  const FullBlock fb = fullBlock(c_, firstBlock_ + lb);
  const size_t d = c_.dim, h = c_.hidden, t = grid_.tpRank();
  for (size_t o = 0; o < hl_; ++o) {
    for (size_t i = 0; i < d; ++i) full[fb.w1 + (t * hl_ + o) * d + i] += local[o * d + i];
    full[fb.b1 + t * hl_ + o] += local[hl_ * d + o];
  }
  const T* lw2 = local + hl_ * d + hl_;
  for (size_t o = 0; o < d; ++o)
    for (size_t i = 0; i < hl_; ++i) full[fb.w2 + o * h + t * hl_ + i] += lw2[o * hl_ + i];
  if (t == 0)
    for (size_t o = 0; o < d; ++o) full[fb.b2 + o] += lw2[d * hl_ + o];
}

template <typename T>
std::vector<double> Run<T>::collect(bool gradients) {
  std::vector<double> full(modelParameters(c_), 0.0);
  std::vector<T> buf(blockSize_);
  for (int lb = 0; lb < blocksHere_; ++lb) {
    const T* local = nullptr;
    if (c_.zero) {
      // Collective over the data-parallel group: every replica takes part.
      if (gradients)
        zero_->readGradients(lb, buf.data());
      else
        zero_->readLayer(lb, buf.data());
      local = buf.data();
    } else {
      local = gradients ? grads_[lb].data() : params_[lb].data();
    }
    if (grid_.dpRank() == 0) scatterToFull(lb, local, full);
  }
  grid_.world().allReduce(full.data(), full.data(), full.size(), DataType::Float64, ReduceOp::Sum);
  return full;
}

template <typename T>
void Run<T>::optimizerStep(bool firstStep, TrainResult& r) {
  if (c_.zero) {
    const train::ZeroOptimizer::StepResult res = zero_->step();
    if (firstStep) {
      // The slices were clipped in step(): undo it, so that firstGrads is the reduced gradient.
      r.firstGrads = collect(true);
      for (double& g : r.firstGrads) g /= res.clipCoefficient;
    }
    return;
  }
  if (firstStep) r.firstGrads = collect(true);
  train::LocalNorm local;
  for (int lb = 0; lb < blocksHere_; ++lb) {
    // b2 is replicated across the tensor-parallel ranks: counted on tensor rank 0 only.
    const size_t counted = grid_.tpRank() == 0 ? blockSize_ : blockSize_ - row_->biasCount();
    local.add(grads_[lb].data(), counted, type());
  }
  const train::GlobalNorm norm = train::globalGradNorm(grid_.modelParallel(), local);
  if (!norm.foundInf) {
    const double coef = norm.clipCoefficient(c_.clip);
    optim_->beginStep();
    for (int lb = 0; lb < blocksHere_; ++lb) {
      train::scaleGradients(grads_[lb].data(), blockSize_, type(), coef);
      optim_->update(params_[lb].data(), grads_[lb].data(), blockSize_, static_cast<size_t>(lb) * blockSize_);
    }
  }
  for (auto& g : grads_) std::fill(g.begin(), g.end(), T(0));
}

template <typename T>
TrainResult Run<T>::run() {
  TrainResult r;
  train::PipelineStage stage(grid_.pipeline(), type(), static_cast<size_t>(rowsPerMicro_) * c_.dim);
  saved_.assign(c_.microBatches, Saved{});
  double timed = 0;
  for (int step = 0; step < c_.steps; ++step) {
    const auto t0 = Clock::now();
    lossSum_ = 0;
    train::PipelineStats ps;
    for (int a = 0; a < c_.accum; ++a) {
      const bool last = a == c_.accum - 1;
      if (reducer_) {
        reducer_->setRequireSync(last);
        reducer_->prepareForBackward();
      }
      ps = stage.run(
          c_.schedule, c_.microBatches,
          [&](int mb, const void* in, void* out) { forward(step, a, mb, in, out); },
          [&](int mb, const void* gradOut, void* gradIn) { backward(mb, gradOut, gradIn, last); });
      if (reducer_) reducer_->finishBackward();
    }
    optimizerStep(step == 0, r);
    double loss = lossSum_;
    grid_.world().allReduce(&loss, &loss, 1, DataType::Float64, ReduceOp::Sum);
    loss /= c_.batch;
    r.losses.push_back(loss);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    if (step > 0 || c_.steps == 1) timed += secs;
    if (c_.pp > 1) {
      r.bubble = ps.bubble();
      r.idealBubble = train::idealBubble(c_.pp, c_.microBatches);
    }
    if (reducer_) r.hiddenShare = reducer_->lastStats().hiddenShare();
    if (c_.verbose && grid_.world().rank() == 0)
      std::printf("step %3d  loss %.8f  time %.2f ms\n", step + 1, loss, secs * 1e3);
  }
  r.stepSeconds = timed / (c_.steps > 1 ? c_.steps - 1 : 1);
  r.parametersHere = blockSize_ * blocksHere_;
  const double n = static_cast<double>(r.parametersHere);
  if (c_.zero) {
    r.zeroMemory = zero_->memory();
    const train::ZeroMemory& m = r.zeroMemory;
    r.residentBytesPerParameter =
        static_cast<double>(m.parameterBytes + m.gradientBytes + m.optimizerBytes) / n;
    r.transientBytesPerParameter = static_cast<double>(m.peakTransientBytes) / n;
  } else {
    r.residentBytesPerParameter =
        static_cast<double>(2 * sizeof(T) * r.parametersHere + optim_->stateBytes()) / n;
    r.transientBytesPerParameter = static_cast<double>(reducer_->lastStats().bytes) / n;
  }
  r.parameters = collect(false);
  return r;
}

}  // namespace

size_t modelParameters(const TrainConfig& config) {
  return fullBlock(config, 0).size * static_cast<size_t>(config.layers);
}

TrainResult train(Communicator& world, const TrainConfig& config) {
  if (config.float64) return Run<double>(world, config).run();
  return Run<float>(world, config).run();
}

}  // namespace chorus::trainer
