//! `share`, `weights`, `priority` and `when_exhausted` of a limit: fair sharing of a shared or group
//! limit among the tenants (or sub-groups) using it, and a cheaper model instead of a 429:
//! ```json
//! {"name": "gpt-4.1", "model": "gpt-4.1", "scope": "shared", "tokens_per_second": 3000, "burst": 10000,
//!  "share": "fair",
//!  "weights": {"search": 2, "*": 1},
//!  "priority": {"levels": ["interactive", "batch"], "members": {"nightly-etl": "batch"}},
//!  "when_exhausted": {"model": "gpt-4.1-mini"}}
//! ```
//! * `share`: `"first_come"` (the default: whoever asks first is served) or `"fair"` (weighted max-min
//!   shares among the members active in the last `window_ms`, see docs/fair-share.md); the object form
//!   `{"by": "team", "window_ms": 1000, "max_members": 64}` is fair sharing with its settings: `by` names
//!   whose shares they are (`"tenant"`, the default, or a level of `groups` inside the limit's scope).
//! * `weights`: a member's weight (0.01 to 1000; `"*"`: members not listed, default 1).
//! * `priority`: strict levels, highest first; `members` puts members on a level, `default` (the first
//!   level unless given) the others. A lower level gets only what the higher ones leave.
//! * `when_exhausted`: `{"model": …}`, the model a request is sent to, charged and limited as, when this
//!   limit (or a budget) refuses it for want of tokens or requests. Loops and targets that nothing limits
//!   or prices are refused at load ([`downgrades`]).
//!
//! Every refusal names the field: `limits[0].weights.acme: must be between 0.01 and 1000, got 0`.

use super::fields::{number_in, TENANT_ID};
use super::rules::{ModelMatch, Rule, Scope};
use super::shape::UniqueMap;
use super::{err, ConfigError, GroupLevel};
use crate::identity::valid_tenant;
use crate::store::hash::FnvBuild;
use serde::Deserialize;
use std::collections::HashMap;

/// Most members a fair limit's record keeps (its size grows by 40 bytes per member).
pub const MAX_MEMBERS: u16 = 256;
/// Members kept when `max_members` is not given.
pub const DEFAULT_MEMBERS: u16 = 64;
/// Most priority levels.
pub const MAX_LEVELS: usize = 8;
/// Most entries of `weights` and of `priority.members`.
pub const MAX_LISTED: usize = 10_000;
/// Smallest and largest weight.
pub const WEIGHT_RANGE: (f64, f64) = (0.01, 1000.0);
/// `window_ms` bounds and default.
pub const WINDOW_MS: (u64, u64, u64) = (100, 60_000, 1000);
/// Longest chain of `when_exhausted` hops a request can follow (the graph is acyclic; this bounds it).
pub const MAX_DOWNGRADE_HOPS: usize = 4;

/// Whose shares a fair limit keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareBy {
    /// Each tenant is a member.
    Tenant,
    /// Each group of this level (index in `groups`) is a member.
    Level(usize),
}

/// A validated fair share (`share: "fair"`).
#[derive(Debug, Clone, PartialEq)]
pub struct FairShare {
    /// Whose shares.
    pub by: ShareBy,
    /// Weights of listed members.
    pub weights: HashMap<String, f64, FnvBuild>,
    /// Weight of every other member.
    pub default_weight: f64,
    /// Priority level names, highest first (one unnamed level when `priority` is absent).
    pub levels: Vec<String>,
    /// Levels of listed members (index in `levels`).
    pub member_levels: HashMap<String, u8, FnvBuild>,
    /// Level of every other member.
    pub default_level: u8,
    /// Members are active while they asked within this window; demand is measured over it (ns).
    pub window_ns: u64,
    /// Members the record keeps; more active ones share one overflow member.
    pub max_members: u16,
}

impl FairShare {
    /// The weight and priority level of member `id`.
    pub fn weight_and_level(&self, id: &str) -> (f64, u8) {
        (
            self.weights.get(id).copied().unwrap_or(self.default_weight),
            self.member_levels
                .get(id)
                .copied()
                .unwrap_or(self.default_level),
        )
    }
}

/// `priority` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a priority object")]
pub(super) struct RawPriority {
    levels: Option<Vec<String>>,
    members: Option<UniqueMap<String>>,
    default: Option<String>,
}

