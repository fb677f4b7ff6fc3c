#!/usr/bin/env bash
# Pollcast beside nchan on this machine, in one run: the same pollcast-bench scenarios against both, alternately,
# each server started fresh for every run and pinned to CPU 0, the bench pinned to CPU 1. Prints one Markdown
# table of medians and writes it, with every raw SUMMARY line, to Benchmarks/results/.
#   Benchmarks/compare-nchan.sh [REPEATS=3]       (QUICK=1 for a short smoke run; ONLY=storm-10k for one scenario)
set -euo pipefail
cd "$(dirname "$0")/.."
source Benchmarks/servers.sh
repeats=${1:-3}
quick=${QUICK:-0}

if ! dpkg-query -W -f='${Status}' nginx libnginx-mod-nchan 2>/dev/null | grep -q "install ok installed"; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx libnginx-mod-nchan >/dev/null
fi
# Debian starts nginx as a service on install; the benchmark runs its own on loopback.
systemctl stop nginx 2>/dev/null || service nginx stop 2>/dev/null || true

swift build -c release >/dev/null
bin=$(swift build -c release --show-bin-path)
work=$(mktemp -d /tmp/pollcast-compare.XXXXXX)
results=Benchmarks/results
mkdir -p "$results"
raw="$results/compare-$(date -u +%Y%m%dT%H%M%SZ).txt"
STARTED_PIDS=()
cleanup() { for pid in "${STARTED_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)"

start_pollcast() {  # sets TARGET INJECT PIDS
  start_relay "$bin" "$work"
  PIDS=$RELAY_PID
}

start_nchan() {
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  prefix="$work/nginx-$port"; mkdir -p "$prefix"
  sed -e "s|@PREFIX@|$prefix|g" -e "s|@PORT@|$port|g" Benchmarks/nchan.conf.template >"$prefix/nginx.conf"
  taskset -c 0 nginx -c "$prefix/nginx.conf" -p "$prefix" >"$prefix/out.log" 2>&1 &
  STARTED_PIDS+=($!); PIDS=$!
  for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$port/pub?channel=probe" -X POST -d x && break; sleep 0.05; done
  channel="run$RANDOM$RANDOM"
  TARGET="http://127.0.0.1:$port/sub?channel=$channel"; INJECT="publish:http://127.0.0.1:$port/pub?channel=$channel"
}

stop_servers() { for pid in "${STARTED_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; sleep 0.5; STARTED_PIDS=(); }

run() {  # scenario-name target bench-args…
  local scenario=$1 target=$2; shift 2
  "start_$target"
  local line
  line=$(taskset -c 1 "$bin/pollcast-bench" --target "$TARGET" --inject "$INJECT" --relay-pid "$PIDS" --label "$target" "$@" \
    2>&1 | tee "$work/bench.log" | grep '^SUMMARY' || echo "SUMMARY target=$target failed=1")
  stop_servers
  echo "scenario=$scenario $line" | tee -a "$raw"
}

if [ "$quick" = 1 ]; then
  scenarios=("fanout-1k-20:--subscribers 1000 --messages 60 --rate 20"
             "storm-2k:--mode storm --subscribers 2000 --messages 60 --rate 20")
  idle_seconds=10; big=2000
else
  scenarios=("hop-1:--subscribers 1 --messages 100 --rate 20"
             "fanout-1k-20:--subscribers 1000 --messages 200 --rate 20"
             "fanout-5k-20:--subscribers 5000 --messages 200 --rate 20"
             "fanout-10k-20:--subscribers 10000 --messages 200 --rate 20"
             "fanout-1k-200:--subscribers 1000 --messages 2000 --rate 200"
             "storm-10k:--mode storm --subscribers 10000 --messages 200 --rate 20")
  idle_seconds=60; big=19000
fi
only=${ONLY:-}
for _ in $(seq 1 "$repeats"); do
  for entry in "${scenarios[@]}"; do
    [ -n "$only" ] && [ "${entry%%:*}" != "$only" ] && continue
    for target in pollcast nchan; do run "${entry%%:*}" "$target" ${entry#*:}; done
  done
done
if [ -n "$only" ]; then python3 Benchmarks/summarize.py "$raw" | tee "${raw%.txt}.md"; exit 0; fi
for target in pollcast nchan; do
  run "held-$big" "$target" --subscribers "$big" --messages 100 --rate 20 --connect-batch 1000
  run "idle-10k" "$target" --mode idle --subscribers "$([ "$quick" = 1 ] && echo 2000 || echo 10000)" --idle-seconds "$idle_seconds"
done
for rate in 100 200 400 800 1600; do
  for target in pollcast nchan; do run "ramp-1k-$rate" "$target" --subscribers 1000 --messages $((rate * 5)) --rate "$rate" --drain-seconds 5; done
done

python3 Benchmarks/summarize.py "$raw" | tee "${raw%.txt}.md"
