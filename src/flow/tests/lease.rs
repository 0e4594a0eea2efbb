//! Quota leases: requests spend from this Envoy's lease without a callout; syncs report, renew and
//! give back.

use super::*;
use crate::flow::Metric;

pub(super) fn cfg(lease: Value) -> Value {
    json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1e6, 1e9)],
        "quota": {"cluster": "webdis", "monthly_limit": 1_000_000, "lease": lease}})
}

/// `{"EVAL":[held, used, limit, model_used, model_limit, version, reported_total, 0, 0]}`.
pub(super) fn lease_reply(held: i64, used: i64, version: i64, reported: i64) -> String {
    eval(&[held, used, 1_000_000, used, -1, version, reported, 0, 0])
}

/// The lease calls among the root callouts, as (reported total, want, target) argument strings.
pub(super) fn lease_calls(e: &FakeEnvoy) -> Vec<(String, String, String)> {
    e.root_callouts
        .borrow()
        .iter()
        .filter(|c| matches!(c.purpose, crate::flow::Purpose::Lease(_)))
        .map(|c| {
            let seg = segments(&c.body);
            let nkeys: usize = seg[2].parse().unwrap();
            let a = &seg[3 + nkeys..];
            (a[1].clone(), a[2].clone(), a[3].clone())
        })
        .collect()
}

/// Drops every root callout but the lease calls (the settlement batch is left unanswered).
pub(super) fn only_lease_calls(e: &FakeEnvoy) {
    e.root_callouts
        .borrow_mut()
        .retain(|c| matches!(c.purpose, crate::flow::Purpose::Lease(_)));
}

pub(super) fn usage_answer(e: &FakeEnvoy, c: &mut Call, total: u64) {
    e.respond(
        c,
        200,
        &[("content-type", "application/json")],
        &[&format!(
            r#"{{"usage":{{"prompt_tokens":{},"completion_tokens":{}}}}}"#,
            total / 2,
            total - total / 2
        )],
    );
}

/// This Envoy's lease account of tenant `acme`, model `m`, as shared data holds it.
pub(super) fn account(e: &FakeEnvoy) -> crate::quota::lease::account::Account {
    let key = crate::quota::lease::account::account_key("acme", Some("m"));
    let (a, _) =
        crate::store::peek::<crate::quota::lease::account::Account>(&e.store, &key).unwrap();
    a.unwrap()
}

/// A first request reserved per request (30 used), then the tick's lease call answered: 1,000 held.
pub(super) fn granted_a_lease(e: &FakeEnvoy) {
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    e.reply(&mut c, 200, &reserved(60, 1_000_000));
    usage_answer(e, &mut c, 30);
    e.tick(0);
    only_lease_calls(e);
    e.reply_root(0, 200, &lease_reply(1000, 1060, 1, 0));
}

/// Three reservations of another tenant find the shim dead: its breaker opens.
fn break_the_shim(e: &FakeEnvoy) {
    for _ in 0..3 {
        let mut c = e.send(
            "/v1/chat/completions",
            &[("x-tenant-id", "other")],
            &chat("m", "hi", 5),
        );
        e.dead_shim(&mut c);
    }
}

