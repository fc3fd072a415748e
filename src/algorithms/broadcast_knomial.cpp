// Broadcast, k-nomial tree (k = 4) from the root: every rank receives the message from its parent
// and forwards it to its children as the bytes arrive, so the message crosses ceil(log4(n)) levels
// pipelined at the granularity of the pipes' free space. The tree is patterns::knomialTree.
#include <cstring>

#include "algorithms/algorithm.hpp"
#include "algorithms/common.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/patterns/patterns.hpp"

namespace chorus::algo {

namespace {
constexpr int kBroadcastRadix = 4;
}

void broadcastKnomial(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int r = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const size_t bytes = op.count * elem;
  const patterns::TreeLinks links = patterns::knomialTree(ctx.size(), op.root, kBroadcastRadix, r);
  std::vector<engine::Transfer> ts;
  ts.reserve(links.children.size() + 1);
  const void* src = op.recv;
  int arrival = -1;  // the receive the forwarding sends are bound to
  if (r == op.root) {
    src = op.send;
    if (op.send != op.recv) ctx.localCopy(op.recv, op.send, bytes);
  } else {
    ts.push_back(engine::Transfer::recv(links.parent, op.recv, bytes, elem, ctx.tag()));
    arrival = 0;
  }
  for (int child : links.children) {
    engine::Transfer fwd = engine::Transfer::send(child, src, bytes, elem, ctx.tag());
    fwd.waitFor = arrival;
    ts.push_back(fwd);
  }
  ctx.run(ts);
}

// Depth ceil(log_4 n); the root serves up to (k - 1) d children.
double broadcastKnomialUs(const CostModel& m, const Op& op, int n) {
  const auto t = m.terms(op, n);
  const int d = ceilLog(n, kBroadcastRadix);
  return d * t.al + (kBroadcastRadix - 1) * d * t.B * t.wire;
}

}  // namespace chorus::algo
