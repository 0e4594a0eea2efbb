//! `UPSTREAM_URL=... make run`: the bootstrap scripts/upstream-config.sh renders from envoy/envoy.yaml, run
//! in real Envoy in front of a mock provider.
//!
//! - A base URL ending in `/v1` reaches the same paths as one without (`/v1/chat/completions`, never
//!   `/v1/v1/...`); another base path is prefixed.
//! - An IPv6 literal (`http://[::1]:<port>`) works.
//! - Without `UPSTREAM_API_KEY` the client's `authorization` goes through (a local vLLM or Ollama); with
//!   it, Envoy replaces it with the configured key.
//! - Every variant (https, base paths, IPv4/IPv6 literals) passes `envoy --mode validate`; malformed URLs
//!   are refused with a message naming UPSTREAM_URL.

mod shipped;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use shipped::ShippedEnvoy;
use wasm_test::{free_port, http, repo_root, require_wasm, RedisServer, TempDir, Webdis};

/// Runs scripts/upstream-config.sh; Ok(rendered yaml) or Err(stderr).
fn render(url: &str, key: Option<&str>, out: &Path) -> Result<String, String> {
    let mut cmd = Command::new(repo_root().join("scripts/upstream-config.sh"));
    cmd.arg(repo_root().join("envoy/envoy.yaml"))
        .arg(out)
        .env("UPSTREAM_URL", url)
        .env_remove("UPSTREAM_API_KEY")
        .env_remove("UPSTREAM_CA")
        .stdin(Stdio::null());
    if let Some(k) = key {
        cmd.env("UPSTREAM_API_KEY", k);
    }
    let o = cmd.output().expect("run scripts/upstream-config.sh");
    if o.status.success() {
        Ok(std::fs::read_to_string(out).expect("rendered config"))
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

/// A mock provider listening on `[::1]` (killed on drop).
struct Ipv6Mock {
    port: u16,
    child: Child,
}

impl Ipv6Mock {
    fn start() -> Ipv6Mock {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mock-provider"))
            .args(["--host", "::1", "--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn mock-provider");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("mock listening line");
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("mock line {line:?}"));
        Ipv6Mock { port, child }
    }

    /// (path, authorization) of every request the mock received.
    fn seen(&self) -> Vec<(String, Option<String>)> {
        let stream = std::net::TcpStream::connect(("::1", self.port)).expect("connect [::1]");
        let mut s = stream;
        use std::io::{Read, Write};
        s.write_all(b"GET /_mock/requests HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .expect("write");
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read");
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
        let v: serde_json::Value = serde_json::from_str(body).expect("mock requests json");
        v.as_array()
            .expect("array")
            .iter()
            .map(|r| {
                (
                    r["path"].as_str().unwrap_or("").to_string(),
                    r["headers"]["authorization"].as_str().map(str::to_string),
                )
            })
            .collect()
    }
}

impl Drop for Ipv6Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chat(envoy: &ShippedEnvoy, auth: &str) -> http::Response {
    let r = envoy.chat(&[("authorization", auth)], 16);
    assert_eq!(r.status, 200, "{}\n{}", r.text(), envoy.log_text());
    r
}

#[test]
fn a_v1_base_url_on_an_ipv6_literal_without_a_key_reaches_the_provider_unchanged() {
    let mock = Ipv6Mock::start();
    let redis = RedisServer::start();
    let webdis = Webdis::start(redis.port);
    let tmp = TempDir::new("upstream");
    let cfg = tmp.path().join("envoy.yaml");
    for url in [
        format!("http://[::1]:{}/v1", mock.port),
        format!("http://[::1]:{}/v1/", mock.port),
        format!("http://[::1]:{}", mock.port),
    ] {
        render(&url, None, &cfg).unwrap_or_else(|e| panic!("{url}: {e}"));
        let envoy = ShippedEnvoy::start_file(&cfg, 0, free_port(), webdis.port);
        chat(&envoy, "Bearer sk-client");
        drop(envoy);
        let seen = mock.seen();
        let last = seen.last().expect("the mock saw the request");
        assert_eq!(last.0, "/v1/chat/completions", "{url}");
        assert_eq!(last.1.as_deref(), Some("Bearer sk-client"), "{url}");
    }
    assert_eq!(mock.seen().len(), 3);
}

#[test]
fn an_api_key_replaces_the_clients_and_a_base_path_is_prefixed() {
    let mock = Ipv6Mock::start();
    let redis = RedisServer::start();
    let webdis = Webdis::start(redis.port);
    let tmp = TempDir::new("upstream");
    let cfg = tmp.path().join("envoy.yaml");
    render(
        &format!("http://[::1]:{}/openai/v1", mock.port),
        Some("sk-operator"),
        &cfg,
    )
    .expect("render");
    let envoy = ShippedEnvoy::start_file(&cfg, 0, free_port(), webdis.port);
    chat(&envoy, "Bearer sk-client");
    let seen = mock.seen();
    assert_eq!(
        seen,
        [(
            "/openai/v1/chat/completions".to_string(),
            Some("Bearer sk-operator".to_string())
        )]
    );
    // The filter still charged the client's key tenant (it runs before the router adds the key).
    let audit = envoy.audit_lines(1);
    assert!(
        audit.iter().any(|l| l.contains("audit=tenant=key:")),
        "{audit:?}"
    );
}

/// URL, API key, text the rendered config must contain, text it must not.
type Case = (
    &'static str,
    Option<&'static str>,
    &'static [&'static str],
    &'static [&'static str],
);

#[test]
fn every_upstream_url_variant_passes_envoy_validate_and_bad_ones_are_refused() {
    let wasm = require_wasm();
    let tmp = TempDir::new("upstream");
    let cfg = tmp.path().join("envoy.yaml");
    let cases: [Case; 6] = [
        (
            "https://api.openai.com/v1",
            Some("sk-x"),
            &[
                "sni: api.openai.com",
                "host_rewrite_literal: \"api.openai.com\"",
                "value: \"Bearer sk-x\"",
                "type: STRICT_DNS",
            ],
            &["prefix_rewrite"],
        ),
        (
            "https://api.anthropic.com",
            Some("k\"q\\"),
            &["value: \"Bearer k\\\"q\\\\\""],
            &["prefix_rewrite"],
        ),
        (
            "https://example.com:8443/openai/v1",
            None,
            &[
                "prefix_rewrite: \"/openai/\"",
                "host_rewrite_literal: \"example.com:8443\"",
            ],
            &["request_headers_to_add:\n                - header: { key: authorization"],
        ),
        (
            "http://127.0.0.1:11434/v1",
            None,
            &["type: STATIC", "address: \"127.0.0.1\", port_value: 11434"],
            &["transport_socket:\n      name: envoy.transport_sockets.tls"],
        ),
        (
            "http://[::1]:8000",
            None,
            &["type: STATIC", "address: \"::1\", port_value: 8000"],
            &["dns_lookup_family"],
        ),
        (
            "https://[2001:db8::1]/v1",
            Some("sk-y"),
            &["san_type: IP_ADDRESS", "port_value: 443"],
            &["sni:"],
        ),
    ];
    for (url, key, want, not) in cases {
        let yaml = render(url, key, &cfg).unwrap_or_else(|e| panic!("{url}: {e}"));
        for w in want {
            assert!(yaml.contains(w), "{url}: rendered config lacks {w:?}");
        }
        for n in not {
            assert!(!yaml.contains(n), "{url}: rendered config has {n:?}");
        }
        let local = yaml.replace(
            "filename: target/wasm32-wasip1/release/tokengate.wasm",
            &format!("filename: {}", wasm.display()),
        );
        std::fs::write(&cfg, local).expect("write");
        let out = Command::new(wasm_test::envoy_bin())
            .args([
                "--mode",
                "validate",
                "--disable-hot-restart",
                "-l",
                "warning",
                "-c",
            ])
            .arg(&cfg)
            .stdin(Stdio::null())
            .output()
            .expect("envoy --mode validate");
        assert!(
            out.status.success(),
            "{url}: envoy --mode validate refused the rendered config:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for bad in [
        "api.openai.com",
        "ftp://x",
        "http://[::1",
        "http://host:99999",
        "https://a b",
    ] {
        let e = render(bad, None, &cfg).expect_err(bad);
        assert!(e.contains("UPSTREAM_URL"), "{bad}: {e}");
    }
}
