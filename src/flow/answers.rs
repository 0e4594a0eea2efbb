//! The answers the flow makes itself, and the audit record. Every reply text lives here.

use super::state::QuotaReq;
use crate::reply::{self, Dec, LocalReply};

/// 401: no tenant.
pub fn missing_tenant() -> LocalReply {
    reply::error(
        401,
        "authentication_error",
        "missing_tenant",
        "No tenant could be determined for this request: send the tenant header or an API key.",
    )
}

/// 413: the body is over `max_body_bytes`.
pub fn too_large(max_body_bytes: usize) -> LocalReply {
    reply::error(
        413,
        "invalid_request_error",
        "request_too_large",
        &format!("The request body exceeds the limit of {max_body_bytes} bytes."),
    )
}

/// 400: the body is not a request to this API.
pub fn invalid_body(api: &str, why: &str) -> LocalReply {
    reply::error(
        400,
        "invalid_request_error",
        "invalid_body",
        &format!("The request body could not be read as a request to the {api} API: {why}"),
    )
}

/// 503: a breaker is open and no fallback is usable.
pub fn circuit_open(what: &str, name: &str, reset_in_ms: u64) -> LocalReply {
    let reset_s = reset_in_ms as f64 / 1000.0;
    let mut r = reply::error_with_reset(
        503,
        "upstream_unavailable",
        "circuit_open",
        &format!("The {what} '{name}' is failing and its circuit breaker is not letting requests through (open, or half-open with every probe in flight); retry after the reset."),
        reset_s,
    );
    r.headers.push((
        "retry-after".to_string(),
        reply::retry_after(reset_s).to_string(),
    ));
    r
}

/// 503: a bucket cannot record the request (`on_store_error: deny`, global `on_failure: closed`).
pub fn limiter_unavailable() -> LocalReply {
    reply::error(
        503,
        "server_error",
        "rate_limiter_unavailable",
        "The rate limiter could not record this request; retry shortly.",
    )
}

/// 503: the quota shim failed (`on_failure: closed`).
pub fn quota_unavailable() -> LocalReply {
    reply::error(
        503,
        "server_error",
        "quota_unavailable",
        "The quota service is unavailable; retry shortly.",
    )
}

/// 429: a monthly quota is used up.
pub fn quota_exceeded(limit: u64, remaining: u64, reset_s: u64, what: &str) -> LocalReply {
    let mut r = reply::error_with_reset(
        429,
        "insufficient_quota",
        "monthly_quota_exceeded",
        &format!("The monthly token quota {what} is used up ({limit} tokens); it resets at the start of next month."),
        reset_s as f64,
    );
    r.headers
        .push(("retry-after".to_string(), reset_s.max(1).to_string()));
    r.headers.extend(quota_headers(limit, remaining, reset_s));
    r
}

/// `x-tokengate-quota-*` headers.
pub fn quota_headers(limit: u64, remaining: u64, reset_s: u64) -> [(String, String); 3] {
    [
        ("x-tokengate-quota-limit".to_string(), limit.to_string()),
        (
            "x-tokengate-quota-remaining".to_string(),
            remaining.to_string(),
        ),
        ("x-tokengate-quota-reset".to_string(), reset_s.to_string()),
    ]
}

/// The audit record: `tenant=… model=… estimated=… decision=… [reserved=… actual=… usage_source=…]`.
/// The model comes from the client's body: written percent-encoded (bounded), so that it can never add
/// fields or lines to the access log.
pub fn audit_record(
    tenant: &str,
    model: &str,
    cost: Option<u64>,
    decision: &str,
    quota: Option<&QuotaReq>,
) -> String {
    let tenant = if tenant.is_empty() { "-" } else { tenant };
    let model = if model.is_empty() {
        std::borrow::Cow::Borrowed("-")
    } else {
        crate::keys::sanitized(model)
    };
    let model = model.as_ref();
    let estimated = Dec::int(cost.unwrap_or(0));
    let mut rec = String::with_capacity(64 + tenant.len() + model.len());
    for part in [
        "tenant=",
        tenant,
        " model=",
        model,
        " estimated=",
        estimated.as_str(),
        " decision=",
        decision,
    ] {
        rec.push_str(part);
    }
    if let Some(q) = quota {
        rec.push_str(" reserved=");
        rec.push_str(Dec::int(q.reserved.total()).as_str());
        if let (Some(a), Some(src)) = (q.actual, q.source) {
            rec.push_str(" actual=");
            rec.push_str(Dec::int(a).as_str());
            rec.push_str(" usage_source=");
            rec.push_str(src.as_str());
        }
    }
    rec
}
