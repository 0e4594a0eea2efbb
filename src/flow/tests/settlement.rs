//! The quota: reservation, the settlement table (one test per row), idempotent repeats, clamping,
//! include_usage injection.

use super::*;
use crate::flow::effect::Purpose;
use crate::flow::Metric;

fn quota_cfg(extra: Value) -> Value {
    let mut q = json!({"cluster": "webdis", "monthly_limit": 100000, "lease": false});
    if let (Some(q), Some(x)) = (q.as_object_mut(), extra.as_object()) {
        for (k, v) in x {
            q.insert(k.clone(), v.clone());
        }
    }
    json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1000.0, 1e6)], "quota": q})
}

/// Sends a chat request and admits its reservation; returns the call and what was reserved.
fn admitted(e: &FakeEnvoy, body: &str) -> Call {
    admitted_at(e, "/v1/chat/completions", body)
}

/// [`admitted`] on another path.
fn admitted_at(e: &FakeEnvoy, path: &str, body: &str) -> Call {
    let mut c = e.send(path, &[TENANT], body);
    clean(&c);
    let callout = c.pending.clone().expect("a reservation callout");
    assert!(segments(&callout.body)
        .iter()
        .any(|s| s == "tg:q:{acme}:2026-11"));
    assert!(!c.forwarded, "waits for the reservation");
    e.reply(&mut c, 200, &reserved(500, 100000));
    assert!(c.forwarded);
    c
}

/// The settlements the worker sends after a tick, as (mode, actual) pairs: `s` settles a reservation,
/// `c` charges a request with no known reservation.
fn settled(e: &FakeEnvoy) -> Vec<(String, u64)> {
    e.tick(0);
    let calls = e.root_callouts.borrow().clone();
    calls
        .iter()
        .flat_map(|c| settle_entries(&c.body))
        .map(|(mode, _, actual)| (mode, actual))
        .collect()
}

/// Every entry of a settlement call's body (the batch script: tenant groups, see
/// `quota::scripts::SETTLE_BATCH_SCRIPT`) as (mode, the account's key prefix `tg:q:{…}`, actual),
/// group after group.
pub(super) fn settle_entries(body: &str) -> Vec<(String, String, u64)> {
    settle_entries_io(body)
        .into_iter()
        .map(|(mode, prefix, actual, _)| (mode, prefix, actual))
        .collect()
}

/// One entry's input tokens, output tokens and split key (`…:<month>:io`).
type Io = (u64, u64, String);

/// [`settle_entries`] with each entry's input/output tokens and its split key.
pub(super) fn settle_entries_io(body: &str) -> Vec<(String, String, u64, Io)> {
    let seg = segments(body);
    assert!(seg[0] == "EVAL" || seg[0] == "EVALSHA", "{seg:?}");
    let nkeys: usize = seg[2].parse().unwrap();
    let keys = &seg[3..3 + nkeys];
    let argv = &seg[3 + nkeys..];
    let sizes: Vec<usize> = argv[1]
        .strip_prefix("tg4s:")
        .expect("the batch tag")
        .split(',')
        .map(|m| m.parse().unwrap())
        .collect();
    let (mut k, mut a) = (0, 2);
    let mut out = Vec::new();
    for m in sizes {
        let prefix = keys[k].split('}').next().unwrap().to_string() + "}";
        for (j, e) in argv[a..a + 7 * m].chunks(7).enumerate() {
            let io_key = keys[k + 5 + 3 * j + 2].clone();
            assert_eq!(io_key, format!("{}:io", keys[k + 5 + 3 * j]));
            let io = (e[5].parse().unwrap(), e[6].parse().unwrap(), io_key);
            out.push((e[0].clone(), prefix.clone(), e[2].parse().unwrap(), io));
        }
        k += 5 + 3 * m;
        a += 7 * m;
    }
    assert_eq!((k, a), (nkeys, argv.len()), "every key and argument read");
    out
}

fn s(actual: u64) -> (String, u64) {
    ("s".to_string(), actual)
}

#[test]
fn a_complete_answer_with_usage_is_charged_its_usage_token_for_token() {
    let e = envoy(quota_cfg(json!({})));
    let mut c = admitted(&e, &chat("m", "hello", 100));
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[r#"{"usage":{"prompt_tokens":7,"completion_tokens":20,"total_tokens":27}}"#],
    );
    clean(&c);
    let reserved = estimated(&c);
    assert_eq!(c.header("x-tokengate-quota-remaining"), Some("99500"));
    assert_eq!(c.header("x-tokengate-quota-limit"), Some("100000"));
    assert_eq!(c.audit_field("actual").as_deref(), Some("27"));
    assert_eq!(c.audit_field("usage_source").as_deref(), Some("provider"));
    assert!(reserved > 27);
    assert_eq!(settled(&e), vec![s(27)]);
}

