//! `quota.budgets` and `quota.prices`: monthly budgets in money, kept in the quota's Redis and reserved
//! and settled exactly like token quotas:
//! ```json
//! "quota": {"cluster": "webdis", "currency": "USD",
//!   "prices": {"gpt-4.1": {"input": 2.00, "output": 8.00, "cached_input": 0.50},
//!              "gpt-4.1-mini": {"input": 0.40, "output": 1.60}},
//!   "budgets": [{"name": "team-spend", "scope": "team", "monthly_limit": 500},
//!               {"name": "org-spend", "scope": "shared", "monthly_limit": 20000}]}
//! ```
//! Prices are per million tokens in the currency; amounts are counted in **micro-units** (10⁻⁶ of the
//! currency: a token of a model at $2.00 per million costs 2 micro-dollars), so every amount is an exact
//! integer. A request's charge is rounded up to the next micro-unit. A model without a price of its own
//! takes the `"*"` entry, else the highest price listed for each kind (never charged low).

use super::fields::TENANT_ID;
use super::rules::Scope;
use super::shape::UniqueMap;
use super::{err, ConfigError, GroupLevel};
use crate::quota::Weights;
use serde::Deserialize;

/// Most budgets.
pub const MAX_BUDGETS: usize = 16;
/// The unit of a token budget's amounts (whole weighted tokens, not micro-units).
pub const TOKENS: &str = "tokens";
/// Micro-units per currency unit.
pub const MICRO: f64 = 1e6;

/// One validated budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// Name (in keys, headers, logs).
    pub name: String,
    /// Whose budget: per tenant, per group at a level, or one shared.
    pub scope: Scope,
    /// Only this tenant, when set.
    pub tenant: Option<String>,
    /// Only this group (exact), when set.
    pub group: Option<String>,
    /// Monthly limit: micro-units of the currency, or weighted tokens for a token budget.
    pub limit: u64,
    /// A budget of weighted tokens (`"unit": "tokens"`, priced by `quota.weights`) rather than money.
    pub tokens: bool,
    /// What a request does when the shim cannot answer.
    pub on_failure: super::QuotaFailure,
    /// The model a request this budget cannot cover is sent to instead (`when_exhausted`).
    pub when_exhausted: Option<String>,
}

