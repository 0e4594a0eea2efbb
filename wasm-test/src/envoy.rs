//! Envoy with the filter: the bootstrap rendered from `templates/envoy-test.yaml` with free ports, the
//! process, its logs, access log and stats.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;

use crate::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// What [`Envoy::start`] runs.
#[derive(Clone, Debug)]
pub struct EnvoyOpts {
    /// Plugin configuration (serialized into the filter's `configuration` StringValue).
    pub plugin_config: Value,
    /// Port of cluster `provider`.
    pub provider_port: u16,
    /// Port of cluster `provider_fallback` (None: a free port nobody listens on).
    pub fallback_port: Option<u16>,
    /// Port of cluster `webdis` (None: a free port nobody listens on).
    pub webdis_port: Option<u16>,
    /// `--concurrency` (worker threads).
    pub concurrency: u32,
    /// `-l`.
    pub log_level: String,
    /// `--component-log-level`.
    pub component_log_level: String,
    /// Filter module (None: [`require_wasm`]).
    pub wasm: Option<PathBuf>,
    /// False runs Envoy without the wasm filter (harness self-tests).
    pub with_filter: bool,
    /// Route timeout.
    pub route_timeout_ms: u64,
    /// HCM `stream_idle_timeout`.
    pub stream_idle_timeout_ms: u64,
    /// How long [`Envoy::start`] waits for `/ready` to say LIVE (60 s: V8 compiles the module slowly
    /// on a loaded 2-core machine; a healthy start takes about a second).
    pub ready_timeout: Duration,
}

impl EnvoyOpts {
    /// Defaults: concurrency 2, `-l warning`, `wasm:info`, route timeout 15 s, idle timeout 30 s.
    pub fn new(provider_port: u16, plugin_config: Value) -> EnvoyOpts {
        EnvoyOpts {
            plugin_config,
            provider_port,
            fallback_port: None,
            webdis_port: None,
            concurrency: 2,
            log_level: "warning".into(),
            component_log_level: "wasm:info".into(),
            wasm: None,
            with_filter: true,
            route_timeout_ms: 15_000,
            stream_idle_timeout_ms: 30_000,
            ready_timeout: Duration::from_secs(60),
        }
    }

    /// Envoy with the same listener/clusters but no wasm filter.
    pub fn without_filter(provider_port: u16) -> EnvoyOpts {
        EnvoyOpts {
            with_filter: false,
            ..EnvoyOpts::new(provider_port, Value::Null)
        }
    }

    /// Sets `fallback_port`.
    pub fn fallback(mut self, port: u16) -> Self {
        self.fallback_port = Some(port);
        self
    }

    /// Sets `webdis_port`.
    pub fn webdis(mut self, port: u16) -> Self {
        self.webdis_port = Some(port);
        self
    }

    /// Sets `concurrency`.
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = n;
        self
    }

    /// Sets `component_log_level` (e.g. `"wasm:debug"`).
    pub fn component_log_level(mut self, s: &str) -> Self {
        self.component_log_level = s.into();
        self
    }
}

/// Ports and paths of one rendered bootstrap.
#[derive(Clone, Debug)]
pub struct Bootstrap {
    /// The YAML file.
    pub path: PathBuf,
    /// Listener port.
    pub port: u16,
    /// Admin port.
    pub admin_port: u16,
    /// Access log file.
    pub access_log: PathBuf,
}

