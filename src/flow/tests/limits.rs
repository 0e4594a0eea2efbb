//! `limits`: every matching limit charged all or nothing, scopes (tenant, group levels, shared),
//! requests in flight, shadow mode.

use super::*;
use crate::flow::Metric;

const GROUPS: &str = "x-tokengate-team";

fn team(t: &'static str) -> (&'static str, &'static str) {
    (GROUPS, t)
}

fn send(e: &FakeEnvoy, tenant: &'static str, team_id: &'static str, max: u64) -> Call {
    e.send(
        "/v1/chat/completions",
        &[("x-tenant-id", tenant), team(team_id)],
        &chat("gpt-4.1", "hi", max),
    )
}

#[test]
fn every_matching_limit_is_charged_and_a_refusal_gives_the_others_back() {
    // Provider-wide 1,000 tokens; each team 600; each tenant 400 (no refill).
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "group_header": GROUPS, "limits": [
        {"name": "provider", "scope": "shared", "model": "gpt-4.1", "tokens_per_second": 0.001, "burst": 1000},
        {"name": "team", "scope": "group", "tokens_per_second": 0.001, "burst": 600},
        {"name": "user", "tokens_per_second": 0.001, "burst": 400}]}),
    );
    let mut a1 = send(&e, "a", "red", 290);
    assert!(a1.forwarded);
    e.respond(&mut a1, 200, &[], &["{}"]);
    let cost = estimated(&a1);
    assert!(cost > 290 && cost < 310, "{cost}");
    // The binding limit is reported: user has 400 - cost left, the least.
    assert_eq!(
        a1.header("x-ratelimit-remaining-tokens")
            .map(str::to_string),
        Some((400 - cost).to_string())
    );
    // Tenant a's own limit refuses the next: the team and provider are given back.
    let a2 = send(&e, "a", "red", 290);
    assert_eq!(a2.status(), Some(429));
    assert!(
        a2.reply_json().to_string().contains("'user'"),
        "{}",
        a2.reply_json()
    );
    assert_eq!(a2.reply_header("x-tokengate-limit"), Some("user"));
    // b (same team) fits the team's 600 once: 2 × cost ≤ 600.
    assert!(send(&e, "b", "red", 290).forwarded);
    // c (same team) is refused by the team, not by its own (untouched) limit.
    let c = send(&e, "c", "red", 290);
    assert_eq!(c.status(), Some(429));
    assert_eq!(c.reply_header("x-tokengate-limit"), Some("team"));
    // c's provider charge was given back: d (another team) fits the provider's 1,000 as the third.
    assert!(send(&e, "d", "blue", 290).forwarded);
    assert!(3 * cost <= 1000 && 4 * cost > 1000);
    // e (team blue, its own limit untouched) hits the provider-wide limit.
    let e4 = send(&e, "e", "blue", 290);
    assert_eq!(e4.reply_header("x-tokengate-limit"), Some("provider"));
    assert_eq!(e.metric(Metric::RequestsLimitedTokens), 3);
}

#[test]
fn nested_groups_charge_the_team_inside_its_org() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "groups": [{"name": "org", "header": "x-org"}, {"name": "team", "header": GROUPS}],
        "limits": [
            {"name": "org", "scope": "org", "tokens_per_second": 0.001, "burst": 10000},
            {"name": "team", "scope": "team", "tokens_per_second": 0.001, "burst": 400}]}),
    );
    let go = |tenant: &'static str, org: &'static str| {
        e.send(
            "/v1/chat/completions",
            &[("x-tenant-id", tenant), ("x-org", org), team("eng")],
            &chat("m", "hi", 300),
        )
    };
    assert!(go("a", "acme").forwarded);
    assert_eq!(
        go("b", "acme").reply_header("x-tokengate-limit"),
        Some("team")
    );
    // Team "eng" of another org is another team.
    assert!(go("c", "globex").forwarded);
    use crate::store::SharedStore;
    assert!(e
        .store
        .get("tg:b:team:org=acme/team=eng:m")
        .unwrap()
        .is_some());
}

