//! The body walk per API family: what is counted, output reservation, errors.

use super::super::tools::*;
use super::*;

#[test]
fn api_kind_is_derived_from_the_path_suffix_ignoring_the_query() {
    assert_eq!(
        ApiKind::from_path("/v1/chat/completions"),
        Some(ApiKind::ChatCompletions)
    );
    assert_eq!(
        ApiKind::from_path("/v1/chat/completions?x=1"),
        Some(ApiKind::ChatCompletions)
    );
    assert_eq!(
        ApiKind::from_path("/openai/v1/completions"),
        Some(ApiKind::Completions)
    );
    assert_eq!(
        ApiKind::from_path("/v1/embeddings"),
        Some(ApiKind::Embeddings)
    );
    assert_eq!(
        ApiKind::from_path("/v1/responses"),
        Some(ApiKind::Responses)
    );
    assert_eq!(
        ApiKind::from_path("/v1/messages?beta=true"),
        Some(ApiKind::AnthropicMessages)
    );
    assert_eq!(ApiKind::from_path("/v1/models"), None);
    assert_eq!(ApiKind::from_path("/v1/threads/thread_abc/messages"), None);
    assert_eq!(
        ApiKind::from_path("/x/threads/y/z/v1/messages"),
        Some(ApiKind::AnthropicMessages)
    );
    assert_eq!(ApiKind::from_path("/v1/chat/completions/x"), None);
    assert_eq!(ApiKind::from_path(""), None);
    assert_eq!(ApiKind::ChatCompletions.as_str(), "chat_completions");
    assert_eq!(ApiKind::AnthropicMessages.as_str(), "anthropic_messages");
}

#[test]
fn chat_completion_counts_messages_overhead_and_requested_output() {
    let e = ok(
        ApiKind::ChatCompletions,
        r#"{"model":"gpt-4.1","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hello there!"}],"max_tokens":64}"#,
    );
    assert_eq!(e.kind, ApiKind::ChatCompletions);
    assert_eq!(e.model.as_deref(), Some("gpt-4.1"));
    // 2 × 3 overhead + 3 primer + ~4 + ~3 text
    assert!((12..=20).contains(&e.prompt_tokens), "{}", e.prompt_tokens);
    assert_eq!(e.requested_output, Some(64));
    assert_eq!(e.output_tokens, 64);
    assert_eq!(e.total(), e.prompt_tokens + 64);
    assert!(!e.stream);
    assert!(!e.include_usage);
}

