//! The official Python SDKs as clients: `wasm-test/sdk/driver.py` (in the repo's `.venv`, `make deps`)
//! runs a batch of calls in one interpreter and reports what each SDK returned or raised.

use crate::repo_root;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Longest one batch of SDK calls may take before the driver is killed.
pub const DRIVER_TIMEOUT: Duration = Duration::from_secs(150);

/// One driver call: its scenario and extra arguments.
pub fn call(scenario: &str, extra: &[&str]) -> Vec<String> {
    std::iter::once(scenario)
        .chain(extra.iter().copied())
        .map(str::to_string)
        .collect()
}

/// Runs `calls` through the driver against `port` on loopback (one Python process) and returns one
/// result per call. The driver is killed (by its PID) after [`DRIVER_TIMEOUT`].
pub fn drive(port: u16, calls: &[Vec<String>]) -> Vec<Value> {
    let base = format!("http://127.0.0.1:{port}");
    let calls: Vec<Vec<String>> = calls
        .iter()
        .map(|c| {
            let mut c = c.clone();
            c.push("--base-url".into());
            c.push(base.clone());
            c
        })
        .collect();
    let root = repo_root();
    let python = root.join(".venv/bin/python");
    let mut child = Command::new(&python)
        .arg(root.join("wasm-test/sdk/driver.py"))
        .arg("batch")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (run `make deps`)", python.display()));
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(json!(calls).to_string().as_bytes());
    }
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out = thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + DRIVER_TIMEOUT;
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the SDK driver ran over {DRIVER_TIMEOUT:?}; stderr:\n{}",
                err.join().unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    let last = out
        .lines()
        .rev()
        .find(|l| l.starts_with('['))
        .unwrap_or_else(|| panic!("no result from the driver; stdout:\n{out}\nstderr:\n{err}"));
    let results: Vec<Value> =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("driver output: {e}: {last}"));
    assert_eq!(results.len(), calls.len(), "stderr:\n{err}");
    results
}
