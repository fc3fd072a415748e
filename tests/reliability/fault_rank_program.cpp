// One rank of a job in which one rank dies, for the process-level fault tests.
//
// Usage: fault_rank_program MODE VICTIM
//   after-init      the victim kills itself (SIGKILL) once every rank has initialised; the others
//                   then call allreduce.
//   mid-collective  every rank loops over large allreduces; the victim kills itself from another
//                   thread ~150 ms into the loop.
//   stopped         as mid-collective, but the victim stops itself (SIGSTOP); the driver continues it
//                   (SIGCONT) once the others have failed, and it reports too
//   before-init     the victim kills itself before joining; the others try to join.
//   shrink          as after-init; then the survivors form a communicator without the victim
//                   (chorusCommShrink) and allreduce on it, printing a second line
//                   shrink=<code> rank=<new rank> size=<new size> sum=<allreduce of rank+1> message=<text>
//   mismatch-count  every rank allreduces 256K floats in chorusMemAlloc buffers, but VICTIM 512K
//   mismatch-kind   as mismatch-count, but VICTIM broadcasts 256K floats from rank 0 instead
//                   (both: the zero-copy path; the driver unsets CHORUS_CHECK)
//   mismatch-count-heap, mismatch-kind-heap
//                   on heap buffers: every rank allreduces 1000 floats but VICTIM 2000; or
//                   every rank allreduces 1024 floats but VICTIM broadcasts them from rank 0
//   bad-setting     VICTIM has CHORUS_SHM_FIFO_BYTES=banana; every rank joins and reports how
//                   its init ended
//   shm-setup       every rank joins and reports how its init ended; VICTIM (-1: none) is killed
//                   inside the creation of its shared-memory segment, 500 ms after reserving it
//                   (fallocate_fault.cpp), leaving the segment's name in /dev/shm
//   zero-copy-death every rank allreduces 256K floats in chorusMemAlloc buffers; VICTIM is killed
//                   as it maps its peers' buffers, which the others map 300 ms later
//                   (fallocate_fault.cpp): they find it dead
//   single-copy-death, single-copy-mismatch
//                   every rank all-gathers 64K floats per rank from heap buffers, read in place
//                   by the peers (single copy: the driver sets CHORUS_CMA); VICTIM is killed as it
//                   reads its peers' buffers, which the others read 300 ms later; or VICTIM
//                   all-gathers 128K floats
//   single-copy-declined
//                   VICTIM has CHORUS_CMA=0; every rank all-gathers 64K floats per rank from heap
//                   buffers and prints ok=<1 if exact> rank=<r>
//   serve-id        makes a unique id, prints it in hex and serves its store for VICTIM seconds
//   join-id         VICTIM is a chorusUniqueId in hex: join it as rank 1 of 2 and report how the
//                   init ended (the driver points the id at a dead, silent or foreign server).
//   intruder        (run under chorusrun, which sets CHORUS_SECRET) rank VICTIM keeps attacking the
//                   job's store from a second thread, from before init until the job is done: a
//                   client without the secret, one with a wrong secret, and a raw connection sending a
//                   request where the hello belongs. Meanwhile every rank joins and runs 40 checked
//                   allreduces. Each rank prints
//                   job_ok=<0|1> rank=<r>
//                   and the attacker also prints attempts=<n> refused=<n> detail=<first unexpected outcome>
// Rank and size come from the environment (CHORUS_RANK / CHORUS_WORLD_SIZE + a store).
//
// A survivor prints one line
//   result=<code> elapsed_ms=<ms> async=<code> again=<code> again_ms=<ms> message=<text>
// (elapsed: from the start of the failing call, or for mid-collective from the start of the loop),
// in modes after-init, shrink, mid-collective and stopped then destroys the communicator and prints
//   destroy_ms=<ms> destroy=<code>      (shrink first: destroy_shrunk_ms=<ms>, for the shrunk one)
// and exits 0; the driver judges the values. Exit 2: init failed where it should not; 3: the
// failure never came.
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "chorus/chorus.h"
#include "chorus/chorus.hpp"
#include "chorus/store.hpp"

