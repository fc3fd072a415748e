#!/usr/bin/env python3
"""placement.py SECONDS OUT.jsonl COLLS SIZES [NAME=ENV ...]: launches of `chorusrun -n 2 chorus-perf`
for each collective, size and variant in turn (the order rotating), each bracketed by a probe of the
cache-line round trip between the two vCPUs (chorus-membw --quick), until SECONDS have passed; one
JSON line a launch (ITERS timed calls after WARMUP, 100 and 20 unless set). summarize.py groups
them by placement. Run from the repository root after building build/lto. Since 2026-12-06 the
general form (builds as well as settings, any rank count) runs it:
../2026-12-06c-stage-slots/placement.py, each variant NAME=build/lto;ENV at 2 ranks."""
import os, sys

here = os.path.dirname(os.path.abspath(__file__))
general = os.path.join(here, "..", "2026-12-06c-stage-slots", "placement.py")
args = sys.argv[1:3] + ["2"] + sys.argv[3:5]
args += [a.partition("=")[0] + "=build/lto;" + a.partition("=")[2] for a in sys.argv[5:]]
os.execv(sys.executable, [sys.executable, general] + args)
