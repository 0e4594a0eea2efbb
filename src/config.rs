//! Plugin configuration: raw serde structs (shape, unknown fields refused) → validated runtime [`Config`]
//! (meaning). A [`ConfigError`] names the JSON path of the bad field, for shape errors too (serde's, with
//! the path tracked by `serde_path_to_error`): `rules[1].burst: must be between 1 and 1e15, got 0`,
//! `rules[0].tokens_per_second: invalid type: string "10", expected a number`. The host logs it in one
//! line and returns `false` from `on_configure`, so Envoy refuses the config. A range refusal states the
//! range; patterns that could never match (a tenant glob, `*` inside a model name, a rule shadowed by an
//! earlier one) are refused rather than left silently idle.
//! Nothing falls back to a default quietly: absent optional fields take the documented defaults below,
//! present but wrong ones are errors.
//!
//! Example (the JSON string in the Envoy wasm filter's `configuration`):
//! ```json
//! {"tenant_header": "x-tenant-id",
//!  "models": {"gpt-4.1": {"default_max_tokens": 4096, "max_tokens_cap": 32768}},
//!  "rules": [{"model": "gpt-4.1", "tokens_per_second": 300000, "burst": 2000000, "requests_per_minute": 600},
//!            {"model": "*", "tokens_per_second": 1000, "burst": 20000}]}
//! ```

use crate::breaker::{BreakerConfig, FailurePolicy};
use crate::bucket::BucketParams;
use crate::estimate::OutputLimits;
use crate::quota::Weights;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// A configuration error with the path of the field at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    /// JSON path of the field, e.g. `rules[0].burst`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    /// `field: reason` on one line: control characters a config value or key brought in are escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let one_line = |f: &mut fmt::Formatter<'_>, s: &str| -> fmt::Result {
            for c in s.chars() {
                if c.is_control() {
                    write!(f, "{}", c.escape_default())?;
                } else {
                    write!(f, "{c}")?;
                }
            }
            Ok(())
        };
        one_line(f, &self.field)?;
        f.write_str(": ")?;
        one_line(f, &self.reason)
    }
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// What to do with a body on an LLM path that is not valid JSON.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InvalidBody {
    /// Answer 400 `invalid_body` (default).
    Reject,
    /// Admit it, charging this many tokens.
    Charge(u64),
}

/// What to do when the shared store fails (CAS retries exhausted, host error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFailure {
    /// Admit the request unmetered, count it (default: a local contention never blocks traffic).
    Allow,
    /// Answer 503 `rate_limiter_unavailable`.
    Deny,
}

/// Which breaker keys are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerKeys {
    /// One breaker per upstream cluster (checked in the headers phase).
    pub cluster: bool,
    /// One breaker per model (checked once the body is read).
    pub model: bool,
}

/// A fallback cluster for when a cluster's breaker is open.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterFallback {
    /// The cluster whose breaker is open.
    pub from: String,
    /// The cluster Envoy routes to when the route header carries `route`.
    pub to: String,
    /// Value written into the route header so Envoy's route table picks `to`.
    pub route: String,
}

/// Validated circuit-breaker settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerSettings {
    /// State-machine tuning.
    pub cfg: BreakerConfig,
    /// What counts as a failure.
    pub policy: FailurePolicy,
    /// Count a stream that ends without its final event as a failure.
    pub count_incomplete_streams: bool,
    /// Which keys.
    pub keys: BreakerKeys,
    /// Request header the route table matches for cluster fallbacks.
    pub route_header: String,
    /// Cluster fallbacks.
    pub cluster_fallbacks: Vec<ClusterFallback>,
    /// Model fallbacks on the same cluster (body `model` rewritten).
    pub model_fallbacks: Vec<(String, String)>,
    /// Longest fallback chain followed (default 1).
    pub max_fallback_hops: u32,
    /// Most breaker keys created (bounded: shared data never evicts).
    pub max_keys: u32,
}

impl BreakerSettings {
    /// The fallback of a cluster.
    pub fn cluster_fallback(&self, from: &str) -> Option<&ClusterFallback> {
        self.cluster_fallbacks.iter().find(|f| f.from == from)
    }
    /// The fallback of a model.
    pub fn model_fallback(&self, from: &str) -> Option<&str> {
        self.model_fallbacks
            .iter()
            .find(|(f, _)| f == from)
            .map(|(_, t)| t.as_str())
    }
}

/// What a quota does when the shim (Webdis/Redis) cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaFailure {
    /// Admit the request and count it (`tokengate_quota_fail_open`).
    Open,
    /// Answer 503 `quota_unavailable`.
    Closed,
}

/// Per-tenant quota settings (after defaults are applied).
#[derive(Debug, Clone, PartialEq)]
pub struct TenantQuota {
    /// Monthly limit, weighted tokens.
    pub monthly_limit: u64,
    /// Monthly limits per model (weighted tokens); models not listed have none.
    pub model_limits: Vec<(String, u64)>,
    /// Failure policy.
    pub on_failure: QuotaFailure,
    /// Clamp `max_tokens` to what is left instead of rejecting.
    pub clamp_output: bool,
}

/// Validated monthly-quota settings.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaSettings {
    /// Envoy cluster of the Webdis shim.
    pub cluster: String,
    /// `:authority` of callouts.
    pub authority: String,
    /// Callout timeout.
    pub timeout_ms: u32,
    /// Defaults for tenants not listed.
    pub default: TenantQuota,
    /// Listed tenants.
    pub tenants: Vec<(String, TenantQuota)>,
    /// Per-model cost weights (exact names); others use unit weights.
    pub weights: Vec<(String, Weights)>,
    /// Month boundaries at this UTC offset.
    pub month_offset_minutes: i32,
    /// Counters expire this long after the month's end.
    pub grace_seconds: u64,
    /// `Idempotency-Key` window (0 = off).
    pub idempotency_window_s: u64,
    /// How long a tenant known exhausted is refused without asking Redis.
    pub exhausted_recheck_s: u64,
    /// A refused tenant with fewer weighted tokens left than this counts as exhausted.
    pub exhausted_below: u64,
    /// Add `stream_options.include_usage` to streaming requests and strip the extra chunk.
    pub inject_stream_usage: bool,
    /// Breaker on the shim itself.
    pub shim_breaker: BreakerConfig,
    /// First settlement retry delay, doubled per attempt.
    pub settle_retry_ms: u64,
    /// Settlement attempts before giving up (logged and counted).
    pub settle_max_attempts: u32,
    /// Seconds added to the host clock for month arithmetic only (tests of month rollover; keep 0).
    pub clock_skew_s: i64,
}

impl QuotaSettings {
    /// The settings of a tenant.
    pub fn tenant(&self, tenant: &str) -> &TenantQuota {
        self.tenants
            .iter()
            .find(|(t, _)| t == tenant)
            .map(|(_, q)| q)
            .unwrap_or(&self.default)
    }
    /// The weights of a model.
    pub fn weights(&self, model: &str) -> Weights {
        self.weights
            .iter()
            .find(|(m, _)| m == model)
            .map(|(_, w)| *w)
            .unwrap_or_default()
    }
}

/// How a rule selects models.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelMatch {
    /// `"*"`: every model.
    Any,
    /// `"gpt-4*"`: names starting with the prefix.
    Prefix(String),
    /// An exact model name.
    Exact(String),
}

impl ModelMatch {
    /// `"*"`, `"prefix*"` or an exact name; `None` for a `*` anywhere else (`"a*b"`, `"**"`, `"*a"`),
    /// which would silently match nothing (it is not a glob).
    fn parse(s: &str) -> Option<Self> {
        if s == "*" {
            return Some(ModelMatch::Any);
        }
        match s.strip_suffix('*') {
            Some(p) if !p.contains('*') => Some(ModelMatch::Prefix(p.to_string())),
            Some(_) => None,
            None if s.contains('*') => None,
            None => Some(ModelMatch::Exact(s.to_string())),
        }
    }

    /// True when every model this pattern selects is also selected by `other`.
    fn within(&self, other: &ModelMatch) -> bool {
        match (self, other) {
            (_, ModelMatch::Any) => true,
            (ModelMatch::Any, _) => false,
            (ModelMatch::Exact(m), o) => o.matches(m),
            (ModelMatch::Prefix(p), ModelMatch::Prefix(q)) => p.starts_with(q.as_str()),
            (ModelMatch::Prefix(_), ModelMatch::Exact(_)) => false,
        }
    }

    /// The pattern as written in the config.
    fn pattern(&self) -> String {
        match self {
            ModelMatch::Any => "*".to_string(),
            ModelMatch::Prefix(p) => format!("{p}*"),
            ModelMatch::Exact(m) => m.clone(),
        }
    }
    /// True when `model` is selected.
    pub fn matches(&self, model: &str) -> bool {
        match self {
            ModelMatch::Any => true,
            ModelMatch::Prefix(p) => model.starts_with(p.as_str()),
            ModelMatch::Exact(m) => m == model,
        }
    }
}

/// One validated bucket rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Name used in logs and keys (defaults to `rule<N>`): 1-64 characters from `[A-Za-z0-9._-]`.
    pub name: String,
    /// `None` = every tenant gets its own bucket ("*"); `Some(t)` = only tenant `t`, a valid tenant id
    /// (tenant patterns are exact: no globs).
    pub tenant: Option<String>,
    /// Which models the rule applies to.
    pub model: ModelMatch,
    /// One bucket per model (true) or one for all models the rule matches (false).
    pub per_model: bool,
    /// Bucket rates.
    pub params: BucketParams,
    /// Shaping: hold a request up to this long instead of rejecting (0 = off).
    pub max_wait_ms: u64,
    /// Give back to the bucket what the provider's reported usage shows was not used (and everything
    /// for a request the provider did not serve).
    pub refund_unused: bool,
    /// The bucket lives in Redis (through `global_buckets`), shared by every Envoy replica, instead of
    /// in this Envoy's shared data.
    pub global: bool,
}

impl Rule {
    /// True when the rule applies to `tenant` (model not considered).
    pub fn matches_tenant(&self, tenant: &str) -> bool {
        self.tenant.as_deref().is_none_or(|t| t == tenant)
    }
}

