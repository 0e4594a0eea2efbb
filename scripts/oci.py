#!/usr/bin/env python3
"""The filter as an OCI image that Istio's WasmPlugin pulls (`url: oci://...`), and the checks Istio's fetcher
makes of such an image. Standard library only; scripts/oci.sh runs it (with skopeo for the registry side).

    scripts/oci.py build WASM OUT_DIR --tag TAG     an OCI image layout (oci:OUT_DIR:TAG for skopeo); prints
                                                    the manifest digest
    scripts/oci.py check IMAGE_DIR WASM [--digest sha256:HEX]
                                                    IMAGE_DIR: `skopeo copy docker://... dir:IMAGE_DIR` (the
                                                    manifest and blobs as the registry served them) or an
                                                    OCI layout; exits 1 unless Istio would load WASM from it

The image ("compat" variant of the Wasm image spec, solo-io/wasm spec/spec-compat.md): an OCI manifest
(application/vnd.oci.image.manifest.v1+json) with the annotation `module.wasm.image/variant: compat`, an OCI
config, and one layer of media type application/vnd.oci.image.layer.v1.tar+gzip: a gzip tar holding one
regular file, `plugin.wasm` (mode 0644, uid/gid 0, mtime 0). Built from the same .wasm, the bytes (and so
the manifest digest) are always the same.

What `check` asserts, after Istio's pkg/wasm/imagefetcher.go (PrepareFetch, extractOCIStandardImage,
extractDockerImage, extractWasmPluginBinary; istio/istio master 86c9f01f, same logic in 1.24-1.28) and
cache.go (the `sha256` comparison):
  1. the manifest is a single image manifest (not an index), OCI or Docker schema 2, and its sha256 is the
     digest given (`--digest`: the digest the registry reported, `skopeo inspect` "Digest"). Istio compares a
     WasmPlugin's `sha256` (or the `@sha256:` of its url) with THIS digest, not with the module's sha256;
  2. an OCI manifest's last layer is application/vnd.oci.image.layer.v1.tar+gzip (Istio's compat path; a
     zstd or uncompressed layer fails there, and the two-layer "oci" artifact variant is not what we ship);
     a Docker manifest's last layer is application/vnd.docker.image.rootfs.diff.tar.gzip. We also require
     exactly one layer and, for OCI, the compat annotation (the spec's "should");
  3. every blob's bytes match its digest and size;
  4. the layer is gzip (magic 1f 8b) holding a tar whose first entry named plugin.wasm (any directory, as
     Istio matches the base name) is a regular file, byte-identical to WASM, within Istio's default
     ISTIO_WASM_MAX_BINARY_SIZE_BYTES (256 MiB), and a Wasm module (\\0asm); nothing else in the layer
     but directories and an optional runtime-config.json.
Prints one line per check and the pins: `sha256: <manifest hex>` and `url: oci://<ref>@sha256:<hex>`.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
COMPAT = ("module.wasm.image/variant", "compat")
MAX_WASM = 256 * 1024 * 1024


def sha256(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


def canonical(obj):
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def layer_bytes(wasm, name="plugin.wasm"):
    """A gzip tar with `name` only, reproducible: mtime 0, uid/gid 0, mode 0644, no gzip file name."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(wasm), 0o644, 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        t.addfile(info, io.BytesIO(wasm))
    tar = raw.getvalue()
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as g:
        g.write(tar)
    return tar, out.getvalue()


