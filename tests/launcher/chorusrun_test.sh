#!/usr/bin/env bash
# Tests of chorusrun on small shell commands.
# Usage: chorusrun_test.sh CASE CHORUSRUN STORE_RENDEZVOUS_HELPER
# The commands run by chorusrun are single-quoted on purpose: the ranks expand them.
# shellcheck disable=SC2016
set -u

CASE=$1
CHORUSRUN=$2
HELPER=${3:-}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/chorusrun_test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
OUT=$WORK/out
ERR=$WORK/err

fail() {
  echo "FAIL ($CASE): $*" >&2
  for f in "$OUT" "$ERR"; do
    if [ -s "$f" ]; then
      echo "---- $(basename "$f") (first 40 lines) ----" >&2
      head -n 40 "$f" >&2
    fi
  done
  exit 1
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# run ARGS...: runs chorusrun with ARGS, stdout to $OUT, stderr to $ERR; sets RC and ELAPSED_MS.
run() {
  local start
  start=$(now_ms)
  "$CHORUSRUN" "$@" >"$OUT" 2>"$ERR" </dev/null
  RC=$?
  ELAPSED_MS=$(($(now_ms) - start))
}

expect_rc() { [ "$RC" -eq "$1" ] || fail "exit status $RC, expected $1"; }
expect_faster_than() { [ "$ELAPSED_MS" -lt "$1" ] || fail "took ${ELAPSED_MS} ms, expected under $1 ms"; }
# expect_count FILE REGEX N: exactly N lines of FILE match REGEX.
expect_count() {
  local n
  n=$(grep -cE -- "$2" "$1")
  [ "$n" -eq "$3" ] || fail "$n lines of $(basename "$1") match '$2', expected $3"
}
expect_in_err() { grep -qE -- "$1" "$ERR" || fail "stderr lacks '$1'"; }

# expect_groups_gone: every process group listed as "PGID <n>" in $OUT is gone within 5 s (the
# ranks' own children may still be dying, or waiting for init to reap them, when chorusrun returns).
expect_groups_gone() {
  local pgid tries
  sed -nE 's/^\[[0-9]+\] PGID ([0-9]+)$/\1/p' "$OUT" >"$WORK/pgids"
  while read -r pgid; do
    tries=0
    while kill -0 -- "-$pgid" 2>/dev/null; do
      tries=$((tries + 1))
      [ "$tries" -le 50 ] || fail "process group $pgid still exists"
      sleep 0.1
    done
  done <"$WORK/pgids"
}

# wait_for_lines FILE REGEX N: waits up to 10 s until N lines of FILE match REGEX.
wait_for_lines() {
  local tries=0
  until [ "$(grep -cE -- "$2" "$1" 2>/dev/null)" -ge "$3" ]; do
    tries=$((tries + 1))
    [ "$tries" -le 100 ] || fail "timed out waiting for $3 lines matching '$2'"
    sleep 0.1
  done
}

case "$CASE" in
environment)
  # Variables chorusrun sets replace inherited ones; others pass through.
  CHORUS_RANK=77 CHORUS_STORE_ADDR=bogus LAUNCHER_TEST_VAR=kept run -n 4 sh -c \
    'echo "ENV $CHORUS_RANK $CHORUS_WORLD_SIZE $CHORUS_LOCAL_RANK $CHORUS_LOCAL_SIZE $CHORUS_STORE_ADDR $LAUNCHER_TEST_VAR"'
  expect_rc 0
  expect_count "$OUT" '.' 4
  for r in 0 1 2 3; do
    expect_count "$OUT" "^\[$r\] ENV $r 4 $r 4 127\.0\.0\.1:[0-9]+ kept$" 1
  done
  [ "$(sed -E 's/.* (127\.0\.0\.1:[0-9]+) .*/\1/' "$OUT" | sort -u | wc -l)" -eq 1 ] ||
    fail "ranks see different store addresses"
  run -n 1 sh -c 'echo "ENV $CHORUS_RANK $CHORUS_WORLD_SIZE"'
  expect_rc 0
  expect_count "$OUT" '^\[0\] ENV 0 1$' 1
  ;;

