#include "chorus/train/zero.hpp"

#include <algorithm>
#include <cstring>

#include "chorus/train/clip.hpp"

namespace chorus::train {

namespace {
// Raw, suitably aligned storage that knows its size.
struct Buffer {
  std::unique_ptr<double[]> data;
  size_t bytes = 0;
  void allocate(size_t n) {
    data.reset(new double[(n + sizeof(double) - 1) / sizeof(double)]());
    bytes = n;
  }
  void release() {
    data.reset();
    bytes = 0;
  }
  std::byte* get() const { return reinterpret_cast<std::byte*>(data.get()); }
  bool empty() const { return !data; }
};

template <typename T>
void addInto(T* dst, const T* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

struct Layer {
  std::vector<ZeroParameter> params;
  std::vector<size_t> offsets;
  size_t count = 0, padded = 0, shard = 0, stateOffset = 0;
  Buffer full;       // parameters: resident (stages 1-2) or gathered (stage 3)
  Buffer ownParams;  // stage 3: this rank's slice
  Buffer grad;       // full gradient: resident (stage 1) or transient (stages 2-3)
  Buffer gradShard;  // stages 2-3: this rank's reduced slice
  Buffer scratch;    // stages 2-3: the reduce-scatter's output
  Work gatherWork, reduceWork;
  bool gathering = false, gathered = false, reducing = false;
  long gradEpoch = -1, shardEpoch = -1;
  bool reducedThisStep = false;
};
}  // namespace

struct ZeroOptimizer::Impl {
  Communicator& dp;
  DataType type;
  size_t es;
  ZeroOptions options;
  std::vector<Layer> layers;
  std::unique_ptr<Optimizer> optimizer;
  long epoch = 0;
  size_t transient = 0, peakTransient = 0;
  std::vector<int> inFlight;  // stages 2-3: layers whose reduction is running, oldest first
  int rank, size;

  Impl(Communicator& c, DataType t, const ZeroOptions& o)
      : dp(c), type(t), es(dataTypeSize(t)), options(o), rank(c.rank()), size(c.size()) {}

  std::string where() const {
    return "ZeroOptimizer (stage " + std::to_string(options.stage) + ", data-parallel rank " +
           std::to_string(rank) + ")";
  }
  Layer& layer(int l, const char* call) {
    if (l < 0 || static_cast<size_t>(l) >= layers.size())
      throw Error(chorusInvalidArgument, where() + ": " + call + ": layer " + std::to_string(l) + " of " +
                                             std::to_string(layers.size()));
    return layers[l];
  }
  void allocTransient(Buffer& b, size_t bytes) {
    b.allocate(bytes);
    transient += bytes;
    peakTransient = std::max(peakTransient, transient);
  }
  void freeTransient(Buffer& b) {
    transient -= b.bytes;
    b.release();
  }
  size_t ownCount(const Layer& L) const {
    const size_t first = static_cast<size_t>(rank) * L.shard;
    return first >= L.count ? 0 : std::min(L.shard, L.count - first);
  }

  void startGather(Layer& L) {
    allocTransient(L.full, L.padded * es);
    L.gatherWork = dp.allGatherAsync(L.ownParams.get(), L.full.get(), L.shard, type);
    L.gathering = true;
  }
  void finishGather(Layer& L) {
    if (!L.gathering) return;
    L.gathering = false;
    L.gathered = true;
    L.gatherWork.wait();
  }

