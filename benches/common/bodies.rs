//! The chat-completions bodies the estimator is measured on (`benches/estimate.rs`,
//! `examples/estimate-instr.rs`).

/// A chat request: a system message, then one user message per text.
pub fn chat_body(texts: &[&str]) -> Vec<u8> {
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a helpful assistant."})];
    for t in texts {
        messages.push(serde_json::json!({"role": "user", "content": t}));
    }
    serde_json::json!({
        "model": "gpt-4.1",
        "messages": messages,
        "max_tokens": 256,
        "stream": true,
        "stream_options": {"include_usage": true}
    })
    .to_string()
    .into_bytes()
}

/// Bodies of about `size` bytes: one user message of corpus texts joined (cycling, so the bodies
/// differ) and cut at a character boundary.
pub fn sized_bodies(texts: &[String], size: usize, count: usize) -> Vec<Vec<u8>> {
    // The rest of the body (model, system message, options) is about 180 bytes.
    let target = size.saturating_sub(180).max(1);
    let mut out = Vec::new();
    let mut next = texts.iter().cycle();
    for _ in 0..count {
        let mut content = String::new();
        while content.len() < target {
            match next.next() {
                Some(t) => {
                    content.push_str(t);
                    content.push_str("\n\n");
                }
                None => break,
            }
        }
        let mut cut = target.min(content.len());
        while !content.is_char_boundary(cut) {
            cut -= 1;
        }
        content.truncate(cut);
        out.push(chat_body(&[content.as_str()]));
    }
    out
}
