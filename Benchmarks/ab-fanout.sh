#!/usr/bin/env bash
# A/B fan-out: the same pollcast-bench scenarios against two release builds, alternating; relay on CPU 0, bench
# and fixture on CPU 1. Prints one SUMMARY line per run.
#   Benchmarks/ab-fanout.sh BASE_BIN_DIR HEAD_BIN_DIR [REPEATS=3]
# e.g. git worktree add /tmp/base <commit> && (cd /tmp/base && swift build -c release)
#      swift build -c release && Benchmarks/ab-fanout.sh /tmp/base/.build/release .build/release
set -euo pipefail
base=$1; head=$2; repeats=${3:-3}
bench=$head/pollcast-bench
work=$(mktemp -d)
ulimit -n "$(ulimit -Hn)"
wait_line() { for _ in $(seq 1 200); do grep -q "listening on" "$1" 2>/dev/null && { head -1 "$1" | sed 's/listening on //'; return 0; }; sleep 0.05; done; return 1; }
one() { # build-dir label args...
  local bin=$1 label=$2; shift 2
  "$bin/pollcast-legacy-fixture" --listen 127.0.0.1:0 >"$work/f.out" 2>/dev/null & local fpid=$!
  taskset -p -c 1 $fpid >/dev/null
  local fixture=$(wait_line "$work/f.out")
  taskset -c 0 "$bin/pollcast" --listen 127.0.0.1:0 --upstream-url "http://$fixture" --upstream-api-key dev-key \
    --log-level warning --ring-max-events 50000 >"$work/r.out" 2>"$work/r.log" & local rpid=$!
  local relay=$(wait_line "$work/r.out")
  for _ in $(seq 1 100); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$relay/readyz")" = 200 ] && break; sleep 0.05; done
  local line=$(taskset -c 1 "$bench" --target "http://$relay/events" --inject "fixture:http://$fixture" --relay-pid $rpid --label "$label" "$@" 2>&1 | grep '^SUMMARY' || echo "SUMMARY label=$label failed=1")
  kill $rpid $fpid 2>/dev/null || true; sleep 0.5
  echo "$label $*: $line"
}
for i in $(seq 1 "$repeats"); do
  for scenario in "--subscribers 1000 --messages 200 --rate 20" "--subscribers 5000 --messages 200 --rate 20"; do
    # The order alternates between repeats, so neither build always runs first.
    if [ $((i % 2)) = 1 ]; then one "$base" base $scenario; one "$head" head $scenario
    else one "$head" head $scenario; one "$base" base $scenario; fi
  done
done
