// Exhaustive tests of the pattern functions (src/algorithms/patterns): for every rank count 1..64,
// the k-nomial trees (several roots and radices) and the double binary tree are valid, connected,
// acyclic, agree on both ends of every link and respect their depth bounds; the halving-doubling
// schedule pairs every send with the peer's receive and, simulated on integer data, gives every
// rank the exact reduction with every rank's contribution counted exactly once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/patterns/patterns.hpp"

namespace chorus::patterns {
namespace {

constexpr int kMaxRanks = 64;

// Smallest d with base^d >= n (0 for n <= 1).
int ceilLog(int base, int n) {
  int d = 0;
  for (int64_t p = 1; p < n; p *= base) ++d;
  return d;
}

// Checks that links[0..n-1] form one tree rooted at `root`; returns its depth (edges), -1 if invalid
// (with gtest failures naming the problem).
int checkTree(const std::vector<TreeLinks>& links, int root, const std::string& what) {
  const int n = static_cast<int>(links.size());
  int roots = 0;
  size_t edges = 0;
  for (int r = 0; r < n; ++r) {
    const TreeLinks& l = links[static_cast<size_t>(r)];
    if (l.parent < 0) {
      ++roots;
      EXPECT_EQ(r, root) << what << ": rank " << r << " has no parent but is not the root";
    } else {
      EXPECT_LT(l.parent, n) << what << ": rank " << r;
      EXPECT_NE(l.parent, r) << what << ": rank " << r << " is its own parent";
      if (l.parent >= n || l.parent == r) return -1;
      const auto& siblings = links[static_cast<size_t>(l.parent)].children;
      EXPECT_EQ(std::count(siblings.begin(), siblings.end(), r), 1)
          << what << ": rank " << r << " is not listed exactly once among its parent " << l.parent
          << "'s children";
    }
    std::set<int> distinct;
    for (int c : l.children) {
      EXPECT_TRUE(c >= 0 && c < n) << what << ": rank " << r << " has child " << c;
      if (c < 0 || c >= n) return -1;
      EXPECT_EQ(links[static_cast<size_t>(c)].parent, r)
          << what << ": rank " << r << " lists child " << c << " whose parent is "
          << links[static_cast<size_t>(c)].parent;
      distinct.insert(c);
    }
    EXPECT_EQ(distinct.size(), l.children.size()) << what << ": rank " << r << " lists a child twice";
    edges += l.children.size();
  }
  EXPECT_EQ(roots, 1) << what;
  EXPECT_EQ(links[static_cast<size_t>(root)].parent, -1) << what << ": the root has a parent";
  EXPECT_EQ(edges, static_cast<size_t>(n - 1)) << what << ": wrong number of edges";
  // Connected and acyclic: every rank reaches the root within n - 1 steps up.
  int depth = 0;
  for (int r = 0; r < n; ++r) {
    int at = r, steps = 0;
    while (at != root && steps < n) {
      at = links[static_cast<size_t>(at)].parent;
      ++steps;
      if (at < 0) break;
    }
    EXPECT_EQ(at, root) << what << ": rank " << r << " does not reach the root (cycle or broken chain)";
    if (at != root) return -1;
    depth = std::max(depth, steps);
  }
  return depth;
}

// ---- k-nomial tree ---------------------------------------------------------------------------

std::vector<int> rootsFor(int n) {
  std::set<int> s{0, n / 2, n - 1, (n * 2) / 3};
  if (n > 1) s.insert(1);
  return {s.begin(), s.end()};
}

TEST(KnomialTree, ValidAndBalancedForEveryRankCountRootAndRadix) {
  for (int n = 1; n <= kMaxRanks; ++n) {
    for (int root : rootsFor(n)) {
      for (int k : {2, 3, 4, 5, 8, 16, n + 1}) {
        if (k < 2) continue;
        const std::string what =
            "knomial n=" + std::to_string(n) + " root=" + std::to_string(root) + " k=" + std::to_string(k);
        std::vector<TreeLinks> links;
        for (int r = 0; r < n; ++r) links.push_back(knomialTree(n, root, k, r));
        const int depth = checkTree(links, root, what);
        ASSERT_GE(depth, 0) << what;
        const int bound = ceilLog(k, n);
        EXPECT_LE(depth, bound) << what;
        for (int r = 0; r < n; ++r) {
          const auto& ch = links[static_cast<size_t>(r)].children;
          EXPECT_LE(ch.size(), static_cast<size_t>((k - 1) * bound)) << what << " rank " << r;
        }
        // The root's children: its k-1 subtrees per digit position, largest position first.
        if (n > 1) {
          const auto& rc = links[static_cast<size_t>(root)].children;
          ASSERT_FALSE(rc.empty()) << what;
          int64_t top = 1;
          while (top * k < n) top *= k;
          EXPECT_EQ(rc.front(), static_cast<int>((root + top) % n)) << what;
          EXPECT_EQ(rc.back(), (root + std::min(k - 1, n - 1)) % n) << what;
        }
      }
    }
  }
}

TEST(KnomialTree, RadixTwoIsTheBinomialTree) {
  // Relative rank v's parent is v with its lowest set bit cleared.
  for (int n = 1; n <= kMaxRanks; ++n) {
    for (int root : rootsFor(n)) {
      for (int r = 0; r < n; ++r) {
        const int v = (r - root + n) % n;
        const TreeLinks l = knomialTree(n, root, 2, r);
        if (v == 0) {
          EXPECT_EQ(l.parent, -1);
        } else {
          EXPECT_EQ(l.parent, ((v & (v - 1)) + root) % n) << "n=" << n << " root=" << root << " r=" << r;
        }
      }
    }
  }
}

TEST(KnomialTree, RejectsBadArguments) {
  EXPECT_THROW(knomialTree(0, 0, 2, 0), std::invalid_argument);
  EXPECT_THROW(knomialTree(4, 4, 2, 0), std::invalid_argument);
  EXPECT_THROW(knomialTree(4, 0, 2, -1), std::invalid_argument);
  EXPECT_THROW(knomialTree(4, 0, 1, 0), std::invalid_argument);
}

// ---- Double binary tree ----------------------------------------------------------------------

TEST(DoubleBinaryTree, BothTreesValidBalancedAndInteriorDisjoint) {
  for (int n = 1; n <= kMaxRanks; ++n) {
    std::vector<TreeLinks> trees[2];
    for (int r = 0; r < n; ++r) {
      const DoubleTree d = doubleBinaryTree(n, r);
      trees[0].push_back(d.tree[0]);
      trees[1].push_back(d.tree[1]);
    }
    int interiorIn[kMaxRanks] = {};
    for (int t = 0; t < 2; ++t) {
      const std::string what = "double binary tree n=" + std::to_string(n) + " tree " + std::to_string(t);
      const int root = doubleBinaryTreeRoot(n, t);
      ASSERT_TRUE(root >= 0 && root < n) << what;
      const int depth = checkTree(trees[t], root, what);
      ASSERT_GE(depth, 0) << what;
      EXPECT_LE(depth, ceilLog(2, n) + 1) << what;  // the required bound
      EXPECT_LE(depth, ceilLog(2, n)) << what;      // what the construction achieves
      for (int r = 0; r < n; ++r) {
        const size_t c = trees[t][static_cast<size_t>(r)].children.size();
        EXPECT_LE(c, 2u) << what << " rank " << r;
        if (c > 0) ++interiorIn[r];
      }
    }
    if (n > 1) {
      EXPECT_NE(doubleBinaryTreeRoot(n, 0), doubleBinaryTreeRoot(n, 1)) << "n=" << n;
    }
    for (int r = 0; r < n; ++r) {
      // Interior in at most one tree (required for n > 2; holds for every n).
      EXPECT_LE(interiorIn[r], 1) << "n=" << n << " rank " << r << " is interior in both trees";
      // And as documented: n even: interior in exactly one; n odd: only rank 0 is a leaf in both.
      if (n >= 2) {
        const int want = (n % 2 == 1 && r == 0) ? 0 : 1;
        EXPECT_EQ(interiorIn[r], want) << "n=" << n << " rank " << r;
      }
    }
  }
}

TEST(DoubleBinaryTree, TreeOneIsTreeZeroShiftedByOne) {
  for (int n = 1; n <= kMaxRanks; ++n) {
    for (int r = 0; r < n; ++r) {
      const TreeLinks a = doubleBinaryTree(n, r).tree[0];
      const TreeLinks b = doubleBinaryTree(n, (r + 1) % n).tree[1];
      EXPECT_EQ(b.parent, a.parent < 0 ? -1 : (a.parent + 1) % n) << "n=" << n << " rank " << r;
      ASSERT_EQ(a.children.size(), b.children.size()) << "n=" << n << " rank " << r;
      for (size_t i = 0; i < a.children.size(); ++i) EXPECT_EQ(b.children[i], (a.children[i] + 1) % n);
    }
    EXPECT_EQ(doubleBinaryTreeRoot(n, 1), (doubleBinaryTreeRoot(n, 0) + 1) % n);
  }
}

TEST(DoubleBinaryTree, SmallCasesByHand) {
  // n = 1: a lone root in both trees.
  EXPECT_EQ(doubleBinaryTree(1, 0).tree[0].parent, -1);
  EXPECT_TRUE(doubleBinaryTree(1, 0).tree[1].children.empty());
  // n = 2: tree 0 is 1 -> 0, tree 1 is 0 -> 1.
  EXPECT_EQ(doubleBinaryTreeRoot(2, 0), 1);
  EXPECT_EQ(doubleBinaryTree(2, 0).tree[0].parent, 1);
  EXPECT_EQ(doubleBinaryTree(2, 1).tree[1].parent, 0);
  // n = 7 (a perfect tree): tree 0 is rooted at 3 with children 1 and 5.
  EXPECT_EQ(doubleBinaryTreeRoot(7, 0), 3);
  EXPECT_EQ(doubleBinaryTree(7, 3).tree[0].children, (std::vector<int>{1, 5}));
  EXPECT_EQ(doubleBinaryTree(7, 5).tree[0].children, (std::vector<int>{4, 6}));
  EXPECT_THROW(doubleBinaryTree(0, 0), std::invalid_argument);
  EXPECT_THROW(doubleBinaryTree(3, 3), std::invalid_argument);
}

// ---- Halving-doubling schedule -----------------------------------------------------------------

const size_t kCounts[] = {0, 1, 7, 64, 1000};

TEST(BlockBoundary, PartitionsEvenlyOnGranules) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{1000}, size_t{1001}}) {
    for (size_t parts = 1; parts <= 64; ++parts) {
      for (size_t g : {size_t{1}, size_t{4}, size_t{16}}) {
        const size_t units = (count + g - 1) / g;
        EXPECT_EQ(blockBoundary(count, parts, 0, g), 0u);
        EXPECT_EQ(blockBoundary(count, parts, parts, g), count);
        for (size_t i = 0; i < parts; ++i) {
          const size_t b = blockBoundary(count, parts, i, g), e = blockBoundary(count, parts, i + 1, g);
          ASSERT_LE(b, e);
          if (e != count) {
            EXPECT_EQ(e % g, 0u);
            const size_t u = (e - b) / g;
            EXPECT_TRUE(u == units / parts || u == (units + parts - 1) / parts)
                << "count " << count << " parts " << parts << " granule " << g << " block " << i;
          }
        }
      }
    }
  }
}

