// AllReduce, double binary tree (as NCCL's tree algorithm): the message is cut in two halves and
// half w is reduced up tree w of patterns::doubleBinaryTree and broadcast back down it. Every rank
// is an interior node of at most one tree, so the two halves load the ranks' links about equally,
// and the latency grows with log2(n) instead of n as in the ring.
//
// Each half is cut into chunks that move in lockstep rounds, both trees together. With h(x) the
// height of rank x in a tree (0 for a leaf) and H the root's, in round t:
//   - up: rank x sends chunk t - h(x) (reduced over its subtree) to its parent, which reduces it
//     into its output (its accumulator; the final result overwrites it later);
//   - down: chunk t - H travels from the root to every rank in the same round, each rank forwarding
//     bytes to its children as they arrive (a send bound to the receive's progress).
// A chunk is complete at x when its children's rounds (t - h(child) <= t - h(x) + 1) are over, so
// every round only needs what earlier rounds produced, and every transfer's counterpart is in the
// same round at the peer: one engine run per round, rounds = chunks + H.
//
// A rank's two children of equal height deliver the same chunk in the same round: the first is
// reduced on arrival, the second lands in scratch and is reduced after the round. Transfers are
// listed tree 0 first, so two transfers on one pipe (a link used by both trees) are in the same
// order on both ends.
#include <algorithm>
#include <utility>

#include "algorithms/algorithm.hpp"
#include "algorithms/common.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/patterns/patterns.hpp"

namespace chorus::algo {

namespace {

constexpr size_t kChunkBytes = size_t{128} << 10;  // without a cost model

// One tree of the double binary tree, with every rank's height.
struct Tree {
  int root = 0;
  std::vector<patterns::TreeLinks> links;
  std::vector<int> height;
};

void computeHeights(Tree& t) {
  // Ranks in breadth-first order from the root; heights from the last (deepest) back.
  std::vector<int> order{t.root};
  for (size_t i = 0; i < order.size(); ++i) {
    for (int c : t.links[static_cast<size_t>(order[i])].children) order.push_back(c);
  }
  t.height.assign(t.links.size(), 0);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    int h = 0;
    for (int c : t.links[static_cast<size_t>(*it)].children)
      h = std::max(h, t.height[static_cast<size_t>(c)] + 1);
    t.height[static_cast<size_t>(*it)] = h;
  }
}

// The elements one tree carries, in chunks.
struct Part {
  size_t lo = 0, elems = 0, chunkElems = 1, chunks = 0;
  // Chunk number round - height, if that is a chunk: its first element and length.
  bool chunkAt(long round, int height, size_t* off, size_t* len) const {
    const long c = round - height;
    if (c < 0 || static_cast<size_t>(c) >= chunks) return false;
    *off = lo + static_cast<size_t>(c) * chunkElems;
    *len = std::min(chunkElems, lo + elems - *off);
    return true;
  }
};

// A reduction done after the round's transfers: out[off, off+len) op= tmp.
struct Deferred {
  size_t off, len;
  const std::byte* tmp;
  int div;
};

}  // namespace

