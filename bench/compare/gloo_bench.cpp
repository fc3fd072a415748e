// compare-gloo: Gloo collectives (TCP transport) timed exactly as chorus-perf times Chorus's, so that
// a driver can put the two side by side. A peer of Chorus: it uses nothing of it.
//
//   chorusrun -n 2 compare-gloo <collective> [flags]
//
// Ranks come from CHORUS_RANK and CHORUS_WORLD_SIZE (chorusrun sets them); at least 2 are needed.
// Rendezvous goes through a gloo::rendezvous::FileStore in a directory that must be fresh for every
// run (stale keys break it): --store-dir DIR, or /tmp/chorus-compare-gloo-<CHORUS_STORE_ADDR>, which
// is unique per chorusrun job. Rank 0 creates the directory and removes it once every rank is
// connected (a directory that already existed is left alone).
//
// collective and algorithm (-a), each one of Gloo's per-algorithm classes:
//   all_reduce      ring (gloo::AllreduceRing, the default), ring_chunked (AllreduceRingChunked),
//                   halving_doubling (AllreduceHalvingDoubling)
//   reduce_scatter  halving_doubling (ReduceScatterHalvingDoubling)
//   all_gather      ring (AllgatherRing)
//   broadcast       one_to_all (BroadcastOneToAll)
// Flags as chorus-perf: -b -e -i -f -n -w -c -d -o -r --json; -d float and -o sum only.
// Size, count, time (-w warm-ups, a barrier, -n timed iterations averaged, max over ranks), algbw,
// busbw and #wrong follow chorus-perf (see bench/chorus_perf.cpp).
//
// Out-of-place and in-place: Gloo's all_reduce and reduce_scatter classes reduce in place, in the
// one buffer they are given. Their in-place columns time that call alone (reduce_scatter leaves
// the rank's block at the start of the buffer, where nccl-tests' in-place layout has it at
// rank * count); their out-of-place columns time a copy of the send buffer into the receive buffer
// followed by that call, which is what out-of-place semantics cost with these classes.
// all_gather (separate input and output) and broadcast (the root sends from its send buffer, the
// others receive into their receive buffer) are out-of-place only: their in-place columns are N/A.
// A collective of 0 elements (blocks below 4 elements) is not issued and times as 0.
// Exit status: 0, 1 if any result was wrong, 2 on a usage or library error.
#include <getopt.h>
#include <gloo/algorithm.h>
#include <gloo/allgather_ring.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/config.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifndef COMPARE_GLOO_PACKAGE
#define COMPARE_GLOO_PACKAGE "unknown"
#endif

