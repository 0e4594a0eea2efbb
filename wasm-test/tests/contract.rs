//! The rest of the README's response contract through the release tokengate.wasm in a real Envoy:
//! invalid bodies, tenants, passthrough, configuration refusal and metrics.

use serde_json::json;
use sha2::Digest;
use std::thread;
use std::time::Duration;
use wasm_test::tg::{self, admitted, assert_error, assert_untouched, chat, header_u64, rule};
use wasm_test::{
    http, mock_provider, prometheus_value, render_bootstrap, Envoy, EnvoyOpts, TempDir,
};

fn default_config() -> serde_json::Value {
    tg::config(json!([rule("all", "*", "*", 1.0, 1000)]))
}

fn post_raw(envoy: &Envoy, headers: &[(&str, &str)], body: &[u8]) -> http::Response {
    let mut h = vec![("x-tenant-id", "t")];
    h.extend_from_slice(headers);
    http::post(envoy.port, tg::CHAT, &h, body).unwrap()
}

/// Lets the provider's connection threads settle before asserting on what it received.
fn settle() {
    thread::sleep(Duration::from_millis(200));
}

#[test]
fn malformed_json_gets_400() {
    let mock = mock_provider!();
    let envoy = tg::start(&mock, default_config());
    let r = post_raw(
        &envoy,
        &[("content-type", "application/json")],
        br#"{"model": "gpt-test", "messages": ["#,
    );
    assert_error(
        &r,
        400,
        "invalid_request_error",
        "invalid_body",
        "invalid_body",
    );
    // Valid JSON that is not an object is not a request either.
    let r = post_raw(&envoy, &[("content-type", "application/json")], b"[1,2,3]");
    assert_error(
        &r,
        400,
        "invalid_request_error",
        "invalid_body",
        "invalid_body",
    );
    settle();
    assert!(
        mock.requests().is_empty(),
        "the provider received {:?}",
        mock.requests()
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn non_json_body_gets_400() {
    let mock = mock_provider!();
    let envoy = tg::start(&mock, default_config());
    let r = post_raw(
        &envoy,
        &[("content-type", "text/plain")],
        b"hello, please summarise this",
    );
    assert_error(
        &r,
        400,
        "invalid_request_error",
        "invalid_body",
        "invalid_body",
    );
    // An empty body on an LLM path is not a request.
    let r = post_raw(&envoy, &[("content-type", "application/json")], b"");
    assert_error(
        &r,
        400,
        "invalid_request_error",
        "invalid_body",
        "invalid_body",
    );
    settle();
    assert!(mock.requests().is_empty());
    tg::assert_no_panic(&envoy);
}

#[test]
fn huge_body_gets_413() {
    let mock = mock_provider!();
    let mut cfg = default_config();
    cfg["max_body_bytes"] = json!(1024);
    let envoy = tg::start(&mock, cfg);
    let big = json!({"model": "gpt-test", "max_tokens": 1,
                     "messages": [{"role": "user", "content": "x".repeat(4000)}]})
    .to_string();
    let r = post_raw(
        &envoy,
        &[("content-type", "application/json")],
        big.as_bytes(),
    );
    assert_error(
        &r,
        413,
        "invalid_request_error",
        "request_too_large",
        "request_too_large",
    );
    // Same without content-length (chunked request body).
    let r = post_raw(
        &envoy,
        &[
            ("content-type", "application/json"),
            ("transfer-encoding", "chunked"),
        ],
        big.as_bytes(),
    );
    assert_error(
        &r,
        413,
        "invalid_request_error",
        "request_too_large",
        "request_too_large",
    );
    // A body under the limit still passes.
    admitted(&post_raw(
        &envoy,
        &[("content-type", "application/json")],
        &chat("gpt-test", 10),
    ));
    settle();
    assert_eq!(
        mock.requests().len(),
        1,
        "only the small request reached the provider"
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn invalid_body_charge_mode_admits_with_fixed_cost() {
    let mock = mock_provider!();
    let mut cfg = default_config();
    cfg["invalid_body"] = json!({"action": "charge", "tokens": 123});
    // Charged as the route's default model: an unreadable body names none.
    cfg["default_model"] = json!("gpt-test");
    let envoy = tg::start(&mock, cfg);
    let body = b"this is not json at all";
    let r = post_raw(&envoy, &[("content-type", "text/plain")], body);
    // Admitted: the provider answers (its own 400 for a non-JSON body), with our headers.
    assert!(
        r.header("x-mock-port").is_some(),
        "answered by the provider: {} {}",
        r.status,
        r.text()
    );
    assert_eq!(header_u64(&r, "x-tokengate-estimated-tokens"), 123);
    assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 1000);
    assert_eq!(header_u64(&r, "x-ratelimit-remaining-tokens"), 1000 - 123);
    let got = mock.requests();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].body.as_bytes(),
        body,
        "the body reaches the provider unchanged"
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn missing_tenant_gets_401_and_default_tenant_is_used_when_configured() {
    let mock = mock_provider!();
    // No tenant header, API-key tenants off, no default tenant → 401.
    let envoy = tg::start(&mock, default_config());
    let r = http::post(
        envoy.port,
        tg::CHAT,
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-ignored"),
        ],
        &chat("gpt-test", 10),
    )
    .unwrap();
    assert_error(
        &r,
        401,
        "invalid_request_error",
        "missing_tenant",
        "missing_tenant",
    );
    settle();
    assert!(mock.requests().is_empty());
    admitted(&tg::post_chat(&envoy, "known", &chat("gpt-test", 10)));
    tg::assert_no_panic(&envoy);
    drop(envoy);

    // With a default tenant, anonymous requests are admitted under that tenant's rule.
    let mut cfg = tg::config(json!([
        rule("anon", "anonymous", "*", 1.0, 1000),
        rule("rest", "*", "*", 1.0, 50_000)
    ]));
    cfg["default_tenant"] = json!("anonymous");
    let envoy = tg::start(&mock, cfg);
    let r = http::post(
        envoy.port,
        tg::CHAT,
        &[("content-type", "application/json")],
        &chat("gpt-test", 10),
    )
    .unwrap();
    admitted(&r);
    assert_eq!(
        header_u64(&r, "x-ratelimit-limit-tokens"),
        1000,
        "the default tenant's rule applies"
    );
    let r = tg::post_chat(&envoy, "someone", &chat("gpt-test", 10));
    admitted(&r);
    assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 50_000);
    tg::assert_no_panic(&envoy);
}

#[test]
fn non_llm_paths_pass_through_untouched() {
    let mock = mock_provider!();
    // No tenant is resolvable here: passthrough must not even need one.
    let envoy = tg::start(&mock, default_config());
    let r = http::get(envoy.port, "/healthz", &[]).unwrap();
    assert_eq!((r.status, r.json()), (200, json!({"ok": true})));
    assert_untouched(&r);
    // A write on a path that is not metered could spend usage: refused, unless allowed (below).
    let r = http::post(
        envoy.port,
        "/other?x=1",
        &[("content-type", "text/plain")],
        b"not json, not metered",
    )
    .unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "path_not_metered");
    assert_eq!(r.header("x-tokengate-reason"), Some("path_not_metered"));
    // OpenAI Assistants' thread messages end in `/messages` but bill nothing: not metered (no tenant
    // is needed, no 401).
    let r = http::post(
        envoy.port,
        "/v1/threads/thread_abc/messages",
        &[("content-type", "application/json")],
        br#"{"role":"user","content":"How does AI work?"}"#,
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_untouched(&r);
    // Only POST is metered: a GET on an LLM path passes too.
    let r = http::get(envoy.port, "/v1/models", &[]).unwrap();
    assert_eq!(r.status, 200);
    assert_untouched(&r);
    let r = http::get(envoy.port, tg::CHAT, &[]).unwrap();
    assert_eq!(r.status, 200);
    assert_untouched(&r);
    let got = mock.requests();
    let paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/healthz",
            "/v1/threads/thread_abc/messages",
            "/v1/models",
            tg::CHAT
        ]
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn writes_on_unmetered_paths_pass_only_where_the_operator_allows_them() {
    let mock = mock_provider!();
    let mut cfg = default_config();
    cfg["unmetered_paths"] = json!({"allow": ["/other", "*/fine_tuning/jobs"]});
    let envoy = tg::start(&mock, cfg);
    // The operator's patterns, and built-in free endpoints (a file upload, a thread created empty).
    for path in [
        "/other?x=1",
        "/org/v1/fine_tuning/jobs",
        "/v1/files",
        "/v1/threads",
    ] {
        let r = http::post(envoy.port, path, &[], b"not json, not metered").unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_untouched(&r);
    }
    // Anthropic's batches and legacy completions: refused in Anthropic's shape.
    for path in ["/v1/messages/batches", "/v1/complete"] {
        let r = http::post(envoy.port, path, &[], b"{}").unwrap();
        assert_eq!(r.status, 403, "{path}");
        let body = r.json();
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], "permission_error", "{body}");
        assert_eq!(body["error"]["details"]["error_code"], "path_not_metered");
        assert!(r.header("request-id").is_some());
    }
    let got: Vec<String> = mock.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(
        got,
        [
            "/other?x=1",
            "/org/v1/fine_tuning/jobs",
            "/v1/files",
            "/v1/threads"
        ]
    );
    let refused = envoy
        .stats()
        .get("wasmcustom.tokengate_requests_rejected_unmetered")
        .copied();
    assert_eq!(refused, Some(2));
    // `writes: pass` restores passing everything, uncharged.
    let mut cfg = default_config();
    cfg["unmetered_paths"] = json!({"writes": "pass"});
    let envoy = tg::start(&mock, cfg);
    let r = http::post(envoy.port, "/v1/batches", &[], b"{}").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_untouched(&r);
    tg::assert_no_panic(&envoy);
}

