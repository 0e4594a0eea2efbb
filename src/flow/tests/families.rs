//! Azure OpenAI, Gemini / Vertex AI and Bedrock through the whole flow: each answer — whole, streamed
//! in the family's framing (Gemini SSE or JSON array, Bedrock's AWS event stream) — settles from the
//! family's own usage; output limits are clamped and written in the family's field; a model the path
//! names never falls back through the body.

use super::*;
use crate::usage::eventstream::encode;

fn quota_cfg(extra: Value) -> Value {
    let mut q = json!({"cluster": "webdis", "monthly_limit": 100000});
    if let (Some(q), Some(x)) = (q.as_object_mut(), extra.as_object()) {
        for (k, v) in x {
            q.insert(k.clone(), v.clone());
        }
    }
    json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
           "rules": [rule(1000.0, 1e6)], "quota": q})
}

const GEMINI: &str = "/v1beta/models/gemini-2.5-flash:generateContent";
const GEMINI_SSE: &str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse";
const GEMINI_ARRAY: &str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent";
const CONVERSE: &str = "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse";
const CONVERSE_STREAM: &str = "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse-stream";
const INVOKE: &str = "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/invoke";
const EVENTSTREAM: (&str, &str) = ("content-type", "application/vnd.amazon.eventstream");

fn gemini_body(max: Option<u64>) -> String {
    let mut v = json!({"contents": [{"role": "user", "parts": [{"text": "hello there"}]}]});
    if let Some(m) = max {
        v["generationConfig"] = json!({"temperature": 0.5, "maxOutputTokens": m});
    }
    v.to_string()
}

fn converse_body(max: Option<u64>) -> String {
    let mut v = json!({"messages": [{"role": "user", "content": [{"text": "hello there"}]}]});
    if let Some(m) = max {
        v["inferenceConfig"] = json!({"maxTokens": m});
    }
    v.to_string()
}

/// Sends a request and admits its reservation in full.
fn admitted(e: &FakeEnvoy, path: &str, body: &str) -> Call {
    let mut c = e.send(path, &[TENANT], body);
    clean(&c);
    assert!(c.pending.is_some(), "a reservation callout");
    e.reply(&mut c, 200, &reserved(500, 100000));
    assert!(c.forwarded, "{:?}", c.reply_json());
    c
}

/// The settled actual and where it came from (the audit record).
fn settled_as(c: &Call) -> (u64, String) {
    (
        c.audit_field("actual")
            .and_then(|a| a.parse().ok())
            .expect("settled"),
        c.audit_field("usage_source").unwrap_or_default(),
    )
}

/// The response's chunks, headers first, then each chunk as Envoy would hand them over.
fn stream(e: &FakeEnvoy, c: &mut Call, headers: &[(&str, &str)], chunks: &[Vec<u8>]) {
    e.respond_partly(c, 200, headers, &[], false);
    for (i, ch) in chunks.iter().enumerate() {
        e.chunk(c, ch, i + 1 == chunks.len());
    }
    e.end(c);
}

/// `bytes` cut into pieces of `n` bytes (an event split across chunks).
fn pieces(bytes: &[u8], n: usize) -> Vec<Vec<u8>> {
    bytes.chunks(n).map(<[u8]>::to_vec).collect()
}

