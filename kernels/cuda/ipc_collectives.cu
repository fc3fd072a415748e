// Device-buffer collectives over CUDA IPC (ipc_collectives.hpp; layout and plans in ipc_layout.hpp,
// each thread's data movement in ipc_steps.hpp, which the host tests emulate).
//
// Simple protocol, per piece: copy the input into this rank's stage; per-block barrier with the same
// block of every peer; read the peers' stages (allreduce: reduce slice `rank`, publish it in the
// result area, barrier, gather every slice from its owner). Every phase maps position w of a slice
// to block (w / kThreads) % blocks, so a block only ever reads what the same block of each peer
// wrote before the barrier, and a per-block barrier is enough.
// LL protocol (small allreduces): each rank writes 16-byte lines {data, flag, data, flag} into
// every peer's slot for it and polls its own slots; no barrier.
#include <cuda_runtime.h>

#include <string>

#include "ipc_collectives.hpp"
#include "reduce_ops.cuh"

namespace chorus::kernels::cuda::ipc {

namespace {

using namespace ops;

// How a kernel waits: until the deadline or the host's abort flag; the first failure into errorWord.
struct Control {
  const volatile uint32_t* abortFlag;
  volatile uint32_t* errorWord;
  volatile uint32_t* errorDetail;  // WaitSite, the value waited for, the value seen
  unsigned int* claim;             // Signals::errorClaim of this rank (nullptr: none)
  uint64_t timeoutNs;
};

struct Args {
  StepArgs step;
  int op;
  int divisor;
  Control ctl;
};

struct P2pKernelArgs {
  P2pArgs p;
  Control ctl;
};
static_assert(sizeof(P2pKernelArgs) <= 4096, "kernel parameters: 4 KiB on every supported driver");

__device__ __forceinline__ uint64_t nowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The first failure of this rank's kernels (the claim makes it one, with its own detail words):
// the detail, then the error word the host reads first.
__device__ __forceinline__ void report(const Control& a, uint32_t why, int peer, uint32_t site = 0,
                                       uint64_t want = 0, uint64_t seen = 0) {
  if (a.claim != nullptr && atomicCAS(a.claim, 0u, 1u) != 0u) return;
  if (*a.errorWord != 0) return;
  if (a.errorDetail != nullptr) {
    a.errorDetail[0] = site;
    a.errorDetail[1] = static_cast<uint32_t>(want);
    a.errorDetail[2] = static_cast<uint32_t>(seen);
    __threadfence_system();
  }
  *a.errorWord = (why << 16) | static_cast<uint32_t>(peer + 1);
}

// Every 1024 polls: false (and the failure reported, with where it waited) once aborted or past
// the deadline.
__device__ __forceinline__ bool stillWaiting(const Control& a, uint32_t& spins, uint64_t start, int peer,
                                             uint32_t site, uint64_t want, uint64_t seen) {
  if (++spins % 1024 != 0) return true;
  if (*a.abortFlag != 0) {
    report(a, kErrAborted, peer, site, want, seen);
    return false;
  }
  if (nowNs() - start > a.timeoutNs) {
    report(a, kErrTimeout, peer, site, want, seen);
    return false;
  }
  return true;
}

__device__ __forceinline__ Signals* signalsOf(const Args& a, int r) {
  return reinterpret_cast<Signals*>(a.step.ws[r]);
}

// Barrier `k` of kernel `seq` between block blockIdx.x of every rank. Thread t < nranks signals
// peer t and waits for it. False (for every thread of the block) once any wait failed.
__device__ bool barrier(const Args& a, int& failed, uint64_t seq, uint32_t& k) {
  const uint64_t v = barrierValue(seq, k++);
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  const int me = a.step.rank;
  if (t < a.step.nranks && !failed) {
    __threadfence_system();  // this block's writes (seen through __syncthreads) before the flag
    volatile uint64_t* theirs = &signalsOf(a, t)->flag[blockIdx.x][me];
    *theirs = v;
    const volatile uint64_t* mine = &signalsOf(a, me)->flag[blockIdx.x][t];
    uint32_t spins = 0;
    const uint64_t start = nowNs();
    uint64_t seen;
    while ((seen = *mine) < v) {
      if (!stillWaiting(a.ctl, spins, start, t, waitSite(kSiteBarrier, blockIdx.x, k - 1), v, seen)) {
        failed = 1;
        break;
      }
    }
    __threadfence_system();
  }
  __syncthreads();
  return !failed;
}

// The number of this kernel on this rank's workspace (read by every block before any finishes).
__device__ __forceinline__ uint64_t kernelSeq(const Args& a) {
  __shared__ uint64_t sSeq;
  if (threadIdx.x == 0)
    sSeq = *reinterpret_cast<volatile unsigned long long*>(&signalsOf(a, a.step.rank)->seq);
  __syncthreads();
  return sSeq;
}

// The last block to finish numbers the next kernel on this workspace.
__device__ void finish(const Args& a, uint64_t seq) {
  __syncthreads();
  if (threadIdx.x == 0) {
    Signals* self = signalsOf(a, a.step.rank);
    __threadfence();
    if (atomicAdd(&self->done, 1u) == gridDim.x - 1) {
      atomicExch(&self->done, 0u);
      atomicExch(&self->seq, static_cast<unsigned long long>(seq + 1));
      __threadfence();
    }
  }
}

__device__ __forceinline__ bool aligned(const void* p, uintptr_t m) {
  return (reinterpret_cast<uintptr_t>(p) & (m - 1)) == 0;
}

__device__ __forceinline__ uint4 asU4(const Vec16& v) { return make_uint4(v.u[0], v.u[1], v.u[2], v.u[3]); }
__device__ __forceinline__ Vec16 asVec(const uint4& v) { return Vec16{{v.x, v.y, v.z, v.w}}; }

template <typename T>
union Pk {
  static constexpr int kN = 16 / sizeof(T);
  uint4 raw;
  T v[kN];
};

// Element-wise reduction of n packs, in rank order (as the CPU kernels and the tests' reference).
template <typename T, typename Op, bool kDiv>
__device__ __forceinline__ Vec16 reduceAs(const Vec16* in, int n, int divisor) {
  using E = Elem<T>;
  constexpr int kN = Pk<T>::kN;
  Pk<T> p;
  p.raw = asU4(in[0]);
  typename E::Acc acc[kN];
#pragma unroll
  for (int e = 0; e < kN; ++e) acc[e] = E::load(p.v[e]);
  for (int k = 1; k < n; ++k) {
    p.raw = asU4(in[k]);
#pragma unroll
    for (int e = 0; e < kN; ++e) acc[e] = Op::apply(acc[e], E::load(p.v[e]));
  }
  Pk<T> out;
#pragma unroll
  for (int e = 0; e < kN; ++e) {
    typename E::Acc x = acc[e];
    if constexpr (kDiv) x = divide(x, divisor);
    out.v[e] = E::store(x);
  }
  return asVec(out.raw);
}

// The memory operations of ipc_steps.hpp on the device. Workspaces are read through L2 only
// (__ldcg), so that no block sees a line an earlier phase cached in L1.
template <typename T>
struct DeviceMemOps {
  const Control& ctl;
  int op;
  int divisor;

