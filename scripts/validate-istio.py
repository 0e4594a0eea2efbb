#!/usr/bin/env python3
"""Checks the Istio manifests under envoy/istio/ without a cluster (run by `make test`, through
wasm-test/tests/validate_configs.rs, with the project's .venv: PyYAML, jsonschema, kubernetes-validate).

    scripts/validate-istio.py [DIR] [--bootstrap OUT] [--wasm PATH]
    scripts/validate-istio.py --extract CRDS.yaml      (regenerates scripts/istio-crd-schemas.json)

1. Istio resources against Istio's CRD OpenAPI schemas (scripts/istio-crd-schemas.json: the served versions
   this project uses, extracted from istio/api's kubernetes/customresourcedefinitions.gen.yaml), strictly:
   a field the schema does not define is an error, as `kubectl apply` (strict field validation) would make it.
   CEL rules (x-kubernetes-validations) are not evaluated.
2. Kubernetes built-ins (Namespace, Deployment, Service, ...) against the Kubernetes schemas of
   kubernetes-validate (strict), for Kubernetes 1.30.
3. Cross-references that no schema sees: the plugin's cluster names are Istio's (`outbound|<port>||<host>`)
   of a Service or ServiceEntry in these manifests, with the matching :authority; every selector selects the
   gateway's pods; the identity chain removes and sets the filter's tenant header; TLS is originated for
   every ServiceEntry port the VirtualService routes to; the buffer-limit patches match the gateway listener
   and the provider's cluster; no demo tenants.
4. --bootstrap OUT: writes an Envoy bootstrap built from the Envoy fragments of these manifests (the
   EnvoyFilter patches, the WasmPlugin's pluginConfig with --wasm, the Istio-named clusters with the
   DestinationRule's TLS) for `envoy --mode validate`.

Prints one line per finding and `validate-istio: N resources, M errors`; exits 1 on any error.
"""
import argparse
import copy
import json
import os
import re
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS = os.path.join(HERE, "istio-crd-schemas.json")
K8S_VERSION = "1.30"
# (group, version, kind) kept by --extract.
USED = {
    ("extensions.istio.io", "v1alpha1", "WasmPlugin"),
    ("networking.istio.io", "v1alpha3", "EnvoyFilter"),
    ("networking.istio.io", "v1", "DestinationRule"),
    ("networking.istio.io", "v1", "Gateway"),
    ("networking.istio.io", "v1", "ServiceEntry"),
    ("networking.istio.io", "v1", "VirtualService"),
    ("networking.istio.io", "v1", "Sidecar"),
    ("security.istio.io", "v1", "RequestAuthentication"),
    ("security.istio.io", "v1", "AuthorizationPolicy"),
    ("security.istio.io", "v1", "PeerAuthentication"),
}

errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")
    print(f"validate-istio: ERROR {where}: {msg}", flush=True)


def extract(crd_file):
    out = {}
    with open(crd_file, encoding="utf-8") as f:
        for doc in yaml.safe_load_all(f):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
            for v in doc["spec"]["versions"]:
                if (group, v["name"], kind) in USED and v.get("served"):
                    out[f"{group}/{v['name']}/{kind}"] = v["schema"]["openAPIV3Schema"]
    missing = {f"{g}/{v}/{k}" for g, v, k in USED} - set(out)
    if missing:
        sys.exit(f"validate-istio: not in {crd_file}: {sorted(missing)}")
    with open(SCHEMAS, "w", encoding="utf-8") as f:
        json.dump({"source": "istio/api kubernetes/customresourcedefinitions.gen.yaml (served versions used "
                             "by envoy/istio/, openAPIV3Schema only)", "schemas": out}, f, sort_keys=True)
        f.write("\n")
    print(f"validate-istio: wrote {len(out)} schemas to {SCHEMAS}")


