//! Fuzz-style robustness: every parser of untrusted bytes gets tens of thousands of mutated and random
//! inputs from a deterministic generator and must return (Ok or Err) without panicking. A panic in the
//! wasm build kills the worker's VM, so "never panic" is checked here for each entry point the host feeds
//! with request, response, callout or shared-data bytes.

use tokengate::breaker::{BreakerState, OpenSet};
use tokengate::estimate::{self, ApiKind, OutputLimits};
use tokengate::limits::bucket::BucketState;
use tokengate::quota::{self, ExhaustedMarker};
use tokengate::rewrite::{self, Edits};
use tokengate::store::Codec;
use tokengate::usage::{self, SseScanner};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "\\u0000",
    "\\ud800",
    "null",
    "true",
    "-1",
    "1e308",
    "18446744073709551616",
    "\"model\"",
    "\"messages\"",
    "\"content\"",
    "\"role\"",
    "\"max_tokens\"",
    "\"stream\"",
    "\"usage\"",
    "\"prompt_tokens\"",
    "\"choices\"",
    "data: ",
    "\n\n",
    "\r\n",
    "[DONE]",
    "event: message_stop",
    "ไทย",
    "日本語",
    "\u{0}",
    "\u{FFFF}",
    "😀",
    "{\"EVAL\":",
    "[false,\"ERR x\"]",
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(6) {
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v.remove(i);
            }
            1 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.next() as u8);
            }
            2 => {
                let i = rng.below(v.len() + 1);
                let t = TOKENS[rng.below(TOKENS.len())].as_bytes();
                v.splice(i..i, t.iter().copied());
            }
            3 if !v.is_empty() => {
                let a = rng.below(v.len());
                let b = a + rng.below(v.len() - a);
                v.truncate(b.max(a));
            }
            4 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            _ => {
                let n = rng.below(64);
                v.extend((0..n).map(|_| rng.next() as u8));
            }
        }
    }
    v
}

const REQUESTS: &[&str] = &[
    r#"{"model":"gpt-4.1","messages":[{"role":"user","content":"hello"}],"max_tokens":20}"#,
    r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"n":3,"stream":true,"stream_options":{"include_usage":true}}"#,
    r#"{"model":"text","prompt":["a","b"],"max_tokens":5}"#,
    r#"{"model":"e","input":[[1,2,3],[4]]}"#,
    r#"{"model":"r","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]}],"instructions":"be brief","max_output_tokens":9}"#,
    r#"{"model":"claude","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","content":"r"}]}],"max_tokens":100}"#,
    // Long strings with escapes every few bytes (code, JSON-in-a-string), read a window at a time.
    r#"{"messages":[{"role":"user","content":"fn main() {\n    let s = \"a\\\\b\";\n\tprintln!(\"{}\", s); // caf\u00e9 \ud83d\ude00 \/\/ done\r\n}\n{\"quota\": {\"fallback\": [1116, 2868, {\"humidity\": -30.1289}]}, \"city\": \"weather\"}\n"}],"max_tokens":64}"#,
    r#"{"prompt":"SELECT id, name FROM users WHERE name = 'O\u0027Brien' AND note LIKE '%\\%%';\n-- ok\n\u4e2d\u6587 TEXT with ALLCAPS and camelCase and 1234567 digits, spaces    and\ttabs\u000b\f\b end","suffix":"x"}"#,
];

#[test]
fn estimator_never_panics_on_mutated_or_random_bodies() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let limits = |_: Option<&str>| OutputLimits {
        default_tokens: 100,
        cap_tokens: 1000,
    };
    let kinds = [
        ApiKind::ChatCompletions,
        ApiKind::Completions,
        ApiKind::Embeddings,
        ApiKind::Responses,
        ApiKind::AnthropicMessages,
    ];
    for i in 0..20_000 {
        let seed = REQUESTS[i % REQUESTS.len()].as_bytes();
        let body = mutate(&mut rng, seed);
        let _ = estimate::estimate(kinds[i % kinds.len()], &body, &limits);
        let _ = estimate::text_tokens(&String::from_utf8_lossy(&body));
    }
    // deep nesting and huge numbers
    let deep = "[".repeat(100_000);
    let _ = estimate::estimate(ApiKind::ChatCompletions, deep.as_bytes(), &limits);
    let nested = format!(
        r#"{{"messages":[{{"role":"user","content":{}1{}}}]}}"#,
        "[".repeat(120),
        "]".repeat(120)
    );
    let _ = estimate::estimate(ApiKind::ChatCompletions, nested.as_bytes(), &limits);
}

#[test]
fn config_parser_never_panics() {
    let mut rng = Rng(42);
    let seed = br#"{"tenant_header":"x-tenant-id","trusted_headers": {"set_by": "the test client: it is the trusted filter"},"rules":[{"name":"a","model":"gpt-4*","tokens_per_second":10,"burst":100,"requests_per_minute":5,"max_wait_ms":10}],"breaker":{"failure_threshold":2,"model_fallbacks":{"a":"b"}},"quota":{"cluster":"webdis","monthly_limit":100,"tenants":{"t":{"monthly_limit":5}}}}"#;
    assert!(tokengate::config::parse(seed).is_ok());
    for _ in 0..20_000 {
        let _ = tokengate::config::parse(&mutate(&mut rng, seed));
    }
}

