#!/usr/bin/env bash
# chorus_train_test.sh <chorusrun> <chorus-train>: chorus-train as processes. A dp x pp x tp =
# 2 x 2 x 2 run with ZeRO-1, accumulation and 1F1B must exit 0, print its summary, lower the loss,
# and end with the final loss a single process reaches on the same global batch (float64, relative
# 1e-9). The equivalence tests (threads) check every grid; this checks the program and its output.
set -euo pipefail
chorusrun=$1
trainer=$2
common=(--float64 --steps 6 --optimizer adamw --lr 0.01 --clip 0.5 --quiet)

grid=$("$chorusrun" -n 8 "$trainer" --dp 2 --tp 2 --pp 2 --zero 1 --accum 2 --micro-batches 2 "${common[@]}")
echo "$grid"
single=$("$chorusrun" -n 1 "$trainer" "${common[@]}")
echo "$single"

for needed in "8 ranks = dp 2 x pp 2 x tp 2, ZeRO 1" "comm_hidden" "resident memory formula (ZeRO-1, N=2"; do
  grep -qF "$needed" <<<"$grid" || { echo "FAIL: the output lacks '$needed'"; exit 1; }
done
read -r last first < <(sed -n 's/.*final loss \([0-9.e+-]*\) (first \([0-9.e+-]*\)).*/\1 \2/p' <<<"$grid")
read -r single_last _ < <(sed -n 's/.*final loss \([0-9.e+-]*\) (first \([0-9.e+-]*\)).*/\1 \2/p' <<<"$single")
awk -v l="$last" -v f="$first" -v s="$single_last" 'BEGIN {
  if (!(l < f)) { print "FAIL: the loss did not fall: " f " -> " l; exit 1 }
  d = l - s; if (d < 0) d = -d
  if (d > 1e-9 * s) { print "FAIL: final loss " l " on the grid, " s " in one process"; exit 1 }
  print "ok: loss " f " -> " l ", one process " s
}'
