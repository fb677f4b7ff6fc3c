# Sourced by the benchmark scripts: starting the servers they measure, one way for all of them.

# Prints the address in the first "listening on ADDRESS" line of FILE once it appears (10 s at most).
wait_line() { for _ in $(seq 1 200); do grep -q "listening on" "$1" 2>/dev/null && { head -1 "$1" | sed 's/listening on //'; return 0; }; sleep 0.05; done; return 1; }

# start_relay BIN WORK: a fresh fixture on CPU 1 and a fresh relay in front of it on CPU 0, ready. Appends both pids
# to STARTED_PIDS as each starts (so a caller's cleanup stops them even when a start fails), and sets RELAY_PID,
# TARGET (the relay's /events) and INJECT (the bench's --inject for the fixture).
start_relay() {
  local bin=$1 work=$2 fixture relay
  "$bin/pollcast-legacy-fixture" --listen 127.0.0.1:0 >"$work/fixture.out" 2>/dev/null &
  STARTED_PIDS+=($!)
  taskset -p -c 1 $! >/dev/null
  fixture=$(wait_line "$work/fixture.out")
  taskset -c 0 "$bin/pollcast" --listen 127.0.0.1:0 --upstream-url "http://$fixture" --upstream-api-key dev-key \
    --log-level warning --ring-max-events 50000 >"$work/relay.out" 2>"$work/relay.log" &
  RELAY_PID=$!
  STARTED_PIDS+=($RELAY_PID)
  relay=$(wait_line "$work/relay.out")
  for _ in $(seq 1 100); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$relay/readyz")" = 200 ] && break; sleep 0.05; done
  TARGET="http://$relay/events"; INJECT="fixture:http://$fixture"
}
