//! `rules`: the bucket rules, first match wins. Each rule names a tenant (`"*"` = every tenant, its own
//! bucket each) and a model pattern (an exact name, `"prefix*"` or `"*"`), and gives its bucket's rates:
//! `{"name": "gpt", "tenant": "*", "model": "gpt-4*", "tokens_per_second": 300000, "burst": 2000000,
//! "requests_per_minute": 600, "per_model": true, "max_wait_ms": 0, "refund_unused": false,
//! "global": false}`. A rule that an earlier one shadows is refused.

use super::fields::{in_range, number_in, show, TENANT_ID};
use super::{err, ConfigError};
use crate::limits::bucket::BucketParams;
use serde::Deserialize;

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
    pub(super) fn parse(s: &str) -> Option<Self> {
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
    pub(super) fn pattern(&self) -> String {
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

/// Whose bucket a limit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// One per tenant (every `rules` entry; the default of `limits`).
    Tenant,
    /// One per group of the level with this index in `groups` (outermost first: org, team); a request
    /// without a group at that level skips the limit.
    Group(usize),
    /// One for every request the limit matches (a provider's own limit).
    Shared,
}

impl Scope {
    /// Whose bucket, semaphore or budget it is for a request: see [`Rule::subject`].
    pub fn subject<'a>(
        self,
        tenant: &'a str,
        levels: &[super::GroupLevel],
        groups: &[Option<String>],
    ) -> std::borrow::Cow<'a, str> {
        match self {
            Scope::Tenant => std::borrow::Cow::Borrowed(tenant),
            Scope::Group(l) => {
                let mut s = String::new();
                for (i, level) in levels.iter().enumerate().take(l.saturating_add(1)) {
                    if i > 0 {
                        s.push('/');
                    }
                    s.push_str(&level.name);
                    s.push('=');
                    s.push_str(groups.get(i).and_then(Option::as_deref).unwrap_or("-"));
                }
                std::borrow::Cow::Owned(s)
            }
            Scope::Shared => std::borrow::Cow::Borrowed("~all"),
        }
    }

    /// The name in the configuration (a group level's own name for [`Scope::Group`]).
    pub fn as_str(self, levels: &[super::GroupLevel]) -> &str {
        match self {
            Scope::Tenant => "tenant",
            Scope::Group(l) => levels.get(l).map_or("group", |g| g.name.as_str()),
            Scope::Shared => "shared",
        }
    }
}

/// One validated bucket rule (`rules`: first match wins) or limit (`limits`: every match applies).
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
    /// Whose bucket it is.
    pub scope: Scope,
    /// Only this group (exact), when set (`limits` only).
    pub group: Option<String>,
    /// The limit has a token bucket (`params`); a `limits` entry may have only `max_in_flight`.
    pub has_bucket: bool,
    /// Requests of the scope in flight at once, at most (`limits` only).
    pub max_in_flight: Option<u32>,
    /// Evaluated and counted, never refusing (`limits` only).
    pub shadow: bool,
    /// An entry of `limits` (not of `rules`): named "limit" in messages.
    pub is_limit: bool,
    /// Fair sharing of the bucket among its members (`share: "fair"`, `limits` only).
    pub fair: Option<Box<super::FairShare>>,
    /// The model a request this limit refuses for want of tokens or requests is sent to instead
    /// (`when_exhausted`, `limits` only).
    pub when_exhausted: Option<String>,
}

impl Rule {
    /// "rule" or "limit", for messages.
    pub fn kind(&self) -> &'static str {
        if self.is_limit {
            "limit"
        } else {
            "rule"
        }
    }

    /// True when the rule applies to `tenant` (model not considered).
    pub fn matches_tenant(&self, tenant: &str) -> bool {
        self.tenant.as_deref().is_none_or(|t| t == tenant)
    }

    /// True when the limit applies to a request of `tenant` in `groups` (one per level of `groups`,
    /// outermost first) for `model`.
    pub fn applies(&self, tenant: &str, groups: &[Option<String>], model: &str) -> bool {
        if !self.matches_tenant(tenant) || !self.model.matches(model) {
            return false;
        }
        match self.scope {
            Scope::Group(l) => match groups.get(l).and_then(Option::as_deref) {
                None => false,
                Some(g) => self.group.as_deref().is_none_or(|want| want == g),
            },
            _ => true,
        }
    }

    /// Whose bucket it is for a request: the tenant; a group as its path from the outermost level
    /// (`org=acme/team=eng`: a team is inside its org, so two orgs' teams named alike never share);
    /// or `~all`. Tenant ids and group ids never contain `=`, `/` or `~`, so these never collide.
    pub fn subject<'a>(
        &self,
        tenant: &'a str,
        levels: &[super::GroupLevel],
        groups: &[Option<String>],
    ) -> std::borrow::Cow<'a, str> {
        self.scope.subject(tenant, levels, groups)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a rule object")]
