#!/usr/bin/env bash
# check_nccl_exports.sh <nccl.h> <libnccl.so.2>: the shim defines every function nccl.h declares
# (and their pnccl aliases), and exports nothing but nccl*/pnccl* symbols.
set -euo pipefail
header=$1
lib=$2
declared=$(grep -oE '^(ncclResult_t|const char\*|void) +p?nccl[A-Za-z0-9_]+ *\(' "$header" |
           grep -oE 'p?nccl[A-Za-z0-9_]+ *[(]' | tr -d '( ' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWwi]$/ {print $3}' | sed 's/@.*//' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(echo "$exported" | grep -vE '^p?nccl' || true)
echo "nccl.h declares $(echo "$declared" | wc -l) functions; $lib exports $(echo "$exported" | wc -l) symbols"
if [ -n "$missing" ]; then echo "FAIL: not exported: $missing"; exit 1; fi
if [ -n "$extra" ]; then echo "FAIL: exported beyond the NCCL API: $extra"; exit 1; fi
readelf -d "$lib" | grep -q 'SONAME.*\[libnccl\.so\.2\]' || { echo "FAIL: SONAME is not libnccl.so.2"; exit 1; }
echo "ok: every declared function is exported, nothing else is, SONAME libnccl.so.2"
