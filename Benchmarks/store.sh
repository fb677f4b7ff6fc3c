#!/usr/bin/env bash
# store.kind sqlite against memory, alternately, each relay started fresh (sqlite on a new file in $TMPDIR):
#   fanout-5k-20     5,000 subscribers, 20 messages/s one by one (batches of 1), 200 messages
#   fanout-1k-b100   1,000 subscribers, 200 messages/s in batches of 100 (one answer, one commit each)
#   ramp-b1-R        10 subscribers, R messages/s one by one, for the highest sustained publish rate
#   ramp-b100-R      10 subscribers, R messages/s in batches of 100
# A rate is sustained when nothing is lost or repeated, the injector achieved 95 % of it and p99 stays below 1 s.
# Reports medians over RUNS of relay CPU per delivery (commits on the writer thread included), p50/p99 latency,
# deliveries/s. Relay on CPU 0, fixture and bench on CPU 1.
# Usage: Benchmarks/store.sh [RUNS=3] [SYNCHRONOUS=normal]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
synchronous=${2:-normal}
swift build -c release >/dev/null
bin=$(swift build -c release --show-bin-path)
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# run LABEL KIND BENCH-ARGS…: one fresh fixture and relay, one bench run, its SUMMARY line tagged.
run() {
  local label=$1 kind=$2
  shift 2
  taskset -c 1 "$bin/pollcast-legacy-fixture" --listen 127.0.0.1:0 --linked-user-id none >"$work/fixture.out" 2>/dev/null &
  local fixture_pid=$!
  until grep -q listening "$work/fixture.out" 2>/dev/null; do sleep 0.05; done
  local fixture
  fixture=$(head -1 "$work/fixture.out" | sed 's/listening on //')
  rm -f "$work"/store.db*
  taskset -c 0 "$bin/pollcast" --listen 127.0.0.1:0 --upstream-url "http://$fixture" --upstream-api-key dev-key \
    --store-kind "$kind" --store-path "$work/store.db" --store-synchronous "$synchronous" \
    --log-level warning >"$work/relay.out" 2>"$work/relay.err" &
  local pid=$!
  until grep -q listening "$work/relay.out" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "the relay did not start: $(cat "$work/relay.err")" >&2; exit 1; }
    sleep 0.05
  done
  local relay
  relay=$(head -1 "$work/relay.out" | sed 's/listening on //')
  taskset -c 1 "$bin/pollcast-bench" --target "http://$relay/events" --inject "fixture:http://$fixture" \
    --relay-pid "$pid" --label "$label-$kind" "$@" >"$work/bench.out" 2>&1 || true
  if ! kill "$pid" 2>/dev/null; then echo "$label $kind: the relay died:"; tail -30 "$work/relay.err"; fi
  wait "$pid" 2>/dev/null || true
  kill "$fixture_pid" 2>/dev/null || true
  wait "$fixture_pid" 2>/dev/null || true
  local summary
  summary=$(grep SUMMARY "$work/bench.out" || echo "SUMMARY failed=1")
  echo "$summary scenario=$label kind=$kind" | tee -a "$work/summaries.txt"
}

for round in $(seq 1 "$runs"); do
  for kind in memory sqlite; do
    run fanout-5k-20 "$kind" --subscribers 5000 --messages 200 --rate 20 --connect-batch 1000
    run fanout-1k-b100 "$kind" --subscribers 1000 --messages 2000 --rate 200 --batch 100 --drain-seconds 5
  done
done
for rate in 1000 2000 4000 8000; do
  for kind in memory sqlite; do run "ramp-b1-$rate" "$kind" --subscribers 10 --messages $((rate * 5)) --rate "$rate" --drain-seconds 5; done
done
for rate in 5000 10000 20000 40000; do
  for kind in memory sqlite; do
    run "ramp-b100-$rate" "$kind" --subscribers 10 --messages $((rate * 5)) --rate "$rate" --batch 100 --drain-seconds 5
  done
