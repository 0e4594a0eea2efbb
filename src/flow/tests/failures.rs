//! Failure modes of the shims (quota, global buckets) under each policy, and what the logs say.

use super::*;
use crate::flow::Metric;

fn quota_cfg(on_failure: &str) -> Value {
    json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1000.0, 1e6)],
        "quota": {"cluster": "webdis", "monthly_limit": 100000, "on_failure": on_failure, "lease": false}})
}

fn global_cfg(on_failure: &str) -> Value {
    json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "rules": [{"name": "g", "tokens_per_second": 1, "burst": 1000, "global": true}],
        "global_buckets": {"cluster": "webdis", "on_failure": on_failure}})
}

/// How a shim fails, as the flow sees it.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// No healthy host: Envoy's synthetic 503.
    Down,
    /// Timeout: Envoy's synthetic 504 (Redis may have run the script).
    Slow,
    /// A 200 with a body that is not a script answer.
    Garbage,
    /// An error a proxy between Webdis and Redis made up (Envoy's redis_proxy after its op_timeout,
    /// while Redis still runs the command).
    ProxyError,
    /// The script's own refusal of a request id it already holds: the command reached Redis twice (a
    /// shim that sent it again after Redis stalled) and this answer is the second one's, so the
    /// reservation exists. Seen in the fault matrix (Redis paused): a reservation left open.
    Duplicate,
}

