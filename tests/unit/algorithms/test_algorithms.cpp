// Every algorithm in tuning::registry(), forced through Config::algo ("<collective>:<name>"), gives
// exact results for 2..5 thread ranks, counts 0, 1, 1000 and 300001, float32 and bfloat16, and (for
// reductions) sum and avg.
//
// The transport is a parameter, as in Gloo's tests: the instances Shm/... run over the ranks' shared
// memory (every algorithm), the instances Tcp/... with Config::transport "tcp", every pair of thread
// ranks over the TCP transport on loopback (the pipe algorithms only: the shared-memory ones, whose
// registry entry says needsSharedMemory, have no instance there, as nothing would run them).
//
// Inputs are integers in [-2, 2], so sums over up to 5 ranks are exact in both types; avg is checked
// against the exact quotient within one unit in the last place of the output type.
#include <gtest/gtest.h>
#include <sched.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "api/api_test_util.hpp"
#include "base/op.hpp"
#include "chorus/chorus.hpp"
#include "chorus/store.hpp"
#include "core/comm_impl.hpp"
#include "engine/shm_sync.hpp"
#include "tuning/tuning.hpp"

using namespace chorus;
using chorus::apitest::fromBf16;
using chorus::apitest::runRanks;
using chorus::apitest::toBf16;

namespace {

const size_t kCounts[] = {0, 1, 1000, 300001};

// A buffer of float32 or bfloat16 elements, read and written as float.
class Buffer {
 public:
  Buffer(DataType type, size_t count) : type_(type), bytes_(count * dataTypeSize(type) + 1) {}
  void set(size_t i, float v) {
    if (type_ == DataType::Float32) {
      std::memcpy(bytes_.data() + i * 4, &v, 4);
    } else {
      uint16_t b = toBf16(v);
      std::memcpy(bytes_.data() + i * 2, &b, 2);
    }
  }
  float get(size_t i) const {
    if (type_ == DataType::Float32) {
      float v;
      std::memcpy(&v, bytes_.data() + i * 4, 4);
      return v;
    }
    uint16_t b;
    std::memcpy(&b, bytes_.data() + i * 2, 2);
    return fromBf16(b);
  }
  void* data() { return bytes_.data(); }

 private:
  DataType type_;
  std::vector<uint8_t> bytes_;  // one spare byte: never a NULL pointer, even for count 0
};

// Input of rank r at element i of its send buffer.
float inputOf(int r, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(r) * 3) % 5) - 2);
}

// Counts each element of `got` (n elements) that differs from want(i), noting the first few.
template <typename Want>
size_t countWrong(const Buffer& got, size_t n, DataType type, bool avg, Want&& want, std::string* report) {
  const double tol = !avg ? 0.0 : (type == DataType::BFloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -22));
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    double w = want(i);
    double g = got.get(i);
    if (std::fabs(g - w) > tol * std::fabs(w)) {
      if (wrong < 3)
        *report +=
            "[" + std::to_string(i) + "] got " + std::to_string(g) + " want " + std::to_string(w) + "; ";
      ++wrong;
    }
  }
  return wrong;
}

struct Param {
  size_t algorithm;  // index into tuning::registry()
  int ranks;
  std::string transport;  // Config::transport: "" (shared memory) or "tcp"
};

std::string nameOf(const Param& p) {
  const algo::Algorithm& a = tuning::registry()[p.algorithm];
  return std::string(opKindName(a.kind)) + "_" + a.name + "_" + std::to_string(p.ranks) + "ranks";
}

class AlgoOverride : public ::testing::TestWithParam<Param> {};

