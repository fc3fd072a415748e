// The chorus backend's tensor checks and reduction mapping: what every call checks of its tensors,
// how a torch ReduceOp on a dtype becomes a Chorus reduction (or a gather and a fold), the
// contiguous stand-in for a strided tensor, and the error check of every call into Chorus.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

#include "chorus/chorus.h"

namespace chorus_torch::detail {

using RedOp = c10d::ReduceOp;

// The stream the worker passes to Chorus: NULL for CPU tensors, the caller's CUDA stream while
// the worker enqueues a CUDA call (set around each operation's body).
extern thread_local void* tlsStream;
void* callStream();

// ---- Argument checks ---------------------------------------------------------------------------

// Every tensor a call touches passes here before anything is read or queued.
void checkTensor(const at::Tensor& t, const char* call);
// The one device of every tensor of a call.
at::Device deviceOf(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const char* call);
void checkAll(const std::vector<at::Tensor>& ts, const char* call);
const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* call);
void checkLike(const at::Tensor& t, const at::Tensor& like, const char* call);

// ---- Element types and reductions ---------------------------------------------------------------

// "torch.int16", as Python users write the type.
std::string dtypeName(at::ScalarType s);
// The Chorus type of a reduction over `s`, or nullopt where Chorus has none. Complex numbers
// reduce as pairs of reals (sum and average only).
std::optional<chorusDataType_t> reductionType(at::ScalarType s);
const char* opName(RedOp::RedOpType op);

// How one reduction runs: a Chorus op on a Chorus type (after scaling by a PREMUL_SUM factor), or,
// for bitwise ops on integers, Chorus gathers every rank's data and each rank folds it
// (Chorus has no bitwise reductions; the gather moves world_size times the data).
struct Reduction {
  chorusDataType_t type = chorusFloat32;
  chorusRedOp_t op = chorusSum;
  bool complexPairs = false;
  std::optional<RedOp::RedOpType> bitwise;  // BAND, BOR or BXOR folded after a gather
  std::optional<double> factor;             // PREMUL_SUM with a scalar factor
  at::Tensor factorTensor;                  // PREMUL_SUM with a tensor factor
};

Reduction reductionOf(const RedOp& rop, at::ScalarType s, const char* call);

// The contiguous tensor an operation reads or writes in place of `t`: `t` itself, or a copy that
// write() copies back.
struct Dense {
  explicit Dense(const at::Tensor& user, bool copyIn = true)
      : user_(user),
        t(user.is_contiguous()
              ? user
              : (copyIn ? user.contiguous() : at::empty_like(user, at::MemoryFormat::Contiguous))) {}
  void write() {
    if (!t.is_same(user_)) user_.copy_(t);
  }
  at::Tensor user_;
  at::Tensor t;
};

// Chorus element count and type of a reduction buffer (complex: twice the reals).
size_t reductionCount(const at::Tensor& t, const Reduction& r);
// Scales `t` (contiguous, owned by the operation) for PREMUL_SUM.
void premultiply(at::Tensor& t, const Reduction& r);
bool premul(const Reduction& r);
// The bitwise fold (BAND, BOR or BXOR) of the rows of `stacked`, one per rank.
at::Tensor fold(const at::Tensor& stacked, RedOp::RedOpType op);

// ---- Errors ------------------------------------------------------------------------------------

std::string timeoutText(chorusResult_t r);
// Raises DistBackendError with Chorus's message unless `r` is chorusSuccess.
void check(chorusComm_t comm, chorusResult_t r, const char* what);

}  // namespace chorus_torch::detail
