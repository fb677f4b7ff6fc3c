#!/usr/bin/env bash
# Runs docker/compose.yaml with a real Docker engine, with compose v1 (`docker-compose`, Debian 12's) or v2
# (`docker compose`), whichever is there (COMPOSE overrides): the default stack streams on 8080; in the cluster
# profile nginx starts while a relay is down, and a client through nginx keeps every message exactly once across
# a kill -9 of the lease holder (which the restart policy brings back) and the late relay joining.
# Expects pollcast:dev built (docker/check-image.sh); builds the cluster's helper images with --network host.
set -euo pipefail
cd "$(dirname "$0")/.."
export DOCKER_BUILDKIT=0
docker=${DOCKER:-/usr/bin/docker}
[ -x "$docker" ] || docker=$(command -v docker)
if [ -n "${COMPOSE:-}" ]; then read -r -a compose <<<"$COMPOSE"
elif command -v docker-compose >/dev/null; then compose=(docker-compose)
else compose=("$docker" compose); fi
project=pcheck$$
dc() { "${compose[@]}" -f docker/compose.yaml -p "$project" "$@"; }
fail() { echo "compose check FAILED: $*" >&2; dc --profile cluster logs --tail 20 >&2 || true; exit 1; }
cleanup() { dc --profile cluster down -v --remove-orphans >/dev/null 2>&1 || true; }
trap cleanup EXIT
echo "compose check: using ${compose[*]} ($("${compose[@]}" version --short 2>/dev/null || echo unknown))"
"$docker" image inspect pollcast:dev >/dev/null 2>&1 || fail "pollcast:dev is not built (run docker/check-image.sh)"
for target in redis lb; do
  "$docker" build --network host -f docker/cluster/Dockerfile --target "$target" -t "pollcast-$target:dev" . \
    >/tmp/pollcast-$target-build.log 2>&1 || { tail -20 /tmp/pollcast-$target-build.log >&2; fail "build $target"; }
done

wait_http() { # URL, seconds
  for _ in $(seq 1 $(($2 * 5))); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.2; done
  return 1
}
container() { dc --profile cluster ps -q "$1"; }
in_node() { "$docker" exec "$(container "$1")" curl -s "http://127.0.0.1:8080$2" 2>/dev/null || true; }

# The default stack: the fixture and one relay on SQLite, streaming on 8080.
dc up -d --no-build >/dev/null 2>&1 || fail "up (default stack)"
wait_http http://127.0.0.1:8080/readyz 60 || fail "the default stack's relay did not become ready on 8080"
summary=$(python3 docker/sse-reader.py http://127.0.0.1:8080/events 5)
count=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["messages"]))' "$summary")
[ "$count" -ge 1 ] || fail "the default stack streamed nothing in 5 s"
echo "compose check: default stack streams on 8080 ($count events in 5 s)"
# The relay names its API (http://legacy:8081, resolved by Docker's DNS): after libcurl's first request, its polls go
# over the kept-alive connection to the address libcurl reached.
metrics=$(curl -fsS http://127.0.0.1:8080/metrics) || fail "no /metrics from the default stack's relay"
kept=$(sed -n 's/^pollcast_upstream_requests_total{client="kept_alive"} //p' <<<"$metrics")
through=$(sed -n 's/^pollcast_upstream_requests_total{client="libcurl"} //p' <<<"$metrics")
[ "${kept:-0}" -ge 1 ] || fail "the relay never polled legacy:8081 over a kept-alive connection (libcurl: ${through:-?})"
echo "compose check: legacy:8081 polled over a kept-alive connection ($kept requests; $through through libcurl)"
dc down -v >/dev/null 2>&1

# The cluster: relay-3 is down when nginx starts.
dc --profile cluster up -d --no-build redis legacy relay-1 relay-2 >/dev/null 2>&1 || fail "up (cluster)"
for node in relay-1 relay-2; do
  for _ in $(seq 1 150); do [[ $(in_node "$node" /healthz) == *ok* || $(in_node "$node" /healthz) == *alive* ]] && break; sleep 0.2; done
done
dc --profile cluster up -d --no-build --no-deps lb >/dev/null 2>&1 || fail "up lb"
wait_http http://127.0.0.1:8090/readyz 60 || fail "nginx did not serve with relay-3 down"
echo "compose check: nginx started and serves with relay-3 down"
python3 docker/sse-reader.py http://127.0.0.1:8090/events 32 >/tmp/pollcast-compose-reader.json &
reader=$!
sleep 6
leader=""
for node in relay-1 relay-2; do [[ $(in_node "$node" /readyz) == *leader* ]] && leader=$node; done
[ -n "$leader" ] || fail "no relay says it leads"
pid=$("$docker" inspect -f '{{.State.Pid}}' "$(container "$leader")")
kill -9 "$pid"
echo "compose check: kill -9 of the lease holder $leader"
sleep 4
dc --profile cluster up -d --no-build --no-deps relay-3 >/dev/null 2>&1 || fail "up relay-3"
echo "compose check: relay-3 joined"
sleep 4
# Whichever node the client sits on now is killed too, so the client always has to resume through nginx.
holder=""
for node in relay-1 relay-2 relay-3; do
  [[ $(in_node "$node" /metrics) == *"pollcast_subscribers_connected 1"* ]] && holder=$node
done
[ -n "$holder" ] || fail "no node holds the client's stream"
kill -9 "$("$docker" inspect -f '{{.State.Pid}}' "$(container "$holder")")"
echo "compose check: kill -9 of $holder, the node the client was reading from"
wait "$reader"
restarts=$("$docker" inspect -f '{{.RestartCount}}' "$(container "$leader")")
[ "$restarts" -ge 1 ] || fail "$leader was not restarted by its policy"
echo "compose check: $leader was restarted by its restart policy ($restarts)"
python3 - /tmp/pollcast-compose-reader.json <<'PY' || fail "the client through nginx lost or repeated something"
import json, sys
summary = json.load(open(sys.argv[1]))
ids = [m[1] for m in summary["messages"] if m[0] == "101"]
assert summary["resets"] == 0, f"reset: {summary['resets']}"
assert len(ids) >= 5, f"only {len(ids)} messages in 30 s"
assert summary["connections"] >= 2, f"the client never had to resume: {summary['connections']} connection(s)"
assert ids == list(range(ids[0], ids[0] + len(ids))), f"gap or duplicate: {ids}"
assert summary["sse_ids"] == sorted(set(summary["sse_ids"])), "SSE ids not strictly increasing"
print(f"compose check: through nginx, {len(ids)} messages exactly once (upstream ids {ids[0]}..{ids[-1]}) over"
      f" {summary['connections']} connections, no reset")
PY
echo "compose check: passed"
