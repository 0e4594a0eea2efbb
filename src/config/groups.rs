//! Groups: the teams and orgs a tenant belongs to, for `limits` at group scope. Levels nest, outermost
//! first (org ⊃ team ⊃ tenant):
//! ```json
//! "groups": [{"name": "org", "claim": "org"}, {"name": "team", "claim": "team"}],
//! "tenant_groups": {"alice": {"org": "acme", "team": "search"}}
//! ```
//! A request's group at a level comes from `tenant_groups` when its (verified) tenant is listed there,
//! else from the level's `claim` in the JWT Envoy verified (see `identity.rs`), else from its `header`
//! — allowed only with `trusted_headers.set_by`, naming the filter that sets it and removes the
//! client's copy. `"group_header": "x-h"` is short for `"groups": [{"name": "group", "header": "x-h"}]`.

use super::fields::{header_name, TENANT_ID};
use super::identity::{claim_path, ClaimPath, RawClaim};
use super::shape::UniqueMap;
use super::{err, ConfigError};
use crate::identity::valid_tenant;
use serde::Deserialize;

/// Most group levels.
pub const MAX_GROUP_LEVELS: usize = 4;

/// One level of groups (`org`, `team`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLevel {
    /// The level's name, what a limit's `scope` names.
    pub name: String,
    /// The claim of the verified JWT naming a request's group at this level.
    pub claim: Option<ClaimPath>,
    /// The trusted header carrying a request's group at this level (lower case; only with
    /// `trusted_headers`).
    pub header: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a group level object")]
pub(super) struct RawGroupLevel {
    name: Option<String>,
    claim: Option<RawClaim>,
    header: Option<String>,
}

/// The group levels and the tenants' fixed groups.
pub(super) struct Groups {
    pub levels: Vec<GroupLevel>,
    /// Tenant → its group at each level (index of `levels`).
    pub tenants:
        std::collections::HashMap<String, Vec<Option<String>>, crate::store::hash::FnvBuild>,
}

/// Validates `groups`, its `group_header` shorthand and `tenant_groups`.
pub(super) fn groups(
    raw: Option<Vec<RawGroupLevel>>,
    group_header: Option<String>,
    tenant_groups: Option<UniqueMap<UniqueMap<String>>>,
) -> Result<Groups, ConfigError> {
    let mut levels = Vec::new();
    match (raw, header_name("group_header", group_header)?) {
        (Some(_), Some(_)) => {
            return Err(err(
                "group_header",
                "give either group_header or groups, not both (group_header is one level named \"group\")",
            ))
        }
        (None, Some(h)) => levels.push(GroupLevel {
            name: "group".to_string(),
            claim: None,
            header: Some(h),
        }),
        (Some(raw), None) => {
            if raw.len() > MAX_GROUP_LEVELS {
                return Err(err(
                    "groups",
                    format!(
                        "must hold at most {MAX_GROUP_LEVELS} levels, got {}",
                        raw.len()
                    ),
                ));
            }
            for (i, g) in raw.into_iter().enumerate() {
                let name = g
                    .name
                    .ok_or_else(|| err(format!("groups[{i}].name"), "is required"))?;
                if !valid_level_name(&name) {
                    return Err(err(
                        format!("groups[{i}].name"),
                        format!("'{name}' is not a valid level name: 1-32 characters from [a-z0-9_-], not \"tenant\" or \"shared\""),
                    ));
                }
                if levels.iter().any(|l: &GroupLevel| l.name == name) {
                    return Err(err(
                        format!("groups[{i}].name"),
                        format!("duplicate level '{name}'"),
                    ));
                }
                let header = header_name(&format!("groups[{i}].header"), g.header)?;
                let claim = g
                    .claim
                    .map(|c| claim_path(&format!("groups[{i}].claim"), c))
                    .transpose()?;
                if claim.is_some() && header.is_some() {
                    return Err(err(
                        format!("groups[{i}]"),
                        "give claim or header, not both",
                    ));
                }
                levels.push(GroupLevel {
                    name,
                    claim,
                    header,
                });
            }
        }
        (None, None) => {}
    }
    let mut tenants = std::collections::HashMap::default();
    for (tenant, map) in tenant_groups.into_iter().flatten() {
        if !valid_tenant(&tenant) {
            return Err(err(
                "tenant_groups",
                format!("'{tenant}' is not a tenant id: {TENANT_ID}"),
            ));
        }
        let mut per_level = vec![None; levels.len()];
        for (level, group) in map {
            let field = format!("tenant_groups.{tenant}.{level}");
            let Some(i) = levels.iter().position(|l| l.name == level) else {
                return Err(err(field, "is not a level of groups"));
            };
            if !valid_tenant(&group) {
                return Err(err(
                    field,
                    format!("'{group}' is not a group id: {TENANT_ID}"),
                ));
            }
            if let Some(slot) = per_level.get_mut(i) {
                *slot = Some(group);
            }
        }
        tenants.insert(tenant, per_level);
    }
    Ok(Groups { levels, tenants })
}

fn valid_level_name(n: &str) -> bool {
    (1..=32).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && n != "tenant"
        && n != "shared"
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn levels_nest_and_tenants_may_be_given_their_groups() {
        let c = parse_str(
            r#"{"groups": [{"name": "org", "header": "X-Org"}, {"name": "team", "header": "x-team"}],
                "trusted_headers": {"set_by": "ext_authz"},
                "tenant_groups": {"alice": {"team": "search", "org": "acme"}},
                "limits": [{"scope": "team", "max_in_flight": 2}]}"#,
        )
        .unwrap();
        assert_eq!(c.groups.len(), 2);
        assert_eq!(c.groups[0].header.as_deref(), Some("x-org"));
        assert_eq!(
            c.tenant_groups.get("alice"),
            Some(&vec![Some("acme".to_string()), Some("search".to_string())])
        );
        assert_eq!(c.limits[0].scope, super::super::Scope::Group(1));
    }

    #[test]
    fn bad_groups_are_refused_naming_the_field() {
        for (cfg, want) in [
            (
                r#"{"group_header": "x-g", "groups": [{"name": "org"}], "limits": [{"max_in_flight": 1}]}"#,
                "group_header: give either group_header or groups, not both (group_header is one level named \"group\")",
            ),
            (
                r#"{"groups": [{"name": "shared"}], "limits": [{"max_in_flight": 1}]}"#,
                "groups[0].name: 'shared' is not a valid level name: 1-32 characters from [a-z0-9_-], not \"tenant\" or \"shared\"",
            ),
            (
                r#"{"groups": [{"name": "org"}], "tenant_groups": {"a": {"team": "x"}}, "limits": [{"max_in_flight": 1}]}"#,
                "tenant_groups.a.team: is not a level of groups",
            ),
            (
                r#"{"groups": [{"name": "org"}], "limits": [{"scope": "team", "max_in_flight": 1}]}"#,
                "limits[0].scope: must be \"tenant\", \"shared\" or a level of groups (org), got \"team\"",
            ),
        ] {
            assert_eq!(refusal(cfg), want, "{cfg}");
        }
    }
}