output_streams)
  # stdout and stderr stay apart; a last line without newline is still printed.
  run -n 3 sh -c 'echo "out $CHORUS_RANK"; echo "err $CHORUS_RANK" >&2; printf "tail $CHORUS_RANK"'
  expect_rc 0
  expect_count "$OUT" '.' 6
  expect_count "$ERR" '.' 3
  for r in 0 1 2; do
    expect_count "$OUT" "^\[$r\] out $r$" 1
    expect_count "$OUT" "^\[$r\] tail $r$" 1
    expect_count "$ERR" "^\[$r\] err $r$" 1
  done
  [ "$(tail -c 1 "$OUT" | od -An -c | tr -d ' ')" = '\n' ] || fail "stdout does not end with a newline"
  ;;

no_prefix)
  run --no-prefix -n 2 sh -c 'echo "plain $CHORUS_RANK"; echo "e $CHORUS_RANK" >&2'
  expect_rc 0
  expect_count "$OUT" '^plain [01]$' 2
  expect_count "$ERR" '^e [01]$' 2
  ;;

stdin)
  # Rank 0 reads chorusrun's standard input; the others read /dev/null.
  echo hello | "$CHORUSRUN" -n 2 sh -c 'read -r x; echo "got [$x]"' >"$OUT" 2>"$ERR"
  RC=$?
  expect_rc 0
  expect_count "$OUT" '^\[0\] got \[hello\]$' 1
  expect_count "$OUT" '^\[1\] got \[\]$' 1
  ;;

interleaving)
  # 4 ranks write 2000 lines each to stdout and to stderr as fast as they can, in blocks that split
  # lines; every relayed line must be whole and carry its own rank's prefix.
  run -n 4 sh -c 'yes "rank $CHORUS_RANK abcdefghijklmnopqrstuvwxyz0123456789" | head -n 2000 &
                  yes "err $CHORUS_RANK ABCDEFGHIJKLMNOPQRSTUVWXYZ" | head -n 2000 >&2; wait'
  expect_rc 0
  expect_count "$OUT" '.' 8000
  expect_count "$ERR" '.' 8000
  expect_count "$OUT" '^\[([0-3])\] rank \1 abcdefghijklmnopqrstuvwxyz0123456789$' 8000
  expect_count "$ERR" '^\[([0-3])\] err \1 ABCDEFGHIJKLMNOPQRSTUVWXYZ$' 8000
  for r in 0 1 2 3; do
    expect_count "$OUT" "^\[$r\] " 2000
    expect_count "$ERR" "^\[$r\] " 2000
  done
  ;;

first_failure)
  # Rank 2 fails with 3; rank 3 then exits 4 when told to stop, the others sleep (in a child
  # process) until stopped. chorusrun returns the first failure and the process groups are gone.
  run -n 4 sh -c 'echo "PGID $$"
                  case $CHORUS_RANK in
                    2) sleep 0.5; exit 3 ;;
                    3) trap "exit 4" TERM; sleep 60 & wait ;;
                    *) sleep 60; true ;;
                  esac'
  expect_rc 3
  expect_faster_than 10000
  expect_in_err '^chorusrun: rank 2 \(pid [0-9]+\) exited with status 3; stopping the other ranks$'
  expect_count "$ERR" '^chorusrun: ' 1
  expect_count "$OUT" '^\[[0-3]\] PGID [0-9]+$' 4
  expect_groups_gone
  ;;

signal_death)
  run -n 3 sh -c 'if [ "$CHORUS_RANK" = 1 ]; then sleep 0.3; kill -KILL $$; fi; sleep 60; true'
  expect_rc 137
  expect_faster_than 10000
  expect_in_err '^chorusrun: rank 1 \(pid [0-9]+\) killed by signal 9 \(Killed\); stopping the other ranks$'
  run -n 1 sh -c 'kill -USR1 $$'
  expect_rc 138
  expect_in_err 'rank 0 \(pid [0-9]+\) killed by signal 10'
  ;;

missing_program)
  run -n 3 chorus-no-such-program-for-test arg
  expect_rc 127
  expect_faster_than 10000
  expect_in_err "cannot execute 'chorus-no-such-program-for-test': No such file or directory"
  run -n 2 "$WORK/missing/prog"
  expect_rc 127
  expect_in_err "cannot execute '$WORK/missing/prog': No such file or directory"
  printf 'not executable\n' >"$WORK/plain"
  run -n 2 "$WORK/plain"
  expect_rc 127
  expect_in_err "cannot execute '$WORK/plain': Permission denied"
  ;;