// Runs one collective of `kind` on this rank and checks the result; returns a failure description or "".
std::string runOne(Communicator& c, OpKind kind, DataType type, ReduceOp op, size_t count,
                   std::atomic<int>& barrierArrivals, int barrierRound) {
  const int n = c.size(), r = c.rank();
  const auto nz = static_cast<size_t>(n);
  const bool avg = op == ReduceOp::Avg;
  auto reduced = [&](size_t index) {  // exact reduction over ranks of inputOf(., index)
    double s = 0;
    for (int q = 0; q < n; ++q) s += inputOf(q, index);
    return avg ? s / n : s;
  };
  std::string report;
  size_t wrong = 0;
  switch (kind) {
    case OpKind::AllReduce: {
      Buffer in(type, count), out(type, count);
      for (size_t i = 0; i < count; ++i) in.set(i, inputOf(r, i));
      c.allReduce(in.data(), out.data(), count, type, op);
      wrong = countWrong(out, count, type, avg, reduced, &report);
      break;
    }
    case OpKind::ReduceScatter: {
      Buffer in(type, count * nz), out(type, count);
      for (size_t i = 0; i < count * nz; ++i) in.set(i, inputOf(r, i));
      c.reduceScatter(in.data(), out.data(), count, type, op);
      wrong = countWrong(
          out, count, type, avg, [&](size_t i) { return reduced(static_cast<size_t>(r) * count + i); },
          &report);
      break;
    }
    case OpKind::AllGather: {
      Buffer in(type, count), out(type, count * nz);
      for (size_t i = 0; i < count; ++i) in.set(i, inputOf(r, i));
      c.allGather(in.data(), out.data(), count, type);
      wrong = countWrong(
          out, count * nz, type, false,
          [&](size_t j) { return static_cast<double>(inputOf(static_cast<int>(j / count), j % count)); },
          &report);
      break;
    }
    case OpKind::Broadcast: {
      const int root = static_cast<int>(count % nz);
      Buffer buf(type, count);
      for (size_t i = 0; i < count; ++i) buf.set(i, r == root ? inputOf(r, i) : 99.0f);
      c.broadcast(buf.data(), buf.data(), count, type, root);
      wrong = countWrong(
          buf, count, type, false, [&](size_t i) { return static_cast<double>(inputOf(root, i)); }, &report);
      break;
    }
    case OpKind::Reduce: {
      const int root = static_cast<int>((count + 1) % nz);
      Buffer in(type, count), out(type, count);
      for (size_t i = 0; i < count; ++i) {
        in.set(i, inputOf(r, i));
        out.set(i, 99.0f);
      }
      c.reduce(in.data(), out.data(), count, type, op, root);
      if (r == root) wrong = countWrong(out, count, type, avg, reduced, &report);
      break;
    }
    case OpKind::AllToAll: {
      Buffer in(type, count * nz), out(type, count * nz);
      for (size_t i = 0; i < count * nz; ++i) in.set(i, inputOf(r, i));
      c.allToAll(in.data(), out.data(), count, type);
      // Block q of the result is block r of rank q's input.
      wrong = countWrong(
          out, count * nz, type, false,
          [&](size_t j) {
            return static_cast<double>(
                inputOf(static_cast<int>(j / count), static_cast<size_t>(r) * count + j % count));
          },
          &report);
      break;
    }
    case OpKind::AllToAllv: {
      // Rank s sends amount(s, d) elements to rank d: uneven, some zero.
      auto amount = [&](int s, int d) {
        return count == 0 ? 0 : (count + static_cast<size_t>(s) + 2 * static_cast<size_t>(d)) % (count + 1);
      };
      auto value = [](int s, int d, size_t i) {
        return static_cast<float>(
            static_cast<int>((i * 7 + static_cast<size_t>(s) * 3 + static_cast<size_t>(d)) % 5) - 2);
      };
      std::vector<size_t> sc(nz), sd(nz), rc(nz), rd(nz);
      size_t stotal = 0, rtotal = 0;
      for (int q = 0; q < n; ++q) {
        sc[static_cast<size_t>(q)] = amount(r, q);
        sd[static_cast<size_t>(q)] = stotal;
        stotal += sc[static_cast<size_t>(q)];
        rc[static_cast<size_t>(q)] = amount(q, r);
        rd[static_cast<size_t>(q)] = rtotal;
        rtotal += rc[static_cast<size_t>(q)];
      }
      Buffer in(type, stotal), out(type, rtotal);
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < sc[static_cast<size_t>(q)]; ++i)
          in.set(sd[static_cast<size_t>(q)] + i, value(r, q, i));
      }
      c.allToAllv(in.data(), sc, sd, out.data(), rc, rd, type);
      for (int q = 0; q < n; ++q) {
        Buffer block(type, rc[static_cast<size_t>(q)]);
        for (size_t i = 0; i < rc[static_cast<size_t>(q)]; ++i)
          block.set(i, out.get(rd[static_cast<size_t>(q)] + i));
        wrong += countWrong(
            block, rc[static_cast<size_t>(q)], type, false,
            [&](size_t i) { return static_cast<double>(value(q, r, i)); }, &report);
      }
      break;
    }
    case OpKind::Barrier: {
      barrierArrivals.fetch_add(1);
      c.barrier();
      // Every rank arrived at this round before anyone left it.
      int seen = barrierArrivals.load();
      if (seen < n * barrierRound) {
        report = "left barrier round " + std::to_string(barrierRound) + " after only " +
                 std::to_string(seen) + " arrivals";
        wrong = 1;
      }
      break;
    }
    default:
      report = "unexpected collective";
      wrong = 1;
  }
  if (!wrong) return "";
  return std::to_string(wrong) + " wrong: " + report;
}