/// The settlements' input/output tokens and split keys after a tick.
fn settled_io(e: &FakeEnvoy) -> Vec<(u64, u64, String)> {
    e.tick(0);
    let calls = e.root_callouts.borrow().clone();
    calls
        .iter()
        .flat_map(|c| settle_entries_io(&c.body))
        .map(|(_, _, _, io)| io)
        .collect()
}

#[test]
fn a_settlement_carries_the_providers_input_and_output_tokens_and_a_refund_or_estimate_none() {
    let e = envoy(quota_cfg(json!({})));
    let mut c = admitted(&e, &chat("m", "hello", 100));
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[r#"{"usage":{"prompt_tokens":7,"completion_tokens":20,"total_tokens":27}}"#],
    );
    clean(&c);
    assert_eq!(
        settled_io(&e),
        vec![(7, 20, "tg:q:{acme}:2026-11:io".to_string())]
    );
    // No usage (an estimate) and a provider error (a refund): nothing for the split.
    let e = envoy(quota_cfg(json!({})));
    for (status, body) in [(200, r#"{"choices":[]}"#), (500, r#"{"error":{}}"#)] {
        let mut c = admitted(&e, &chat("m", "hello", 100));
        e.respond(
            &mut c,
            status,
            &[("content-type", "application/json")],
            &[body],
        );
        clean(&c);
    }
    let io = settled_io(&e);
    assert_eq!(io.len(), 2, "{io:?}");
    assert!(io.iter().all(|(i, o, _)| (*i, *o) == (0, 0)), "{io:?}");
}

#[test]
fn a_complete_answer_without_usage_is_charged_the_reservation() {
    let e = envoy(quota_cfg(json!({})));
    let mut c = admitted(&e, &chat("m", "hello", 100));
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[r#"{"id":"x"}"#],
    );
    assert_eq!(c.audit_field("usage_source").as_deref(), Some("estimate"));
    assert_eq!(c.audit_field("actual"), c.audit_field("reserved"));
    // The reservation is settled at its own amount (its record in Redis must go).
    let reserved: u64 = c.audit_field("reserved").unwrap().parse().unwrap();
    assert_eq!(settled(&e), vec![s(reserved)]);
}

#[test]
fn an_answer_the_provider_did_not_serve_is_refunded_in_full() {
    let e = envoy(quota_cfg(json!({})));
    let mut c = admitted(&e, &chat("m", "hello", 100));
    e.respond(
        &mut c,
        500,
        &[("content-type", "application/json")],
        &[r#"{"error":{}}"#],
    );
    let reserved = estimated(&c);
    assert_eq!(c.audit_field("actual").as_deref(), Some("0"));
    assert_eq!(c.audit_field("usage_source").as_deref(), Some("none"));
    assert!(reserved > 0);
    assert_eq!(settled(&e), vec![s(0)]);
}

#[test]
fn a_request_envoy_stopped_waiting_for_is_charged_like_one_whose_client_left() {
    // Envoy's own 504 after its route timeout: the provider had the whole request and may still be
    // generating (and billing) it. Charged the reservation (or, with "received", the prompt); any
    // other 5xx of Envoy's or the provider's is refunded.
    for (details, policy, want) in [
        ("response_timeout", "reservation", "all"),
        ("upstream_per_try_timeout", "reservation", "all"),
        ("response_timeout", "received", "prompt"),
        (
            "upstream_reset_before_response_started{connection_failure}",
            "reservation",
            "none",
        ),
        ("via_upstream", "reservation", "none"),
    ] {
        let mut e = envoy(quota_cfg(json!({"abandoned_charge": policy})));
        e.props
            .insert("response.code_details".into(), details.as_bytes().to_vec());
        let mut c = admitted(&e, &chat("m", "hello", 1000));
        e.respond(
            &mut c,
            504,
            &[("content-type", "text/plain")],
            &["upstream request timeout"],
        );
        let (actual, reserved) = charged(&c);
        let ok = match want {
            "all" => actual == reserved,
            "prompt" => actual > 0 && actual < 50,
            _ => actual == 0,
        };
        assert!(ok, "{details} {policy}: charged {actual} of {reserved}");
        assert_eq!(settled(&e), vec![s(actual)], "{details} {policy}");
    }
}

#[test]
fn a_stream_envoy_stops_waiting_for_after_its_headers_is_charged_like_one_whose_client_left() {
    // The route timeout fires while the provider streams (200, then a reset; details
    // `response_timeout`): the provider goes on generating.
    let ev = "data: {\"choices\":[{\"delta\":{\"content\":\"word word word\"}}]}\n\n";
    for (policy, whole) in [("reservation", true), ("received", false)] {
        let mut e = envoy(quota_cfg(
            json!({"inject_stream_usage": false, "abandoned_charge": policy}),
        ));
        let chat = chat_stream("m", "hello", 1000);
        let (actual, reserved) = stream_ends_mid_way(
            &mut e,
            "response_timeout",
            "/v1/chat/completions",
            &chat,
            &[ev],
        );
        if whole {
            assert_eq!(actual, reserved, "{policy}");
        } else {
            assert!(
                actual > 3 && actual < 50,
                "{policy}: prompt + 3 words, got {actual}"
            );
        }
    }
}

#[test]
fn a_background_response_short_of_its_completion_is_charged_its_whole_reservation() {
    // `background_responses: "reservation"`: the provider generates whatever happens to the answer,
    // so a stream the provider cut is charged like one whose client left, whatever the policy.
    let mut e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1000.0, 1e6)],
        "background_responses": "reservation",
        "quota": {"cluster": "webdis", "monthly_limit": 100000, "abandoned_charge": "received", "lease": false}}),
    );
    let cut = "upstream_reset_after_response_started{remote_reset}";
    let ev = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"abc\"}\n\n";
    let body =
        r#"{"model":"m","input":"hi","background":true,"stream":true,"max_output_tokens":500}"#;
    let (actual, reserved) = stream_ends_mid_way(&mut e, cut, "/v1/responses", body, &[ev]);
    assert_eq!(actual, reserved);
    // Not in background, the same cut stream is charged the prompt and what arrived.
    let body = r#"{"model":"m","input":"hi","stream":true,"max_output_tokens":500}"#;
    let (actual, _) = stream_ends_mid_way(&mut e, cut, "/v1/responses", body, &[ev]);
    assert!(actual < 50, "{actual}");
}

