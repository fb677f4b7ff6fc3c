#!/usr/bin/env bash
# Soak test of the release build: Benchmarks/soak.py's docstring says what it does. Arguments go to soak.py:
#   Benchmarks/soak.sh [--cycles 200000] [--messages 1000000] [--threads 4]
set -euo pipefail
cd "$(dirname "$0")/.."
swift build -c release --product pollcast >/dev/null
swift build -c release --product pollcast-legacy-fixture >/dev/null
exec python3 Benchmarks/soak.py --bin .build/release "$@"