#[test]
fn tenant_groups_in_the_config_win_over_headers() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "group_header": GROUPS,
        "tenant_groups": {"a": {"group": "red"}},
        "limits": [{"name": "team", "scope": "group", "group": "red", "tokens_per_second": 0.001, "burst": 400}]}),
    );
    assert!(send(&e, "a", "blue", 300).forwarded);
    // a is in red whatever its header says: the second is refused.
    assert_eq!(send(&e, "a", "blue", 300).status(), Some(429));
    // b names red in its header: counted in red too (a header set by a trusted filter).
    assert_eq!(send(&e, "b", "red", 300).status(), Some(429));
    // b in blue: the limit is for red only.
    assert!(send(&e, "b", "blue", 300).forwarded);
    // No group: a group limit does not apply.
    assert!(
        e.send(
            "/v1/chat/completions",
            &[("x-tenant-id", "z")],
            &chat("m", "hi", 300)
        )
        .forwarded
    );
}

#[test]
fn in_flight_slots_are_held_until_the_stream_ends_and_a_refusal_gives_them_back() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "group_header": GROUPS, "limits": [
        {"name": "conc", "scope": "group", "max_in_flight": 2},
        {"name": "user", "tokens_per_second": 0.001, "burst": 400}]}),
    );
    let mut a = send(&e, "a", "red", 10);
    let mut b = send(&e, "b", "red", 10);
    assert!(a.forwarded && b.forwarded);
    // Full: refused in the headers phase, before the body.
    let c = send(&e, "c", "red", 10);
    assert_eq!(c.status(), Some(429));
    assert_eq!(c.reply_header("x-tokengate-limit"), Some("conc"));
    assert!(!c.upstream_started);
    assert_eq!(c.reply_json()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(e.metric(Metric::RequestsLimitedInFlight), 1);
    // Another team has its own slots.
    assert!(send(&e, "c", "blue", 10).forwarded);
    // The client of `a` goes away mid-response: its slot is free.
    e.respond_partly(&mut a, 200, &[], &["{"], false);
    e.end(&mut a);
    assert!(send(&e, "c", "red", 10).forwarded);
    e.respond(&mut b, 200, &[], &["{}"]);
    // A request refused by a later limit gives its slot back: d's own bucket is too small.
    let d = send(&e, "d", "red", 1000);
    assert_eq!(d.reply_header("x-tokengate-limit"), Some("user"));
    assert!(
        send(&e, "e", "red", 10).forwarded,
        "d's slot was given back"
    );
}

#[test]
fn a_slot_of_a_request_that_vanished_expires() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "limits": [
        {"name": "conc", "max_in_flight": 1}]}),
    );
    let a = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    assert!(a.forwarded);
    std::mem::forget(a); // never ends (its VM went away)
    assert_eq!(
        e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10))
            .status(),
        Some(429)
    );
    e.advance_ms(crate::limits::inflight::SLOT_TTL_S * 1000);
    assert!(
        e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10))
            .forwarded
    );
}

#[test]
fn a_shadow_limit_counts_and_logs_but_never_refuses() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "limits": [
        {"name": "trial", "tokens_per_second": 0.001, "burst": 100, "shadow": true},
        {"name": "conc", "max_in_flight": 1, "shadow": true},
        {"name": "real", "tokens_per_second": 0.001, "burst": 100000}]}),
    );
    let mut calls = Vec::new();
    for _ in 0..3 {
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 60));
        assert!(c.forwarded);
        e.respond_partly(&mut c, 200, &[], &["{"], false);
        // Headers report the enforced limit only.
        let rem: u64 = c
            .header("x-ratelimit-remaining-tokens")
            .unwrap()
            .parse()
            .unwrap();
        assert!(rem > 99_000);
        calls.push(c);
    }
    // The bucket held one request (100 tokens), the slot one: 2 + 2 would-be refusals.
    assert_eq!(e.metric(Metric::ShadowRefusals), 4);
    assert!(e.logged("shadow limit 'trial' would have refused a request of tenant 'acme'"));
    assert_eq!(e.metric(Metric::RequestsLimitedTokens), 0);
}

