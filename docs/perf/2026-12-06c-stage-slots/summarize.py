#!/usr/bin/env python3
"""summarize.py RUNS.jsonl: median us out of place / in place per collective, size, placement and
variant. Near: both probes under 200 ns; far: both over 350 ns; other launches left out."""
import collections, json, statistics as st, sys

d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["oop"] is None:
        continue
    p = "near" if r["s0"] < 200 and r["s1"] < 200 else "far" if r["s0"] > 350 and r["s1"] > 350 else None
    if p:
        d[(r["coll"], r["size"], p, r["v"])].append((r["oop"], r["inp"]))
print(f"{'collective':15} {'size':>5} {'placement':9} {'variant':10} {'launches':>8} {'out of place':>12} {'in place':>9}")
for k in sorted(d):
    v = d[k]
    print(f"{k[0]:15} {k[1]:>5} {k[2]:9} {k[3]:10} {len(v):8d} {st.median(x[0] for x in v):12.1f} "
          f"{st.median(x[1] for x in v):9.1f}")
