#!/usr/bin/env bash
# Builds the Debian 12 base image localhost/debian-base:12 for `make compose-test` and `make oci`, without a
# container registry: debootstrap (minbase) from this machine's own Debian mirror, imported into Podman.
# Cached: when the image already exists, nothing is done (about 1-2 min the first time, 0 s after).
#
#   scripts/base-image.sh            make sure localhost/debian-base:12 exists
#   scripts/base-image.sh --rebuild  remove it and build it again
#
# The mirror is the first `URIs:` (deb822) or `deb` line for bookworm in /etc/apt/sources.list*, or
# $DEBIAN_MIRROR. Needs root, debootstrap and podman (scripts/deps.sh --containers). Podman runs with
# CONTAINERS_CONF=scripts/containers.conf (runc, cgroupfs, open-files limits this machine allows).
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/scripts/containers.conf}"
IMAGE=localhost/debian-base:12

log() { printf 'base-image: %s\n' "$*"; }
die() { printf 'base-image: %s\n' "$*" >&2; exit 1; }

if [ "${1:-}" = --rebuild ]; then
    podman rmi -f "$IMAGE" >/dev/null 2>&1 || true
fi
if podman image exists "$IMAGE"; then
    exit 0
fi
[ "$(id -u)" = 0 ] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap is not installed: scripts/deps.sh --containers"

mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # deb822: the URIs of the stanza whose Suites include bookworm.
        mirror=$(awk 'BEGIN{RS=""} /Suites:[^\n]*bookworm( |\n|$)/ {
                    if (match($0, /URIs:[ \t]*[^ \t\n]+/)) { s=substr($0,RSTART,RLENGTH); sub(/URIs:[ \t]*/,"",s); print s; exit } }' "$f")
        [ -n "$mirror" ] && break
    done
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1=="deb" && $3=="bookworm" {print $2; exit}' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || die "no Debian bookworm mirror found in /etc/apt/sources.list*: set DEBIAN_MIRROR"

root=$(mktemp -d /var/tmp/tokengate-debootstrap.XXXXXX)
trap 'rm -rf "$root"' EXIT
log "debootstrap --variant=minbase bookworm from $mirror (first time only, about a minute)"
start=$(date +%s)
if ! debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1; then
    tail -n 20 "$root.log" >&2
    rm -f "$root.log"
    die "debootstrap failed"
fi
rm -f "$root.log"
# The image's apt uses the same mirror as this machine.
printf 'deb %s bookworm main\n' "$mirror" > "$root/etc/apt/sources.list"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | podman import - "$IMAGE" >/dev/null
log "$IMAGE built in $(( $(date +%s) - start )) s"