/// The validated runtime configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Header carrying the tenant id.
    pub tenant_header: Option<String>,
    /// Derive the tenant from a hashed API key when the header is absent.
    pub api_key_tenants: bool,
    /// Tenant used when none is found (`None` → 401).
    pub default_tenant: Option<String>,
    /// Header giving the model (used in the headers phase and when the body has none).
    pub model_header: Option<String>,
    /// Largest request body accepted on LLM paths.
    pub max_body_bytes: usize,
    /// Policy for bodies that are not valid JSON.
    pub invalid_body: InvalidBody,
    /// Output reservation for models without an entry in `models`.
    pub default_output: OutputLimits,
    /// Per-model output reservation.
    pub models: Vec<(ModelMatch, OutputLimits)>,
    /// Bucket rules, first match wins.
    pub rules: Vec<Rule>,
    /// Most bucket keys created for distinct tenants before overflow buckets are used.
    pub max_tenants: u32,
    /// CAS retries for one shared-data update.
    pub cas_max_retries: u32,
    /// Whether responses are read (breaker stream ends, quota settlements, `refund_unused`): metered
    /// requests then ask the provider for an uncompressed answer.
    pub reads_responses: bool,
    /// Policy when a bucket update fails.
    pub on_store_error: StoreFailure,
    /// Circuit breaker, when configured.
    pub breaker: Option<BreakerSettings>,
    /// Monthly quotas, when configured.
    pub quota: Option<QuotaSettings>,
    /// Where the buckets of `global` rules live, when configured.
    pub global: Option<GlobalSettings>,
}

/// What a request of a `global` rule gets when Redis cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalFailure {
    /// Charge this Envoy's own shared-data bucket of the rule instead (per replica).
    Local,
    /// Admit without charging any bucket.
    Open,
    /// Answer 503 `rate_limiter_unavailable`.
    Closed,
}

/// Global buckets: the Webdis shim in front of the Redis that holds them.
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalSettings {
    /// Envoy cluster of the Webdis shim.
    pub cluster: String,
    /// `:authority` of callouts.
    pub authority: String,
    /// Callout timeout.
    pub timeout_ms: u32,
    /// Policy when the shim or Redis cannot answer.
    pub on_failure: GlobalFailure,
    /// Breaker on the shim itself (shared with the quota's when both use one cluster).
    pub shim_breaker: BreakerConfig,
}

impl Config {
    /// Output limits for a model (first matching entry of `models`, else `default_output`).
    pub fn output_limits(&self, model: Option<&str>) -> OutputLimits {
        model
            .and_then(|m| self.models.iter().find(|(mm, _)| mm.matches(m)))
            .map(|(_, l)| *l)
            .unwrap_or(self.default_output)
    }

    /// Index of the first rule that applies to (tenant, model).
    pub fn rule_for(&self, tenant: &str, model: &str) -> Option<usize> {
        self.rules
            .iter()
            .position(|r| r.matches_tenant(tenant) && r.model.matches(model))
    }

    /// The rule that will apply to `tenant` whatever the model, when that is known without the body:
    /// the first rule for this tenant matches every model and keeps one bucket for all of them.
    pub fn rule_without_model(&self, tenant: &str) -> Option<usize> {
        let idx = self.rules.iter().position(|r| r.matches_tenant(tenant))?;
        let rule = self.rules.get(idx)?;
        (rule.model == ModelMatch::Any && !rule.per_model).then_some(idx)
    }

    /// True when the root context needs ticks (shaping, quota settlements).
    pub fn needs_tick(&self) -> bool {
        self.shaping() || self.quota.is_some() || self.global.is_some()
    }

