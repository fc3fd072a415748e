#!/usr/bin/env python3
"""PyTorch's own torch.distributed test suite (DistributedTest) against a backend, 2 processes a test.

    PYTHONPATH=<dir holding chorus_torch> python torch_suite.py --backend chorus --out chorus.json
    python torch_suite.py --backend gloo --out gloo.json
    python torch_suite.py --compare gloo.json chorus.json --out table.md   # side-by-side table

The suite is torch/testing/_internal/distributed/distributed_test.py from the installed torch
wheel. It is driven the way PyTorch's test/distributed/test_distributed_spawn.py drives it (that
file is not in the wheel): one TestCase class built from TestDistBackend and
DistributedTest._DistTestBase whose setUp spawns the ranks (MultiProcessTestCase._spawn_processes),
with BACKEND, WORLD_SIZE (2 by default), TEMP_DIR and INIT_METHOD (env:// by default, as PyTorch's
CI sets it) in the environment. As in upstream, TestDistBackend still makes each test's default
group through its own init file; INIT_METHOD only decides the tests gated on it.

A backend that is not built into torch (chorus) is treated exactly as the suite treats another
backend, gloo by default (--gates-as), wherever the suite gates by backend name; see REWRITES below.
To do so the suite's source is read, rewritten and executed as the module
torch.testing._internal.distributed.distributed_test before any test is collected. Every spawned
rank re-imports this script as __mp_main__ (multiprocessing's spawn start method), which loads the
same rewritten module and imports the backend's plugin module (chorus_torch for chorus) before
the rank runs its test: the plugin must be importable through PYTHONPATH.

The suite needs expecttest (a test dependency of torch that the wheel does not pull in):
pip install expecttest, or put a directory holding it on PYTHONPATH.

Results: --out FILE.json holds one record per test (status passed, failed, skipped or error, the
first line of the failure's message, seconds), rewritten after every test, so an interrupted
run can go on with --resume; a FILE.md with the same table is written beside it. "failed": a rank
raised (an assertion or an exception from the backend); "error": the ranks timed out, crashed
(a signal, an unexpected exit code) or the harness failed. Each test's output (both ranks'
stdout and stderr) goes to --log-dir/<test>.log.
"""
import argparse
import datetime
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
import unittest

SUITE_MODULE = "torch.testing._internal.distributed.distributed_test"
# Backends whose plugin module a rank imports before its test (the import registers the backend).
PLUGIN_MODULES = {"chorus": "chorus_torch"}
BUILTIN_BACKENDS = {"gloo", "nccl", "mpi", "ucc", "xccl"}

# Environment that the driver hands to every spawned rank (they re-import this file).
ENV_GATES_AS = "TORCH_SUITE_GATES_AS"  # the backend whose gates apply to BACKEND
ENV_PLUGIN = "TORCH_SUITE_PLUGIN"  # the module that registers BACKEND, or ""

