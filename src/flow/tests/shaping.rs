//! Shaping, refunds and two workers on one shared store.

use super::*;
use crate::flow::Metric;

#[test]
fn a_request_short_of_tokens_within_max_wait_is_held_then_released_by_the_tick() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [
        {"name": "s", "tokens_per_second": 100, "burst": 100, "max_wait_ms": 1000}]}),
    );
    assert!(
        e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 80))
            .forwarded
    );
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 30));
    clean(&c);
    assert!(c.held && !c.forwarded, "held, not refused");
    assert_eq!(e.metric(Metric::RequestsShaped), 1);
    e.tick(0);
    e.release(&mut c);
    assert!(!c.forwarded, "not due yet");
    e.advance_ms(1000);
    e.tick(0);
    e.release(&mut c);
    assert!(c.forwarded);
    e.respond(&mut c, 200, &[], &["{}"]);
    let ms: u64 = c.header("x-tokengate-shaped-ms").unwrap().parse().unwrap();
    assert!(ms > 0 && ms <= 1000);
    assert_eq!(c.audit_field("decision").as_deref(), Some("shaped"));
}

#[test]
fn refund_unused_gives_back_what_the_usage_shows_was_not_used_and_takes_what_was_over() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [
        {"name": "r", "tokens_per_second": 0.001, "burst": 1000, "refund_unused": true}]}),
    );
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 500));
    let cost = {
        e.respond(
            &mut c,
            200,
            &[("content-type", "application/json")],
            &[r#"{"usage":{"prompt_tokens":5,"completion_tokens":15}}"#],
        );
        estimated(&c)
    };
    assert_eq!(e.metric(Metric::TokensCredited), cost - 20);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    let cost = estimated(&{
        e.respond(
            &mut c,
            200,
            &[("content-type", "application/json")],
            &[r#"{"usage":{"prompt_tokens":50,"completion_tokens":50}}"#],
        );
        c
    });
    assert_eq!(e.metric(Metric::TokensDebited), 100 - cost);
}

#[test]
fn two_workers_share_one_bucket_exactly() {
    let e = FakeEnvoy::new(
        &json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(0.001, 1000.0)]}).to_string(),
        2,
    );
    let mut admitted = 0u64;
    for i in 0..40 {
        let c = e.send_on(
            i % 2,
            "/v1/chat/completions",
            &[TENANT],
            &chat("m", "hi", 90),
        );
        if c.forwarded {
            admitted += c.audit_field("estimated").unwrap().parse::<u64>().unwrap();
        }
    }
    assert!(
        admitted <= 1000 && admitted > 800,
        "admitted {admitted} of a 1000 burst"
    );
}