/// `when_exhausted` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object {\"model\": …}")]
pub(super) struct RawWhenExhausted {
    model: Option<String>,
}

/// The share settings of one limit, as written.
pub(super) struct RawShare {
    pub share: Option<serde_json::Value>,
    pub weights: Option<UniqueMap<f64>>,
    pub priority: Option<RawPriority>,
}

/// What the fair share needs to know of its limit.
pub(super) struct Host<'a> {
    pub scope: Scope,
    pub has_bucket: bool,
    pub max_wait_ms: u64,
    pub levels: &'a [GroupLevel],
}

/// Validates `share`, `weights` and `priority` of `limits[i]` (`f` names a field of it).
pub(super) fn fair(
    f: &dyn Fn(&str) -> String,
    raw: RawShare,
    host: &Host,
) -> Result<Option<Box<FairShare>>, ConfigError> {
    let (by, window_ms, max_members) = match raw.share {
        None => None,
        Some(v) => share(f, &v, host)?,
    }
    .map_or((None, 0, 0), |(b, w, m)| (Some(b), w, m));
    let Some(by) = by else {
        for (name, given) in [
            ("weights", raw.weights.is_some()),
            ("priority", raw.priority.is_some()),
        ] {
            if given {
                return Err(err(f(name), "needs share \"fair\""));
            }
        }
        return Ok(None);
    };
    let mut weights = HashMap::default();
    let mut default_weight = 1.0;
    for (id, w) in raw.weights.into_iter().flatten() {
        let field = format!("{}.{id}", f("weights"));
        let w = number_in(field.clone(), Some(w), WEIGHT_RANGE.0, WEIGHT_RANGE.1)?;
        if id == "*" {
            default_weight = w;
        } else {
            member_id(&field, &id)?;
            weights.insert(id, w);
        }
    }
    if weights.len() > MAX_LISTED {
        return Err(err(
            f("weights"),
            format!(
                "must list at most {MAX_LISTED} members, got {}",
                weights.len()
            ),
        ));
    }
    let (levels, member_levels, default_level) = match raw.priority {
        None => (vec!["default".to_string()], HashMap::default(), 0),
        Some(p) => priority(f, p)?,
    };
    Ok(Some(Box::new(FairShare {
        by,
        weights,
        default_weight,
        levels,
        member_levels,
        default_level,
        window_ns: window_ms.saturating_mul(1_000_000),
        max_members,
    })))
}