    /// True when any rule shapes (needs the root tick).
    pub fn shaping(&self) -> bool {
        self.rules.iter().any(|r| r.max_wait_ms > 0)
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "the plugin configuration as a JSON object"
)]
struct RawConfig {
    tenant_header: Option<String>,
    api_key_tenants: Option<bool>,
    default_tenant: Option<String>,
    model_header: Option<String>,
    max_body_bytes: Option<u64>,
    invalid_body: Option<RawInvalidBody>,
    default_output: Option<RawOutput>,
    #[serde(default)]
    models: UniqueMap<RawOutput>,
    rules: Option<Vec<RawRule>>,
    max_tenants: Option<u32>,
    cas_max_retries: Option<u32>,
    on_store_error: Option<String>,
    breaker: Option<RawBreaker>,
    quota: Option<RawQuota>,
    global_buckets: Option<RawGlobal>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
struct RawGlobal {
    cluster: Option<String>,
    authority: Option<String>,
    timeout_ms: Option<u32>,
    on_failure: Option<String>,
    shim_breaker: Option<RawShimBreaker>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
struct RawQuota {
    cluster: Option<String>,
    authority: Option<String>,
    timeout_ms: Option<u32>,
    monthly_limit: Option<u64>,
    #[serde(default)]
    model_limits: UniqueMap<u64>,
    on_failure: Option<String>,
    clamp_output: Option<bool>,
    #[serde(default)]
    tenants: UniqueMap<RawTenantQuota>,
    #[serde(default)]
    weights: UniqueMap<RawWeights>,
    month_offset_minutes: Option<i32>,
    grace_seconds: Option<u64>,
    idempotency_window_s: Option<u64>,
    exhausted_recheck_s: Option<u64>,
    exhausted_below: Option<u64>,
    inject_stream_usage: Option<bool>,
    shim_breaker: Option<RawShimBreaker>,
    settle_retry_ms: Option<u64>,
    settle_max_attempts: Option<u32>,
    clock_skew_s: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
struct RawTenantQuota {
    monthly_limit: Option<u64>,
    #[serde(default)]
    model_limits: UniqueMap<u64>,
    on_failure: Option<String>,
    clamp_output: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
struct RawWeights {
    input: Option<f64>,
    output: Option<f64>,
    cached_input: Option<f64>,
    reasoning: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
struct RawShimBreaker {
    failure_threshold: Option<u32>,
    window_ms: Option<u64>,
    recovery_ms: Option<u64>,
}

fn quota_failure(
    field: &str,
    v: Option<&str>,
    default: QuotaFailure,
) -> Result<QuotaFailure, ConfigError> {
    match v {
        None => Ok(default),
        Some("open") => Ok(QuotaFailure::Open),
        Some("closed") => Ok(QuotaFailure::Closed),
        Some(o) => Err(err(
            field,
            format!("'{o}' is not one of \"open\", \"closed\""),
        )),
    }
}

/// Largest limit: Lua numbers are exact up to 2^53.
const MAX_QUOTA: u64 = (1 << 53) - 1;

fn limit(field: String, v: u64) -> Result<u64, ConfigError> {
    if v == 0 || v > MAX_QUOTA {
        Err(err(
            field,
            format!("must be between 1 and {MAX_QUOTA} (2^53 - 1), got {v}"),
        ))
    } else {
        Ok(v)
    }
}

/// Cluster (required), `:authority` (default: the cluster) and timeout (default 50 ms) of the Webdis shim
/// configured in section `section`.
fn shim_target(
    section: &str,
    cluster: Option<String>,
    authority: Option<String>,
    timeout_ms: Option<u32>,
) -> Result<(String, String, u32), ConfigError> {
    let cluster = cluster.filter(|c| !c.trim().is_empty()).ok_or_else(|| {
        err(
            format!("{section}.cluster"),
            "is required (the Envoy cluster of the Webdis shim)",
        )
    })?;
    let authority = authority.unwrap_or_else(|| cluster.clone());
    let timeout_ms = in_range(
        format!("{section}.timeout_ms"),
        timeout_ms.unwrap_or(50),
        1,
        60_000,
    )?;
    Ok((cluster, authority, timeout_ms))
}

/// The breaker on a Webdis shim (`field` names it in errors).
fn shim_breaker(field: &str, raw: Option<RawShimBreaker>) -> Result<BreakerConfig, ConfigError> {
    let sb = raw.unwrap_or(RawShimBreaker {
        failure_threshold: None,
        window_ms: None,
        recovery_ms: None,
    });
    let b = BreakerConfig {
        failure_threshold: sb.failure_threshold.unwrap_or(3),
        window_ms: sb.window_ms.unwrap_or(10_000),
        recovery_ms: sb.recovery_ms.unwrap_or(5_000),
        max_recovery_ms: sb.recovery_ms.unwrap_or(5_000).max(60_000),
        half_open_max_calls: 1,
        ..BreakerConfig::default()
    };
    b.validate().map_err(|e| prefixed_err(field, &e))?;
    Ok(b)
}

fn global(raw: RawGlobal) -> Result<GlobalSettings, ConfigError> {
    let (cluster, authority, timeout_ms) =
        shim_target("global_buckets", raw.cluster, raw.authority, raw.timeout_ms)?;
    let on_failure = match raw.on_failure.as_deref() {
        None | Some("local") => GlobalFailure::Local,
        Some("open") => GlobalFailure::Open,
        Some("closed") => GlobalFailure::Closed,
        Some(o) => {
            return Err(err(
                "global_buckets.on_failure",
                format!("'{o}' is not one of \"local\", \"open\", \"closed\""),
            ))
        }
    };
    Ok(GlobalSettings {
        cluster,
        authority,
        timeout_ms,
        on_failure,
        shim_breaker: shim_breaker("global_buckets.shim_breaker", raw.shim_breaker)?,
    })
}

fn quota(raw: RawQuota) -> Result<QuotaSettings, ConfigError> {
    let (cluster, authority, timeout_ms) =
        shim_target("quota", raw.cluster, raw.authority, raw.timeout_ms)?;
    let monthly_limit = limit(
        "quota.monthly_limit".into(),
        raw.monthly_limit
            .ok_or_else(|| err("quota.monthly_limit", "is required"))?,
    )?;
    let mut model_limits = Vec::new();
    for (m, v) in raw.model_limits {
        exact_model(&format!("quota.model_limits.{m}"), &m)?;
        model_limits.push((m.clone(), limit(format!("quota.model_limits.{m}"), v)?));
    }
    let default = TenantQuota {
        monthly_limit,
        model_limits,
        on_failure: quota_failure(
            "quota.on_failure",
            raw.on_failure.as_deref(),
            QuotaFailure::Closed,
        )?,
        clamp_output: raw.clamp_output.unwrap_or(false),
    };
    let mut tenants = Vec::new();
    for (t, q) in raw.tenants {
        if !crate::identity::valid_tenant(&t) {
            return Err(err(
                format!("quota.tenants.{t}"),
                format!("is not a valid tenant id: {TENANT_ID}"),
            ));
        }
        let mut ml = default.model_limits.clone();
        for (m, v) in q.model_limits {
            exact_model(&format!("quota.tenants.{t}.model_limits.{m}"), &m)?;
            let v = limit(format!("quota.tenants.{t}.model_limits.{m}"), v)?;
            ml.retain(|(x, _)| x != &m);
            ml.push((m, v));
        }
        let tq = TenantQuota {
            monthly_limit: match q.monthly_limit {
                Some(v) => limit(format!("quota.tenants.{t}.monthly_limit"), v)?,
                None => default.monthly_limit,
            },
            model_limits: ml,
            on_failure: quota_failure(
                &format!("quota.tenants.{t}.on_failure"),
                q.on_failure.as_deref(),
                default.on_failure,
            )?,
            clamp_output: q.clamp_output.unwrap_or(default.clamp_output),
        };
        tenants.push((t, tq));
    }
    let mut weights = Vec::new();
    for (m, w) in raw.weights {
        exact_model(&format!("quota.weights.{m}"), &m)?;
        let wt = Weights {
            input: w.input.unwrap_or(1.0),
            output: w.output.unwrap_or(1.0),
            cached_input: w.cached_input.unwrap_or(w.input.unwrap_or(1.0)),
            reasoning: w.reasoning.unwrap_or(w.output.unwrap_or(1.0)),
        };
        if let Err(f) = wt.validate() {
            return Err(err(
                format!("quota.weights.{m}.{f}"),
                "must be a number >= 0",
            ));
        }
        weights.push((m, wt));
    }
    let month_offset_minutes = raw.month_offset_minutes.unwrap_or(0);
    if month_offset_minutes.unsigned_abs() > crate::quota::MAX_OFFSET_MIN.unsigned_abs() {
        let max = crate::quota::MAX_OFFSET_MIN;
        return Err(err(
            "quota.month_offset_minutes",
            format!("must be between -{max} and {max}, got {month_offset_minutes}"),
        ));
    }
    let shim_breaker = shim_breaker("quota.shim_breaker", raw.shim_breaker)?;
    let settle_max_attempts = in_range(
        "quota.settle_max_attempts",
        raw.settle_max_attempts.unwrap_or(20),
        1,
        1000,
    )?;
    let clock_skew_s = raw.clock_skew_s.unwrap_or(0);
    if clock_skew_s.unsigned_abs() > MAX_CLOCK_SKEW_S.unsigned_abs() {
        return Err(err(
            "quota.clock_skew_s",
            format!("must be between -{MAX_CLOCK_SKEW_S} and {MAX_CLOCK_SKEW_S} (100 years), got {clock_skew_s}"),
        ));
    }
    Ok(QuotaSettings {
        cluster,
        authority,
        timeout_ms,
        default,
        tenants,
        weights,
        month_offset_minutes,
        grace_seconds: in_range(
            "quota.grace_seconds",
            raw.grace_seconds.unwrap_or(7 * 86_400),
            0,
            TEN_YEARS_S,
        )?,
        idempotency_window_s: in_range(
            "quota.idempotency_window_s",
            raw.idempotency_window_s.unwrap_or(86_400),
            0,
            TEN_YEARS_S,
        )?,
        exhausted_recheck_s: at_least(
            "quota.exhausted_recheck_s",
            raw.exhausted_recheck_s.unwrap_or(60),
            1,
        )?,
        exhausted_below: at_least(
            "quota.exhausted_below",
            raw.exhausted_below.unwrap_or(1000),
            1,
        )?,
        inject_stream_usage: raw.inject_stream_usage.unwrap_or(true),
        shim_breaker,
        settle_retry_ms: in_range(
            "quota.settle_retry_ms",
            raw.settle_retry_ms.unwrap_or(500),
            10,
            60_000,
        )?,
        settle_max_attempts,
        clock_skew_s,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
struct RawBreaker {
    keys: Option<Vec<String>>,
    failure_threshold: Option<u32>,
    window_ms: Option<u64>,
    failure_rate_percent: Option<u32>,
    min_requests: Option<u32>,
    recovery_ms: Option<u64>,
    max_recovery_ms: Option<u64>,
    backoff_multiplier: Option<f64>,
    half_open_max_calls: Option<u32>,
    half_open_successes_to_close: Option<u32>,
    probe_timeout_ms: Option<u64>,
    failure_statuses: Option<Vec<[u32; 2]>>,
    count_429: Option<bool>,
    count_incomplete_streams: Option<bool>,
    route_header: Option<String>,
    #[serde(default)]
    cluster_fallbacks: UniqueMap<RawClusterFallback>,
    #[serde(default)]
    model_fallbacks: UniqueMap<String>,
    max_fallback_hops: Option<u32>,
    max_keys: Option<u32>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a JSON object {\"cluster\": …, \"route\": …}"
)]
struct RawClusterFallback {
    cluster: String,
    route: String,
}

fn breaker(raw: RawBreaker) -> Result<BreakerSettings, ConfigError> {
    let d = BreakerConfig::default();
    let cfg = BreakerConfig {
        failure_threshold: raw.failure_threshold.unwrap_or(d.failure_threshold),
        window_ms: raw.window_ms.unwrap_or(d.window_ms),
        failure_rate_percent: raw.failure_rate_percent,
        min_requests: raw.min_requests.unwrap_or(d.min_requests),
        recovery_ms: raw.recovery_ms.unwrap_or(d.recovery_ms),
        max_recovery_ms: raw
            .max_recovery_ms
            .unwrap_or(d.max_recovery_ms.max(raw.recovery_ms.unwrap_or(0))),
        backoff_multiplier: raw.backoff_multiplier.unwrap_or(d.backoff_multiplier),
        half_open_max_calls: raw.half_open_max_calls.unwrap_or(d.half_open_max_calls),
        half_open_successes_to_close: raw
            .half_open_successes_to_close
            .unwrap_or(d.half_open_successes_to_close),
        probe_timeout_ms: raw.probe_timeout_ms.unwrap_or(d.probe_timeout_ms),
    };
    cfg.validate().map_err(|e| prefixed_err("breaker", &e))?;
    let mut policy = FailurePolicy::default();
    if let Some(st) = raw.failure_statuses {
        policy.failure_statuses = st.into_iter().map(|[a, b]| (a, b)).collect();
    }
    policy.count_429 = raw.count_429.unwrap_or(true);
    policy.validate().map_err(|e| prefixed_err("breaker", &e))?;
    let keys = match raw.keys {
        None => BreakerKeys {
            cluster: true,
            model: true,
        },
        Some(list) => {
            let mut k = BreakerKeys {
                cluster: false,
                model: false,
            };
            for (i, s) in list.iter().enumerate() {
                match s.as_str() {
                    "cluster" => k.cluster = true,
                    "model" => k.model = true,
                    o => {
                        return Err(err(
                            format!("breaker.keys[{i}]"),
                            format!("'{o}' is not one of \"cluster\", \"model\""),
                        ))
                    }
                }
            }
            if !k.cluster && !k.model {
                return Err(err(
                    "breaker.keys",
                    "must name \"cluster\", \"model\" or both",
                ));
            }
            k
        }
    };
    let route_header = header_name("breaker.route_header", raw.route_header)?
        .unwrap_or_else(|| "x-tokengate-route".to_string());
    let mut cluster_fallbacks = Vec::new();
    for (from, f) in raw.cluster_fallbacks {
        if from.is_empty() || f.cluster.is_empty() || f.route.is_empty() || from == f.cluster {
            return Err(err(
                format!("breaker.cluster_fallbacks.{from}"),
                "needs a non-empty source, a different non-empty cluster and a route value",
            ));
        }
        if !f
            .route
            .bytes()
            .all(|b| b == b'\t' || (0x20..0x7F).contains(&b))
        {
            return Err(err(
                format!("breaker.cluster_fallbacks.{from}.route"),
                "must be a valid header value (visible ASCII, spaces and tabs)",
            ));
        }
        cluster_fallbacks.push(ClusterFallback {
            from,
            to: f.cluster,
            route: f.route,
        });
    }
    let mut model_fallbacks = Vec::new();
    for (from, to) in raw.model_fallbacks {
        if from.is_empty() || to.is_empty() || from == to {
            return Err(err(
                format!("breaker.model_fallbacks.{from}"),
                "needs a non-empty, different target model",
            ));
        }
        exact_model(&format!("breaker.model_fallbacks.{from}"), &from)?;
        exact_model(&format!("breaker.model_fallbacks.{from}"), &to)?;
        model_fallbacks.push((from, to));
    }
    let max_fallback_hops = in_range(
        "breaker.max_fallback_hops",
        raw.max_fallback_hops.unwrap_or(1),
        0,
        8,
    )?;
    let max_keys = in_range("breaker.max_keys", raw.max_keys.unwrap_or(1000), 1, 100_000)?;
    Ok(BreakerSettings {
        cfg,
        policy,
        count_incomplete_streams: raw.count_incomplete_streams.unwrap_or(true),
        keys,
        route_header,
        cluster_fallbacks,
        model_fallbacks,
        max_fallback_hops,
        max_keys,
    })
}

/// Turns a validation message that starts with the field name (`failure_threshold must be >= 1`) into a
/// ConfigError under `prefix` (`breaker.failure_threshold: must be >= 1`).
fn prefixed_err(prefix: &str, msg: &str) -> ConfigError {
    let (field, reason) = msg.split_once(' ').unwrap_or((msg, "is invalid"));
    err(format!("{prefix}.{field}"), reason.to_string())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object {\"action\": …}")]
struct RawInvalidBody {
    action: String,
    tokens: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
struct RawOutput {
    default_max_tokens: Option<u64>,
    max_tokens_cap: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a rule object")]
struct RawRule {
    name: Option<String>,
    tenant: Option<String>,
    model: Option<String>,
    tokens_per_second: Option<f64>,
    burst: Option<f64>,
    requests_per_minute: Option<f64>,
    per_model: Option<bool>,
    max_wait_ms: Option<u64>,
    refund_unused: Option<bool>,
    global: Option<bool>,
}

/// Keys that name one model (quota limits and weights, model fallbacks): a `*` there would be taken
/// literally and never match, so it is refused.
fn exact_model(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.contains('*') {
        return Err(err(
            field,
            format!("'{name}' must be an exact model name here ('*' patterns are only for rules[].model and models)"),
        ));
    }
    Ok(())
}

/// Default header giving the model in the headers phase.
pub const DEFAULT_MODEL_HEADER: &str = "x-tokengate-model";
/// Default largest body: 8 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 8 * 1024 * 1024;
/// Default output reservation when a request sets no `max_tokens` and its model has no entry.
pub const DEFAULT_OUTPUT: OutputLimits = OutputLimits {
    default_tokens: 1024,
    cap_tokens: 32768,
};
/// Longest shaping hold accepted.
pub const MAX_WAIT_MS_LIMIT: u64 = 60_000;
/// Largest `max_body_bytes`: 1 GiB.
pub const MAX_BODY_BYTES_LIMIT: u64 = 1 << 30;
/// Most bucket rules.
pub const MAX_RULES: usize = 256;

/// A JSON object whose keys must be distinct: serde_json alone keeps the last of two equal keys
/// silently, so `{"models": {"a": …, "a": …}}` would lose an entry without a word.
struct UniqueMap<V>(BTreeMap<String, V>);

impl<V> IntoIterator for UniqueMap<V> {
    type Item = (String, V);
    type IntoIter = std::collections::btree_map::IntoIter<String, V>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a, V> IntoIterator for &'a UniqueMap<V> {
    type Item = (&'a String, &'a V);
    type IntoIter = std::collections::btree_map::Iter<'a, String, V>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<V> Default for UniqueMap<V> {
    fn default() -> Self {
        UniqueMap(BTreeMap::new())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for UniqueMap<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Keys<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Keys<V> {
            type Value = UniqueMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<Self::Value, A::Error> {
                let mut map = BTreeMap::new();
                while let Some(key) = access.next_key::<String>()? {
                    if map.contains_key(&key) {
                        // Worded as serde words a repeated struct field, so shape_error treats both alike.
                        return Err(serde::de::Error::custom(format_args!(
                            "duplicate field `{key}`"
                        )));
                    }
                    let value = access.next_value()?;
                    map.insert(key, value);
                }
                Ok(UniqueMap(map))
            }
        }
        d.deserialize_map(Keys(std::marker::PhantomData))
    }
}

/// Parses and validates the plugin configuration.
pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let raw: RawConfig = serde_path_to_error::deserialize(&mut de).map_err(shape_error)?;
    // Text after the JSON object (what serde_json::from_slice checks last).
    de.end().map_err(|e| err("configuration", e.to_string()))?;
    validate(raw)
}

/// The `ConfigError` of a serde (shape) error: the JSON path serde_path_to_error tracked names the field,
/// the reason is serde's message in words a user knows (`expected a number`, not `expected f64`).
///
/// * type and value errors: `rules[0].tokens_per_second: invalid type: string "10", expected a number`;
/// * unknown fields: `rules[0].foo: unknown field `foo`, expected one of …` (the path ends at the key);
/// * duplicate and missing fields are reported on the struct by serde: the field is appended to the path
///   (`rules[0].burst: is given more than once`, `breaker.cluster_fallbacks.a.route: is required`);
/// * JSON syntax errors keep serde_json's line and column (the path is where parsing stopped).
fn shape_error(e: serde_path_to_error::Error<serde_json::Error>) -> ConfigError {
    let mut path = String::new();
    for segment in e.path().iter() {
        match segment {
            serde_path_to_error::Segment::Seq { index } => {
                if path.is_empty() {
                    path.push_str("configuration");
                }
                path.push_str(&format!("[{index}]"));
            }
            serde_path_to_error::Segment::Map { key } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
            }
            // Where a key was not read yet (a syntax error between fields): the path so far.
            serde_path_to_error::Segment::Enum { .. } | serde_path_to_error::Segment::Unknown => {}
        }
    }
    let inner = e.inner();
    let full = inner.to_string();
    let at = |path: &str, name: &str| match (path.is_empty(), name.is_empty()) {
        (true, true) => "configuration".to_string(),
        (true, false) => name.to_string(),
        (false, true) => path.to_string(),
        (false, false) => format!("{path}.{name}"),
    };
    if !inner.is_data() {
        // Syntax error or truncated input: the position is what finds it.
        return err(at(&path, ""), full);
    }
    let position = format!(" at line {} column {}", inner.line(), inner.column());
    let msg = full.strip_suffix(position.as_str()).unwrap_or(&full);
    let quoted = |prefix: &str| {
        msg.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix('`'))
            .filter(|name| !name.contains('`'))
    };
    if let Some(name) = quoted("duplicate field `") {
        return err(at(&path, name), "is given more than once");
    }
    if let Some(name) = quoted("missing field `") {
        return err(at(&path, name), "is required");
    }
    err(at(&path, ""), plain_expectation(msg))
}

/// serde's `…, expected f64` in words: Rust type names mean nothing in a JSON config.
fn plain_expectation(msg: &str) -> String {
    const WORDS: [(&str, &str); 7] = [
        ("f64", "a number"),
        ("u64", "an integer >= 0"),
        ("u32", "an integer between 0 and 4294967295"),
        ("i32", "an integer between -2147483648 and 2147483647"),
        ("i64", "an integer"),
        ("a sequence", "an array"),
        ("a map", "a JSON object"),
    ];
    if let Some((head, expected)) = msg.rsplit_once(", expected ") {
        if let Some((_, words)) = WORDS.iter().find(|(rust, _)| *rust == expected) {
            return format!("{head}, expected {words}");
        }
    }
    msg.to_string()
}

fn header_name(field: &str, v: Option<String>) -> Result<Option<String>, ConfigError> {
    match v {
        None => Ok(None),
        Some(h) => {
            let lower = h.trim().to_ascii_lowercase();
            let ok = !lower.is_empty()
                && lower
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if ok {
                Ok(Some(lower))
            } else {
                Err(err(field, format!("'{h}' is not a valid header name")))
            }
        }
    }
}

fn output(field: &str, raw: &RawOutput, base: OutputLimits) -> Result<OutputLimits, ConfigError> {
    let cap = raw.max_tokens_cap.unwrap_or(base.cap_tokens);
    let default = raw
        .default_max_tokens
        .unwrap_or(base.default_tokens.min(cap));
    if cap == 0 {
        return Err(err(format!("{field}.max_tokens_cap"), "must be >= 1"));
    }
    if default > cap {
        return Err(err(
            format!("{field}.default_max_tokens"),
            format!("{default} is larger than max_tokens_cap {cap}"),
        ));
    }
    Ok(OutputLimits {
        default_tokens: default,
        cap_tokens: cap,
    })
}

/// Refuses a rule that an earlier one shadows: first match wins, so a rule whose tenant and model
/// patterns are both within an earlier rule's is never used (two catch-alls, the same patterns twice,
/// `gpt-4.1` after `gpt-*`). Only what is decided exactly from the patterns is refused.
fn unreachable_rule(rules: &[Rule]) -> Result<(), ConfigError> {
    for (j, later) in rules.iter().enumerate() {
        let covered = |earlier: &&Rule| {
            let tenant = match (&earlier.tenant, &later.tenant) {
                (None, _) => true,
                (Some(a), Some(b)) => a == b,
                (Some(_), None) => false,
            };
            tenant && later.model.within(&earlier.model)
        };
        if let Some((i, earlier)) = rules.iter().take(j).enumerate().find(|(_, e)| covered(e)) {
            return Err(err(
                format!("rules[{j}]"),
                format!(
                    "can never match: rules[{i}] (tenant \"{}\", model \"{}\") matches every request it would",
                    earlier.tenant.as_deref().unwrap_or("*"),
                    earlier.model.pattern()
                ),
            ));
        }
    }
    Ok(())
}

/// What a tenant id is, for messages (see [`crate::identity::valid_tenant`]).
const TENANT_ID: &str = "1-128 characters from [A-Za-z0-9._:@-]";

/// What a rule name is, for messages: it goes into shared-data and Redis keys, logs and error bodies.
const RULE_NAME: &str = "1-64 characters from [A-Za-z0-9._-]";

/// Longest rule name.
pub const MAX_RULE_NAME_LEN: usize = 64;

fn valid_rule_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_RULE_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A model pattern (`rules[].model`, `models` keys): `*` alone or once at the end, nowhere else.
fn model_pattern(field: &str, s: &str) -> Result<ModelMatch, ConfigError> {
    ModelMatch::parse(s).ok_or_else(|| {
        err(
            field,
            format!("'{s}' is not a model pattern: use an exact name, \"prefix*\" or \"*\" ('*' only once, at the end)"),
        )
    })
}

/// Bounds of the numbers of a rule. Rates and capacities are f64; 1e15 keeps every balance, sum and
/// product of the bucket math far inside f64's exact integers and Lua's. The global bucket script reports
/// balances in thousandths of a token, hence the smallest rate of one thousandth per second.
const MIN_TOKENS_PER_SECOND: f64 = 1e-3;
/// Largest `tokens_per_second`, `burst` and `requests_per_minute`.
const MAX_RATE: f64 = 1e15;
/// Longest time to refill an empty bucket (`burst / tokens_per_second`): about 31.7 years. Waits and
/// resets are reported in µs by the global bucket script (i64) and as whole seconds in headers; this keeps
/// both far from overflowing, and no real limit needs more.
const MAX_REFILL_S: f64 = 1e9;
/// Bound of `quota.grace_seconds` and `quota.idempotency_window_s`: 10 years (Redis expiry times).
const TEN_YEARS_S: u64 = 3650 * 86_400;
/// Bound of `quota.clock_skew_s` either way: 100 years.
const MAX_CLOCK_SKEW_S: i64 = 100 * 365 * 86_400;

/// A number for a message: plain when short (`0.5`, `60000`), else in exponent form (`1e15`, `1e-300`).
fn show(x: f64) -> String {
    if x != 0.0 && x.is_finite() && !(1e-3..1e15).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// A required number within `lo..=hi`; the error states the range and what was given.
fn number_in(field: String, v: Option<f64>, lo: f64, hi: f64) -> Result<f64, ConfigError> {
    match v {
        None => Err(err(field, "is required")),
        Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x),
        Some(x) => Err(err(
            field,
            format!(
                "must be between {} and {}, got {}",
                show(lo),
                show(hi),
                show(x)
            ),
        )),
    }
}

/// An integer within `lo..=hi`; the error states the range and what was given.
fn in_range<T>(field: impl Into<String>, v: T, lo: T, hi: T) -> Result<T, ConfigError>
where
    T: PartialOrd + fmt::Display + Copy,
{
    if v < lo || v > hi {
        Err(err(
            field,
            format!("must be between {lo} and {hi}, got {v}"),
        ))
    } else {
        Ok(v)
    }
}

/// An integer of at least `lo` (no upper bound but its type's).
fn at_least<T>(field: impl Into<String>, v: T, lo: T) -> Result<T, ConfigError>
where
    T: PartialOrd + fmt::Display + Copy,
{
    if v < lo {
        Err(err(field, format!("must be >= {lo}, got {v}")))
    } else {
        Ok(v)
    }
}

fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    let tenant_header = header_name("tenant_header", raw.tenant_header)?;
    let model_header = header_name(
        "model_header",
        Some(
            raw.model_header
                .unwrap_or_else(|| DEFAULT_MODEL_HEADER.to_string()),
        ),
    )?;
    let api_key_tenants = raw.api_key_tenants.unwrap_or(true);
    let default_tenant = match raw.default_tenant {
        Some(t) if t.trim().is_empty() => {
            return Err(err("default_tenant", "must not be empty (omit it for 401)"))
        }
        Some(t) if !crate::identity::valid_tenant(&t) => {
            return Err(err(
                "default_tenant",
                format!("'{t}' is not a valid tenant id: {TENANT_ID}"),
            ))
        }
        other => other,
    };
    let max_body = raw.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
    if max_body == 0 || max_body > MAX_BODY_BYTES_LIMIT {
        return Err(err(
            "max_body_bytes",
            format!("must be between 1 and {MAX_BODY_BYTES_LIMIT} (1 GiB), got {max_body}"),
        ));
    }
    let invalid_body = match raw.invalid_body {
        None => InvalidBody::Reject,
        Some(ib) => match (ib.action.as_str(), ib.tokens) {
            ("reject", None) => InvalidBody::Reject,
            ("reject", Some(_)) => {
                return Err(err(
                    "invalid_body.tokens",
                    "only allowed with action \"charge\"",
                ))
            }
            ("charge", Some(t)) if t > 0 => InvalidBody::Charge(t),
            ("charge", _) => {
                return Err(err(
                    "invalid_body.tokens",
                    "action \"charge\" needs tokens > 0",
                ))
            }
            (a, _) => {
                return Err(err(
                    "invalid_body.action",
                    format!("'{a}' is not one of \"reject\", \"charge\""),
                ))
            }
        },
    };
    let default_output = match &raw.default_output {
        None => DEFAULT_OUTPUT,
        Some(o) => output("default_output", o, DEFAULT_OUTPUT)?,
    };
    let mut models = Vec::new();
    for (name, o) in &raw.models {
        if name.is_empty() {
            return Err(err("models", "model name must not be empty"));
        }
        let pattern = model_pattern(&format!("models.{name}"), name)?;
        models.push((
            pattern,
            output(&format!("models.{name}"), o, default_output)?,
        ));
    }
    // Exact names before prefixes before "*", so lookups find the most specific entry first.
    models.sort_by_key(|(m, _)| match m {
        ModelMatch::Exact(_) => 0,
        ModelMatch::Prefix(p) => 1 + usize::MAX / 2 - p.len().min(usize::MAX / 4),
        ModelMatch::Any => usize::MAX,
    });

    let raw_rules = raw.rules.ok_or_else(|| err("rules", "is required"))?;
    if raw_rules.is_empty() || raw_rules.len() > MAX_RULES {
        return Err(err(
            "rules",
            format!(
                "must hold between 1 and {MAX_RULES} rules, got {}",
                raw_rules.len()
            ),
        ));
    }
    let mut rules = Vec::with_capacity(raw_rules.len());
    for (i, r) in raw_rules.into_iter().enumerate() {
        let f = |name: &str| format!("rules[{i}].{name}");
        let rate = number_in(
            f("tokens_per_second"),
            r.tokens_per_second,
            MIN_TOKENS_PER_SECOND,
            MAX_RATE,
        )?;
        let burst = number_in(f("burst"), r.burst, 1.0, MAX_RATE)?;
        if burst / rate > MAX_REFILL_S {
            return Err(err(
                f("tokens_per_second"),
                format!(
                    "{} refills the burst of {} tokens in {} s, longer than the {} s (about 31 years) supported: use at least {}",
                    show(rate),
                    show(burst),
                    show(burst / rate),
                    show(MAX_REFILL_S),
                    show(burst / MAX_REFILL_S)
                ),
            ));
        }
        let rpm = match r.requests_per_minute {
            None => None,
            Some(v) => Some(number_in(f("requests_per_minute"), Some(v), 1.0, MAX_RATE)?),
        };
        let max_wait_ms = in_range(
            f("max_wait_ms"),
            r.max_wait_ms.unwrap_or(0),
            0,
            MAX_WAIT_MS_LIMIT,
        )?;
        let tenant = match r.tenant.as_deref() {
            None | Some("*") => None,
            Some("") => return Err(err(f("tenant"), "must not be empty (use \"*\")")),
            Some(t) if crate::identity::valid_tenant(t) => Some(t.to_string()),
            Some(t) => {
                return Err(err(
                    f("tenant"),
                    format!("'{t}' can never match a tenant: use \"*\" or one exact tenant id, {TENANT_ID} (tenant patterns are not globs)"),
                ))
            }
        };
        let model_s = r.model.unwrap_or_else(|| "*".to_string());
        if model_s.is_empty() {
            return Err(err(f("model"), "must not be empty (use \"*\")"));
        }
        let model = model_pattern(&f("model"), &model_s)?;
        let name = r.name.unwrap_or_else(|| format!("rule{i}"));
        if !valid_rule_name(&name) {
            return Err(err(
                f("name"),
                format!("'{name}' is not a valid rule name: {RULE_NAME}"),
            ));
        }
        if rules.iter().any(|x: &Rule| x.name == name) {
            return Err(err(f("name"), format!("duplicate rule name '{name}'")));
        }
        rules.push(Rule {
            name,
            tenant,
            model,
            per_model: r.per_model.unwrap_or(true),
            params: BucketParams {
                tokens_per_second: rate,
                burst,
                requests_per_minute: rpm,
            },
            max_wait_ms,
            refund_unused: r.refund_unused.unwrap_or(false),
            global: r.global.unwrap_or(false),
        });
    }
    unreachable_rule(&rules)?;
    if let InvalidBody::Charge(tokens) = invalid_body {
        let largest = rules.iter().map(|r| r.params.burst).fold(0.0, f64::max);
        if tokens as f64 > largest {
            return Err(err(
                "invalid_body.tokens",
                format!(
                    "{tokens} is larger than the burst of every rule (largest {}): every request with an unreadable body would be refused with 413",
                    show(largest)
                ),
            ));
        }
    }
    let max_tenants = in_range(
        "max_tenants",
        raw.max_tenants.unwrap_or(10_000),
        1,
        1_000_000,
    )?;
    let cas_max_retries = in_range(
        "cas_max_retries",
        raw.cas_max_retries.unwrap_or(32),
        1,
        1000,
    )?;
    let on_store_error = match raw.on_store_error.as_deref() {
        None | Some("allow") => StoreFailure::Allow,
        Some("deny") => StoreFailure::Deny,
        Some(o) => {
            return Err(err(
                "on_store_error",
                format!("'{o}' is not one of \"allow\", \"deny\""),
            ))
        }
    };
    let breaker = raw.breaker.map(breaker).transpose()?;
    let quota = raw.quota.map(quota).transpose()?;
    let global = raw.global_buckets.map(global).transpose()?;
    if let (Some(g), Some(q)) = (&global, &quota) {
        if g.cluster == q.cluster && g.shim_breaker != q.shim_breaker {
            return Err(err(
                "global_buckets.shim_breaker".to_string(),
                format!(
                    "differs from quota.shim_breaker, but both reach cluster '{}' and a cluster has one shim breaker: give both the same settings (or omit both)",
                    g.cluster
                ),
            ));
        }
    }
    if global.is_none() {
        if let Some(i) = rules.iter().position(|r| r.global) {
            return Err(err(
                format!("rules[{i}].global"),
                "needs the top-level \"global_buckets\" section (the Webdis shim of the Redis holding the buckets)",
            ));
        }
    }
    let reads_responses =
        breaker.is_some() || quota.is_some() || rules.iter().any(|r| r.refund_unused);
    Ok(Config {
        reads_responses,
        quota,
        global,
        breaker,
        on_store_error,
        tenant_header,
        api_key_tenants,
        default_tenant,
        model_header,
        max_body_bytes: usize::try_from(max_body).unwrap_or(usize::MAX),
        invalid_body,
        default_output,
        models,
        rules,
        max_tenants,
        cas_max_retries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> Result<Config, ConfigError> {
        parse(s.as_bytes())
    }

    const MIN: &str = r#"{"rules":[{"tokens_per_second":10,"burst":100}]}"#;

    #[test]
    fn exact_model_keys_and_route_values_are_checked() {
        let r = r#""rules":[{"tokens_per_second":10,"burst":100}]"#;
        let e = parse_str(&format!(
            r#"{{{r},"quota":{{"cluster":"w","monthly_limit":10,"weights":{{"gpt-4*":{{"output":2}}}}}}}}"#
        ))
        .unwrap_err();
        assert_eq!(e.field, "quota.weights.gpt-4*");
        let e = parse_str(&format!(
            r#"{{{r},"quota":{{"cluster":"w","monthly_limit":10,"model_limits":{{"a*":1}}}}}}"#
        ))
        .unwrap_err();
        assert_eq!(e.field, "quota.model_limits.a*");
        let e = parse_str(&format!(
            r#"{{{r},"breaker":{{"model_fallbacks":{{"a":"b*"}}}}}}"#
        ))
        .unwrap_err();
        assert_eq!(e.field, "breaker.model_fallbacks.a");
        let e = parse_str(&format!(
            r#"{{{r},"breaker":{{"cluster_fallbacks":{{"a":{{"cluster":"b","route":"x\r\ny"}}}}}}}}"#
        ))
        .unwrap_err();
        assert_eq!(e.field, "breaker.cluster_fallbacks.a.route");
    }

    #[test]
    fn one_cluster_has_one_shim_breaker() {
        let q = r#""quota":{"cluster":"webdis","monthly_limit":1000,"shim_breaker":{"failure_threshold":2}}"#;
        let g = r#""global_buckets":{"cluster":"webdis"}"#;
        let e = parse_str(&format!(
            r#"{{"rules":[{{"tokens_per_second":10,"burst":100}}],{q},{g}}}"#
        ))
        .unwrap_err();
        assert_eq!(e.field, "global_buckets.shim_breaker");
        assert!(e.reason.contains("cluster 'webdis'"), "{}", e.reason);
        // Same settings, or another cluster: fine.
        let g2 = r#""global_buckets":{"cluster":"webdis","shim_breaker":{"failure_threshold":2}}"#;
        parse_str(&format!(
            r#"{{"rules":[{{"tokens_per_second":10,"burst":100}}],{q},{g2}}}"#
        ))
        .unwrap();
        let g3 = r#""global_buckets":{"cluster":"webdis2"}"#;
        parse_str(&format!(
            r#"{{"rules":[{{"tokens_per_second":10,"burst":100}}],{q},{g3}}}"#
        ))
        .unwrap();
    }

    #[test]
    fn minimal_config_takes_documented_defaults() {
        let c = parse_str(MIN).unwrap();
        assert_eq!(c.max_body_bytes, 8 * 1024 * 1024);
        assert!(c.api_key_tenants);
        assert_eq!(c.invalid_body, InvalidBody::Reject);
        assert_eq!(c.rules[0].name, "rule0");
        assert_eq!(c.rules[0].model, ModelMatch::Any);
        assert!(c.rules[0].per_model);
    }

    #[test]
    fn global_buckets_parse_with_defaults_and_refuse_what_is_wrong() {
        let c = parse_str(
            r#"{"rules":[{"tokens_per_second":10,"burst":100,"global":true}],
                "global_buckets":{"cluster":"webdis"}}"#,
        )
        .unwrap();
        assert!(c.rules[0].global);
        let g = c.global.as_ref().unwrap();
        assert_eq!(
            (g.cluster.as_str(), g.authority.as_str()),
            ("webdis", "webdis")
        );
        assert_eq!((g.timeout_ms, g.on_failure), (50, GlobalFailure::Local));
        assert_eq!(g.shim_breaker.failure_threshold, 3);
        assert!(c.needs_tick());
        assert!(!parse_str(MIN).unwrap().rules[0].global);
        for (cfg, field) in [
            (
                r#"{"rules":[{"tokens_per_second":10,"burst":100,"global":true}]}"#,
                "rules[0].global",
            ),
            (
                r#"{"rules":[{"tokens_per_second":10,"burst":100}],"global_buckets":{}}"#,
                "global_buckets.cluster",
            ),
            (
                r#"{"rules":[{"tokens_per_second":10,"burst":100}],"global_buckets":{"cluster":"w","on_failure":"maybe"}}"#,
                "global_buckets.on_failure",
            ),
            (
                r#"{"rules":[{"tokens_per_second":10,"burst":100}],"global_buckets":{"cluster":"w","timeout_ms":0}}"#,
                "global_buckets.timeout_ms",
            ),
            (
                r#"{"rules":[{"tokens_per_second":10,"burst":100}],"global_buckets":{"cluster":"w","redis":1}}"#,
                "global_buckets.redis",
            ),
        ] {
            let e = parse_str(cfg).unwrap_err();
            assert_eq!(e.field, field, "{cfg}: {e}");
        }
    }

    #[test]
    fn unknown_field_is_refused_naming_it() {
        let e = parse_str(r#"{"rules":[{"tokens_per_second":1,"burst":1}],"tenant_heder":"x"}"#)
            .unwrap_err();
        assert_eq!(e.field, "tenant_heder");
        let e =
            parse_str(r#"{"rules":[{"tokens_per_second":1,"burst":1,"brust":3}]}"#).unwrap_err();
        assert_eq!(e.field, "rules[0].brust");
    }

    #[test]
    fn missing_or_empty_rules_are_refused() {
        assert_eq!(parse_str("{}").unwrap_err().field, "rules");
        assert_eq!(parse_str(r#"{"rules":[]}"#).unwrap_err().field, "rules");
    }

    #[test]
    fn negative_or_zero_rates_are_refused_with_the_rule_index() {
        let e = parse_str(
            r#"{"rules":[{"tokens_per_second":1,"burst":1},{"tokens_per_second":-5,"burst":10}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "rules[1].tokens_per_second");
        let e = parse_str(r#"{"rules":[{"tokens_per_second":1,"burst":0}]}"#).unwrap_err();
        assert_eq!(e.field, "rules[0].burst");
    }

    #[test]
    fn wrong_types_are_refused() {
        assert!(parse_str(r#"{"rules":[{"tokens_per_second":"fast","burst":1}]}"#).is_err());
        assert!(parse_str(r#"[1,2]"#).is_err());
        assert!(parse_str("not json").is_err());
        assert!(parse_str("").is_err());
    }

    #[test]
    fn invalid_body_policy_is_checked() {
        let c = parse_str(
            r#"{"invalid_body":{"action":"charge","tokens":500},"rules":[{"tokens_per_second":1,"burst":500}]}"#,
        )
        .unwrap();
        assert_eq!(c.invalid_body, InvalidBody::Charge(500));
        let e = parse_str(
            r#"{"invalid_body":{"action":"charge"},"rules":[{"tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "invalid_body.tokens");
        let e = parse_str(
            r#"{"invalid_body":{"action":"drop"},"rules":[{"tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "invalid_body.action");
    }

    #[test]
    fn first_matching_rule_wins_and_tenant_rules_are_specific() {
        let c = parse_str(
            r#"{"rules":[
              {"name":"vip","tenant":"vip","tokens_per_second":9,"burst":9},
              {"name":"g41","model":"gpt-4.1","tokens_per_second":5,"burst":5},
              {"name":"g4","model":"gpt-4*","tokens_per_second":4,"burst":4},
              {"name":"any","tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap();
        assert_eq!(c.rule_for("vip", "gpt-4.1"), Some(0));
        assert_eq!(c.rule_for("t", "gpt-4.1"), Some(1));
        assert_eq!(c.rule_for("t", "gpt-4o"), Some(2));
        assert_eq!(c.rule_for("t", "llama"), Some(3));
    }

    #[test]
    fn headers_phase_rule_is_known_only_for_model_independent_buckets() {
        let c = parse_str(
            r#"{"rules":[{"tenant":"a","per_model":false,"tokens_per_second":1,"burst":1},
                         {"tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap();
        assert_eq!(c.rule_without_model("a"), Some(0));
        assert_eq!(c.rule_without_model("b"), None);
    }

    #[test]
    fn model_output_limits_prefer_exact_then_prefix() {
        let c = parse_str(
            r#"{"models":{"gpt-4*":{"default_max_tokens":100},"gpt-4.1":{"default_max_tokens":200}},
                "rules":[{"tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap();
        assert_eq!(c.output_limits(Some("gpt-4.1")).default_tokens, 200);
        assert_eq!(c.output_limits(Some("gpt-4o")).default_tokens, 100);
        assert_eq!(c.output_limits(Some("x")).default_tokens, 1024);
        assert_eq!(c.output_limits(None).default_tokens, 1024);
    }

    #[test]
    fn default_larger_than_cap_is_refused() {
        let e = parse_str(
            r#"{"models":{"m":{"default_max_tokens":100,"max_tokens_cap":10}},"rules":[{"tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "models.m.default_max_tokens");
    }

    #[test]
    fn the_readme_sample_and_a_config_with_every_documented_field_parse() {
        let readme = include_str!("../README.md");
        let sample = readme
            .split("## Sample configuration")
            .nth(1)
            .and_then(|s| s.split("```json\n").nth(1))
            .and_then(|s| s.split("```").next())
            .unwrap();
        let c = parse(sample.as_bytes()).unwrap();
        assert!(c.breaker.is_some() && c.quota.is_some());
        let every = r#"{
          "tenant_header": "x-tenant-id", "api_key_tenants": true, "default_tenant": "anon",
          "model_header": "x-model", "max_body_bytes": 1048576,
          "invalid_body": {"action": "charge", "tokens": 100},
          "default_output": {"default_max_tokens": 512, "max_tokens_cap": 4096},
          "models": {"gpt-4*": {"default_max_tokens": 256, "max_tokens_cap": 1024}},
          "rules": [{"name": "r", "tenant": "*", "model": "*", "per_model": false,
                     "tokens_per_second": 10, "burst": 100, "requests_per_minute": 60,
                     "max_wait_ms": 500, "refund_unused": true, "global": true}],
          "max_tenants": 100, "cas_max_retries": 8, "on_store_error": "deny",
          "breaker": {"keys": ["cluster", "model"], "failure_threshold": 3, "window_ms": 30000,
            "failure_rate_percent": 50, "min_requests": 10, "recovery_ms": 1000,
            "backoff_multiplier": 1.5, "max_recovery_ms": 60000, "half_open_max_calls": 2,
            "half_open_successes_to_close": 1, "probe_timeout_ms": 5000,
            "failure_statuses": [[500, 599]], "count_429": true, "count_incomplete_streams": true,
            "route_header": "x-route", "cluster_fallbacks": {"a": {"cluster": "b", "route": "fb"}},
            "model_fallbacks": {"m1": "m2"}, "max_fallback_hops": 2, "max_keys": 50},
          "quota": {"cluster": "webdis", "authority": "webdis", "timeout_ms": 80,
            "monthly_limit": 1000, "model_limits": {"m1": 10}, "on_failure": "open",
            "clamp_output": true, "tenants": {"t": {"monthly_limit": 5, "model_limits": {"m1": 2},
            "on_failure": "closed", "clamp_output": false}},
            "weights": {"m1": {"input": 1, "output": 4, "cached_input": 0.5, "reasoning": 4}},
            "month_offset_minutes": 540, "grace_seconds": 60, "idempotency_window_s": 0,
            "exhausted_recheck_s": 5, "exhausted_below": 10, "inject_stream_usage": false,
            "shim_breaker": {"failure_threshold": 2, "window_ms": 1000, "recovery_ms": 500},
            "settle_retry_ms": 100, "settle_max_attempts": 3, "clock_skew_s": 0},
          "global_buckets": {"cluster": "webdis", "authority": "webdis", "timeout_ms": 80,
            "on_failure": "closed",
            "shim_breaker": {"failure_threshold": 2, "window_ms": 1000, "recovery_ms": 500}}
        }"#;
        let c = parse(every.as_bytes()).unwrap();
        assert_eq!(c.on_store_error, StoreFailure::Deny);
        assert!(c.rules[0].refund_unused);
        assert_eq!(c.quota.unwrap().exhausted_below, 10);
        assert_eq!(c.global.unwrap().on_failure, GlobalFailure::Closed);
    }

    #[test]
    fn breaker_section_is_validated_naming_the_field() {
        let base =
            |b: &str| format!(r#"{{"breaker":{b},"rules":[{{"tokens_per_second":1,"burst":1}}]}}"#);
        let c = parse_str(&base(
            r#"{"failure_threshold":2,"model_fallbacks":{"a":"b"},
            "cluster_fallbacks":{"p":{"cluster":"q","route":"fallback"}}}"#,
        ))
        .unwrap();
        let b = c.breaker.unwrap();
        assert_eq!(b.cfg.failure_threshold, 2);
        assert_eq!(b.model_fallback("a"), Some("b"));
        assert_eq!(b.cluster_fallback("p").unwrap().to, "q");
        assert!(b.keys.cluster && b.keys.model);
        let e = parse_str(&base(r#"{"half_open_max_calls":0}"#)).unwrap_err();
        assert_eq!(e.field, "breaker.half_open_max_calls");
        let e = parse_str(&base(r#"{"failure_statuses":[[400,499]]}"#)).unwrap_err();
        assert!(e.field.starts_with("breaker.failure_statuses"), "{e}");
        let e = parse_str(&base(r#"{"keys":["route"]}"#)).unwrap_err();
        assert_eq!(e.field, "breaker.keys[0]");
        let e = parse_str(&base(r#"{"model_fallbacks":{"a":"a"}}"#)).unwrap_err();
        assert_eq!(e.field, "breaker.model_fallbacks.a");
        let e = parse_str(&base(r#"{"recovery_msec":1}"#)).unwrap_err();
        assert_eq!(e.field, "breaker.recovery_msec");
    }

    #[test]
    fn bad_header_names_and_duplicate_rule_names_are_refused() {
        assert_eq!(
            parse_str(r#"{"tenant_header":"x y","rules":[{"tokens_per_second":1,"burst":1}]}"#)
                .unwrap_err()
                .field,
            "tenant_header"
        );
        let e = parse_str(
            r#"{"rules":[{"name":"a","tokens_per_second":1,"burst":1},{"name":"a","tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "rules[1].name");
    }

    /// `parse(config)`'s error as the log line shows it (after `invalid configuration: `).
    fn refusal(config: &str) -> String {
        match parse_str(config) {
            Ok(_) => panic!("accepted: {config}"),
            Err(e) => e.to_string(),
        }
    }

    /// MIN's rule with `extra` fields, and top-level `top` fields.
    fn with(extra: &str, top: &str) -> String {
        format!(r#"{{"rules":[{{"tokens_per_second":10,"burst":100{extra}}}]{top}}}"#)
    }

    #[test]
    fn shape_errors_name_the_full_path_of_the_field_in_every_section() {
        for (config, line) in [
            (
                r#"{"rules":[{"tokens_per_second":"10","burst":100}]}"#.to_string(),
                r#"rules[0].tokens_per_second: invalid type: string "10", expected a number"#,
            ),
            (
                with("", r#","models":{"a":{"default_max_tokens":"x"}}"#),
                r#"models.a.default_max_tokens: invalid type: string "x", expected an integer >= 0"#,
            ),
            (
                with(r#","max_wait_ms":-1"#, ""),
                "rules[0].max_wait_ms: invalid value: integer `-1`, expected an integer >= 0",
            ),
            (
                with(r#","max_wait_ms":1.5"#, ""),
                "rules[0].max_wait_ms: invalid type: floating point `1.5`, expected an integer >= 0",
            ),
            (
                with(r#","refund_unused":1"#, ""),
                "rules[0].refund_unused: invalid type: integer `1`, expected a boolean",
            ),
            (
                with("", r#","max_body_bytes":-1"#),
                "max_body_bytes: invalid value: integer `-1`, expected an integer >= 0",
            ),
            (
                with("", r#","max_tenants":-1"#),
                "max_tenants: invalid value: integer `-1`, expected an integer between 0 and 4294967295",
            ),
            (
                with("", r#","invalid_body":{"action":"charge","tokens":-1}"#),
                "invalid_body.tokens: invalid value: integer `-1`, expected an integer >= 0",
            ),
            (
                with("", r#","default_output":{"max_tokens_cap":-1}"#),
                "default_output.max_tokens_cap: invalid value: integer `-1`, expected an integer >= 0",
            ),
            (
                with("", r#","quota":{"tenants":{"t":{"model_limits":{"m":-1}}}}"#),
                "quota.tenants.t.model_limits.m: invalid value: integer `-1`, expected an integer >= 0",
            ),
            (
                with("", r#","quota":{"weights":{"m":{"input":"x"}}}"#),
                r#"quota.weights.m.input: invalid type: string "x", expected a number"#,
            ),
            (
                with("", r#","quota":{"month_offset_minutes":60.5}"#),
                "quota.month_offset_minutes: invalid type: floating point `60.5`, expected an integer between -2147483648 and 2147483647",
            ),
            (
                with("", r#","global_buckets":{"shim_breaker":{"window_ms":-3}}"#),
                "global_buckets.shim_breaker.window_ms: invalid value: integer `-3`, expected an integer >= 0",
            ),
            (
                with("", r#","breaker":{"cluster_fallbacks":{"a":{"cluster":"b","route":1}}}"#),
                "breaker.cluster_fallbacks.a.route: invalid type: integer `1`, expected a string",
            ),
            (
                with("", r#","breaker":{"keys":"cluster"}"#),
                r#"breaker.keys: invalid type: string "cluster", expected an array"#,
            ),
            (
                with("", r#","breaker":{"failure_threshold":0}"#),
                "breaker.failure_threshold: must be >= 1",
            ),
            (
                r#"{"rules":[1]}"#.to_string(),
                "rules[0]: invalid type: integer `1`, expected a rule object",
            ),
            (
                r#"{"rules":{}}"#.to_string(),
                "rules: invalid type: map, expected an array",
            ),
            (
                "null".to_string(),
                "configuration: invalid type: null, expected the plugin configuration as a JSON object",
            ),
        ] {
            assert_eq!(refusal(&config), line, "{config}");
        }
    }

    #[test]
    fn unknown_repeated_and_missing_fields_are_named_with_their_path() {
        let foo = refusal(&with(r#","foo":1"#, ""));
        assert!(
            foo.starts_with("rules[0].foo: unknown field `foo`, expected one of `name`, "),
            "{foo}"
        );
        assert_eq!(
            refusal(&with(r#","burst":1"#, "")),
            "rules[0].burst: is given more than once"
        );
        assert_eq!(
            refusal(&with("", r#","rules":[]"#)),
            "rules: is given more than once"
        );
        assert_eq!(
            refusal(&with("", r#","models":{"a":{},"b":{},"a":{}}"#)),
            "models.a: is given more than once"
        );
        assert_eq!(
            refusal(&with(
                "",
                r#","quota":{"tenants":{"t":{"model_limits":{"m":1,"m":2}}}}"#
            )),
            "quota.tenants.t.model_limits.m: is given more than once"
        );
        assert_eq!(
            refusal(&with(
                "",
                r#","breaker":{"model_fallbacks":{"a":"b","a":"c"}}"#
            )),
            "breaker.model_fallbacks.a: is given more than once"
        );
        assert_eq!(
            refusal(&with(
                "",
                r#","breaker":{"cluster_fallbacks":{"a":{"cluster":"b"}}}"#
            )),
            "breaker.cluster_fallbacks.a.route: is required"
        );
        assert_eq!(
            refusal(&with("", r#","invalid_body":{"tokens":1}"#)),
            "invalid_body.action: is required"
        );
        let probe = refusal(&with("", r#","breaker":{"probe_permits":2}"#));
        assert!(
            probe.starts_with("breaker.probe_permits: unknown field `probe_permits`"),
            "{probe}"
        );
    }

    #[test]
    fn json_syntax_errors_keep_the_position_and_the_path_reached() {
        assert_eq!(
            refusal(r#"{"rules":[{"tokens_per_second":10,"burst":100,}]}"#),
            "rules[0]: trailing comma at line 1 column 47"
        );
        assert_eq!(
            refusal(&format!("{MIN} x")),
            "configuration: trailing characters at line 1 column 50"
        );
        assert_eq!(
            refusal(""),
            "configuration: EOF while parsing a value at line 1 column 0"
        );
        assert_eq!(
            refusal("[1]"),
            "configuration[0]: invalid type: integer `1`, expected a string"
        );
    }

    #[test]
    fn tenant_patterns_that_can_never_match_a_tenant_id_are_refused() {
        for tenant in ["team-*", "a b", "*a", "ü"] {
            assert_eq!(
                refusal(&with(&format!(r#","tenant":"{tenant}""#), "")),
                format!("rules[0].tenant: '{tenant}' can never match a tenant: use \"*\" or one exact tenant id, 1-128 characters from [A-Za-z0-9._:@-] (tenant patterns are not globs)")
            );
        }
        let long = "a".repeat(129);
        assert!(refusal(&with(&format!(r#","tenant":"{long}""#), ""))
            .starts_with("rules[0].tenant: 'aaaa"));
        let ok = "a".repeat(128);
        for tenant in ["*", "key:0123456789abcdef", "a.b_c:d@e-f", ok.as_str()] {
            parse_str(&with(&format!(r#","tenant":"{tenant}""#), "")).unwrap();
        }
    }

    #[test]
    fn default_tenant_must_be_a_valid_tenant_id() {
        assert_eq!(
            refusal(&with("", r#","default_tenant":"a b""#)),
            "default_tenant: 'a b' is not a valid tenant id: 1-128 characters from [A-Za-z0-9._:@-]"
        );
        assert_eq!(
            refusal(&with("", r#","default_tenant":" ""#)),
            "default_tenant: must not be empty (omit it for 401)"
        );
        let c = parse_str(&with("", r#","default_tenant":"anon@x""#)).unwrap();
        assert_eq!(c.default_tenant.as_deref(), Some("anon@x"));
        assert_eq!(
            refusal(&with(
                "",
                r#","quota":{"cluster":"w","monthly_limit":1,"tenants":{"a/b":{}}}"#
            )),
            "quota.tenants.a/b: is not a valid tenant id: 1-128 characters from [A-Za-z0-9._:@-]"
        );
    }

    #[test]
    fn rule_names_are_limited_to_a_key_safe_charset() {
        for name in ["a b", "a:b", "a/b", "", "{x}", "é"] {
            assert_eq!(
                refusal(&with(&format!(r#","name":"{name}""#), "")),
                format!("rules[0].name: '{name}' is not a valid rule name: 1-64 characters from [A-Za-z0-9._-]")
            );
        }
        let long = "n".repeat(65);
        assert!(
            refusal(&with(&format!(r#","name":"{long}""#), "")).starts_with("rules[0].name: 'nnn")
        );
        for name in [
            "gpt-4.1",
            "claude-sonnet-4.5",
            "A_b-9",
            "n".repeat(64).as_str(),
        ] {
            parse_str(&with(&format!(r#","name":"{name}""#), "")).unwrap();
        }
    }

    #[test]
    fn a_star_is_only_accepted_alone_or_once_at_the_end_of_a_model_pattern() {
        for pattern in ["gpt-*-mini", "**", "*gpt", "gpt**", "a*b*"] {
            assert_eq!(
                refusal(&with(&format!(r#","model":"{pattern}""#), "")),
                format!("rules[0].model: '{pattern}' is not a model pattern: use an exact name, \"prefix*\" or \"*\" ('*' only once, at the end)")
            );
            assert_eq!(
                refusal(&with("", &format!(r#","models":{{"{pattern}":{{}}}}"#))),
                format!("models.{pattern}: '{pattern}' is not a model pattern: use an exact name, \"prefix*\" or \"*\" ('*' only once, at the end)")
            );
        }
        let c = parse_str(&with(
            r#","model":"gpt-4*""#,
            r#","models":{"*":{},"o3*":{},"x":{}}"#,
        ))
        .unwrap();
        assert_eq!(c.rules[0].model, ModelMatch::Prefix("gpt-4".into()));
    }

    #[test]
    fn a_rule_shadowed_by_an_earlier_one_is_refused_naming_both() {
        let rules = |list: &str| format!(r#"{{"rules":[{list}]}}"#);
        let r = |tenant: &str, model: &str| {
            format!(r#"{{"tenant":"{tenant}","model":"{model}","tokens_per_second":1,"burst":1}}"#)
        };
        for (earlier, later) in [
            (r("*", "*"), r("*", "*")),
            (r("*", "*"), r("t", "gpt-4.1")),
            (r("t", "gpt-4.1"), r("t", "gpt-4.1")),
            (r("*", "gpt-*"), r("t", "gpt-4*")),
            (r("*", "gpt-*"), r("*", "gpt-4.1")),
            (r("t", "*"), r("t", "gpt-*")),
        ] {
            let e = parse_str(&rules(&format!("{earlier},{later}"))).unwrap_err();
            assert_eq!(e.field, "rules[1]", "{earlier} {later}");
            assert!(
                e.reason.starts_with("can never match: rules[0] (tenant")
                    && e.reason.ends_with(") matches every request it would"),
                "{e}"
            );
        }
        assert_eq!(
            refusal(&rules(&format!(
                "{},{},{}",
                r("a", "*"),
                r("*", "gpt-*"),
                r("*", "gpt-4o")
            ))),
            r#"rules[2]: can never match: rules[1] (tenant "*", model "gpt-*") matches every request it would"#
        );
        // Still reachable: a narrower rule after a wider one on the other axis, or a wider one last.
        for (earlier, later) in [
            (r("t", "*"), r("*", "*")),
            (r("*", "gpt-4.1"), r("*", "gpt-*")),
            (r("*", "gpt-4*"), r("*", "gpt-*")),
            (r("t", "gpt-*"), r("u", "gpt-*")),
            (r("*", "gpt-4.1"), r("t", "*")),
        ] {
            parse_str(&rules(&format!("{earlier},{later}"))).unwrap();
        }
    }

    #[test]
    fn refusal_lines_stay_on_one_line_whatever_the_config_holds() {
        let line = refusal(&with(r#","name":"a\nb""#, ""));
        assert_eq!(
            line,
            "rules[0].name: 'a\\nb' is not a valid rule name: 1-64 characters from [A-Za-z0-9._-]"
        );
        assert!(!refusal(&with("", r#","models":{"a\nb":{"x":1}}"#)).contains('\n'));
    }

    #[test]
    fn rule_numbers_are_refused_outside_their_stated_range() {
        for (extra, line) in [
            (
                r#","tokens_per_second":1e-300"#,
                "rules[0].tokens_per_second: must be between 0.001 and 1e15, got 1e-300",
            ),
            (
                r#","tokens_per_second":0.0009"#,
                "rules[0].tokens_per_second: must be between 0.001 and 1e15, got 9e-4",
            ),
            (
                r#","tokens_per_second":-5"#,
                "rules[0].tokens_per_second: must be between 0.001 and 1e15, got -5",
            ),
            (
                r#","tokens_per_second":2e15"#,
                "rules[0].tokens_per_second: must be between 0.001 and 1e15, got 2e15",
            ),
            (
                r#","burst":1e16"#,
                "rules[0].burst: must be between 1 and 1e15, got 1e16",
            ),
            (
                r#","burst":0.5"#,
                "rules[0].burst: must be between 1 and 1e15, got 0.5",
            ),
            (
                r#","requests_per_minute":0.5"#,
                "rules[0].requests_per_minute: must be between 1 and 1e15, got 0.5",
            ),
            (
                r#","requests_per_minute":1e300"#,
                "rules[0].requests_per_minute: must be between 1 and 1e15, got 1e300",
            ),
            (
                r#","max_wait_ms":60001"#,
                "rules[0].max_wait_ms: must be between 0 and 60000, got 60001",
            ),
            (
                r#","tokens_per_second":0.001,"burst":2000000"#,
                "rules[0].tokens_per_second: 0.001 refills the burst of 2000000 tokens in 2000000000 s, longer than the 1000000000 s (about 31 years) supported: use at least 0.002",
            ),
        ] {
            // The rule is built field by field: a repeated field would be refused as such.
            let mut fields = vec![("tokens_per_second", "10"), ("burst", "100")];
            for kv in extra.trim_start_matches(',').split(',') {
                let (k, v) = kv.split_once(':').unwrap();
                let k = k.trim_matches('"');
                match fields.iter_mut().find(|(name, _)| *name == k) {
                    Some(slot) => slot.1 = v,
                    None => fields.push((k, v)),
                }
            }
            let rule: Vec<String> = fields.iter().map(|(k, v)| format!(r#""{k}":{v}"#)).collect();
            let config = format!(r#"{{"rules":[{{{}}}]}}"#, rule.join(","));
            assert_eq!(refusal(&config), line, "{config}");
        }
        // The edges are accepted.
        for rule in [
            r#"{"tokens_per_second":0.001,"burst":1000000}"#,
            r#"{"tokens_per_second":1e15,"burst":1e15,"requests_per_minute":1e15}"#,
            r#"{"tokens_per_second":1,"burst":1,"requests_per_minute":1,"max_wait_ms":60000}"#,
        ] {
            parse_str(&format!(r#"{{"rules":[{rule}]}}"#)).unwrap();
        }
    }

    #[test]
    fn every_bounded_setting_states_its_range_in_the_refusal() {
        let many: Vec<String> = (0..257)
            .map(|i| format!(r#"{{"tenant":"t{i}","tokens_per_second":1,"burst":1}}"#))
            .collect();
        let quota = |extra: &str| {
            with(
                "",
                &format!(r#","quota":{{"cluster":"w","monthly_limit":1{extra}}}"#),
            )
        };
        for (config, line) in [
            (
                format!(r#"{{"rules":[{}]}}"#, many.join(",")),
                "rules: must hold between 1 and 256 rules, got 257",
            ),
            (
                r#"{"rules":[]}"#.to_string(),
                "rules: must hold between 1 and 256 rules, got 0",
            ),
            (
                with("", r#","max_body_bytes":1073741825"#),
                "max_body_bytes: must be between 1 and 1073741824 (1 GiB), got 1073741825",
            ),
            (
                with("", r#","max_body_bytes":0"#),
                "max_body_bytes: must be between 1 and 1073741824 (1 GiB), got 0",
            ),
            (
                with("", r#","max_tenants":1000001"#),
                "max_tenants: must be between 1 and 1000000, got 1000001",
            ),
            (
                with("", r#","cas_max_retries":0"#),
                "cas_max_retries: must be between 1 and 1000, got 0",
            ),
            (
                with("", r#","default_output":{"max_tokens_cap":0}"#),
                "default_output.max_tokens_cap: must be >= 1",
            ),
            (
                with("", r#","breaker":{"max_fallback_hops":9}"#),
                "breaker.max_fallback_hops: must be between 0 and 8, got 9",
            ),
            (
                with("", r#","breaker":{"max_keys":100001}"#),
                "breaker.max_keys: must be between 1 and 100000, got 100001",
            ),
            (
                with("", r#","global_buckets":{"cluster":"w","timeout_ms":60001}"#),
                "global_buckets.timeout_ms: must be between 1 and 60000, got 60001",
            ),
            (
                quota(r#","timeout_ms":0"#),
                "quota.timeout_ms: must be between 1 and 60000, got 0",
            ),
            (
                with("", r#","quota":{"cluster":"w","monthly_limit":9007199254740992}"#),
                "quota.monthly_limit: must be between 1 and 9007199254740991 (2^53 - 1), got 9007199254740992",
            ),
            (
                quota(r#","model_limits":{"m":0}"#),
                "quota.model_limits.m: must be between 1 and 9007199254740991 (2^53 - 1), got 0",
            ),
            (
                quota(r#","month_offset_minutes":-841"#),
                "quota.month_offset_minutes: must be between -840 and 840, got -841",
            ),
            (
                quota(r#","settle_max_attempts":1001"#),
                "quota.settle_max_attempts: must be between 1 and 1000, got 1001",
            ),
            (
                quota(r#","settle_retry_ms":9"#),
                "quota.settle_retry_ms: must be between 10 and 60000, got 9",
            ),
            (
                quota(r#","settle_retry_ms":60001"#),
                "quota.settle_retry_ms: must be between 10 and 60000, got 60001",
            ),
            (
                quota(r#","exhausted_recheck_s":0"#),
                "quota.exhausted_recheck_s: must be >= 1, got 0",
            ),
            (
                quota(r#","exhausted_below":0"#),
                "quota.exhausted_below: must be >= 1, got 0",
            ),
            (
                quota(r#","grace_seconds":315360001"#),
                "quota.grace_seconds: must be between 0 and 315360000, got 315360001",
            ),
            (
                quota(r#","idempotency_window_s":315360001"#),
                "quota.idempotency_window_s: must be between 0 and 315360000, got 315360001",
            ),
            (
                quota(r#","clock_skew_s":-3153600001"#),
                "quota.clock_skew_s: must be between -3153600000 and 3153600000 (100 years), got -3153600001",
            ),
            (
                quota(r#","weights":{"m":{"output":-1}}"#),
                "quota.weights.m.output: must be a number >= 0",
            ),
        ] {
            assert_eq!(refusal(&config), line, "{config}");
        }
    }

    #[test]
    fn a_fixed_charge_for_unreadable_bodies_above_every_burst_is_refused() {
        let config = |tokens: u64| {
            format!(
                r#"{{"invalid_body":{{"action":"charge","tokens":{tokens}}},
                    "rules":[{{"tenant":"a","tokens_per_second":1,"burst":300}},
                             {{"tokens_per_second":1,"burst":200}}]}}"#
            )
        };
        assert_eq!(
            refusal(&config(301)),
            "invalid_body.tokens: 301 is larger than the burst of every rule (largest 300): every request with an unreadable body would be refused with 413"
        );
        assert_eq!(
            parse_str(&config(300)).unwrap().invalid_body,
            InvalidBody::Charge(300)
        );
    }
}