void armFallocateFault(long delayMs);  // fallocate_fault.cpp
void armPeerBufferFault(bool die);
void armPeerReadFault(bool die, long waitMs = 300);

namespace {

using Clock = std::chrono::steady_clock;

long long msSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

int envInt(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

void report(chorusResult_t result, long long elapsed, chorusComm_t comm, const std::string& message) {
  chorusResult_t async = chorusSuccess;
  chorusResult_t again = chorusSuccess;
  long long againMs = -1;
  if (comm) {
    chorusCommGetAsyncError(comm, &async);
    // A later call on the broken communicator fails fast.
    float x = 1, y = 0;
    auto t0 = Clock::now();
    again = chorusAllReduce(&x, &y, 1, chorusFloat32, chorusSum, comm, nullptr);
    againMs = msSince(t0);
  }
  std::string oneLine = message;
  for (char& c : oneLine) {
    if (c == '\n') c = ' ';
  }
  std::printf("result=%d elapsed_ms=%lld async=%d again=%d again_ms=%lld message=%s\n",
              static_cast<int>(result), elapsed, static_cast<int>(async), static_cast<int>(again), againMs,
              oneLine.c_str());
  std::fflush(stdout);
}

// Destroys `comm` and prints how long that took: destroy_ms=<ms> result=<code>.
void reportDestroy(chorusComm_t comm) {
  auto t0 = Clock::now();
  chorusResult_t r = chorusCommDestroy(comm);
  std::printf("destroy_ms=%lld destroy=%d\n", msSince(t0), static_cast<int>(r));
  std::fflush(stdout);
}

// One attack on the store at 127.0.0.1:port; true if the store refused it.
bool attack(int kind, uint16_t port, std::string* unexpected) {
  if (kind < 2) {
    const std::string secret = kind == 0 ? std::string() : std::string("not-the-job-secret-0123456789");
    try {
      auto store = chorus::makeTcpStore("127.0.0.1", port, std::chrono::seconds(5), secret);
      store->setString("intruder/was/here", "1");
      *unexpected = "a client with " + std::string(kind == 0 ? "no" : "a wrong") + " secret was served";
      return false;
    } catch (const chorus::Error& e) {
      if (e.code() == chorusInvalidUsage) return true;
      *unexpected = e.what();
      return false;
    }
  }
  // Raw: read the greeting, answer with a SET request, expect to be hung up on.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool refused = false;
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    unsigned char request[80] = {1, 16, 0, 0, 0, 51};  // SET, 16-byte key, 51-byte value
    std::memcpy(request + 13, "intruder/was/her", 16);
    (void)::send(fd, request, sizeof request, MSG_NOSIGNAL);
    unsigned char buf[256];
    size_t got = 0;
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) break;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        refused = got <= 96;  // at most the hello and a refusing verdict, then the close
        break;
      }
      got += static_cast<size_t>(n);
    }
  }
  if (fd >= 0) ::close(fd);
  if (!refused) *unexpected = "a raw connection was not hung up on";
  return refused;
}