impl Budget {
    /// True when the budget applies to a request of `tenant` in `groups`.
    pub fn applies(&self, tenant: &str, groups: &[Option<String>]) -> bool {
        if self.tenant.as_deref().is_some_and(|t| t != tenant) {
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

    /// The quota account of the budget for a request: `~b:<name>:<subject>` (`~` never appears in a
    /// tenant id, so an account never collides with a tenant's own).
    pub fn account(
        &self,
        tenant: &str,
        levels: &[GroupLevel],
        groups: &[Option<String>],
    ) -> String {
        format!(
            "~b:{}:{}",
            self.name,
            self.scope.subject(tenant, levels, groups)
        )
    }
}

/// Budgets, prices and the currency's name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Budgets {
    /// The budgets, in order.
    pub list: Vec<Budget>,
    /// Prices per model (micro-units per token = currency per million tokens).
    pub prices: Vec<(String, Weights)>,
    /// For a model not listed.
    pub default_price: Weights,
    /// The currency's name, for headers and messages (`USD`).
    pub currency: String,
}

impl Budgets {
    /// What a budget's amounts are counted in, for headers and messages: the currency, or
    /// [`TOKENS`].
    pub fn unit<'a>(&'a self, b: &Budget) -> &'a str {
        if b.tokens {
            TOKENS
        } else {
            &self.currency
        }
    }

    /// A model's price, micro-units per token.
    pub fn price(&self, model: &str) -> Weights {
        self.prices
            .iter()
            .find(|(m, _)| m == model)
            .map_or(self.default_price, |(_, w)| *w)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a budget object")]
pub(super) struct RawBudget {
    name: Option<String>,
    scope: Option<String>,
    tenant: Option<String>,
    group: Option<String>,
    monthly_limit: Option<f64>,
    on_failure: Option<String>,
    unit: Option<String>,
    when_exhausted: Option<super::fair::RawWhenExhausted>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a price object")]
pub(super) struct RawPrice {
    input: Option<f64>,
    output: Option<f64>,
    cached_input: Option<f64>,
}

/// Largest amount: Lua numbers are exact up to 2^53 (micro-units: about 9 billion currency units).
const MAX_MICROS: f64 = 9_007_199_254_740_991.0;

/// Validates `quota.budgets`, `quota.prices` and `quota.currency`.
pub(super) fn budgets(
    raw: Option<Vec<RawBudget>>,
    prices: Option<UniqueMap<RawPrice>>,
    currency: Option<String>,
    levels: &[GroupLevel],
    default_failure: super::QuotaFailure,
) -> Result<Budgets, ConfigError> {
    let raw = raw.unwrap_or_default();
    if raw.len() > MAX_BUDGETS {
        return Err(err(
            "quota.budgets",
            format!("must hold at most {MAX_BUDGETS} budgets, got {}", raw.len()),
        ));
    }
    let currency_given = currency.is_some();
    let currency = currency.unwrap_or_else(|| "USD".to_string());
    if !(1..=8).contains(&currency.len()) || !currency.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(err(
            "quota.currency",
            format!("'{currency}' is not a currency code: 1-8 letters (USD, EUR)"),
        ));
    }
    let mut list: Vec<Budget> = Vec::new();
    for (i, b) in raw.into_iter().enumerate() {
        let f = |name: &str| format!("quota.budgets[{i}].{name}");
        let name = b.name.unwrap_or_else(|| format!("budget{i}"));
        if !super::rules::valid_rule_name(&name) {
            return Err(err(
                f("name"),
                format!("'{name}' is not a valid budget name: 1-64 characters from [A-Za-z0-9._-]"),
            ));
        }
        if list.iter().any(|x| x.name == name) {
            return Err(err(f("name"), format!("duplicate budget name '{name}'")));
        }
        let scope = match b.scope.as_deref() {
            None | Some("tenant") => Scope::Tenant,
            Some("shared") => Scope::Shared,
            Some(other) => match levels.iter().position(|l| l.name == other) {
                Some(l) => Scope::Group(l),
                None => {
                    return Err(err(
                        f("scope"),
                        format!(
                            "must be \"tenant\", \"shared\" or a level of groups, got \"{other}\""
                        ),
                    ))
                }
            },
        };
        if b.group.is_some() && !matches!(scope, Scope::Group(_)) {
            return Err(err(f("group"), "needs a group scope"));
        }
        for (field, v) in [("tenant", &b.tenant), ("group", &b.group)] {
            if let Some(v) = v {
                if !crate::identity::valid_tenant(v) {
                    return Err(err(f(field), format!("'{v}' is not an id: {TENANT_ID}")));
                }
            }
        }
        let tokens = match b.unit.as_deref() {
            None | Some("money") => false,
            Some("tokens") => true,
            Some(o) => {
                return Err(err(
                    f("unit"),
                    format!("'{o}' is not one of \"money\", \"tokens\""),
                ))
            }
        };
        let limit = b
            .monthly_limit
            .ok_or_else(|| err(f("monthly_limit"), "is required"))?;
        let limit = if tokens {
            if !(limit.is_finite() && limit.fract() == 0.0 && (1.0..=MAX_MICROS).contains(&limit)) {
                return Err(err(
                    f("monthly_limit"),
                    format!("must be a whole number of tokens between 1 and 9007199254740991, got {limit}"),
                ));
            }
            limit as u64
        } else {
            let micros = (limit * MICRO).round();
            if !limit.is_finite() || !(1.0..=MAX_MICROS).contains(&micros) {
                return Err(err(
                    f("monthly_limit"),
                    format!("must be between 0.000001 and 9007199254 (currency units, counted in millionths), got {limit}"),
                ));
            }
            micros as u64
        };
        let on_failure = match b.on_failure.as_deref() {
            None => default_failure,
            Some("open") => super::QuotaFailure::Open,
            Some("closed") => super::QuotaFailure::Closed,
            Some(o) => {
                return Err(err(
                    f("on_failure"),
                    format!("'{o}' is not one of \"open\", \"closed\""),
                ))
            }
        };
        let when_exhausted = b
            .when_exhausted
            .map(|w| super::fair::target(&f("when_exhausted"), w))
            .transpose()?;
        list.push(Budget {
            name,
            scope,
            tenant: b.tenant,
            group: b.group,
            limit,
            tokens,
            on_failure,
            when_exhausted,
        });
    }
    let mut out = Budgets {
        list,
        currency,
        ..Budgets::default()
    };
    let mut star = None;
    for (m, p) in prices.into_iter().flatten() {
        let field = |k: &str| format!("quota.prices.{m}.{k}");
        let (Some(input), Some(output)) = (p.input, p.output) else {
            return Err(err(
                format!("quota.prices.{m}"),
                "needs input and output (currency per million tokens)",
            ));
        };
        let w = Weights {
            input,
            output,
            cached_input: p.cached_input.unwrap_or(input),
            reasoning: output,
        };
        if let Err(k) = w.validate() {
            return Err(err(field(k), "must be a number >= 0"));
        }
        if w.input > 1e9 || w.output > 1e9 || w.cached_input > 1e9 {
            return Err(err(
                format!("quota.prices.{m}"),
                "a price above 1e9 per million tokens is surely a mistake",
            ));
        }
        if m == "*" {
            star = Some(w);
        } else {
            if m.contains('*') {
                return Err(err(
                    format!("quota.prices.{m}"),
                    format!("'{m}' is not a model: prices name exact models, and \"*\" the others"),
                ));
            }
            out.prices.push((m, w));
        }
    }
    let money = out.list.iter().any(|b| !b.tokens);
    if !money && (currency_given || !out.prices.is_empty() || star.is_some()) {
        let field = if currency_given {
            "quota.currency"
        } else {
            "quota.prices"
        };
        return Err(err(
            field,
            "applies to budgets in money only, and quota.budgets has no budget in money (\"unit\": \"money\", the default): add one or remove this field",
        ));
    }
    if money && out.prices.is_empty() && star.is_none() {
        return Err(err(
            "quota.prices",
            "is required with budgets: the price per million tokens of each model (a \"*\" entry for the others)",
        ));
    }
    super::fair::priced_targets(&out.list, &out.prices, star.is_some())?;
    out.default_price = star.unwrap_or_else(|| {
        // The highest price of each kind: a model nobody priced is never charged low.
        out.prices.iter().fold(
            Weights {
                input: 0.0,
                output: 0.0,
                cached_input: 0.0,
                reasoning: 0.0,
            },
            |a, (_, w)| Weights {
                input: a.input.max(w.input),
                output: a.output.max(w.output),
                cached_input: a.cached_input.max(w.cached_input),
                reasoning: a.reasoning.max(w.reasoning),
            },
        )
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn budgets_parse_in_micro_units_and_unpriced_models_take_the_highest_price() {
        let c = parse_str(
            r#"{"tenant_header": "x-t", "groups": [{"name": "team", "header": "x-team"}], "trusted_headers": {"set_by": "ext_authz"},
                "rules": [{"tokens_per_second": 1, "burst": 1}],
                "quota": {"cluster": "webdis", "currency": "EUR",
                  "prices": {"a": {"input": 2, "output": 8, "cached_input": 0.5}, "b": {"input": 3, "output": 1}},
                  "budgets": [{"name": "t", "scope": "team", "monthly_limit": 500.25}]}}"#,
        )
        .unwrap();
        let q = c.quota.unwrap();
        assert_eq!(
            q.default.monthly_limit, 0,
            "no token quota without monthly_limit"
        );
        let b = &q.budgets;
        assert_eq!(b.currency, "EUR");
        assert_eq!(b.list[0].limit, 500_250_000);
        assert_eq!(b.list[0].scope, super::Scope::Group(0));
        assert_eq!(b.price("a").cached_input, 0.5);
        let other = b.price("zzz");
        assert_eq!(
            (other.input, other.output, other.cached_input),
            (3.0, 8.0, 3.0)
        );
        assert_eq!(
            b.list[0].account("alice", &c.groups, &[Some("red".into())]),
            "~b:t:team=red"
        );
    }

    #[test]
    fn bad_budgets_are_refused_naming_the_field() {
        for (quota, want) in [
            (
                r#""budgets": [{"monthly_limit": 5}]"#,
                "quota.prices: is required with budgets: the price per million tokens of each model (a \"*\" entry for the others)",
            ),
            (
                r#""prices": {"*": {"input": 1}}, "budgets": [{"monthly_limit": 5}]"#,
                "quota.prices.*: needs input and output (currency per million tokens)",
            ),
            (
                r#""prices": {"*": {"input": 1, "output": 1}}, "budgets": [{"monthly_limit": 0}]"#,
                "quota.budgets[0].monthly_limit: must be between 0.000001 and 9007199254 (currency units, counted in millionths), got 0",
            ),
            (
                r#""budgets": [{"monthly_limit": 1.5, "unit": "tokens"}]"#,
                "quota.budgets[0].monthly_limit: must be a whole number of tokens between 1 and 9007199254740991, got 1.5",
            ),
            (
                r#""budgets": [{"monthly_limit": 1, "unit": "eur"}]"#,
                "quota.budgets[0].unit: 'eur' is not one of \"money\", \"tokens\"",
            ),
            (
                r#""prices": {"*": {"input": 1, "output": -1}}, "budgets": [{"monthly_limit": 1}]"#,
                "quota.prices.*.output: must be a number >= 0",
            ),
            (
                r#""prices": {"*": {"input": 1, "output": 1}}, "budgets": [{"monthly_limit": 1, "scope": "team"}]"#,
                "quota.budgets[0].scope: must be \"tenant\", \"shared\" or a level of groups, got \"team\"",
            ),
            (
                r#""prices": {"gpt-*": {"input": 1, "output": 1}}, "budgets": [{"monthly_limit": 1}]"#,
                "quota.prices.gpt-*: 'gpt-*' is not a model: prices name exact models, and \"*\" the others",
            ),
            (
                r#""prices": {"*": {"input": 1, "output": 1}}, "budgets": [{"name": "rule0", "monthly_limit": 1}]"#,
                "quota.budgets[0].name: 'rule0' is also a rule or limit name: x-tokengate-limit must name one thing",
            ),
            (r#""monthly_limit": 5, "currency": "US$""#, "quota.currency: 'US$' is not a currency code: 1-8 letters (USD, EUR)"),
            (
                r#""prices": {"*": {"input": 1, "output": 1}}"#,
                "quota.monthly_limit: is required (or give budgets: a quota of money only)",
            ),
            (
                r#""monthly_limit": 5, "currency": "EUR""#,
                "quota.currency: applies to budgets in money only, and quota.budgets has no budget in money (\"unit\": \"money\", the default): add one or remove this field",
            ),
            (
                r#""monthly_limit": 5, "prices": {"*": {"input": 1, "output": 1}}, "budgets": [{"monthly_limit": 9, "unit": "tokens"}]"#,
                "quota.prices: applies to budgets in money only, and quota.budgets has no budget in money (\"unit\": \"money\", the default): add one or remove this field",
            ),
        ] {
            let cfg = format!(
                r#"{{"rules": [{{"tokens_per_second": 1, "burst": 1}}], "quota": {{"cluster": "webdis", {quota}}}}}"#
            );
            assert_eq!(refusal(&cfg), want, "{quota}");
        }
    }
}
