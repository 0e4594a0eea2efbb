#!/usr/bin/env bash
# `make oci`: the filter as an OCI image Istio's WasmPlugin pulls (`url: oci://<registry>/<name>:<tag>`), in the
# "compat" format of the Wasm image spec (one tar+gzip layer holding plugin.wasm, annotation
# module.wasm.image/variant=compat; scripts/oci.py has the details and the Istio source it follows).
#
#   scripts/oci.sh                       build target/oci/tokengate (an OCI layout, tag = Cargo.toml's version)
#   scripts/oci.sh --push REF            build, push to REF (registry/name:tag) with skopeo, then read back what
#                                        the registry serves and check it as Istio's fetcher would
#   scripts/oci.sh --push REF --insecure the registry speaks plain HTTP (a loopback test registry)
#
# Needs python3 and skopeo only (scripts/deps.sh --oci); no container engine, no root. The image is built
# byte for byte from the .wasm (mtime 0, fixed config), so the same module always gives the same manifest
# digest; skopeo pushes it with --preserve-digests, so the digest printed before the push is the one the
# registry serves. That **manifest digest** is what a WasmPlugin pins (`sha256: <hex>`, or
# `url: oci://REF@sha256:<hex>`): Istio compares the pin with the manifest's digest, not with the module's
# sha256 (a module-sha256 pin makes every fetch fail). Push with your registry credentials in skopeo's or
# podman's auth file (`skopeo login REGISTRY`).
set -euo pipefail
cd "$(dirname "$0")/.."
WASM=${WASM:-target/wasm32-wasip1/release/tokengate.wasm}
OUT=${OCI_OUT:-target/oci/tokengate}
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
die() { printf 'oci: %s\n' "$*" >&2; exit 1; }

push="" insecure=0
while [ $# -gt 0 ]; do
    case "$1" in
        --push) push=${2:?--push needs REF}; shift 2 ;;
        --insecure) insecure=1; shift ;;
        *) die "unknown argument $1 (scripts/oci.sh [--push REF [--insecure]])" ;;
    esac
done
[ -f "$WASM" ] || die "$WASM is not built: make build"
[ -n "$VERSION" ] || die "no version in Cargo.toml"

rm -rf "$OUT"
mkdir -p "$OUT"
digest=$(python3 scripts/oci.py build "$WASM" "$OUT" --tag "$VERSION")
module=$(sha256sum "$WASM" | cut -d' ' -f1)
# The layout itself passes the checks (no registry involved yet).
python3 scripts/oci.py check "$OUT" "$WASM" --digest "$digest" >/dev/null || {
    python3 scripts/oci.py check "$OUT" "$WASM" --digest "$digest" >&2 || true
    die "the image built in $OUT does not pass the checks"
}
printf 'oci: %s (oci:%s:%s): one tar+gzip layer with plugin.wasm, annotation module.wasm.image/variant=compat\n' \
    "$OUT" "$OUT" "$VERSION"
printf 'oci: manifest digest %s   (module sha256 %s: NOT the pin)\n' "$digest" "$module"
if [ -z "$push" ]; then
    printf 'oci: push: scripts/oci.sh --push <registry>/<name>:%s   (or: skopeo copy --preserve-digests oci:%s:%s docker://<registry>/<name>:%s)\n' \
        "$VERSION" "$OUT" "$VERSION" "$VERSION"
    printf 'oci: then pin the WasmPlugin: url: oci://<registry>/<name>@%s   (or url: oci://<registry>/<name>:%s with sha256: %s)\n' \
        "$digest" "$VERSION" "${digest#sha256:}"
    exit 0
fi

command -v skopeo >/dev/null || die "skopeo is not installed: scripts/deps.sh --oci"
last=${push##*/}
[[ "$push" == */* && "$last" == *:* && "$last" != *@* ]] || die "--push wants registry/name:tag, got $push"
repo=${push%:*}
dtls=() stls=() itls=()
if [ "$insecure" = 1 ]; then dtls=(--dest-tls-verify=false); stls=(--src-tls-verify=false); itls=(--tls-verify=false); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
skopeo copy -q --preserve-digests --digestfile "$tmp/pushed" "${dtls[@]}" "oci:$OUT:$VERSION" "docker://$push" \
    || die "skopeo copy to docker://$push failed"
pushed=$(cat "$tmp/pushed")
[ "$pushed" = "$digest" ] || die "the registry stored $pushed, not $digest"
# What the registry serves: its digest, its manifest, and the blobs as served (dir: keeps them verbatim).
served=$(skopeo inspect "${itls[@]}" --format '{{.Digest}}' "docker://$push") || die "skopeo inspect $push failed"
skopeo inspect "${itls[@]}" --raw "docker://$push" > "$tmp/raw.json" || die "skopeo inspect --raw $push failed"
skopeo copy -q "${stls[@]}" "docker://$push" "dir:$tmp/served" \
    || die "skopeo copy docker://$push dir: failed"
cmp -s "$tmp/raw.json" "$tmp/served/manifest.json" || die "skopeo inspect --raw and the copied manifest differ"
printf 'oci: pushed %s; the registry serves manifest %s\n' "$push" "$served"
python3 scripts/oci.py check "$tmp/served" "$WASM" --digest "$served" || die "the image the registry serves is not what Istio loads"
printf 'oci: WasmPlugin pin: url: oci://%s@%s\n' "$repo" "$served"
printf 'oci:             or: url: oci://%s   sha256: %s\n' "$push" "${served#sha256:}"