# REWRITES: how the suite's gates see a non-builtin backend as --gates-as (gloo). Each rewrite
# keeps the number of lines, so tracebacks point at the right line of the original file.
#
#  R1  `BACKEND = os.environ["BACKEND"]` gains `; _SUITE_BACKEND = <gates-as>` on the same line:
#      the name the gates compare from here on (equal to BACKEND for gloo, nccl, ...).
#  R2  every comparison of BACKEND: `BACKEND ==`, `BACKEND !=`, `BACKEND in`, `BACKEND not in`
#      becomes a comparison of _SUITE_BACKEND. This covers all the skip_but_pass_in_sandcastle_if
#      and unittest.skipIf gates (BACKEND == "nccl", BACKEND != "gloo", BACKEND not in
#      DistTestCases.backend_feature["ddp"], BACKEND in DistTestCases.skip_collective[...], ...),
#      require_backend_is_available's `BACKEND not in backends`, TestDistBackend._run's nccl check
#      and the branches inside test bodies (e.g. `if BACKEND == "mpi" or BACKEND == "gloo"`).
#  R3  require_backend_is_available's `check(dist.Backend(BACKEND))` checks _SUITE_BACKEND's
#      availability (dist.is_gloo_available()) instead of returning False for a plugin.
#  M1  (not textual: on torch.testing._internal.common_distributed.DistTestCases before the suite is
#      executed) BACKEND is added to every backend_feature and skip_collective set that holds
#      gates-as, and to backend_feature["plugin"]: for any reader of those sets that R2 missed.
#  M2  (not textual: on the executed module) BACKEND is appended to PROFILING_SUPPORTED_BACKENDS,
#      CUDA_PROFILING_SUPPORTED_BACKENDS and SEND_RECV_PROFILING_SUPPORTED_BACKENDS where gates-as
#      is in them: the tests compare dist.get_backend(), the backend's real name, with these lists
#      (and then look for profiler events named "<backend>:<op>").
#
# Deliberately NOT rewritten (they are not gates, or gate only nccl/mpi, which gloo and a plugin
# pass alike); --audit lists every remaining mention of a backend name with the rule it falls under:
#  N1  `backend=BACKEND` in init_process_group/new_group: the backend under test is used.
#  N2  BACKEND.lower(), BACKEND.upper(), dist.Backend(BACKEND) in test_get_backend and
#      test_Backend_enum_class: the name the backend reports must be its own.
#  N3  f-strings and messages mentioning {BACKEND}.
#  N4  init_multigpu_helper(..., BACKEND), nccl_skip_if_lt_x_gpu(BACKEND, n),
#      require_n_gpus_for_nccl_backend(n, os.environ["BACKEND"]) and
#      `backend = os.environ["BACKEND"]` followed by `backend == "nccl"`: nccl only.
#  N5  `ddp_logging_data.get("backend_name") == "gloo"` in test_ddp_logging_data_cpu: asserts the
#      Gloo-specific fields (gloo_socket_ifname, gloo_device_transport, gloo_num_threads) that
#      DDP's logger records only for ProcessGroupGloo, i.e. the real backend's identity, not a gate.
#  N6  dist.new_group(backend=dist.Backend.GLOO) / backend=dist.Backend.NCCL: helper groups that a
#      test makes beside the group under test (e.g. a gloo barrier after an expected failure).
#  N7  the dist.Backend.GLOO/NCCL/MPI/UCC names inside the *_PROFILING_SUPPORTED_BACKENDS lists and
#      require_backend_is_available's check() (handled by M2 and R3).
#  N8  `dist.get_backend() != "nccl"` and other comparisons of the real name with nccl only.
#  N9  dist.Backend(["gloo"]) in test_Backend_enum_class: an invalid argument that must raise.

_R2 = re.compile(r"(?<![\w.\"'])BACKEND(?=\s*(?:==|!=|not\s+in\b|in\b))")
_R1_FROM = 'BACKEND = os.environ["BACKEND"]\n'
_R3_FROM = "if not check(dist.Backend(BACKEND)):"
_R3_TO = "if not check(dist.Backend(_SUITE_BACKEND)):"

# What --audit accepts, per remaining line that names a backend (rule, regex on the stripped line).
_AUDIT_OK = [
    ("R1", r'^BACKEND = os\.environ\["BACKEND"\]; _SUITE_BACKEND = '),
    ("R2", r"_SUITE_BACKEND\s*(==|!=|in\b|not\s+in\b)"),
    ("R2", r"^@require_backend_is_available\("),  # its `BACKEND not in backends` is rewritten
    ("N1", r"\bbackend=BACKEND,?\s*$"),
    ("N2", r"BACKEND\.(lower|upper)\(\)|dist\.Backend\(BACKEND"),
    ("N3", r'^f?"[^"]*\{BACKEND\}|f"[^"]*\{BACKEND\}'),
    ("N4", r"init_multigpu_helper\(.*BACKEND\)|nccl_skip_if_lt_x_gpu\(BACKEND|"
           r'int\(os\.environ\["WORLD_SIZE"\]\), os\.environ\["BACKEND"\]|'
           r'^backend = os\.environ\["BACKEND"\]$'),
    ("N5", r'ddp_logging_data\.get\("backend_name"\) == "gloo"'),
    ("N6", r"backend=dist\.Backend\.(GLOO|NCCL)|backend=\"gloo\""),
    ("N7", r"^dist\.Backend\.(NCCL|GLOO|MPI|UCC),$|^if backend == dist\.Backend\.(GLOO|NCCL|MPI|UCC):$"),
    ("N9", r'dist\.Backend\(\["gloo"\]\)'),
    ("comment", r"^#"),
]
_AUDIT_NAME = re.compile(r'(?<![\w])BACKEND(?![\w])|"gloo"|Backend\.GLOO')


