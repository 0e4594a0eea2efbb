//! Harness for driving the built `tokengate.wasm` inside a real Envoy 1.40, on loopback only.
//!
//! Every integration test in `wasm-test/tests/` builds on these pieces:
//!
//! ```no_run
//! use wasm_test::{http, Envoy, EnvoyOpts, MockProvider};
//! use serde_json::json;
//!
//! let mock = MockProvider::start();
//! let envoy = Envoy::start(EnvoyOpts::new(mock.port, json!({"rules": [
//!     {"name": "all", "tenant": "*", "model": "*", "tokens_per_second": 10, "burst": 1000}]})))
//!     .unwrap();
//! let resp = http::post(envoy.port, "/v1/chat/completions", &[("x-tenant-id", "a")],
//!     br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
//! assert_eq!(resp.status, 200);
//! ```
//!
//! - [`MockProvider`]: spawns the `mock-provider` binary (see `src/bin/mock-provider.rs`).
//! - [`Envoy`]: renders `templates/envoy-test.yaml` with free ports into a fresh temp dir and runs
//!   Envoy with the filter; exposes its log, access log and stats.
//! - [`http`]: a small HTTP/1.1 client (one-shot, keep-alive, streaming with abort).
//! - [`RedisServer`], [`Webdis`], [`redis_cmd`]: for the quota tests.
//! - [`faults`]: processes paused, killed and restarted on their ports, upstream faults, the mock's
//!   served-usage ledger (the fault-matrix tests).
//! - [`cluster`]: a Redis Cluster (3 masters + 3 replicas), Envoy's `redis_proxy` in front of it, and
//!   Webdis in front of that (the fleet tests).
//! - [`fleet`]: client load over several Envoys with per-tenant tallies of what was served, and the
//!   Redis side of a tenant's quota (plain Redis or Cluster).
//!
//! Every spawned process is killed by PID when its handle drops. Set `KEEP_TMP=1` to keep the temp
//! dirs (bootstrap, logs) for inspection.

pub mod cluster;
pub mod fleet;

use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub mod faults;

/// The Envoy bootstrap template (placeholders `{{NAME}}`).
pub const BOOTSTRAP_TEMPLATE: &str = include_str!("../templates/envoy-test.yaml");

// ---------------------------------------------------------------------------------------------
// Locating things
// ---------------------------------------------------------------------------------------------

/// Repository root: the parent of this package's directory.
pub fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// Envoy binary: `$ENVOY_BIN`, else `<root>/.venv/bin/envoy`, else `/tmp/venvtest/bin/envoy`.
pub fn envoy_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return PathBuf::from(p);
    }
    let venv = repo_root().join(".venv/bin/envoy");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("/tmp/venvtest/bin/envoy")
}

/// Filter module: `$TOKENGATE_WASM`, else `<root>/target/wasm32-wasip1/release/tokengate.wasm`.
pub fn wasm_path() -> PathBuf {
    match std::env::var_os("TOKENGATE_WASM") {
        Some(p) => PathBuf::from(p),
        None => repo_root().join("target/wasm32-wasip1/release/tokengate.wasm"),
    }
}

/// [`wasm_path`], panicking with instructions when the file does not exist.
pub fn require_wasm() -> PathBuf {
    let p = wasm_path();
    if !p.is_file() {
        panic!(
            "tokengate.wasm not found at {}: run `make build` first (or set TOKENGATE_WASM)",
            p.display()
        );
    }
    p
}

/// The `mock-provider` binary: `$MOCK_PROVIDER_BIN`, else next to the running test executable
/// (`target/<profile>/mock-provider`; Cargo builds it before integration tests run).
pub fn mock_provider_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("MOCK_PROVIDER_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(format!("mock-provider{}", std::env::consts::EXE_SUFFIX))
}

/// Starts a [`MockProvider`] from the binary Cargo built for the calling integration test
/// (`env!("CARGO_BIN_EXE_mock-provider")`, resolved at the call site).
#[macro_export]
macro_rules! mock_provider {
    () => {
        $crate::MockProvider::start_with(::std::path::Path::new(env!(
            "CARGO_BIN_EXE_mock-provider"
        )))
    };
}

/// A free TCP port on 127.0.0.1 (bound then released), never one this process was given before:
/// the OS may hand a released port out again at once (this stop's CI: two Redis Cluster nodes got
/// the same port, and the one that could not bind was taken for up by the other's answer).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..1000 {
        let port = match TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()) {
            Ok(a) => a.port(),
            Err(e) => panic!("cannot bind 127.0.0.1:0: {e}"),
        };
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
    panic!("no loopback port this process was not given already, in 1000 tries");
}

