//! Global-bucket leases (`global_buckets.lease`): requests spend this Envoy's block of a global bucket
//! without a callout, exactly across workers; blocks are asked with a miss or by the tick, idle ones go
//! back to Redis; credits go to the lease.

use super::*;
use crate::flow::{Metric, Purpose};
use crate::global::lease::{self, Account};

const KEY: &str = "tg:gb:{g:acme}:m";

fn cfg(rule_extra: Value, lease: Value, on_failure: &str) -> Value {
    let mut rule =
        json!({"name": "g", "tokens_per_second": 1000, "burst": 1_000_000, "global": true});
    if let (Some(r), Some(x)) = (rule.as_object_mut(), rule_extra.as_object()) {
        for (k, v) in x {
            r.insert(k.clone(), v.clone());
        }
    }
    json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule],
        "global_buckets": {"cluster": "webdis", "on_failure": on_failure, "lease": lease}})
}

/// `{"EVAL":[0, tokens left × 1000, requests left × 1000, 0, block tokens, block requests]}`.
fn admitted(left: i64, bt: i64, br: i64) -> String {
    eval(&[0, left * 1000, 0, 0, bt, br])
}

/// The script's ARGV of a Webdis command body.
fn argv(body: &str) -> Vec<String> {
    let seg = segments(body);
    let nkeys: usize = seg[2].parse().unwrap();
    seg[3 + nkeys..].to_vec()
}

fn account(e: &FakeEnvoy) -> Account {
    crate::store::peek::<Account>(&e.store, &lease::account_key(KEY))
        .unwrap()
        .0
        .expect("an account")
}

fn send(e: &FakeEnvoy, w: usize) -> Call {
    e.send_on(w, "/v1/chat/completions", &[TENANT], &chat("m", "hi", 100))
}

/// Requests every 10 ms, each charged in Redis, until one asks for a block; returns it and its cost.
fn warm_up(e: &FakeEnvoy) -> (Call, u64) {
    for i in 0..50 {
        e.advance_ms(10);
        let mut c = send(e, 0);
        let args = argv(&c.pending.as_ref().expect("charged in Redis").body);
        let cost: u64 = args[0].parse().unwrap();
        if args[9] != "0" {
            assert!(i > 0, "nothing is leased before any use was measured");
            return (c, cost);
        }
        assert_eq!(args[8], "1", "a request");
        e.reply(&mut c, 200, &admitted(900_000, 0, 0));
        assert!(c.forwarded);
        e.respond(&mut c, 200, &[], &["{}"]);
    }
    panic!("no block was ever asked");
}

#[test]
fn a_busy_bucket_gets_a_block_with_a_charge_and_requests_then_spend_it_without_callouts() {
    let e = FakeEnvoy::new(&cfg(json!({}), json!({}), "closed").to_string(), 2);
    let (mut c, cost) = warm_up(&e);
    let asked: u64 = argv(&c.pending.as_ref().unwrap().body)[9].parse().unwrap();
    assert!(
        asked >= cost,
        "a block covers at least one request: {asked} < {cost}"
    );
    assert!(asked <= 100_000, "at most 10 % of the burst");
    // Redis grants 5 requests' worth beyond this one.
    e.reply(&mut c, 200, &admitted(800_000, 5 * cost as i64, 0));
    assert!(c.forwarded);
    assert_eq!(account(&e).tokens, 5 * cost);
    let charged = e.metric(Metric::GlobalCharged);
    for i in 0..5 {
        let mut c = send(&e, i % 2);
        clean(&c);
        assert!(
            c.forwarded && c.pending.is_none(),
            "request {i} from the lease"
        );
        e.respond(&mut c, 200, &[], &["{}"]);
        assert!(c.header("x-ratelimit-remaining-tokens").is_some());
    }
    assert_eq!(e.metric(Metric::GlobalLeased), 5);
    assert_eq!(e.metric(Metric::GlobalCharged), charged, "no callout");
    // Spent exactly: the sixth goes to Redis again.
    assert_eq!(account(&e).tokens, 0);
    let c = send(&e, 0);
    assert!(c.pending.is_some(), "the lease is empty");
}