namespace compare_gloo {
namespace {

constexpr size_t kMaxBufferBytes = size_t{1} << 30;
constexpr size_t kBlockAlign = 4;
constexpr auto kGlooTimeout = std::chrono::seconds(120);
constexpr auto kStoreDirWait = std::chrono::seconds(60);

enum class Coll { AllReduce, ReduceScatter, AllGather, Broadcast };

struct CollEntry {
  Coll coll;
  const char* name;
  std::vector<const char*> algos;  // the first is the default
};

const std::vector<CollEntry>& collTable() {
  static const std::vector<CollEntry> table = {
      {Coll::AllReduce, "all_reduce", {"ring", "ring_chunked", "halving_doubling"}},
      {Coll::ReduceScatter, "reduce_scatter", {"halving_doubling"}},
      {Coll::AllGather, "all_gather", {"ring"}},
      {Coll::Broadcast, "broadcast", {"one_to_all"}},
  };
  return table;
}

const CollEntry& entryFor(Coll c) {
  for (const CollEntry& e : collTable()) {
    if (e.coll == c) return e;
  }
  throw std::logic_error("unknown collective");
}

bool collReduces(Coll c) { return c == Coll::AllReduce || c == Coll::ReduceScatter; }
bool collHasInPlace(Coll c) { return collReduces(c); }

double busFactor(Coll c, int nranks) {
  const double n = nranks;
  switch (c) {
    case Coll::AllReduce:
      return 2.0 * (n - 1) / n;
    case Coll::ReduceScatter:
    case Coll::AllGather:
      return (n - 1) / n;
    case Coll::Broadcast:
      return 1.0;
  }
  return 1.0;
}

struct Options {
  Coll coll = Coll::AllReduce;
  std::string algo;
  size_t minBytes = 32u << 20;
  size_t maxBytes = 32u << 20;
  size_t stepBytes = 1u << 20;
  size_t stepFactor = 1;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  int root = 0;
  bool json = false;
  std::string storeDir;
  std::string iface;  // Gloo's TCP device on this interface (default: 127.0.0.1)
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Shape {
  size_t count = 0;      // count argument of the call
  size_t sendElems = 0;  // elements of the send buffer
  size_t recvElems = 0;  // elements of the receive buffer
  size_t bytes = 0;      // max(sendElems, recvElems) * sizeof(float)
};

Shape shapeFor(Coll c, size_t sizeBytes, int nranks) {
  const size_t elems = sizeBytes / sizeof(float);
  const size_t n = static_cast<size_t>(nranks);
  Shape s;
  switch (c) {
    case Coll::AllReduce:
    case Coll::Broadcast:
      s.count = elems;
      s.sendElems = elems;
      s.recvElems = elems;
      break;
    case Coll::AllGather:
      s.count = elems / (kBlockAlign * n) * kBlockAlign;
      s.sendElems = s.count;
      s.recvElems = s.count * n;
      break;
    case Coll::ReduceScatter:
      s.count = elems / (kBlockAlign * n) * kBlockAlign;
      s.sendElems = s.count * n;
      s.recvElems = s.count;
      break;
  }
  s.bytes = std::max(s.sendElems, s.recvElems) * sizeof(float);
  return s;
}

// "8", "64K", "1M", "2G" (powers of 1024; lower case accepted).
size_t parseSize(const std::string& text, const char* flag) {
  if (text.empty() || text[0] == '-') throw UsageError(std::string("invalid size for ") + flag);
  size_t pos = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &pos, 0);
  } catch (const std::exception&) {
    throw UsageError(std::string("invalid size for ") + flag + ": '" + text + "'");
  }
  const std::string suffix = text.substr(pos);
  unsigned shift = 0;
  if (suffix == "K" || suffix == "k") {
    shift = 10;
  } else if (suffix == "M" || suffix == "m") {
    shift = 20;
  } else if (suffix == "G" || suffix == "g") {
    shift = 30;
  } else if (!suffix.empty()) {
    throw UsageError(std::string("invalid size for ") + flag + ": '" + text + "'");
  }
  if (value > (~0ull >> shift)) throw UsageError(std::string("size too large for ") + flag);
  return static_cast<size_t>(value << shift);
}

long long parseInt(const char* text, const char* flag, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0' || value < lo || value > hi) {
    throw UsageError(std::string("invalid value for ") + flag + ": '" + text + "'");
  }
  return value;
}

// ---- Validation data: small integers, exact in float, whose sums stay exact -------------------