def _die(msg):
    print(f"torch_suite.py: {msg}", file=sys.stderr)
    sys.exit(2)


def suite_path():
    try:
        spec = importlib.util.find_spec(SUITE_MODULE)
    except ModuleNotFoundError as e:  # torch itself missing
        _die(f"cannot find {SUITE_MODULE}: {e}")
    if spec is None or not spec.origin:
        _die(f"this torch has no {SUITE_MODULE}")
    return spec.origin


def rewrite_source(src, gates_as):
    """The suite's source with the gates rewritten (R1-R3), and the count of each rewrite."""
    counts = {}
    if src.count(_R1_FROM) != 1:
        raise RuntimeError("R1: the suite no longer has exactly one line " + _R1_FROM.strip())
    src = src.replace(_R1_FROM, _R1_FROM.rstrip("\n") + f"; _SUITE_BACKEND = {gates_as!r}\n")
    counts["R1"] = 1
    # R2 must not touch the R1 line itself (`BACKEND = ...` is no comparison, so it does not).
    src, counts["R2"] = _R2.subn("_SUITE_BACKEND", src)
    counts["R3"] = src.count(_R3_FROM)
    src = src.replace(_R3_FROM, _R3_TO)
    for rule in ("R2", "R3"):
        if counts[rule] == 0:
            raise RuntimeError(f"{rule} matched nothing: the suite changed, review the rewrites")
    return src, counts


def audit(src):
    """Lines of the rewritten source that still name a backend, each with the rule that allows it."""
    rows = []
    for n, line in enumerate(src.splitlines(), 1):
        s = line.strip()
        if not _AUDIT_NAME.search(s.replace("_SUITE_BACKEND", "")):
            continue
        rule = next((r for r, pat in _AUDIT_OK if re.search(pat, s)), None)
        rows.append((n, rule, s))
    return rows


def _patch_dist_test_cases(backend, gates_as):
    from torch.testing._internal import common_distributed as cd

    if backend == gates_as:
        return
    for table in (cd.DistTestCases.backend_feature, cd.DistTestCases.skip_collective):
        for key, names in table.items():
            if gates_as in names:
                names.add(backend)
    cd.DistTestCases.backend_feature.setdefault("plugin", set()).add(backend)