fn fail(e: &FakeEnvoy, c: &mut Call, f: Fault) {
    match f {
        Fault::Down => e.dead_shim(c),
        Fault::Slow => e.time_out(c),
        Fault::Garbage => e.reply(c, 200, "<html>proxy error</html>"),
        Fault::ProxyError => e.reply(c, 200, r#"{"EVALSHA":[false,"ERR upstream failure"]}"#),
        Fault::Duplicate => e.reply(
            c,
            200,
            r#"{"EVALSHA":[false,"ERR tokengate: request already reserved or reconciled"]}"#,
        ),
    }
}

#[test]
fn a_failing_quota_shim_under_on_failure_closed_answers_503_and_gives_the_bucket_back() {
    for fault in [
        Fault::Down,
        Fault::Slow,
        Fault::Garbage,
        Fault::ProxyError,
        Fault::Duplicate,
    ] {
        let e = envoy(quota_cfg("closed"));
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
        fail(&e, &mut c, fault);
        clean(&c);
        assert_eq!(c.status(), Some(503), "{fault:?}");
        assert_eq!(c.reply_json()["error"]["code"], "quota_unavailable");
        assert!(
            e.metric(Metric::TokensCredited) > 0,
            "bucket charge given back ({fault:?})"
        );
        assert_eq!(e.metric(Metric::QuotaFailClosed), 1);
        assert!(
            e.logged("cluster 'webdis'") || e.logged("webdis"),
            "{fault:?}: {:?}",
            e.logs.borrow()
        );
        e.end(&mut c);
        e.tick(0);
        // The script may have run (a 503 from Webdis and Envoy's own 503 look alike): a
        // reconciliation (actual 0) undoes whatever it did.
        assert_eq!(e.root_callouts.borrow().len(), 1, "{fault:?}");
    }
}

#[test]
fn a_failing_quota_shim_under_on_failure_open_admits_and_counts_it() {
    for fault in [Fault::Down, Fault::Slow, Fault::Garbage] {
        let e = envoy(quota_cfg("open"));
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
        fail(&e, &mut c, fault);
        clean(&c);
        assert!(c.forwarded, "{fault:?}");
        assert_eq!(e.metric(Metric::QuotaFailOpen), 1);
        e.respond(
            &mut c,
            200,
            &[("content-type", "application/json")],
            &[r#"{"usage":{"prompt_tokens":3,"completion_tokens":4}}"#],
        );
        assert_eq!(
            c.audit_field("decision").as_deref(),
            Some("admit_quota_fail_open")
        );
    }
}

#[test]
fn an_unknown_shim_cluster_is_refused_at_dispatch_and_the_log_names_it() {
    let mut cfg = quota_cfg("closed");
    cfg["quota"]["cluster"] = json!("outbound|7379||webdis.tokengate.svc.cluster.local");
    let mut e = FakeEnvoy::new(&cfg.to_string(), 1);
    e.clusters.retain(|c| c == "provider");
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    clean(&c);
    assert_eq!(c.status(), Some(503));
    assert!(
        e.logged("outbound|7379||webdis.tokengate.svc.cluster.local"),
        "{:?}",
        e.logs.borrow()
    );
}

#[test]
fn the_shim_breaker_opens_after_three_failures_and_then_no_callout_is_made() {
    let e = envoy(quota_cfg("closed"));
    for _ in 0..3 {
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
        e.dead_shim(&mut c);
    }
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    assert_eq!(c.status(), Some(503));
    assert!(
        c.pending.is_none(),
        "no callout while the shim's breaker is open"
    );
    assert!(e.logged("webdis shim webdis: closed -> open"));
}

/// A Redis Cluster failover: the shim breaker opens on the dead master's errors, its probe after
/// `recovery_ms` can still fail (the proxy routes the slot to the promoted replica only later), and
/// then the next probe comes after `recovery_ms` again (5 s by default), not after a doubled wait: a
/// tenant is refused for at most one recovery window once Redis answers again.
#[test]
fn after_a_failed_probe_the_shim_breaker_probes_again_after_recovery_ms_not_longer() {
    let e = envoy(quota_cfg("closed"));
    for _ in 0..3 {
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
        e.dead_shim(&mut c);
    }
    for round in 0..3 {
        e.advance_ms(4_999);
        let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
        assert!(c.pending.is_none(), "round {round}: still open at 4.999 s");
        assert_eq!(c.status(), Some(503));
        e.advance_ms(1);
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
        assert!(
            c.pending.is_some(),
            "round {round}: a probe 5 s after the breaker (re)opened: {:?}",
            e.logs.borrow()
        );
        e.dead_shim(&mut c);
        assert_eq!(c.status(), Some(503));
    }
    assert!(e.logged("webdis shim webdis: half_open -> open (probe_failed)"));
}

#[test]
fn failure_logs_are_rate_limited_per_cause() {
    let e = envoy(quota_cfg("open"));
    for _ in 0..50 {
        let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
        // The shim breaker opens after three: the others fail at once, all logged as one cause.
        let mut c = c;
        if c.pending.is_some() {
            e.dead_shim(&mut c);
        }
    }
    let lines = e
        .logs
        .borrow()
        .iter()
        .filter(|(_, l)| l.starts_with("quota check failed"))
        .count();
    assert_eq!(lines, 1, "{:?}", e.logs.borrow());
    assert_eq!(e.metric(Metric::LogsSuppressed), 49);
    e.advance_ms(10_001);
    e.tick(0);
    assert!(e.logged("49 more 'quota_shim' failures"));
}

#[test]
fn a_failing_global_shim_follows_on_failure() {
    for fault in [Fault::Down, Fault::Slow, Fault::Garbage] {
        // local: this Envoy's own bucket is charged instead.
        let e = envoy(global_cfg("local"));
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
        fail(&e, &mut c, fault);
        assert!(c.forwarded, "{fault:?}");
        assert_eq!(e.metric(Metric::GlobalFallbackLocal), 1);
        assert!(!e.store.is_empty(), "a local bucket was written");
        // open: admitted without a bucket.
        let e = envoy(global_cfg("open"));
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
        fail(&e, &mut c, fault);
        assert!(c.forwarded);
        assert_eq!(e.metric(Metric::GlobalFailOpen), 1);
        // closed: 503 rate_limiter_unavailable.
        let e = envoy(global_cfg("closed"));
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
        fail(&e, &mut c, fault);
        clean(&c);
        assert_eq!(c.status(), Some(503));
        assert_eq!(c.reply_json()["error"]["code"], "rate_limiter_unavailable");
    }
}

#[test]
fn a_global_charge_admits_refuses_and_retries_with_eval_after_noscript() {
    let e = envoy(global_cfg("closed"));
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    assert!(
        c.pending.as_ref().unwrap().body.starts_with("EVAL/"),
        "first call loads the script"
    );
    e.reply(&mut c, 200, &eval(&[0, 900_000, 0, 0, 0, 0]));
    assert!(c.forwarded);
    e.respond(&mut c, 200, &[], &["{}"]);
    assert_eq!(c.header("x-ratelimit-remaining-tokens"), Some("900"));
    // Later calls use EVALSHA; NOSCRIPT (Redis restarted) → sent again with EVAL.
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    assert!(c.pending.as_ref().unwrap().body.starts_with("EVALSHA/"));
    e.reply(
        &mut c,
        200,
        r#"{"EVAL":[false,"NOSCRIPT No matching script"]}"#,
    );
    assert!(c.pending.as_ref().unwrap().body.starts_with("EVAL/"));
    // Refused: 429 and the balances are cached: the next request is refused without a callout.
    e.reply(&mut c, 200, &eval(&[2, 0, 0, 5_000_000, 0, 0]));
    assert_eq!(c.status(), Some(429));
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    assert_eq!(c.status(), Some(429));
    assert!(c.pending.is_none());
    assert_eq!(e.metric(Metric::GlobalRejectedCached), 1);
}

#[test]
fn an_upstream_that_answers_before_the_decision_is_accounted_and_never_answered_twice() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1000.0, 1e6)],
        "quota": {"cluster": "webdis", "monthly_limit": 100000, "lease": false}}),
    );
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    assert!(c.pending.is_some() && !c.forwarded);
    // The provider refuses the key without reading the body.
    e.respond_partly(
        &mut c,
        401,
        &[("content-type", "application/json")],
        &[r#"{"error":{}}"#],
        true,
    );
    // The reservation answers afterwards: ignored (no reply, no resume).
    e.reply(&mut c, 200, &reserved(10, 100000));
    e.end(&mut c);
    clean(&c);
    assert!(c.reply.is_none());
    assert_eq!(e.metric(Metric::ResponsesBeforeDecision), 1);
    assert_eq!(
        c.audit_field("decision").as_deref(),
        Some("response_before_decision")
    );
    // Reconciled with what it cost: 0 for a 401.
    e.tick(0);
    let calls = e.root_callouts.borrow();
    assert_eq!(calls.len(), 1);
    let seg = segments(&calls[0].body);
    let nkeys: usize = seg[2].parse().unwrap();
    // A charge ("c", no known reservation) of what it cost: 0 for a 401.
    assert_eq!(&seg[3 + nkeys + 2], "c", "{seg:?}");
    assert_eq!(&seg[3 + nkeys + 4], "0", "{seg:?}");
}

