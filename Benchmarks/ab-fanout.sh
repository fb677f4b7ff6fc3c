#!/usr/bin/env bash
# A/B fan-out: the same pollcast-bench scenarios against two release builds, alternating; relay on CPU 0, bench
# and fixture on CPU 1. Prints one SUMMARY line per run.
#   Benchmarks/ab-fanout.sh BASE_BIN_DIR HEAD_BIN_DIR [REPEATS=3]
# e.g. git worktree add /tmp/base <commit> && (cd /tmp/base && swift build -c release)
#      swift build -c release && Benchmarks/ab-fanout.sh /tmp/base/.build/release .build/release
set -euo pipefail
source "$(dirname "$0")/servers.sh"
STARTED_PIDS=()
base=$1; head=$2; repeats=${3:-3}
bench=$head/pollcast-bench
work=$(mktemp -d)
ulimit -n "$(ulimit -Hn)"
one() { # build-dir label args...
  local bin=$1 label=$2; shift 2
  start_relay "$bin" "$work"
  local line=$(taskset -c 1 "$bench" --target "$TARGET" --inject "$INJECT" --relay-pid $RELAY_PID --label "$label" "$@" 2>&1 | grep '^SUMMARY' || echo "SUMMARY label=$label failed=1")
  kill "${STARTED_PIDS[@]}" 2>/dev/null || true; STARTED_PIDS=(); sleep 0.5
  echo "$label $*: $line"
}
for i in $(seq 1 "$repeats"); do
  for scenario in "--subscribers 1000 --messages 200 --rate 20" "--subscribers 5000 --messages 200 --rate 20"; do
    # The order alternates between repeats, so neither build always runs first.
    if [ $((i % 2)) = 1 ]; then one "$base" base $scenario; one "$head" head $scenario
    else one "$head" head $scenario; one "$base" base $scenario; fi
  done
done
