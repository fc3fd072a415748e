#include "algorithms/cost_model.hpp"

#include <cmath>
#include <cstring>

namespace chorus::algo {

namespace {

// floor(log2 n) and whether n is a power of two.
int floorLog2(int n) {
  int l = 0;
  while ((2 << l) <= n) ++l;
  return l;
}
int ceilLog(int n, int k) {
  int d = 0;
  for (long span = 1; span < n; span *= k) ++d;
  return d;
}

constexpr double kTreeChunkBytes = 128 * 1024;  // allreduce_tree.cpp
constexpr int kRadix = 4;                       // broadcast_knomial.cpp, reduce_knomial.cpp

}  // namespace

CostModel CostModel::forLinkClass(const std::string& linkClass) {
  CostModel m;
  m.linkClass = linkClass;
  if (linkClass == "shm-xnuma") {
    m.wireGBps = 1.0;
  } else if (linkClass == "network") {
    m.alphaUs = 25.0;
    m.wireGBps = 1.1;
  }
  return m;
}

double CostModel::predictUs(const Algorithm& a, const Op& op, int n) const {
  if (a.needsSharedMemory) return -1;
  const double B = static_cast<double>(op.messageBytes());
  const double wire = 1.0 / (wireGBps * 1e3);  // us per byte
  const double red = 1.0 / (reduceGBps * 1e3);
  const double al = alphaUs;
  const double fn = n;
  if (n <= 1) return 0;
  const int L = floorLog2(n);
  const bool pow2 = (1 << L) == n;
  const double p = static_cast<double>(1 << L);
  const std::string name = a.name;
  switch (op.kind) {
    case OpKind::AllReduce:
      if (name == "ring") return 2 * (fn - 1) * al + 2 * (fn - 1) / fn * B * wire + (fn - 1) / fn * B * red;
      if (name == "rd")
        return (L + (pow2 ? 0 : 2)) * al + (L + (pow2 ? 0 : 2)) * B * wire + (L + (pow2 ? 0 : 1)) * B * red;
      if (name == "rhd") {
        const double fold = pow2 ? 0 : 2 * al + 2 * B * wire + B * red;
        return fold + 2 * L * al + 2 * (p - 1) / p * B * wire + (p - 1) / p * B * red;
      }
      if (name == "tree") {
        const double h = std::ceil(std::log2(fn));
        const double chunks = std::ceil(B / 2 / kTreeChunkBytes);
        // Rounds of chunks moving up and down both trees. Each rank sends its half up each tree
        // (B in all), and where it is interior forwards that tree's half to two children (B) while
        // reducing what two children sent (B).
        return (chunks + 2 * h) * al + 2 * B * wire + B * red;
      }
      break;
    case OpKind::ReduceScatter:
      if (name == "ring") return (fn - 1) * (al + B * wire + B * red);
      break;
    case OpKind::AllGather:
      if (name == "ring") return (fn - 1) * (al + B * wire);
      break;
    case OpKind::Broadcast:
      if (name == "pipeline") return (fn - 1) * al + B * wire + (fn - 2) * al;
      if (name == "knomial") {
        const int d = ceilLog(n, kRadix);
        return d * al + (kRadix - 1) * d * B * wire;  // the root serves up to (k-1) d children
      }
      break;
    case OpKind::Reduce:
      if (name == "pipeline") return 2 * (fn - 1) * al + B * wire + B * red;
      if (name == "knomial") {
        const int d = ceilLog(n, kRadix);
        return d * al + (kRadix - 1) * d * B * (wire + red);
      }
      break;
    case OpKind::AllToAll:
      if (name == "pairwise") return (fn - 1) * (al + B * wire);
      break;
    case OpKind::AllToAllv:
      if (name == "pairwise") return (fn - 1) * al;
      break;
    case OpKind::Barrier:
      if (name == "pipes") return std::ceil(std::log2(fn)) * al;
      break;
    default:
      break;
  }
  return -1;
}

const Algorithm* cheapest(const CostModel& model, const Op& op, int n) {
  const Algorithm* best = nullptr;
  double bestUs = 0;
  for (const Algorithm& a : registry()) {
    if (a.kind != op.kind) continue;
    const double us = model.predictUs(a, op, n);
    if (us < 0) continue;
    if (!best || us < bestUs) {
      best = &a;
      bestUs = us;
    }
  }
  return best;
}

}  // namespace chorus::algo