/// `share`: `"first_come"` (None), `"fair"` or `{"by", "window_ms", "max_members"}`.
fn share(
    f: &dyn Fn(&str) -> String,
    v: &serde_json::Value,
    host: &Host,
) -> Result<Option<(ShareBy, u64, u16)>, ConfigError> {
    use serde_json::Value;
    let (by, window_ms, max_members) = match v {
        Value::String(s) if s == "first_come" => return Ok(None),
        Value::String(s) if s == "fair" => (None, None, None),
        Value::Object(o) => {
            let mut by = None;
            let mut window = None;
            let mut members = None;
            for (k, v) in o {
                let field = format!("{}.{k}", f("share"));
                match k.as_str() {
                    "by" => match v.as_str() {
                        Some(s) => by = Some(s.to_string()),
                        None => return Err(err(field, "must be \"tenant\" or a level of groups")),
                    },
                    "window_ms" => match v.as_u64() {
                        Some(n) => window = Some(n),
                        None => {
                            return Err(err(
                                field,
                                format!(
                                    "must be a whole number of milliseconds between {} and {}",
                                    WINDOW_MS.0, WINDOW_MS.1
                                ),
                            ))
                        }
                    },
                    "max_members" => match v.as_u64() {
                        Some(n) => members = Some(n),
                        None => {
                            return Err(err(
                                field,
                                format!("must be a whole number between 2 and {MAX_MEMBERS}"),
                            ))
                        }
                    },
                    other => {
                        return Err(err(
                            field,
                            format!("unknown field `{other}`, expected one of `by`, `window_ms`, `max_members`"),
                        ))
                    }
                }
            }
            (by, window, members)
        }
        other => {
            return Err(err(
                f("share"),
                format!(
                    "must be \"fair\", \"first_come\" or an object {{\"by\": …, \"window_ms\": …, \"max_members\": …}}, got {other}"
                ),
            ))
        }
    };
    if matches!(host.scope, Scope::Tenant) {
        return Err(err(
            f("share"),
            "a tenant's own limit has one member to share with: fair sharing needs scope \"shared\" or a level of groups",
        ));
    }
    if !host.has_bucket {
        return Err(err(
            f("share"),
            "needs a token bucket (tokens_per_second and burst): in-flight caps are not shared fairly",
        ));
    }
    if host.max_wait_ms > 0 {
        return Err(err(
            f("max_wait_ms"),
            "must be 0 with share \"fair\": a held request would take its tokens out of turn",
        ));
    }
    let by = match by.as_deref() {
        None | Some("tenant") => ShareBy::Tenant,
        Some(name) => {
            let inside = |l: usize| match host.scope {
                Scope::Shared => true,
                Scope::Group(s) => l > s,
                Scope::Tenant => false,
            };
            match host.levels.iter().position(|g| g.name == name) {
                Some(l) if inside(l) => ShareBy::Level(l),
                _ => {
                    let names: Vec<&str> = host
                        .levels
                        .iter()
                        .enumerate()
                        .filter(|(l, _)| inside(*l))
                        .map(|(_, g)| g.name.as_str())
                        .collect();
                    return Err(err(
                        format!("{}.by", f("share")),
                        format!(
                            "must be \"tenant\" or a level of groups inside the limit's scope ({}), got \"{name}\"",
                            if names.is_empty() { "none".to_string() } else { names.join(", ") }
                        ),
                    ));
                }
            }
        }
    };
    let window_ms = window_ms.unwrap_or(WINDOW_MS.2);
    if !(WINDOW_MS.0..=WINDOW_MS.1).contains(&window_ms) {
        return Err(err(
            format!("{}.window_ms", f("share")),
            format!(
                "must be between {} and {}, got {window_ms}",
                WINDOW_MS.0, WINDOW_MS.1
            ),
        ));
    }
    let max_members = max_members.unwrap_or(u64::from(DEFAULT_MEMBERS));
    let max_members = match u16::try_from(max_members) {
        Ok(n) if (2..=MAX_MEMBERS).contains(&n) => n,
        _ => {
            return Err(err(
                format!("{}.max_members", f("share")),
                format!("must be between 2 and {MAX_MEMBERS}, got {max_members}"),
            ))
        }
    };
    Ok(Some((by, window_ms, max_members)))
}

/// A member id in `weights` or `priority.members`: a tenant or group id.
fn member_id(field: &str, id: &str) -> Result<(), ConfigError> {
    if valid_tenant(id) {
        Ok(())
    } else {
        Err(err(
            field,
            format!("'{id}' can never name a member: a tenant or group id, {TENANT_ID}, or \"*\""),
        ))
    }
}

type Levels = (Vec<String>, HashMap<String, u8, FnvBuild>, u8);

fn priority(f: &dyn Fn(&str) -> String, p: RawPriority) -> Result<Levels, ConfigError> {
    let field = |k: &str| format!("{}.{k}", f("priority"));
    let levels = p.levels.ok_or_else(|| {
        err(
            field("levels"),
            "is required: the level names, highest first",
        )
    })?;
    if levels.is_empty() || levels.len() > MAX_LEVELS {
        return Err(err(
            field("levels"),
            format!(
                "must name between 1 and {MAX_LEVELS} levels, got {}",
                levels.len()
            ),
        ));
    }
    for (i, name) in levels.iter().enumerate() {
        if !super::rules::valid_rule_name(name) {
            return Err(err(
                format!("{}[{i}]", field("levels")),
                format!("'{name}' is not a level name: 1-64 characters from [A-Za-z0-9._-]"),
            ));
        }
        if levels.iter().take(i).any(|l| l == name) {
            return Err(err(
                format!("{}[{i}]", field("levels")),
                format!("'{name}' is named twice"),
            ));
        }
    }
    let level_of = |at: String, name: &str| -> Result<u8, ConfigError> {
        levels
            .iter()
            .position(|l| l == name)
            .and_then(|i| u8::try_from(i).ok())
            .ok_or_else(|| {
                err(
                    at,
                    format!("'{name}' is not one of the levels ({})", levels.join(", ")),
                )
            })
    };
    let default_level = match p.default.as_deref() {
        None => 0,
        Some(name) => level_of(field("default"), name)?,
    };
    let mut member_levels = HashMap::default();
    for (id, level) in p.members.into_iter().flatten() {
        let at = format!("{}.{id}", field("members"));
        member_id(&at, &id)?;
        let l = level_of(at, &level)?;
        member_levels.insert(id, l);
    }
    if member_levels.len() > MAX_LISTED {
        return Err(err(
            field("members"),
            format!(
                "must list at most {MAX_LISTED} members, got {}",
                member_levels.len()
            ),
        ));
    }
    Ok((levels, member_levels, default_level))
}

