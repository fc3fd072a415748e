#!/usr/bin/env bash
# tests/gpu/run.sh: the GPU checks, in one go, on a machine with a CUDA device (the lent H200).
#
#   tests/gpu/run.sh                 # build (if needed), test, benchmark; results in $OUT (or build/gpu/out)
#   tests/gpu/run.sh --build-only    # here, without a GPU: build build/gpu to carry to the device machine
#
# The build leaves out what the GPU checks do not need (hwloc, OpenSSL, UCX, verbs, PyTorch, the
# peers), so build/gpu's binaries need only libc and libstdc++ (libcudart is linked statically) and
# run on a machine where nothing can be installed. Steps, each logged under $OUT, sized to finish
# in well under 8 minutes on an H200:
#   1. the machine: nvidia-smi, nvcc
#   2. gpu.cuda_kernels: the CUDA kernels against the CPU kernels, bit for bit, every type and op
#   3. gpu.cuda_collectives: device-buffer collectives and send/recv, ranks as threads on the GPU,
#      exact; graphs, streams, timeout and abort, staged operations; then its send/recv,
#      all-to-all-v and barrier tests again with everything staged (CHORUS_CUDA_IPC=0)
#   4. chorus-cuda-bench: reduction GB/s against a device-to-device copy of the same bytes
#   5. chorus-perf --memory cuda: all_reduce, reduce_scatter, all_gather, 2, 4 and 8 ranks (threads)
#      on the one GPU, and sendrecv with 2; then all_reduce with 2 processes, staged and over CUDA
#      IPC handles
#   6. NCCL single-rank all_reduce through PyTorch, as a sanity baseline (skipped without torch)
#   7. PyTorch's own ProcessGroupNCCL over Chorus's libnccl.so.2 (LD_PRELOAD), 2 processes on the
#      GPU: tests/frameworks/torch_nccl_shim_gpu_test.py (skipped without torch)
# The timeouts add up to 569 s, under the device tool's 600 s per command. It writes
# $OUT/summary.md.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-build/gpu/out}
mkdir -p "$OUT"
build=build/gpu
bin=build/gpu-bin  # the binaries alone, stripped: what to carry to the device machine
step() { echo "== $* ($(date +%T))" | tee -a "$OUT/summary.md"; }

# Run --build-only right before carrying build/gpu-bin: carried binaries are used as they are.
targets="test_cuda_kernels test_cuda_collectives chorus-cuda-bench chorus-perf chorusrun chorus_nccl"
binaries="tests/gpu/test_cuda_kernels tests/gpu/test_cuda_collectives bench/gpu/chorus-cuda-bench bench/chorus-perf
  src/chorusrun"
