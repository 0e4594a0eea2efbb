//! Tests of the harness itself: the mock provider, the HTTP client, Redis/Webdis launchers and the
//! Envoy bootstrap (run without the filter). None of them needs tokengate.wasm.

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use wasm_test::http::{self, StreamOpts};
use wasm_test::{
    mock_provider, redis_cmd, Envoy, EnvoyOpts, MockProvider, RedisServer, RespValue, Webdis,
};

fn chat_body(extra: Value) -> Value {
    let mut b = json!({"model": "gpt-test", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello to the whole world please"}]});
    if let (Some(o), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            o.insert(k.clone(), v.clone());
        }
    }
    b
}

/// "You are terse." (14) + "Say hello to the whole world please" (35) = 49 bytes -> 12 tokens.
const CHAT_PROMPT_TOKENS: u64 = 12;

#[test]
fn mock_answers_chat_completions_with_deterministic_usage() {
    let mock = mock_provider!();
    let r = http::post_json(
        mock.port,
        "/v1/chat/completions",
        &[],
        &chat_body(json!({"max_tokens": 5})),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.header("x-mock-port"),
        Some(mock.port.to_string().as_str())
    );
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "gpt-test");
    assert_eq!(v["usage"]["prompt_tokens"], CHAT_PROMPT_TOKENS);
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["usage"]["total_tokens"], CHAT_PROMPT_TOKENS + 5);
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    // Default completion is 16; the header overrides it; max_completion_tokens is honoured.
    let v = http::post_json(
        mock.port,
        "/v1/chat/completions",
        &[],
        &chat_body(json!({})),
    )
    .unwrap()
    .json();
    assert_eq!(v["usage"]["completion_tokens"], 16);
    let v = http::post_json(
        mock.port,
        "/v1/chat/completions",
        &[("x-mock-completion-tokens", "3")],
        &chat_body(json!({})),
    )
    .unwrap()
    .json();
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let v = http::post_json(
        mock.port,
        "/v1/chat/completions",
        &[("x-mock-completion-tokens", "300")],
        &chat_body(json!({"max_completion_tokens": 40})),
    )
    .unwrap()
    .json();
    assert_eq!(
        v["usage"]["completion_tokens"], 40,
        "override never exceeds the request limit"
    );
}

#[test]
fn mock_answers_every_endpoint_in_its_api_shape() {
    let mock = mock_provider!();
    let v = http::post_json(
        mock.port,
        "/v1/completions",
        &[],
        &json!({"model": "c", "prompt": "abcdefgh", "max_tokens": 2}),
    )
    .unwrap()
    .json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "c");
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(v["usage"]["completion_tokens"], 2);

    let v = http::post_json(
        mock.port,
        "/v1/embeddings",
        &[],
        &json!({"model": "e", "input": ["abcd", "efgh", "ijkl"]}),
    )
    .unwrap()
    .json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], 3);
    assert!(v["usage"].get("completion_tokens").is_none());

    let v = http::post_json(
        mock.port,
        "/v1/responses",
        &[],
        &json!({"model": "r", "input": "x".repeat(40), "max_output_tokens": 7}),
    )
    .unwrap()
    .json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["usage"]["input_tokens"], 10);
    assert_eq!(v["usage"]["output_tokens"], 7);
    assert_eq!(v["usage"]["total_tokens"], 17);

    let v = http::post_json(
        mock.port,
        "/v1/messages",
        &[("x-api-key", "k")],
        &json!({"model": "claude-x", "max_tokens": 9, "system": "abcd",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "efghijkl"}]}]}),
    )
    .unwrap()
    .json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["model"], "claude-x");
    assert_eq!(v["usage"]["input_tokens"], 3);
    assert_eq!(v["usage"]["output_tokens"], 9);

    // Prompt tokens are at least 1.
    let v = http::post_json(
        mock.port,
        "/v1/chat/completions",
        &[],
        &json!({"model": "m", "messages": []}),
    )
    .unwrap()
    .json();
    assert_eq!(v["usage"]["prompt_tokens"], 1);

    // Anything else is 200 {"ok":true,"path":…}; /healthz is {"ok":true}.
    let r = http::get(mock.port, "/healthz", &[]).unwrap();
    assert_eq!((r.status, r.json()), (200, json!({"ok": true})));
    let r = http::post(mock.port, "/other/thing?x=1", &[], b"not json").unwrap();
    assert_eq!(
        (r.status, r.json()),
        (200, json!({"ok": true, "path": "/other/thing"}))
    );

    // A non-JSON body on an LLM path is a 400 from the provider.
    let r = http::post(mock.port, "/v1/chat/completions", &[], b"nope").unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
}

