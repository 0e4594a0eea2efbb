//! The answers the flow makes itself (as [`Refusal`]s, rendered per API family by
//! [`crate::reply::render`]), and the audit record. Every reply text lives here or in
//! [`crate::limits::local`] (bucket refusals).

use super::reservation::QuotaReq;
use crate::reply::{Class, Dec, QuotaView, Refusal};

/// 401: no tenant.
pub fn missing_tenant() -> Refusal {
    Refusal::new(
        Class::MissingTenant,
        "No tenant could be determined for this request: send an API key (or the credentials your gateway requires).",
    )
}

/// 401: an API key that `api_keys` does not list.
pub fn unknown_api_key() -> Refusal {
    Refusal::new(
        Class::MissingTenant,
        "The API key is not known to this gateway.",
    )
}

/// 401: `Authorization` and `x-api-key` carry different keys, or one of them comes twice with different
/// values.
pub fn two_api_keys() -> Refusal {
    Refusal::new(
        Class::MissingTenant,
        "The request carries two different API keys (two of the places its provider reads a key from, or one of them twice, with different values): send one.",
    )
}

/// 401: a listed API key of another tenant than the verified identity names.
pub fn identity_conflict(verified: &str) -> Refusal {
    Refusal::new(
        Class::IdentityConflict,
        format!("The API key belongs to another tenant than the verified identity ('{verified}'): send the key issued to that tenant, or none."),
    )
}

/// 403: a claim of the verified token that is not an id.
pub fn invalid_claim(claim: &str, setting: &str) -> Refusal {
    let claim = clip(claim, 64);
    Refusal::new(
        Class::InvalidClaim,
        format!("The verified token's claim '{claim}' ({setting}) is not an id: one string of 1-128 characters from [A-Za-z0-9._:@-], or a whole number."),
    )
}

/// 400: an Azure OpenAI deployment that `azure_openai.deployments` does not list.
pub fn unknown_deployment(deployment: &str) -> Refusal {
    let d = clip(deployment, 128);
    Refusal::new(
        Class::UnknownDeployment,
        format!("The deployment '{d}' is not one this gateway knows: its model, and so its cost, is unknown."),
    )
}

/// 400: a model in the request path that cannot be read.
pub fn unreadable_path_model() -> Refusal {
    Refusal::new(
        Class::UnknownDeployment,
        "The model named in the request path cannot be read (empty, too long, or a bad escape).",
    )
}

/// 400: the body names no model and no default model is configured for its route.
pub fn model_required() -> Refusal {
    Refusal::new(
        Class::ModelRequired,
        "The request names no model, and this gateway has no default model for its route: send the model in the body.",
    )
}

/// 400: a body that is not a request of its API (charged under `invalid_body: charge`) on a path that
/// names no model, and no default model is configured for its route: no model it names can be trusted.
pub fn model_required_invalid_body() -> Refusal {
    Refusal::new(
        Class::ModelRequired,
        "The request body is not a valid request of its API, so no model in it can be trusted, and this gateway has no default model for its route: send a valid body.",
    )
}

/// 403: a tenant the client may not name.
pub fn forbidden_tenant(header: &str) -> Refusal {
    Refusal::new(
        Class::ForbiddenTenant,
        format!("The tenant named in '{header}' is reserved for tenants derived from API keys and cannot be chosen by a client."),
    )
}

/// 403: a verified token's tenant claim naming a tenant derived from an API key (`key:…`).
pub fn forbidden_claim_tenant(claim: &str) -> Refusal {
    let claim = clip(claim, 64);
    Refusal::new(
        Class::ForbiddenTenant,
        format!("The tenant named in the verified token's claim '{claim}' is reserved for tenants derived from API keys and cannot be chosen by a token."),
    )
}

/// 403: a request that could spend provider usage on a path tokengate does not meter.
pub fn path_not_metered(method: &str, path: &str) -> Refusal {
    let (method, path) = (clip(method, 16), clip(path, 200));
    Refusal::new(
        Class::PathNotMetered,
        format!("{method} {path} is not an API this gateway meters (chat/completions, completions, embeddings, responses, messages), so it is refused: its usage could not be charged. The operator can allow it in unmetered_paths."),
    )
}

