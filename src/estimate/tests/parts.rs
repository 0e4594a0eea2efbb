//! Content parts that are not plain text: images, audio, files, documents, search results, parts of
//! unknown types, and parts nested beyond the walk's depth.

use super::*;

#[test]
fn chat_content_parts_count_text_and_a_fixed_cost_per_image() {
    let text_only = ok(
        ApiKind::ChatCompletions,
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"Describe this picture in detail please"}]}]}"#,
    );
    let with_image = ok(
        ApiKind::ChatCompletions,
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"Describe this picture in detail please"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}}]}]}"#,
    );
    assert_eq!(
        with_image.prompt_tokens,
        text_only.prompt_tokens + IMAGE_TOKENS
    );
    assert!(text_only.prompt_tokens >= 6 + 6);
}

#[test]
fn an_image_costs_the_most_an_image_can_unless_its_detail_is_low() {
    let text = r#"{"type":"text","text":"Describe this picture in detail please"}"#;
    let chat = |parts: &str| {
        ok(
            ApiKind::ChatCompletions,
            &format!(r#"{{"messages":[{{"role":"user","content":[{text}{parts}]}}]}}"#),
        )
        .prompt_tokens
    };
    let base = chat("");
    let url = r#""url":"data:image/png;base64,AAAA""#;
    for (part, cost) in [
        (
            format!(r#",{{"type":"image_url","image_url":{{{url}}}}}"#),
            IMAGE_TOKENS,
        ),
        (
            format!(r#",{{"type":"image_url","image_url":{{{url},"detail":"auto"}}}}"#),
            IMAGE_TOKENS,
        ),
        (
            format!(r#",{{"type":"image_url","image_url":{{{url},"detail":"high"}}}}"#),
            IMAGE_TOKENS,
        ),
        (
            format!(r#",{{"type":"image_url","image_url":{{"detail":"low",{url}}}}}"#),
            IMAGE_LOW_TOKENS,
        ),
        (
            format!(r#",{{"image_url":{{{url},"detail":"low"}},"type":"image_url"}}"#),
            IMAGE_LOW_TOKENS,
        ),
        (
            r#",{"type":"image_url","image_url":"https://x/y.png"}"#.to_string(),
            IMAGE_TOKENS,
        ),
        (
            format!(
                r#",{{"type":"image_url","image_url":{{{url},"detail":"low"}}}},{{"type":"image_url","image_url":{{{url}}}}}"#
            ),
            IMAGE_LOW_TOKENS + IMAGE_TOKENS,
        ),
    ] {
        assert_eq!(chat(&part), base + cost, "{part}");
    }
    // Responses' input_image has `detail` beside its URL; Anthropic's images have none.
    let responses = |part: &str| {
        ok(
            ApiKind::Responses,
            &format!(r#"{{"input":[{{"role":"user","content":[{{"type":"input_text","text":"hi"}}{part}]}}]}}"#),
        )
        .prompt_tokens
    };
    let base = responses("");
    assert_eq!(
        responses(r#",{"type":"input_image","image_url":"https://x/y.png"}"#),
        base + IMAGE_TOKENS
    );
    assert_eq!(
        responses(r#",{"type":"input_image","detail":"low","image_url":"https://x/y.png"}"#),
        base + IMAGE_LOW_TOKENS
    );
    let anthropic = |part: &str| {
        ok(
            ApiKind::AnthropicMessages,
            &format!(r#"{{"max_tokens":5,"messages":[{{"role":"user","content":[{{"type":"text","text":"hi"}}{part}]}}]}}"#),
        )
        .prompt_tokens
    };
    assert_eq!(
        anthropic(
            r#",{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}"#
        ),
        anthropic("") + IMAGE_TOKENS
    );
    // `detail` only where the API reads it: not on Anthropic's images, not beside chat's image_url.
    let low = r#","detail":"low""#;
    let plain_a =
        r#",{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}"#;
    let with_low = format!(
        r#",{{"type":"image"{low},"source":{{"type":"base64","media_type":"image/png","data":"AAAA"}}}}"#
    );
    assert_eq!(anthropic(&with_low), anthropic(plain_a));
    let base = chat("");
    assert_eq!(
        chat(&format!(
            r#",{{"type":"image_url"{low},"image_url":"https://x/y.png"}}"#
        )),
        base + IMAGE_TOKENS
    );
    // In a part of a type the walk does not know, image_url and detail count by their JSON size,
    // as every other field does.
    let unknown = |fields: &str| chat(&format!(r#",{{"type":"x-new",{fields}}}"#));
    assert_eq!(
        unknown(r#""image_url":{"url":"abc","detail":"low"}"#),
        unknown(r#""image_xyz":{"url":"abc","detail":"low"}"#)
    );
    assert_eq!(unknown(r#""detail":"low""#), unknown(r#""detaix":"low""#));
}

#[test]
fn audio_and_file_parts_have_a_documented_size_based_or_fixed_cost() {
    let base = ok(
        ApiKind::ChatCompletions,
        r#"{"messages":[{"role":"user","content":[]}]}"#,
    )
    .prompt_tokens;
    let with = |part: &str| {
        ok(
            ApiKind::ChatCompletions,
            &format!(r#"{{"messages":[{{"role":"user","content":[{part}]}}]}}"#),
        )
        .prompt_tokens
            - base
    };
    let b64 = "A".repeat(10 * 1024);
    assert_eq!(
        with(&format!(
            r#"{{"type":"input_audio","input_audio":{{"data":"{b64}","format":"mp3"}}}}"#
        )),
        10 * AUDIO_TOKENS_PER_KB
    );
    assert_eq!(
        with(&format!(
            r#"{{"type":"input_audio","input_audio":{{"format":"wav","data":"{b64}"}}}}"#
        )),
        10 * AUDIO_WAV_TOKENS_PER_KB
    );
    assert_eq!(
        with(r#"{"type":"input_audio","input_audio":{"data":"QUJD"}}"#),
        1
    );
    assert_eq!(
        with(&format!(
            r#"{{"type":"file","file":{{"filename":"a.pdf","file_data":"data:application/pdf;base64,{b64}"}}}}"#
        )),
        per_kb(10 * 1024 + 28, FILE_TOKENS_PER_KB)
    );
    assert_eq!(
        with(r#"{"type":"file","file":{"file_id":"file-abc123"}}"#),
        FILE_ID_TOKENS
    );
    // Responses `input_file` parts carry the fields directly.
    let responses = |part: &str| {
        ok(
            ApiKind::Responses,
            &format!(r#"{{"input":[{{"role":"user","content":[{part}]}}]}}"#),
        )
        .prompt_tokens
    };
    let empty = responses("");
    assert_eq!(
        responses(r#"{"type":"input_file","file_id":"file-abc123"}"#) - empty,
        FILE_ID_TOKENS
    );
    assert_eq!(
        responses(&format!(
            r#"{{"type":"input_file","filename":"a.pdf","file_data":"{b64}"}}"#
        )) - empty,
        10 * FILE_TOKENS_PER_KB
    );
    // Odd shapes are 0, never an error.
    assert_eq!(with(r#"{"type":"input_audio","input_audio":"x"}"#), 0);
    assert_eq!(with(r#"{"type":"file","file":7}"#), 0);
}

#[test]
fn anthropic_documents_and_search_results_are_counted() {
    let base = MESSAGE_OVERHEAD + REPLY_PRIMER;
    let doc = |block: serde_json::Value| {
        let body = serde_json::json!({"model": "claude", "max_tokens": 1,
            "messages": [{"role": "user", "content": [block]}]})
        .to_string();
        ok(ApiKind::AnthropicMessages, &body).prompt_tokens - base
    };
    let pdf = "A".repeat(400 * 1024);
    assert_eq!(
        doc(serde_json::json!({"type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}})),
        400 * FILE_TOKENS_PER_KB
    );
    assert_eq!(
        doc(serde_json::json!({"type": "document",
            "source": {"type": "url", "url": "https://example.com/a.pdf"}})),
        FILE_ID_TOKENS
    );
    assert_eq!(
        doc(serde_json::json!({"type": "document", "source": {"type": "file", "file_id": "f1"}})),
        FILE_ID_TOKENS
    );
    let words = "The quarterly report shows revenue growth in every region.";
    assert_eq!(
        doc(
            serde_json::json!({"type": "document", "title": "Report", "context": "Q3",
            "source": {"type": "content", "content": [{"type": "text", "text": words}]}})
        ),
        text_tokens(words) + text_tokens("Report") + text_tokens("Q3")
    );
    assert!(
        doc(
            serde_json::json!({"type": "search_result", "source": "https://e.com", "title": "t",
            "content": [{"type": "text", "text": words}]})
        ) >= text_tokens(words)
    );
}

#[test]
fn deep_parts_beyond_max_depth_count_zero_and_the_body_stays_valid() {
    // Through `content` arrays of arrays, every level is one JSON level deeper: serde_json's limit
    // (128) ends it first. Through tool_result blocks, MAX_DEPTH would; both are bounded.
    let mut inner = String::from(r#"{"type":"text","text":"leaf"}"#);
    for _ in 0..60 {
        inner = format!(r#"{{"type":"tool_result","content":[{inner}]}}"#);
    }
    let body = format!(r#"{{"messages":[{{"role":"user","content":[{inner}]}}]}}"#);
    let e = ok(ApiKind::AnthropicMessages, &body);
    assert_eq!(
        e.prompt_tokens,
        MESSAGE_OVERHEAD + REPLY_PRIMER + 60 * 3 + text_tokens("leaf")
    );
    let nested = format!(
        r#"{{"messages":[{{"role":"user","content":[{}"x"{}]}}]}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    assert_eq!(
        ok(ApiKind::ChatCompletions, &nested).prompt_tokens,
        MESSAGE_OVERHEAD + ROLE + REPLY_PRIMER
    );
}

#[test]
fn content_parts_of_unknown_types_are_estimated_from_their_size() {
    let bpe = tiktoken_rs::o200k_base().unwrap();
    let payload = serde_json::json!({
        "rows": (0..20).map(|i| serde_json::json!({"id": i, "name": format!("item number {i}"), "tags": ["alpha", "beta"], "score": 0.5 + f64::from(i)})).collect::<Vec<_>>()
    });
    let real = bpe.encode_ordinary(&payload.to_string()).len() as u64;
    assert!(real > 200, "{real}");
    let part = serde_json::json!({"type": "input_json", "json": payload});
    let chat =
        serde_json::json!({"messages": [{"role": "user", "content": [part.clone()]}]}).to_string();
    let empty = ok(
        ApiKind::ChatCompletions,
        r#"{"messages":[{"role":"user","content":[]}]}"#,
    )
    .prompt_tokens;
    let got = ok(ApiKind::ChatCompletions, &chat).prompt_tokens - empty;
    assert!(got >= real, "{got} for {real}");
    assert!(got <= real * 3, "{got} for {real}");
    // The same in Anthropic blocks and Responses content and items.
    let anthropic =
        serde_json::json!({"messages": [{"role": "user", "content": [part.clone()]}]}).to_string();
    assert!(ok(ApiKind::AnthropicMessages, &anthropic).prompt_tokens >= real);
    let responses = serde_json::json!({"input": [{"role": "user", "content": [part.clone()]}, {"type": "something_new", "data": payload}]}).to_string();
    assert!(ok(ApiKind::Responses, &responses).prompt_tokens >= 2 * real);
    // Known parts keep their costs: an image's URL is not counted by size.
    let image = serde_json::json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,".to_string() + &"A".repeat(30_000)}}]}]}).to_string();
    assert_eq!(
        ok(ApiKind::ChatCompletions, &image).prompt_tokens - empty,
        IMAGE_TOKENS
    );
}