#[test]
fn mock_streams_openai_sse_with_usage_and_done() {
    let mock = mock_provider!();
    let body = chat_body(
        json!({"stream": true, "max_tokens": 8, "stream_options": {"include_usage": true}}),
    );
    let s = http::post_stream(
        mock.port,
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
        &StreamOpts::default(),
    )
    .unwrap();
    assert_eq!(s.status, 200);
    assert_eq!(s.header("content-type"), Some("text/event-stream"));
    assert_eq!(s.header("transfer-encoding"), Some("chunked"));
    assert!(s.complete);
    assert!(s.pieces.len() >= 5, "several chunks: {}", s.pieces.len());
    assert!(
        s.pieces.last().unwrap().at > s.pieces[0].at,
        "chunks arrive over time"
    );
    let data = http::sse_data(&s.body());
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let usage_chunk: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["prompt_tokens"], CHAT_PROMPT_TOKENS);
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 8);
    let text: String = data[..data.len() - 2]
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(text.split_whitespace().count(), 8);

    // Without include_usage: no usage chunk.
    let body = chat_body(json!({"stream": true}));
    let s = http::post_stream(
        mock.port,
        "/v1/chat/completions",
        &[],
        body.to_string().as_bytes(),
        &StreamOpts::default(),
    )
    .unwrap();
    assert!(!s.text().contains("\"usage\""));
    assert!(s.text().ends_with("data: [DONE]\n\n"));

    // Legacy completions stream.
    let s = http::post_stream(mock.port, "/v1/completions", &[],
        json!({"model": "c", "prompt": "abcd", "stream": true, "stream_options": {"include_usage": true}}).to_string().as_bytes(),
        &StreamOpts::default()).unwrap();
    let data = http::sse_data(&s.body());
    let usage: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 16);
}

#[test]
fn mock_streams_anthropic_and_responses_events() {
    let mock = mock_provider!();
    let s = http::post_stream(mock.port, "/v1/messages", &[],
        json!({"model": "claude", "max_tokens": 6, "stream": true, "messages": [{"role": "user", "content": "abcdefgh"}]}).to_string().as_bytes(),
        &StreamOpts::default()).unwrap();
    assert!(s.complete);
    let events = http::sse_events(&s.body());
    assert_eq!(events.first().map(String::as_str), Some("message_start"));
    assert!(events.iter().any(|e| e == "content_block_delta"));
    assert_eq!(
        &events[events.len() - 2..],
        ["message_delta", "message_stop"]
    );
    let data: Vec<Value> = http::sse_data(&s.body())
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(data[0]["message"]["usage"]["input_tokens"], 2);
    assert_eq!(data[data.len() - 2]["usage"]["output_tokens"], 6);

    let s = http::post_stream(
        mock.port,
        "/v1/responses",
        &[],
        json!({"model": "r", "input": "abcdefgh", "max_output_tokens": 4, "stream": true})
            .to_string()
            .as_bytes(),
        &StreamOpts::default(),
    )
    .unwrap();
    let events = http::sse_events(&s.body());
    assert!(events.iter().any(|e| e == "response.output_text.delta"));
    assert_eq!(
        events.last().map(String::as_str),
        Some("response.completed")
    );
    let last: Value = serde_json::from_str(http::sse_data(&s.body()).last().unwrap()).unwrap();
    assert_eq!(
        last["response"]["usage"],
        json!({"input_tokens": 2, "output_tokens": 4, "total_tokens": 6})
    );
}

