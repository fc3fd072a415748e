#!/usr/bin/env python3
"""bench/compare/run's choice of figures in a JSON row (compared_mode): out of place for every
collective, but for broadcast the in-place figures where the row has them (Chorus; the peers'
rows print null there), since the peers broadcast one buffer per rank.
Usage: check_rows.py <bench/compare/run>"""
import importlib.machinery
import importlib.util
import sys

loader = importlib.machinery.SourceFileLoader("compare_run", sys.argv[1])
spec = importlib.util.spec_from_loader("compare_run", loader)
run = importlib.util.module_from_spec(spec)
loader.exec_module(run)
failures = []
chorus = {"oop_time_us": 150.0, "ip_time_us": 90.0}
peer = {"oop_time_us": 190.0, "ip_time_us": None}
cases = [("broadcast", chorus, "ip"), ("broadcast", peer, "oop"), ("broadcast", {"oop_time_us": 1.0}, "oop"),
         ("all_reduce", chorus, "oop"), ("all_gather", chorus, "oop"), ("reduce_scatter", chorus, "oop")]
for coll, row, want in cases:
    got = run.compared_mode(row, coll)
    if got != want:
        failures.append("%s %s: %s, expected %s" % (coll, row, got, want))
if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("rows: every case as expected")