/// Writes `<dir>/envoy.yaml` from [`BOOTSTRAP_TEMPLATE`] with fresh free ports.
pub fn render_bootstrap(opts: &EnvoyOpts, dir: &Path) -> Bootstrap {
    let port = free_port();
    let admin_port = free_port();
    let access_log = dir.join("access.log");
    let mut text = String::new();
    let mut in_wasm = false;
    for line in BOOTSTRAP_TEMPLATE.lines() {
        let t = line.trim();
        if t == "# BEGIN WASM" {
            in_wasm = true;
            continue;
        }
        if t == "# END WASM" {
            in_wasm = false;
            continue;
        }
        if in_wasm && !opts.with_filter {
            continue;
        }
        text.push_str(line);
        text.push('\n');
    }
    // A JSON string literal is a valid YAML double-quoted scalar.
    let config_literal = Value::String(opts.plugin_config.to_string()).to_string();
    // Envoy loads a private copy: a concurrent `cargo build` rewriting the shared .wasm must not
    // change (or truncate) the module under a running test.
    let wasm = if opts.with_filter {
        let src = opts.wasm.clone().unwrap_or_else(require_wasm);
        let copy = dir.join("tokengate.wasm");
        snapshot_wasm(&src, &copy);
        copy
    } else {
        PathBuf::new()
    };
    let path_literal = |p: &Path| Value::String(p.display().to_string()).to_string();
    let dur = |ms: u64| format!("{}s", ms as f64 / 1000.0);
    let subs = [
        ("{{LISTENER_PORT}}", port.to_string()),
        ("{{ADMIN_PORT}}", admin_port.to_string()),
        ("{{PROVIDER_PORT}}", opts.provider_port.to_string()),
        (
            "{{FALLBACK_PORT}}",
            opts.fallback_port.unwrap_or_else(free_port).to_string(),
        ),
        (
            "{{WEBDIS_PORT}}",
            opts.webdis_port.unwrap_or_else(free_port).to_string(),
        ),
        ("{{ACCESS_LOG}}", path_literal(&access_log)),
        ("{{PLUGIN_CONFIG}}", config_literal),
        ("{{WASM_PATH}}", path_literal(&wasm)),
        ("{{ROUTE_TIMEOUT}}", dur(opts.route_timeout_ms)),
        ("{{STREAM_IDLE_TIMEOUT}}", dur(opts.stream_idle_timeout_ms)),
    ];
    for (k, v) in subs {
        text = text.replace(k, &v);
    }
    let path = dir.join("envoy.yaml");
    fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    Bootstrap {
        path,
        port,
        admin_port,
        access_log,
    }
}