#[test]
fn the_shim_clusters_are_checked_once_at_start_and_a_wrong_name_is_logged() {
    let e = envoy(quota_cfg("closed"));
    e.tick(0);
    assert!(e.logged("webdis shim at cluster 'webdis' answers PING"));
    assert_eq!(e.metric(Metric::ShimClusterUnreachable), 0);
    // A second VM of the same process does not check it again.
    let e = FakeEnvoy::new(&quota_cfg("closed").to_string(), 2);
    e.tick(0);
    e.tick(1);
    let pings = e
        .logs
        .borrow()
        .iter()
        .filter(|(_, l)| l.contains("answers PING"))
        .count();
    assert_eq!(pings, 1);
    // An unknown cluster (the host refuses the callout) and a shim that does not answer.
    let mut cfg = quota_cfg("closed");
    cfg["quota"]["cluster"] = json!("webdis-typo");
    let mut e = FakeEnvoy::new(&cfg.to_string(), 1);
    e.clusters.retain(|c| c == "provider");
    e.tick(0);
    assert!(e.logged("cluster 'webdis-typo'"), "{:?}", e.logs.borrow());
    assert_eq!(e.metric(Metric::ShimClusterUnreachable), 1);
    let e = envoy(quota_cfg("closed"));
    *e.probe_answer.borrow_mut() = (503, String::new());
    e.tick(0);
    assert!(
        e.logged("did not answer PING (HTTP 503"),
        "{:?}",
        e.logs.borrow()
    );
}
