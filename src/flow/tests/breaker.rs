//! Circuit breakers: fallbacks through Envoy routing and body rewrites, half-open probes, outcomes.

use super::*;
use crate::breaker;
use crate::flow::Metric;
use crate::store::SharedStore;

fn cfg(breaker: Value) -> Value {
    json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1000.0, 1e6)], "breaker": breaker})
}

/// Five upstream 500s through `e` open the breakers the requests went through (in the count mode,
/// `"failure_threshold": 5`).
fn fail_five(e: &FakeEnvoy, model: &str) {
    for _ in 0..5 {
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat(model, "hi", 5));
        assert!(c.forwarded);
        e.respond(&mut c, 500, &[], &["{}"]);
    }
}

#[test]
fn an_open_cluster_breaker_routes_to_the_fallback_cluster_in_the_headers_phase() {
    let e = envoy(cfg(json!({"keys": ["cluster"], "failure_threshold": 5,
        "cluster_fallbacks": {"provider": {"cluster": "provider_fallback", "route": "fallback"}}})));
    fail_five(&e, "m");
    assert!(e.logged("breaker tg:cb:cluster=provider: closed -> open"));
    assert_eq!(
        e.gauges
            .borrow()
            .get("tokengate_breaker_state.cluster=provider"),
        Some(&1)
    );
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5));
    clean(&c);
    assert!(c.forwarded);
    assert!(c
        .headers
        .iter()
        .any(|(k, v)| k == "x-tokengate-route" && v == "fallback"));
    e.respond(&mut c, 200, &[], &["{}"]);
    assert_eq!(
        c.header("x-tokengate-fallback"),
        Some("provider -> provider_fallback")
    );
}

#[test]
fn an_open_model_breaker_rewrites_the_model_and_charges_the_fallback() {
    let e = envoy(cfg(
        json!({"keys": ["model"], "failure_threshold": 5, "model_fallbacks": {"gpt-4.1": "deepseek"}}),
    ));
    fail_five(&e, "gpt-4.1");
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("gpt-4.1", "hi", 5));
    clean(&c);
    assert!(c.forwarded);
    let sent: Value = serde_json::from_slice(&c.body).unwrap();
    assert_eq!(sent["model"], "deepseek");
    assert!(!c.headers.iter().any(|(k, _)| k == "content-length"));
    e.respond(&mut c, 200, &[], &["{}"]);
    assert_eq!(
        c.header("x-tokengate-fallback"),
        Some("gpt-4.1 -> deepseek")
    );
    assert_eq!(c.audit_field("model").as_deref(), Some("deepseek"));
}

#[test]
fn an_open_breaker_without_a_fallback_answers_503_circuit_open() {
    let e = envoy(cfg(json!({"keys": ["model"], "failure_threshold": 5})));
    fail_five(&e, "m");
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5));
    clean(&c);
    assert_eq!(c.status(), Some(503));
    assert_eq!(c.reply_json()["error"]["code"], "circuit_open");
    assert!(c.reply_header("retry-after").is_some());
    assert_eq!(e.metric(Metric::BreakerShortCircuited), 1);
    // Other models are not affected.
    assert!(
        e.send("/v1/chat/completions", &[TENANT], &chat("other", "hi", 5))
            .forwarded
    );
}

#[test]
fn half_open_admits_exactly_the_probes_and_a_probe_success_closes_it() {
    let e = envoy(cfg(
        json!({"keys": ["model"], "failure_threshold": 5, "recovery_ms": 1000, "half_open_max_calls": 1}),
    ));
    fail_five(&e, "m");
    e.advance_ms(1001);
    let mut probe = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5));
    assert!(probe.forwarded);
    assert_eq!(e.metric(Metric::BreakerProbes), 1);
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5));
    assert_eq!(c.status(), Some(503), "every probe is in flight");
    assert_eq!(c.reply_header("retry-after"), Some("1"));
    e.respond(&mut probe, 200, &[], &["{}"]);
    assert!(e.logged("half_open -> closed"), "{:?}", e.logs.borrow());
    assert!(
        e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5))
            .forwarded
    );
}

