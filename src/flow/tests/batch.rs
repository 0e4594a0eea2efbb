//! Group commit of reservations (`flow::vm::batch`): many tenants' reservations in one call, each
//! request answered with its own entry, and the fault guarantees per request.

use super::*;
use crate::flow::effect::Purpose;
use crate::flow::Metric;

fn cfg(on_failure: &str, batch: Value) -> Value {
    json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "rules": [rule(1000.0, 1e6)],
        "quota": {"cluster": "webdis", "monthly_limit": 100000, "on_failure": on_failure, "batch": batch,
        "lease": false}})
}

fn send(e: &FakeEnvoy, tenant: &str) -> Call {
    e.send(
        "/v1/chat/completions",
        &[("x-tenant-id", tenant)],
        &chat("m", "hi", 10),
    )
}

/// One admitted entry of a batch reply (used after, limit).
fn ok(used: i64) -> Vec<i64> {
    vec![1, used, 100000, 0, -1, 0, 10, 0, 0]
}

/// One refused entry (tenant limit).
fn over() -> Vec<i64> {
    vec![0, 99_995, 100000, 0, -1, 0, 0, 1, 0]
}

/// An entry the script refused with `code`.
fn refused_code(code: i64) -> Vec<i64> {
    vec![-1, code, 0, 0, 0, 0, 0, 0, 0]
}

fn batch_reply(entries: &[Vec<i64>]) -> String {
    eval(&entries.concat())
}

/// The tenants of the batch call waiting at the root (first one).
fn batch_tenants(e: &FakeEnvoy) -> Vec<String> {
    let calls = e.root_callouts.borrow();
    let c = calls
        .iter()
        .find(|c| matches!(c.purpose, Purpose::Batch(_)))
        .expect("a batch call");
    let seg = segments(&c.body);
    let nkeys: usize = seg[2].parse().unwrap();
    assert_eq!(nkeys % 9, 0);
    // The first key of each entry is its tenant's counter `tg:q:{<tenant>}:<month>`.
    seg[3..3 + nkeys]
        .chunks(9)
        .map(|k| {
            let t = &k[0];
            t[t.find('{').unwrap() + 1..t.find('}').unwrap()].to_string()
        })
        .collect()
}

/// One request in flight alone, then `n` tenants queued behind it; its answer wakes the root, which
/// sends the queue as one call.
fn queued_behind_one(e: &FakeEnvoy, n: usize) -> (Call, Vec<Call>) {
    let mut first = send(e, "first");
    assert!(
        first.pending.is_some(),
        "nothing in flight: sent at once, alone"
    );
    let waiting: Vec<Call> = (0..n).map(|i| send(e, &format!("t{i}"))).collect();
    for c in &waiting {
        clean(c);
        assert!(
            c.pending.is_none(),
            "waits in the batch, no callout of its own"
        );
        assert!(!c.forwarded && c.reply.is_none());
        assert!(c.req.waits_on_root());
    }
    assert_eq!(e.wakes.get(), 0, "the call in flight brings the next batch");
    e.reply(&mut first, 200, &reserved(10, 100000));
    assert!(first.forwarded);
    assert_eq!(e.wakes.get(), 1, "its answer wakes the root");
    assert!(e.root_callouts.borrow().is_empty());
    e.wake(0);
    (first, waiting)
}