#[test]
fn two_workers_never_admit_more_than_the_lease_holds() {
    let e = FakeEnvoy::new(&cfg(json!({}), json!({}), "closed").to_string(), 2);
    let (mut c, cost) = warm_up(&e);
    e.reply(
        &mut c,
        200,
        &admitted(800_000, 7 * cost as i64 + cost as i64 / 2, 0),
    );
    let mut from_lease = 0;
    let mut charged = Vec::new();
    for i in 0..20 {
        let c = send(&e, i % 2);
        if c.forwarded && c.pending.is_none() {
            from_lease += 1;
        } else if let Some(p) = &c.pending {
            // EVALSHA/<sha>/1/<key>/<cost>/…: what Redis is charged.
            charged.push(segments(&p.body)[4].parse::<u64>().unwrap());
        }
    }
    assert_eq!(from_lease, 7, "7.5 requests' worth admits 7");
    // The eighth takes the half request the lease still held and is charged the rest in Redis.
    assert_eq!(charged.first(), Some(&(cost - cost / 2)), "{charged:?}");
    assert_eq!(account(&e).tokens, 0);
}

#[test]
fn the_tick_tops_up_a_low_lease_and_gives_an_idle_one_back_with_its_requests() {
    let e = envoy(cfg(
        json!({"requests_per_minute": 100_000}),
        json!({"idle_ms": 500}),
        "closed",
    ));
    let (mut c, cost) = warm_up(&e);
    let args = argv(&c.pending.as_ref().unwrap().body);
    assert_ne!(
        args[10], "0",
        "requests are asked with the tokens: {args:?}"
    );
    let block = 4 * cost as i64;
    e.reply(&mut c, 200, &admitted(800_000, block, 4));
    assert_eq!((account(&e).tokens, account(&e).requests), (4 * cost, 4));
    // Spending most of it asks for a top-up, sent by the next tick.
    let mut spent = 0;
    while account(&e).tokens >= cost && spent < 4 {
        let c = send(&e, 0);
        assert!(c.forwarded && c.pending.is_none());
        spent += 1;
    }
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    let calls: Vec<Vec<String>> = e
        .root_callouts
        .borrow()
        .iter()
        .filter(|c| matches!(c.purpose, Purpose::GlobalLease(_)))
        .map(|c| argv(&c.body))
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let top = &calls[0];
    assert_eq!(
        (top[0].as_str(), top[8].as_str()),
        ("0", "0"),
        "a block alone: {top:?}"
    );
    let bt: i64 = top[9].parse().unwrap();
    assert!(bt > 0);
    e.root_callouts
        .borrow_mut()
        .retain(|c| matches!(c.purpose, Purpose::GlobalLease(_)));
    e.reply_root(0, 200, &admitted(700_000, bt, 3));
    let held = account(&e);
    assert!(held.tokens >= bt as u64, "{held:?}");
    assert_eq!(e.metric(Metric::GlobalLeaseCalls), 1);
    // Idle for longer than idle_ms: the leader gives tokens and requests back.
    e.advance_ms(600);
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    let back: Vec<Vec<String>> = e
        .root_callouts
        .borrow()
        .iter()
        .filter(|c| matches!(c.purpose, Purpose::GlobalLease(_)))
        .map(|c| argv(&c.body))
        .collect();
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(back[0][5], held.tokens.to_string(), "credit: {:?}", back[0]);
    assert_eq!(back[0][11], held.requests.to_string());
    assert_eq!(account(&e).tokens, 0);
    e.reply_root(0, 200, &admitted(1_000_000, 0, 0));
    assert_eq!(e.metric(Metric::GlobalLeaseReturnedTokens), held.tokens);
    // Nothing more to give back.
    e.tick(0);
    assert!(e.root_callouts.borrow().is_empty());
}

#[test]
fn credits_of_a_leased_bucket_go_to_the_lease_not_to_redis() {
    let e = envoy(cfg(json!({"refund_unused": true}), json!({}), "closed"));
    let (mut c, cost) = warm_up(&e);
    e.reply(&mut c, 200, &admitted(800_000, 2 * cost as i64, 0));
    // The provider used 10 tokens: the rest comes back into the lease.
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[r#"{"usage":{"prompt_tokens":4,"completion_tokens":6}}"#],
    );
    assert_eq!(account(&e).tokens, 2 * cost + cost - 10);
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    assert!(
        !e.root_callouts
            .borrow()
            .iter()
            .any(|c| matches!(c.purpose, Purpose::Credit(_))),
        "no credit sent to Redis"
    );
    assert_eq!(e.metric(Metric::GlobalTokensCredited), cost - 10);
}

