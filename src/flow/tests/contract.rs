//! The response contract: every answer the filter makes, and the headers of admitted responses.

use super::*;
use crate::flow::Metric;

#[test]
fn an_admitted_request_is_forwarded_with_rate_limit_and_estimate_headers() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(10.0, 1000.0)]}),
    );
    let mut c = e.send(
        "/v1/chat/completions",
        &[TENANT],
        &chat("m", "hello there", 10),
    );
    assert!(c.forwarded && c.reply.is_none());
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[r#"{"id":"x"}"#],
    );
    clean(&c);
    let cost = estimated(&c);
    assert!(cost > 10, "prompt + 10 reserved, got {cost}");
    assert_eq!(c.header("x-ratelimit-limit-tokens"), Some("1000"));
    assert_eq!(
        c.header("x-ratelimit-remaining-tokens"),
        Some((1000 - cost).to_string().as_str())
    );
    assert!(c.header("x-ratelimit-reset-tokens").is_some());
    assert_eq!(c.audit_field("decision").as_deref(), Some("admit"));
    assert_eq!(c.audit_field("tenant").as_deref(), Some("acme"));
    assert_eq!(e.metric(Metric::RequestsAdmitted), 1);
}

#[test]
fn an_empty_token_bucket_answers_429_tokens_per_second_exceeded_with_the_estimate() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1.0, 100.0)]}),
    );
    let first = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 60));
    assert!(first.forwarded);
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 60));
    clean(&c);
    assert_eq!(c.status(), Some(429));
    let j = c.reply_json();
    assert_eq!(j["error"]["code"], "rate_limit_exceeded");
    assert_eq!(j["error"]["type"], "tokens");
    assert_eq!(j["error"]["param"], Value::Null);
    assert_eq!(
        c.reply_header("x-tokengate-reason"),
        Some("tokens_per_second_exceeded")
    );
    assert_eq!(c.reply_header("x-should-retry"), Some("true"));
    assert!(c.reply_header("retry-after").is_some());
    assert_eq!(c.reply_header("x-ratelimit-limit-tokens"), Some("100"));
    assert!(estimated(&c) > 60);
    assert_eq!(e.metric(Metric::RequestsLimitedTokens), 1);
    assert_eq!(c.audit_field("decision").as_deref(), Some("limited_tokens"));
}

#[test]
fn a_spent_request_bucket_answers_429_requests_per_minute_exceeded() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [
        {"name": "r", "tokens_per_second": 1000, "burst": 100000, "requests_per_minute": 1}]}),
    );
    assert!(
        e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5))
            .forwarded
    );
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5));
    assert_eq!(c.status(), Some(429));
    assert_eq!(
        c.reply_header("x-tokengate-reason"),
        Some("requests_per_minute_exceeded")
    );
    assert_eq!(c.reply_json()["error"]["type"], "requests");
    assert_eq!(c.reply_header("x-ratelimit-remaining-requests"), Some("0"));
    assert_eq!(e.metric(Metric::RequestsLimitedRequests), 1);
}

#[test]
fn a_bucket_known_from_the_headers_refuses_before_the_upstream_is_contacted() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [
        {"name": "r", "tokens_per_second": 1000, "burst": 1e6, "requests_per_minute": 1}]}),
    );
    let body = chat("m", "hi", 35);
    assert!(
        e.send(
            "/v1/chat/completions",
            &[TENANT, ("x-tokengate-model", "m")],
            &body
        )
        .forwarded
    );
    let c = e.send(
        "/v1/chat/completions",
        &[TENANT, ("x-tokengate-model", "m")],
        &body,
    );
    clean(&c);
    assert_eq!(c.status(), Some(429));
    assert_eq!(
        c.reply_header("x-tokengate-reason"),
        Some("requests_per_minute_exceeded")
    );
    assert_eq!(c.reply_json()["error"]["type"], "requests");
    assert!(!c.upstream_started, "refused in the headers phase");
    // No estimate is known in the headers phase.
    assert_eq!(c.reply_header("x-tokengate-estimated-tokens"), None);
}

