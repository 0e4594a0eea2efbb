#!/usr/bin/env bash
# `make compose-test`: brings envoy/docker-compose.yaml up for real with podman-compose, on local stand-ins of
# the official images (scripts/compose-images.sh: Debian base from debootstrap, Envoy from the wheel, Redis
# and Webdis from Debian, the mock provider), smoke-tests it (scripts/compose-smoke.py) and tears it down.
#
#   1. A missing .wasm is a clear error: the compose file, copied where ../target/... does not exist, makes
#      the envoy service exit 78 with a message naming `make build`.
#   2. `podman-compose up -d` under a project name of its own, host ports picked free on 127.0.0.1; every
#      service's healthcheck is run with `podman healthcheck run` until it passes (bounded): Podman 4.3 does
#      not run healthchecks by itself without systemd, and podman-compose waits on `service_healthy` only
#      with Podman >= 4.6 (Docker Compose honours the conditions).
#   3. The smoke test: admitted / rate-limited / global bucket / quota / identity / breaker / metrics, and
#      Redis' AOF directory exists in its volume. Then `make oci`'s image is built and checked (scripts/oci.sh).
#   4. Always (trap): `podman-compose down -v`, then whatever is left with the project's label (containers,
#      network, volume) is removed by name. The stand-in images stay cached (`scripts/compose-test.sh
#      --clean-images` removes them and the base image).
#
# Needs: root, podman + runc + netavark + debootstrap (scripts/deps.sh --containers installs them and
# podman-compose into .venv), the built .wasm and mock-provider (make compose-test builds them).
# Measured on a 2-core machine: first run 70-140 s (debootstrap 30-80 s, stand-in images 20-35 s), then about
# 20 s with the images cached.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export CONTAINERS_CONF="$ROOT/scripts/containers.conf"
COMPOSE="$ROOT/.venv/bin/podman-compose"
PROJECT="tokengate-ct-$$"
start=$(date +%s)

log() { printf 'compose-test: %s\n' "$*"; }
die() { printf 'compose-test: %s\n' "$*" >&2; exit 1; }

if [ "${1:-}" = --clean-images ]; then
    podman rmi -f localhost/tokengate-test-envoy localhost/tokengate-test-redis-webdis \
        localhost/tokengate-test-mock localhost/debian-base:12 2>/dev/null || true
    exit 0
fi

[ -x "$COMPOSE" ] || die "podman-compose is not installed in .venv: scripts/deps.sh --containers"
command -v podman >/dev/null || die "podman is not installed: scripts/deps.sh --containers"
[ -f target/wasm32-wasip1/release/tokengate.wasm ] || die "the filter is not built: make build"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Images: the stand-ins for ENVOY_IMAGE, REDIS_IMAGE, WEBDIS_IMAGE, MOCK_IMAGE.
images=$(scripts/compose-images.sh)
# shellcheck disable=SC2086
export $images
log "images ready ($(( $(date +%s) - start )) s): $images"

TMP=$(mktemp -d)
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    for p in "$PROJECT" "$PROJECT-nowasm"; do
        for f in "$ROOT/envoy/docker-compose.yaml" "$TMP/envoy/docker-compose.yaml"; do
            [ -f "$f" ] && "$COMPOSE" -p "$p" -f "$f" down -v -t 2 >/dev/null 2>&1
        done
        # Anything the project made that `down` left behind, by label and by name.
        ids=$(podman ps -aq --filter "label=io.podman.compose.project=$p")
        [ -n "$ids" ] && podman rm -f $ids >/dev/null 2>&1
        for n in $(podman network ls -q --filter "label=io.podman.compose.project=$p"); do
            podman network rm -f "$n" >/dev/null 2>&1
        done
        for v in $(podman volume ls -q --filter "label=io.podman.compose.project=$p"); do
            podman volume rm -f "$v" >/dev/null 2>&1
        done
    done
    rm -rf "$TMP"
    log "torn down ($(( $(date +%s) - start )) s in all)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# 1. A missing .wasm: the same compose file, where ../target/wasm32-wasip1/release does not exist.
