//! `tokengate usage`: the month's chargeback report from the counters in Redis, per account (a tenant's
//! token quota, a budget's subject), per model or per budget, as a table, CSV or JSON, with totals per
//! unit. Amounts are what Redis counts, to the unit: weighted tokens for token quotas and token budgets,
//! micro-units of the currency for money budgets (printed as exact decimals: `0.009955`). Next to them,
//! `tokens_in`/`tokens_out`: the provider's input and output tokens (its `usage`) of the requests
//! settled in the account, from the month's `:io` hash — whole tokens whatever the unit, unweighted,
//! `-` (JSON `null`) when Redis holds no split for the row (counted by 0.1.x, or no provider usage
//! settled yet); totals add the rows that have one.
//!
//! The configuration tells what each account is counted in and its limit; an account Redis holds that
//! the configuration cannot explain (a budget it does not define, a subject of another scope, tenant
//! counters without a token quota) stops the report (exit 5): its amounts would be printed in the wrong
//! unit or against the wrong limit.

use crate::accounts::{add_opt, AccountId, Amounts, Kind, Month};
use crate::fail::Failure;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use tokengate::config::{Config, Scope};

/// What the rows are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// One row per account: a tenant's token quota, a budget's subject.
    Account,
    /// One row per account and model.
    Model,
    /// One row per budget (its subjects summed), and one for all tenants' token quotas.
    Budget,
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns.
    Table,
    /// RFC 4180 CSV with a header line.
    Csv,
    /// One JSON object (amounts as exact decimal strings and as integers of the base unit).
    Json,
}

/// Which accounts.
#[derive(Debug, Clone, Default)]
pub struct Select {
    /// Only this tenant's accounts (its token quota, its tenant-scope budgets, and the group budgets of
    /// the groups `tenant_groups` fixes for it).
    pub tenant: Option<String>,
    /// Only budget subjects of this group: `team=red`, `org=acme/team=red`, or a bare `red`.
    pub group: Option<String>,
    /// Only this budget.
    pub budget: Option<String>,
}

/// The unit of an account.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unit {
    /// Weighted tokens.
    Tokens,
    /// Micro-units of this currency.
    Money(String),
}

impl Unit {
    /// As printed: `tokens` or the currency.
    pub fn name(&self) -> &str {
        match self {
            Unit::Tokens => tokengate::config::TOKENS,
            Unit::Money(c) => c,
        }
    }

    /// An amount in this unit, exact: whole tokens, or micro-units as a decimal of the currency.
    pub fn amount(&self, v: i64) -> String {
        let s = tokengate::reply::amount(v.unsigned_abs(), self.amount_unit());
        if v < 0 {
            format!("-{s}")
        } else {
            s
        }
    }