uint64_t mix(uint64_t rank, uint64_t index) {
  uint64_t x = index * 0x9E3779B97F4A7C15ull + (rank + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 32;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

// Inputs of reductions: 0..range-1 with range = clamp(120 / n, 1, 15) + 1 (as chorus-perf).
uint64_t reduceRange(int nranks) {
  return static_cast<uint64_t>(std::clamp(120 / std::max(nranks, 1), 1, 15)) + 1;
}

float reduceValue(int rank, size_t index, uint64_t range) {
  return static_cast<float>(mix(static_cast<uint64_t>(rank), index) % range);
}

// Data moved by all_gather and broadcast: 0..112.
float copyValue(int rank, size_t index) {
  return static_cast<float>(mix(static_cast<uint64_t>(rank), index) % 113);
}

// Host buffer aligned to 64 bytes, zeroed (so its pages are touched before timing).
struct Buffer {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> mem;

  explicit Buffer(size_t bytes) {
    const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    mem.reset(static_cast<float*>(std::aligned_alloc(64, rounded)));
    if (!mem) throw std::runtime_error("cannot allocate " + std::to_string(rounded) + " bytes");
    std::memset(mem.get(), 0, rounded);
  }
  float* data() const { return mem.get(); }
};

struct HalfResult {
  bool measured = false;  // false: N/A (this collective has no such mode here)
  double timeUs = 0;
  double algbw = 0;
  double busbw = 0;
  int64_t wrong = -1;  // -1: not checked
};

std::string formatTime(double us) {
  char buf[32];
  if (us >= 10000.0) {
    std::snprintf(buf, sizeof(buf), "%7.0f", us);
  } else if (us >= 100.0) {
    std::snprintf(buf, sizeof(buf), "%7.1f", us);
  } else {
    std::snprintf(buf, sizeof(buf), "%7.2f", us);
  }
  return buf;
}

// A double as JSON: the shortest of %.15g..%.17g that reads back exactly, with ".0" added to whole
// numbers (as nlohmann::json writes them, which chorus-perf uses); null when not finite.
std::string jsonDouble(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

// ---- The store directory -------------------------------------------------------------------------

std::string storeDirFor(const Options& o) {
  if (!o.storeDir.empty()) return o.storeDir;
  const char* addr = std::getenv("CHORUS_STORE_ADDR");
  if (!addr || !*addr) {
    throw UsageError("no store directory: give --store-dir DIR (fresh for every run) or run under chorusrun");
  }
  std::string id = addr;
  for (char& ch : id) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-') ch = '-';
  }
  return (std::filesystem::temp_directory_path() / ("chorus-compare-gloo-" + id)).string();
}

// Rank 0 creates the directory (true if it did); the others wait until it exists.
bool prepareStoreDir(const std::string& dir, int rank) {
  if (rank == 0) {
    if (mkdir(dir.c_str(), 0700) == 0) return true;
    if (errno != EEXIST)
      throw std::runtime_error("cannot create store directory " + dir + ": " + std::strerror(errno));
    return false;
  }
  const auto deadline = std::chrono::steady_clock::now() + kStoreDirWait;
  struct stat st {};
  while (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("store directory " + dir + " did not appear (is rank 0 running?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// ---- The benchmark -------------------------------------------------------------------------------

class Bench {
 public:
  Bench(std::shared_ptr<gloo::Context> ctx, const Options& o)
      : ctx_(std::move(ctx)),
        o_(o),
        rank_(ctx_->rank),
        size_(ctx_->size),
        send_(o.maxBytes),
        recv_(o.maxBytes),
        barrier_(ctx_),
        maxScalar_(ctx_, std::vector<double*>{&scalar_}, 1, gloo::ReductionFunction<double>::max),
        sumScalar_(ctx_, std::vector<double*>{&scalar_}, 1, gloo::ReductionFunction<double>::sum) {}

  void barrier() { barrier_.run(); }

  int run() {
    printHeader();
    for (size_t size = o_.minBytes; size <= o_.maxBytes;) {
      runSize(size);
      const size_t next = o_.stepFactor > 1 ? size * o_.stepFactor : size + o_.stepBytes;
      if (next <= size) break;  // overflow
      size = next;
    }
    if (rank_ == 0) {
      const double avg = bwCount_ ? bwSum_ / static_cast<double>(bwCount_) : 0.0;
      std::printf("# Out of bounds values : %" PRId64 " %s\n", errors_, errors_ ? "FAILED" : "OK");
      std::printf("# Avg bus bandwidth    : %g\n", avg);
      std::printf("#\n");
      std::fflush(stdout);
    }
    return errors_ ? 1 : 0;
  }

 private:
  double allReduceScalar(double v, bool max) {
    scalar_ = v;
    (max ? maxScalar_ : sumScalar_).run();
    return scalar_;
  }

  void printHeader() {
    struct RankInfo {
      int32_t pid;
      char host[60];
    };
    static_assert(sizeof(RankInfo) == 64);
    RankInfo mine{};
    mine.pid = static_cast<int32_t>(getpid());
    if (gethostname(mine.host, sizeof(mine.host) - 1) != 0) std::strcpy(mine.host, "unknown");
    std::vector<RankInfo> all(static_cast<size_t>(size_));
    gloo::AllgatherRing<uint8_t> gather(ctx_, {reinterpret_cast<const uint8_t*>(&mine)},
                                        reinterpret_cast<uint8_t*>(all.data()), sizeof(RankInfo));
    gather.run();
    if (rank_ != 0) return;
    if (o_.stepFactor > 1) {
      std::printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(factor)", o_.minBytes, o_.maxBytes,
                  o_.stepFactor);
    } else {
      std::printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(bytes)", o_.minBytes, o_.maxBytes,
                  o_.stepBytes);
    }
    std::printf(" warmup iters: %d iters: %d agg iters: 1 validation: %d graph: 0\n", o_.warmup, o_.iters,
                o_.check);
    std::printf("#\n# System: gloo\n");
    std::printf("# Library: Gloo %d.%d.%d (package %s), transport tcp on 127.0.0.1, algorithm %s\n",
                GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH, COMPARE_GLOO_PACKAGE,
                o_.algo.c_str());
    std::printf("#\n# Using devices\n");
    for (int r = 0; r < size_; ++r) {
      all[r].host[sizeof(all[r].host) - 1] = '\0';
      int local = 0;  // ranks before this one on the same host: its "device"
      for (int q = 0; q < r; ++q) local += std::strcmp(all[q].host, all[r].host) == 0;
      std::printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [cpu] host memory\n", r, 0,
                  static_cast<int>(all[r].pid), all[r].host, local);
    }
    std::printf("#\n");
    std::printf("#%62s%-35s%s\n", "", "out-of-place", "in-place");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count",
                "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
                "#wrong");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s\n", "(B)", "(elements)", "",
                "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)");
    std::fflush(stdout);
  }

  void runSize(size_t size) {
    const Shape shape = shapeFor(o_.coll, size, size_);
    HalfResult halves[2];
    halves[0] = runHalf(shape, false);
    if (collHasInPlace(o_.coll)) halves[1] = runHalf(shape, true);
    if (rank_ != 0) return;
    const char* redop = collReduces(o_.coll) ? "sum" : "none";
    const int root = o_.coll == Coll::Broadcast ? o_.root : -1;
    std::printf("%12zu  %12zu  %8s  %6s  %6i", shape.bytes, shape.count, "float", redop, root);
    for (const HalfResult& h : halves) {
      if (h.measured) {
        std::printf("  %7s  %6.2f  %6.2f  %5s", formatTime(h.timeUs).c_str(), h.algbw, h.busbw,
                    h.wrong < 0 ? "N/A" : std::to_string(h.wrong).c_str());
      } else {
        std::printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
      }
    }
    std::printf("\n");
    if (o_.json) {
      std::string j = "{\"collective\":\"" + std::string(entryFor(o_.coll).name) + "\"";
      j += ",\"size\":" + std::to_string(shape.bytes) + ",\"count\":" + std::to_string(shape.count);
      j += std::string(",\"type\":\"float\",\"redop\":\"") + redop + "\",\"root\":" + std::to_string(root);
      const char* prefixes[2] = {"oop_", "ip_"};
      for (int k = 0; k < 2; ++k) {
        const HalfResult& h = halves[k];
        const std::string p = std::string(",\"") + prefixes[k];
        j += p + "time_us\":" + (h.measured ? jsonDouble(h.timeUs) : "null");
        j += p + "algbw\":" + (h.measured ? jsonDouble(h.algbw) : "null");
        j += p + "busbw\":" + (h.measured ? jsonDouble(h.busbw) : "null");
        j += p + "wrong\":" + (h.measured && h.wrong >= 0 ? std::to_string(h.wrong) : "null");
      }
      j += ",\"ranks\":" + std::to_string(size_) + ",\"system\":\"gloo\",\"algo\":\"" + o_.algo + "\"}";
      std::printf("%s\n", j.c_str());
    }
    std::fflush(stdout);
  }

  // The Gloo algorithm object for one shape and layout. Gloo registers the buffers with the
  // transport when the object is made, so it is made once per row and half, outside the timing.
  std::unique_ptr<gloo::Algorithm> makeAlgorithm(const Shape& s, float* send, float* recv) {
    const int count = static_cast<int>(s.count);
    switch (o_.coll) {
      case Coll::AllReduce: {
        const std::vector<float*> ptrs{recv};
        if (o_.algo == "ring_chunked")
          return std::make_unique<gloo::AllreduceRingChunked<float>>(ctx_, ptrs, count);
        if (o_.algo == "halving_doubling") {
          return std::make_unique<gloo::AllreduceHalvingDoubling<float>>(ctx_, ptrs, count);
        }
        return std::make_unique<gloo::AllreduceRing<float>>(ctx_, ptrs, count);
      }
      case Coll::ReduceScatter: {
        const std::vector<int> recvElems(static_cast<size_t>(size_), count);
        return std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(ctx_, std::vector<float*>{recv},
                                                                           count * size_, recvElems);
      }
      case Coll::AllGather:
        return std::make_unique<gloo::AllgatherRing<float>>(ctx_, std::vector<const float*>{send}, recv,
                                                            count);
      case Coll::Broadcast:
        return std::make_unique<gloo::BroadcastOneToAll<float>>(
            ctx_, std::vector<float*>{rank_ == o_.root ? send : recv}, s.count, o_.root);
    }
    throw std::logic_error("unknown collective");
  }

  // Writes a sentinel (NaN) over the output, then this rank's input over `input` (in that order,
  // so that in-place layouts work).
  void prepare(float* input, size_t inputElems, float* output, size_t outputElems) {
    std::memset(output, 0xFF, outputElems * sizeof(float));
    if (o_.coll == Coll::Broadcast && rank_ != o_.root) return;
    const uint64_t range = reduceRange(size_);
    for (size_t i = 0; i < inputElems; ++i) {
      input[i] = collReduces(o_.coll) ? reduceValue(rank_, i, range) : copyValue(rank_, i);
    }
  }

  int64_t countWrong(const Shape& s, const float* out) const {
    const uint64_t range = reduceRange(size_);
    int64_t wrong = 0;
    switch (o_.coll) {
      case Coll::AllReduce:
      case Coll::ReduceScatter: {
        const size_t base = o_.coll == Coll::ReduceScatter ? static_cast<size_t>(rank_) * s.count : 0;
        for (size_t i = 0; i < s.recvElems; ++i) {
          float want = 0.0f;
          for (int r = 0; r < size_; ++r) want += reduceValue(r, base + i, range);
          wrong += !(out[i] == want);
        }
        break;
      }
      case Coll::AllGather:
        for (size_t i = 0; i < s.recvElems; ++i) {
          wrong += !(out[i] == copyValue(static_cast<int>(i / s.count), i % s.count));
        }
        break;
      case Coll::Broadcast:
        for (size_t i = 0; i < s.recvElems; ++i) wrong += !(out[i] == copyValue(o_.root, i));
        break;
    }
    return wrong;
  }

  HalfResult runHalf(const Shape& s, bool inPlace) {
    float* send = send_.data();
    float* recv = recv_.data();
    // Out-of-place reductions copy the send buffer into the receive buffer and reduce there;
    // in-place ones reduce the receive buffer, which holds the input.
    std::unique_ptr<gloo::Algorithm> algo;
    if (s.count > 0) algo = makeAlgorithm(s, send, recv);
    std::function<void()> op = [] {};
    if (algo) {
      gloo::Algorithm* a = algo.get();
      if (collReduces(o_.coll) && !inPlace) {
        const size_t copyBytes = s.sendElems * sizeof(float);
        op = [a, send, recv, copyBytes] {
          std::memcpy(recv, send, copyBytes);
          a->run();
        };
      } else {
        op = [a] { a->run(); };
      }
    }

    HalfResult h;
    h.measured = true;
    // The checked run's data whether or not it is checked (zeros stream faster than data on some
    // machines; chorus-perf does the same).
    if (inPlace) {
      prepare(recv, s.sendElems, recv, s.recvElems);  // the input is the whole buffer
    } else {
      prepare(send, s.sendElems, recv, s.recvElems);
    }
    // Gloo's classes send into their peers' registered buffers as soon as a peer starts: nobody
    // starts before everyone has written its buffers.
    barrier_.run();
    if (o_.check) {
      op();
      const float* out = o_.coll == Coll::Broadcast && rank_ == o_.root ? send : recv;
      const int64_t wrong = countWrong(s, out);
      h.wrong = static_cast<int64_t>(allReduceScalar(static_cast<double>(wrong), false));
      if (h.wrong > 0) ++errors_;
    }

    for (int i = 0; i < o_.warmup; ++i) op();
    barrier_.run();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o_.iters; ++i) op();
    const auto stop = std::chrono::steady_clock::now();
    double us = std::chrono::duration<double, std::micro>(stop - start).count() / o_.iters;
    us = allReduceScalar(us, true);

    h.timeUs = us;
    h.algbw = us > 0 ? static_cast<double>(s.bytes) / us / 1.0e3 : 0.0;
    h.busbw = h.algbw * busFactor(o_.coll, size_);
    bwSum_ += h.busbw;
    ++bwCount_;
    return h;
  }

  std::shared_ptr<gloo::Context> ctx_;
  const Options& o_;
  const int rank_;
  const int size_;
  Buffer send_;
  Buffer recv_;
  gloo::BarrierAllToAll barrier_;
  double scalar_ = 0.0;
  gloo::AllreduceRing<double> maxScalar_;
  gloo::AllreduceRing<double> sumScalar_;
  int64_t errors_ = 0;  // rows and halves with #wrong > 0
  double bwSum_ = 0;
  int64_t bwCount_ = 0;
};

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  return static_cast<int>(parseInt(v, name, 0, INT_MAX));
}