#[test]
fn a_probe_permit_is_given_back_when_a_later_step_refuses_the_request() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1000.0, 1e6)],
        "breaker": {"keys": ["model"], "failure_threshold": 5, "recovery_ms": 1000,
                    "half_open_max_calls": 1},
        "quota": {"cluster": "webdis", "monthly_limit": 100000}}),
    );
    for _ in 0..5 {
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5));
        e.reply(&mut c, 200, &reserved(1, 100000));
        e.respond(&mut c, 500, &[], &["{}"]);
    }
    e.advance_ms(1001);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5));
    // Refused by a tenant × model limit (a tenant limit would also mark the tenant exhausted).
    e.reply(&mut c, 200, &eval(&[0, 10, 100000, 100, 100, 0, 0, 2]));
    assert_eq!(c.status(), Some(429));
    // The permit came back: the next request may probe.
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5));
    assert!(
        c.pending.is_some() || c.forwarded,
        "not refused by the breaker"
    );
}

#[test]
fn a_client_abort_does_not_count_as_a_failure_but_an_upstream_reset_does() {
    let e = envoy(cfg(json!({"keys": ["model"], "failure_threshold": 1})));
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5));
    e.end(&mut c); // client gone before any response: status 0, no details
    assert!(
        e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5))
            .forwarded
    );
    let mut e = envoy(cfg(json!({"keys": ["model"], "failure_threshold": 1})));
    e.props
        .insert("response.code".into(), 503u64.to_le_bytes().to_vec());
    e.props.insert(
        "response.code_details".into(),
        b"upstream_reset_before_response_started{connection_termination}".to_vec(),
    );
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5));
    e.end(&mut c);
    assert_eq!(
        e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5))
            .status(),
        Some(503)
    );
}

/// The stored record of breaker `key(scope, name)`, if any.
fn stored(e: &FakeEnvoy, scope: &str, name: &str) -> Option<breaker::BreakerState> {
    crate::store::peek::<breaker::BreakerState>(&e.store, &breaker::key(scope, name))
        .unwrap()
        .0
}

/// One request for `model` on worker `w`, answered `status` by the upstream.
fn one(e: &FakeEnvoy, w: usize, model: &str, status: u32) {
    let mut c = e.send_on(w, "/v1/chat/completions", &[TENANT], &chat(model, "hi", 5));
    assert!(c.forwarded, "{:?}", c.reply_json());
    e.respond(&mut c, status, &[], &["{}"]);
}

#[test]
fn requests_through_closed_breakers_read_only_the_set_of_open_breakers_and_create_no_key() {
    let buckets = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1000.0, 1e6)]}),
    );
    let with = envoy(cfg(
        json!({"keys": ["cluster", "model"], "failure_threshold": 5}),
    ));
    for e in [&buckets, &with] {
        one(e, 0, "m", 200);
    }
    let (b0, w0) = (buckets.store.reads(), with.store.reads());
    for _ in 0..10 {
        one(&buckets, 0, "m", 200);
        one(&with, 0, "m", 200);
    }
    let per_request = ((with.store.reads() - w0) - (buckets.store.reads() - b0)) as f64 / 10.0;
    assert_eq!(
        per_request, 1.0,
        "one read of the set per request (the body phase reuses the headers phase's), nothing else"
    );
    // A body that takes longer than the reuse window to arrive: the set is read again for the model.
    for e in [&buckets, &with] {
        e.upload_ms
            .set(crate::flow::vm::breakers::OPEN_SET_REUSE_MS);
    }
    let (b0, w0) = (buckets.store.reads(), with.store.reads());
    for _ in 0..10 {
        one(&buckets, 0, "m", 200);
        one(&with, 0, "m", 200);
    }
    let per_request = ((with.store.reads() - w0) - (buckets.store.reads() - b0)) as f64 / 10.0;
    assert_eq!(
        per_request, 2.0,
        "a slow upload: one read of the set per phase"
    );
    assert!(stored(&with, "model", "m").is_none());
    assert!(stored(&with, "cluster", "provider").is_none());
    assert!(
        with.store.get(breaker::OPEN_SET_KEY).unwrap().is_none(),
        "no breaker was ever open"
    );
}

