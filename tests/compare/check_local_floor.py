#!/usr/bin/env python3
"""bench/compare/run's floor measured before every point (used by tests/compare): a 2-round run of
Chorus alone, 2 ranks, 32K and 1M with --floor-from 1M. Checks that each round measured a floor
before the 1M point (membw-local.jsonl: 2 lines of chorus-membw JSON), that every 1M measurement
carries the floor of its round (measurements.csv), that results.csv holds the median of those
floors and busbw / floor computed from them, and that the table shows %floor at 1M only. And the
floor timed in the launch itself (chorus-perf --floor): every 1M measurement carries its copy rate,
results.csv their median and busbw / floor from them, the table %launch at 1M only. And every
launch carries the cache-line round trip timed before and after it (the placement probe).
Usage: check_local_floor.py <python3> <bench/compare/run> <build dir> <scratch dir>"""
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys

python, driver, build, out = sys.argv[1:5]
shutil.rmtree(out, ignore_errors=True)
cmd = [python, driver, "--build", build, "--systems", "chorus", "--collectives", "all_reduce", "--ranks", "2",
       "--sizes", "32K,1M", "--rounds", "2", "--floor-from", "1M", "--floor-bytes", "16M", "--floor-reps", "1",
       "--idle-timeout", "0", "--max-retries", "0", "--min-iters", "2", "--iters", "10", "--out", out]
p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
print(p.stdout)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


check(p.returncode == 0, "exit status %d" % p.returncode)
with open(os.path.join(out, "membw-local.jsonl")) as f:
    local = [json.loads(line) for line in f if line.strip()]
check(len(local) == 2, "%d floors measured before a point, expected 2 (one per round at 1M)" % len(local))
for run in local:
    check(run.get("tool") == "chorus-membw" and run["config"]["reps"] == 2,
          "membw-local.jsonl line is not chorus-membw -n 2: %s" % str(run)[:200])
with open(os.path.join(out, "measurements.csv"), newline="") as f:
    ms = list(csv.DictReader(f))
big = [m for m in ms if m["size"] == str(1 << 20)]
small = [m for m in ms if m["size"] == str(32 << 10)]
check(len(big) == 2 and all(float(m["floor_copy"]) > 0 and float(m["floor_memcpy"]) > 0 for m in big),
      "1M measurements without their round's floor: %s" % big)
check(all(not m["floor_copy"] for m in small), "a 32K measurement carries a floor: %s" % small)
check(all(float(m["launch_copy"]) > 0 and float(m["launch_copy_change"]) > 0 for m in big),
      "1M measurements without the copy rate of their launch: %s" % big)
check(all(not m["launch_copy"] for m in small), "a 32K launch timed a floor: %s" % small)
# The placement probe around every launch: the cache-line round trip before and after, in ns.
check(all(float(m["spin_before_ns"]) > 0 and float(m["spin_after_ns"]) > 0 for m in ms),
      "a launch without its round trips: %s" % [(m["spin_before_ns"], m["spin_after_ns"]) for m in ms])
with open(os.path.join(out, "results.csv"), newline="") as f:
    rows = {r["size"]: r for r in csv.DictReader(f)}
r = rows[str(1 << 20)]


def check_median(column, values):
    """results.csv's `column` at 1M is the median of `values` (one per kept round)."""
    med = statistics.median(values)
    check(abs(float(r[column]) - med) < 1e-3 * med, "%s %s is not the median of %s" % (column, r[column], values))


# all_reduce on 2 ranks: floor busbw = B / 4.
for copy_key, rate_col, frac_col in (("floor_copy", "local_copy_gbps", "local_floor_fraction"),
                                     ("launch_copy", "launch_copy_gbps", "launch_floor_fraction")):
    check_median(rate_col, [float(m[copy_key]) for m in big])
    check_median(frac_col, [float(m["busbw"]) / (float(m[copy_key]) / 4) for m in big])
check(rows[str(32 << 10)]["local_floor_fraction"] == "", "32K has a local floor fraction")
check(rows[str(32 << 10)]["launch_floor_fraction"] == "", "32K has a launch floor fraction")
with open(os.path.join(out, "table.txt")) as f:
    table = f.read()
check("measured again before every point from 1M in every round" in table, "no local floor line in table.txt")
lines = [l.split() for l in table.splitlines()]
row_1m = [l for l in lines if l and l[0] == "1M"]
row_32k = [l for l in lines if l and l[0] == "32K"]
check(row_1m and all(c.rstrip("~").endswith("%") for c in row_1m[0][-3:]),
      "1M row without %%launch, %%floor and %%memcpy: %s" % row_1m)
check(row_32k and row_32k[0][-3:] == ["-", "-", "-"], "32K row with a floor fraction: %s" % row_32k)
check("%launch" in table and "timed in the same launch" in table, "no %launch column or its legend")
if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("local floor: 2 floors, each 1M measurement held against its own round's and its launch's")
