#!/usr/bin/env python3
"""quartiles.py RUNS.jsonl: per collective, size, placement and variant, the launches of
placement.py (../2026-12-06c-stage-slots) and the 25th/50th/75th percentiles of their times (us),
out of place and in place. near: both probes of the cache-line round trip under 250 ns; far: both
at 250 ns or more; launches whose probes disagree (the host moved the vCPUs) are left out."""
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1])]


def q(v):
    v = sorted(v)
    n = len(v)
    return "%7.2f %7.2f %7.2f" % (v[n // 4], v[n // 2], v[3 * n // 4]) if n else "      -       -       -"


place = {"near": lambda r: r["s0"] < 250 and r["s1"] < 250, "far": lambda r: r["s0"] >= 250 and r["s1"] >= 250}
print("%-11s %5s %-5s %-7s %8s   %-23s   %-23s" % ("collective", "size", "place", "variant", "launches",
                                                 "out of place q1 q2 q3", "in place q1 q2 q3"))
keys = []
for r in rows:
    k = (r["coll"], r["size"], r["v"])
    if k not in keys:
        keys.append(k)
for coll in dict.fromkeys(k[0] for k in keys):
    for size in dict.fromkeys(k[1] for k in keys if k[0] == coll):
        for p, cond in place.items():
            for v in dict.fromkeys(k[2] for k in keys if k[0] == coll and k[1] == size):
                rs = [r for r in rows if (r["coll"], r["size"], r["v"]) == (coll, size, v) and cond(r) and r["oop"]]
                print("%-11s %5s %-5s %-7s %8d   %s   %s" % (coll, size, p, v, len(rs), q([r["oop"] for r in rs]),
                                                          q([r["inp"] for r in rs])))
