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
//! {"api_key_tenants": true,
//!  "models": {"gpt-4.1": {"default_max_tokens": 4096, "max_tokens_cap": 32768}},
//!  "rules": [{"model": "gpt-4.1", "tokens_per_second": 300000, "burst": 2000000, "requests_per_minute": 600},
//!            {"model": "*", "tokens_per_second": 1000, "burst": 20000}]}
//! ```
//!
//! One file per section, each with its raw serde structs, its validated types and its step of
//! `validate()`: `top.rs` (tenant, model and body fields, shared-store bounds), `rules.rs`, `models.rs`
//! (`default_output`, `models`), `breaker.rs`, `quota.rs`, `global.rs` (`global_buckets`), `paths.rs`
//! (`unmetered_paths`), `families.rs` (`azure_openai`); `shim.rs`
//! holds the Webdis shim settings `quota` and `global_buckets` share, `fields.rs` the value checks every
//! section uses and `shape.rs` the serde-level errors. Every public type is re-exported here
//! (`crate::config::Rule`, `crate::config::QuotaSettings`, …).

mod breaker;
mod budgets;
mod fair;
mod families;
mod fields;
mod global;
mod groups;
mod identity;
mod limits;
mod models;
mod paths;
mod quota;
mod rules;
mod shape;
mod shim;
mod top;

pub use breaker::{BreakerKeys, BreakerMode, BreakerSettings, ClusterFallback};
pub use budgets::{Budget, Budgets, MAX_BUDGETS, MICRO, TOKENS};
pub use fair::{FairShare, ShareBy, MAX_DOWNGRADE_HOPS};
pub use families::{AzureOpenAi, UnknownDeployment, MAX_DEPLOYMENTS};
pub use global::{GlobalFailure, GlobalSettings};
pub use groups::{GroupLevel, MAX_GROUP_LEVELS};
pub use identity::{ClaimPath, Claims, DEFAULT_JWT_KEY, DEFAULT_JWT_NAMESPACE, MAX_CLAIM_SEGMENTS};
pub use models::{DefaultModel, DEFAULT_OUTPUT};
pub use paths::{glob, Unmetered, BUILT_IN as UNMETERED_BUILT_IN};
pub use quota::{
    AbandonedCharge, BatchSettings, LeaseSettings, QuotaFailure, QuotaSettings, TenantQuota,
};
pub use rules::{ModelMatch, Rule, Scope, MAX_RULES, MAX_RULE_NAME_LEN, MAX_WAIT_MS_LIMIT};
pub use top::{
    AboveCap, InvalidBody, StoreFailure, DEFAULT_MAX_BODY_BYTES, DEFAULT_MODEL_HEADER,
    MAX_BODY_BYTES_LIMIT,
};

use crate::estimate::OutputLimits;
use serde::Deserialize;
use shape::UniqueMap;
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

