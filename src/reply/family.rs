//! The per-family contract (see the [`super`] module docs for the tables): refusals rendered for OpenAI
//! or Anthropic clients, rate-limit headers on admitted answers, and the merge with the provider's own
//! rate-limit headers.

use super::{retry_after, LocalReply};
use crate::estimate::ApiKind;
use crate::limits::bucket::Snapshot;
use serde_json::{json, Map, Value};

/// The API family a client speaks, which decides the shape of every answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// OpenAI paths: chat completions, completions, embeddings, responses; Azure OpenAI's too (the
    /// `openai` SDK's `AzureOpenAI` reads OpenAI's shape and `retry-after-ms`).
    OpenAi,
    /// Anthropic `/v1/messages` (also Claude on Vertex AI).
    Anthropic,
    /// Gemini API and Vertex AI (`google-genai`): `{"error":{"code","message","status","details"}}`.
    Gemini,
    /// Bedrock Runtime (`boto3`): `{"message"}` with the exception name in `x-amzn-errortype`.
    Bedrock,
}

impl Family {
    /// The family of a metered API.
    pub fn of(kind: ApiKind) -> Family {
        match kind {
            ApiKind::AnthropicMessages => Family::Anthropic,
            ApiKind::GeminiGenerate | ApiKind::GeminiStream => Family::Gemini,
            ApiKind::BedrockConverse
            | ApiKind::BedrockConverseStream
            | ApiKind::BedrockInvoke
            | ApiKind::BedrockInvokeStream => Family::Bedrock,
            _ => Family::OpenAi,
        }
    }

    /// The family of a path that is not metered, when its shape names Gemini / Vertex AI (a last
    /// segment `{resource}:{verb}`, `:embedContent`, `:predict`, …) or Bedrock (`/model/{id}/…`,
    /// `/async-invoke`); `path` as the filter reads it (lower case, no query). `None`: decide as
    /// before (OpenAI or Anthropic).
    pub fn of_unmetered_path(path: &str) -> Option<Family> {
        let last = path.rsplit('/').next().unwrap_or("");
        if path.contains("/model/") || path.ends_with("/async-invoke") {
            Some(Family::Bedrock)
        } else if last.contains(':') || last.contains("%3a") {
            Some(Family::Gemini)
        } else {
            None
        }
    }
}

/// Why the filter refuses a request (one per distinct answer; see the module table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A token bucket is empty.
    TokensPerSecond,
    /// A request bucket is empty.
    RequestsPerMinute,
    /// The monthly quota is spent.
    QuotaExceeded,
    /// What is left of the monthly quota here cannot cover the request, but leases of other Envoys
    /// hold enough that comes back when they are idle.
    QuotaLeased,
    /// The request costs more than a bucket can ever hold.
    CostExceedsBurst,
    /// A circuit breaker is open for the provider or model.
    CircuitOpen,
    /// The quota service (Webdis/Redis) did not answer and the policy is closed.
    QuotaUnavailable,
    /// A bucket could not record the request (shared data or the global store failed).
    LimiterUnavailable,
    /// The body is not a JSON request of the API.
    InvalidBody,
    /// The body is larger than `max_body_bytes`.
    BodyTooLarge,
    /// No tenant could be determined.
    MissingTenant,
    /// The client named a tenant it may not use.
    ForbiddenTenant,
    /// A request that could spend provider usage on a path that is not metered.
    PathNotMetered,
    /// An OpenAI Responses request with `background: true` (`background_responses: "refuse"`).
    BackgroundNotMetered,
    /// The output limit is above the model's cap and the config refuses instead of lowering it.
    OutputLimitTooLarge,
    /// Lowering `max_tokens` leaves no room for Anthropic's minimum thinking budget.
    ThinkingBudgetDoesNotFit,
    /// Too many requests of this scope are in flight.
    ConcurrencyLimit,
    /// An Azure OpenAI deployment that `azure_openai.deployments` does not list
    /// (`unknown_deployment: "refuse"`), or a model in the path that cannot be read.
    UnknownDeployment,
    /// A claim of the verified token that should name the tenant or a group is not an id (a number
    /// too large, a list, an object, characters outside the id's).
    InvalidClaim,
    /// Two verified identities name different tenants (a listed API key of another tenant than the
    /// verified token's).
    IdentityConflict,
    /// The body names no model and no default model is configured for its route.
    ModelRequired,
}