void printUsage() {
  std::printf(
      "Usage: compare-gloo <collective> [flags]   (ranks from CHORUS_RANK and CHORUS_WORLD_SIZE: chorusrun)\n"
      "  collective              all_reduce, reduce_scatter, all_gather or broadcast\n"
      "  -a, --algo NAME         all_reduce: ring (default), ring_chunked or halving_doubling;\n"
      "                          reduce_scatter: halving_doubling; all_gather: ring; broadcast: one_to_all\n"
      "  -b, --minbytes SIZE     smallest size, suffixes K M G (default 32M)\n"
      "  -e, --maxbytes SIZE     largest size (default 32M, at most 1G)\n"
      "  -i, --stepbytes SIZE    additive step when no factor > 1 is given (default 1M)\n"
      "  -f, --stepfactor N      multiplicative step (default 1: use -i)\n"
      "  -n, --iters N           timed iterations (default 20)\n"
      "  -w, --warmup_iters N    warm-up iterations (default 5)\n"
      "  -c, --check 0|1         validate results (default 1)\n"
      "  -d, --datatype float    data type (float only)\n"
      "  -o, --op sum            reduction (sum only)\n"
      "  -r, --root N            root of broadcast (default 0)\n"
      "      --json              also print each row as a JSON object\n"
      "      --store-dir DIR     FileStore directory, fresh for every run\n"
      "                          (default: /tmp/chorus-compare-gloo-<CHORUS_STORE_ADDR>)\n"
      "      --iface NAME        Gloo's TCP device on this interface (default: 127.0.0.1)\n");
}

