// Chorus C++ API. The C API in chorus.h is a thin layer over this one: one implementation.
//
// Errors are thrown as chorus::Error, whose code() is a chorusResult_t and whose what() names the
// call, the rank and, where one is involved, the peer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "chorus/store.hpp"

namespace chorus {

enum class DataType : int {
  Int8 = chorusInt8,
  Uint8 = chorusUint8,
  Int32 = chorusInt32,
  Uint32 = chorusUint32,
  Int64 = chorusInt64,
  Uint64 = chorusUint64,
  Float16 = chorusFloat16,
  Float32 = chorusFloat32,
  Float64 = chorusFloat64,
  BFloat16 = chorusBfloat16,
};
inline constexpr int kNumDataTypes = chorusNumTypes;

enum class ReduceOp : int {
  Sum = chorusSum,
  Prod = chorusProd,
  Max = chorusMax,
  Min = chorusMin,
  Avg = chorusAvg,
};
inline constexpr int kNumReduceOps = chorusNumOps;

/// Bytes per element; throws chorusInvalidArgument for an unknown type.
CHORUS_API size_t dataTypeSize(DataType t);
/// "float32", "bfloat16", ... ("unknown(N)" for anything else, valid until the next such call on
/// this thread).
CHORUS_API const char* dataTypeName(DataType t);
CHORUS_API const char* reduceOpName(ReduceOp op);

/// IEEE half and bfloat16 as 16-bit storage types, for typed spans.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <typename T>
constexpr DataType dataTypeOf();
template <>
constexpr DataType dataTypeOf<int8_t>() {
  return DataType::Int8;
}
template <>
constexpr DataType dataTypeOf<uint8_t>() {
  return DataType::Uint8;
}
template <>
constexpr DataType dataTypeOf<int32_t>() {
  return DataType::Int32;
}
template <>
constexpr DataType dataTypeOf<uint32_t>() {
  return DataType::Uint32;
}
template <>
constexpr DataType dataTypeOf<int64_t>() {
  return DataType::Int64;
}
template <>
constexpr DataType dataTypeOf<uint64_t>() {
  return DataType::Uint64;
}
template <>
constexpr DataType dataTypeOf<Half>() {
  return DataType::Float16;
}
template <>
constexpr DataType dataTypeOf<BFloat16>() {
  return DataType::BFloat16;
}
template <>
constexpr DataType dataTypeOf<float>() {
  return DataType::Float32;
}
template <>
constexpr DataType dataTypeOf<double>() {
  return DataType::Float64;
}

/// What every Chorus failure throws.
class CHORUS_API Error : public std::runtime_error {
 public:
  Error(chorusResult_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  chorusResult_t code() const noexcept { return code_; }

 private:
  chorusResult_t code_;
};

/// Per-communicator settings. Defaults come from the environment (read once per process,
/// see docs/configuration.md); fields set here override it.
struct CHORUS_API Config {
  /// Deadline for every wait inside an operation (CHORUS_TIMEOUT, seconds; default 300).
  std::chrono::milliseconds timeout{0};
  /// Algorithm override in the grammar `coll[:lo-hi]:algo[,...]` (CHORUS_ALGO), e.g.
  /// "allreduce:0-4k:rd,allreduce:ring". Empty: the built-in choice.
  std::string algo;
  /// Bytes per rank of the shared-memory staging area (CHORUS_SHM_STAGE_BYTES; default from the
  /// machine: half its L2 cache, as a power of two from 256 KiB to 8 MiB (1 MiB where unknown), or
  /// twice that where measured faster on the machine (CHORUS_STAGE_PROBE, docs/configuration.md)).
  size_t shmStageBytes = 0;
  /// Bytes of each shared-memory point-to-point FIFO (CHORUS_SHM_FIFO_BYTES; default 1 MiB).
  size_t shmFifoBytes = 0;
  /// Before each collective, compare its kind, count, type, op and root across ranks
  /// (CHORUS_CHECK=1): a mismatch is a chorusInvalidUsage error naming the differing ranks instead
  /// of a hang or wrong data. Costs one synchronisation per collective. Rank 0's setting wins.
  /// Without it, a hash of the call travels with every message and sync flag, and a mismatch it
  /// finds is the same error (16 bits of hash on most paths: 1 mismatch in 65535 can pass).
  bool checkCalls = false;
  /// Read peers' chorusMemAlloc buffers in place when every rank's are such (CHORUS_ZERO_COPY):
  /// -1 takes the environment's setting (default on), 0 turns it off, 1 on. Rank 0's setting wins.
  int zeroCopy = -1;
  /// Testing and validation: the ranks of one host play this many hosts, in contiguous blocks
  /// (CHORUS_VIRTUAL_HOSTS): -1 takes the environment's setting, 0 or 1 is off. Rank 0's setting wins.
  int virtualHosts = -1;
  /// The kinds of transport between hosts this rank offers, e.g. "tcp" or "ucx,tcp" (CHORUS_NET);
  /// empty takes the environment's setting, else what is there (docs/networking.md).
  std::string net;
  /// Testing and measurements: how the ranks reach each other. "" (the default): the ranks of one
  /// host share memory, other hosts are reached as `net` says. "tcp": no shared memory at all;
  /// every pair of ranks uses Chorus's TCP transport, over loopback when all ranks share one host
  /// (thread ranks of one process included), else over the interface chosen as between hosts
  /// (docs/networking.md). The algorithms that need shared memory are then not chosen, even when
  /// `algo` names them. No environment variable; rank 0's setting wins.
  std::string transport;