#[test]
fn a_held_lease_is_spent_while_redis_is_down_then_on_failure_applies() {
    let e = envoy(cfg(json!({}), json!({}), "closed"));
    let (mut c, cost) = warm_up(&e);
    e.reply(&mut c, 200, &admitted(800_000, 2 * cost as i64, 0));
    // Redis goes away: the next miss (another tenant) fails.
    let mut o = e.send(
        "/v1/chat/completions",
        &[("x-tenant-id", "other")],
        &chat("m", "hi", 100),
    );
    e.dead_shim(&mut o);
    assert_eq!(o.status(), Some(503));
    for _ in 0..2 {
        let c = send(&e, 0);
        assert!(c.forwarded && c.pending.is_none(), "from the lease");
    }
    let mut c = send(&e, 0);
    e.dead_shim(&mut c);
    assert_eq!(
        c.status(),
        Some(503),
        "on_failure=closed once the lease is spent"
    );
    // The failed ask is cleared: a later miss may ask again.
    assert_eq!(account(&e).asking_since_ns, 0);
}

#[test]
fn while_the_shim_stays_down_background_calls_are_one_probe_per_recovery_window() {
    // As for quota leases (bb6): top-ups asked by the tick must not go out at every tick once the
    // breaker's recovery has passed, while the shim stays down.
    let e = envoy(cfg(
        json!({"requests_per_minute": 100_000}),
        json!({}),
        "closed",
    ));
    let (mut c, cost) = warm_up(&e);
    e.reply(&mut c, 200, &admitted(800_000, 2_000 * cost as i64, 2_000));
    // Spend most of it: the lease is low, and each request served from it asks for a top-up.
    let mut spent = 0;
    while account(&e).tokens >= 400 * cost && spent < 2_000 {
        let c = send(&e, 0);
        assert!(c.forwarded && c.pending.is_none());
        spent += 1;
    }
    e.root_callouts.borrow_mut().clear();
    for _ in 0..3 {
        let mut o = e.send(
            "/v1/chat/completions",
            &[("x-tenant-id", "other")],
            &chat("m", "hi", 100),
        );
        e.dead_shim(&mut o);
    }
    // 12 s of ticks (20 ms), a request from the lease every tick, every call to the shim failing.
    let mut sent = Vec::new();
    for tick in 0..600 {
        e.advance_ms(20);
        let mut c = send(&e, 0);
        if c.pending.is_some() {
            e.dead_shim(&mut c);
        }
        e.tick(0);
        while e.reply_root(0, 503, "").is_some() {
            sent.push(tick);
        }
    }
    assert!(!sent.is_empty(), "top-ups were asked");
    assert!(
        sent.windows(2).all(|w| w[1] - w[0] >= 5_000 / 20),
        "calls sent at ticks {sent:?}"
    );
}

#[test]
fn a_cached_refusal_does_not_refuse_what_the_lease_still_holds() {
    let e = envoy(cfg(json!({}), json!({}), "closed"));
    let (mut c, cost) = warm_up(&e);
    e.reply(&mut c, 200, &admitted(800_000, cost as i64 / 2, 0));
    // A bigger request misses the lease and Redis refuses it (the bucket is spent).
    let mut big = e.send_on(0, "/v1/chat/completions", &[TENANT], &chat("m", "hi", 400));
    e.reply(&mut big, 200, &eval(&[2, 0, 0, 1_000_000, 0, 0]));
    assert_eq!(big.status(), Some(429));
    // A small one fits the lease: admitted, though the refusal cache says the bucket is spent.
    let small = e.send_on(
        0,
        "/v1/chat/completions",
        &[TENANT, ("x-tokengate-model", "m")],
        &chat("m", "", 1),
    );
    assert!(
        small.forwarded && small.pending.is_none(),
        "{:?}",
        small.reply_json()
    );
    // Without it, the cache refuses.
    let again = e.send_on(0, "/v1/chat/completions", &[TENANT], &chat("m", "hi", 400));
    assert_eq!(again.status(), Some(429));
    assert_eq!(e.metric(Metric::GlobalRejectedCached), 1);
}