#[test]
fn a_stream_cut_mid_way_is_charged_the_prompt_and_the_streamed_output() {
    let e = envoy(quota_cfg(json!({"inject_stream_usage": false})));
    let mut c = admitted(&e, &chat_stream("m", "hello", 1000));
    let text = "word ".repeat(40);
    let ev = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n");
    e.respond_partly(
        &mut c,
        200,
        &[("content-type", "text/event-stream")],
        &[&ev],
        false,
    );
    e.end(&mut c); // the client (or upstream) went away before [DONE]
    clean(&c);
    let (actual, reserved) = charged(&c);
    assert_eq!(c.audit_field("usage_source").as_deref(), Some("estimate"));
    assert!(
        actual > 30 && actual < reserved,
        "prompt + ~40 streamed tokens, got {actual} of {reserved}"
    );
}

#[test]
fn a_client_gone_before_any_response_is_charged_its_reservation() {
    // The provider may run a request whose client left to its end (and bill it): by default the whole
    // reservation is charged.
    let e = envoy(quota_cfg(json!({})));
    let mut c = admitted(&e, &chat("m", "hello", 1000));
    e.end(&mut c);
    let (actual, reserved) = charged(&c);
    assert_eq!(actual, reserved);
    assert_eq!(c.audit_field("usage_source").as_deref(), Some("estimate"));
    assert_eq!(settled(&e), vec![s(actual)]);
}

#[test]
fn a_client_gone_before_any_response_is_charged_the_prompt_with_abandoned_charge_received() {
    let e = envoy(quota_cfg(json!({"abandoned_charge": "received"})));
    let mut c = admitted(&e, &chat("m", "hello", 1000));
    e.end(&mut c);
    let (actual, reserved) = charged(&c);
    assert!(actual > 0 && actual < 50, "the prompt only, got {actual}");
    assert!(actual < reserved);
    assert_eq!(settled(&e), vec![s(actual)]);
}

/// A stream the client leaves after one content event (Envoy's details say the downstream went).
fn leave_mid_stream(e: &mut FakeEnvoy, path: &str, body: &str, events: &[&str]) -> (u64, u64) {
    stream_ends_mid_way(e, "downstream_remote_disconnect", path, body, events)
}

/// A stream that ends after `events`, Envoy's `response.code_details` being `details`; returns what
/// was charged and reserved (no usage arrived: charged from the estimate).
fn stream_ends_mid_way(
    e: &mut FakeEnvoy,
    details: &str,
    path: &str,
    body: &str,
    events: &[&str],
) -> (u64, u64) {
    e.props
        .insert("response.code_details".into(), details.as_bytes().to_vec());
    let mut c = admitted_at(e, path, body);
    e.respond_partly(
        &mut c,
        200,
        &[("content-type", "text/event-stream")],
        events,
        false,
    );
    e.end(&mut c);
    clean(&c);
    assert_eq!(c.audit_field("usage_source").as_deref(), Some("estimate"));
    charged(&c)
}

/// What a call's audit says it was charged and had reserved.
fn charged(c: &Call) -> (u64, u64) {
    let field = |k: &str| -> u64 { c.audit_field(k).unwrap().parse().unwrap() };
    (field("actual"), field("reserved"))
}