#[test]
fn a_cost_above_the_burst_answers_413_cost_exceeds_burst() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(10.0, 100.0)]}),
    );
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 500));
    assert_eq!(c.status(), Some(413));
    assert_eq!(c.reply_json()["error"]["code"], "cost_exceeds_burst");
    assert_eq!(e.metric(Metric::RequestsRejectedCostExceedsBurst), 1);
}

#[test]
fn a_body_over_max_body_bytes_answers_413_from_its_content_length_or_while_buffering() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "max_body_bytes": 100, "rules": [rule(10.0, 1e6)]}),
    );
    let big = chat("m", &"x".repeat(200), 5);
    let c = e.send("/v1/chat/completions", &[TENANT], &big);
    assert_eq!(c.status(), Some(413));
    assert!(!c.upstream_started);
    assert_eq!(c.reply_json()["error"]["code"], "request_too_large");
    // Without content-length (chunked upload) the body phase refuses it.
    let c = e.send(
        "/v1/chat/completions",
        &[TENANT, ("content-length", "10")],
        &big,
    );
    assert!(c.upstream_started);
    assert_eq!(c.status(), Some(413));
    assert_eq!(e.metric(Metric::RequestsRejectedTooLarge), 2);
}

#[test]
fn a_body_that_is_not_a_request_answers_400_or_is_charged_the_configured_tokens() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(10.0, 1e6)]}),
    );
    let c = e.send("/v1/chat/completions", &[TENANT], "not json");
    assert_eq!(c.status(), Some(400));
    assert_eq!(c.reply_json()["error"]["code"], "invalid_body");
    // Charged a fixed cost, as the default model (the body names none that could be read).
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "invalid_body": {"action": "charge", "tokens": 77},
        "default_model": "m", "rules": [rule(10.0, 1e6)]}),
    );
    let mut c = e.send("/v1/chat/completions", &[TENANT], "not json");
    assert!(c.forwarded);
    e.respond(&mut c, 400, &[], &["{}"]);
    assert_eq!(estimated(&c), 77);
    assert_eq!(c.audit_field("model").as_deref(), Some("m"));
    assert_eq!(e.metric(Metric::RequestsInvalidBodyCharged), 1);
    // Without a default model it would be charged as no model at all (past every model-scoped
    // limit): refused.
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "invalid_body": {"action": "charge", "tokens": 77},
        "rules": [rule(10.0, 1e6)]}),
    );
    let c = e.send("/v1/chat/completions", &[TENANT], "not json");
    assert_eq!(c.status(), Some(400));
    assert_eq!(c.reply_json()["error"]["code"], "model_required");
    // Even when it spells a model: a body that cannot be read names none that can be trusted.
    let c = e.send(
        "/v1/chat/completions",
        &[TENANT],
        r#"{"model":"m","max_tokens":"x","messages":[]}"#,
    );
    assert_eq!(c.status(), Some(400));
    let msg = c.reply_json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("not a valid request of its API"), "{msg}");
}

#[test]
fn no_tenant_answers_401_unless_a_default_tenant_is_configured() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "api_key_tenants": false, "rules": [rule(10.0, 1e6)]}),
    );
    let c = e.send("/v1/chat/completions", &[], &chat("m", "hi", 5));
    assert_eq!(c.status(), Some(401));
    assert_eq!(c.reply_json()["error"]["code"], "missing_tenant");
    assert!(!c.upstream_started);
    let e = envoy(
        json!({"default_tenant": "anon", "api_key_tenants": false, "rules": [rule(10.0, 1e6)]}),
    );
    let c = e.send("/v1/chat/completions", &[], &chat("m", "hi", 5));
    assert!(c.forwarded);
    assert_eq!(c.audit_field("tenant").as_deref(), Some("anon"));
}

#[test]
fn an_api_key_names_a_hashed_tenant() {
    let e = envoy(json!({"rules": [rule(10.0, 1e6)]}));
    let c = e.send(
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-alice")],
        &chat("m", "hi", 5),
    );
    assert!(c.forwarded);
    let t = c.audit_field("tenant").unwrap();
    assert_eq!(t, crate::identity::tenant_from_key("sk-alice"));
    assert!(!t.contains("alice"));
}