def load_suite():
    """Executes the (rewritten) suite as SUITE_MODULE and returns the module; runs in every process."""
    backend = os.environ["BACKEND"]
    gates_as = os.environ.get(ENV_GATES_AS) or backend
    plugin = os.environ.get(ENV_PLUGIN, "")
    try:
        import expecttest  # noqa: F401  (torch.testing._internal.common_utils needs it)
    except ImportError:
        _die("the suite needs expecttest: pip install expecttest, or put a directory holding it on PYTHONPATH")
    import torch  # noqa: F401

    if plugin:
        try:
            importlib.import_module(plugin)
        except ImportError as e:
            _die(f"cannot import {plugin} (backend {backend}): {e}; put its directory on PYTHONPATH")
    if SUITE_MODULE in sys.modules:
        return sys.modules[SUITE_MODULE]
    path = suite_path()
    with open(path, encoding="utf-8") as f:
        src = f.read()
    if gates_as != backend:
        src, _ = rewrite_source(src, gates_as)
    else:
        src = src.replace(_R1_FROM, _R1_FROM.rstrip("\n") + "; _SUITE_BACKEND = BACKEND\n")
    _patch_dist_test_cases(backend, gates_as)
    mod = types.ModuleType(SUITE_MODULE)
    mod.__file__ = path
    mod.__package__ = SUITE_MODULE.rpartition(".")[0]
    mod.__spec__ = importlib.util.spec_from_file_location(SUITE_MODULE, path)
    # Registered under the real name first: objects of its classes that ranks pickle to each other
    # (all_gather_object) resolve to this module on the other side too.
    sys.modules[SUITE_MODULE] = mod
    try:
        exec(compile(src, path, "exec"), mod.__dict__)
    except BaseException:
        del sys.modules[SUITE_MODULE]
        raise
    if gates_as != backend:  # M2
        for name in ("PROFILING_SUPPORTED_BACKENDS", "CUDA_PROFILING_SUPPORTED_BACKENDS",
                     "SEND_RECV_PROFILING_SUPPORTED_BACKENDS"):
            lst = getattr(mod, name, None)
            if lst is not None and gates_as in lst and backend not in lst:
                lst.append(backend)
    return mod


def make_test_class(mod):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False

    class TestDistBackendWithSpawn(mod.TestDistBackend, mod.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

        def tearDown(self):
            procs = list(self.processes)
            super().tearDown()  # terminates the ranks that are still running
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join(5)

    TestDistBackendWithSpawn.__module__ = __name__
    TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"
    globals()["TestDistBackendWithSpawn"] = TestDistBackendWithSpawn
    return TestDistBackendWithSpawn


# ---------------------------------------------------------------------------------------------
# The driver (the main process only).

_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning|Failure|Timeout)\b.*|^[A-Za-z_][\w.]*: ")


def first_exception_line(text):
    """The last exception of a (possibly chained) Python traceback, on one line: its first line, the
    next line where that one says no more than "...!" (torch's assertEqual), and the innermost line
    of the suite that raised it."""
    tb = text.split("Traceback (most recent call last):")[-1]
    lines = tb.splitlines()
    where = ""
    for i, line in enumerate(lines):
        m = re.match(r'\s*File "[^"]*distributed_test\.py", line (\d+), in (\w+)', line)
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            where = f" [distributed_test.py:{m.group(1)} {m.group(2)}: {code}]"
        if i and line and not line[0].isspace() and _EXC_LINE.match(line):
            msg = line.strip()
            if msg.endswith("!"):
                rest = [x.strip() for x in lines[i + 1:i + 4] if x.strip()]
                if rest:
                    msg += " " + rest[0]
            return msg + where
    for line in lines:
        if line.strip():
            return line.strip()
    return ""


def summarize(err_text):
    """(status, one line) for a test's failure text from unittest."""
    m = list(re.finditer(r"Process (\d+) exited with error code \d+ and exception:\n", err_text))
    if m:
        ranks = [x.group(1) for x in m]
        body = err_text[m[0].end(): m[1].start() if len(m) > 1 else len(err_text)]
        return "failed", f"rank {ranks[0]}: {first_exception_line(body)}" + (
            f" (ranks {','.join(ranks)} raised)" if len(ranks) > 1 else "")
    t = re.search(r"Process (\d+) terminated or timed out after ([\d.]+) seconds", err_text)
    if t:
        return "error", f"timeout: rank {t.group(1)} did not finish within {float(t.group(2)):.0f} s"
    c = re.search(r"Expected exit code (\d+) but got (-?\d+)", err_text)
    if c:
        code = int(c.group(2))
        why = f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exit code {code}"
        return "error", f"rank 0 ended with {why} (expected {c.group(1)})"
    return "failed", first_exception_line(err_text)