#[test]
fn reservations_that_wait_together_go_in_one_call_and_each_request_gets_its_own_answer() {
    let e = envoy(cfg("closed", json!({})));
    let (_, mut w) = queued_behind_one(&e, 4);
    assert_eq!(batch_tenants(&e), ["t0", "t1", "t2", "t3"]);
    assert_eq!(e.metric(Metric::QuotaBatched), 4);
    assert_eq!(e.metric(Metric::QuotaBatchCalls), 1);
    let call = e
        .reply_root(
            0,
            200,
            &batch_reply(&[ok(10), over(), refused_code(1), ok(20)]),
        )
        .unwrap();
    assert!(call.body.starts_with("EVAL/"), "first batch: EVAL");
    let mut refs: Vec<&mut Call> = w.iter_mut().collect();
    assert_eq!(e.continue_ready(0, &mut refs), 4);
    for c in &w {
        clean(c);
    }
    assert!(w[0].forwarded && w[3].forwarded);
    assert_eq!(w[1].status(), Some(429));
    assert_eq!(w[1].reply_json()["error"]["code"], "insufficient_quota");
    // A duplicate request id proves Redis reserved it: the shim's failure policy (closed), and the
    // reservation is reconciled at the end.
    assert_eq!(w[2].status(), Some(503));
    // Settled one by one, each with its own reservation.
    for i in [0, 3] {
        let c = &mut w[i];
        e.respond(
            c,
            200,
            &[("content-type", "application/json")],
            &[r#"{"usage":{"prompt_tokens":3,"completion_tokens":2}}"#],
        );
    }
    e.end(&mut w[2]);
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    let settle: Vec<String> = e
        .root_callouts
        .borrow()
        .iter()
        .filter(|c| matches!(c.purpose, Purpose::Settle(_)))
        .flat_map(|c| segments(&c.body))
        .collect();
    for (tenant, mode) in [("t0", "s"), ("t3", "s"), ("t2", "c")] {
        assert!(
            settle
                .iter()
                .any(|s| s == &format!("tg:q:{{{tenant}}}:open")),
            "{tenant}: {settle:?}"
        );
        let _ = mode;
    }
    assert!(
        !settle.iter().any(|s| s == "tg:q:{t1}:open"),
        "refused: nothing to settle"
    );
    // The duplicate met the shim's failure policy.
    assert_eq!(e.metric(Metric::QuotaShimErrors), 1);
}

#[test]
fn a_failed_batch_gives_every_waiting_request_its_on_failure_and_counts_one_failure() {
    for (policy, status) in [("closed", Some(503)), ("open", None)] {
        let e = envoy(cfg(policy, json!({})));
        let (_, mut w) = queued_behind_one(&e, 5);
        // Webdis killed mid-batch: Envoy answers the callout 503.
        e.reply_root(0, 503, "").unwrap();
        let mut refs: Vec<&mut Call> = w.iter_mut().collect();
        assert_eq!(e.continue_ready(0, &mut refs), 5);
        for c in &w {
            clean(c);
            assert_eq!(c.status(), status, "{policy}");
            assert_eq!(c.forwarded, policy == "open");
        }
        // Each request met the failure (counted per request, as without batching).
        assert_eq!(e.metric(Metric::QuotaShimErrors), 5);
        // The breaker (3 failures) counted one: the next request still gets its callout.
        let c = send(&e, "next");
        assert!(c.pending.is_some(), "{policy}: breaker still closed");
        if policy == "open" {
            assert_eq!(e.metric(Metric::QuotaFailOpen), 5);
        }
    }
}

#[test]
fn a_timed_out_batch_reconciles_every_request_whatever_redis_did() {
    let e = envoy(cfg("open", json!({})));
    let (_, mut w) = queued_behind_one(&e, 3);
    e.reply_root(0, 504, "").unwrap();
    let mut refs: Vec<&mut Call> = w.iter_mut().collect();
    e.continue_ready(0, &mut refs);
    for c in w.iter_mut() {
        assert!(c.forwarded);
        assert_eq!(c.audit_field("decision"), None);
        e.respond(
            c,
            200,
            &[("content-type", "application/json")],
            &[r#"{"usage":{"prompt_tokens":3,"completion_tokens":2}}"#],
        );
    }
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    // Each is charged what it cost (mode c: whatever the lost reservation did, once).
    let modes: Vec<String> = e
        .root_callouts
        .borrow()
        .iter()
        .filter(|c| matches!(c.purpose, Purpose::Settle(_)))
        .flat_map(|c| {
            let seg = segments(&c.body);
            let nkeys: usize = seg[2].parse().unwrap();
            seg[3 + nkeys + 2..]
                .chunks(7)
                .map(|a| format!("{}:{}:{}/{}", a[0], a[2], a[5], a[6]))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(modes.len(), 3, "{modes:?}");
    assert!(modes.iter().all(|m| m.starts_with("c:")), "{modes:?}");
    // A charge carries the provider's input/output tokens like a settlement.
    assert!(modes.iter().all(|m| m.ends_with(":3/2")), "{modes:?}");
}

#[test]
fn a_client_that_leaves_while_queued_is_never_sent_and_one_that_leaves_in_flight_is_reconciled_at_zero(
) {
    let e = envoy(cfg("closed", json!({})));
    let mut first = send(&e, "first");
    let mut gone_early = send(&e, "early");
    let mut gone_late = send(&e, "late");
    let mut stays = send(&e, "stays");
    // Leaves while waiting in the queue: taken out, nothing to give back.
    e.end(&mut gone_early);
    assert_eq!(e.workers[0].borrow().batch.queued(), 2);
    e.reply(&mut first, 200, &reserved(10, 100000));
    e.wake(0);
    assert_eq!(batch_tenants(&e), ["late", "stays"]);
    // Leaves while the batch is in flight: its answer is dropped, it is reconciled at 0.
    e.end(&mut gone_late);
    e.reply_root(0, 200, &batch_reply(&[ok(10), ok(10)]))
        .unwrap();
    let mut refs: Vec<&mut Call> = vec![&mut stays];
    assert_eq!(e.continue_ready(0, &mut refs), 1, "only the one still here");
    assert!(stays.forwarded);
    assert!(
        e.workers[0].borrow().batch.results.is_empty(),
        "nothing kept"
    );
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    let settle: Vec<Vec<String>> = e
        .root_callouts
        .borrow()
        .iter()
        .filter(|c| matches!(c.purpose, Purpose::Settle(_)))
        .map(|c| segments(&c.body))
        .collect();
    assert_eq!(
        settle.len(),
        1,
        "only the one that left in flight: {settle:?}"
    );
    let seg = &settle[0];
    assert!(seg.iter().any(|s| s == "tg:q:{late}:open"));
    let nkeys: usize = seg[2].parse().unwrap();
    assert_eq!(
        &seg[3 + nkeys + 2..3 + nkeys + 5],
        ["c", seg[3 + nkeys + 3].as_str(), "0"]
    );
}

#[test]
fn noscript_sends_the_same_batch_again_as_eval_then_evalsha_is_used() {
    let e = envoy(cfg("closed", json!({})));
    let (_, mut w) = queued_behind_one(&e, 2);
    let c = e
        .reply_root(0, 200, &batch_reply(&[ok(10), ok(10)]))
        .unwrap();
    assert!(c.body.starts_with("EVAL/"));
    let mut refs: Vec<&mut Call> = w.iter_mut().collect();
    e.continue_ready(0, &mut refs);
    // The next batch: EVALSHA; Redis restarted: NOSCRIPT, sent again as EVAL, once.
    let (_, mut w) = queued_behind_one(&e, 2);
    let c = e
        .reply_root(
            0,
            200,
            r#"{"EVALSHA":[false,"NOSCRIPT No matching script"]}"#,
        )
        .unwrap();
    assert!(c.body.starts_with("EVALSHA/"));
    assert_eq!(batch_tenants(&e), ["t0", "t1"]);
    let c = e
        .reply_root(0, 200, &batch_reply(&[ok(10), ok(10)]))
        .unwrap();
    assert!(c.body.starts_with("EVAL/"));
    let mut refs: Vec<&mut Call> = w.iter_mut().collect();
    assert_eq!(e.continue_ready(0, &mut refs), 2);
    assert!(w.iter().all(|c| c.forwarded));
    assert_eq!(e.metric(Metric::QuotaShimErrors), 0);
}

#[test]
fn behind_a_redis_cluster_a_crossslot_batch_is_sent_again_per_tenant_and_stays_per_tenant() {
    let e = envoy(cfg("closed", json!({})));
    let (_, mut w) = queued_behind_one(&e, 3);
    e.reply_root(
        0,
        200,
        r#"{"EVAL":[false,"CROSSSLOT Keys in request don't hash to the same slot"]}"#,
    )
    .unwrap();
    assert!(e.logged("batched per tenant from now on"));
    // Nothing ran: each tenant's reservation in a call of its own, at once.
    let calls: Vec<_> = e.root_callouts.borrow().clone();
    assert_eq!(calls.len(), 3);
    for _ in 0..3 {
        e.reply_root(0, 200, &batch_reply(&[ok(10)])).unwrap();
    }
    let mut refs: Vec<&mut Call> = w.iter_mut().collect();
    assert_eq!(e.continue_ready(0, &mut refs), 3);
    assert!(w.iter().all(|c| c.forwarded));
    assert_eq!(e.metric(Metric::QuotaShimErrors), 0, "not a shim failure");
}

#[test]
fn a_full_batch_goes_at_once_in_a_second_call() {
    let e = envoy(cfg("closed", json!({"max_reservations": 2})));
    let _first = send(&e, "first");
    let _a = send(&e, "a");
    assert_eq!(e.wakes.get(), 0);
    let _b = send(&e, "b");
    assert_eq!(e.wakes.get(), 1, "full: the root is woken");
    e.wake(0);
    assert_eq!(batch_tenants(&e), ["a", "b"]);
}

#[test]
fn a_reservation_that_waited_max_wait_ms_goes_at_the_tick_while_the_call_in_flight_hangs() {
    let e = envoy(cfg("closed", json!({"max_wait_ms": 5})));
    let _first = send(&e, "first");
    let _a = send(&e, "a");
    e.tick(0);
    assert!(e.root_callouts.borrow().is_empty(), "not yet");
    e.advance_ms(5);
    e.tick(0);
    assert_eq!(batch_tenants(&e), ["a"]);
}

#[test]
fn while_the_shim_breaker_is_open_nothing_waits_each_request_gets_its_on_failure_at_once() {
    let e = envoy(cfg("closed", json!({})));
    for _ in 0..3 {
        let mut c = send(&e, "x");
        e.dead_shim(&mut c);
    }
    let _first_pending = e.workers[0].borrow().batch.queued();
    let c = send(&e, "y");
    assert_eq!(c.status(), Some(503));
    assert!(!c.req.waits_on_root());
}

#[test]
fn batch_false_sends_every_reservation_as_its_own_callout() {
    let e = envoy(cfg("closed", json!(false)));
    let a = send(&e, "a");
    let b = send(&e, "b");
    assert!(a.pending.is_some() && b.pending.is_some());
    assert_eq!(e.metric(Metric::QuotaBatched), 0);
}

#[test]
fn a_budget_after_a_batched_token_quota_is_reserved_too_and_the_request_goes_on() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "rules": [rule(1000.0, 1e6)],
        "quota": {"cluster": "webdis", "monthly_limit": 100000,
                  "currency": "USD", "budgets": [{"name": "spend", "monthly_limit": 1000000}],
                  "prices": {"m": {"input": 1.0, "output": 1.0}}}}),
    );
    let mut first = send(&e, "first");
    let mut c = send(&e, "t");
    assert!(c.req.waits_on_root());
    e.reply(&mut first, 200, &reserved(10, 100000));
    // `first` goes on to its budget: nothing else in flight, sent alone; `c` still waits behind it.
    assert!(first.pending.is_some());
    e.wake(0);
    assert!(e.root_callouts.borrow().is_empty(), "a call is in flight");
    e.reply(&mut first, 200, &reserved(10, 1000000));
    assert!(first.forwarded);
    e.wake(0);
    assert_eq!(batch_tenants(&e), ["t"]);
    e.reply_root(0, 200, &batch_reply(&[ok(10)])).unwrap();
    let mut refs: Vec<&mut Call> = vec![&mut c];
    assert_eq!(e.continue_ready(0, &mut refs), 1);
    // Its budget: nothing in flight any more, sent alone from its continuation.
    assert!(c.pending.is_some(), "budget sent");
    e.reply(&mut c, 200, &reserved(10, 1000000));
    clean(&c);
    assert!(c.forwarded);
}