#[test]
fn without_lease_settings_every_request_is_charged_in_redis() {
    let mut c = cfg(json!({}), json!({}), "closed");
    c["global_buckets"].as_object_mut().unwrap().remove("lease");
    let e = envoy(c);
    for _ in 0..30 {
        e.advance_ms(10);
        let mut c = send(&e, 0);
        let args = argv(&c.pending.as_ref().expect("a charge").body);
        assert_eq!(args[9], "0", "no block asked");
        e.reply(&mut c, 200, &admitted(900_000, 0, 0));
        e.respond(&mut c, 200, &[], &["{}"]);
    }
    assert_eq!(e.metric(Metric::GlobalCharged), 30);
    assert_eq!(e.metric(Metric::GlobalLeased), 0);
}

#[test]
fn accounts_are_bounded_by_max_tenants_and_beyond_it_requests_are_charged_one_by_one() {
    let mut c = cfg(json!({}), json!({}), "closed");
    c["max_tenants"] = json!(1);
    let e = envoy(c);
    let (mut first, _) = warm_up(&e);
    e.reply(&mut first, 200, &admitted(800_000, 0, 0));
    for _ in 0..30 {
        e.advance_ms(10);
        let mut c = e.send(
            "/v1/chat/completions",
            &[("x-tenant-id", "other")],
            &chat("m", "hi", 100),
        );
        let args = argv(&c.pending.as_ref().expect("charged in Redis").body);
        assert_eq!(args[9], "0", "no block for a bucket beyond the bound");
        e.reply(&mut c, 200, &admitted(900_000, 0, 0));
        assert!(c.forwarded);
    }
    let other = lease::account_key("tg:gb:{g:other}:m");
    assert!(crate::store::peek::<Account>(&e.store, &other)
        .unwrap()
        .0
        .is_none());
}

#[test]
fn a_miss_spends_what_the_lease_holds_and_a_refusal_gives_it_back() {
    let e = envoy(cfg(json!({}), json!({}), "closed"));
    let (mut c, cost) = warm_up(&e);
    // The block granted holds one and a half requests.
    e.reply(
        &mut c,
        200,
        &admitted(800_000, cost as i64 + cost as i64 / 2, 0),
    );
    assert!(send(&e, 0).forwarded, "one from the lease");
    // The next holds half of its cost: Redis is charged only the rest (the bucket and the lease
    // together can admit it even when Redis alone cannot).
    let mut c = send(&e, 0);
    let args = argv(&c.pending.as_ref().unwrap().body);
    assert_eq!(args[0], (cost - cost / 2).to_string());
    assert_eq!(account(&e).tokens, 0);
    // Refused: the half goes back to the lease.
    e.reply(&mut c, 200, &eval(&[2, 0, 0, 5_000_000, 0, 0]));
    assert_eq!(c.status(), Some(429));
    assert_eq!(account(&e).tokens, cost / 2);
}

#[test]
fn an_idle_lease_given_back_clears_a_cached_refusal_of_its_bucket() {
    // A bucket that hardly refills: a cached refusal stands for hours unless something changes it.
    let e = envoy(cfg(
        json!({"tokens_per_second": 0.001}),
        json!({"idle_ms": 500}),
        "closed",
    ));
    let (mut c, cost) = warm_up(&e);
    e.reply(&mut c, 200, &admitted(800_000, cost as i64 / 2, 0));
    // Half a request in the lease: the next takes it and Redis, nearly empty, refuses the rest.
    let mut c = send(&e, 0);
    e.reply(&mut c, 200, &eval(&[2, 10_000, 0, 3_600_000_000, 0, 0]));
    assert_eq!(c.status(), Some(429));
    assert_eq!(account(&e).tokens, cost / 2, "given back to the lease");
    // Refused from the cache while Redis cannot have refilled.
    let c = send(&e, 0);
    assert_eq!(c.status(), Some(429));
    assert_eq!(e.metric(Metric::GlobalRejectedCached), 1);
    // Idle: the lease goes back to Redis; once it took it, the cached refusal is gone.
    e.advance_ms(600);
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    assert!(e
        .root_callouts
        .borrow()
        .iter()
        .any(|c| matches!(c.purpose, Purpose::GlobalLease(_))));
    e.reply_root(0, 200, &admitted(10 + cost as i64 / 2, 0, 0));
    let c = send(&e, 0);
    assert!(
        c.pending.is_some(),
        "asked of Redis, not refused from a stale cache"
    );
    assert_eq!(e.metric(Metric::GlobalRejectedCached), 1);
}
