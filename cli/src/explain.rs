//! `tokengate explain`: what one request would meet, from the configuration alone (no Envoy, no Redis):
//! the filter's estimate of its body, the rule and limits that apply with their keys, breaker keys and
//! fallbacks, and the quota and budget reservations with their Redis keys and cost. Everything comes
//! from the filter's own code: [`tokengate::estimate::estimate`], [`tokengate::config::Config::applicable`],
//! the key builders and the reservation's weighting ([`tokengate::quota::weighted`]).

use crate::accounts::AccountId;
use crate::fail::Failure;
use std::fmt::Write as _;
use tokengate::config::{Config, Scope};
use tokengate::estimate::{estimate, ApiKind};
use tokengate::quota::weighted;

/// The request to explain.
pub struct Request<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// Group values (`level=value`, or a bare value for `group_header`'s one level).
    pub groups: &'a [String],
    /// The model header's value, or the model when the body has none.
    pub model: Option<&'a str>,
    /// The request path (`/v1/chat/completions`).
    pub path: &'a str,
    /// The body.
    pub body: &'a [u8],
    /// The upstream cluster the route picks (for the breaker's cluster key).
    pub cluster: Option<&'a str>,
    /// The month (`YYYY-MM`).
    pub month: &'a str,
}

/// The groups of a request, one per level: `tenant_groups` when the configuration fixes them (headers
/// are then ignored, as in the filter), else the `level=value` arguments.
pub fn groups(cfg: &Config, tenant: &str, args: &[String]) -> Result<Vec<Option<String>>, Failure> {
    if let Some(fixed) = cfg.tenant_groups.get(tenant) {
        return Ok(fixed.clone());
    }
    let levels = &cfg.groups;
    let mut groups: Vec<Option<String>> = vec![None; levels.len()];
    let names = || {
        let n: Vec<&str> = levels.iter().map(|l| l.name.as_str()).collect();
        if n.is_empty() {
            "none configured".to_string()
        } else {
            n.join(", ")
        }
    };
    for g in args {
        let (level, value) = match g.split_once('=') {
            Some((l, v)) => (l.to_string(), v.to_string()),
            None if levels.len() == 1 => (
                levels.first().map(|l| l.name.clone()).unwrap_or_default(),
                g.clone(),
            ),
            None => {
                return Err(Failure::input(format!(
                    "--group {g:?}: write level=value (levels: {})",
                    names()
                )))
            }
        };
        let i = levels.iter().position(|l| l.name == level).ok_or_else(|| {
            Failure::input(format!(
                "--group {g:?}: no group level {level:?} (levels: {})",
                names()
            ))
        })?;
        if let Some(slot) = groups.get_mut(i) {
            *slot = Some(value);
        }
    }
    Ok(groups)
}

fn micro(v: u64, unit: &str) -> String {
    tokengate::reply::amount(v, unit)
}

