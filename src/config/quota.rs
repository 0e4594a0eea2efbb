//! `quota`: monthly per-tenant limits kept in Redis behind the Webdis shim, with per-tenant and per-model
//! overrides, cost weights and the settlement settings:
//! `"quota": {"cluster": "webdis", "monthly_limit": 1000000, "model_limits": {"gpt-4.1": 500000},
//! "tenants": {"acme": {"monthly_limit": 5000000}}, "weights": {"gpt-4.1": {"output": 4}}}`.

use super::fields::{at_least, exact_model, in_range, TENANT_ID};
use super::shape::UniqueMap;
use super::shim::{shim_breaker, shim_target, RawShimBreaker};
use super::{err, ConfigError};
use crate::breaker::BreakerConfig;
use crate::quota::Weights;
use serde::Deserialize;

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
    /// Monthly limit, weighted tokens; 0: no token quota (a configuration of budgets only).
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
    /// A reservation never settled (its Envoy stopped) is charged its prompt after this long.
    pub reservation_timeout_s: u64,
    /// How long a tenant known exhausted is refused without asking Redis.
    pub exhausted_recheck_s: u64,
    /// A refused tenant with fewer weighted tokens left than this counts as exhausted.
    pub exhausted_below: u64,
    /// Add `stream_options.include_usage` to streaming requests and strip the extra chunk.
    pub inject_stream_usage: bool,
    /// What a request is charged when its client leaves after it was sent, before the provider's final
    /// usage arrived.
    pub abandoned_charge: AbandonedCharge,
    /// Breaker on the shim itself.
    pub shim_breaker: BreakerConfig,
    /// First settlement retry delay, doubled per attempt.
    pub settle_retry_ms: u64,
    /// Settlement attempts before giving up (logged and counted).
    pub settle_max_attempts: u32,
    /// Seconds added to the host clock for month arithmetic only (tests of month rollover; keep 0).
    pub clock_skew_s: i64,
    /// Leases (`quota.lease`): on unless `"lease": false` (`None`).
    pub lease: Option<LeaseSettings>,
    /// Budgets in money (`quota.budgets`, `quota.prices`).
    pub budgets: super::Budgets,
    /// Group commit of reservations (`quota.batch`): off when `None`.
    pub batch: Option<BatchSettings>,
}

/// `quota.batch`: reservations that wait at the same moment go to Redis in one script call
/// (`flow::vm::batch`). On by default; `"batch": false` turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSettings {
    /// Most reservations in one call (`max_reservations`, default 64, 1–256).
    pub max_reservations: usize,
    /// A reservation waits at most this long for the call in flight to return before it is sent in a
    /// call of its own batch (`max_wait_ms`, default 5, 1–1000).
    pub max_wait_ms: u64,
}

impl Default for BatchSettings {
    fn default() -> Self {
        BatchSettings {
            max_reservations: 64,
            max_wait_ms: 5,
        }
    }
}

/// `quota.lease`: each Envoy holds a block of a tenant's quota and spends it without a callout per
/// request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseSettings {
    /// Sizing and renewal.
    pub policy: crate::quota::lease::account::Policy,
    /// A lease not renewed for this long is resolved by Redis (its Envoy went away).
    pub ttl_s: u64,
}

impl QuotaSettings {
    /// Seconds since the epoch on the quota's clock, for month arithmetic: the host clock (`now_ns`)
    /// plus `clock_skew_s`.
    pub fn now_s(&self, now_ns: u64) -> i64 {
        i64::try_from(now_ns / 1_000_000_000)
            .unwrap_or(0)
            .saturating_add(self.clock_skew_s)
    }

    /// The settings of a tenant.
    pub fn tenant(&self, tenant: &str) -> &TenantQuota {
        self.tenants
            .iter()
            .find(|(t, _)| t == tenant)
            .map(|(_, q)| q)
            .unwrap_or(&self.default)
    }
    /// The budget an account id names (`~b:<name>:…`, see [`super::Budget::account`]).
    pub fn budget_of(&self, account: &str) -> Option<(usize, &super::Budget)> {
        let rest = account.strip_prefix("~b:")?;
        let name = rest.split(':').next()?;
        self.budgets
            .list
            .iter()
            .enumerate()
            .find(|(_, b)| b.name == name)
    }