class _Result(unittest.TestResult):
    def __init__(self, driver):
        super().__init__()
        self.driver = driver

    def startTest(self, test):
        super().startTest(test)
        self.driver.start(test)

    def stopTest(self, test):
        super().stopTest(test)
        self.driver.stop(test)

    def addSuccess(self, test):
        self.driver.record(test, "passed", "")

    def addSkip(self, test, reason):
        self.driver.record(test, "skipped", str(reason).splitlines()[0] if reason else "")

    def addFailure(self, test, err):
        self._add_err(test, err)

    def addError(self, test, err):
        self._add_err(test, err)

    def _add_err(self, test, err):
        text = "".join(traceback.format_exception(*err))
        status, line = summarize(text)
        if status == "failed" and not re.search(r"Process \d+ exited with error code", text):
            status = "error" if err[0] is not AssertionError else "failed"
        self.driver.record(test, status, line, text)

    def addExpectedFailure(self, test, err):
        self.driver.record(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test):
        self.driver.record(test, "failed", "unexpected success")


class Driver:
    def __init__(self, args, results):
        self.args = args
        self.results = results  # name -> record
        self.current = None
        self.t0 = 0.0
        self.saved_fds = None
        self.lock = threading.Lock()
        self.console = os.fdopen(os.dup(1), "w", buffering=1)
        threading.Thread(target=self._watchdog, daemon=True).start()

    def start(self, test):
        name = test.id().split(".")[-1]
        with self.lock:
            self.current, self.t0 = test, time.time()
        log = open(os.path.join(self.args.log_dir, name + ".log"), "w")
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved_fds = (os.dup(1), os.dup(2))
        os.dup2(log.fileno(), 1)  # the ranks inherit these
        os.dup2(log.fileno(), 2)
        log.close()

    def stop(self, test):
        sys.stdout.flush()
        sys.stderr.flush()
        if self.saved_fds:
            os.dup2(self.saved_fds[0], 1)
            os.dup2(self.saved_fds[1], 2)
            os.close(self.saved_fds[0])
            os.close(self.saved_fds[1])
            self.saved_fds = None
        with self.lock:
            self.current = None

    def record(self, test, status, message, detail=""):
        name = test.id().split(".")[-1]
        secs = round(time.time() - self.t0, 1) if self.t0 else 0.0
        self.results[name] = {"status": status, "message": message[:500], "seconds": secs}
        if detail and status != "skipped":
            with open(os.path.join(self.args.log_dir, name + ".log"), "a") as f:
                f.write("\n===== torch_suite.py: unittest's report =====\n" + detail)
        done = sum(1 for r in self.results.values())
        print(f"[{done}/{self.args.total}] {status:7s} {secs:6.1f}s {name}" + (f"  {message[:160]}" if message and status != "passed" else ""),
              file=self.console)
        write_results(self.args, self.results)

    def _watchdog(self):
        # The suite's own timeout ends the ranks after --timeout; this kills them if that is stuck.
        while True:
            time.sleep(5)
            with self.lock:
                test, t0 = self.current, self.t0
            if test is not None and time.time() - t0 > self.args.timeout + 90:
                for p in getattr(test, "processes", []):
                    try:
                        os.kill(p.pid, signal.SIGKILL)
                    except (OSError, TypeError):
                        pass


def write_results(args, results):
    meta = {
        "backend": args.backend, "gates_as": args.gates_as, "world_size": args.world_size,
        "init_method": os.environ.get("INIT_METHOD_AT_START", ""), "torch": _torch_version(),
        "suite": suite_path(), "timeout_s": args.timeout, "filter": args.filter,
        "updated": datetime.datetime.now().isoformat(timespec="seconds"),
        "totals": _totals(results),
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"meta": meta, "tests": dict(sorted(results.items()))}, f, indent=1)
    os.replace(tmp, args.out)
    md = os.path.splitext(args.out)[0] + ".md"
    if md != args.out:
        with open(md, "w") as f:
            f.write(f"# DistributedTest, backend {args.backend} (world size {args.world_size}, torch {meta['torch']})\n\n")
            f.write(_totals_line(meta["totals"]) + "\n\n| test | result | seconds | message |\n|---|---|---|---|\n")
            for name, r in sorted(results.items()):
                f.write(f"| {name} | {r['status']} | {r['seconds']} | {_md(r['message'])} |\n")