#[test]
fn chat_tools_tool_calls_and_response_format_are_counted() {
    let base = r#"{"messages":[{"role":"user","content":"What is the weather in Paris?"}]}"#;
    let with_tools = r#"{"messages":[{"role":"user","content":"What is the weather in Paris?"}],
        "tools":[{"type":"function","function":{"name":"get_weather","description":"Get the current weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]}"#;
    let b = ok(ApiKind::ChatCompletions, base).prompt_tokens;
    let t = ok(ApiKind::ChatCompletions, with_tools).prompt_tokens;
    assert!(t >= b + 25, "tools add their JSON: {b} -> {t}");

    let with_calls = r#"{"messages":[{"role":"user","content":"What is the weather in Paris?"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":"{\"temp_c\": 18, \"sky\": \"clear\"}"}]}"#;
    let c = ok(ApiKind::ChatCompletions, with_calls).prompt_tokens;
    assert!(c >= b + 20, "tool calls and results count: {b} -> {c}");

    let with_schema = r#"{"messages":[{"role":"user","content":"What is the weather in Paris?"}],
        "response_format":{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object","properties":{"temp":{"type":"number"}}}}}}"#;
    let s = ok(ApiKind::ChatCompletions, with_schema).prompt_tokens;
    assert!(s >= b + 15, "response_format schema counts: {b} -> {s}");
}

#[test]
fn the_largest_present_of_max_tokens_max_completion_tokens_max_output_tokens_is_reserved() {
    let e = ok(ApiKind::ChatCompletions, r#"{"max_completion_tokens":300}"#);
    assert_eq!((e.requested_output, e.output_tokens), (Some(300), 300));
    // Both present: the larger, whichever comes first (err towards charging).
    let e = ok(
        ApiKind::ChatCompletions,
        r#"{"max_tokens":100,"max_completion_tokens":300}"#,
    );
    assert_eq!((e.requested_output, e.output_tokens), (Some(300), 300));
    let e = ok(
        ApiKind::ChatCompletions,
        r#"{"max_completion_tokens":50,"max_tokens":400}"#,
    );
    assert_eq!((e.requested_output, e.output_tokens), (Some(400), 400));
    // A bad one is still an error, even when the other is larger.
    assert_eq!(
        est(
            ApiKind::ChatCompletions,
            r#"{"max_tokens":900,"max_completion_tokens":"x"}"#
        ),
        Err(EstimateError::BadField("max_completion_tokens"))
    );
    let e = ok(
        ApiKind::ChatCompletions,
        r#"{"max_tokens":null,"max_completion_tokens":300}"#,
    );
    assert_eq!(e.requested_output, Some(300));
    let e = ok(
        ApiKind::Responses,
        r#"{"input":"hi","max_output_tokens":77}"#,
    );
    assert_eq!((e.requested_output, e.output_tokens), (Some(77), 77));
    let e = ok(
        ApiKind::AnthropicMessages,
        r#"{"messages":[],"max_tokens":5}"#,
    );
    assert_eq!(e.output_tokens, 5);
    // `-0` is an integer in JSON (Python reads 0), as `0` is; a fraction is not.
    for zero in ["-0", "0", "-0.0"] {
        let e = ok(
            ApiKind::ChatCompletions,
            &format!(r#"{{"max_tokens":{zero}}}"#),
        );
        assert_eq!(e.requested_output, Some(0), "{zero}");
    }
    assert_eq!(
        est(ApiKind::ChatCompletions, r#"{"max_tokens":64.5}"#),
        Err(EstimateError::BadField("max_tokens"))
    );
}

#[test]
fn legacy_completions_reserve_max_tokens_times_the_larger_of_n_and_best_of() {
    let e = ok(
        ApiKind::Completions,
        r#"{"prompt":"hi","max_tokens":10,"best_of":5}"#,
    );
    assert_eq!(e.output_tokens, 50);
    let e = ok(
        ApiKind::Completions,
        r#"{"prompt":"hi","max_tokens":10,"n":2,"best_of":5}"#,
    );
    assert_eq!(e.output_tokens, 50);
    let e = ok(
        ApiKind::Completions,
        r#"{"prompt":"hi","max_tokens":10,"n":7,"best_of":null}"#,
    );
    assert_eq!(e.output_tokens, 70);
    // Capped at MAX_N like `n`.
    let e = ok(
        ApiKind::Completions,
        r#"{"prompt":"hi","max_tokens":10,"best_of":100000}"#,
    );
    assert_eq!(e.output_tokens, 10 * MAX_N);
    assert_eq!(
        est(ApiKind::Completions, r#"{"max_tokens":10,"best_of":-1}"#),
        Err(EstimateError::BadField("best_of"))
    );
    // Chat has no `best_of`: ignored there.
    let e = ok(ApiKind::ChatCompletions, r#"{"max_tokens":10,"best_of":5}"#);
    assert_eq!(e.output_tokens, 10);
}

#[test]
fn chat_prediction_content_and_refusals_count_as_prompt_text() {
    let base = ok(
        ApiKind::ChatCompletions,
        r#"{"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .prompt_tokens;
    let code = "fn main() { println!(hello); }";
    let with_string = ok(
        ApiKind::ChatCompletions,
        &format!(
            r#"{{"messages":[{{"role":"user","content":"hi"}}],"prediction":{{"type":"content","content":"{code}"}}}}"#
        ),
    );
    let t = text_tokens(code);
    assert_eq!(with_string.prompt_tokens, base + t);
    let with_parts = ok(
        ApiKind::ChatCompletions,
        &format!(
            r#"{{"messages":[{{"role":"user","content":"hi"}}],"prediction":{{"type":"content","content":[{{"type":"text","text":"{code}"}},{{"type":"text","text":"{code}"}}]}}}}"#
        ),
    );
    assert_eq!(with_parts.prompt_tokens, base + 2 * t);
    let null = ok(
        ApiKind::ChatCompletions,
        r#"{"messages":[{"role":"user","content":"hi"}],"prediction":null}"#,
    );
    assert_eq!(null.prompt_tokens, base);
    assert_eq!(
        est(ApiKind::ChatCompletions, r#"{"prediction":"x"}"#),
        Err(EstimateError::BadField("prediction"))
    );
    assert_eq!(
        est(
            ApiKind::ChatCompletions,
            r#"{"prediction":{"type":"content","content":5}}"#
        ),
        Err(EstimateError::BadField("prediction.content"))
    );
    // Assistant refusals: the message field and refusal content parts.
    let refusal = "I can't help with that request.";
    let r = text_tokens(refusal);
    let msg = ok(
        ApiKind::ChatCompletions,
        &format!(
            r#"{{"messages":[{{"role":"user","content":"hi"}},{{"role":"assistant","content":null,"refusal":"{refusal}"}}]}}"#
        ),
    );
    assert_eq!(msg.prompt_tokens, base + MESSAGE_OVERHEAD + ROLE + r);
    let part = ok(
        ApiKind::ChatCompletions,
        &format!(
            r#"{{"messages":[{{"role":"user","content":"hi"}},{{"role":"assistant","content":[{{"type":"refusal","refusal":"{refusal}"}}]}}]}}"#
        ),
    );
    assert_eq!(part.prompt_tokens, base + MESSAGE_OVERHEAD + ROLE + r);
}

#[test]
fn output_defaults_per_model_and_is_clamped_to_the_cap() {
    let e = ok(ApiKind::ChatCompletions, r#"{"messages":[]}"#);
    assert_eq!((e.requested_output, e.output_tokens), (None, 1000));
    let e = ok(ApiKind::ChatCompletions, r#"{"max_tokens":100000}"#);
    assert_eq!((e.requested_output, e.output_tokens), (Some(100000), 4000));
    let per_model = |m: Option<&str>| match m {
        Some("big") => OutputLimits {
            default_tokens: 8000,
            cap_tokens: 16000,
        },
        _ => OutputLimits {
            default_tokens: 10,
            cap_tokens: 20,
        },
    };
    let big = estimate(ApiKind::ChatCompletions, br#"{"model":"big"}"#, &per_model);
    assert_eq!(big.map(|e| e.output_tokens), Ok(8000));
    let none = estimate(ApiKind::ChatCompletions, br#"{}"#, &per_model);
    assert_eq!(none.map(|e| e.output_tokens), Ok(10));
}

#[test]
fn output_choices_is_the_multiplier_of_the_reserved_output() {
    for (kind, body, choices, output) in [
        (ApiKind::ChatCompletions, r#"{"max_tokens":10}"#, 1, 10),
        (
            ApiKind::ChatCompletions,
            r#"{"max_tokens":10,"n":3}"#,
            3,
            30,
        ),
        (
            ApiKind::ChatCompletions,
            r#"{"max_tokens":10,"n":1000}"#,
            128,
            1280,
        ),
        (ApiKind::Completions, r#"{"max_tokens":10,"n":0}"#, 1, 10),
        (ApiKind::Embeddings, r#"{"input":"x","n":4}"#, 1, 0),
    ] {
        let e = ok(kind, body);
        assert_eq!(
            (e.output_choices, e.output_tokens),
            (choices, output),
            "{body}"
        );
    }
}

#[test]
fn n_multiplies_the_reserved_output_up_to_128() {
    assert_eq!(
        ok(ApiKind::ChatCompletions, r#"{"max_tokens":10,"n":3}"#).output_tokens,
        30
    );
    assert_eq!(
        ok(ApiKind::ChatCompletions, r#"{"max_tokens":10,"n":1000}"#).output_tokens,
        1280
    );
    assert_eq!(
        ok(ApiKind::Completions, r#"{"max_tokens":10,"n":0}"#).output_tokens,
        10
    );
    assert_eq!(
        est(ApiKind::ChatCompletions, r#"{"n":-1}"#),
        Err(EstimateError::BadField("n"))
    );
    assert_eq!(
        est(ApiKind::ChatCompletions, r#"{"n":"2"}"#),
        Err(EstimateError::BadField("n"))
    );
}

#[test]
fn completions_prompt_accepts_strings_and_token_ids() {
    let s = ok(
        ApiKind::Completions,
        r#"{"prompt":"Once upon a time there was a gateway"}"#,
    );
    assert!((6..=12).contains(&s.prompt_tokens), "{}", s.prompt_tokens);
    let a = ok(
        ApiKind::Completions,
        r#"{"prompt":["one two three","four five six"]}"#,
    );
    assert!((4..=10).contains(&a.prompt_tokens), "{}", a.prompt_tokens);
    assert_eq!(
        ok(ApiKind::Completions, r#"{"prompt":[1,2,3,4,5]}"#).prompt_tokens,
        5
    );
    assert_eq!(
        ok(ApiKind::Completions, r#"{"prompt":[[1,2,3],[4,5]]}"#).prompt_tokens,
        5
    );
    assert_eq!(ok(ApiKind::Completions, r#"{}"#).prompt_tokens, 0);
    assert_eq!(
        est(ApiKind::Completions, r#"{"prompt":{"a":1}}"#),
        Err(EstimateError::BadField("prompt"))
    );
    assert_eq!(
        est(ApiKind::Completions, r#"{"prompt":[true]}"#),
        Err(EstimateError::BadField("prompt"))
    );
}

#[test]
fn embeddings_count_input_and_reserve_no_output() {
    let e = ok(
        ApiKind::Embeddings,
        r#"{"model":"text-embedding-3-small","input":"The quick brown fox","max_tokens":50}"#,
    );
    assert_eq!(e.output_tokens, 0);
    assert!((3..=6).contains(&e.prompt_tokens), "{}", e.prompt_tokens);
    assert_eq!(
        ok(ApiKind::Embeddings, r#"{"input":["a b","c d"]}"#).output_tokens,
        0
    );
    assert_eq!(
        ok(ApiKind::Embeddings, r#"{"input":[[1,2,3],[4]]}"#).prompt_tokens,
        4
    );
    assert_eq!(
        ok(ApiKind::Embeddings, r#"{"input":[7,8]}"#).prompt_tokens,
        2
    );
    assert_eq!(
        est(ApiKind::Embeddings, r#"{"input":5}"#),
        Err(EstimateError::BadField("input"))
    );
    assert_eq!(
        est(ApiKind::Embeddings, r#"{"input":[["x"]]}"#),
        Err(EstimateError::BadField("input"))
    );
}

#[test]
fn responses_count_input_items_instructions_and_tools() {
    let s = ok(
        ApiKind::Responses,
        r#"{"model":"gpt-4.1","input":"Tell me a joke about routers"}"#,
    );
    let items = ok(
        ApiKind::Responses,
        r#"{"instructions":"Be funny and brief.","input":[{"role":"user","content":"Tell me a joke about routers"},
           {"role":"user","content":[{"type":"input_text","text":"and about switches"},{"type":"input_image","image_url":"https://x/y.png"}]},
           {"type":"function_call","name":"lookup","arguments":"{\"q\":\"router\"}","call_id":"c1"},
           {"type":"function_call_output","call_id":"c1","output":"nothing found"}],
           "tools":[{"type":"function","name":"lookup","parameters":{"type":"object"}}]}"#,
    );
    assert!(
        items.prompt_tokens > s.prompt_tokens + IMAGE_TOKENS + 20,
        "{} vs {}",
        items.prompt_tokens,
        s.prompt_tokens
    );
    assert_eq!(items.output_tokens, 1000);
    assert_eq!(
        est(ApiKind::Responses, r#"{"input":7}"#),
        Err(EstimateError::BadField("input"))
    );
    assert_eq!(
        est(ApiKind::Responses, r#"{"instructions":[]}"#),
        Err(EstimateError::BadField("instructions"))
    );
}

#[test]
fn anthropic_messages_count_system_blocks_tool_use_and_tool_results() {
    let plain = ok(
        ApiKind::AnthropicMessages,
        r#"{"model":"claude-sonnet-4","max_tokens":1024,"system":"You are a travel agent.","messages":[{"role":"user","content":"Plan a weekend in Lisbon."}]}"#,
    );
    assert_eq!(plain.output_tokens, 1024);
    assert!(
        (15..=30).contains(&plain.prompt_tokens),
        "{}",
        plain.prompt_tokens
    );
    let blocks = ok(
        ApiKind::AnthropicMessages,
        r#"{"max_tokens":10,"system":[{"type":"text","text":"You are a travel agent."}],"messages":[
            {"role":"user","content":[{"type":"text","text":"Plan a weekend in Lisbon."},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]},
            {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"search_hotels","input":{"city":"Lisbon","nights":2}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"Hotel Avenida, 120 EUR per night"}]}]}],
            "tools":[{"name":"search_hotels","description":"Find hotels","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}]}"#,
    );
    assert!(
        blocks.prompt_tokens > plain.prompt_tokens + IMAGE_TOKENS + 30,
        "{}",
        blocks.prompt_tokens
    );
    assert_eq!(
        est(ApiKind::AnthropicMessages, r#"{"system":5}"#),
        Err(EstimateError::BadField("system"))
    );
}

#[test]
fn stream_and_include_usage_flags_are_reported() {
    let e = ok(
        ApiKind::ChatCompletions,
        r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
    );
    assert!(e.stream && e.include_usage);
    let e = ok(
        ApiKind::ChatCompletions,
        r#"{"stream":true,"stream_options":{"include_usage":false}}"#,
    );
    assert!(e.stream && !e.include_usage);
    let e = ok(ApiKind::ChatCompletions, r#"{"stream":false}"#);
    assert!(!e.stream && !e.include_usage);
    assert_eq!(
        est(ApiKind::ChatCompletions, r#"{"stream":"yes"}"#),
        Err(EstimateError::BadField("stream"))
    );
}

#[test]
fn malformed_bodies_are_errors_not_panics() {
    assert!(matches!(
        est(ApiKind::ChatCompletions, "{"),
        Err(EstimateError::NotJson(_))
    ));
    assert!(matches!(
        est(ApiKind::ChatCompletions, ""),
        Err(EstimateError::NotJson(_))
    ));
    assert!(matches!(
        estimate(
            ApiKind::ChatCompletions,
            b"{\"messages\":\"\xff\xfe\"}",
            &limits
        ),
        Err(EstimateError::NotJson(_))
    ));
    assert_eq!(
        est(ApiKind::ChatCompletions, "[1,2]"),
        Err(EstimateError::NotObject)
    );
    assert_eq!(
        est(ApiKind::ChatCompletions, "\"text\""),
        Err(EstimateError::NotObject)
    );
    assert_eq!(
        est(ApiKind::ChatCompletions, r#"{"messages":{}}"#),
        Err(EstimateError::BadField("messages"))
    );
    assert_eq!(
        est(ApiKind::ChatCompletions, r#"{"messages":[1]}"#),
        Err(EstimateError::BadField("messages[]"))
    );
    assert_eq!(
        est(
            ApiKind::ChatCompletions,
            r#"{"messages":[{"role":"user","content":5}]}"#
        ),
        Err(EstimateError::BadField("messages[].content"))
    );
    assert_eq!(
        est(ApiKind::ChatCompletions, r#"{"model":3}"#),
        Err(EstimateError::BadField("model"))
    );
    assert_eq!(
        est(ApiKind::ChatCompletions, r#"{"tools":{}}"#),
        Err(EstimateError::BadField("tools"))
    );
    assert_eq!(
        est(ApiKind::ChatCompletions, r#"{"max_tokens":1.5}"#),
        Err(EstimateError::BadField("max_tokens"))
    );
    assert_eq!(
        est(ApiKind::ChatCompletions, r#"{"max_tokens":-1}"#),
        Err(EstimateError::BadField("max_tokens"))
    );
    assert_eq!(
        est(ApiKind::Responses, r#"{"max_output_tokens":"9"}"#),
        Err(EstimateError::BadField("max_output_tokens"))
    );
    let msg = EstimateError::BadField("messages").to_string();
    assert!(msg.contains("messages"));
}

#[test]
fn deeply_nested_json_is_an_error_or_bounded_not_a_stack_overflow() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(matches!(
        est(ApiKind::ChatCompletions, &deep),
        Err(EstimateError::NotJson(_))
    ));
    let deep_obj = format!(
        r#"{{"messages":[{{"role":"user","content":{}1{}}}]}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    );
    assert!(est(ApiKind::ChatCompletions, &deep_obj).is_err());
    // Nesting within serde_json's limit through tool_result blocks stays bounded.
    let mut inner = String::from(r#"{"type":"text","text":"leaf"}"#);
    for _ in 0..40 {
        inner = format!(r#"{{"type":"tool_result","content":[{inner}]}}"#);
    }
    let body = format!(r#"{{"messages":[{{"role":"user","content":[{inner}]}}]}}"#);
    assert!(est(ApiKind::AnthropicMessages, &body).is_ok());
}

#[test]
fn huge_strings_and_numbers_saturate_instead_of_overflowing() {
    let big = "word ".repeat(400_000);
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"{big}"}}],"max_tokens":18446744073709551615,"n":128}}"#
    );
    let e = ok(ApiKind::ChatCompletions, &body);
    assert!(
        (350_000..=480_000).contains(&e.prompt_tokens),
        "{}",
        e.prompt_tokens
    );
    assert_eq!(e.output_tokens, 4000 * 128);
    let unlimited = |_: Option<&str>| OutputLimits {
        default_tokens: u64::MAX,
        cap_tokens: u64::MAX,
    };
    let e = estimate(ApiKind::ChatCompletions, br#"{"n":128}"#, &unlimited);
    assert_eq!(e.as_ref().map(|e| e.output_tokens), Ok(u64::MAX));
    assert_eq!(e.map(|e| e.total()), Ok(u64::MAX));
    assert!(est(ApiKind::ChatCompletions, r#"{"max_tokens":1e400}"#).is_err());
}

#[test]
fn missing_inputs_estimate_zero_prompt() {
    assert_eq!(ok(ApiKind::ChatCompletions, "{}").prompt_tokens, 0);
    assert_eq!(ok(ApiKind::Embeddings, "{}").prompt_tokens, 0);
    assert_eq!(ok(ApiKind::Responses, "{}").prompt_tokens, 0);
    assert_eq!(ok(ApiKind::AnthropicMessages, "{}").prompt_tokens, 0);
}

#[test]
fn a_syntax_error_wins_over_an_earlier_bad_field_and_field_order_decides_the_rest() {
    assert!(matches!(
        est(ApiKind::ChatCompletions, r#"{"model":3,"messages":[}"#),
        Err(EstimateError::NotJson(_))
    ));
    assert!(matches!(
        est(ApiKind::ChatCompletions, r#"{"model":3} x"#),
        Err(EstimateError::NotJson(_))
    ));
    // `model` is checked before `messages`, whatever their order in the body.
    assert_eq!(
        est(ApiKind::ChatCompletions, r#"{"messages":5,"model":3}"#),
        Err(EstimateError::BadField("model"))
    );
    assert_eq!(
        est(
            ApiKind::ChatCompletions,
            r#"{"n":"x","max_tokens":"y","tools":1}"#
        ),
        Err(EstimateError::BadField("tools"))
    );
    // The first bad message in array order.
    assert_eq!(
        est(
            ApiKind::ChatCompletions,
            r#"{"messages":[{"content":"ok"},{"content":1},{"tool_calls":1}]}"#
        ),
        Err(EstimateError::BadField("messages[].content"))
    );
}

#[test]
fn the_last_of_duplicate_keys_wins_as_in_a_parsed_object() {
    let e = ok(
        ApiKind::ChatCompletions,
        r#"{"model":3,"model":"b","max_tokens":"x","max_tokens":7}"#,
    );
    assert_eq!(
        (e.model.as_deref(), e.requested_output),
        (Some("b"), Some(7))
    );
    let first = ok(
        ApiKind::ChatCompletions,
        r#"{"messages":[{"content":[{"text":"one two three four","type":"text","type":"image_url"}]}]}"#,
    );
    assert_eq!(
        first.prompt_tokens,
        MESSAGE_OVERHEAD + REPLY_PRIMER + IMAGE_TOKENS
    );
}

#[test]
fn skipped_fields_are_still_checked_like_the_rest_of_the_body() {
    // Invalid UTF-8, out-of-range numbers and excessive depth are errors wherever they are.
    assert!(matches!(
        estimate(
            ApiKind::ChatCompletions,
            b"{\"user\":\"\xc3\x28\"}",
            &limits
        ),
        Err(EstimateError::NotJson(_))
    ));
    assert!(matches!(
        est(ApiKind::ChatCompletions, r#"{"temperature":1e400}"#),
        Err(EstimateError::NotJson(_))
    ));
    let deep = format!(r#"{{"metadata":{}{}}}"#, "[".repeat(200), "]".repeat(200));
    assert!(matches!(
        est(ApiKind::ChatCompletions, &deep),
        Err(EstimateError::NotJson(_))
    ));
    // Fields of other APIs are skipped, not counted or checked.
    assert_eq!(
        ok(ApiKind::Embeddings, r#"{"messages":5,"tools":{}}"#).prompt_tokens,
        0
    );
}

#[test]
fn invalid_utf8_in_counted_text_is_not_json() {
    for body in [
        &b"{\"messages\":[{\"content\":\"ab\xffcd\"}]}"[..],
        b"{\"messages\":[{\"content\":\"\xed\xa0\x80\"}]}", // encoded surrogate
        b"{\"messages\":[{\"content\":\"\xe4\xb8\"}]}",     // truncated sequence
        b"{\"model\":\"\xc0\xaf\"}",                        // overlong
    ] {
        assert!(matches!(
            estimate(ApiKind::ChatCompletions, body, &limits),
            Err(EstimateError::NotJson(_))
        ));
    }
}

#[test]
fn chat_framing_follows_openais_published_counting() {
    // OpenAI's method: per message 3 + the tokens of every value (the role is one token), +1 per
    // name, 3 for the reply primer.
    let empty = ok(
        ApiKind::ChatCompletions,
        r#"{"messages":[{"role":"user","content":""}]}"#,
    );
    assert_eq!(empty.prompt_tokens, 7);
    let named = ok(
        ApiKind::ChatCompletions,
        r#"{"messages":[{"role":"user","content":"","name":"bob"}]}"#,
    );
    assert_eq!(named.prompt_tokens, 7 + text_tokens("bob") + 1);
    let two = ok(
        ApiKind::ChatCompletions,
        r#"{"messages":[{"role":"system","content":""},{"role":"assistant","content":""}]}"#,
    );
    assert_eq!(
        two.prompt_tokens,
        2 * (MESSAGE_OVERHEAD + ROLE) + REPLY_PRIMER
    );
    // Responses: a string input is one user message.
    let r = ok(ApiKind::Responses, r#"{"input":""}"#);
    assert_eq!(r.prompt_tokens, 7);
    let items = ok(
        ApiKind::Responses,
        r#"{"input":[{"role":"user","content":""}]}"#,
    );
    assert_eq!(items.prompt_tokens, 7);
}

#[test]
fn tools_are_counted_by_openais_published_method() {
    let base = ok(
        ApiKind::ChatCompletions,
        r#"{"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .prompt_tokens;
    let tools = r#"{"messages":[{"role":"user","content":"hi"}],"tools":[
        {"type":"function","function":{"name":"get_weather","description":"Get the weather.",
         "parameters":{"type":"object","properties":{
            "city":{"type":"string","description":"The city"},
            "unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city"]}}},
        {"type":"function","function":{"name":"now","parameters":{"type":"object","properties":{}}}}]}"#;
    let t = ok(ApiKind::ChatCompletions, tools).prompt_tokens;
    let expected = FUNCTION_INIT
        + text_tokens("get_weather:Get the weather")
        + PROPERTIES_INIT
        + PROPERTY_KEY
        + text_tokens("city:string:The city")
        + PROPERTY_KEY
        + text_tokens("unit:string:")
        + (ENUM_ITEM + text_tokens("celsius") + ENUM_ITEM + text_tokens("fahrenheit") - ENUM_INIT)
        + FUNCTION_INIT
        + text_tokens("now:")
        + FUNCTIONS_END;
    assert_eq!(t - base, expected);
    // Legacy `functions` and the Responses API's flat form count the same.
    let functions = r#"{"messages":[{"role":"user","content":"hi"}],"functions":[{"name":"now","parameters":{"type":"object","properties":{}}}]}"#;
    assert_eq!(
        ok(ApiKind::ChatCompletions, functions).prompt_tokens - base,
        FUNCTION_INIT + text_tokens("now:") + FUNCTIONS_END
    );
    let responses = ok(
        ApiKind::Responses,
        r#"{"input":"hi","tools":[{"type":"function","name":"now","parameters":{"type":"object","properties":{}}}]}"#,
    );
    let plain = ok(ApiKind::Responses, r#"{"input":"hi"}"#);
    assert_eq!(
        responses.prompt_tokens - plain.prompt_tokens,
        FUNCTION_INIT + text_tokens("now:") + FUNCTIONS_END
    );
    // A tool that is not a function: its JSON text (never less than the method's end tokens).
    let search = ok(
        ApiKind::Responses,
        r#"{"input":"hi","tools":[{"type":"web_search_preview"}]}"#,
    );
    assert_eq!(
        search.prompt_tokens - plain.prompt_tokens,
        text_tokens(r#"{"type":"web_search_preview"}"#) + FUNCTIONS_END
    );
    // Nested schemas the method does not describe are counted as JSON on top of it.
    let nested = r#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"xs":{"type":"array","items":{"type":"string"}}}}}}]}"#;
    assert!(
        ok(ApiKind::ChatCompletions, nested).prompt_tokens - base
            > FUNCTION_INIT
                + text_tokens("f:")
                + PROPERTIES_INIT
                + PROPERTY_KEY
                + text_tokens("xs:array:")
                + FUNCTIONS_END
    );
}

#[test]
fn text_a_function_schema_holds_beyond_the_methods_fields_is_counted() {
    // Black-box run: a nested pydantic model (`openai.pydantic_function_tool`) puts its fields'
    // descriptions under `parameters.$defs`; 13 KB of them estimated at 56 tokens (the same fields
    // inline: 2,443), past a burst of 2,000 and charged 54 when the client left early.
    let words = "the quick brown fox jumps over the lazy dog ".repeat(200);
    let base = ok(
        ApiKind::ChatCompletions,
        r#"{"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .prompt_tokens;
    let hidden = text_tokens(&words);
    let with = |parameters: &str, extra: &str| {
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","function":{{"name":"f","parameters":{parameters}{extra}}}}}]}}"#
        );
        ok(ApiKind::ChatCompletions, &body).prompt_tokens - base
    };
    let plain = with(
        r#"{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false}"#,
        r#","strict":true"#,
    );
    // The published method alone for the plain one: `required` naming a property, a boolean
    // `additionalProperties` and `strict` add nothing.
    assert_eq!(
        plain,
        FUNCTION_INIT
            + text_tokens("f:")
            + PROPERTIES_INIT
            + PROPERTY_KEY
            + text_tokens("a:string:")
            + FUNCTIONS_END
    );
    for (parameters, extra) in [
        (
            format!(
                r##"{{"type":"object","properties":{{"a":{{"$ref":"#/$defs/A"}}}},"$defs":{{"A":{{"description":"{words}"}}}}}}"##
            ),
            String::new(),
        ),
        (
            format!(
                r#"{{"type":"object","title":"{words}","properties":{{"a":{{"type":"string"}}}}}}"#
            ),
            String::new(),
        ),
        (
            format!(r#"{{"type":"object","enum":["{words}"]}}"#),
            String::new(),
        ),
        (
            format!(
                r#"{{"type":"object","properties":{{"a":{{"type":"string"}}}},"required":["{words}"]}}"#
            ),
            String::new(),
        ),
        (format!(r#""{words}""#), String::new()),
        (
            r#"{"type":"object","properties":{"a":{"type":"string"}}}"#.to_string(),
            format!(r#","examples":["{words}"]"#),
        ),
        (
            r#"{"type":"object","properties":{"a":{"type":"string"}}}"#.to_string(),
            format!(r#","description":{{"x":"{words}"}}"#),
        ),
        (
            format!(
                r#"{{"type":"object","properties":{{"a":{{"type":"string","description":{{"x":"{words}"}}}}}}}}"#
            ),
            String::new(),
        ),
        (
            format!(
                r#"{{"type":"object","properties":{{"a":{{"type":"string","enum":"{words}"}}}}}}"#
            ),
            String::new(),
        ),
    ] {
        let t = with(&parameters, &extra);
        assert!(
            t >= hidden,
            "{t} < {hidden}: {}",
            &parameters[..parameters.len().min(80)]
        );
    }
    // Review: a `type` that is not "object", `required` repeating a property's name, and the
    // wrapper's own keys (chat `{"type":"function","function":{…},…}`).
    let key = words.trim().replace(' ', "_");
    for (parameters, times) in [
        (
            format!(r#"{{"type":"{words}","properties":{{"a":{{"type":"string"}}}}}}"#),
            1,
        ),
        (
            format!(
                r#"{{"type":"object","properties":{{"{key}":{{"type":"string"}}}},"required":["{key}","{key}","{key}"]}}"#
            ),
            2,
        ),
    ] {
        let t = with(&parameters, "");
        assert!(t >= hidden * times, "{t} < {times} × {hidden}");
    }
    let wrapped = format!(
        r#"{{"messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","function":{{"name":"f"}},"x":"{words}"}}]}}"#
    );
    let t = ok(ApiKind::ChatCompletions, &wrapped).prompt_tokens - base;
    assert!(t >= hidden, "{t} < {hidden}");
    // A Responses prompt template's variables are billed text.
    let plain = ok(ApiKind::Responses, r#"{"input":"hi"}"#).prompt_tokens;
    let templated = ok(
        ApiKind::Responses,
        &format!(r#"{{"input":"hi","prompt":{{"id":"pmpt_1","variables":{{"doc":"{words}"}}}}}}"#),
    )
    .prompt_tokens;
    assert!(
        templated - plain >= hidden,
        "{templated} - {plain} < {hidden}"
    );
}

#[test]
fn billed_text_in_responses_items_and_anthropic_server_tool_results_is_counted() {
    // Black-box run: 15,828 characters (~3,230 tokens) in an MCP call's output, a shell call's
    // output, an item of an unknown type, a computer call's screenshot, or an Anthropic code
    // execution / web fetch result were estimated at 27-63 tokens, past a burst of 2,000.
    let words = "the quick brown fox jumps over the lazy dog ".repeat(200);
    let hidden = text_tokens(&words);
    let plain = ok(ApiKind::Responses, r#"{"input":[]}"#).prompt_tokens;
    let shot = "A".repeat(40_000);
    for item in [
        format!(r#"{{"type":"mcp_call","name":"f","arguments":"{{}}","output":"{words}"}}"#),
        format!(r#"{{"type":"mcp_call","name":"f","arguments":"{words}"}}"#),
        format!(r#"{{"type":"mcp_approval_request","name":"f","arguments":"{words}"}}"#),
        format!(r#"{{"type":"local_shell_call_output","call_id":"c","output":"{words}"}}"#),
        format!(
            r#"{{"type":"shell_call_output","call_id":"c","output":[{{"stdout":"{words}"}}]}}"#
        ),
        format!(r#"{{"type":"new_thing","input":"{words}"}}"#),
        format!(r#"{{"type":"new_thing","content":"","payload":"{words}"}}"#),
        format!(
            r#"{{"type":"computer_call_output","call_id":"c","output":{{"type":"computer_screenshot","image_url":"data:image/png;base64,{shot}"}}}}"#
        ),
    ] {
        let t = ok(ApiKind::Responses, &format!(r#"{{"input":[{item}]}}"#)).prompt_tokens - plain;
        // The screenshot is an image, billed as one (not by its size).
        let want = if item.contains("computer") {
            IMAGE_TOKENS
        } else {
            hidden
        };
        assert!(t >= want, "{t} < {want}: {}", &item[..item.len().min(60)]);
    }
    // Black-box run: a Responses `input_file` by `file_url` counted 8, as a `file_id` 2,056.
    let by_url = ok(ApiKind::Responses, r#"{"input":[{"role":"user","content":[{"type":"input_file","file_url":"https://x/a.pdf"}]}]}"#).prompt_tokens;
    let by_id = ok(
        ApiKind::Responses,
        r#"{"input":[{"role":"user","content":[{"type":"input_file","file_id":"file-1"}]}]}"#,
    )
    .prompt_tokens;
    assert_eq!(by_url, by_id);
    assert!(by_url >= FILE_ID_TOKENS);
    // Review: a screenshot of 1 MB is still an image, not 350,000 tokens; an image generation call
    // passed back is an image, not its base64 by size.
    let big = "A".repeat(1 << 20);
    for item in [
        format!(
            r#"{{"type":"computer_call_output","call_id":"c","output":{{"type":"computer_screenshot","image_url":"data:image/png;base64,{big}"}}}}"#
        ),
        format!(
            r#"{{"type":"image_generation_call","id":"ig_1","status":"completed","result":"{big}"}}"#
        ),
    ] {
        let t = ok(ApiKind::Responses, &format!(r#"{{"input":[{item}]}}"#)).prompt_tokens - plain;
        assert!(
            (IMAGE_TOKENS..IMAGE_TOKENS + 20).contains(&t),
            "{t}: {}",
            &item[..50]
        );
    }
    // Annotations and logprobs of an echoed output_text part are not billed text.
    let echo = |extra: &str| {
        ok(ApiKind::Responses, &format!(r#"{{"input":[{{"role":"assistant","content":[{{"type":"output_text","text":"hello there"{extra}}}]}}]}}"#)).prompt_tokens
    };
    assert_eq!(
        echo(""),
        echo(&format!(
            r#","annotations":[{{"type":"url_citation","url":"{}"}}]"#,
            "x".repeat(3000)
        ))
    );
    // A message keeps the published framing (its other fields are not counted).
    let m = ok(
        ApiKind::Responses,
        r#"{"input":[{"type":"message","role":"user","content":"hi","id":"msg_1"}]}"#,
    )
    .prompt_tokens;
    let m0 = ok(
        ApiKind::Responses,
        r#"{"input":[{"role":"user","content":"hi"}]}"#,
    )
    .prompt_tokens;
    assert_eq!(m, m0);
    let base = ok(
        ApiKind::AnthropicMessages,
        r#"{"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .prompt_tokens;
    // Review: code-execution output files are references to files in the container: not 2,048 each.
    let files = r#"{"max_tokens":1,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"code_execution_tool_result","tool_use_id":"t","content":{"type":"code_execution_result","stdout":"","content":[{"type":"code_execution_output","file_id":"file_1"},{"type":"code_execution_output","file_id":"file_2"}]}}]}]}"#;
    let t = ok(ApiKind::AnthropicMessages, files).prompt_tokens - base;
    assert!(t < 100, "{t}");
    for block in [
        format!(
            r#"{{"type":"code_execution_tool_result","tool_use_id":"t","content":{{"type":"code_execution_result","stdout":"{words}","stderr":"","return_code":0,"content":[]}}}}"#
        ),
        format!(
            r#"{{"type":"bash_code_execution_tool_result","tool_use_id":"t","content":{{"type":"bash_code_execution_result","stdout":"{words}"}}}}"#
        ),
        format!(
            r#"{{"type":"web_fetch_tool_result","tool_use_id":"t","content":{{"type":"web_fetch_result","url":"https://x","content":{{"type":"document","source":{{"type":"text","media_type":"text/plain","data":"{words}"}}}}}}}}"#
        ),
    ] {
        let body = format!(
            r#"{{"max_tokens":1,"messages":[{{"role":"user","content":"hi"}},{{"role":"assistant","content":[{block}]}}]}}"#
        );
        let t = ok(ApiKind::AnthropicMessages, &body).prompt_tokens - base;
        assert!(t >= hidden, "{t} < {hidden}: {}", &block[..60]);
    }
}

#[test]
fn anthropic_tools_add_the_published_tool_use_system_prompt() {
    let base = ok(
        ApiKind::AnthropicMessages,
        r#"{"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .prompt_tokens;
    let tool = r#"{"name":"get_weather","input_schema":{"type":"object"}}"#;
    let with = ok(
        ApiKind::AnthropicMessages,
        &format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"tools":[{tool}]}}"#),
    );
    // The definition as its compact JSON text (serde_json writes the keys in order).
    let json = serde_json::from_str::<Value>(tool).unwrap().to_string();
    assert_eq!(
        with.prompt_tokens - base,
        ANTHROPIC_TOOL_SYSTEM_TOKENS + text_tokens(&json)
    );
}
