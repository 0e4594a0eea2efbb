//! `global_buckets`: the Webdis shim in front of the Redis that holds the buckets of `global` rules, what
//! such a request gets when Redis cannot answer, and leases: `"global_buckets": {"cluster": "webdis",
//! "on_failure": "local", "lease": {"horizon_ms": 1000, "max_share_percent": 10, "idle_ms": 2000}}`.

use super::fields::in_range;
use super::quota::QuotaSettings;
use super::rules::Rule;
use super::shim::{shim_breaker, shim_target, RawShimBreaker};
use super::{err, ConfigError};
use crate::breaker::BreakerConfig;
use serde::Deserialize;

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
    /// Leases (`global_buckets.lease`, see [`crate::global::lease`]): off when `None`.
    pub lease: Option<crate::global::lease::Policy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
pub(super) struct RawGlobal {
    cluster: Option<String>,
    authority: Option<String>,
    timeout_ms: Option<u32>,
    on_failure: Option<String>,
    shim_breaker: Option<RawShimBreaker>,
    lease: Option<RawLease>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
struct RawLease {
    horizon_ms: Option<u64>,
    max_share_percent: Option<u32>,
    idle_ms: Option<u64>,
}

/// `global_buckets.lease`: every field optional (`{}` turns leases on with the defaults).
fn lease(raw: RawLease, timeout_ms: u32) -> Result<crate::global::lease::Policy, ConfigError> {
    let horizon_ms = in_range(
        "global_buckets.lease.horizon_ms",
        raw.horizon_ms.unwrap_or(1000),
        10,
        600_000,
    )?;
    let share = in_range(
        "global_buckets.lease.max_share_percent",
        raw.max_share_percent.unwrap_or(10),
        1,
        100,
    )?;
    let idle_ms = in_range(
        "global_buckets.lease.idle_ms",
        raw.idle_ms.unwrap_or(2000),
        100,
        3_600_000,
    )?;
    Ok(crate::global::lease::Policy {
        horizon_s: horizon_ms as f64 / 1000.0,
        max_share: f64::from(share) / 100.0,
        idle_ns: idle_ms.saturating_mul(1_000_000),
        ask_timeout_ns: u64::from(timeout_ms)
            .saturating_mul(2)
            .max(1000)
            .saturating_mul(1_000_000),
    })
}

/// Validates the `global_buckets` section.
pub(super) fn global(raw: RawGlobal) -> Result<GlobalSettings, ConfigError> {
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
        lease: raw.lease.map(|l| lease(l, timeout_ms)).transpose()?,
    })
}

/// What `global_buckets` must agree on with the rest: a cluster has one shim breaker (so the quota's and
/// the global buckets' settings must be equal when both reach one cluster), and `global` rules need the
/// section.
pub(super) fn consistent(
    global: Option<&GlobalSettings>,
    quota: Option<&QuotaSettings>,
    rules: &[Rule],
    limits: &[Rule],
) -> Result<(), ConfigError> {
    if let (Some(g), Some(q)) = (global, quota) {
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
        if let Some(i) = limits.iter().position(|r| r.global) {
            return Err(err(
                format!("limits[{i}].global"),
                "needs the top-level \"global_buckets\" section (the Webdis shim of the Redis holding the buckets)",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

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
        assert_eq!(g.lease, None, "leases are off unless asked for");
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
            (
                r#"{"rules":[{"tokens_per_second":10,"burst":100}],"global_buckets":{"cluster":"w","lease":{"horizon_ms":5}}}"#,
                "global_buckets.lease.horizon_ms",
            ),
            (
                r#"{"rules":[{"tokens_per_second":10,"burst":100}],"global_buckets":{"cluster":"w","lease":{"max_share_percent":0}}}"#,
                "global_buckets.lease.max_share_percent",
            ),
            (
                r#"{"rules":[{"tokens_per_second":10,"burst":100}],"global_buckets":{"cluster":"w","lease":{"max_share_percent":101}}}"#,
                "global_buckets.lease.max_share_percent",
            ),
            (
                r#"{"rules":[{"tokens_per_second":10,"burst":100}],"global_buckets":{"cluster":"w","lease":{"idle_ms":99}}}"#,
                "global_buckets.lease.idle_ms",
            ),
            (
                r#"{"rules":[{"tokens_per_second":10,"burst":100}],"global_buckets":{"cluster":"w","lease":{"idle_s":9}}}"#,
                "global_buckets.lease.idle_s",
            ),
            (
                r#"{"rules":[{"tokens_per_second":10,"burst":100}],"global_buckets":{"cluster":"w","lease":true}}"#,
                "global_buckets.lease",
            ),
        ] {
            let e = parse_str(cfg).unwrap_err();
            assert_eq!(e.field, field, "{cfg}: {e}");
        }
    }

    #[test]
    fn global_leases_take_their_defaults_from_an_empty_object() {
        let c = parse_str(
            r#"{"rules":[{"tokens_per_second":10,"burst":100,"global":true}],
                "global_buckets":{"cluster":"webdis","timeout_ms":800,"lease":{}}}"#,
        )
        .unwrap();
        let l = c.global.as_ref().unwrap().lease.unwrap();
        assert_eq!(l.horizon_s, 1.0);
        assert_eq!(l.max_share, 0.1);
        assert_eq!(l.idle_ns, 2_000_000_000);
        assert_eq!(l.ask_timeout_ns, 1_600_000_000);
        let c = parse_str(
            r#"{"rules":[{"tokens_per_second":10,"burst":100,"global":true}],
                "global_buckets":{"cluster":"webdis","lease":{"horizon_ms":250,"max_share_percent":25,"idle_ms":500}}}"#,
        )
        .unwrap();
        let l = c.global.as_ref().unwrap().lease.unwrap();
        assert_eq!(
            (l.horizon_s, l.max_share, l.idle_ns),
            (0.25, 0.25, 500_000_000)
        );
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
}
