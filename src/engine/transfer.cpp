#include "engine/transfer.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

#include "base/error.hpp"
#include "kernels/cpu/reduce.hpp"

namespace chorus::engine {

namespace {

size_t padOf(size_t bytes) { return alignUp(bytes, 8) - bytes; }

// Payloads at least this large go through a direct pipe's write()/read() (no copy through its
// buffer); smaller ones are batched with their header through reserve()/commit().
constexpr size_t kDirectBytes = size_t{64} << 10;

const char* kindName(TransferKind k) {
  return k == TransferKind::Send   ? "send to"
         : k == TransferKind::Recv ? "receive from"
                                   : "receive+reduce from";
}

// Each step function moves as much as the pipe allows and reports whether anything moved.
bool stepSend(Transfer& t, std::span<Transfer> all, transport::SendPipe& pipe) {
  bool moved = false;
  if (t.phase == 0) {
    std::span<std::byte> s = pipe.reserve();
    if (s.size() < 8) return false;
    const size_t inPlaceMin = pipe.inPlaceMinBytes();
    const bool byAddress = inPlaceMin && t.bytes >= inPlaceMin && t.waitFor < 0;
    uint64_t h = MessageHeader::encode(t.tag, t.bytes, byAddress);
    std::memcpy(s.data(), &h, 8);
    pipe.commit(8);
    t.phase = byAddress ? 4 : 1;
    moved = true;
  }
  if (t.phase == 1) {
    const bool direct = pipe.direct() && t.bytes >= kDirectBytes;
    while (t.done < t.bytes) {
      size_t limit = t.bytes;
      if (t.waitFor >= 0) limit = std::min(limit, all[static_cast<size_t>(t.waitFor)].done);
      if (limit <= t.done) break;
      if (direct) {
        size_t want = limit - t.done;
        want -= want % t.elemSize;
        if (want == 0) break;
        const size_t n = pipe.write(t.src + t.done, want, t.elemSize);
        if (n == 0) break;
        t.done += n;
        moved = true;
        continue;
      }
      std::span<std::byte> s = pipe.reserve();
      size_t n = std::min(s.size(), limit - t.done);
      n -= n % t.elemSize;
      if (n == 0) break;
      std::memcpy(s.data(), t.src + t.done, n);
      pipe.commit(n);
      t.done += n;
      moved = true;
    }
    if (t.done == t.bytes) t.phase = 2;
  }
  if (t.phase == 2) {
    size_t pad = padOf(t.bytes);
    if (pad) {
      std::span<std::byte> s = pipe.reserve();
      if (s.size() < pad) {
        if (moved) pipe.flush();
        return moved;
      }
      pipe.commit(pad);
    }
    t.phase = 3;
    moved = true;
  }
  if (t.phase == 4) {  // single copy: the payload's address, in place of its bytes
    std::span<std::byte> s = pipe.reserve();
    if (s.size() >= 8) {
      const uint64_t address = reinterpret_cast<uintptr_t>(t.src);
      std::memcpy(s.data(), &address, 8);
      pipe.commit(8);
      t.ticket = pipe.postInPlace();
      t.phase = 5;
      moved = true;
    }
  }
  if (t.phase == 5 && pipe.inPlaceReadsDone() >= t.ticket) {  // the receiver has copied it
    t.done = t.bytes;
    t.phase = 3;
    moved = true;
  }
  if (moved) pipe.flush();
  return moved;
}

// Single copy: the payload of `t` from the sender's buffer at `address`, straight into its
// destination (Recv) or through a cache-sized piece reduced into it (RecvReduce).
void receiveInPlace(Transfer& t, transport::RecvPipe& pipe, uint64_t address, int self,
                    const std::function<std::string()>& what) {
  const auto refused = [&] {
    fail(chorusInternalError, strCat("rank ", self, ": ", what(), ": message from rank ", t.peer,
                                     " was sent by address, which this pipe cannot read (a corrupt stream)"));
  };
  try {
    if (!pipe.readInPlace(t.dst, address, 0)) refused();  // whether this pipe can, whatever the length
    if (t.kind == TransferKind::Recv) {
      if (!pipe.readInPlace(t.dst, address, t.bytes)) refused();
    } else {
      // Half of a 1 MiB L2 with the operand and the output beside it; whole elements.
      constexpr size_t kPiece = size_t{256} << 10;
      thread_local std::unique_ptr<std::byte[]> scratch;
      if (!scratch) scratch = std::make_unique<std::byte[]>(kPiece);
      const size_t piece = kPiece / t.elemSize * t.elemSize;
      for (size_t o = 0; o < t.bytes; o += piece) {
        const size_t n = std::min(piece, t.bytes - o);
        if (!pipe.readInPlace(scratch.get(), address + o, n)) refused();
        const void* srcs[2] = {t.src + o, scratch.get()};
        kernels::reduce(t.dst + o, srcs, 2, n / t.elemSize, t.dtype, t.op, t.avgDivisor);
      }
    }
  } catch (const Error& e) {
    fail(e.code(), strCat("rank ", self, ": ", what(), ": ", e.what()));
  }
  pipe.finishInPlace();
  t.done = t.bytes;
}

bool stepRecv(Transfer& t, transport::RecvPipe& pipe, int self, const std::function<std::string()>& what) {
  bool moved = false;
  if (t.phase == 0) {
    std::span<const std::byte> s = pipe.peek();
    if (s.size() < 8) return false;
    uint64_t h;
    std::memcpy(&h, s.data(), 8);
    const MessageHeader header = MessageHeader::decode(h);
    const uint16_t tag = header.tag;
    const size_t len = header.length;
    if (tag != t.tag || len != t.bytes) {
      fail(chorusInvalidUsage,
           strCat("rank ", self, ": ", what(), ": message from rank ", t.peer, " has ", len, " bytes (tag ",
                  tag, ") but this rank expected ", t.bytes, " bytes (tag ", t.tag,
                  "); the ranks called different operations, counts or types"));
    }
    pipe.consume(8);
    t.phase = header.byAddress ? 4 : 1;
    moved = true;
  }
  if (t.phase == 4) {  // single copy: the sender's buffer address
    std::span<const std::byte> s = pipe.peek();
    if (s.size() < 8) return moved;
    uint64_t address;
    std::memcpy(&address, s.data(), 8);
    pipe.consume(8);
    receiveInPlace(t, pipe, address, self, what);
    t.phase = 3;
    return true;
  }
  if (t.phase == 1) {
    const bool direct = t.kind == TransferKind::Recv && pipe.direct() && t.bytes >= kDirectBytes;
    while (t.done < t.bytes) {
      if (direct) {
        // Straight into the destination when nothing waits in the pipe's buffer (read() returns 0
        // otherwise, and the buffered bytes are taken below).
        const size_t n = pipe.read(t.dst + t.done, t.bytes - t.done, t.elemSize);
        if (n) {
          t.done += n;
          moved = true;
          continue;
        }
      }
      std::span<const std::byte> s = pipe.peek();
      size_t n = std::min(s.size(), t.bytes - t.done);
      n -= n % t.elemSize;
      if (n == 0) break;
      if (t.kind == TransferKind::Recv) {
        std::memcpy(t.dst + t.done, s.data(), n);
      } else {
        const void* srcs[2] = {t.src + t.done, s.data()};
        kernels::reduce(t.dst + t.done, srcs, 2, n / t.elemSize, t.dtype, t.op, t.avgDivisor);
      }
      pipe.consume(n);
      t.done += n;
      moved = true;
    }
    if (t.done == t.bytes) t.phase = 2;
  }
  if (t.phase == 2) {
    size_t pad = padOf(t.bytes);
    if (pad) {
      std::span<const std::byte> s = pipe.peek();
      if (s.size() < pad) return moved;
      pipe.consume(pad);
    }
    t.phase = 3;
    moved = true;
  }
  return moved;
}

// Sends to and receives from this rank itself pair up in order and complete by local copy.
void runSelfTransfers(std::span<Transfer> ts, int self, const std::function<std::string()>& what) {
  std::vector<size_t> sends, recvs;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].peer != self) continue;
    (ts[i].kind == TransferKind::Send ? sends : recvs).push_back(i);
  }
  if (sends.size() != recvs.size()) {
    fail(chorusInvalidUsage, strCat("rank ", self, ": ", what(), ": ", sends.size(), " sends to self but ",
                                    recvs.size(), " receives from self in the same group"));
  }
  for (size_t k = 0; k < sends.size(); ++k) {
    Transfer& s = ts[sends[k]];
    Transfer& r = ts[recvs[k]];
    if (s.bytes != r.bytes) {
      fail(chorusInvalidUsage, strCat("rank ", self, ": ", what(), ": send to self of ", s.bytes,
                                      " bytes matched with a receive of ", r.bytes, " bytes"));
    }
    if (r.kind == TransferKind::Recv) {
      if (r.dst != s.src && s.bytes) std::memmove(r.dst, s.src, s.bytes);
    } else {
      const void* srcs[2] = {r.src, s.src};
      kernels::reduce(r.dst, srcs, 2, r.bytes / r.elemSize, r.dtype, r.op, r.avgDivisor);
    }
    s.done = s.bytes;
    r.done = r.bytes;
    s.phase = r.phase = 3;
  }
}

}  // namespace

