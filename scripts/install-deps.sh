#!/usr/bin/env bash
# Installs the Debian packages Pollcast builds, runs and tests with. Needs root (or sudo) and apt.
set -euo pipefail
# chromium and chromium-driver run the live page's browser test; redis-server runs the cluster tests (store.kind redis);
# etcd-server runs the etcd v2 recipe against a real etcd.
packages=(libevent-dev libcurl4-openssl-dev libjwt-dev libssl-dev libsqlite3-dev libhiredis-dev redis-server etcd-server pkg-config curl ca-certificates chromium chromium-driver openssl)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y --no-install-recommends "${missing[@]}"
fi
# A real Python SSE client library for the interop test (PyPI).
if ! python3 -c 'import httpx, httpx_sse' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check httpx httpx-sse 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages httpx httpx-sse
fi