#[test]
fn other_spellings_of_an_llm_path_are_metered_too() {
    // A trailing slash, doubled slashes or an escaped slash must not slip past the meter: each is
    // refused by the filter itself (413: the estimate exceeds this rule's burst of 10), never sent on.
    let mock = mock_provider!();
    let envoy = tg::start(&mock, tg::config(json!([rule("tiny", "*", "*", 1.0, 10)])));
    for path in [
        "/v1/chat/completions/",
        "/v1/chat/completions/?x=1",
        "//v1//chat/completions",
        "/v1/chat%2Fcompletions",
        "/v1/chat%2fcompletions",
        "/v1/Chat/Completions",
        "/v1/chat/completions;x=1",
        "/v1/chat;a=b/completions",
    ] {
        let r = http::post(
            envoy.port,
            path,
            &[("x-tenant-id", "t"), ("content-type", "application/json")],
            &chat("gpt-test", 100),
        )
        .unwrap();
        assert_eq!(r.status, 413, "{path}: {}", r.text());
        assert_error(
            &r,
            413,
            "invalid_request_error",
            "cost_exceeds_burst",
            "cost_exceeds_burst",
        );
    }
    settle();
    assert!(mock.requests().is_empty(), "nothing reached the provider");
    tg::assert_no_panic(&envoy);
}