Transfer Transfer::recvReduce(int peer, void* dst, const void* local, size_t bytes, DataType type,
                              ReduceOp op, int avgDivisor, uint16_t tag) {
  Transfer t;
  t.kind = TransferKind::RecvReduce;
  t.peer = peer;
  t.dst = static_cast<std::byte*>(dst);
  t.src = static_cast<const std::byte*>(local);
  t.bytes = bytes;
  t.elemSize = dataTypeSize(type);
  t.dtype = type;
  t.op = op;
  t.avgDivisor = avgDivisor;
  t.tag = tag;
  return t;
}

void runTransfers(std::span<Transfer> ts, PipeSet& pipes, int self, Waiter& waiter,
                  const std::function<std::string()>& what) {
  runSelfTransfers(ts, self, what);
  // blockedBy[i]: the previous transfer on the same pipe (same peer and direction), or -1.
  std::vector<int> blockedBy(ts.size(), -1);
  std::unordered_map<int64_t, int> lastOnPipe;
  size_t remaining = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].complete()) continue;
    ++remaining;
    int64_t key = int64_t{ts[i].peer} * 2 + (ts[i].kind == TransferKind::Send ? 1 : 0);
    auto it = lastOnPipe.find(key);
    if (it != lastOnPipe.end()) blockedBy[i] = it->second;
    lastOnPipe[key] = static_cast<int>(i);
  }
  auto describe = [&]() {
    std::string s = strCat("rank ", self, ": ", what(), " stalled:");
    int shown = 0;
    for (const Transfer& t : ts) {
      if (t.complete()) continue;
      if (shown++ == 8) {
        s += " ...";
        break;
      }
      if (t.phase >= 4) {
        s += strCat(" [", kindName(t.kind), " rank ", t.peer, ": ", t.bytes, " bytes, sent by address",
                    t.phase == 5 ? ", not yet copied by the receiver]" : "]");
        continue;
      }
      s += strCat(" [", kindName(t.kind), " rank ", t.peer, ": ", t.done, " of ", t.bytes, " bytes]");
    }
    return s;
  };
  while (remaining > 0) {
    bool moved = false;
    for (size_t i = 0; i < ts.size(); ++i) {
      Transfer& t = ts[i];
      if (t.complete()) continue;
      if (blockedBy[i] >= 0 && !ts[static_cast<size_t>(blockedBy[i])].complete()) continue;
      bool m = false;
      if (t.kind == TransferKind::Send) {
        m = stepSend(t, ts, pipes.sendPipe(t.peer));
      } else {
        try {
          m = stepRecv(t, pipes.recvPipe(t.peer), self, what);
        } catch (const Error&) {
          // Reading a sender's buffer in place failed: a sender that exited after failing (a
          // third rank died, say) has published why.
          if (t.phase == 4) waiter.explainPeerError();
          throw;
        }
      }
      moved |= m;
      if (t.complete()) --remaining;
    }
    if (moved) {
      waiter.progressed();
    } else {
      waiter.idle(describe, [&](int rank) {
        for (const Transfer& t : ts) {
          if (!t.complete() && t.peer == rank) return true;
        }
        return false;
      });
    }
  }
}

}  // namespace chorus::engine
