//! Fault controls for the fault-matrix tests (`tests/faults.rs`): processes that can be paused, killed and
//! restarted on the same port, upstream faults asked of the mock provider by request header, and the
//! mock's served-usage ledger.
//!
//! ```no_run
//! use wasm_test::faults::{DurableRedis, RestartableWebdis};
//! let mut redis = DurableRedis::start();           // AOF on: appendonly yes, appendfsync everysec
//! let mut webdis = RestartableWebdis::start(redis.port);
//! redis.pause();                                   // SIGSTOP by PID
//! redis.resume();                                  // SIGCONT
//! redis.kill();                                    // SIGKILL: what was not written to the AOF is gone
//! redis.restart();                                 // same port, same data dir: the AOF is loaded
//! webdis.kill();
//! webdis.restart();
//! ```
//!
//! - [`DurableRedis`]: `redis-server` with `--appendonly yes --appendfsync everysec` in its own data dir.
//! - [`RestartableWebdis`]: Webdis on a fixed port, killed (SIGKILL) and started again on that port.
//! - [`RestartableEnvoy`]: Envoy with the filter from one rendered bootstrap (same ports every time),
//!   stopped with SIGTERM and started again.
//! - [`Upstream`]: the mock provider's failure injection (`x-mock-status`, `x-mock-reset`,
//!   `x-mock-cut-after`).
//! - [`ledger`], [`reset_ledger`]: the mock's `GET /_mock/ledger` and `POST /_mock/ledger/reset`.
//!
//! Every process is held by a [`Proc`], which on drop (also while a test panics) sends SIGCONT (a
//! paused process must be able to end), then SIGTERM, then SIGKILL after a grace period, by PID.

use crate::{
    free_port, http, redis_cmd, render_bootstrap, Bootstrap, EnvoyOpts, MockProvider, RespValue,
    TempDir,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

/// Sends `sig` (a name such as `STOP`, `CONT`, `TERM`, `KILL`) to `pid` with `kill(1)`; true when sent.
pub fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A child process, stopped by PID when dropped.
pub struct Proc {
    name: String,
    child: Child,
}

impl Proc {
    /// Spawns `cmd` (stdin from /dev/null); panics naming `name` when it cannot.
    pub fn spawn(name: &str, cmd: &mut Command) -> Proc {
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {name}: {e}"));
        Proc {
            name: name.to_string(),
            child,
        }
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status once it has exited (reaped), None while it runs.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits (bounded) for it to exit; the exit status, None when it still runs at the deadline.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }

    /// SIGTERM, wait up to `grace` for it to exit, then SIGKILL; reaps it. True when it exited on
    /// SIGTERM alone.
    pub fn terminate(&mut self, grace: Duration) -> bool {
        if self.exited().is_some() {
            return true;
        }
        signal(self.pid(), "TERM");
        if self.wait_exit(grace).is_some() {
            return true;
        }
        eprintln!(
            "{} (pid {}) ignored SIGTERM: SIGKILL",
            self.name,
            self.pid()
        );
        self.kill();
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exited().is_none() {
            // A paused process must be able to act on SIGTERM.
            signal(self.pid(), "CONT");
            self.terminate(Duration::from_secs(2));
        }
    }
}

/// Polls `ready` every 30 ms until it holds or `timeout` passes; panics with `what` and `detail()`
/// when it never does or `proc` exits meanwhile.
fn wait_ready(
    proc: &mut Proc,
    timeout: Duration,
    what: &str,
    mut ready: impl FnMut() -> bool,
    detail: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return;
        }
        if let Some(st) = proc.exited() {
            panic!("{what}: exited {st}: {}", detail());
        }
        if Instant::now() >= deadline {
            panic!("{what}: not ready after {timeout:?}: {}", detail());
        }
        thread::sleep(Duration::from_millis(30));
    }
}

fn read_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all.get(all.len().saturating_sub(lines)..)
        .unwrap_or_default()
        .join("\n")
}

// ---------------------------------------------------------------------------------------------
// Redis with AOF
// ---------------------------------------------------------------------------------------------