#[test]
fn bad_config_is_refused_at_load() {
    let mock = mock_provider!();
    let good_rule = rule("all", "*", "*", 1.0, 1000);
    let cases = [
        (
            "bogus_option",
            json!({"rules": [good_rule.clone()], "bogus_option": true}),
        ),
        (
            "tokens_per_second",
            json!({"rules": [rule("neg", "*", "*", -5.0, 1000)]}),
        ),
        ("rules", json!({"rules": []})),
    ];
    for (field, cfg) in &cases {
        let log = Envoy::start_expect_failure(EnvoyOpts::new(mock.port, cfg.clone()));
        let naming: Vec<&str> = log.lines().filter(|l| l.contains(field)).collect();
        assert!(
            !naming.is_empty(),
            "no log line names {field:?} for {cfg}:\n{log}"
        );
        println!("{field}: {}", naming[0]);
    }
    // `envoy --mode validate` runs on_configure too, so it catches the same mistake.
    let dir = TempDir::new("validate");
    let boot = render_bootstrap(&EnvoyOpts::new(mock.port, cases[0].1.clone()), dir.path());
    let err = Envoy::validate(&boot.path).expect_err("validate must refuse an unknown field");
    assert!(err.contains("bogus_option"), "{err}");
    let boot = render_bootstrap(&EnvoyOpts::new(mock.port, default_config()), dir.path());
    Envoy::validate(&boot.path).unwrap_or_else(|e| panic!("a good config validates: {e}"));
}