#[test]
fn other_methods_and_paths_pass_untouched_but_lose_a_client_sent_route_header() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(10.0, 1e6)],
        "breaker": {"cluster_fallbacks": {"provider": {"cluster": "fb", "route": "fallback"}}}}),
    );
    let c = e.send(
        "/v1/models",
        &[
            (":method", "GET"),
            TENANT,
            ("x-tokengate-route", "fallback"),
        ],
        "",
    );
    clean(&c);
    assert!(c.forwarded && c.audit.is_none());
    assert!(!c.headers.iter().any(|(k, _)| k == "x-tokengate-route"));
    assert_eq!(e.metric(Metric::RequestsPassthrough), 1);
}

#[test]
fn writes_on_paths_that_are_not_metered_are_refused_unless_allowed() {
    // POST /v1/batches, Anthropic's message batches and legacy /v1/complete, an Assistants run, a
    // WebSocket upgrade: each could spend provider usage the filter cannot charge.
    let e = envoy(json!({"rules": [rule(10.0, 1e6)]}));
    for (method, path, extra, family) in [
        ("POST", "/v1/batches", None, "openai"),
        ("POST", "/v1/images/generations?x=1", None, "openai"),
        ("PUT", "/v1/Threads/t1/Runs/", None, "openai"),
        (
            "GET",
            "/v1/realtime?model=m",
            Some(("upgrade", "websocket")),
            "openai",
        ),
        ("POST", "/v1/messages/batches", None, "anthropic"),
        ("POST", "/v1/complete", None, "anthropic"),
        (
            "POST",
            "/v1/other",
            Some(("anthropic-version", "2023-06-01")),
            "anthropic",
        ),
        // An upgrade has no body to meter, even on a metered path.
        (
            "POST",
            "/v1/chat/completions",
            Some(("upgrade", "websocket")),
            "openai",
        ),
        (
            "CONNECT",
            "/v1/messages",
            Some((":protocol", "websocket")),
            "anthropic",
        ),
        // Assistants' paths with `/messages/` are OpenAI's.
        ("POST", "/v1/threads/t1/messagesx", None, "openai"),
        // A thread created and run at once spends (`*/threads` is free, this is not).
        ("POST", "/v1/threads/runs", None, "openai"),
    ] {
        let mut hs = vec![(":method", method), ("authorization", "Bearer sk-a")];
        hs.extend(extra);
        let c = e.send(path, &hs, "{}");
        clean(&c);
        assert!(!c.forwarded && !c.upstream_started, "{path}");
        let r = c.reply.as_ref().unwrap();
        assert_eq!(r.status, 403, "{path}");
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let reason = match family {
            "openai" => &body["error"]["code"],
            _ => &body["error"]["details"]["error_code"],
        };
        assert_eq!(reason, "path_not_metered", "{path}: {body}");
        if family == "anthropic" {
            assert_eq!(body["error"]["type"], "permission_error", "{body}");
        }
        assert!(
            c.audit_field("decision") == Some("path_not_metered".into()),
            "{path}"
        );
    }
    assert_eq!(e.metric(Metric::RequestsRejectedUnmetered), 11);
    // Reads, the built-in free endpoints and the operator's patterns pass, uncharged.
    let e = envoy(json!({"rules": [rule(10.0, 1e6)],
        "unmetered_paths": {"allow": ["/v1/files", "*/fine_tuning/jobs"]}}));
    for (method, path) in [
        ("GET", "/v1/models"),
        ("DELETE", "/v1/files/f1"),
        ("HEAD", "/v1/batches"),
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/v1/responses/input_tokens"),
        ("POST", "/v1/moderations"),
        ("POST", "/v1/threads/t1/messages"),
        ("POST", "/v1/threads/t1/messages/msg_1"),
        ("POST", "/v1/responses/resp_1/cancel"),
        ("POST", "/v1/files/"),
        ("POST", "/org/v1/fine_tuning/jobs"),
        ("POST", "/v1/uploads"),
        ("POST", "/v1/uploads/u1/parts"),
        ("POST", "/v1/threads"),
        ("POST", "/v1/chat/completions/chatcmpl-1"),
        ("POST", "/v1/conversations"),
        ("POST", "/v1/conversations/c1/items"),
        ("POST", "/v1/batches/b1/cancel"),
        ("POST", "/v1/messages/batches/b1/cancel"),
    ] {
        let c = e.send(path, &[(":method", method)], "{}");
        clean(&c);
        assert!(c.forwarded && c.reply.is_none(), "{method} {path}");
    }
    assert_eq!(e.metric(Metric::RequestsPassthrough), 19);
    assert_eq!(e.metric(Metric::RequestsRejectedUnmetered), 0);
    // `writes: pass`: the old behaviour, every unmetered request untouched.
    let e = envoy(json!({"rules": [rule(10.0, 1e6)], "unmetered_paths": {"writes": "pass"}}));
    let c = e.send("/v1/batches", &[], "{}");
    assert!(c.forwarded && c.reply.is_none());
}

