#!/usr/bin/env python3
"""placement.py SECONDS OUT.jsonl COLLS SIZES [NAME=ENV ...]: launches of `chorusrun -n 2 chorus-perf`
for each collective, size and variant in turn (the order rotating), each bracketed by a probe of the
cache-line round trip between the two vCPUs (chorus-membw --quick), until SECONDS have passed; one
JSON line a launch (ITERS timed calls after WARMUP, 100 and 20 unless set). summarize.py groups
them by placement. Run from the repository root after
building build/lto."""
import json, os, re, subprocess, sys, time

B = "build/lto"
ITERS, WARMUP = os.environ.get("ITERS", "100"), os.environ.get("WARMUP", "20")
secs, out, colls, sizes = float(sys.argv[1]), sys.argv[2], sys.argv[3].split(","), sys.argv[4].split(",")
variants = []
for a in sys.argv[5:]:
    name, _, env = a.partition("=")
    variants.append((name, dict(kv.split("=", 1) for kv in env.split(";") if kv)))


def spin():
    p = subprocess.run([B + "/bench/membw/chorus-membw", "--quick", "--json"], capture_output=True, text=True)
    return json.loads(p.stdout)["latency"]["spin_round_trip_ns"]["median"]


end, i = time.time() + secs, 0
with open(out, "a") as f:
    while time.time() < end:
        for coll in colls:
            for size in sizes:
                for k in range(len(variants)):
                    name, env = variants[(i + k) % len(variants)]
                    e = dict(os.environ)
                    e.update(env)
                    s0 = spin()
                    p = subprocess.run([B + "/src/chorusrun", "-n", "2", B + "/bench/chorus-perf", coll, "-b", size,
                                        "-e", size, "-n", ITERS, "-w", WARMUP, "-c", "0"],
                                       capture_output=True, text=True, env=e)
                    s1 = spin()
                    rows = [l.split() for l in p.stdout.splitlines() if re.match(r"\[0\]\s+\d+\s", l)]
                    oop, inp = (float(rows[-1][6]), float(rows[-1][10])) if rows else (None, None)
                    f.write(json.dumps(dict(coll=coll, size=size, v=name, s0=s0, s1=s1, oop=oop, inp=inp)) + "\n")
                    f.flush()
        i += 1
