//! Every plugin configuration shown in README.md and docs/*.md, and shipped in envoy/*.yaml and deploy/
//! (an Istio WasmPlugin's `pluginConfig`), loaded into real Envoy 1.40 behind the shipped identity chain
//! and attacked as a hostile client would (issue 26): a documented or shipped example can never again
//! ship a hole.
//!
//! **Shipped configurations.** In envoy/*.yaml the plugin configuration sits between
//! `# tokengate:plugin-config-begin` and `-end` (a `value: |` block) and runs behind that file's own
//! identity block; a WasmPlugin's `pluginConfig:` runs behind the shipped `envoy/envoy.yaml` one (what
//! Istio builds from a `RequestAuthentication`: `jwt_authn`, `payload_in_metadata: payload`, the token
//! not forwarded). A YAML file that runs the filter without a configuration the test finds fails.
//!
//! **Which blocks are configurations.** Every fenced block of README.md and docs/*.md is classified; one
//! that cannot be fails the test, naming its file and line:
//! - a ```` ```json ```` block is a complete plugin configuration (a JSON object), loaded as written;
//! - unless the line before its fence is a marker: `<!-- doc-example: fragment {…} -->` — members of a
//!   configuration (`"quota": {…}`, or an object), loaded merged over [`BASE`] and the marker's object
//!   (what the fragment depends on, such as its group levels); or `<!-- doc-example: not-config -->` —
//!   not a plugin configuration (a response body), skipped;
//! - a block in another language must not hold one: a block naming an identity setting
//!   ([`CONFIG_WORDS`]) fails unless it is marked not-config.
//!
//! **The chain.** One Envoy (concurrency 1) with two listeners per example, each running the identity
//! filter of the shipped `envoy/envoy.yaml` as it is (the lines between `# tokengate:identity-begin` and
//! `-end`: `jwt_authn` with the demo HS256 key, the token in `x-tokengate-jwt`, its payload in the dynamic
//! metadata; nothing removes or sets an identity header) and then tokengate, in its own `vm_id`:
//! - `as-is`: the example as written (its Redis callouts given 5 s, [`patient`]);
//! - `ledger`: the example plus a Redis ledger of who is charged — its `quota` (or a new one) without
//!   leases, with `model_limits` for every model the probes name and a token budget per group level
//!   (`docledger-<level>`), so that every admitted request reserves `tg:q:{<tenant>}:<month>`,
//!   `…:<month>:m:<model>` and `tg:q:{~b:docledger-<level>:<group path>}:<month>` before it is forwarded.
//!
//! **The probes**, each with fresh names: a control request; forged tenant headers and a forged `key:`
//! tenant; forged group headers at every level the example defines, next to a token with groups and one
//! without; a forged `x-tokengate-model` (and the example's `model_header`) with and without a body
//! `model`; API keys: unlisted, two different ones, `Authorization` twice, an unlisted key or (with
//! `api_keys`) another tenant's listed key next to a valid token; tokens signed with another key, expired,
//! `alg: none`, or from another issuer; verified claims of the wrong type (an object, a list of two, a
//! float, a boolean, a negative number, a string that is no id) and of the accepted ones (a whole number,
//! a one-element list), at the tenant claim and at every group claim.
//!
//! An oracle computes from the example what each probe must get, by the documented precedence (verified
//! claim > API key, listed in `api_keys` or hashed > `default_tenant`; the model from the body, else
//! `default_model`, else 400): refused (status and `x-tokengate-reason`, or `jwt_authn`'s 401), or
//! admitted as the verified identity (tenant, group at each level, model). A request header is never
//! identity here: nothing in the chain removes a client's copy, so an example that trusts one fails.
//! So a configuration with `trusted_headers` fails here by design; docs/deploying.md gives that recipe
//! in prose, and this test does not run its header chain.
//! Checked for each probe: the status and reason; the audit record's tenant and model; on the `ledger`
//! listener, the tenant's, model's and groups' ledger keys. Checked at the end: no forged name in any Redis
//! key or audit record; neither a token nor a verified id reached the provider.
//!
//! `DOC_EXAMPLES_FILES=docs/limits.md,README.md` restricts the files read (to try one example, or an old
//! version of one). Shown to fail: docs/limits.md's former example (`tenant_header` and
//! `{"name": "org", "header": "x-tokengate-org"}`) is refused by the filter; with `trusted_headers` added
//! it loads and the forged tenant and org headers are charged; on the v0.1.0 module
//! (`TOKENGATE_WASM=wasm-test/artefacts/tokengate-v0.1.0.wasm`) it loads as written and the same forgeries
//! are charged.

mod jwt;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jwt::{base64url, hex, mint, shipped_demo_key};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use wasm_test::{
    free_port, http, mock_provider, redis_cmd, repo_root, require_wasm, tail, RedisServer,
    RespValue, TempDir, Webdis,
};

/// What a fragment is merged over (before the marker's own object): a tenant from the verified `tenant`
/// claim, as the shipped configurations do, and one roomy rule (a configuration needs rules or limits).
const BASE: &str = r#"{"tenant_claim": "tenant",
  "rules": [{"name": "doc-base", "tokens_per_second": 1000000, "burst": 10000000}]}"#;

/// Words that mark a plugin configuration (or an identity setting of one) in a block that is not JSON.
const CONFIG_WORDS: [&str; 11] = [
    "tenant_claim",
    "tenant_header",
    "group_header",
    "trusted_headers",
    "api_keys",
    "api_key_tenants",
    "tenant_groups",
    "default_tenant",
    "jwt_metadata",
    "forward_identity_headers",
    "pluginConfig",
];

/// The namespace `jwt_authn` writes its dynamic metadata in.
const JWT_NAMESPACE: &str = "envoy.filters.http.jwt_authn";

/// The header the shipped chain reads a token from.
const TOKEN_HEADER: &str = "x-tokengate-jwt";

/// The chat path every probe posts to.
const CHAT: &str = "/v1/chat/completions";

/// Budgets of the ledger listener are named `docledger-<level>`.
const LEDGER: &str = "docledger";

/// The Redis callout timeout of every listener ([`patient`]).
const CALLOUT_TIMEOUT_MS: u64 = 5000;

/// A limit no probe reaches.
const ROOMY: u64 = 1_000_000_000_000;

// ---------------------------------------------------------------------------------------------
// Extraction
// ---------------------------------------------------------------------------------------------

/// A fenced block of a Markdown file.
#[derive(Debug)]
struct Block {
    /// `file:line` of the opening fence.
    at: String,
    /// The fence's language (`json`, `yaml`, empty).
    lang: String,
    /// The lines between the fences.
    text: String,
    /// The marker on the line before the fence, if any.
    marker: Option<String>,
}

/// What a marker says.
#[derive(Debug, PartialEq)]
enum Marker {
    /// Members of a configuration, merged over [`BASE`] and this object.
    Fragment(Value),
    /// Not a plugin configuration.
    NotConfig,
}

/// The fenced blocks of `text` (file `file`), with the marker before each.
fn blocks(file: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim_start();
        if let Some(lang) = t.strip_prefix("```") {
            let start = i;
            let indent = lines[i].len() - t.len();
            let mut body = Vec::new();
            i += 1;
            while i < lines.len() && lines[i].trim() != "```" {
                body.push(lines[i].get(indent..).unwrap_or(lines[i].trim_start()));
                i += 1;
            }
            assert!(
                i < lines.len(),
                "{file}:{}: a code fence that is never closed",
                start + 1
            );
            let marker = start
                .checked_sub(1)
                .map(|p| lines[p].trim())
                .filter(|l| l.starts_with("<!--") && l.contains("doc-example"))
                .map(str::to_string);
            out.push(Block {
                at: format!("{file}:{}", start + 1),
                lang: lang.trim().to_string(),
                text: body.join("\n"),
                marker,
            });
        } else if t.starts_with("<!--") && t.contains("doc-example") {
            // A marker must sit right above a fence.
            let next = lines.get(i + 1).map(|l| l.trim_start()).unwrap_or("");
            assert!(
                next.starts_with("```"),
                "{file}:{}: a doc-example marker must be the line right above a code fence",
                i + 1
            );
        }
        i += 1;
    }
    out
}

