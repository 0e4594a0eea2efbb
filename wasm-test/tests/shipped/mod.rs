//! Runs a shipped Envoy bootstrap (`envoy/envoy.yaml`, or a file rendered from it) with test ports: the
//! lines marked `# tokengate:<marker>` (listener, admin, `provider`, `provider_fallback`, `webdis`) get the
//! given ports, the wasm path becomes a private copy of the built filter and the stdout access log a file.
//! Everything else is as shipped. Shared by the tests that must exercise what users run.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wasm_test::{free_port, http, repo_root, require_wasm, TempDir};

/// The OpenAI chat path.
pub const CHAT: &str = "/v1/chat/completions";

/// Replaces the port of the one line ending with `# tokengate:<marker>`.
pub fn set_marked_port(yaml: &str, marker: &str, port: u16) -> String {
    let tag = format!("# tokengate:{marker}");
    let mut found = 0;
    let out: Vec<String> = yaml
        .lines()
        .map(|line| {
            if !line.trim_end().ends_with(&tag) {
                return line.to_string();
            }
            found += 1;
            let start = line
                .find("port_value:")
                .expect("marked line has port_value")
                + 11;
            let rest = &line[start..];
            let digits = rest.trim_start();
            let end = digits
                .find(|c: char| !c.is_ascii_digit())
                .expect("port_value is followed by text");
            let lead = rest.len() - digits.len();
            format!("{}{}{}", &line[..start + lead], port, &digits[end..])
        })
        .collect();
    assert_eq!(found, 1, "envoy.yaml: expected one `{tag}` line");
    out.join("\n") + "\n"
}

/// `yaml` (envoy/envoy.yaml or a file derived from it) with the plugin configuration between the
/// `# tokengate:plugin-config-begin` and `-end` markers replaced by `config`; the filter chain around it
/// (identity filters, routes, clusters) stays as shipped.
pub fn with_plugin_config(yaml: &str, config: &Value) -> String {
    let mut out = Vec::new();
    let mut inside = false;
    let mut found = 0;
    for line in yaml.lines() {
        if line.trim_end().ends_with("# tokengate:plugin-config-begin") {
            inside = true;
            found += 1;
            out.push(line.to_string());
            let indent = &line[..line.len() - line.trim_start().len()];
            // A JSON string literal is a valid YAML double-quoted scalar.
            out.push(format!(
                "{indent}value: {}",
                Value::String(config.to_string())
            ));
            continue;
        }
        if line.trim_end().ends_with("# tokengate:plugin-config-end") {
            inside = false;
        }
        if !inside {
            out.push(line.to_string());
        }
    }
    assert_eq!(
        found, 1,
        "envoy.yaml: expected one plugin-config-begin marker"
    );
    out.join("\n") + "\n"
}

/// Envoy running the shipped envoy/envoy.yaml (killed by PID on drop).
pub struct ShippedEnvoy {
    /// Listener port.
    pub port: u16,
    /// Admin port.
    pub admin_port: u16,
    child: Child,
    access_log: PathBuf,
    log: PathBuf,
    // Last: removed after the process is gone.
    _dir: TempDir,
}

impl ShippedEnvoy {
    /// envoy/envoy.yaml as shipped, with the given cluster ports.
    pub fn start(provider: u16, fallback: u16, webdis: u16) -> ShippedEnvoy {
        Self::start_file(
            &repo_root().join("envoy/envoy.yaml"),
            provider,
            fallback,
            webdis,
        )
    }

    /// A bootstrap derived from envoy/envoy.yaml (same markers), with the given cluster ports. A port of
    /// 0 leaves that line as it is (a provider address rendered by scripts/upstream-config.sh).
    pub fn start_file(file: &Path, provider: u16, fallback: u16, webdis: u16) -> ShippedEnvoy {
        let dir = TempDir::new("shipped");
        let shipped = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let wasm = dir.path().join("tokengate.wasm");
        std::fs::copy(require_wasm(), &wasm).expect("copy tokengate.wasm");
        let access_log = dir.path().join("access.log");
        let (port, admin_port) = (free_port(), free_port());
        let mut yaml = shipped;
        for (marker, p) in [
            ("listener-address", port),
            ("admin-address", admin_port),
            ("provider-address", provider),
            ("fallback-address", fallback),
            ("webdis-address", webdis),
        ] {
            if p == 0 {
                continue;
            }
            yaml = set_marked_port(&yaml, marker, p);
        }
        let wasm_line = "filename: target/wasm32-wasip1/release/tokengate.wasm";
        assert!(yaml.contains(wasm_line), "envoy.yaml: wasm path changed");
        yaml = yaml.replace(wasm_line, &format!("filename: {}", wasm.display()));
        assert_eq!(yaml.matches("path: /dev/stdout").count(), 1);
        yaml = yaml.replace(
            "path: /dev/stdout",
            &format!("path: {}", access_log.display()),
        );
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, yaml).expect("write envoy.yaml");
        let log = dir.path().join("envoy.log");
        let out = std::fs::File::create(&log).expect("envoy.log");
        let child = Command::new(wasm_test::envoy_bin())
            .arg("-c")
            .arg(&config)
            .args([
                "--concurrency",
                "2",
                "--disable-hot-restart",
                "-l",
                "warning",
            ])
            .args(["--file-flush-interval-msec", "100"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().expect("envoy.log")))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("spawn envoy");
        let mut envoy = ShippedEnvoy {
            port,
            admin_port,
            child,
            access_log,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(st)) = envoy.child.try_wait() {
                panic!("envoy exited {st} at start:\n{}", envoy.log_text());
            }
            if let Ok(r) = http::get(envoy.admin_port, "/ready", &[]) {
                if r.status == 200 && r.text().trim() == "LIVE" {
                    return envoy;
                }
            }
            assert!(
                Instant::now() < deadline,
                "envoy not LIVE after 30 s:\n{}",
                envoy.log_text()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Envoy's own log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Audit records (`tenant=… model=… …`) of the access log, waiting (bounded) for `n` lines.
    pub fn audit_lines(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(&self.access_log).unwrap_or_default();
            let lines: Vec<String> = text.lines().map(str::to_string).collect();
            if lines.len() >= n || Instant::now() >= deadline {
                return lines;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// A counter or gauge from admin `/stats` (0 when absent).
    pub fn stat(&self, name: &str) -> u64 {
        let r = http::get(self.admin_port, "/stats?format=json", &[]).expect("admin /stats");
        let v: Value = serde_json::from_slice(&r.body).expect("stats json");
        v["stats"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == name)
            .and_then(|s| s["value"].as_u64())
            .unwrap_or(0)
    }

    /// POSTs a small gpt-4.1 chat request with these headers.
    pub fn chat(&self, headers: &[(&str, &str)], max_tokens: u64) -> http::Response {
        let mut h = headers.to_vec();
        h.push(("content-type", "application/json"));
        let body = json!({"model": "gpt-4.1", "max_tokens": max_tokens,
                          "messages": [{"role": "user", "content": "Say hello."}]});
        http::post(self.port, CHAT, &h, body.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("POST {CHAT}: {e}\n{}", self.log_text()))
    }
}

impl Drop for ShippedEnvoy {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
