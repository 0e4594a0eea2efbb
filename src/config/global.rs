//! `global_buckets`: the Webdis shim in front of the Redis that holds the buckets of `global` rules, and
//! what such a request gets when Redis cannot answer: `"global_buckets": {"cluster": "webdis",
//! "on_failure": "local"}`.

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
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
pub(super) struct RawGlobal {
    cluster: Option<String>,
    authority: Option<String>,
    timeout_ms: Option<u32>,
    on_failure: Option<String>,
    shim_breaker: Option<RawShimBreaker>,
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
