#include "check.hpp"

#include <cstdlib>

namespace chorus::testing {

const char* collName(Coll c) {
  switch (c) {
    case Coll::AllReduce:
      return "allreduce";
    case Coll::ReduceScatter:
      return "reducescatter";
    case Coll::AllGather:
      return "allgather";
    case Coll::Broadcast:
      return "broadcast";
    case Coll::Reduce:
      return "reduce";
    case Coll::AllToAll:
      return "alltoall";
    case Coll::AllToAllv:
      return "alltoallv";
    case Coll::SendRecv:
      return "sendrecv";
  }
  return "?";
}

std::string describe(const Case& c, int nranks) {
  return std::string(collName(c.coll)) + " " + dataTypeName(c.type) + " " + reduceOpName(c.op) + " count " +
         std::to_string(c.count) + (c.inPlace ? " in-place" : " out-of-place") + " root " +
         std::to_string(c.root) + " ranks " + std::to_string(nranks);
}

bool quickTests() {
  const char* quick = std::getenv("CHORUS_TEST_QUICK");
  return quick != nullptr && std::string(quick) == "1";
}

std::vector<size_t> matrixCounts() {
  if (quickTests()) return {0, 1, 7, 1023, 65539};
  return {0, 1, 7, 1023, 1048579};
}

namespace {

// inputValue(op, ., r, i) == inputValue(op, ., r, i + period(op)) for every i.
size_t period(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return 5;
    case ReduceOp::Prod:
      return 33;
    default:
      return 61;
  }
}

bool perRankCount(Coll c) {
  return c == Coll::ReduceScatter || c == Coll::AllGather || c == Coll::AllToAll || c == Coll::AllToAllv;
}

bool reducing(Coll c) { return c == Coll::AllReduce || c == Coll::ReduceScatter || c == Coll::Reduce; }

// Uneven all-to-all: rank r sends (r + 2j) % 5 * scale + (j == r) elements to rank j.
size_t vCount(int from, int to, size_t count) {
  size_t scale = count / 4 + 1;
  return static_cast<size_t>((from + 2 * to) % 5) * scale + (from == to ? 1 : 0);
}

template <typename T>
size_t runTyped(Communicator& comm, const Case& c, std::string* report) {
  using Tr = Traits<T>;
  const int n = comm.size(), me = comm.rank();
  const auto N = static_cast<size_t>(n), ME = static_cast<size_t>(me);
  const size_t count = c.count;
  const ReduceOp valOp = reducing(c.coll) ? c.op : ReduceOp::Sum;
  // inputValue() depends on the index only modulo a small period: tabulate it once per case.
  const size_t P = period(valOp);
  std::vector<T> tab(N * P);
  std::vector<double> tabD(N * P), expTab(P);
  for (size_t r = 0; r < N; ++r) {
    for (size_t k = 0; k < P; ++k) {
      tab[r * P + k] = Tr::from(inputValue(valOp, Tr::isSigned, static_cast<int>(r), k));
      tabD[r * P + k] = Tr::to(tab[r * P + k]);
    }
  }
  for (size_t k = 0; k < P; ++k) expTab[k] = expectedReduce(c.op, Tr::isSigned, Tr::isFloat, n, k);
  auto in = [&](int r, size_t i) { return tab[static_cast<size_t>(r) * P + i % P]; };
  auto inD = [&](int r, size_t i) { return tabD[static_cast<size_t>(r) * P + i % P]; };
  auto expected = [&](size_t i) { return expTab[i % P]; };
  const T poison = Tr::from(99);
  const bool approx = c.op == ReduceOp::Avg && Tr::isFloat;
  switch (c.coll) {
    case Coll::AllReduce: {
      std::vector<T> send(count), recv(count, poison);
      for (size_t i = 0; i < count; ++i) send[i] = in(me, i);
      T* out = c.inPlace ? send.data() : recv.data();
      comm.allReduce(send.data(), out, count, dataTypeOf<T>(), c.op);
      return countWrong(out, count, expected, approx, report);
    }
    case Coll::ReduceScatter: {
      std::vector<T> send(count * N), recv(count, poison);
      for (size_t i = 0; i < count * N; ++i) send[i] = in(me, i);
      T* out = c.inPlace ? send.data() + ME * count : recv.data();
      comm.reduceScatter(send.data(), out, count, dataTypeOf<T>(), c.op);
      return countWrong(
          out, count, [&](size_t i) { return expected(ME * count + i); }, approx, report);
    }
    case Coll::AllGather: {
      std::vector<T> send(count), recv(count * N, poison);
      T* src = send.data();
      if (c.inPlace) src = recv.data() + ME * count;
      for (size_t i = 0; i < count; ++i) src[i] = in(me, i);
      comm.allGather(src, recv.data(), count, dataTypeOf<T>());
      return countWrong(
          recv.data(), count * N, [&](size_t g) { return inD(static_cast<int>(g / count), g % count); },
          false, report);
    }
    case Coll::Broadcast: {
      std::vector<T> send(count), recv(count, poison);
      if (me == c.root) {
        for (size_t i = 0; i < count; ++i) (c.inPlace ? recv : send)[i] = in(c.root, i);
      }
      comm.broadcast(c.inPlace ? recv.data() : send.data(), recv.data(), count, dataTypeOf<T>(), c.root);
      return countWrong(
          recv.data(), count, [&](size_t i) { return inD(c.root, i); }, false, report);
    }
    case Coll::Reduce: {
      std::vector<T> send(count), recv(count, poison);
      for (size_t i = 0; i < count; ++i) send[i] = in(me, i);
      T* out = c.inPlace ? send.data() : recv.data();
      comm.reduce(send.data(), out, count, dataTypeOf<T>(), c.op, c.root);
      if (me != c.root) return 0;
      return countWrong(out, count, expected, approx, report);
    }
    case Coll::AllToAll: {
      std::vector<T> send(count * N), recv(count * N, poison);
      for (size_t g = 0; g < count * N; ++g) send[g] = in(me, g);
      T* out = c.inPlace ? send.data() : recv.data();
      comm.allToAll(send.data(), out, count, dataTypeOf<T>());
      // Block j of the output came from rank j's block `me`.
      return countWrong(
          out, count * N, [&](size_t g) { return inD(static_cast<int>(g / count), ME * count + g % count); },
          false, report);
    }
    case Coll::AllToAllv: {
      std::vector<size_t> sc(N), sd(N), rc(N), rd(N);
      size_t st = 0, rt = 0;
      for (size_t j = 0; j < N; ++j) {
        sc[j] = vCount(me, static_cast<int>(j), count);
        rc[j] = vCount(static_cast<int>(j), me, count);
        sd[j] = st;
        rd[j] = rt + j;  // gaps between blocks must stay untouched
        st += sc[j];
        rt += rc[j] + 1;
      }
      std::vector<T> send(st), recv(rt + N, poison);
      for (size_t j = 0; j < N; ++j) {
        for (size_t i = 0; i < sc[j]; ++i) send[sd[j] + i] = in(me, j * 1000003 + i);
      }
      comm.allToAllv(send.data(), sc, sd, recv.data(), rc, rd, dataTypeOf<T>());
      size_t wrong = 0;
      std::vector<double> want(recv.size(), Tr::to(poison));
      for (size_t j = 0; j < N; ++j) {
        for (size_t i = 0; i < rc[j]; ++i) want[rd[j] + i] = inD(static_cast<int>(j), ME * 1000003 + i);
      }
      wrong += countWrong(
          recv.data(), recv.size(), [&](size_t g) { return want[g]; }, false, report);
      return wrong;
    }
    case Coll::SendRecv: {
      // Ring exchange in one group: send to me+1, receive from me-1 (and to/from self when n == 1).
      std::vector<T> send(count), recv(count, poison);
      for (size_t i = 0; i < count; ++i) send[i] = in(me, i);
      {
        Group g;
        comm.send(send.data(), count, dataTypeOf<T>(), (me + 1) % n);
        comm.recv(recv.data(), count, dataTypeOf<T>(), (me - 1 + n) % n);
        g.end();
      }
      return countWrong(
          recv.data(), count, [&](size_t i) { return inD((me - 1 + n) % n, i); }, false, report);
    }
  }
  return 0;
}

}  // namespace