  /// Fills unset fields from the environment and built-in defaults.
  static Config fromEnvironment();
};

/// Handle of an asynchronous operation. Copyable; all copies see the same operation.
class CHORUS_API Work {
 public:
  Work();
  /// Waits until done or `timeout` passes; returns whether it is done. Throws the operation's
  /// error if it failed.
  bool wait(std::chrono::milliseconds timeout);
  /// Waits until done (bounded by the communicator's timeout inside the operation); throws on failure.
  void wait();
  /// True if finished (successfully or not); never blocks.
  bool test() const;
  /// chorusSuccess, chorusInProgress, or the failure code.
  chorusResult_t status() const;
  /// The failure message (empty if none).
  std::string errorMessage() const;

  struct State;
  explicit Work(std::shared_ptr<State> s) : state_(std::move(s)) {}

 private:
  std::shared_ptr<State> state_;
};

class CommImpl;

/// A CUDA stream (a cudaStream_t), for calls on device buffers; this header needs no CUDA include.
/// A null handle means host buffers, as the calls without a stream.
struct CudaStream {
  void* handle = nullptr;
};

/// One rank's membership of a group of ranks. Move-only; destruction frees it (waits for pending
/// asynchronous work first). Every collective must be called by all ranks in the same order.
class CHORUS_API Communicator {
 public:
  /// Joins as `rank` of `size` using `store` for rendezvous (collective over all ranks).
  Communicator(std::shared_ptr<Store> store, int rank, int size, const Config& config = {});
  /// Joins the job described by environment variables (see chorusCommInitFromEnv).
  static Communicator fromEnvironment(const Config& config = {});
  /// `size` ranks as threads of this process (each communicator then used by its own thread,
  /// or all from one thread inside a group).
  static std::vector<Communicator> createLocal(int size, const Config& config = {});

  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  ~Communicator();

  int rank() const;
  int size() const;

  /// Deadline for each operation this rank issues on this communicator from now on, instead of
  /// Config::timeout (CHORUS_TIMEOUT); zero restores that. Each call keeps the timeout in force when
  /// it was issued (a group: the shortest of its calls'); when it passes, the call fails with
  /// chorusTimeout naming the ranks that have not arrived. Thread-safe.
  void setTimeout(std::chrono::milliseconds timeout);
  /// The timeout the next call will get.
  std::chrono::milliseconds timeout() const;

  // Blocking collectives (throw chorus::Error). Counts are in elements. A count of 0 (but for
  // barrier and allToAllv) checks the arguments and returns at once, without the peers, as NCCL
  // discards such calls (docs/reliability.md).
  void allReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op);
  void reduceScatter(const void* send, void* recv, size_t recvCount, DataType type, ReduceOp op);
  void allGather(const void* send, void* recv, size_t sendCount, DataType type);
  void broadcast(const void* send, void* recv, size_t count, DataType type, int root);
  void reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root);
  void allToAll(const void* send, void* recv, size_t count, DataType type);
  void allToAllv(const void* send, std::span<const size_t> sendCounts, std::span<const size_t> sendDispls,
                 void* recv, std::span<const size_t> recvCounts, std::span<const size_t> recvDispls,
                 DataType type);
  void send(const void* buf, size_t count, DataType type, int peer);
  void recv(void* buf, size_t count, DataType type, int peer);
  void barrier();

