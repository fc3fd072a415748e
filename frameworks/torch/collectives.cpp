// The chorus backend's collectives and barriers (ProcessGroupChorus's methods declared under
// "Collectives" in process_group_chorus.hpp): each checks its arguments on the caller's thread,
// then queues the body that calls Chorus; and the bodies several collectives share.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "process_group_chorus.hpp"
#include "tensors.hpp"

namespace chorus_torch {

using namespace detail;

namespace {

void allreduceNow(chorusComm_t c, const at::Tensor& t, const Reduction& red, int n, const char* call) {
  if (red.bitwise) {
    at::Tensor in = t.contiguous();
    at::Tensor all = at::empty({n, t.numel()}, t.options());
    check(c, chorusAllGather(in.data_ptr(), all.data_ptr(), in.nbytes(), chorusUint8, c, callStream()), call);
    at::Tensor(t).copy_(fold(all, *red.bitwise).view(t.sizes()));
    return;
  }
  Dense d(t, true);
  if (premul(red)) premultiply(d.t, red);
  check(c,
        chorusAllReduce(d.t.data_ptr(), d.t.data_ptr(), reductionCount(d.t, red), red.type, red.op, c,
                        callStream()),
        call);
  d.write();
}

void allgatherNow(chorusComm_t c, const at::Tensor& in, const at::Tensor& out, const char* call) {
  at::Tensor src = in.contiguous();
  Dense d(out, false);
  check(c, chorusAllGather(src.data_ptr(), d.t.data_ptr(), src.nbytes(), chorusUint8, c, callStream()), call);
  d.write();
}

// `in` holds n blocks of out's size; `owned` when `in` is a temporary the call may scale in place.
void reduceScatterNow(chorusComm_t c, const at::Tensor& in, const at::Tensor& out, const Reduction& red,
                      int me, int n, const char* call, bool owned) {
  if (red.bitwise) {
    at::Tensor src = in.contiguous();
    at::Tensor all = at::empty({n, in.numel()}, in.options());
    check(c, chorusAllGather(src.data_ptr(), all.data_ptr(), src.nbytes(), chorusUint8, c, callStream()),
          call);
    at::Tensor folded = fold(all, *red.bitwise);
    at::Tensor(out).copy_(folded.view({n, -1})[me].view(out.sizes()));
    return;
  }
  at::Tensor src = in.contiguous();
  if (premul(red)) {
    if (!owned && src.is_same(in)) src = src.clone();
    premultiply(src, red);
  }
  Dense d(out, false);
  check(c,
        chorusReduceScatter(src.data_ptr(), d.t.data_ptr(), reductionCount(d.t, red), red.type, red.op, c,
                            callStream()),
        call);
  d.write();
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  const at::Tensor t = single(tensors, "broadcast");
  checkRoot(opts.rootRank, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(OpType::BROADCAST, "chorus:broadcast", tensors, tensors, {opts.timeout, opts.asyncOp},
                 [t, root](chorusComm_t c) {
                   Dense d(t, true);
                   check(c,
                         chorusBroadcast(d.t.data_ptr(), d.t.data_ptr(), d.t.nbytes(), chorusUint8, root, c,
                                         callStream()),
                         "broadcast");
                   d.write();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].layout() == at::kSparse)
    return allreduceSparse(tensors, opts);
  const at::Tensor t = single(tensors, "all_reduce");
  const Reduction red = reductionOf(opts.reduceOp, t.scalar_type(), "all_reduce");
  const int n = getSize();
  return enqueue(OpType::ALLREDUCE, "chorus:all_reduce", tensors, tensors, {opts.timeout, opts.asyncOp},
                 [t, red, n](chorusComm_t c) { allreduceNow(c, t, red, n, "all_reduce"); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduceSparse(std::vector<at::Tensor>& tensors,
                                                                   const c10d::AllreduceOptions& opts) {
  const at::Tensor t = tensors[0];
  TORCH_CHECK(t.device().is_cpu(), "chorus all_reduce: sparse tensors on ", t.device(), " are not supported");
  TORCH_CHECK(opts.reduceOp == RedOp::SUM, "chorus all_reduce: sparse tensors take ReduceOp.SUM only, not ",
              opName(opts.reduceOp.op_));
  const int n = getSize();
  return enqueue(
      OpType::ALLREDUCE, "chorus:all_reduce", tensors, tensors, {opts.timeout, opts.asyncOp},
      [t, n](chorusComm_t c) {
        const at::Tensor in = t.coalesce();
        const at::Tensor idx = in._indices().contiguous(), val = in._values().contiguous();
        const int64_t nnz = idx.size(1);
        at::Tensor counts = at::empty({n}, at::kLong);
        check(c, chorusAllGather(&nnz, counts.data_ptr(), sizeof nnz, chorusUint8, c, callStream()),
              "all_reduce (sparse counts)");
        const int64_t most = counts.max().item<int64_t>();
        auto gather = [&](const at::Tensor& part, int64_t dim, const char* what) {
          // `part` padded to `most` along `dim`, gathered: n x its padded shape.
          std::vector<int64_t> shape(part.sizes().begin(), part.sizes().end());
          shape[dim] = most;
          at::Tensor padded = at::zeros(shape, part.options());
          padded.narrow(dim, 0, part.size(dim)).copy_(part);
          shape.insert(shape.begin(), n);
          at::Tensor all = at::empty(shape, part.options());
          check(c,
                chorusAllGather(padded.data_ptr(), all.data_ptr(), padded.nbytes(), chorusUint8, c,
                                callStream()),
                what);
          return all;
        };
        at::Tensor allIdx = gather(idx, 1, "all_reduce (sparse indices)");
        at::Tensor allVal = gather(val, 0, "all_reduce (sparse values)");
        std::vector<at::Tensor> idxs, vals;
        for (int r = 0; r < n; ++r) {
          const int64_t k = counts[r].item<int64_t>();
          idxs.push_back(allIdx[r].narrow(1, 0, k));
          vals.push_back(allVal[r].narrow(0, 0, k));
        }
        at::Tensor sum =
            at::sparse_coo_tensor(at::cat(idxs, 1), at::cat(vals, 0), t.sizes(), t.options()).coalesce();
        at::Tensor(t).copy_(sum);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "chorus allreduce_coalesced: no tensors");
  checkAll(tensors, "allreduce_coalesced");
  for (const auto& t : tensors)
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "chorus allreduce_coalesced: mixed types (",
                tensors[0].scalar_type(), " and ", t.scalar_type(), ")");
  const Reduction red = reductionOf(opts.reduceOp, tensors[0].scalar_type(), "allreduce_coalesced");
  const int n = getSize();
  return enqueue(OpType::ALLREDUCE_COALESCED, "chorus:all_reduce", tensors, tensors,
                 {opts.timeout, opts.asyncOp}, [tensors, red, n](chorusComm_t c) {
                   std::vector<at::Tensor> flat;
                   for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
                   at::Tensor all = at::cat(flat);
                   allreduceNow(c, all, red, n, "allreduce_coalesced");
                   int64_t offset = 0;
                   for (const auto& t : tensors) {
                     at::Tensor(t).copy_(all.narrow(0, offset, t.numel()).view(t.sizes()));
                     offset += t.numel();
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  const at::Tensor t = single(tensors, "reduce");
  checkRoot(opts.rootRank, "reduce");
  const Reduction red = reductionOf(opts.reduceOp, t.scalar_type(), "reduce");
  const int root = static_cast<int>(opts.rootRank), me = getRank(), n = getSize();
  return enqueue(
      OpType::REDUCE, "chorus:reduce", tensors, tensors, {opts.timeout, opts.asyncOp},
      [t, red, root, me, n](chorusComm_t c) {
        if (red.bitwise) {
          at::Tensor in = t.contiguous();
          at::Tensor all = at::empty({n, t.numel()}, t.options());
          check(c, chorusAllGather(in.data_ptr(), all.data_ptr(), in.nbytes(), chorusUint8, c, callStream()),
                "reduce");
          if (me == root) at::Tensor(t).copy_(fold(all, *red.bitwise).view(t.sizes()));
          return;
        }
        // A copy when scaling: only the root's tensor may change.
        Dense d(t, true);
        at::Tensor buf = premul(red) ? d.t.clone() : d.t;
        if (premul(red)) premultiply(buf, red);
        check(c,
              chorusReduce(buf.data_ptr(), buf.data_ptr(), reductionCount(buf, red), red.type, red.op, root,
                           c, callStream()),
              "reduce");
        if (me == root) {
          if (!buf.is_same(d.t)) d.t.copy_(buf);
          d.write();
        }
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  const at::Tensor in = single(inputs, "all_gather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
              "chorus all_gather: one list of ", getSize(), " output tensors expected");
  for (const auto& o : outputs[0]) checkLike(o, in, "all_gather");
  const std::vector<at::Tensor> outs = outputs[0];
  return enqueue(
      OpType::ALLGATHER, "chorus:all_gather", inputs, outs, {opts.timeout, opts.asyncOp},
      [in, outs](chorusComm_t c) {
        at::Tensor src = in.contiguous();
        at::Tensor flat = at::empty({static_cast<int64_t>(outs.size()), in.numel()}, in.options());
        check(c, chorusAllGather(src.data_ptr(), flat.data_ptr(), src.nbytes(), chorusUint8, c, callStream()),
              "all_gather");
        for (size_t r = 0; r < outs.size(); ++r)
          at::Tensor(outs[r]).copy_(flat[static_cast<int64_t>(r)].view(outs[r].sizes()));
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::all_gather_single(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::AllgatherOptions& opts) {
  checkTensor(input, "all_gather_into_tensor");
  checkTensor(output, "all_gather_into_tensor");
  TORCH_CHECK(output.numel() == input.numel() * getSize() && output.scalar_type() == input.scalar_type(),
              "chorus all_gather_into_tensor: the output must hold world_size (", getSize(), ") inputs of ",
              input.numel(), " ", input.scalar_type(), " elements, not ", output.numel(), " ",
              output.scalar_type());
  const at::Tensor in = input, out = output;
  return enqueue(OpType::_ALLGATHER_BASE, "chorus:all_gather_into_tensor", {input}, {output},
                 {opts.timeout, opts.asyncOp},
                 [in, out](chorusComm_t c) { allgatherNow(c, in, out, "all_gather_into_tensor"); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::all_gather_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  checkCoalesced(inputs, outputs, "all_gather_into_tensor_coalesced");
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(OpType::COALESCED, "chorus:all_gather_into_tensor_coalesced", inputs, outputs,
                 {opts.timeout, opts.asyncOp}, [ins, outs](chorusComm_t c) {
                   for (size_t i = 0; i < ins.size(); ++i)
                     allgatherNow(c, ins[i], outs[i], "all_gather_into_tensor_coalesced");
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(static_cast<int>(outputLists.size()) == getSize(), "chorus all_gather_coalesced: ", getSize(),
              " output lists expected, got ", outputLists.size());
  checkAll(inputs, "all_gather_coalesced");
  for (const auto& list : outputLists) {
    TORCH_CHECK(list.size() == inputs.size(), "chorus all_gather_coalesced: every output list needs ",
                inputs.size(), " tensors");
    for (size_t i = 0; i < list.size(); ++i) checkLike(list[i], inputs[i], "all_gather_coalesced");
  }
  TORCH_CHECK(!inputs.empty(), "chorus all_gather_coalesced: no tensors");
  const std::vector<at::Tensor> ins = inputs;
  const std::vector<std::vector<at::Tensor>> outs = outputLists;
  std::vector<at::Tensor> flatOuts;
  for (const auto& l : outputLists) flatOuts.insert(flatOuts.end(), l.begin(), l.end());
  return enqueue(
      OpType::ALLGATHER_COALESCED, "chorus:all_gather_coalesced", inputs, flatOuts,
      {opts.timeout, opts.asyncOp}, [ins, outs](chorusComm_t c) {
        // Every input as bytes in one buffer, gathered once.
        std::vector<at::Tensor> bytes;
        for (const auto& t : ins) bytes.push_back(t.contiguous().view({-1}).view(at::kByte));
        at::Tensor mine = at::cat(bytes);
        at::Tensor all = at::empty({static_cast<int64_t>(outs.size()), mine.numel()}, mine.options());
        check(c,
              chorusAllGather(mine.data_ptr(), all.data_ptr(), mine.nbytes(), chorusUint8, c, callStream()),
              "all_gather_coalesced");
        for (size_t r = 0; r < outs.size(); ++r) {
          int64_t off = 0;
          for (size_t i = 0; i < ins.size(); ++i) {
            const int64_t nb = static_cast<int64_t>(ins[i].nbytes());
            at::Tensor dst = outs[r][i];
            at::Tensor src = all[static_cast<int64_t>(r)].narrow(0, off, nb);
            dst.copy_(src.view(dst.scalar_type()).view(dst.sizes()));
            off += nb;
          }
        }
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const at::Tensor out = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "chorus reduce_scatter: one list of ", getSize(), " input tensors expected");
  for (const auto& i : inputs[0]) checkLike(i, out, "reduce_scatter");
  const Reduction red = reductionOf(opts.reduceOp, out.scalar_type(), "reduce_scatter");
  const std::vector<at::Tensor> ins = inputs[0];
  const int me = getRank(), n = getSize();
  return enqueue(OpType::REDUCE_SCATTER, "chorus:reduce_scatter", ins, outputs, {opts.timeout, opts.asyncOp},
                 [out, ins, red, me, n](chorusComm_t c) {
                   std::vector<at::Tensor> flat;
                   for (const auto& t : ins) flat.push_back(t.reshape({-1}));
                   reduceScatterNow(c, at::cat(flat), out, red, me, n, "reduce_scatter", true);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce_scatter_single(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  checkTensor(input, "reduce_scatter_tensor");
  checkTensor(output, "reduce_scatter_tensor");
  TORCH_CHECK(input.numel() == output.numel() * getSize() && output.scalar_type() == input.scalar_type(),
              "chorus reduce_scatter_tensor: the input must hold world_size (", getSize(), ") outputs of ",
              output.numel(), " ", output.scalar_type(), " elements, not ", input.numel(), " ",
              input.scalar_type());
  const Reduction red = reductionOf(opts.reduceOp, output.scalar_type(), "reduce_scatter_tensor");
  const at::Tensor in = input, out = output;
  const int me = getRank(), n = getSize();
  return enqueue(OpType::_REDUCE_SCATTER_BASE, "chorus:reduce_scatter_tensor", {input}, {output},
                 {opts.timeout, opts.asyncOp}, [in, out, red, me, n](chorusComm_t c) {
                   reduceScatterNow(c, in, out, red, me, n, "reduce_scatter_tensor", false);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce_scatter_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  checkCoalesced(outputs, inputs, "reduce_scatter_tensor_coalesced");
  std::vector<Reduction> reds;
  for (const auto& o : outputs)
    reds.push_back(reductionOf(opts.reduceOp, o.scalar_type(), "reduce_scatter_tensor_coalesced"));
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  const int me = getRank(), n = getSize();
  return enqueue(OpType::COALESCED, "chorus:reduce_scatter_tensor_coalesced", inputs, outputs,
                 {opts.timeout, opts.asyncOp}, [ins, outs, reds, me, n](chorusComm_t c) {
                   for (size_t i = 0; i < ins.size(); ++i)
                     reduceScatterNow(c, ins[i], outs[i], reds[i], me, n, "reduce_scatter_tensor_coalesced",
                                      false);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                                     std::vector<int64_t>& outSplits,
                                                                     std::vector<int64_t>& inSplits,
                                                                     const c10d::AllToAllOptions& opts) {
  checkTensor(input, "all_to_all_single");
  checkTensor(output, "all_to_all_single");
  const int n = getSize();
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "chorus all_to_all_single: input (",
              input.scalar_type(), ") and output (", output.scalar_type(), ") types differ");
  const at::Tensor in = input, out = output;
  if (outSplits.empty() && inSplits.empty()) {
    const int64_t rows = input.dim() > 0 ? input.size(0) : 0;
    TORCH_CHECK(input.numel() == output.numel() && rows % n == 0,
                "chorus all_to_all_single: equal splits need input and output of the same size, with a first "
                "dimension divisible by ",
                n);
    return enqueue(OpType::ALLTOALL_BASE, "chorus:all_to_all", {input}, {output},
                   {opts.timeout, opts.asyncOp}, [in, out, n](chorusComm_t c) {
                     at::Tensor src = in.contiguous();
                     Dense d(out, false);
                     check(c,
                           chorusAllToAll(src.data_ptr(), d.t.data_ptr(), src.nbytes() / n, chorusUint8, c,
                                          callStream()),
                           "all_to_all_single");
                     d.write();
                   });
  }
  TORCH_CHECK((outSplits.empty() || static_cast<int>(outSplits.size()) == n) &&
                  (inSplits.empty() || static_cast<int>(inSplits.size()) == n),
              "chorus all_to_all_single: split sizes must have ", n, " entries");
  // Splits count rows (the first dimension); they must be non-negative and add up to it.
  auto counts = [&](const std::vector<int64_t>& splits, const at::Tensor& t, std::vector<size_t>& cnt,
                    std::vector<size_t>& disp, const char* which) {
    TORCH_CHECK(t.dim() > 0, "chorus all_to_all_single: uneven splits need a tensor with dimensions");
    const int64_t rows = t.size(0);
    const int64_t rowBytes = rows > 0 ? static_cast<int64_t>(t.nbytes()) / rows : 0;
    TORCH_CHECK(!splits.empty() || rows % n == 0, "chorus all_to_all_single: ", which, " has ", rows,
                " rows, not divisible by ", n);
    int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      const int64_t sz = splits.empty() ? rows / n : splits[r];
      TORCH_CHECK(sz >= 0, "chorus all_to_all_single: negative split size");
      disp.push_back(static_cast<size_t>(total * rowBytes));
      cnt.push_back(static_cast<size_t>(sz * rowBytes));
      total += sz;
    }
    TORCH_CHECK(total == rows, "chorus all_to_all_single: ", which, " splits add up to ", total,
                " rows, not ", rows);
  };
  std::vector<size_t> sc, sd, rc, rd;
  counts(inSplits, input, sc, sd, "the input");
  counts(outSplits, output, rc, rd, "the output");
  return enqueue(OpType::ALLTOALL_BASE, "chorus:all_to_all", {input}, {output}, {opts.timeout, opts.asyncOp},
                 [in, out, sc, sd, rc, rd](chorusComm_t c) {
                   at::Tensor src = in.contiguous();
                   Dense d(out, false);
                   check(c,
                         chorusAllToAllv(src.data_ptr(), sc.data(), sd.data(), d.t.data_ptr(), rc.data(),
                                         rd.data(), chorusUint8, c, callStream()),
                         "all_to_all_single");
                   d.write();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  const int n = getSize();
  TORCH_CHECK(static_cast<int>(outputs.size()) == n && static_cast<int>(inputs.size()) == n,
              "chorus all_to_all: ", n, " input and output tensors expected");
  std::vector<size_t> sc, sd, rc, rd;
  for (int r = 0; r < n; ++r) {
    checkTensor(inputs[r], "all_to_all");
    checkTensor(outputs[r], "all_to_all");
    TORCH_CHECK(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                    outputs[r].scalar_type() == inputs[0].scalar_type(),
                "chorus all_to_all: every tensor must have the same type");
    sd.push_back(r == 0 ? 0 : sd.back() + sc.back());
    sc.push_back(inputs[r].nbytes());
    rd.push_back(r == 0 ? 0 : rd.back() + rc.back());
    rc.push_back(outputs[r].nbytes());
  }
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(OpType::ALLTOALL, "chorus:all_to_all", inputs, outputs, {opts.timeout, opts.asyncOp},
                 [ins, outs, sc, sd, rc, rd](chorusComm_t c) {
                   std::vector<at::Tensor> bytes;
                   for (const auto& t : ins) bytes.push_back(t.contiguous().view({-1}).view(at::kByte));
                   at::Tensor in = at::cat(bytes);
                   at::Tensor out = at::empty({static_cast<int64_t>(rd.back() + rc.back())}, in.options());
                   check(c,
                         chorusAllToAllv(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(),
                                         rd.data(), chorusUint8, c, callStream()),
                         "all_to_all");
                   for (size_t r = 0; r < outs.size(); ++r) {
                     at::Tensor dst = outs[r];
                     dst.copy_(out.narrow(0, static_cast<int64_t>(rd[r]), static_cast<int64_t>(rc[r]))
                                   .view(dst.scalar_type())
                                   .view(dst.sizes()));
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  const at::Tensor in = single(inputs, "gather");
  checkRoot(opts.rootRank, "gather");
  const int root = static_cast<int>(opts.rootRank), me = getRank();
  const bool isRoot = me == root;
  if (isRoot) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "chorus gather: the root needs one list of ", getSize(), " output tensors");
    for (const auto& o : outputs[0]) checkLike(o, in, "gather");
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "chorus gather: rank ", me,
                " is not the root (", root, ") and takes no output list");
  }
  const std::vector<at::Tensor> outs = isRoot ? outputs[0] : std::vector<at::Tensor>{};
  return enqueue(OpType::GATHER, "chorus:gather", inputs, outs, {opts.timeout, opts.asyncOp},
                 [in, outs, root, me](chorusComm_t c) {
                   at::Tensor src = in.contiguous();
                   std::vector<at::Tensor> dense;
                   chorusResult_t first = chorusSuccess;
                   {
                     GroupGuard group;
                     check(c, group.startResult(), "gather");
                     if (me == root) {
                       for (size_t r = 0; r < outs.size(); ++r) {
                         dense.push_back(outs[r].is_contiguous()
                                             ? outs[r]
                                             : at::empty_like(outs[r], at::MemoryFormat::Contiguous));
                         if (static_cast<int>(r) == root)
                           dense[r].copy_(src.view(outs[r].sizes()));
                         else if (first == chorusSuccess)
                           first = chorusRecv(dense[r].data_ptr(), dense[r].nbytes(), chorusUint8,
                                              static_cast<int>(r), c, callStream());
                       }
                     } else {
                       first = chorusSend(src.data_ptr(), src.nbytes(), chorusUint8, root, c, callStream());
                     }
                     const chorusResult_t end = group.end();
                     check(c, first, "gather");
                     check(c, end, "gather");
                   }
                   for (size_t r = 0; r < dense.size(); ++r)
                     if (!dense[r].is_same(outs[r])) at::Tensor(outs[r]).copy_(dense[r]);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  const at::Tensor out = single(outputs, "scatter");
  checkRoot(opts.rootRank, "scatter");
  const int root = static_cast<int>(opts.rootRank), me = getRank();
  const bool isRoot = me == root;
  if (isRoot) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "chorus scatter: the root needs one list of ", getSize(), " input tensors");
    for (const auto& i : inputs[0]) checkLike(i, out, "scatter");
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "chorus scatter: rank ", me,
                " is not the root (", root, ") and takes no input list");
  }
  const std::vector<at::Tensor> ins = isRoot ? inputs[0] : std::vector<at::Tensor>{};
  return enqueue(OpType::SCATTER, "chorus:scatter", ins, outputs, {opts.timeout, opts.asyncOp},
                 [out, ins, root, me](chorusComm_t c) {
                   Dense d(out, false);
                   std::vector<at::Tensor> srcs;
                   for (const auto& t : ins) srcs.push_back(t.contiguous());
                   chorusResult_t first = chorusSuccess;
                   GroupGuard group;
                   check(c, group.startResult(), "scatter");
                   if (me == root) {
                     for (size_t r = 0; r < srcs.size(); ++r) {
                       if (static_cast<int>(r) == root)
                         d.t.copy_(srcs[r].view(d.t.sizes()));
                       else if (first == chorusSuccess)
                         first = chorusSend(srcs[r].data_ptr(), srcs[r].nbytes(), chorusUint8,
                                            static_cast<int>(r), c, callStream());
                     }
                   } else {
                     first = chorusRecv(d.t.data_ptr(), d.t.nbytes(), chorusUint8, root, c, callStream());
                   }
                   const chorusResult_t end = group.end();
                   check(c, first, "scatter");
                   check(c, end, "scatter");
                   d.write();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::barrier(const c10d::BarrierOptions& opts) {
  return enqueue(OpType::BARRIER, "chorus:barrier", {}, {}, {opts.timeout, opts.asyncOp},
                 [](chorusComm_t c) { check(c, chorusBarrier(c, callStream()), "barrier"); });
}

void ProcessGroupChorus::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? options_->timeout : opts.timeout;
  const uint64_t round = monitoredRound_++;
  const std::string base = "chorus/monitored_barrier/" + std::to_string(round) + "/";
  const int me = getRank(), n = getSize();
  withoutGil([&] {
    if (me != 0) {
      store_->set(base + std::to_string(me), std::vector<uint8_t>{1});
      try {
        store_->wait({base + "done"}, timeout);
      } catch (const std::exception& e) {
        TORCH_CHECK(false, "Rank ", me,
                    " successfully reached monitoredBarrier, but received errors while waiting "
                    "for send/recv from rank 0. Please check rank 0 logs for faulty rank. (chorus: Timed "
                    "out after ",
                    timeout.count(), " ms: ", e.what(), ")");
      }
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    std::vector<int> missing;
    for (int r = 1; r < n; ++r) {
      const auto left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::steady_clock::now() - start);
      if (left.count() <= 0 && !waitAllRanks)
        TORCH_CHECK(false, "Rank 0 timed out in monitoredBarrier after ", timeout.count(), " ms (chorus)");
      bool arrived = false;
      try {
        store_->wait({base + std::to_string(r)}, std::max(left, std::chrono::milliseconds(1)));
        arrived = true;
      } catch (const std::exception&) {
      }
      if (!arrived) {
        missing.push_back(r);
        if (!waitAllRanks) break;
      }
    }
    if (!missing.empty()) {
      std::string list;
      for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
      TORCH_CHECK(false, missing.size() == 1 ? "Rank " : "Ranks ", list,
                  " failed to pass monitoredBarrier in ", timeout.count(), " ms (chorus: Timed out)");
    }
    store_->set(base + "done", std::vector<uint8_t>{1});
  });
}

void ProcessGroupChorus::checkCoalesced(const std::vector<at::Tensor>& small,
                                        const std::vector<at::Tensor>& large, const char* call) const {
  TORCH_CHECK(small.size() == large.size(), "chorus ", call, ": ", small.size(), " and ", large.size(),
              " tensors: one of each per pair");
  for (size_t i = 0; i < small.size(); ++i) {
    checkTensor(small[i], call);
    checkTensor(large[i], call);
    TORCH_CHECK(
        large[i].numel() == small[i].numel() * getSize() && large[i].scalar_type() == small[i].scalar_type(),
        "chorus ", call, ": pair ", i, " must be a tensor and one of world_size (", getSize(),
        ") times its size and of its type, not ", small[i].numel(), " and ", large[i].numel(), " elements");
  }
}

void ProcessGroupChorus::checkRoot(int64_t root, const char* call) const {
  TORCH_CHECK(root >= 0 && root < getSize(), "chorus ", call, ": root ", root,
              " is not a rank of this group of ", getSize());
}
}  // namespace chorus_torch
