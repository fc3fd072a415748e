#!/usr/bin/env bash
# torch_entrypoint_test.sh <python> <source dir> <build dir> <work dir>: installs the package with pip
# (reusing the build), then runs ranks that never import chorus_torch: torch finds the backend
# through the package's torch.distributed.backends entry point.
set -euo pipefail
python=$1 src=$2 build=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
CHORUS_BUILD_DIR=$build "$python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
  --target "$work/site" "$src/frameworks/torch"
test -f "$work/site/chorus_torch-0.1.0.dist-info/entry_points.txt"
grep -q "chorus = chorus_torch:register" "$work/site/chorus_torch-0.1.0.dist-info/entry_points.txt"
# pip builds in the source tree: leave nothing of it there.
rm -rf "$src/frameworks/torch/build" "$src"/frameworks/torch/*.egg-info
PYTHONPATH=$work/site exec "$python" "$src/tests/frameworks/torch_backend_test.py" --world 2 entrypoint
