#!/usr/bin/env bash
# Proves that docker/Dockerfile's runtime stage is complete without a Docker engine: a minimal Debian 12 root
# filesystem (debootstrap minbase, the base of debian:bookworm-slim) gets exactly the packages listed in
# docker/runtime-packages.txt, the release binaries are copied in, and under chroot, as the image's non-root
# user, the fixture and the relay start, the HEALTHCHECK command passes, and an event flows from the fixture to
# an SSE client. Needs root. The bare root filesystem is cached in /var/cache/pollcast between runs.
set -euo pipefail
cd "$(dirname "$0")/.."

mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=/var/cache/pollcast
tarball=$cache/bookworm-minbase.tar
root=$(mktemp -d /tmp/pollcast-rootfs.XXXXXX)
work=$(mktemp -d /tmp/pollcast-check.XXXXXX)
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  sleep 0.2
  umount "$root/dev" 2>/dev/null || true
  umount "$root/proc" 2>/dev/null || true
  rm -rf "$root" "$work"
}
trap cleanup EXIT
fail() { echo "runtime-stage check FAILED: $*" >&2; for f in "$work"/*.log; do echo "--- $f" >&2; tail -20 "$f" >&2; done; exit 1; }
step() { echo "runtime-stage check: $*"; }

command -v debootstrap >/dev/null || { apt-get update -qq; apt-get install -y -qq --no-install-recommends debootstrap; }

mkdir -p "$cache"
if [ -s "$tarball" ]; then
  step "reusing the cached Debian 12 minbase root filesystem"
  tar -xf "$tarball" -C "$root"
else
  step "debootstrap --variant=minbase bookworm (cached afterwards)"
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || fail "debootstrap"
  tar -cf "$tarball.tmp" -C "$root" . && mv "$tarball.tmp" "$tarball"
fi

# mktemp made the directory 0700 (and the cached tarball keeps that): the image's user must be able to enter /.
chmod 0755 "$root"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
cp /etc/resolv.conf "$root/etc/resolv.conf"

packages=$(grep -v '^#' docker/runtime-packages.txt | grep -v '^[[:space:]]*$' | xargs)
step "installing the runtime packages: $packages"
chroot "$root" apt-get update -qq >"$work/apt.log" 2>&1 || fail "apt-get update in the root filesystem"
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages \
  >>"$work/apt.log" 2>&1 || fail "apt-get install $packages"
chroot "$root" useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin pollcast
mkdir -p "$root/var/lib/pollcast"
chroot "$root" chown 10001:10001 /var/lib/pollcast

# Exactly what the Dockerfile's build stage copies, in a scratch directory: a file the image lacks fails here too
# (a full checkout once hid that the image could not build without Tests/).
scratch="$work/src"
mkdir -p "$scratch"
copied=$(awk '/^FROM /{stage++} stage == 1 && /^COPY /{print $2}' docker/Dockerfile)
[ -n "$copied" ] || fail "no COPY in the Dockerfile's build stage"
for path in $copied; do cp -r "$path" "$scratch/"; done
step "building release binaries from what the Dockerfile copies ($(echo $copied)), --static-swift-stdlib"
(cd "$scratch" && swift build -c release --static-swift-stdlib --product pollcast) >"$work/build.log" 2>&1 \
  || fail "swift build pollcast"
(cd "$scratch" && swift build -c release --static-swift-stdlib --product pollcast-legacy-fixture) >>"$work/build.log" 2>&1 \
  || fail "swift build pollcast-legacy-fixture"
bin=$(cd "$scratch" && swift build -c release --show-bin-path)
install -m 0755 "$bin/pollcast" "$bin/pollcast-legacy-fixture" "$root/usr/local/bin/"
mkdir -p "$root/etc/pollcast"
cp Config/pollcast.json "$root/etc/pollcast/pollcast.json"

for binary in pollcast pollcast-legacy-fixture; do
  if chroot "$root" ldd "/usr/local/bin/$binary" | grep -q "not found"; then
    chroot "$root" ldd "/usr/local/bin/$binary" >&2
    fail "$binary needs a library the runtime packages do not provide"
  fi
done

wait_line() {  # file, seconds
  for _ in $(seq 1 $(( $2 * 20 ))); do
    if grep -q "listening on" "$1" 2>/dev/null; then head -1 "$1" | sed 's/listening on //'; return 0; fi
    sleep 0.05
  done
  return 1
}

step "starting the fixture and the relay under chroot as uid 10001"
chroot --userspec=10001:10001 "$root" /usr/local/bin/pollcast-legacy-fixture --listen 127.0.0.1:0 \
  >"$work/fixture.out" 2>"$work/fixture.log" &
pids+=($!)
fixture=$(wait_line "$work/fixture.out" 10) || fail "the fixture did not start"
start_relay() {  # the image's way, with the store the compose file sets, on the volume's directory
  rm -f "$work/relay.out"
  chroot --userspec=10001:10001 "$root" env POLLCAST_CONFIG=/etc/pollcast/pollcast.json POLLCAST_LISTEN=127.0.0.1:0 \
    POLLCAST_UPSTREAM_URL="http://$fixture" POLLCAST_UPSTREAM_API_KEY=dev-key POLLCAST_STORE_KIND=sqlite \
    POLLCAST_STORE_PATH=/var/lib/pollcast/pollcast.db /usr/local/bin/pollcast >"$work/relay.out" 2>>"$work/relay.log" &
  relay_pid=$!
  pids+=($relay_pid)
  relay=$(wait_line "$work/relay.out" 10) || fail "the relay did not start"
}
start_relay

step "HEALTHCHECK command (curl inside the root filesystem) against /healthz"
chroot --userspec=10001:10001 "$root" curl -fsS -o /dev/null "http://$relay/healthz" || fail "healthcheck"

for _ in $(seq 1 100); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$relay/readyz")" = 200 ] && break
  sleep 0.1
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://$relay/readyz")" = 200 ] || fail "/readyz never became ready"

step "streaming an event from the fixture through the relay"
curl -sN --max-time 20 "http://$relay/events" >"$work/events.txt" 2>/dev/null &
pids+=($!)
sleep 0.5
curl -fsS -X POST "http://$fixture/_control/messages" -d '{"user_id":"101","text":"hello from the runtime stage"}' \
  >/dev/null || fail "injecting a message"
for _ in $(seq 1 100); do
  grep -q "hello from the runtime stage" "$work/events.txt" && break
  sleep 0.1
done
grep -q "hello from the runtime stage" "$work/events.txt" || fail "the event did not reach the SSE client"

step "kill -9, a message while the relay is down, restart on the same store: the client resumes and gets it"
last_id=$(grep '^id: ' "$work/events.txt" | tail -1 | sed 's/id: //')
[ -n "$last_id" ] || fail "the event had no id"
kill -KILL "$relay_pid"
wait "$relay_pid" 2>/dev/null || true
curl -fsS -X POST "http://$fixture/_control/messages" -d '{"user_id":"101","text":"sent while the relay was down"}' \
  >/dev/null || fail "injecting a message"
start_relay
grep -q "store loaded" "$work/relay.log" || fail "the restarted relay did not load the store"
curl -sN --max-time 20 -H "Last-Event-ID: $last_id" "http://$relay/events" >"$work/resumed.txt" 2>/dev/null &
pids+=($!)
for _ in $(seq 1 100); do
  grep -q "sent while the relay was down" "$work/resumed.txt" && break
  sleep 0.1
done
grep -q "sent while the relay was down" "$work/resumed.txt" || fail "the resumed client did not get what it missed"
grep -q "hello from the runtime stage" "$work/resumed.txt" && fail "the resumed client got an event twice"

step "a corrupt store file: exit 74, the file left as it is"
echo "not a database" >"$root/tmp/corrupt.db"
set +e
chroot --userspec=10001:10001 "$root" env POLLCAST_LISTEN=127.0.0.1:0 POLLCAST_UPSTREAM_URL="http://$fixture" \
  POLLCAST_STORE_KIND=sqlite POLLCAST_STORE_PATH=/tmp/corrupt.db /usr/local/bin/pollcast >/dev/null 2>"$work/corrupt.log"
code=$?
set -e
[ "$code" = 74 ] || fail "a corrupt store exited $code, not 74"
grep -q "/tmp/corrupt.db" "$work/corrupt.log" || fail "the error does not name the file"
[ "$(cat "$root/tmp/corrupt.db")" = "not a database" ] || fail "the corrupt file was changed"

step "SIGTERM: the relay exits 0"
kill -TERM "$relay_pid"
wait "$relay_pid" || fail "the relay exited with $?"
echo "runtime-stage check passed: the runtime packages ($packages) are sufficient; the store survives kill -9"