/// Validates `when_exhausted` of `limits[i]`: one exact model; the limit must be able to refuse for want
/// of tokens or requests (a token bucket, not in shadow mode).
pub(super) fn when_exhausted(
    f: &dyn Fn(&str) -> String,
    raw: Option<RawWhenExhausted>,
    has_bucket: bool,
    shadow: bool,
) -> Result<Option<String>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let model = target(&f("when_exhausted"), raw)?;
    if !has_bucket {
        return Err(err(
            f("when_exhausted"),
            "needs a token bucket: a cheaper model does not free a slot of max_in_flight",
        ));
    }
    if shadow {
        return Err(err(
            f("when_exhausted"),
            "a shadow limit never refuses, so it never sends a request elsewhere",
        ));
    }
    Ok(Some(model))
}

/// The model of a `when_exhausted` object at `field`.
pub(super) fn target(field: &str, raw: RawWhenExhausted) -> Result<String, ConfigError> {
    let model = raw
        .model
        .ok_or_else(|| err(format!("{field}.model"), "is required"))?;
    if model.is_empty()
        || model.contains('*')
        || model.len() > 256
        || model.chars().any(char::is_control)
    {
        return Err(err(
            format!("{field}.model"),
            format!("'{model}' is not a model name: one exact model, no '*'"),
        ));
    }
    Ok(model)
}

/// Where a request can be sent when something refuses it: `(field, from, to)` edges for the load-time
/// check. `from` is the pattern of models the refusing limit matches (`Any` for a budget).
struct Edge<'a> {
    field: String,
    from: &'a ModelMatch,
    to: &'a str,
    /// The limit keeps one bucket for every model it matches (a downgrade it matches lands in the
    /// same spent bucket).
    one_bucket: bool,
}

/// A budget in money that sends refused requests to a model must know that model's price (an entry of
/// `quota.prices`, or `"*"`): otherwise it would be charged at the highest price listed, never less.
pub(super) fn priced_targets(
    budgets: &[super::Budget],
    prices: &[(String, crate::quota::Weights)],
    star: bool,
) -> Result<(), ConfigError> {
    for (i, b) in budgets.iter().enumerate() {
        if let Some(to) = b.when_exhausted.as_deref().filter(|_| !b.tokens) {
            if !star && !prices.iter().any(|(m, _)| m == to) {
                return Err(err(
                    format!("quota.budgets[{i}].when_exhausted.model"),
                    format!("'{to}' has no price in quota.prices (nor \"*\"): it would be charged at the highest price listed, never less"),
                ));
            }
        }
    }
    Ok(())
}

/// The load-time check of every `when_exhausted` (limits and budgets): a target must be limited (a rule
/// or limit with a token bucket matches it); a limit whose one bucket (`per_model: false`) also holds its
/// target could never admit the downgrade; and following targets from any model must never come back to
/// a model already left (no loop), in at most [`MAX_DOWNGRADE_HOPS`] hops. A target equal to the model
/// at hand is no hop: the request is refused there.
pub(super) fn downgrades(
    rules: &[Rule],
    limits: &[Rule],
    budgets: &[super::Budget],
) -> Result<(), ConfigError> {
    static ANY: ModelMatch = ModelMatch::Any;
    let mut edges: Vec<Edge> = Vec::new();
    for (i, l) in limits.iter().enumerate() {
        if let Some(to) = &l.when_exhausted {
            edges.push(Edge {
                field: format!("limits[{i}].when_exhausted.model"),
                from: &l.model,
                to,
                one_bucket: !l.per_model,
            });
        }
    }
    for (i, b) in budgets.iter().enumerate() {
        if let Some(to) = &b.when_exhausted {
            edges.push(Edge {
                field: format!("quota.budgets[{i}].when_exhausted.model"),
                from: &ANY,
                to,
                one_bucket: false,
            });
        }
    }
    for e in &edges {
        let limited = rules
            .iter()
            .chain(limits.iter())
            .any(|r| r.has_bucket && r.model.matches(e.to));
        if !limited {
            return Err(err(
                e.field.clone(),
                format!("'{}' is not limited: no rule or limit with a token bucket matches it, so a downgraded request would pass unlimited", e.to),
            ));
        }
        if e.one_bucket && e.from.matches(e.to) {
            return Err(err(
                e.field.clone(),
                format!("'{}' is charged to this limit's one bucket too (per_model is false): the downgraded request could never be admitted", e.to),
            ));
        }
    }
    for start in &edges {
        let mut path: Vec<&str> = vec![start.to];
        if let Some(found) = walk(&edges, &mut path) {
            return Err(err(start.field.clone(), found));
        }
    }
    Ok(())
}