TEST_P(AlgoOverride, ResultsAreExact) {
  const Param p = GetParam();
  const algo::Algorithm& a = tuning::registry()[p.algorithm];
  Config config = apitest::testConfig(60);
  config.algo = std::string(opKindName(a.kind)) + ":" + a.name;
  config.transport = p.transport;
  auto comms = Communicator::createLocal(p.ranks, config);
  // Over TCP there is no shared memory: the algorithm runs over the sockets' pipes or not at all.
  for (Communicator& c : comms) ASSERT_EQ(c.impl()->sharedMemory() == nullptr, p.transport == "tcp");
  const bool reducing =
      a.kind == OpKind::AllReduce || a.kind == OpKind::ReduceScatter || a.kind == OpKind::Reduce;
  std::vector<ReduceOp> ops =
      reducing ? std::vector<ReduceOp>{ReduceOp::Sum, ReduceOp::Avg} : std::vector<ReduceOp>{ReduceOp::Sum};
  std::atomic<int> barrierArrivals{0};
  runRanks(comms, [&](Communicator& c, int r) {
    int round = 0;
    for (DataType type : {DataType::Float32, DataType::BFloat16}) {
      for (size_t count : kCounts) {
        for (ReduceOp op : ops) {
          std::string failure = runOne(c, a.kind, type, op, count, barrierArrivals, ++round);
          EXPECT_EQ(failure, "") << config.algo << ", " << p.ranks << " ranks over "
                                 << (p.transport.empty() ? "shm" : p.transport) << ", rank " << r << ", "
                                 << dataTypeName(type) << ", " << reduceOpName(op) << ", count " << count;
        }
      }
    }
  });
}