#[test]
fn two_workers_never_admit_beyond_a_shared_limit() {
    let e = FakeEnvoy::new(
        &json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "limits": [
            {"name": "provider", "scope": "shared", "tokens_per_second": 0.001, "burst": 2000},
            {"name": "user", "tokens_per_second": 0.001, "burst": 700}]})
        .to_string(),
        2,
    );
    let tenants = ["a", "b", "c", "d", "e", "f"];
    let mut per_tenant = std::collections::HashMap::new();
    let mut total = 0;
    for i in 0..60 {
        let t = tenants[i % tenants.len()];
        let c = e.send_on(
            i % 2,
            "/v1/chat/completions",
            &[("x-tenant-id", t)],
            &chat("m", "hi", 90),
        );
        if c.forwarded {
            let cost = estimated(&c);
            total += cost;
            *per_tenant.entry(t).or_insert(0) += cost;
        }
    }
    assert!(total <= 2000 && total > 1800, "{total}");
    assert!(per_tenant.values().all(|v| *v <= 700), "{per_tenant:?}");
}

#[test]
fn global_limits_are_charged_one_after_another_and_a_refusal_gives_the_first_back() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "limits": [
        {"name": "provider", "scope": "shared", "tokens_per_second": 100, "burst": 100000, "global": true},
        {"name": "user", "tokens_per_second": 10, "burst": 1000, "global": true},
        {"name": "local", "tokens_per_second": 10, "burst": 1000}],
        "global_buckets": {"cluster": "webdis", "on_failure": "closed"}}),
    );
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    let first = segments(&c.pending.as_ref().unwrap().body);
    assert!(
        first.iter().any(|s| s.contains("{provider:%7Eall}")),
        "{first:?}"
    );
    e.reply(&mut c, 200, &eval(&[0, 90_000_000, 0, 0, 0, 0]));
    assert!(!c.forwarded, "the second limit is charged next");
    let second = segments(&c.pending.as_ref().unwrap().body);
    assert!(
        second.iter().any(|s| s.contains("{user:acme}")),
        "{second:?}"
    );
    e.reply(&mut c, 200, &eval(&[0, 500_000, 0, 0, 0, 0]));
    assert!(c.forwarded);
    e.respond(&mut c, 200, &[], &["{}"]);
    // The binding limit: the user's 500 left, not the provider's 90,000 nor the local one.
    assert_eq!(c.header("x-ratelimit-remaining-tokens"), Some("500"));

    // The user's bucket refuses: the provider's charge is credited back (by the tick) and the local
    // bucket's at once.
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    let cost = estimated_pending(&e, &mut c);
    e.reply(&mut c, 200, &eval(&[2, 0, 0, 1_000_000, 0, 0]));
    assert_eq!(c.status(), Some(429));
    assert_eq!(c.reply_header("x-tokengate-limit"), Some("user"));
    assert_eq!(
        e.metric(Metric::TokensCredited),
        cost,
        "local bucket given back"
    );
    e.tick(0);
    let credits: Vec<Vec<String>> = e
        .root_callouts
        .borrow()
        .iter()
        .map(|c| segments(&c.body))
        .collect();
    assert!(
        credits
            .iter()
            .any(|s| s.iter().any(|p| p.contains("{provider:%7Eall}"))),
        "{credits:?}"
    );
}