#[test]
fn metrics_are_visible_in_prometheus() {
    let mock = mock_provider!();
    let envoy = tg::start(&mock, default_config());
    let cost = admitted(&tg::post_chat(&envoy, "t", &chat("gpt-test", 600)));
    assert_eq!(
        tg::post_chat(&envoy, "t", &chat("gpt-test", 600)).status,
        429
    );
    assert_eq!(http::get(envoy.port, "/healthz", &[]).unwrap().status, 200);
    assert_eq!(post_raw(&envoy, &[], b"not json").status, 400);
    let r = http::post(envoy.port, tg::CHAT, &[], &chat("gpt-test", 10)).unwrap();
    assert_eq!(r.status, 401);

    envoy.wait_stat(
        "tokengate_requests_rejected_no_tenant",
        1,
        Duration::from_secs(3),
    );
    let prom = envoy.prometheus();
    let value = |name: &str| {
        prometheus_value(&prom, name).unwrap_or_else(|| {
            let ours: Vec<&str> = prom.lines().filter(|l| l.contains("tokengate")).collect();
            panic!(
                "{name} missing from /stats/prometheus; tokengate lines:\n{}",
                ours.join("\n")
            )
        })
    };
    for name in tg::COUNTERS {
        value(name);
    }
    assert_eq!(value("tokengate_requests_admitted"), 1);
    assert_eq!(value("tokengate_requests_limited_tokens"), 1);
    assert_eq!(value("tokengate_requests_limited_requests"), 0);
    assert_eq!(value("tokengate_requests_rejected_invalid_body"), 1);
    assert_eq!(value("tokengate_requests_rejected_no_tenant"), 1);
    assert_eq!(value("tokengate_requests_rejected_too_large"), 0);
    assert!(value("tokengate_requests_passthrough") >= 1);
    assert!(
        value("tokengate_tokens_estimated") >= cost,
        "tokens_estimated counts at least the admitted cost {cost}"
    );
    assert_eq!(value("tokengate_cas_exhausted"), 0);
    assert_eq!(value("tokengate_state_corrupt"), 0);
    // Same numbers in /stats under wasmcustom.
    assert_eq!(
        envoy.stat_opt("wasmcustom.tokengate_requests_admitted"),
        Some(1)
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_client_model_name_cannot_forge_access_log_fields_or_lines() {
    let mock = mock_provider!();
    let envoy = tg::start(&mock, default_config());
    let body = json!({"model": "evil tenant=admin decision=limited\nFAKE LINE", "max_tokens": 1,
                      "messages": [{"role": "user", "content": "hi"}]});
    let r = tg::post_chat(&envoy, "t", body.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let log = envoy.wait_access_log(1, Duration::from_secs(5));
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 1, "one request, one line:\n{log}");
    let line = lines[0];
    assert!(line.contains("tenant=t "), "{line}");
    assert!(
        line.contains("model=evil%20tenant%3Dadmin%20decision%3Dlimited%0AFAKE%20LINE "),
        "{line}"
    );
    assert_eq!(line.matches("tenant=").count(), 1, "{line}");
    assert_eq!(line.matches("decision=").count(), 1, "{line}");
    tg::assert_no_panic(&envoy);
}

#[test]
fn colons_in_tenants_and_models_never_share_a_bucket() {
    let mock = mock_provider!();
    let burst = 100_000u64;
    let envoy = tg::start(
        &mock,
        tg::config(json!([rule("all", "*", "*", 1.0, burst)])),
    );
    let a = tg::post_chat(&envoy, "acme:dev", &chat("m", 1000));
    let cost_a = admitted(&a);
    assert_eq!(
        header_u64(&a, "x-ratelimit-remaining-tokens"),
        burst - cost_a
    );
    // Tenant `acme` with model `dev:m` spells the same `acme:dev:m`, but is another bucket.
    let b = tg::post_chat(&envoy, "acme", &chat("dev:m", 1000));
    let cost_b = admitted(&b);
    assert_eq!(
        header_u64(&b, "x-ratelimit-remaining-tokens"),
        burst - cost_b
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_body_without_a_model_is_charged_as_the_default_model_never_the_model_header() {
    // Before: the model header picked the model (and its limits) of a body without one, and with
    // neither the request passed every model-scoped limit as no model at all.
    let mock = mock_provider!();
    let cfg = tg::merge(
        tg::config(json!([rule("all", "*", "*", 1.0, 1_000_000)])),
        json!({"models": {"big-model": {"default_max_tokens": 4096}, "small-model": {"default_max_tokens": 200}}}),
    );
    let envoy = tg::start(&mock, cfg.clone());
    let body = br#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let r = post_raw(
        &envoy,
        &[
            ("content-type", "application/json"),
            ("x-tokengate-model", "big-model"),
        ],
        body,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.header("x-tokengate-reason"), Some("model_required"));
    assert_eq!(mock.requests().len(), 0);
    drop(envoy);
    // With a default model it is charged as that model, whatever the header says.
    let envoy = tg::start(
        &mock,
        tg::merge(cfg, json!({"default_model": "small-model"})),
    );
    let r = post_raw(
        &envoy,
        &[
            ("content-type", "application/json"),
            ("x-tokengate-model", "big-model"),
        ],
        body,
    );
    let est = admitted(&r);
    assert!(
        (200..300).contains(&est),
        "200 reserved for small-model: {est}"
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_body_phase_429_says_what_the_request_would_have_cost() {
    let mock = mock_provider!();
    let envoy = tg::start(&mock, tg::config(json!([rule("all", "*", "*", 1.0, 1000)])));
    let a = tg::post_chat(&envoy, "t", &chat("gpt-test", 900));
    admitted(&a);
    let b = tg::post_chat(&envoy, "t", &chat("gpt-test", 900));
    let ours = assert_error(
        &b,
        429,
        "tokens",
        "rate_limit_exceeded",
        "tokens_per_second_exceeded",
    );
    let est = header_u64(&b, "x-tokengate-estimated-tokens");
    assert!((900..1000).contains(&est), "{est}");
    assert_eq!(ours["estimated_tokens"], est, "the body says it too");
    assert_eq!(ours["limit"], "all", "the binding rule is named");
    tg::assert_no_panic(&envoy);
}

#[test]
fn a_client_cannot_name_a_key_tenant_in_the_tenant_header() {
    // Tenants from API keys are `key:<16 hex of SHA-256(key)>`. With a tenant header that nothing
    // strips (the test config), a client could name another key's tenant and spend its bucket:
    // refused with 403 forbidden_tenant, which no retry fixes.
    let mock = mock_provider!();
    let burst = 10_000;
    let mut cfg = tg::config(json!([rule("all", "*", "*", 1.0, burst)]));
    cfg["api_key_tenants"] = json!(true);
    let envoy = tg::start(&mock, cfg);
    let digest = sha2::Sha256::digest(b"sk-bob");
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let bob = format!("key:{}", &hex[..16]);
    for (auth, tenant) in [
        ("Bearer sk-mallory", bob.clone()),
        ("Bearer sk-mallory", bob.to_uppercase()),
        ("", bob.clone()),
    ] {
        let mut h = vec![
            ("x-tenant-id", tenant.as_str()),
            ("content-type", "application/json"),
        ];
        if !auth.is_empty() {
            h.push(("authorization", auth));
        }
        let r = http::post(envoy.port, tg::CHAT, &h, &chat("gpt-test", 1000)).unwrap();
        assert_error(
            &r,
            403,
            "invalid_request_error",
            "forbidden_tenant",
            "forbidden_tenant",
        );
    }
    settle();
    assert!(mock.requests().is_empty(), "nothing reached the provider");
    // Bob's bucket is untouched: his own first request finds it full.
    let r = http::post(
        envoy.port,
        tg::CHAT,
        &[
            ("authorization", "Bearer sk-bob"),
            ("content-type", "application/json"),
        ],
        &chat("gpt-test", 1000),
    )
    .unwrap();
    let cost = admitted(&r);
    assert_eq!(header_u64(&r, "x-ratelimit-remaining-tokens"), burst - cost);
    tg::assert_no_panic(&envoy);
}

#[test]
fn anthropic_clients_get_anthropics_error_shape_and_headers() {
    let mock = mock_provider!();
    let burst = 1000;
    let envoy = tg::start(
        &mock,
        tg::config(json!([rule("all", "*", "*", 1.0, burst)])),
    );
    let messages = |tenant: Option<&str>, body: &[u8]| {
        let mut h = vec![("content-type", "application/json")];
        if let Some(t) = tenant {
            h.push(("x-tenant-id", t));
        }
        http::post(envoy.port, "/v1/messages", &h, body).unwrap()
    };
    let body = |max_tokens: u64| {
        json!({"model": "claude-test", "max_tokens": max_tokens,
               "messages": [{"role": "user", "content": "Write one short sentence about rivers."}]})
        .to_string()
        .into_bytes()
    };
    let first = messages(Some("a"), &body(600));
    admitted(&first);
    let r = messages(Some("a"), &body(600));
    let ours =
        tg::assert_anthropic_error(&r, 429, "rate_limit_error", "tokens_per_second_exceeded");
    assert!(ours["retry_after"].as_f64().unwrap_or(0.0) > 1.0, "{ours}");
    assert_eq!(header_u64(&r, "anthropic-ratelimit-tokens-limit"), burst);
    header_u64(&r, "anthropic-ratelimit-tokens-remaining");
    let reset = r.header("anthropic-ratelimit-tokens-reset").unwrap_or("");
    assert!(tg::is_rfc3339(reset), "{reset:?}");
    assert!(
        r.headers_with_prefix("x-ratelimit-").is_empty() && r.header("x-request-id").is_none(),
        "no OpenAI names on Anthropic's path: {:?}",
        r.headers
    );
    tg::assert_anthropic_error(
        &messages(Some("a"), b"{not json"),
        400,
        "invalid_request_error",
        "invalid_body",
    );
    tg::assert_anthropic_error(
        &messages(None, &body(10)),
        401,
        "authentication_error",
        "missing_tenant",
    );
    settle();
    assert_eq!(
        mock.requests().len(),
        1,
        "only the first reached the provider"
    );
    tg::assert_no_panic(&envoy);
}

#[test]
fn an_absent_output_limit_reaches_the_provider_written_in_only_when_configured() {
    // `output_limit_absent: "write"`: the reserved limit is written into a body without one (Envoy
    // sends the longer body chunked), so the provider cannot generate more than was reserved.
    let mock = mock_provider!();
    let body = br#"{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}"#;
    for (absent, want) in [("leave", None), ("write", Some(1024))] {
        let cfg = tg::merge(
            tg::config(json!([rule("all", "*", "*", 1.0, 1_000_000)])),
            json!({"output_limit_absent": absent}),
        );
        let envoy = tg::start(&mock, cfg);
        let r = post_raw(&envoy, &[("content-type", "application/json")], body);
        let est = admitted(&r);
        assert!((1024..1100).contains(&est), "{est}");
        settle();
        let sent = mock
            .requests()
            .into_iter()
            .next_back()
            .expect("the provider got it");
        assert_eq!(
            sent.json()["max_completion_tokens"].as_u64(),
            want,
            "{absent}: {}",
            sent.body
        );
        assert_eq!(sent.json()["messages"][0]["content"], "hi");
        tg::assert_no_panic(&envoy);
    }
}