  __device__ void copy(Byte* dst, const Byte* src, size_t n) {
    if (n == kPack && aligned(dst, 16) && aligned(src, 16)) {
      *reinterpret_cast<uint4*>(dst) = __ldcg(reinterpret_cast<const uint4*>(src));
    } else if (n == 8 && aligned(dst, 8) && aligned(src, 8)) {
      *reinterpret_cast<uint2*>(dst) = __ldcg(reinterpret_cast<const uint2*>(src));
    } else if (n % 4 == 0 && aligned(dst, 4) && aligned(src, 4)) {
      for (size_t i = 0; i < n; i += 4)
        *reinterpret_cast<unsigned*>(dst + i) = __ldcg(reinterpret_cast<const unsigned*>(src + i));
    } else if (n % 2 == 0 && aligned(dst, 2) && aligned(src, 2)) {
      for (size_t i = 0; i < n; i += 2)
        *reinterpret_cast<unsigned short*>(dst + i) =
            __ldcg(reinterpret_cast<const unsigned short*>(src + i));
    } else {
      for (size_t i = 0; i < n; ++i) dst[i] = __ldcg(src + i);
    }
  }
  __device__ Vec16 load(const Byte* src) { return asVec(__ldcg(reinterpret_cast<const uint4*>(src))); }
  __device__ void store(Byte* dst, const Vec16& v, size_t n) {
    if (n == kPack && aligned(dst, 16)) {
      *reinterpret_cast<uint4*>(dst) = asU4(v);
    } else if (n == 8 && aligned(dst, 8)) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(v.u[0], v.u[1]);
    } else if (n % 4 == 0 && aligned(dst, 4)) {
      for (size_t i = 0; i < n / 4; ++i) reinterpret_cast<unsigned*>(dst)[i] = v.u[i];
    } else {
      const Byte* b = reinterpret_cast<const Byte*>(&v);
      for (size_t i = 0; i < n; ++i) dst[i] = b[i];
    }
  }
  __device__ Vec16 reduce(const Vec16* in, int n) {
    switch (static_cast<ReduceOp>(op)) {
      case ReduceOp::Prod:
        return reduceAs<T, OpProd, false>(in, n, divisor);
      case ReduceOp::Max:
        return reduceAs<T, OpMax, false>(in, n, divisor);
      case ReduceOp::Min:
        return reduceAs<T, OpMin, false>(in, n, divisor);
      case ReduceOp::Avg:
        return reduceAs<T, OpSum, true>(in, n, divisor);
      default:
        return reduceAs<T, OpSum, false>(in, n, divisor);
    }
  }
  __device__ void storeLine(Byte* dst, const Vec16& v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(dst), "r"(v.u[0]), "r"(v.u[1]),
                 "r"(v.u[2]), "r"(v.u[3])
                 : "memory");
  }
  __device__ Vec16 loadLine(const Byte* src) {
    Vec16 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.u[0]), "=r"(v.u[1]), "=r"(v.u[2]), "=r"(v.u[3])
                 : "l"(src)
                 : "memory");
    return v;
  }
  __device__ bool pollLine(const Byte* src, uint32_t flag, int peer, Vec16* line) {
    *line = loadLine(src);
    uint32_t spins = 0;
    const uint64_t start = nowNs();
    while (line->u[1] != flag || line->u[3] != flag) {
      const uint32_t seen = line->u[1] != flag ? line->u[1] : line->u[3];
      if (!stillWaiting(ctl, spins, start, peer, waitSite(kSiteLL, blockIdx.x, 0), flag, seen)) return false;
      *line = loadLine(src);
    }
    return true;
  }
};

