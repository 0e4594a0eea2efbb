//! What clients get back: every answer the filter makes itself, and the rate-limit headers it adds to
//! the provider's answers, in the shape of the API family the client speaks.
//!
//! # Per API family ([`render`], [`limit_headers`], [`merge_provider_headers`])
//! A refusal is described once ([`Refusal`]: a [`Class`], a message, what the limits say) and rendered
//! for the client's [`Family`], so that the official SDKs raise their own exception types with the
//! attributes they document (`status_code`, `code`, `type`, `request_id`, and the Anthropic SDK's
//! `error_code`).
//!
//! OpenAI paths (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/responses`): the body
//! is OpenAI's `{"error":{"message","type","param","code"}}` exactly (param `null`); tokengate's own
//! details go in a top-level `tokengate` object, which the SDKs ignore (they read `body["error"]`):
//! ```text
//! HTTP/1.1 429
//! content-type: application/json
//! x-request-id: 5d9f…
//! x-tokengate-reason: tokens_per_second_exceeded
//! retry-after: 2
//! retry-after-ms: 1251
//! x-should-retry: true
//! x-ratelimit-limit-tokens: 2000          x-ratelimit-limit-requests: 600
//! x-ratelimit-remaining-tokens: 120       x-ratelimit-remaining-requests: 14
//! x-ratelimit-reset-tokens: 941ms         x-ratelimit-reset-requests: 4.6s
//! {"error":{"message":"… Please try again in 1.251s.","type":"tokens","param":null,"code":"rate_limit_exceeded"},
//!  "tokengate":{"reason":"tokens_per_second_exceeded","retry_after":1.251}}
//! ```
//! Resets are OpenAI's durations, as Go's `time.Duration` prints them (OpenAI's `6m0s`; go-openai reads
//! them with `time.ParseDuration`), rounded up to the millisecond: `0s`, `20ms`, `1s`, `1.5s`, `6m0s`,
//! `1m30.5s`, `1h0m0s`.
//!
//! Anthropic `/v1/messages`: `{"type":"error","error":{"type","message","details":{"error_code"}},
//! "request_id"}` with Anthropic's error types, `anthropic-ratelimit-{requests,tokens,input-tokens,
//! output-tokens}-{limit,remaining,reset}` (reset as an RFC 3339 UTC time, rounded up to the second) and
//! `request-id`. `details.error_code` carries tokengate's reason (the anthropic SDK's
//! `APIStatusError.error_code`; SDKs without it ignore the field).
//!
//! Azure OpenAI answers as OpenAI. Gemini / Vertex AI ([`Family::Gemini`]): Google's
//! `{"error":{"code","message","status","details"}}` (`RESOURCE_EXHAUSTED` 429, `INVALID_ARGUMENT`
//! 400, `UNAUTHENTICATED` 401, `PERMISSION_DENIED` 403, `UNAVAILABLE` 503; `details` with
//! `google.rpc.ErrorInfo`, `RetryInfo` when a retry can fix it, `QuotaFailure` on a quota). Bedrock
//! ([`Family::Bedrock`]): `{"message"}` with the exception in `x-amzn-errortype`
//! (`ThrottlingException` 429, `ServiceQuotaExceededException` 400 for a spent quota,
//! `ValidationException` 400, `AccessDeniedException` 403, `ServiceUnavailableException` 503), the id
//! in `x-amzn-requestid`, and `x-amz-retry-after` (ms, what botocore's standard retry mode waits) on
//! what a retry can fix. Both carry OpenAI's `x-ratelimit-*` names. See `docs/families.md` and
//! `docs/response-contract.md`.
//!
//! # Classes, statuses and retries
//! | [`Class`] | status | OpenAI `type` / `code` | Anthropic status `type` | retry |
//! |---|---|---|---|---|
//! | `TokensPerSecond` | 429 | `tokens` / `rate_limit_exceeded` | 429 `rate_limit_error` | yes |
//! | `RequestsPerMinute` | 429 | `requests` / `rate_limit_exceeded` | 429 `rate_limit_error` | yes |
//! | `ConcurrencyLimit` | 429 | `requests` / `rate_limit_exceeded` | 429 `rate_limit_error` | yes |
//! | `QuotaExceeded` | 429 | `insufficient_quota` / `insufficient_quota` | 429 `rate_limit_error` | no |
//! | `QuotaLeased` | 429 | `tokens` / `rate_limit_exceeded` | 429 `rate_limit_error` | yes |
//! | `CostExceedsBurst` | 413 | `invalid_request_error` / `cost_exceeds_burst` | 413 `request_too_large` | no |
//! | `BodyTooLarge` | 413 | `invalid_request_error` / `request_too_large` | 413 `request_too_large` | no |
//! | `InvalidBody` | 400 | `invalid_request_error` / `invalid_body` | 400 `invalid_request_error` | no |
//! | `OutputLimitTooLarge` | 400 | `invalid_request_error` / `output_limit_too_large` | 400 `invalid_request_error` | no |
//! | `ThinkingBudgetDoesNotFit` | 400 | `invalid_request_error` / `thinking_budget_does_not_fit` | 400 `invalid_request_error` | no |
//! | `MissingTenant` | 401 | `invalid_request_error` / `missing_tenant` | 401 `authentication_error` | no |
//! | `ForbiddenTenant` | 403 | `invalid_request_error` / `forbidden_tenant` | 403 `permission_error` | no |
//! | `PathNotMetered` | 403 | `invalid_request_error` / `path_not_metered` | 403 `permission_error` | no |
//! | `BackgroundNotMetered` | 400 | `invalid_request_error` / `background_not_metered` | 400 `invalid_request_error` | no |
//! | `CircuitOpen` | 503 | `server_error` / `circuit_open` | 529 `overloaded_error` | yes |
//! | `QuotaUnavailable` | 503 | `server_error` / `quota_unavailable` | 503 `api_error` | yes |
//! | `LimiterUnavailable` | 503 | `server_error` / `rate_limiter_unavailable` | 503 `api_error` | yes |
//!
//! What a retry can fix carries `retry-after` (whole seconds, rounded up, at least 1: LiteLLM reads it
//! with `int()`), `retry-after-ms` (both SDKs read it first, so they wait the exact time) and
//! `x-should-retry: true`. What a retry cannot fix carries `x-should-retry: false` (both SDKs obey it
//! before looking at the status) and never a `retry-after`: a spent monthly quota must not park a client
//! (the anthropic SDK sleeps on any `retry-after`) or a LiteLLM deployment (cooled down for the
//! `retry-after` it reads) until the month's end. The quota's reset stays in the body
//! (`tokengate.quota`) and in `x-tokengate-quota-reset` (seconds until the reset).
//!
//! Every answer the filter makes carries the request id (`x-request-id` on OpenAI paths, `request-id`
//! and the body's `request_id` on Anthropic's) and `x-tokengate-reason`.
//!
//! # Provider headers
//! On an answer from the provider, [`merge_provider_headers`] decides per resource (requests, tokens,
//! input tokens, output tokens) whose trio (limit, remaining, reset) is reported: the one with the
//! least remaining, always whole — never the provider's limit with tokengate's remaining.
//!
//! # Earlier helpers
//! [`error`], [`error_with_reset`], [`rate_limited`] and [`each_ratelimit_header`] are the previous,
//! OpenAI-shaped contract (decimal-second resets, `reset_in` inside `error`), kept until the request
//! flow uses the functions above.

