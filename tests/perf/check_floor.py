#!/usr/bin/env python3
"""chorus-perf --floor (used by tests/perf): every JSON row carries the copy floor timed in the
launch, consistent with its own definition (copy_gbps = 2 * ranks * size / copy_us / 1e3), results
still validated; without --floor no row has it; --floor with --memory cuda is a usage error.
Usage: check_floor.py <chorus-perf>"""
import json
import subprocess
import sys

perf = sys.argv[1]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def rows(extra):
    p = subprocess.run([perf, "all_reduce", "-t", "2", "-b", "64K", "-e", "4M", "-f", "8", "-c", "1", "-n", "3",
                        "-w", "1", "--json"] + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=240)
    check(p.returncode == 0, "chorus-perf %s: exit %d\n%s" % (" ".join(extra), p.returncode, p.stdout))
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


with_floor = rows(["--floor"])
check(len(with_floor) == 3, "%d JSON rows with --floor, expected 3 (64K, 512K, 4M)" % len(with_floor))
for r in with_floor:
    check(r["oop_wrong"] == 0 and r["ip_wrong"] == 0, "wrong results with --floor: %s" % r)
    check(r.get("copy_us", 0) > 0 and r.get("copy_change", 0) > 0, "no copy floor in %s" % r)
    want = 2.0 * r["ranks"] * r["size"] / r["copy_us"] / 1e3 if r.get("copy_us") else None
    check(want and abs(r["copy_gbps"] - want) <= 1e-6 * want, "copy_gbps %s is not 2 n size / copy_us (%s)"
          % (r.get("copy_gbps"), want))
check(all("copy_us" not in r for r in rows([])), "a row has copy_us without --floor")
p = subprocess.run([perf, "all_reduce", "-t", "2", "--floor", "--memory", "cuda"], stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT, universal_newlines=True, timeout=60)
check(p.returncode == 2 and "--floor" in p.stdout, "--floor --memory cuda: exit %d, %s" % (p.returncode, p.stdout))
if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("--floor: %d rows, each with a copy floor of its own launch" % len(with_floor))