#[test]
fn response_usage_and_sse_scanner_never_panic() {
    let mut rng = Rng(7);
    let json = br#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":1}}}"#;
    let sse = b"data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\n\ndata: [DONE]\n\n";
    for _ in 0..20_000 {
        let _ = usage::from_json(&mutate(&mut rng, json));
        let stream = mutate(&mut rng, sse);
        for strip in [false, true] {
            let mut sc = SseScanner::with_max_event(strip, 64);
            let mut at = 0;
            while at < stream.len() {
                let n = 1 + rng.below(17);
                let end = (at + n).min(stream.len());
                let _ = sc.feed(&stream[at..end]);
                at = end;
            }
            let _ = sc.finish();
            let _ = (sc.usage(), sc.completed(), sc.content_bytes());
        }
    }
}

#[test]
fn shim_replies_never_panic() {
    let mut rng = Rng(99);
    let seeds: [&[u8]; 4] = [
        br#"{"EVAL":[1,300,1000,300,-1,0,50,0]}"#,
        br#"{"EVALSHA":[false,"NOSCRIPT No matching script"]}"#,
        br#"{"EVAL":[1,0,-1]}"#,
        b"",
    ];
    for i in 0..20_000 {
        let body = mutate(&mut rng, seeds[i % seeds.len()]);
        let status = [0u32, 200, 403, 503, 504, 500][i % 6];
        let _ = quota::parse_reserve_reply(status, &body);
        let _ = quota::parse_settle_reply(status, &body, 3);
    }
}

#[test]
fn body_rewrites_never_panic() {
    let mut rng = Rng(1234);
    let edits = Edits {
        set_model: Some("fallback".into()),
        inject_include_usage: true,
        clamp_max_output: Some(5),
        max_output_field: "max_tokens".into(),
        clamp_present_only: false,
        limit_at: rewrite::LimitAt::Top,
    };
    let present_only = Edits {
        clamp_present_only: true,
        ..edits.clone()
    };
    for i in 0..20_000 {
        let body = mutate(&mut rng, REQUESTS[i % REQUESTS.len()].as_bytes());
        let _ = rewrite::rewrite(&body, if i % 2 == 0 { &edits } else { &present_only });
    }
    // Each family's own output-limit field (nested objects, either spelling, invoke shapes).
    let at = [
        rewrite::LimitAt::Gemini,
        rewrite::LimitAt::Converse,
        rewrite::LimitAt::Invoke { nova: false },
        rewrite::LimitAt::Invoke { nova: true },
    ];
    for i in 0..20_000 {
        let (_, seed) = FAMILY_REQUESTS[i % FAMILY_REQUESTS.len()];
        let body = mutate(&mut rng, seed.as_bytes());
        let e = Edits {
            limit_at: at[(i / 2) % at.len()],
            ..if i % 2 == 0 {
                edits.clone()
            } else {
                present_only.clone()
            }
        };
        let _ = rewrite::rewrite(&body, &e);
    }
}

#[test]
fn shared_state_decoders_reject_garbage_without_panicking() {
    let mut rng = Rng(5);
    for _ in 0..50_000 {
        let n = rng.below(300);
        let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        let _ = BucketState::decode(&bytes);
        let _ = BreakerState::decode(&bytes);
        let _ = ExhaustedMarker::decode(&bytes);
        let _ = OpenSet::decode(&bytes);
        let blob = tokengate::host::abi::HeaderBlob::from_bytes(bytes.clone());
        let _ = blob.find(":status");
    }
    // The set of open breakers is variable-length: mutations of a valid one reach its length checks.
    let set = [&[1u8, 2, 0, 0, 0, 7][..], b"model=a", &[9], b"cluster=b"].concat();
    assert!(OpenSet::decode(&set).is_some_and(|s| s.contains("cluster", "b")));
    for _ in 0..50_000 {
        if let Some(s) = OpenSet::decode(&mutate(&mut rng, &set)) {
            let _ = (s.contains("model", "a"), s.has_scope("cluster"));
        }
    }
}

