#include "algorithms/patterns/patterns.hpp"

#include <stdexcept>
#include <string>

namespace chorus::patterns {

namespace {

int wrap(int a, int n) { return ((a % n) + n) % n; }

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("chorus::patterns: ") + what);
}

// Lowest set bit of j > 0.
int64_t lowBit(int64_t j) { return j & -j; }

// Tree 0 of the double binary tree works on positions j = rank + 1 in 1..n inside the perfect binary
// search tree over 1..2^K - 1; this is its root 2^(K-1), K the smallest with 2^K - 1 >= n.
int64_t bitTreeRoot(int n) {
  int64_t top = 1;  // 2^(K-1)
  while (2 * top - 1 < n) top *= 2;
  return top;
}

// Parent of position j in the perfect tree (j not its root): j + b if j is a left child, else j - b.
int64_t perfectParent(int64_t j) {
  const int64_t b = lowBit(j);
  return (j / b) % 4 == 1 ? j + b : j - b;
}

// Links of position j (1..n) in tree 0, as positions (0 = none).
struct PosLinks {
  int64_t parent = 0;
  int64_t left = 0, right = 0;
};

PosLinks bitTreeLinks(int n, int64_t j) {
  PosLinks l;
  if (j != bitTreeRoot(n)) {
    int64_t p = perfectParent(j);
    while (p > n) p = perfectParent(p);  // the nearest ancestor that exists
    l.parent = p;
  }
  const int64_t b = lowBit(j);
  if (b > 1) {
    l.left = j - b / 2;  // < j <= n: always exists
    if (j + 1 <= n) {
      // The right subtree holds [j + 1, j + b - 1]; its topmost existing node is found by going left
      // from its root until the position exists (the leftmost, j + 1, does).
      int64_t x = j + b / 2;
      while (x > n) x -= lowBit(x) / 2;
      l.right = x;
    }
  }
  return l;
}

TreeLinks toRanks(const PosLinks& l, int n, int shift) {
  TreeLinks t;
  auto rankOf = [&](int64_t pos) { return wrap(static_cast<int>(pos - 1) + shift, n); };
  if (l.parent) t.parent = rankOf(l.parent);
  if (l.left) t.children.push_back(rankOf(l.left));
  if (l.right) t.children.push_back(rankOf(l.right));
  return t;
}

}  // namespace

TreeLinks knomialTree(int n, int root, int radix, int rank) {
  require(n >= 1, "knomialTree: n must be >= 1");
  require(root >= 0 && root < n, "knomialTree: root out of range");
  require(rank >= 0 && rank < n, "knomialTree: rank out of range");
  require(radix >= 2, "knomialTree: radix must be >= 2");
  const int64_t k = radix, nn = n;
  const int64_t v = wrap(rank - root, n);
  TreeLinks t;
  // Digit positions (as k^i) below v's lowest non-zero digit: where its children hang.
  int64_t lowest = nn;  // the root: every position below n
  if (v != 0) {
    int64_t mask = 1;
    while ((v / mask) % k == 0) mask *= k;
    lowest = mask;
    const int64_t parentV = v - ((v / mask) % k) * mask;
    t.parent = static_cast<int>((parentV + root) % nn);
  }
  std::vector<int64_t> masks;
  for (int64_t mask = 1; mask < lowest && mask < nn; mask *= k) masks.push_back(mask);
  for (auto it = masks.rbegin(); it != masks.rend(); ++it) {
    for (int64_t j = 1; j < k; ++j) {
      const int64_t c = v + j * *it;
      if (c >= nn) break;
      t.children.push_back(static_cast<int>((c + root) % nn));
    }
  }
  return t;
}

DoubleTree doubleBinaryTree(int n, int rank) {
  require(n >= 1, "doubleBinaryTree: n must be >= 1");
  require(rank >= 0 && rank < n, "doubleBinaryTree: rank out of range");
  DoubleTree d;
  d.tree[0] = toRanks(bitTreeLinks(n, rank + 1), n, 0);
  // Tree 1: tree 0 with every rank shifted by one, so this rank plays position (rank - 1) mod n.
  d.tree[1] = toRanks(bitTreeLinks(n, wrap(rank - 1, n) + 1), n, 1);
  return d;
}

