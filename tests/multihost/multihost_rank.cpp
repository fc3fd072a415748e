// One rank of a multi-host test, started by netns_hosts.sh with the torchrun variables.
//
//   multihost_rank kill
//     Every rank runs allreduces of 1 MiB; the last rank kills itself (SIGKILL) after 20 of them.
//     Every other rank must fail within 30 s with an error that names the killed rank, never hang
//     and never finish: it prints the error and exits 0; anything else exits non-zero.
//   multihost_rank mismatch
//     On a fresh split communicator per case, the last rank calls something else than the others
//     (another op, another collective, another count); with check mode off, every rank must get an
//     error saying the calls differ, well before the timeout (20 s), never a result. Prints each
//     error and exits 0; anything else exits non-zero.
//   multihost_rank basic
//     One exact allreduce and an allreduce on a split communicator (its own connections); the
//     test script checks the library's INFO lines for the transport, address family and streams.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.hpp"

using namespace chorus;

namespace {

int killMode() {
  Config config;
  config.timeout = std::chrono::seconds(60);
  Communicator comm = Communicator::fromEnvironment(config);
  const int victim = comm.size() - 1;
  std::vector<float> buf(size_t{1} << 18, 1.0f);
  auto start = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 100000; ++i) {
      if (comm.rank() == victim && i == 20) {
        std::printf("rank %d: killing myself after %d allreduces\n", comm.rank(), i);
        std::fflush(stdout);
        raise(SIGKILL);
      }
      if (i == 20) start = std::chrono::steady_clock::now();
      comm.allReduce(buf.data(), buf.data(), buf.size(), DataType::Float32, ReduceOp::Max);
    }
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string text = e.what();
    std::printf("rank %d: failed after %.2f s: %s\n", comm.rank(), s, text.c_str());
    std::fflush(stdout);
    // Stay a moment, as a real job's ranks do while they report: a survivor that exits at once
    // closes its connections, and over UCX a peer can see that close before the failure notice
    // sent just before it, and then name this rank instead of the killed one.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    if (text.find("rank " + std::to_string(victim)) == std::string::npos) {
      std::fprintf(stderr, "rank %d: the error does not name rank %d\n", comm.rank(), victim);
      return 1;
    }
    if (s > 30) {
      std::fprintf(stderr, "rank %d: took %.1f s to notice\n", comm.rank(), s);
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "rank %d: never noticed that rank %d was killed\n", comm.rank(), victim);
  return 1;
}

int mismatchMode() {
  Config config;
  config.timeout = std::chrono::seconds(20);
  config.checkCalls = false;
  Communicator comm = Communicator::fromEnvironment(config);
  const bool odd = comm.rank() == comm.size() - 1;
  struct Case {
    const char* name;
    void (*call)(Communicator&, bool, std::vector<float>&);
  };
  const Case cases[] = {
      {"op",
       [](Communicator& c, bool o, std::vector<float>& b) {
         c.allReduce(b.data(), b.data(), 262144, DataType::Float32, o ? ReduceOp::Max : ReduceOp::Sum);
       }},
      {"kind",
       [](Communicator& c, bool o, std::vector<float>& b) {
         if (o) {
           c.broadcast(b.data(), b.data(), 1024, DataType::Float32, 0);
         } else {
           c.allReduce(b.data(), b.data(), 1024, DataType::Float32, ReduceOp::Sum);
         }
       }},
      {"count",
       [](Communicator& c, bool o, std::vector<float>& b) {
         c.allReduce(b.data(), b.data(), o ? 2000 : 1000, DataType::Float32, ReduceOp::Sum);
       }},
  };
  int bad = 0;
  for (const Case& k : cases) {
    std::optional<Communicator> sub = comm.split(0, comm.rank());
    std::vector<float> buf(262144, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    std::string text;
    try {
      k.call(*sub, odd, buf);
      text = "succeeded";
    } catch (const Error& e) {
      text = e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d: %s mismatch after %.2f s: %s\n", comm.rank(), k.name, s, text.c_str());
    std::fflush(stdout);
    if ((text.find("mismatch") == std::string::npos &&
         text.find("different operations") == std::string::npos) ||
        s > 10) {
      std::fprintf(stderr, "rank %d: the %s mismatch was not reported as one in time\n", comm.rank(), k.name);
      ++bad;
    }
  }
  comm.barrier();
  return bad == 0 ? 0 : 1;
}

int basicMode() {
  Communicator comm = Communicator::fromEnvironment();
  const int n = comm.size();
  std::vector<int64_t> v(100003);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i) * (comm.rank() + 1);
  comm.allReduce(v.data(), v.data(), v.size(), DataType::Int64, ReduceOp::Sum);
  const int64_t f = int64_t{n} * (n + 1) / 2;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != static_cast<int64_t>(i) * f) {
      std::fprintf(stderr, "rank %d: element %zu is %lld\n", comm.rank(), i, static_cast<long long>(v[i]));
      return 1;
    }
  }
  // A split across hosts (even ranks) sets up its own connections.
  std::optional<Communicator> sub = comm.split(comm.rank() % 2, comm.rank());
  int64_t one = 1;
  sub->allReduce(&one, &one, 1, DataType::Int64, ReduceOp::Sum);
  if (one != sub->size()) {
    std::fprintf(stderr, "rank %d: split allreduce gave %lld, expected %d\n", comm.rank(),
                 static_cast<long long>(one), sub->size());
    return 1;
  }
  // Rank 0 serves the store: nobody leaves before every rank is done with it.
  comm.barrier();
  std::printf("rank %d: ok\n", comm.rank());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "basic";
  try {
    if (mode == "kill") return killMode();
    if (mode == "basic") return basicMode();
    if (mode == "mismatch") return mismatchMode();
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
  std::fprintf(stderr, "usage: multihost_rank basic|kill|mismatch\n");
  return 2;
}