/// The explanation, as printed.
pub fn explain(cfg: &Config, r: &Request) -> Result<String, Failure> {
    let kind = ApiKind::from_path(r.path).ok_or_else(|| {
        Failure::input(format!(
            "--path {}: not a metered API path (…/chat/completions, …/completions, …/embeddings, …/responses, …/messages)",
            r.path
        ))
    })?;
    let groups = groups(cfg, r.tenant, r.groups)?;
    let mut o = String::new();
    let est = estimate(kind, r.body, &|m| cfg.output_limits(m.or(r.model)));
    let (prompt, output, choices, body_model) = match &est {
        Ok(e) => (
            e.prompt_tokens,
            e.output_tokens,
            e.output_choices,
            e.model.clone(),
        ),
        Err(e) => {
            match cfg.invalid_body {
                tokengate::config::InvalidBody::Reject => {
                    let _ = writeln!(o, "400 invalid_body: {e}");
                    return Ok(o);
                }
                tokengate::config::InvalidBody::Charge(t) => {
                    let _ = writeln!(o, "not an API body ({e}): admitted and charged {t} tokens (invalid_body: charge)");
                    (t, 0, 1, None)
                }
            }
        }
    };
    let model = body_model
        .clone()
        .or_else(|| r.model.map(str::to_string))
        .unwrap_or_default();
    let cost = prompt.saturating_add(output);
    let _ = writeln!(
        o,
        "request   {} ({}), tenant {:?}, groups {}, model {:?}{}",
        r.path,
        kind.as_str(),
        r.tenant,
        show_groups(cfg, &groups),
        model,
        if body_model.is_some() {
            " (from the body)"
        } else {
            ""
        }
    );
    let lim = cfg.output_limits(Some(&model).filter(|m| !m.is_empty()).map(String::as_str));
    let _ = writeln!(
        o,
        "estimate  prompt {prompt} + output {output} reserved ({choices} choice(s); default_max_tokens {}, max_tokens_cap {}) = {cost} tokens",
        lim.default_tokens, lim.cap_tokens
    );
    if let Ok(e) = &est {
        if e.background && cfg.refuse_background {
            let _ = writeln!(
                o,
                "answer    400 background_not_metered (background_responses: refuse)"
            );
            return Ok(o);
        }
        if e.requested_output.is_some_and(|req| req > lim.cap_tokens) {
            let _ = writeln!(
                o,
                "output    the body asks {} > cap {}: {}",
                e.requested_output.unwrap_or(0),
                lim.cap_tokens,
                if cfg.output_above_cap == tokengate::config::AboveCap::Lower {
                    "lowered in the body to the cap"
                } else {
                    "400 output_limit_too_large (output_above_cap: refuse)"
                }
            );
        }
    }
    // Rules and limits.
    let applicable = cfg.applicable(r.tenant, &groups, &model);
    if applicable.is_empty() {
        let _ = writeln!(o, "buckets   none applies: no bucket charged");
    }
    for idx in applicable {
        let Some(rule) = cfg.rule(idx) else { continue };
        let subject = rule.subject(r.tenant, &cfg.groups, &groups).into_owned();
        let what = if rule.is_limit { "limit" } else { "rule " };
        let mut line = format!("{what}     {:?}", rule.name);
        if rule.is_limit {
            let _ = write!(
                line,
                " scope {} ({subject})",
                rule.scope.as_str(&cfg.groups)
            );
        }
        if rule.has_bucket {
            let p = &rule.params;
            let key = if rule.global && cfg.global.is_some() {
                format!("Redis {}", tokengate::global::key(rule, &subject, &model))
            } else {
                format!(
                    "shared data {}",
                    tokengate::limits::local::plain_key(rule, &subject, &model)
                )
            };
            let _ = write!(
                line,
                ": {} tokens/s, burst {}{}, bucket {key}",
                p.tokens_per_second,
                p.burst,
                p.requests_per_minute
                    .map(|r| format!(", {r} requests/min"))
                    .unwrap_or_default()
            );
            if (cost as f64) > p.burst {
                let _ = write!(line, " -> 413 cost_exceeds_burst ({cost} > {})", p.burst);
            }
        }
        if let Some(m) = rule.max_in_flight {
            let _ = write!(
                line,
                "; at most {m} in flight per Envoy ({}{}:{subject})",
                tokengate::store::keys::IN_FLIGHT,
                rule.name
            );
        }
        if rule.shadow {
            line.push_str(" [shadow: counted, never refuses]");
        }
        if matches!(rule.scope, Scope::Group(_)) && rule.is_limit && subject.ends_with("=-") {
            line.push_str(" [no group at this level: skipped]");
        }
        let _ = writeln!(o, "{line}");
    }
    // Breakers.
    if let Some(b) = &cfg.breaker {
        let mut keys = Vec::new();
        if b.keys.cluster {
            let mut k = match r.cluster {
                Some(c) => tokengate::breaker::key("cluster", c),
                None => format!(
                    "{}cluster=<the route's cluster: --cluster>",
                    tokengate::store::keys::BREAKER
                ),
            };
            let c = r.cluster.unwrap_or("");
            if let Some(f) = b.cluster_fallback(c) {
                let _ = write!(
                    k,
                    " (fallback cluster {:?}, route header {:?})",
                    f.to, f.route
                );
            }
            keys.push(k);
        }
        if b.keys.model && !model.is_empty() {
            let mut k = tokengate::breaker::key("model", &model);
            if let Some(f) = b.model_fallback(&model) {
                let _ = write!(k, " (fallback model {f:?})");
            }
            keys.push(k);
        }
        let _ = writeln!(o, "breaker   {}", keys.join(", "));
    }
    // Quota and budgets.
    if let Some(q) = &cfg.quota {
        let t = q.tenant(r.tenant);
        if t.monthly_limit > 0 {
            let a = AccountId::from_id(r.tenant);
            let w = q.weights(&model);
            let pc = weighted(prompt, 0, 0, 0, &w);
            let oc = weighted(0, output, 0, 0, &w);
            let mut line = format!(
                "quota     tenant {:?}: {} (limit {}, override {}:limit)",
                r.tenant,
                a.counter(r.month),
                t.monthly_limit,
                a.prefix()
            );
            if !model.is_empty() {
                let m = tokengate::store::keys::sanitize(&model);
                let _ = write!(line, ", model {}", a.model_counter(r.month, &m));
                if let Some((_, l)) = t.model_limits.iter().find(|(x, _)| *x == model) {
                    let _ = write!(line, " (limit {l})");
                }
            }
            let _ = writeln!(o, "{line}");
            let _ = writeln!(
                o,
                "          reserves {pc} + {oc} = {} weighted tokens (weights input {}, output {}); settled to the provider's usage",
                pc.saturating_add(oc),
                w.input,
                w.output
            );
            if pc.saturating_add(oc) > t.monthly_limit {
                let _ = writeln!(
                    o,
                    "          {} > the monthly limit {}: 429 monthly_quota_exceeded{} (unless an override raised it)",
                    pc.saturating_add(oc),
                    t.monthly_limit,
                    if t.clamp_output { " or the output lowered (clamp_output)" } else { "" }
                );
            }
        } else {
            let _ = writeln!(o, "quota     tenant {:?}: no token quota", r.tenant);
        }
        for b in &q.budgets.list {
            if !b.applies(r.tenant, &groups) {
                continue;
            }
            let a = AccountId::from_id(&b.account(r.tenant, &cfg.groups, &groups));
            let unit = q.budgets.unit(b);
            let price = if b.tokens {
                q.weights(&model)
            } else {
                q.budgets.price(&model)
            };
            let amount =
                weighted(prompt, 0, 0, 0, &price).saturating_add(weighted(0, output, 0, 0, &price));
            let _ = writeln!(
                o,
                "budget    {:?} ({}): {} limit {} {unit}; reserves {} {unit} (price input {}, output {}{})",
                b.name,
                a.label(),
                a.counter(r.month),
                micro(b.limit, unit),
                micro(amount, unit),
                price.input,
                price.output,
                if b.tokens { " weighted tokens" } else { " per million tokens" }
            );
        }
        match q.lease {
            Some(l) => {
                let t = q.tenant(r.tenant).monthly_limit;
                let threshold = l.policy.threshold(t);
                let floor = l.policy.floor(t);
                let never = if t > 0 && t < threshold {
                    format!(
                        " (tenant {:?}: limit {t} is below it: never leased)",
                        r.tenant
                    )
                } else {
                    String::new()
                };
                let _ = writeln!(
                    o,
                    "leases    on: an account is served from this Envoy's lease while what is left of it is at least {threshold} \
                     (the smallest lease, {floor}: min_limit_percent of the limit, at most min_tokens; x 100 / max_share_percent); \
                     below it every request is reserved in Redis{never}"
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "leases    off (quota.lease: false): every request is reserved in Redis"
                );
            }
        }
    }
    Ok(o)
}

