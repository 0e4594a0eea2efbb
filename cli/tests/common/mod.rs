//! Shared by the CLI's integration tests: running the built `tokengate` binary, config files, months.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// What one run of the CLI gave.
pub struct Run {
    /// Exit code.
    pub code: i32,
    /// Standard output.
    pub out: String,
    /// Standard error.
    pub err: String,
}

/// Runs `tokengate args…`; stdin is empty.
pub fn tg(args: &[&str]) -> Run {
    let o = Command::new(env!("CARGO_BIN_EXE_tokengate"))
        .args(args)
        .env_remove("TOKENGATE_CONFIG")
        .env_remove("TOKENGATE_REDIS")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run tokengate: {e}"));
    let run = Run {
        code: o.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&o.stdout).to_string(),
        err: String::from_utf8_lossy(&o.stderr).to_string(),
    };
    assert!(
        !run.err.contains("panicked") && !run.err.contains("RUST_BACKTRACE"),
        "tokengate {args:?} panicked:\n{}",
        run.err
    );
    run
}

/// Runs `tokengate` and expects exit 0; returns stdout.
pub fn ok(args: &[&str]) -> String {
    let r = tg(args);
    assert_eq!(r.code, 0, "tokengate {args:?}:\n{}{}", r.out, r.err);
    r.out
}

/// True when `name` (or the path in `$var`) is an executable on `PATH`.
pub fn installed(var: &str, name: &str) -> bool {
    let bin = std::env::var(var).unwrap_or_else(|_| name.to_string());
    if bin.contains('/') {
        return Path::new(&bin).exists();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(&bin).exists()))
        .unwrap_or(false)
}

/// False (test skipped) when redis-server or webdis is missing, outside CI.
pub fn have_redis() -> bool {
    if installed("REDIS_SERVER", "redis-server") && installed("WEBDIS_BIN", "webdis") {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "redis-server or webdis not installed (scripts/deps.sh installs them)"
    );
    eprintln!("SKIPPED: redis-server or webdis not installed");
    false
}

/// Now, unix seconds.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Writes `text` to `dir/name`; returns the path as a string.
pub fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    p.display().to_string()
}

/// The `rows` of `tokengate usage --format json` as (account, model, unit, used, in_leases, in_flight,
/// settled) in base units.
pub fn rows(json: &str) -> Vec<(String, String, String, i64, i64, i64, i64)> {
    let v: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("not JSON ({e}):\n{json}"));
    v["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("no rows:\n{json}"))
        .iter()
        .map(|r| {
            let b = |k: &str| r[k]["base"].as_i64().unwrap_or_else(|| panic!("{k}: {r}"));
            (
                r["account"].as_str().unwrap_or("").to_string(),
                r["model"].as_str().unwrap_or("").to_string(),
                r["unit"].as_str().unwrap_or("").to_string(),
                b("used"),
                b("in_leases"),
                b("in_flight"),
                b("settled"),
            )
        })
        .collect()
}