// Returns false after --help.
bool parseArgs(int argc, char** argv, Options& o, bool quiet) {
  static const option kLong[] = {{"algo", required_argument, nullptr, 'a'},
                                 {"minbytes", required_argument, nullptr, 'b'},
                                 {"maxbytes", required_argument, nullptr, 'e'},
                                 {"stepbytes", required_argument, nullptr, 'i'},
                                 {"stepfactor", required_argument, nullptr, 'f'},
                                 {"iters", required_argument, nullptr, 'n'},
                                 {"warmup_iters", required_argument, nullptr, 'w'},
                                 {"check", required_argument, nullptr, 'c'},
                                 {"datatype", required_argument, nullptr, 'd'},
                                 {"op", required_argument, nullptr, 'o'},
                                 {"root", required_argument, nullptr, 'r'},
                                 {"json", no_argument, nullptr, 'J'},
                                 {"store-dir", required_argument, nullptr, 'S'},
                                 {"iface", required_argument, nullptr, 'I'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  std::string minText = "32M", maxText = "32M", stepText = "1M";
  bool maxGiven = false;
  opterr = quiet ? 0 : 1;
  for (;;) {
    const int c = getopt_long(argc, argv, "a:b:e:i:f:n:w:c:d:o:r:h", kLong, nullptr);
    if (c == -1) break;
    switch (c) {
      case 'a':
        o.algo = optarg;
        break;
      case 'b':
        minText = optarg;
        break;
      case 'e':
        maxText = optarg;
        maxGiven = true;
        break;
      case 'i':
        stepText = optarg;
        break;
      case 'f':
        o.stepFactor = static_cast<size_t>(parseInt(optarg, "-f", 1, 1 << 20));
        break;
      case 'n':
        o.iters = static_cast<int>(parseInt(optarg, "-n", 1, 1 << 30));
        break;
      case 'w':
        o.warmup = static_cast<int>(parseInt(optarg, "-w", 0, 1 << 30));
        break;
      case 'c':
        o.check = static_cast<int>(parseInt(optarg, "-c", 0, 1));
        break;
      case 'd':
        if (std::strcmp(optarg, "float") != 0 && std::strcmp(optarg, "float32") != 0 &&
            std::strcmp(optarg, "fp32") != 0) {
          throw UsageError(std::string("only -d float is supported (got '") + optarg + "')");
        }
        break;
      case 'o':
        if (std::strcmp(optarg, "sum") != 0)
          throw UsageError(std::string("only -o sum is supported (got '") + optarg + "')");
        break;
      case 'r':
        o.root = static_cast<int>(parseInt(optarg, "-r", INT_MIN, INT_MAX));
        break;
      case 'J':
        o.json = true;
        break;
      case 'I':
        o.iface = optarg;
        break;
      case 'S':
        o.storeDir = optarg;
        if (o.storeDir.empty()) throw UsageError("--store-dir needs a directory");
        break;
      case 'h':
        if (!quiet) printUsage();
        return false;
      default:
        throw UsageError("bad command line (see --help)");
    }
  }
  if (optind >= argc)
    throw UsageError("a collective is required: all_reduce, reduce_scatter, all_gather or broadcast");
  if (optind != argc - 1) throw UsageError("exactly one collective expected");
  const std::string name = argv[optind];
  const CollEntry* entry = nullptr;
  for (const CollEntry& e : collTable()) {
    if (name == e.name) entry = &e;
  }
  if (!entry)
    throw UsageError("unknown collective '" + name +
                     "' (all_reduce, reduce_scatter, all_gather or broadcast)");
  o.coll = entry->coll;
  if (o.algo.empty()) {
    o.algo = entry->algos.front();
  } else if (std::none_of(entry->algos.begin(), entry->algos.end(),
                          [&](const char* a) { return o.algo == a; })) {
    std::string known;
    for (const char* a : entry->algos) known += (known.empty() ? "" : ", ") + std::string(a);
    throw UsageError("unknown algorithm '" + o.algo + "' for " + name + " (" + known + ")");
  }
  o.minBytes = parseSize(minText, "-b");
  const size_t maxBytes = parseSize(maxText, "-e");
  o.maxBytes = maxGiven ? maxBytes : std::max(maxBytes, o.minBytes);
  o.stepBytes = parseSize(stepText, "-i");
  if (o.minBytes > o.maxBytes) throw UsageError("invalid sizes: minbytes > maxbytes");
  if (o.maxBytes > kMaxBufferBytes) throw UsageError("maxbytes above 1G (the largest buffer allowed)");
  if (o.stepFactor <= 1 && o.stepBytes == 0) throw UsageError("stepbytes must be > 0 without a step factor");
  if (o.stepFactor > 1 && o.minBytes == 0) throw UsageError("minbytes must be > 0 with a step factor");
  return true;
}

}  // namespace
}  // namespace compare_gloo

