//! `limits`: limits that *all* apply to every request they match (unlike `rules`, where the first match
//! wins), each at a scope — the tenant's own bucket, its group's, or one shared by everyone — with a
//! token bucket, a cap on requests in flight, or both, and optionally in shadow mode:
//! ```json
//! "limits": [
//!   {"name": "gpt-4.1-provider", "model": "gpt-4.1", "scope": "shared",
//!    "tokens_per_second": 300000, "burst": 2000000},
//!   {"name": "gpt-4.1-team", "model": "gpt-4.1", "scope": "group",
//!    "tokens_per_second": 60000, "burst": 400000},
//!   {"name": "team-concurrency", "scope": "group", "max_in_flight": 20},
//!   {"name": "trial", "scope": "tenant", "tokens_per_second": 100, "burst": 1000, "shadow": true}
//! ]
//! ```
//! A request is charged by every limit that matches it, all or nothing (one refuses: the others are
//! given back), and by the first matching `rules` entry if any.

use super::fields::{in_range, TENANT_ID};
use super::rules::{
    bucket, model_field, name_field, tenant_pattern, Rule, Scope, MAX_WAIT_MS_LIMIT,
};
use super::{err, ConfigError};
use crate::limits::bucket::BucketParams;
use serde::Deserialize;

/// Most limits.
pub const MAX_LIMITS: usize = 64;
/// Largest `max_in_flight`.
pub const MAX_IN_FLIGHT: u32 = 4096;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a limit object")]
pub(super) struct RawLimit {
    name: Option<String>,
    scope: Option<String>,
    tenant: Option<String>,
    group: Option<String>,
    model: Option<String>,
    tokens_per_second: Option<f64>,
    burst: Option<f64>,
    requests_per_minute: Option<f64>,
    per_model: Option<bool>,
    max_wait_ms: Option<u64>,
    refund_unused: Option<bool>,
    global: Option<bool>,
    max_in_flight: Option<u32>,
    shadow: Option<bool>,
    share: Option<serde_json::Value>,
    weights: Option<super::shape::UniqueMap<f64>>,
    priority: Option<super::fair::RawPriority>,
    when_exhausted: Option<super::fair::RawWhenExhausted>,
}

