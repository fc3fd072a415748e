#!/bin/bash
# 256 MiB against the launch's copy floor, steady state (20 timed calls after 6 warm-up)
cd /work/main
for r in 1 2; do
for n in 2 4; do for M in 0 1; do for c in all_reduce all_gather reduce_scatter; do
  echo "== round $r ranks $n memalloc $M $c"
  build/lto/src/chorusrun -n $n build/lto/bench/chorus-perf $c -b 256M -e 256M -n 20 -w 6 -c 0 -M $M --floor --json 2>&1 | grep -o '{.*}'
  build/lto/bench/membw/chorus-membw --quick -n 1 --bytes 1M 2>/dev/null | grep "spin round"
done; done; done; done
