//! The official SDKs through Envoy and the release tokengate.wasm: the `openai` and `anthropic` Python
//! SDKs and LiteLLM (installed into .venv by `make deps`, pinned in wasm-test/sdk/requirements.txt),
//! driven by wasm-test/sdk/driver.py against the mock provider.
//!
//! * Every admitted path parses with the SDK: chat (plain, streamed with and without `include_usage`),
//!   legacy completions (plain and streamed), embeddings, responses (plain and streamed), Anthropic
//!   messages (plain and streamed), LiteLLM's completion.
//! * Refusals raise the SDK's own exception type; what a retry can fix is retried (attempts counted at
//!   Envoy: `http.ingress.downstream_rq_total`), what it cannot returns at once.
//!
//! * Every refusal carries its family's contract (docs/response-contract.md) as the SDK reports it:
//!   OpenAI `type`/`code`/`param`, Anthropic `type`/`error_code`, the request id, the retry headers;
//!   admitted answers report whole rate-limit trios in the family's format.
//!
//! `tests/sdk_replies.rs` (package tokengate) checks every rendered class against the same SDKs
//! without Envoy.

use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};
use wasm_test::faults::{month_label, now_unix};
use wasm_test::sdk::{call, drive, DRIVER_TIMEOUT};
use wasm_test::tg::{self, rule};
use wasm_test::{
    free_port, mock_provider, repo_root, Envoy, EnvoyOpts, MockProvider, RedisServer, RespValue,
    Webdis,
};

/// What the mock answers for `max_tokens` 8 (`t0 t1 … t7 `).
const TEXT8: &str = "t0 t1 t2 t3 t4 t5 t6 t7 ";

/// A driver started ahead of time (`driver.py lines`): Python and the SDK are loaded before a call
/// whose timing matters. Killed (by its PID) when dropped.
struct WarmDriver {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    results: std::sync::mpsc::Receiver<String>,
    base: String,
}