const FAMILY_REQUESTS: &[(ApiKind, &str)] = &[
    (
        ApiKind::GeminiGenerate,
        r#"{"contents":[{"role":"user","parts":[{"text":"hi"},{"inlineData":{"mimeType":"image/png","data":"AAAA"}},{"functionCall":{"name":"f","args":{"a":1}}}]}],"systemInstruction":{"parts":[{"text":"s"}]},"tools":[{"functionDeclarations":[{"name":"f"}]}],"generationConfig":{"maxOutputTokens":9,"candidateCount":2,"thinkingConfig":{"thinkingBudget":5}}}"#,
    ),
    (
        ApiKind::GeminiStream,
        r#"{"contents":[{"parts":[{"fileData":{"mimeType":"video/mp4","fileUri":"gs://b/v"}},{"functionResponse":{"name":"f","response":{"x":[1,2]}}}]}],"cachedContent":"cachedContents/c"}"#,
    ),
    (
        ApiKind::BedrockConverse,
        r#"{"messages":[{"role":"user","content":[{"text":"hi"},{"image":{"format":"png","source":{"bytes":"AAAA"}}},{"document":{"format":"pdf","name":"d","source":{"bytes":"AAAA"}}},{"toolResult":{"toolUseId":"t","content":[{"json":{"a":1}},{"text":"r"}]}}]}],"system":[{"text":"s"},{"cachePoint":{"type":"default"}}],"toolConfig":{"tools":[{"toolSpec":{"name":"f","inputSchema":{"json":{}}}}]},"inferenceConfig":{"maxTokens":9}}"#,
    ),
    (
        ApiKind::BedrockInvoke,
        r#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}"#,
    ),
    (
        ApiKind::BedrockInvokeStream,
        r#"{"prompt":"<s>[INST] hi [/INST]","max_gen_len":9,"textGenerationConfig":{"maxTokenCount":3}}"#,
    ),
    (
        ApiKind::BedrockInvoke,
        r#"{"schemaVersion":"messages-v1","messages":[{"role":"user","content":[{"text":"hi"}]}],"inferenceConfig":{"max_new_tokens":9}}"#,
    ),
];

#[test]
fn every_family_never_panics_on_mutated_bodies_paths_and_streams() {
    use tokengate::usage::eventstream::{encode, Decoder};
    use tokengate::usage::{BedrockStream, EventStreamScanner, GeminiScanner, StreamScanner};
    let mut rng = Rng(0x5eed_f00d);
    let limits = |_: Option<&str>| OutputLimits {
        default_tokens: 100,
        cap_tokens: 1000,
    };
    for i in 0..20_000 {
        let (kind, seed) = FAMILY_REQUESTS[i % FAMILY_REQUESTS.len()];
        let body = mutate(&mut rng, seed.as_bytes());
        let _ = estimate::estimate_with_model(kind, &body, Some("m"), &limits);
        let _ = estimate::estimate(kind, &body, &limits);
    }
    let paths = [
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fus.m%3A0/converse-stream",
        "/openai/deployments/d/chat/completions?api-version=1",
        "/v1/projects/p/locations/l/publishers/anthropic/models/c@1:streamRawPredict",
    ];
    for i in 0..20_000 {
        let p = mutate(&mut rng, paths[i % paths.len()].as_bytes());
        let _ = estimate::route(Some("POST"), Some(&String::from_utf8_lossy(&p)));
    }
    let gemini = b"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"h\"}]},\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":3,\"candidatesTokenCount\":1}}\r\n\r\n";
    let array = br#"[{"candidates":[{"content":{"parts":[{"text":"a\"]}"}]}}]},{"usageMetadata":{"promptTokenCount":3,"totalTokenCount":5}}]"#;
    let mut events = Vec::new();
    for (ty, p) in [
        ("contentBlockDelta", r#"{"delta":{"text":"x"}}"#),
        ("messageStop", r#"{"stopReason":"end_turn"}"#),
        (
            "metadata",
            r#"{"usage":{"inputTokens":1,"outputTokens":2}}"#,
        ),
        ("chunk", r#"{"bytes":"eyJnZW5lcmF0aW9uIjoieCJ9"}"#),
    ] {
        events.extend(encode(
            &[(":event-type", ty), (":message-type", "event")],
            p.as_bytes(),
        ));
    }
    for _ in 0..5_000 {
        let g = mutate(&mut rng, gemini);
        let a = mutate(&mut rng, array);
        let e = mutate(&mut rng, &events);
        let mut gs = GeminiScanner::new();
        let mut ga = GeminiScanner::new();
        let mut conv = EventStreamScanner::new(BedrockStream::Converse);
        let mut inv = StreamScanner::EventStream(EventStreamScanner::new(BedrockStream::Invoke));
        let mut dec = Decoder::new(256);
        for (stream, at_most) in [(&g, 7usize), (&a, 5), (&e, 11)] {
            let mut at = 0;
            while at < stream.len() {
                let end = (at + 1 + rng.below(at_most)).min(stream.len());
                let piece = &stream[at..end];
                let _ = gs.feed(piece);
                let _ = ga.feed(piece);
                let _ = conv.feed(piece);
                let _ = inv.feed(piece);
                dec.feed(piece, &mut |_| {});
                at = end;
            }
        }
        for s in [&mut gs, &mut ga] {
            let _ = s.finish();
            let _ = (s.usage(), s.completed(), s.content_bytes());
        }
        let _ = conv.finish();
        let _ = (conv.usage(), conv.completed(), conv.content_bytes());
        let _ = inv.finish();
        let _ = (inv.usage(), inv.completed(), inv.content_bytes());
        dec.finish();
        let _ = usage::gemini::from_json(&g);
        let _ = usage::bedrock::from_converse_json(&a);
        let _ = usage::bedrock::from_invoke(&a, Some("x"), None);
    }
}
