#!/usr/bin/env bash
# Per-user relaying (auth.mode = upstream): ACCOUNTS accounts × 2 subscribers each on the fixture, messages to
# random accounts at RATE per second. Reports polls in flight per account (fixture stats, must stay ≤ 1), relay
# CPU per delivery, RSS per active account and per further subscriber, p50/p99 latency, and relay CPU idle with
# every account's poll hanging. Relay on CPU 0, fixture and bench on CPU 1.
# Usage: Benchmarks/accounts.sh [RUNS=3] [ACCOUNTS=2000] [RATE=100] [MESSAGES=3000] [IDLE_SECONDS=60] [STORE=memory]
#        [ADAPTER=chat]
# IDLE_SECONDS must be longer than two poll holds (HOLD, default 25 s) for the idle figure to include re-polls: the
# script refuses a shorter one. HOLD sets both the relay's poll timeout and the fixture's longest hold.
# FIXTURE_ARGS adds fixture options, e.g. FIXTURE_ARGS="--answer-delay-ms 200" (a slow legacy API) or
# "--stall-fraction 0.5" (half the accounts' polls never answered; the bench then sends no message to them).
# ADAPTER=generic polls the fixture's single-stream /api/feed with each subscriber's key as a Bearer header (the
# generic adapter, a built-in recipe since issue 22) instead of the chat API's session/poll.
# STORE=sqlite keeps every account's ring, ids and cursors in a fresh SQLite file per run.
# UPSTREAM_HOST=localhost has the relay address the fixture by that name instead of 127.0.0.1 (as a relay in a
# container names its API: http://legacy:8081); the name must resolve to 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
accounts=${2:-2000}
rate=${3:-100}
messages=${4:-3000}
idle=${5:-60}
store=${6:-memory}
adapter=${7:-chat}
hold=${HOLD:-25}
# SUBSCRIBERS_PER_ACCOUNT (default 2): 1 lets more accounts fit under a file-descriptor limit (each account costs the
# relay one upstream connection and one per subscriber; this machine's hard RLIMIT_NOFILE is 20,000 per process).
per_account=${SUBSCRIBERS_PER_ACCOUNT:-2}
read -r -a fixture_args <<<"${FIXTURE_ARGS:-}"
# The bench must know which accounts the fixture stalls (their messages are never answered, by design).
bench_extra=()
for ((i = 0; i < ${#fixture_args[@]}; i++)); do
  if [ "${fixture_args[$i]}" = --stall-fraction ]; then bench_extra+=(--stall-fraction "${fixture_args[$((i + 1))]}"); fi
done
# LAG_SAMPLE_MS: scrape the relay's loop lag every MS ms in the idle and message phases (each scrape costs the
# relay a /metrics render, which the idle CPU figure then includes): reports lag_max_idle_ms, lag_max_messages_ms.
if [ -n "${LAG_SAMPLE_MS:-}" ]; then bench_extra+=(--lag-sample-ms "$LAG_SAMPLE_MS"); fi
# CONNECT_SPREAD: open one subscriber per account evenly over this many seconds, as users arrive (default 15, one
# heartbeat interval: as evenly as arrivals at random times). 0 connects in batches of 200 as fast as the relay takes
# them (the method before 2026-12-07): every account's timers and polls then start within a few bursts and wake the
# relay a few times an interval instead of once per account, which hid two thirds of the idle cost (0.65 against
# 1.98 % of a core at 2,000 accounts, same build).
connect_spread=${CONNECT_SPREAD:-15}
if [ "$connect_spread" != 0 ]; then bench_extra+=(--connect-spread "$connect_spread"); fi
# LOOP_PROBE_MS: the relay's loop probe interval (server.loop_probe_ms, default 500). Any stall longer than it is
# counted: with LAG_SAMPLE_MS the bench reports the probe ticks late by over 10 / 15 / 20 / 50 ms in each phase
# (probe_late_over_15ms_idle, probe_late_over_15ms_messages: with LOOP_PROBE_MS=5, 0 means no stall over 20 ms).
# Each tick wakes the relay, which the idle figure then includes.
relay_extra=()
if [ -n "${LOOP_PROBE_MS:-}" ]; then relay_extra+=(--server-loop-probe-ms "$LOOP_PROBE_MS"); fi
if ! python3 -c "import sys; sys.exit(0 if float('$idle') > 2 * float('$hold') else 1)"; then
  echo "IDLE_SECONDS ($idle) must be longer than two poll holds (2 × $hold s): the idle figure would hold no re-poll" >&2
  exit 64
fi
# The relay re-reads a silent stream's newest ids once upstream.resync_interval_seconds (60) have passed since the
# last sync, at its next empty poll: an idle window shorter than that plus one hold holds no such sync, and the
# message phase that follows then holds the first wave of them (every account connected at once).
if ! python3 -c "import sys; sys.exit(0 if float('$idle') >= 60 + float('$hold') else 1)"; then
  echo "note: the idle window ($idle s) holds no periodic cursor sync (60 s + one hold); the message phase holds" \
    "the first wave of them. An IDLE_SECONDS of 60 + 4 holds (160 with HOLD 25) measures idle with them." >&2
fi
# BENCH_BIN_DIR: another build's bin directory (an A/B against an older commit); default this tree's release build.
if [ -n "${BENCH_BIN_DIR:-}" ]; then
  bin=$BENCH_BIN_DIR
else
  swift build -c release >/dev/null
  bin=$(swift build -c release --show-bin-path)
fi
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for run in $(seq 1 "$runs"); do
  taskset -c 1 "$bin/pollcast-legacy-fixture" --listen 127.0.0.1:0 --accounts "$accounts" \
    --max-poll-timeout "$hold" ${fixture_args[@]+"${fixture_args[@]}"} >"$work/fixture.out" 2>/dev/null &
  fixture_pid=$!
  until grep -q listening "$work/fixture.out" 2>/dev/null; do sleep 0.05; done
  fixture=$(head -1 "$work/fixture.out" | sed 's/listening on //')
  api=$fixture
  if [ -n "${UPSTREAM_HOST:-}" ]; then api="$UPSTREAM_HOST:${fixture##*:}"; fi
  rm -f "$work"/store.db*
  upstream=(--upstream-url "http://$api" --upstream-poll-timeout-seconds "$hold")
  if [ "$adapter" = generic ]; then
    upstream=(--upstream-adapter generic --generic-url-template "http://$api/api/feed?after={cursor}&timeout=$hold"
      --generic-events-pointer /data/items --generic-id-pointer /seq --generic-headers "Authorization: Bearer {credential}")
  fi
  taskset -c 0 "$bin/pollcast" --listen 127.0.0.1:0 "${upstream[@]}" --auth-mode upstream "${relay_extra[@]}" \
    --store-kind "$store" --store-path "$work/store.db" --log-level warning >"$work/relay.out" 2>"$work/relay.err" &
  pid=$!
  until grep -q listening "$work/relay.out" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "the relay did not start: $(cat "$work/relay.err")" >&2; exit 1; }
    sleep 0.05
  done
  relay=$(head -1 "$work/relay.out" | sed 's/listening on //')
  taskset -c 1 "$bin/pollcast-bench" --target "http://$relay/events" --inject "fixture:http://$fixture" \
    --accounts "$accounts" --subscribers $((accounts * per_account)) --messages "$messages" --rate "$rate" \
    --idle-seconds "$idle" --connect-batch 200 --sources 16 --relay-pid "$pid" --label "accounts" ${bench_extra[@]+"${bench_extra[@]}"} >"$work/bench.out" 2>&1 || true
  grep -v '^SUMMARY' "$work/bench.out" | sed "s/^/run $run: /"
  if ! kill "$pid" 2>/dev/null; then echo "run $run: the relay died:"; tail -30 "$work/relay.err"; fi
  wait "$pid" 2>/dev/null || true
  kill "$fixture_pid" 2>/dev/null || true
  wait "$fixture_pid" 2>/dev/null || true
  grep SUMMARY "$work/bench.out" >>"$work/summaries.txt" || echo "run $run: no summary"
done
python3 - "$work/summaries.txt" <<'PY'
import statistics, sys
rows = [dict(f.split("=", 1) for f in line.split()[1:]) for line in open(sys.argv[1])]
def med(key):
    values = [float(r[key]) for r in rows if key in r]
    return statistics.median(values) if values else float("nan")
print(f"runs {len(rows)}: median over runs")
for key in ["max_polls_per_account", "lost", "dup", "foreign", "cpu_us_per_delivery", "p50_ms", "p99_ms",
            "rss_kb_per_account", "rss_kb_per_extra_sub", "idle_cpu_pct", "lag_max_idle_ms", "lag_max_messages_ms", "deliveries", "connected", "sessions", "fixture_polls", "fixture_syncs"]:
    print(f"  {key}: {med(key):g}   (runs: {', '.join(r.get(key, '?') for r in rows)})")
PY