// ipc_steps.hpp's executor on the device: one CUDA block.
template <typename T>
struct DeviceBlock {
  const Args& a;
  int& failed;  // in shared memory
  DeviceMemOps<T> m;

  __device__ DeviceBlock(const Args& args, int& sharedFailed)
      : a(args), failed(sharedFailed), m{args.ctl, args.op, args.divisor} {
    if (threadIdx.x == 0) failed = 0;  // published by seq()'s __syncthreads
  }
  __device__ uint64_t seq() { return kernelSeq(a); }
  __device__ DeviceMemOps<T>& mem() { return m; }
  template <typename F>
  __device__ void each(F&& f) {
    f(static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x, static_cast<size_t>(gridDim.x) * kThreads);
  }
  __device__ bool barrier(uint64_t seq, uint32_t& k) { return ipc::barrier(a, failed, seq, k); }
  __device__ void finish(uint64_t seq) { ipc::finish(a, seq); }
};

// ipc_steps.hpp's P2P executor on the device: one CUDA block, one lane.
struct P2pBlock {
  const Control& ctl;
  int& failed;  // in shared memory, 0 at the start
  DeviceMemOps<unsigned char> m;
  uint32_t site;  // waitSite of this block's lane, for a failed wait's report

  __device__ int block() const { return static_cast<int>(blockIdx.x); }
  __device__ DeviceMemOps<unsigned char>& mem() { return m; }
  template <typename F>
  __device__ void threads(F&& f) {
    f(static_cast<size_t>(threadIdx.x), static_cast<size_t>(kThreads));
  }
  // Counters this rank keeps and sizes no one changes while they are read: every thread alike.
  __device__ uint64_t read(const uint64_t* word) { return *reinterpret_cast<const volatile uint64_t*>(word); }
  __device__ bool waitAtLeast(const uint64_t* word, uint64_t v, int peer) {
    __syncthreads();  // every thread has read `failed` of the wait before
    if (threadIdx.x == 0) {
      const volatile uint64_t* w = word;
      uint32_t spins = 0;
      const uint64_t start = nowNs();
      uint64_t seen;
      while ((seen = *w) < v) {
        if (!stillWaiting(ctl, spins, start, peer, site, v, seen)) {
          failed = 1;
          break;
        }
      }
      __threadfence_system();  // what the peer wrote before `word`, before this block reads it
    }
    __syncthreads();
    return !failed;
  }
  __device__ void publish(uint64_t* word, uint64_t v) {
    __syncthreads();  // the block's copies are done
    if (threadIdx.x == 0) {
      __threadfence_system();
      *reinterpret_cast<volatile uint64_t*>(word) = v;
    }
  }
  __device__ void report(uint32_t why, int peer) {
    if (threadIdx.x == 0) ipc::report(ctl, why, peer, site);
  }
};

