#!/usr/bin/env bash
# store.kind redis: the same fan-out on 1 relay and on 3 relays sharing one redis-server, and on 1 relay with
# store.kind memory (the baseline), alternately, everything started fresh each run:
#   fanout-5k-20     5,000 subscribers (spread round-robin over the nodes), 20 messages/s one by one, 200 messages
#   fanout-1k-b100   1,000 subscribers, 200 messages/s in batches of 100
# Reports medians over RUNS of the relays' CPU per delivery (all nodes summed), p50/p99 latency, and Redis's own
# CPU (per message and in total). Relays on CPU 0; redis-server, fixture and bench on CPU 1 (2-core machine).
# Usage: Benchmarks/cluster.sh [RUNS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
swift build -c release >/dev/null
bin=$(swift build -c release --show-bin-path)
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
ticks=$(getconf CLK_TCK)
cpu_seconds() { awk -v t="$ticks" '{ printf "%.3f", ($14 + $15) / t }' "/proc/$1/stat"; }

# run LABEL KIND NODES BENCH-ARGS…: fresh fixture, redis and NODES relays, one bench run, its SUMMARY line tagged.
run() {
  local label=$1 kind=$2 nodes=$3
  shift 3
  taskset -c 1 "$bin/pollcast-legacy-fixture" --listen 127.0.0.1:0 --linked-user-id none >"$work/fixture.out" 2>/dev/null &
  local fixture_pid=$!
  until grep -q listening "$work/fixture.out" 2>/dev/null; do sleep 0.05; done
  local fixture
  fixture=$(head -1 "$work/fixture.out" | sed 's/listening on //')
  rm -rf "$work/redis" && mkdir -p "$work/redis"
  taskset -c 1 redis-server --port 0 --unixsocket "$work/redis/redis.sock" --save "" --appendonly yes \
    --dir "$work/redis" --logfile "$work/redis/log" &
  local redis_pid=$!
  until [ -S "$work/redis/redis.sock" ]; do sleep 0.05; done
  local pids=() targets=()
  for node in $(seq 1 "$nodes"); do
    taskset -c 0 "$bin/pollcast" --listen 127.0.0.1:0 --upstream-url "http://$fixture" --upstream-api-key dev-key \
      --store-kind "$kind" --store-redis-url "unix://$work/redis/redis.sock" --store-node-id "node-$node" \
      --log-level warning >"$work/relay-$node.out" 2>"$work/relay-$node.err" &
    pids+=($!)
  done
  for node in $(seq 1 "$nodes"); do
    until grep -q listening "$work/relay-$node.out" 2>/dev/null; do
      kill -0 "${pids[$((node - 1))]}" 2>/dev/null || { echo "relay $node did not start: $(cat "$work/relay-$node.err")" >&2; exit 1; }
      sleep 0.05
    done
    targets+=("http://$(head -1 "$work/relay-$node.out" | sed 's/listening on //')/events")
    # Every node follows (or leads) before the run starts.
    until curl -fsS "${targets[-1]%/events}/readyz" >/dev/null 2>&1; do sleep 0.05; done
  done
  local redis_before
  redis_before=$(cpu_seconds "$redis_pid")
  taskset -c 1 "$bin/pollcast-bench" --target "$(IFS=,; echo "${targets[*]}")" --inject "fixture:http://$fixture" \
    --relay-pid "$(IFS=,; echo "${pids[*]}")" --label "$label-$kind-$nodes" "$@" >"$work/bench.out" 2>&1 || true
  local redis_after
  redis_after=$(cpu_seconds "$redis_pid")
  for pid in "${pids[@]}"; do
    if ! kill "$pid" 2>/dev/null; then echo "$label: a relay died:"; tail -30 "$work"/relay-*.err; fi
    wait "$pid" 2>/dev/null || true
  done
  kill "$redis_pid" "$fixture_pid" 2>/dev/null || true
  wait "$redis_pid" "$fixture_pid" 2>/dev/null || true
  local summary
  summary=$(grep SUMMARY "$work/bench.out" || echo "SUMMARY failed=1")
  echo "$summary scenario=$label kind=$kind nodes=$nodes redis_cpu_s=$(awk -v a="$redis_after" -v b="$redis_before" 'BEGIN { printf "%.3f", a - b }')" \
    | tee -a "$work/summaries.txt"
}

for round in $(seq 1 "$runs"); do
  for setup in "memory 1" "redis 1" "redis 3"; do
    # shellcheck disable=SC2086
    run fanout-5k-20 $setup --subscribers 5000 --messages 200 --rate 20 --connect-batch 1000
    # shellcheck disable=SC2086
    run fanout-1k-b100 $setup --subscribers 1000 --messages 2000 --rate 200 --batch 100 --drain-seconds 5
  done
done
cp "$work/summaries.txt" "${CLUSTER_BENCH_OUT:-/tmp/cluster-bench-summaries.txt}"
python3 - "$work/summaries.txt" <<'PY'
import collections, statistics, sys
rows = [dict(f.split("=", 1) for f in line.split()[1:] if "=" in f) for line in open(sys.argv[1])]
groups = collections.defaultdict(list)
for row in rows:
    groups[(row["scenario"], row["kind"], row["nodes"])].append(row)
def median(rows, key):
    values = [float(r[key]) for r in rows if key in r]
    return statistics.median(values) if values else float("nan")
print("| scenario | store | nodes | runs | lost | dup | p50 (ms) | p99 (ms) | relay CPU/delivery (µs, all nodes) | Redis CPU (s) | Redis CPU/message (µs) |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for (scenario, kind, nodes), rows in sorted(groups.items()):
    messages = median(rows, "messages") if any("messages" in r for r in rows) else float("nan")
    redis = median(rows, "redis_cpu_s")
    print(f"| {scenario} | {kind} | {nodes} | {len(rows)} | {max(int(r.get('lost', 0)) for r in rows)} | "
          f"{max(int(r.get('dup', 0)) for r in rows)} | {median(rows, 'p50_ms'):.1f} | {median(rows, 'p99_ms'):.1f} | "
          f"{median(rows, 'cpu_us_per_delivery'):.2f} | {redis:.2f} | {redis / messages * 1e6 if messages == messages else float('nan'):.0f} |")
PY