#[test]
fn mock_injects_status_retry_after_delay_and_served_by() {
    let mock = mock_provider!();
    let r = http::post_json(
        mock.port,
        "/v1/chat/completions",
        &[("x-mock-status", "503"), ("x-mock-id", "primary")],
        &chat_body(json!({})),
    )
    .unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["type"], "server_error");
    assert_eq!(r.header("x-mock-served-by"), Some("primary"));

    let r = http::post_json(
        mock.port,
        "/v1/chat/completions",
        &[("x-mock-status", "429"), ("x-mock-retry-after", "7")],
        &chat_body(json!({})),
    )
    .unwrap();
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("7"));
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");

    let t = Instant::now();
    let r = http::post_json(
        mock.port,
        "/v1/chat/completions",
        &[("x-mock-delay-ms", "300")],
        &chat_body(json!({})),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    assert!(t.elapsed() >= Duration::from_millis(300));

    // Timeouts are reported as errors.
    let e = http::request(
        mock.port,
        "POST",
        "/v1/chat/completions",
        &[("x-mock-delay-ms", "1500")],
        chat_body(json!({})).to_string().as_bytes(),
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert_eq!(e, "timeout");
}

#[test]
fn mock_reset_and_cut_after_break_the_connection() {
    let mock = mock_provider!();
    let e = http::post_json(
        mock.port,
        "/v1/chat/completions",
        &[("x-mock-reset", "1")],
        &chat_body(json!({})),
    )
    .unwrap_err();
    assert!(
        e == "eof" || e.contains("reset") || e.contains("closed"),
        "{e}"
    );

    let body = chat_body(json!({"stream": true, "max_tokens": 8}));
    let s = http::post_stream(
        mock.port,
        "/v1/chat/completions",
        &[("x-mock-cut-after", "2")],
        body.to_string().as_bytes(),
        &StreamOpts::default(),
    )
    .unwrap();
    assert_eq!(s.status, 200);
    assert!(!s.complete, "no terminating chunk");
    assert!(s.error.is_some());
    assert_eq!(http::sse_data(&s.body()).len(), 2);

    // Non-stream: half the body then close.
    let e = http::post_json(
        mock.port,
        "/v1/chat/completions",
        &[("x-mock-cut-after", "1")],
        &chat_body(json!({})),
    )
    .unwrap_err();
    assert!(e.contains("missing"), "{e}");
}

#[test]
fn mock_records_requests_including_chunked_bodies_and_resets() {
    let mock = mock_provider!();
    let body = chat_body(json!({})).to_string();
    http::post(
        mock.port,
        "/v1/chat/completions",
        &[("transfer-encoding", "chunked"), ("x-tenant-id", "t1")],
        body.as_bytes(),
    )
    .unwrap();
    http::get(mock.port, "/healthz", &[]).unwrap();
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].method, "POST");
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    assert_eq!(reqs[0].header("X-Tenant-Id"), Some("t1"));
    assert_eq!(reqs[0].body, body);
    assert_eq!(reqs[0].json()["model"], "gpt-test");
    assert_eq!(reqs[1].path, "/healthz");
    assert_eq!(mock.count("/chat/completions"), 1);
    mock.reset();
    assert!(mock.requests().is_empty());

    // Headers without the announced body: listed as incomplete, not as received.
    {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", mock.port)).unwrap();
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"model\"").unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while mock.incomplete_requests().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(mock.incomplete_requests().len(), 1);
    assert!(mock.requests().is_empty());
}

#[test]
fn keep_alive_client_reuses_one_connection() {
    let mock = MockProvider::start(); // locates the binary next to the test executable
    let mut c = http::Client::new(mock.port);
    for _ in 0..20 {
        let r = c
            .post(
                "/v1/chat/completions",
                &[("content-type", "application/json")],
                chat_body(json!({})).to_string().as_bytes(),
            )
            .unwrap();
        assert_eq!(r.status, 200);
    }
    assert_eq!(c.connections, 1);
    // After a server-side close the client reconnects.
    let _ = c.post("/v1/chat/completions", &[("x-mock-reset", "1")], b"{}");
    assert_eq!(c.get("/healthz", &[]).unwrap().status, 200);
}

