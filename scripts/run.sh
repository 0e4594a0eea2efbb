#!/usr/bin/env bash
# `make run`: tokengate in Envoy on 127.0.0.1:10000 with all three mechanisms of envoy/envoy.yaml (token
# buckets, circuit breaker with cluster/model fallbacks, monthly quotas), in front of two mock providers (or a
# real one), plus the quota store: a private redis-server and Webdis in front of it.
#
# Builds nothing (make did): needs target/wasm32-wasip1/release/tokengate.wasm, the mock-provider binary
# (target/release or target/debug), Envoy ($ENVOY_BIN, else the one in .venv), redis-server and webdis
# (`make deps`).
#
#   scripts/run.sh                       mocks on 127.0.0.1:8081 (provider) and :8082 (provider_fallback)
#   UPSTREAM_URL=https://api.openai.com UPSTREAM_API_KEY=sk-... scripts/run.sh
#   UPSTREAM_URL=http://127.0.0.1:8000/v1 scripts/run.sh          (a local vLLM; no key needed)
#   UPSTREAM_URL=http://[::1]:11434/v1 scripts/run.sh             (a local Ollama on IPv6 loopback)
#                                        no mocks: cluster `provider` goes to that server (TLS for https); the
#                                        base URL may end in /v1 or not; with UPSTREAM_API_KEY every request
#                                        routed to it gets `authorization: Bearer $UPSTREAM_API_KEY`, without
#                                        it the client's headers go through (scripts/upstream-config.sh)
#                                        (Redis and Webdis are still started locally: quotas keep working)
#
# Quota store, in both modes: redis-server on 127.0.0.1:$REDIS_PORT (default 6380, so a system Redis on 6379
# is left alone) with AOF persistence (appendonly yes, appendfsync everysec) in .run/redis/: counters and
# overrides survive a restart of `make run` (rm -rf .run/redis to start from zero), and Webdis with
# .run/webdis.json, generated from envoy/webdis.json (same ACL) with redis_port pointed at that Redis and
# http_port taken from the `webdis` cluster of envoy/envoy.yaml (7379).
#
# Optional: UPSTREAM_CA (CA bundle, default /etc/ssl/certs/ca-certificates.crt), ENVOY_LOG_LEVEL (warn),
# REDIS_PORT (6380). Runtime files go to .run/ (gitignored). Ctrl-C stops everything this script started,
# by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
RUN_DIR="$ROOT/.run"
WASM="target/wasm32-wasip1/release/tokengate.wasm"
LISTEN_PORT=10000
ADMIN_PORT=9901
MOCK_PORTS=(8081 8082)
REDIS_PORT=${REDIS_PORT:-6380}

die() { printf 'run: %s\n' "$*" >&2; exit 1; }

ENVOY=$(scripts/envoy-bin.sh) || die "no Envoy 1.40 found: run 'make deps' (or set ENVOY_BIN)"
[ -f "$WASM" ] || die "$WASM is not built: run 'make build'"

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Redis answers PING with +PONG (inline command, bash only).
redis_ok() {
    (
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf 'PING\r\n' >&3
        IFS= read -r -t 2 line <&3 && [[ "$line" == +PONG* ]]
    ) 2>/dev/null
}

# Webdis answers GET /PING with {"PING":[true,"PONG"]} once it reaches Redis (503 while it cannot).
webdis_ok() {
    (
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf 'GET /PING HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
        reply=$(timeout 2 cat <&3) && [[ "$reply" == "HTTP/1."?" 200"* && "$reply" == *PONG* ]]
    ) 2>/dev/null
}

