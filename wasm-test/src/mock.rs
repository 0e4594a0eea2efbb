//! The mock LLM provider as a test sees it: a `mock-provider` process, the requests it received and
//! the usage it served.

use crate::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