#[test]
fn a_gemini_answer_settles_from_usage_metadata_with_thinking_and_tool_tokens() {
    let e = envoy(quota_cfg(json!({})));
    let mut c = admitted(&e, GEMINI, &gemini_body(Some(100)));
    let answer = json!({"candidates": [{"content": {"parts": [{"text": "hi"}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 11, "toolUsePromptTokenCount": 4,
                          "cachedContentTokenCount": 3, "candidatesTokenCount": 7,
                          "thoughtsTokenCount": 20, "totalTokenCount": 42}});
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[&answer.to_string()],
    );
    clean(&c);
    assert_eq!(settled_as(&c), (42, "provider".into()));
}

#[test]
fn a_gemini_sse_stream_settles_from_its_last_chunk_and_passes_unchanged() {
    let e = envoy(quota_cfg(json!({})));
    let mut c = admitted(&e, GEMINI_SSE, &gemini_body(Some(100)));
    let chunk = |text: &str, out: u64, finish: bool| {
        let mut cand = json!({"content": {"parts": [{"text": text}], "role": "model"}});
        if finish {
            cand["finishReason"] = json!("MAX_TOKENS");
        }
        let v = json!({"candidates": [cand],
            "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": out,
                              "totalTokenCount": 9 + out}});
        format!("data: {v}\r\n\r\n")
    };
    let body = [
        chunk("a b", 2, false),
        chunk("c d", 4, false),
        chunk("e", 5, true),
    ]
    .concat();
    stream(
        &e,
        &mut c,
        &[
            ("content-type", "text/event-stream"),
            ("content-length", "1"),
        ],
        &pieces(body.as_bytes(), 7),
    );
    clean(&c);
    assert_eq!(settled_as(&c), (14, "provider".into()));
    assert_eq!(c.client_body, body.as_bytes(), "forwarded byte for byte");
    assert!(
        c.header("content-length").is_some(),
        "a stream that is not rewritten keeps its length"
    );
}

#[test]
fn a_gemini_stream_without_alt_sse_is_read_as_its_json_array() {
    let e = envoy(quota_cfg(json!({})));
    let mut c = admitted(&e, GEMINI_ARRAY, &gemini_body(Some(100)));
    let el = |out: u64, finish: bool| {
        let mut cand = json!({"content": {"parts": [{"text": "x"}]}});
        if finish {
            cand["finishReason"] = json!("STOP");
        }
        json!({"candidates": [cand], "usageMetadata": {"promptTokenCount": 9,
               "candidatesTokenCount": out, "totalTokenCount": 9 + out}})
        .to_string()
    };
    let body = format!("[{},\r\n{}]", el(3, false), el(6, true));
    stream(
        &e,
        &mut c,
        &[("content-type", "application/json; charset=UTF-8")],
        &pieces(body.as_bytes(), 5),
    );
    assert_eq!(settled_as(&c), (15, "provider".into()));
}

#[test]
fn a_converse_answer_settles_from_its_usage_with_the_cache_counted_in_the_prompt() {
    let e = envoy(quota_cfg(json!({})));
    let mut c = admitted(&e, CONVERSE, &converse_body(Some(100)));
    let answer = json!({"output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 5, "outputTokens": 8, "cacheReadInputTokens": 10,
                  "totalTokens": 23}});
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[&answer.to_string()],
    );
    assert_eq!(settled_as(&c), (23, "provider".into()));
}

fn converse_events(out: u64) -> Vec<u8> {
    let ev = |t: &str, p: Value| {
        encode(
            &[
                (":event-type", t),
                (":content-type", "application/json"),
                (":message-type", "event"),
            ],
            p.to_string().as_bytes(),
        )
    };
    [
        ev("messageStart", json!({"role": "assistant"})),
        ev(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"text": "hello world"}}),
        ),
        ev("contentBlockStop", json!({"contentBlockIndex": 0})),
        ev("messageStop", json!({"stopReason": "end_turn"})),
        ev(
            "metadata",
            json!({"usage": {"inputTokens": 6, "outputTokens": out, "totalTokens": 6 + out},
                   "metrics": {"latencyMs": 5}}),
        ),
    ]
    .concat()
}

#[test]
fn a_converse_stream_settles_from_its_metadata_event_over_any_split_of_the_frames() {
    for size in [1, 13, 64, 4096] {
        let e = envoy(quota_cfg(json!({})));
        let mut c = admitted(&e, CONVERSE_STREAM, &converse_body(Some(100)));
        let body = converse_events(9);
        stream(&e, &mut c, &[EVENTSTREAM], &pieces(&body, size));
        clean(&c);
        assert_eq!(settled_as(&c), (15, "provider".into()), "chunks of {size}");
        assert_eq!(c.client_body, body, "forwarded unchanged");
    }
}