    /// The configured monthly limit of a quota account: a budget's (micro-units), else the tenant's
    /// token quota.
    pub fn account_limit(&self, account: &str) -> u64 {
        match self.budget_of(account) {
            Some((_, b)) => b.limit,
            None => self.tenant(account).monthly_limit,
        }
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
pub(super) struct RawQuota {
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
    reservation_timeout_s: Option<u64>,
    exhausted_recheck_s: Option<u64>,
    exhausted_below: Option<u64>,
    inject_stream_usage: Option<bool>,
    abandoned_charge: Option<String>,
    shim_breaker: Option<RawShimBreaker>,
    settle_retry_ms: Option<u64>,
    settle_max_attempts: Option<u32>,
    clock_skew_s: Option<i64>,
    lease: Option<RawLeaseSwitch>,
    batch: Option<serde_json::Value>,
    budgets: Option<Vec<super::budgets::RawBudget>>,
    prices: Option<UniqueMap<super::budgets::RawPrice>>,
    currency: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
struct RawLease {
    horizon_ms: Option<u64>,
    min_tokens: Option<u64>,
    min_limit_percent: Option<u32>,
    max_share_percent: Option<u32>,
    idle_s: Option<u64>,
    refresh_ms: Option<u64>,
    ttl_s: Option<u64>,
}

/// `quota.lease`: `false` (off), `true` or an object (on; `{}`: the defaults).
enum RawLeaseSwitch {
    Off,
    On(RawLease),
}

impl<'de> Deserialize<'de> for RawLeaseSwitch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawLeaseSwitch;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("false, true or a JSON object")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(if v {
                    RawLeaseSwitch::On(RawLease::default())
                } else {
                    RawLeaseSwitch::Off
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                RawLease::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawLeaseSwitch::On)
            }
        }
        d.deserialize_any(V)
    }
}

/// Default of `quota.lease.min_tokens`: the smallest lease of an account with a large limit.
pub const LEASE_MIN_TOKENS: u64 = 4096;
/// Default of `quota.lease.min_limit_percent`: the smallest lease of an account with a small limit.
pub const LEASE_MIN_LIMIT_PERCENT: u32 = 1;

/// `quota.lease`: every field optional (absent, `true` or `{}`: leases with the defaults).
fn lease(raw: RawLease, timeout_ms: u32) -> Result<LeaseSettings, ConfigError> {
    let horizon_ms = in_range(
        "quota.lease.horizon_ms",
        raw.horizon_ms.unwrap_or(2000),
        100,
        600_000,
    )?;
    let ttl_s = in_range("quota.lease.ttl_s", raw.ttl_s.unwrap_or(60), 5, 86_400)?;
    let refresh_ms = in_range(
        "quota.lease.refresh_ms",
        raw.refresh_ms.unwrap_or(1000),
        10,
        600_000,
    )?;
    if refresh_ms.saturating_mul(3) > ttl_s.saturating_mul(1000) {
        return Err(err(
            "quota.lease.refresh_ms",
            format!("must be at most a third of quota.lease.ttl_s ({ttl_s} s): a lease is renewed before Redis gives it up"),
        ));
    }
    Ok(LeaseSettings {
        policy: crate::quota::lease::account::Policy {
            horizon_s: horizon_ms as f64 / 1000.0,
            min_tokens: in_range(
                "quota.lease.min_tokens",
                raw.min_tokens.unwrap_or(LEASE_MIN_TOKENS),
                1,
                crate::shim::webdis::MAX_LUA_INT,
            )?,
            min_fraction: f64::from(in_range(
                "quota.lease.min_limit_percent",
                raw.min_limit_percent.unwrap_or(LEASE_MIN_LIMIT_PERCENT),
                0,
                100,
            )?) / 100.0,
            max_share: f64::from(in_range(
                "quota.lease.max_share_percent",
                raw.max_share_percent.unwrap_or(10),
                1,
                100,
            )?) / 100.0,
            idle_ns: in_range("quota.lease.idle_s", raw.idle_s.unwrap_or(10), 1, 86_400)?
                .saturating_mul(1_000_000_000),
            refresh_ns: refresh_ms.saturating_mul(1_000_000),
            renew_ns: ttl_s.saturating_mul(1_000_000_000) / 3,
            sync_timeout_ns: u64::from(timeout_ms)
                .saturating_mul(2)
                .max(1000)
                .saturating_mul(1_000_000),
        },
        ttl_s,
    })
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

/// Bound of `quota.grace_seconds`: 10 years (Redis expiry times).
const TEN_YEARS_S: u64 = 3650 * 86_400;
/// Bound of `quota.clock_skew_s` either way: 100 years.
const MAX_CLOCK_SKEW_S: i64 = 100 * 365 * 86_400;

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

/// What a request is charged when its client leaves after the request was sent upstream and before the
/// provider's final usage arrived (`quota.abandoned_charge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbandonedCharge {
    /// The whole reservation (prompt estimate + output reserved): the provider may go on generating
    /// (a non-streamed answer runs to its end; hidden reasoning is billed) and tokengate cannot see it.
    Reservation,
    /// The prompt estimate plus the output estimated from the bytes that reached Envoy: what a client
    /// that stops a stream has seen, and no more.
    Received,
}

