#!/usr/bin/env bash
# `make oci`: the filter as an OCI image Istio's WasmPlugin can pull (`url: oci://<registry>/<name>:<tag>`),
# built with Podman. Istio's Wasm image format, "compat" variant: an image FROM scratch with a single layer
# holding the module as /plugin.wasm (Istio's fetcher takes plugin.wasm from the image's layer).
#
#   scripts/oci.sh [IMAGE]     default localhost/tokengate-wasm:latest
#
# Checks what it built: one layer, whose only file is plugin.wasm, byte-identical to
# target/wasm32-wasip1/release/tokengate.wasm; prints its digest and the sha256 of plugin.wasm. Push it with
#   podman push IMAGE docker://registry.example.com/platform/tokengate:0.1.0
# (podman login first), then set the WasmPlugin's url to oci://registry.example.com/platform/tokengate:0.1.0
# (envoy/istio/wasmplugin.yaml; imagePullSecret for a private registry). docs/deploying.md has the details.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/scripts/containers.conf}"
IMAGE=${1:-localhost/tokengate-wasm:latest}
WASM=target/wasm32-wasip1/release/tokengate.wasm
die() { printf 'oci: %s\n' "$*" >&2; exit 1; }

[ -f "$WASM" ] || die "$WASM is not built: make build"
command -v podman >/dev/null || die "podman is not installed: scripts/deps.sh --containers"
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$WASM" "$ctx/plugin.wasm"
printf 'FROM scratch\nCOPY plugin.wasm ./\n' > "$ctx/Containerfile"
podman build --quiet --format oci -t "$IMAGE" "$ctx" >/dev/null || die "podman build failed"

# Check the image as a registry would serve it.
layers=$(podman image inspect "$IMAGE" --format '{{len .RootFS.Layers}}')
[ "$layers" = 1 ] || die "$IMAGE has $layers layers, Istio's format wants one"
mkdir "$ctx/oci"
podman save --quiet --format oci-dir -o "$ctx/oci" "$IMAGE"
manifest=$(python3 -c '
import json, sys
d = sys.argv[1]
index = json.load(open(d + "/index.json"))
m = json.load(open(d + "/blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]))
assert len(m["layers"]) == 1, m["layers"]
print(m["layers"][0]["digest"].split(":")[1], m["layers"][0]["mediaType"])
' "$ctx/oci") || die "cannot read the saved image's manifest"
read -r layer media <<<"$manifest"
mkdir "$ctx/layer"
case "$media" in
    *gzip*) tar -xzf "$ctx/oci/blobs/sha256/$layer" -C "$ctx/layer" ;;
    *) tar -xf "$ctx/oci/blobs/sha256/$layer" -C "$ctx/layer" ;;
esac
files=$(cd "$ctx/layer" && find . -type f | sort)
[ "$files" = "./plugin.wasm" ] || die "the layer holds $files, not just plugin.wasm"
cmp -s "$ctx/layer/plugin.wasm" "$WASM" || die "plugin.wasm in the image differs from $WASM"
printf 'oci: %s: one layer (%s) with plugin.wasm, sha256 %s\n' "$IMAGE" "$media" \
    "$(sha256sum "$WASM" | cut -d' ' -f1)"
printf 'oci: push: podman push %s docker://<registry>/<name>:<tag>; WasmPlugin url: oci://<registry>/<name>:<tag>\n' "$IMAGE"
