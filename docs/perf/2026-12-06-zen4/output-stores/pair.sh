#!/usr/bin/env bash
# usage: pair.sh coll n b e rounds -> lines: round variant rt_before rt_after sizes...
B=/work/main/build/lto
coll=$1; n=$2; b=$3; e=$4; rounds=$5
rt() { $B/bench/membw/chorus-membw --quick 2>&1 | awk '/spin round trip/{print $(NF-3)}'; }
for r in $(seq 1 $rounds); do
  for v in 0 1; do
    if [ $(( (r + v) % 2 )) = 0 ]; then env=X=1; name=timed; else env=CHORUS_NT_STORE_BYTES=32M; name=threshold; fi
    a=$(rt)
    out=$(env $env $B/src/chorusrun -n $n $B/bench/chorus-perf $coll -b $b -e $e -f 2 -n 50 -w 20 2>&1 | grep -E "^\[0\] +[0-9]" | awk '{printf "%s %s/%s ", $2, $7, $11}')
    z=$(rt)
    echo "$r $name $a $z $out"
  done
done
