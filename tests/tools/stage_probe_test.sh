#!/usr/bin/env bash
# stage_probe_test.sh CHORUS_INFO CHORUSRUN CHORUS_PERF: the staging size measured on this machine
# (topology/stage_probe.hpp): measured once and cached in CHORUS_CACHE_DIR/machine-probe, read back
# by the next process (and by a job, whose rank 0 uses it), measured again when the file is for
# another machine or deleted; a lock held by another process is waited for 3 s, then the L2 / 2
# rule; CHORUS_STAGE_PROBE=0 and CHORUS_SHM_STAGE_BYTES are obeyed; a cache
# directory that cannot be made is reported. Exits 77 in a sanitizer build (which does not probe).
set -uo pipefail
info=$1 run=$2 perf=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
staging() { grep -E "^ +staging " <<<"$1"; }

out=$(CHORUS_CACHE_DIR=$dir "$info" -n 2 2>&1) || fail "chorus-info failed: $out"
line=$(staging "$out")
echo "first: $line"
if grep -q "a sanitizer build does not probe" <<<"$line"; then
  [ -e "$dir/machine-probe" ] && fail "a sanitizer build wrote the cache"
  echo "a sanitizer build does not probe: skipped"
  exit 77
fi
grep -qE "staging [0-9.]+ [KM]iB per rank \(measured \(reduce-scatter, 2 threads: .* us, .* us, paired ratio .*\), cached in $dir/machine-probe" <<<"$line" ||
  fail "not measured and cached: $line"
bytes=$(sed -n 's/^shm_stage_bytes //p' "$dir/machine-probe")
[ -n "$bytes" ] || fail "no size in the cache file: $(cat "$dir/machine-probe")"

# The next process reads it.
line=$(staging "$(CHORUS_CACHE_DIR=$dir "$info" -n 2 2>&1)")
echo "second: $line"
grep -q "(measured, cached in $dir/machine-probe" <<<"$line" || fail "the cache was not read: $line"

# A figure in the file is used as it is: by chorus-info and by a job's rank 0 for every rank.
sed -i 's/^shm_stage_bytes .*/shm_stage_bytes 393216/' "$dir/machine-probe"
line=$(staging "$(CHORUS_CACHE_DIR=$dir "$info" -n 2 2>&1)")
grep -q "staging 384 KiB per rank (measured, cached in" <<<"$line" || fail "the cached figure was not used: $line"
log=$(CHORUS_CACHE_DIR=$dir CHORUS_DEBUG=INFO CHORUS_DEBUG_SUBSYS=SHM "$run" -n 2 "$perf" reduce_scatter \
      -b 1M -e 1M -w 1 -n 2 2>&1) || fail "the job failed: $log"
[ "$(grep -c "shared memory ready, 2 segments of .* (staging 384 KiB per rank, 4 slots of 192 KiB)" <<<"$log")" -eq 2 ] ||
  fail "the job's ranks did not both stage 384 KiB: $log"

# Written for another machine: measured again, and the file rewritten for this one.
sed -i 's/^key .*/key another CPU/' "$dir/machine-probe"
line=$(staging "$(CHORUS_CACHE_DIR=$dir "$info" -n 2 2>&1)")
grep -q "(measured (reduce-scatter" <<<"$line" || fail "another machine's figure was used: $line"
grep -q "^key another CPU" "$dir/machine-probe" && fail "the file still names another machine"
# Deleted: measured again.
rm "$dir/machine-probe"
line=$(staging "$(CHORUS_CACHE_DIR=$dir "$info" -n 2 2>&1)")
grep -q "(measured (reduce-scatter" <<<"$line" || fail "not measured after the file was deleted: $line"
[ -e "$dir/machine-probe" ] || fail "not cached again"

# Another process holding the lock past 3 s: the rule, said so, and nothing written.
if command -v flock >/dev/null; then
  rm "$dir/machine-probe"
  flock "$dir/machine-probe.lock" sleep 8 &
  holder=$!
  sleep 0.5
  line=$(staging "$(CHORUS_CACHE_DIR=$dir "$info" -n 2 2>&1)")
  kill $holder 2>/dev/null; wait $holder 2>/dev/null
  grep -q "machine-probe.lock held by another process past 3 s); the L2 / 2 rule" <<<"$line" ||
    fail "a held lock not waited for with a deadline: $line"
  [ -e "$dir/machine-probe" ] && fail "written without the lock"
fi
# The settings.
line=$(staging "$(CHORUS_CACHE_DIR=$dir CHORUS_STAGE_PROBE=0 "$info" -n 2 2>&1)")
grep -qF "(CHORUS_STAGE_PROBE=0); the L2 / 2 rule: " <<<"$line" || fail "CHORUS_STAGE_PROBE=0 not obeyed: $line"
line=$(staging "$(CHORUS_CACHE_DIR=$dir CHORUS_SHM_STAGE_BYTES=2M "$info" -n 2 2>&1)")
grep -q "staging 2 MiB per rank (CHORUS_SHM_STAGE_BYTES;" <<<"$line" || fail "CHORUS_SHM_STAGE_BYTES not obeyed: $line"
# A cache directory that cannot be made: measured, and the reason it is not kept named.
touch "$dir/a-file"
line=$(staging "$(CHORUS_CACHE_DIR=$dir/a-file/sub "$info" -n 2 2>&1)")
grep -q "not cached: cannot create $dir/a-file/sub" <<<"$line" || fail "an unusable cache directory not named: $line"
echo "PASS"