#[test]
fn the_cluster_breaker_is_named_only_when_an_outcome_is_recorded() {
    // Without the cluster name at hand (as if the property could not be read), closed breakers
    // admit as usual: the name is needed only for a failure, at the end.
    let mut e = envoy(cfg(json!({"keys": ["cluster"], "failure_threshold": 1})));
    e.props.remove("xds.cluster_name");
    one(&e, 0, "m", 200);
    one(&e, 0, "m", 500);
    assert_eq!(
        e.metric(Metric::BreakerOpened),
        0,
        "no name, nothing to record"
    );
    e.props
        .insert("xds.cluster_name".into(), b"provider".to_vec());
    one(&e, 0, "m", 500);
    assert!(e.logged("breaker tg:cb:cluster=provider: closed -> open"));
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5));
    assert_eq!(c.status(), Some(503));
}

#[test]
fn a_breaker_opened_on_one_worker_refuses_the_next_request_on_the_other() {
    let e = FakeEnvoy::new(
        &cfg(json!({"keys": ["model"], "failure_threshold": 3})).to_string(),
        2,
    );
    one(&e, 1, "m", 200);
    for _ in 0..3 {
        one(&e, 0, "m", 500);
    }
    let c = e.send_on(1, "/v1/chat/completions", &[TENANT], &chat("m", "hi", 5));
    assert_eq!(c.status(), Some(503), "worker 1 sees it at once");
    // Closing it again (probe success on worker 0) is seen by worker 1 at once too.
    e.advance_ms(30_001);
    one(&e, 0, "m", 200);
    assert!(e.logged("half_open -> closed"));
    one(&e, 1, "m", 200);
    assert!(e
        .store
        .get(breaker::OPEN_SET_KEY)
        .unwrap()
        .unwrap()
        .0
        .is_empty());
}

fn rate_cfg() -> Value {
    cfg(json!({"keys": ["model"], "failure_rate_percent": 50, "min_requests": 4}))
}

/// Writes `successes` plain successes and `failures` failures into the window of model `m`'s breaker, as
/// earlier traffic would have (an old window: workers gather their successes in batches on it).
fn earlier_traffic(e: &FakeEnvoy, successes: u32, failures: u32) {
    let cfg = &e.cfg.breaker.as_ref().unwrap().cfg;
    let key = breaker::key("model", "m");
    breaker::record_batch_shared(&e.store, &key, cfg, successes, None, e.now.get(), 8).unwrap();
    for _ in 0..failures {
        let fail = (
            breaker::Outcome::Failure {
                retry_after_ms: None,
            },
            false,
        );
        let (w, _) =
            breaker::record_batch_shared(&e.store, &key, cfg, 0, Some(fail), e.now.get(), 8)
                .unwrap();
        assert_eq!(w.transition, None, "the earlier traffic leaves it closed");
    }
}

fn counts(e: &FakeEnvoy) -> (u64, u64) {
    let rate = &e.cfg.breaker.as_ref().unwrap().cfg;
    stored(e, "model", "m").map_or((0, 0), |s| s.window_counts(rate, e.now.get()))
}

#[test]
fn while_the_window_is_young_every_success_is_written_at_once() {
    let e = envoy(rate_cfg());
    for n in 1..=3 {
        one(&e, 0, "m", 200);
        assert_eq!(counts(&e), (n, 0));
    }
    one(&e, 0, "m", 500);
    assert_eq!(counts(&e), (3, 1));
    // 3 of 6 = 50 %: the second and third failures open it, not the first two alone.
    one(&e, 0, "m", 500);
    assert_eq!(e.metric(Metric::BreakerOpened), 0);
    one(&e, 0, "m", 500);
    assert!(e.logged("closed -> open (failure_rate)"));
}

