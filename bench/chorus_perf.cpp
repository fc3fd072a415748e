// chorus-perf: nccl-tests-compatible benchmark of Chorus collectives on host memory, or on CUDA
// device memory with --memory cuda (each rank on device rank % devices; several ranks may share one).
//
//   chorus-perf <collective> [flags]          ranks from the environment (chorusrun, torchrun, ...;
//                                             one rank without launcher variables)
//   chorus-perf <collective> -t N [flags]     N ranks as threads of this process
//
// collective: all_reduce, reduce_scatter, all_gather, broadcast, reduce, alltoall, sendrecv.
// The table is nccl-tests' (rank 0 prints it). Per row and mode (out-of-place, in-place):
//   size   bytes of the larger buffer: all_gather's receive buffer, reduce_scatter's send buffer,
//          alltoall's buffers (nranks blocks each); the buffer otherwise. The requested size is
//          rounded down so that this holds (blocks are multiples of 4 elements, as nccl-tests).
//   count  the count argument of the call: the per-rank block for all_gather, reduce_scatter and
//          alltoall; all elements otherwise.
//   time   microseconds per operation, averaged over -n iterations after -w warm-ups, max over ranks
//   algbw  size / time (GB/s, G = 1e9);  busbw = algbw * factor with factor 2(n-1)/n for all_reduce,
//          (n-1)/n for all_gather, reduce_scatter and alltoall, and 1 for broadcast, reduce, sendrecv
//   #wrong with -c 1: wrong elements summed over ranks in one validation run; N/A without it
//          (and for in-place sendrecv, which sends from and receives into one buffer, as nccl-tests).
// With --floor (host memory), each row also times the machine's floor in the same launch: every
// rank memcpy's `size` bytes from its send buffer into its receive buffer, all ranks at once, -n
// times before the out-of-place run and -n times after the in-place run. The JSON row gets
// copy_us (per copy, the mean of the two, max over ranks), copy_gbps (the ranks' aggregate rate,
// read and write counted as STREAM does: 2 * nranks * size / copy_us) and copy_change (the rate
// after / before: far from 1, the machine changed pace during the row).
// Exit status: 0, 1 if any result was wrong, 2 on a usage or library error.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.hpp"
#include "perf_coll.hpp"
#include "perf_data.hpp"
#if CHORUS_PERF_CUDA
#include "cuda/cuda_kernels.hpp"
#endif

namespace chorus_perf {
namespace {

constexpr size_t kMaxBufferBytes = size_t{1} << 30;

struct Options {
  Coll coll = Coll::AllReduce;
  size_t minBytes = 32u << 20;
  size_t maxBytes = 32u << 20;
  size_t stepBytes = 1u << 20;
  size_t stepFactor = 1;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  int root = 0;
  int threads = 0;  // 0: ranks from the environment
  bool json = false;
  bool memAlloc = false;
  bool cuda = false;   // --memory cuda: device buffers, calls on a stream
  bool floor = false;  // --floor: time a plain copy of the same buffers in the same launch
  std::vector<TypeDesc> types;
  std::vector<OpDesc> ops;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "8", "64K", "1M", "2G" (powers of 1024; lower case accepted).
size_t parseSize(const std::string& text, const char* flag) {
  size_t pos = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &pos, 0);
  } catch (const std::exception&) {
    throw UsageError(std::string("invalid size for ") + flag + ": '" + text + "'");
  }
  if (!text.empty() && text[0] == '-') throw UsageError(std::string("negative size for ") + flag);
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

// Host buffer aligned to 64 bytes, zeroed (so its pages are touched before timing); from
// chorus::memAlloc (peers read it in place) with -M 1.
struct Buffer {
  struct Free {
    bool shared;
    void operator()(void* p) const { shared ? chorus::memFree(p) : std::free(p); }
  };
  std::unique_ptr<void, Free> mem;