#[test]
fn a_client_gone_mid_stream_is_charged_its_reservation() {
    let mut e = envoy(quota_cfg(json!({"inject_stream_usage": false})));
    let ev = "data: {\"choices\":[{\"delta\":{\"content\":\"word word word\"}}]}\n\n";
    let (actual, reserved) = leave_mid_stream(
        &mut e,
        "/v1/chat/completions",
        &chat_stream("m", "hello", 1000),
        &[ev],
    );
    assert_eq!(actual, reserved);
}

#[test]
fn an_anthropic_stream_left_after_message_start_is_charged_for_what_arrived_not_one_token() {
    // `message_start` says `output_tokens: 1`; the client leaves after 400 bytes of text. With
    // "received" the charge is the prompt plus ~100 tokens, never the start event's 1.
    let mut e = envoy(quota_cfg(json!({"abandoned_charge": "received"})));
    let body = r#"{"model":"m","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"hello"}]}"#;
    let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n";
    let text = "abcd".repeat(100);
    let delta = format!(
        "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{text}\"}}}}\n\n"
    );
    let (actual, reserved) = leave_mid_stream(&mut e, "/v1/messages", body, &[start, &delta]);
    assert!(
        actual >= 100 && actual < reserved,
        "prompt + 100 streamed tokens, got {actual} of {reserved}"
    );
    // And by default, the whole reservation.
    let mut e = envoy(quota_cfg(json!({})));
    let (actual, reserved) = leave_mid_stream(&mut e, "/v1/messages", body, &[start, &delta]);
    assert_eq!(actual, reserved);
}

#[test]
fn include_usage_is_injected_for_streams_and_its_chunk_removed_from_what_the_client_gets() {
    let e = envoy(quota_cfg(json!({})));
    let mut c = admitted(&e, &chat_stream("m", "hello", 50));
    let sent: Value = serde_json::from_slice(&c.body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert!(
        !c.headers.iter().any(|(k, _)| k == "content-length"),
        "rewritten body goes chunked"
    );
    let chunks = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,\"total_tokens\":6}}\n\n",
        "data: [DONE]\n\n",
    ];
    e.respond(
        &mut c,
        200,
        &[
            ("content-type", "text/event-stream"),
            ("content-length", "999"),
        ],
        &chunks,
    );
    clean(&c);
    let seen = String::from_utf8(c.client_body.clone()).unwrap();
    assert!(seen.contains("\"hi\"") && seen.contains("[DONE]"));
    assert!(
        !seen.contains("usage"),
        "the injected usage chunk is stripped: {seen}"
    );
    assert_eq!(c.header("content-length"), None);
    assert_eq!(c.audit_field("actual").as_deref(), Some("6"));
}