def _torch_version():
    try:
        import torch
        return torch.__version__
    except Exception:
        return "?"


def _totals(results):
    t = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for r in results.values():
        t[r["status"]] = t.get(r["status"], 0) + 1
    t["total"] = len(results)
    return t


def _totals_line(t):
    return f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped, {t['error']} error ({t['total']} tests)"


def _md(s):
    return s.replace("|", "\\|").replace("\n", " ")


def compare(args):
    data = []
    for path in args.compare:
        with open(path) as f:
            data.append(json.load(f))
    names = sorted(set().union(*(d["tests"] for d in data)))
    cols = [d["meta"]["backend"] for d in data]
    out = [f"# DistributedTest: {' vs '.join(cols)} (world size {data[0]['meta']['world_size']}, "
           f"torch {data[0]['meta']['torch']})\n"]
    for c, d in zip(cols, data):
        out.append(f"- **{c}**: {_totals_line(_totals(d['tests']))}")
    if len(data) == 2:
        a, b = data[0]["tests"], data[1]["tests"]
        diff = [n for n in names if a.get(n, {}).get("status") == "passed" and b.get(n, {}).get("status") in ("failed", "error")]
        gained = [n for n in names if b.get(n, {}).get("status") == "passed" and a.get(n, {}).get("status") != "passed"]
        out.append(f"- {cols[0]} passes, {cols[1]} fails or errors: **{len(diff)}**" + (f" ({', '.join(diff)})" if diff else ""))
        out.append(f"- {cols[1]} passes, {cols[0]} does not: **{len(gained)}**" + (f" ({', '.join(gained)})" if gained else ""))
    out.append("\n| test | " + " | ".join(cols) + " | " + " | ".join(f"{c} message" for c in cols) + " |")
    out.append("|---|" + "---|" * (2 * len(cols)))
    for n in names:
        st = [d["tests"].get(n, {}).get("status", "-") for d in data]
        msgs = [_md(d["tests"].get(n, {}).get("message", ""))[:200] if s not in ("passed", "skipped") else "" for d, s in zip(data, st)]
        mark = lambda s: f"**{s}**" if s in ("failed", "error") else s  # noqa: E731
        out.append(f"| {n} | " + " | ".join(mark(s) for s in st) + " | " + " | ".join(msgs) + " |")
    text = "\n".join(out) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


def resummarize(args):
    with open(args.out) as f:
        data = json.load(f)
    log_dir = args.log_dir or os.path.splitext(args.out)[0] + "-logs"
    for name, r in data["tests"].items():
        path = os.path.join(log_dir, name + ".log")
        if r["status"] in ("failed", "error") and os.path.exists(path):
            with open(path, errors="replace") as f:
                text = f.read()
            mark = "===== torch_suite.py: unittest's report =====\n"
            if mark in text:
                status, line = summarize(text.split(mark, 1)[1])
                r["message"] = line[:500]
    args.backend = data["meta"]["backend"]
    args.gates_as, args.world_size = data["meta"]["gates_as"], data["meta"]["world_size"]
    args.timeout, args.filter = data["meta"]["timeout_s"], data["meta"]["filter"]
    os.environ["INIT_METHOD_AT_START"] = data["meta"].get("init_method", "")
    write_results(args, data["tests"])
    return 0


