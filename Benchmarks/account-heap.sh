#!/usr/bin/env bash
# What a per-user account holds, by owner: the relay under heaptrack (Debian `heaptrack`) with ACCOUNTS accounts of
# one subscriber each, a message to each in turn, then the live heap at the steady state, grouped by libcurl (per
# transfer and per multi handle), Swift task slabs (each account's suspended poll cycle), libevent, and the rest;
# then the allocations a message costs (one answered poll, one delivery), by the first owner named in their stacks
# (in the order listed: an allocation under both the feed and the event loop counts for the feed).
# Usage: Benchmarks/account-heap.sh [ACCOUNTS=2000]
set -euo pipefail
cd "$(dirname "$0")/.."
accounts=${1:-2000}
rate=200  # messages a second, one to each account in turn
command -v heaptrack >/dev/null || { echo "needs heaptrack (apt-get install heaptrack)" >&2; exit 69; }
swift build -c release >/dev/null
bin=$(swift build -c release --show-bin-path)
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
"$bin/pollcast-legacy-fixture" --listen 127.0.0.1:0 --accounts "$accounts" --max-poll-timeout 25 >"$work/fixture.out" 2>/dev/null &
until grep -q listening "$work/fixture.out" 2>/dev/null; do sleep 0.05; done
fixture=$(head -1 "$work/fixture.out" | sed 's/listening on //')
heaptrack -o "$work/relay" "$bin/pollcast" --listen 127.0.0.1:0 --upstream-url "http://$fixture" \
  --upstream-poll-timeout-seconds 25 --auth-mode upstream --log-level warning >"$work/relay.out" 2>"$work/relay.err" &
tracker=$!
until grep -q "listening on" "$work/relay.out" 2>/dev/null; do sleep 0.1; done
relay=$(grep "listening on" "$work/relay.out" | head -1 | sed 's/.*listening on //')
pid=$(pgrep -f "^$bin/pollcast --listen" | head -1)
started=$(date +%s.%N)
"$bin/pollcast-bench" --target "http://$relay/events" --inject "fixture:http://$fixture" --accounts "$accounts" \
  --subscribers "$accounts" --messages "$accounts" --rate "$rate" --idle-seconds 0 --connect-batch 200 --sources 16 \
  --relay-pid "$pid" --label heap | grep -E "deliveries|lost" || true
at_ms=$(python3 -c "import time; print(int((time.time() - $started) * 1000) - 500)")
kill -INT "$pid"
# The relay is heaptrack's child, not this shell's: heaptrack writes its recording after the relay exits.
wait "$tracker" 2>/dev/null || true
recording=$(ls "$work"/relay*.zst)
echo "accounts: $accounts (one subscriber each); live heap near the end of the run, by owner:"
python3 Benchmarks/heap_live.py "$recording" "$at_ms" curl_multi_socket_action curl_easy_init StackAllocator \
  bufferevent_socket_new swift_task_create SSEConnection
echo "task-allocator slabs by what opened them (two per account since the thirteenth step: the frames of the hanging poll's chain):"
python3 Benchmarks/heap_live.py --slabs "$recording" "$at_ms"
echo "allocations per message over the last 70 % of the message phase (one answered poll and one delivery each), by owner:"
python3 Benchmarks/heap_live.py --allocations "$recording" $((at_ms - 700 * accounts / rate)) "$at_ms" "$rate" RecipeAnswer \
  RawJSON evhttp KeepAliveConnection UpstreamClient RecipeAdapter Feed UpstreamWorker CursorBook SSEConnection EventLoop