size_t runCase(Communicator& comm, const Case& c, std::string* report) {
  switch (c.type) {
    case DataType::Int8:
      return runTyped<int8_t>(comm, c, report);
    case DataType::Uint8:
      return runTyped<uint8_t>(comm, c, report);
    case DataType::Int32:
      return runTyped<int32_t>(comm, c, report);
    case DataType::Uint32:
      return runTyped<uint32_t>(comm, c, report);
    case DataType::Int64:
      return runTyped<int64_t>(comm, c, report);
    case DataType::Uint64:
      return runTyped<uint64_t>(comm, c, report);
    case DataType::Float16:
      return runTyped<Half>(comm, c, report);
    case DataType::BFloat16:
      return runTyped<BFloat16>(comm, c, report);
    case DataType::Float32:
      return runTyped<float>(comm, c, report);
    case DataType::Float64:
      return runTyped<double>(comm, c, report);
  }
  return 0;
}

std::vector<Case> mixedInPlaceCases(int rank, int nranks, bool flip) {
  // 256 KiB, 2 MiB and 8 MiB of float32: the allreduce pulls out of place but stages at 2 MiB once
  // any rank is in place; reduce-scatter pulls either way.
  std::vector<Case> cases;
  const bool inPlace = (rank % 2 == 1) != flip;
  for (Coll coll : {Coll::AllReduce, Coll::ReduceScatter}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      for (size_t count : {size_t{65536} + 3, size_t{524288}, size_t{2097152} + 17}) {
        const size_t c = perRankCount(coll) ? count / static_cast<size_t>(nranks) : count;
        cases.push_back(Case{coll, DataType::Float32, op, c, inPlace, -1});
      }
    }
  }
  return cases;
}