  // Device buffers (CUDA; see "Device buffers" in chorus.h): each call is enqueued on `stream` and
  // returns, with NCCL's semantics. Buffers must be device memory of the calling thread's device
  // (other memory is staged through pinned host memory). Every rank makes the same calls in the
  // same order. Errors a kernel meets later are reported by asyncError(). Throws chorus::Error.
  void allReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, CudaStream stream);
  void reduceScatter(const void* send, void* recv, size_t recvCount, DataType type, ReduceOp op,
                     CudaStream stream);
  void allGather(const void* send, void* recv, size_t sendCount, DataType type, CudaStream stream);
  void broadcast(const void* send, void* recv, size_t count, DataType type, int root, CudaStream stream);
  void reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root,
              CudaStream stream);
  void allToAll(const void* send, void* recv, size_t count, DataType type, CudaStream stream);
  void send(const void* buf, size_t count, DataType type, int peer, CudaStream stream);
  void recv(void* buf, size_t count, DataType type, int peer, CudaStream stream);
  void barrier(CudaStream stream);

  // Asynchronous forms: return at once; the buffers must stay valid until the Work completes.
  Work allReduceAsync(const void* send, void* recv, size_t count, DataType type, ReduceOp op);
  Work reduceScatterAsync(const void* send, void* recv, size_t recvCount, DataType type, ReduceOp op);
  Work allGatherAsync(const void* send, void* recv, size_t sendCount, DataType type);
  Work broadcastAsync(const void* send, void* recv, size_t count, DataType type, int root);
  Work reduceAsync(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root);
  Work allToAllAsync(const void* send, void* recv, size_t count, DataType type);
  Work barrierAsync();

  // Typed span views.
  template <typename T>
  void allReduce(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    checkSpan(send.size(), recv.size(), "allReduce");
    allReduce(send.data(), recv.data(), send.size(), dataTypeOf<T>(), op);
  }
  template <typename T>
  void allReduce(std::span<T> inout, ReduceOp op) {
    allReduce(inout.data(), inout.data(), inout.size(), dataTypeOf<T>(), op);
  }
  template <typename T>
  Work allReduceAsync(std::span<T> inout, ReduceOp op) {
    return allReduceAsync(inout.data(), inout.data(), inout.size(), dataTypeOf<T>(), op);
  }
  template <typename T>
  void allGather(std::span<const T> send, std::span<T> recv) {
    checkSpan(send.size() * static_cast<size_t>(size()), recv.size(), "allGather");
    allGather(send.data(), recv.data(), send.size(), dataTypeOf<T>());
  }
  template <typename T>
  void reduceScatter(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    checkSpan(recv.size() * static_cast<size_t>(size()), send.size(), "reduceScatter");
    reduceScatter(send.data(), recv.data(), recv.size(), dataTypeOf<T>(), op);
  }
  template <typename T>
  void broadcast(std::span<T> buf, int root) {
    broadcast(buf.data(), buf.data(), buf.size(), dataTypeOf<T>(), root);
  }

  /// Ranks with equal color form a new communicator, ordered by key then rank. Collective.
  /// Returns std::nullopt for color CHORUS_SPLIT_NOCOLOR.
  std::optional<Communicator> split(int color, int key);

  /// The ranks not in `excludeRanks` as a new communicator, in the same order (see
  /// chorusCommShrink). Every survivor passes the same list; works after a peer died.
  Communicator shrink(std::span<const int> excludeRanks);

  /// Fails every pending and later operation on this communicator and tells the peers. Safe to call
  /// from another thread while an operation is blocked.
  void abort();
  /// chorusSuccess or the error that broke this communicator.
  chorusResult_t asyncError() const;
  /// Text of the last error on this communicator.
  std::string lastError() const;

  /// Bytes of memory this communicator allocated (shared segments, scratch).
  size_t memoryBytes() const;

  CommImpl* impl() const { return impl_.get(); }
  explicit Communicator(std::shared_ptr<CommImpl> impl);

 private:
  static void checkSpan(size_t expected, size_t got, const char* call);
  std::shared_ptr<CommImpl> impl_;
};

/// Host memory the other ranks on this host read in place (see chorusMemAlloc). Throws Error.
CHORUS_API void* memAlloc(size_t bytes);
/// Frees memory from memAlloc (nullptr is a no-op). Throws Error for any other pointer.
CHORUS_API void memFree(void* ptr);

/// Group calls on the calling thread (see chorusGroupStart). Prefer the RAII Group below.
CHORUS_API void groupStart();
CHORUS_API void groupEnd();

/// RAII group: operations issued while it lives run together when it is destroyed
/// (call end() to get errors as exceptions instead of the destructor swallowing them).
class Group {
 public:
  Group() { groupStart(); }
  ~Group() {
    if (!ended_) {
      try {
        groupEnd();
      } catch (...) {
      }
    }
  }
  void end() {
    ended_ = true;
    groupEnd();
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

 private:
  bool ended_ = false;
};

}  // namespace chorus
