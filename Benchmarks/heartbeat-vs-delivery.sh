#!/usr/bin/env bash
# A heartbeat against a delivery, on equal terms: both to 10,000 idle subscribers whose readers sleep between
# writes. (a) relay CPU per heartbeat: idle subscribers for 45 s with 15 s heartbeats, CPU / heartbeats sent;
# (b) relay CPU per delivery: one message a second to the same 10,000 subscribers with heartbeats off.
# Relay on CPU 0, bench on CPU 1. Usage: Benchmarks/heartbeat-vs-delivery.sh [RUNS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
swift build -c release >/dev/null
bin=$(swift build -c release --show-bin-path)
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
"$bin/pollcast-legacy-fixture" --listen 127.0.0.1:0 >"$work/fixture.out" 2>/dev/null &
until grep -q listening "$work/fixture.out" 2>/dev/null; do sleep 0.05; done
fixture=$(head -1 "$work/fixture.out" | sed 's/listening on //')
start_relay() {
  taskset -c 0 "$bin/pollcast" --listen 127.0.0.1:0 --upstream-url "http://$fixture" --upstream-api-key dev-key \
    --upstream-poll-timeout-seconds 50 --log-level warning --server-timeout-seconds 600 --server-max-connections-per-address 0 "$@" >"$work/relay.out" 2>/dev/null &
  relay_pid=$!
  until grep -q listening "$work/relay.out" 2>/dev/null; do
    kill -0 "$relay_pid" 2>/dev/null || { echo "the relay did not start" >&2; exit 1; }
    sleep 0.05
  done
  relay=$(head -1 "$work/relay.out" | sed 's/listening on //')
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
for run in $(seq 1 "$runs"); do
  start_relay --sse-heartbeat-seconds 15
  before=$(ticks "$relay_pid")
  taskset -c 1 "$bin/pollcast-bench" --target "http://$relay/events" --mode idle --subscribers 10000 \
    --idle-seconds 45 --relay-pid "$relay_pid" >"$work/idle.out" 2>&1
  after=$(ticks "$relay_pid")
  beats=$(curl -s "http://$relay/metrics" | awk '/^pollcast_heartbeats_sent_total/ {print $2}')
  kill "$relay_pid"; wait "$relay_pid" 2>/dev/null || true
  # The window includes connecting 10,000 subscribers; the idle figure the bench prints excludes it.
  idle_pct=$(sed -n 's/.*idle_cpu_pct=\([0-9.]*\).*/\1/p' "$work/idle.out")
  awk -v p="$idle_pct" -v b="$beats" 'BEGIN { printf "run %d heartbeat: %.2f µs of relay CPU each (%d heartbeats, %.3f%% of a core over 45 s)\n", '"$run"', p / 100 * 45 * 1e6 / b, b, p }'
  start_relay --sse-heartbeat-seconds 500
  taskset -c 1 "$bin/pollcast-bench" --target "http://$relay/events" --inject "fixture:http://$fixture" --mode fanout \
    --subscribers 10000 --messages 20 --rate 1 --relay-pid "$relay_pid" >"$work/fanout.out" 2>&1
  kill "$relay_pid"; wait "$relay_pid" 2>/dev/null || true
  echo "run $run delivery: $(sed -n 's/.*cpu_us_per_delivery=\([0-9.]*\).*/\1/p' "$work/fanout.out") µs of relay CPU each (10,000 × 20 at 1/s)"
done