  Buffer(size_t bytes, bool shared) : mem(nullptr, Free{shared}) {
    const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    mem.reset(shared ? chorus::memAlloc(rounded) : std::aligned_alloc(64, rounded));
    if (!mem) throw std::runtime_error("cannot allocate " + std::to_string(rounded) + " bytes");
    std::memset(mem.get(), 0, rounded);
  }
  char* data() const { return static_cast<char*>(mem.get()); }
};

// --memory cuda: this rank's device, buffers and stream. The host buffers stay, as the mirrors that
// results are prepared and checked in.
struct DeviceSide {
  DeviceSide(size_t bytes, int rank);
  ~DeviceSide();
  DeviceSide(const DeviceSide&) = delete;
  DeviceSide& operator=(const DeviceSide&) = delete;
  int device = 0;
  char* send = nullptr;
  char* recv = nullptr;
  void* stream = nullptr;
};
#if CHORUS_PERF_CUDA
namespace cu = chorus::kernels::cuda;
DeviceSide::DeviceSide(size_t bytes, int rank) {
  std::string why;
  const int devices = cu::deviceCount(&why);
  if (devices == 0) throw std::runtime_error("--memory cuda: no CUDA device (" + why + ")");
  device = rank % devices;
  cu::setDevice(device);
  send = static_cast<char*>(cu::deviceAlloc(std::max<size_t>(bytes, 64)));
  recv = static_cast<char*>(cu::deviceAlloc(std::max<size_t>(bytes, 64)));
  stream = cu::streamCreate();
}
DeviceSide::~DeviceSide() {
  cu::streamDestroy(stream);
  cu::deviceFree(send);
  cu::deviceFree(recv);
}
#else
DeviceSide::DeviceSide(size_t, int) {
  throw std::runtime_error("--memory cuda: this build of chorus-perf has no CUDA");
}
DeviceSide::~DeviceSide() = default;
#endif

// One half (out-of-place or in-place) of a table row.
struct HalfResult {
  double timeUs = 0;
  double algbw = 0;
  double busbw = 0;
  int64_t wrong = -1;  // -1: not checked (N/A)
};

void printHeader(chorus::Communicator& comm, const Options& o, const DeviceSide* dev) {
  struct RankInfo {
    int32_t pid;
    int32_t device;
    char host[56];
    char deviceName[64];
  };
  static_assert(sizeof(RankInfo) == 128);
  RankInfo mine{};
  mine.pid = static_cast<int32_t>(getpid());
  if (dev) {
    mine.device = dev->device;
#if CHORUS_PERF_CUDA
    std::snprintf(mine.deviceName, sizeof(mine.deviceName), "%s", cu::deviceName().c_str());
#endif
  }
  if (gethostname(mine.host, sizeof(mine.host) - 1) != 0) std::strcpy(mine.host, "unknown");
  mine.host[sizeof(mine.host) - 1] = '\0';
  const int n = comm.size();
  std::vector<RankInfo> all(static_cast<size_t>(n));
  comm.allGather(&mine, all.data(), sizeof(RankInfo), chorus::DataType::Uint8);
  if (comm.rank() != 0) return;

  if (o.stepFactor > 1) {
    std::printf("# nThread %d nGpus 1 minBytes %zu maxBytes %zu step: %zu(factor)", std::max(o.threads, 1),
                o.minBytes, o.maxBytes, o.stepFactor);
  } else {
    std::printf("# nThread %d nGpus 1 minBytes %zu maxBytes %zu step: %zu(bytes)", std::max(o.threads, 1),
                o.minBytes, o.maxBytes, o.stepBytes);
  }
  std::printf(" warmup iters: %d iters: %d agg iters: 1 validation: %d graph: 0\n", o.warmup, o.iters,
              o.check);
  std::printf("#\n# Using devices\n");
  for (int r = 0; r < n; ++r) {
    all[r].host[sizeof(all[r].host) - 1] = '\0';
    int local = 0;  // ranks before this one on the same host: its "device"
    for (int q = 0; q < r; ++q) local += std::strcmp(all[q].host, all[r].host) == 0;
    if (o.cuda) {
      std::printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [cuda] %s\n", r, 0,
                  static_cast<int>(all[r].pid), all[r].host, all[r].device, all[r].deviceName);
    } else {
      std::printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [cpu] %s\n", r, 0,
                  static_cast<int>(all[r].pid), all[r].host, local,
                  o.memAlloc ? "host memory from chorusMemAlloc" : "host memory");
    }
  }
  std::printf("#\n");
  std::printf("#%62s%-35s%s\n", "", "out-of-place", "in-place");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type",
              "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s\n", "(B)", "(elements)", "", "",
              "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)");
  std::fflush(stdout);
}

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

