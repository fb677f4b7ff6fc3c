#!/usr/bin/env bash
# Builds docker/Dockerfile with a real Docker engine and uses the image as a user would: the container streams an
# event from the reference fixture, is kill -9ed and restarted on its volume, a client resumes with Last-Event-ID
# with nothing lost or repeated, and `docker stop` ends it with exit 0. Needs a Docker engine (DOCKER_HOST), e.g.
#   eval "$(../shared/tools/docker-engine.sh)" && docker/check-image.sh
# Prints the build time, the image and binary sizes, and each check's outcome.
set -euo pipefail
cd "$(dirname "$0")/.."
export DOCKER_BUILDKIT=0
docker=${DOCKER:-/usr/bin/docker}
[ -x "$docker" ] || docker=$(command -v docker)
net=pollcast-check-$$
fail() { echo "image check FAILED: $*" >&2; for c in legacy relay; do echo "--- $c" >&2; "$docker" logs "$net-$c" 2>&1 | tail -20 >&2 || true; done; exit 1; }
cleanup() {
  "$docker" rm -f "$net-legacy" "$net-relay" >/dev/null 2>&1 || true
  "$docker" volume rm "$net-data" >/dev/null 2>&1 || true
  "$docker" network rm "$net" >/dev/null 2>&1 || true
}
trap cleanup EXIT

started=$(date +%s)
"$docker" build --network host -f docker/Dockerfile -t pollcast:dev . >/tmp/pollcast-image-build.log 2>&1 \
  || { tail -30 /tmp/pollcast-image-build.log >&2; fail "docker build (log above)"; }
echo "image check: built pollcast:dev in $(($(date +%s) - started)) s"
size=$("$docker" image inspect -f '{{.Size}}' pollcast:dev)
echo "image check: image size $((size / 1000000)) MB"
"$docker" run --rm --entrypoint /bin/sh pollcast:dev -c 'ls -l /usr/local/bin/pollcast /usr/local/bin/pollcast-legacy-fixture' \
  | awk '{printf "image check: %s %d MB\n", $NF, $5 / 1000000}'

"$docker" network create "$net" >/dev/null
"$docker" volume create "$net-data" >/dev/null
"$docker" run -d --name "$net-legacy" --network "$net" --network-alias legacy \
  --entrypoint /usr/local/bin/pollcast-legacy-fixture pollcast:dev --listen 0.0.0.0:8081 --chatter 0.3 >/dev/null
relay_args=(-d --name "$net-relay" --network "$net" -p 127.0.0.1::8080 -v "$net-data:/var/lib/pollcast"
  -e POLLCAST_UPSTREAM_URL=http://legacy:8081 -e POLLCAST_UPSTREAM_API_KEY=dev-key
  -e POLLCAST_STORE_KIND=sqlite -e POLLCAST_STORE_PATH=/var/lib/pollcast/pollcast.db
  -e POLLCAST_SERVER_SHUTDOWN_DEADLINE_SECONDS=5)
"$docker" run "${relay_args[@]}" pollcast:dev >/dev/null
port() { "$docker" port "$net-relay" 8080/tcp | sed -n "1s/.*://p"; }
wait_healthy() {
  for _ in $(seq 1 150); do
    if curl -fsS -o /dev/null "http://127.0.0.1:$(port)/readyz" 2>/dev/null; then return 0; fi
    sleep 0.2
  done
  fail "the relay did not become ready"
}
wait_healthy
first=$(python3 docker/sse-reader.py "http://127.0.0.1:$(port)/events" 3)
count=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["messages"]))' "$first")
[ "$count" -ge 2 ] || fail "streamed $count events in 3 s"
last=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["last_id"])' "$first")
last_upstream=$(python3 -c 'import json,sys; print([m[1] for m in json.loads(sys.argv[1])["messages"] if m[0] == "101"][-1])' "$first")
echo "image check: streamed $count events from the container (last id $last, last upstream id of stream 101: $last_upstream)"

pid=$("$docker" inspect -f '{{.State.Pid}}' "$net-relay")
kill -9 "$pid"
for _ in $(seq 1 50); do [ "$("$docker" inspect -f '{{.State.Running}}' "$net-relay")" = false ] && break; sleep 0.1; done
echo "image check: kill -9: the container exited $("$docker" inspect -f '{{.State.ExitCode}}' "$net-relay")"
sleep 1  # the fixture goes on chattering while the relay is down
"$docker" start "$net-relay" >/dev/null
wait_healthy
resumed=$(python3 docker/sse-reader.py "http://127.0.0.1:$(port)/events" 3 "$last")
python3 - "$resumed" "$last_upstream" <<'PY' || fail "the resume after kill -9 lost or repeated something"
import json, sys
summary, last = json.loads(sys.argv[1]), int(sys.argv[2])
ids = [m[1] for m in summary["messages"] if m[0] == "101"]
assert summary["resets"] == 0, f"reset after the restart: {summary}"
assert ids and ids[0] == last + 1, f"first resumed upstream id {ids[:1]}, expected {last + 1}"
assert ids == list(range(ids[0], ids[0] + len(ids))), f"gap or duplicate: {ids}"
sse = summary["sse_ids"]
assert sse == sorted(set(sse)), "SSE ids not strictly increasing"
print(f"image check: resumed after kill -9 with Last-Event-ID: {len(ids)} events, upstream ids {ids[0]}..{ids[-1]}, no gap, no duplicate, no reset")
PY

"$docker" stop -t 15 "$net-relay" >/dev/null
code=$("$docker" inspect -f '{{.State.ExitCode}}' "$net-relay")
[ "$code" = 0 ] || fail "docker stop: exit $code (expected 0)"
echo "image check: docker stop: exit 0"
echo "image check: passed"