#[test]
fn on_an_old_window_successes_are_gathered_and_written_with_the_next_failure_of_their_worker() {
    let e = envoy(rate_cfg());
    earlier_traffic(&e, 640, 0);
    // The worker's first success is written at once and tells it the window's size (641): from then
    // on it gathers up to 641 / 64 = 10.
    one(&e, 0, "m", 200);
    assert_eq!(counts(&e), (641, 0));
    for _ in 0..3 {
        one(&e, 0, "m", 200);
    }
    assert_eq!(counts(&e), (641, 0), "gathered, not written");
    one(&e, 0, "m", 500);
    assert_eq!(counts(&e), (644, 1));
    // A full batch is written without waiting for anything else.
    for _ in 0..9 {
        one(&e, 0, "m", 200);
    }
    assert_eq!(counts(&e), (644, 1));
    one(&e, 0, "m", 200);
    assert_eq!(counts(&e), (654, 1));
    // After a pause longer than the flush interval the window may have emptied: the next success is
    // written at once, and tells the worker the size again.
    e.advance_ms(crate::breaker::failover::SUCCESS_FLUSH_MS + 1);
    one(&e, 0, "m", 200);
    assert_eq!(counts(&e), (655, 1));
    one(&e, 0, "m", 200);
    assert_eq!(counts(&e), (655, 1));
}

#[test]
fn gathered_successes_are_written_after_the_flush_interval_or_by_the_tick() {
    let e = FakeEnvoy::new(&rate_cfg().to_string(), 2);
    earlier_traffic(&e, 640, 0);
    one(&e, 0, "m", 200);
    one(&e, 1, "m", 200);
    assert_eq!(
        counts(&e),
        (642, 0),
        "each worker's first success is written at once"
    );
    one(&e, 0, "m", 200);
    e.advance_ms(crate::breaker::failover::SUCCESS_FLUSH_MS - 1);
    one(&e, 0, "m", 200);
    assert_eq!(counts(&e), (642, 0));
    e.advance_ms(1);
    // The first one waited SUCCESS_FLUSH_MS: the next request's end writes all three.
    one(&e, 0, "m", 200);
    assert_eq!(counts(&e), (645, 0));
    // An idle worker writes at its tick.
    one(&e, 1, "m", 200);
    assert_eq!(counts(&e), (645, 0));
    e.tick(1);
    assert_eq!(counts(&e), (646, 0));
}

#[test]
fn a_burst_spread_over_workers_is_counted_exactly_while_the_window_is_young() {
    // Worker 0 served 6 successes, then worker 1 has 4 failures: 4 of 10 is below 50 %. (Before the
    // window-sized batches, worker 0 still held the 6 and worker 1 read 4 of 4: it opened.)
    let e = FakeEnvoy::new(&rate_cfg().to_string(), 2);
    for _ in 0..6 {
        one(&e, 0, "m", 200);
    }
    for _ in 0..4 {
        one(&e, 1, "m", 500);
    }
    assert_eq!(counts(&e), (6, 4));
    assert_eq!(e.metric(Metric::BreakerOpened), 0, "4 of 10 is below 50 %");
}

#[test]
fn on_an_old_window_another_workers_failures_lack_less_than_a_64th_of_it() {
    // 330 successes and 310 failures (48 %). Worker 0 learns the window (641 after its first success)
    // and gathers 9 more. Worker 1's failures read the rate without those 9 (fewer than 641 / 64): it
    // opens at 331 + 331 failures, 21 more, where the exact count (340 successes) would take 30.
    let e = FakeEnvoy::new(&rate_cfg().to_string(), 2);
    earlier_traffic(&e, 330, 310);
    for _ in 0..10 {
        one(&e, 0, "m", 200);
    }
    assert_eq!(counts(&e), (331, 310));
    let mut failures = 0;
    while e.metric(Metric::BreakerOpened) == 0 && failures < 40 {
        one(&e, 1, "m", 500);
        failures += 1;
    }
    assert_eq!(failures, 21);
}