#[test]
fn a_cold_tenant_reserves_per_request_then_spends_from_a_lease_without_callouts() {
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    // Cold: the first request is reserved per request.
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(c.pending.is_some(), "per-request reservation");
    e.reply(&mut c, 200, &reserved(60, 1_000_000));
    usage_answer(&e, &mut c, 30);
    // The tick asks for a lease (and settles the per-request reservation through the journal).
    e.tick(0);
    let calls = lease_calls(&e);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0], ("0".into(), "1000".into(), "-1".into()));
    // Answer the lease call (the settlement batch is left unanswered).
    only_lease_calls(&e);
    e.reply_root(0, 200, &lease_reply(1000, 1060, 1, 0));
    // Now requests are served from the lease: no callout.
    let mut total = 0;
    for _ in 0..5 {
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
        clean(&c);
        assert!(c.forwarded && c.pending.is_none(), "served from the lease");
        assert_eq!(c.audits, 0, "the record is written once, at the settlement");
        usage_answer(&e, &mut c, 40);
        total += 40;
        assert!(c.header("x-tokengate-quota-remaining").is_some());
        assert_eq!(c.audits, 1);
        assert_eq!(c.audit_field("actual").as_deref(), Some("40"));
        assert_eq!(c.audit_field("decision").as_deref(), Some("admit"));
    }
    assert_eq!(e.metric(Metric::QuotaLeased), 5);
    // Each request's end was written by the next request's reservation; the last one's by the tick.
    let a = account(&e);
    assert_eq!(a.consumed, total - 40);
    assert!(a.inflight > 0);
    e.tick(0);
    let a = account(&e);
    assert_eq!((a.consumed, a.inflight), (total, 0));
    // A refresh later reports the usage total.
    e.root_callouts.borrow_mut().clear();
    e.advance_ms(1_100);
    e.tick(0);
    let calls = lease_calls(&e);
    assert_eq!(calls.last().map(|c| c.0.clone()), Some(total.to_string()));
}

#[test]
fn a_lease_keeps_serving_while_the_shim_is_down_and_its_usage_is_reported_after() {
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    granted_a_lease(&e);
    // The shim breaks (three failures open its breaker); the lease still covers requests.
    break_the_shim(&e);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(c.forwarded && c.pending.is_none());
    usage_answer(&e, &mut c, 44);
    // Nothing is sent while the breaker is open; once it lets calls through the usage is reported
    // (the first sync is the breaker's probe, alone: its success closes the breaker).
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    assert!(lease_calls(&e).is_empty());
    e.advance_ms(5_100);
    e.tick(0);
    assert_eq!(lease_calls(&e).len(), 1, "the probe alone");
    if lease_calls(&e)[0].0 != "44" {
        e.reply_root(0, 200, &lease_reply(1000, 1060, 1, 0));
        e.tick(0);
    }
    assert!(
        lease_calls(&e).iter().any(|c| c.0 == "44"),
        "{:?}",
        lease_calls(&e)
    );
}

#[test]
fn while_the_shim_stays_down_lease_syncs_are_one_probe_per_recovery_window() {
    // bb6 black-box: with Redis down, once the shim breaker's recovery had passed every tick (20 ms)
    // sent the failed syncs again (248 in 9 s for one tenant), and their failures never re-opened it.
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    granted_a_lease(&e);
    break_the_shim(&e);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    usage_answer(&e, &mut c, 44);
    e.root_callouts.borrow_mut().clear();
    // Four recovery windows (5 s) of ticks (20 ms each) with every sync failing: each sync is the
    // breaker's probe, alone, and its failure opens the breaker for another window.
    let mut sent = Vec::new();
    for tick in 0..4 * 5_000 / 20 {
        e.advance_ms(20);
        e.tick(0);
        while e.reply_root(0, 503, "").is_some() {
            sent.push(tick);
        }
    }
    assert!(sent.len() >= 2, "syncs sent at ticks {sent:?}");
    assert!(
        sent.windows(2).all(|w| w[1] - w[0] >= 5_000 / 20),
        "syncs sent at ticks {sent:?}"
    );
    // The shim is back: probes succeed (closing the breaker) and the usage is reported.
    let mut reported = false;
    for _ in 0..3 {
        e.advance_ms(5_100);
        e.tick(0);
        let calls = lease_calls(&e);
        assert!(calls.len() <= 1, "{calls:?}");
        reported |= calls.iter().any(|c| c.0 == "44");
        if e.reply_root(0, 200, &lease_reply(1000, 1104, 2, 44))
            .is_none()
        {
            break;
        }
    }
    assert!(reported, "the usage was reported");
    let key = crate::flow::shim::key("webdis");
    let (st, _) = crate::store::peek::<crate::breaker::BreakerState>(&e.store, &key).unwrap();
    assert_eq!(st.unwrap().state(), crate::breaker::State::Closed);
}