#[test]
fn an_event_stream_that_fails_its_crc_is_never_trusted_for_usage() {
    let e = envoy(quota_cfg(json!({})));
    let mut c = admitted(&e, CONVERSE_STREAM, &converse_body(Some(100)));
    let mut body = converse_events(9);
    // The last byte is the metadata message's CRC: the usage it carries is not read.
    if let Some(b) = body.last_mut() {
        *b ^= 0xff;
    }
    stream(&e, &mut c, &[EVENTSTREAM], &pieces(&body, 50));
    clean(&c);
    let (actual, source) = settled_as(&c);
    assert_ne!(source, "provider", "usage from a broken frame: {actual}");
    assert_ne!(actual, 15);
    assert_eq!(c.client_body, body, "the client still gets every byte");
}

#[test]
fn a_bedrock_invoke_answer_settles_from_bedrocks_token_count_headers() {
    let e = envoy(quota_cfg(json!({})));
    let body = json!({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 100,
                      "messages": [{"role": "user", "content": "hello"}]})
    .to_string();
    let mut c = admitted(&e, INVOKE, &body);
    // The body's own usage says otherwise: Bedrock's headers win.
    let answer = json!({"content": [{"type": "text", "text": "hi"}],
                        "usage": {"input_tokens": 1, "output_tokens": 1}});
    e.respond(
        &mut c,
        200,
        &[
            ("content-type", "application/json"),
            ("x-amzn-bedrock-input-token-count", "12"),
            ("x-amzn-bedrock-output-token-count", "30"),
        ],
        &[&answer.to_string()],
    );
    assert_eq!(settled_as(&c), (42, "provider".into()));
    // Without the headers, the model body's usage.
    let mut c = admitted(&e, INVOKE, &body);
    e.respond(
        &mut c,
        200,
        &[("content-type", "application/json")],
        &[&answer.to_string()],
    );
    assert_eq!(settled_as(&c), (2, "provider".into()));
}

#[test]
fn a_quota_clamp_lowers_each_familys_own_output_field() {
    // Granted 40 of output cost (unit weights).
    let grant = eval(&[1, 99990, 100000, 0, -1, 0, 40, 3]);
    let e = envoy(quota_cfg(json!({"clamp_output": true})));
    let cases: [(&str, String, &str); 4] = [
        (
            GEMINI,
            gemini_body(Some(1000)),
            "/generationConfig/maxOutputTokens",
        ),
        (
            CONVERSE,
            converse_body(Some(1000)),
            "/inferenceConfig/maxTokens",
        ),
        (
            INVOKE,
            json!({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 1000,
                   "messages": [{"role": "user", "content": "hello"}]})
            .to_string(),
            "/max_tokens",
        ),
        (
            "/openai/deployments/dep/chat/completions?api-version=2024-10-21",
            json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 1000})
                .to_string(),
            "/max_tokens",
        ),
    ];
    for (path, body, field) in cases {
        let mut c = e.send(path, &[TENANT], &body);
        e.reply(&mut c, 200, &grant);
        clean(&c);
        assert!(c.forwarded, "{path}: {:?}", c.reply_json());
        let sent: Value = serde_json::from_slice(&c.body).unwrap();
        assert_eq!(sent.pointer(field), Some(&json!(40)), "{path}: {sent}");
        // Every other byte as the client sent it.
        let want = body.replace("1000", "40");
        assert_eq!(String::from_utf8_lossy(&c.body), want, "{path}");
    }
}