/// Depth-first search from the last model of `path`; the message of the first loop or too long chain.
fn walk<'a>(edges: &[Edge<'a>], path: &mut Vec<&'a str>) -> Option<String> {
    let at = *path.last()?;
    for e in edges.iter().filter(|e| e.from.matches(at) && e.to != at) {
        if path.contains(&e.to) {
            let mut chain: Vec<&str> = path.clone();
            chain.push(e.to);
            return Some(format!(
                "downgrades loop: {} ({} sends '{at}' back)",
                chain.join(" -> "),
                e.field.trim_end_matches(".when_exhausted.model")
            ));
        }
        if path.len() >= MAX_DOWNGRADE_HOPS {
            return Some(format!(
                "downgrades chain longer than {MAX_DOWNGRADE_HOPS} hops: {} -> {}",
                path.join(" -> "),
                e.to
            ));
        }
        path.push(e.to);
        if let Some(m) = walk(edges, path) {
            return Some(m);
        }
        path.pop();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    /// A config with group levels org and team, a gpt-4.1-mini limit, and `limit` as limits[0].
    fn with_limit(limit: &str) -> String {
        format!(
            r#"{{"tenant_header": "x-tenant-id","trusted_headers": {{"set_by": "the test"}}, "groups": [{{"name": "org", "header": "x-org"}}, {{"name": "team", "header": "x-team"}}],
                "limits": [{limit}, {{"name": "mini", "model": "gpt-4.1-mini", "tokens_per_second": 10, "burst": 10}}]}}"#
        )
    }

    #[test]
    fn a_fair_limit_parses_with_weights_priorities_and_a_downgrade() {
        let c = parse_str(&with_limit(
            r#"{"name": "p", "model": "gpt-4.1", "scope": "shared", "tokens_per_second": 3000, "burst": 10000,
                "share": {"by": "team", "window_ms": 2000, "max_members": 16},
                "weights": {"search": 2, "*": 0.5},
                "priority": {"levels": ["interactive", "batch"], "members": {"etl": "batch"}, "default": "interactive"},
                "when_exhausted": {"model": "gpt-4.1-mini"}}"#,
        ))
        .unwrap();
        let l = &c.limits[0];
        let f = l.fair.as_deref().unwrap();
        assert_eq!(f.by, ShareBy::Level(1));
        assert_eq!(f.window_ns, 2_000_000_000);
        assert_eq!(f.max_members, 16);
        assert_eq!(f.weight_and_level("search"), (2.0, 0));
        assert_eq!(f.weight_and_level("etl"), (0.5, 1));
        assert_eq!(f.weight_and_level("other"), (0.5, 0));
        assert_eq!(l.when_exhausted.as_deref(), Some("gpt-4.1-mini"));
        let c = parse_str(&with_limit(
            r#"{"scope": "shared", "tokens_per_second": 1, "burst": 1, "share": "fair"}"#,
        ))
        .unwrap();
        let f = c.limits[0].fair.as_deref().unwrap();
        assert_eq!(
            (f.by, f.window_ns, f.max_members, f.levels.len()),
            (ShareBy::Tenant, 1_000_000_000, DEFAULT_MEMBERS, 1)
        );
        let c = parse_str(&with_limit(
            r#"{"scope": "shared", "tokens_per_second": 1, "burst": 1, "share": "first_come"}"#,
        ))
        .unwrap();
        assert!(c.limits[0].fair.is_none());
    }

    #[test]
    fn bad_share_settings_are_refused_naming_the_field() {
        let b = r#""tokens_per_second": 10, "burst": 10"#;
        for (limit, want) in [
            (
                format!(r#"{{{b}, "share": "fair"}}"#),
                "limits[0].share: a tenant's own limit has one member to share with: fair sharing needs scope \"shared\" or a level of groups",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "share": "equal"}}"#),
                "limits[0].share: must be \"fair\", \"first_come\" or an object {\"by\": …, \"window_ms\": …, \"max_members\": …}, got \"equal\"",
            ),
            (
                r#"{"scope": "shared", "max_in_flight": 3, "share": "fair"}"#.to_string(),
                "limits[0].share: needs a token bucket (tokens_per_second and burst): in-flight caps are not shared fairly",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "share": "fair", "max_wait_ms": 100}}"#),
                "limits[0].max_wait_ms: must be 0 with share \"fair\": a held request would take its tokens out of turn",
            ),
            (
                format!(r#"{{{b}, "scope": "team", "share": {{"by": "org"}}}}"#),
                "limits[0].share.by: must be \"tenant\" or a level of groups inside the limit's scope (none), got \"org\"",
            ),
            (
                format!(r#"{{{b}, "scope": "org", "share": {{"by": "dept"}}}}"#),
                "limits[0].share.by: must be \"tenant\" or a level of groups inside the limit's scope (team), got \"dept\"",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "share": {{"window_ms": 50}}}}"#),
                "limits[0].share.window_ms: must be between 100 and 60000, got 50",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "share": {{"max_members": 1}}}}"#),
                "limits[0].share.max_members: must be between 2 and 256, got 1",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "share": {{"members": 3}}}}"#),
                "limits[0].share.members: unknown field `members`, expected one of `by`, `window_ms`, `max_members`",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "weights": {{"a": 2}}}}"#),
                "limits[0].weights: needs share \"fair\"",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "share": "fair", "weights": {{"a": 0}}}}"#),
                "limits[0].weights.a: must be between 0.01 and 1000, got 0",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "share": "fair", "weights": {{"a b": 1}}}}"#),
                "limits[0].weights.a b: 'a b' can never name a member: a tenant or group id, 1-128 characters from [A-Za-z0-9._:@-], or \"*\"",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "share": "fair", "priority": {{"members": {{"a": "x"}}}}}}"#),
                "limits[0].priority.levels: is required: the level names, highest first",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "share": "fair", "priority": {{"levels": ["hi", "hi"]}}}}"#),
                "limits[0].priority.levels[1]: 'hi' is named twice",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "share": "fair", "priority": {{"levels": ["hi", "lo"], "members": {{"a": "mid"}}}}}}"#),
                "limits[0].priority.members.a: 'mid' is not one of the levels (hi, lo)",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "share": "fair", "priority": {{"levels": ["hi"], "default": "lo"}}}}"#),
                "limits[0].priority.default: 'lo' is not one of the levels (hi)",
            ),
            (
                format!(r#"{{{b}, "scope": "shared", "share": "fair", "priority": {{"levels": ["1","2","3","4","5","6","7","8","9"]}}}}"#),
                "limits[0].priority.levels: must name between 1 and 8 levels, got 9",
            ),
        ] {
            assert_eq!(refusal(&with_limit(&limit)), want, "{limit}");
        }
    }

    #[test]
    fn downgrades_that_loop_or_go_nowhere_are_refused_at_load() {
        let lim = |name: &str, model: &str, to: &str, per_model: bool| {
            format!(
                r#"{{"name": "{name}", "model": "{model}", "scope": "shared", "tokens_per_second": 10, "burst": 10, "per_model": {per_model}, "when_exhausted": {{"model": "{to}"}}}}"#
            )
        };
        let cfg = |limits: &[String]| {
            format!(
                r#"{{"tenant_header": "x-tenant-id","trusted_headers": {{"set_by": "the test"}}, "limits": [{}]}}"#,
                limits.join(",")
            )
        };
        // A chain and a fixed point (a limit matching its own target, per model) are fine.
        parse_str(&cfg(&[
            lim("a", "gpt-4.1", "gpt-4.1-mini", true),
            lim("b", "gpt-4.1-mini", "gpt-4.1-nano", true),
            r#"{"name": "n", "model": "gpt-4.1-nano", "tokens_per_second": 1, "burst": 1}"#.into(),
        ]))
        .unwrap();
        parse_str(&cfg(&[lim("a", "gpt-4*", "gpt-4.1-mini", true)])).unwrap();
        for (limits, want) in [
            (
                vec![
                    lim("a", "gpt-4.1", "gpt-4o", true),
                    lim("b", "gpt-4o", "gpt-4.1", true),
                ],
                "limits[0].when_exhausted.model: downgrades loop: gpt-4o -> gpt-4.1 -> gpt-4o (limits[0] sends 'gpt-4.1' back)",
            ),
            (
                vec![lim("a", "gpt-4.1", "gpt-4.1-mini", true)],
                "limits[0].when_exhausted.model: 'gpt-4.1-mini' is not limited: no rule or limit with a token bucket matches it, so a downgraded request would pass unlimited",
            ),
            (
                vec![lim("a", "gpt-4*", "gpt-4.1-mini", false)],
                "limits[0].when_exhausted.model: 'gpt-4.1-mini' is charged to this limit's one bucket too (per_model is false): the downgraded request could never be admitted",
            ),
            (
                vec![lim("a", "x", "gpt-*", true)],
                "limits[0].when_exhausted.model: 'gpt-*' is not a model name: one exact model, no '*'",
            ),
            (
                vec![
                    r#"{"name": "a", "max_in_flight": 2, "when_exhausted": {"model": "m"}}"#.into(),
                ],
                "limits[0].when_exhausted: needs a token bucket: a cheaper model does not free a slot of max_in_flight",
            ),
            (
                vec![
                    r#"{"name": "a", "tokens_per_second": 1, "burst": 1, "shadow": true, "when_exhausted": {"model": "m"}}"#.into(),
                ],
                "limits[0].when_exhausted: a shadow limit never refuses, so it never sends a request elsewhere",
            ),
            (
                vec![r#"{"name": "a", "tokens_per_second": 1, "burst": 1, "when_exhausted": {}}"#.into()],
                "limits[0].when_exhausted.model: is required",
            ),
        ] {
            assert_eq!(refusal(&cfg(&limits)), want);
        }
        // A chain longer than MAX_DOWNGRADE_HOPS.
        let models = ["m0", "m1", "m2", "m3", "m4", "m5"];
        let chain: Vec<String> = models
            .windows(2)
            .map(|w| lim(w[0], w[0], w[1], true))
            .chain([
                r#"{"name": "last", "model": "m5", "tokens_per_second": 1, "burst": 1}"#
                    .to_string(),
            ])
            .collect();
        assert!(refusal(&cfg(&chain)).contains("downgrades chain longer than 4 hops"));
    }

    #[test]
    fn a_budget_downgrades_only_to_a_priced_and_limited_model() {
        let q = |budget_extra: &str, prices: &str| {
            format!(
                r#"{{"tenant_header": "x-tenant-id","trusted_headers": {{"set_by": "the test"}},
                    "limits": [{{"name": "l", "model": "gpt-4.1*", "tokens_per_second": 1, "burst": 1}}],
                    "quota": {{"cluster": "w", "prices": {prices},
                      "budgets": [{{"name": "spend", "monthly_limit": 10{budget_extra}}}]}}}}"#
            )
        };
        let ok = q(
            r#", "when_exhausted": {"model": "gpt-4.1-mini"}"#,
            r#"{"gpt-4.1": {"input": 2, "output": 8}, "gpt-4.1-mini": {"input": 0.4, "output": 1.6}}"#,
        );
        let c = parse_str(&ok).unwrap();
        assert_eq!(
            c.quota.unwrap().budgets.list[0].when_exhausted.as_deref(),
            Some("gpt-4.1-mini")
        );
        assert_eq!(
            refusal(&q(
                r#", "when_exhausted": {"model": "gpt-4.1-mini"}"#,
                r#"{"gpt-4.1": {"input": 2, "output": 8}}"#
            )),
            "quota.budgets[0].when_exhausted.model: 'gpt-4.1-mini' has no price in quota.prices (nor \"*\"): it would be charged at the highest price listed, never less"
        );
        assert_eq!(
            refusal(&q(
                r#", "when_exhausted": {"model": "o3"}"#,
                r#"{"*": {"input": 2, "output": 8}}"#
            )),
            "quota.budgets[0].when_exhausted.model: 'o3' is not limited: no rule or limit with a token bucket matches it, so a downgraded request would pass unlimited"
        );
    }
}