#[test]
fn only_openai_chat_and_completions_streams_get_include_usage() {
    // Anthropic's Messages and OpenAI's Responses refuse fields they do not define (and their streams
    // end with their usage anyway): their bodies reach the provider as sent.
    let e = envoy(quota_cfg(json!({})));
    for (path, body) in [
        (
            "/v1/messages",
            r#"{"model":"m","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
        (
            "/v1/responses",
            r#"{"model":"m","max_output_tokens":50,"stream":true,"input":"hi"}"#,
        ),
    ] {
        let c = admitted_at(&e, path, body);
        assert_eq!(c.body, body.as_bytes(), "{path}");
    }
    let c = admitted_at(
        &e,
        "/v1/completions",
        r#"{"model":"m","max_tokens":50,"stream":true,"prompt":"hi"}"#,
    );
    let sent: Value = serde_json::from_slice(&c.body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
}

#[test]
fn a_repeated_idempotency_key_is_reserved_and_charged_like_any_request() {
    // The provider serves every repeat, so a repeat is never free: no bound to game with new keys.
    let e = envoy(quota_cfg(json!({})));
    for _ in 0..3 {
        let mut c = e.send(
            "/v1/chat/completions",
            &[TENANT, ("idempotency-key", "k1")],
            &chat("m", "hi", 10),
        );
        assert!(c.pending.is_some(), "every repeat is reserved");
        e.reply(&mut c, 200, &reserved(500, 100000));
        e.respond(
            &mut c,
            200,
            &[("content-type", "application/json")],
            &[r#"{"usage":{"prompt_tokens":7,"completion_tokens":20}}"#],
        );
    }
    assert_eq!(settled(&e), vec![s(27), s(27), s(27)]);
}

#[test]
fn a_request_admitted_while_the_shim_was_down_is_charged_its_usage_when_it_answers_again() {
    let e = envoy(quota_cfg(json!({"on_failure": "open"})));
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 100));
    e.dead_shim(&mut c);
    assert!(c.forwarded);
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[r#"{"usage":{"prompt_tokens":9,"completion_tokens":31}}"#],
    );
    assert_eq!(c.audit_field("actual").as_deref(), Some("40"));
    assert_eq!(settled(&e), vec![("c".to_string(), 40)]);
}

#[test]
fn a_quota_refusal_answered_seconds_after_its_reservation_still_resets_at_the_start_of_next_month()
{
    // The reservation is sent at T0 and Redis answers 2.5 s later: the 429 says the month's end
    // (not the reservation's "seconds to reset" added to the answer's clock, one or more seconds
    // late), and the seconds left as of the answer.
    let e = envoy(quota_cfg(json!({})));
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    e.advance_ms(2_500);
    e.reply(&mut c, 200, &eval(&[0, 100000, 100000, 0, -1, 0, 0, 1]));
    assert_eq!(c.status(), Some(429));
    let now_s = i64::try_from(crate::flow::fake::T0 / 1_000_000_000).unwrap() + 2;
    let end = crate::quota::calendar::month_end_unix(now_s, 0);
    let j = c.reply_json();
    let q = &j["tokengate"]["quota"];
    // T0 is 2026-11-15T00:00:00Z.
    assert_eq!(q["reset_at"], "2026-12-01T00:00:00Z");
    assert_eq!(q["reset_in"], end - now_s);
    assert_eq!(
        c.reply_header("x-tokengate-quota-reset"),
        Some((end - now_s).to_string().as_str())
    );
}

#[test]
fn a_spent_quota_answers_429_and_is_then_refused_from_shared_data_without_a_callout() {
    let e = envoy(quota_cfg(json!({})));
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    e.reply(&mut c, 200, &eval(&[0, 100000, 100000, 0, -1, 0, 0, 1]));
    clean(&c);
    assert_eq!(c.status(), Some(429));
    let j = c.reply_json();
    assert_eq!(j["error"]["type"], "insufficient_quota");
    assert_eq!(j["error"]["code"], "insufficient_quota");
    assert_eq!(c.reply_header("x-tokengate-quota-remaining"), Some("0"));
    assert_eq!(
        c.reply_header("x-tokengate-reason"),
        Some("monthly_quota_exceeded")
    );
    // A month-long wait is not a retry: the SDKs would sleep on it.
    assert_eq!(c.reply_header("retry-after"), None);
    assert_eq!(c.reply_header("x-should-retry"), Some("false"));
    assert!(j["tokengate"]["quota"]["reset_in"].as_u64().unwrap() > 86_400);
    assert_eq!(e.metric(Metric::QuotaRejected), 1);
    // The next request is refused in the headers phase, no callout.
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    assert_eq!(c.status(), Some(429));
    assert!(c.pending.is_none() && !c.upstream_started);
    assert_eq!(e.metric(Metric::QuotaRejectedCached), 1);
    assert_eq!(
        c.audit_field("decision").as_deref(),
        Some("quota_exceeded_cached")
    );
}

#[test]
fn a_clamped_reservation_lowers_max_tokens_in_the_body() {
    let e = envoy(quota_cfg(json!({"clamp_output": true})));
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 1000));
    // Granted 40 of output cost (unit weights): max_tokens 40.
    e.reply(&mut c, 200, &eval(&[1, 99990, 100000, 0, -1, 0, 40, 3]));
    clean(&c);
    assert!(c.forwarded);
    let sent: Value = serde_json::from_slice(&c.body).unwrap();
    assert_eq!(sent["max_tokens"], 40);
    assert_eq!(e.metric(Metric::QuotaClamped), 1);
}

#[test]
fn settlements_of_one_tenant_go_in_one_batch_and_a_failed_batch_is_retried() {
    let e = envoy(quota_cfg(json!({})));
    for _ in 0..3 {
        let mut c = admitted(&e, &chat("m", "hello", 100));
        e.respond(&mut c, 500, &[], &["{}"]);
    }
    let backlog = || {
        e.gauges
            .borrow()
            .get("tokengate_quota_settle_backlog")
            .copied()
    };
    e.tick(0);
    assert_eq!(backlog(), Some(3), "three settlements waiting");
    assert_eq!(e.root_callouts.borrow().len(), 1, "one batch");
    e.reply_root(0, 503, "");
    assert_eq!(
        e.metric(Metric::QuotaSettleRetries),
        1,
        "the batch is sent again later"
    );
    e.advance_ms(2000);
    e.tick(0);
    assert_eq!(backlog(), Some(3), "still waiting");
    assert_eq!(e.root_callouts.borrow().len(), 1);
    e.reply_root(0, 200, &eval(&[1, 1, 1]));
    assert_eq!(e.metric(Metric::QuotaSettled), 3);
    assert!(e.metric(Metric::QuotaRefundedTokens) > 0);
    e.tick(0);
    assert_eq!(backlog(), Some(0), "all taken");
}

