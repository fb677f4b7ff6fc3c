#!/usr/bin/env bash
# Connect rate and relay CPU per connect with JWT verification (HS256, ES256) against auth.mode none: 10,000
# subscribers, each with its own token (so no verification is answered from the relay's cache), relay on CPU 0,
# bench on CPU 1. Prints each run and the medians. Usage: Benchmarks/jwt-connect.sh [RUNS=3] [SUBSCRIBERS=10000]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
subscribers=${2:-10000}
swift build -c release >/dev/null
bin=$(swift build -c release --show-bin-path)
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
openssl rand -hex 32 >"$work/secret"
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/ec.key" 2>/dev/null
openssl pkey -in "$work/ec.key" -pubout -out "$work/ec.pem"
"$bin/pollcast-legacy-fixture" --listen 127.0.0.1:0 >"$work/fixture.out" 2>/dev/null &
until grep -q listening "$work/fixture.out" 2>/dev/null; do sleep 0.05; done
fixture=$(head -1 "$work/fixture.out" | sed 's/listening on //')
measure() { # label, relay flags..., -- bench flags...
  local label=$1; shift
  local relay_flags=() bench_flags=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do relay_flags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  bench_flags=("$@")
  for run in $(seq 1 "$runs"); do
    taskset -c 0 "$bin/pollcast" --listen 127.0.0.1:0 --upstream-url "http://$fixture" --upstream-api-key dev-key \
      --log-level warning --server-max-connections-per-address 0 "${relay_flags[@]}" >"$work/relay.out" 2>"$work/relay.err" &
    local pid=$!
    until grep -q listening "$work/relay.out" 2>/dev/null; do
      kill -0 "$pid" 2>/dev/null || { echo "the relay did not start: $(cat "$work/relay.err")" >&2; exit 1; }
      sleep 0.05
    done
    local relay
    relay=$(head -1 "$work/relay.out" | sed 's/listening on //')
    taskset -c 1 "$bin/pollcast-bench" --target "http://$relay/events" --mode idle --idle-seconds 1 \
      --subscribers "$subscribers" --connect-batch 100 --sources 16 --relay-pid "$pid" "${bench_flags[@]}" >"$work/bench.out" 2>&1 || true
    if ! kill "$pid" 2>/dev/null; then echo "$label run $run: the relay died:"; tail -30 "$work/relay.err"; fi
    wait "$pid" 2>/dev/null || true
    local line
    line=$(grep SUMMARY "$work/bench.out" || echo "SUMMARY failed")
    echo "$label run $run: $(echo "$line" | grep -o 'connected=[0-9]*\|connects_per_s=[0-9.]*\|cpu_us_per_connect=[0-9.]*' | tr '\n' ' ')"
  done
}
{
  measure none
  measure HS256 --auth-mode jwt --auth-jwt-key-file "$work/secret" -- --mint-tokens "HS256:$work/secret"
  measure ES256 --auth-mode jwt --auth-jwt-algorithm ES256 --auth-jwt-key-file "$work/ec.pem" -- --mint-tokens "ES256:$work/ec.key"
} | tee "$work/runs.txt"
python3 - "$work/runs.txt" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) run \d+: connected=(\d+) connects_per_s=([\d.]+) cpu_us_per_connect=([\d.]+)", line)
    if m: rows.setdefault(m[1], []).append((float(m[3]), float(m[4])))
base = statistics.median(c for _, c in rows.get("none", [(0, 1)]))
for label, values in rows.items():
    rate = statistics.median(r for r, _ in values); cpu = statistics.median(c for _, c in values)
    print(f"median {label}: {rate:.0f} connects/s, {cpu:.1f} µs relay CPU per connect ({cpu / base:.2f} × none)")
PY