/// A fresh directory under `std::env::temp_dir()`, removed on drop unless `KEEP_TMP` is set.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<tmp>/tokengate-<prefix>-<pid>-<n>-<nanos>`.
    pub fn new(prefix: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        loop {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!(
                "tokengate-{prefix}-{}-{n}-{nanos}",
                std::process::id()
            ));
            match fs::create_dir(&path) {
                Ok(()) => return TempDir { path },
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("cannot create {}: {e}", path.display()),
            }
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("KEEP_TMP").is_some() {
            eprintln!("KEEP_TMP: kept {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// SIGTERM by PID, wait up to `grace`, then SIGKILL; always reaps.
fn terminate(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// Mock provider
// ---------------------------------------------------------------------------------------------

/// A running `mock-provider` process on 127.0.0.1:`port`.
pub struct MockProvider {
    /// Port it listens on.
    pub port: u16,
    child: Child,
}

/// One request the mock provider received (from `/_mock/requests`).
#[derive(Clone, Debug)]
pub struct MockRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path with query, as received.
    pub path: String,
    /// Lowercased header names.
    pub headers: BTreeMap<String, String>,
    /// Body (lossy UTF-8).
    pub body: String,
}

impl MockRequest {
    /// A header by lowercased name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// The body parsed as JSON (`Value::Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

impl MockProvider {
    /// Spawns the binary found by [`mock_provider_bin`] on a free port.
    pub fn start() -> MockProvider {
        Self::start_with(&mock_provider_bin())
    }

    /// Spawns the given `mock-provider` binary on a free port (waits for its listening line, 10 s).
    pub fn start_with(bin: &Path) -> MockProvider {
        Self::start_on(bin, 0)
    }

    /// Spawns the given binary on `port` (0 = free port).
    pub fn start_on(bin: &Path, port: u16) -> MockProvider {
        let mut child = Command::new(bin)
            .args(["--port", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {}: {e}", bin.display()));
        let Some(stdout) = child.stdout.take() else {
            panic!("mock-provider has no stdout")
        };
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next().and_then(Result::ok);
            let _ = tx.send(first);
            // Drain anything else so the child never blocks on a full pipe.
            for _ in lines {}
        });
        let line = match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Some(l)) => l,
            other => {
                terminate(&mut child, Duration::from_millis(100));
                panic!("mock-provider did not print its listening line: {other:?}");
            }
        };
        let port = line
            .rsplit(':')
            .next()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected mock-provider line {line:?}"));
        MockProvider { port, child }
    }

    /// PID of the process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Complete requests received since start or the last [`reset`](Self::reset).
    pub fn requests(&self) -> Vec<MockRequest> {
        self.fetch("/_mock/requests")
    }

    /// Requests whose headers arrived but whose body never completed (stream reset upstream).
    pub fn incomplete_requests(&self) -> Vec<MockRequest> {
        self.fetch("/_mock/incomplete")
    }

    /// Number of complete requests whose path ends with `suffix` (query ignored).
    pub fn count(&self, suffix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.path.split('?').next().unwrap_or("").ends_with(suffix))
            .count()
    }

    /// Requests of `x-mock-concurrency: <group>` at the mock at once (see `src/bin/mock-provider.rs`):
    /// answering now, the most at once since start or [`reset_concurrency`](Self::reset_concurrency),
    /// and how many arrived. All 0 for a group never seen.
    pub fn concurrency(&self, group: &str) -> Concurrency {
        let r = http::get(self.port, "/_mock/concurrency", &[])
            .unwrap_or_else(|e| panic!("mock /_mock/concurrency: {e}"));
        let v: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("mock /_mock/concurrency body is not JSON: {e}"));
        let n = |k: &str| v[group][k].as_u64().unwrap_or(0);
        let spans = v[group]["spans"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| Span {
                from_us: s[0].as_u64().unwrap_or(0),
                to_us: s[1].as_u64(),
                gone: s[2] == "gone",
                tag: s[3].as_str().unwrap_or("").to_string(),
            })
            .collect();
        Concurrency {
            active: n("active"),
            max: n("max"),
            total: n("total"),
            spans,
        }
    }

    /// Clears every `x-mock-concurrency` group.
    pub fn reset_concurrency(&self) {
        let r = http::post(self.port, "/_mock/concurrency/reset", &[], b"")
            .unwrap_or_else(|e| panic!("mock concurrency reset: {e}"));
        assert_eq!(r.status, 200, "mock concurrency reset");
    }

    /// Clears the recorded requests.
    pub fn reset(&self) {
        let r = http::post(self.port, "/_mock/reset", &[], b"")
            .unwrap_or_else(|e| panic!("mock reset: {e}"));
        assert_eq!(r.status, 200, "mock reset");
    }

    fn fetch(&self, path: &str) -> Vec<MockRequest> {
        let r = http::get(self.port, path, &[]).unwrap_or_else(|e| panic!("mock {path}: {e}"));
        let v: Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("mock {path} body is not JSON: {e}"));
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|r| MockRequest {
                        method: str_of(r, "method"),
                        path: str_of(r, "path"),
                        headers: r
                            .get("headers")
                            .and_then(Value::as_object)
                            .map(|m| {
                                m.iter()
                                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                                    .collect()
                            })
                            .unwrap_or_default(),
                        body: str_of(r, "body"),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// One `x-mock-concurrency` group of the mock (see [`MockProvider::concurrency`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Concurrency {
    /// Requests being answered now.
    pub active: u64,
    /// The most answered at once.
    pub max: u64,
    /// Requests counted in the group.
    pub total: u64,
    /// Each request's time at the mock, in arrival order.
    pub spans: Vec<Span>,
}

/// One request's time at the mock provider, in microseconds since the Unix epoch (comparable with
/// [`unix_micros`] taken by the test's clients).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Span {
    /// Its body was complete.
    pub from_us: u64,
    /// The last bytes of its answer were about to be written (or a write failed), or its peer closed
    /// the connection; `None`: not yet.
    pub to_us: Option<u64>,
    /// It ended because the peer closed the connection (a client abort passed on by Envoy).
    pub gone: bool,
    /// Its `x-mock-tag`.
    pub tag: String,
}

impl Concurrency {
    /// The most requests at the mock at once when each request ends at `end(span)` (its `to_us`, or
    /// earlier when the test knows better: the moment its client went away, say); `None` counts as
    /// still running. At equal times an end comes before a start.
    pub fn max_at_once(&self, end: impl Fn(&Span) -> Option<u64>) -> usize {
        let mut edges: Vec<(u64, i32)> = Vec::with_capacity(2 * self.spans.len());
        for s in &self.spans {
            edges.push((s.from_us, 1));
            edges.push((end(s).unwrap_or(u64::MAX).max(s.from_us), -1));
        }
        edges.sort_unstable();
        let (mut now, mut most) = (0i32, 0i32);
        for (_, d) in edges {
            now += d;
            most = most.max(now);
        }
        usize::try_from(most).unwrap_or(0)
    }
}

/// Now, in microseconds since the Unix epoch (the clock of the mock's [`Span`]s).
pub fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

fn str_of(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_string()
}

impl Drop for MockProvider {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(2));
    }
}

// ---------------------------------------------------------------------------------------------
// Envoy
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Redis and Webdis
// ---------------------------------------------------------------------------------------------

/// A `redis-server` on a free loopback port (no persistence).
pub struct RedisServer {
    /// Its port.
    pub port: u16,
    child: Child,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts `$REDIS_SERVER` (default `redis-server`) and waits for PING (10 s).
    pub fn start() -> RedisServer {
        let dir = TempDir::new("redis");
        let port = free_port();
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let log = dir.path().join("redis.log");
        let mut child = Command::new(&bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {bin} (apt-get install redis-server): {e}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if matches!(redis_cmd(port, &["PING"]), Ok(RespValue::Simple(ref s)) if s == "PONG") {
                break;
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "redis-server exited {st}: {}",
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if Instant::now() >= deadline {
                terminate(&mut child, Duration::from_millis(500));
                panic!("redis-server not answering PING on {port}");
            }
            thread::sleep(Duration::from_millis(30));
        }
        RedisServer {
            port,
            child,
            _dir: dir,
        }
    }

    /// Runs a command against this server.
    pub fn cmd(&self, args: &[&str]) -> Result<RespValue, String> {
        redis_cmd(self.port, args)
    }

    /// PID of the process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(2));
    }
}

