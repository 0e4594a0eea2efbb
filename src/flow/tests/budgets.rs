//! Budgets in money (`quota.budgets`, `quota.prices`): reserved and settled like token quotas, in
//! micro-units of the currency, at tenant, group and shared scope, all or nothing with the token quota.

use super::*;
use crate::flow::Metric;

fn cfg(monthly_limit: Option<u64>, budgets: Value) -> Value {
    let mut q = json!({"cluster": "webdis", "currency": "USD",
        "prices": {"gpt-4.1": {"input": 2.0, "output": 8.0, "cached_input": 0.5}},
        "budgets": budgets, "lease": false});
    if let Some(l) = monthly_limit {
        q["monthly_limit"] = json!(l);
    }
    json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "group_header": "x-team",
           "rules": [rule(1000.0, 1e6)], "quota": q})
}

fn send(e: &FakeEnvoy, tenant: &'static str, team: &'static str, max: u64) -> Call {
    e.send(
        "/v1/chat/completions",
        &[("x-tenant-id", tenant), ("x-team", team)],
        &chat("gpt-4.1", "hello", max),
    )
}

/// The Redis keys and argv of the reservation `c` waits for.
fn pending(c: &Call) -> Vec<String> {
    segments(&c.pending.as_ref().expect("a reservation").body)
}

/// (mode, account key prefix, actual) of every settlement entry a tick sends.
fn settlements(e: &FakeEnvoy) -> Vec<(String, String, u64)> {
    e.tick(0);
    let calls = e.root_callouts.borrow().clone();
    calls
        .iter()
        .flat_map(|c| super::settlement::settle_entries(&c.body))
        .collect()
}

#[test]
fn a_team_budget_is_reserved_after_the_token_quota_and_settled_at_the_models_prices() {
    let e = envoy(cfg(
        Some(1_000_000),
        json!([{"name": "team", "scope": "group", "monthly_limit": 500}]),
    ));
    let mut c = send(&e, "alice", "red", 100);
    assert!(pending(&c).iter().any(|s| s == "tg:q:{alice}:2026-11"));
    let seg = pending(&c);
    let token_prompt: u64 = seg[3 + seg[2].parse::<usize>().unwrap()].parse().unwrap();
    e.reply(&mut c, 200, &reserved(500, 1_000_000));
    // The budget next: its account is the team's, its amounts micro-dollars.
    let seg = pending(&c);
    assert!(
        seg.iter()
            .any(|s| s == "tg:q:{%7Eb:team:group%3Dred}:2026-11"),
        "{seg:?}"
    );
    e.reply(&mut c, 200, &reserved(2_000, 500_000_000));
    assert!(c.forwarded);
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[r#"{"usage":{"prompt_tokens":1000,"completion_tokens":500,"prompt_tokens_details":{"cached_tokens":400}}}"#],
    );
    clean(&c);
    assert_eq!(c.header("x-tokengate-budget"), Some("team"));
    assert_eq!(c.header("x-tokengate-budget-limit"), Some("500"));
    assert_eq!(c.header("x-tokengate-budget-remaining"), Some("499.998"));
    assert_eq!(c.header("x-tokengate-quota-remaining"), Some("999500"));
    // The token counters count the token quota only, not the budget's micro-dollars.
    assert_eq!(e.metric(Metric::QuotaReservedTokens), token_prompt);
    // 600 uncached × $2 + 400 cached × $0.50 + 500 × $8 per million = 1200 + 200 + 4000 µ$.
    assert_eq!(c.audit_field("budget.team.actual").as_deref(), Some("5400"));
    assert_eq!(c.audit_field("actual").as_deref(), Some("1500"));
    let s = settlements(&e);
    assert!(
        s.contains(&("s".into(), "tg:q:{alice}".into(), 1500)),
        "{s:?}"
    );
    assert!(
        s.contains(&("s".into(), "tg:q:{%7Eb:team:group%3Dred}".into(), 5400)),
        "{s:?}"
    );
    // The budget's account gets the same input/output split as the token quota, in tokens.
    let io: Vec<(String, u64, u64)> = e
        .root_callouts
        .borrow()
        .iter()
        .flat_map(|c| super::settlement::settle_entries_io(&c.body))
        .map(|(_, prefix, _, (i, o, _))| (prefix, i, o))
        .collect();
    assert_eq!(
        io,
        [
            ("tg:q:{alice}".to_string(), 1000, 500),
            ("tg:q:{%7Eb:team:group%3Dred}".to_string(), 1000, 500)
        ]
    );
}

