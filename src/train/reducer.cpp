#include "chorus/train/reducer.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

namespace chorus::train {

namespace {
using Clock = std::chrono::steady_clock;

struct Bucket {
  std::vector<size_t> params;
  std::vector<size_t> offsets;  // element offset of each parameter in `buffer`
  DataType type = DataType::Float32;
  size_t count = 0;
  std::vector<std::max_align_t> storage;
  size_t pending = 0;
  bool launched = false, done = false;
  Work work;
  Clock::time_point launchedAt, doneAt;

  std::byte* bytes() { return reinterpret_cast<std::byte*>(storage.data()); }
};

std::string rankText(const Communicator& c) { return "rank " + std::to_string(c.rank()); }
}  // namespace

struct Reducer::Impl {
  Communicator& comm;
  std::vector<GradientSpec> params;
  ReducerOptions options;
  std::vector<Bucket> buckets;
  std::vector<std::pair<size_t, size_t>> where;  // parameter -> (bucket, element offset)
  std::vector<uint8_t> ready;
  std::vector<size_t> arrival;
  std::vector<size_t> unused;
  size_t nextLaunch = 0;
  bool sync = true, inBackward = false, rebuilt = false;
  Stats stats;

  Impl(Communicator& c, std::vector<GradientSpec> p, const ReducerOptions& o)
      : comm(c), params(std::move(p)), options(o) {}

  void build(const std::vector<size_t>& order) {
    buckets.clear();
    where.assign(params.size(), {0, 0});
    size_t bytes = 0;
    for (size_t idx : order) {
      const GradientSpec& p = params[idx];
      const size_t sz = p.count * dataTypeSize(p.type);
      // The current bucket's capacity: the first is smaller, so that communication starts early.
      const size_t cap = buckets.size() == 1 ? options.firstBucketBytes : options.bucketBytes;
      if (buckets.empty() || buckets.back().type != p.type || (bytes > 0 && bytes + sz > cap)) {
        buckets.emplace_back();
        buckets.back().type = p.type;
        bytes = 0;
      }
      Bucket& b = buckets.back();
      where[idx] = {buckets.size() - 1, b.count};
      b.params.push_back(idx);
      b.offsets.push_back(b.count);
      b.count += p.count;
      bytes += sz;
    }
    for (Bucket& b : buckets) {
      const size_t sz = b.count * dataTypeSize(b.type);
      b.storage.assign((sz + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t), std::max_align_t{});
    }
  }

  void pollDone() {
    for (size_t i = 0; i < nextLaunch; ++i) {
      Bucket& b = buckets[i];
      if (!b.done && b.work.test()) {
        b.done = true;
        b.doneAt = Clock::now();
      }
    }
  }

  void launchReady() {
    while (nextLaunch < buckets.size() && buckets[nextLaunch].pending == 0) {
      Bucket& b = buckets[nextLaunch++];
      b.launchedAt = Clock::now();
      b.work = comm.allReduceAsync(b.bytes(), b.bytes(), b.count, b.type, ReduceOp::Avg);
      b.launched = true;
    }
  }

  void fill(size_t idx, bool zero) {
    auto [bi, off] = where[idx];
    Bucket& b = buckets[bi];
    const size_t es = dataTypeSize(b.type);
    std::byte* dst = b.bytes() + off * es;
    if (zero)
      std::memset(dst, 0, params[idx].count * es);
    else
      std::memcpy(dst, params[idx].grad, params[idx].count * es);
    ready[idx] = 1;
    --b.pending;
  }