  void finishReduce(Layer& L) {
    if (!L.reducing) return;
    L.reducing = false;
    const int index = static_cast<int>(&L - layers.data());
    inFlight.erase(std::remove(inFlight.begin(), inFlight.end(), index), inFlight.end());
    L.reduceWork.wait();
    if (options.stage == 1) return;
    if (L.shardEpoch != epoch) {
      std::memcpy(L.gradShard.get(), L.scratch.get(), L.shard * es);
      L.shardEpoch = epoch;
    } else if (type == DataType::Float64) {
      addInto(reinterpret_cast<double*>(L.gradShard.get()), reinterpret_cast<const double*>(L.scratch.get()),
              L.shard);
    } else {
      addInto(reinterpret_cast<float*>(L.gradShard.get()), reinterpret_cast<const float*>(L.scratch.get()),
              L.shard);
    }
    freeTransient(L.grad);
    freeTransient(L.scratch);
  }
  void pollReductions() {
    for (Layer& L : layers)
      if (L.reducing && L.reduceWork.test()) finishReduce(L);
    if (options.stage == 1) return;
    // Reductions complete in the order they started (one communicator), so wait for the oldest.
    while (static_cast<int>(inFlight.size()) > options.maxReductionsInFlight)
      finishReduce(layers[inFlight.front()]);
  }
};

ZeroOptimizer::ZeroOptimizer(Communicator& dataParallel, DataType type, std::vector<ZeroLayer> layers,
                             const ZeroOptions& options)
    : impl_(std::make_unique<Impl>(dataParallel, type, options)) {
  Impl& s = *impl_;
  if (options.stage < 1 || options.stage > 3)
    throw Error(chorusInvalidArgument,
                "ZeroOptimizer: stage must be 1, 2 or 3, not " + std::to_string(options.stage));
  if (type != DataType::Float32 && type != DataType::Float64)
    throw Error(
        chorusInvalidArgument,
        std::string("ZeroOptimizer: parameters must be float32 or float64, not ") + dataTypeName(type));
  if (layers.empty()) throw Error(chorusInvalidArgument, "ZeroOptimizer: no layers");
  if (options.prefetchLayers < 0)
    throw Error(chorusInvalidArgument, "ZeroOptimizer: negative prefetchLayers");
  if (options.maxReductionsInFlight < 1)
    throw Error(chorusInvalidArgument, "ZeroOptimizer: maxReductionsInFlight must be at least 1");
  size_t state = 0;
  for (ZeroLayer& zl : layers) {
    Layer L;
    L.params = std::move(zl.params);
    for (const ZeroParameter& p : L.params) {
      L.offsets.push_back(L.count);
      L.count += p.count;
    }
    if (L.count == 0) throw Error(chorusInvalidArgument, "ZeroOptimizer: a layer with no elements");
    const size_t n = static_cast<size_t>(s.size);
    L.padded = (L.count + n - 1) / n * n;
    L.shard = L.padded / n;
    L.stateOffset = state;
    state += L.shard;
    if (options.stage <= 2) L.full.allocate(L.padded * s.es);
    if (options.stage == 3) L.ownParams.allocate(L.shard * s.es);
    if (options.stage == 1) L.grad.allocate(L.padded * s.es);
    if (options.stage >= 2) L.gradShard.allocate(L.shard * s.es);
    s.layers.push_back(std::move(L));
  }
  s.optimizer = std::make_unique<Optimizer>(options.optimizer, type, state);
}

ZeroOptimizer::~ZeroOptimizer() {
  for (Layer& L : impl_->layers) {
    try {
      if (L.gathering) L.gatherWork.wait();
      if (L.reducing) L.reduceWork.wait();
    } catch (...) {
      // The communicator failed; the error was reported to whoever waited first.
    }
  }
}

int ZeroOptimizer::stage() const { return impl_->options.stage; }
size_t ZeroOptimizer::layerCount() const { return impl_->layers.size(); }
size_t ZeroOptimizer::layerElements(int layer) const { return impl_->layer(layer, "layerElements").count; }
size_t ZeroOptimizer::parameterOffset(int layer, int param) const {
  Layer& L = impl_->layer(layer, "parameterOffset");
  if (param < 0 || static_cast<size_t>(param) >= L.offsets.size())
    throw Error(chorusInvalidArgument, impl_->where() + ": parameter " + std::to_string(param) +
                                           " of layer " + std::to_string(layer));
  return L.offsets[param];
}

void ZeroOptimizer::setLayer(int layer, const void* values) {
  Impl& s = *impl_;
  Layer& L = s.layer(layer, "setLayer");
  if (L.gathering || L.gathered)
    throw Error(chorusInvalidUsage,
                s.where() + ": setLayer(" + std::to_string(layer) + ") while it is gathered");
  if (s.options.stage <= 2) {
    std::memset(L.full.get(), 0, L.full.bytes);
    std::memcpy(L.full.get(), values, L.count * s.es);
  } else {
    std::memset(L.ownParams.get(), 0, L.ownParams.bytes);
    const size_t own = s.ownCount(L);
    if (own)
      std::memcpy(L.ownParams.get(), static_cast<const std::byte*>(values) + s.rank * L.shard * s.es,
                  own * s.es);
  }
}

void* ZeroOptimizer::acquire(int layer, int direction) {
  Impl& s = *impl_;
  Layer& L = s.layer(layer, "acquire");
  if (s.options.stage <= 2) return L.full.get();
  if (!L.gathering && !L.gathered) s.startGather(L);
  s.finishGather(L);
  for (int k = 1; k <= s.options.prefetchLayers; ++k) {
    const int next = layer + (direction >= 0 ? k : -k);
    if (next < 0 || static_cast<size_t>(next) >= s.layers.size()) break;
    Layer& N = s.layers[next];
    if (!N.gathering && !N.gathered) s.startGather(N);
  }
  return L.full.get();
}

void ZeroOptimizer::release(int layer) {
  Impl& s = *impl_;
  Layer& L = s.layer(layer, "release");
  if (s.options.stage <= 2) return;
  s.finishGather(L);
  if (L.gathered) s.freeTransient(L.full);
  L.gathered = false;
}

void* ZeroOptimizer::gradients(int layer) {
  Impl& s = *impl_;
  Layer& L = s.layer(layer, "gradients");
  if (s.options.stage == 1) {
    if (L.reducing)
      throw Error(chorusInvalidUsage,
                  s.where() + ": gradients(" + std::to_string(layer) +
                      ") while its allreduce is in flight: stage 1 reduces once per step");
    if (L.gradEpoch != s.epoch) {
      std::memset(L.grad.get(), 0, L.grad.bytes);
      L.gradEpoch = s.epoch;
    }
    return L.grad.get();
  }
  s.finishReduce(L);  // an earlier micro-step's reduction still using the buffer
  if (L.grad.empty()) s.allocTransient(L.grad, L.padded * s.es);
  return L.grad.get();
}

void ZeroOptimizer::reduceGradients(int layer) {
  Impl& s = *impl_;
  Layer& L = s.layer(layer, "reduceGradients");
  if (s.options.stage == 1) {
    if (L.gradEpoch != s.epoch || L.reducing || L.reducedThisStep)
      throw Error(chorusInvalidUsage, s.where() + ": reduceGradients(" + std::to_string(layer) +
                                          ") without gradients this step, or twice in one step");
    L.reduceWork = s.dp.allReduceAsync(L.grad.get(), L.grad.get(), L.padded, s.type, ReduceOp::Avg);
  } else {
    if (L.grad.empty() || L.reducing)
      throw Error(chorusInvalidUsage, s.where() + ": reduceGradients(" + std::to_string(layer) +
                                          ") without gradients(" + std::to_string(layer) +
                                          ") since the last one");
    s.allocTransient(L.scratch, L.shard * s.es);
    L.reduceWork = s.dp.reduceScatterAsync(L.grad.get(), L.scratch.get(), L.shard, s.type, ReduceOp::Avg);
  }
  L.reducing = true;
  L.reducedThisStep = true;
  s.inFlight.push_back(layer);
  s.pollReductions();
}

ZeroOptimizer::StepResult ZeroOptimizer::step() {
  Impl& s = *impl_;
  for (size_t l = 0; l < s.layers.size(); ++l) {
    Layer& L = s.layers[l];
    s.finishReduce(L);
    if (L.gathering) s.finishGather(L);
    if (L.gathered) {
      s.freeTransient(L.full);
      L.gathered = false;
    }
    if (!L.reducedThisStep)
      throw Error(chorusInvalidUsage, s.where() + ": step() but layer " + std::to_string(l) + " ('" +
                                          L.params.front().name + "', ...) had no reduceGradients this step");
    L.reducedThisStep = false;
  }
  s.inFlight.clear();
  auto gradSlice = [&](Layer& L) -> std::byte* {
    return s.options.stage == 1 ? L.grad.get() + static_cast<size_t>(s.rank) * L.shard * s.es
                                : L.gradShard.get();
  };
  auto paramSlice = [&](Layer& L) -> std::byte* {
    return s.options.stage == 3 ? L.ownParams.get()
                                : L.full.get() + static_cast<size_t>(s.rank) * L.shard * s.es;
  };

  // Global norm over the slices this rank owns, each parameter counted once.
  LocalNorm local;
  for (Layer& L : s.layers) {
    const size_t first = static_cast<size_t>(s.rank) * L.shard, end = first + s.ownCount(L);
    for (size_t p = 0; p < L.params.size(); ++p) {
      if (!L.params[p].countInNorm) continue;
      const size_t a = std::max(first, L.offsets[p]), b = std::min(end, L.offsets[p] + L.params[p].count);
      if (a < b) local.add(gradSlice(L) + (a - first) * s.es, b - a, s.type);
    }
  }
  const GlobalNorm norm = globalGradNorm(s.options.normGroup ? *s.options.normGroup : s.dp, local);
  StepResult result;
  result.gradNorm = norm.norm;
  ++s.epoch;
  if (norm.foundInf) {
    result.skipped = true;
    return result;
  }
  const double coef = norm.clipCoefficient(s.options.maxGradNorm);
  result.clipCoefficient = coef;
  s.optimizer->beginStep();
  for (Layer& L : s.layers) {
    const size_t own = s.ownCount(L);
    if (own == 0) continue;
    scaleGradients(gradSlice(L), own, s.type, coef);
    s.optimizer->update(paramSlice(L), gradSlice(L), own, L.stateOffset);
  }
  if (s.options.stage <= 2) {
    Group g;
    for (Layer& L : s.layers) s.dp.allGather(paramSlice(L), L.full.get(), L.shard, s.type);
    g.end();
  }
  return result;
}

void ZeroOptimizer::readLayer(int layer, void* out) {
  Impl& s = *impl_;
  Layer& L = s.layer(layer, "readLayer");
  if (s.options.stage <= 2) {
    std::memcpy(out, L.full.get(), L.count * s.es);
    return;
  }
  Buffer tmp;
  tmp.allocate(L.padded * s.es);
  s.dp.allGather(L.ownParams.get(), tmp.get(), L.shard, s.type);
  std::memcpy(out, tmp.get(), L.count * s.es);
}

void ZeroOptimizer::readGradients(int layer, void* out) {
  Impl& s = *impl_;
  Layer& L = s.layer(layer, "readGradients");
  // Every stage from the slices, which step() clipped (stage 1's other slices were not).
  const std::byte* own =
      s.options.stage == 1 ? L.grad.get() + static_cast<size_t>(s.rank) * L.shard * s.es : L.gradShard.get();
  Buffer tmp;
  tmp.allocate(L.padded * s.es);
  s.dp.allGather(own, tmp.get(), L.shard, s.type);
  std::memcpy(out, tmp.get(), L.count * s.es);
}

ZeroMemory ZeroOptimizer::memory() const {
  const Impl& s = *impl_;
  ZeroMemory m;
  for (const Layer& L : s.layers) {
    m.parameterElements += L.count;
    m.parameterBytes += (s.options.stage == 3 ? L.shard : L.padded) * s.es;
    m.gradientBytes += (s.options.stage == 1 ? L.padded : L.shard) * s.es;
  }
  m.optimizerBytes = s.optimizer->stateBytes();
  m.peakTransientBytes = s.peakTransient;
  return m;
}

}  // namespace chorus::train
