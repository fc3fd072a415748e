// The chorus backend's tensor checks and reduction mapping (tensors.hpp): argument checks, the
// Chorus type and op of each torch reduction, the PREMUL_SUM scaling and bitwise folds, and the
// error check of every call into Chorus.
#include "tensors.hpp"

#include <algorithm>
#include <cctype>

namespace chorus_torch::detail {

thread_local void* tlsStream = nullptr;
void* callStream() { return tlsStream; }

// ---- Argument checks ---------------------------------------------------------------------------

void checkTensor(const at::Tensor& t, const char* call) {
  TORCH_CHECK(t.defined(), "chorus ", call, ": an undefined tensor");
  if (t.layout() != at::kStrided) {
    std::string layout = c10::str(t.layout());
    std::transform(layout.begin(), layout.end(), layout.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    TORCH_CHECK(false, "chorus ", call, ": a ", layout,
                " tensor: only dense (strided) tensors are supported; no data was read");
  }
#ifdef CHORUS_TORCH_CUDA
  if (t.is_cuda()) return;
#endif
  TORCH_CHECK(t.device().is_cpu(), "chorus ", call, ": a tensor on ", t.device(),
              ": this build of the chorus backend takes CPU"
#ifdef CHORUS_TORCH_CUDA
              " and CUDA"
#endif
              " tensors only (use \"cpu:chorus,cuda:nccl\")");
}

at::Device deviceOf(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const char* call) {
  std::optional<at::Device> dev;
  for (const auto* list : {&a, &b})
    for (const auto& t : *list) {
      if (!t.defined()) continue;
      if (!dev) dev = t.device();
      TORCH_CHECK(t.device() == *dev, "chorus ", call, ": tensors on ", *dev, " and ", t.device(),
                  " in one call; every tensor of a call must be on one device");
    }
  return dev.value_or(at::Device(at::kCPU));
}

void checkAll(const std::vector<at::Tensor>& ts, const char* call) {
  for (const auto& t : ts) checkTensor(t, call);
}

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* call) {
  TORCH_CHECK(tensors.size() == 1, "chorus ", call, ": one tensor per call, got ", tensors.size());
  checkTensor(tensors[0], call);
  return tensors[0];
}

void checkLike(const at::Tensor& t, const at::Tensor& like, const char* call) {
  checkTensor(t, call);
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.numel() == like.numel(), "chorus ", call,
              ": every tensor must have the input's type (", like.scalar_type(), ") and size (", like.numel(),
              " elements), not ", t.scalar_type(), " and ", t.numel());
}

// ---- Element types and reductions ---------------------------------------------------------------

std::string dtypeName(at::ScalarType s) { return "torch." + std::string(c10::getDtypeNames(s).first); }

std::optional<chorusDataType_t> reductionType(at::ScalarType s) {
  switch (s) {
    case at::kChar:
      return chorusInt8;
    case at::kByte:
    case at::kBool:
      return chorusUint8;
    case at::kInt:
      return chorusInt32;
    case at::kUInt32:
      return chorusUint32;
    case at::kLong:
      return chorusInt64;
    case at::kUInt64:
      return chorusUint64;
    case at::kHalf:
      return chorusFloat16;
    case at::kBFloat16:
      return chorusBfloat16;
    case at::kFloat:
    case at::kComplexFloat:
      return chorusFloat32;
    case at::kDouble:
    case at::kComplexDouble:
      return chorusFloat64;
    default:
      return std::nullopt;
  }
}

const char* opName(RedOp::RedOpType op) {
  switch (op) {
    case RedOp::SUM:
      return "SUM";
    case RedOp::AVG:
      return "AVG";
    case RedOp::PRODUCT:
      return "PRODUCT";
    case RedOp::MIN:
      return "MIN";
    case RedOp::MAX:
      return "MAX";
    case RedOp::BAND:
      return "BAND";
    case RedOp::BOR:
      return "BOR";
    case RedOp::BXOR:
      return "BXOR";
    case RedOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "an unknown op";
  }
}