  // Waits for every launched bucket; returns the first failure's message (empty if none).
  std::string waitLaunched() {
    std::string firstError;
    for (size_t i = 0; i < nextLaunch; ++i) {
      Bucket& b = buckets[i];
      try {
        b.work.wait();
      } catch (const std::exception& e) {
        if (firstError.empty()) firstError = e.what();
      }
      if (!b.done) {
        b.done = true;
        b.doneAt = Clock::now();
      }
    }
    return firstError;
  }
};

Reducer::Reducer(Communicator& comm, std::vector<GradientSpec> params, const ReducerOptions& options)
    : impl_(std::make_unique<Impl>(comm, std::move(params), options)) {
  if (impl_->params.empty()) throw Error(chorusInvalidArgument, "Reducer: no parameters registered");
  if (options.firstBucketBytes == 0 || options.bucketBytes == 0)
    throw Error(chorusInvalidArgument, "Reducer: bucket capacities must be positive");
  for (const GradientSpec& p : impl_->params) {
    if (p.grad == nullptr || p.count == 0)
      throw Error(chorusInvalidArgument,
                  "Reducer: parameter '" + p.name + "' has no gradient buffer or no elements");
    (void)dataTypeSize(p.type);  // throws for an unknown type
  }
  // Every rank must register the same parameters (as DDP verifies at construction): compare a
  // signature of the counts and types, its minimum and maximum over the ranks.
  uint64_t h = 0;
  for (const GradientSpec& p : impl_->params)
    h = h * 1000003u + p.count * 16u + static_cast<uint64_t>(p.type);
  const int64_t sig[2] = {static_cast<int64_t>(impl_->params.size()), static_cast<int64_t>(h >> 1)};
  int64_t lo[2] = {sig[0], sig[1]}, hi[2] = {sig[0], sig[1]};
  {
    Group g;
    comm.allReduce(lo, lo, 2, DataType::Int64, ReduceOp::Min);
    comm.allReduce(hi, hi, 2, DataType::Int64, ReduceOp::Max);
    g.end();
  }
  if (lo[0] != hi[0] || lo[1] != hi[1])
    throw Error(chorusInvalidUsage,
                "Reducer on " + rankText(comm) + ": the ranks registered different parameters (" +
                    (lo[0] != hi[0] ? "counts from " + std::to_string(lo[0]) + " to " + std::to_string(hi[0])
                                    : std::string("same count, different sizes or types")) +
                    ")");
  std::vector<size_t> order(impl_->params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  impl_->build(order);
  impl_->ready.assign(impl_->params.size(), 0);
}

Reducer::~Reducer() {
  if (impl_ && impl_->inBackward) impl_->waitLaunched();
}

void Reducer::setRequireSync(bool sync) {
  if (impl_->inBackward) throw Error(chorusInvalidUsage, "Reducer::setRequireSync inside a backward pass");
  impl_->sync = sync;
}
bool Reducer::requireSync() const { return impl_->sync; }

void Reducer::prepareForBackward() {
  Impl& s = *impl_;
  if (s.inBackward)
    throw Error(chorusInvalidUsage, "Reducer::prepareForBackward on " + rankText(s.comm) +
                                        ": the previous backward pass was not finished (finishBackward)");
  if (!s.sync) return;
  s.inBackward = true;
  s.nextLaunch = 0;
  s.arrival.clear();
  std::fill(s.ready.begin(), s.ready.end(), 0);
  for (Bucket& b : s.buckets) {
    b.pending = b.params.size();
    b.launched = b.done = false;
    b.work = Work();
  }
}

void Reducer::markGradReady(size_t index) {
  Impl& s = *impl_;
  if (index >= s.params.size())
    throw Error(chorusInvalidArgument, "Reducer::markGradReady: index " + std::to_string(index) + " of " +
                                           std::to_string(s.params.size()) + " parameters");
  if (!s.sync) return;
  if (!s.inBackward)
    throw Error(chorusInvalidUsage, "Reducer::markGradReady('" + s.params[index].name +
                                        "') outside a backward pass (call prepareForBackward first)");
  if (s.ready[index])
    throw Error(chorusInvalidUsage, "Reducer::markGradReady: parameter '" + s.params[index].name + "' on " +
                                        rankText(s.comm) + " was marked ready twice in one backward pass");
  s.fill(index, false);
  s.arrival.push_back(index);
  s.launchReady();
  s.pollDone();
}

void Reducer::finishBackward() {
  Impl& s = *impl_;
  if (!s.sync) return;
  if (!s.inBackward) throw Error(chorusInvalidUsage, "Reducer::finishBackward without prepareForBackward");
  const auto backwardEnd = Clock::now();
  std::vector<size_t> missing;
  for (size_t i = 0; i < s.params.size(); ++i)
    if (!s.ready[i]) missing.push_back(i);

  if (!missing.empty() && !s.options.findUnusedParameters) {
    const std::string cause = s.waitLaunched();
    s.inBackward = false;
    std::string names;
    for (size_t k = 0; k < missing.size() && k < 8; ++k)
      names += (k ? ", '" : "'") + s.params[missing[k]].name + "'";
    if (missing.size() > 8) names += " and " + std::to_string(missing.size() - 8) + " more";
    std::string msg = "Reducer::finishBackward on " + rankText(s.comm) + ": " +
                      std::to_string(missing.size()) +
                      " parameter(s) produced no gradient in this backward pass: " + names +
                      ". Their buckets cannot be reduced, so the communicator was aborted (the other ranks "
                      "fail instead of waiting). If parameters are unused by design, set "
                      "ReducerOptions::findUnusedParameters";
    if (!cause.empty()) msg += " (an earlier bucket also failed: " + cause + ")";
    s.comm.abort();
    throw Error(chorusInvalidUsage, msg);
  }

  std::vector<uint8_t> used;
  Work usedWork;
  if (s.options.findUnusedParameters) {
    used.assign(s.ready.begin(), s.ready.end());
    for (size_t i : missing) s.fill(i, true);
    s.launchReady();
    // Every rank issues this after all its buckets, so the order of collectives agrees.
    usedWork = s.comm.allReduceAsync(used.data(), used.data(), used.size(), DataType::Uint8, ReduceOp::Max);
  }
  const std::string err = s.waitLaunched();
  std::string usedErr;
  if (s.options.findUnusedParameters) {
    try {
      usedWork.wait();
    } catch (const std::exception& e) {
      usedErr = e.what();
    }
  }
  s.inBackward = false;
  if (!err.empty()) throw Error(s.comm.asyncError() ? s.comm.asyncError() : chorusSystemError, err);
  if (!usedErr.empty()) throw Error(chorusSystemError, usedErr);

  for (Bucket& b : s.buckets) {
    const size_t es = dataTypeSize(b.type);
    for (size_t k = 0; k < b.params.size(); ++k)
      std::memcpy(s.params[b.params[k]].grad, b.bytes() + b.offsets[k] * es,
                  s.params[b.params[k]].count * es);
  }
  s.unused.clear();
  for (size_t i = 0; i < used.size(); ++i)
    if (!used[i]) s.unused.push_back(i);

  Stats st;
  st.buckets = s.buckets.size();
  Clock::time_point prevDone{};
  for (Bucket& b : s.buckets) {
    st.bytes += b.count * dataTypeSize(b.type);
    const Clock::time_point start = std::max(b.launchedAt, prevDone);
    if (b.doneAt > start) {
      st.commBusy += b.doneAt - start;
      if (b.doneAt > backwardEnd) st.exposed += b.doneAt - std::max(start, backwardEnd);
    }
    prevDone = std::max(prevDone, b.doneAt);
  }
  s.stats = st;

  if (s.options.rebuildBuckets && !s.rebuilt) {
    s.rebuilt = true;
    std::vector<int64_t> order;
    for (size_t i : s.arrival) order.push_back(static_cast<int64_t>(i));
    for (size_t i : missing) order.push_back(static_cast<int64_t>(i));
    // Rank 0's order for everyone: local arrival orders may differ.
    s.comm.broadcast(order.data(), order.data(), order.size(), DataType::Int64, 0);
    std::vector<uint8_t> seen(s.params.size(), 0);
    std::vector<size_t> rebuiltOrder;
    for (int64_t v : order) {
      if (v < 0 || static_cast<size_t>(v) >= s.params.size() || seen[v])
        throw Error(chorusInvalidUsage,
                    "Reducer: " + rankText(s.comm) +
                        " got a bucket order from rank 0 that is not a permutation of its " +
                        std::to_string(s.params.size()) +
                        " parameters: the ranks registered different parameters");
      seen[v] = 1;
      rebuiltOrder.push_back(static_cast<size_t>(v));
    }
    s.build(rebuiltOrder);
  }
}

std::vector<std::vector<size_t>> Reducer::bucketLayout() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : impl_->buckets) out.push_back(b.params);
  return out;
}

std::vector<size_t> Reducer::unusedParameters() const { return impl_->unused; }

Reducer::Stats Reducer::lastStats() const { return impl_->stats; }

}  // namespace chorus::train