/// A `redis-server` on a fixed loopback port with AOF persistence (`appendonly yes`,
/// `appendfsync everysec`, no RDB snapshots) in its own data dir, so that a restart after SIGKILL
/// loads what was written to the AOF.
pub struct DurableRedis {
    /// Its port (kept across restarts).
    pub port: u16,
    proc: Option<Proc>,
    paused: bool,
    // Declared last: removed after the process is gone.
    dir: TempDir,
}

impl DurableRedis {
    /// Starts `$REDIS_SERVER` (default `redis-server`) on a free port and waits for PING (10 s).
    pub fn start() -> DurableRedis {
        let mut r = DurableRedis {
            port: free_port(),
            proc: None,
            paused: false,
            dir: TempDir::new("redis-aof"),
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let log = self.dir.path().join("redis.log");
        let mut cmd = Command::new(&bin);
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
            ])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut proc = Proc::spawn(&format!("{bin} (apt-get install redis-server)"), &mut cmd);
        let port = self.port;
        wait_ready(
            &mut proc,
            Duration::from_secs(10),
            &format!("redis-server on {port}"),
            || matches!(redis_cmd(port, &["PING"]), Ok(RespValue::Simple(ref s)) if s == "PONG"),
            || read_tail(&log, 20),
        );
        self.proc = Some(proc);
        self.paused = false;
    }

    /// PID of the running process (None while killed).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// The data dir (AOF files).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// SIGSTOP: Redis holds every connection and answers nothing until [`resume`](Self::resume).
    pub fn pause(&mut self) {
        if let Some(p) = &self.proc {
            assert!(signal(p.pid(), "STOP"), "SIGSTOP redis {}", p.pid());
            self.paused = true;
        }
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&mut self) {
        if let Some(p) = &self.proc {
            assert!(signal(p.pid(), "CONT"), "SIGCONT redis {}", p.pid());
            self.paused = false;
        }
    }

    /// SIGKILL (no shutdown: only what Redis had written to the AOF file survives).
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
        self.paused = false;
    }

    /// Starts Redis again on the same port with the same data dir (after [`kill`](Self::kill)); waits
    /// until it answers PING, that is until the AOF is loaded (bounded, 10 s).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// One command.
    pub fn cmd(&self, args: &[&str]) -> Result<RespValue, String> {
        redis_cmd(self.port, args)
    }

    /// Integer value of `key`: Ok(0) when absent, Err when Redis cannot answer or it is not an integer.
    pub fn get_i64(&self, key: &str) -> Result<i64, String> {
        match self.cmd(&["GET", key])? {
            RespValue::Bulk(None) => Ok(0),
            v => v
                .as_int()
                .ok_or_else(|| format!("GET {key}: not an integer: {v:?}")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Webdis
// ---------------------------------------------------------------------------------------------

/// Webdis on a fixed loopback port in front of a Redis port, killed and restarted on that port.
pub struct RestartableWebdis {
    /// Its HTTP port (kept across restarts).
    pub port: u16,
    proc: Option<Proc>,
    // Declared last: removed after the process is gone.
    dir: TempDir,
}

impl RestartableWebdis {
    /// Writes a config (`daemonize: false`, 2 threads, pool of 8) for a free port and starts
    /// `$WEBDIS_BIN` (default `webdis`); waits until `GET /PING` answers PONG (10 s).
    pub fn start(redis_port: u16) -> RestartableWebdis {
        let dir = TempDir::new("webdis-r");
        let port = free_port();
        let config = serde_json::json!({
            "redis_host": "127.0.0.1", "redis_port": redis_port, "redis_auth": null,
            "http_host": "127.0.0.1", "http_port": port, "threads": 2, "pool_size": 8,
            "daemonize": false, "websockets": false, "database": 0, "verbosity": 3,
            "logfile": dir.path().join("webdis.log").display().to_string(),
        });
        fs::write(dir.path().join("webdis.json"), config.to_string())
            .unwrap_or_else(|e| panic!("webdis.json: {e}"));
        let mut w = RestartableWebdis {
            port,
            proc: None,
            dir,
        };
        w.spawn(Duration::from_secs(10));
        w
    }

    /// Starts the process; a start that fails (its port not free yet) is retried until `timeout`.
    fn spawn(&mut self, timeout: Duration) {
        let bin = std::env::var("WEBDIS_BIN").unwrap_or_else(|_| "webdis".into());
        let deadline = Instant::now() + timeout;
        loop {
            let mut cmd = Command::new(&bin);
            cmd.arg(self.dir.path().join("webdis.json"))
                .current_dir(self.dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let mut proc = Proc::spawn(&format!("{bin} (apt-get install webdis)"), &mut cmd);
            let port = self.port;
            let up = loop {
                let pong =
                    http::request(port, "GET", "/PING", &[], b"", Duration::from_millis(500))
                        .is_ok_and(|r| r.status == 200 && r.text().contains("PONG"));
                if pong {
                    break true;
                }
                if proc.exited().is_some() || Instant::now() >= deadline {
                    break false;
                }
                thread::sleep(Duration::from_millis(30));
            };
            if up {
                self.proc = Some(proc);
                return;
            }
            proc.kill();
            if Instant::now() >= deadline {
                panic!(
                    "webdis not answering /PING on {port} after {timeout:?}: {}",
                    read_tail(&self.dir.path().join("webdis.log"), 20)
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// PID of the running process (None while killed).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// Starts Webdis again on the same port (retried while the port is not free yet; 10 s).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn(Duration::from_secs(10));
    }

    /// Contents of webdis.log.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("webdis.log")).unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// Envoy
// ---------------------------------------------------------------------------------------------

/// Envoy with the filter, started from one rendered bootstrap so that every start listens on the same
/// ports; stopped with SIGTERM and started again. Each start logs to its own `envoy-<n>.log`.
pub struct RestartableEnvoy {
    /// Listener port.
    pub port: u16,
    /// Admin port.
    pub admin_port: u16,
    opts: EnvoyOpts,
    boot: Bootstrap,
    proc: Option<Proc>,
    starts: u32,
    // Declared last: removed after the process is gone.
    dir: TempDir,
}

impl RestartableEnvoy {
    /// Renders the bootstrap of `opts` and starts Envoy (see [`start_again`](Self::start_again)).
    pub fn start(opts: EnvoyOpts) -> Result<RestartableEnvoy, String> {
        let dir = TempDir::new("envoy-r");
        let boot = render_bootstrap(&opts, dir.path());
        let mut e = RestartableEnvoy {
            port: boot.port,
            admin_port: boot.admin_port,
            opts,
            boot,
            proc: None,
            starts: 0,
            dir,
        };
        e.start_again()?;
        Ok(e)
    }

    /// Starts Envoy from the bootstrap (after [`stop`](Self::stop)) and waits until admin `/ready`
    /// says LIVE (bounded by the options' `ready_timeout`). Err with the log tail when it exits or
    /// never gets ready (a listener port still held is retried until then).
    pub fn start_again(&mut self) -> Result<Duration, String> {
        let t0 = Instant::now();
        let deadline = t0 + self.opts.ready_timeout;
        loop {
            self.starts += 1;
            let log_path = self.log_path(self.starts);
            let log = fs::File::create(&log_path).map_err(|e| format!("envoy log: {e}"))?;
            let log2 = log.try_clone().map_err(|e| format!("envoy log: {e}"))?;
            let mut cmd = Command::new(crate::envoy_bin());
            cmd.arg("-c")
                .arg(&self.boot.path)
                .args(["--concurrency", &self.opts.concurrency.to_string()])
                .arg("--disable-hot-restart")
                .args(["-l", &self.opts.log_level])
                .args(["--component-log-level", &self.opts.component_log_level])
                .args(["--file-flush-interval-msec", "100"])
                .stdout(Stdio::from(log2))
                .stderr(Stdio::from(log));
            let mut proc = Proc::spawn("envoy", &mut cmd);
            loop {
                if proc.exited().is_some() {
                    let text = fs::read_to_string(&log_path).unwrap_or_default();
                    if text.contains("Address already in use") && Instant::now() < deadline {
                        thread::sleep(Duration::from_millis(200));
                        break;
                    }
                    return Err(format!(
                        "envoy exited before ready; log tail:\n{}",
                        read_tail(&log_path, 40)
                    ));
                }
                let live = http::request(
                    self.admin_port,
                    "GET",
                    "/ready",
                    &[],
                    b"",
                    Duration::from_millis(500),
                )
                .is_ok_and(|r| r.status == 200 && r.text().trim() == "LIVE");
                if live {
                    self.proc = Some(proc);
                    return Ok(t0.elapsed());
                }
                if Instant::now() >= deadline {
                    proc.kill();
                    return Err(format!(
                        "envoy not LIVE after {:?}; log tail:\n{}",
                        self.opts.ready_timeout,
                        read_tail(&log_path, 40)
                    ));
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// SIGTERM by PID and wait (bounded by `grace`, then SIGKILL) until the process is gone. True
    /// when it exited on SIGTERM alone.
    pub fn stop(&mut self, grace: Duration) -> bool {
        match self.proc.take() {
            Some(mut p) => p.terminate(grace),
            None => true,
        }
    }

    /// PID of the running process (None while stopped).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// How many times Envoy was started.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    fn log_path(&self, n: u32) -> PathBuf {
        self.dir.path().join(format!("envoy-{n}.log"))
    }

    /// The logs of every start, in order.
    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|n| fs::read_to_string(self.log_path(n)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The access log (every start appends to it).
    pub fn access_log(&self) -> String {
        fs::read_to_string(&self.boot.access_log).unwrap_or_default()
    }

    /// Counters and gauges of the running Envoy (`/stats?format=json`): name → value; empty while it
    /// is stopped or does not answer.
    pub fn stats(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        let Ok(r) = http::get(self.admin_port, "/stats?format=json", &[]) else {
            return out;
        };
        let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
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
}

/// A stat of [`RestartableEnvoy::stats`] by name, with or without the `wasmcustom.` prefix.
pub fn stat_of(stats: &BTreeMap<String, u64>, name: &str) -> Option<u64> {
    stats
        .get(name)
        .or_else(|| stats.get(&format!("wasmcustom.{name}")))
        .copied()
}

// ---------------------------------------------------------------------------------------------
// Upstream faults
// ---------------------------------------------------------------------------------------------

/// What the mock provider is asked to do with one request (its request headers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// A normal answer.
    Normal,
    /// This error status (`x-mock-status`).
    Status(u16),
    /// Close the connection without answering (`x-mock-reset: 1`).
    Reset,
    /// Streams: send this many events then close without the final chunk; JSON: the headers and
    /// half the body, then close (`x-mock-cut-after`).
    CutAfter(u32),
}

impl Upstream {
    /// The request headers that ask for it.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        match *self {
            Upstream::Normal => Vec::new(),
            Upstream::Status(s) => vec![("x-mock-status", s.to_string())],
            Upstream::Reset => vec![("x-mock-reset", "1".into())],
            Upstream::CutAfter(n) => vec![("x-mock-cut-after", n.to_string())],
        }
    }

    /// A short name for tables: `ok`, `500`, `reset`, `cut`.
    pub fn label(&self) -> String {
        match *self {
            Upstream::Normal => "ok".into(),
            Upstream::Status(s) => s.to_string(),
            Upstream::Reset => "reset".into(),
            Upstream::CutAfter(_) => "cut".into(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The mock's served-usage ledger
// ---------------------------------------------------------------------------------------------

/// One answer of the mock provider (an entry of `GET /_mock/ledger`).
#[derive(Clone, Debug, Default)]
pub struct ServedAnswer {
    /// Tenant (`x-mock-tenant`, else `x-tenant-id`).
    pub tenant: String,
    /// `x-mock-tag` of the request.
    pub tag: String,
    /// An SSE answer.
    pub stream: bool,
    /// `complete`, `cut`, `reset` or `error`.
    pub outcome: String,
    /// For `cut`: `injected` or `peer`.
    pub cut_by: String,
    /// Status sent (0: none).
    pub status: u16,
    /// Prompt tokens (the mock's rule).
    pub prompt: u64,
    /// Completion tokens of the whole answer.
    pub completion: u64,
    /// Completion tokens sent.
    pub output_sent: u64,
    /// Bytes of generated text in the stream events sent.
    pub content_bytes: u64,
    /// Body bytes written (JSON).
    pub body_bytes: u64,
    /// Tokens served: prompt + `output_sent` for an answer that started, else 0.
    pub tokens: u64,
}

/// The whole ledger.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// LLM answers given.
    pub served: u64,
    /// Tokens served, all tenants.
    pub tokens: u64,
    /// Tokens served per tenant.
    pub tenant_tokens: BTreeMap<String, u64>,
    /// Every answer, in the order they ended.
    pub answers: Vec<ServedAnswer>,
}

impl Ledger {
    /// The answers keyed by tag (answers without a tag left out; a repeated tag keeps the last).
    pub fn by_tag(&self) -> BTreeMap<String, ServedAnswer> {
        self.answers
            .iter()
            .filter(|a| !a.tag.is_empty())
            .map(|a| (a.tag.clone(), a.clone()))
            .collect()
    }
}

/// `GET /_mock/ledger` of `mock`.
pub fn ledger(mock: &MockProvider) -> Ledger {
    let r = http::get(mock.port, "/_mock/ledger", &[])
        .unwrap_or_else(|e| panic!("GET /_mock/ledger: {e}"));
    let v: Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("/_mock/ledger is not JSON: {e}"));
    let u = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let tenant_tokens = v
        .get("tenants")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(t, e)| (t.clone(), u(e, "tokens"))).collect())
        .unwrap_or_default();
    let answers = v
        .get("requests")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|a| ServedAnswer {
            tenant: s(a, "tenant"),
            tag: s(a, "tag"),
            stream: a.get("stream").and_then(Value::as_bool).unwrap_or(false),
            outcome: s(a, "outcome"),
            cut_by: s(a, "cut_by"),
            status: u(a, "status") as u16,
            prompt: u(a, "prompt"),
            completion: u(a, "completion"),
            output_sent: u(a, "output_sent"),
            content_bytes: u(a, "content_bytes"),
            body_bytes: u(a, "body_bytes"),
            tokens: u(a, "tokens"),
        })
        .collect();
    Ledger {
        served: u(&v, "served"),
        tokens: u(&v, "tokens"),
        tenant_tokens,
        answers,
    }
}

/// `POST /_mock/ledger/reset` of `mock`.
pub fn reset_ledger(mock: &MockProvider) {
    let r = http::post(mock.port, "/_mock/ledger/reset", &[], b"")
        .unwrap_or_else(|e| panic!("POST /_mock/ledger/reset: {e}"));
    assert_eq!(r.status, 200, "ledger reset");
}

// ---------------------------------------------------------------------------------------------
// Calendar
// ---------------------------------------------------------------------------------------------

/// `"2026-11"`: the UTC month of Unix time `t` (H. Hinnant's civil-from-days), as the quota keys
/// `tg:q:{tenant}:<month>` spell it with `month_offset_minutes: 0`.
pub fn month_label(t: i64) -> String {
    let z = t.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}")
}

/// Unix time now, seconds.
pub fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::month_label;

    #[test]
    fn month_labels_around_year_and_leap_day_ends() {
        assert_eq!(month_label(0), "1970-01");
        assert_eq!(month_label(951_782_399), "2000-02"); // 2000-02-28T23:59:59Z
        assert_eq!(month_label(951_868_799), "2000-02"); // 2000-02-29T23:59:59Z
        assert_eq!(month_label(951_868_800), "2000-03");
        assert_eq!(month_label(1_798_761_599), "2026-12"); // 2026-12-31T23:59:59Z
        assert_eq!(month_label(1_798_761_600), "2027-01");
    }
}