#[test]
fn streaming_client_can_abort_mid_stream() {
    let mock = mock_provider!();
    let body = chat_body(json!({"stream": true, "max_tokens": 8})).to_string();
    let s = http::post_stream(
        mock.port,
        "/v1/chat/completions",
        &[("x-mock-chunk-delay-ms", "50")],
        body.as_bytes(),
        &StreamOpts {
            abort_after_bytes: Some(1),
            ..StreamOpts::default()
        },
    )
    .unwrap();
    assert!(s.aborted);
    assert!(!s.complete);
    assert_eq!(s.pieces.len(), 1);
}

#[test]
fn redis_and_webdis_start_and_answer() {
    let redis = RedisServer::start();
    assert_eq!(
        redis.cmd(&["SET", "k", "41"]).unwrap(),
        RespValue::Simple("OK".into())
    );
    assert_eq!(
        redis_cmd(redis.port, &["INCR", "k"]).unwrap(),
        RespValue::Int(42)
    );
    assert_eq!(redis.cmd(&["GET", "k"]).unwrap().as_int(), Some(42));
    assert_eq!(
        redis.cmd(&["GET", "missing"]).unwrap(),
        RespValue::Bulk(None)
    );
    assert!(matches!(redis.cmd(&["NOPE"]).unwrap(), RespValue::Error(_)));

    let webdis = Webdis::start(redis.port);
    let r = http::get(webdis.port, "/GET/k", &[]).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"GET": "42"}));
    let r = http::get(webdis.port, "/EVAL/return%20%7B1%2C2%7D/0", &[]).unwrap();
    assert_eq!(r.json(), json!({"EVAL": [1, 2]}));
}

#[test]
fn envoy_without_filter_proxies_routes_and_logs() {
    let mock = mock_provider!();
    let fallback = mock_provider!();
    let envoy = Envoy::start(EnvoyOpts::without_filter(mock.port).fallback(fallback.port)).unwrap();
    let r = http::post_json(
        envoy.port,
        "/v1/chat/completions",
        &[],
        &chat_body(json!({})),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-mock-port"),
        Some(mock.port.to_string().as_str())
    );
    let r = http::post_json(
        envoy.port,
        "/v1/chat/completions",
        &[("x-tokengate-route", "fallback")],
        &chat_body(json!({})),
    )
    .unwrap();
    assert_eq!(
        r.header("x-mock-port"),
        Some(fallback.port.to_string().as_str())
    );
    // Envoy forwards a chunked request body intact.
    let body = chat_body(json!({"max_tokens": 3})).to_string();
    let r = http::post(
        envoy.port,
        "/v1/chat/completions",
        &[("transfer-encoding", "chunked")],
        body.as_bytes(),
    )
    .unwrap();
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
    assert_eq!(mock.requests().last().unwrap().body, body);
    // Streams pass through chunk by chunk.
    let s = http::post_stream(
        envoy.port,
        "/v1/chat/completions",
        &[],
        chat_body(json!({"stream": true, "stream_options": {"include_usage": true}}))
            .to_string()
            .as_bytes(),
        &StreamOpts::default(),
    )
    .unwrap();
    assert!(s.complete);
    assert_eq!(
        http::sse_data(&s.body()).last().map(String::as_str),
        Some("[DONE]")
    );

    let log = envoy.wait_access_log(4, Duration::from_secs(3));
    assert!(
        log.lines()
            .any(|l| l.starts_with("200 POST /v1/chat/completions")
                && l.contains("provider_fallback")),
        "{log}"
    );
    assert!(envoy.stat("cluster.provider.upstream_rq_completed") >= 3);
    assert_eq!(envoy.stat_opt("no.such.stat"), None);
    assert!(wasm_test::prometheus_value(
        &envoy.prometheus(),
        "envoy_cluster_upstream_rq_completed"
    )
    .is_some());
    assert!(Envoy::validate(envoy.bootstrap_path()).is_ok());
    let dir = envoy.dir().to_path_buf();
    drop(envoy);
    if std::env::var_os("KEEP_TMP").is_none() {
        assert!(!dir.exists(), "temp dir removed");
    }
}

#[test]
fn envoy_start_reports_a_broken_bootstrap() {
    let mut opts = EnvoyOpts::without_filter(1);
    opts.component_log_level = "nosuchcomponent:info".into();
    let e = Envoy::start(opts).err().expect("envoy must refuse");
    assert!(e.contains("exited"), "{e}");
}
