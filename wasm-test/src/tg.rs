//! Small builders and assertions shared by the filter tests (the README response contract).

use crate::*;
use serde_json::json;
use serde_json::Value;

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
pub fn rule(name: &str, tenant: &str, model: &str, tokens_per_second: f64, burst: u64) -> Value {
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
    json!({"tenant_header": "x-tenant-id","trusted_headers": {"set_by": "the test client: it is the trusted filter"}, "forward_identity_headers": true, "model_header": "x-tokengate-model",
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
pub fn assert_anthropic_error(r: &http::Response, status: u16, etype: &str, reason: &str) -> Value {
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