#[test]
fn an_idle_lease_is_given_back() {
    let e = envoy(cfg(json!({"min_tokens": 1000, "idle_s": 5})));
    granted_a_lease(&e);
    e.advance_ms(6_000);
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    let calls = lease_calls(&e);
    assert_eq!(
        calls.last().map(|c| c.2.clone()),
        Some("0".into()),
        "target 0: {calls:?}"
    );
}

#[test]
fn a_refusal_while_this_envoy_holds_a_lease_does_not_mark_the_tenant_exhausted() {
    let e = envoy(cfg(json!({"min_tokens": 100})));
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    e.reply(&mut c, 200, &reserved(60, 1_000_000));
    usage_answer(&e, &mut c, 30);
    e.tick(0);
    only_lease_calls(&e);
    e.reply_root(0, 200, &lease_reply(200, 1060, 1, 0));
    // A request the lease cannot cover goes per request; Redis refuses it with little left (the
    // lease's 200 are counted there as used).
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 500));
    assert!(
        c.pending.is_some(),
        "per request: the lease holds less than its cost"
    );
    e.reply(&mut c, 200, &eval(&[0, 999_900, 1_000_000, 0, -1, 0, 0, 1]));
    assert_eq!(c.status(), Some(429));
    // Not marked exhausted: the lease goes back at the next sync and a later request may fit; the
    // next one is asked of Redis (here covered by the lease again), not refused from the marker.
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(c.forwarded, "{:?}", c.status());
    assert_eq!(e.metric(Metric::QuotaRejectedCached), 0);
}

#[test]
fn a_tenant_served_from_a_lease_moments_ago_is_not_refused_from_its_exhausted_marker() {
    use crate::quota::ExhaustedMarker;
    use crate::store::{Codec, SharedStore};
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    granted_a_lease(&e);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(c.forwarded && c.pending.is_none(), "served from the lease");
    usage_answer(&e, &mut c, 40);
    // A marker says the tenant is exhausted (written by hand: this Envoy writes none while it holds
    // a lease of the tenant).
    let marker = ExhaustedMarker {
        month_end_unix: i64::MAX,
        limit: 1_000_000,
        config_limit: 1_000_000,
        remaining: 0,
    };
    e.store
        .set(&ExhaustedMarker::key("acme"), &marker.encode(), 0)
        .unwrap();
    // Within 100 ms of the lease serving the tenant, the marker is not read: the lease decides.
    e.advance_ms(50);
    let reads = e.store.reads();
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(c.forwarded && c.pending.is_none(), "served from the lease");
    assert_eq!(
        e.store.reads() - reads,
        2,
        "the bucket and the lease account, no marker"
    );
    usage_answer(&e, &mut c, 40);
    // Later, the marker is read again and refuses in the headers phase.
    e.advance_ms(200);
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert_eq!(c.status(), Some(429));
    assert!(!c.upstream_started);
    assert_eq!(e.metric(Metric::QuotaRejectedCached), 1);
}