    fn amount_unit(&self) -> &str {
        match self {
            Unit::Tokens => tokengate::config::TOKENS,
            Unit::Money(_) => "money",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `tokens` (a tenant's token quota) or `budget`.
    pub kind: &'static str,
    /// The tenant, `budget:subject`, a budget's name (`--by budget`) or `all tenants`.
    pub account: String,
    /// The model (`--by model`): a name, `-` for usage without a model counter, `*` when the account
    /// has no per-model counters (a month counted by 0.1.0, which reserved budgets without
    /// the model).
    pub model: Option<String>,
    /// The unit.
    pub unit: Unit,
    /// The amounts.
    pub amounts: Amounts,
    /// The limit in force (override or configured), when there is one.
    pub limit: Option<i64>,
}

impl Row {
    fn remaining(&self) -> Option<i64> {
        self.limit.map(|l| l - self.amounts.used)
    }
}

/// What each account is counted in and its configured limit, or why the configuration cannot tell.
fn explain_account(cfg: &Config, a: &AccountId) -> Result<(Unit, i64), String> {
    let Some(q) = cfg.quota.as_ref() else {
        return Err(format!(
            "{}: Redis counts it, but the configuration has no quota section",
            a.label()
        ));
    };
    let limit = |l: u64| i64::try_from(l).unwrap_or(i64::MAX);
    match &a.kind {
        Kind::Tenant => {
            let t = q.tenant(&a.id);
            if t.monthly_limit == 0 {
                return Err(format!(
                    "tenant {}: Redis counts a token quota, but the configuration gives it none (no quota.monthly_limit)",
                    a.label()
                ));
            }
            Ok((Unit::Tokens, limit(t.monthly_limit)))
        }
        Kind::Budget { name, subject } => {
            let Some((_, b)) = q.budget_of(&a.id) else {
                let known: Vec<&str> = q.budgets.list.iter().map(|b| b.name.as_str()).collect();
                return Err(format!(
                    "budget {name:?} (account {}): Redis counts it, but the configuration defines no such budget (it defines {known:?})",
                    a.label()
                ));
            };
            let levels = &cfg.groups;
            let shape_ok = a.cut
                || match b.scope {
                    Scope::Shared => subject == "~all",
                    Scope::Tenant => !subject.contains('=') && subject != "~all",
                    Scope::Group(l) => {
                        let parts: Vec<&str> = subject.split('/').collect();
                        parts.len() == l + 1
                            && parts
                                .iter()
                                .zip(levels.iter())
                                .all(|(p, lv)| p.split_once('=').is_some_and(|(n, _)| n == lv.name))
                    }
                };
            if !shape_ok {
                return Err(format!(
                    "budget {name:?}: Redis holds subject {subject:?}, which its configured scope {:?} never writes",
                    b.scope.as_str(levels)
                ));
            }
            let unit = if b.tokens {
                Unit::Tokens
            } else {
                Unit::Money(q.budgets.currency.clone())
            };
            Ok((unit, limit(b.limit)))
        }
    }
}

fn model_limit(cfg: &Config, a: &AccountId, model: &str) -> Option<i64> {
    let q = cfg.quota.as_ref()?;
    if a.kind != Kind::Tenant {
        return None;
    }
    q.tenant(&a.id)
        .model_limits
        .iter()
        .find(|(m, _)| m == model)
        .map(|(_, l)| i64::try_from(*l).unwrap_or(i64::MAX))
}

fn selected(cfg: &Config, sel: &Select, a: &AccountId) -> bool {
    if let Some(b) = &sel.budget {
        if !matches!(&a.kind, Kind::Budget { name, .. } if name == b) {
            return false;
        }
    }
    if let Some(g) = &sel.group {
        let Kind::Budget { subject, .. } = &a.kind else {
            return false;
        };
        let last = subject.rsplit('/').next().unwrap_or(subject);
        let value = last.split_once('=').map_or(last, |(_, v)| v);
        if !(subject == g || last == g || (!g.contains('=') && value == g)) {
            return false;
        }
    }
    if let Some(t) = &sel.tenant {
        return match &a.kind {
            Kind::Tenant => &a.id == t,
            Kind::Budget { subject, .. } => {
                if subject == t {
                    return true;
                }
                // Group budgets of the groups the configuration fixes for this tenant.
                let (Some(q), Some(groups)) = (cfg.quota.as_ref(), cfg.tenant_groups.get(t)) else {
                    return false;
                };
                q.budgets
                    .list
                    .iter()
                    .any(|b| b.account(t, &cfg.groups, groups) == a.id)
            }
        };
    }
    true
}

/// The report's rows (before totals), or every mismatch between the configuration and Redis.
pub fn rows(cfg: &Config, months: &[Month], sel: &Select, by: By) -> Result<Vec<Row>, Failure> {
    let mut problems = Vec::new();
    let mut out = Vec::new();
    let mut per_budget: BTreeMap<(String, Unit), Amounts> = BTreeMap::new();
    for m in months {
        let a = &m.account;
        let (unit, configured) = match explain_account(cfg, a) {
            Ok(x) => x,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        if !selected(cfg, sel, a) {
            continue;
        }
        let kind = match a.kind {
            Kind::Tenant => "tokens",
            Kind::Budget { .. } => "budget",
        };
        let limit = Some(m.total.limit_override.unwrap_or(configured));
        match by {
            By::Account => out.push(Row {
                kind,
                account: a.label(),
                model: None,
                unit,
                amounts: m.total.clone(),
                limit,
            }),
            By::Model => {
                if m.models.is_empty() {
                    out.push(Row {
                        kind,
                        account: a.label(),
                        model: Some("*".into()),
                        unit,
                        amounts: m.total.clone(),
                        limit,
                    });
                    continue;
                }
                let mut rest = Amounts {
                    limit_override: None,
                    ..m.total.clone()
                };
                for (model, am) in &m.models {
                    rest.used -= am.used;
                    rest.in_leases -= am.in_leases;
                    rest.in_flight -= am.in_flight;
                    rest.tokens_in = rest.tokens_in.map(|v| v - am.tokens_in.unwrap_or(0));
                    rest.tokens_out = rest.tokens_out.map(|v| v - am.tokens_out.unwrap_or(0));
                    out.push(Row {
                        kind,
                        account: a.label(),
                        model: Some(model.clone()),
                        unit: unit.clone(),
                        amounts: am.clone(),
                        limit: am.limit_override.or_else(|| model_limit(cfg, a, model)),
                    });
                }
                if rest.used != 0
                    || rest.in_leases != 0
                    || rest.in_flight != 0
                    || rest.tokens_in.is_some_and(|v| v != 0)
                    || rest.tokens_out.is_some_and(|v| v != 0)
                {
                    out.push(Row {
                        kind,
                        account: a.label(),
                        model: Some("-".into()),
                        unit,
                        amounts: rest,
                        limit: None,
                    });
                }
            }
            By::Budget => {
                let name = match &a.kind {
                    Kind::Tenant => "all tenants (token quotas)".to_string(),
                    Kind::Budget { name, .. } => name.clone(),
                };
                let e = per_budget.entry((name, unit)).or_default();
                add(e, &m.total);
            }
        }
    }
    if !problems.is_empty() {
        return Err(Failure::mismatch(format!(
            "the configuration does not match what Redis holds (wrong config file, or one changed this month?):\n  {}",
            problems.join("\n  ")
        )));
    }
    for ((name, unit), amounts) in per_budget {
        out.push(Row {
            kind: if name.starts_with("all tenants") {
                "tokens"
            } else {
                "budget"
            },
            account: name,
            model: None,
            unit,
            amounts,
            limit: None,
        });
    }
    Ok(out)
}

/// Totals per unit.
pub fn totals(rows: &[Row]) -> Vec<(Unit, Amounts)> {
    let mut t: BTreeMap<Unit, Amounts> = BTreeMap::new();
    for r in rows {
        add(t.entry(r.unit.clone()).or_default(), &r.amounts);
    }
    t.into_iter().collect()
}

fn add(e: &mut Amounts, a: &Amounts) {
    e.used += a.used;
    e.in_leases += a.in_leases;
    e.in_flight += a.in_flight;
    e.tokens_in = add_opt(e.tokens_in, a.tokens_in);
    e.tokens_out = add_opt(e.tokens_out, a.tokens_out);
}

/// Input/output tokens as printed: the number, `-` when no split is recorded.
fn tokens(v: Option<i64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

const HEAD: [&str; 11] = [
    "kind",
    "account",
    "model",
    "unit",
    "used",
    "in_leases",
    "in_flight",
    "settled",
    "tokens_in",
    "tokens_out",
    "limit",
];

fn cells(r: &Row) -> Vec<String> {
    let u = &r.unit;
    vec![
        r.kind.to_string(),
        r.account.clone(),
        r.model.clone().unwrap_or_default(),
        u.name().to_string(),
        u.amount(r.amounts.used),
        u.amount(r.amounts.in_leases),
        u.amount(r.amounts.in_flight),
        u.amount(r.amounts.settled()),
        tokens(r.amounts.tokens_in),
        tokens(r.amounts.tokens_out),
        r.limit.map(|l| u.amount(l)).unwrap_or_default(),
        r.remaining().map(|l| u.amount(l)).unwrap_or_default(),
    ]
}

fn total_cells(u: &Unit, a: &Amounts) -> Vec<String> {
    vec![
        "total".into(),
        String::new(),
        String::new(),
        u.name().to_string(),
        u.amount(a.used),
        u.amount(a.in_leases),
        u.amount(a.in_flight),
        u.amount(a.settled()),
        tokens(a.tokens_in),
        tokens(a.tokens_out),
        String::new(),
        String::new(),
    ]
}

/// The report, printed.
pub fn render(month: &str, rows: &[Row], by: By, format: Format) -> String {
    let totals = totals(rows);
    let mut head: Vec<String> = HEAD.iter().map(|s| s.to_string()).collect();
    head.push("remaining".into());
    let keep_model = by == By::Model;
    let strip = |mut v: Vec<String>| {
        if !keep_model {
            v.remove(2);
        }
        v
    };
    match format {
        Format::Json => {
            let row_json = |r: &Row| {
                let u = &r.unit;
                let amt = |v: i64| json!({"amount": u.amount(v), "base": v});
                let mut o = json!({
                    "kind": r.kind, "account": r.account, "unit": u.name(),
                    "used": amt(r.amounts.used), "in_leases": amt(r.amounts.in_leases),
                    "in_flight": amt(r.amounts.in_flight), "settled": amt(r.amounts.settled()),
                    "tokens_in": r.amounts.tokens_in, "tokens_out": r.amounts.tokens_out,
                    "limit": r.limit.map(amt), "remaining": r.remaining().map(amt),
                });
                if let (Some(m), Some(obj)) = (&r.model, o.as_object_mut()) {
                    obj.insert("model".into(), Value::String(m.clone()));
                }
                o
            };
            let v = json!({
                "month": month,
                "by": format!("{by:?}").to_lowercase(),
                "base_unit": "whole weighted tokens for `tokens`, micro-units (1e-6) of the currency otherwise",
                "tokens_in_out": "the provider's input/output tokens of the requests settled (leased ones as their lease reported them), unweighted; null: no split recorded",
                "rows": rows.iter().map(row_json).collect::<Vec<_>>(),
                "totals": totals.iter().map(|(u, a)| {
                    let amt = |v: i64| json!({"amount": u.amount(v), "base": v});
                    json!({"unit": u.name(), "used": amt(a.used), "in_leases": amt(a.in_leases),
                           "in_flight": amt(a.in_flight), "settled": amt(a.settled()),
                           "tokens_in": a.tokens_in, "tokens_out": a.tokens_out})
                }).collect::<Vec<_>>(),
            });
            let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
            s.push('\n');
            s
        }
        Format::Csv => {
            let mut lines = vec![strip(head)];
            lines.extend(rows.iter().map(|r| strip(cells(r))));
            lines.extend(totals.iter().map(|(u, a)| strip(total_cells(u, a))));
            let mut s = String::new();
            for l in lines {
                let q: Vec<String> = l.iter().map(|c| csv_cell(c)).collect();
                s.push_str(&q.join(","));
                s.push_str("\r\n");
            }
            s
        }
        Format::Table => {
            let mut lines = vec![strip(head.iter().map(|h| h.to_uppercase()).collect())];
            lines.extend(rows.iter().map(|r| strip(cells(r))));
            let body = lines.len();
            lines.extend(totals.iter().map(|(u, a)| strip(total_cells(u, a))));
            let ncol = lines.first().map_or(0, Vec::len);
            let widths: Vec<usize> = (0..ncol)
                .map(|i| {
                    lines
                        .iter()
                        .map(|l| l.get(i).map_or(0, |c| c.chars().count()))
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let numeric_from = if keep_model { 4 } else { 3 };
            let mut s = format!("month {month}\n");
            for (n, l) in lines.iter().enumerate() {
                if n == body && !totals.is_empty() {
                    let w: usize = widths.iter().sum::<usize>() + 2 * ncol.saturating_sub(1);
                    s.push_str(&"-".repeat(w));
                    s.push('\n');
                }
                let mut cols = Vec::with_capacity(ncol);
                for (i, c) in l.iter().enumerate() {
                    let w = widths.get(i).copied().unwrap_or(0);
                    cols.push(if i >= numeric_from && n > 0 {
                        format!("{c:>w$}")
                    } else {
                        format!("{c:<w$}")
                    });
                }
                s.push_str(cols.join("  ").trim_end());
                s.push('\n');
            }
            if rows.is_empty() {
                s.push_str("(no usage counted in Redis for this month and selection)\n");
            }
            s
        }
    }
}

fn csv_cell(c: &str) -> String {
    if c.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", c.replace('"', "\"\""))
    } else {
        c.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounts::AccountId;

    fn cfg() -> Config {
        tokengate::config::parse(
            br#"{"group_header": "x-team", "trusted_headers": {"set_by": "the test"}, "tenant_groups": {"bob": {"group": "red"}},
                "rules": [{"tokens_per_second": 1, "burst": 1}],
                "quota": {"cluster": "w", "monthly_limit": 1000, "currency": "EUR",
                  "tenants": {"alice": {"monthly_limit": 50}},
                  "prices": {"m": {"input": 2, "output": 8}},
                  "budgets": [{"name": "team", "scope": "group", "monthly_limit": 5},
                              {"name": "mine", "scope": "tenant", "monthly_limit": 100, "unit": "tokens"}]}}"#,
        )
        .unwrap()
    }

    fn month(id: &str, used: i64) -> Month {
        Month {
            account: AccountId::from_id(id),
            total: Amounts {
                used,
                in_leases: 10,
                in_flight: 0,
                limit_override: None,
                tokens_in: None,
                tokens_out: None,
            },
            models: BTreeMap::new(),
            leases: Vec::new(),
        }
    }

    #[test]
    fn accounts_are_reported_in_their_unit_against_their_limit() {
        let ms = [
            month("alice", 40),
            month("~b:team:group=red", 1_250_000),
            month("~b:mine:bob", 7),
        ];
        let r = rows(&cfg(), &ms, &Select::default(), By::Account).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].limit, Some(50));
        assert_eq!(r[1].unit, Unit::Money("EUR".into()));
        assert_eq!(r[1].unit.amount(r[1].amounts.settled()), "1.24999");
        assert_eq!(r[1].remaining(), Some(5_000_000 - 1_250_000));
        assert_eq!(r[2].unit, Unit::Tokens);
        let t = render("2026-12", &r, By::Account, Format::Csv);
        assert!(
            t.contains("budget,team:group=red,EUR,1.25,0.00001,0,1.24999,-,-,5,3.75\r\n"),
            "{t}"
        );
        assert!(t.contains("total,,EUR,1.25,"), "{t}");
    }

    #[test]
    fn the_input_output_split_is_shown_summed_and_a_missing_one_is_a_dash_or_null() {
        let mut alice = month("alice", 40);
        alice.total.tokens_in = Some(30);
        alice.total.tokens_out = Some(12);
        alice.models.insert(
            "m".into(),
            Amounts {
                used: 25,
                tokens_in: Some(20),
                tokens_out: Some(2),
                ..Amounts::default()
            },
        );
        let mut team = month("~b:team:group=red", 1_250_000);
        team.total.tokens_in = Some(30);
        team.total.tokens_out = Some(12);
        // bob: counted by 0.1.x, no split.
        let ms = [alice, team, month("bob", 9)];
        let r = rows(&cfg(), &ms, &Select::default(), By::Account).unwrap();
        let csv = render("2026-12", &r, By::Account, Format::Csv);
        assert!(
            csv.starts_with("kind,account,unit,used,in_leases,in_flight,settled,tokens_in,tokens_out,limit,remaining\r\n"),
            "{csv}"
        );
        assert!(
            csv.contains("tokens,alice,tokens,40,10,0,30,30,12,50,10\r\n"),
            "{csv}"
        );
        assert!(
            csv.contains("tokens,bob,tokens,9,10,0,-1,-,-,1000,991\r\n"),
            "{csv}"
        );
        // Totals per unit add the rows that have a split.
        assert!(
            csv.contains("total,,tokens,49,20,0,29,30,12,,\r\n"),
            "{csv}"
        );
        assert!(
            csv.contains("total,,EUR,1.25,0.00001,0,1.24999,30,12,,\r\n"),
            "{csv}"
        );
        let j: Value =
            serde_json::from_str(&render("2026-12", &r, By::Account, Format::Json)).unwrap();
        assert_eq!(j["rows"][0]["tokens_in"], 30);
        assert_eq!(j["rows"][2]["tokens_in"], Value::Null);
        assert_eq!(j["totals"][1]["tokens_out"], 12);
        // Per model: the model's fields, and the rest (without a model counter) as `-`.
        let r = rows(&cfg(), &ms[..1], &Select::default(), By::Model).unwrap();
        let io: Vec<(Option<String>, Option<i64>, Option<i64>)> = r
            .iter()
            .map(|r| (r.model.clone(), r.amounts.tokens_in, r.amounts.tokens_out))
            .collect();
        assert_eq!(
            io,
            [
                (Some("m".into()), Some(20), Some(2)),
                (Some("-".into()), Some(10), Some(10))
            ]
        );
        let table = render("2026-12", &r, By::Model, Format::Table);
        assert!(table.contains("TOKENS_IN  TOKENS_OUT"), "{table}");
    }

    #[test]
    fn a_tenant_selects_its_own_budgets_and_its_fixed_groups() {
        let ms = [
            month("alice", 1),
            month("bob", 1),
            month("~b:team:group=red", 1),
            month("~b:team:group=blue", 1),
            month("~b:mine:bob", 1),
        ];
        let sel = Select {
            tenant: Some("bob".into()),
            ..Select::default()
        };
        let r = rows(&cfg(), &ms, &sel, By::Account).unwrap();
        let names: Vec<&str> = r.iter().map(|r| r.account.as_str()).collect();
        assert_eq!(names, ["bob", "team:group=red", "mine:bob"]);
        let sel = Select {
            group: Some("red".into()),
            ..Select::default()
        };
        let r = rows(&cfg(), &ms, &sel, By::Account).unwrap();
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn accounts_the_configuration_cannot_explain_stop_the_report() {
        let ms = [month("~b:gone:group=red", 1), month("~b:team:red", 1)];
        let e = rows(&cfg(), &ms, &Select::default(), By::Account).unwrap_err();
        assert_eq!(e.code, 5);
        assert!(e.message.contains("no such budget"), "{}", e.message);
        assert!(e.message.contains("\"red\""), "{}", e.message);
    }
}
