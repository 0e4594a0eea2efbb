//! Circuit breakers: fallbacks through Envoy routing and body rewrites, half-open probes, outcomes.

use super::*;
use crate::flow::Metric;

fn cfg(breaker: Value) -> Value {
    json!({"tenant_header": "x-tenant-id", "rules": [rule(1000.0, 1e6)], "breaker": breaker})
}

/// Five upstream 500s through `e` open the breakers the requests went through.
fn fail_five(e: &FakeEnvoy, model: &str) {
    for _ in 0..5 {
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat(model, "hi", 5));
        assert!(c.forwarded);
        e.respond(&mut c, 500, &[], &["{}"]);
    }
}

#[test]
fn an_open_cluster_breaker_routes_to_the_fallback_cluster_in_the_headers_phase() {
    let e = envoy(cfg(json!({"keys": ["cluster"],
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
        json!({"keys": ["model"], "model_fallbacks": {"gpt-4.1": "deepseek"}}),
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
    let e = envoy(cfg(json!({"keys": ["model"]})));
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
        json!({"keys": ["model"], "recovery_ms": 1000, "half_open_max_calls": 1}),
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
        json!({"tenant_header": "x-tenant-id", "rules": [rule(1000.0, 1e6)],
        "breaker": {"keys": ["model"], "recovery_ms": 1000, "half_open_max_calls": 1},
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