fn show_groups(cfg: &Config, groups: &[Option<String>]) -> String {
    if cfg.groups.is_empty() {
        return "(none configured)".into();
    }
    cfg.groups
        .iter()
        .zip(groups)
        .map(|(l, g)| format!("{}={}", l.name, g.as_deref().unwrap_or("-")))
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explain_names_rules_limits_keys_and_costs() {
        let cfg = tokengate::config::parse(
            br#"{"group_header": "x-team", "trusted_headers": {"set_by": "the test"},
                "rules": [{"name": "r", "model": "gpt-4.1", "tokens_per_second": 10, "burst": 100}],
                "limits": [{"name": "team", "scope": "group", "tokens_per_second": 5, "burst": 5000}],
                "quota": {"cluster": "w", "monthly_limit": 1000000, "currency": "USD",
                  "weights": {"gpt-4.1": {"input": 1, "output": 4}},
                  "prices": {"gpt-4.1": {"input": 2, "output": 8}},
                  "budgets": [{"name": "spend", "scope": "group", "monthly_limit": 5}]}}"#,
        )
        .unwrap();
        let body = br#"{"model":"gpt-4.1","max_tokens":200,"messages":[{"role":"user","content":"hello there"}]}"#;
        let groups = vec!["red".to_string()];
        let out = explain(
            &cfg,
            &Request {
                tenant: "alice",
                groups: &groups,
                model: None,
                path: "/v1/chat/completions",
                body,
                cluster: None,
                month: "2026-12",
            },
        )
        .unwrap();
        assert!(out.contains("rule      \"r\""), "{out}");
        assert!(out.contains("413 cost_exceeds_burst"), "{out}");
        assert!(
            out.contains("limit     \"team\" scope group (group=red)"),
            "{out}"
        );
        assert!(out.contains("tg:q:{alice}:2026-12:m:gpt-4.1"), "{out}");
        assert!(
            out.contains("tg:q:{%7Eb:spend:group%3Dred}:2026-12"),
            "{out}"
        );
        assert!(out.contains("output 200 reserved"), "{out}");
        // Leases on by default: a large limit is leased until 40,960 is left.
        assert!(out.contains("leases    on:"), "{out}");
        assert!(out.contains("at least 40960"), "{out}");
    }

    #[test]
    fn explain_prints_the_lease_threshold_of_the_tenant_or_that_leases_are_off() {
        let run = |lease: &str| {
            let cfg = tokengate::config::parse(
                format!(
                    r#"{{"rules": [{{"tokens_per_second": 10, "burst": 100}}],
                    "quota": {{"cluster": "w", "monthly_limit": 50000{lease}}}}}"#
                )
                .as_bytes(),
            )
            .unwrap();
            let body =
                br#"{"model":"m","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}"#;
            explain(
                &cfg,
                &Request {
                    tenant: "small",
                    groups: &[],
                    model: None,
                    path: "/v1/chat/completions",
                    body,
                    cluster: None,
                    month: "2026-12",
                },
            )
            .unwrap()
        };
        // 50,000: the smallest lease is 500 (1 %), leased while 5,000 (10 %) is left.
        let on = run("");
        assert!(
            on.contains("at least 5000 (the smallest lease, 500"),
            "{on}"
        );
        let off = run(r#", "lease": false"#);
        assert!(off.contains("leases    off (quota.lease: false)"), "{off}");
    }
}