__global__ void __launch_bounds__(kThreads) p2pKernel(P2pKernelArgs a) {
  __shared__ int sFailed;
  if (threadIdx.x == 0) sFailed = 0;
  __syncthreads();
  const P2pLane& lane = a.p.lanes[blockIdx.x < static_cast<unsigned>(a.p.nLanes) ? blockIdx.x : 0];
  P2pBlock x{a.ctl, sFailed, DeviceMemOps<unsigned char>{a.ctl, 0, 1},
             waitSite(lane.send ? kSiteP2pSend : kSiteP2pRecv, static_cast<uint32_t>(lane.channel), 0)};
  p2pKernelBody(x, a.p);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) simpleKernel(Args a) {
  __shared__ int sFailed;
  DeviceBlock<T> x(a, sFailed);
  simpleKernelBody(x, a.step);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) llKernel(Args a) {
  __shared__ int sFailed;
  DeviceBlock<T> x(a, sFailed);
  llKernelBody(x, a.step);
}

__global__ void waitForHost(const volatile uint32_t* done, const volatile uint32_t* started, uint32_t ticket,
                            const volatile uint32_t* abortFlag, volatile uint32_t* errorWord,
                            uint64_t timeoutNs) {
  uint64_t since = 0;  // when the host began this operation (0: not yet; earlier ones have deadlines)
  while (static_cast<int32_t>(*done - ticket) < 0) {
    if (*abortFlag != 0) {
      if (*errorWord == 0) *errorWord = kErrAborted << 16;
      return;
    }
    if (static_cast<int32_t>(*started - ticket) >= 0) {
      const uint64_t now = nowNs();
      if (since == 0) {
        since = now;
      } else if (now - since > timeoutNs) {
        if (*errorWord == 0) *errorWord = kErrStaged << 16;
        return;
      }
    }
    __nanosleep(2000);  // each poll reads host memory over the bus
  }
}

unsigned int* claimOf(void* ownWorkspace) { return &reinterpret_cast<Signals*>(ownWorkspace)->errorClaim; }

template <typename T>
void launchAs(const Args& a, bool ll, int blocks, cudaStream_t stream) {
  if (ll)
    llKernel<T><<<blocks, kThreads, 0, stream>>>(a);
  else
    simpleKernel<T><<<blocks, kThreads, 0, stream>>>(a);
}

}  // namespace

void launchWaitForHost(const volatile uint32_t* done, const volatile uint32_t* started, uint32_t ticket,
                       const volatile uint32_t* abortFlag, volatile uint32_t* errorWord, uint64_t timeoutNs,
                       void* stream) {
  (void)cudaGetLastError();
  waitForHost<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(done, started, ticket, abortFlag, errorWord,
                                                              timeoutNs);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    throw Error(chorusUnhandledCudaError, std::string("staged operation's wait kernel launch: ") +
                                              cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

void launch(const Call& c, void* streamv) {
  const size_t elem = dataTypeSize(c.type);
  Args a{};
  for (int r = 0; r < kMaxRanks; ++r) a.step.ws[r] = static_cast<Byte*>(c.ws[r]);
  a.step.send = static_cast<const Byte*>(c.send);
  a.step.recv = static_cast<Byte*>(c.recv);
  a.step.layout = c.layout;
  a.step.plan = planFor(c.kind, c.count * elem, c.nranks, c.layout.stageBytes, c.maxBlocks);
  a.step.bytes = c.count * elem;
  a.step.rank = c.rank;
  a.step.nranks = c.nranks;
  a.step.root = c.root;
  a.step.kind = c.kind;
  a.op = static_cast<int>(c.op);
  a.divisor = c.nranks;
  a.ctl = Control{c.abortFlag, c.errorWord, c.errorDetail, claimOf(c.ws[c.rank]), c.timeoutNs};
  const bool ll = usesLL(c.kind, a.step.bytes, c.llMaxBytes, c.layout);
  const int blocks = ll ? llBlocks(a.step.bytes, c.maxBlocks) : a.step.plan.blocks;
  auto stream = static_cast<cudaStream_t>(streamv);
  (void)cudaGetLastError();  // an error an earlier call left behind is not this launch's
  if (!withStorageType(c.type, [&]<typename T>() { launchAs<T>(a, ll, blocks, stream); }))
    throw Error(chorusInvalidArgument,
                "device collective: unknown data type " + std::to_string(static_cast<int>(c.type)));
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    throw Error(chorusUnhandledCudaError, std::string("device collective kernel launch: ") +
                                              cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

void launchP2p(const P2pCall& c, void* stream) {
  if (c.args.nLanes <= 0) return;
  P2pKernelArgs a{
      c.args, Control{c.abortFlag, c.errorWord, c.errorDetail, claimOf(c.args.ws[c.args.rank]), c.timeoutNs}};
  (void)cudaGetLastError();
  p2pKernel<<<a.p.nLanes, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    throw Error(chorusUnhandledCudaError, std::string("device send/recv kernel launch: ") +
                                              cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

}  // namespace chorus::kernels::cuda::ipc
