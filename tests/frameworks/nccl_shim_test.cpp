// A program written against the unmodified nccl.h of CUDA, linked against Chorus's libnccl.so.2,
// run as 4 processes by chorusrun: every collective with host buffers and a NULL stream, checked
// exactly, and the refusals of what the shim does not support. Rank and size come from chorusrun's
// CHORUS_RANK / CHORUS_WORLD_SIZE; the unique id travels through a file, as MPI would carry it.
//
//   chorusrun -n 4 nccl_shim_test <directory for the id file>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

int gRank = 0, gSize = 0, gFailures = 0;

#define CHECK(cond, ...)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "rank %d: FAIL %s:%d: %s: ", gRank, __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                   \
      std::fprintf(stderr, "\n");                                                          \
      ++gFailures;                                                                         \
    }                                                                                      \
  } while (0)

#define NCCL_OK(call)                                                                            \
  do {                                                                                           \
    ncclResult_t r_ = (call);                                                                    \
    if (r_ != ncclSuccess) {                                                                     \
      std::fprintf(stderr, "rank %d: %s failed: %s: %s\n", gRank, #call, ncclGetErrorString(r_), \
                   ncclGetLastError(nullptr));                                                   \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// float <-> IEEE half and bfloat16 bits, exact for the small integers and quarters used here.
uint16_t toHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  if ((x & 0x7fffffffu) == 0) return static_cast<uint16_t>(sign);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | ((x >> 13) & 0x3ffu));
}
float fromHalf(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const int exp = (h >> 10) & 0x1f;
  uint32_t x = sign;
  if (exp != 0)
    x |= (static_cast<uint32_t>(exp - 15 + 127) << 23) | (static_cast<uint32_t>(h & 0x3ffu) << 13);
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
uint16_t toBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return static_cast<uint16_t>(x >> 16);
}
float fromBf16(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

size_t sizeOf(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

void put(void* buf, ncclDataType_t t, size_t i, double v) {
  char* p = static_cast<char*>(buf) + i * sizeOf(t);
  switch (t) {
    case ncclInt8: {
      int8_t x = static_cast<int8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case ncclUint8: {
      uint8_t x = static_cast<uint8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case ncclInt32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case ncclUint32: {
      uint32_t x = static_cast<uint32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case ncclInt64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case ncclUint64: {
      uint64_t x = static_cast<uint64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case ncclFloat16: {
      uint16_t x = toHalf(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case ncclBfloat16: {
      uint16_t x = toBf16(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case ncclFloat32: {
      float x = static_cast<float>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    default:
      std::memcpy(p, &v, 8);
      break;
  }
}

double get(const void* buf, ncclDataType_t t, size_t i) {
  const char* p = static_cast<const char*>(buf) + i * sizeOf(t);
  switch (t) {
    case ncclInt8: {
      int8_t x;
      std::memcpy(&x, p, 1);
      return x;
    }
    case ncclUint8: {
      uint8_t x;
      std::memcpy(&x, p, 1);
      return x;
    }
    case ncclInt32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case ncclUint32: {
      uint32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case ncclInt64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case ncclUint64: {
      uint64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case ncclFloat16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return fromHalf(x);
    }
    case ncclBfloat16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return fromBf16(x);
    }
    case ncclFloat32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    default: {
      double x;
      std::memcpy(&x, p, 8);
      return x;
    }
  }
}

// Rank r's element i: 1 or 2, so that sums, products, minima, maxima and averages are exact in
// every type, int8 included.
double value(int r, size_t i) { return 1.0 + static_cast<double>((r + i) % 2); }

double reduceAll(ncclRedOp_t op, size_t i, bool integer) {
  double acc = value(0, i);
  for (int r = 1; r < gSize; ++r) {
    const double v = value(r, i);
    if (op == ncclSum || op == ncclAvg) acc += v;
    if (op == ncclProd) acc *= v;
    if (op == ncclMax) acc = std::fmax(acc, v);
    if (op == ncclMin) acc = std::fmin(acc, v);
  }
  if (op == ncclAvg) acc = integer ? std::trunc(acc / gSize) : acc / gSize;
  return acc;
}

const char* typeName(ncclDataType_t t) {
  static const char* names[] = {"int8",   "uint8",   "int32",   "uint32",  "int64",
                                "uint64", "float16", "float32", "float64", "bfloat16"};
  return names[t];
}

void testAllReduce(ncclComm_t comm) {
  const size_t n = 1031;
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  for (int t = 0; t <= ncclBfloat16; ++t) {
    const ncclDataType_t type = static_cast<ncclDataType_t>(t);
    const bool integer = type <= ncclUint64;
    for (ncclRedOp_t op : ops) {
      std::vector<char> send(n * sizeOf(type)), recv(n * sizeOf(type));
      for (size_t i = 0; i < n; ++i) put(send.data(), type, i, value(gRank, i));
      NCCL_OK(ncclAllReduce(send.data(), recv.data(), n, type, op, comm, nullptr));
      int wrong = 0;
      for (size_t i = 0; i < n; ++i) wrong += get(recv.data(), type, i) != reduceAll(op, i, integer);
      CHECK(wrong == 0, "allreduce %s op %d: %d wrong", typeName(type), static_cast<int>(op), wrong);
      // In place.
      NCCL_OK(ncclAllReduce(send.data(), send.data(), n, type, op, comm, nullptr));
      CHECK(std::memcmp(send.data(), recv.data(), recv.size()) == 0, "in-place allreduce %s differs",
            typeName(type));
    }
  }
}

void testOthers(ncclComm_t comm) {
  const size_t n = 777;
  const ncclDataType_t T = ncclFloat32;
  std::vector<float> mine(n), out(n * gSize), all(n * gSize);
  for (size_t i = 0; i < n; ++i) mine[i] = static_cast<float>(gRank * 1000 + i);

  // Broadcast from 1 (out of place) and Bcast from 2 (in place).
  NCCL_OK(ncclBroadcast(mine.data(), out.data(), n, T, 1, comm, nullptr));
  CHECK(out[5] == 1005.0f && out[n - 1] == 1000.0f + (n - 1), "broadcast: %g", out[5]);
  std::vector<float> b = mine;
  NCCL_OK(ncclBcast(b.data(), n, T, 2, comm, nullptr));
  CHECK(b[7] == 2007.0f, "bcast: %g", b[7]);

  // Reduce (sum) to 3.
  std::fill(out.begin(), out.end(), -1.0f);
  NCCL_OK(ncclReduce(mine.data(), out.data(), n, T, ncclSum, 3, comm, nullptr));
  if (gRank == 3) {
    const float want = static_cast<float>(1000 * (gSize * (gSize - 1) / 2) + gSize * 9);
    CHECK(out[9] == want, "reduce: %g, want %g", out[9], want);
  }

  // AllGather, ReduceScatter, AlltoAll.
  NCCL_OK(ncclAllGather(mine.data(), all.data(), n, T, comm, nullptr));
  for (int r = 0; r < gSize; ++r)
    CHECK(all[r * n + 3] == static_cast<float>(r * 1000 + 3), "allgather block %d", r);
  std::vector<float> rs(n);
  NCCL_OK(ncclReduceScatter(all.data(), rs.data(), n, T, ncclSum, comm, nullptr));
  CHECK(rs[3] == gSize * static_cast<float>(gRank * 1000 + 3), "reducescatter: %g", rs[3]);
  std::vector<float> a2aIn(n * gSize), a2aOut(n * gSize);
  for (int r = 0; r < gSize; ++r)
    for (size_t i = 0; i < n; ++i) a2aIn[r * n + i] = static_cast<float>(gRank * 100 + r + i * 0.5);
  NCCL_OK(ncclAlltoAll(a2aIn.data(), a2aOut.data(), n, T, comm, nullptr));
  for (int r = 0; r < gSize; ++r)
    CHECK(a2aOut[r * n + 2] == static_cast<float>(r * 100 + gRank + 1.0), "alltoall block %d: %g", r,
          a2aOut[r * n + 2]);

  // Gather to 0 and scatter from 1 (NCCL 2.28).
  std::fill(all.begin(), all.end(), -1.0f);
  NCCL_OK(ncclGather(mine.data(), all.data(), n, T, 0, comm, nullptr));
  if (gRank == 0)
    for (int r = 0; r < gSize; ++r)
      CHECK(all[r * n + 11] == static_cast<float>(r * 1000 + 11), "gather block %d", r);
  std::vector<float> src(n * gSize), got(n);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(gRank * 10000 + i);
  NCCL_OK(ncclScatter(src.data(), got.data(), n, T, 1, comm, nullptr));
  CHECK(got[4] == static_cast<float>(10000 + gRank * n + 4), "scatter: %g", got[4]);

  // Gather inside the caller's group: the root's own block is copied when the group ends.
  std::vector<float> part(n, 100.0f + gRank), gathered(n * gSize, -1.0f);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclGather(part.data(), gathered.data(), n, T, 0, comm, nullptr));
  NCCL_OK(ncclGroupEnd());
  if (gRank == 0)
    for (int r = 0; r < gSize; ++r)
      CHECK(gathered[r * n + 1] == 100.0f + r, "gather in a group, block %d: %g", r, gathered[r * n + 1]);

  // A ring of sends and receives in one group.
  std::vector<double> to(n, gRank + 0.5), from(n, -1);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(to.data(), n, ncclFloat64, (gRank + 1) % gSize, comm, nullptr));
  NCCL_OK(ncclRecv(from.data(), n, ncclFloat64, (gRank + gSize - 1) % gSize, comm, nullptr));
  NCCL_OK(ncclGroupEnd());
  CHECK(from[n - 1] == (gRank + gSize - 1) % gSize + 0.5, "sendrecv: %g", from[n - 1]);

  // Memory from ncclMemAlloc.
  void* mem = nullptr;
  NCCL_OK(ncclMemAlloc(&mem, 1 << 20));
  auto* m = static_cast<int32_t*>(mem);
  for (int i = 0; i < (1 << 18); ++i) m[i] = gRank + i;
  NCCL_OK(ncclAllReduce(m, m, 1 << 18, ncclInt32, ncclMax, comm, nullptr));
  CHECK(m[100] == gSize - 1 + 100, "allreduce in ncclMemAlloc memory: %d", m[100]);
  NCCL_OK(ncclMemFree(mem));
}

void testSplitAndQueries(ncclComm_t comm) {
  int count = 0, rank = -1, device = 0;
  NCCL_OK(ncclCommCount(comm, &count));
  NCCL_OK(ncclCommUserRank(comm, &rank));
  NCCL_OK(ncclCommCuDevice(comm, &device));
  // No GPU where this runs: -1 (on a GPU machine, the calling thread's device).
  CHECK(count == gSize && rank == gRank && device == -1, "count %d rank %d device %d", count, rank, device);
  ncclComm_t half = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  NCCL_OK(ncclCommSplit(comm, gRank % 2, gRank, &half, &config));
  int halfSize = 0;
  NCCL_OK(ncclCommCount(half, &halfSize));
  int64_t v = gRank, sum = 0;
  NCCL_OK(ncclAllReduce(&v, &sum, 1, ncclInt64, ncclSum, half, nullptr));
  CHECK(halfSize == gSize / 2 && sum == (gRank % 2 == 0 ? 2 : 4), "split: size %d sum %lld", halfSize,
        static_cast<long long>(sum));
  NCCL_OK(ncclCommDestroy(half));
  ncclComm_t none = reinterpret_cast<ncclComm_t>(0x1);
  NCCL_OK(ncclCommSplit(comm, gRank == 0 ? NCCL_SPLIT_NOCOLOR : 1, 0, &none, nullptr));
  if (gRank == 0) CHECK(none == nullptr, "NCCL_SPLIT_NOCOLOR gives a NULL communicator");
  if (none) NCCL_OK(ncclCommDestroy(none));
  void* handle = nullptr;
  char buf[64];
  NCCL_OK(ncclCommRegister(comm, buf, sizeof buf, &handle));
  NCCL_OK(ncclCommDeregister(comm, handle));
  ncclResult_t async = ncclInternalError;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess, "async error %d", static_cast<int>(async));
}

void testRefusals(ncclComm_t comm) {
  float x[4] = {1, 2, 3, 4};
  auto lastError = [&] { return std::string(ncclGetLastError(comm)); };
  // A stream goes to Chorus's device path, which needs a GPU on every rank (main() hides any) and a
  // build with CUDA: either way the error names CUDA.
  ncclResult_t r = ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, comm, reinterpret_cast<cudaStream_t>(0x10));
  CHECK((r == ncclInvalidUsage || r == ncclInvalidArgument) && lastError().find("CUDA") != std::string::npos,
        "stream: %d %s", static_cast<int>(r), lastError().c_str());
  // Gather and scatter refuse streams in the shim itself.
  r = ncclGather(x, x, 1, ncclFloat32, 0, comm, reinterpret_cast<cudaStream_t>(0x10));
  CHECK(r == ncclInvalidUsage && lastError().find("stream") != std::string::npos, "gather stream: %d %s",
        static_cast<int>(r), lastError().c_str());
  ncclRedOp_t premul;
  float scalar = 2;
  r = ncclRedOpCreatePreMulSum(&premul, &scalar, ncclFloat32, ncclScalarHostImmediate, comm);
  CHECK(r == ncclInvalidUsage && lastError().find("not supported") != std::string::npos, "premulsum: %s",
        lastError().c_str());
  r = ncclAllReduce(x, x, 4, ncclFloat8e4m3, ncclSum, comm, nullptr);
  CHECK(r == ncclInvalidArgument && lastError().find("float8") != std::string::npos, "float8: %s",
        lastError().c_str());
  r = ncclAllReduce(x, x, 4, ncclFloat32, static_cast<ncclRedOp_t>(7), comm, nullptr);
  CHECK(r == ncclInvalidArgument, "op 7: %d", static_cast<int>(r));
  // Values outside the enums' ranges, as a C caller may pass them: refused and named (the
  // sanitizer pass's UBSan checks that no enum load happens on the way).
  for (int t : {42, -1}) {
    r = ncclAllReduce(x, x, 4, static_cast<ncclDataType_t>(t), ncclSum, comm, nullptr);
    CHECK(r == ncclInvalidArgument &&
              lastError().find("unknown data type " + std::to_string(t)) != std::string::npos,
          "type %d: %d %s", t, static_cast<int>(r), lastError().c_str());
  }
  r = ncclAllReduce(x, x, 4, ncclFloat32, static_cast<ncclRedOp_t>(-1), comm, nullptr);
  CHECK(r == ncclInvalidArgument && lastError().find("reduction op -1") != std::string::npos, "op -1: %s",
        lastError().c_str());
  CHECK(ncclGetErrorString(static_cast<ncclResult_t>(99)) != nullptr, "error string of an unknown result");
  // An error Chorus itself finds: the root is out of range (every rank finds it, nothing is sent).
  r = ncclBroadcast(x, x, 4, ncclFloat32, gSize, comm, nullptr);
  CHECK(r == ncclInvalidArgument && lastError().find("root") != std::string::npos, "bad root: %s",
        lastError().c_str());
  CHECK(std::string(ncclGetErrorString(ncclInvalidUsage)).find("invalid usage") != std::string::npos,
        "error string");
  // The communicator still works after refused calls.
  NCCL_OK(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, comm, nullptr));
  CHECK(x[3] == 4.0f * gSize, "allreduce after refusals: %g", x[3]);
}

ncclUniqueId exchangeId(const std::string& dir) {
  // chorusrun's pid names the job, so concurrent runs do not share a file.
  const std::string path = dir + "/nccl_shim_id." + std::to_string(getppid());
  ncclUniqueId id;
  if (gRank == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(id.internal, sizeof id.internal);
    std::rename(tmp.c_str(), path.c_str());
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path, std::ios::binary);
    if (in.read(id.internal, sizeof id.internal)) return id;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::fprintf(stderr, "rank %d: no unique id in %s after 60 s\n", gRank, path.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const char* rank = std::getenv("CHORUS_RANK");
  const char* size = std::getenv("CHORUS_WORLD_SIZE");
  if (argc != 2 || !rank || !size) {
    std::fprintf(stderr, "usage: chorusrun -n 4 %s <directory for the id file>\n", argv[0]);
    return 2;
  }
  gRank = std::atoi(rank);
  gSize = std::atoi(size);
  setenv("CUDA_VISIBLE_DEVICES", "", 1);  // the same behaviour on machines with a GPU
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  CHECK(version == NCCL_VERSION_CODE, "version %d, header %d", version, NCCL_VERSION_CODE);

  const ncclUniqueId id = exchangeId(argv[1]);
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  NCCL_OK(ncclCommInitRankConfig(&comm, gSize, id, gRank, &config));
  testAllReduce(comm);
  testOthers(comm);
  testSplitAndQueries(comm);
  testRefusals(comm);
  NCCL_OK(ncclCommFinalize(comm));
  NCCL_OK(ncclCommDestroy(comm));
  if (gRank == 0) std::remove((std::string(argv[1]) + "/nccl_shim_id." + std::to_string(getppid())).c_str());
  std::printf("rank %d: %s\n", gRank, gFailures ? "FAILED" : "all NCCL calls checked");
  return gFailures ? 1 : 0;
}