/// A Webdis in front of a Redis port, on its own free HTTP port.
pub struct Webdis {
    /// Its HTTP port.
    pub port: u16,
    child: Child,
    dir: TempDir,
}

impl Webdis {
    /// Writes a config (`daemonize: false`, `verbosity: 3`, logfile in a temp dir), starts
    /// `$WEBDIS_BIN` (default `webdis`) and waits until `GET /PING` answers (10 s).
    pub fn start(redis_port: u16) -> Webdis {
        Webdis::start_with(redis_port, &serde_json::json!({}))
    }

    /// [`Webdis::start`] with the fields of the JSON object `extra` added to (or replacing those of) its
    /// config, e.g. `{"acl": [{"disabled": ["EVAL"]}]}`.
    pub fn start_with(redis_port: u16, extra: &Value) -> Webdis {
        let dir = TempDir::new("webdis");
        let port = free_port();
        let mut config = serde_json::json!({
            "redis_host": "127.0.0.1",
            "redis_port": redis_port,
            "redis_auth": null,
            "http_host": "127.0.0.1",
            "http_port": port,
            "threads": 2,
            "pool_size": 8,
            "daemonize": false,
            "websockets": false,
            "database": 0,
            "verbosity": 3,
            "logfile": dir.path().join("webdis.log").display().to_string(),
        });
        if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                config.insert(k.clone(), v.clone());
            }
        }
        let cfg_path = dir.path().join("webdis.json");
        fs::write(&cfg_path, config.to_string()).unwrap_or_else(|e| panic!("webdis.json: {e}"));
        let bin = std::env::var("WEBDIS_BIN").unwrap_or_else(|_| "webdis".into());
        let mut child = Command::new(&bin)
            .arg(&cfg_path)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {bin} (apt-get install webdis): {e}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(r) = http::request(port, "GET", "/PING", &[], b"", Duration::from_secs(1)) {
                if r.status == 200 && r.text().contains("PONG") {
                    break;
                }
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "webdis exited {st}: {}",
                    fs::read_to_string(dir.path().join("webdis.log")).unwrap_or_default()
                );
            }
            if Instant::now() >= deadline {
                terminate(&mut child, Duration::from_millis(500));
                panic!("webdis not answering /PING on {port}");
            }
            thread::sleep(Duration::from_millis(30));
        }
        Webdis { port, child, dir }
    }

    /// Contents of webdis.log.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("webdis.log")).unwrap_or_default()
    }

    /// PID of the process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Webdis {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(2));
    }
}

/// A RESP2 reply.
#[derive(Clone, Debug, PartialEq)]
pub enum RespValue {
    /// `+OK`
    Simple(String),
    /// `-ERR …`
    Error(String),
    /// `:1`
    Int(i64),
    /// `$…` (None = nil)
    Bulk(Option<Vec<u8>>),
    /// `*…` (None = nil array)
    Array(Option<Vec<RespValue>>),
}

impl RespValue {
    /// Bulk or simple string as text.
    pub fn as_str(&self) -> Option<String> {
        match self {
            RespValue::Simple(s) => Some(s.clone()),
            RespValue::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// Integer reply, or a bulk string holding an integer.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            RespValue::Int(i) => Some(*i),
            other => other.as_str().and_then(|s| s.parse().ok()),
        }
    }
}