#[test]
fn case_parameters_and_trailing_slashes_do_not_hide_an_llm_path() {
    use crate::estimate::ApiKind;
    use crate::flow::request::headers::api_kind;
    for p in [
        "/v1/chat/completions",
        "/V1/Chat/Completions/",
        "/v1/chat;x=y/completions?stream=1",
        "/openai/deployments/d/chat/completions",
    ] {
        assert_eq!(
            api_kind(Some("POST"), Some(p)),
            Some(ApiKind::ChatCompletions),
            "{p}"
        );
    }
    assert_eq!(api_kind(Some("GET"), Some("/v1/chat/completions")), None);
    assert_eq!(
        api_kind(Some("POST"), Some("/v1/threads/t1/messages")),
        None
    );
    assert_eq!(
        api_kind(Some("POST"), Some("/v1/messages")),
        Some(ApiKind::AnthropicMessages)
    );
}

#[test]
fn every_answer_in_the_headers_phase_leaves_no_request_hanging() {
    // 401, 413 by content-length, cached quota 429, open cluster breaker: the headers phase answers
    // and never pauses without a reply (FakeEnvoy flags a pause as a violation).
    let e =
        envoy(json!({"api_key_tenants": false, "max_body_bytes": 10, "rules": [rule(10.0, 1e6)]}));
    clean(&e.send("/v1/chat/completions", &[], &chat("m", "hi", 5)));
    clean(&e.send(
        "/v1/chat/completions",
        &[("x-tenant-id", "a")],
        &chat("m", "hi", 5),
    ));
}

#[test]
fn anthropic_clients_get_anthropic_shapes_and_headers() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1.0, 100.0)]}),
    );
    let body = json!({"model": "claude", "max_tokens": 60, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    assert!(e.send("/v1/messages", &[TENANT], &body).forwarded);
    let c = e.send("/v1/messages", &[TENANT, ("x-request-id", "req-7")], &body);
    clean(&c);
    assert_eq!(c.status(), Some(429));
    let j = c.reply_json();
    assert_eq!(j["type"], "error");
    assert_eq!(j["error"]["type"], "rate_limit_error");
    assert_eq!(j["request_id"], "req-7");
    assert_eq!(c.reply_header("request-id"), Some("req-7"));
    assert!(c
        .reply_header("anthropic-ratelimit-tokens-remaining")
        .is_some());
    let reset = c.reply_header("anthropic-ratelimit-tokens-reset").unwrap();
    assert!(
        reset.starts_with("2026-11-") && reset.ends_with('Z'),
        "RFC 3339: {reset}"
    );
    assert!(c.reply_header("x-ratelimit-limit-tokens").is_none());
    // Admitted answers carry Anthropic's headers too.
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1.0, 1000.0)]}),
    );
    let mut c = e.send("/v1/messages", &[TENANT], &body);
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &["{}"],
    );
    assert_eq!(c.header("anthropic-ratelimit-tokens-limit"), Some("1000"));
}

#[test]
fn openai_resets_are_durations_and_every_answer_carries_the_request_id() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1.0, 100.0)]}),
    );
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 60));
    e.respond(&mut c, 200, &[], &["{}"]);
    let reset = c.header("x-ratelimit-reset-tokens").unwrap();
    assert!(
        reset.ends_with('s') && !reset.contains('.')
            || reset.contains("m")
            || reset.ends_with("ms"),
        "{reset}"
    );
    let c = e.send(
        "/v1/chat/completions",
        &[TENANT, ("x-request-id", "abc")],
        &chat("m", "hi", 60),
    );
    assert_eq!(c.reply_header("x-request-id"), Some("abc"));
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 60));
    assert!(c
        .reply_header("x-request-id")
        .is_some_and(|v| v.starts_with("tg-")));
}

