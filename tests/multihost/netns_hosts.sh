#!/usr/bin/env bash
# Runs one program as the ranks of a job spread over emulated hosts: network namespaces joined by
# veth pairs to a bridge (in a namespace of its own), with link-local addresses only.
#
#   netns_hosts.sh [--hosts H] [--ranks R] [--rate RATE] [--timeout S] [--allow-sigkill] -- PROGRAM ARGS...
#
# Host h gets 169.254.77.(h+1)/16 and fe80::77:(h+1)/64 on its eth0. Rank h*R+l runs in host h
# with the torchrun variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
# MASTER_ADDR=169.254.77.1, MASTER_PORT) and whatever else is in the environment. --rate shapes
# each host's egress with tc tbf (e.g. 1gbit). Output is prefixed "[h<h> r<rank>]". Exit status: 0
# when every rank exits 0 (or was killed by SIGKILL,
# with --allow-sigkill: a test that kills a rank on purpose), otherwise the first failing rank's status (124 on --timeout).
# Needs root and iproute2; exits 77 (CTest's skip code) with the reason otherwise. Every namespace
# and link it made is removed on exit, also on failure or interruption.
set -uo pipefail

hosts=2 ranks=1 rate="" timeout=300 allowKill=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --allow-sigkill) allowKill=1; shift ;;
    --) shift; break ;;
    *) echo "netns_hosts.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "netns_hosts.sh: no program given" >&2; exit 2; }

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (CI runs as root)"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"

tag="chx$$"
sw="${tag}sw"
made=()
pids=()
workdir=$(mktemp -d)
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for ns in "${made[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$sw" 2>/dev/null || skip "cannot create a network namespace (ip netns add failed)"
made+=("$sw")
ip -n "$sw" link add br0 type bridge || skip "cannot create a bridge (no bridge support in this kernel)"
ip -n "$sw" link set br0 up
ip -n "$sw" link set lo up
for ((h = 0; h < hosts; h++)); do
  ns="${tag}h$h"
  ip netns add "$ns" || { echo "cannot create namespace $ns" >&2; exit 1; }
  made+=("$ns")
  # No duplicate address detection, no automatic link-local address: the test's own fe80::77:x is
  # usable at once.
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
  ip link add eth0 netns "$ns" type veth peer name "h$h" netns "$sw" || { echo "cannot create veth" >&2; exit 1; }
  ip -n "$ns" link set eth0 addrgenmode none 2>/dev/null
  ip -n "$sw" link set "h$h" master br0
  ip -n "$sw" link set "h$h" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "169.254.77.$((h + 1))/16" dev eth0
  ip -n "$ns" addr add "fe80::77:$((h + 1))/64" dev eth0 nodad
  ip -n "$ns" link set eth0 up
  if [ -n "$rate" ]; then
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 100ms ||
      { echo "tc tbf failed" >&2; exit 1; }
  fi
done
# Wait until every bridge port forwards (state 3; at once without STP, but the port comes up
# asynchronously).
for ((h = 0; h < hosts; h++)); do
  for i in $(seq 100); do
    [ "$(ip netns exec "$sw" cat "/sys/class/net/h$h/brport/state" 2>/dev/null)" = 3 ] && break
    sleep 0.05
  done
done

port=$((20000 + $$ % 20000))
world=$((hosts * ranks))
for ((h = 0; h < hosts; h++)); do
  for ((l = 0; l < ranks; l++)); do
    r=$((h * ranks + l))
    ip netns exec "${tag}h$h" env RANK=$r LOCAL_RANK=$l WORLD_SIZE=$world LOCAL_WORLD_SIZE=$ranks GROUP_RANK=$h \
      MASTER_ADDR=169.254.77.1 MASTER_PORT=$port "$@" >"$workdir/out.$r" 2>&1 &
    pids+=($!)
  done
done

status=0
deadline=$((SECONDS + timeout))
remaining=$world
while [ "$remaining" -gt 0 ]; do
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      wait "${pids[$i]}"
      rc=$?
      # Reaped: its pid may now belong to any process, so it leaves the list cleanup() kills.
      unset "pids[$i]"
      remaining=$((remaining - 1))
      if [ "$rc" = 137 ] && [ "$allowKill" = 1 ]; then echo "rank $i was killed (expected)"; rc=0; fi
      if [ "$rc" != 0 ] && [ "$status" = 0 ]; then status=$rc; echo "rank $i exited with status $rc"; fi
    fi
  done
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "timed out after ${timeout}s; $remaining rank(s) still running"
    status=124
    break
  fi
  sleep 0.05
done
for ((r = 0; r < world; r++)); do
  sed "s/^/[h$((r / ranks)) r$r] /" "$workdir/out.$r"
done
exit "$status"