void allReduceTree(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  const int n = ctx.size(), r = ctx.rank();
  const auto me = static_cast<size_t>(r);
  const size_t elem = dataTypeSize(op.type);
  const size_t line = cacheLineElems(elem);
  // The chunk size is the cost model's pipelining optimum for this size and rank count.
  const algo::CostModel* model = ctx.costModel();
  const size_t chunkBytes = model ? model->treeChunkBytes(op.count * elem, n) : kChunkBytes;
  const size_t chunkElems = std::max(line, chunkBytes / elem / line * line);

  Tree trees[2];
  for (int w = 0; w < 2; ++w) {
    trees[w].root = patterns::doubleBinaryTreeRoot(n, w);
    trees[w].links.resize(static_cast<size_t>(n));
  }
  for (int q = 0; q < n; ++q) {
    patterns::DoubleTree d = patterns::doubleBinaryTree(n, q);
    for (int w = 0; w < 2; ++w) trees[w].links[static_cast<size_t>(q)] = std::move(d.tree[w]);
  }
  const size_t half = patterns::blockBoundary(op.count, 2, 1, line);
  Part parts[2];
  parts[0].lo = 0;
  parts[0].elems = half;
  parts[1].lo = half;
  parts[1].elems = op.count - half;
  long rounds = 0;
  for (int w = 0; w < 2; ++w) {
    computeHeights(trees[w]);
    parts[w].chunkElems = chunkElems;
    parts[w].chunks = (parts[w].elems + chunkElems - 1) / chunkElems;
    if (parts[w].chunks) {
      rounds = std::max(
          rounds, static_cast<long>(parts[w].chunks) + trees[w].height[static_cast<size_t>(trees[w].root)]);
    }
  }

  const int avgDiv = avgDivisor(op, n);
  std::byte* tmpBase = ctx.scratch(2 * chunkElems * elem);
  const void* in = op.send;
  void* out = op.recv;
  std::vector<engine::Transfer> ts;
  std::vector<Deferred> deferred;
  for (long t = 0; t < rounds; ++t) {
    ts.clear();
    deferred.clear();
    for (int w = 0; w < 2; ++w) {
      const Part& part = parts[w];
      if (!part.chunks) continue;
      const Tree& tree = trees[w];
      const patterns::TreeLinks& links = tree.links[me];
      const bool isRoot = r == tree.root;
      const int h = tree.height[me];
      const int rootHeight = tree.height[static_cast<size_t>(tree.root)];
      size_t off = 0, len = 0;
      // Up: reduce what the children send this round.
      const size_t nc = links.children.size();
      for (size_t i = 0; i < nc; ++i) {
        const int child = links.children[i];
        const int hc = tree.height[static_cast<size_t>(child)];
        if (!part.chunkAt(t, hc, &off, &len)) continue;
        bool earlier = false, sameBefore = false, sameAfter = false, later = false;
        for (size_t j = 0; j < nc; ++j) {
          if (j == i) continue;
          const int hj = tree.height[static_cast<size_t>(links.children[j])];
          if (hj < hc) earlier = true;
          if (hj > hc) later = true;
          if (hj == hc) (j < i ? sameBefore : sameAfter) = true;
        }
        // The last contribution to arrive completes the chunk: at the root, Avg divides there.
        const int div = isRoot && !later ? avgDiv : 0;
        const size_t bytes = len * elem;
        if (sameBefore) {
          std::byte* tmp = tmpBase + static_cast<size_t>(w) * chunkElems * elem;
          ts.push_back(engine::Transfer::recv(child, tmp, bytes, elem, ctx.tag()));
          deferred.push_back(Deferred{off, len, tmp, div});
        } else {
          ts.push_back(engine::Transfer::recvReduce(child, at(out, off, elem),
                                                    earlier ? at(out, off, elem) : at(in, off, elem), bytes,
                                                    op.type, op.op, sameAfter ? 0 : div, ctx.tag()));
        }
      }
      // Up: pass this rank's reduced chunk to the parent (a leaf's is its input).
      if (!isRoot && part.chunkAt(t, h, &off, &len)) {
        ts.push_back(
            engine::Transfer::send(links.parent, at(nc ? out : in, off, elem), len * elem, elem, ctx.tag()));
      }
      // Down: the finished chunk from the root to every rank, forwarded as it arrives.
      if (part.chunkAt(t, rootHeight, &off, &len)) {
        int arrival = -1;
        if (!isRoot) {
          ts.push_back(engine::Transfer::recv(links.parent, at(out, off, elem), len * elem, elem, ctx.tag()));
          arrival = static_cast<int>(ts.size()) - 1;
        }
        for (int child : links.children) {
          engine::Transfer fwd =
              engine::Transfer::send(child, at(out, off, elem), len * elem, elem, ctx.tag());
          fwd.waitFor = arrival;
          ts.push_back(fwd);
        }
      }
    }
    if (!ts.empty()) ctx.run(ts);
    for (const Deferred& d : deferred) {
      std::byte* dst = at(out, d.off, elem);
      const void* srcs[2] = {dst, d.tmp};
      ctx.localReduce(dst, srcs, 2, d.len, op.type, op.op, d.div);
    }
  }
}

// Pipelined over both trees in the chunk size the model finds fastest (CostModel::treeUs).
double allReduceTreeUs(const CostModel& m, const Op& op, int n) {
  return m.treeUs(static_cast<double>(op.messageBytes()), n,
                  static_cast<double>(m.treeChunkBytes(op.messageBytes(), n)));
}

std::string allReduceTreeNote(const CostModel& m, const Op& op, int n) {
  return strCat(" in chunks of ", formatBytes(m.treeChunkBytes(op.messageBytes(), n)));
}

}  // namespace chorus::algo