def check_gates(args):
    """Compares the suite's static skips for BACKEND (rewritten) with those of --gates-as (original)."""
    mod = load_suite()
    base = mod.DistributedTest._DistTestBase
    mine = {n: _skip_of(getattr(base, n)) for n in dir(base) if n.startswith("test")}
    env = dict(os.environ, BACKEND=args.gates_as)
    code = ("import json, sys; import torch.testing._internal.distributed.distributed_test as m;"
            "b = m.DistributedTest._DistTestBase;"
            "print(json.dumps({n: getattr(getattr(b, n), '__unittest_skip_why__', None) "
            "if getattr(getattr(b, n), '__unittest_skip__', False) else None for n in dir(b) if n.startswith('test')}))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if res.returncode:
        _die("loading the original suite failed:\n" + res.stderr[-2000:])
    ref = json.loads(res.stdout.strip().splitlines()[-1])
    bad = 0
    for n in sorted(set(ref) | set(mine)):
        a = ref.get(n, "<missing>")
        b = mine.get(n, "<missing>")
        if isinstance(b, str):
            b = b.replace(args.backend, args.gates_as)
        if a != b:
            bad += 1
            print(f"DIFFERS {n}: {args.gates_as}={a!r} {args.backend}={b!r}")
    print(f"{len(ref)} tests; static skips differ for {bad}")
    return 1 if bad else 0


def _skip_of(fn):
    return getattr(fn, "__unittest_skip_why__", None) if getattr(fn, "__unittest_skip__", False) else None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default=os.environ.get("BACKEND", "gloo"), help="gloo, chorus, ... (default: $BACKEND or gloo)")
    p.add_argument("--gates-as", default=None,
                   help="the backend whose gates apply (default: gloo for a backend not built into torch, else itself)")
    p.add_argument("--plugin", default=None, help="module that registers the backend (default: chorus_torch for chorus)")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--init-method", choices=["env", "file"], default="env",
                   help="INIT_METHOD as PyTorch's CI sets it: env:// (default) or a file:// under TEMP_DIR")
    p.add_argument("--filter", default=None, help="regex (re.search) on test names")
    p.add_argument("--exclude", default=None, help="regex (re.search) of test names to leave out")
    p.add_argument("--timeout", type=int, default=300, help="seconds a test's ranks may run (default 300)")
    p.add_argument("--jobs", type=int, default=1, help="tests run at once in separate drivers (default 1: serial)")
    p.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # "k/N", used by --jobs
    p.add_argument("--out", default=None, help="results file (.json, and a .md beside it); with --compare a .md")
    p.add_argument("--log-dir", default=None, help="per-test logs (default: <out without .json>-logs/)")
    p.add_argument("--resume", action="store_true", help="keep the tests already in --out and run the others")
    p.add_argument("--list", action="store_true", help="list the selected tests and exit")
    p.add_argument("--audit", action="store_true", help="print the rewrites and every remaining backend-name mention")
    p.add_argument("--check-gates", action="store_true",
                   help="compare the static skips of --backend (rewritten) with --gates-as (original suite)")
    p.add_argument("--compare", nargs="+", metavar="RESULTS.json", help="side-by-side table of result files")
    p.add_argument("--resummarize", action="store_true",
                   help="recompute the messages of --out's failed tests from the reports in --log-dir")
    a = p.parse_args()
    if a.gates_as is None:
        a.gates_as = a.backend if a.backend in BUILTIN_BACKENDS else "gloo"
    if a.plugin is None:
        a.plugin = PLUGIN_MODULES.get(a.backend, "")
    return a


def _selected(cls, args):
    names = sorted(unittest.TestLoader().getTestCaseNames(cls))
    if args.filter:
        names = [n for n in names if re.search(args.filter, n)]
    if args.exclude:
        names = [n for n in names if not re.search(args.exclude, n)]
    if args.shard:
        k, n = map(int, args.shard.split("/"))
        names = names[k::n]
    return names