// The low-latency broadcast and reduce let a rank that waits for nobody (the broadcast's root,
// the reduce's other ranks) leave its call at once, and write its next message into a slot as soon
// as every peer has published the message before (ShmSync::llNext). Thousands of such calls back
// to back, roots moving, counts of one to three messages, mixed with the low-latency allreduce
// (which waits for everyone): every result exact, on every rank, for 2..5 thread ranks. Without
// the wait in llNext a root overwrote messages its slowest peer had not read yet.
//
// The second pass takes the default algorithms with counts on both sides of the low-latency bounds,
// so that a rank ahead may already synchronise in a staged call while a peer still waits for its
// low-latency message: that must not look like a mismatch (ShmSync::synchronisesAhead).
TEST(LowLatencyMessages, RanksAheadNeverOverwriteUnreadMessages) {
  for (const bool defaults : {false, true})
    for (int n : {2, 3, 4, 5}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, " + (defaults ? "default algorithms" : "ll forced"));
      Config config = apitest::testConfig(60);
      config.algo = defaults ? "" : "allreduce:ll,broadcast:ll,reduce:ll";
      auto comms = Communicator::createLocal(n, config);
      const size_t perMessage = engine::ShmSync::llCapacity() / sizeof(int32_t);
      runRanks(comms, [&](Communicator& c, int r) {
        auto value = [](int call, int rank, size_t i) {
          return static_cast<int32_t>((static_cast<size_t>(call) * 31 + static_cast<size_t>(rank) * 7 + i) %
                                      1000);
        };
        std::vector<int32_t> in, out;
        size_t wrong = 0;
        std::string first;
        for (int call = 0; call < 3000 && wrong == 0; ++call) {
          // Forced: one to three messages. Defaults: 8 B, 256 B (low latency), 4 KiB, 20 KiB (staged).
          const size_t sizes[] = {2, 64, 1024, 5000};
          const size_t count = defaults ? sizes[static_cast<size_t>(call) * 7 / 3 % 4]
                                        : 1 + static_cast<size_t>(call) * 37 % (3 * perMessage);
          in.assign(count, 0);
          out.assign(count, -1);
          for (size_t i = 0; i < count; ++i) in[i] = value(call, r, i);
          const int kind = call % 5;
          const int root = kind == 4 ? 0 : (call * 7 / 5) % n;
          auto expect = [&](size_t i) {
            if (kind < 2) return value(call, root, i);  // broadcast
            int32_t s = 0;
            for (int q = 0; q < n; ++q) s += value(call, q, i);
            return s;
          };
          bool checked = true;
          if (kind < 2) {
            c.broadcast(in.data(), out.data(), count, DataType::Int32, root);
          } else if (kind < 4) {
            c.reduce(in.data(), out.data(), count, DataType::Int32, ReduceOp::Sum, root);
            checked = r == root;
          } else {
            c.allReduce(in.data(), out.data(), count, DataType::Int32, ReduceOp::Sum);
          }
          for (size_t i = 0; checked && i < count; ++i) {
            if (out[i] != expect(i) && wrong++ == 0)
              first = "call " + std::to_string(call) + " (" +
                      (kind < 2   ? "broadcast"
                       : kind < 4 ? "reduce"
                                  : "allreduce") +
                      ", root " + std::to_string(root) + ", count " + std::to_string(count) + ") element " +
                      std::to_string(i) + ": got " + std::to_string(out[i]) + ", want " +
                      std::to_string(expect(i));
          }
        }
        EXPECT_EQ(wrong, 0u) << "rank " << r << ": " << first;
      });
    }
}

// A rank that waits for nobody runs ahead through the ring of low-latency slots, exactly as far as
// the ring allows: while one rank sleeps after its call s, the broadcast's root (and, in a reduce,
// every sender) finishes calls up to s + kLlRootedSlots and no further (its next message would go
// into the slot of message s + 1, which the sleeper has not read). Long runs of one root, then of
// the next, 2..4 thread ranks; every result exact on every rank. In check mode (CHORUS_CHECK=1, the
// sanitizer pass) every call synchronises first, so nobody runs ahead at all.
TEST(LowLatencyMessages, RanksWaitingForNobodyRunAheadByTheRingAndNoFurther) {
  constexpr int kRing = transport::ShmGroup::kLlRootedSlots;
  constexpr int kSleepEvery = 2 * kRing + 100, kCalls = 4 * kSleepEvery;  // runs longer than 2 rings
  const char* check = std::getenv("CHORUS_CHECK");
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    auto comms = Communicator::createLocal(n, apitest::testConfig(60));
    // The whole ring where the ranks share the cores (3 and 4 ranks on a 2-core machine), 16 slots
    // where each has one (the CPUs this process may run on, as the communicator counts them).
    const int depth = comms[0].impl()->sharedMemory()->llRingDepth();
    cpu_set_t cpus;
    const int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    EXPECT_EQ(depth, cores >= n ? 16 : kRing);
    const int lead = check && std::string(check) == "1" ? 0 : depth;
    std::vector<std::atomic<int>> done(static_cast<size_t>(n));
    std::vector<std::vector<int>> leads(static_cast<size_t>(n));
    runRanks(comms, [&](Communicator& c, int r) {
      size_t wrong = 0;
      std::string first;
      for (int call = 0; call < kCalls; ++call) {
        const bool bcast = call < kCalls / 2;
        const int root = (call / kSleepEvery) % n;  // one root for a whole run
        // The sleeper: a rank that reads in this run (not the broadcast's root, the reduce's root).
        const int sleeper = bcast ? (root + 1) % n : root;
        std::array<int32_t, 4> in{}, out{};
        for (size_t i = 0; i < in.size(); ++i) in[i] = call * 10 + r + static_cast<int>(i);
        if (bcast) {
          c.broadcast(in.data(), out.data(), in.size(), DataType::Int32, root);
          for (size_t i = 0; i < in.size(); ++i)
            if (out[i] != call * 10 + root + static_cast<int>(i) && wrong++ == 0)
              first = "broadcast " + std::to_string(call) + " element " + std::to_string(i);
        } else {
          c.reduce(in.data(), out.data(), in.size(), DataType::Int32, ReduceOp::Sum, root);
          for (size_t i = 0; r == root && i < in.size(); ++i) {
            int32_t want = 0;
            for (int q = 0; q < n; ++q) want += call * 10 + q + static_cast<int>(i);
            if (out[i] != want && wrong++ == 0)
              first = "reduce " + std::to_string(call) + " element " + std::to_string(i);
          }
        }
        done[static_cast<size_t>(r)].store(call + 1);
        if (r == sleeper && call % kSleepEvery == kRing / 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          // The ranks that wait for nobody in this run: how far ahead of this one they got.
          for (int q = 0; q < n; ++q) {
            if (q != r && (!bcast || q == root))
              leads[static_cast<size_t>(r)].push_back(done[static_cast<size_t>(q)].load() - (call + 1));
          }
        }
      }
      EXPECT_EQ(wrong, 0u) << "rank " << r << ": " << first;
    });
    size_t seen = 0;
    for (const auto& l : leads) {
      for (int ahead : l) EXPECT_EQ(ahead, lead) << "how far a rank that waits for nobody got ahead";
      seen += l.size();
    }
    EXPECT_GE(seen, 4u);
  }
}