/// The usage of a leased request served with the reservation of the next one, or written by the tick.
#[test]
fn a_leased_request_is_settled_by_the_next_reservation_of_its_account_or_the_tick() {
    let e = FakeEnvoy::new(&cfg(json!({"min_tokens": 1000})).to_string(), 2);
    granted_a_lease(&e);
    let key = crate::quota::lease::account::account_key("acme", Some("m"));
    // The account's CAS token: MemStore moves it by one per write.
    let writes = |e: &FakeEnvoy| {
        crate::store::SharedStore::get(&e.store, &key)
            .unwrap()
            .unwrap()
            .1
    };

    let mut first = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(first.pending.is_none(), "served from the lease");
    let reserved_each = account(&e).inflight;
    assert!(reserved_each > 40);
    let before = writes(&e);
    usage_answer(&e, &mut first, 40);
    assert_eq!(writes(&e), before, "its end is kept by the VM");
    assert_eq!(first.audit_field("actual").as_deref(), Some("40"));
    assert_eq!(
        (account(&e).consumed, account(&e).inflight),
        (0, reserved_each)
    );

    // The next request of the account writes it with its own reservation, in one CAS.
    let before = writes(&e);
    let mut second = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(second.pending.is_none());
    assert_eq!(
        writes(&e) - before,
        1,
        "one write for the end and the reservation"
    );
    assert_eq!(
        (account(&e).consumed, account(&e).inflight),
        (40, reserved_each)
    );
    usage_answer(&e, &mut second, 45);
    // A second worker's requests of the account are its own; each worker's tick writes what it kept.
    let mut third = e.send_on(1, "/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(third.pending.is_none());
    usage_answer(&e, &mut third, 50);
    assert_eq!(
        (account(&e).consumed, account(&e).inflight),
        (40, 2 * reserved_each)
    );
    e.tick(0);
    assert_eq!(
        (account(&e).consumed, account(&e).inflight),
        (85, reserved_each)
    );
    e.tick(1);
    assert_eq!((account(&e).consumed, account(&e).inflight), (135, 0));
    // A sync reports all of it.
    e.root_callouts.borrow_mut().clear();
    e.advance_ms(1_100);
    e.tick(0);
    assert_eq!(
        lease_calls(&e).last().map(|c| c.0.clone()),
        Some("135".to_string())
    );
}

#[test]
fn a_worker_torn_down_writes_the_leased_requests_it_kept() {
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    granted_a_lease(&e);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(c.pending.is_none(), "served from the lease");
    usage_answer(&e, &mut c, 40);
    assert!(account(&e).inflight > 0);
    e.done(0);
    assert_eq!((account(&e).consumed, account(&e).inflight), (40, 0));
}

#[test]
fn a_request_too_big_for_the_lease_reports_the_unspent_lease_as_left() {
    // Redis' counter includes this Envoy's whole lease (1,000 held, none spent): a request reserved
    // by a callout while the lease is held says the lease's unspent part is left, as a request
    // served from the lease does.
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    granted_a_lease(&e);
    let mut small = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(small.pending.is_none(), "served from the lease");
    usage_answer(&e, &mut small, 40);
    let from_lease: u64 = small
        .header("x-tokengate-quota-remaining")
        .unwrap()
        .parse()
        .unwrap();
    e.tick(0);
    let mut big = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5_000));
    assert!(
        big.pending.is_some(),
        "more than the lease holds: reserved per request"
    );
    // The reservation's cost, on a counter that already holds the lease.
    e.reply(&mut big, 200, &reserved(1_060 + 5_010, 1_000_000));
    usage_answer(&e, &mut big, 100);
    let left: u64 = big
        .header("x-tokengate-quota-remaining")
        .unwrap()
        .parse()
        .unwrap();
    let unspent = 1_000 - 40;
    assert_eq!(left, 1_000_000 - (1_060 + 5_010) + unspent);
    assert!(left < from_lease);
}

/// A tenant refusal with `left` of 1,000,000 left, what other Envoys' leases would add (`grow`), and
/// whether they hold leases of the tenant at all (the 9th element).
fn refused_elsewhere(left: i64, grow: i64, others: bool) -> String {
    eval(&[
        0,
        1_000_000 - left,
        1_000_000,
        0,
        -1,
        grow,
        0,
        1,
        i64::from(others),
    ])
}

/// A refused reservation: `[0, used, limit, model_used, model_limit, 0, 0, reason 1 (tenant)]`.
fn refused(used: i64) -> String {
    eval(&[0, used, 1_000_000, used, -1, 0, 0, 1])
}

