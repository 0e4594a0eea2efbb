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

/// The filter's own quota scripts, sent through a Webdis as the filter sends them.
pub struct Scripts {
    /// Webdis' port.
    pub webdis_port: u16,
    /// The month of the keys.
    pub month: String,
}

use tokengate::quota::calendar::month_end_unix;
use tokengate::quota::*;
use tokengate::shim::webdis::ScriptCall;

impl Scripts {
    pub fn post(&self, body: &str) -> Vec<u8> {
        let r = wasm_test::http::Client::new(self.webdis_port)
            .post("/", &[], body.as_bytes())
            .unwrap_or_else(|e| panic!("webdis: {e}"));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.body
    }

    pub fn reserve(
        &self,
        account: &str,
        model: Option<&str>,
        id: &str,
        prompt: u64,
        output: u64,
        limit: u64,
    ) -> bool {
        let a = ReserveArgs {
            tenant: account.into(),
            model: model.map(str::to_string),
            month: self.month.clone(),
            request_id: id.into(),
            prompt_cost: prompt,
            output_cost: output,
            default_limit: limit,
            default_model_limit: 0,
            expire_at_unix: month_end_unix(now(), 0) + 86_400,
            deadline_s: 3600,
            clamp_output: false,
            min_output_cost: 0,
            lease_owner: lease_owner(0xe1),
        };
        let b = self.post(&reserve_request(&a, ScriptCall::Eval));
        parse_reserve_reply(200, &b)
            .unwrap_or_else(|e| panic!("reserve: {e:?}"))
            .allowed
    }

    pub fn settle(&self, account: &str, model: Option<&str>, id: &str, actual: u64) {
        let keys = QuotaKeys::new(account, model, &self.month, id);
        let s = SettleArgs {
            keys,
            mode: SettleMode::Settle,
            actual,
            expire_at_unix: month_end_unix(now(), 0) + 86_400,
            // No provider usage: the account's month has no input/output split (as 0.1.x left it).
            tokens_in: 0,
            tokens_out: 0,
        };
        let b = self.post(&settle_request(&[&s], ScriptCall::Eval));
        assert_eq!(
            parse_settle_reply(200, &b, 1).unwrap_or_else(|e| panic!("settle: {e:?}")),
            vec![1]
        );
    }

    /// A lease of Envoy `envoy` growing to `want`; returns what it holds.
    pub fn lease(
        &self,
        account: &str,
        model: Option<&str>,
        envoy: u64,
        want: u64,
        limit: u64,
    ) -> u64 {
        let a = LeaseArgs {
            keys: QuotaKeys::new(account, model, &self.month, "-"),
            lease_id: lease_id(envoy, model, &self.month),
            reported_total: 0,
            want,
            target: None,
            default_limit: limit,
            default_model_limit: 0,
            expire_at_unix: month_end_unix(now(), 0) + 86_400,
            ttl_s: 60,
            max_grant: 1_000_000_000,
            max_share_percent: 100,
            tokens_in: 0,
            tokens_out: 0,
        };
        let b = self.post(&lease_request(&a, ScriptCall::Eval));
        parse_lease_reply(200, &b)
            .unwrap_or_else(|e| panic!("lease: {e:?}"))
            .held
    }
}