mkdir -p "$TMP/envoy"
cp envoy/docker-compose.yaml envoy/envoy-docker.yaml envoy/webdis-docker.json "$TMP/envoy/"
set +e
out=$("$COMPOSE" -p "$PROJECT-nowasm" -f "$TMP/envoy/docker-compose.yaml" run --rm --no-deps -T envoy 2>&1)
rc=$?
set -e
if [ "$rc" = 0 ] || ! grep -q "tokengate.wasm is missing: run 'make build'" <<<"$out"; then
    printf '%s\n' "$out" | tail -n 20 >&2
    die "a missing .wasm did not fail with the clear message (exit $rc)"
fi
log "ok   missing .wasm: envoy exits $rc with \"tokengate.wasm is missing: run 'make build' ...\""

# 2. Up.
export TOKENGATE_PORT TOKENGATE_ADMIN_PORT
TOKENGATE_PORT=$(free_port)
TOKENGATE_ADMIN_PORT=$(free_port)
if ! "$COMPOSE" -p "$PROJECT" -f envoy/docker-compose.yaml up -d --no-build >"$TMP/up.log" 2>&1; then
    tail -n 30 "$TMP/up.log" >&2
    die "podman-compose up failed"
fi
containers=$(podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}')
[ "$(wc -w <<<"$containers")" = 5 ] || die "expected 5 containers, got: $containers"

# Every healthcheck must pass (60 s at most for all).
deadline=$(( $(date +%s) + 60 ))
for c in $containers; do
    until podman healthcheck run "$c" >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            podman ps -a --filter "label=io.podman.compose.project=$PROJECT" >&2
            podman logs --tail 30 "$c" >&2 || true
            die "$c is not healthy after 60 s"
        fi
        sleep 1
    done
done
log "ok   5 services up and healthy ($(( $(date +%s) - start )) s): $(tr '\n' ' ' <<<"$containers")"

# 3. Smoke test through Envoy on the published loopback ports.
set +e
python3 scripts/compose-smoke.py "$TOKENGATE_PORT" "$TOKENGATE_ADMIN_PORT" | tee "$TMP/smoke.log"
smoke=${PIPESTATUS[0]}
set -e
smoke_passed=$(sed -n 's/^compose-smoke: \([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$TMP/smoke.log")
smoke_failed=$(sed -n 's/^compose-smoke: \([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$TMP/smoke.log")
if [ -z "$smoke_passed" ]; then smoke_passed=0; smoke_failed=1; fi
if [ "$smoke" != 0 ] && [ "$smoke_failed" = 0 ]; then smoke_failed=1; fi
redis_c=$(grep -m1 '_redis_' <<<"$containers")
if podman exec "$redis_c" sh -c 'ls /data/appendonlydir/*.manifest' >/dev/null 2>&1; then
    log "ok   Redis writes its AOF to the redis-data volume (/data/appendonlydir)"
    aof=1
else
    log "FAIL Redis has no AOF in /data/appendonlydir"
    aof=0
fi
if [ "$smoke" != 0 ]; then
    envoy_c=$(grep -m1 '_envoy_' <<<"$containers")
    podman logs --tail 40 "$envoy_c" >&2 || true
fi
# 4. The OCI image of the plugin (`make oci`), built and checked by scripts/oci.sh (make deploy-check pushes it
#    to a registry and checks what the registry serves).
if OCI_OUT="$TMP/oci" scripts/oci.sh; then oci=1; else oci=0; fi

# Missing .wasm and health passed (the script dies otherwise).
passed=$(( smoke_passed + 2 + aof + oci ))
failed=$(( smoke_failed + 2 - aof - oci ))
log "$passed passed, $failed failed"
[ "$failed" = 0 ]