/// One command over a fresh connection to 127.0.0.1:`port` (2 s timeout).
pub fn redis_cmd(port: u16, args: &[&str]) -> Result<RespValue, String> {
    let stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let mut req = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        req.extend_from_slice(a.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    let mut w = stream.try_clone().map_err(|e| e.to_string())?;
    w.write_all(&req).map_err(|e| format!("write: {e}"))?;
    let mut r = BufReader::new(stream);
    read_resp(&mut r)
}

/// One kept-open Redis connection that sends commands in pipelined batches (for load in tests).
pub struct RedisConn {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl RedisConn {
    /// Connects to the Redis on `port`.
    pub fn connect(port: u16) -> Result<RedisConn, String> {
        let stream =
            TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let w = stream.try_clone().map_err(|e| e.to_string())?;
        Ok(RedisConn {
            w,
            r: BufReader::new(stream),
        })
    }

    /// Sends every command (each a list of arguments) at once, then reads one reply per command.
    pub fn pipeline(&mut self, cmds: &[Vec<Vec<u8>>]) -> Result<Vec<RespValue>, String> {
        let mut req = Vec::new();
        for args in cmds {
            req.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for a in args {
                req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                req.extend_from_slice(a);
                req.extend_from_slice(b"\r\n");
            }
        }
        self.w.write_all(&req).map_err(|e| format!("write: {e}"))?;
        cmds.iter().map(|_| read_resp(&mut self.r)).collect()
    }
}

fn read_resp(r: &mut BufReader<TcpStream>) -> Result<RespValue, String> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| format!("read: {e}"))?;
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(line.len().min(1));
    let num = || {
        rest.parse::<i64>()
            .map_err(|e| format!("bad RESP {line:?}: {e}"))
    };
    match kind {
        "+" => Ok(RespValue::Simple(rest.to_string())),
        "-" => Ok(RespValue::Error(rest.to_string())),
        ":" => Ok(RespValue::Int(num()?)),
        "$" => {
            let n = num()?;
            if n < 0 {
                return Ok(RespValue::Bulk(None));
            }
            let mut buf = vec![0u8; n as usize + 2];
            r.read_exact(&mut buf).map_err(|e| format!("read: {e}"))?;
            buf.truncate(n as usize);
            Ok(RespValue::Bulk(Some(buf)))
        }
        "*" => {
            let n = num()?;
            if n < 0 {
                return Ok(RespValue::Array(None));
            }
            let mut items = Vec::with_capacity(n as usize);
            for _ in 0..n {
                items.push(read_resp(r)?);
            }
            Ok(RespValue::Array(Some(items)))
        }
        _ => Err(format!("bad RESP line {line:?}")),
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP client
// ---------------------------------------------------------------------------------------------

/// Minimal HTTP/1.1 client over `std::net::TcpStream` to 127.0.0.1.
pub mod http {
    use super::*;

    /// Timeout of [`post`], [`get`] and [`Client`] requests.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// A complete response.
    #[derive(Clone, Debug)]
    pub struct Response {
        /// Status code.
        pub status: u16,
        /// Headers with lowercased names, in arrival order.
        pub headers: Vec<(String, String)>,
        /// Decoded body (chunked framing removed).
        pub body: Vec<u8>,
    }

    impl Response {
        /// First header with that name (case-insensitive).
        pub fn header(&self, name: &str) -> Option<&str> {
            find_header(&self.headers, name)
        }

        /// A header parsed as a number (None if absent or not a number).
        pub fn header_f64(&self, name: &str) -> Option<f64> {
            self.header(name).and_then(|v| v.trim().parse().ok())
        }

        /// Names of headers starting with `prefix` (lowercase).
        pub fn headers_with_prefix(&self, prefix: &str) -> Vec<String> {
            self.headers
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, _)| k.clone())
                .collect()
        }

        /// Body as (lossy) UTF-8.
        pub fn text(&self) -> String {
            String::from_utf8_lossy(&self.body).into_owned()
        }

        /// Body as JSON; panics with the body text if it is not JSON.
        pub fn json(&self) -> Value {
            json(self)
        }
    }

    /// Body of `r` as JSON; panics with status and body if it is not JSON.
    pub fn json(r: &Response) -> Value {
        serde_json::from_slice(&r.body).unwrap_or_else(|e| {
            panic!(
                "response body is not JSON ({e}): status {} body {:?}",
                r.status,
                r.text()
            )
        })
    }

    fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        let name = name.to_ascii_lowercase();
        headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// POST with [`DEFAULT_TIMEOUT`].
    pub fn post(
        port: u16,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, String> {
        request(port, "POST", path, headers, body, DEFAULT_TIMEOUT)
    }

    /// POST a JSON value with `content-type: application/json` added.
    pub fn post_json(
        port: u16,
        path: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> Result<Response, String> {
        let mut h = headers.to_vec();
        h.push(("content-type", "application/json"));
        post(port, path, &h, body.to_string().as_bytes())
    }

    /// GET with [`DEFAULT_TIMEOUT`].
    pub fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> Result<Response, String> {
        request(port, "GET", path, headers, b"", DEFAULT_TIMEOUT)
    }

    /// One request on a fresh connection (`connection: close`). Err on connect failure, timeout or
    /// a connection closed before a complete response.
    pub fn request(
        port: u16,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Response, String> {
        let deadline = Instant::now() + timeout;
        let stream = connect(port, timeout)?;
        let mut h = headers.to_vec();
        h.push(("connection", "close"));
        write_request(&stream, port, method, path, &h, body)?;
        let mut reader = BufReader::new(stream);
        read_response(&mut reader, method, deadline).map(|(r, _)| r)
    }

    fn connect(port: u16, timeout: Duration) -> Result<TcpStream, String> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let s = TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(5)))
            .map_err(|e| format!("connect 127.0.0.1:{port}: {e}"))?;
        let _ = s.set_nodelay(true);
        s.set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        Ok(s)
    }

    /// Writes the request. A `transfer-encoding: chunked` header in `headers` sends the body in
    /// two chunks; otherwise `content-length` is added (unless given) for bodies and POST/PUT.
    fn write_request(
        mut stream: &TcpStream,
        port: u16,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), String> {
        let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
        let chunked = headers.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
        });
        let mut buf = format!("{method} {path} HTTP/1.1\r\n");
        if !has("host") {
            buf.push_str(&format!("host: 127.0.0.1:{port}\r\n"));
        }
        for (k, v) in headers {
            buf.push_str(&format!("{k}: {v}\r\n"));
        }
        if !chunked
            && !has("content-length")
            && (!body.is_empty() || method == "POST" || method == "PUT")
        {
            buf.push_str(&format!("content-length: {}\r\n", body.len()));
        }
        buf.push_str("\r\n");
        let mut bytes = buf.into_bytes();
        if chunked {
            let mid = body.len() / 2;
            for part in [&body[..mid], &body[mid..]] {
                if !part.is_empty() {
                    bytes.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                    bytes.extend_from_slice(part);
                    bytes.extend_from_slice(b"\r\n");
                }
            }
            bytes.extend_from_slice(b"0\r\n\r\n");
        } else {
            bytes.extend_from_slice(body);
        }
        stream
            .write_all(&bytes)
            .and_then(|_| stream.flush())
            .map_err(|e| format!("write: {e}"))
    }

    fn io_err(e: std::io::Error) -> String {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => "timeout".to_string(),
            _ => format!("read: {e}"),
        }
    }

    fn check(deadline: Instant) -> Result<(), String> {
        if Instant::now() > deadline {
            Err("timeout".into())
        } else {
            Ok(())
        }
    }

    /// Reads one line (without CRLF). Ok(None) on EOF before any byte.
    fn line(r: &mut BufReader<TcpStream>, deadline: Instant) -> Result<Option<String>, String> {
        check(deadline)?;
        let mut s = String::new();
        match r.read_line(&mut s) {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(s.trim_end_matches(['\r', '\n']).to_string())),
            Err(e) => Err(io_err(e)),
        }
    }

    struct Head {
        status: u16,
        headers: Vec<(String, String)>,
    }

    /// Reads the status line and headers, skipping 1xx interim responses. Err("eof") when the
    /// connection closed before any byte.
    fn read_head(r: &mut BufReader<TcpStream>, deadline: Instant) -> Result<Head, String> {
        loop {
            let status_line = line(r, deadline)?.ok_or_else(|| "eof".to_string())?;
            let status: u16 = status_line
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("bad status line {status_line:?}"))?;
            let mut headers = Vec::new();
            loop {
                let l = line(r, deadline)?.ok_or("connection closed in headers")?;
                if l.is_empty() {
                    break;
                }
                if let Some((k, v)) = l.split_once(':') {
                    headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                }
            }
            if (100..200).contains(&status) && status != 101 {
                continue;
            }
            return Ok(Head { status, headers });
        }
    }

    enum BodyKind {
        None,
        Length(usize),
        Chunked,
        UntilClose,
    }

    fn body_kind(method: &str, head: &Head) -> BodyKind {
        if method == "HEAD" || head.status == 204 || head.status == 304 {
            return BodyKind::None;
        }
        if find_header(&head.headers, "transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
        {
            return BodyKind::Chunked;
        }
        match find_header(&head.headers, "content-length").and_then(|v| v.parse().ok()) {
            Some(n) => BodyKind::Length(n),
            None => BodyKind::UntilClose,
        }
    }

    /// Reads the body, calling `sink` with each piece as it arrives; `sink` returns false to stop.
    /// Returns (complete, reusable connection).
    fn read_body(
        r: &mut BufReader<TcpStream>,
        kind: BodyKind,
        deadline: Instant,
        sink: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<(bool, bool), String> {
        match kind {
            BodyKind::None => Ok((true, true)),
            BodyKind::Length(n) => {
                let mut left = n;
                let mut buf = [0u8; 16384];
                while left > 0 {
                    check(deadline)?;
                    let want = left.min(buf.len());
                    let got = r.read(&mut buf[..want]).map_err(io_err)?;
                    if got == 0 {
                        return Err(format!("connection closed with {left} body bytes missing"));
                    }
                    left -= got;
                    if !sink(&buf[..got]) {
                        return Ok((false, false));
                    }
                }
                Ok((true, true))
            }
            BodyKind::Chunked => loop {
                let size_line = line(r, deadline)?.ok_or("connection closed in chunked body")?;
                let size =
                    usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                        .map_err(|_| format!("bad chunk size {size_line:?}"))?;
                if size == 0 {
                    while let Some(l) = line(r, deadline)? {
                        if l.is_empty() {
                            break;
                        }
                    }
                    return Ok((true, true));
                }
                let mut buf = vec![0u8; size];
                check(deadline)?;
                r.read_exact(&mut buf).map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => "connection closed in chunk".to_string(),
                    _ => io_err(e),
                })?;
                let mut crlf = [0u8; 2];
                r.read_exact(&mut crlf).map_err(io_err)?;
                if !sink(&buf) {
                    return Ok((false, false));
                }
            },
            BodyKind::UntilClose => {
                let mut buf = [0u8; 16384];
                loop {
                    check(deadline)?;
                    let got = r.read(&mut buf).map_err(io_err)?;
                    if got == 0 {
                        return Ok((true, false));
                    }
                    if !sink(&buf[..got]) {
                        return Ok((false, false));
                    }
                }
            }
        }
    }

    /// Reads a full response; the bool says whether the connection can be reused.
    fn read_response(
        r: &mut BufReader<TcpStream>,
        method: &str,
        deadline: Instant,
    ) -> Result<(Response, bool), String> {
        let head = read_head(r, deadline)?;
        let mut body = Vec::new();
        let kind = body_kind(method, &head);
        let (_, reusable) = read_body(r, kind, deadline, &mut |b| {
            body.extend_from_slice(b);
            true
        })?;
        let close = find_header(&head.headers, "connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        Ok((
            Response {
                status: head.status,
                headers: head.headers,
                body,
            },
            reusable && !close,
        ))
    }

    /// A keep-alive connection that reconnects when the server closed it.
    pub struct Client {
        port: u16,
        timeout: Duration,
        conn: Option<BufReader<TcpStream>>,
        /// Number of TCP connections opened so far.
        pub connections: u32,
    }

    impl Client {
        /// A client for 127.0.0.1:`port` with [`DEFAULT_TIMEOUT`].
        pub fn new(port: u16) -> Client {
            Client {
                port,
                timeout: DEFAULT_TIMEOUT,
                conn: None,
                connections: 0,
            }
        }

        /// Sets the per-request timeout.
        pub fn with_timeout(mut self, t: Duration) -> Client {
            self.timeout = t;
            self
        }

        /// POST.
        pub fn post(
            &mut self,
            path: &str,
            headers: &[(&str, &str)],
            body: &[u8],
        ) -> Result<Response, String> {
            self.request("POST", path, headers, body)
        }

        /// GET.
        pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Result<Response, String> {
            self.request("GET", path, headers, b"")
        }

        /// One request on the kept connection. A reused connection that turns out closed before
        /// any response byte is replaced once (the request was not processed).
        pub fn request(
            &mut self,
            method: &str,
            path: &str,
            headers: &[(&str, &str)],
            body: &[u8],
        ) -> Result<Response, String> {
            for attempt in 0..2 {
                let reused = self.conn.is_some();
                if self.conn.is_none() {
                    self.conn = Some(BufReader::new(connect(self.port, self.timeout)?));
                    self.connections += 1;
                }
                let deadline = Instant::now() + self.timeout;
                let Some(reader) = self.conn.as_mut() else {
                    return Err("no connection".into());
                };
                let sent = write_request(reader.get_ref(), self.port, method, path, headers, body);
                let result = sent.and_then(|_| read_response(reader, method, deadline));
                match result {
                    Ok((resp, reusable)) => {
                        if !reusable {
                            self.conn = None;
                        }
                        return Ok(resp);
                    }
                    Err(e) => {
                        self.conn = None;
                        let stale = e == "eof" || e.starts_with("write:") || e.contains("reset");
                        if !(reused && stale && attempt == 0) {
                            return Err(e);
                        }
                    }
                }
            }
            Err("unreachable".into())
        }
    }

    /// Options of [`post_stream`].
    #[derive(Clone, Debug)]
    pub struct StreamOpts {
        /// Close the connection once this many body bytes arrived.
        pub abort_after_bytes: Option<usize>,
        /// Overall timeout.
        pub timeout: Duration,
    }

    impl Default for StreamOpts {
        fn default() -> Self {
            StreamOpts {
                abort_after_bytes: None,
                timeout: DEFAULT_TIMEOUT,
            }
        }
    }

    /// One body piece (a decoded chunk, or one read for non-chunked bodies).
    #[derive(Clone, Debug)]
    pub struct Piece {
        /// Time since the request was written.
        pub at: Duration,
        /// Bytes.
        pub data: Vec<u8>,
    }

    /// A response read piece by piece.
    #[derive(Clone, Debug)]
    pub struct StreamResponse {
        /// Status code.
        pub status: u16,
        /// Headers with lowercased names.
        pub headers: Vec<(String, String)>,
        /// Body pieces in arrival order.
        pub pieces: Vec<Piece>,
        /// The body ended properly (terminating chunk / full length).
        pub complete: bool,
        /// We closed the connection after `abort_after_bytes`.
        pub aborted: bool,
        /// Why the body ended early (connection closed mid-body, timeout), if it did.
        pub error: Option<String>,
    }

    impl StreamResponse {
        /// First header with that name.
        pub fn header(&self, name: &str) -> Option<&str> {
            find_header(&self.headers, name)
        }

        /// All pieces concatenated.
        pub fn body(&self) -> Vec<u8> {
            self.pieces.iter().flat_map(|p| p.data.clone()).collect()
        }

        /// Body as lossy UTF-8.
        pub fn text(&self) -> String {
            String::from_utf8_lossy(&self.body()).into_owned()
        }
    }

    /// POST and read the body as it arrives. Err only when no response head arrived; a body cut
    /// short is reported in `complete`/`error`.
    pub fn post_stream(
        port: u16,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        opts: &StreamOpts,
    ) -> Result<StreamResponse, String> {
        let deadline = Instant::now() + opts.timeout;
        let stream = connect(port, opts.timeout)?;
        let mut h = headers.to_vec();
        h.push(("connection", "close"));
        let t0 = Instant::now();
        write_request(&stream, port, "POST", path, &h, body)?;
        let mut reader = BufReader::new(stream);
        let head = read_head(&mut reader, deadline)?;
        let mut pieces = Vec::new();
        let mut total = 0usize;
        let mut aborted = false;
        let kind = body_kind("POST", &head);
        let res = read_body(&mut reader, kind, deadline, &mut |b| {
            pieces.push(Piece {
                at: t0.elapsed(),
                data: b.to_vec(),
            });
            total += b.len();
            if opts.abort_after_bytes.is_some_and(|n| total >= n) {
                aborted = true;
                return false;
            }
            true
        });
        if aborted {
            let _ = reader.get_ref().shutdown(std::net::Shutdown::Both);
        }
        let (complete, error) = match res {
            Ok((c, _)) => (c, None),
            Err(e) => (false, Some(e)),
        };
        Ok(StreamResponse {
            status: head.status,
            headers: head.headers,
            pieces,
            complete,
            aborted,
            error,
        })
    }

    /// The `data:` payloads of an SSE body, in order (e.g. `{"id":…}` and `[DONE]`).
    pub fn sse_data(body: &[u8]) -> Vec<String> {
        String::from_utf8_lossy(body)
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.trim().to_string())
            .collect()
    }

    /// The `event:` names of an SSE body, in order.
    pub fn sse_events(body: &[u8]) -> Vec<String> {
        String::from_utf8_lossy(body)
            .lines()
            .filter_map(|l| l.strip_prefix("event:"))
            .map(|d| d.trim().to_string())
            .collect()
    }
}