timeout)
  run --timeout 1 -n 2 sh -c 'echo "PGID $$"; sleep 60; true'
  expect_rc 124
  expect_faster_than 10000
  [ "$ELAPSED_MS" -ge 900 ] || fail "stopped after ${ELAPSED_MS} ms, before the 1 s timeout"
  expect_in_err '^chorusrun: .*timeout of 1 second'
  expect_groups_gone
  run --timeout 30 -n 2 true
  expect_rc 0
  ;;

forward_signal)
  # SIGTERM and SIGINT sent to chorusrun reach every rank; chorusrun exits with 128+signal.
  for sig in TERM INT; do
    # Empty the files first: the background job's own redirection truncates them only once it
    # has forked, and wait_for_lines must not find the previous round's "ready" lines (the signal
    # would then reach chorusrun before its handlers, while it still ignores SIGINT as a
    # background job of this script does, and the round would hang).
    : >"$OUT"
    : >"$ERR"
    start=$(now_ms)
    "$CHORUSRUN" -n 3 sh -c 'trap "echo caught; exit 0" '"$sig"'; echo "PGID $$"; echo ready; sleep 60; true' \
      >"$OUT" 2>"$ERR" </dev/null &
    pid=$!
    wait_for_lines "$OUT" '^\[[0-2]\] ready$' 3
    kill -"$sig" "$pid"
    wait "$pid"
    RC=$?
    ELAPSED_MS=$(($(now_ms) - start))
    expect_rc $((128 + $(kill -l "$sig")))
    expect_faster_than 10000
    expect_count "$OUT" '^\[[0-2]\] caught$' 3
    expect_in_err "^chorusrun: received signal $(kill -l "$sig")"
    expect_groups_gone
  done
  ;;

grace_kill)
  # Ranks that ignore SIGTERM are killed after --grace-seconds.
  run --grace-seconds 1 -n 3 sh -c 'trap "" TERM; echo "PGID $$"
                                    if [ "$CHORUS_RANK" = 0 ]; then sleep 1; exit 5; fi; sleep 60; true'
  expect_rc 5
  [ "$ELAPSED_MS" -ge 1900 ] || fail "finished after ${ELAPSED_MS} ms, before the grace period ended"
  expect_faster_than 10000
  expect_in_err 'killing them'
  expect_groups_gone
  ;;

command_line)
  run --help
  expect_rc 0
  grep -q 'CHORUS_STORE_ADDR' "$OUT" || fail "--help does not describe CHORUS_STORE_ADDR"
  grep -q -- '--timeout' "$OUT" || fail "--help does not describe --timeout"
  # Options after the program belong to the program; "--" ends chorusrun's options.
  run -n 2 sh -c 'echo "args: $*"' prog -n 7 --no-prefix --timeout
  expect_rc 0
  expect_count "$OUT" '^\[[01]\] args: -n 7 --no-prefix --timeout$' 2
  run --np=2 --no-prefix -- sh -c 'echo "args: $*"' prog -- x
  expect_rc 0
  expect_count "$OUT" '^args: -- x$' 2
  for bad in "-n 0 true" "-n 1025 true" "--np" "-n 2" "--bogus -n 2 true" "-n 2 --bogus true" \
    "-n 2 --timeout -1 true" "true"; do
    # shellcheck disable=SC2086
    run $bad
    [ "$RC" -eq 2 ] || fail "'chorusrun $bad' exited with $RC, expected 2"
    [ -s "$ERR" ] || fail "'chorusrun $bad' printed no error"
  done
  ;;

store_rendezvous)
  [ -n "$HELPER" ] || fail "no store helper given"
  run --timeout 50 -n 4 "$HELPER"
  expect_rc 0
  for r in 0 1 2 3; do
    expect_count "$OUT" "^\[$r\] rendezvous ok$" 1
  done
  ;;

*)
  fail "unknown case"
  ;;
esac
echo "PASS ($CASE)"