#[test]
fn a_clamp_that_leaves_no_room_for_the_thinking_budget_is_refused_and_the_reservation_given_back() {
    let e = envoy(quota_cfg(json!({"clamp_output": true})));
    let body = json!({"model": "claude", "max_tokens": 8000,
        "thinking": {"type": "enabled", "budget_tokens": 4000},
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let mut c = e.send("/v1/messages", &[TENANT], &body);
    e.reply(&mut c, 200, &eval(&[1, 99990, 100000, 0, -1, 0, 500, 3]));
    clean(&c);
    assert_eq!(c.status(), Some(400));
    assert_eq!(c.reply_json()["error"]["type"], "invalid_request_error");
    assert_eq!(
        c.reply_header("x-tokengate-reason"),
        Some("thinking_budget_does_not_fit")
    );
    assert_eq!(settled(&e), vec![s(0)], "the reservation is refunded");
    // A clamp that leaves room lowers the budget below max_tokens.
    let mut c = e.send("/v1/messages", &[TENANT], &body);
    e.reply(&mut c, 200, &eval(&[1, 99990, 100000, 0, -1, 0, 3000, 3]));
    assert!(c.forwarded);
    let sent: Value = serde_json::from_slice(&c.body).unwrap();
    assert_eq!(sent["max_tokens"], 3000);
    assert!(sent["thinking"]["budget_tokens"].as_u64().unwrap() < 3000);
}

#[test]
fn settlements_wait_in_shared_data_and_any_worker_sends_them() {
    let e = FakeEnvoy::new(&quota_cfg(json!({})).to_string(), 2);
    let mut c = e.send_on(0, "/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    e.reply(&mut c, 200, &reserved(10, 100000));
    e.respond(&mut c, 500, &[], &["{}"]);
    // Worker 1 takes the claim first: it sends worker 0's settlement.
    e.tick(1);
    assert_eq!(e.root_callouts.borrow().len(), 1);
    e.tick(0);
    assert_eq!(
        e.root_callouts.borrow().len(),
        1,
        "worker 0 does not hold the claim"
    );
    e.reply_root(1, 200, &eval(&[1]));
    assert_eq!(e.metric(Metric::QuotaSettled), 1);
    assert_eq!(
        crate::store::journal::bounds(&e.store),
        (1, 1),
        "the head moved past it"
    );
}

#[test]
fn a_lapsed_claim_passes_to_another_worker_which_sends_the_same_entries_again() {
    let e = FakeEnvoy::new(&quota_cfg(json!({})).to_string(), 2);
    let mut c = e.send_on(0, "/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    e.reply(&mut c, 200, &reserved(10, 100000));
    e.respond(&mut c, 500, &[], &["{}"]);
    e.tick(0);
    assert_eq!(e.root_callouts.borrow().len(), 1);
    // Worker 0 goes away with its batch in flight; after the claim lapses worker 1 sends it again.
    e.root_callouts.borrow_mut().clear();
    e.advance_ms(2_001);
    e.tick(1);
    assert_eq!(e.root_callouts.borrow().len(), 1);
    e.reply_root(1, 200, &eval(&[1]));
    assert_eq!(crate::store::journal::bounds(&e.store), (1, 1));
}

#[test]
fn charges_of_an_outage_wait_for_the_shim_and_are_sent_when_it_answers() {
    let e = envoy(quota_cfg(json!({"on_failure": "open"})));
    for _ in 0..5 {
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
        if c.pending.is_some() {
            e.dead_shim(&mut c);
        }
        e.respond(
            &mut c,
            200,
            &[("content-type", "application/json")],
            &[r#"{"usage":{"prompt_tokens":2,"completion_tokens":3}}"#],
        );
    }
    assert_eq!(e.metric(Metric::QuotaFailOpen), 5);
    // The shim's breaker is open: nothing is sent, everything waits in the journal.
    e.tick(0);
    assert!(e.root_callouts.borrow().is_empty());
    assert_eq!(crate::store::journal::bounds(&e.store), (0, 5));
    // Once the breaker lets a probe through, the five charges go in one batch.
    e.advance_ms(5_001);
    e.tick(0);
    let calls = e.root_callouts.borrow().clone();
    assert_eq!(calls.len(), 1);
    let charged: Vec<(String, u64)> = {
        let seg = segments(&calls[0].body);
        let nkeys: usize = seg[2].parse().unwrap();
        seg[3 + nkeys + 2..]
            .chunks(7)
            .map(|a| (a[0].clone(), a[2].parse().unwrap()))
            .collect()
    };
    assert_eq!(charged, vec![("c".to_string(), 5); 5]);
    e.reply_root(0, 200, &eval(&[1, 1, 1, 1, 1]));
    assert_eq!(crate::store::journal::bounds(&e.store), (5, 5));
}

#[test]
fn a_request_with_a_reservation_writes_its_audit_record_once_when_it_is_settled() {
    let e = envoy(quota_cfg(json!({})));
    let mut c = admitted(&e, &chat("m", "hello", 100));
    assert_eq!(c.audits, 0, "nothing before the settlement: {:?}", c.audit);
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[r#"{"usage":{"prompt_tokens":7,"completion_tokens":20}}"#],
    );
    assert_eq!(c.audits, 1);
    assert_eq!(c.audit_field("decision").as_deref(), Some("admit"));
    assert_eq!(c.audit_field("actual").as_deref(), Some("27"));
    assert_eq!(
        c.audit_field("reserved"),
        Some(estimated(&c).to_string()),
        "{:?}",
        c.audit
    );
    // The client goes before any response: settled in on_log, which writes the one record (Envoy
    // writes its access log after on_log).
    let mut d = admitted(&e, &chat("m", "hello", 100));
    e.end(&mut d);
    assert_eq!(d.audits, 1);
    assert_eq!(d.audit_field("decision").as_deref(), Some("admit"));
    assert!(d.audit_field("actual").is_some(), "{:?}", d.audit);
    // Without a quota the record is written when the request is admitted.
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1e6, 1e9)]}),
    );
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hello", 100));
    assert!(c.forwarded);
    assert_eq!(c.audits, 1);
    assert_eq!(c.audit_field("decision").as_deref(), Some("admit"));
}