/// The validated runtime configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where verified JWT claims are read and which names the tenant (`tenant_claim`, `jwt_metadata`).
    pub claims: Claims,
    /// Header carrying the tenant id (only with `trusted_headers`).
    pub tenant_header: Option<String>,
    /// `trusted_headers.set_by`: who sets the identity headers (`None`: headers are no identity).
    pub trusted_headers: Option<String>,
    /// Send the identity headers on upstream (`forward_identity_headers`; default false: removed).
    pub forward_identity_headers: bool,
    /// What a body without a model is charged as (`default_model`).
    pub default_model: DefaultModel,
    /// Group levels, outermost first (org, team), each from a trusted header (`group_header` is one
    /// level named `group`).
    pub groups: Vec<GroupLevel>,
    /// Tenants' fixed groups (one per level), which their headers cannot change.
    pub tenant_groups:
        std::collections::HashMap<String, Vec<Option<String>>, crate::store::hash::FnvBuild>,
    /// Derive the tenant from a hashed API key when the header is absent.
    pub api_key_tenants: bool,
    /// The only API keys accepted (SHA-256 → tenant); `None`: any key names its own `key:` tenant.
    pub api_keys: Option<crate::identity::ApiKeys>,
    /// Tenant used when none is found (`None` → 401).
    pub default_tenant: Option<String>,
    /// Header naming the model in the headers phase: a hint that can only speed up a refusal (the
    /// body's model decides).
    pub model_header: Option<String>,
    /// Largest request body accepted on LLM paths.
    pub max_body_bytes: usize,
    /// Policy for bodies that are not valid JSON.
    pub invalid_body: InvalidBody,
    /// What to do with an output limit above the model's `max_tokens_cap`.
    pub output_above_cap: AboveCap,
    /// Write the reserved output limit into a body that has none (`output_limit_absent: "write"`), so
    /// that the provider never generates more than was reserved.
    pub write_absent_limit: bool,
    /// Output reservation for models without an entry in `models`.
    pub default_output: OutputLimits,
    /// Per-model output reservation.
    pub models: Vec<(ModelMatch, OutputLimits)>,
    /// Bucket rules, first match wins.
    pub rules: Vec<Rule>,
    /// Limits: every matching one applies.
    pub limits: Vec<Rule>,
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
    /// What happens to requests that are not metered LLM calls (`unmetered_paths`).
    pub unmetered: Unmetered,
    /// Refuse OpenAI Responses requests with `background: true` (`background_responses: "refuse"`, the
    /// default): the provider generates after the response, which carries no usage.
    pub refuse_background: bool,
    /// Azure OpenAI deployments → models (`azure_openai`).
    pub azure_openai: AzureOpenAi,
}

impl Config {
    /// Output limits for a model (first matching entry of `models`, else `default_output`).
    pub fn output_limits(&self, model: Option<&str>) -> OutputLimits {
        model
            .and_then(|m| self.models.iter().find(|(mm, _)| mm.matches(m)))
            .map(|(_, l)| *l)
            .unwrap_or(self.default_output)
    }

    /// Rule or limit `i` of one index space: `rules` first, then `limits`.
    pub fn rule(&self, i: usize) -> Option<&Rule> {
        match self.rules.get(i) {
            Some(r) => Some(r),
            None => self.limits.get(i.checked_sub(self.rules.len())?),
        }
    }

    /// What applies to a request, in the index space of [`Config::rule`]: the first matching rule, then
    /// every matching limit.
    pub fn applicable(&self, tenant: &str, groups: &[Option<String>], model: &str) -> Vec<usize> {
        let mut out: Vec<usize> = self.rule_for(tenant, model).into_iter().collect();
        let base = self.rules.len();
        for (j, l) in self.limits.iter().enumerate() {
            if l.applies(tenant, groups, model) {
                out.push(base + j);
            }
        }
        out
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

    /// The model a request refused by the limit or budget named `name` goes to instead
    /// (`when_exhausted`).
    pub fn downgrade_of(&self, name: &str) -> Option<&str> {
        self.rules
            .iter()
            .chain(self.limits.iter())
            .find(|r| r.name == name)
            .and_then(|r| r.when_exhausted.as_deref())
            .or_else(|| {
                self.quota
                    .as_ref()?
                    .budgets
                    .list
                    .iter()
                    .find(|b| b.name == name)?
                    .when_exhausted
                    .as_deref()
            })
    }

    /// True when some limit or budget sends what it refuses to another model (`when_exhausted`): the
    /// body may then be rewritten after a refusal.
    pub fn downgrades(&self) -> bool {
        self.rules
            .iter()
            .chain(self.limits.iter())
            .any(|r| r.when_exhausted.is_some())
            || self
                .quota
                .as_ref()
                .is_some_and(|q| q.budgets.list.iter().any(|b| b.when_exhausted.is_some()))
    }

    /// True when any rule shapes (needs the root tick).
    pub fn shaping(&self) -> bool {
        self.rules.iter().any(|r| r.max_wait_ms > 0)
    }

    /// What the configuration enables, for the load log line (`configured: …`) and `tokengate check`:
    /// `2 bucket rules, 5 limits, quota (3 budgets, leases), global buckets, breaker`.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} bucket rules, {} limits",
            self.rules.len(),
            self.limits.len()
        );
        if let Some(q) = &self.quota {
            let mut parts = Vec::new();
            if q.default.monthly_limit == 0 {
                parts.push("no token quota".to_string());
            }
            if !q.budgets.list.is_empty() {
                parts.push(format!("{} budgets", q.budgets.list.len()));
            }
            if q.lease.is_some() {
                parts.push("leases".to_string());
            }
            s.push_str(", quota");
            if !parts.is_empty() {
                s.push_str(&format!(" ({})", parts.join(", ")));
            }
        }
        if self.global.is_some() {
            s.push_str(", global buckets");
        }
        if self.breaker.is_some() {
            s.push_str(", breaker");
        }
        s
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "the plugin configuration as a JSON object"
)]
struct RawConfig {
    tenant_header: Option<String>,
    tenant_claim: Option<identity::RawClaim>,
    jwt_metadata: Option<identity::RawJwtMetadata>,
    trusted_headers: Option<identity::RawTrusted>,
    forward_identity_headers: Option<bool>,
    default_model: Option<models::RawDefaultModel>,
    group_header: Option<String>,
    groups: Option<Vec<groups::RawGroupLevel>>,
    tenant_groups: Option<UniqueMap<UniqueMap<String>>>,
    api_key_tenants: Option<bool>,
    api_keys: Option<UniqueMap<Vec<String>>>,
    default_tenant: Option<String>,
    model_header: Option<String>,
    max_body_bytes: Option<u64>,
    invalid_body: Option<top::RawInvalidBody>,
    output_above_cap: Option<String>,
    output_limit_absent: Option<String>,
    default_output: Option<models::RawOutput>,
    #[serde(default)]
    models: UniqueMap<models::RawOutput>,
    rules: Option<Vec<rules::RawRule>>,
    limits: Option<Vec<limits::RawLimit>>,
    max_tenants: Option<u32>,
    cas_max_retries: Option<u32>,
    on_store_error: Option<String>,
    breaker: Option<breaker::RawBreaker>,
    quota: Option<quota::RawQuota>,
    global_buckets: Option<global::RawGlobal>,
    unmetered_paths: Option<paths::RawUnmetered>,
    background_responses: Option<String>,
    azure_openai: Option<families::RawAzure>,
}

