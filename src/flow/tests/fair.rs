//! Fair shares of a limit through the pipeline's fair step, and a cheaper model instead of a 429
//! (`when_exhausted`).

use super::*;
use crate::flow::Metric;

fn tenant(t: &'static str) -> [(&'static str, &'static str); 1] {
    [("x-tenant-id", t)]
}

fn base(limits: Value) -> Value {
    json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
           "models": {"gpt-4.1": {"default_max_tokens": 100}, "gpt-4.1-mini": {"default_max_tokens": 100}},
           "limits": limits})
}

#[test]
fn a_member_over_its_share_is_refused_while_a_quiet_one_is_served() {
    let e = envoy(base(
        json!([{"name": "provider", "scope": "shared", "tokens_per_second": 1000,
        "burst": 2000, "share": "fair"}]),
    ));
    let body = chat("gpt-4.1", "hi", 100);
    // The heavy tenant asks 5,500 tokens/s, the quiet one 275 (less than half of 1,000).
    let mut heavy_refused = 0;
    let mut quiet_refused = 0;
    for i in 0..200 {
        e.advance_ms(20);
        if e.send("/v1/chat/completions", &tenant("heavy"), &body)
            .status()
            == Some(429)
        {
            heavy_refused += 1;
        }
        if i % 20 == 0
            && e.send("/v1/chat/completions", &tenant("quiet"), &body)
                .status()
                == Some(429)
        {
            quiet_refused += 1;
        }
    }
    assert!(heavy_refused > 100, "heavy refused {heavy_refused} of 200");
    assert_eq!(
        quiet_refused, 0,
        "the quiet tenant asks less than its share"
    );
    assert!(e.metric(Metric::FairRefusedOverShare) > 0);
    // Per limit: the refusals by reason, the members active and the share per unit of weight (the
    // heavy tenant is held to what the quiet one leaves of 1,000 tokens/s, plus the bucket's steering).
    let g = e.gauges.borrow();
    assert_eq!(
        g.get("tokengate_fair_refused_over_share.provider").copied(),
        Some(e.metric(Metric::FairRefusedOverShare))
    );
    assert_eq!(
        g.get("tokengate_fair_refused_limit_empty.provider")
            .copied(),
        (e.metric(Metric::FairRefusedLimitEmpty) > 0)
            .then(|| e.metric(Metric::FairRefusedLimitEmpty))
    );
    assert_eq!(
        g.get("tokengate_fair_active_members.provider").copied(),
        Some(2)
    );
    let share = g.get("tokengate_fair_share.provider").copied().unwrap_or(0);
    assert!((500..=1000).contains(&share), "share {share} tokens/s");
}

#[test]
fn a_fair_charge_is_given_back_when_a_later_step_refuses() {
    // A per-tenant limit after the fair one refuses: the fair record gets its tokens back.
    let e = envoy(base(json!([
        {"name": "provider", "scope": "shared", "tokens_per_second": 1, "burst": 300, "share": "fair"},
        {"name": "user", "tokens_per_second": 1, "burst": 150}])));
    let body = chat("gpt-4.1", "hi", 100);
    assert!(
        e.send("/v1/chat/completions", &tenant("a"), &body)
            .forwarded
    );
    // `user` (150) is spent by a: refused by it after the fair charge, which is given back.
    assert_eq!(
        e.send("/v1/chat/completions", &tenant("a"), &body).status(),
        Some(429)
    );
    // Another tenant can use the rest of the fair bucket: 300 - one charge.
    assert!(
        e.send("/v1/chat/completions", &tenant("b"), &body)
            .forwarded
    );
}

#[test]
fn a_spent_limit_sends_the_request_to_its_cheaper_model_charged_as_that_model() {
    let e = envoy(base(json!([
        {"name": "big", "model": "gpt-4.1", "tokens_per_second": 1, "burst": 150,
         "when_exhausted": {"model": "gpt-4.1-mini"}},
        {"name": "small", "model": "gpt-4.1-mini", "tokens_per_second": 1, "burst": 250}])));
    let body = chat("gpt-4.1", "hi", 100);
    let mut c = e.send("/v1/chat/completions", &tenant("a"), &body);
    assert!(c.forwarded);
    e.respond(&mut c, 200, &[], &["{}"]);
    assert!(c.header("x-tokengate-downgraded").is_none());
    // `big` is spent: served as gpt-4.1-mini, the body rewritten, charged to `small`.
    let mut c = e.send("/v1/chat/completions", &tenant("a"), &body);
    clean(&c);
    assert!(c.forwarded, "{:?}", c.reply_json());
    let sent: Value = serde_json::from_slice(&c.body).unwrap();
    assert_eq!(sent["model"], "gpt-4.1-mini");
    e.respond(&mut c, 200, &[], &["{}"]);
    assert_eq!(
        c.header("x-tokengate-downgraded"),
        Some("gpt-4.1 -> gpt-4.1-mini")
    );
    assert_eq!(c.audit_field("model").as_deref(), Some("gpt-4.1-mini"));
    assert_eq!(
        c.audit_field("downgraded").as_deref(),
        Some("gpt-4.1->gpt-4.1-mini")
    );
    assert_eq!(e.metric(Metric::RequestsDowngraded), 1);
    // `small` (250) holds one more; then it is spent too, and the first refusal (big's) is the
    // answer.
    assert!(
        e.send("/v1/chat/completions", &tenant("a"), &body)
            .forwarded
    );
    let c = e.send("/v1/chat/completions", &tenant("a"), &body);
    assert_eq!(c.status(), Some(429));
    assert_eq!(c.reply_header("x-tokengate-limit"), Some("big"));
}
