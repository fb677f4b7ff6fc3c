#!/usr/bin/env bash
# Per-user relaying on several nodes (auth.mode = upstream, store.kind = redis): NODES relays on one redis-server
# and the fixture with ACCOUNTS accounts, 2 subscribers per account on two different nodes, messages to random
# accounts at RATE per second. Two kinds of run, alternately:
#   steady   nothing goes wrong: relay CPU per delivery (all nodes summed), Redis CPU per message, p50/p99
#   kill     halfway through the messages the node holding the most account leases is killed with kill -9; its
#            subscribers reconnect to the next node with their Last-Event-ID (no CPU figures: a node is gone)
# Both report polls in flight per account (fixture stats, must stay <= 1 cluster-wide) and lost/dup/foreign.
# Relays on CPU 0; redis-server, fixture and bench on CPU 1 (2-core machine).
# Usage: Benchmarks/accounts-cluster.sh [RUNS=3] [ACCOUNTS=600] [RATE=100] [MESSAGES=3000] [NODES=3]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
accounts=${2:-600}
rate=${3:-100}
messages=${4:-3000}
nodes=${5:-3}
swift build -c release >/dev/null
bin=$(swift build -c release --show-bin-path)
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
ticks=$(getconf CLK_TCK)
cpu_seconds() { awk -v t="$ticks" '{ printf "%.3f", ($14 + $15) / t }' "/proc/$1/stat"; }

run() {
  local kind=$1
  taskset -c 1 "$bin/pollcast-legacy-fixture" --listen 127.0.0.1:0 --accounts "$accounts" >"$work/fixture.out" 2>/dev/null &
  local fixture_pid=$!
  until grep -q listening "$work/fixture.out" 2>/dev/null; do sleep 0.05; done
  local fixture
  fixture=$(head -1 "$work/fixture.out" | sed 's/listening on //')
  rm -rf "$work/redis" && mkdir -p "$work/redis"
  local socket="$work/redis/redis.sock"
  taskset -c 1 redis-server --port 0 --unixsocket "$socket" --save "" --appendonly yes \
    --dir "$work/redis" --logfile "$work/redis/log" &
  local redis_pid=$!
  until [ -S "$socket" ]; do sleep 0.05; done
  local pids=() targets=()
  for node in $(seq 1 "$nodes"); do
    taskset -c 0 "$bin/pollcast" --listen 127.0.0.1:0 --upstream-url "http://$fixture" --auth-mode upstream \
      --store-kind redis --store-redis-url "unix://$socket" --store-node-id "node-$node" \
      --log-level warning >"$work/relay-$node.out" 2>"$work/relay-$node.err" &
    pids+=($!)
  done
  for node in $(seq 1 "$nodes"); do
    until grep -q listening "$work/relay-$node.out" 2>/dev/null; do
      kill -0 "${pids[$((node - 1))]}" 2>/dev/null || { echo "relay $node did not start: $(cat "$work/relay-$node.err")" >&2; exit 1; }
      sleep 0.05
    done
    targets+=("http://$(head -1 "$work/relay-$node.out" | sed 's/listening on //')/events")
  done
  local redis_before
  redis_before=$(cpu_seconds "$redis_pid")
  # Line-buffered, so the kill below can wait for the bench's "polls hanging" line.
  taskset -c 1 stdbuf -oL "$bin/pollcast-bench" --target "$(IFS=,; echo "${targets[*]}")" --inject "fixture:http://$fixture" \
    --accounts "$accounts" --subscribers $((accounts * 2)) --messages "$messages" --rate "$rate" \
    --idle-seconds 5 --connect-batch 200 --sources 16 --drain-seconds 15 \
    --relay-pid "$(IFS=,; echo "${pids[*]}")" --label "accounts-cluster-$kind" >"$work/bench.out" 2>&1 &
  local bench_pid=$!
  local killed="none"
  if [ "$kind" = kill ]; then
    until grep -q 'fixture polls hanging' "$work/bench.out" 2>/dev/null; do sleep 0.1; done
    sleep "$(awk -v m="$messages" -v r="$rate" 'BEGIN { print 5 + m / r / 2 }')"
    # The node holding the most account leases.
    local best=0 count
    for node in $(seq 1 "$nodes"); do
      count=$(redis-cli -s "$socket" --scan --pattern 'pollcast{account:*}:lease' \
        | while read -r key; do redis-cli -s "$socket" GET "$key"; done | grep -c "^node-$node/" || true)
      if [ "$count" -gt "$best" ]; then best=$count; killed=$node; fi
    done
    [ "$killed" != none ] && kill -9 "${pids[$((killed - 1))]}"
    killed="node-$killed:$best-leases"
  fi
  wait "$bench_pid" || true
  local redis_after
  redis_after=$(cpu_seconds "$redis_pid")
  grep -v '^SUMMARY' "$work/bench.out" | sed "s/^/$kind: /"
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  kill "$redis_pid" "$fixture_pid" 2>/dev/null || true
  wait "$redis_pid" "$fixture_pid" 2>/dev/null || true
  local summary
  summary=$(grep SUMMARY "$work/bench.out" || echo "SUMMARY failed=1")
  echo "$summary run=$kind killed=$killed redis_cpu_s=$(awk -v a="$redis_after" -v b="$redis_before" 'BEGIN { printf "%.3f", a - b }')" \
    | tee -a "$work/summaries.txt"
}

for round in $(seq 1 "$runs"); do
  run steady
  run kill
done
cp "$work/summaries.txt" "${ACCOUNTS_CLUSTER_OUT:-/tmp/accounts-cluster-summaries.txt}"
python3 - "$work/summaries.txt" "$messages" <<'PY'
import collections, statistics, sys
rows = [dict(f.split("=", 1) for f in line.split()[1:] if "=" in f) for line in open(sys.argv[1])]
messages = float(sys.argv[2])
groups = collections.defaultdict(list)
for row in rows:
    groups[row.get("run", "?")].append(row)
for run, group in groups.items():
    print(f"{run}: {len(group)} runs, median (all runs)")
    for row in group:
        row["redis_cpu_us_per_msg"] = str(float(row.get("redis_cpu_s", "nan")) / messages * 1e6)
    for key in ["max_polls_per_account", "lost", "dup", "foreign", "cpu_us_per_delivery", "redis_cpu_us_per_msg",
                "p50_ms", "p99_ms", "deliveries", "connected", "sessions", "killed"]:
        values = [row.get(key, "?") for row in group]
        try:
            median = f"{statistics.median(float(v) for v in values if v != '?'):g}"
        except (ValueError, statistics.StatisticsError):
            median = "-"
        print(f"  {key}: {median}   (runs: {', '.join(values)})")
PY
