// The chorus backend's point-to-point calls on CPU tensors: the queue that batches sends and
// receives into one Chorus group on the worker, and their Work. The engine that matches tags is in
// p2p.cpp.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "chorus/chorus.h"
#include "work.hpp"

namespace chorus_torch::detail {

// ---- Point to point with tags ------------------------------------------------------------------
//
// Chorus matches the messages between two ranks in order. torch (like gloo and MPI) matches a
// receive to the first message from its source with its tag. So every message carries an envelope
// (tag, bytes) sent just before it; a batch of queued receives is posted in order, and after it
// the worker moves each message to the first receive of that source and tag that is still open.
// A message no open receive wants waits in an unexpected list for a later receive; a receive
// whose buffer held another tag's message is posted again. So receives of one size may be posted in
// any tag order. A receive of one size that meets a message of another (receives of different sizes
// posted in another tag order than the sends) fails with Chorus's size mismatch and a hint saying so.

struct Envelope {
  int64_t tag;
  int64_t bytes;
};

struct P2pOp {
  bool isSend;
  at::Tensor tensor;  // the user's tensor
  int peer;
  int64_t tag;
  c10::intrusive_ptr<AsyncWork> work;
};

class P2pEngine;  // p2p.cpp

// Point-to-point calls wait here and run together, as one Chorus group on the worker, when one of
// their Works is waited for, at endCoalescing, or before the next collective. So irecv-then-isend on
// two ranks, or a batch_isend_irecv list, progress together instead of each blocking the other.
class P2pQueue {
 public:
  P2pQueue(chorusComm_t comm, Worker* worker);
  void add(P2pOp op);
  void flush();
  void detach();

 private:
  std::mutex mu_;
  std::vector<P2pOp> ops_;
  chorusComm_t comm_;
  Worker* worker_;
  std::shared_ptr<P2pEngine> engine_;
};

class P2pWork : public AsyncWork {
 public:
  P2pWork(std::shared_ptr<P2pQueue> queue, int rank, OpType type, const char* title,
          const std::vector<at::Tensor>& tensors, uint64_t seq)
      : AsyncWork(rank, type, title, tensors, tensors, seq), queue_(std::move(queue)) {}
  bool wait(std::chrono::milliseconds timeout) override {
    if (!isCompleted()) queue_->flush();
    return AsyncWork::wait(timeout);
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (!isCompleted()) queue_->flush();
    return future_;
  }

 private:
  std::shared_ptr<P2pQueue> queue_;
};

}  // namespace chorus_torch::detail