/// Body of `r` as JSON (see [`http::json`]).
pub fn json(r: &http::Response) -> Value {
    http::json(r)
}

// ---------------------------------------------------------------------------------------------
// Helpers for filter tests (the README response contract)
// ---------------------------------------------------------------------------------------------

/// Small builders and assertions shared by the filter tests.
pub mod tg {
    use super::*;
    use serde_json::json;

    /// The OpenAI chat path.
    pub const CHAT: &str = "/v1/chat/completions";

    /// Every counter the README promises.
    pub const COUNTERS: [&str; 12] = [
        "tokengate_requests_admitted",
        "tokengate_requests_limited_tokens",
        "tokengate_requests_limited_requests",
        "tokengate_requests_shaped",
        "tokengate_requests_rejected_invalid_body",
        "tokengate_requests_rejected_too_large",
        "tokengate_requests_rejected_no_tenant",
        "tokengate_requests_passthrough",
        "tokengate_tokens_estimated",
        "tokengate_cas_exhausted",
        "tokengate_state_corrupt",
        "tokengate_tenant_overflow",
    ];

    /// A chat request body with a fixed short prompt and `max_tokens`.
    pub fn chat(model: &str, max_tokens: u64) -> Vec<u8> {
        json!({"model": model, "max_tokens": max_tokens,
               "messages": [{"role": "user", "content": "Write one short sentence about rivers."}]})
        .to_string()
        .into_bytes()
    }