std::vector<Case> matrix(Coll coll, int nranks, const std::vector<size_t>& counts) {
  static const DataType types[] = {DataType::Int8,    DataType::Uint8,  DataType::Int32,   DataType::Uint32,
                                   DataType::Int64,   DataType::Uint64, DataType::Float16, DataType::BFloat16,
                                   DataType::Float32, DataType::Float64};
  static const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg};
  std::vector<Case> cases;
  bool hasInPlace = coll != Coll::AllToAllv && coll != Coll::SendRecv;
  int opCount = reducing(coll) ? 5 : 1;
  for (DataType t : types) {
    for (int o = 0; o < opCount; ++o) {
      for (size_t count : counts) {
        for (int ip = 0; ip < (hasInPlace ? 2 : 1); ++ip) {
          // Rooted collectives move the root around so that every position is exercised.
          int root = (coll == Coll::Broadcast || coll == Coll::Reduce)
                         ? static_cast<int>((count + static_cast<size_t>(o) + static_cast<size_t>(ip)) %
                                            static_cast<size_t>(nranks))
                         : -1;
          // Collectives whose count is per rank (or per peer) take the total across ranks from the
          // list, as nccl-tests sizes them, so that the largest case stays one ~1M-element buffer.
          size_t c = count;
          if (perRankCount(coll)) c = (count + static_cast<size_t>(nranks) - 1) / static_cast<size_t>(nranks);
          cases.push_back(Case{coll, t, ops[o], c, ip == 1, root});
        }
      }
    }
  }
  return cases;
}

}  // namespace chorus::testing