// Every algorithm of the registry that can run over `transport`, for 2..5 ranks.
std::vector<Param> params(const std::string& transport) {
  std::vector<Param> out;
  for (size_t i = 0; i < tuning::registry().size(); ++i) {
    if (transport == "tcp" && tuning::registry()[i].needsSharedMemory) continue;
    for (int n : {2, 3, 4, 5}) out.push_back({i, n, transport});
  }
  return out;
}

std::string testName(const ::testing::TestParamInfo<Param>& tp) { return nameOf(tp.param); }

INSTANTIATE_TEST_SUITE_P(Shm, AlgoOverride, ::testing::ValuesIn(params("")), testName);
INSTANTIATE_TEST_SUITE_P(Tcp, AlgoOverride, ::testing::ValuesIn(params("tcp")), testName);

// The parameter's mechanism: rank 0's Config::transport wins (the others' is ignored, either way),
// and the communicators split from one keep it.
TEST(TransportSetting, RankZerosWinsAndSplitsKeepIt) {
  for (const std::string rank0 : {"tcp", ""}) {
    SCOPED_TRACE("rank 0's Config::transport '" + rank0 + "'");
    constexpr int n = 3;
    auto store = makeInProcessStore();
    std::vector<std::optional<Communicator>> made(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        Config config = apitest::testConfig(60);
        config.transport = r == 0 ? rank0 : (rank0 == "tcp" ? "" : "tcp");
        try {
          made[static_cast<size_t>(r)].emplace(store, r, n, config);
        } catch (const Error& e) {
          ADD_FAILURE() << "rank " << r << ": " << e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    std::vector<Communicator> comms;
    for (auto& c : made) {
      ASSERT_TRUE(c.has_value());
      comms.push_back(std::move(*c));
    }
    const bool tcp = rank0 == "tcp";
    runRanks(comms, [&](Communicator& c, int r) {
      EXPECT_EQ(c.impl()->config().transport, rank0) << "rank " << r;
      EXPECT_EQ(c.impl()->sharedMemory() == nullptr, tcp) << "rank " << r;
      std::vector<float> v(1000, static_cast<float>(r + 1)), sum(1000);
      c.allReduce(v.data(), sum.data(), v.size(), DataType::Float32, ReduceOp::Sum);
      for (float x : sum) ASSERT_EQ(x, 6.0f);
      std::optional<Communicator> child = c.split(0, r);
      ASSERT_TRUE(child.has_value());
      EXPECT_EQ(child->impl()->sharedMemory() == nullptr, tcp) << "rank " << r << " of the split";
      child->allReduce(v.data(), sum.data(), v.size(), DataType::Float32, ReduceOp::Sum);
      for (float x : sum) ASSERT_EQ(x, 6.0f);
    });
  }
}

}  // namespace