/// Parses and validates the plugin configuration.
pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let raw: RawConfig = serde_path_to_error::deserialize(&mut de).map_err(shape::shape_error)?;
    // Text after the JSON object (what serde_json::from_slice checks last).
    de.end().map_err(|e| err("configuration", e.to_string()))?;
    validate(raw)
}

/// The meaning stage: each section in turn (the first refusal is reported, in this order), then what
/// sections must agree on.
fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    let RawConfig {
        tenant_claim,
        jwt_metadata,
        trusted_headers,
        forward_identity_headers,
        default_model,
        tenant_header,
        group_header,
        groups,
        tenant_groups,
        api_key_tenants,
        api_keys,
        default_tenant,
        model_header,
        max_body_bytes,
        invalid_body,
        output_above_cap,
        output_limit_absent,
        default_output,
        models,
        rules,
        limits,
        max_tenants,
        cas_max_retries,
        on_store_error,
        breaker,
        quota,
        global_buckets,
        unmetered_paths,
        background_responses,
        azure_openai,
    } = raw;
    let sources = top::sources(tenant_header, model_header, api_key_tenants, default_tenant)?;
    let api_keys = api_keys
        .map(|k| top::api_keys(k, sources.api_key_tenants))
        .transpose()?;
    let max_body_bytes = top::max_body_bytes(max_body_bytes)?;
    let invalid_body = top::invalid_body(invalid_body)?;
    let output_above_cap = top::above_cap(output_above_cap)?;
    let write_absent_limit = top::write_absent_limit(output_limit_absent)?;
    let (default_output, models) = models::models(default_output.as_ref(), &models)?;
    let shorthand = group_header.is_some();
    let groups = groups::groups(groups, group_header, tenant_groups)?;
    let claims = identity::claims(jwt_metadata, tenant_claim)?;
    let header_field = if sources.tenant_header.is_some() {
        Some("tenant_header")
    } else {
        groups
            .levels
            .iter()
            .any(|l| l.header.is_some())
            .then_some(if shorthand {
                "group_header"
            } else {
                "groups[].header"
            })
    };
    let trusted_headers = identity::trusted_headers(trusted_headers, header_field)?;
    let default_model = models::default_model(default_model)?;
    let rules = match (rules, &limits) {
        // Only limits: no first-match rule at all.
        (None, Some(l)) if !l.is_empty() => Vec::new(),
        (rules, _) => rules::rules(rules)?,
    };
    let limits = limits::limits(limits.unwrap_or_default(), &rules, &groups.levels)?;
    top::charge_fits_a_rule(invalid_body, &rules)?;
    let store = top::store(max_tenants, cas_max_retries, on_store_error)?;
    let breaker = breaker.map(breaker::breaker).transpose()?;
    let quota = quota.map(|q| quota::quota(q, &groups.levels)).transpose()?;
    let global = global_buckets.map(global::global).transpose()?;
    let unmetered = paths::unmetered(unmetered_paths)?;
    let refuse_background = top::refuse_background(background_responses)?;
    let azure_openai = families::azure(azure_openai)?;
    global::consistent(global.as_ref(), quota.as_ref(), &rules, &limits)?;
    fair::downgrades(
        &rules,
        &limits,
        quota.as_ref().map_or(&[], |q| &q.budgets.list),
    )?;
    if let Some(q) = &quota {
        for (i, b) in q.budgets.list.iter().enumerate() {
            if rules.iter().chain(limits.iter()).any(|r| r.name == b.name) {
                return Err(err(
                    format!("quota.budgets[{i}].name"),
                    format!(
                        "'{}' is also a rule or limit name: x-tokengate-limit must name one thing",
                        b.name
                    ),
                ));
            }
        }
    }
    let reads_responses = breaker.is_some()
        || quota.is_some()
        || rules.iter().chain(limits.iter()).any(|r| r.refund_unused);
    Ok(Config {
        claims,
        trusted_headers,
        forward_identity_headers: forward_identity_headers.unwrap_or(false),
        default_model,
        azure_openai,
        unmetered,
        refuse_background,
        reads_responses,
        quota,
        global,
        breaker,
        on_store_error: store.on_store_error,
        tenant_header: sources.tenant_header,
        groups: groups.levels,
        tenant_groups: groups.tenants,
        api_key_tenants: sources.api_key_tenants,
        api_keys,
        default_tenant: sources.default_tenant,
        model_header: sources.model_header,
        max_body_bytes,
        invalid_body,
        output_above_cap,
        write_absent_limit,
        default_output,
        models,
        rules,
        limits,
        max_tenants: store.max_tenants,
        cas_max_retries: store.cas_max_retries,
    })
}