/// Parses `<!-- doc-example: fragment {…} -->` / `<!-- doc-example: not-config … -->`.
fn parse_marker(at: &str, line: &str) -> Marker {
    let inner = line
        .trim()
        .strip_prefix("<!--")
        .and_then(|s| s.strip_suffix("-->"))
        .map(str::trim)
        .and_then(|s| s.strip_prefix("doc-example:"))
        .map(str::trim)
        .unwrap_or_else(|| panic!("{at}: malformed marker {line:?}: write `<!-- doc-example: fragment {{…}} -->` or `<!-- doc-example: not-config -->`"));
    if let Some(rest) = inner.strip_prefix("fragment") {
        let rest = rest.trim();
        if rest.is_empty() {
            return Marker::Fragment(json!({}));
        }
        let base: Value = serde_json::from_str(rest)
            .unwrap_or_else(|e| panic!("{at}: the marker's base is not JSON ({e}): {rest}"));
        assert!(
            base.is_object(),
            "{at}: the marker's base must be an object"
        );
        return Marker::Fragment(base);
    }
    if inner.starts_with("not-config") {
        return Marker::NotConfig;
    }
    panic!("{at}: unknown doc-example marker {line:?} (fragment or not-config)")
}

/// A plugin configuration from the docs.
#[derive(Clone, Debug)]
struct Example {
    /// `file:line` of its block.
    at: String,
    /// The configuration to load (a fragment already merged).
    config: Value,
    /// The whole file (raw API keys named in its text).
    doc: String,
    /// The file whose identity block (`# tokengate:identity-begin` … `-end`) runs before the filter: the
    /// example's own Envoy config when it is one, else the shipped `envoy/envoy.yaml`.
    chain: String,
}