done
# The store's own ceiling, without a relay: one commit at a time as the upstream loop does.
for round in $(seq 1 "$runs"); do
  for sync in normal full; do
    for batch in 1 100; do
      taskset -c 0 "$bin/pollcast-bench" --mode store --store-path "$work/micro.db" --synchronous "$sync" \
        --batch "$batch" --messages $((batch == 1 ? 20000 : 200000)) | grep SUMMARY | tee -a "$work/micro.txt"
    done
  done
done
cp "$work/summaries.txt" "${STORE_BENCH_OUT:-/tmp/store-bench-summaries.txt}"
python3 - "$work/micro.txt" <<'PY'
import collections, statistics, sys
rows = [dict(f.split("=", 1) for f in line.split()[1:]) for line in open(sys.argv[1])]
groups = collections.defaultdict(list)
for row in rows:
    groups[(row["synchronous"], row["batch"])].append(row)
print("| synchronous | batch | commits/s | events/s | commit p50 (ms) | commit p99 (ms) | runs |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for (sync, batch), found in sorted(groups.items(), key=lambda g: (g[0][0] != "normal", int(g[0][1]))):
    med = lambda key: statistics.median(float(r[key]) for r in found)
    print(f"| {sync} | {batch} | {med('commits_per_s'):,.0f} | {med('events_per_s'):,.0f} | "
          f"{med('commit_p50_ms'):.3f} | {med('commit_p99_ms'):.3f} | {len(found)} |")
PY
python3 - "$work/summaries.txt" <<'PY'
import collections, statistics, sys
rows = [dict(f.split("=", 1) for f in line.split()[1:]) for line in open(sys.argv[1]) if "failed=1" not in line]
groups = collections.defaultdict(list)
for row in rows:
    groups[(row["scenario"], row["kind"])].append(row)
def med(scenario, kind, key):
    values = [float(r[key]) for r in groups[(scenario, kind)] if key in r]
    return statistics.median(values) if values else float("nan")
print("| scenario | metric | memory | sqlite | sqlite / memory | runs |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for scenario in ["fanout-5k-20", "fanout-1k-b100"]:
    for key, name in [("cpu_us_per_delivery", "relay CPU per delivery (µs)"), ("p50_ms", "latency p50 (ms)"),
                      ("p99_ms", "latency p99 (ms)"), ("deliveries_per_s", "deliveries/s"), ("lost", "lost"),
                      ("dup", "duplicated")]:
        m, s = med(scenario, "memory", key), med(scenario, "sqlite", key)
        ratio = f"{s / m:.2f}" if m else "–"
        print(f"| {scenario} | {name} | {m:g} | {s:g} | {ratio} | {len(groups[(scenario, 'sqlite')])} |")
def sustained(row):
    return (int(row.get("lost", 1)) == 0 and int(row.get("dup", 1)) == 0
            and float(row.get("achieved_rate", 0)) >= 0.95 * float(row["rate"]) and float(row.get("p99_ms", 1e9)) < 1000)
for prefix in ["ramp-b1-", "ramp-b100-"]:
    for kind in ["memory", "sqlite"]:
        best = 0
        for (scenario, k), found in sorted(groups.items()):
            if k == kind and scenario.startswith(prefix) and all(sustained(r) for r in found):
                best = max(best, float(scenario[len(prefix):]))
        steps = sorted(((float(s[len(prefix):]), r) for (s, k), r in groups.items()
                        if k == kind and s.startswith(prefix)), key=lambda step: step[0])
        details = ", ".join(f"{rate:g}/s: achieved {float(r[0].get('achieved_rate', 'nan')):g}/s, "
                            f"p99 {float(r[0].get('p99_ms', 'nan')):.1f} ms, lost {r[0].get('lost', '?')}, "
                            f"{float(r[0].get('cpu_us_per_delivery', 'nan')):.1f} µs/delivery"
                            for rate, r in steps)
        print(f"highest sustained {prefix.rstrip('-')} {kind}: {best:g} messages/s   ({details})")
PY