int main(int argc, char** argv) {
  using namespace compare_gloo;
  Options o;
  int rank = 0;
  int size = 1;
  try {
    // chorusrun's variables, else torchrun's (bench/net/run starts ranks in network namespaces).
    rank = envInt("CHORUS_RANK", envInt("RANK", 0));
    size = envInt("CHORUS_WORLD_SIZE", envInt("WORLD_SIZE", 1));
    if (rank >= size) throw UsageError("CHORUS_RANK must be below CHORUS_WORLD_SIZE");
    // Gloo's ring classes need a left and a right peer.
    if (size < 2) throw UsageError("needs at least 2 ranks: run it under chorusrun -n N (N >= 2)");
    if (!parseArgs(argc, argv, o, rank != 0)) return 0;
    if (o.coll == Coll::Broadcast && (o.root < 0 || o.root >= size)) {
      throw UsageError("root " + std::to_string(o.root) + " out of range for " + std::to_string(size) +
                       " ranks");
    }
  } catch (const UsageError& e) {
    // Every rank fails alike; rank 0 says why. The others give it a moment first: chorusrun stops
    // the remaining ranks as soon as one exits, which could cut rank 0 off before it has printed.
    if (rank == 0) {
      std::fprintf(stderr, "compare-gloo: %s\n", e.what());
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    return 2;
  }

  std::string storeDir;
  bool ownStoreDir = false;
  try {
    storeDir = storeDirFor(o);
    ownStoreDir = prepareStoreDir(storeDir, rank);
    gloo::transport::tcp::attr attr;
    if (o.iface.empty())
      attr.hostname = "127.0.0.1";
    else
      attr.iface = o.iface;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(kGlooTimeout);
    gloo::rendezvous::FileStore store(storeDir);
    context->connectFullMesh(store, device);

    Bench bench(context, o);
    bench.barrier();  // every rank is connected: the store is no longer needed
    if (ownStoreDir) {
      std::error_code ignored;
      std::filesystem::remove_all(storeDir, ignored);
      ownStoreDir = false;
    }
    const int status = bench.run();
    // No rank closes its connections while another still uses them. A rank that leaves this
    // barrier first may close before the others have noticed its message; their "connection
    // closed by peer" comes after every result and is not an error.
    try {
      bench.barrier();
    } catch (const std::exception&) {
    }
    return status;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "compare-gloo: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare-gloo: rank %d: %s\n", rank, e.what());
  }
  if (ownStoreDir) {
    std::error_code ignored;
    std::filesystem::remove_all(storeDir, ignored);
  }
  return 2;
}