/// `a` with the top-level members of each later object set.
fn merged(layers: &[&Value]) -> Value {
    let mut out = Map::new();
    for l in layers {
        if let Some(o) = l.as_object() {
            for (k, v) in o {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// Every example of README.md and docs/*.md (or of `DOC_EXAMPLES_FILES`); panics on a block that cannot be
/// classified.
fn examples() -> Vec<Example> {
    let root = repo_root();
    let files: Vec<String> = match std::env::var("DOC_EXAMPLES_FILES") {
        Ok(list) if !list.trim().is_empty() => {
            list.split(',').map(|s| s.trim().to_string()).collect()
        }
        _ => {
            let mut v = vec!["README.md".to_string()];
            v.extend(files_in(&root, "docs", ".md"));
            v.extend(files_in(&root, "envoy", ".yaml"));
            v.extend(files_in(&root, "deploy", ".yaml"));
            v
        }
    };
    let base: Value = serde_json::from_str(BASE).expect("BASE is JSON");
    let mut out = Vec::new();
    for file in files {
        let doc = fs::read_to_string(root.join(&file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        if file.ends_with(".yaml") {
            for (at, config) in yaml_configs(&file, &doc) {
                let chain = if doc.contains("# tokengate:identity-begin") {
                    file.clone()
                } else {
                    "envoy/envoy.yaml".to_string()
                };
                out.push(Example {
                    at,
                    config,
                    doc: doc.clone(),
                    chain,
                });
            }
            continue;
        }
        for b in blocks(&file, &doc) {
            let marker = b.marker.as_deref().map(|m| parse_marker(&b.at, m));
            if marker == Some(Marker::NotConfig) {
                continue;
            }
            if b.lang != "json" {
                assert!(
                    marker.is_none(),
                    "{}: a fragment marker on a ```{} block: plugin configurations are shown as ```json",
                    b.at,
                    b.lang
                );
                if let Some(w) = CONFIG_WORDS.iter().find(|w| b.text.contains(*w)) {
                    panic!(
                        "{}: a ```{} block names `{w}`: show a plugin configuration as a ```json block (it is then \
                         loaded and spoof-tested), or mark the block `<!-- doc-example: not-config -->`",
                        b.at, b.lang
                    );
                }
                continue;
            }
            let config = match marker {
                None => {
                    let v: Value = serde_json::from_str(&b.text).unwrap_or_else(|e| {
                        panic!(
                            "{}: a ```json block that is not a complete plugin configuration ({e}): make it one, \
                             or mark it `<!-- doc-example: fragment {{…}} -->` (members of a configuration) or \
                             `<!-- doc-example: not-config -->`",
                            b.at
                        )
                    });
                    assert!(
                        v.is_object(),
                        "{}: a ```json block that is not an object: a plugin configuration is one, else mark it",
                        b.at
                    );
                    v
                }
                Some(Marker::Fragment(extra)) => {
                    let text = b.text.trim();
                    let wrapped = if text.starts_with('{') {
                        text.to_string()
                    } else {
                        format!("{{{text}}}")
                    };
                    let frag: Value = serde_json::from_str(&wrapped).unwrap_or_else(|e| {
                        panic!(
                            "{}: a fragment that is not members of a JSON object ({e})",
                            b.at
                        )
                    });
                    merged(&[&base, &extra, &frag])
                }
                Some(Marker::NotConfig) => unreachable!(),
            };
            out.push(Example {
                at: b.at,
                config,
                doc: doc.clone(),
                chain: "envoy/envoy.yaml".to_string(),
            });
        }
    }
    out
}

/// The files under `dir` (recursively) whose names end with `ext`, as repository paths, sorted.
fn files_in(root: &std::path::Path, dir: &str, ext: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![root.join(dir)];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                todo.push(p);
            } else if p.to_string_lossy().ends_with(ext) {
                let rel = p.strip_prefix(root).expect("under the root");
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// The plugin configurations of an Envoy or Istio YAML file: the Envoy bootstraps' string between
/// `# tokengate:plugin-config-begin` and `-end` (a `value: |` block), and a WasmPlugin's `pluginConfig:`
/// (JSON written as YAML flow, the lines indented under it). A file that names the filter
/// (`tokengate.wasm`, `kind: WasmPlugin`) without a configuration the test can find fails.
fn yaml_configs(file: &str, text: &str) -> Vec<(String, Value)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let t = line.trim_start();
        let indent = line.len() - t.len();
        let start = i + 1;
        let body: Vec<&str> = if t.starts_with("# tokengate:plugin-config-begin") {
            let mut body = Vec::new();
            i += 1;
            while i < lines.len()
                && !lines[i]
                    .trim_start()
                    .starts_with("# tokengate:plugin-config-end")
            {
                body.push(lines[i]);
                i += 1;
            }
            assert!(
                i < lines.len(),
                "{file}:{start}: plugin-config-begin without -end"
            );
            let first = body.first().map(|l| l.trim()).unwrap_or("");
            assert!(
                first == "value: |",
                "{file}:{start}: the plugin configuration must be a `value: |` block, found {first:?}"
            );
            body.split_off(1)
        } else if t.starts_with("pluginConfig:") {
            let mut body = vec![t.trim_start_matches("pluginConfig:")];
            i += 1;
            while i < lines.len() {
                let l = lines[i];
                let lt = l.trim_start();
                if !lt.is_empty() && l.len() - lt.len() <= indent {
                    break;
                }
                body.push(l);
                i += 1;
            }
            i -= 1;
            body
        } else {
            i += 1;
            continue;
        };
        let json = body.join("\n");
        let v: Value = serde_json::from_str(&json).unwrap_or_else(|e| {
            panic!("{file}:{start}: the plugin configuration is not JSON ({e}): the test loads it as written")
        });
        assert!(
            v.is_object(),
            "{file}:{start}: the plugin configuration is not an object"
        );
        out.push((format!("{file}:{start}"), v));
        i += 1;
    }
    let names_filter = text.contains("envoy.filters.http.wasm")
        || text.lines().any(|l| l.trim_end() == "kind: WasmPlugin");
    assert!(
        out.len() >= usize::from(names_filter),
        "{file}: runs the filter, but no plugin configuration is marked (`# tokengate:plugin-config-begin` \
         … `-end` around a `value: |`, or a WasmPlugin's `pluginConfig:`): mark it so it is spoof-tested"
    );
    out
}

// ---------------------------------------------------------------------------------------------
// What an example says about identity
// ---------------------------------------------------------------------------------------------

/// A group level.
#[derive(Clone, Debug)]
struct Level {
    name: String,
    claim: Option<Vec<String>>,
    header: Option<String>,
}

/// The identity settings of an example, as the oracle needs them.
#[derive(Clone, Debug)]
struct Spec {
    tenant_claim: Option<Vec<String>>,
    /// `jwt_metadata.key` (the shipped chain's `payload_in_metadata`).
    payload_key: String,
    levels: Vec<Level>,
    tenant_header: Option<String>,
    model_header: String,
    api_key_tenants: bool,
    /// `api_keys`: SHA-256 hex → tenant.
    api_keys: Option<BTreeMap<String, String>>,
    /// Raw keys named in the document whose SHA-256 `api_keys` lists: (key, tenant).
    raw_keys: Vec<(String, String)>,
    default_tenant: Option<String>,
    tenant_groups: BTreeMap<String, BTreeMap<String, String>>,
    /// `default_model` for a route without a name of its own (`*`, or the plain string).
    default_model: Option<String>,
    /// The body model of the probes and a forged one.
    model: String,
    forged_model: String,
}

/// A claim path as configured: `"a.b"` or `["a", "b"]`.
fn claim_path(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => s.split('.').map(str::to_string).collect(),
        Value::Array(a) => a
            .iter()
            .map(|s| s.as_str().expect("claim segment").to_string())
            .collect(),
        other => panic!("claim path {other}"),
    }
}

fn sha256_hex(s: &str) -> String {
    hex(&Sha256::digest(s.as_bytes()))
}

/// The tenant the filter derives from an unlisted key: `key:<16 hex of SHA-256>`.
fn key_tenant(key: &str) -> String {
    format!("key:{}", &sha256_hex(key)[..16])
}

/// Exact model names an example mentions (limits, rules, models, quota, default_model).
fn models_of(c: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |m: &str| {
        if !m.is_empty() && !m.contains('*') && !out.iter().any(|x| x == m) {
            out.push(m.to_string());
        }
    };
    for list in ["limits", "rules"] {
        for r in c[list].as_array().into_iter().flatten() {
            if let Some(m) = r["model"].as_str() {
                add(m);
            }
        }
    }
    for key in [
        &c["models"],
        &c["quota"]["model_limits"],
        &c["quota"]["weights"],
    ] {
        for m in key.as_object().into_iter().flatten().map(|(k, _)| k) {
            add(m);
        }
    }
    out
}

fn spec(ex: &Example) -> Spec {
    let c = &ex.config;
    let at = &ex.at;
    let (namespace, payload_key) = match c.get("jwt_metadata") {
        Some(m) => (
            m["namespace"].as_str().unwrap_or(JWT_NAMESPACE).to_string(),
            m["key"].as_str().unwrap_or("payload").to_string(),
        ),
        None => (JWT_NAMESPACE.to_string(), "payload".to_string()),
    };
    assert_eq!(
        namespace, JWT_NAMESPACE,
        "{at}: jwt_metadata.namespace {namespace}: the test's chain (the shipped jwt_authn) writes only {JWT_NAMESPACE}"
    );
    let mut levels = Vec::new();
    if let Some(h) = c["group_header"].as_str() {
        levels.push(Level {
            name: "group".into(),
            claim: None,
            header: Some(h.to_ascii_lowercase()),
        });
    }
    for g in c["groups"].as_array().into_iter().flatten() {
        levels.push(Level {
            name: g["name"].as_str().expect("groups[].name").to_string(),
            claim: g.get("claim").map(claim_path),
            header: g["header"].as_str().map(str::to_ascii_lowercase),
        });
    }
    let api_keys = c.get("api_keys").map(|m| {
        let mut out = BTreeMap::new();
        for (tenant, digests) in m.as_object().expect("api_keys object") {
            for d in digests.as_array().expect("api_keys digests") {
                let d = d.as_str().expect("digest");
                let d = d.strip_prefix("sha256:").unwrap_or(d).to_ascii_lowercase();
                out.insert(d, tenant.clone());
            }
        }
        out
    });
    // Raw keys: any word of the document whose SHA-256 is listed.
    let mut raw_keys = Vec::new();
    if let Some(listed) = &api_keys {
        let words: BTreeSet<&str> = ex
            .doc
            .split(|ch: char| ch.is_whitespace() || "`\"'(),;|<>[]{}".contains(ch))
            .filter(|w| w.len() >= 4)
            .collect();
        for w in words {
            if let Some(t) = listed.get(&sha256_hex(w)) {
                raw_keys.push((w.to_string(), t.clone()));
            }
        }
        assert!(
            !raw_keys.is_empty(),
            "{at}: api_keys lists digests of keys the document never names: name one (`printf %s sk-… | sha256sum`) so the \
             test can present it"
        );
    }
    let default_model = match &c["default_model"] {
        Value::String(s) => Some(s.clone()),
        Value::Object(m) => m.get("*").and_then(Value::as_str).map(str::to_string),
        _ => None,
    };
    let models = models_of(c);
    let model = models
        .first()
        .cloned()
        .unwrap_or_else(|| "gpt-4.1".to_string());
    let forged_model = models
        .iter()
        .find(|m| **m != model)
        .cloned()
        .unwrap_or_else(|| {
            if model == "gpt-4.1-mini" {
                "gpt-4o-mini".into()
            } else {
                "gpt-4.1-mini".into()
            }
        });
    let tenant_groups = c["tenant_groups"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(t, g)| {
            let g = g
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(l, v)| Some((l.clone(), v.as_str()?.to_string())))
                .collect();
            (t.clone(), g)
        })
        .collect();
    Spec {
        tenant_claim: c.get("tenant_claim").map(claim_path),
        payload_key,
        levels,
        tenant_header: c["tenant_header"].as_str().map(str::to_ascii_lowercase),
        model_header: c["model_header"]
            .as_str()
            .unwrap_or("x-tokengate-model")
            .to_ascii_lowercase(),
        api_key_tenants: c["api_key_tenants"].as_bool().unwrap_or(true),
        api_keys,
        raw_keys,
        default_tenant: c["default_tenant"].as_str().map(str::to_string),
        tenant_groups,
        default_model,
        model,
        forged_model,
    }
}

/// The example with the Redis ledger ([module docs](self)).
fn ledger_config(c: &Value, s: &Spec) -> Value {
    let mut c = c.clone();
    let obj = c.as_object_mut().expect("config object");
    let mut quota = obj
        .remove("quota")
        .unwrap_or_else(|| json!({"cluster": "webdis", "timeout_ms": 1000}));
    let q = quota.as_object_mut().expect("quota object");
    q.remove("lease");
    q.entry("monthly_limit").or_insert(json!(ROOMY));
    let ml = q
        .entry("model_limits")
        .or_insert(json!({}))
        .as_object_mut()
        .expect("model_limits object");
    let mut names = vec![s.model.clone(), s.forged_model.clone()];
    names.extend(s.default_model.clone());
    for m in names {
        ml.entry(m).or_insert(json!(ROOMY));
    }
    let budgets = q
        .entry("budgets")
        .or_insert(json!([]))
        .as_array_mut()
        .expect("budgets array");
    for l in &s.levels {
        budgets.push(
            json!({"name": format!("{LEDGER}-{}", l.name), "scope": l.name,
                            "unit": "tokens", "monthly_limit": ROOMY}),
        );
    }
    obj.insert("quota".into(), quota);
    c
}

/// `c` with its Redis callouts given [`CALLOUT_TIMEOUT_MS`] (a shared, loaded host answers a callout in
/// more than the usual 100 ms at times; a timeout is no identity matter).
fn patient(c: &Value) -> Value {
    let mut c = c.clone();
    for k in ["quota", "global_buckets"] {
        if let Some(o) = c.get_mut(k).and_then(Value::as_object_mut) {
            o.insert("timeout_ms".into(), json!(CALLOUT_TIMEOUT_MS));
        }
    }
    c
}

// ---------------------------------------------------------------------------------------------
// Probes and the oracle
// ---------------------------------------------------------------------------------------------

/// The token a probe carries.
#[derive(Clone, Debug)]
enum Tok {
    None,
    /// A valid token with this payload (iss, aud, exp added).
    Valid(Value),
    /// A token `jwt_authn` must refuse.
    Bad(String),
}

/// One request of the suite.
#[derive(Clone, Debug)]
struct Probe {
    what: String,
    tok: Tok,
    /// `Authorization: Bearer <k>` lines.
    bearer: Vec<String>,
    /// `x-api-key` lines.
    xkey: Vec<String>,
    forged: Vec<(String, String)>,
    /// The body's model (None: no `model` member).
    model: Option<String>,
}

/// What a probe must get.
#[derive(Clone, Debug, PartialEq)]
enum Expect {
    /// `jwt_authn`'s 401.
    JwtRefused,
    /// The filter's refusal.
    Refused(u16, &'static str),
    /// Admitted, charged to this tenant, these groups (per level) and model.
    Admitted {
        tenant: String,
        groups: Vec<Option<String>>,
        model: String,
    },
}

/// A verified claim as the filter reads it.
enum ClaimVal {
    Missing,
    Id(String),
    Invalid,
}

fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'-'))
}

/// The claim at `path` of a verified payload, by the documented reading (strings, whole numbers,
/// one-element lists; anything else is of the wrong type).
fn claim_at(payload: &Value, path: &[String]) -> ClaimVal {
    let mut v = payload;
    for seg in path {
        match v.get(seg.as_str()) {
            Some(x) if v.is_object() => v = x,
            _ => return ClaimVal::Missing,
        }
    }
    match v {
        Value::String(s) if valid_id(s) => ClaimVal::Id(s.clone()),
        Value::Number(n) => match n.as_f64() {
            // Envoy hands a number over as the 8 bytes of a double; printable ones are read as text.
            Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= 9_007_199_254_740_992.0 => {
                match std::str::from_utf8(&x.to_le_bytes()) {
                    Ok(t) if !t.chars().any(char::is_control) => match valid_id(t) {
                        true => ClaimVal::Id(t.to_string()),
                        false => ClaimVal::Invalid,
                    },
                    _ => ClaimVal::Id(format!("{}", x as u64)),
                }
            }
            _ => ClaimVal::Invalid,
        },
        Value::Null => ClaimVal::Missing,
        Value::Array(a) if a.len() == 1 => match &a[0] {
            Value::String(s) if valid_id(s) => ClaimVal::Id(s.clone()),
            _ => ClaimVal::Invalid,
        },
        _ => ClaimVal::Invalid,
    }
}

/// What the filter must answer `p` with under `s` ([module docs](self)).
fn expect(s: &Spec, p: &Probe) -> Expect {
    let payload = match &p.tok {
        Tok::Bad(_) => return Expect::JwtRefused,
        Tok::Valid(v) => Some(v),
        Tok::None => None,
    };
    let claim = |path: &Option<Vec<String>>| match (payload, path) {
        (Some(pl), Some(path)) => claim_at(pl, path),
        _ => ClaimVal::Missing,
    };
    let verified = match claim(&s.tenant_claim) {
        ClaimVal::Invalid => return Expect::Refused(403, "invalid_identity_claim"),
        ClaimVal::Id(t) => Some(t),
        ClaimVal::Missing => None,
    };
    let keys: BTreeSet<&str> = p.bearer.iter().chain(&p.xkey).map(String::as_str).collect();
    let key = match keys.len() {
        0 => Ok(None),
        1 => Ok(keys.iter().next().copied()),
        _ => Err(()),
    };
    let tenant = match (&s.api_keys, s.api_key_tenants) {
        (Some(listed), true) => match key {
            Err(()) => return Expect::Refused(401, "missing_tenant"),
            Ok(Some(k)) => match listed.get(&sha256_hex(k)) {
                None => return Expect::Refused(401, "missing_tenant"),
                Some(t) => match &verified {
                    Some(v) if v != t => return Expect::Refused(401, "identity_conflict"),
                    Some(v) => v.clone(),
                    None => t.clone(),
                },
            },
            Ok(None) => match (&verified, &s.default_tenant) {
                (Some(v), _) => v.clone(),
                (None, Some(d)) => d.clone(),
                (None, None) => return Expect::Refused(401, "missing_tenant"),
            },
        },
        (_, api_key_tenants) => match (&verified, key, &s.default_tenant) {
            (Some(v), _, _) => v.clone(),
            (None, Err(()), _) if api_key_tenants => return Expect::Refused(401, "missing_tenant"),
            (None, Ok(Some(k)), _) if api_key_tenants => key_tenant(k),
            (None, _, Some(d)) => d.clone(),
            (None, _, None) => return Expect::Refused(401, "missing_tenant"),
        },
    };
    let groups = match s.tenant_groups.get(&tenant) {
        Some(fixed) => s
            .levels
            .iter()
            .map(|l| fixed.get(&l.name).cloned())
            .collect(),
        None => {
            let mut g = Vec::new();
            for l in &s.levels {
                g.push(match claim(&l.claim) {
                    ClaimVal::Invalid => return Expect::Refused(403, "invalid_identity_claim"),
                    ClaimVal::Id(x) => Some(x),
                    // A header is no identity here: nothing in the chain removes a client's copy.
                    ClaimVal::Missing => None,
                });
            }
            g
        }
    };
    let model = match p.model.clone().or_else(|| s.default_model.clone()) {
        Some(m) => m,
        None => return Expect::Refused(400, "model_required"),
    };
    Expect::Admitted {
        tenant,
        groups,
        model,
    }
}

/// Sets `value` at `path` in `payload`, creating objects on the way.
fn set_claim(payload: &mut Value, path: &[String], value: Value) {
    let mut v = payload;
    for (i, seg) in path.iter().enumerate() {
        if !v.is_object() {
            *v = json!({});
        }
        let o = v.as_object_mut().expect("object");
        if i + 1 == path.len() {
            o.insert(seg.clone(), value);
            return;
        }
        v = o.entry(seg.clone()).or_insert(json!({}));
    }
}

/// Fresh names for one probe.
struct Names {
    tag: String,
}

impl Names {
    fn attacker(&self, n: usize) -> String {
        format!("vrf-{}-{n}", self.tag)
    }
    fn group(&self, n: usize, level: &str) -> String {
        format!("vrf-{}-{n}-{level}", self.tag)
    }
    fn forged(&self, n: usize) -> String {
        format!("frg-{}-{n}", self.tag)
    }
    fn forged_group(&self, n: usize, level: &str) -> String {
        format!("frg-{}-{n}-{level}", self.tag)
    }
    fn key(&self, n: usize, what: &str) -> String {
        format!("sk-{what}-{}-{n}", self.tag)
    }
}

/// Header names a client could hope a tenant is read from.
fn tenant_headers(s: &Spec) -> Vec<String> {
    let mut v: Vec<String> = ["x-tenant-id", "x-tokengate-tenant", "x-tenant"]
        .map(String::from)
        .to_vec();
    v.extend(s.tenant_header.clone());
    v.sort();
    v.dedup();
    v
}

/// Header names a client could hope a level's group is read from.
fn group_headers(l: &Level) -> Vec<String> {
    let mut v = vec![
        format!("x-tokengate-{}", l.name),
        format!("x-{}", l.name),
        "x-tokengate-group".to_string(),
    ];
    v.extend(l.header.clone());
    v.sort();
    v.dedup();
    v
}

/// The probes for one listener (`tag` makes every name fresh).
fn probes(s: &Spec, tag: &str, number: &mut u64) -> Vec<Probe> {
    let names = Names { tag: tag.into() };
    let mut out = Vec::new();
    let mut n = 0usize;
    let any_claims = s.tenant_claim.is_some() || s.levels.iter().any(|l| l.claim.is_some());
    // A valid token for the attacker of probe `n`: their tenant and every group claim.
    let token = |n: usize, with_groups: bool| -> Value {
        let mut p = json!({"sub": names.attacker(n)});
        if let Some(path) = &s.tenant_claim {
            set_claim(&mut p, path, json!(names.attacker(n)));
        }
        if with_groups {
            for l in &s.levels {
                if let Some(path) = &l.claim {
                    set_claim(&mut p, path, json!(names.group(n, &l.name)));
                }
            }
        }
        p
    };
    // The attacker's own credentials: a token when the example reads claims, and a key when the tenant
    // comes from one.
    let creds = |n: usize, with_groups: bool| -> (Tok, Vec<String>) {
        let tok = if any_claims {
            Tok::Valid(token(n, with_groups))
        } else {
            Tok::None
        };
        let keys = if s.tenant_claim.is_some() {
            vec![]
        } else if let Some((k, _)) = s.raw_keys.first() {
            vec![k.clone()]
        } else {
            vec![names.key(n, "own")]
        };
        (tok, keys)
    };
    let mut push = |what: &str,
                    tok: Tok,
                    bearer: Vec<String>,
                    xkey: Vec<String>,
                    forged: Vec<(String, String)>,
                    model: Option<String>| {
        out.push(Probe {
            what: what.to_string(),
            tok,
            bearer,
            xkey,
            forged,
            model,
        });
    };
    let m = Some(s.model.clone());
    let forged_tenant = |n: usize| -> Vec<(String, String)> {
        tenant_headers(s)
            .into_iter()
            .map(|h| (h, names.forged(n)))
            .collect()
    };
    let forged_groups = |n: usize| -> Vec<(String, String)> {
        let mut v = Vec::new();
        for l in &s.levels {
            for h in group_headers(l) {
                v.push((h, names.forged_group(n, &l.name)));
            }
        }
        v.sort();
        v.dedup_by(|a, b| a.0 == b.0);
        v
    };

    n += 1;
    let (t, k) = creds(n, true);
    push(
        "control: the attacker's own credentials",
        t,
        k,
        vec![],
        vec![],
        m.clone(),
    );

    n += 1;
    let (t, k) = creds(n, true);
    push(
        "forged tenant headers",
        t,
        k,
        vec![],
        forged_tenant(n),
        m.clone(),
    );

    n += 1;
    let (t, k) = creds(n, true);
    let victim = key_tenant(&names.key(n, "victim"));
    let f = tenant_headers(s)
        .into_iter()
        .map(|h| (h, victim.clone()))
        .collect();
    push("a forged key: tenant header", t, k, vec![], f, m.clone());

    n += 1;
    let mut f = forged_tenant(n);
    f.extend(forged_groups(n));
    push(
        "forged tenant and group headers, no credentials",
        Tok::None,
        vec![],
        vec![],
        f,
        m.clone(),
    );

    if !s.levels.is_empty() {
        n += 1;
        let (t, k) = creds(n, true);
        push(
            "forged group headers next to verified groups",
            t,
            k,
            vec![],
            forged_groups(n),
            m.clone(),
        );
        n += 1;
        let (t, k) = creds(n, false);
        push(
            "forged group headers, a token without groups",
            t,
            k,
            vec![],
            forged_groups(n),
            m.clone(),
        );
    }

    let hints = |_: usize| -> Vec<(String, String)> {
        let mut v = vec![
            ("x-tokengate-model".to_string(), s.forged_model.clone()),
            (s.model_header.clone(), s.forged_model.clone()),
        ];
        v.dedup();
        v
    };
    n += 1;
    let (t, k) = creds(n, true);
    push(
        "a forged model header next to the body's model",
        t,
        k,
        vec![],
        hints(n),
        m.clone(),
    );
    n += 1;
    let (t, k) = creds(n, true);
    push(
        "a forged model header, a body without a model",
        t,
        k,
        vec![],
        hints(n),
        None,
    );
    n += 1;
    let (t, k) = creds(n, true);
    push("a body without a model", t, k, vec![], vec![], None);

    n += 1;
    push(
        "an unlisted key alone",
        Tok::None,
        vec![names.key(n, "unlisted")],
        vec![],
        vec![],
        m.clone(),
    );
    n += 1;
    push(
        "two different keys",
        Tok::None,
        vec![names.key(n, "one")],
        vec![names.key(n, "two")],
        vec![],
        m.clone(),
    );
    if any_claims {
        n += 1;
        push(
            "two different keys next to a valid token",
            Tok::Valid(token(n, true)),
            vec![names.key(n, "one")],
            vec![names.key(n, "two")],
            vec![],
            m.clone(),
        );
        n += 1;
        push(
            "Authorization twice next to a valid token",
            Tok::Valid(token(n, true)),
            vec![names.key(n, "one"), names.key(n, "two")],
            vec![],
            vec![],
            m.clone(),
        );
        n += 1;
        push(
            "an unlisted key next to a valid token",
            Tok::Valid(token(n, true)),
            vec![names.key(n, "unlisted")],
            vec![],
            vec![],
            m.clone(),
        );
        if let Some(claim) = &s.tenant_claim {
            for (k, t) in &s.raw_keys {
                n += 1;
                push(
                    &format!("{t}'s listed key next to another tenant's token"),
                    Tok::Valid(token(n, true)),
                    vec![k.clone()],
                    vec![],
                    vec![],
                    m.clone(),
                );
                n += 1;
                let mut own = token(n, true);
                set_claim(&mut own, claim, json!(t));
                push(
                    &format!("{t}'s listed key next to {t}'s own token"),
                    Tok::Valid(own),
                    vec![],
                    vec![k.clone()],
                    vec![],
                    m.clone(),
                );
            }
        }
    }

    // Tokens jwt_authn must refuse, each naming a forged identity.
    let key = shipped_demo_key();
    let mut wrong = key.clone();
    wrong[0] ^= 1;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let forged_payload = |n: usize| -> Value {
        let mut p = json!({"sub": names.forged(n)});
        if let Some(path) = &s.tenant_claim {
            set_claim(&mut p, path, json!(names.forged(n)));
        }
        for l in &s.levels {
            if let Some(path) = &l.claim {
                set_claim(&mut p, path, json!(names.forged_group(n, &l.name)));
            }
        }
        p
    };
    n += 1;
    push(
        "a token signed with another key",
        Tok::Bad(mint(&wrong, forged_payload(n))),
        vec![],
        vec![],
        vec![],
        m.clone(),
    );
    n += 1;
    let mut p = forged_payload(n);
    p["exp"] = json!(now - 600);
    push(
        "an expired token",
        Tok::Bad(mint(&key, p)),
        vec![],
        vec![],
        vec![],
        m.clone(),
    );
    n += 1;
    let mut p = forged_payload(n);
    p["iss"] = json!("someone-else");
    push(
        "a token from another issuer",
        Tok::Bad(mint(&key, p)),
        vec![],
        vec![],
        vec![],
        m.clone(),
    );
    n += 1;
    let mut p = forged_payload(n);
    p["iss"] = json!("tokengate-demo");
    p["aud"] = json!("tokengate");
    p["exp"] = json!(now + 300);
    let none = format!(
        "{}.{}.",
        base64url(br#"{"alg":"none","typ":"JWT"}"#),
        base64url(p.to_string().as_bytes())
    );
    push(
        "an alg: none token",
        Tok::Bad(none),
        vec![],
        vec![],
        vec![],
        m.clone(),
    );

    // Verified claims of the wrong type, and of the accepted ones, at every claim the example reads.
    let mut paths: Vec<(String, Vec<String>)> = Vec::new();
    if let Some(p) = &s.tenant_claim {
        paths.push(("tenant".into(), p.clone()));
    }
    for l in &s.levels {
        if let Some(p) = &l.claim {
            paths.push((l.name.clone(), p.clone()));
        }
    }
    for (which, path) in &paths {
        for (kind, value) in [
            ("an object", json!({"id": names.forged(n)})),
            (
                "a list of two",
                json!([names.forged(n), names.forged(n + 1)]),
            ),
            ("a float", json!(12.5)),
            ("a boolean", json!(true)),
            ("a negative number", json!(-3)),
            ("a string that is no id", json!("two words")),
            // 8 bytes: read as a double they make a whole number (5946584628076641).
            ("8 bytes of text that is no id", json!("a b c 5C")),
        ] {
            n += 1;
            let mut p = token(n, true);
            set_claim(&mut p, path, value);
            push(
                &format!("the {which} claim is {kind}"),
                Tok::Valid(p),
                vec![],
                vec![],
                vec![],
                m.clone(),
            );
        }
        *number += 1;
        n += 1;
        let mut p = token(n, true);
        set_claim(&mut p, path, json!(*number));
        push(
            &format!("the {which} claim is a whole number"),
            Tok::Valid(p),
            vec![],
            vec![],
            vec![],
            m.clone(),
        );
        n += 1;
        let mut p = token(n, true);
        let one = if which == "tenant" {
            names.attacker(n)
        } else {
            names.group(n, which)
        };
        set_claim(&mut p, path, json!([one]));
        push(
            &format!("the {which} claim is a one-element list"),
            Tok::Valid(p),
            vec![],
            vec![],
            vec![],
            m.clone(),
        );
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Envoy
// ---------------------------------------------------------------------------------------------

/// The identity filters of `file` (an Envoy config under `envoy/`, between the identity markers), with the
/// example's `payload_in_metadata` key.
fn identity_chain(file: &str, payload_key: &str) -> String {
    let yaml = fs::read_to_string(repo_root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut out = Vec::new();
    let mut inside = false;
    for line in yaml.lines() {
        if line.trim_end().ends_with("# tokengate:identity-end") {
            inside = false;
        }
        if inside {
            out.push(line.to_string());
        }
        if line.trim_end().ends_with("# tokengate:identity-begin") {
            inside = true;
        }
    }
    let text = out.join("\n");
    assert!(
        text.contains("envoy.filters.http.jwt_authn") && text.contains("payload_in_metadata: payload"),
        "{file}: the identity block changed (no jwt_authn with payload_in_metadata: payload):\n{text}"
    );
    text.replace(
        "payload_in_metadata: payload",
        &format!("payload_in_metadata: {}", Value::String(payload_key.into())),
    )
}

/// One listener of the test's Envoy.
struct Listener {
    name: String,
    port: u16,
    config: Value,
    payload_key: String,
    /// The file whose identity block runs before the filter.
    chain: String,
}

fn listener_yaml(l: &Listener, wasm: &str, access_log: &str) -> String {
    format!(
        r#"  - name: {name}
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {port} }}
    per_connection_buffer_limit_bytes: 16777216
    enable_reuse_port: false
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          codec_type: AUTO
          normalize_path: true
          merge_slashes: true
          path_with_escaped_slashes_action: UNESCAPE_AND_FORWARD
          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {access_log}
              log_format:
                text_format_source:
                  inline_string: "probe=%REQ(X-DOC-PROBE)% status=%RESPONSE_CODE% audit=%FILTER_STATE(wasm.tokengate_audit:PLAIN)%\n"
          route_config:
            name: doc_routes
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route: {{ cluster: provider, timeout: 15s }}
          http_filters:
{chain}
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: tokengate
                root_id: tokengate
                failure_policy: FAIL_RELOAD
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: {config}
                vm_config:
                  vm_id: {name}
                  runtime: envoy.wasm.runtime.v8
                  code:
                    local:
                      filename: {wasm}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#,
        name = l.name,
        port = l.port,
        chain = identity_chain(&l.chain, &l.payload_key),
        config = Value::String(l.config.to_string()),
    )
}

fn cluster_yaml(name: &str, port: u16) -> String {
    let n = Value::String(name.into());
    format!(
        r#"  - name: {n}
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: {n}
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{ address: 127.0.0.1, port_value: {port} }}
"#
    )
}

/// The callout clusters a configuration names (each becomes a cluster to Webdis).
fn callout_clusters(c: &Value, out: &mut BTreeSet<String>) {
    for k in ["quota", "global_buckets"] {
        if let Some(n) = c[k]["cluster"].as_str() {
            out.insert(n.to_string());
        }
    }
}

/// The fallback clusters a configuration names (each becomes a cluster to the mock provider).
fn fallback_clusters(c: &Value, out: &mut BTreeSet<String>) {
    for (_, f) in c["breaker"]["cluster_fallbacks"]
        .as_object()
        .into_iter()
        .flatten()
    {
        if let Some(n) = f["cluster"].as_str() {
            out.insert(n.to_string());
        }
    }
}

fn bootstrap(
    listeners: &[Listener],
    admin: u16,
    provider: u16,
    webdis: u16,
    dir: &std::path::Path,
    wasm: &str,
) -> PathBuf {
    let access_log = dir.join("access.log").display().to_string();
    let mut clusters = BTreeSet::new();
    let mut fallbacks = BTreeSet::new();
    for l in listeners {
        callout_clusters(&l.config, &mut clusters);
        fallback_clusters(&l.config, &mut fallbacks);
    }
    clusters.remove("provider");
    fallbacks.remove("provider");
    let mut y = format!(
        "admin:\n  address:\n    socket_address: {{ address: 127.0.0.1, port_value: {admin} }}\nstatic_resources:\n  listeners:\n"
    );
    for l in listeners {
        y.push_str(&listener_yaml(l, wasm, &access_log));
    }
    y.push_str("  clusters:\n");
    y.push_str(&cluster_yaml("provider", provider));
    for c in &clusters {
        y.push_str(&cluster_yaml(c, webdis));
    }
    for c in fallbacks.difference(&clusters) {
        y.push_str(&cluster_yaml(c, provider));
    }
    let path = dir.join("envoy.yaml");
    fs::write(&path, y).expect("write envoy.yaml");
    path
}

/// Envoy running the doc examples (killed by PID on drop).
struct DocEnvoy {
    child: Child,

    access_log: PathBuf,
}

impl Drop for DocEnvoy {
    fn drop(&mut self) {
        wasm_test::terminate(&mut self.child, Duration::from_secs(3));
    }
}

fn start_envoy(
    yaml: &std::path::Path,
    admin: u16,
    dir: &std::path::Path,
) -> Result<DocEnvoy, String> {
    let log = dir.join("envoy.log");
    let out = fs::File::create(&log).expect("envoy.log");
    let child = Command::new(wasm_test::envoy_bin())
        .arg("-c")
        .arg(yaml)
        .args([
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "-l",
            "warning",
        ])
        .args(["--file-flush-interval-msec", "100"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone().expect("envoy.log")))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("spawn envoy");
    let mut e = DocEnvoy {
        child,

        access_log: dir.join("access.log"),
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(Some(st)) = e.child.try_wait() {
            return Err(format!(
                "envoy exited {st}:\n{}",
                tail(&fs::read_to_string(&log).unwrap_or_default(), 30)
            ));
        }
        if let Ok(r) = http::get(admin, "/ready", &[]) {
            if r.status == 200 && r.text().trim() == "LIVE" {
                return Ok(e);
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "envoy not LIVE after 90 s:\n{}",
                tail(&fs::read_to_string(&log).unwrap_or_default(), 30)
            ));
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// `envoy --mode validate` of one listener: the filter's refusal line, if it refuses.
fn refusal_of(l: &Listener, dir: &std::path::Path, wasm: &str) -> Option<String> {
    let sub = dir.join(&l.name);
    fs::create_dir_all(&sub).expect("mkdir");
    let one = [Listener {
        name: l.name.clone(),
        port: l.port,
        config: l.config.clone(),
        payload_key: l.payload_key.clone(),
        chain: l.chain.clone(),
    }];
    let yaml = bootstrap(&one, free_port(), 1, 1, &sub, wasm);
    let out = Command::new(wasm_test::envoy_bin())
        .args(["--mode", "validate", "-c"])
        .arg(&yaml)
        .args(["--disable-hot-restart", "-l", "warning"])
        .output()
        .expect("envoy --mode validate");
    if out.status.success() {
        return None;
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(
        text.lines()
            .find(|l| l.contains("invalid configuration"))
            .map(str::to_string)
            .unwrap_or_else(|| tail(&text, 5)),
    )
}

// ---------------------------------------------------------------------------------------------
// Running and checking
// ---------------------------------------------------------------------------------------------

/// A probe sent, and what came back.
struct Sent {
    id: String,
    listener: usize,
    probe: Probe,
    expect: Expect,
    status: u16,
    reason: Option<String>,
    body: String,
}

fn send(port: u16, id: &str, p: &Probe) -> (u16, Option<String>, String) {
    let mut h: Vec<(String, String)> = vec![
        ("content-type".into(), "application/json".into()),
        ("x-doc-probe".into(), id.into()),
    ];
    match &p.tok {
        Tok::None => {}
        Tok::Valid(payload) => h.push((
            TOKEN_HEADER.into(),
            mint(&shipped_demo_key(), payload.clone()),
        )),
        Tok::Bad(t) => h.push((TOKEN_HEADER.into(), t.clone())),
    }
    for k in &p.bearer {
        h.push(("authorization".into(), format!("Bearer {k}")));
    }
    for k in &p.xkey {
        h.push(("x-api-key".into(), k.clone()));
    }
    h.extend(p.forged.iter().cloned());
    let mut body =
        json!({"max_tokens": 16, "messages": [{"role": "user", "content": "Say hello."}]});
    if let Some(m) = &p.model {
        body["model"] = json!(m);
    }
    let refs: Vec<(&str, &str)> = h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    match http::post(port, CHAT, &refs, body.to_string().as_bytes()) {
        Ok(r) => (
            r.status,
            r.header("x-tokengate-reason").map(str::to_string),
            r.text().chars().take(300).collect(),
        ),
        Err(e) => (0, None, format!("transport error: {e}")),
    }
}

/// Every Redis key, percent-decoded.
fn redis_keys(port: u16) -> Vec<String> {
    match redis_cmd(port, &["KEYS", "*"]) {
        Ok(RespValue::Array(Some(items))) => items
            .iter()
            .filter_map(|v| v.as_str())
            .map(|k| percent_decode(&k))
            .collect(),
        other => panic!("KEYS *: {other:?}"),
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let Some(v) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// True when `key` is `tg:q:{<account>}:<YYYY-MM><rest>`.
fn month_key(key: &str, account: &str, rest: &str) -> bool {
    let Some(after) = key.strip_prefix(&format!("tg:q:{{{account}}}:")) else {
        return false;
    };
    let month = after.get(..7).unwrap_or("");
    month.len() == 7 && month.as_bytes()[4] == b'-' && after[7..] == *rest
}

/// `field=value` of an audit record.
fn audit_field<'a>(record: &'a str, field: &str) -> Option<&'a str> {
    record
        .split(' ')
        .find_map(|p| p.strip_prefix(field).and_then(|r| r.strip_prefix('=')))
}

#[test]
fn blocks_are_classified_by_fence_and_marker() {
    let md = "text\n\n```json\n{\"rules\": []}\n```\n<!-- doc-example: fragment {\"groups\": []} -->\n```json\n\"quota\": {}\n```\n  ```sh\n  make run\n  ```\n<!-- doc-example: not-config -->\n```json\n{\"error\": 1}\n```\n";
    let b = blocks("x.md", md);
    assert_eq!(b.len(), 4);
    assert_eq!(b[0].at, "x.md:3");
    assert_eq!(b[0].marker, None);
    assert_eq!(
        parse_marker(&b[1].at, b[1].marker.as_deref().unwrap()),
        Marker::Fragment(json!({"groups": []}))
    );
    assert_eq!(b[2].lang, "sh");
    assert_eq!(b[2].text, "make run");
    assert_eq!(
        parse_marker(&b[3].at, b[3].marker.as_deref().unwrap()),
        Marker::NotConfig
    );
    assert_eq!(
        percent_decode("tg:q:{~b:x:org%3Da%2Fteam%3Db}:2026-11"),
        "tg:q:{~b:x:org=a/team=b}:2026-11"
    );
    assert!(month_key("tg:q:{a}:2026-11", "a", ""));
    assert!(month_key("tg:q:{a}:2026-11:m:gpt-4.1", "a", ":m:gpt-4.1"));
    assert!(!month_key("tg:q:{a}:limit", "a", ""));
}

/// Mock provider, Redis, Webdis and one Envoy with `listeners` (refusals named by [`refusal_of`]).
struct Stack {
    mock: wasm_test::MockProvider,
    redis: RedisServer,
    _webdis: Webdis,
    envoy: DocEnvoy,
    // Last: removed after Envoy is gone.
    _dir: TempDir,
}

/// Starts the stack; `Err` names every listener whose configuration the filter refuses (by `what`).
fn start_stack(
    listeners: &[Listener],
    what: &dyn Fn(&Listener) -> String,
) -> Result<Stack, String> {
    let mock = mock_provider!();
    let redis = RedisServer::start();
    let webdis = Webdis::start(redis.port);
    let dir = TempDir::new("docex");
    let wasm = dir.path().join("tokengate.wasm");
    fs::copy(require_wasm(), &wasm).expect("copy tokengate.wasm");
    let wasm = wasm.display().to_string();
    let admin = free_port();
    let yaml = bootstrap(listeners, admin, mock.port, webdis.port, dir.path(), &wasm);
    match start_envoy(&yaml, admin, dir.path()) {
        Ok(envoy) => Ok(Stack {
            mock,
            redis,
            _webdis: webdis,
            envoy,
            _dir: dir,
        }),
        Err(e) => {
            let refused: Vec<String> = listeners
                .iter()
                .filter_map(|l| {
                    Some(format!(
                        "{}: {}",
                        what(l),
                        refusal_of(l, dir.path(), &wasm)?
                    ))
                })
                .collect();
            Err(format!("Envoy refused:\n{}\n\n{e}", refused.join("\n")))
        }
    }
}

/// The access log's lines by probe id: (status, audit record), waiting (bounded) for `ids`.
fn audits(envoy: &DocEnvoy, ids: &[&str]) -> BTreeMap<String, (u16, String)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = fs::read_to_string(&envoy.access_log).unwrap_or_default();
        let map: BTreeMap<String, (u16, String)> = text
            .lines()
            .filter_map(|line| {
                let id = line.strip_prefix("probe=")?.split(' ').next()?.to_string();
                let status = line
                    .split(" status=")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()?;
                let audit = line.split(" audit=").nth(1)?.to_string();
                Some((id, (status, audit)))
            })
            .collect();
        if ids.iter().all(|i| map.contains_key(*i)) || Instant::now() > deadline {
            return map;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn every_doc_example_loads_and_charges_only_the_verified_identity() {
    let started = Instant::now();
    let examples = examples();
    assert!(
        !examples.is_empty(),
        "no plugin configuration found in the docs"
    );
    // Two listeners an example: as written, and with the ledger.
    let mut listeners = Vec::new();
    let mut specs = Vec::new();
    let mut origin = BTreeMap::new();
    for (i, ex) in examples.iter().enumerate() {
        let s = spec(ex);
        for (suffix, config, how) in [
            ("a", patient(&ex.config), "as written"),
            (
                "l",
                patient(&ledger_config(&ex.config, &s)),
                "with the test's ledger",
            ),
        ] {
            let name = format!("e{i}{suffix}");
            origin.insert(name.clone(), format!("{} ({how})", ex.at));
            listeners.push(Listener {
                name,
                port: free_port(),
                config,
                payload_key: s.payload_key.clone(),
                chain: ex.chain.clone(),
            });
            specs.push((i, s.clone()));
        }
    }
    let stack = start_stack(&listeners, &|l| origin[&l.name].clone())
        .unwrap_or_else(|e| panic!("the doc examples do not load: {e}"));
    let (mock, redis, envoy) = (&stack.mock, &stack.redis, &stack.envoy);
    let loaded = started.elapsed();

    let mut number = 7_100_000u64;
    let mut sent: Vec<Sent> = Vec::new();
    for (li, (l, (_, s))) in listeners.iter().zip(&specs).enumerate() {
        for (pi, p) in probes(s, &l.name, &mut number).into_iter().enumerate() {
            let id = format!("{}-{pi}", l.name);
            let (status, reason, body) = send(l.port, &id, &p);
            let expect = expect(s, &p);
            sent.push(Sent {
                id,
                listener: li,
                probe: p,
                expect,
                status,
                reason,
                body,
            });
        }
    }
    let probed = started.elapsed();

    let ids: Vec<&str> = sent.iter().map(|s| s.id.as_str()).collect();
    let audits = audits(envoy, &ids);
    let keys = redis_keys(redis.port);

    let mut failures: Vec<String> = Vec::new();
    let mut admitted = 0;
    for s in &sent {
        let l = &listeners[s.listener];
        let (ex_i, spec) = &specs[s.listener];
        let ledger = l.name.ends_with('l');
        let whereis = format!(
            "{} [{}] {}",
            examples[*ex_i].at,
            if ledger { "ledger" } else { "as written" },
            s.probe.what
        );
        let mut fail =
            |msg: String| failures.push(format!("{whereis}: {msg}\n    probe {:?}", s.probe));
        let audit = audits.get(&s.id).map(|(_, a)| a.as_str()).unwrap_or("");
        match &s.expect {
            Expect::JwtRefused => {
                if s.status != 401 || !s.body.starts_with("Jwt") {
                    fail(format!(
                        "expected jwt_authn's 401, got {} {:?} {}",
                        s.status, s.reason, s.body
                    ));
                }
            }
            Expect::Refused(status, reason) => {
                if s.status != *status || s.reason.as_deref() != Some(*reason) {
                    fail(format!(
                        "expected {status} {reason}, got {} {:?} {}",
                        s.status, s.reason, s.body
                    ));
                }
            }
            Expect::Admitted {
                tenant,
                groups,
                model,
            } => {
                admitted += 1;
                if s.status != 200 {
                    fail(format!(
                        "expected admitted as {tenant} ({groups:?}, {model}), got {} {:?} {}",
                        s.status, s.reason, s.body
                    ));
                    continue;
                }
                if audit_field(audit, "tenant") != Some(tenant.as_str())
                    || audit_field(audit, "model") != Some(model.as_str())
                {
                    fail(format!("expected the audit record to name tenant={tenant} model={model}: {audit:?}"));
                }
                if ledger {
                    if !keys.iter().any(|k| month_key(k, tenant, "")) {
                        fail(format!("the ledger has no charge of tenant {tenant}"));
                    }
                    if !keys
                        .iter()
                        .any(|k| month_key(k, tenant, &format!(":m:{model}")))
                    {
                        fail(format!(
                            "the ledger has no charge of tenant {tenant} as model {model}"
                        ));
                    }
                    let others = [&spec.model, &spec.forged_model];
                    for o in others {
                        if o != model
                            && keys
                                .iter()
                                .any(|k| month_key(k, tenant, &format!(":m:{o}")))
                        {
                            fail(format!(
                                "the ledger charged tenant {tenant} as model {o}, not {model}"
                            ));
                        }
                    }
                    for (i, lv) in spec.levels.iter().enumerate() {
                        let Some(Some(_)) = groups.get(i) else {
                            continue;
                        };
                        let path: Vec<String> = spec.levels[..=i]
                            .iter()
                            .zip(groups)
                            .map(|(l, g)| format!("{}={}", l.name, g.as_deref().unwrap_or("-")))
                            .collect();
                        let account = format!("~b:{LEDGER}-{}:{}", lv.name, path.join("/"));
                        if !keys.iter().any(|k| month_key(k, &account, "")) {
                            fail(format!(
                                "the ledger has no charge of group {}",
                                path.join("/")
                            ));
                        }
                    }
                }
            }
        }
    }
    // Forged names nowhere; verified ones and tokens never upstream.
    let forged_keys: BTreeSet<&str> = sent
        .iter()
        .flat_map(|s| s.probe.forged.iter())
        .map(|(_, v)| v.as_str())
        .filter(|v| v.starts_with("key:"))
        .collect();
    for k in &keys {
        if k.contains("frg-") || forged_keys.iter().any(|f| k.contains(f)) {
            failures.push(format!("a forged identity reached Redis: {k}"));
        }
    }
    for (id, (_, a)) in &audits {
        if a.contains("frg-") || forged_keys.iter().any(|f| a.contains(f)) {
            failures.push(format!(
                "a forged identity is in the audit record of {id}: {a}"
            ));
        }
    }
    let upstream = mock.requests();
    for r in &upstream {
        if r.header(TOKEN_HEADER).is_some() {
            failures.push(format!("the token reached the provider: {:?}", r.headers));
        }
        for (h, v) in &r.headers {
            if v.contains("vrf-") {
                failures.push(format!("a verified id reached the provider in {h}: {v}"));
            }
        }
    }
    let total = started.elapsed();
    eprintln!(
        "doc examples: {} examples ({} listeners), {} probes ({} admitted), {} requests upstream; Envoy ready after {:.1} s, probes done after {:.1} s, all {:.1} s",
        examples.len(),
        listeners.len(),
        sent.len(),
        admitted,
        upstream.len(),
        loaded.as_secs_f64(),
        probed.as_secs_f64(),
        total.as_secs_f64()
    );
    for ex in &examples {
        eprintln!("  {}", ex.at);
    }
    drop(stack);
    assert!(
        failures.is_empty(),
        "{} of {} probes failed:\n{}",
        failures.len(),
        sent.len(),
        failures.join("\n")
    );
}

/// What Envoy 1.40's `jwt_authn` (`payload_in_metadata`) and the filter make of claim paths and claim
/// values (the facts docs/config.md states): the tenant each token is charged as, or the refusal.
#[test]
fn claims_are_read_as_documented() {
    let roomy = json!([{"name": "all", "tokens_per_second": 1000000, "burst": 10000000}]);
    let claims: [(&str, Value); 4] = [
        ("nested", json!("org.tenant")),
        ("index", json!("tenants.0")),
        ("dotted", json!(["https://idp.example/claims", "tenant"])),
        ("plain", json!("tenant")),
    ];
    let listeners: Vec<Listener> = claims
        .iter()
        .map(|(name, claim)| Listener {
            name: format!("m-{name}"),
            port: free_port(),
            config: json!({"tenant_claim": claim, "api_key_tenants": false, "rules": roomy}),
            payload_key: "payload".into(),
            chain: "envoy/envoy.yaml".into(),
        })
        .collect();
    let stack = start_stack(&listeners, &|l| l.name.clone()).unwrap_or_else(|e| panic!("{e}"));
    let port = |name: &str| {
        listeners
            .iter()
            .find(|l| l.name == format!("m-{name}"))
            .expect("listener")
            .port
    };
    // (listener, payload, tenant charged or the refusal)
    let cases: Vec<(&str, Value, &str)> = vec![
        ("nested", json!({"org": {"tenant": "acme"}}), "acme"),
        ("nested", json!({"org": "acme"}), "401 missing_tenant"),
        ("index", json!({"tenants": ["acme", "other"]}), "acme"),
        ("index", json!({"tenants": ["acme"]}), "acme"),
        ("index", json!({"tenants": []}), "401 missing_tenant"),
        ("index", json!({"tenants": {"0": "acme"}}), "acme"),
        (
            "dotted",
            json!({"https://idp.example/claims": {"tenant": "acme"}}),
            "acme",
        ),
        ("plain", json!({"tenant": "acme"}), "acme"),
        ("plain", json!({"tenant": 4242}), "4242"),
        ("plain", json!({"tenant": 0}), "0"),
        (
            "plain",
            json!({"tenant": 9007199254740992u64}),
            "9007199254740992",
        ),
        (
            "plain",
            json!({"tenant": 1e17}),
            "403 invalid_identity_claim",
        ),
        (
            "plain",
            json!({"tenant": 12.5}),
            "403 invalid_identity_claim",
        ),
        ("plain", json!({"tenant": -3}), "403 invalid_identity_claim"),
        (
            "plain",
            json!({"tenant": true}),
            "403 invalid_identity_claim",
        ),
        (
            "plain",
            json!({"tenant": false}),
            "403 invalid_identity_claim",
        ),
        ("plain", json!({"tenant": null}), "401 missing_tenant"),
        ("plain", json!({"tenant": ""}), "403 invalid_identity_claim"),
        (
            "plain",
            json!({"tenant": "two words"}),
            "403 invalid_identity_claim",
        ),
        // Envoy hands a claim over without its type: 8 bytes of text that read as a whole double are
        // text (refused unless an id), and a whole number whose 8 bytes are printable text is that text.
        (
            "plain",
            json!({"tenant": "a b c 5C"}),
            "403 invalid_identity_claim",
        ),
        (
            "plain",
            json!({"tenant": 5947783412001656u64}),
            "403 invalid_identity_claim",
        ),
        ("plain", json!({"tenant": 5460610219467361u64}), "abcdef3C"),
        (
            "plain",
            json!({"tenant": 2251799813685248u64}),
            "2251799813685248",
        ),
        ("plain", json!({"tenant": ["acme"]}), "acme"),
        (
            "plain",
            json!({"tenant": ["acme", "other"]}),
            "403 invalid_identity_claim",
        ),
        ("plain", json!({"tenant": []}), "403 invalid_identity_claim"),
        (
            "plain",
            json!({"tenant": [5]}),
            "403 invalid_identity_claim",
        ),
        (
            "plain",
            json!({"tenant": [["acme"]]}),
            "403 invalid_identity_claim",
        ),
        (
            "plain",
            json!({"tenant": {"id": "acme"}}),
            "403 invalid_identity_claim",
        ),
        // The same bytes as ["acme"]: a list's elements are pairs with empty values.
        ("plain", json!({"tenant": {"acme": ""}}), "acme"),
        ("plain", json!({"tenant": {}}), "403 invalid_identity_claim"),
    ];
    let key = shipped_demo_key();
    let mut got = Vec::new();
    for (i, (l, payload, _)) in cases.iter().enumerate() {
        let token = mint(&key, payload.clone());
        let id = format!("m{i}");
        let body = json!({"model": "gpt-4.1", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
        let r = http::post(
            port(l),
            CHAT,
            &[
                ("content-type", "application/json"),
                ("x-doc-probe", &id),
                (TOKEN_HEADER, &token),
            ],
            body.to_string().as_bytes(),
        )
        .expect("POST");
        got.push((
            id,
            r.status,
            r.header("x-tokengate-reason").map(str::to_string),
        ));
    }
    let ids: Vec<&str> = got.iter().map(|g| g.0.as_str()).collect();
    let audits = audits(&stack.envoy, &ids);
    let mut failures = Vec::new();
    for ((l, payload, want), (id, status, reason)) in cases.iter().zip(&got) {
        let seen = if *status == 200 {
            audits
                .get(id)
                .and_then(|(_, a)| audit_field(a, "tenant"))
                .unwrap_or("?")
                .to_string()
        } else {
            format!("{status} {}", reason.as_deref().unwrap_or("-"))
        };
        eprintln!("{l:8} {payload:60} -> {seen}");
        if seen != *want {
            failures.push(format!("{l} {payload}: expected {want}, got {seen}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
