#!/usr/bin/env bash
# Mints an HS256 subscriber token for auth.mode = jwt with nothing but openssl, the way a backend without a JWT
# library can. Usage: scripts/mint-token.sh SECRET_FILE [STREAMS_JSON='["*"]'] [TTL_SECONDS=3600] [SUB] [AUD]
# SECRET_FILE is the relay's auth.jwt.key_file (a trailing newline is ignored, as the relay does).
set -euo pipefail
secret_file=$1
streams=${2:-'["*"]'}
ttl=${3:-3600}
sub=${4:-}
aud=${5:-}
b64() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
claims=$(printf '{"streams":%s,"exp":%d' "$streams" $(($(date +%s) + ttl)))
[ -n "$sub" ] && claims+=$(printf ',"sub":"%s"' "$sub")
[ -n "$aud" ] && claims+=$(printf ',"aud":"%s"' "$aud")
claims+='}'
h=$(printf '{"alg":"HS256","typ":"JWT"}' | b64)
p=$(printf '%s' "$claims" | b64)
s=$(printf '%s.%s' "$h" "$p" | openssl dgst -sha256 -hmac "$(cat "$secret_file")" -binary | b64)
echo "$h.$p.$s"