std::string formatWrong(int64_t wrong) {
  if (wrong < 0) return "N/A";
  return std::to_string(wrong);
}

nlohmann::json jsonWrong(int64_t wrong) {
  return wrong < 0 ? nlohmann::json(nullptr) : nlohmann::json(wrong);
}

class Bench {
 public:
  Bench(chorus::Communicator& comm, const Options& o)
      : comm_(comm),
        o_(o),
        send_(o.maxBytes, o.memAlloc),
        recv_(o.maxBytes, o.memAlloc),
        dev_(o.cuda ? std::make_unique<DeviceSide>(o.maxBytes, comm.rank()) : nullptr),
        printer_(comm.rank() == 0) {}

  // Runs every row; returns the process exit status (0, or 1 if any result was wrong).
  int run() {
    printHeader(comm_, o_, dev_.get());
    static const std::vector<OpDesc> kNoOp = {{chorus::ReduceOp::Sum, "none"}};
    const std::vector<OpDesc>& ops = collReduces(o_.coll) ? o_.ops : kNoOp;
    for (const TypeDesc& type : o_.types) {
      for (const OpDesc& op : ops) {
        for (size_t size = o_.minBytes; size <= o_.maxBytes;) {
          runSize(size, type, op);
          const size_t next = o_.stepFactor > 1 ? size * o_.stepFactor : size + o_.stepBytes;
          if (next <= size) break;  // overflow
          size = next;
        }
      }
    }
    if (printer_) {
      const double avg = bwCount_ ? bwSum_ / bwCount_ : 0.0;
      std::printf("# Out of bounds values : %" PRId64 " %s\n", errors_, errors_ ? "FAILED" : "OK");
      std::printf("# Avg bus bandwidth    : %g\n", avg);
      std::printf("#\n");
      std::fflush(stdout);
    }
    return errors_ ? 1 : 0;
  }

