#!/usr/bin/env bash
# expect_output.sh PATTERN -- COMMAND...: runs COMMAND, prints its output, and fails unless it
# succeeded and its output matches the extended regular expression PATTERN. Exit 77 passes through.
pattern=$1
shift
[ "$1" = "--" ] && shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" = 77 ] && exit 77
[ "$rc" = 0 ] || exit "$rc"
if ! grep -Eq -- "$pattern" <<<"$out"; then
  echo "expect_output.sh: output does not match '$pattern'"
  exit 1
fi
