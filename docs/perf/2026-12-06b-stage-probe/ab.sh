#!/usr/bin/env bash
# The measured staging size (the default, 1 MiB on the AVX-512 EPYC) against the L2 / 2 rule's
# 512 KiB, forced: 2, 4 and 8 ranks, the three staged collectives. Run from the repository root.
set -u
out=${1:-docs/perf/2026-12-06b-stage-probe}
for n in 2 4 8; do
  case $n in
    2) args="-b 512K -e 16M -f 2 --rounds 5 --warmup 20 --iters 50" ;;
    4) args="-b 512K -e 16M -f 2 --rounds 5 --warmup 10 --iters 30" ;;
    8) args="-b 1M -e 16M -f 4 --rounds 5 --warmup 5 --iters 10" ;;
  esac
  for coll in reduce_scatter all_reduce all_gather; do
    bench/ab --build build/lto --env "" --env CHORUS_SHM_STAGE_BYTES=512K $coll -n $n $args \
      > "$out/ab-$coll-$n.txt" 2>&1
  done
done
