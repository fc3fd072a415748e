#include "chorus/train/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <string>

namespace chorus::train {

std::vector<PipelineAction> pipelineActions(PipelineSchedule schedule, int stages, int stage,
                                            int microBatches) {
  if (stages < 1 || stage < 0 || stage >= stages || microBatches < 1)
    throw Error(chorusInvalidArgument, "pipelineActions: stage " + std::to_string(stage) + " of " +
                                           std::to_string(stages) + " with " + std::to_string(microBatches) +
                                           " micro-batches");
  using K = PipelineAction::Kind;
  std::vector<PipelineAction> out;
  if (schedule == PipelineSchedule::GPipe) {
    for (int i = 0; i < microBatches; ++i) out.push_back({K::Forward, i});
    for (int i = 0; i < microBatches; ++i) out.push_back({K::Backward, i});
    return out;
  }
  const int warmup = std::min(stages - stage - 1, microBatches);
  for (int i = 0; i < warmup; ++i) out.push_back({K::Forward, i});
  for (int i = 0; i < microBatches - warmup; ++i) {
    out.push_back({K::Forward, warmup + i});
    out.push_back({K::Backward, i});
  }
  for (int i = microBatches - warmup; i < microBatches; ++i) out.push_back({K::Backward, i});
  return out;
}

PipelineStage::PipelineStage(Communicator& pipeline, DataType type, size_t boundaryCount)
    : pp_(&pipeline), type_(type), count_(boundaryCount) {
  if (boundaryCount == 0 && pipeline.size() > 1)
    throw Error(chorusInvalidArgument, "PipelineStage: zero elements at the stage boundary");
}

PipelineStats PipelineStage::run(PipelineSchedule schedule, int microBatches, const ForwardFn& forward,
                                 const BackwardFn& backward) {
  using Clock = std::chrono::steady_clock;
  using K = PipelineAction::Kind;
  const int p = pp_->size(), s = pp_->rank();
  const bool first = s == 0, last = s == p - 1;
  const auto actions = pipelineActions(schedule, p, s, microBatches);
  const size_t bytes = count_ * dataTypeSize(type_);

  // Buffers per micro-batch: the received activation stays until that micro-batch's backward.
  std::vector<std::vector<std::byte>> in(microBatches), out(microBatches), gradIn(microBatches);
  std::vector<std::byte> gradOut(last ? 0 : bytes);

  PipelineStats st;
  const auto start = Clock::now();
  int inFlight = 0;

  // A send left over from the previous step, issued together with the next step's receive.
  struct Pending {
    const void* buf = nullptr;
    int peer = -1;
  } pending;
  auto communicate = [&](void* recvBuf, int recvPeer) {
    if (!pending.buf && !recvBuf) return;
    Group g;
    if (pending.buf) pp_->send(pending.buf, count_, type_, pending.peer);
    if (recvBuf) pp_->recv(recvBuf, count_, type_, recvPeer);
    g.end();
    pending = {};
  };

  for (const PipelineAction& a : actions) {
    const int mb = a.microBatch;
    if (a.kind == K::Forward) {
      if (!first) in[mb].resize(bytes);
      communicate(first ? nullptr : in[mb].data(), s - 1);
      if (!last) out[mb].resize(bytes);
      const auto t0 = Clock::now();
      forward(mb, first ? nullptr : in[mb].data(), last ? nullptr : out[mb].data());
      st.busySeconds += std::chrono::duration<double>(Clock::now() - t0).count();
      st.peakInFlight = std::max(st.peakInFlight, ++inFlight);
      if (!last) pending = {out[mb].data(), s + 1};
    } else {
      communicate(last ? nullptr : gradOut.data(), s + 1);
      if (!first) gradIn[mb].resize(bytes);
      const auto t0 = Clock::now();
      backward(mb, last ? nullptr : gradOut.data(), first ? nullptr : gradIn[mb].data());
      st.busySeconds += std::chrono::duration<double>(Clock::now() - t0).count();
      --inFlight;
      // The activation is no longer needed.
      std::vector<std::byte>().swap(in[mb]);
      if (!first) pending = {gradIn[mb].data(), s - 1};
    }
    // Outputs and input gradients already sent can go: a send completes within its group.
    for (int i = 0; i < microBatches; ++i) {
      if (!out[i].empty() && pending.buf != out[i].data()) std::vector<std::byte>().swap(out[i]);
      if (!gradIn[i].empty() && pending.buf != gradIn[i].data()) std::vector<std::byte>().swap(gradIn[i]);
    }
  }
  communicate(nullptr, -1);
  st.totalSeconds = std::chrono::duration<double>(Clock::now() - start).count();
  return st;
}

}  // namespace chorus::train
