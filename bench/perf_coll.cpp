// chorus-perf: collective shapes and dispatch.
#include "perf_coll.hpp"

#include <algorithm>

namespace chorus_perf {

namespace {

struct CollEntry {
  Coll coll;
  const char* name;
};

constexpr CollEntry kColls[] = {
    {Coll::AllReduce, "all_reduce"}, {Coll::ReduceScatter, "reduce_scatter"},
    {Coll::AllGather, "all_gather"}, {Coll::Broadcast, "broadcast"},
    {Coll::Reduce, "reduce"},        {Coll::AllToAll, "alltoall"},
    {Coll::SendRecv, "sendrecv"},
};

// Per-rank block of a collective whose buffer holds nranks blocks: rounded down to a multiple of
// 4 elements, as nccl-tests does.
constexpr size_t kBlockAlign = 4;

}  // namespace

std::optional<Coll> collFromName(const std::string& name) {
  for (const auto& e : kColls) {
    if (name == e.name) return e.coll;
  }
  return std::nullopt;
}

const char* collName(Coll c) {
  for (const auto& e : kColls) {
    if (c == e.coll) return e.name;
  }
  return "unknown";
}

bool collReduces(Coll c) { return c == Coll::AllReduce || c == Coll::ReduceScatter || c == Coll::Reduce; }

bool collRooted(Coll c) { return c == Coll::Broadcast || c == Coll::Reduce; }

double busFactor(Coll c, int nranks) {
  const double n = nranks;
  switch (c) {
    case Coll::AllReduce:
      return 2.0 * (n - 1) / n;
    case Coll::ReduceScatter:
    case Coll::AllGather:
    case Coll::AllToAll:
      return (n - 1) / n;
    case Coll::Broadcast:
    case Coll::Reduce:
    case Coll::SendRecv:
      return 1.0;
  }
  return 1.0;
}

Shape shapeFor(Coll c, size_t sizeBytes, size_t typeSize, int nranks) {
  const size_t elems = sizeBytes / typeSize;
  const size_t n = static_cast<size_t>(nranks);
  Shape s;
  switch (c) {
    case Coll::AllReduce:
    case Coll::Broadcast:
    case Coll::Reduce:
    case Coll::SendRecv:
      s.count = elems;
      s.sendElems = elems;
      s.recvElems = elems;
      break;
    case Coll::AllGather: {
      const size_t base = elems / (kBlockAlign * n) * kBlockAlign;
      s.count = base;
      s.sendElems = base;
      s.recvElems = base * n;
      s.sendInplaceOffset = base;
      break;
    }
    case Coll::ReduceScatter: {
      const size_t base = elems / (kBlockAlign * n) * kBlockAlign;
      s.count = base;
      s.sendElems = base * n;
      s.recvElems = base;
      s.recvInplaceOffset = base;
      break;
    }
    case Coll::AllToAll: {
      const size_t base = elems / (kBlockAlign * n) * kBlockAlign;
      s.count = base;
      s.sendElems = base * n;
      s.recvElems = base * n;
      break;
    }
  }
  s.bytes = std::max(s.sendElems, s.recvElems) * typeSize;
  return s;
}

void runColl(chorus::Communicator& comm, Coll c, const void* send, void* recv, size_t count,
             chorus::DataType type, chorus::ReduceOp op, int root, chorus::CudaStream stream) {
  switch (c) {
    case Coll::AllReduce:
      comm.allReduce(send, recv, count, type, op, stream);
      return;
    case Coll::ReduceScatter:
      comm.reduceScatter(send, recv, count, type, op, stream);
      return;
    case Coll::AllGather:
      comm.allGather(send, recv, count, type, stream);
      return;
    case Coll::Broadcast:
      comm.broadcast(send, recv, count, type, root, stream);
      return;
    case Coll::Reduce:
      comm.reduce(send, recv, count, type, op, root, stream);
      return;
    case Coll::AllToAll:
      comm.allToAll(send, recv, count, type, stream);
      return;
    case Coll::SendRecv: {
      const int n = comm.size();
      const int me = comm.rank();
      chorus::Group group;
      comm.send(send, count, type, (me + 1) % n, stream);
      comm.recv(recv, count, type, (me - 1 + n) % n, stream);
      group.end();
      return;
    }
  }
}

}  // namespace chorus_perf