int doubleBinaryTreeRoot(int n, int which) {
  require(n >= 1, "doubleBinaryTreeRoot: n must be >= 1");
  require(which == 0 || which == 1, "doubleBinaryTreeRoot: which must be 0 or 1");
  const int root0 = static_cast<int>(bitTreeRoot(n) - 1);
  return which == 0 ? root0 : (root0 + 1) % n;
}

size_t blockBoundary(size_t count, size_t parts, size_t i, size_t granule) {
  require(parts >= 1 && i <= parts && granule >= 1, "blockBoundary: bad arguments");
  const size_t units = count / granule + (count % granule ? 1 : 0);
  const size_t u = units / parts * i + units % parts * i / parts;
  return u >= units ? count : u * granule;
}

int halvingDoublingRounds(int n) {
  require(n >= 1, "halvingDoublingRounds: n must be >= 1");
  int p = 1, lg = 0;
  while (p * 2 <= n) {
    p *= 2;
    ++lg;
  }
  return 2 * lg + (n > p ? 2 : 0);
}

std::vector<Step> halvingDoublingSchedule(int n, int rank, size_t count, size_t granule) {
  require(n >= 1, "halvingDoublingSchedule: n must be >= 1");
  require(rank >= 0 && rank < n, "halvingDoublingSchedule: rank out of range");
  require(granule >= 1, "halvingDoublingSchedule: granule must be >= 1");
  int p = 1, lg = 0;
  while (p * 2 <= n) {
    p *= 2;
    ++lg;
  }
  const int rem = n - p;
  const Range all{0, count};
  std::vector<Step> steps;
  const int first = rem > 0 ? 1 : 0;  // first reduce-scatter round
  const int unfold = first + 2 * lg;  // the unfold round (only if rem > 0)
  if (rank < 2 * rem && rank % 2 == 0) {
    // Folded away: hand the data to rank + 1, get the result back at the end.
    steps.push_back(Step{0, rank + 1, all, Range{}, false});
    steps.push_back(Step{unfold, rank + 1, Range{}, all, false});
    return steps;
  }
  if (rank < 2 * rem) steps.push_back(Step{0, rank - 1, Range{}, all, true});
  const int v = rank < 2 * rem ? rank / 2 : rank - rem;
  auto realRank = [&](int w) { return w < rem ? 2 * w + 1 : w + rem; };
  auto block = [&](int b) {
    return blockBoundary(count, static_cast<size_t>(p), static_cast<size_t>(b), granule);
  };
  // Reduce-scatter: the blocks [lo, lo + 2d) this rank is responsible for shrink to [v, v + 1).
  int lo = 0, round = first;
  for (int d = p / 2; d >= 1; d /= 2, ++round) {
    const bool keepLow = (v & d) == 0;
    const int keep = keepLow ? lo : lo + d, give = keepLow ? lo + d : lo;
    steps.push_back(Step{round, realRank(v ^ d), Range{block(give), block(give + d)},
                         Range{block(keep), block(keep + d)}, true});
    lo = keep;
  }
  // All-gather: send what this rank holds, receive the partner's equal-sized neighbour range.
  for (int d = 1; d < p; d *= 2, ++round) {
    const int partnerLo = lo ^ d;  // lo is a multiple of d here: flip the bit that separates the two
    steps.push_back(Step{round, realRank(v ^ d), Range{block(lo), block(lo + d)},
                         Range{block(partnerLo), block(partnerLo + d)}, false});
    lo = lo < partnerLo ? lo : partnerLo;
  }
  if (rank < 2 * rem) steps.push_back(Step{unfold, rank - 1, all, Range{}, false});
  return steps;
}

}  // namespace chorus::patterns
