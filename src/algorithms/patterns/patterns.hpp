// Communication patterns as pure functions of (rank count, rank, ...): who talks to whom and which
// part of the data moves, with no buffers, pipes or library types involved. The algorithms in
// src/algorithms turn them into transfers; tests/unit/patterns checks them exhaustively.
//
// Depends on the standard library only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace chorus::patterns {

/// One rank's links in a tree over ranks 0..n-1. parent is -1 for the root.
struct TreeLinks {
  int parent = -1;
  std::vector<int> children;
};

// ---------------------------------------------------------------------------------------------
// k-nomial tree
// ---------------------------------------------------------------------------------------------

/// The k-nomial tree of `radix` k >= 2 over n >= 1 ranks rooted at `root`, as seen by `rank`.
///
/// Ranks are numbered relative to the root, v = (rank - root) mod n, and written in base k. The
/// parent of v != 0 is v with its lowest non-zero digit cleared; the children of v are v + j * k^i
/// for every digit position i below v's lowest non-zero digit (every position for the root) and
/// j = 1..k-1, as long as they are < n. Children are listed largest subtree first (highest digit
/// position first), the order in which a broadcast should serve them. Depth (edges from the root to
/// the deepest rank) is at most ceil(log_k(n)); every rank has at most (k-1) * ceil(log_k(n))
/// children. k = 2 is the binomial tree.
///
/// Preconditions (checked; std::invalid_argument otherwise): n >= 1, 0 <= root, rank < n, radix >= 2.
TreeLinks knomialTree(int n, int root, int radix, int rank);

// ---------------------------------------------------------------------------------------------
// Double binary tree
// ---------------------------------------------------------------------------------------------

/// The two binary trees of a double binary tree over n >= 1 ranks, as seen by `rank`.
///
/// Tree 0 is the in-order ("bit") tree: with positions j = rank + 1 in 1..n embedded in the perfect
/// binary search tree over 1..2^K - 1, K = ceil(log2(n + 1)), a rank's parent is its nearest
/// ancestor that is <= n. Leaves are exactly the even ranks and interior nodes the odd ranks, every
/// node has at most two children and the depth is at most K - 1 <= ceil(log2(n)) edges. Tree 1 is
/// tree 0 with every rank shifted by one (rank -> (rank + 1) mod n): its interior nodes are even
/// ranks. So every rank is an interior node in at most one of the two trees (n odd: rank 0 is a leaf
/// in both), and an operation that sends half the data through each tree uses every rank's links
/// about equally.
///
/// Children are listed in increasing rank order of tree 0's positions (left child first).
struct DoubleTree {
  TreeLinks tree[2];
};
DoubleTree doubleBinaryTree(int n, int rank);

/// The root of tree `which` (0 or 1) of the double binary tree over n >= 1 ranks.
int doubleBinaryTreeRoot(int n, int which);

// ---------------------------------------------------------------------------------------------
// Recursive halving-doubling (Rabenseifner) allreduce
// ---------------------------------------------------------------------------------------------

/// A half-open range [begin, end) of element indices.
struct Range {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
  bool empty() const { return end == begin; }
  friend bool operator==(const Range&, const Range&) = default;
};

/// One step of one rank in a schedule: in round `round` this rank sends elements `send` of its
/// buffer to `peer` and receives elements `recv` from `peer`, which it either reduces into its
/// buffer (`reduce`) or copies over it. An empty range moves nothing (only the fold and unfold steps
/// have one). Within a step `send` and `recv` never overlap, so both may use the same buffer at once.
/// The peer has a step of the same round naming this rank, whose `recv` equals this step's `send` and
/// whose `send` equals this step's `recv`.
struct Step {
  int round = 0;
  int peer = -1;
  Range send;
  Range recv;
  bool reduce = false;
};

/// The recursive halving-doubling allreduce of `count` elements over n >= 1 ranks, as `rank`'s list
/// of steps in round order.
///
/// Let p be the largest power of two <= n and rem = n - p. When rem > 0, round 0 folds: each even
/// rank r < 2 * rem sends its whole buffer to r + 1, which reduces it; the even ranks then sit out
/// and the remaining p ranks take new ranks 0..p-1 (odd r < 2 * rem -> r / 2, r >= 2 * rem -> r - rem).
/// The buffer is cut into p nearly equal blocks (boundaries multiples of `granule` elements, except
/// at `count`). Reduce-scatter by recursive halving: for distances d = p/2, ..., 1, new ranks v and
/// v ^ d exchange the halves of their current range of blocks, the one with bit d clear keeping the
/// lower half, and reduce what they receive, so new rank v ends with block v fully reduced. All-gather
/// by recursive doubling (d = 1, ..., p/2) undoes the halving with copies. With rem > 0 a last round
/// unfolds: r + 1 sends the whole result back to each even r < 2 * rem.
///
/// Rounds are numbered the same on every rank (a rank sitting a round out has no step for it):
/// 0 fold (only if rem > 0), then log2(p) reduce-scatter and log2(p) all-gather rounds, then unfold.
std::vector<Step> halvingDoublingSchedule(int n, int rank, size_t count, size_t granule = 1);

/// The number of rounds of halvingDoublingSchedule for n ranks.
int halvingDoublingRounds(int n);

/// Start of block i (0 <= i <= parts) when `count` elements are cut into `parts` nearly equal
/// blocks whose boundaries are multiples of `granule` (granule >= 1) except `count` itself: with
/// u = ceil(count / granule) granules, every block gets floor(u / parts) or ceil(u / parts) of them
/// (the last non-empty block cut at `count`), boundary(0) == 0 and boundary(parts) == count.
size_t blockBoundary(size_t count, size_t parts, size_t i, size_t granule = 1);

}  // namespace chorus::patterns