 private:
  void runSize(size_t size, const TypeDesc& type, const OpDesc& op) {
    const int n = comm_.size();
    const Shape shape = shapeFor(o_.coll, size, type.size, n);
    const int root = collRooted(o_.coll) ? o_.root : -1;
    HalfResult halves[2];
    const double copyBefore = o_.floor ? timeCopies(shape.bytes) : 0.0;
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      halves[inPlace] = runHalf(shape, type, op, inPlace != 0);
    }
    const double copyAfter = o_.floor ? timeCopies(shape.bytes) : 0.0;
    if (!printer_) return;
    std::printf("%12zu  %12zu  %8s  %6s  %6i", shape.bytes, shape.count, type.name, op.name, root);
    for (const HalfResult& h : halves) {
      std::printf("  %7s  %6.2f  %6.2f  %5s", formatTime(h.timeUs).c_str(), h.algbw, h.busbw,
                  formatWrong(h.wrong).c_str());
    }
    std::printf("\n");
    if (o_.json) {
      nlohmann::ordered_json j;
      j["collective"] = collName(o_.coll);
      j["size"] = shape.bytes;
      j["count"] = shape.count;
      j["type"] = type.name;
      j["redop"] = op.name;
      j["root"] = root;
      const char* prefixes[2] = {"oop_", "ip_"};
      for (int k = 0; k < 2; ++k) {
        const std::string p = prefixes[k];
        j[p + "time_us"] = halves[k].timeUs;
        j[p + "algbw"] = halves[k].algbw;
        j[p + "busbw"] = halves[k].busbw;
        j[p + "wrong"] = jsonWrong(halves[k].wrong);
      }
      j["ranks"] = n;
      if (o_.floor) {
        const double us = (copyBefore + copyAfter) / 2;
        j["copy_us"] = us;
        j["copy_gbps"] = us > 0 ? 2.0 * n * static_cast<double>(shape.bytes) / us / 1.0e3 : 0.0;
        j["copy_change"] = copyAfter > 0 ? copyBefore / copyAfter : 0.0;
      }
      std::printf("%s\n", j.dump().c_str());
    }
    std::fflush(stdout);
  }

  HalfResult runHalf(const Shape& shape, const TypeDesc& type, const OpDesc& op, bool inPlace) {
    const int rank = comm_.rank();
    const size_t r = static_cast<size_t>(rank);
    // Offsets into the buffers (in place: into the receive buffer), the same on host and device.
    size_t sendAt = 0, recvAt = 0;
    bool sendInRecv = false;
    if (inPlace) {
      sendAt = shape.sendInplaceOffset * r * type.size;
      recvAt = shape.recvInplaceOffset * r * type.size;
      sendInRecv = true;
    }
    char* send = (sendInRecv ? recv_.data() : send_.data()) + sendAt;
    char* recv = recv_.data() + recvAt;
    const void* devSend = send;
    void* devRecv = recv;
    chorus::CudaStream stream;
    if (dev_) {
      devSend = (sendInRecv ? dev_->recv : dev_->send) + sendAt;
      devRecv = dev_->recv + recvAt;
      stream.handle = dev_->stream;
    }
    auto issue = [&] {
      runColl(comm_, o_.coll, devSend, devRecv, shape.count, type.type, op.op, o_.root, stream);
    };
    HalfResult h;
    // In-place sendrecv reads and writes one buffer concurrently: timed, not checked (nccl-tests).
    const bool checkable = !(inPlace && o_.coll == Coll::SendRecv);
    CheckSpec spec;
    spec.coll = o_.coll;
    spec.type = type.type;
    spec.op = op.op;
    spec.root = o_.root;
    spec.rank = rank;
    spec.nranks = comm_.size();
    spec.shape = shape;
    // The buffers hold the checked run's data whether or not it is checked: zeros are not a fair
    // input on host memory, where a streamed (non-temporal) line of zeros can cost a fraction of a
    // line of data (2 MiB per thread on the EPYC VM: 91 against 42 GB/s; docs/performance.md).
    prepareBuffers(spec, send, recv);
    toDevice(shape, type);
    if (o_.check && checkable) {
      issue();
      fromDevice(shape, type);
      int64_t wrong = static_cast<int64_t>(countWrong(spec, recv));
      comm_.allReduce(&wrong, &wrong, 1, chorus::DataType::Int64, chorus::ReduceOp::Sum);
      h.wrong = wrong;
      if (wrong > 0) ++errors_;
    }

    for (int i = 0; i < o_.warmup; ++i) issue();
    waitStream();
    comm_.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o_.iters; ++i) issue();
    waitStream();
    const auto stop = std::chrono::steady_clock::now();
    double us = std::chrono::duration<double, std::micro>(stop - start).count() / o_.iters;
    comm_.allReduce(&us, &us, 1, chorus::DataType::Float64, chorus::ReduceOp::Max);

    h.timeUs = us;
    h.algbw = us > 0 ? static_cast<double>(shape.bytes) / us / 1.0e3 : 0.0;
    h.busbw = h.algbw * busFactor(o_.coll, comm_.size());
    bwSum_ += h.busbw;
    ++bwCount_;
    return h;
  }

  // --floor: microseconds per memcpy of `bytes` from this rank's send buffer into its receive
  // buffer, every rank copying at once, over -n copies; the slowest rank's. The buffers keep data
  // (the receive buffer then holds the send buffer's, which the next row prepares again).
  double timeCopies(size_t bytes) {
    comm_.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o_.iters; ++i) std::memcpy(recv_.data(), send_.data(), bytes);
    comm_.barrier();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
                o_.iters;
    comm_.allReduce(&us, &us, 1, chorus::DataType::Float64, chorus::ReduceOp::Max);
    return us;
  }

  // --memory cuda: the prepared host buffers to the device; the results back (after the stream).
  void toDevice(const Shape& shape, const TypeDesc& type) {
#if CHORUS_PERF_CUDA
    if (!dev_) return;
    // On the rank's stream: a copy on the legacy stream could race the kernels (ranks' streams do not
    // wait for it), and a device-wide wait could wait for a peer's kernel that waits for this rank.
    const size_t bytes = std::max(shape.sendElems, shape.recvElems) * type.size;
    cu::copyAsync(dev_->send, send_.data(), bytes, dev_->stream);
    cu::copyAsync(dev_->recv, recv_.data(), bytes, dev_->stream);
    cu::streamSynchronize(dev_->stream);
#else
    (void)shape;
    (void)type;
#endif
  }
  void fromDevice(const Shape& shape, const TypeDesc& type) {
#if CHORUS_PERF_CUDA
    if (!dev_) return;
    // The collective done first: a copy into pageable memory queued behind a kernel blocks in the
    // driver until the kernel is done, and can hold up a peer's own pageable copy (toDevice) that
    // must finish before that peer launches its side (seen as a hang with 4 ranks on one H200).
    cu::streamSynchronize(dev_->stream);
    cu::copyAsync(recv_.data(), dev_->recv, std::max(shape.sendElems, shape.recvElems) * type.size,
                  dev_->stream);
    cu::streamSynchronize(dev_->stream);
#else
    (void)shape;
    (void)type;
#endif
  }
  void waitStream() {
#if CHORUS_PERF_CUDA
    if (dev_) cu::streamSynchronize(dev_->stream);
#endif
  }

  chorus::Communicator& comm_;
  const Options& o_;
  Buffer send_;
  Buffer recv_;
  std::unique_ptr<DeviceSide> dev_;
  bool printer_;
  int64_t errors_ = 0;  // results with #wrong > 0
  double bwSum_ = 0;
  int64_t bwCount_ = 0;
};