struct Schedules {
  int n;
  size_t count;
  std::vector<std::vector<Step>> of;  // per rank
};

Schedules build(int n, size_t count, size_t granule) {
  Schedules s{n, count, {}};
  for (int r = 0; r < n; ++r) s.of.push_back(halvingDoublingSchedule(n, r, count, granule));
  return s;
}

TEST(HalvingDoubling, EverySendMatchesTheReceiveAtThePeer) {
  for (int n = 1; n <= kMaxRanks; ++n) {
    const int rounds = halvingDoublingRounds(n);
    for (size_t count : kCounts) {
      for (size_t granule : {size_t{1}, size_t{16}}) {
        const Schedules s = build(n, count, granule);
        const std::string what = "n=" + std::to_string(n) + " count=" + std::to_string(count) +
                                 " granule=" + std::to_string(granule);
        if (n == 1) {
          EXPECT_TRUE(s.of[0].empty()) << what;
        }
        for (int r = 0; r < n; ++r) {
          int lastRound = -1;
          for (const Step& st : s.of[static_cast<size_t>(r)]) {
            const std::string at = what + " rank " + std::to_string(r) + " round " + std::to_string(st.round);
            EXPECT_GT(st.round, lastRound) << at << ": rounds not increasing";
            lastRound = st.round;
            EXPECT_LT(st.round, rounds) << at;
            ASSERT_TRUE(st.peer >= 0 && st.peer < n && st.peer != r) << at << " peer " << st.peer;
            EXPECT_LE(st.send.begin, st.send.end) << at;
            EXPECT_LE(st.recv.begin, st.recv.end) << at;
            EXPECT_LE(st.send.end, count) << at;
            EXPECT_LE(st.recv.end, count) << at;
            const bool disjoint = st.send.empty() || st.recv.empty() || st.send.end <= st.recv.begin ||
                                  st.recv.end <= st.send.begin;
            EXPECT_TRUE(disjoint) << at << ": send and receive ranges overlap";
            // The peer's step of the same round names this rank, sends what this rank receives and
            // receives what it sends.
            int matches = 0;
            for (const Step& o : s.of[static_cast<size_t>(st.peer)]) {
              if (o.round != st.round) continue;
              ++matches;
              EXPECT_EQ(o.peer, r) << at;
              EXPECT_EQ(o.recv, st.send) << at << ": peer " << st.peer << " receives another range";
              EXPECT_EQ(o.send, st.recv) << at << ": peer " << st.peer << " sends another range";
            }
            EXPECT_EQ(matches, 1) << at << ": peer " << st.peer << " has no (or several) steps this round";
          }
        }
      }
    }
  }
}