Reduction reductionOf(const RedOp& rop, at::ScalarType s, const char* call) {
  const RedOp::RedOpType op = rop.op_;
  const auto type = reductionType(s);
  TORCH_CHECK(
      type.has_value(), "chorus ", call, ": reductions over ", dtypeName(s),
      " tensors are not supported (bool, int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, "
      "float32, float64 and complex are)");
  Reduction r;
  r.type = *type;
  r.complexPairs = at::isComplexType(s);
  const bool isBool = s == at::kBool;
  const bool isIntegral = at::isIntegralType(s, /*includeBool=*/false);
  auto refuse = [&](const char* why) {
    TORCH_CHECK(false, "chorus ", call, ": ReduceOp.", opName(op), " is not supported on ", dtypeName(s),
                " tensors (", why, ")");
  };
  if (r.complexPairs && op != RedOp::SUM && op != RedOp::AVG && op != RedOp::PREMUL_SUM)
    refuse("complex tensors take SUM, AVG and PREMUL_SUM");
  switch (op) {
    case RedOp::SUM:
      r.op = isBool ? chorusMax : chorusSum;  // logical or, as torch's backends do for bool
      break;
    case RedOp::PRODUCT:
      r.op = isBool ? chorusMin : chorusProd;  // logical and
      break;
    case RedOp::MIN:
      r.op = chorusMin;
      break;
    case RedOp::MAX:
      r.op = chorusMax;
      break;
    case RedOp::AVG:
      if (isBool) refuse("the average of booleans is not a boolean");
      r.op = chorusAvg;
      break;
    case RedOp::BAND:
    case RedOp::BOR:
    case RedOp::BXOR:
      if (!isBool && !isIntegral) refuse("bitwise ops take integer and bool tensors");
      if (isBool && op == RedOp::BAND) {
        r.op = chorusMin;
      } else if (isBool && op == RedOp::BOR) {
        r.op = chorusMax;
      } else {
        r.bitwise = op;
      }
      break;
    case RedOp::PREMUL_SUM: {
      if (!at::isFloatingType(s) && !r.complexPairs) refuse("PREMUL_SUM takes floating-point tensors");
      auto* sup = dynamic_cast<c10d::PreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK(sup != nullptr, "chorus ", call, ": ReduceOp.PREMUL_SUM without a factor");
      if (sup->tensor_factor.defined()) {
        checkTensor(sup->tensor_factor, call);
        TORCH_CHECK(sup->tensor_factor.numel() == 1, "chorus ", call,
                    ": a PREMUL_SUM factor tensor must hold one element, not ", sup->tensor_factor.numel());
        r.factorTensor = sup->tensor_factor;
      } else {
        r.factor = sup->double_factor;
      }
      r.op = chorusSum;
      break;
    }
    default:
      refuse("unknown op");
  }
  return r;
}

size_t reductionCount(const at::Tensor& t, const Reduction& r) {
  return static_cast<size_t>(t.numel()) * (r.complexPairs ? 2 : 1);
}

void premultiply(at::Tensor& t, const Reduction& r) {
  if (r.factor)
    t.mul_(*r.factor);
  else if (r.factorTensor.defined())
    t.mul_(r.factorTensor.to(t.scalar_type()));
}

bool premul(const Reduction& r) { return r.factor.has_value() || r.factorTensor.defined(); }

at::Tensor fold(const at::Tensor& stacked, RedOp::RedOpType op) {
  at::Tensor acc = stacked[0].clone();
  for (int64_t i = 1; i < stacked.size(0); ++i) {
    if (op == RedOp::BAND)
      acc.bitwise_and_(stacked[i]);
    else if (op == RedOp::BOR)
      acc.bitwise_or_(stacked[i]);
    else
      acc.bitwise_xor_(stacked[i]);
  }
  return acc;
}

// ---- Errors ------------------------------------------------------------------------------------

std::string timeoutText(chorusResult_t r) {
  // torch's tests and users look for "Timed out"; Chorus's detail (which ranks) follows.
  return r == chorusTimeout ? "Timed out waiting for peers: " : "";
}

void check(chorusComm_t comm, chorusResult_t r, const char* what) {
  if (r == chorusSuccess) return;
  const std::string msg = std::string("chorus ") + what + " failed (" + chorusGetErrorString(r) +
                          "): " + timeoutText(r) +
                          (comm ? chorusGetLastError(comm) : chorusGetLastError(nullptr));
  C10_THROW_ERROR(DistBackendError, msg);
}

}  // namespace chorus_torch::detail