mod family;

pub use family::{
    amount, limit_headers, merge_provider_headers, merge_with, money, render, Class, Family,
    HeaderEdits, Limits, QuotaView, Refusal, Trio,
};

use crate::limits::bucket::Snapshot;
use serde_json::json;

/// A local reply to send instead of forwarding.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalReply {
    /// HTTP status.
    pub status: u32,
    /// Headers, in order.
    pub headers: Vec<(String, String)>,
    /// JSON body.
    pub body: Vec<u8>,
}

/// A short decimal formatted on the stack: the hot path writes every admitted response's
/// `x-ratelimit-*` values with no allocation and none of `core::fmt`'s machinery.
#[derive(Clone, Copy)]
pub struct Dec {
    buf: [u8; 24],
    start: usize,
}

impl Dec {
    /// `v` in decimal.
    pub fn int(v: u64) -> Dec {
        let mut d = Dec {
            buf: [0; 24],
            start: 24,
        };
        d.push_int(v);
        d
    }

    /// Seconds as a short decimal, rounded up to the millisecond: `0.25`, `3`, `12.5`; `0` for
    /// non-positive or non-finite input.
    pub fn secs(s: f64) -> Dec {
        if !s.is_finite() || s <= 0.0 {
            return Dec::int(0);
        }
        let ms = (s * 1000.0).ceil();
        let whole = (ms / 1000.0).floor();
        let frac = (ms - whole * 1000.0) as u64;
        let mut d = Dec {
            buf: [0; 24],
            start: 24,
        };
        if frac != 0 {
            // Three digits, trailing zeros dropped.
            let (mut f, mut digits) = (frac, 3);
            while f % 10 == 0 {
                f /= 10;
                digits -= 1;
            }
            for _ in 0..digits {
                d.push((f % 10) as u8 + b'0');
                f /= 10;
            }
            d.push(b'.');
        }
        d.push_int(whole as u64);
        d
    }

