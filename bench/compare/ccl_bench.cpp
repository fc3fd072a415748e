// compare-oneccl: Intel oneCCL's collectives (ccl::allreduce, ccl::reduce_scatter, ccl::allgather,
// ccl::broadcast) timed exactly as compare-mpich times MPICH's: this file is the oneCCL half of
// the program (peer_backend.h); mpi_bench.c, compiled with COMPARE_PEER_SYSTEM="oneccl", is the
// rest (arguments, sizes, buffers, timing, checks, output), the same code as the MPI peers'.
//
//   mpirun.mpich -n 2 compare-oneccl <collective> [flags]   (flags as compare-mpich's)
//
// MPI (Debian's MPICH, linked in) starts the ranks and carries the address of oneCCL's key-value
// store from rank 0 to the others; oneCCL's communicator is made from it. Unless the environment
// already sets them, the program sets these oneCCL and libfabric variables before ccl::init(), for
// a shared-memory run on one host with few cores (README.md explains each):
//   CCL_ATL_TRANSPORT=ofi    oneCCL's transport layer over libfabric (the alternative: mpi)
//   CCL_ATL_SHM=1            with ofi, libfabric's shm provider between ranks of one host
//   CCL_WORKER_OFFLOAD=0     collectives progress in the calling thread, not in a worker thread
//   CCL_WORKER_COUNT=1       one worker thread per rank (idle with the setting above)
//   CCL_KVS_IFACE=lo         the key-value store listens on the loopback interface
//   FI_TCP_IFACE=lo          libfabric's tcp provider (ofi without shm) on the loopback interface
//   CCL_LOG_LEVEL=error      no warning per variable set (one remains: for this one), and no
//                            warning at every start that libfabric truncated an endpoint name
//   CCL_MPI_LIBRARY_PATH     with CCL_ATL_TRANSPORT=mpi: the MPI library this program is linked to
//                            (found with dladdr), so that oneCCL does not load another one
#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <oneapi/ccl.hpp>
#include <optional>
#include <string>

#include "peer_backend.h"

#ifndef COMPARE_ONECCL_PACKAGE
#define COMPARE_ONECCL_PACKAGE "unknown package"
#endif

namespace {

ccl::shared_ptr_class<ccl::kvs> g_kvs;
std::optional<ccl::communicator> g_comm;
int g_rank = 0;

void setDefault(const char* name, const char* value) { setenv(name, value, 0); }

std::string envOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

[[noreturn]] void fail(const char* what, const char* why) {
  std::fprintf(stderr, "compare-oneccl: rank %d: %s: %s\n", g_rank, what, why);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::abort();  // MPI_Abort does not return
}

}  // namespace

extern "C" void peerInit(int* argc, char*** argv) {
  setDefault("CCL_ATL_TRANSPORT", "ofi");
  setDefault("CCL_ATL_SHM", "1");
  setDefault("CCL_WORKER_OFFLOAD", "0");
  setDefault("CCL_WORKER_COUNT", "1");
  setDefault("CCL_KVS_IFACE", "lo");
  setDefault("FI_TCP_IFACE", "lo");
  setDefault("CCL_LOG_LEVEL", "error");
  const bool atlMpi = envOr("CCL_ATL_TRANSPORT", "") == "mpi";

  // oneCCL's MPI transport calls MPI from its own threads: it requires MPI_THREAD_MULTIPLE.
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (atlMpi && provided < MPI_THREAD_MULTIPLE) {
    fail("CCL_ATL_TRANSPORT=mpi", "the MPI library does not provide MPI_THREAD_MULTIPLE");
  }
  if (atlMpi && !std::getenv("CCL_MPI_LIBRARY_PATH")) {
    // The MPI library already loaded: oneCCL would otherwise dlopen "libmpi.so.12", which is not
    // Debian's MPICH (libmpich.so.12) and could be another MPI in the same process.
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &info) == 0 || !info.dli_fname) {
      fail("CCL_ATL_TRANSPORT=mpi", "cannot find the MPI library's path (set CCL_MPI_LIBRARY_PATH)");
    }
    setenv("CCL_MPI_LIBRARY_PATH", info.dli_fname, 1);
  }

  // oneCCL logs to standard output, where its lines ("2026:12:02-15:32:08: 9714 |CCL_WARN| value
  // of CCL_LOG_LEVEL changed ...") would read as rows of the table: standard error while it starts.
  std::fflush(stdout);
  const int savedStdout = dup(STDOUT_FILENO);
  if (savedStdout >= 0) dup2(STDERR_FILENO, STDOUT_FILENO);
  try {
    ccl::init();
    ccl::kvs::address_type address{};
    if (g_rank == 0) {
      g_kvs = ccl::create_main_kvs();
      address = g_kvs->get_address();
    }
    MPI_Bcast(address.data(), static_cast<int>(address.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (g_rank != 0) g_kvs = ccl::create_kvs(address);
    g_comm.emplace(ccl::create_communicator(size, g_rank, g_kvs));
  } catch (const std::exception& e) {
    fail("cannot create the oneCCL communicator", e.what());
  }
  std::cout.flush();
  std::fflush(stdout);
  if (savedStdout >= 0) {
    dup2(savedStdout, STDOUT_FILENO);
    close(savedStdout);
  }
}

extern "C" int peerRun(Coll coll, const float* send, float* recv, size_t count, int root) {
  try {
    const ccl::communicator& comm = *g_comm;
    const auto f32 = ccl::datatype::float32;
    switch (coll) {
      case ALL_REDUCE:
        ccl::allreduce(send, recv, count, f32, ccl::reduction::sum, comm).wait();
        return 0;
      case REDUCE_SCATTER:
        ccl::reduce_scatter(send, recv, count, f32, ccl::reduction::sum, comm).wait();
        return 0;
      case ALL_GATHER:
        ccl::allgather(send, recv, count, f32, comm).wait();
        return 0;
      case BROADCAST:
        ccl::broadcast(recv, count, f32, root, comm).wait();
        return 0;
      case REDUCE:
        ccl::reduce(send, recv, count, f32, ccl::reduction::sum, root, comm).wait();
        return 0;
      case ALL_TO_ALL:
        ccl::alltoall(send, recv, count, f32, comm).wait();
        return 0;
    }
    std::fprintf(stderr, "compare-oneccl: unknown collective %d\n", static_cast<int>(coll));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare-oneccl: rank %d: oneCCL error: %s\n", g_rank, e.what());
  }
  return 1;
}

extern "C" void peerLibrary(char* out, size_t size) {
  const ccl::library_version v = ccl::get_library_version();
  const std::string atl = envOr("CCL_ATL_TRANSPORT", "mpi");
  std::string transport = "ATL " + atl;
  if (atl == "ofi") {
    transport += envOr("CCL_ATL_SHM", "0") == "1" ? " (libfabric shm provider)" : " (libfabric, no shm)";
  } else if (atl == "mpi") {
    transport += " (" + envOr("CCL_MPI_LIBRARY_PATH", "libmpi.so.12") + ")";
  }
  std::snprintf(out, size, "oneCCL %u.%u.%u (%s), %s; %s; CCL_WORKER_OFFLOAD=%s CCL_WORKER_COUNT=%s", v.major,
                v.minor, v.update, v.full ? v.full : "?", COMPARE_ONECCL_PACKAGE, transport.c_str(),
                envOr("CCL_WORKER_OFFLOAD", "1").c_str(), envOr("CCL_WORKER_COUNT", "1").c_str());
}

extern "C" void peerFinalize(void) {
  g_comm.reset();
  g_kvs.reset();
}
