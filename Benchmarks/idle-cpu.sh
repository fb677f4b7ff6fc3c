#!/usr/bin/env bash
# Relay CPU while idle: one long-poll hanging at the upstream (the fixture holds it for --hold seconds), no
# messages, optionally some idle SSE subscribers. Prints the relay's CPU time over the window as a share of one
# core. Usage: Benchmarks/idle-cpu.sh [SECONDS=60] [SUBSCRIBERS=0]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
subscribers=${2:-0}
swift build -c release --product pollcast >/dev/null
swift build -c release --product pollcast-legacy-fixture >/dev/null
bin=$(swift build -c release --show-bin-path)
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
"$bin/pollcast-legacy-fixture" --listen 127.0.0.1:0 >"$work/fixture.out" 2>/dev/null &
until grep -q listening "$work/fixture.out" 2>/dev/null; do sleep 0.05; done
fixture=$(head -1 "$work/fixture.out" | sed 's/listening on //')
"$bin/pollcast" --listen 127.0.0.1:0 --upstream-url "http://$fixture" --upstream-api-key dev-key \
  --upstream-poll-timeout-seconds 50 --log-level warning >"$work/relay.out" 2>/dev/null &
relay_pid=$!
until grep -q listening "$work/relay.out" 2>/dev/null; do sleep 0.05; done
relay=$(head -1 "$work/relay.out" | sed 's/listening on //')
for _ in $(seq 1 "$subscribers"); do curl -sN "http://$relay/events" >/dev/null & done
sleep 2
ticks() { awk '{print $14 + $15}' "/proc/$relay_pid/stat"; }
hz=$(getconf CLK_TCK)
before=$(ticks)
sleep "$seconds"
after=$(ticks)
polls=$(curl -s "http://$fixture/_control/stats")
awk -v b="$before" -v a="$after" -v hz="$hz" -v s="$seconds" -v n="$subscribers" 'BEGIN {
  cpu = (a - b) / hz; printf "relay CPU over %d s with one hanging poll and %d idle subscribers: %.3f s = %.3f%% of one core\n", s, n, cpu, 100 * cpu / s }'
echo "fixture stats: $polls"
