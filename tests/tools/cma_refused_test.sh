#!/usr/bin/env bash
# cma_refused_test.sh DENY_CMA CHORUS_INFO CHORUSRUN CHORUS_PERF: where cross-memory attach is refused
# (EPERM, as Yama's ptrace_scope or another user gives), chorus-info says so and why, and
# collectives forced to read heap buffers in place (CHORUS_CMA=1K) stage them instead: every rank
# logs the refusal once, at set-up, and every result is exact; the same where only writes
# (process_vm_writev) are refused. Exits 77 where no seccomp filter can be set.
set -uo pipefail
deny=$1 info=$2 run=$3 perf=$4
out=$("$deny" "$info" -n 2 2>&1)
rc=$?
[ $rc -eq 77 ] && { echo "$out"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
grep -E "Single copy +refused, collectives stage heap buffers: process [0-9]+ refused it: .*EPERM: ptrace rules" <<<"$out" ||
  fail "chorus-info did not report the refusal: $out"
# Sizes where single copy would read in place: allreduce from 256 KiB, reduce_scatter from 32 KiB,
# all_gather and broadcast up to 1 MiB, sends from 1 MiB; 2 and 3 ranks.
for n in 2 3; do
  for coll in all_reduce reduce_scatter all_gather broadcast sendrecv alltoall; do
    log=$(CHORUS_CMA=1K CHORUS_DEBUG=INFO CHORUS_DEBUG_SUBSYS=SHM "$deny" "$run" -n $n "$perf" $coll \
          -b 4K -e 4M -f 8 -w 1 -n 2 2>&1)
    rc=$?
    [ $rc -eq 0 ] || fail "$coll, $n ranks: exit status $rc: $log"
    grep -q "Out of bounds values : 0 OK" <<<"$log" || fail "$coll, $n ranks: wrong results: $log"
    refusals=$(grep -cE "collectives stage ordinary buffers: rank [0-9]+ cannot read rank [0-9]+'s memory: process [0-9]+ refused it: .*EPERM" <<<"$log")
    [ "$refusals" -eq $n ] || fail "$coll, $n ranks: $refusals refusal lines, want one per rank: $log"
    echo "ok: $coll, $n ranks: staged, exact, the refusal named by every rank"
  done
done
# Writes refused alone (the single-copy allreduce writes its reduced slices into the peers'
# outputs): chorus-info and the set-up probe find it, every rank stages, says why, and is exact.
out=$("$deny" --writes-only "$info" -n 2 2>&1)
grep -E "Single copy +refused, collectives stage heap buffers: process_vm_writev is refused here: .*EPERM" <<<"$out" ||
  fail "chorus-info did not report the refused writes: $out"
log=$(CHORUS_CMA=1K CHORUS_DEBUG=INFO CHORUS_DEBUG_SUBSYS=SHM "$deny" --writes-only "$run" -n 2 "$perf" all_reduce \
      -b 4K -e 4M -f 8 -w 1 -n 2 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "all_reduce, writes refused: exit status $rc: $log"
grep -q "Out of bounds values : 0 OK" <<<"$log" || fail "all_reduce, writes refused: wrong results: $log"
refusals=$(grep -cE "collectives stage ordinary buffers: rank [0-9]+ cannot write its peers' memory: process_vm_writev is refused here: .*EPERM" <<<"$log")
[ "$refusals" -eq 2 ] || fail "all_reduce, writes refused: $refusals refusal lines, want 2: $log"
echo "ok: all_reduce, 2 ranks, writes refused alone: staged, exact, named by every rank"
echo "ok: cross-memory attach refused: reported by chorus-info, collectives staged and exact"