def build(wasm_path, out_dir, tag, annotations=True, name="plugin.wasm", layer_media=OCI_LAYER_GZIP):
    """Writes an OCI image layout; returns the manifest digest. The keyword arguments make the broken
    variants deploy-check.sh pushes to prove that `check` refuses them."""
    with open(wasm_path, "rb") as f:
        wasm = f.read()
    tar, gz = layer_bytes(wasm, name)
    if layer_media == OCI_LAYER_GZIP:
        layer = gz
    elif layer_media == "application/vnd.oci.image.layer.v1.tar":
        layer = tar
    else:
        raise SystemExit(f"oci: layer media type {layer_media} is not built here")
    config = {
        "architecture": "wasm", "os": "wasi",
        "rootfs": {"type": "layers", "diff_ids": [sha256(tar)]},
        "config": {}, "created": "1970-01-01T00:00:00Z",
    }
    config_b = canonical(config)
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha256(config_b), "size": len(config_b)},
        "layers": [{"mediaType": layer_media, "digest": sha256(layer), "size": len(layer)}],
    }
    if annotations:
        manifest["annotations"] = {COMPAT[0]: COMPAT[1]}
    manifest_b = canonical(manifest)
    blobs = os.path.join(out_dir, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)
    for b in (layer, config_b, manifest_b):
        with open(os.path.join(blobs, sha256(b)[7:]), "wb") as f:
            f.write(b)
    with open(os.path.join(out_dir, "oci-layout"), "w", encoding="utf-8") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [{
        "mediaType": OCI_MANIFEST, "digest": sha256(manifest_b), "size": len(manifest_b),
        "annotations": {"org.opencontainers.image.ref.name": tag}}]}
    with open(os.path.join(out_dir, "index.json"), "w", encoding="utf-8") as f:
        json.dump(index, f)
    return sha256(manifest_b)


class Image:
    """Manifest bytes and blobs of an image in a skopeo `dir:` directory or an OCI layout."""

    def __init__(self, path):
        self.path = path
        if os.path.exists(os.path.join(path, "manifest.json")):
            self.kind = "dir"
            with open(os.path.join(path, "manifest.json"), "rb") as f:
                self.manifest = f.read()
        else:
            self.kind = "oci"
            with open(os.path.join(path, "index.json"), encoding="utf-8") as f:
                index = json.load(f)
            self.manifest = self.blob(index["manifests"][0]["digest"])

    def blob(self, digest):
        hexd = digest.split(":", 1)[1]
        p = os.path.join(self.path, hexd) if self.kind == "dir" else \
            os.path.join(self.path, "blobs", "sha256", hexd)
        with open(p, "rb") as f:
            return f.read()