/// 400: an OpenAI Responses request with `background: true` (`background_responses: "refuse"`).
pub fn background_not_metered() -> Refusal {
    Refusal::new(
        Class::BackgroundNotMetered,
        "Background responses (background: true) are not available through this gateway: the provider generates them after answering, without usage, so they could not be charged. Send the request without background (stream it for long answers).",
    )
}

/// At most the first `n` characters of `s`.
fn clip(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((end, _)) => s.get(..end).unwrap_or(s),
        None => s,
    }
}

/// 413: the body is over `max_body_bytes`.
pub fn too_large(max_body_bytes: usize) -> Refusal {
    Refusal::new(
        Class::BodyTooLarge,
        format!("The request body exceeds the limit of {max_body_bytes} bytes."),
    )
}

/// 400: the body is not a request to this API.
pub fn invalid_body(api: &str, why: &str) -> Refusal {
    Refusal::new(
        Class::InvalidBody,
        format!("The request body could not be read as a request to the {api} API: {why}"),
    )
}

/// 400: lowering the output limit leaves no room for Anthropic's minimum thinking budget.
pub fn thinking_does_not_fit(max_tokens: u64) -> Refusal {
    Refusal::new(
        Class::ThinkingBudgetDoesNotFit,
        format!("max_tokens must stay above thinking.budget_tokens (at least {}), but only {max_tokens} output tokens can be granted; lower the thinking budget or max_tokens.", crate::rewrite::MIN_THINKING_BUDGET),
    )
}

/// 400: the output limit is above the model's cap (`output_above_cap: refuse`), or cannot be lowered
/// to it in place.
pub fn output_limit_too_large(cap: u64, how: &str) -> Refusal {
    Refusal::new(
        Class::OutputLimitTooLarge,
        format!("The output limit (max_tokens / max_completion_tokens / max_output_tokens) must be {how} {cap} for this model."),
    )
}

/// 503 (529 for Anthropic): a breaker is open and no fallback is usable.
pub fn circuit_open(what: &str, name: &str, reset_in_ms: u64) -> Refusal {
    let mut r = Refusal::new(
        Class::CircuitOpen,
        format!("The {what} '{name}' is failing and its circuit breaker is not letting requests through (open, or half-open with every probe in flight)."),
    );
    r.retry_after_s = Some(reset_in_ms as f64 / 1000.0);
    r
}

/// 503: a bucket cannot record the request (`on_store_error: deny`, global `on_failure: closed`).
pub fn limiter_unavailable() -> Refusal {
    Refusal::new(
        Class::LimiterUnavailable,
        "The rate limiter could not record this request.",
    )
}

/// 429: every in-flight slot of limit `rule` is held (retry in a second).
pub fn too_many_in_flight(
    rule: &crate::config::Rule,
    max: u32,
    levels: &[crate::config::GroupLevel],
) -> Refusal {
    let whose = match rule.scope {
        crate::config::Scope::Tenant => "for this tenant".to_string(),
        crate::config::Scope::Shared => "for everyone".to_string(),
        s => format!("for this {}", s.as_str(levels)),
    };
    let mut r = Refusal::new(
        Class::ConcurrencyLimit,
        format!(
            "Too many requests in flight (limit '{}'): at most {max} at once {whose}. Retry when one ends.",
            rule.name
        ),
    );
    r.retry_after_s = Some(1.0);
    r.limit_name = Some(rule.name.clone());
    r
}

/// 503: the quota shim failed (`on_failure: closed`).
pub fn quota_unavailable() -> Refusal {
    Refusal::new(Class::QuotaUnavailable, "The quota service is unavailable.")
}

/// 429: a monthly quota is used up. Not retryable: the month's reset (`reset_unix_s`, the start of
/// the reservation's next month) is in the body and in `x-tokengate-quota-reset` (seconds from
/// `now_unix_s`), never in `retry-after`.
pub fn quota_exceeded(
    limit: u64,
    remaining: u64,
    reset_unix_s: i64,
    now_unix_s: i64,
    what: &str,
) -> Refusal {
    // Left but less than this request may use (its prompt estimate and output limit): said so, with
    // what is left, rather than "used up".
    let message = if remaining == 0 {
        format!("The monthly token quota {what} is used up ({limit} tokens); it resets at the start of next month.")
    } else {
        format!("The monthly token quota {what} cannot cover this request: {remaining} tokens left of {limit}; it resets at the start of next month.")
    };
    let mut r = Refusal::new(Class::QuotaExceeded, message);
    r.quota = Some(QuotaView {
        limit,
        remaining,
        reset_unix_s,
        reset_in_s: crate::quota::calendar::seconds_until(reset_unix_s, now_unix_s),
        currency: None,
    });
    r
}