#[test]
fn a_request_redis_refuses_but_the_lease_covers_gives_the_lease_back_and_is_reserved() {
    // bb12: 67,868 left with this Envoy's lease, a request of 65,546 refused as "month spent"
    // (x-should-retry: false), admitted a second later once the lease had gone back.
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    granted_a_lease(&e);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5_000));
    assert!(
        c.pending.is_some(),
        "more than the lease holds: reserved per request"
    );
    // Redis has 4,500 left outside the lease: not enough alone, enough with its 1,000.
    e.reply(&mut c, 200, &refused(1_000_000 - 4_500));
    let give = c.pending.clone().expect("the lease is given back first");
    assert_eq!(give.purpose, crate::flow::Purpose::LeaseGiveBack);
    let seg = segments(&give.body);
    let nkeys: usize = seg[2].parse().unwrap();
    // Target: what requests in flight hold (none).
    assert_eq!(seg[3 + nkeys + 3], "0");
    assert_eq!(
        account(&e).available(),
        0,
        "nothing spent while it goes back"
    );
    assert!(c.status().is_none() && !c.forwarded);
    e.reply(&mut c, 200, &lease_reply(0, 1_000_000 - 5_500, 2, 0));
    let again = c.pending.clone().expect("the reservation is sent again");
    assert_eq!(again.purpose, crate::flow::Purpose::Reserve);
    e.reply(&mut c, 200, &reserved(1_000_000 - 5_500 + 5_010, 1_000_000));
    clean(&c);
    assert!(c.forwarded, "admitted");
    usage_answer(&e, &mut c, 100);
    assert_eq!(c.audit_field("decision").as_deref(), Some("admit"));
    // Admitted: not a quota refusal in the metrics (the first refusal was counted before).
    assert_eq!(e.metric(Metric::QuotaRejected), 0);
}

#[test]
fn a_refusal_that_other_envoys_leases_would_cover_is_a_retryable_429() {
    // Left by the last stop: with two Envoys, a request that only the other Envoy's idle lease
    // could cover was refused as "month spent" (x-should-retry: false): the SDKs gave up, and a
    // retry after that lease went back would have passed.
    let e = envoy(cfg(
        json!({"min_tokens": 1000, "idle_s": 10, "refresh_ms": 1000}),
    ));
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5_000));
    // 500 left in Redis (below exhausted_below, 1,000); other Envoys' leases hold 5,000.
    e.reply(&mut c, 200, &refused_elsewhere(500, 5_000, true));
    assert_eq!(c.status(), Some(429));
    let j = c.reply_json();
    assert_eq!(j["error"]["code"], "rate_limit_exceeded");
    assert_eq!(j["error"]["type"], "tokens");
    assert_eq!(
        c.reply_header("x-tokengate-reason"),
        Some("monthly_quota_leased")
    );
    assert_eq!(c.reply_header("x-should-retry"), Some("true"));
    // Idle leases go back after idle_s, at their Envoy's next sync, walk and call: 10 + 1 + 0.02
    // (one account in this Envoy's walk, a tick of 32) + 1 s, rounded up.
    assert_eq!(c.reply_header("retry-after"), Some("13"));
    assert_eq!(c.reply_header("retry-after-ms"), Some("12020"));
    assert_eq!(c.reply_header("x-tokengate-quota-remaining"), Some("500"));
    assert_eq!(
        c.audit_field("decision").as_deref(),
        Some("quota_held_elsewhere")
    );
    assert_eq!(e.metric(Metric::QuotaRejected), 1);
    // No exhausted marker, though less than exhausted_below is left: the next request asks Redis.
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    assert!(c.pending.is_some(), "asks Redis");
}

#[test]
fn a_refusal_that_the_leases_cannot_cover_stays_a_spent_quota_and_marks_nothing_while_they_hold_some(
) {
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5_000));
    // 500 left and 2,000 in other Envoys' leases: 2,500 < 5,010.
    e.reply(&mut c, 200, &refused_elsewhere(500, 2_000, true));
    assert_eq!(c.status(), Some(429));
    assert_eq!(c.reply_json()["error"]["code"], "insufficient_quota");
    assert_eq!(c.reply_header("x-should-retry"), Some("false"));
    assert_eq!(c.reply_header("retry-after"), None);
    // Review: the exhausted marker (500 < 1,000) then refused a request of 1,510 at once as month
    // spent, which the leases going back would let through: Redis is asked.
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 1_500));
    assert!(c.pending.is_some(), "asks Redis");
    e.reply(&mut c, 200, &refused_elsewhere(500, 2_000, true));
    assert_eq!(
        c.reply_header("x-tokengate-reason"),
        Some("monthly_quota_leased")
    );
    // Review: no growth for this request's account, but other Envoys hold leases of the tenant
    // (another model): no marker either (9th element).
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 1_500));
    e.reply(&mut c, 200, &refused_elsewhere(500, 0, true));
    assert_eq!(c.reply_json()["error"]["code"], "insufficient_quota");
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 1_500));
    assert!(c.pending.is_some(), "asks Redis");
    // Its client goes (its callout no longer holds this VM's next reservations in a batch).
    e.end(&mut c);
    // With no lease held anywhere, the marker is written as before.
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 1_500));
    e.reply(&mut c, 200, &refused(1_000_000 - 500));
    assert_eq!(c.reply_json()["error"]["code"], "insufficient_quota");
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 1_500));
    assert!(c.pending.is_none(), "refused from the marker");
    assert_eq!(c.status(), Some(429));
}