pub(super) struct RawRule {
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

/// Longest shaping hold accepted.
pub const MAX_WAIT_MS_LIMIT: u64 = 60_000;
/// Most bucket rules.
pub const MAX_RULES: usize = 256;
/// What a rule name is, for messages: it goes into shared-data and Redis keys, logs and error bodies.
const RULE_NAME: &str = "1-64 characters from [A-Za-z0-9._-]";
/// Longest rule name.
pub const MAX_RULE_NAME_LEN: usize = 64;
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

pub(super) fn valid_rule_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_RULE_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A model pattern (`rules[].model`, `models` keys): `*` alone or once at the end, nowhere else.
pub(super) fn model_pattern(field: &str, s: &str) -> Result<ModelMatch, ConfigError> {
    ModelMatch::parse(s).ok_or_else(|| {
        err(
            field,
            format!("'{s}' is not a model pattern: use an exact name, \"prefix*\" or \"*\" ('*' only once, at the end)"),
        )
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

/// Validates `rules` (required, 1 to [`MAX_RULES`]) in order, then refuses a rule an earlier one shadows.
pub(super) fn rules(raw: Option<Vec<RawRule>>) -> Result<Vec<Rule>, ConfigError> {
    let raw_rules = raw.ok_or_else(|| err("rules", "is required"))?;
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
        let rule = rule(i, r, &rules)?;
        rules.push(rule);
    }
    unreachable_rule(&rules)?;
    Ok(rules)
}

/// A bucket's rates at `f(..)`: `tokens_per_second` and `burst` required, `requests_per_minute` optional.
pub(super) fn bucket(
    f: &dyn Fn(&str) -> String,
    tokens_per_second: Option<f64>,
    burst: Option<f64>,
    requests_per_minute: Option<f64>,
) -> Result<BucketParams, ConfigError> {
    let rate = number_in(
        f("tokens_per_second"),
        tokens_per_second,
        MIN_TOKENS_PER_SECOND,
        MAX_RATE,
    )?;
    let burst = number_in(f("burst"), burst, 1.0, MAX_RATE)?;
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
    let rpm = match requests_per_minute {
        None => None,
        Some(v) => Some(number_in(f("requests_per_minute"), Some(v), 1.0, MAX_RATE)?),
    };
    Ok(BucketParams {
        tokens_per_second: rate,
        burst,
        requests_per_minute: rpm,
    })
}

/// A `tenant` field: `"*"` (or absent) for every tenant, else one exact tenant id.
pub(super) fn tenant_pattern(
    field: String,
    t: Option<&str>,
) -> Result<Option<String>, ConfigError> {
    match t {
        None | Some("*") => Ok(None),
        Some("") => Err(err(field, "must not be empty (use \"*\")")),
        Some(t) if crate::identity::valid_tenant(t) => Ok(Some(t.to_string())),
        Some(t) => Err(err(
            field,
            format!("'{t}' can never match a tenant: use \"*\" or one exact tenant id, {TENANT_ID} (tenant patterns are not globs)"),
        )),
    }
}

/// A `model` field (absent: `"*"`).
pub(super) fn model_field(field: String, m: Option<String>) -> Result<ModelMatch, ConfigError> {
    let model_s = m.unwrap_or_else(|| "*".to_string());
    if model_s.is_empty() {
        return Err(err(field, "must not be empty (use \"*\")"));
    }
    model_pattern(&field, &model_s)
}

/// A rule or limit name, distinct from `taken`.
pub(super) fn name_field(
    field: String,
    name: String,
    taken: &[&str],
) -> Result<String, ConfigError> {
    if !valid_rule_name(&name) {
        return Err(err(
            field,
            format!("'{name}' is not a valid rule name: {RULE_NAME}"),
        ));
    }
    if taken.contains(&name.as_str()) {
        return Err(err(field, format!("duplicate rule name '{name}'")));
    }
    Ok(name)
}

/// Validates `rules[i]`; `earlier` are the rules before it (names must be distinct).
fn rule(i: usize, r: RawRule, earlier: &[Rule]) -> Result<Rule, ConfigError> {
    let f = |name: &str| format!("rules[{i}].{name}");
    let params = bucket(&f, r.tokens_per_second, r.burst, r.requests_per_minute)?;
    let max_wait_ms = in_range(
        f("max_wait_ms"),
        r.max_wait_ms.unwrap_or(0),
        0,
        MAX_WAIT_MS_LIMIT,
    )?;
    let tenant = tenant_pattern(f("tenant"), r.tenant.as_deref())?;
    let model = model_field(f("model"), r.model)?;
    let name = name_field(
        f("name"),
        r.name.unwrap_or_else(|| format!("rule{i}")),
        &earlier.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(),
    )?;
    Ok(Rule {
        name,
        tenant,
        model,
        per_model: r.per_model.unwrap_or(true),
        params,
        max_wait_ms,
        refund_unused: r.refund_unused.unwrap_or(false),
        global: r.global.unwrap_or(false),
        scope: Scope::Tenant,
        group: None,
        has_bucket: true,
        is_limit: false,
        max_in_flight: None,
        shadow: false,
        fair: None,
        when_exhausted: None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

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
}
