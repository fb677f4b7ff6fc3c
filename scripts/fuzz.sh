#!/usr/bin/env bash
# Builds the libFuzzer harness (Fuzz/FuzzTargets.swift compiled with PollcastCore's sources, ASan on) and runs
# every target for SECONDS each (default 60) from its committed seed corpus in Fuzz/corpus/TARGET.
# A crash leaves its input in .build/fuzz/crashes/TARGET and fails the script; add it to the seed corpus and to a
# regression test once fixed.
#   scripts/fuzz.sh [seconds] [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(rawjson sse resume query pointer template config cursor jwt credential store redis recipe target)
out=.build/fuzz
mkdir -p "$out"
binary="$out/pollcast-fuzz"
sources=$(find Sources/PollcastCore -name '*.swift' | sort)
# Rebuild when any source is newer than the binary. No `ls -t | head` here: under pipefail, head closing the pipe
# while ls still writes (its listing is over one 4 KiB buffer) kills the script with SIGPIPE, exit 141, as CI did.
stale=0
[ -x "$binary" ] || stale=1
for source in $sources Fuzz/FuzzTargets.swift; do
  if [ "$source" -nt "$binary" ]; then stale=1; break; fi
done
if [ "$stale" = 1 ]; then
  echo "building $binary"
  # shellcheck disable=SC2086
  swiftc -sanitize=fuzzer,address -parse-as-library -swift-version 6 -module-name PollcastCore -O -g \
    -I Sources/CLibevent -I Sources/CCurl -I Sources/CJWT -I Sources/CSQLite -I Sources/CHiredis -I Sources/CSSL \
    -Xcc -I/usr/include/hiredis $sources Fuzz/FuzzTargets.swift \
    -levent -levent_pthreads -lcurl -ljwt -lsqlite3 -lhiredis -lcrypto -o "$binary"
fi
failed=0
for target in "${targets[@]}"; do
  corpus="$out/corpus/$target"
  crashes="$out/crashes/$target"
  mkdir -p "$corpus" "$crashes"
  # The committed seeds are read, never written: new inputs go to the working corpus.
  log="$out/$target.log"
  # No Swift backtracer: under ASan it reads memory ASan owns and reports its own "unknown-crash" in
  # memserver_read instead of the trap (CI's store finding read so); libFuzzer's deadly-signal report names the line.
  if POLLCAST_FUZZ_TARGET="$target" SWIFT_BACKTRACE=enable=no ASAN_OPTIONS=detect_leaks=0 "$binary" -max_total_time="$seconds" \
    -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$crashes/" "$corpus" "Fuzz/corpus/$target" \
    >"$log" 2>&1; then
    runs=$(grep -oE 'Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' | tail -1 || true)
    echo "fuzz $target: ok, ${runs:-?} runs in ${seconds} s"
  else
    echo "fuzz $target: FAILED — see $log; inputs in $crashes"
    # What failed first (the frames in our sources), then the end of the log, then each crashing input small
    # enough to print, gzipped and base64-encoded: a CI log is all a failure on another machine leaves.
    grep -m 12 -E "ERROR: |SUMMARY: |Fatal error|runtime failure| in .*(Fuzz|Sources)/" "$log" || true
    tail -25 "$log"
    for input in "$crashes"/*; do
      [ -f "$input" ] && [ "$(stat -c %s "$input")" -le 65536 ] || continue
      echo "input $(basename "$input") (gzip | base64; decode with: base64 -d | gunzip > input):"
      gzip -9c "$input" | base64 -w 0
      echo
    done
    failed=1
  fi
done
exit $failed