/// 429 that invites a retry: what is left of the quota here (`remaining`, this Envoy's own lease
/// included) cannot cover the request, but other Envoys' leases hold up to `elsewhere` more, which
/// comes back to Redis when they are idle (in about `retry_s`).
pub fn quota_leased(
    limit: u64,
    remaining: u64,
    elsewhere: u64,
    reset_unix_s: i64,
    now_unix_s: i64,
    what: &str,
    retry_s: f64,
) -> Refusal {
    let mut r = quota_exceeded(limit, remaining, reset_unix_s, now_unix_s, what);
    r.class = Class::QuotaLeased;
    r.message = format!("The monthly token quota {what} has {remaining} tokens left of {limit} for this gateway, not enough for this request; other gateways hold up to {elsewhere} more in leases, which come back when they are idle.");
    r.retry_after_s = Some(retry_s);
    r
}

/// 429: a monthly budget in money is spent (the [`quota_exceeded`] answer of its account, reworded).
pub fn as_budget(mut r: Refusal, b: &crate::config::Budget, currency: &str) -> Refusal {
    if let Some(q) = r.quota.as_mut() {
        q.currency = Some(currency.to_string());
        r.message = format!(
            "The monthly budget '{}' cannot cover this request: {} {currency} left of {} {currency}; it resets at the start of next month.",
            b.name,
            crate::reply::amount(q.remaining, currency),
            crate::reply::amount(q.limit, currency)
        );
    }
    r.limit_name = Some(b.name.clone());
    r
}

/// `x-tokengate-quota-*` headers.
pub fn quota_headers(limit: u64, remaining: u64, reset_s: u64) -> [(&'static str, u64); 3] {
    [
        ("x-tokengate-quota-limit", limit),
        ("x-tokengate-quota-remaining", remaining),
        ("x-tokengate-quota-reset", reset_s),
    ]
}

/// The audit record: `tenant=… model=… estimated=… decision=… [reserved=… actual=… usage_source=…]`.
/// The model comes from the client's body: written percent-encoded (bounded), so that it can never add
/// fields or lines to the access log.
pub(in crate::flow) fn audit_record(
    tenant: &str,
    model: &str,
    cost: Option<u64>,
    decision: &str,
    quotas: &[QuotaReq],
    cfg: &crate::config::Config,
) -> String {
    let tenant = if tenant.is_empty() { "-" } else { tenant };
    let model = if model.is_empty() {
        std::borrow::Cow::Borrowed("-")
    } else {
        crate::store::keys::sanitized(model)
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
    for q in quotas {
        let budget = q
            .budget
            .and_then(|i| cfg.quota.as_ref()?.budgets.list.get(i));
        // The token quota: `reserved= actual= usage_source=`; a budget (micro-units):
        // `budget.<name>.reserved= budget.<name>.actual=`.
        let prefix = match budget {
            Some(b) => format!(" budget.{}.", b.name),
            None => " ".to_string(),
        };
        rec.push_str(&prefix);
        rec.push_str("reserved=");
        rec.push_str(Dec::int(q.reserved.total()).as_str());
        if let (Some(a), Some(src)) = (q.actual, q.source) {
            rec.push_str(&prefix);
            rec.push_str("actual=");
            rec.push_str(Dec::int(a).as_str());
            if budget.is_none() {
                rec.push_str(" usage_source=");
                rec.push_str(src.as_str());
            }
        }
    }
    rec
}

/// Appends ` downgraded=<from>-><to>[,…]` to an audit record, model names percent-encoded like the
/// record's `model` (nothing when the request kept its model).
pub(in crate::flow) fn add_downgrades(rec: &mut String, hops: &[String]) {
    if hops.is_empty() {
        return;
    }
    rec.push_str(" downgraded=");
    for (i, hop) in hops.iter().enumerate() {
        if i > 0 {
            rec.push(',');
        }
        let (from, to) = hop.split_once(" -> ").unwrap_or((hop.as_str(), ""));
        rec.push_str(&crate::store::keys::sanitized(from));
        rec.push_str("->");
        rec.push_str(&crate::store::keys::sanitized(to));
    }
}
