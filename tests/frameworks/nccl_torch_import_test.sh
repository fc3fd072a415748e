#!/usr/bin/env bash
# nccl_torch_import_test.sh <python> <libnccl.so.2> <version>: the pinned PyTorch (its libtorch_cuda
# links NCCL) imports with Chorus's libnccl.so.2 preloaded (torch's RPATH names the NCCL wheel's
# library, so preloading is the way in); every NCCL function libtorch_cuda.so links is bound to
# the shim (the dynamic linker's own record, LD_DEBUG=bindings), none to NVIDIA's library, which
# torch also opens, privately, by path; and torch.cuda.nccl.version() reports the shim's version.
set -euo pipefail
python=$1
shim=$(realpath "$2")
version=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
LD_DEBUG=bindings LD_DEBUG_OUTPUT=$tmp/bindings LD_PRELOAD=$shim EXPECTED=$version "$python" - <<'PY'
import os
import torch
import torch.cuda.nccl as nccl
import torch.distributed as dist

got = ".".join(str(v) for v in nccl.version())
assert got == os.environ["EXPECTED"], f"torch.cuda.nccl.version() is {got}, the shim is {os.environ['EXPECTED']}"
assert dist.is_nccl_available(), "torch.distributed reports no NCCL backend"
print(f"torch {torch.__version__} imported; torch.cuda.nccl.version() = {got}")
PY
needs=$(nm -D --undefined-only "$(dirname "$("$python" -c 'import torch, os; print(torch.__file__)')")/lib/libtorch_cuda.so" |
        awk '{print $2}' | grep -cE '^nccl')
bindings=$(cat "$tmp"/bindings.* | grep -E 'libtorch_cuda\.so .* normal symbol `nccl' || true)
to_shim=$(echo "$bindings" | grep -c " to $shim \[" || true)
elsewhere=$(echo "$bindings" | grep -v " to $shim \[" | grep -c . || true)
echo "libtorch_cuda.so links $needs NCCL functions: $to_shim bound to $shim, $elsewhere elsewhere"
if [ "$elsewhere" != 0 ]; then echo "FAIL: bound elsewhere:"; echo "$bindings" | grep -v " to $shim \[" | head; exit 1; fi
if [ "$to_shim" -lt "$needs" ]; then echo "FAIL: only $to_shim of $needs bound to the shim"; exit 1; fi
echo "ok: torch imports over Chorus's libnccl.so.2 $version"