#[test]
fn the_providers_trio_is_kept_whole_when_it_has_less_left_and_replaced_whole_otherwise() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(1.0, 1000.0)]}),
    );
    let provider = [
        ("x-ratelimit-limit-tokens", "90000"),
        ("x-ratelimit-remaining-tokens", "3"),
        ("x-ratelimit-reset-tokens", "6m0s"),
        ("x-ratelimit-limit-requests", "500"),
        ("x-ratelimit-remaining-requests", "499"),
        ("x-ratelimit-reset-requests", "120ms"),
    ];
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    e.respond(&mut c, 429, &provider, &["{}"]);
    assert_eq!(c.header("x-ratelimit-remaining-tokens"), Some("3"));
    assert_eq!(c.header("x-ratelimit-limit-tokens"), Some("90000"));
    assert_eq!(c.header("x-ratelimit-reset-tokens"), Some("6m0s"));
    // No request bucket here: the provider's request trio passes untouched.
    assert_eq!(c.header("x-ratelimit-remaining-requests"), Some("499"));
    let provider = [
        ("x-ratelimit-limit-tokens", "90000"),
        ("x-ratelimit-remaining-tokens", "89000"),
        ("x-ratelimit-reset-tokens", "1s"),
    ];
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 10));
    e.respond(&mut c, 200, &provider, &["{}"]);
    assert_eq!(c.header("x-ratelimit-limit-tokens"), Some("1000"));
    assert_ne!(c.header("x-ratelimit-reset-tokens"), Some("1s"));
}

#[test]
fn a_client_cannot_name_a_tenant_in_the_key_namespace() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(10.0, 1e6)]}),
    );
    let forged = crate::identity::tenant_from_key("sk-bob");
    for t in [forged.as_str(), "KEY:0123456789abcdef", " key:x"] {
        let c = e.send(
            "/v1/chat/completions",
            &[("x-tenant-id", t), ("authorization", "Bearer sk-alice")],
            &chat("m", "hi", 5),
        );
        clean(&c);
        assert_eq!(c.status(), Some(403), "{t}");
        assert_eq!(
            c.reply_header("x-tokengate-reason"),
            Some("forbidden_tenant")
        );
        assert!(!c.upstream_started);
    }
}

#[test]
fn two_different_api_keys_name_no_tenant() {
    // OpenAI checks the bearer token, Anthropic x-api-key: charging either while the provider bills the
    // other would let a client pick its tenant.
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(10.0, 1e6)]}),
    );
    let two = [
        ("authorization", "Bearer junk-1"),
        ("x-api-key", "sk-ant-real"),
    ];
    // The same header twice with different keys: an upstream may read either line.
    let twice = [("x-api-key", "sk-ant-aaa"), ("x-api-key", "sk-ant-bbb")];
    for (path, two) in [
        ("/v1/messages", &two),
        ("/v1/chat/completions", &two),
        ("/v1/messages", &twice),
    ] {
        let body = if path == "/v1/messages" {
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#
                .to_string()
        } else {
            chat("m", "hi", 5)
        };
        let c = e.send(path, two, &body);
        clean(&c);
        assert_eq!(c.status(), Some(401), "{path}");
        assert_eq!(c.reply_header("x-tokengate-reason"), Some("missing_tenant"));
        assert!(c.reply_json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("two different API keys"));
        assert_eq!(c.audit_field("decision").as_deref(), Some("two_api_keys"));
        assert!(!c.upstream_started);
    }
    // The same key twice, one of them empty, or a tenant from the trusted header: admitted.
    for headers in [
        vec![("authorization", "Bearer sk-1"), ("x-api-key", "sk-1")],
        vec![("authorization", "Bearer "), ("x-api-key", "sk-1")],
        vec![("x-api-key", "sk-1"), ("x-api-key", "sk-1")],
        vec![
            ("x-tenant-id", "acme"),
            ("authorization", "Bearer a"),
            ("x-api-key", "b"),
        ],
    ] {
        let mut c = e.send("/v1/chat/completions", &headers, &chat("m", "hi", 5));
        assert!(c.forwarded, "{headers:?}: {:?}", c.reply);
        e.respond(&mut c, 200, &[], &["{}"]);
        clean(&c);
    }
    assert_eq!(e.metric(Metric::RequestsRejectedNoTenant), 3);
}