/// How a class is answered.
struct Shape {
    status: u32,
    openai_type: &'static str,
    openai_code: &'static str,
    anthropic_status: u32,
    anthropic_type: &'static str,
    /// A retry later can succeed.
    retryable: bool,
}

impl Class {
    /// tokengate's name for the class: `x-tokengate-reason`, `tokengate.reason` in the body, the
    /// Anthropic `details.error_code`, and the OpenAI `code` where OpenAI has no code of its own.
    pub fn reason(self) -> &'static str {
        match self {
            Class::TokensPerSecond => "tokens_per_second_exceeded",
            Class::RequestsPerMinute => "requests_per_minute_exceeded",
            Class::QuotaExceeded => "monthly_quota_exceeded",
            Class::QuotaLeased => "monthly_quota_leased",
            Class::CostExceedsBurst => "cost_exceeds_burst",
            Class::CircuitOpen => "circuit_open",
            Class::QuotaUnavailable => "quota_unavailable",
            Class::LimiterUnavailable => "rate_limiter_unavailable",
            Class::InvalidBody => "invalid_body",
            Class::BodyTooLarge => "request_too_large",
            Class::MissingTenant => "missing_tenant",
            Class::ForbiddenTenant => "forbidden_tenant",
            Class::PathNotMetered => "path_not_metered",
            Class::BackgroundNotMetered => "background_not_metered",
            Class::OutputLimitTooLarge => "output_limit_too_large",
            Class::ThinkingBudgetDoesNotFit => "thinking_budget_does_not_fit",
            Class::ConcurrencyLimit => "concurrency_limit_exceeded",
            Class::UnknownDeployment => "unknown_deployment",
            Class::InvalidClaim => "invalid_identity_claim",
            Class::IdentityConflict => "identity_conflict",
            Class::ModelRequired => "model_required",
        }
    }

    /// Whether the answer invites a retry (`retry-after`) or forbids one (`x-should-retry: false`).
    pub fn retryable(self) -> bool {
        self.shape().retryable
    }

    /// The HTTP status for `family`.
    pub fn status(self, family: Family) -> u32 {
        let s = self.shape();
        match family {
            Family::OpenAi => s.status,
            Family::Anthropic => s.anthropic_status,
            Family::Gemini => self.google().0,
            Family::Bedrock => self.bedrock().0,
        }
    }

    /// Gemini / Vertex AI: the HTTP status and `google.rpc.Code` name (`error.status`), as Google maps
    /// them (AIP-193).
    pub fn google(self) -> (u32, &'static str) {
        match self {
            Class::TokensPerSecond
            | Class::RequestsPerMinute
            | Class::ConcurrencyLimit
            | Class::QuotaLeased
            | Class::QuotaExceeded => (429, "RESOURCE_EXHAUSTED"),
            Class::CostExceedsBurst
            | Class::BodyTooLarge
            | Class::InvalidBody
            | Class::OutputLimitTooLarge
            | Class::ThinkingBudgetDoesNotFit
            | Class::BackgroundNotMetered
            | Class::UnknownDeployment
            | Class::ModelRequired => (400, "INVALID_ARGUMENT"),
            Class::MissingTenant | Class::IdentityConflict => (401, "UNAUTHENTICATED"),
            Class::ForbiddenTenant | Class::PathNotMetered | Class::InvalidClaim => {
                (403, "PERMISSION_DENIED")
            }
            Class::CircuitOpen | Class::QuotaUnavailable | Class::LimiterUnavailable => {
                (503, "UNAVAILABLE")
            }
        }
    }

    /// Bedrock: the HTTP status and the exception name (`x-amzn-errortype`) Bedrock Runtime answers
    /// with, so that botocore raises the modeled exception and retries (standard mode) exactly the
    /// throttling and unavailable ones.
    pub fn bedrock(self) -> (u32, &'static str) {
        match self {
            Class::TokensPerSecond
            | Class::RequestsPerMinute
            | Class::ConcurrencyLimit
            | Class::QuotaLeased => (429, "ThrottlingException"),
            Class::QuotaExceeded => (400, "ServiceQuotaExceededException"),
            Class::CostExceedsBurst
            | Class::BodyTooLarge
            | Class::InvalidBody
            | Class::OutputLimitTooLarge
            | Class::ThinkingBudgetDoesNotFit
            | Class::BackgroundNotMetered
            | Class::UnknownDeployment
            | Class::ModelRequired => (400, "ValidationException"),
            Class::MissingTenant
            | Class::ForbiddenTenant
            | Class::PathNotMetered
            | Class::InvalidClaim
            | Class::IdentityConflict => (403, "AccessDeniedException"),
            Class::CircuitOpen | Class::QuotaUnavailable | Class::LimiterUnavailable => {
                (503, "ServiceUnavailableException")
            }
        }
    }

    fn shape(self) -> Shape {
        let reason = self.reason();
        let (status, openai_type, openai_code, anthropic_status, anthropic_type, retryable) =
            match self {
                Class::TokensPerSecond | Class::QuotaLeased => (
                    429,
                    "tokens",
                    "rate_limit_exceeded",
                    429,
                    "rate_limit_error",
                    true,
                ),
                Class::RequestsPerMinute | Class::ConcurrencyLimit => (
                    429,
                    "requests",
                    "rate_limit_exceeded",
                    429,
                    "rate_limit_error",
                    true,
                ),
                Class::QuotaExceeded => (
                    429,
                    "insufficient_quota",
                    "insufficient_quota",
                    429,
                    "rate_limit_error",
                    false,
                ),
                Class::CostExceedsBurst | Class::BodyTooLarge => (
                    413,
                    "invalid_request_error",
                    reason,
                    413,
                    "request_too_large",
                    false,
                ),
                Class::CircuitOpen => (503, "server_error", reason, 529, "overloaded_error", true),
                Class::QuotaUnavailable | Class::LimiterUnavailable => {
                    (503, "server_error", reason, 503, "api_error", true)
                }
                Class::InvalidBody
                | Class::BackgroundNotMetered
                | Class::OutputLimitTooLarge
                | Class::ThinkingBudgetDoesNotFit
                | Class::UnknownDeployment
                | Class::ModelRequired => (
                    400,
                    "invalid_request_error",
                    reason,
                    400,
                    "invalid_request_error",
                    false,
                ),
                Class::MissingTenant | Class::IdentityConflict => (
                    401,
                    "invalid_request_error",
                    reason,
                    401,
                    "authentication_error",
                    false,
                ),
                Class::ForbiddenTenant | Class::PathNotMetered | Class::InvalidClaim => (
                    403,
                    "invalid_request_error",
                    reason,
                    403,
                    "permission_error",
                    false,
                ),
            };
        Shape {
            status,
            openai_type,
            openai_code,
            anthropic_status,
            anthropic_type,
            retryable,
        }
    }
}