    /// One rule: `{"name","tenant","model","tokens_per_second","burst"}`.
    pub fn rule(
        name: &str,
        tenant: &str,
        model: &str,
        tokens_per_second: f64,
        burst: u64,
    ) -> Value {
        json!({"name": name, "tenant": tenant, "model": model,
               "tokens_per_second": tokens_per_second, "burst": burst})
    }

    /// `rule` with extra fields merged in.
    pub fn rule_with(base: Value, extra: Value) -> Value {
        merge(base, extra)
    }

    /// A plugin config: tenant from `x-tenant-id`, model hint from `x-tokengate-model`, no API-key
    /// tenants, no default tenant.
    pub fn config(rules: Value) -> Value {
        json!({"tenant_header": "x-tenant-id", "model_header": "x-tokengate-model",
               "api_key_tenants": false, "rules": rules})
    }

    /// `a` with the top-level fields of `b` set.
    pub fn merge(mut a: Value, b: Value) -> Value {
        if let (Some(o), Value::Object(e)) = (a.as_object_mut(), b) {
            o.extend(e);
        }
        a
    }

    /// Starts Envoy with the filter in front of `mock` (concurrency 2); panics with the log tail.
    pub fn start(mock: &MockProvider, plugin_config: Value) -> Envoy {
        start_opts(EnvoyOpts::new(mock.port, plugin_config))
    }

    /// [`start`] with explicit options.
    pub fn start_opts(opts: EnvoyOpts) -> Envoy {
        require_wasm();
        Envoy::start(opts).unwrap_or_else(|e| panic!("envoy did not start: {e}"))
    }

    /// POST a chat body for `tenant` (x-tenant-id) on a fresh connection.
    pub fn post_chat(envoy: &Envoy, tenant: &str, body: &[u8]) -> http::Response {
        http::post(
            envoy.port,
            CHAT,
            &[
                ("x-tenant-id", tenant),
                ("content-type", "application/json"),
            ],
            body,
        )
        .unwrap_or_else(|e| panic!("POST {CHAT}: {e}"))
    }