fn abandoned_charge(v: Option<&str>) -> Result<AbandonedCharge, ConfigError> {
    match v {
        None | Some("reservation") => Ok(AbandonedCharge::Reservation),
        Some("received") => Ok(AbandonedCharge::Received),
        Some(o) => Err(err(
            "quota.abandoned_charge",
            format!("'{o}' is not one of \"reservation\", \"received\""),
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

/// Validates the `quota` section.
pub(super) fn quota(
    raw: RawQuota,
    levels: &[super::GroupLevel],
) -> Result<QuotaSettings, ConfigError> {
    let (cluster, authority, timeout_ms) =
        shim_target("quota", raw.cluster, raw.authority, raw.timeout_ms)?;
    let has_budgets = raw.budgets.as_ref().is_some_and(|b| !b.is_empty());
    let monthly_limit = match raw.monthly_limit {
        Some(v) => limit("quota.monthly_limit".into(), v)?,
        None if has_budgets => 0,
        None => {
            return Err(err(
                "quota.monthly_limit",
                "is required (or give budgets: a quota of money only)",
            ))
        }
    };
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
    let budgets = super::budgets::budgets(
        raw.budgets,
        raw.prices,
        raw.currency,
        levels,
        default.on_failure,
    )?;
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
    if month_offset_minutes.unsigned_abs() > crate::quota::calendar::MAX_OFFSET_MIN.unsigned_abs() {
        let max = crate::quota::calendar::MAX_OFFSET_MIN;
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
    if raw.idempotency_window_s.is_some_and(|w| w != 0) {
        return Err(err(
            "quota.idempotency_window_s",
            "is no longer supported: a repeated Idempotency-Key is charged like any request (the provider serves every repeat), so there is no window to set; remove the field (reservations are resolved by quota.reservation_timeout_s)",
        ));
    }
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
        reservation_timeout_s: in_range(
            "quota.reservation_timeout_s",
            raw.reservation_timeout_s.unwrap_or(3600),
            1,
            7 * 86_400,
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
        abandoned_charge: abandoned_charge(raw.abandoned_charge.as_deref())?,
        shim_breaker,
        settle_retry_ms: in_range(
            "quota.settle_retry_ms",
            raw.settle_retry_ms.unwrap_or(500),
            10,
            60_000,
        )?,
        settle_max_attempts,
        clock_skew_s,
        // On unless turned off: every quota is leased by default.
        lease: match raw.lease {
            Some(RawLeaseSwitch::Off) => None,
            Some(RawLeaseSwitch::On(l)) => Some(lease(l, timeout_ms)?),
            None => Some(lease(RawLease::default(), timeout_ms)?),
        },
        batch: batch(raw.batch)?,
        budgets,
    })
}

/// `quota.batch`: `false` (off), `true` or absent (on, the defaults), or an object of the fields.
fn batch(raw: Option<serde_json::Value>) -> Result<Option<BatchSettings>, ConfigError> {
    let obj = match raw {
        None | Some(serde_json::Value::Bool(true)) => return Ok(Some(BatchSettings::default())),
        Some(serde_json::Value::Bool(false)) => return Ok(None),
        Some(serde_json::Value::Object(o)) => o,
        Some(other) => {
            return Err(err(
                "quota.batch",
                format!("must be true, false or an object, got {other}"),
            ))
        }
    };
    let d = BatchSettings::default();
    let mut out = d;
    for (k, v) in obj {
        let field = format!("quota.batch.{k}");
        let n = v
            .as_u64()
            .ok_or_else(|| err(field.clone(), format!("must be a whole number, got {v}")))?;
        match k.as_str() {
            "max_reservations" => {
                out.max_reservations = usize::try_from(in_range(field.clone(), n, 1, 256)?)
                    .unwrap_or(d.max_reservations)
            }
            "max_wait_ms" => out.max_wait_ms = in_range(field.clone(), n, 1, 1000)?,
            _ => {
                return Err(err(
                    field,
                    "unknown field (expected max_reservations, max_wait_ms)",
                ))
            }
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use crate::config::testing::parse_str;

    fn with_lease(lease: &str) -> String {
        let lease = if lease.is_empty() {
            String::new()
        } else {
            format!(r#","lease":{lease}"#)
        };
        format!(
            r#"{{"rules":[{{"tokens_per_second":10,"burst":100}}],
                "quota":{{"cluster":"webdis","monthly_limit":50000{lease}}}}}"#
        )
    }

    #[test]
    fn leases_are_on_whenever_a_quota_is_configured_and_false_turns_them_off() {
        let on = |lease: &str| parse_str(&with_lease(lease)).unwrap().quota.unwrap().lease;
        let default = on("").expect("on without a lease field");
        assert_eq!(on("{}"), Some(default));
        assert_eq!(on("true"), Some(default));
        assert_eq!(on("false"), None);
        let p = default.policy;
        assert_eq!(
            (p.min_tokens, p.min_fraction, p.max_share),
            (4096, 0.01, 0.1)
        );
        assert_eq!((p.horizon_s, default.ttl_s), (2.0, 60));
        let set = on(r#"{"min_tokens": 512, "min_limit_percent": 0, "idle_s": 2}"#).unwrap();
        assert_eq!((set.policy.min_tokens, set.policy.min_fraction), (512, 0.0));
        assert_eq!(set.policy.idle_ns, 2_000_000_000);
    }

    #[test]
    fn a_bad_lease_field_is_refused_with_its_name() {
        for (lease, field) in [
            ("1", "quota.lease"),
            (r#""on""#, "quota.lease"),
            (
                r#"{"min_limit_percent": 101}"#,
                "quota.lease.min_limit_percent",
            ),
            (
                r#"{"max_share_percent": 0}"#,
                "quota.lease.max_share_percent",
            ),
            (r#"{"min_tokens": 0}"#, "quota.lease.min_tokens"),
            (r#"{"refresh_ms": 30000}"#, "quota.lease.refresh_ms"),
            (r#"{"min_share": 1}"#, "quota.lease.min_share"),
        ] {
            let e = parse_str(&with_lease(lease)).unwrap_err();
            assert_eq!(e.field, field, "{lease}: {e}");
        }
    }

    #[test]
    fn the_smallest_lease_is_a_percent_of_the_limit_at_most_min_tokens() {
        let l = parse_str(&with_lease(""))
            .unwrap()
            .quota
            .unwrap()
            .lease
            .unwrap();
        let p = l.policy;
        // 50,000 tokens: leases from 500, leased while 5,000 (10 %) or more is left.
        assert_eq!((p.floor(50_000), p.threshold(50_000)), (500, 5_000));
        // Large limits: 4,096 at most, leased until 40,960 is left.
        assert_eq!(
            (p.floor(50_000_000), p.threshold(50_000_000)),
            (4096, 40_960)
        );
        // A limit not known yet, and tiny ones.
        assert_eq!((p.floor(0), p.floor(20), p.floor(1)), (4096, 1, 1));
        let abs = parse_str(&with_lease(r#"{"min_limit_percent": 0}"#))
            .unwrap()
            .quota
            .unwrap()
            .lease
            .unwrap();
        assert_eq!(abs.policy.threshold(50_000), 40_960);
    }
}