/// One resource's rate-limit header trio.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trio {
    /// The limit (a bucket's burst, or requests per window).
    pub limit: u64,
    /// What is left now.
    pub remaining: u64,
    /// Seconds until the resource is full again.
    pub reset_s: f64,
}

/// The trios to report; a `None` resource is not reported.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Limits {
    /// Requests (`x-ratelimit-*-requests`, `anthropic-ratelimit-requests-*`).
    pub requests: Option<Trio>,
    /// Tokens (`x-ratelimit-*-tokens`, `anthropic-ratelimit-tokens-*`).
    pub tokens: Option<Trio>,
    /// Input tokens (Anthropic only: `anthropic-ratelimit-input-tokens-*`).
    pub input_tokens: Option<Trio>,
    /// Output tokens (Anthropic only: `anthropic-ratelimit-output-tokens-*`).
    pub output_tokens: Option<Trio>,
}

impl From<&Snapshot> for Limits {
    /// A bucket snapshot: its token trio, and its request trio when the rule has one.
    fn from(s: &Snapshot) -> Limits {
        Limits {
            tokens: Some(Trio {
                limit: floor_u64(s.limit_tokens),
                remaining: s.remaining_tokens,
                reset_s: s.reset_tokens_s,
            }),
            requests: s.requests.map(|(limit, remaining, reset_s)| Trio {
                limit: floor_u64(limit),
                remaining,
                reset_s,
            }),
            ..Limits::default()
        }
    }
}

fn floor_u64(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        x.min(1e18) as u64
    } else {
        0
    }
}

