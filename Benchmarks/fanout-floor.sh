#!/usr/bin/env bash
# The shared feed's fan-out against its physical floor (issue 23): the same pollcast-bench scenario against the relay
# (fed by the reference fixture) and against `fanout-floor.c` (an epoll server that frames each event once and sends
# it to each socket, fed by the bench's publish requests), alternating, each server started fresh for every run and
# pinned to CPU 0, the bench and the fixture on CPU 1. Prints every run's CPU per delivery, the medians, and the
# relay's figure as a multiple of the floor's.
#   Benchmarks/fanout-floor.sh [REPEATS=3] [BENCH ARGS…]   (default: --subscribers 1000 --messages 200 --rate 20)
#   BENCH_BIN_DIR=… uses that build of the relay (default: a release build of this checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
source Benchmarks/servers.sh
repeats=${1:-3}
shift || true
scenario=("$@")
[ ${#scenario[@]} -gt 0 ] || scenario=(--subscribers 1000 --messages 200 --rate 20)
if [ -z "${BENCH_BIN_DIR:-}" ]; then
  swift build -c release --product pollcast >/dev/null
  swift build -c release --product pollcast-bench >/dev/null
  swift build -c release --product pollcast-legacy-fixture >/dev/null
fi
bin=${BENCH_BIN_DIR:-$(swift build -c release --show-bin-path)}
work=$(mktemp -d /tmp/pollcast-fanout-floor.XXXXXX)
STARTED_PIDS=()
cleanup() { for pid in "${STARTED_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)"
cc -O2 -o "$work/fanout-floor" Benchmarks/fanout-floor.c

start_floor() {  # sets TARGET INJECT PID
  taskset -c 0 "$work/fanout-floor" >"$work/floor.out" 2>&1 &
  STARTED_PIDS+=($!); PID=$!
  local floor
  floor=$(wait_line "$work/floor.out")
  TARGET="http://$floor/events"; INJECT="publish:http://$floor/pub"
}

declare -A figures=([relay]="" [floor]="") users=([relay]="" [floor]="")
run() {  # relay|floor
  if [ "$1" = relay ]; then start_relay "$bin" "$work"; PID=$RELAY_PID; else start_floor; fi
  local line cpu
  line=$(taskset -c 1 "$bin/pollcast-bench" --target "$TARGET" --inject "$INJECT" --relay-pid "$PID" --label "$1" \
    "${scenario[@]}" 2>&1 | grep '^SUMMARY' || echo "SUMMARY label=$1 failed=1")
  for pid in "${STARTED_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  STARTED_PIDS=(); sleep 0.5
  echo "$line"
  cpu=$(sed -n 's/.*cpu_us_per_delivery=\([0-9.]*\).*/\1/p' <<<"$line")
  if [ -z "$cpu" ] || ! grep -q ' lost=0 ' <<<"$line " || ! grep -q ' dup=0 ' <<<"$line "; then
    echo "run failed, or lost or duplicated events: $line" >&2
    exit 1
  fi
  figures[$1]+="$cpu "
  users[$1]+="$(sed -n 's/.*cpu_user_share=\([0-9.]*\).*/\1/p' <<<"$line") "
}

for i in $(seq 1 "$repeats"); do
  # The order alternates between repeats, so neither server always runs first.
  if [ $((i % 2)) = 1 ]; then run relay; run floor; else run floor; run relay; fi
done
python3 - "${figures[relay]}" "${figures[floor]}" "${scenario[*]}" "${users[relay]}" "${users[floor]}" <<'EOF'
import statistics, sys
relay = [float(x) for x in sys.argv[1].split()]
floor = [float(x) for x in sys.argv[2].split()]
# The user-space part (CPU × the user share /proc reports): the kernel's part of a send is the same in both and
# carries most of this VM's noise.
relay_user = [c * float(u) for c, u in zip(relay, sys.argv[4].split())]
floor_user = [c * float(u) for c, u in zip(floor, sys.argv[5].split())]
r, f = statistics.median(relay), statistics.median(floor)
print(f"scenario: {sys.argv[3]}")
print("relay CPU per delivery (µs): " + " / ".join(f"{x:.3f}" for x in relay) + f"  median {r:.3f}")
print("floor CPU per delivery (µs): " + " / ".join(f"{x:.3f}" for x in floor) + f"  median {f:.3f}")
print(f"relay / floor: {r / f:.3f}x (medians); per pair: " +
      " / ".join(f"{a / b:.3f}" for a, b in zip(relay, floor)))
print(f"user-space CPU per delivery (µs): relay {statistics.median(relay_user):.2f}, "
      f"floor {statistics.median(floor_user):.2f} (medians)")
EOF