have_all=1
for b in $binaries; do [ -x "$bin/$(basename "$b")" ] || have_all=0; done
[ -f "$bin/shim/libnccl.so.2" ] || have_all=0
if [ "${1:-}" = "--build-only" ] || [ $have_all = 0 ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="80;90" \
    -DCHORUS_WITH_HWLOC=OFF -DCHORUS_WITH_OPENSSL=OFF -DCHORUS_WITH_UCX=OFF -DCHORUS_WITH_VERBS=OFF \
    -DCHORUS_BUILD_TORCH=OFF -DCHORUS_BUILD_NCCL_SHIM=ON -DCHORUS_BUILD_COMPARE=OFF -DCHORUS_BUILD_UNTESTED=OFF \
    > "$OUT/configure.log" 2>&1 || { echo "configure failed: see $OUT/configure.log"; tail -20 "$OUT/configure.log"; exit 1; }
  # shellcheck disable=SC2086
  cmake --build "$build" -j "$(nproc)" --target $targets > "$OUT/build.log" 2>&1 ||
    { echo "build failed: see $OUT/build.log"; tail -20 "$OUT/build.log"; exit 1; }
  rm -rf "$bin" && mkdir -p "$bin"
  for b in $binaries; do cp "$build/$b" "$bin/" && strip "$bin/$(basename "$b")"; done
  # libnccl.so.2 and the libchorus.so.0 it loads (built against CUDA's nccl.h).
  mkdir -p "$bin/shim" && cp -L "$build/nccl-shim/libnccl.so.2" "$build/src/libchorus.so.0" "$bin/shim/" &&
    strip "$bin"/shim/*
  [ "${1:-}" = "--build-only" ] && { echo "built $bin ($(du -sh "$bin" | cut -f1); carry it to the device machine)"; exit 0; }
fi

: > "$OUT/summary.md"
# A rank that fails leaves its peers' kernels waiting: let them give up well within the step limits.
# Eight ranks' streams on one GPU: enough hardware queues that they never share one.
# CHORUS_TIMEOUT may be set lower, so that a failing run leaves device time for another.
export CHORUS_TIMEOUT=${CHORUS_TIMEOUT:-20} CUDA_DEVICE_MAX_CONNECTIONS=32
step "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || true
  nvcc --version 2>/dev/null | tail -1 || true; } | tee -a "$OUT/summary.md"

status=0
# A GPU test binary, its verdict lines in the summary. Skipped means the device was not usable (no
# driver, or one older than this CUDA needs): a failure here.
gtest() {  # name timeout
  step "gpu.$1"
  timeout "$2" "$bin/test_$1" > "$OUT/test_$1.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && { status=1; echo "test_$1: exit status $rc" | tee -a "$OUT/summary.md"; }
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK |Failure|first differing|Expected|Which is|rank [0-9]" \
    "$OUT/test_$1.log" | head -60 | tee -a "$OUT/summary.md"
  if grep -q "SKIPPED" "$OUT/test_$1.log"; then
    echo "FAIL: the GPU tests were skipped: the device is not usable" | tee -a "$OUT/summary.md"
    status=1
  fi
}
gtest cuda_kernels 75
gtest cuda_collectives 100
# The same calls through the staged path (pinned host memory and the host transports).
step "gpu.cuda_collectives, everything staged (CHORUS_CUDA_IPC=0)"
CHORUS_CUDA_IPC=0 timeout 45 "$bin/test_cuda_collectives" \
  --gtest_filter='*SendRecv*:*OneThread*:*AllToAllv*:*Barrier*:*HostMemory*' > "$OUT/test_staged.log" 2>&1 ||
  { status=1; echo "staged pass: failed" | tee -a "$OUT/summary.md"; }
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|rank [0-9]" "$OUT/test_staged.log" | head -30 | tee -a "$OUT/summary.md"

step "chorus-cuda-bench (reduction vs device-to-device copy)"
timeout 60 "$bin/chorus-cuda-bench" --max-mib 1024 --iters 20 > "$OUT/bench.md" 2> "$OUT/bench.err" || status=1
cat "$OUT/bench.md" "$OUT/bench.err" >> "$OUT/summary.md"

# nccl-tests tables; the summary keeps the rows of a few sizes and the average bus bandwidth.
perf() {  # log timeout args...
  local log=$1 limit=$2
  shift 2
  timeout "$limit" "$@" > "$OUT/$log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && { status=1; echo "($log: exit status $rc)" | tee -a "$OUT/summary.md"; }
  echo "$*" >> "$OUT/summary.md"
  grep -E "^ +(8|1024|65536|1048576|33554432|134217728) |Avg bus|Out of bounds|chorus-perf:|error" "$OUT/$log" |
    tee -a "$OUT/summary.md"
}
step "chorus-perf --memory cuda (ranks as threads on one GPU)"
for coll in all_reduce reduce_scatter all_gather; do
  for n in 2 4 8; do
    perf "perf_${coll}_${n}.txt" 16 "$bin/chorus-perf" "$coll" -t "$n" --memory cuda -b 8 -e 128M -f 4 -w 5 -n 20
  done
done
perf perf_sendrecv_2.txt 15 "$bin/chorus-perf" sendrecv -t 2 --memory cuda -b 8 -e 128M -f 4 -w 5 -n 20
step "chorus-perf --memory cuda, 2 processes on one GPU: staged (default), then CUDA IPC (time-sliced)"
perf perf_procs.txt 20 "$bin/chorusrun" -n 2 "$bin/chorus-perf" all_reduce --memory cuda -b 8 -e 1M -f 16 -w 2 -n 5
perf perf_procs_ipc.txt 20 env CHORUS_CUDA_SHARED_GPU=ipc \
  "$bin/chorusrun" -n 2 "$bin/chorus-perf" all_reduce --memory cuda -b 8 -e 1M -f 16 -w 2 -n 5

step "NCCL single-rank all_reduce via PyTorch (baseline)"
timeout 30 python3 - >> "$OUT/summary.md" 2> "$OUT/baseline.err" <<'PY' || echo "(baseline skipped: see baseline.err)" >> "$OUT/summary.md"
import torch, torch.distributed as dist
store = dist.HashStore()
dist.init_process_group("nccl", store=store, rank=0, world_size=1)
print("| size | NCCL 1-rank all_reduce us |\n|---|---|")
for nbytes in (8, 8 << 10, 8 << 20, 256 << 20):
    t = torch.ones(max(nbytes // 4, 1), device="cuda")
    for _ in range(5):
        dist.all_reduce(t)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        dist.all_reduce(t)
    end.record()
    torch.cuda.synchronize()
    print(f"| {nbytes} B | {start.elapsed_time(end) / 20 * 1e3:.1f} |")
dist.destroy_process_group()
PY
step "torch ProcessGroupNCCL over Chorus's libnccl.so.2 (2 processes, one GPU)"
# Exit 77: no torch or no usable GPU there.
LD_LIBRARY_PATH="$PWD/$bin/shim" LD_PRELOAD="$PWD/$bin/shim/libnccl.so.2" timeout 60 \
  python3 tests/frameworks/torch_nccl_shim_gpu_test.py > "$OUT/torch_shim.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 77 ] && status=1
case $rc in
  0) echo "torch shim test: passed" ;;
  77) echo "torch shim test: skipped (see torch_shim.log)" ;;
  *) echo "torch shim test: exit status $rc"; tail -15 "$OUT/torch_shim.log" ;;
esac | tee -a "$OUT/summary.md"
step "done (status $status)"
exit $status