/// Helpers shared by the config tests of every section.
#[cfg(test)]
mod testing {
    use super::{parse, Config, ConfigError};

    pub(super) fn parse_str(s: &str) -> Result<Config, ConfigError> {
        parse(s.as_bytes())
    }

    pub(super) const MIN: &str = r#"{"rules":[{"tokens_per_second":10,"burst":100}]}"#;

    /// `parse(config)`'s error as the log line shows it (after `invalid configuration: `).
    pub(super) fn refusal(config: &str) -> String {
        match parse_str(config) {
            Ok(_) => panic!("accepted: {config}"),
            Err(e) => e.to_string(),
        }
    }

    /// MIN's rule with `extra` fields, and top-level `top` fields.
    pub(super) fn with(extra: &str, top: &str) -> String {
        format!(r#"{{"rules":[{{"tokens_per_second":10,"burst":100{extra}}}]{top}}}"#)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

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
    fn the_load_line_counts_limits_not_only_bucket_rules() {
        let only_limits = parse_str(
            r#"{"limits": [{"tokens_per_second": 1, "burst": 1}, {"max_in_flight": 2}],
                "quota": {"cluster": "w", "currency": "USD", "prices": {"*": {"input": 1, "output": 1}},
                  "budgets": [{"name": "b", "scope": "shared", "monthly_limit": 1}], "lease": {}}}"#,
        )
        .unwrap();
        assert_eq!(
            only_limits.summary(),
            "0 bucket rules, 2 limits, quota (no token quota, 1 budgets, leases)"
        );
        assert_eq!(
            parse_str(MIN).unwrap().summary(),
            "1 bucket rules, 0 limits"
        );
    }

    #[test]
    fn wrong_types_are_refused() {
        assert!(parse_str(r#"{"rules":[{"tokens_per_second":"fast","burst":1}]}"#).is_err());
        assert!(parse_str(r#"[1,2]"#).is_err());
        assert!(parse_str("not json").is_err());
        assert!(parse_str("").is_err());
    }

    #[test]
    fn the_readme_sample_and_a_config_with_every_documented_field_parse() {
        let readme = include_str!("../../README.md");
        let sample = readme
            .split("## Sample configuration")
            .nth(1)
            .and_then(|s| s.split("```json\n").nth(1))
            .and_then(|s| s.split("```").next())
            .unwrap();
        let c = parse(sample.as_bytes()).unwrap();
        assert!(c.breaker.is_some() && c.quota.is_some());
        let every = r#"{
          "tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "ext_authz"},
          "tenant_claim": "tenant", "jwt_metadata": {"namespace": "envoy.filters.http.jwt_authn", "key": "payload"},
          "forward_identity_headers": false, "default_model": {"local": "llama", "*": "gpt-4.1-mini"},
          "api_key_tenants": true, "default_tenant": "anon",
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
            "abandoned_charge": "received",
            "shim_breaker": {"failure_threshold": 2, "window_ms": 1000, "recovery_ms": 500},
            "settle_retry_ms": 100, "settle_max_attempts": 3, "clock_skew_s": 0},
          "global_buckets": {"cluster": "webdis", "authority": "webdis", "timeout_ms": 80,
            "on_failure": "closed",
            "shim_breaker": {"failure_threshold": 2, "window_ms": 1000, "recovery_ms": 500}}
        }"#;
        let c = parse(every.as_bytes()).unwrap();
        assert_eq!(c.on_store_error, StoreFailure::Deny);
        assert!(c.rules[0].refund_unused);
        let q = c.quota.unwrap();
        assert_eq!(q.exhausted_below, 10);
        assert_eq!(q.abandoned_charge, AbandonedCharge::Received);
        assert_eq!(c.global.unwrap().on_failure, GlobalFailure::Closed);
    }

    #[test]
    fn refusal_lines_stay_on_one_line_whatever_the_config_holds() {
        let line = refusal(&with(
            "",
            r#","quota":{"cluster":"w","monthly_limit":1,"abandoned_charge":"all"}"#,
        ));
        assert_eq!(
            line,
            "quota.abandoned_charge: 'all' is not one of \"reservation\", \"received\""
        );
        let line = refusal(&with(r#","name":"a\nb""#, ""));
        assert_eq!(
            line,
            "rules[0].name: 'a\\nb' is not a valid rule name: 1-64 characters from [A-Za-z0-9._-]"
        );
        assert!(!refusal(&with("", r#","models":{"a\nb":{"x":1}}"#)).contains('\n'));
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
                quota(r#","idempotency_window_s":600"#),
                "quota.idempotency_window_s: is no longer supported: a repeated Idempotency-Key is charged like any request (the provider serves every repeat), so there is no window to set; remove the field (reservations are resolved by quota.reservation_timeout_s)",
            ),
            (
                r#"{"api_keys": {"a": ["nope"]}, "rules": [{"tokens_per_second": 1, "burst": 1}]}"#.to_string(),
                "api_keys.a[0]: must be the SHA-256 of the key as 64 hex digits (printf %s \"$KEY\" | sha256sum), optionally after 'sha256:'; never the key itself",
            ),
            (
                r#"{"api_keys": {"key:x": ["sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"]}, "rules": [{"tokens_per_second": 1, "burst": 1}]}"#.to_string(),
                "api_keys.key:x: tenant ids starting with 'key:' are reserved for unlisted keys",
            ),
            (
                r#"{"api_keys": {"a": ["2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"], "b": ["2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"]}, "rules": [{"tokens_per_second": 1, "burst": 1}]}"#.to_string(),
                "api_keys.b[0]: the same key is also listed for tenant 'a'",
            ),
            (
                quota(r#","reservation_timeout_s":0"#),
                "quota.reservation_timeout_s: must be between 1 and 604800, got 0",
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
}
