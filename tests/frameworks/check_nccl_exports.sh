#!/usr/bin/env bash
# check_nccl_exports.sh <include dir> <libnccl.so.2> [device]: the shim defines every function the
# dir's nccl.h declares (and their pnccl aliases), and, with `device`, the host functions of its
# nccl_device/ headers (NCCL's device API from 2.28, but gin_win_stub.h, which is for Windows only), and
# exports nothing but nccl*/pnccl* symbols.
set -euo pipefail
dir=$1
lib=$2
declared=$(grep -oE '^(ncclResult_t|const char\*|void) +p?nccl[A-Za-z0-9_]+ *\(' "$dir/nccl.h" |
           grep -oE 'p?nccl[A-Za-z0-9_]+ *[(]' | tr -d '( ' | sort -u)
if [ "${3:-}" = device ]; then
  host=$(grep -hoE '^NCCL_EXTERN_C __host__ [A-Za-z_]+ +nccl[A-Za-z0-9_]+ *\(' \
           $(ls "$dir"/nccl_device/*.h | grep -v gin_win_stub.h) | grep -oE 'nccl[A-Za-z0-9_]+ *[(]' | tr -d '( ')
  [ -n "$host" ] || { echo "FAIL: no host functions found in $dir/nccl_device"; exit 1; }
  declared=$(printf '%s\n%s\n' "$declared" "$(echo "$host" | sed 'p;s/^/p/')" | sort -u)
fi
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWwi]$/ {print $3}' | sed 's/@.*//' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(echo "$exported" | grep -vE '^p?nccl' || true)
echo "the headers declare $(echo "$declared" | wc -l) functions (with pnccl aliases); $lib exports $(echo "$exported" | wc -l) symbols"
if [ -n "$missing" ]; then echo "FAIL: not exported: $missing"; exit 1; fi
if [ -n "$extra" ]; then echo "FAIL: exported beyond the NCCL API: $extra"; exit 1; fi
readelf -d "$lib" | grep -q 'SONAME.*\[libnccl\.so\.2\]' || { echo "FAIL: SONAME is not libnccl.so.2"; exit 1; }
echo "ok: every declared function is exported, nothing else is, SONAME libnccl.so.2"