/// A monthly quota, as reported with a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaView {
    /// Tokens per month.
    pub limit: u64,
    /// Tokens left this month.
    pub remaining: u64,
    /// When the month ends (Unix seconds).
    pub reset_unix_s: i64,
    /// Seconds until then.
    pub reset_in_s: u64,
    /// A budget in money: its currency (`limit` and `remaining` are then micro-units, reported in
    /// `x-tokengate-budget-*` as decimal currency amounts).
    pub currency: Option<String>,
}

/// A budget's amount in its unit: whole tokens for a token budget, else micro-units as a decimal
/// amount of the currency (`500250000` → `500.25`).
pub fn amount(v: u64, unit: &str) -> String {
    if unit == crate::config::TOKENS {
        v.to_string()
    } else {
        money(v)
    }
}

/// Micro-units as a decimal amount of the currency: `500250000` → `500.25`.
pub fn money(micros: u64) -> String {
    let (units, frac) = (micros / 1_000_000, micros % 1_000_000);
    if frac == 0 {
        units.to_string()
    } else {
        format!("{units}.{frac:06}")
            .trim_end_matches('0')
            .to_string()
    }
}

/// Everything a refusal says.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// Why.
    pub class: Class,
    /// The human-readable message (OpenAI answers append "Please try again in …" when retryable).
    pub message: String,
    /// When a retry can succeed, in seconds; only used for retryable classes (1 s when `None`).
    pub retry_after_s: Option<f64>,
    /// The binding limit's trios, reported in the family's rate-limit headers.
    pub limits: Option<Limits>,
    /// The quota, for `x-tokengate-quota-*` and the body.
    pub quota: Option<QuotaView>,
    /// The request's estimated cost (`x-tokengate-estimated-tokens`).
    pub estimated: Option<u64>,
    /// The binding limit's name (a rule name), in the body.
    pub limit_name: Option<String>,
}

impl Refusal {
    /// A refusal with only a class and a message.
    pub fn new(class: Class, message: impl Into<String>) -> Refusal {
        Refusal {
            class,
            message: message.into(),
            retry_after_s: None,
            limits: None,
            quota: None,
            estimated: None,
            limit_name: None,
        }
    }
}