PIDS=()
cleanup() {
    trap - INT TERM EXIT
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'echo; echo "run: stopping"; exit 130' INT
trap 'exit 143' TERM

mkdir -p "$RUN_DIR"

CONFIG="envoy/envoy.yaml"
UPSTREAM_MODE=0
if [ -n "${UPSTREAM_URL:-}" ]; then
    UPSTREAM_MODE=1
    CONFIG="$RUN_DIR/envoy.yaml"
    # Cluster `provider` -> UPSTREAM_URL (TLS for https, the key added when UPSTREAM_API_KEY is set).
    UPSTREAM_DESC=$(scripts/upstream-config.sh envoy/envoy.yaml "$CONFIG") || die "cannot use UPSTREAM_URL=$UPSTREAM_URL"
fi

REDIS=$(command -v redis-server) || die "redis-server is not installed: run 'make deps'"
WEBDIS=$(command -v webdis) || die "webdis is not installed: run 'make deps'"
[[ "$REDIS_PORT" =~ ^[0-9]+$ ]] || die "REDIS_PORT must be a port number, got: $REDIS_PORT"
# Webdis must listen where Envoy's `webdis` cluster points.
WEBDIS_PORT=$(sed -n 's/.*port_value: \([0-9]*\) }  # tokengate:webdis-address.*/\1/p' envoy/envoy.yaml)
[[ "$WEBDIS_PORT" =~ ^[0-9]+$ ]] || die "cannot find the webdis cluster's port in envoy/envoy.yaml"
[ "$REDIS_PORT" != "$WEBDIS_PORT" ] || die "REDIS_PORT must differ from Webdis' port $WEBDIS_PORT"

for p in "$LISTEN_PORT" "$ADMIN_PORT"; do
    if port_busy "$p"; then die "127.0.0.1:$p is already in use (another 'make run'?)"; fi
done
if port_busy "$REDIS_PORT"; then
    die "127.0.0.1:$REDIS_PORT is already in use (set REDIS_PORT to a free port for tokengate's Redis)"
fi
if port_busy "$WEBDIS_PORT"; then
    die "127.0.0.1:$WEBDIS_PORT is already in use (Webdis; the webdis cluster of envoy/envoy.yaml points there)"
fi

# Quota store: Redis (loopback, AOF) and Webdis in front of it, with envoy/webdis.json's ACL.
sed -E \
    -e "s|(\"redis_host\"[[:space:]]*:[[:space:]]*)\"[^\"]*\"|\\1\"127.0.0.1\"|" \
    -e "s|(\"redis_port\"[[:space:]]*:[[:space:]]*)[0-9]+|\\1$REDIS_PORT|" \
    -e "s|(\"http_host\"[[:space:]]*:[[:space:]]*)\"[^\"]*\"|\\1\"127.0.0.1\"|" \
    -e "s|(\"http_port\"[[:space:]]*:[[:space:]]*)[0-9]+|\\1$WEBDIS_PORT|" \
    -e "s|(\"daemonize\"[[:space:]]*:[[:space:]]*)[a-z]+|\\1false|" \
    -e "s|(\"logfile\"[[:space:]]*:[[:space:]]*)\"[^\"]*\"|\\1\"$RUN_DIR/webdis.log\"|" \
    envoy/webdis.json > "$RUN_DIR/webdis.json"
for want in "\"redis_port\": $REDIS_PORT" "\"http_port\": $WEBDIS_PORT" '"daemonize": false' \
    "\"logfile\": \"$RUN_DIR/webdis.log\"" '{"disabled": ["*"]}'; do
    grep -qF "$want" "$RUN_DIR/webdis.json" || die "could not derive $RUN_DIR/webdis.json from envoy/webdis.json ($want)"
done

# AOF: every write is in .run/redis/appendonlydir within a second (what a production Redis should run;
# docs/operating-redis.md).
mkdir -p "$RUN_DIR/redis"
"$REDIS" --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly yes --appendfsync everysec \
    --daemonize no --dir "$RUN_DIR/redis" --logfile "$RUN_DIR/redis.log" > /dev/null 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
for _ in $(seq 1 50); do
    kill -0 "$REDIS_PID" 2>/dev/null || die "redis-server exited at start; see $RUN_DIR/redis.log"
    if redis_ok "$REDIS_PORT"; then break; fi
    sleep 0.1
done
redis_ok "$REDIS_PORT" || die "redis-server did not answer PING on 127.0.0.1:$REDIS_PORT within 5 s; see $RUN_DIR/redis.log"

"$WEBDIS" "$RUN_DIR/webdis.json" > /dev/null 2>&1 &
WEBDIS_PID=$!
PIDS+=("$WEBDIS_PID")
for _ in $(seq 1 50); do
    kill -0 "$WEBDIS_PID" 2>/dev/null || die "webdis exited at start; see $RUN_DIR/webdis.log"
    if webdis_ok "$WEBDIS_PORT"; then break; fi
    sleep 0.1
done
webdis_ok "$WEBDIS_PORT" || die "webdis did not answer /PING on 127.0.0.1:$WEBDIS_PORT within 5 s; see $RUN_DIR/webdis.log"

if [ "$UPSTREAM_MODE" = 0 ]; then
    MOCK=""
    for m in target/release/mock-provider target/debug/mock-provider; do
        if [ -x "$m" ]; then MOCK=$m; break; fi
    done
    [ -n "$MOCK" ] || die "mock-provider is not built: cargo build -p wasm-test --bin mock-provider --release"
    for p in "${MOCK_PORTS[@]}"; do
        if port_busy "$p"; then die "127.0.0.1:$p is already in use (the mock provider's port)"; fi
        "$MOCK" --port "$p" > "$RUN_DIR/mock-$p.log" 2>&1 &
        PIDS+=("$!")
    done
fi

# Envoy in the foreground of this script: its access log (with the tokengate audit field) is printed here.
"$ENVOY" -c "$CONFIG" --disable-hot-restart --log-level "${ENVOY_LOG_LEVEL:-warn}" \
    2> >(tee "$RUN_DIR/envoy.log" >&2) &
ENVOY_PID=$!
PIDS+=("$ENVOY_PID")

# Ready when the admin port answers and the listener accepts connections.
for _ in $(seq 1 150); do
    kill -0 "$ENVOY_PID" 2>/dev/null || die "Envoy exited at start; see the messages above and $RUN_DIR/envoy.log"
    if port_busy "$ADMIN_PORT" && port_busy "$LISTEN_PORT"; then break; fi
    sleep 0.2
done
port_busy "$LISTEN_PORT" || die "Envoy did not open 127.0.0.1:$LISTEN_PORT within 30 s; see $RUN_DIR/envoy.log"
if [ "$UPSTREAM_MODE" = 0 ]; then
    for p in "${MOCK_PORTS[@]}"; do
        port_busy "$p" || die "mock provider on 127.0.0.1:$p is not up; see $RUN_DIR/mock-$p.log"
    done
fi

# Demo tokens for the jwt_authn example of envoy/envoy.yaml (its public demo key): the `tenant` claim is the
# tenant tokengate charges. Client-sent x-tenant-id headers are removed by Envoy before any filter runs.
TOKENS="$RUN_DIR/tokens.env"
{
    for t in demo-small demo-global demo-quota team-b; do
        var="TG_$(printf '%s' "$t" | tr 'a-z-' 'A-Z_')"
        printf 'export %s=%s\n' "$var" "$(scripts/demo-token.py "$t" demo --config envoy/envoy.yaml)"
    done
} > "$TOKENS" || die "cannot mint the demo tokens (python3 scripts/demo-token.py)"

URL="http://127.0.0.1:$LISTEN_PORT/v1/chat/completions"
body='{"model":"gpt-4.1","max_tokens":64,"messages":[{"role":"user","content":"Say hello"}]}'
big='{"model":"gpt-4.1","max_tokens":1500,"messages":[{"role":"user","content":"Write a long story"}]}'
flaky='{"model":"claude-sonnet-4.5","max_tokens":64,"messages":[{"role":"user","content":"Say hello"}]}'
cat <<EOF

tokengate is running (config: $CONFIG)
  listener   http://127.0.0.1:$LISTEN_PORT   (Envoy + $WASM: buckets, circuit breaker, monthly quotas)
EOF
if [ "$UPSTREAM_MODE" = 1 ]; then
    cat <<EOF
  $UPSTREAM_DESC
  fallback   127.0.0.1:8082 is not started in this mode (the breaker's fallback cluster answers 503)
EOF
else
    cat <<EOF
  provider   http://127.0.0.1:8081  (mock; log $RUN_DIR/mock-8081.log)
  fallback   http://127.0.0.1:8082  (mock; cluster provider_fallback, used while the breaker of provider is open)
EOF
fi
cat <<EOF
  quotas     Webdis http://127.0.0.1:$WEBDIS_PORT -> Redis 127.0.0.1:$REDIS_PORT (AOF in $RUN_DIR/redis: counters survive restarts; logs $RUN_DIR/webdis.log, $RUN_DIR/redis.log)
  admin      http://127.0.0.1:$ADMIN_PORT
  logs       access log below (audit=...), Envoy messages also in $RUN_DIR/envoy.log

Who is charged: the API key's tenant (key:<16 hex of its SHA-256>), or the tenant claim of a verified JWT sent
as x-tokengate-jwt. Load the demo tokens (7 days, tenants demo-small, demo-global, demo-quota, team-b) first:
  source $TOKENS
A client-sent x-tenant-id is removed by Envoy (it would let anyone pick a tenant).
State persists in Redis (AOF): to replay the quota demo in the same month, stop and rm -rf $RUN_DIR/redis.

Admitted (rule gpt-4.1; look at the x-ratelimit-*, x-tokengate-estimated-tokens and x-tokengate-quota-* headers):
  curl -si $URL -H 'content-type: application/json' -H 'authorization: Bearer sk-demo-a' -d '$body'

Rate-limited (tenant demo-small: burst 2000 tokens, 50 tokens/s, 5 requests/min; the 2nd call gets 429 tokens_per_second_exceeded):
  for i in 1 2; do curl -s -o /dev/null -w '%{http_code}\n' $URL -H 'content-type: application/json' -H "x-tokengate-jwt: \$TG_DEMO_SMALL" -d '$big'; done

Global bucket in Redis, shared by every Envoy replica (tenant demo-global: burst 2000 tokens, 50 tokens/s; 2nd call 429):
  for i in 1 2; do curl -s -o /dev/null -w '%{http_code}\n' $URL -H 'content-type: application/json' -H "x-tokengate-jwt: \$TG_DEMO_GLOBAL" -d '$big'; done
  redis-cli -p $REDIS_PORT HGETALL 'tg:gb:{demo-global:demo-global}'

Monthly quota (tenant demo-quota: 2000 tokens a month; the 1st call uses ~1500, the 2nd gets 429 insufficient_quota):
  for i in 1 2; do curl -s -o /dev/null -w '%{http_code} quota-remaining=%header{x-tokengate-quota-remaining}\n' $URL -H 'content-type: application/json' -H "x-tokengate-jwt: \$TG_DEMO_QUOTA" -d '$big'; done
  curl -si $URL -H 'content-type: application/json' -H "x-tokengate-jwt: \$TG_DEMO_QUOTA" -d '$big'
EOF
if [ "$UPSTREAM_MODE" = 0 ]; then
    cat <<EOF

Circuit breaker (opens for 30 s when at least half of at least 20 requests in 30 s failed; x-mock-status: 500
makes the mock fail). These 20 failures open the breakers of model claude-sonnet-4.5 (no model fallback) and of
cluster provider:
  for i in \$(seq 20); do curl -s -o /dev/null -w '%{http_code}\n' $URL -H 'content-type: application/json' -H 'authorization: Bearer sk-demo-a' -H 'x-mock-status: 500' -d '$flaky'; done
then claude-sonnet-4.5 gets 503 circuit_open from tokengate itself (retry-after; not sent upstream):
  curl -si $URL -H 'content-type: application/json' -H 'authorization: Bearer sk-demo-a' -d '$flaky'
while cluster provider is open, other models are served by the fallback cluster (provider_fallback, the mock on
127.0.0.1:8082: response headers x-tokengate-fallback: provider -> provider_fallback and x-mock-port: 8082):
  curl -si $URL -H 'content-type: application/json' -H 'authorization: Bearer sk-demo-a' -d '$body'
(gpt-4.1 itself falls back to deepseek-v3.2 when its model breaker opens; after 30 s the breakers let 3 probes through.)
EOF
fi
cat <<EOF

Metrics (tokengate_* counters, tokengate_quota_*, tokengate_breaker_*):
  curl -s http://127.0.0.1:$ADMIN_PORT/stats/prometheus | grep tokengate_

Ctrl-C stops Envoy, Webdis$([ "$UPSTREAM_MODE" = 0 ] && echo ", Redis and the mocks" || echo " and Redis").

EOF

# Wait for Envoy (or a signal); stop everything else when it goes.
set +e
wait "$ENVOY_PID"
rc=$?
set -e
if [ "$rc" != 0 ]; then echo "run: Envoy exited with status $rc" >&2; fi
exit "$rc"