#[test]
fn what_a_retry_cannot_fix_says_so_and_never_carries_retry_after() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "max_body_bytes": 1000, "rules": [rule(10.0, 100.0)]}),
    );
    for c in [
        e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 500)),
        e.send("/v1/chat/completions", &[TENANT], "nope"),
        e.send(
            "/v1/chat/completions",
            &[TENANT],
            &chat("m", &"x".repeat(2000), 5),
        ),
        e.send("/v1/chat/completions", &[], &chat("m", "hi", 5)),
    ] {
        clean(&c);
        assert_eq!(
            c.reply_header("x-should-retry"),
            Some("false"),
            "{:?}",
            c.reply
        );
        assert_eq!(c.reply_header("retry-after"), None);
    }
}

#[test]
fn with_api_keys_listed_only_those_keys_are_tenants_and_made_up_keys_get_401() {
    let alice: String = crate::identity::key_digest("sk-alice")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let e = envoy(json!({"api_keys": {"alice": [alice]}, "rules": [rule(10.0, 1e6)]}));
    let c = e.send(
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-alice")],
        &chat("m", "hi", 5),
    );
    assert!(c.forwarded);
    assert_eq!(c.audit_field("tenant").as_deref(), Some("alice"));
    for k in ["sk-random-1", "sk-random-2", "sk-alice2"] {
        let c = e.send(
            "/v1/chat/completions",
            &[("authorization", &format!("Bearer {k}"))],
            &chat("m", "hi", 5),
        );
        clean(&c);
        assert_eq!(c.status(), Some(401), "{k}");
        assert!(!c.upstream_started);
        assert_eq!(
            c.audit_field("decision").as_deref(),
            Some("unknown_api_key")
        );
    }
}

#[test]
fn an_output_limit_above_the_cap_is_lowered_in_the_body_keeping_its_length() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "models": {"m": {"default_max_tokens": 100, "max_tokens_cap": 4096}},
        "rules": [rule(10.0, 1e9)]}),
    );
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":18446744073709551615}"#;
    let c = e.send("/v1/chat/completions", &[TENANT], body);
    clean(&c);
    assert!(c.forwarded);
    assert_eq!(
        c.body.len(),
        body.len(),
        "content-length kept: the body keeps its length"
    );
    let sent: Value = serde_json::from_slice(&c.body).unwrap();
    assert_eq!(sent["max_tokens"], 4096);
    assert!(c.headers.iter().any(|(k, _)| k == "content-length"));
    assert_eq!(e.metric(Metric::RequestsOutputCapped), 1);
    // Below the cap: untouched.
    let body = chat("m", "hi", 4000);
    let c = e.send("/v1/chat/completions", &[TENANT], &body);
    assert_eq!(c.body, body.as_bytes());
}

#[test]
fn an_output_limit_above_the_cap_is_refused_when_configured() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "output_above_cap": "refuse",
        "models": {"m": {"default_max_tokens": 100, "max_tokens_cap": 4096}},
        "rules": [rule(10.0, 1e9)]}),
    );
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 5000));
    clean(&c);
    assert_eq!(c.status(), Some(400));
    assert_eq!(
        c.reply_header("x-tokengate-reason"),
        Some("output_limit_too_large")
    );
    assert!(c.reply_json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("at most 4096"));
}