/// Copies a wasm module, retrying (bounded) while it is not a complete module yet.
fn snapshot_wasm(src: &Path, dst: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let bytes = fs::read(src).unwrap_or_default();
        if bytes.len() > 8 && bytes.starts_with(b"\0asm") {
            fs::write(dst, &bytes).unwrap_or_else(|e| panic!("write {}: {e}", dst.display()));
            return;
        }
        if Instant::now() >= deadline {
            panic!(
                "{} is not a wasm module (being rebuilt?): run `make build`",
                src.display()
            );
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// A running Envoy (killed by PID on drop; its temp dir removed unless `KEEP_TMP`).
pub struct Envoy {
    /// Listener port.
    pub port: u16,
    /// Admin port.
    pub admin_port: u16,
    child: Child,
    boot: Bootstrap,
    log_path: PathBuf,
    // Declared last: removed after the process is gone.
    dir: TempDir,
}

enum Started {
    Live(Envoy),
    Exited {
        log: String,
        code: Option<i32>,
    },
    /// With the last `/ready` answer or error.
    TimedOut(Envoy, String),
}

impl Envoy {
    /// Renders the bootstrap, starts Envoy and waits until admin `/ready` says LIVE (bounded by
    /// `opts.ready_timeout`). Err carries the tail of envoy.log when it exits or never gets ready.
    ///
    /// A start that failed because a picked port was taken meanwhile is retried with new ports
    /// (at most 3 attempts).
    pub fn start(opts: EnvoyOpts) -> Result<Envoy, String> {
        for attempt in 1..=3 {
            match Self::launch(&opts) {
                Started::Live(e) => return Ok(e),
                Started::Exited { log, .. }
                    if attempt < 3 && log.contains("Address already in use") =>
                {
                    continue
                }
                Started::Exited { log, code } => {
                    return Err(format!(
                        "envoy exited ({code:?}) before ready; log tail:\n{}",
                        tail(&log, 40)
                    ))
                }
                Started::TimedOut(e, last) => {
                    return Err(format!(
                        "envoy (pid {}) not LIVE after {:?}; last /ready: {last}; log tail:\n{}",
                        e.pid(),
                        opts.ready_timeout,
                        tail(&e.log(), 40)
                    ))
                }
            }
        }
        Err("unreachable".into())
    }

    /// Starts Envoy with a config it must refuse; returns its log. Panics if Envoy becomes LIVE.
    pub fn start_expect_failure(opts: EnvoyOpts) -> String {
        match Self::launch(&opts) {
            Started::Exited { log, .. } => log,
            Started::Live(e) => panic!(
                "envoy accepted a config it should refuse: {}\nlog:\n{}",
                opts.plugin_config,
                tail(&e.log(), 40)
            ),
            Started::TimedOut(e, last) => panic!(
                "envoy neither refused nor became ready (last /ready: {last}); log:\n{}",
                tail(&e.log(), 40)
            ),
        }
    }

    fn launch(opts: &EnvoyOpts) -> Started {
        let dir = TempDir::new("envoy");
        let boot = render_bootstrap(opts, dir.path());
        let log_path = dir.path().join("envoy.log");
        let log = fs::File::create(&log_path).unwrap_or_else(|e| panic!("envoy.log: {e}"));
        let log2 = log.try_clone().unwrap_or_else(|e| panic!("envoy.log: {e}"));
        let bin = envoy_bin();
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&boot.path)
            .args(["--concurrency", &opts.concurrency.to_string()])
            .arg("--disable-hot-restart")
            .args(["-l", &opts.log_level])
            .args(["--component-log-level", &opts.component_log_level])
            .args(["--file-flush-interval-msec", "100"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log2))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn envoy {}: {e}", bin.display()));
        let mut envoy = Envoy {
            port: boot.port,
            admin_port: boot.admin_port,
            child,
            boot,
            log_path,
            dir,
        };
        let deadline = Instant::now() + opts.ready_timeout;
        let mut last: String;
        loop {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                return Started::Exited {
                    log: envoy.log(),
                    code: status.code(),
                };
            }
            match http::request(
                envoy.admin_port,
                "GET",
                "/ready",
                &[],
                b"",
                Duration::from_millis(500),
            ) {
                Ok(r) if r.status == 200 && r.text().trim() == "LIVE" => {
                    return Started::Live(envoy)
                }
                Ok(r) => last = format!("{} {}", r.status, r.text().trim()),
                Err(e) => last = e,
            }
            if Instant::now() >= deadline {
                return Started::TimedOut(envoy, last);
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// `envoy --mode validate -c <yaml>`; Err carries its output.
    pub fn validate(yaml: &Path) -> Result<(), String> {
        let out = Command::new(envoy_bin())
            .args(["--mode", "validate", "-c"])
            .arg(yaml)
            .args(["-l", "warning", "--disable-hot-restart"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run envoy: {e}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(())
        } else {
            Err(text)
        }
    }

    /// PID of the Envoy process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The temp dir (bootstrap, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The rendered bootstrap file.
    pub fn bootstrap_path(&self) -> &Path {
        &self.boot.path
    }

    /// Contents of envoy.log (stdout + stderr).
    pub fn log(&self) -> String {
        fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Contents of access.log (flushed every 100 ms; see [`wait_access_log`](Self::wait_access_log)).
    pub fn access_log(&self) -> String {
        fs::read(&self.boot.access_log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Waits (bounded) until access.log has at least `lines` lines; returns its contents.
    pub fn wait_access_log(&self, lines: usize, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.access_log();
            if text.lines().count() >= lines || Instant::now() >= deadline {
                return text;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (bounded) until envoy.log contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log().contains(needle) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// GET on the admin port.
    pub fn admin_get(&self, path: &str) -> Result<http::Response, String> {
        http::get(self.admin_port, path, &[])
    }

    /// Counters and gauges from `/stats?format=json`: name → value.
    pub fn stats(&self) -> BTreeMap<String, u64> {
        let r = self
            .admin_get("/stats?format=json")
            .unwrap_or_else(|e| panic!("admin /stats: {e}"));
        let v: Value =
            serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("/stats json: {e}"));
        let mut out = BTreeMap::new();
        for s in v
            .get("stats")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let (Some(name), Some(value)) = (
                s.get("name").and_then(Value::as_str),
                s.get("value").and_then(Value::as_u64),
            ) {
                out.insert(name.to_string(), value);
            }
        }
        out
    }

    /// One stat; `name` may omit the `wasmcustom.` prefix. None when Envoy does not have it.
    pub fn stat_opt(&self, name: &str) -> Option<u64> {
        let stats = self.stats();
        stats
            .get(name)
            .or_else(|| stats.get(&format!("wasmcustom.{name}")))
            .copied()
    }

    /// One stat; 0 when absent (use [`stat_opt`](Self::stat_opt) to tell absent from zero).
    pub fn stat(&self, name: &str) -> u64 {
        self.stat_opt(name).unwrap_or(0)
    }

    /// Waits (bounded) until `stat(name) >= min`; returns the last value seen.
    pub fn wait_stat(&self, name: &str, min: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.stat(name);
            if v >= min || Instant::now() >= deadline {
                return v;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// `/stats/prometheus` text.
    pub fn prometheus(&self) -> String {
        self.admin_get("/stats/prometheus")
            .unwrap_or_else(|e| panic!("admin /stats/prometheus: {e}"))
            .text()
    }
}

/// Sum of all samples of metric `name` in Prometheus text (None when no sample has that name).
pub fn prometheus_value(text: &str, name: &str) -> Option<u64> {
    let mut found = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if let Some(v) = rest
            .rsplit(' ')
            .next()
            .and_then(|v| v.trim().parse::<f64>().ok())
        {
            *found.get_or_insert(0u64) += v as u64;
        }
    }
    found
}

impl Drop for Envoy {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(2));
    }
}
