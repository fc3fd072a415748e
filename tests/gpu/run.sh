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
#   3. chorus-cuda-bench: reduction GB/s against a device-to-device copy of the same bytes
#   4. NCCL single-rank all_reduce through PyTorch, as a sanity baseline (skipped without torch)
# The timeouts add up to 450 s, under the device tool's 600 s per command.
# and writes $OUT/summary.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu/out}
mkdir -p "$OUT"
build=build/gpu
step() { echo "== $* ($(date +%T))" | tee -a "$OUT/summary.md"; }

# Run --build-only right before carrying build/gpu: a carried build is used as it is.
if [ "${1:-}" = "--build-only" ] || [ ! -x "$build/tests/gpu/test_cuda_kernels" ] ||
  [ ! -x "$build/bench/gpu/chorus-cuda-bench" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="80;90" \
    -DCHORUS_WITH_HWLOC=OFF -DCHORUS_WITH_OPENSSL=OFF -DCHORUS_WITH_UCX=OFF -DCHORUS_WITH_VERBS=OFF \
    -DCHORUS_BUILD_TORCH=OFF -DCHORUS_BUILD_NCCL_SHIM=OFF -DCHORUS_BUILD_COMPARE=OFF -DCHORUS_BUILD_UNTESTED=OFF \
    > "$OUT/configure.log" 2>&1 || { echo "configure failed: see $OUT/configure.log"; tail -20 "$OUT/configure.log"; exit 1; }
  cmake --build "$build" -j "$(nproc)" --target test_cuda_kernels chorus-cuda-bench > "$OUT/build.log" 2>&1 ||
    { echo "build failed: see $OUT/build.log"; tail -20 "$OUT/build.log"; exit 1; }
  [ "${1:-}" = "--build-only" ] && { echo "built $build (carry it to the device machine)"; exit 0; }
fi

: > "$OUT/summary.md"
step "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || true
  nvcc --version 2>/dev/null | tail -1 || true; } | tee -a "$OUT/summary.md"

status=0
step "gpu.cuda_kernels"
timeout 240 "$build/tests/gpu/test_cuda_kernels" > "$OUT/test_cuda_kernels.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |CUDA devices|Failure|first differing" "$OUT/test_cuda_kernels.log" |
  tee -a "$OUT/summary.md"
# Skipped means the device was not usable (no driver, or one older than this CUDA needs): a failure here.
if grep -q "SKIPPED" "$OUT/test_cuda_kernels.log"; then
  echo "FAIL: the GPU tests were skipped: the device is not usable" | tee -a "$OUT/summary.md"
  status=1
fi

step "chorus-cuda-bench (reduction vs device-to-device copy)"
timeout 150 "$build/bench/gpu/chorus-cuda-bench" --max-mib 1024 --iters 20 > "$OUT/bench.md" 2> "$OUT/bench.err" || status=1
cat "$OUT/bench.md" "$OUT/bench.err" >> "$OUT/summary.md"

step "NCCL single-rank all_reduce via PyTorch (baseline)"
timeout 60 python3 - >> "$OUT/summary.md" 2> "$OUT/baseline.err" <<'PY' || echo "(baseline skipped: see baseline.err)" >> "$OUT/summary.md"
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
step "done (status $status)"
exit $status