#[test]
fn an_anthropic_thinking_budget_is_kept_below_a_lowered_max_tokens() {
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "models": {"claude": {"default_max_tokens": 1000, "max_tokens_cap": 8000}},
        "rules": [rule(10.0, 1e9)]}),
    );
    let body = json!({"model": "claude", "max_tokens": 64000,
        "thinking": {"type": "enabled", "budget_tokens": 32000},
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let c = e.send("/v1/messages", &[TENANT], &body);
    clean(&c);
    assert!(c.forwarded);
    let sent: Value = serde_json::from_slice(&c.body).unwrap();
    assert_eq!(sent["max_tokens"], 8000);
    assert_eq!(sent["thinking"]["budget_tokens"], 7999);
    // A cap below Anthropic's minimum budget cannot fit any thinking: refused before the provider.
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "models": {"claude": {"default_max_tokens": 500, "max_tokens_cap": 1000}},
        "rules": [rule(10.0, 1e9)]}),
    );
    let c = e.send("/v1/messages", &[TENANT], &body);
    assert_eq!(c.status(), Some(400));
    assert_eq!(c.reply_json()["error"]["type"], "invalid_request_error");
    assert_eq!(
        c.reply_header("x-tokengate-reason"),
        Some("thinking_budget_does_not_fit")
    );
}

#[test]
fn a_long_unmetered_path_is_clipped_in_the_message() {
    let e = envoy(json!({"rules": [rule(10.0, 1e6)]}));
    let path = format!("/v1/{}", "é".repeat(300));
    let c = e.send(&path, &[], "{}");
    clean(&c);
    let body: serde_json::Value = serde_json::from_slice(&c.reply.unwrap().body).unwrap();
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with(&format!("POST /v1/{}", "é".repeat(196))),
        "{msg}"
    );
    assert!(!msg.contains(&"é".repeat(197)), "{msg}");
}

#[test]
fn a_background_response_is_refused_unless_configured_to_charge_its_reservation() {
    let body = |background: &str| {
        format!(
            r#"{{"model":"m","input":"hello there","max_output_tokens":50,"background":{background}}}"#
        )
    };
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(10.0, 1e6)]}),
    );
    let c = e.send("/v1/responses", &[TENANT], &body("true"));
    clean(&c);
    assert!(!c.forwarded);
    assert_eq!(c.status(), Some(400));
    let j = c.reply_json();
    assert_eq!(j["error"]["code"], "background_not_metered");
    assert_eq!(j["error"]["type"], "invalid_request_error");
    assert_eq!(
        c.reply_header("x-tokengate-reason"),
        Some("background_not_metered")
    );
    assert_eq!(c.reply_header("x-should-retry"), Some("false"));
    assert_eq!(c.reply_header("retry-after"), None);
    assert_eq!(e.metric(Metric::RequestsRejectedUnmetered), 1);
    assert_eq!(e.metric(Metric::RequestsAdmitted), 0);
    assert_eq!(
        c.audit_field("decision").as_deref(),
        Some("background_not_metered")
    );
    // Not a boolean: the body is not a Responses request.
    let c = e.send("/v1/responses", &[TENANT], &body(r#""yes""#));
    assert_eq!(c.status(), Some(400));
    assert_eq!(c.reply_json()["error"]["code"], "invalid_body");
    // false and null are the default; other APIs do not know the field.
    for (path, b) in [
        ("/v1/responses", body("false")),
        ("/v1/responses", body("null")),
        (
            "/v1/chat/completions",
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"background":true}"#.into(),
        ),
    ] {
        let mut c = e.send(path, &[TENANT], &b);
        assert!(c.forwarded, "{path} {b}");
        e.respond(&mut c, 200, &[], &["{}"]);
        clean(&c);
    }
    assert_eq!(e.metric(Metric::RequestsRejectedUnmetered), 1);
    // "reservation": admitted, charged its whole reservation (the answer, queued, has no usage).
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(10.0, 1e6)],
        "background_responses": "reservation"}),
    );
    let mut c = e.send("/v1/responses", &[TENANT], &body("true"));
    assert!(c.forwarded && c.reply.is_none());
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[r#"{"id":"resp_1","object":"response","status":"queued","usage":null}"#],
    );
    clean(&c);
    assert!(estimated(&c) > 50);
    assert_eq!(e.metric(Metric::RequestsRejectedUnmetered), 0);
    // Without an output limit the reserved one is written in (the provider cannot generate more than
    // was charged), also where output_above_cap refuses: nothing was asked above the cap.
    let e = envoy(
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(10.0, 1e6)],
        "background_responses": "reservation", "output_above_cap": "refuse",
        "models": {"m": {"default_max_tokens": 700, "max_tokens_cap": 4096}}}),
    );
    let unlimited = r#"{"model":"m","input":"hello there","background":true}"#;
    let mut c = e.send("/v1/responses", &[TENANT], unlimited);
    assert!(c.forwarded && c.reply.is_none(), "{:?}", c.reply);
    let sent: Value = serde_json::from_slice(&c.body).unwrap();
    assert_eq!(sent["max_output_tokens"], 700, "{sent}");
    assert_eq!(sent["input"], "hello there");
    e.respond(&mut c, 200, &[], &["{}"]);
    clean(&c);
    assert_eq!(e.metric(Metric::RequestsOutputCapped), 0);
    // Not in background: left to the provider's default, settled from its usage.
    let mut c = e.send(
        "/v1/responses",
        &[TENANT],
        r#"{"model":"m","input":"hello there"}"#,
    );
    assert!(c.forwarded);
    assert_eq!(c.body, br#"{"model":"m","input":"hello there"}"#);
    e.respond(&mut c, 200, &[], &["{}"]);
    let bad = crate::config::parse(
        json!({"rules": [rule(10.0, 1e6)], "background_responses": "sometimes"})
            .to_string()
            .as_bytes(),
    );
    assert!(
        bad.as_ref()
            .is_err_and(|e| e.to_string().contains("background_responses")),
        "{bad:?}"
    );
}