impl WarmDriver {
    fn start(port: u16) -> WarmDriver {
        let root = repo_root();
        let python = root.join(".venv/bin/python");
        let mut child = Command::new(&python)
            .arg(root.join("wasm-test/sdk/driver.py"))
            .arg("lines")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (run `make deps`)", python.display()));
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, results) = std::sync::mpsc::channel();
        thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        WarmDriver {
            child,
            stdin,
            results,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    fn call(&mut self, scenario: &str, extra: &[&str]) -> Value {
        let mut argv = call(scenario, extra);
        argv.extend(["--base-url".to_string(), self.base.clone()]);
        writeln!(self.stdin, "{}", json!(argv)).unwrap();
        let line = self
            .results
            .recv_timeout(DRIVER_TIMEOUT)
            .unwrap_or_else(|e| panic!("no answer from the SDK driver in {DRIVER_TIMEOUT:?}: {e}"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }
}

impl Drop for WarmDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One call, one result.
fn drive1(port: u16, scenario: &str, extra: &[&str]) -> Value {
    drive(port, &[call(scenario, extra)]).remove(0)
}

/// Requests Envoy has received so far.
fn requests_seen(envoy: &Envoy) -> u64 {
    envoy
        .stat_opt("http.ingress.downstream_rq_total")
        .unwrap_or(0)
}

/// Runs one driver call and returns its result and how many HTTP requests it made through Envoy.
fn attempts(envoy: &Envoy, scenario: &str, extra: &[&str]) -> (Value, u64) {
    let before = requests_seen(envoy);
    let got = drive1(envoy.port, scenario, extra);
    // Counters are updated when a stream is created: the driver is done, so every attempt is counted.
    (got, requests_seen(envoy) - before)
}

fn assert_ok(got: &Value) {
    assert_eq!(got["ok"], true, "the SDK call failed: {got}");
}

fn assert_raised(got: &Value, exception: &str, status: u64) {
    assert_eq!(got["ok"], false, "the SDK call succeeded: {got}");
    assert_eq!(got["exception"], exception, "{got}");
    assert_eq!(got["status_code"], status, "{got}");
}

fn elapsed(got: &Value) -> f64 {
    got["elapsed"].as_f64().unwrap_or(f64::NAN)
}

/// A roomy rule for everyone.
fn roomy() -> Value {
    tg::config(json!([rule("all", "*", "*", 1_000_000.0, 1_000_000_000)]))
}

/// Redis + Webdis for the quota tests.
struct Quota {
    // Webdis before Redis: dropped first.
    webdis: Webdis,
    redis: RedisServer,
}

impl Quota {
    fn start() -> Quota {
        let redis = RedisServer::start();
        let webdis = Webdis::start(redis.port);
        Quota { webdis, redis }
    }
}

/// Envoy in front of `mock` with `cfg`, its quota shim at `webdis_port`.
fn envoy_with_shim(mock: &MockProvider, cfg: Value, webdis_port: u16) -> Envoy {
    let mut o = EnvoyOpts::new(mock.port, cfg).webdis(webdis_port);
    o.ready_timeout = Duration::from_secs(60);
    tg::start_opts(o)
}

/// `roomy()` with a quota section.
fn with_quota(quota: Value) -> Value {
    tg::merge(
        roomy(),
        json!({"quota": tg::merge(json!({"cluster": "webdis", "timeout_ms": 1000}), quota)}),
    )
}

// ---------------------------------------------------------------------------------------------
// Admitted answers parse with the SDKs
// ---------------------------------------------------------------------------------------------

#[test]
fn the_openai_sdk_parses_every_openai_path_through_the_filter() {
    let mock = mock_provider!();
    let envoy = tg::start(&mock, roomy());
    let scenarios = [
        "openai-chat",
        "openai-chat-stream",
        "openai-chat-stream-usage",
        "openai-completions",
        "openai-completions-stream",
        "openai-embeddings",
        "openai-responses",
        "openai-responses-stream",
    ];
    let calls: Vec<Vec<String>> = scenarios.iter().map(|s| call(s, &[])).collect();
    let results = drive(envoy.port, &calls);
    let by: std::collections::HashMap<&str, &Value> =
        scenarios.iter().copied().zip(results.iter()).collect();
    for (s, got) in &by {
        assert_ok(got);
        if *s != "openai-embeddings" {
            assert_eq!(got["text"], TEXT8, "{s}: {got}");
        }
    }
    let chat_usage = json!({"prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10});
    assert_eq!(by["openai-chat"]["usage"], chat_usage);
    assert_eq!(by["openai-chat"]["finish_reason"], "length");
    // The filter's own headers reached the SDK on the admitted answer.
    let h = &by["openai-chat"]["headers"];
    for name in ["x-ratelimit-limit-tokens", "x-tokengate-estimated-tokens"] {
        assert!(h.get(name).is_some(), "{name} missing: {h}");
    }
    assert_eq!(
        by["openai-chat-stream"]["usage"],
        Value::Null,
        "not asked for"
    );
    assert_eq!(by["openai-chat-stream-usage"]["usage"], chat_usage);
    assert_eq!(by["openai-completions"]["usage"], chat_usage);
    assert_eq!(by["openai-completions-stream"]["usage"], chat_usage);
    assert_eq!(by["openai-embeddings"]["dims"], 8);
    assert_eq!(
        by["openai-embeddings"]["usage"],
        json!({"prompt_tokens": 2, "total_tokens": 2})
    );
    let resp_usage = json!({"input_tokens": 2, "output_tokens": 8, "total_tokens": 10});
    assert_eq!(by["openai-responses"]["usage"], resp_usage);
    assert_eq!(by["openai-responses"]["status"], "completed");
    let stream = by["openai-responses-stream"];
    assert_eq!(stream["usage"], resp_usage);
    assert_eq!(stream["final_text"], TEXT8);
    assert_eq!(
        stream["events"].as_array().map(Vec::len),
        Some(12),
        "{stream}"
    );
    // Each call went through the filter to the provider once.
    assert_eq!(mock.requests().len(), scenarios.len());
    assert_eq!(
        envoy.stat("tokengate_requests_admitted"),
        scenarios.len() as u64
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn the_anthropic_sdk_parses_messages_and_their_stream_through_the_filter() {
    let mock = mock_provider!();
    let envoy = tg::start(&mock, roomy());
    let results = drive(
        envoy.port,
        &[
            call("anthropic-messages", &[]),
            call("anthropic-messages-stream", &[]),
        ],
    );
    let usage = json!({"input_tokens": 2, "output_tokens": 8});
    for got in &results {
        assert_ok(got);
        assert_eq!(got["text"], TEXT8, "{got}");
        assert_eq!(got["usage"], usage, "{got}");
        assert_eq!(got["stop_reason"], "max_tokens", "{got}");
    }
    let h = &results[0]["headers"];
    assert!(h.get("x-tokengate-estimated-tokens").is_some(), "{h}");
    let events: Vec<&str> = results[1]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(
        &events[events.len() - 2..],
        ["message_delta", "message_stop"]
    );
    assert!(events.contains(&"content_block_delta"));
    assert_eq!(results[1]["final_text"], TEXT8);
    assert_eq!(envoy.stat("tokengate_requests_admitted"), 2);
    tg::assert_no_panic(&envoy);
}

#[test]
fn litellm_completion_parses_through_the_filter() {
    let mock = mock_provider!();
    let envoy = tg::start(&mock, roomy());
    let got = drive1(envoy.port, "litellm-chat", &[]);
    assert_ok(&got);
    assert_eq!(got["text"], TEXT8);
    assert_eq!(got["usage"]["completion_tokens"], 8, "{got}");
    assert_eq!(envoy.stat("tokengate_requests_admitted"), 1);
    tg::assert_no_panic(&envoy);
}

#[test]
fn an_injected_include_usage_is_invisible_to_the_sdk_and_every_other_body_byte_is_kept() {
    let q = Quota::start();
    let mock = mock_provider!();
    let envoy = envoy_with_shim(
        &mock,
        with_quota(json!({"monthly_limit": 1_000_000})),
        q.webdis.port,
    );
    // A tool schema whose properties are not in sorted order: structured output comes back in this
    // order, so the provider must receive it as sent.
    let got = drive1(
        envoy.port,
        "openai-chat-stream",
        &["--tool-properties", "zeta,alpha,mid"],
    );
    assert_ok(&got);
    assert_eq!(got["text"], TEXT8);
    assert_eq!(
        got["usage"],
        Value::Null,
        "the usage chunk the filter asked for is stripped again"
    );
    let sent = mock
        .requests()
        .into_iter()
        .find(|r| r.path == tg::CHAT)
        .expect("the provider got the request");
    let body = &sent.body;
    assert!(
        body.ends_with(r#","stream_options":{"include_usage":true}}"#),
        "injected as one new member at the end: {body}"
    );
    let at = |k: &str| body.find(&format!("\"{k}\"")).unwrap_or(usize::MAX);
    assert!(
        at("zeta") < at("alpha") && at("alpha") < at("mid"),
        "properties keep their order: {body}"
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_clamped_anthropic_request_keeps_its_thinking_budget_below_max_tokens() {
    const LIMIT: u64 = 3000;
    let q = Quota::start();
    let mock = mock_provider!();
    let cfg = with_quota(json!({"monthly_limit": 1_000_000,
        "tenants": {"thinker": {"monthly_limit": LIMIT, "clamp_output": true}}}));
    let envoy = envoy_with_shim(&mock, cfg, q.webdis.port);
    let got = drive1(
        envoy.port,
        "anthropic-messages",
        &[
            "--tenant",
            "thinker",
            "--max-tokens",
            "8000",
            "--thinking-budget",
            "5000",
        ],
    );
    assert_ok(&got);
    let sent = mock
        .requests()
        .into_iter()
        .find(|r| r.path == "/v1/messages")
        .expect("the provider got the request")
        .json();
    let max = sent["max_tokens"].as_u64().unwrap();
    assert!(
        max < LIMIT && max > 2000,
        "clamped to what the quota has left: {sent}"
    );
    assert_eq!(
        sent["thinking"],
        json!({"type": "enabled", "budget_tokens": max - 1}),
        "the budget stays below max_tokens"
    );
    assert_eq!(got["usage"]["output_tokens"], max, "{got}");
    tg::assert_no_panic(&envoy);
}

// ---------------------------------------------------------------------------------------------
// Refusals: the SDK's own exceptions; retried when a retry can help, at once when not
// ---------------------------------------------------------------------------------------------

/// A bucket of 1000 tokens refilled at 50/s: a first request of ~600 tokens leaves ~400, so a second
/// one right after it (same driver process, no start-up in between) is refused for about 4 s.
fn small_bucket() -> Value {
    tg::config(json!([rule("all", "*", "*", 50.0, 1000)]))
}

#[test]
fn a_bucket_429_is_retried_by_both_sdks_and_then_admitted() {
    let mock = mock_provider!();
    let envoy = tg::start(&mock, small_bucket());
    for (scenario, tenant) in [("openai-chat", "o"), ("anthropic-messages", "a")] {
        let args = ["--tenant", tenant, "--max-tokens", "590"];
        let before = requests_seen(&envoy);
        let results = drive(envoy.port, &[call(scenario, &args), call(scenario, &args)]);
        let n = requests_seen(&envoy) - before;
        assert_ok(&results[0]);
        let got = &results[1];
        assert_ok(got);
        assert_eq!(
            n, 3,
            "{scenario}: the first, then one 429 and its admitted retry: {got}"
        );
        assert!(
            elapsed(got) >= 1.0,
            "{scenario}: waited before retrying: {got}"
        );
    }
    assert_eq!(envoy.stat("tokengate_requests_limited_tokens"), 2);
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_bucket_429_without_retries_raises_rate_limit_error() {
    let mock = mock_provider!();
    let envoy = tg::start(&mock, small_bucket());
    for (ok, err, tenant) in [
        ("openai-chat", "openai-error", "o"),
        ("anthropic-messages", "anthropic-error", "a"),
    ] {
        let args = [
            "--tenant",
            tenant,
            "--max-tokens",
            "590",
            "--max-retries",
            "0",
        ];
        let results = drive(envoy.port, &[call(ok, &args), call(err, &args)]);
        assert_ok(&results[0]);
        assert_raised(&results[1], "RateLimitError", 429);
    }
    tg::assert_no_panic(&envoy);
}

#[test]
fn what_a_retry_cannot_fix_returns_at_once() {
    let mock = mock_provider!();
    let mut cfg = tg::config(json!([rule("small", "*", "*", 1.0, 100)]));
    cfg["max_body_bytes"] = json!(4096);
    let envoy = tg::start(&mock, cfg);
    let big = "x".repeat(8000);
    let cases: [(&str, Vec<&str>, &str, u64); 6] = [
        // Costs more than the burst: never admitted.
        (
            "openai-error",
            vec!["--max-tokens", "500"],
            "APIStatusError",
            413,
        ),
        (
            "anthropic-error",
            vec!["--max-tokens", "500"],
            "ContentTooLargeError",
            413,
        ),
        // Body over max_body_bytes.
        (
            "openai-error",
            vec!["--prompt", &big],
            "APIStatusError",
            413,
        ),
        (
            "anthropic-error",
            vec!["--prompt", &big],
            "ContentTooLargeError",
            413,
        ),
        // No tenant.
        (
            "openai-error",
            vec!["--tenant", ""],
            "AuthenticationError",
            401,
        ),
        (
            "anthropic-error",
            vec!["--tenant", ""],
            "AuthenticationError",
            401,
        ),
    ];
    for (scenario, args, exception, status) in cases {
        let (got, n) = attempts(&envoy, scenario, &args);
        assert_raised(&got, exception, status);
        assert_eq!(n, 1, "not retried: {got}");
        assert!(elapsed(&got) < 5.0, "{got}");
    }
    assert!(mock.requests().is_empty(), "nothing reached the provider");
    tg::assert_no_panic(&envoy);
}

#[test]
fn batch_apis_that_cannot_be_metered_are_refused_in_each_sdks_shape() {
    // A batch spends provider usage the filter never sees a body for: refused with 403 (both SDKs
    // raise PermissionDeniedError, not retried), while token counting, free, passes.
    let mock = mock_provider!();
    let envoy = tg::start(&mock, roomy());
    for scenario in ["openai-batches-error", "anthropic-batches-error"] {
        let (got, n) = attempts(&envoy, scenario, &[]);
        assert_raised(&got, "PermissionDeniedError", 403);
        assert_eq!(n, 1, "not retried: {got}");
        assert_eq!(
            got["headers"]["x-tokengate-reason"], "path_not_metered",
            "{got}"
        );
        let code = if scenario.starts_with("openai") {
            &got["code"]
        } else {
            &got["error_code"]
        };
        assert_eq!(code, "path_not_metered", "{got}");
    }
    assert!(mock.requests().is_empty(), "no batch reached the provider");
    let got = drive1(envoy.port, "anthropic-count-tokens", &[]);
    assert_ok(&got);
    assert_eq!(got["status"], 200, "{got}");
    let paths: Vec<String> = mock.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/v1/messages/count_tokens"]);
    tg::assert_no_panic(&envoy);
}

fn breaker_config() -> Value {
    tg::merge(
        roomy(),
        json!({"breaker": {"keys": ["cluster"], "failure_threshold": 2, "recovery_ms": 2000,
                           "half_open_max_calls": 2, "probe_timeout_ms": 5000}}),
    )
}

/// Two provider failures (500, not retried) that open the cluster breaker, made by the same driver
/// process as the calls after them: no interpreter start-up between them and the breaker's recovery
/// (2 s). The second waits 0.3 s for the first's outcome to be recorded (in `on_log`).
fn open_breaker(scenario: &str) -> Vec<Vec<String>> {
    let fail = |sleep: &str| {
        call(
            scenario,
            &[
                "--header",
                "x-mock-status=500",
                "--max-retries",
                "0",
                "--sleep-before",
                sleep,
            ],
        )
    };
    vec![fail("0"), fail("0.3")]
}

#[test]
fn an_open_breaker_is_retried_after_retry_after_and_the_probe_admitted() {
    for scenario in ["openai-chat", "anthropic-messages"] {
        let mock = mock_provider!();
        let envoy = tg::start(&mock, breaker_config());
        let mut calls = open_breaker(scenario);
        calls.push(call(scenario, &["--sleep-before", "0.3"]));
        let before = requests_seen(&envoy);
        let results = drive(envoy.port, &calls);
        let n = requests_seen(&envoy) - before;
        for failed in &results[..2] {
            assert_eq!(
                failed["status_code"], 500,
                "{scenario}: the provider's 500: {failed}"
            );
        }
        let got = &results[2];
        assert_ok(got);
        assert_eq!(
            n, 4,
            "{scenario}: two failures, one 503, then the half-open probe: {got}"
        );
        assert!(
            elapsed(got) >= 1.0,
            "{scenario}: waited for the reset: {got}"
        );
        assert_eq!(got["text"], TEXT8);
        assert_eq!(envoy.stat("tokengate_breaker_opened"), 1);
        tg::assert_no_panic(&envoy);
    }
}

#[test]
fn an_unreachable_quota_service_is_retried_and_then_raised() {
    let mock = mock_provider!();
    let dead = free_port();
    let cfg = with_quota(
        json!({"monthly_limit": 1_000_000, "timeout_ms": 300, "on_failure": "closed",
        "shim_breaker": {"failure_threshold": 1000}}),
    );
    let envoy = envoy_with_shim(&mock, cfg, dead);
    for (scenario, exception) in [
        ("openai-error", "InternalServerError"),
        ("anthropic-error", "ServiceUnavailableError"),
    ] {
        let (got, n) = attempts(&envoy, scenario, &[]);
        assert_raised(&got, exception, 503);
        assert_eq!(n, 3, "{scenario}: the first try and two retries: {got}");
    }
    assert!(mock.requests().is_empty());
    tg::assert_no_panic(&envoy);
}

// ---------------------------------------------------------------------------------------------
// The per-family contract through Envoy (docs/response-contract.md, src/reply/family.rs)
// ---------------------------------------------------------------------------------------------

/// Asserts the OpenAI attributes of a refusal: `code`, `type`, `param` null, a request id, and the
/// retry headers of the class.
fn assert_openai(got: &Value, status: u64, etype: &str, code: &str, reason: &str, retry: bool) {
    assert_eq!(got["status_code"], status, "{got}");
    assert_eq!(got["type"], etype, "{got}");
    assert_eq!(got["code"], code, "{got}");
    assert_eq!(got["param"], Value::Null, "{got}");
    assert!(
        got["request_id"].as_str().is_some_and(|s| !s.is_empty()),
        "x-request-id: {got}"
    );
    assert_retry_headers(got, reason, retry);
}

/// Asserts the Anthropic attributes: `type`, `error_code` (tokengate's reason), a request id.
fn assert_anthropic(got: &Value, status: u64, etype: &str, reason: &str, retry: bool) {
    assert_eq!(got["status_code"], status, "{got}");
    assert_eq!(got["type"], etype, "{got}");
    assert_eq!(got["error_code"], reason, "{got}");
    assert!(
        got["request_id"].as_str().is_some_and(|s| !s.is_empty()),
        "request-id: {got}"
    );
    assert_eq!(got["body"]["type"], "error", "{got}");
    assert_retry_headers(got, reason, retry);
}

/// A reset as OpenAI writes it: Go's `time.Duration` at millisecond precision (`20ms`, `1.5s`).
fn is_go_duration(s: &str) -> bool {
    tg::parse_go_duration(s).is_some()
}

#[test]
fn the_contract_checkers_accept_exactly_the_formats() {
    for (ok, secs) in [
        ("0s", 0.0),
        ("20ms", 0.02),
        ("1s", 1.0),
        ("1.5s", 1.5),
        ("6m0s", 360.0),
        ("1m30.5s", 90.5),
        ("1h0m0s", 3600.0),
        ("13m45.999s", 825.999),
    ] {
        assert_eq!(tg::parse_go_duration(ok), Some(secs), "{ok}");
        assert_eq!(tg::go_duration((secs * 1000.0_f64).round() as u64), ok);
    }
    for bad in [
        "", "9.347", "0.001", "1.5", "ms", "1x2s", "-1s", "90s", "1m", "1000ms", "1.50s", "0.5s",
    ] {
        assert!(!is_go_duration(bad), "{bad}");
    }
    assert!(tg::is_rfc3339("2026-01-01T00:00:06Z"));
    assert!(!tg::is_rfc3339("2026-01-01 00:00:06Z") && !tg::is_rfc3339("1767225606"));
}

fn assert_retry_headers(got: &Value, reason: &str, retry: bool) {
    let h = &got["headers"];
    assert_eq!(h["x-tokengate-reason"], reason, "{got}");
    if retry {
        assert_eq!(h["x-should-retry"], "true", "{got}");
        assert!(
            h.get("retry-after").is_some() && h.get("retry-after-ms").is_some(),
            "{got}"
        );
    } else {
        assert_eq!(h["x-should-retry"], "false", "{got}");
        assert!(h.get("retry-after").is_none(), "no retry-after: {got}");
    }
}

#[test]
fn refusals_carry_each_familys_error_contract() {
    let mock = mock_provider!();
    let mut cfg = small_bucket();
    cfg["max_body_bytes"] = json!(4096);
    let envoy = tg::start(&mock, cfg);
    let big = "x".repeat(8000);
    let no_retry = |a: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        v.extend(["--max-retries".to_string(), "0".to_string()]);
        v
    };
    let results = drive(
        envoy.port,
        &[
            // A first request drains the bucket (see `small_bucket`); the second one is refused.
            no_retry(&["openai-chat", "--tenant", "o", "--max-tokens", "590"]),
            no_retry(&["openai-error", "--tenant", "o", "--max-tokens", "590"]),
            no_retry(&["anthropic-messages", "--tenant", "a", "--max-tokens", "590"]),
            no_retry(&["anthropic-error", "--tenant", "a", "--max-tokens", "590"]),
            no_retry(&["openai-error", "--max-tokens", "5000"]),
            no_retry(&["anthropic-error", "--max-tokens", "5000"]),
            no_retry(&["openai-error", "--prompt", &big]),
            no_retry(&["anthropic-error", "--prompt", &big]),
            no_retry(&["openai-error", "--tenant", ""]),
            no_retry(&["anthropic-error", "--tenant", ""]),
        ],
    );
    assert_ok(&results[0]);
    assert_ok(&results[2]);
    let tps = "tokens_per_second_exceeded";
    assert_openai(&results[1], 429, "tokens", "rate_limit_exceeded", tps, true);
    assert_anthropic(&results[3], 429, "rate_limit_error", tps, true);
    let burst = "cost_exceeds_burst";
    assert_openai(
        &results[4],
        413,
        "invalid_request_error",
        burst,
        burst,
        false,
    );
    assert_anthropic(&results[5], 413, "request_too_large", burst, false);
    let large = "request_too_large";
    assert_openai(
        &results[6],
        413,
        "invalid_request_error",
        large,
        large,
        false,
    );
    assert_anthropic(&results[7], 413, "request_too_large", large, false);
    let tenant = "missing_tenant";
    assert_openai(
        &results[8],
        401,
        "invalid_request_error",
        tenant,
        tenant,
        false,
    );
    assert_anthropic(&results[9], 401, "authentication_error", tenant, false);
    // OpenAI resets are durations, Anthropic's RFC 3339 times.
    let h = &results[1]["headers"];
    assert!(
        is_go_duration(h["x-ratelimit-reset-tokens"].as_str().unwrap_or("")),
        "{h}"
    );
    let h = &results[3]["headers"];
    assert!(
        tg::is_rfc3339(h["anthropic-ratelimit-tokens-reset"].as_str().unwrap_or("")),
        "{h}"
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn retryable_server_side_refusals_carry_each_familys_contract() {
    let mock = mock_provider!();
    for (scenario, refused) in [
        ("openai-chat", "openai-error"),
        ("anthropic-messages", "anthropic-error"),
    ] {
        let envoy = tg::start(&mock, breaker_config());
        let mut calls = open_breaker(scenario);
        calls.push(call(
            refused,
            &["--max-retries", "0", "--sleep-before", "0.3"],
        ));
        let got = drive(envoy.port, &calls).remove(2);
        if refused == "openai-error" {
            assert_openai(
                &got,
                503,
                "server_error",
                "circuit_open",
                "circuit_open",
                true,
            );
        } else {
            assert_raised(&got, "OverloadedError", 529);
            assert_anthropic(&got, 529, "overloaded_error", "circuit_open", true);
        }
        tg::assert_no_panic(&envoy);
    }

    let cfg = with_quota(
        json!({"monthly_limit": 1_000_000, "timeout_ms": 300, "on_failure": "closed",
        "shim_breaker": {"failure_threshold": 1000}}),
    );
    let envoy = envoy_with_shim(&mock, cfg, free_port());
    let results = drive(
        envoy.port,
        &[
            call("openai-error", &["--max-retries", "0"]),
            call("anthropic-error", &["--max-retries", "0"]),
        ],
    );
    let q = "quota_unavailable";
    assert_openai(&results[0], 503, "server_error", q, q, true);
    assert_anthropic(&results[1], 503, "api_error", q, true);
    tg::assert_no_panic(&envoy);
}

/// `quota.lease.idle_s` of the test below.
const IDLE_S: f64 = 5.0;

#[test]
fn a_quota_held_in_another_envoys_idle_lease_is_served_after_the_sdks_own_retry() {
    // Two Envoys, leases on: what is left outside the leases cannot cover the request, the other
    // Envoy's idle lease can (idle_s: it must still be held when the SDK's first attempt comes, a
    // Python start after the last request that took it; a scenario whose start took longer is run
    // again for another tenant). The 429 `monthly_quota_leased` invites a retry after idle_s +
    // refresh_ms; both SDKs with their default retries wait for it and get 200 (before: a
    // non-retryable `insufficient_quota`, one attempt, the call failed).
    let q = Quota::start();
    let mock = mock_provider!();
    let cfg = with_quota(json!({"monthly_limit": 1_000_000,
        "lease": {"idle_s": IDLE_S as u64, "refresh_ms": 500, "min_tokens": 1000, "max_share_percent": 20}}));
    let (a, b) = (
        envoy_with_shim(&mock, cfg.clone(), q.webdis.port),
        envoy_with_shim(&mock, cfg, q.webdis.port),
    );
    // Python and the SDKs loaded before the clock: A's lease would go idle during a cold start.
    let mut on_a = WarmDriver::start(a.port);
    assert_ok(&on_a.call(
        "openai-error",
        &["--tenant", "warm-up", "--max-tokens", "8"],
    ));
    for scenario in ["openai-error", "anthropic-error"] {
        let mut on_b = WarmDriver::start(b.port);
        assert_ok(&on_b.call(scenario, &["--tenant", "warm-up", "--max-tokens", "8"]));
        for try_no in 1..=3 {
            let tenant = format!("leased-{scenario}-{try_no}");
            if lease_scenario(&q, &mut on_a, &mut on_b, &b, scenario, &tenant) {
                break;
            }
            assert!(
                try_no < 3,
                "{scenario}: the host was too slow three times in a row"
            );
        }
    }
    tg::assert_no_panic(&a);
    tg::assert_no_panic(&b);
}

/// One scenario of the test above, for a fresh tenant. False when its premise did not hold: A's
/// lease went idle (and was given back) before the first attempt reached B — the first attempt is
/// then rightly admitted and says nothing.
fn lease_scenario(
    q: &Quota,
    on_a: &mut WarmDriver,
    on_b: &mut WarmDriver,
    b: &Envoy,
    scenario: &str,
    tenant: &str,
) -> bool {
    let redis = |args: &[&str]| {
        q.redis
            .cmd(args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    };
    let month = month_label(now_unix());
    let used_key = format!("tg:q:{{{tenant}}}:{month}");
    redis(&["SET", &format!("tg:q:{{{tenant}}}:limit"), "40000"]);
    redis(&["SET", &used_key, "12000"]);
    // Envoy A takes a lease of the tenant.
    let deadline = Instant::now() + Duration::from_secs(20);
    let held = loop {
        let got = on_a.call("openai-error", &["--tenant", tenant, "--max-tokens", "64"]);
        assert_ok(&got);
        let held: u64 = match redis(&["HVALS", &format!("tg:q:{{{tenant}}}:leases")]) {
            RespValue::Array(Some(rows)) => rows
                .iter()
                .filter_map(RespValue::as_str)
                .filter_map(|r| r.split(' ').next()?.parse::<u64>().ok())
                .sum(),
            _ => 0,
        };
        if held >= 400 {
            break held;
        }
        assert!(Instant::now() < deadline, "no lease after 20 s");
    };
    let counter: u64 = match redis(&["GET", &used_key]) {
        RespValue::Bulk(Some(v)) => String::from_utf8_lossy(&v).parse().unwrap_or(0),
        v => panic!("GET {used_key}: {v:?}"),
    };
    // Redis alone has `outside` left; the request needs half of A's lease on top.
    let outside = 40_000 - counter;
    let max_tokens = (outside + held / 2).to_string();
    let last_use = Instant::now();
    let before = requests_seen(b);
    let got = on_b.call(scenario, &["--tenant", tenant, "--max-tokens", &max_tokens]);
    // Counters are updated when a stream is created: the call is done, so every attempt is counted.
    let n = requests_seen(b) - before;
    // From A's last request to B's first attempt: everything but the SDK call itself.
    let gap = last_use.elapsed().as_secs_f64() - elapsed(&got);
    println!(
        "{scenario}: {outside} left outside a lease of {held}; max_tokens {max_tokens}: {n} attempts \
         ({gap:.1} s before the first), {}",
        got.to_string().chars().take(300).collect::<String>()
    );
    assert_ok(&got);
    if n == 1 && gap >= IDLE_S - 1.0 {
        return false;
    }
    assert!(
        (2..=3).contains(&n),
        "{scenario}: one retry (two on a slow host): {n}"
    );
    assert!(
        elapsed(&got) >= 5.0,
        "{scenario}: waited for retry-after: {got}"
    );
    true
}

#[test]
fn a_spent_quota_returns_at_once_with_default_retries_in_every_client() {
    let q = Quota::start();
    let mock = mock_provider!();
    let cfg =
        with_quota(json!({"monthly_limit": 1_000_000, "tenants": {"poor": {"monthly_limit": 1}}}));
    let envoy = envoy_with_shim(&mock, cfg, q.webdis.port);
    for scenario in ["openai-error", "anthropic-error"] {
        let (got, n) = attempts(&envoy, scenario, &["--tenant", "poor"]);
        assert_raised(&got, "RateLimitError", 429);
        assert_eq!(n, 1, "{scenario}: no retry: {got}");
        assert!(elapsed(&got) < 10.0, "{scenario}: {got}");
        let m = "monthly_quota_exceeded";
        if scenario == "openai-error" {
            assert_openai(
                &got,
                429,
                "insufficient_quota",
                "insufficient_quota",
                m,
                false,
            );
        } else {
            assert_anthropic(&got, 429, "rate_limit_error", m, false);
        }
        // The month's reset stays in the body and in x-tokengate-quota-reset, never in retry-after.
        let reset: u64 = got["headers"]["x-tokengate-quota-reset"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("x-tokengate-quota-reset: {got}"));
        assert!(reset > 0, "{got}");
        assert_eq!(
            got["body"]["tokengate"]["quota"]["reset_in"], reset,
            "{got}"
        );
    }
    // LiteLLM cools a deployment down for the retry-after it reads (utils.py
    // _get_retry_after_from_exception_header): none here, so only for its default cooldown.
    let (got, n) = attempts(&envoy, "litellm-chat", &["--tenant", "poor"]);
    assert_eq!(got["ok"], false, "{got}");
    assert_eq!(got["exception"], "RateLimitError", "{got}");
    assert_eq!(n, 1, "{got}");
    assert!(mock.requests().is_empty(), "nothing reached the provider");
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_thinking_budget_that_cannot_fit_is_refused_before_the_provider() {
    let q = Quota::start();
    let mock = mock_provider!();
    let cfg = with_quota(json!({"monthly_limit": 1_000_000,
        "tenants": {"thinker": {"monthly_limit": 1000, "clamp_output": true}}}));
    let envoy = envoy_with_shim(&mock, cfg, q.webdis.port);
    let got = drive1(
        envoy.port,
        "anthropic-error",
        &[
            "--tenant",
            "thinker",
            "--max-tokens",
            "8000",
            "--thinking-budget",
            "5000",
        ],
    );
    assert_raised(&got, "BadRequestError", 400);
    let r = "thinking_budget_does_not_fit";
    assert_anthropic(&got, 400, "invalid_request_error", r, false);
    assert!(
        mock.requests().iter().all(|r| r.path != "/v1/messages"),
        "not forwarded"
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn admitted_answers_report_whole_trios_in_each_familys_format() {
    let mock = mock_provider!();
    // Our bucket: 1,000,000 burst. The provider reports 5 tokens left (binding: its trio whole) and
    // 999,999 requests left (ours binds: our request trio whole).
    let cfg = tg::config(json!([tg::rule_with(
        rule("all", "*", "*", 1_000_000.0, 1_000_000),
        json!({"requests_per_minute": 100})
    )]));
    let envoy = tg::start(&mock, cfg);
    let provider = "--header=x-mock-ratelimit-tokens=30000,5";
    let requests = "--header=x-mock-ratelimit-requests=1000000,999999";
    let results = drive(
        envoy.port,
        &[
            call("openai-chat", &[provider, requests]),
            call("anthropic-messages", &[provider, requests]),
        ],
    );
    let h = &results[0]["headers"];
    assert_eq!(h["x-ratelimit-limit-tokens"], "30000", "{h}");
    assert_eq!(h["x-ratelimit-remaining-tokens"], "5", "{h}");
    assert_eq!(h["x-ratelimit-reset-tokens"], "6s", "{h}");
    assert_eq!(h["x-ratelimit-limit-requests"], "100", "{h}");
    assert_eq!(h["x-ratelimit-remaining-requests"], "99", "{h}");
    assert!(
        is_go_duration(h["x-ratelimit-reset-requests"].as_str().unwrap_or("")),
        "{h}"
    );
    assert!(h.get("x-request-id").is_some(), "{h}");
    let h = &results[1]["headers"];
    assert_eq!(h["anthropic-ratelimit-tokens-limit"], "30000", "{h}");
    assert_eq!(h["anthropic-ratelimit-tokens-remaining"], "5", "{h}");
    assert_eq!(h["anthropic-ratelimit-requests-limit"], "100", "{h}");
    assert!(
        tg::is_rfc3339(
            h["anthropic-ratelimit-requests-reset"]
                .as_str()
                .unwrap_or("")
        ),
        "{h}"
    );
    assert!(
        h.get("x-ratelimit-limit-tokens").is_none(),
        "no OpenAI names on Anthropic: {h}"
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_client_naming_a_key_tenant_gets_permission_denied_from_both_sdks() {
    // `key:<hash>` tenants are derived from API keys: a client that names one in the tenant header
    // would be charged to someone else's key. 403 forbidden_tenant, which no retry fixes.
    let mock = mock_provider!();
    let envoy = tg::start(&mock, roomy());
    for (scenario, tenant) in [
        ("openai-error", "key:0123456789abcdef"),
        ("openai-error", "KEY:0123456789abcdef"),
        ("anthropic-error", "key:0123456789abcdef"),
    ] {
        let (got, n) = attempts(&envoy, scenario, &["--tenant", tenant]);
        assert_raised(&got, "PermissionDeniedError", 403);
        assert_eq!(n, 1, "{scenario} {tenant}: not retried: {got}");
        let r = "forbidden_tenant";
        if scenario == "openai-error" {
            assert_openai(&got, 403, "invalid_request_error", r, r, false);
        } else {
            assert_anthropic(&got, 403, "permission_error", r, false);
        }
    }
    // A tenant that merely contains `key:` further on is an ordinary tenant.
    assert_ok(&drive1(
        envoy.port,
        "openai-chat",
        &["--tenant", "team-key:a"],
    ));
    assert_eq!(
        mock.requests().len(),
        1,
        "only the ordinary tenant reached the provider"
    );
    tg::assert_no_panic(&envoy);
}

/// A header the SDK reported on an admitted answer.
fn header<'a>(got: &'a Value, name: &str) -> &'a str {
    got["headers"][name]
        .as_str()
        .unwrap_or_else(|| panic!("{name} missing: {got}"))
}

#[test]
fn admitted_answers_report_our_whole_trio_where_ours_binds_and_the_providers_where_it_does() {
    // The mirror image of the test above, per resource: our token bucket has less left than the
    // provider reports (ours replaces its whole trio, reset included), and the provider's request
    // trio has as few (OpenAI: a tie, 99) or fewer (Anthropic: 3) requests left than ours (its
    // trio stays as sent).
    let mock = mock_provider!();
    let cfg = tg::config(json!([tg::rule_with(
        rule("all", "*", "*", 1000.0, 1_000_000),
        json!({"requests_per_minute": 100})
    )]));
    let envoy = tg::start(&mock, cfg);
    let tokens = "--header=x-mock-ratelimit-tokens=30000000,29999999";
    let results = drive(
        envoy.port,
        &[
            call(
                "openai-chat",
                &[tokens, "--header=x-mock-ratelimit-requests=100000,99"],
            ),
            call(
                "anthropic-messages",
                &[tokens, "--header=x-mock-ratelimit-requests=100000,3"],
            ),
        ],
    );
    for got in &results {
        assert_ok(got);
    }
    let o = &results[0];
    let cost: u64 = header(o, "x-tokengate-estimated-tokens").parse().unwrap();
    assert_eq!(header(o, "x-ratelimit-limit-tokens"), "1000000", "{o}");
    assert_eq!(
        header(o, "x-ratelimit-remaining-tokens"),
        (1_000_000 - cost).to_string(),
        "{o}"
    );
    // Full again after cost / 1000 tok/s: our reset, not the provider's 6 s.
    let reset = tg::parse_go_duration(header(o, "x-ratelimit-reset-tokens"))
        .unwrap_or_else(|| panic!("a Go duration: {o}"));
    assert!(
        (reset - cost as f64 / 1000.0).abs() < 0.05,
        "reset {reset} vs {cost} / 1000: {o}"
    );
    assert_eq!(header(o, "x-ratelimit-limit-requests"), "100000", "{o}");
    assert_eq!(header(o, "x-ratelimit-remaining-requests"), "99", "{o}");
    assert_eq!(header(o, "x-ratelimit-reset-requests"), "6s", "{o}");

    let a = &results[1];
    let cost: u64 = header(a, "x-tokengate-estimated-tokens").parse().unwrap();
    assert_eq!(
        header(a, "anthropic-ratelimit-tokens-limit"),
        "1000000",
        "{a}"
    );
    assert_eq!(
        header(a, "anthropic-ratelimit-tokens-remaining"),
        (1_000_000 - cost).to_string(),
        "{a}"
    );
    assert!(
        tg::is_rfc3339(header(a, "anthropic-ratelimit-tokens-reset")),
        "{a}"
    );
    assert_eq!(
        header(a, "anthropic-ratelimit-requests-limit"),
        "100000",
        "{a}"
    );
    assert_eq!(
        header(a, "anthropic-ratelimit-requests-remaining"),
        "3",
        "{a}"
    );
    assert!(
        tg::is_rfc3339(header(a, "anthropic-ratelimit-requests-reset")),
        "{a}"
    );
    // Our token reset (the bucket is full again in well under a second) came with our trio: it is
    // before the provider's (6 s away). RFC 3339 UTC times of one format compare as strings.
    assert!(
        header(a, "anthropic-ratelimit-tokens-reset")
            < header(a, "anthropic-ratelimit-requests-reset"),
        "{a}"
    );
    assert!(
        a["headers"].get("x-ratelimit-limit-requests").is_none(),
        "no OpenAI names on Anthropic: {a}"
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_background_response_is_refused_as_a_bad_request_the_sdk_does_not_retry() {
    // `background: true` is generated after an answer without usage: refused (400, not retried),
    // nothing reaches the provider; with `background_responses: "reservation"` the SDK gets the
    // queued response.
    let mock = mock_provider!();
    let envoy = tg::start(&mock, roomy());
    let (got, n) = attempts(&envoy, "openai-responses-background", &[]);
    assert_raised(&got, "BadRequestError", 400);
    assert_eq!(n, 1, "not retried: {got}");
    assert_eq!(got["code"], "background_not_metered", "{got}");
    assert_eq!(
        got["headers"]["x-tokengate-reason"], "background_not_metered",
        "{got}"
    );
    assert!(mock.requests().is_empty(), "nothing reached the provider");
    let envoy = tg::start(
        &mock,
        tg::merge(roomy(), json!({"background_responses": "reservation"})),
    );
    let got = drive1(envoy.port, "openai-responses-background", &[]);
    assert_ok(&got);
    assert_eq!(got["status"], "queued", "{got}");
    assert_eq!(got["usage"], Value::Null, "{got}");
    tg::assert_no_panic(&envoy);
}