def strict(schema):
    """The schema with additionalProperties: false wherever an object lists its properties (strict
    field validation), and int-or-string made explicit."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("x-kubernetes-int-or-string"):
                node.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    # The CRD schema leaves metadata to the API server.
    s.setdefault("properties", {})["metadata"] = {"type": "object"}
    s["properties"]["apiVersion"] = {"type": "string"}
    s["properties"]["kind"] = {"type": "string"}
    return s


def where(doc, file):
    md = doc.get("metadata") or {}
    return f"{os.path.basename(file)} {doc.get('kind')}/{md.get('name')}"


def validate_schemas(docs):
    import jsonschema
    import kubernetes_validate

    with open(SCHEMAS, encoding="utf-8") as f:
        schemas = json.load(f)["schemas"]
    for file, doc in docs:
        w = where(doc, file)
        md = doc.get("metadata") or {}
        if not md.get("name"):
            err(w, "metadata.name is required")
        api = doc.get("apiVersion", "")
        if ".istio.io/" in api:
            key = f"{api}/{doc.get('kind')}"
            if key not in schemas:
                err(w, f"no schema for {key} (add it to USED and run --extract)")
                continue
            if not md.get("namespace"):
                err(w, "metadata.namespace is required for the Istio resources here")
            v = jsonschema.Draft7Validator(strict(schemas[key]))
            for e in sorted(v.iter_errors(doc), key=lambda e: list(e.absolute_path)):
                path = ".".join(str(p) for p in e.absolute_path) or "(root)"
                err(w, f"{path}: {e.message[:300]}")
        else:
            try:
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.absolute_path) or "(root)"
                err(w, f"{path}: {e.message[:300]}")
            except kubernetes_validate.SchemaNotFoundError as e:
                err(w, f"unknown kind: {e}")


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_references(docs):
    by_kind = {}
    for file, doc in docs:
        by_kind.setdefault(doc.get("kind"), []).append((file, doc))

    def one(kind):
        items = by_kind.get(kind, [])
        if len(items) != 1:
            err("manifests", f"expected one {kind}, found {len(items)}")
            return None, {}
        return items[0]

    # Envoy clusters Istio makes: Services (FQDN) and ServiceEntry hosts, per port.
    clusters = {}
    for file, svc in by_kind.get("Service", []):
        md = svc["metadata"]
        host = f"{md['name']}.{md.get('namespace', 'default')}.svc.cluster.local"
        for p in svc["spec"].get("ports", []):
            clusters[f"outbound|{p['port']}||{host}"] = (host, svc)
    for file, se in by_kind.get("ServiceEntry", []):
        for host in se["spec"]["hosts"]:
            for p in se["spec"].get("ports", []):
                clusters[f"outbound|{p['number']}||{host}"] = (host, se)

    _, gw_deploy = one("Deployment") if len(by_kind.get("Deployment", [])) == 1 else (None, None)
    gw_deploys = [d for _, d in by_kind.get("Deployment", [])
                  if d["spec"]["template"]["metadata"].get("annotations", {}).get("inject.istio.io/templates")
                  == "gateway"]
    if len(gw_deploys) != 1:
        err("manifests", f"expected one gateway Deployment (inject.istio.io/templates: gateway), "
                         f"found {len(gw_deploys)}")
        return
    gw = gw_deploys[0]
    gw_labels = gw["spec"]["template"]["metadata"]["labels"]

    file, wp = one("WasmPlugin")
    if not wp:
        return
    w = where(wp, file)
    cfg = wp["spec"]["pluginConfig"]
    if not selects(wp["spec"].get("selector", {}).get("matchLabels"), gw_labels):
        err(w, "selector does not select the gateway's pods")
    for section in ("quota", "global_buckets"):
        sec = cfg.get(section)
        if not sec:
            continue
        c = sec.get("cluster", "")
        if not re.fullmatch(r"outbound\|\d+\|\|[A-Za-z0-9.-]+", c):
            err(w, f"pluginConfig.{section}.cluster {c!r} is not an Istio cluster name outbound|<port>||<host>")
        elif c not in clusters:
            err(w, f"pluginConfig.{section}.cluster {c!r}: no Service or ServiceEntry in these manifests makes it")
        elif sec.get("authority") != clusters[c][0]:
            err(w, f"pluginConfig.{section}.authority must be the host {clusters[c][0]!r}")
    for src, fb in (cfg.get("breaker", {}).get("cluster_fallbacks") or {}).items():
        for c in (src, fb.get("cluster")):
            if c not in clusters:
                err(w, f"pluginConfig.breaker.cluster_fallbacks: {c!r} is not a cluster of these manifests")
    for i, r in enumerate(cfg.get("rules", [])):
        if r.get("tenant", "*") != "*":
            err(w, f"pluginConfig.rules[{i}] is for tenant {r['tenant']!r}: no demo tenants in the Istio config")
    if (cfg.get("quota") or {}).get("tenants"):
        err(w, "pluginConfig.quota.tenants: no demo tenants in the Istio config")
    tenant_header = cfg.get("tenant_header")

    # Every selector selects the gateway.
    for kind in ("EnvoyFilter", "RequestAuthentication"):
        for file, d in by_kind.get(kind, []):
            sel = d["spec"].get("workloadSelector", {}).get("labels") or \
                d["spec"].get("selector", {}).get("matchLabels")
            if not selects(sel, gw_labels):
                err(where(d, file), "does not select the gateway's pods")

    # Identity: header_mutation first removes the tenant header; RequestAuthentication sets it.
    removed, first = set(), False
    for file, ef in by_kind.get("EnvoyFilter", []):
        for p in ef["spec"]["configPatches"]:
            v = p["patch"].get("value", {})
            if p["applyTo"] == "HTTP_FILTER" and v.get("name") == "envoy.filters.http.header_mutation":
                first = p["patch"]["operation"] == "INSERT_FIRST" and p["match"].get("context") == "GATEWAY"
                for m in v["typed_config"]["mutations"]["request_mutations"]:
                    removed.add(m.get("remove"))
    if not first:
        err("identity", "no EnvoyFilter inserts header_mutation FIRST in the gateway's HTTP filters")
    for h in (tenant_header, "x-tokengate-group"):
        if h not in removed:
            err("identity", f"header_mutation does not remove the client's {h}")
    outs = {(o["claim"], o["header"]) for _, ra in by_kind.get("RequestAuthentication", [])
            for r in ra["spec"]["jwtRules"] for o in r.get("outputClaimToHeaders", [])}
    if ("tenant", tenant_header) not in outs or ("group", "x-tokengate-group") not in outs:
        err("identity", f"RequestAuthentication must output claims tenant -> {tenant_header} and "
                        f"group -> x-tokengate-group, has {sorted(outs)}")

    # Egress: VirtualService destinations are ServiceEntry HTTP ports with TLS originated by a DR.
    drs = {d["spec"]["host"]: d for _, d in by_kind.get("DestinationRule", [])}
    ses = {h: se for _, se in by_kind.get("ServiceEntry", []) for h in se["spec"]["hosts"]}
    for file, vs in by_kind.get("VirtualService", []):
        for route in vs["spec"].get("http", []):
            for dest in route.get("route", []):
                host, port = dest["destination"]["host"], dest["destination"].get("port", {}).get("number")
                if host not in ses:
                    continue
                se_port = [p for p in ses[host]["spec"]["ports"] if p["number"] == port]
                if not se_port or se_port[0]["protocol"] != "HTTP":
                    err(where(vs, file), f"{host}:{port} must be an HTTP port of its ServiceEntry "
                                         f"(TLS passthrough hides requests from the filter)")
                dr = drs.get(host)
                tls = [s.get("tls", {}) for s in (dr or {}).get("spec", {}).get("trafficPolicy", {})
                       .get("portLevelSettings", []) if s.get("port", {}).get("number") == port]
                if not tls or tls[0].get("mode") != "SIMPLE" or tls[0].get("sni") != host:
                    err(where(vs, file), f"no DestinationRule originating TLS (SIMPLE, sni {host}) on port {port}")

    # Buffer limits: the gateway listener (Service targetPort) and the provider cluster.
    gw_ports = {p.get("targetPort") for _, s in by_kind.get("Service", [])
                if selects(s["spec"].get("selector"), gw_labels) for p in s["spec"]["ports"]}
    listener_ok = cluster_ok = False
    for file, ef in by_kind.get("EnvoyFilter", []):
        for p in ef["spec"]["configPatches"]:
            v = p["patch"].get("value", {})
            limit = v.get("per_connection_buffer_limit_bytes", 0)
            if p["applyTo"] == "LISTENER" and p["match"]["listener"].get("portNumber") in gw_ports:
                listener_ok = limit >= cfg.get("max_body_bytes", 8388608)
            if p["applyTo"] == "CLUSTER":
                c = p["match"]["cluster"]
                if f"outbound|{c.get('portNumber')}||{c.get('service')}" in clusters:
                    cluster_ok = limit >= cfg.get("max_body_bytes", 8388608)
    if not listener_ok:
        err("buffer limits", f"no LISTENER patch on the gateway port {sorted(gw_ports)} raising "
                             "per_connection_buffer_limit_bytes to max_body_bytes or more")
    if not cluster_ok:
        err("buffer limits", "no CLUSTER patch raising the provider cluster's per_connection_buffer_limit_bytes")
    return clusters, drs, cfg


def bootstrap(docs, clusters, drs, cfg, wasm):
    """An Envoy bootstrap from the Envoy fragments of the manifests (see the module doc)."""
    filters, listener_patch, cluster_patches = [], {}, {}
    for _, d in docs:
        if d.get("kind") != "EnvoyFilter":
            continue
        for p in d["spec"]["configPatches"]:
            v = p["patch"].get("value", {})
            if p["applyTo"] == "HTTP_FILTER":
                filters.append(v)
            elif p["applyTo"] == "LISTENER":
                listener_patch.update(v)
            elif p["applyTo"] == "CLUSTER":
                c = p["match"]["cluster"]
                cluster_patches[f"outbound|{c['portNumber']}||{c['service']}"] = v
    wasm_filter = {
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": "tokengate", "root_id": "tokengate", "failure_policy": "FAIL_RELOAD",
                "vm_config": {"vm_id": "tokengate", "runtime": "envoy.wasm.runtime.v8",
                              "code": {"local": {"filename": wasm}}},
                "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                  "value": json.dumps(cfg)}}}}
    router = {"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
    out_clusters = []
    for name, (host, _) in sorted(clusters.items()):
        port = int(name.split("|")[1])
        c = {"name": name, "type": "STRICT_DNS", "connect_timeout": "1s",
             "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
                 "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}
        dr = drs.get(host)
        for s in (dr or {}).get("spec", {}).get("trafficPolicy", {}).get("portLevelSettings", []):
            tls = s.get("tls", {})
            if s.get("port", {}).get("number") == port and tls.get("mode") == "SIMPLE":
                c["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                    "sni": tls["sni"],
                    "common_tls_context": {"validation_context": {
                        "trusted_ca": {"filename": tls.get("caCertificates",
                                                           "/etc/ssl/certs/ca-certificates.crt")},
                        "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": san}}
                                                          for san in tls.get("subjectAltNames", [])]}}}}
        c.update(cluster_patches.get(name, {}))
        out_clusters.append(c)
    route_cluster = next(n for n in sorted(clusters) if n in cluster_patches)
    listener = {"name": "gateway_8080", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": route_cluster}}]}]},
        "http_filters": filters + [wasm_filter, router]}}]}]}
    listener.update(listener_patch)
    return {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
            "static_resources": {"listeners": [listener], "clusters": out_clusters}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", default=os.path.join(HERE, "..", "envoy", "istio"))
    ap.add_argument("--bootstrap")
    ap.add_argument("--wasm", default="target/wasm32-wasip1/release/tokengate.wasm")
    ap.add_argument("--extract")
    a = ap.parse_args()
    if a.extract:
        extract(a.extract)
        return
    docs = []
    for name in sorted(os.listdir(a.dir)):
        if name.endswith((".yaml", ".yml")):
            path = os.path.join(a.dir, name)
            with open(path, encoding="utf-8") as f:
                docs += [(path, d) for d in yaml.safe_load_all(f) if d]
    validate_schemas(docs)
    refs = check_references(docs)
    if a.bootstrap and refs:
        with open(a.bootstrap, "w", encoding="utf-8") as f:
            json.dump(bootstrap(docs, *refs, os.path.abspath(a.wasm)), f, indent=1)
    print(f"validate-istio: {len(docs)} resources, {len(errors)} errors")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
