#!/usr/bin/env python3
"""bench/compare/run's ratio paired by placement (ratio_cell, paired_ratio), on made-up rounds:
every round at one placement gives the median of the per-round ratios; a round whose two launches
ran at different placements is left out ("^"); with no round paired the cell is the ratio of the
medians in brackets; without round trips, the ratio of the medians. The third case is the 2-rank
8 B allreduce of docs/perf/2026-12-05-small/ranks248, whose rounds the placement split.
Usage: check_pairing.py <bench/compare/run>"""
import importlib.machinery
import importlib.util
import sys

loader = importlib.machinery.SourceFileLoader("compare_run", sys.argv[1])
spec = importlib.util.spec_from_loader("compare_run", loader)
run = importlib.util.module_from_spec(spec)
loader.exec_module(run)
failures = []


def point(rounds):
    """rounds: (time_us, spin before, spin after) per round, round 1 first."""
    p = run.Point()
    for i, (t, before, after) in enumerate(rounds, start=1):
        m = run.Measurement(round=i, time_us=t)
        m.spin_before_ns, m.spin_after_ns = before, after
        p.kept.append(m)
    return p


def expect(name, ours, peer, cell):
    got = run.ratio_cell(point(ours), point(peer))
    if got != cell:
        failures.append("%s: %s, expected %s" % (name, got, cell))


ONE, TWO = 110, 510
# All rounds on one placement: median of 2.0, 1.5, 3.0 (the medians' ratio would be 0.20/0.10).
expect("paired", [(0.10, ONE, ONE), (0.20, ONE, 115), (0.10, 108, ONE)],
       [(0.20, ONE, ONE), (0.30, ONE, ONE), (0.30, ONE, 120)], "2.00")
# Each round paired though the placements differ between rounds: 0.50/0.30 and 0.20/0.10.
expect("paired across placements", [(0.30, TWO, TWO), (0.10, ONE, ONE)],
       [(0.50, TWO, 500), (0.20, ONE, ONE)], "1.83")
# ranks248: rounds 1 and 2 paired (1.73x, 1.83x), round 3 mixed (Chorus on one complex, Open MPI
# moved to two during its launch): median 1.78, marked; the medians alone gave 1.01.
expect("a mixed round left out", [(0.331, TWO, TWO), (0.108, ONE, ONE), (0.197, ONE, ONE)],
       [(0.574, TWO, TWO), (0.198, ONE, ONE), (0.168, ONE, TWO)], "1.78^")
# No round pairs: the medians' ratio, in brackets.
expect("none paired", [(0.10, ONE, ONE), (0.10, ONE, ONE)], [(0.30, TWO, TWO), (0.30, TWO, TWO)], "(3.00)")
# Round trips not measured (--no-placement): the medians' ratio.
expect("unknown placement", [(0.10, None, None), (0.20, None, None), (0.30, None, None)],
       [(0.40, None, None), (0.40, None, None), (0.40, None, None)], "2.00")
# A round where one system has no time (a failed launch) does not count as unpaired.
expect("a round without a time", [(0.10, ONE, ONE), (None, ONE, ONE)], [(0.25, ONE, ONE), (0.30, ONE, ONE)],
       "2.50")
if failures:
    print("FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("pairing: all cases as expected")