    fn push(&mut self, b: u8) {
        if let Some(i) = self.start.checked_sub(1) {
            if let Some(slot) = self.buf.get_mut(i) {
                *slot = b;
                self.start = i;
            }
        }
    }

    fn push_int(&mut self, mut v: u64) {
        loop {
            self.push((v % 10) as u8 + b'0');
            v /= 10;
            if v == 0 {
                break;
            }
        }
    }

    /// The digits.
    pub fn as_str(&self) -> &str {
        self.buf
            .get(self.start..)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("0")
    }
}

/// Formats seconds as a short decimal: `0.25`, `3`, `12.5`.
pub fn secs(s: f64) -> String {
    Dec::secs(s).as_str().to_string()
}

/// Whole seconds for `Retry-After`: rounded up, at least 1.
pub fn retry_after(s: f64) -> u64 {
    if !s.is_finite() || s <= 1.0 {
        1
    } else {
        s.ceil().min(1e9) as u64
    }
}

/// `reset_in` as a JSON number rounded up to milliseconds.
fn reset_number(s: f64) -> f64 {
    if !s.is_finite() || s <= 0.0 {
        0.0
    } else {
        (s * 1000.0).ceil() / 1000.0
    }
}

/// Calls `f(name, value)` for each `x-ratelimit-*` header of a snapshot, without allocating.
pub fn each_ratelimit_header(snap: &Snapshot, mut f: impl FnMut(&'static str, &str)) {
    f(
        "x-ratelimit-limit-tokens",
        Dec::int(snap.limit_tokens.floor() as u64).as_str(),
    );
    f(
        "x-ratelimit-remaining-tokens",
        Dec::int(snap.remaining_tokens).as_str(),
    );
    f(
        "x-ratelimit-reset-tokens",
        Dec::secs(snap.reset_tokens_s).as_str(),
    );
    if let Some((limit, remaining, reset)) = snap.requests {
        f(
            "x-ratelimit-limit-requests",
            Dec::int(limit.floor() as u64).as_str(),
        );
        f(
            "x-ratelimit-remaining-requests",
            Dec::int(remaining).as_str(),
        );
        f("x-ratelimit-reset-requests", Dec::secs(reset).as_str());
    }
}

/// The `x-ratelimit-*` headers for a snapshot.
pub fn ratelimit_headers(snap: &Snapshot) -> Vec<(String, String)> {
    let mut h = Vec::with_capacity(6);
    each_ratelimit_header(snap, |k, v| h.push((k.to_string(), v.to_string())));
    h
}

/// An OpenAI-shaped error body; `reset_in` is added when given.
pub fn error_body(kind: &str, code: &str, message: &str, reset_in: Option<f64>) -> Vec<u8> {
    let mut err = json!({"type": kind, "code": code, "message": message});
    if let (Some(r), Some(obj)) = (reset_in, err.as_object_mut()) {
        obj.insert("reset_in".to_string(), json!(reset_number(r)));
    }
    json!({ "error": err }).to_string().into_bytes()
}

fn json_headers() -> Vec<(String, String)> {
    vec![("content-type".to_string(), "application/json".to_string())]
}

/// A plain error reply (400, 401, 413, 503 …) with no rate-limit headers.
pub fn error(status: u32, kind: &str, code: &str, message: &str) -> LocalReply {
    LocalReply {
        status,
        headers: json_headers(),
        body: error_body(kind, code, message, None),
    }
}

/// An error reply carrying `reset_in` (e.g. 503 `circuit_open`); the caller adds `retry-after`.
pub fn error_with_reset(
    status: u32,
    kind: &str,
    code: &str,
    message: &str,
    reset_in_s: f64,
) -> LocalReply {
    LocalReply {
        status,
        headers: json_headers(),
        body: error_body(kind, code, message, Some(reset_in_s)),
    }
}

/// A 429 from a bucket: `code` is `tokens_per_second_exceeded` or `requests_per_minute_exceeded`.
pub fn rate_limited(code: &str, message: &str, reset_in_s: f64, snap: &Snapshot) -> LocalReply {
    let mut headers = json_headers();
    headers.push((
        "retry-after".to_string(),
        retry_after(reset_in_s).to_string(),
    ));
    headers.extend(ratelimit_headers(snap));
    LocalReply {
        status: 429,
        headers,
        body: error_body("rate_limit_error", code, message, Some(reset_in_s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `format!` implementation `Dec` replaced.
    fn secs_reference(s: f64) -> String {
        if !s.is_finite() || s <= 0.0 {
            return "0".to_string();
        }
        let ms = (s * 1000.0).ceil();
        let whole = (ms / 1000.0).floor();
        let frac = ms - whole * 1000.0;
        if frac == 0.0 {
            format!("{}", whole as u64)
        } else {
            let f = format!("{:03}", frac as u64);
            format!("{}.{}", whole as u64, f.trim_end_matches('0'))
        }
    }

    #[test]
    fn stack_decimals_match_format() {
        let mut x = 0.000_01f64;
        while x < 1e7 {
            for v in [x, x * 1.37, x * 2.0001, x * 9.999] {
                assert_eq!(Dec::secs(v).as_str(), secs_reference(v), "{v}");
            }
            x *= 1.7;
        }
        for v in [
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            0.001,
            0.01,
            0.1,
            1.0,
            1.5,
            2.25,
            59.999,
            1e15,
            1.8e19,
            1e30,
        ] {
            assert_eq!(Dec::secs(v).as_str(), secs_reference(v), "{v}");
        }
        for v in [0u64, 1, 9, 10, 99, 100, 12345, u64::MAX] {
            assert_eq!(Dec::int(v).as_str(), v.to_string());
        }
    }

    fn snap() -> Snapshot {
        Snapshot {
            limit_tokens: 2000.0,
            remaining_tokens: 120,
            reset_tokens_s: 0.9401,
            requests: Some((600.0, 14, 4.6)),
        }
    }

    #[test]
    fn seconds_are_short_decimals_rounded_up_to_the_millisecond() {
        assert_eq!(secs(0.25), "0.25");
        assert_eq!(secs(3.0), "3");
        assert_eq!(secs(0.0001), "0.001");
        assert_eq!(secs(-1.0), "0");
        assert_eq!(secs(f64::NAN), "0");
        assert_eq!(secs(12.5), "12.5");
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_at_least_one() {
        assert_eq!(retry_after(0.2), 1);
        assert_eq!(retry_after(1.0), 1);
        assert_eq!(retry_after(1.01), 2);
        assert_eq!(retry_after(f64::INFINITY), 1);
    }

    #[test]
    fn rate_limited_reply_has_contract_headers_and_body() {
        let r = rate_limited("tokens_per_second_exceeded", "slow down", 1.2501, &snap());
        assert_eq!(r.status, 429);
        let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "content-type",
                "retry-after",
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests"
            ]
        );
        assert_eq!(r.headers[1].1, "2");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(v["error"]["code"], "tokens_per_second_exceeded");
        assert_eq!(v["error"]["reset_in"], 1.251);
    }

    #[test]
    fn error_reply_escapes_messages() {
        let r = error(
            400,
            "invalid_request_error",
            "invalid_body",
            "bad \"json\"\n",
        );
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["message"], "bad \"json\"\n");
        assert!(v["error"].get("reset_in").is_none());
    }
}