#[test]
fn a_give_back_answered_noscript_is_sent_again_as_eval_and_the_request_admitted() {
    // Left by the last stop: Redis restarted (its scripts gone) while this Envoy held a lease; the
    // give-back's NOSCRIPT was taken for a failure and the request got Redis' first refusal.
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    granted_a_lease(&e);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5_000));
    e.reply(&mut c, 200, &refused(1_000_000 - 4_500));
    let give = c.pending.clone().expect("the give-back");
    assert_eq!(give.purpose, crate::flow::Purpose::LeaseGiveBack);
    assert!(give.body.starts_with("EVALSHA/"), "{}", give.body);
    e.reply(
        &mut c,
        200,
        r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#,
    );
    let again = c.pending.clone().expect("the give-back, sent again");
    assert_eq!(again.purpose, crate::flow::Purpose::LeaseGiveBack);
    assert!(again.body.starts_with("EVAL/"), "{}", again.body);
    assert_eq!(
        account(&e).available(),
        0,
        "still nothing spendable while it goes back"
    );
    e.reply(&mut c, 200, &lease_reply(0, 1_000_000 - 5_500, 2, 0));
    let reserve = c.pending.clone().expect("the reservation, sent again");
    assert_eq!(reserve.purpose, crate::flow::Purpose::Reserve);
    e.reply(&mut c, 200, &reserved(1_000_000 - 5_500 + 5_010, 1_000_000));
    clean(&c);
    assert!(c.forwarded, "admitted");
    assert_eq!(e.metric(Metric::QuotaRejected), 0);
}

#[test]
fn a_refused_request_the_lease_cannot_cover_is_refused_at_once_and_only_once_given_back() {
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    granted_a_lease(&e);
    // 3,000 left outside the lease + 1,000 in it < 5,010: refused, the lease kept.
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5_000));
    e.reply(&mut c, 200, &refused(1_000_000 - 3_000));
    assert_eq!(c.status(), Some(429));
    assert_eq!(account(&e).available(), 1_000);
    // Covered, but Redis refuses again after the give-back (another Envoy took it): 429, no
    // second give-back.
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5_000));
    e.reply(&mut c, 200, &refused(1_000_000 - 4_500));
    assert_eq!(
        c.pending.as_ref().map(|p| p.purpose),
        Some(crate::flow::Purpose::LeaseGiveBack)
    );
    e.reply(&mut c, 200, &lease_reply(0, 1_000_000 - 4_000, 2, 0));
    e.reply(&mut c, 200, &refused(1_000_000 - 4_000));
    assert_eq!(c.status(), Some(429));
    assert!(c.pending.is_none());
    let j = c.reply_json();
    assert_eq!(j["error"]["code"], "insufficient_quota");
    assert_eq!(e.metric(Metric::QuotaRejected), 2, "each 429 once");
}