#[test]
fn a_quota_refusal_with_tokens_left_says_how_many_not_used_up() {
    let used_up =
        crate::flow::request::answers::quota_exceeded(2000, 0, 3600, 0, "for this tenant");
    assert!(
        used_up.message.contains("is used up (2000 tokens)"),
        "{}",
        used_up.message
    );
    let short =
        crate::flow::request::answers::quota_exceeded(2000, 165, 3600, 0, "for this tenant");
    assert!(
        short
            .message
            .contains("cannot cover this request: 165 tokens left of 2000"),
        "{}",
        short.message
    );
}

/// Requests of tenants `t0`…`t{n-1}`, one each, admitted and answered 500 (each settles to 0).
fn one_request_each(e: &FakeEnvoy, n: usize) {
    for i in 0..n {
        let tenant = format!("t{i}");
        let mut c = e.send(
            "/v1/chat/completions",
            &[("x-tenant-id", tenant.as_str())],
            &chat("m", "hi", 10),
        );
        e.reply(&mut c, 200, &reserved(10, 100000));
        assert!(c.forwarded);
        e.respond(&mut c, 500, &[], &["{}"]);
    }
}

/// The tenants of each settlement call sent so far, one list per call.
fn tenants_per_call(e: &FakeEnvoy) -> Vec<Vec<String>> {
    e.root_callouts
        .borrow()
        .iter()
        .filter(|c| matches!(c.purpose, Purpose::Settle(_)))
        .map(|c| {
            settle_entries(&c.body)
                .into_iter()
                .map(|(_, k, _)| {
                    k.trim_start_matches("tg:q:{")
                        .trim_end_matches('}')
                        .to_string()
                })
                .collect()
        })
        .collect()
}

#[test]
fn settlements_of_many_tenants_in_a_window_go_in_one_call() {
    let e = envoy(quota_cfg(json!({})));
    one_request_each(&e, 100);
    e.tick(0);
    let calls = tenants_per_call(&e);
    assert_eq!(calls.len(), 1, "one call for the window");
    let want: Vec<String> = (0..100).map(|i| format!("t{i}")).collect();
    assert_eq!(calls[0], want);
    // Redis has not run the script yet: EVAL, then EVALSHA.
    assert!(e.root_callouts.borrow()[0].body.starts_with("EVAL/"));
    e.reply_root(0, 200, &eval(&[1; 100]));
    assert_eq!(e.metric(Metric::QuotaSettled), 100);
    assert_eq!(crate::store::journal::bounds(&e.store), (100, 100));
    // A window holds at most WINDOW entries: 200 more go in two calls, one after the other.
    one_request_each(&e, 200);
    e.tick(0);
    assert_eq!(tenants_per_call(&e).len(), 1);
    assert_eq!(
        tenants_per_call(&e)[0].len(),
        crate::flow::vm::settle::WINDOW
    );
    assert!(e.root_callouts.borrow()[0].body.starts_with("EVALSHA/"));
    e.reply_root(0, 200, &eval(&[0; crate::flow::vm::settle::WINDOW]));
    // The rest is not a full window: it waits MIN_GAP_NS after the last call (more may join it).
    e.tick(0);
    assert!(tenants_per_call(&e).is_empty(), "not yet");
    e.advance_ms(99);
    e.tick(0);
    assert!(tenants_per_call(&e).is_empty(), "not yet");
    e.advance_ms(1);
    e.tick(0);
    assert_eq!(
        tenants_per_call(&e)[0].len(),
        200 - crate::flow::vm::settle::WINDOW
    );
}