/// The answer for a refusal, in the shape of `family`. `request_id` is echoed in the family's header
/// (and in the Anthropic body); `now_unix_ms` dates the Anthropic resets.
pub fn render(family: Family, r: &Refusal, request_id: &str, now_unix_ms: u64) -> LocalReply {
    let shape = r.class.shape();
    let reason = r.class.reason();
    let retry_s = r
        .retry_after_s
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(1.0);
    let mut headers: Vec<(String, String)> = Vec::with_capacity(16);
    let mut h = |k: &str, v: &str| headers.push((k.to_string(), v.to_string()));
    h("content-type", "application/json");
    match family {
        Family::OpenAi | Family::Gemini => h("x-request-id", request_id),
        Family::Anthropic => h("request-id", request_id),
        Family::Bedrock => {
            h("x-amzn-requestid", request_id);
            h("x-amzn-errortype", r.class.bedrock().1);
        }
    }
    h("x-tokengate-reason", reason);
    if shape.retryable {
        h("retry-after", &retry_after(retry_s).to_string());
        h("retry-after-ms", &ceil_ms(retry_s).max(1).to_string());
        if family == Family::Bedrock {
            // botocore's standard retry mode waits at least this long (milliseconds), up to its own
            // backoff + 5 s; it reads no `retry-after`.
            h("x-amz-retry-after", &ceil_ms(retry_s).max(1).to_string());
        }
        h("x-should-retry", "true");
    } else {
        h("x-should-retry", "false");
    }
    if let Some(l) = &r.limits {
        limit_headers(family, l, now_unix_ms, &mut h);
    }
    if let Some(q) = &r.quota {
        if let Some(unit) = &q.currency {
            h("x-tokengate-budget-limit", &amount(q.limit, unit));
            h("x-tokengate-budget-remaining", &amount(q.remaining, unit));
            h("x-tokengate-budget-reset", &q.reset_in_s.to_string());
        } else {
            h("x-tokengate-quota-limit", &q.limit.to_string());
            h("x-tokengate-quota-remaining", &q.remaining.to_string());
            h("x-tokengate-quota-reset", &q.reset_in_s.to_string());
        }
    }
    if let Some(e) = r.estimated {
        h("x-tokengate-estimated-tokens", &e.to_string());
    }
    if let Some(name) = &r.limit_name {
        h("x-tokengate-limit", name);
    }

    let mut ours = Map::new();
    ours.insert("reason".into(), json!(reason));
    if let Some(name) = &r.limit_name {
        ours.insert("limit".into(), json!(name));
    }
    if shape.retryable {
        ours.insert(
            "retry_after".into(),
            json!(ceil_ms(retry_s) as f64 / 1000.0),
        );
    }
    if let Some(e) = r.estimated {
        ours.insert("estimated_tokens".into(), json!(e));
    }
    if let Some(q) = &r.quota {
        match &q.currency {
            Some(c) => ours.insert(
                "budget".into(),
                json!({"limit": amount(q.limit, c), "remaining": amount(q.remaining, c), "currency": c,
                       "reset_at": rfc3339(q.reset_unix_s).as_str(), "reset_in": q.reset_in_s}),
            ),
            None => ours.insert(
                "quota".into(),
                json!({"limit": q.limit, "remaining": q.remaining,
                       "reset_at": rfc3339(q.reset_unix_s).as_str(), "reset_in": q.reset_in_s}),
            ),
        };
    }
    let body = match family {
        Family::OpenAi => {
            let message = if shape.retryable {
                format!(
                    "{} Please try again in {}.",
                    r.message,
                    go_duration(ceil_ms(retry_s)).as_str()
                )
            } else {
                r.message.clone()
            };
            json!({
                "error": {"message": message, "type": shape.openai_type, "param": Value::Null,
                          "code": shape.openai_code},
                "tokengate": ours,
            })
        }
        Family::Anthropic => json!({
            "type": "error",
            "error": {"type": shape.anthropic_type, "message": r.message,
                      "details": {"error_code": reason}},
            "request_id": request_id,
            "tokengate": ours,
        }),
        Family::Gemini => {
            let (code, status) = r.class.google();
            let retry = go_duration(ceil_ms(retry_s));
            let message = if shape.retryable {
                format!("{} Please retry in {}.", r.message, retry.as_str())
            } else {
                r.message.clone()
            };
            let mut metadata = Map::new();
            metadata.insert("reason".into(), json!(reason));
            if let Some(name) = &r.limit_name {
                metadata.insert("limit".into(), json!(name));
            }
            let mut details = vec![json!({
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason.to_ascii_uppercase(),
                "domain": "tokengate",
                "metadata": metadata,
            })];
            if matches!(r.class, Class::QuotaExceeded | Class::QuotaLeased) {
                details.push(json!({
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [{"subject": "tokengate", "description": r.message}],
                }));
            }
            if shape.retryable {
                // google.protobuf.Duration in JSON: seconds with up to 9 fractional digits and `s`.
                details.push(json!({
                    "@type": "type.googleapis.com/google.rpc.RetryInfo",
                    "retryDelay": format!("{}s", super::Dec::secs(retry_s).as_str()),
                }));
            }
            json!({
                "error": {"code": code, "message": message, "status": status, "details": details},
                "tokengate": ours,
            })
        }
        Family::Bedrock => json!({
            "message": r.message,
            "tokengate": ours,
        }),
    };
    LocalReply {
        status: r.class.status(family),
        headers,
        body: body.to_string().into_bytes(),
    }
}

/// Calls `f(name, value)` for each rate-limit header of `l` in the family's names: OpenAI
/// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (resets as durations; input/output-token
/// trios have no OpenAI header and are skipped), Anthropic
/// `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}` (resets as
/// RFC 3339 times from `now_unix_ms`). No allocation: for every admitted answer.
pub fn limit_headers(family: Family, l: &Limits, now_unix_ms: u64, mut f: impl FnMut(&str, &str)) {
    for (res, trio) in resources(l) {
        if let Some(t) = trio {
            trio_headers(family, res, t, now_unix_ms, &mut f);
        }
    }
}