#[test]
fn the_give_back_goes_out_while_the_sync_the_miss_asked_for_is_in_flight_and_that_sync_cannot_refill_it(
) {
    // Review: the request's own miss asks for a sync; sent by the next tick, it was still in flight
    // when Redis refused, the give-back was not made and the request got the 429.
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    granted_a_lease(&e);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5_000));
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    assert_eq!(lease_calls(&e).len(), 1, "the sync the miss asked for");
    e.reply(&mut c, 200, &refused(1_000_000 - 4_500));
    assert_eq!(
        c.pending.as_ref().map(|p| p.purpose),
        Some(crate::flow::Purpose::LeaseGiveBack)
    );
    assert_eq!(account(&e).available(), 0);
    // No other sync starts meanwhile.
    e.advance_ms(100);
    e.tick(0);
    assert_eq!(lease_calls(&e).len(), 1);
    // The earlier sync answers first, having grown the lease to 20,000: not spendable.
    e.reply_root(
        0,
        200,
        &lease_reply(20_000, 1_000_000 - 4_500 + 19_000, 2, 0),
    );
    assert_eq!(
        account(&e).available(),
        0,
        "a sync answered while the give-back is in flight"
    );
    // The give-back took all of it back.
    e.reply(&mut c, 200, &lease_reply(0, 1_000_000 - 5_500, 3, 0));
    e.reply(&mut c, 200, &reserved(1_000_000 - 5_500 + 5_010, 1_000_000));
    clean(&c);
    assert!(c.forwarded, "admitted");
}

#[test]
fn a_give_back_that_fails_leaves_redis_refusal_as_the_answer_whatever_on_failure_says() {
    // Review: a failed give-back then sent the reservation again, and its failure applied the
    // shim's failure policy: with "open", a request Redis had refused was admitted.
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1e6, 1e9)],
        "quota": {"cluster": "webdis", "monthly_limit": 1_000_000, "on_failure": "open",
                  "lease": {"min_tokens": 1000}}}),
    );
    granted_a_lease(&e);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5_000));
    e.reply(&mut c, 200, &refused(1_000_000 - 4_500));
    assert!(c.pending.is_some(), "the give-back");
    e.dead_shim(&mut c);
    assert!(c.pending.is_none(), "not sent again");
    assert_eq!(c.status(), Some(429), "Redis' refusal");
    assert!(!c.forwarded);
    assert_eq!(c.reply_json()["error"]["code"], "insufficient_quota");
    // Given back (or not) for this request: no exhausted marker while Redis may hold the lease.
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    assert!(
        c.pending.is_some(),
        "no marker: the next request asks Redis"
    );
}

#[test]
fn a_lease_a_sync_gave_back_while_the_reservation_was_in_flight_is_asked_for_again() {
    // Third black-box run (1-3 % of tries): the request's miss made the next tick give the lease
    // back (too small for such requests); Redis ran the refused reservation just before that
    // give-back, and the request, finding no lease left to give back, was answered 429.
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    granted_a_lease(&e);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5_000));
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    assert_eq!(lease_calls(&e).len(), 1);
    // The sync gave everything back (Redis ran it after the reservation).
    e.reply_root(0, 200, &lease_reply(0, 1_000_000 - 5_500, 2, 0));
    e.reply(&mut c, 200, &refused(1_000_000 - 4_500));
    let again = c.pending.clone().expect("sent again");
    assert_eq!(again.purpose, crate::flow::Purpose::Reserve);
    e.reply(&mut c, 200, &reserved(1_000_000 - 5_500 + 5_010, 1_000_000));
    clean(&c);
    assert!(c.forwarded, "admitted");
    // No lease then and none now: refused at once.
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5_000));
    e.reply(&mut c, 200, &refused(1_000_000 - 4_500));
    assert_eq!(c.status(), Some(429));
}

#[test]
fn a_lease_granted_while_a_reservation_waits_is_not_counted_as_left_on_top_of_redis() {
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    // A cold tenant's first request waits for its reservation...
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(c.pending.is_some(), "per-request reservation");
    // ...while the tick's lease call for the account is answered first (Redis ran it after the
    // reservation, whose `used` does not count it).
    e.tick(0);
    only_lease_calls(&e);
    e.reply_root(0, 200, &lease_reply(1000, 1060, 1, 0));
    e.reply(&mut c, 200, &reserved(60, 1_000_000));
    usage_answer(&e, &mut c, 30);
    let left: u64 = c
        .header("x-tokengate-quota-remaining")
        .expect("remaining")
        .parse()
        .unwrap();
    assert!(
        left <= 1_000_000 - 60,
        "remaining {left} over the limit less this reservation"
    );
}
