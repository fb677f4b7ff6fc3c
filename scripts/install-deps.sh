#!/usr/bin/env bash
# Installs the Debian packages Pollcast builds, runs and tests with. Needs root (or sudo) and apt.
set -euo pipefail
# chromium and chromium-driver run the live page's browser test; redis-server runs the cluster tests (store.kind redis);
# etcd-server and nginx with libnginx-mod-nchan run the etcd and nchan recipes against the real servers.
packages=(libevent-dev libcurl4-openssl-dev libjwt-dev libssl-dev libsqlite3-dev libhiredis-dev redis-server etcd-server nginx libnginx-mod-nchan pkg-config curl ca-certificates chromium chromium-driver openssl)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update
  # The servers the tests use (redis, etcd, nginx) are installed without starting their system services (nginx would
  # take port 80): a policy-rc.d for the length of the install, unless the machine already has one.
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee "$policy" >/dev/null
    $sudo_cmd chmod +x "$policy"
  fi
  status=0
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y --no-install-recommends "${missing[@]}" || status=$?
  if [ -n "$policy" ]; then $sudo_cmd rm -f "$policy"; fi
  if [ "$status" -ne 0 ]; then exit "$status"; fi
fi
# A real Python SSE client library for the interop test (PyPI).
if ! python3 -c 'import httpx, httpx_sse' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check httpx httpx-sse 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages httpx httpx-sse
fi