int intruderMode(int myRank, int attacker) {
  std::atomic<bool> stop{false};
  int attempts = 0, refused = 0;
  std::string unexpected;
  std::thread thief;
  if (myRank == attacker) {
    const char* addr = std::getenv("CHORUS_STORE_ADDR");
    const char* colon = addr ? std::strrchr(addr, ':') : nullptr;
    if (!colon) {
      std::fprintf(stderr, "intruder mode needs CHORUS_STORE_ADDR (run it under chorusrun)\n");
      return 64;
    }
    const auto port = static_cast<uint16_t>(std::atoi(colon + 1));
    thief = std::thread([&, port] {
      for (int kind = 0; !stop.load() || attempts < 3; kind = (kind + 1) % 3) {
        ++attempts;
        std::string why;
        if (attack(kind, port, &why)) ++refused;
        if (unexpected.empty()) unexpected = why;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  bool ok = false;
  try {
    auto comm = chorus::Communicator::fromEnvironment();
    ok = true;
    std::vector<float> in(1 << 16), out(1 << 16);
    for (int iter = 0; iter < 40; ++iter) {
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((myRank + 1) * (iter + 1) + i % 7);
      comm.allReduce(in.data(), out.data(), in.size(), chorus::DataType::Float32, chorus::ReduceOp::Sum);
      const int n = comm.size();
      for (size_t i = 0; i < out.size(); ++i) {
        const float expect = static_cast<float>((iter + 1) * n * (n + 1) / 2 + n * static_cast<int>(i % 7));
        if (out[i] != expect) ok = false;
      }
    }
    comm.barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", myRank, e.what());
    ok = false;
  }
  if (thief.joinable()) {
    stop = true;
    thief.join();
    std::printf("attempts=%d refused=%d detail=%s\n", attempts, refused, unexpected.c_str());
  }
  std::printf("job_ok=%d rank=%d\n", ok ? 1 : 0, myRank);
  std::fflush(stdout);
  return 0;
}

}  // namespace

// The end of a call that must fail: false (and a line on stderr) if it succeeded; else reports how
// it failed and destroys the communicator.
bool reportFailedCall(chorusResult_t r, long long elapsedMs, chorusComm_t comm, int myRank,
                      const std::string& mode) {
  if (r == chorusSuccess) {
    std::fprintf(stderr, "rank %d: %s: the call succeeded\n", myRank, mode.c_str());
    return false;
  }
  report(r, elapsedMs, comm, chorusGetLastError(comm));
  chorusCommDestroy(comm);
  return true;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: fault_rank_program after-init|mid-collective|before-init|shrink|intruder VICTIM\n"
                 "       fault_rank_program join-id HEX_ID\n");
    return 64;
  }
  const std::string mode = argv[1];
  const int victim = std::atoi(argv[2]);
  const int myRank = envInt("CHORUS_RANK");
  if (mode == "intruder") return intruderMode(myRank, victim);
  if (mode == "bad-setting") {
    if (myRank == victim) setenv("CHORUS_SHM_FIFO_BYTES", "banana", 1);
    chorusComm_t comm = nullptr;
    auto t0 = Clock::now();
    chorusResult_t r = chorusCommInitFromEnv(&comm);
    long long elapsed = msSince(t0);
    if (r == chorusSuccess) return 3;
    report(r, elapsed, nullptr, chorusGetLastError(nullptr));
    return 0;
  }
  if (mode == "mismatch-count" || mode == "mismatch-kind" || mode == "zero-copy-death" ||
      mode == "mismatch-count-heap" || mode == "mismatch-kind-heap") {
    // chorusMemAlloc buffers of 256K floats (the zero-copy path), or heap buffers with the
    // probe's sizes: 1000 floats against 2000, 1024 broadcast against 1024 allreduced.
    const bool heap = mode.ends_with("-heap");
    chorusComm_t comm = nullptr;
    if (chorusCommInitFromEnv(&comm) != chorusSuccess) return 2;
    if (mode == "zero-copy-death") armPeerBufferFault(myRank == victim);
    const bool kind = mode.starts_with("mismatch-kind");
    const size_t count = heap ? (kind ? 1024 : 1000) : size_t{256} << 10;
    std::vector<float> heapBuf;
    float* buf = nullptr;
    if (heap) {
      heapBuf.assign(2 * count, 1.0f);
      buf = heapBuf.data();
    } else {
      if (chorusMemAlloc(reinterpret_cast<void**>(&buf), 2 * count * sizeof(float)) != chorusSuccess)
        return 2;
      for (size_t i = 0; i < 2 * count; ++i) buf[i] = 1.0f;
    }
    auto t0 = Clock::now();
    chorusResult_t r;
    const bool mismatch = myRank == victim && mode != "zero-copy-death";
    if (mismatch && kind)
      r = chorusBroadcast(buf, buf, count, chorusFloat32, 0, comm, nullptr);
    else
      r = chorusAllReduce(buf, buf, mismatch ? 2 * count : count, chorusFloat32, chorusSum, comm, nullptr);
    if (!reportFailedCall(r, msSince(t0), comm, myRank, mode)) return 3;
    if (!heap) chorusMemFree(buf);
    return 0;
  }
  if (mode == "single-copy-declined") {
    if (myRank == victim) setenv("CHORUS_CMA", "0", 1);
    chorusComm_t comm = nullptr;
    if (chorusCommInitFromEnv(&comm) != chorusSuccess) return 2;
    int nranks = 0;
    chorusCommCount(comm, &nranks);
    const size_t count = size_t{64} << 10;
    std::vector<float> send(count), recv(count * static_cast<size_t>(nranks));
    for (size_t i = 0; i < count; ++i)
      send[i] = static_cast<float>(myRank * 1000 + static_cast<int>(i % 999));
    bool ok = chorusAllGather(send.data(), recv.data(), count, chorusFloat32, comm, nullptr) == chorusSuccess;
    for (size_t k = 0; ok && k < static_cast<size_t>(nranks); ++k) {
      for (size_t i = 0; i < count; ++i) {
        if (recv[k * count + i] !=
            static_cast<float>(static_cast<int>(k) * 1000 + static_cast<int>(i % 999))) {
          ok = false;
          break;
        }
      }
    }
    std::printf("ok=%d rank=%d\n", ok ? 1 : 0, myRank);
    chorusCommDestroy(comm);
    return 0;
  }
  if (mode == "single-copy-death" || mode == "single-copy-mismatch") {
    chorusComm_t comm = nullptr;
    if (chorusCommInitFromEnv(&comm) != chorusSuccess) return 2;
    int nranks = 0;
    chorusCommCount(comm, &nranks);
    if (mode == "single-copy-death") armPeerReadFault(myRank == victim);
    const size_t count = (mode == "single-copy-mismatch" && myRank == victim ? 2 : 1) * (size_t{64} << 10);
    std::vector<float> send(count, 1.0f), recv(count * static_cast<size_t>(nranks));
    auto t0 = Clock::now();
    chorusResult_t r = chorusAllGather(send.data(), recv.data(), count, chorusFloat32, comm, nullptr);
    if (!reportFailedCall(r, msSince(t0), comm, myRank, mode)) return 3;
    return 0;
  }
  if (mode == "single-copy-p2p-death") {
    // A ring shift of 1 MiB per rank, sent by address (CHORUS_CMA forces it): rank r sends to r+1
    // and receives from r-1; the victim dies as it reads rank r-1's buffer. The rank after it
    // reads the victim's 300 ms later and fails; the rank before it reads that rank's buffer only
    // after 1.5 s, when that rank has failed and exited.
    chorusComm_t comm = nullptr;
    if (chorusCommInitFromEnv(&comm) != chorusSuccess) return 2;
    int nranks = 0;
    chorusCommCount(comm, &nranks);
    armPeerReadFault(myRank == victim, (myRank + 1) % nranks == victim ? 1500 : 300);
    const size_t count = size_t{256} << 10;
    std::vector<float> send(count, 1.0f), recv(count);
    auto t0 = Clock::now();
    chorusGroupStart();
    chorusSend(send.data(), count, chorusFloat32, (myRank + 1) % nranks, comm, nullptr);
    chorusRecv(recv.data(), count, chorusFloat32, (myRank + nranks - 1) % nranks, comm, nullptr);
    chorusResult_t r = chorusGroupEnd();
    if (!reportFailedCall(r, msSince(t0), comm, myRank, mode)) return 3;
    return 0;
  }
  if (mode == "shm-setup") {
    if (myRank == victim) armFallocateFault(500);
    chorusComm_t comm = nullptr;
    auto t0 = Clock::now();
    chorusResult_t r = chorusCommInitFromEnv(&comm);
    long long elapsed = msSince(t0);
    report(r, elapsed, nullptr, r == chorusSuccess ? "" : chorusGetLastError(nullptr));
    if (comm) chorusCommDestroy(comm);
    return 0;
  }
  if (mode == "serve-id") {
    chorusUniqueId id{};
    if (chorusGetUniqueId(&id) != chorusSuccess) return 2;
    for (char c : id.internal) std::printf("%02x", static_cast<unsigned char>(c));
    std::printf("\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(victim));
    return 0;
  }
  if (mode == "join-id") {
    chorusUniqueId id{};
    const std::string hex = argv[2];
    if (hex.size() != 2 * sizeof id.internal) return 64;
    for (size_t i = 0; i < sizeof id.internal; ++i)
      id.internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    chorusComm_t comm = nullptr;
    auto t0 = Clock::now();
    chorusResult_t r = chorusCommInitRank(&comm, 2, id, 1);
    long long elapsed = msSince(t0);
    if (r == chorusSuccess) return 3;
    report(r, elapsed, nullptr, chorusGetLastError(nullptr));
    return 0;
  }

  if (mode == "before-init") {
    if (myRank == victim) raise(SIGKILL);
    chorusComm_t comm = nullptr;
    auto t0 = Clock::now();
    chorusResult_t r = chorusCommInitFromEnv(&comm);
    long long elapsed = msSince(t0);
    std::string message = chorusGetLastError(nullptr);
    if (r == chorusSuccess) {
      std::fprintf(stderr, "rank %d: init succeeded without rank %d\n", myRank, victim);
      return 3;
    }
    report(r, elapsed, nullptr, message);
    return 0;
  }

  chorusComm_t comm = nullptr;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    std::fprintf(stderr, "rank %d: init failed: %s\n", myRank, chorusGetLastError(nullptr));
    return 2;
  }
  // Every rank has finished joining (and watches every other) before anyone dies.
  if (chorusBarrier(comm, nullptr) != chorusSuccess) {
    std::fprintf(stderr, "rank %d: barrier failed: %s\n", myRank, chorusGetLastError(comm));
    return 2;
  }

  if (mode == "after-init" || mode == "shrink") {
    if (myRank == victim) raise(SIGKILL);
    std::vector<float> in(1000, 1.0f), out(1000);
    auto t0 = Clock::now();
    chorusResult_t r =
        chorusAllReduce(in.data(), out.data(), in.size(), chorusFloat32, chorusSum, comm, nullptr);
    long long elapsed = msSince(t0);
    if (r == chorusSuccess) {
      std::fprintf(stderr, "rank %d: allreduce succeeded without rank %d\n", myRank, victim);
      return 3;
    }
    report(r, elapsed, comm, chorusGetLastError(comm));
    if (mode == "shrink") {
      chorusComm_t smaller = nullptr;
      chorusResult_t s = chorusCommShrink(comm, &victim, 1, &smaller);
      int newRank = -1, newSize = -1;
      float sum = -1;
      if (s == chorusSuccess) {
        chorusCommUserRank(smaller, &newRank);
        chorusCommCount(smaller, &newSize);
        float mine = static_cast<float>(myRank + 1);
        s = chorusAllReduce(&mine, &sum, 1, chorusFloat32, chorusSum, smaller, nullptr);
      }
      std::printf("shrink=%d rank=%d size=%d sum=%g message=%s\n", static_cast<int>(s), newRank, newSize,
                  static_cast<double>(sum), s == chorusSuccess ? "" : chorusGetLastError(smaller));
      std::fflush(stdout);
      auto d0 = Clock::now();
      if (smaller) chorusCommDestroy(smaller);
      std::printf("destroy_shrunk_ms=%lld\n", msSince(d0));
    }
    reportDestroy(comm);
    return 0;
  }

  if (mode == "mid-collective" || mode == "stopped") {
    if (myRank == victim) {
      const int sig = mode == "stopped" ? SIGSTOP : SIGKILL;
      std::thread([sig] {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        raise(sig);
      }).detach();
    }
    std::vector<float> in(1 << 20, 1.0f), out(1 << 20);
    auto t0 = Clock::now();
    for (int iter = 0; msSince(t0) < 30000; ++iter) {
      // Alternate between allreduce and broadcast (from a rotating root).
      chorusResult_t r =
          iter % 2 == 0
              ? chorusAllReduce(in.data(), out.data(), in.size(), chorusFloat32, chorusSum, comm, nullptr)
              : chorusBroadcast(in.data(), out.data(), in.size(), chorusFloat32, iter % 3, comm, nullptr);
      if (r != chorusSuccess) {
        report(r, msSince(t0), comm, chorusGetLastError(comm));
        reportDestroy(comm);
        return 0;
      }
    }
    std::fprintf(stderr, "rank %d: 30 s of collectives without noticing rank %d die\n", myRank, victim);
    return 3;
  }

  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 64;
}