#[test]
fn an_absent_output_limit_is_written_in_only_when_configured() {
    let cfg = |absent: &str| {
        json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"}, "rules": [rule(10.0, 1e9)],
        "output_limit_absent": absent, "output_above_cap": "refuse",
        "models": {"m": {"default_max_tokens": 700, "max_tokens_cap": 4096}}})
    };
    let sent = |e: &FakeEnvoy, path: &str, body: &str| -> Vec<u8> {
        let mut c = e.send(path, &[TENANT], body);
        assert!(c.forwarded, "{path} {body}: {:?}", c.reply);
        let b = c.body.clone();
        e.respond(&mut c, 200, &[], &["{}"]);
        clean(&c);
        b
    };
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let e = envoy(cfg("leave"));
    assert_eq!(sent(&e, "/v1/chat/completions", chat), chat.as_bytes());
    let e = envoy(cfg("write"));
    let json = |b: Vec<u8>| serde_json::from_slice::<Value>(&b).unwrap();
    let got = json(sent(&e, "/v1/chat/completions", chat));
    // Chat: the field every OpenAI model takes (reasoning models refuse max_tokens) …
    assert_eq!(got["max_completion_tokens"], 700, "{got}");
    assert_eq!(got.get("max_tokens"), None, "{got}");
    assert_eq!(got["messages"][0]["content"], "hi");
    // … unless the body names max_tokens (null); per choice; each API's field.
    let got = json(sent(
        &e,
        "/v1/chat/completions",
        r#"{"model":"m","n":3,"messages":[{"role":"user","content":"hi"}],"max_tokens":null}"#,
    ));
    assert_eq!(got["max_tokens"], 700, "{got}");
    let got = json(sent(&e, "/v1/responses", r#"{"model":"m","input":"hi"}"#));
    assert_eq!(got["max_output_tokens"], 700, "{got}");
    let got = json(sent(
        &e,
        "/v1/completions",
        r#"{"model":"m","prompt":"hi"}"#,
    ));
    assert_eq!(got["max_tokens"], 700, "{got}");
    // A limit that is present stays; embeddings have none.
    let asked =
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":5}"#;
    assert_eq!(sent(&e, "/v1/chat/completions", asked), asked.as_bytes());
    let emb = r#"{"model":"m","input":"hi"}"#;
    assert_eq!(sent(&e, "/v1/embeddings", emb), emb.as_bytes());
    assert_eq!(e.metric(Metric::RequestsOutputCapped), 0);
    let bad = crate::config::parse(
        json!({"rules": [rule(10.0, 1e6)], "output_limit_absent": "always"})
            .to_string()
            .as_bytes(),
    );
    assert!(
        bad.as_ref()
            .is_err_and(|e| e.to_string().contains("output_limit_absent")),
        "{bad:?}"
    );
}
