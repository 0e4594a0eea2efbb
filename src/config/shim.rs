//! The Webdis shim of a section that calls Redis (`quota`, `global_buckets`): its cluster, `:authority`,
//! callout timeout, and the circuit breaker kept on the shim itself.

use super::fields::{in_range, prefixed_err};
use super::{err, ConfigError};
use crate::breaker::BreakerConfig;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
pub(super) struct RawShimBreaker {
    failure_threshold: Option<u32>,
    window_ms: Option<u64>,
    recovery_ms: Option<u64>,
}

/// Cluster (required), `:authority` (default: the cluster) and timeout (default 50 ms) of the Webdis shim
/// configured in section `section`.
pub(super) fn shim_target(
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

/// The breaker on a Webdis shim (`field` names it in errors): `failure_threshold` failures within
/// `window_ms` open it for `recovery_ms`, then one probe goes; a failed probe opens it for `recovery_ms`
/// again, not longer (no backoff). The shim is the filter's own dependency and a whole Redis Cluster
/// stands behind it: after an outage (a failover) every tenant waits for the next probe, so the wait
/// after Redis answers again is at most one `recovery_ms` (plus the failed probe's callout), as the
/// README documents; a growing recovery would stretch that to minutes while costing a dead shim only
/// one callout per window fewer.
pub(super) fn shim_breaker(
    field: &str,
    raw: Option<RawShimBreaker>,
) -> Result<BreakerConfig, ConfigError> {
    let sb = raw.unwrap_or(RawShimBreaker {
        failure_threshold: None,
        window_ms: None,
        recovery_ms: None,
    });
    let b = BreakerConfig {
        failure_threshold: sb.failure_threshold.unwrap_or(3),
        window_ms: sb.window_ms.unwrap_or(10_000),
        recovery_ms: sb.recovery_ms.unwrap_or(5_000),
        max_recovery_ms: sb.recovery_ms.unwrap_or(5_000),
        backoff_multiplier: 1.0,
        half_open_max_calls: 1,
        ..BreakerConfig::default()
    };
    b.validate().map_err(|e| prefixed_err(field, &e))?;
    Ok(b)
}