TEST(HalvingDoubling, StepAndRoundCounts) {
  for (int n = 1; n <= kMaxRanks; ++n) {
    int p = 1, lg = 0;
    while (p * 2 <= n) {
      p *= 2;
      ++lg;
    }
    const int rem = n - p;
    EXPECT_EQ(halvingDoublingRounds(n), 2 * lg + (rem ? 2 : 0));
    for (int r = 0; r < n; ++r) {
      const auto steps = halvingDoublingSchedule(n, r, 100);
      const bool folded = r < 2 * rem && r % 2 == 0;
      const bool partner = r < 2 * rem && r % 2 == 1;
      EXPECT_EQ(steps.size(), static_cast<size_t>(folded ? 2 : 2 * lg + (partner ? 2 : 0))) << n << " " << r;
    }
  }
}

// Runs the schedules on `width` int64 lanes per element; init(rank, element, lane) gives the input.
// Messages of a round are taken before any receive of that round is applied, as on real pipes.
std::vector<std::vector<int64_t>> simulate(const Schedules& s, int width,
                                           const std::function<int64_t(int, size_t, int)>& init) {
  const auto w = static_cast<size_t>(width);
  std::vector<std::vector<int64_t>> data(static_cast<size_t>(s.n), std::vector<int64_t>(s.count * w));
  for (int r = 0; r < s.n; ++r) {
    for (size_t i = 0; i < s.count; ++i) {
      for (int l = 0; l < width; ++l)
        data[static_cast<size_t>(r)][i * w + static_cast<size_t>(l)] = init(r, i, l);
    }
  }
  const int rounds = halvingDoublingRounds(s.n);
  for (int round = 0; round < rounds; ++round) {
    std::map<std::pair<int, int>, std::vector<int64_t>> inFlight;  // (from, to) -> payload
    for (int r = 0; r < s.n; ++r) {
      for (const Step& st : s.of[static_cast<size_t>(r)]) {
        if (st.round != round || st.send.empty()) continue;
        const auto& d = data[static_cast<size_t>(r)];
        inFlight[{r, st.peer}] = std::vector<int64_t>(d.begin() + static_cast<ptrdiff_t>(st.send.begin * w),
                                                      d.begin() + static_cast<ptrdiff_t>(st.send.end * w));
      }
    }
    for (int r = 0; r < s.n; ++r) {
      for (const Step& st : s.of[static_cast<size_t>(r)]) {
        if (st.round != round || st.recv.empty()) continue;
        auto it = inFlight.find({st.peer, r});
        if (it == inFlight.end()) {
          ADD_FAILURE() << "round " << round << ": rank " << r << " receives from " << st.peer
                        << " which sends nothing";
          continue;
        }
        const std::vector<int64_t>& payload = it->second;
        EXPECT_EQ(payload.size(), st.recv.size() * w);
        auto& d = data[static_cast<size_t>(r)];
        for (size_t k = 0; k < payload.size() && k < st.recv.size() * w; ++k) {
          int64_t& x = d[st.recv.begin * w + k];
          x = st.reduce ? x + payload[k] : payload[k];
        }
        inFlight.erase(it);
      }
    }
    EXPECT_TRUE(inFlight.empty()) << "round " << round << ": a message nobody received";
  }
  return data;
}