/// Validates `limits` (0 to [`MAX_LIMITS`]); names must differ from each other and from `rules`.
pub(super) fn limits(
    raw: Vec<RawLimit>,
    rules: &[Rule],
    levels: &[super::GroupLevel],
) -> Result<Vec<Rule>, ConfigError> {
    if raw.len() > MAX_LIMITS {
        return Err(err(
            "limits",
            format!("must hold at most {MAX_LIMITS} limits, got {}", raw.len()),
        ));
    }
    let mut out: Vec<Rule> = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let f = |name: &str| format!("limits[{i}].{name}");
        let scope = match r.scope.as_deref() {
            None | Some("tenant") => Scope::Tenant,
            Some("shared") => Scope::Shared,
            Some(other) => match levels.iter().position(|l| l.name == other) {
                Some(l) => Scope::Group(l),
                None => {
                    let names: Vec<&str> = levels.iter().map(|l| l.name.as_str()).collect();
                    let hint = if names.is_empty() {
                        " (group scopes need groups or group_header: the trusted headers naming a request's groups)".to_string()
                    } else {
                        format!(" ({})", names.join(", "))
                    };
                    return Err(err(
                        f("scope"),
                        format!("must be \"tenant\", \"shared\" or a level of groups{hint}, got \"{other}\""),
                    ));
                }
            },
        };
        if r.group.is_some() && !matches!(scope, Scope::Group(_)) {
            return Err(err(f("group"), "needs a group scope"));
        }
        let has_bucket = r.tokens_per_second.is_some() || r.burst.is_some();
        if !has_bucket && r.max_in_flight.is_none() {
            return Err(err(
                format!("limits[{i}]"),
                "limits nothing: give tokens_per_second and burst, or max_in_flight, or both",
            ));
        }
        let params = if has_bucket {
            bucket(&f, r.tokens_per_second, r.burst, r.requests_per_minute)?
        } else {
            if r.requests_per_minute.is_some() {
                return Err(err(
                    f("requests_per_minute"),
                    "needs tokens_per_second and burst (a token bucket)",
                ));
            }
            BucketParams {
                tokens_per_second: 1e15,
                burst: 1e15,
                requests_per_minute: None,
            }
        };
        let max_in_flight = r
            .max_in_flight
            .map(|n| in_range(f("max_in_flight"), n, 1, MAX_IN_FLIGHT))
            .transpose()?;
        let group = match r.group.as_deref() {
            None | Some("*") => None,
            Some(g) if crate::identity::valid_tenant(g) => Some(g.to_string()),
            Some(g) => {
                return Err(err(
                    f("group"),
                    format!(
                    "'{g}' can never match a group: use \"*\" or one exact group id, {TENANT_ID}"
                ),
                ))
            }
        };
        let taken: Vec<&str> = rules
            .iter()
            .chain(out.iter())
            .map(|x| x.name.as_str())
            .collect();
        let name = name_field(
            f("name"),
            r.name.unwrap_or_else(|| format!("limit{i}")),
            &taken,
        )?;
        let global = r.global.unwrap_or(false);
        let max_wait_ms = in_range(
            f("max_wait_ms"),
            r.max_wait_ms.unwrap_or(0),
            0,
            MAX_WAIT_MS_LIMIT,
        )?;
        let shadow = r.shadow.unwrap_or(false);
        let fair = super::fair::fair(
            &f,
            super::fair::RawShare {
                share: r.share,
                weights: r.weights,
                priority: r.priority,
            },
            &super::fair::Host {
                scope,
                has_bucket,
                max_wait_ms,
                levels,
            },
        )?;
        let when_exhausted = super::fair::when_exhausted(&f, r.when_exhausted, has_bucket, shadow)?;
        if global && !has_bucket {
            return Err(err(
                f("global"),
                "needs a token bucket (in-flight caps live in this Envoy's shared data)",
            ));
        }
        let limit = Rule {
            name,
            tenant: tenant_pattern(f("tenant"), r.tenant.as_deref())?,
            model: model_field(f("model"), r.model)?,
            per_model: r.per_model.unwrap_or(true),
            params,
            max_wait_ms,
            refund_unused: r.refund_unused.unwrap_or(false),
            global,
            scope,
            group,
            has_bucket,
            max_in_flight,
            shadow,
            is_limit: true,
            fair,
            when_exhausted,
        };
        if limit.max_wait_ms > 0 && !has_bucket {
            return Err(err(f("max_wait_ms"), "needs a token bucket"));
        }
        if limit.refund_unused && !has_bucket {
            return Err(err(f("refund_unused"), "needs a token bucket"));
        }
        out.push(limit);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn limits_parse_with_scopes_and_in_flight_caps() {
        let c = parse_str(
            r#"{"group_header": "x-tokengate-group", "trusted_headers": {"set_by": "ext_authz"}, "rules": [{"tokens_per_second": 1, "burst": 1}],
               "limits": [
                 {"name": "prov", "model": "gpt-4.1", "scope": "shared", "tokens_per_second": 300000, "burst": 2000000},
                 {"name": "team", "scope": "group", "max_in_flight": 20},
                 {"name": "try", "tokens_per_second": 1, "burst": 10, "shadow": true}]}"#,
        )
        .unwrap();
        assert_eq!(c.limits.len(), 3);
        assert_eq!(c.limits[0].scope, super::Scope::Shared);
        assert!(!c.limits[1].has_bucket);
        assert_eq!(c.limits[1].max_in_flight, Some(20));
        assert!(c.limits[2].shadow);
    }

    #[test]
    fn bad_limits_are_refused_naming_the_field() {
        for (limits, want) in [
            (
                r#"[{"scope": "group", "max_in_flight": 1}]"#,
                "limits[0].scope: must be \"tenant\", \"shared\" or a level of groups (group scopes need groups or group_header: the trusted headers naming a request's groups), got \"group\"",
            ),
            (
                r#"[{"name": "x"}]"#,
                "limits[0]: limits nothing: give tokens_per_second and burst, or max_in_flight, or both",
            ),
            (
                r#"[{"tenant": "a", "group": "x", "max_in_flight": 1}]"#,
                "limits[0].group: needs a group scope",
            ),
            (
                r#"[{"name": "rule0", "max_in_flight": 1}]"#,
                "limits[0].name: duplicate rule name 'rule0'",
            ),
            (
                r#"[{"max_in_flight": 0}]"#,
                "limits[0].max_in_flight: must be between 1 and 4096, got 0",
            ),
            (
                r#"[{"max_in_flight": 3, "refund_unused": true}]"#,
                "limits[0].refund_unused: needs a token bucket",
            ),
            (
                r#"[{"max_in_flight": 3, "global": true}]"#,
                "limits[0].global: needs a token bucket (in-flight caps live in this Envoy's shared data)",
            ),
        ] {
            let cfg = format!(
                r#"{{"rules": [{{"tokens_per_second": 1, "burst": 1}}], "limits": {limits}}}"#
            );
            assert_eq!(refusal(&cfg), want);
        }
    }
}
