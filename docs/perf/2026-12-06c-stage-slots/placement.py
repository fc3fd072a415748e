#!/usr/bin/env python3
"""placement.py SECONDS OUT.jsonl RANKS COLLS SIZES NAME=BUILD[;VAR=VALUE...] ...: launches of
`BUILD/src/chorusrun -n RANKS BUILD/bench/chorus-perf` for each collective, size and variant in turn
(the variants' order rotating), each bracketed by a probe of the cache-line round trip between the
two vCPUs (chorus-membw --quick of the first variant's build), until SECONDS have passed; one JSON
line a launch (ITERS timed calls after WARMUP, 100 and 20 unless set);
../2026-12-06b-timed-slow-cma/summarize.py groups them by placement. The older
../2026-12-06b-timed-slow-cma/placement.py (settings only, 2 ranks) runs this one."""
import json, os, re, subprocess, sys, time

ITERS, WARMUP = os.environ.get("ITERS", "100"), os.environ.get("WARMUP", "20")
secs, out, ranks = float(sys.argv[1]), sys.argv[2], sys.argv[3]
colls, sizes = sys.argv[4].split(","), sys.argv[5].split(",")
variants = []
for a in sys.argv[6:]:
    name, _, spec = a.partition("=")
    build, *env = spec.split(";")
    variants.append((name, build, dict(kv.split("=", 1) for kv in env if kv)))


def spin():
    p = subprocess.run([variants[0][1] + "/bench/membw/chorus-membw", "--quick", "--json"], capture_output=True,
                       text=True)
    return json.loads(p.stdout)["latency"]["spin_round_trip_ns"]["median"]


end, i = time.time() + secs, 0
with open(out, "a") as f:
    while time.time() < end:
        for coll in colls:
            for size in sizes:
                for k in range(len(variants)):
                    name, b, env = variants[(i + k) % len(variants)]
                    e = dict(os.environ)
                    e.update(env)
                    s0 = spin()
                    p = subprocess.run([b + "/src/chorusrun", "-n", ranks, b + "/bench/chorus-perf", coll, "-b", size,
                                        "-e", size, "-n", ITERS, "-w", WARMUP, "-c", "0"],
                                       capture_output=True, text=True, env=e)
                    s1 = spin()
                    rows = [l.split() for l in p.stdout.splitlines() if re.match(r"\[0\]\s+\d+\s", l)]
                    oop, inp = (float(rows[-1][6]), float(rows[-1][10])) if rows else (None, None)
                    f.write(json.dumps(dict(coll=coll, size=size, ranks=int(ranks), v=name, s0=s0, s1=s1, oop=oop,
                                            inp=inp)) + "\n")
                    f.flush()
        i += 1