int benchRank(chorus::Communicator& comm, const Options& o) {
  if (collRooted(o.coll) && (o.root < 0 || o.root >= comm.size())) {
    throw UsageError("root " + std::to_string(o.root) + " out of range for " + std::to_string(comm.size()) +
                     " ranks");
  }
  Bench bench(comm, o);
  return bench.run();
}

// -t N: N ranks as threads of this process, each driving its own communicator.
int runThreads(const Options& o) {
  std::vector<chorus::Communicator> comms = chorus::Communicator::createLocal(o.threads);
  std::vector<int> status(comms.size(), 0);
  std::mutex mutex;
  std::string firstError;
  std::vector<std::thread> threads;
  threads.reserve(comms.size());
  for (size_t i = 0; i < comms.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        status[i] = benchRank(comms[i], o);
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          if (firstError.empty()) firstError = e.what();
        }
        status[i] = 2;
        try {
          comms[i].abort();  // fails the other threads' operations instead of leaving them waiting
        } catch (...) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!firstError.empty()) {
    std::fprintf(stderr, "chorus-perf: %s\n", firstError.c_str());
    return 2;
  }
  return *std::max_element(status.begin(), status.end());
}

int runProcess(const Options& o) {
  chorus::Communicator comm = chorus::Communicator::fromEnvironment();
  try {
    return benchRank(comm, o);
  } catch (...) {
    try {
      comm.abort();
    } catch (...) {
    }
    throw;
  }
}

}  // namespace
}  // namespace chorus_perf