/// Answers the first global charge of `c` admitting; returns the estimate it was charged.
fn estimated_pending(e: &FakeEnvoy, c: &mut Call) -> u64 {
    e.reply(c, 200, &eval(&[0, 90_000_000, 0, 0, 0, 0]));
    let body = segments(&c.pending.as_ref().unwrap().body);
    // EVALSHA/<sha>/<nkeys>/<key>/<cost>/…
    body[4].parse().unwrap()
}

#[test]
fn a_client_that_goes_while_its_admission_waits_gives_everything_back() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "limits": [
        {"name": "conc", "max_in_flight": 1},
        {"name": "user", "tokens_per_second": 0.001, "burst": 1000}],
        "quota": {"cluster": "webdis", "monthly_limit": 100000, "lease": false}}),
    );
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    assert!(c.pending.is_some(), "waits on its reservation");
    let cost = estimated_from_callout(&c);
    e.end(&mut c); // the client goes; the reservation never answers
    clean(&c);
    assert_eq!(e.metric(Metric::RequestsAbandoned), 1);
    assert_eq!(e.metric(Metric::TokensCredited), cost, "bucket given back");
    assert_eq!(c.audit_field("decision").as_deref(), Some("client_gone"));
    // Reconciled at 0: Redis may run the reservation still.
    e.tick(0);
    let calls = e.root_callouts.borrow().clone();
    assert_eq!(calls.len(), 1);
    let seg = segments(&calls[0].body);
    let nkeys: usize = seg[2].parse().unwrap();
    assert_eq!(&seg[3 + nkeys + 2], "c", "{seg:?}");
    assert_eq!(&seg[3 + nkeys + 4], "0", "{seg:?}");
    // Its in-flight slot is free at once (not after the slot's 900 s expiry).
    let mut d = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    assert!(
        d.pending.is_some(),
        "admitted past the in-flight limit: {:?}",
        d.status()
    );
    e.reply(&mut d, 200, &reserved(10, 100000));
    assert!(d.forwarded);
}

#[test]
fn a_client_that_goes_while_shaping_holds_it_is_charged_nothing() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [
        {"name": "s", "tokens_per_second": 100, "burst": 100, "max_wait_ms": 1000}],
        "quota": {"cluster": "webdis", "monthly_limit": 100000, "lease": false}}),
    );
    let mut a = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 80));
    e.reply(&mut a, 200, &reserved(10, 100000));
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 30));
    e.reply(&mut c, 200, &reserved(10, 100000));
    assert!(c.held);
    e.end(&mut c);
    // The record of the abandoned request (a request with a reservation has none before it ends).
    let cost = estimated_from_callout_body(&c);
    assert_eq!(e.metric(Metric::RequestsAbandoned), 1);
    assert_eq!(e.metric(Metric::TokensCredited), cost);
    e.tick(0);
    // Its reservation is settled at 0 (the provider never saw it), not charged its prompt.
    let calls = e.root_callouts.borrow().clone();
    let settled: Vec<String> = calls
        .iter()
        .map(|c| {
            let seg = segments(&c.body);
            let nkeys: usize = seg[2].parse().unwrap();
            format!("{}:{}", seg[3 + nkeys + 2], seg[3 + nkeys + 4])
        })
        .collect();
    assert_eq!(settled, vec!["s:0".to_string()]);
    assert!(e.resumed.borrow().is_empty(), "never resumed");
}

/// The estimate a request's reservation callout carries (prompt + output costs, unit weights).
fn estimated_from_callout(c: &Call) -> u64 {
    let seg = segments(&c.pending.as_ref().unwrap().body);
    let nkeys: usize = seg[2].parse().unwrap();
    let prompt: u64 = seg[3 + nkeys].parse().unwrap();
    let output: u64 = seg[3 + nkeys + 1].parse().unwrap();
    prompt + output
}

/// The estimate of a request whose callout was answered (from its audit record).
fn estimated_from_callout_body(c: &Call) -> u64 {
    c.audit_field("estimated").unwrap().parse().unwrap()
}