def check(image_dir, wasm_path, digest=None):
    """Returns the list of failures (empty: Istio's fetcher loads this module from this image)."""
    fails = []

    def ok(msg):
        print(f"oci-check: ok   {msg}")

    def fail(msg):
        fails.append(msg)
        print(f"oci-check: FAIL {msg}")

    with open(wasm_path, "rb") as f:
        wasm = f.read()
    img = Image(image_dir)
    m_digest = sha256(img.manifest)
    try:
        m = json.loads(img.manifest)
    except ValueError as e:
        fail(f"the manifest is not JSON: {e}")
        return fails
    media = m.get("mediaType", "")
    if digest is not None:
        if digest == m_digest:
            ok(f"manifest digest {m_digest} is the digest the registry reports (what Istio compares `sha256` with)")
        elif digest.split(":")[-1] == hashlib.sha256(wasm).hexdigest():
            fail(f"the pin {digest} is the sha256 of the module, not of the manifest ({m_digest}): Istio would "
                 "refuse the fetch (with FAIL_RELOAD/FAIL_CLOSE: every request denied)")
        else:
            fail(f"the registry reports {digest}, the manifest served hashes to {m_digest}")
    if media in (OCI_INDEX, DOCKER_LIST) or "manifests" in m:
        fail(f"{media or 'an index'}: push one image manifest, not an index (Istio would pick a platform)")
        return fails
    if m.get("schemaVersion") != 2:
        fail(f"schemaVersion {m.get('schemaVersion')}, not 2")
    if media == DOCKER_MANIFEST:
        want, path = DOCKER_LAYER_GZIP, "Docker schema 2 (Istio's extractDockerImage)"
    elif media in (OCI_MANIFEST, ""):
        want, path = OCI_LAYER_GZIP, "OCI image manifest (Istio's compat path, extractOCIStandardImage)"
        ann = (m.get("annotations") or {}).get(COMPAT[0])
        if ann == COMPAT[1]:
            ok(f"annotation {COMPAT[0]}={COMPAT[1]} (spec-compat.md)")
        else:
            fail(f"no annotation {COMPAT[0]}={COMPAT[1]} on the manifest (spec-compat.md asks for it)")
    else:
        fail(f"manifest media type {media!r} is neither OCI nor Docker schema 2")
        return fails
    ok(f"{path}")
    layers = m.get("layers") or []
    if len(layers) != 1:
        fail(f"{len(layers)} layers: ship exactly one (Istio reads the last)")
    if not layers:
        return fails
    last = layers[-1]
    if last.get("mediaType") != want:
        fail(f"the last layer is {last.get('mediaType')}: Istio wants {want} "
             "(a zstd or uncompressed layer fails in Istio's fetcher)")
    else:
        ok(f"the last layer is {want}")
    cfg = m.get("config") or {}
    for what, d in (("config", cfg), ("layer", last)):
        try:
            b = img.blob(d["digest"])
        except (OSError, KeyError, IndexError) as e:
            fail(f"{what} blob {d.get('digest')} missing: {e}")
            return fails
        if sha256(b) != d["digest"] or len(b) != d.get("size"):
            fail(f"{what} blob does not match its digest/size ({sha256(b)}, {len(b)} bytes)")
        if what == "layer":
            layer = b
    if media != DOCKER_MANIFEST and cfg.get("mediaType") != OCI_CONFIG:
        fail(f"config media type {cfg.get('mediaType')}, not {OCI_CONFIG}")
    if layer[:2] != b"\x1f\x8b":
        fail(f"the layer is not gzip (starts {layer[:4].hex()}): Istio's gzip.NewReader fails")
        return fails
    try:
        tar = gzip.decompress(layer)
    except (OSError, EOFError) as e:
        fail(f"the layer does not gunzip: {e}")
        return fails
    found, others = None, []
    try:
        with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as t:
            for info in t:
                base = os.path.basename(info.name.rstrip("/"))
                if base == "plugin.wasm" and found is None:
                    if not info.isreg():
                        fail(f"{info.name} is not a regular file")
                        return fails
                    if info.size > MAX_WASM:
                        fail(f"{info.name}: {info.size} bytes, over Istio's 256 MiB limit")
                    f = t.extractfile(info)
                    found = (info.name, f.read() if f else b"")
                elif not info.isdir() and base != "runtime-config.json":
                    others.append(info.name)
    except tarfile.TarError as e:
        fail(f"the layer is not a tar: {e}")
        return fails
    if found is None:
        fail("no plugin.wasm in the layer (Istio: \"plugin.wasm not found in the archive\")")
        return fails
    name, data = found
    if others:
        fail(f"the layer also holds {others}")
    if not data.startswith(b"\0asm"):
        fail(f"{name} is not a Wasm module")
    if data != wasm:
        fail(f"{name} differs from {wasm_path}")
    else:
        ok(f"{name}: {len(data)} bytes, identical to {wasm_path} (sha256 {hashlib.sha256(data).hexdigest()})")
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("wasm")
    b.add_argument("out")
    b.add_argument("--tag", required=True)
    b.add_argument("--no-annotation", action="store_true", help="(a broken variant, for tests)")
    b.add_argument("--file-name", default="plugin.wasm", help="(a broken variant, for tests)")
    b.add_argument("--layer-media", default=OCI_LAYER_GZIP, help="(a broken variant, for tests)")
    c = sub.add_parser("check")
    c.add_argument("image_dir")
    c.add_argument("wasm")
    c.add_argument("--digest")
    a = ap.parse_args()
    if a.cmd == "build":
        print(build(a.wasm, a.out, a.tag, not a.no_annotation, a.file_name, a.layer_media))
        return
    fails = check(a.image_dir, a.wasm, a.digest)
    print(f"oci-check: {'refused' if fails else 'accepted'}: {len(fails)} problem(s)")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