#[test]
fn an_absent_limit_is_written_where_each_family_reads_it() {
    let cfg = json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "rules": [rule(1000.0, 1e6)], "output_limit_absent": "write",
        "default_output": {"default_max_tokens": 300, "max_tokens_cap": 4000}});
    let e = envoy(cfg);
    let plain = json!({"contents": [{"parts": [{"text": "hi"}]}]}).to_string();
    let with_config =
        json!({"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"temperature": 1}})
            .to_string();
    let null_config =
        json!({"contents": [{"parts": [{"text": "hi"}]}], "generation_config": null}).to_string();
    for (path, body, want) in [
        (
            GEMINI,
            plain.clone(),
            format!(
                "{},\"generationConfig\":{{\"maxOutputTokens\":300}}}}",
                &plain[..plain.len() - 1]
            ),
        ),
        (
            GEMINI,
            with_config.clone(),
            with_config.replace(
                "\"temperature\":1}",
                "\"temperature\":1,\"maxOutputTokens\":300}",
            ),
        ),
        (
            GEMINI,
            null_config.clone(),
            null_config.replace("null", "{\"maxOutputTokens\":300}"),
        ),
        (
            CONVERSE,
            converse_body(None),
            format!(
                "{},\"inferenceConfig\":{{\"maxTokens\":300}}}}",
                &converse_body(None)[..converse_body(None).len() - 1]
            ),
        ),
    ] {
        let c = e.send(path, &[TENANT], &body);
        clean(&c);
        assert!(c.forwarded, "{path}: {:?}", c.reply_json());
        assert_eq!(String::from_utf8_lossy(&c.body), want, "{path}");
        assert!(!c.headers.iter().any(|(k, _)| k == "content-length"));
    }
}

#[test]
fn a_model_the_path_names_never_falls_back_through_the_body() {
    let cfg = json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "rules": [rule(1000.0, 1e6)],
        "breaker": {"keys": ["model"], "failure_threshold": 5, "model_fallbacks": {
            "anthropic.claude-3-5-haiku-20241022-v1:0": "amazon.nova-lite-v1:0",
            "gpt-4o": "gpt-4o-mini"}},
        "azure_openai": {"deployments": {"prod": "gpt-4o"}}});
    let e = envoy(cfg);
    for _ in 0..5 {
        let mut c = e.send(CONVERSE, &[TENANT], &converse_body(Some(5)));
        assert!(c.forwarded);
        e.respond(&mut c, 500, &[], &["{}"]);
    }
    let c = e.send(CONVERSE, &[TENANT], &converse_body(Some(5)));
    clean(&c);
    assert_eq!(c.status(), Some(503), "refused, not sent to the fallback");
    assert_eq!(
        c.reply_header("x-amzn-errortype"),
        Some("ServiceUnavailableException")
    );
    assert_eq!(c.reply_header("x-tokengate-reason"), Some("circuit_open"));
    assert!(c.reply_header("x-amz-retry-after").is_some());
    // Azure: a deployment in the path, and on v1 a listed deployment in the body, likewise.
    for _ in 0..5 {
        let mut c = e.send(
            "/openai/deployments/prod/chat/completions",
            &[TENANT],
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}).to_string(),
        );
        assert!(c.forwarded);
        e.respond(&mut c, 500, &[], &["{}"]);
    }
    let c = e.send(
        "/openai/deployments/prod/chat/completions",
        &[TENANT],
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}).to_string(),
    );
    assert_eq!(c.status(), Some(503));
    assert_eq!(c.reply_json()["error"]["code"], "circuit_open");
    let c = e.send(
        "/openai/v1/chat/completions",
        &[TENANT],
        &chat("prod", "hi", 5),
    );
    assert_eq!(c.status(), Some(503), "a deployment name in a v1 body");
    // A model the body names still falls back on OpenAI's paths.
    let c = e.send("/v1/chat/completions", &[TENANT], &chat("gpt-4o", "hi", 5));
    assert!(c.forwarded);
    let sent: Value = serde_json::from_slice(&c.body).unwrap();
    assert_eq!(sent["model"], "gpt-4o-mini");
}

#[test]
fn the_breaker_judges_a_family_stream_by_how_its_framing_ends() {
    let cfg = json!({"tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the test"},
        "rules": [rule(1000.0, 1e6)],
        "breaker": {"keys": ["model"], "count_incomplete_streams": true,
                    "failure_threshold": 2, "window_ms": 60000}});
    let e = envoy(cfg);
    // Whole streams: successes.
    for _ in 0..3 {
        let mut c = e.send(CONVERSE_STREAM, &[TENANT], &converse_body(Some(5)));
        stream(&e, &mut c, &[EVENTSTREAM], &pieces(&converse_events(3), 40));
    }
    assert!(!e.logged("closed -> open"));
    // Streams without their `metadata` event (cut): failures that open it.
    let body = converse_events(3);
    let cut = &body[..body.len() - 60];
    for _ in 0..2 {
        let mut c = e.send(CONVERSE_STREAM, &[TENANT], &converse_body(Some(5)));
        stream(&e, &mut c, &[EVENTSTREAM], &pieces(cut, 40));
    }
    assert!(e.logged("closed -> open"), "{:?}", e.logs.borrow());
}