/// The four resources of [`Limits`], in header order.
fn resources(l: &Limits) -> [(Resource, Option<&Trio>); 4] {
    [
        (Resource::Requests, l.requests.as_ref()),
        (Resource::Tokens, l.tokens.as_ref()),
        (Resource::InputTokens, l.input_tokens.as_ref()),
        (Resource::OutputTokens, l.output_tokens.as_ref()),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resource {
    Requests,
    Tokens,
    InputTokens,
    OutputTokens,
}

/// `[limit, remaining, reset]` header names of a resource, or `None` (no such header in the family).
fn names(family: Family, res: Resource) -> Option<[&'static str; 3]> {
    Some(match (family, res) {
        (Family::OpenAi, Resource::Requests) => [
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ],
        (Family::OpenAi, Resource::Tokens) => [
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        ],
        (Family::OpenAi, _) => return None,
        // Gemini and Bedrock have no rate-limit headers of their own: OpenAI's names, which generic
        // clients and dashboards read.
        (Family::Gemini | Family::Bedrock, Resource::Requests) => [
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ],
        (Family::Gemini | Family::Bedrock, Resource::Tokens) => [
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        ],
        (Family::Gemini | Family::Bedrock, _) => return None,
        (Family::Anthropic, Resource::Requests) => [
            "anthropic-ratelimit-requests-limit",
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        ],
        (Family::Anthropic, Resource::Tokens) => [
            "anthropic-ratelimit-tokens-limit",
            "anthropic-ratelimit-tokens-remaining",
            "anthropic-ratelimit-tokens-reset",
        ],
        (Family::Anthropic, Resource::InputTokens) => [
            "anthropic-ratelimit-input-tokens-limit",
            "anthropic-ratelimit-input-tokens-remaining",
            "anthropic-ratelimit-input-tokens-reset",
        ],
        (Family::Anthropic, Resource::OutputTokens) => [
            "anthropic-ratelimit-output-tokens-limit",
            "anthropic-ratelimit-output-tokens-remaining",
            "anthropic-ratelimit-output-tokens-reset",
        ],
    })
}

fn trio_headers(
    family: Family,
    res: Resource,
    t: &Trio,
    now_unix_ms: u64,
    f: &mut impl FnMut(&str, &str),
) {
    let Some([limit, remaining, reset]) = names(family, res) else {
        return;
    };
    f(limit, super::Dec::int(t.limit).as_str());
    f(remaining, super::Dec::int(t.remaining).as_str());
    let ms = ceil_ms(t.reset_s);
    match family {
        Family::OpenAi | Family::Gemini | Family::Bedrock => f(reset, go_duration(ms).as_str()),
        Family::Anthropic => {
            // Rounded up to the second: a client that waits until then finds the resource full.
            let at = now_unix_ms.saturating_add(ms).saturating_add(999) / 1000;
            f(
                reset,
                rfc3339(i64::try_from(at).unwrap_or(i64::MAX)).as_str(),
            );
        }
    }
}

/// Header changes for a provider's answer: each `(name, value)` replaces that header.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeaderEdits {
    /// Headers to set (replacing any value the provider sent).
    pub set: Vec<(String, String)>,
}

/// The merge rule for rate-limit headers on a provider's answer (`provider`: its headers, names in
/// lowercase as Envoy hands them over): per resource,
/// * tokengate reports nothing for it (`None` in `ours`): the provider's headers stay as sent;
/// * the provider sent the whole trio (limit, remaining, reset; limit and remaining integers) and its
///   remaining is below or equal to tokengate's: the provider's trio stays as sent (the binding one);
/// * else tokengate's trio replaces all three headers.
///
/// So one trio never mixes two sources. The family's own header names are the only ones looked at
/// (an Anthropic answer's `anthropic-ratelimit-*`, an OpenAI one's `x-ratelimit-*`).
pub fn merge_provider_headers(
    family: Family,
    provider: &[(&str, &str)],
    ours: &Limits,
    now_unix_ms: u64,
) -> HeaderEdits {
    let mut edits = HeaderEdits::default();
    for (res, trio) in resources(ours) {
        let (Some(t), Some([limit, remaining, reset])) = (trio, names(family, res)) else {
            continue;
        };
        let get = |name: &str| {
            provider
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.trim())
        };
        let theirs = match (get(limit), get(remaining), get(reset)) {
            (Some(l), Some(r), Some(_)) => l.parse::<u64>().ok().and(r.parse::<u64>().ok()),
            _ => None,
        };
        if theirs.is_some_and(|their_remaining| their_remaining <= t.remaining) {
            continue;
        }
        trio_headers(family, res, t, now_unix_ms, &mut |k, v| {
            edits.set.push((k.to_string(), v.to_string()))
        });
    }
    edits
}