    /// A header that must be present and an integer.
    pub fn header_u64(r: &http::Response, name: &str) -> u64 {
        let v = r.header(name).unwrap_or_else(|| {
            panic!(
                "missing header {name}; status {} headers {:?} body {}",
                r.status,
                r.headers,
                r.text()
            )
        });
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("header {name}: {v:?} is not a non-negative integer"))
    }

    /// A header that must be present and a number.
    pub fn header_f64(r: &http::Response, name: &str) -> f64 {
        let v = r.header(name).unwrap_or_else(|| {
            panic!(
                "missing header {name}; status {} headers {:?}",
                r.status, r.headers
            )
        });
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("header {name}: {v:?} is not a number"))
    }

    /// `x-tokengate-estimated-tokens` of an admitted response.
    pub fn estimated(r: &http::Response) -> u64 {
        header_u64(r, "x-tokengate-estimated-tokens")
    }

    /// Asserts 200 (with the body in the message) and returns the estimated cost.
    pub fn admitted(r: &http::Response) -> u64 {
        assert_eq!(
            r.status,
            200,
            "expected admission; headers {:?} body {}",
            r.headers,
            r.text()
        );
        estimated(r)
    }

    /// Whether the response contract (docs/response-contract.md) says a retry can fix a refusal of
    /// tokengate's `reason`: such answers carry `retry-after`, `retry-after-ms` and
    /// `x-should-retry: true`; every other one `x-should-retry: false` and no `retry-after`.
    pub fn retryable(reason: &str) -> bool {
        matches!(
            reason,
            "tokens_per_second_exceeded"
                | "requests_per_minute_exceeded"
                | "concurrency_limit_exceeded"
                | "circuit_open"
                | "quota_unavailable"
                | "rate_limiter_unavailable"
        )
    }

    /// Asserts the retry headers of one of the filter's answers (either family), given its body's
    /// `tokengate` object: retryable (`retry-after` = max(1, ceil(`tokengate.retry_after`)),
    /// `retry-after-ms` = that in whole ms, `x-should-retry: true`) exactly when [`retryable`] says
    /// so; else `x-should-retry: false` and none of `retry-after`, `retry-after-ms`,
    /// `tokengate.retry_after`.
    pub fn assert_retry_semantics(r: &http::Response, ours: &Value, reason: &str) {
        let body = r.text();
        if retryable(reason) {
            assert_eq!(r.header("x-should-retry"), Some("true"), "{reason}: {body}");
            let secs = ours["retry_after"]
                .as_f64()
                .unwrap_or_else(|| panic!("tokengate.retry_after must be a number: {body}"));
            assert!(secs > 0.0, "tokengate.retry_after {secs} > 0");
            let ms = (secs * 1000.0).round();
            assert!(
                (secs * 1000.0 - ms).abs() < 1e-6,
                "tokengate.retry_after {secs} has millisecond precision"
            );
            assert_eq!(
                header_u64(r, "retry-after"),
                (secs.ceil() as u64).max(1),
                "retry-after vs tokengate.retry_after {secs}"
            );
            assert_eq!(
                header_u64(r, "retry-after-ms"),
                (ms as u64).max(1),
                "retry-after-ms vs tokengate.retry_after {secs}"
            );
        } else {
            assert_eq!(
                r.header("x-should-retry"),
                Some("false"),
                "{reason}: {:?} {body}",
                r.headers
            );
            for h in ["retry-after", "retry-after-ms"] {
                assert!(
                    r.header(h).is_none(),
                    "{reason}: no {h} on what a retry cannot fix: {:?}",
                    r.headers
                );
            }
            assert!(
                ours.get("retry_after").is_none(),
                "{reason}: no tokengate.retry_after: {body}"
            );
        }
    }

    /// Asserts one of the filter's own answers on an OpenAI path: that status, a JSON body whose
    /// `error` is exactly `{"message","type","param":null,"code"}` with that type and code,
    /// `x-request-id`, tokengate's `reason` in `x-tokengate-reason` and `tokengate.reason`, and the
    /// retry headers of the reason's class ([`assert_retry_semantics`]). Returns the body's
    /// `tokengate` object (`retry_after`, `limit`, `estimated_tokens`, `quota`).
    pub fn assert_error(
        r: &http::Response,
        status: u16,
        etype: &str,
        code: &str,
        reason: &str,
    ) -> Value {
        assert_eq!(
            r.status,
            status,
            "status; headers {:?} body {}",
            r.headers,
            r.text()
        );
        let ct = r.header("content-type").unwrap_or("");
        assert!(ct.starts_with("application/json"), "content-type {ct:?}");
        assert!(
            r.header("x-mock-port").is_none(),
            "answered by the filter, not the provider"
        );
        let v = r.json();
        let e = &v["error"];
        let mut keys: Vec<&str> = e
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        keys.sort_unstable();
        assert_eq!(
            keys,
            ["code", "message", "param", "type"],
            "error is exactly OpenAI's four fields: {v}"
        );
        assert_eq!(e["type"], etype, "error.type in {v}");
        assert_eq!(e["code"], code, "error.code in {v}");
        assert_eq!(e["param"], Value::Null, "error.param in {v}");
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "error.message in {v}"
        );
        assert!(
            r.header("x-request-id").is_some_and(|id| !id.is_empty()),
            "x-request-id on every answer: {:?}",
            r.headers
        );
        assert!(
            r.header("request-id").is_none(),
            "no Anthropic names on OpenAI paths: {:?}",
            r.headers
        );
        let ours = v["tokengate"].clone();
        assert_eq!(ours["reason"], reason, "tokengate.reason in {v}");
        assert_eq!(
            r.header("x-tokengate-reason"),
            Some(reason),
            "{:?}",
            r.headers
        );
        assert_retry_semantics(r, &ours, reason);
        ours
    }

    /// Asserts one of the filter's own answers on Anthropic's `/v1/messages`: that status,
    /// `{"type":"error","error":{"type","message","details":{"error_code"}},"request_id"}` with that
    /// error type and tokengate's `reason` as `error_code`, `request-id` equal to the body's
    /// `request_id`, `x-tokengate-reason`, and the retry headers of the class. Returns the body's
    /// `tokengate` object.
    pub fn assert_anthropic_error(
        r: &http::Response,
        status: u16,
        etype: &str,
        reason: &str,
    ) -> Value {
        assert_eq!(
            r.status,
            status,
            "status; headers {:?} body {}",
            r.headers,
            r.text()
        );
        let ct = r.header("content-type").unwrap_or("");
        assert!(ct.starts_with("application/json"), "content-type {ct:?}");
        assert!(
            r.header("x-mock-port").is_none(),
            "answered by the filter, not the provider"
        );
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], etype, "error.type in {v}");
        assert_eq!(v["error"]["details"]["error_code"], reason, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "error.message in {v}"
        );
        let id = r.header("request-id").unwrap_or("");
        assert!(!id.is_empty(), "request-id: {:?}", r.headers);
        assert_eq!(v["request_id"], id, "body request_id = request-id header");
        let ours = v["tokengate"].clone();
        assert_eq!(ours["reason"], reason, "tokengate.reason in {v}");
        assert_eq!(
            r.header("x-tokengate-reason"),
            Some(reason),
            "{:?}",
            r.headers
        );
        assert_retry_semantics(r, &ours, reason);
        ours
    }

    /// Asserts a bucket's 429 on an OpenAI path (`reason` `tokens_per_second_exceeded`: type
    /// `tokens`; `requests_per_minute_exceeded`: type `requests`; code `rate_limit_exceeded`) with
    /// the retry headers, `x-ratelimit-limit-tokens` = `burst`, `x-ratelimit-remaining-tokens` and a
    /// duration in `x-ratelimit-reset-tokens`. Returns `tokengate.retry_after` (> 0, seconds).
    pub fn assert_rate_limited(r: &http::Response, reason: &str, burst: u64) -> f64 {
        let etype = match reason {
            "tokens_per_second_exceeded" => "tokens",
            "requests_per_minute_exceeded" => "requests",
            other => panic!("not a bucket reason: {other}"),
        };
        let ours = assert_error(r, 429, etype, "rate_limit_exceeded", reason);
        let retry_after = ours["retry_after"].as_f64().unwrap_or(0.0);
        assert_eq!(header_u64(r, "x-ratelimit-limit-tokens"), burst);
        header_u64(r, "x-ratelimit-remaining-tokens");
        assert!(header_duration(r, "x-ratelimit-reset-tokens") >= 0.0);
        retry_after
    }

    /// Milliseconds as Go's `time.Duration` prints them (what OpenAI's `x-ratelimit-reset-*` carry):
    /// `0s`, `20ms`, `1s`, `1.5s`, `6m0s`, `1m30.5s`, `1h0m0s`.
    pub fn go_duration(ms: u64) -> String {
        if ms < 1000 {
            return if ms == 0 {
                "0s".into()
            } else {
                format!("{ms}ms")
            };
        }
        let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
        let mut out = String::new();
        if h > 0 {
            out += &format!("{h}h");
        }
        if h > 0 || m > 0 {
            out += &format!("{m}m");
        }
        out += &s.to_string();
        if frac > 0 {
            out += format!(".{frac:03}").trim_end_matches('0');
        }
        out + "s"
    }

    /// Seconds of a duration written as [`go_duration`] writes it (millisecond precision); `None`
    /// for anything else (`9.347`, `1.5`, `90s`, `1m`, …).
    pub fn parse_go_duration(s: &str) -> Option<f64> {
        let mut ms = 0f64;
        let mut rest = s;
        while !rest.is_empty() {
            let n = rest
                .find(|c: char| !c.is_ascii_digit() && c != '.')
                .filter(|&n| n > 0)?;
            let num: f64 = rest.get(..n)?.parse().ok()?;
            rest = rest.get(n..)?;
            let (unit, len) = if rest.starts_with("ms") {
                (1.0, 2)
            } else {
                match rest.chars().next()? {
                    'h' => (3_600_000.0, 1),
                    'm' => (60_000.0, 1),
                    's' => (1000.0, 1),
                    _ => return None,
                }
            };
            ms += num * unit;
            rest = rest.get(len..)?;
        }
        let whole = ms.round();
        ((ms - whole).abs() < 1e-6 && go_duration(whole as u64) == s).then_some(whole / 1000.0)
    }

    /// A header that must be present and a [`go_duration`], in seconds.
    pub fn header_duration(r: &http::Response, name: &str) -> f64 {
        let v = r.header(name).unwrap_or_else(|| {
            panic!(
                "missing header {name}; status {} headers {:?}",
                r.status, r.headers
            )
        });
        parse_go_duration(v.trim())
            .unwrap_or_else(|| panic!("header {name}: {v:?} is not a Go duration (`1.5s`, `20ms`)"))
    }

    /// An RFC 3339 UTC time as the Anthropic headers carry it (`2026-01-01T00:00:00Z`).
    pub fn is_rfc3339(s: &str) -> bool {
        let b = s.as_bytes();
        b.len() == 20
            && b.iter().enumerate().all(|(i, c)| match i {
                4 | 7 => *c == b'-',
                10 => *c == b'T',
                13 | 16 => *c == b':',
                19 => *c == b'Z',
                _ => c.is_ascii_digit(),
            })
    }

    /// Asserts the response carries no `x-ratelimit-*` and no `x-tokengate-*` header.
    pub fn assert_untouched(r: &http::Response) {
        let ours: Vec<String> = r
            .headers
            .iter()
            .map(|(k, _)| k.clone())
            .filter(|k| {
                k.starts_with("x-ratelimit-") || k.starts_with("x-tokengate-") || k == "retry-after"
            })
            .collect();
        assert!(
            ours.is_empty(),
            "filter headers on a passthrough response: {ours:?}"
        );
    }

    /// Asserts the filter never panicked in this Envoy.
    pub fn assert_no_panic(envoy: &Envoy) {
        let log = envoy.log();
        let bad: Vec<&str> = log
            .lines()
            .filter(|l| {
                l.contains("panicked") || l.contains("Wasm VM failed") || l.contains("wasm trap")
            })
            .collect();
        assert!(
            bad.is_empty(),
            "filter failure in envoy.log:\n{}",
            bad.join("\n")
        );
    }
}
