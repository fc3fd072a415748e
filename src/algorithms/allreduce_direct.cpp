// AllReduce, direct: on one host every rank stages its chunk in shared memory, reduces one slice of
// it straight from all peers' staging areas, and copies every reduced slice out.
// Per chunk: 2 synchronisations; each byte is read n+1 times in total across ranks, written twice.
#include "algorithms/common.hpp"

namespace chorus::algo {

void allReduceDirect(Context& ctx, const Op& op) {
  if (op.count == 0) return;
  transport::ShmGroup& shm = *ctx.shm();
  const int n = ctx.size(), me = ctx.rank();
  const size_t elem = dataTypeSize(op.type);
  const size_t chunk = stageChunkElems(shm, elem, 1);
  const kernels::Store store = outputStore(op.count * elem);
  std::vector<const void*> srcs(static_cast<size_t>(n));
  forEachStagedChunk(
      ctx, op.count, chunk,
      [&](size_t off, size_t ce, int h) {
        kernels::copy(shm.stage(me, h), at(op.send, off, elem), ce * elem);
      },
      [&](size_t off, size_t ce, int h) {
        Slices slices(ce, static_cast<size_t>(n), cacheLineElems(elem));
        const size_t so = slices.offset(static_cast<size_t>(me)), sn = slices.length(static_cast<size_t>(me));
        if (sn) {
          for (int k = 0; k < n; ++k) srcs[static_cast<size_t>(k)] = shm.stage(k, h) + so * elem;
          kernels::reduce(shm.stage(me, h) + so * elem, srcs.data(), n, sn, op.type, op.op,
                          avgDivisor(op, n));
        }
        ctx.syncAll();  // every slice reduced
        for (int k = 0; k < n; ++k) {
          size_t o = slices.offset(static_cast<size_t>(k)), l = slices.length(static_cast<size_t>(k));
          if (l) kernels::copy(at(op.recv, off + o, elem), shm.stage(k, h) + o * elem, l * elem, store);
        }
      });
}

}  // namespace chorus::algo