int main(int argc, char** argv) {
  using namespace chorus_perf;
  Options o;
  std::string collective;
  std::string minText = "32M", maxText = "32M", stepText = "1M";
  std::string typeText = "float", opText = "sum";
  int ngpus = 1;

  CLI::App app{"chorus-perf: nccl-tests-compatible benchmark of Chorus collectives", "chorus-perf"};
  app.add_option("collective", collective,
                 "all_reduce, reduce_scatter, all_gather, broadcast, reduce, "
                 "alltoall or sendrecv")
      ->required()
      ->check(CLI::IsMember(
          {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "alltoall", "sendrecv"}));
  app.add_option("-t,--threads", o.threads,
                 "ranks as threads of this process (default: from the environment)")
      ->check(CLI::Range(1, 4096));
  app.add_option("-g,--ngpus", ngpus, "devices per thread (only 1)")->check(CLI::Range(1, 1));
  app.add_option("-b,--minbytes", minText, "smallest size, suffixes K M G (default 32M)");
  auto* maxOpt = app.add_option("-e,--maxbytes", maxText, "largest size (default 32M, at most 1G)");
  app.add_option("-i,--stepbytes", stepText, "additive step when no factor > 1 is given (default 1M)");
  app.add_option("-f,--stepfactor", o.stepFactor, "multiplicative step (default 1: use -i)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("-n,--iters", o.iters, "timed iterations (default 20)")->check(CLI::Range(1, 1 << 30));
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations (default 5)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("-c,--check", o.check, "validate results: 0 or 1 (default 1)")->check(CLI::Range(0, 1));
  app.add_option("-o,--op", opText, "sum, prod, min, max, avg or all (default sum)");
  app.add_option("-d,--datatype", typeText,
                 "int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16 or all "
                 "(default float)");
  app.add_option("-r,--root", o.root, "root of broadcast and reduce (default 0)");
  app.add_flag("--json", o.json, "also print each row as a JSON object");
  app.add_flag("--floor", o.floor,
               "host memory: also time a memcpy of the same buffers by every rank at once (JSON copy_us, "
               "copy_gbps, copy_change)");
  std::string memory = "host";
  app.add_option("--memory", memory,
                 "host, or cuda: device buffers, each rank on device rank % devices, calls on a stream")
      ->check(CLI::IsMember({"host", "cuda"}));
  int memAlloc = 0;
  app.add_option("-M,--memalloc", memAlloc,
                 "1: buffers from chorus::memAlloc, which peers read in place (zero copy); default 0")
      ->check(CLI::Range(0, 1));
  try {
    app.parse(argc, argv);
    o.memAlloc = memAlloc != 0;
    o.cuda = memory == "cuda";
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    o.coll = *collFromName(collective);
    o.minBytes = parseSize(minText, "-b");
    o.maxBytes = maxOpt->count() ? parseSize(maxText, "-e") : std::max(parseSize(maxText, "-e"), o.minBytes);
    o.stepBytes = parseSize(stepText, "-i");
    if (o.minBytes > o.maxBytes) throw UsageError("invalid sizes: minbytes > maxbytes");
    if (o.floor && o.cuda) throw UsageError("--floor times host copies: not with --memory cuda");
    if (o.maxBytes > kMaxBufferBytes) throw UsageError("maxbytes above 1G (the largest buffer allowed)");
    if (o.stepFactor <= 1 && o.stepBytes == 0)
      throw UsageError("stepbytes must be > 0 without a step factor");
    if (o.stepFactor > 1 && o.minBytes == 0) throw UsageError("minbytes must be > 0 with a step factor");
    if (typeText == "all") {
      o.types = allTypes();
    } else if (auto t = typeFromName(typeText)) {
      o.types = {*t};
    } else {
      throw UsageError("unknown datatype '" + typeText + "'");
    }
    if (opText == "all") {
      o.ops = allOps();
    } else if (auto op = opFromName(opText)) {
      o.ops = {*op};
    } else {
      throw UsageError("unknown op '" + opText + "'");
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "chorus-perf: %s\n", e.what());
    return 2;
  }

  try {
    return o.threads > 0 ? runThreads(o) : runProcess(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-perf: %s\n", e.what());
    return 2;
  }
}
