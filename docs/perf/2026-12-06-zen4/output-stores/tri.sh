#!/usr/bin/env bash
# usage: tri.sh coll n b e rounds: default / plain (NT 32M) / streaming (NT 4M), placement probed around each launch
B=/work/main/build/lto
coll=$1; n=$2; b=$3; e=$4; rounds=$5
rt() { $B/bench/membw/chorus-membw --quick 2>&1 | awk '/spin round trip/{print $(NF-3)}'; }
vars=(X=1 CHORUS_NT_STORE_BYTES=32M CHORUS_NT_STORE_BYTES=4M); names=(timed plain streaming)
for r in $(seq 1 $rounds); do
  for j in 0 1 2; do
    v=$(( (r + j) % 3 ))
    a=$(rt)
    out=$(env ${vars[$v]} $B/src/chorusrun -n $n $B/bench/chorus-perf $coll -b $b -e $e -f 2 -n 50 -w 20 2>&1 | grep -E "^\[0\] +[0-9]" | awk '{printf "%s %s/%s ", $2, $7, $11}')
    z=$(rt)
    echo "$r ${names[$v]} $a $z $out"
  done
done