#[test]
fn a_tenant_group_redis_refuses_does_not_stop_the_others_and_only_it_is_sent_again() {
    let e = envoy(quota_cfg(json!({"settle_max_attempts": 2})));
    one_request_each(&e, 3);
    e.tick(0);
    // t1's group failed in Redis (-3: a key of the wrong type, say); t0 and t2 were applied.
    e.reply_root(0, 200, &eval(&[1, -3, 1]));
    assert_eq!(e.metric(Metric::QuotaSettled), 2);
    assert_eq!(e.metric(Metric::QuotaSettleRetries), 1);
    assert!(e.logged("{t1}"), "the log names the tenant");
    assert_eq!(crate::store::journal::bounds(&e.store), (0, 3), "kept");
    // Nothing before the backoff; then only t1's settlement again.
    e.tick(0);
    assert!(tenants_per_call(&e).is_empty());
    e.advance_ms(2_000);
    e.tick(0);
    assert_eq!(tenants_per_call(&e), vec![vec!["t1".to_string()]]);
    // Refused again (-2: the script refused its arguments): given up after 2 attempts, alone.
    e.reply_root(0, 200, &eval(&[-2]));
    assert_eq!(e.metric(Metric::QuotaSettleDropped), 1);
    assert_eq!(e.metric(Metric::QuotaSettled), 2);
    assert_eq!(
        e.metric(Metric::QuotaSettleDuplicates),
        0,
        "t0, t2 never resent"
    );
    assert_eq!(crate::store::journal::bounds(&e.store), (3, 3));
    // A later window goes as usual.
    one_request_each(&e, 2);
    e.advance_ms(100);
    e.tick(0);
    assert_eq!(tenants_per_call(&e).len(), 1);
    e.reply_root(0, 200, &eval(&[1, 1]));
    assert_eq!(e.metric(Metric::QuotaSettled), 4);
}

#[test]
fn a_window_the_shim_could_not_take_is_sent_again_whole_after_a_backoff() {
    let e = envoy(quota_cfg(json!({})));
    one_request_each(&e, 3);
    e.tick(0);
    e.reply_root(0, 504, "");
    assert_eq!(e.metric(Metric::QuotaSettleRetries), 1);
    e.advance_ms(2_000);
    e.tick(0);
    assert_eq!(tenants_per_call(&e), vec![vec!["t0", "t1", "t2"]]);
    e.reply_root(0, 200, &eval(&[1, 1, 1]));
    assert_eq!(crate::store::journal::bounds(&e.store), (3, 3));
}

#[test]
fn noscript_sends_the_same_window_again_at_once_as_eval() {
    let e = envoy(quota_cfg(json!({})));
    one_request_each(&e, 2);
    e.tick(0);
    e.reply_root(0, 200, &eval(&[1, 1]));
    one_request_each(&e, 2);
    e.advance_ms(100);
    e.tick(0);
    assert!(e.root_callouts.borrow()[0].body.starts_with("EVALSHA/"));
    e.reply_root(
        0,
        200,
        r#"{"EVALSHA":[false,"NOSCRIPT No matching script"]}"#,
    );
    let calls = e.root_callouts.borrow().clone();
    assert_eq!(calls.len(), 1, "sent again at once");
    assert!(calls[0].body.starts_with("EVAL/"));
    assert_eq!(tenants_per_call(&e), vec![vec!["t0", "t1"]]);
    e.reply_root(0, 200, &eval(&[1, 1]));
    assert_eq!(e.metric(Metric::QuotaSettled), 4);
    assert_eq!(e.metric(Metric::QuotaSettleRetries), 0);
    assert_eq!(crate::store::journal::bounds(&e.store), (4, 4));
}

#[test]
fn behind_a_redis_cluster_settlements_fall_back_to_one_call_per_tenant() {
    let e = envoy(quota_cfg(json!({})));
    one_request_each(&e, 3);
    e.tick(0);
    e.reply_root(
        0,
        200,
        r#"{"EVAL":[false,"CROSSSLOT Keys in request don't hash to the same slot"]}"#,
    );
    // Nothing ran: each tenant's group at once, apart.
    assert_eq!(
        tenants_per_call(&e),
        vec![vec!["t0"], vec!["t1"], vec!["t2"]]
    );
    assert!(e.logged("settlements are sent per tenant from now on"));
    assert_eq!(e.metric(Metric::QuotaSettleRetries), 0);
    for _ in 0..3 {
        e.reply_root(0, 200, &eval(&[1]));
    }
    assert_eq!(e.metric(Metric::QuotaSettled), 3);
    assert_eq!(crate::store::journal::bounds(&e.store), (3, 3));
    // And from then on.
    one_request_each(&e, 2);
    e.advance_ms(100);
    e.tick(0);
    assert_eq!(tenants_per_call(&e), vec![vec!["t0"], vec!["t1"]]);
}
