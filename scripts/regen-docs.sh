#!/usr/bin/env bash
# Regenerates the README's settings table and Config/pollcast.json from the one Setting table
# (`pollcast --help-config` and `--print-config` of the defaults), which ReadmeTests and ConfigurationTests check.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$(swift build --show-bin-path)/pollcast"
[ -x "$bin" ] || swift build --product pollcast
"$bin" --help-config > /tmp/pollcast-settings.md
python3 - <<'PY'
import re
table = open('/tmp/pollcast-settings.md').read().strip('\n').split('\n')
lines = open('README.md').read().split('\n')
start = lines.index(table[0])
end = start
while end < len(lines) and lines[end].startswith('|'):
    end += 1
lines[start:end] = table
open('README.md', 'w').write('\n'.join(lines))
PY
# The shipped file is the defaults, as --print-config writes them (no secrets: every default is empty).
(cd /tmp && env -i PATH="$PATH" "$bin" --print-config) > Config/pollcast.json