/// [`merge_provider_headers`] without allocating: the provider's headers are looked up with `get`, and
/// every header that must be set is passed to `f` (name, value) — for every admitted answer.
pub fn merge_with<'h>(
    family: Family,
    get: &dyn Fn(&str) -> Option<&'h str>,
    ours: &Limits,
    now_unix_ms: u64,
    mut f: impl FnMut(&'static str, &str),
) {
    for (res, trio) in resources(ours) {
        let (Some(t), Some(names @ [limit, remaining, reset])) = (trio, names(family, res)) else {
            continue;
        };
        let theirs = match (get(limit), get(remaining), get(reset)) {
            (Some(l), Some(r), Some(_)) => l
                .trim()
                .parse::<u64>()
                .ok()
                .and(r.trim().parse::<u64>().ok()),
            _ => None,
        };
        if theirs.is_some_and(|their_remaining| their_remaining <= t.remaining) {
            continue;
        }
        let mut i = 0;
        trio_headers(family, res, t, now_unix_ms, &mut |_, v| {
            if let Some(name) = names.get(i) {
                f(name, v);
            }
            i += 1;
        });
    }
}

/// Seconds as whole milliseconds, rounded up; 0 for non-positive or non-finite input.
fn ceil_ms(s: f64) -> u64 {
    if !s.is_finite() || s <= 0.0 {
        0
    } else {
        (s * 1000.0).ceil().min(1e15) as u64
    }
}

/// A short ASCII string on the stack (header values on the hot path).
#[derive(Clone, Copy)]
pub(crate) struct Short {
    buf: [u8; 32],
    len: usize,
}

impl Short {
    fn new() -> Short {
        Short {
            buf: [0; 32],
            len: 0,
        }
    }

    fn push(&mut self, b: u8) {
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = b;
            self.len += 1;
        }
    }

    fn push_str(&mut self, s: &str) {
        for &b in s.as_bytes() {
            self.push(b);
        }
    }

    /// `v` in decimal, at least `width` digits (zero-padded).
    fn push_int(&mut self, v: u64, width: usize) {
        let d = super::Dec::int(v);
        for _ in d.as_str().len()..width {
            self.push(b'0');
        }
        self.push_str(d.as_str());
    }

    /// The text.
    pub(crate) fn as_str(&self) -> &str {
        self.buf
            .get(..self.len)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("")
    }
}

/// Milliseconds as Go's `time.Duration` prints them (OpenAI's reset headers), at millisecond
/// precision: `0s`, `20ms`, `1s`, `1.5s`, `6m0s`, `1m30.5s`, `1h0m0s`.
pub(crate) fn go_duration(ms: u64) -> Short {
    let mut s = Short::new();
    if ms == 0 {
        s.push_str("0s");
        return s;
    }
    if ms < 1000 {
        s.push_int(ms, 1);
        s.push_str("ms");
        return s;
    }
    let h = ms / 3_600_000;
    let m = ms / 60_000 % 60;
    let sec = ms / 1000 % 60;
    let frac = ms % 1000;
    if h > 0 {
        s.push_int(h, 1);
        s.push(b'h');
    }
    if h > 0 || m > 0 {
        s.push_int(m, 1);
        s.push(b'm');
    }
    s.push_int(sec, 1);
    if frac > 0 {
        s.push(b'.');
        let (mut f, mut digits) = (frac, 3);
        while f % 10 == 0 {
            f /= 10;
            digits -= 1;
        }
        s.push_int(f, digits);
    }
    s.push(b's');
    s
}

/// Unix seconds as an RFC 3339 UTC time: `2026-03-01T00:00:00Z`.
pub(crate) fn rfc3339(unix_s: i64) -> Short {
    let days = unix_s.div_euclid(86_400);
    let secs = unix_s.rem_euclid(86_400) as u64;
    let (y, m, d) = civil_from_days(days);
    let mut s = Short::new();
    if y < 0 {
        s.push(b'-');
    }
    s.push_int(y.unsigned_abs(), 4);
    s.push(b'-');
    s.push_int(u64::from(m), 2);
    s.push(b'-');
    s.push_int(u64::from(d), 2);
    s.push(b'T');
    s.push_int(secs / 3600, 2);
    s.push(b':');
    s.push_int(secs / 60 % 60, 2);
    s.push(b':');
    s.push_int(secs % 60, 2);
    s.push(b'Z');
    s
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar (H. Hinnant's
/// algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests;