int64_t inputOf(int r, size_t i) {
  return (static_cast<int64_t>(r) + 1) * 1000003 + static_cast<int64_t>(i) * (r % 7 + 1) - 5 * r;
}

TEST(HalvingDoubling, SimulatedSumIsExactOnEveryRank) {
  for (int n = 1; n <= kMaxRanks; ++n) {
    for (size_t count : kCounts) {
      for (size_t granule : {size_t{1}, size_t{16}}) {
        const Schedules s = build(n, count, granule);
        const auto data = simulate(s, 1, [](int r, size_t i, int) { return inputOf(r, i); });
        size_t wrong = 0;
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < count; ++i) {
            int64_t want = 0;
            for (int q = 0; q < n; ++q) want += inputOf(q, i);
            if (data[static_cast<size_t>(r)][i] != want && wrong++ < 3) {
              ADD_FAILURE() << "n=" << n << " count=" << count << " granule=" << granule << " rank " << r
                            << " element " << i << ": got " << data[static_cast<size_t>(r)][i] << " want "
                            << want;
            }
          }
        }
        EXPECT_EQ(wrong, 0u) << "n=" << n << " count=" << count << " granule=" << granule;
      }
    }
  }
}

TEST(HalvingDoubling, EveryContributionCountedExactlyOnce) {
  // Lane q of every element starts as 1 on rank q and 0 elsewhere: after the allreduce every lane
  // of every element on every rank must be exactly 1 (a sum cannot hide a double count this way).
  for (int n = 1; n <= kMaxRanks; ++n) {
    for (size_t count : kCounts) {
      const Schedules s = build(n, count, 1);
      const auto data = simulate(s, n, [](int r, size_t, int lane) { return lane == r ? 1 : 0; });
      size_t wrong = 0;
      for (int r = 0; r < n; ++r) {
        for (int64_t x : data[static_cast<size_t>(r)]) wrong += x != 1;
      }
      EXPECT_EQ(wrong, 0u) << "n=" << n << " count=" << count;
    }
  }
}

TEST(HalvingDoubling, RejectsBadArguments) {
  EXPECT_THROW(halvingDoublingSchedule(0, 0, 10), std::invalid_argument);
  EXPECT_THROW(halvingDoublingSchedule(3, 3, 10), std::invalid_argument);
  EXPECT_THROW(halvingDoublingSchedule(3, 0, 10, 0), std::invalid_argument);
}

}  // namespace
}  // namespace chorus::patterns