#[test]
fn a_spent_budget_refuses_with_its_name_and_gives_the_token_reservation_back() {
    let e = envoy(cfg(
        Some(1_000_000),
        json!([{"name": "org", "scope": "shared", "monthly_limit": 0.01}]),
    ));
    let mut c = send(&e, "alice", "red", 100);
    e.reply(&mut c, 200, &reserved(500, 1_000_000));
    assert!(
        pending(&c)
            .iter()
            .any(|s| s == "tg:q:{%7Eb:org:%7Eall}:2026-11"),
        "{:?}",
        pending(&c)
    );
    e.reply(&mut c, 200, &eval(&[0, 9_999, 10_000, 0, -1, 0, 0, 1]));
    clean(&c);
    assert_eq!(c.status(), Some(429));
    assert_eq!(c.reply_header("x-tokengate-limit"), Some("org"));
    assert_eq!(c.reply_header("x-tokengate-budget-limit"), Some("0.01"));
    assert_eq!(
        c.reply_header("x-tokengate-budget-remaining"),
        Some("0.000001")
    );
    let body = c.reply_json();
    assert_eq!(body["error"]["code"], "insufficient_quota");
    assert_eq!(body["tokengate"]["budget"]["currency"], "USD");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("budget 'org' cannot cover this request: 0.000001 USD left of 0.01 USD"));
    assert_eq!(
        c.audit_field("decision").as_deref(),
        Some("budget_exceeded")
    );
    // The token quota's reservation is given back: settled at 0.
    assert_eq!(
        settlements(&e),
        vec![("s".into(), "tg:q:{alice}".into(), 0)]
    );
    // Marked spent: the next request is refused without a callout.
    let mut c = send(&e, "bob", "blue", 100);
    e.reply(&mut c, 200, &reserved(500, 1_000_000));
    assert_eq!(c.status(), Some(429));
    assert_eq!(e.metric(Metric::QuotaRejectedCached), 1);
}

#[test]
fn a_budget_only_quota_makes_one_reservation_and_budgets_of_other_scopes_apply_too() {
    let e = envoy(cfg(
        None,
        json!([{"name": "me", "monthly_limit": 5},
               {"name": "blue-only", "scope": "group", "group": "blue", "monthly_limit": 50}]),
    ));
    let mut c = send(&e, "alice", "red", 100);
    assert!(pending(&c)
        .iter()
        .any(|s| s == "tg:q:{%7Eb:me:alice}:2026-11"));
    e.reply(&mut c, 200, &reserved(0, 5_000_000));
    assert!(
        c.forwarded,
        "one reservation: no token quota, red is not blue"
    );
    e.respond(&mut c, 200, &[], &["{}"]);
    assert_eq!(c.header("x-tokengate-quota-limit"), None);
    let mut c = send(&e, "alice", "blue", 100);
    e.reply(&mut c, 200, &reserved(0, 5_000_000));
    assert!(!c.forwarded);
    assert!(pending(&c)
        .iter()
        .any(|s| s == "tg:q:{%7Eb:blue-only:group%3Dblue}:2026-11"));
}

#[test]
fn a_budget_shim_failure_follows_the_budgets_own_policy() {
    let e = envoy(cfg(
        Some(1_000_000),
        json!([{"name": "team", "scope": "group", "monthly_limit": 500, "on_failure": "open"}]),
    ));
    let mut c = send(&e, "alice", "red", 100);
    e.reply(&mut c, 200, &reserved(500, 1_000_000));
    e.dead_shim(&mut c);
    assert!(c.forwarded, "the budget fails open");
    assert_eq!(e.metric(Metric::QuotaFailOpen), 1);
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[r#"{"usage":{"prompt_tokens":10,"completion_tokens":10}}"#],
    );
    // Charged later ("c": no known reservation) at its price: 10 × 2 + 10 × 8.
    let s = settlements(&e);
    assert!(
        s.contains(&("c".into(), "tg:q:{%7Eb:team:group%3Dred}".into(), 100)),
        "{s:?}"
    );
}

#[test]
fn a_token_budget_is_a_monthly_token_quota_at_group_scope() {
    let mut c = cfg(
        None,
        json!([{"name": "team-tokens", "scope": "group", "unit": "tokens", "monthly_limit": 100000}]),
    );
    c["quota"]["weights"] = json!({"gpt-4.1": {"output": 4}});
    // No budget in money: prices and a currency would be refused.
    let q = c["quota"].as_object_mut().unwrap();
    q.remove("prices");
    q.remove("currency");
    let e = envoy(c);
    let mut c = send(&e, "alice", "red", 100);
    let seg = pending(&c);
    assert!(
        seg.iter()
            .any(|s| s == "tg:q:{%7Eb:team-tokens:group%3Dred}:2026-11"),
        "{seg:?}"
    );
    // Reserved at the quota's weights: output 100 × 4.
    let nkeys: usize = seg[2].parse().unwrap();
    assert_eq!(seg[3 + nkeys + 1], "400", "{seg:?}");
    e.reply(&mut c, 200, &reserved(2_000, 100_000));
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[r#"{"usage":{"prompt_tokens":10,"completion_tokens":20}}"#],
    );
    assert_eq!(c.header("x-tokengate-budget-limit"), Some("100000"));
    assert_eq!(c.header("x-tokengate-budget-remaining"), Some("98000"));
    // 10 + 20 × 4 weighted tokens.
    assert_eq!(
        c.audit_field("budget.team-tokens.actual").as_deref(),
        Some("90")
    );
    // Spent: 429 in tokens.
    let mut c = send(&e, "bob", "red", 100);
    e.reply(&mut c, 200, &eval(&[0, 99_990, 100_000, 0, -1, 0, 0, 1]));
    assert_eq!(c.status(), Some(429));
    assert_eq!(c.reply_header("x-tokengate-budget-remaining"), Some("10"));
    assert_eq!(c.reply_json()["tokengate"]["budget"]["currency"], "tokens");
}