def _run_jobs(args):
    if not args.out:
        _die("--jobs needs --out")
    stem = os.path.splitext(args.out)[0]
    procs = []
    argv = [a for a in sys.argv[1:]]
    for k in range(args.jobs):
        sub = argv + ["--jobs", "1", "--shard", f"{k}/{args.jobs}", "--out", f"{stem}.shard{k}.json",
                      "--log-dir", args.log_dir]
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sub))
    rc = max(p.wait() for p in procs)
    merged = {}
    for k in range(args.jobs):
        with open(f"{stem}.shard{k}.json") as f:
            merged.update(json.load(f)["tests"])
    args.total = len(merged)
    write_results(args, merged)
    t = _totals(merged)
    print(_totals_line(t))
    print(f"{t['passed']} passed, {t['failed'] + t['error']} failed, {t['skipped']} skipped")
    return rc or (1 if t["failed"] + t["error"] else 0)


def main():
    args = parse_args()
    if args.compare:
        return compare(args)
    if args.resummarize:
        return resummarize(args)
    os.environ["BACKEND"] = args.backend
    os.environ["WORLD_SIZE"] = str(args.world_size)
    os.environ[ENV_GATES_AS] = args.gates_as
    os.environ[ENV_PLUGIN] = args.plugin
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(args.timeout)
    # The suite's TEMP_DIR (init files, per-test scratch): removed when the driver ends.
    temp_dir = tempfile.mkdtemp(prefix="torch_suite_")
    try:
        return _run(args, temp_dir)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _run(args, temp_dir):
    os.environ["TEMP_DIR"] = temp_dir
    os.environ["INIT_METHOD"] = "env://" if args.init_method == "env" else f"file://{temp_dir}/shared_init_file"
    os.environ["INIT_METHOD_AT_START"] = os.environ["INIT_METHOD"]
    if args.audit:
        with open(suite_path(), encoding="utf-8") as f:
            src, counts = rewrite_source(f.read(), args.gates_as)
        print("rewrites:", ", ".join(f"{k}={v}" for k, v in counts.items()))
        unknown = 0
        for n, rule, s in audit(src):
            unknown += rule is None
            print(f"{n:6d} {rule or 'UNKNOWN':7s} {s[:150]}")
        print(f"{unknown} mention(s) that no rule covers")
        return 1 if unknown else 0
    if args.check_gates:
        return check_gates(args)
    if args.jobs > 1 and not args.list:
        args.log_dir = args.log_dir or os.path.splitext(args.out or "torch_suite")[0] + "-logs"
        os.makedirs(args.log_dir, exist_ok=True)
        return _run_jobs(args)

    mod = load_suite()
    from torch.testing._internal import common_distributed as cd

    cd.get_timeout = lambda test_id: args.timeout  # one per-test limit for all (--timeout)
    cls = make_test_class(mod)
    names = _selected(cls, args)
    if args.list:
        print("\n".join(names))
        return 0
    if not args.out:
        args.out = f"torch_suite_{args.backend}.json"
    args.log_dir = args.log_dir or os.path.splitext(args.out)[0] + "-logs"
    os.makedirs(args.log_dir, exist_ok=True)
    results = {}
    if args.resume and os.path.exists(args.out):
        with open(args.out) as f:
            results = {k: v for k, v in json.load(f)["tests"].items() if k in names}
    todo = [n for n in names if n not in results]
    args.total = len(names)
    print(f"torch_suite.py: backend {args.backend} (gates as {args.gates_as}), world size {args.world_size}, "
          f"{len(todo)} of {len(names)} tests to run, timeout {args.timeout} s; logs in {args.log_dir}", flush=True)
    driver = Driver(args, results)
    suite = unittest.TestSuite(cls(n) for n in todo)
    suite.run(_Result(driver))
    write_results(args, results)
    t = _totals(results)
    print(_totals_line(t), file=driver.console)
    # The plain closing line CI runners read.
    print(f"{t['passed']} passed, {t['failed'] + t['error']} failed, {t['skipped']} skipped", file=driver.console)
    return 1 if t["failed"] + t["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
elif __name__ == "__mp_main__":
    # A rank spawned by the suite: the same rewritten suite and the same test class as the driver.
    make_test_class(load_suite())
