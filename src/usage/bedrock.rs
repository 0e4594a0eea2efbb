//! Bedrock usage: Converse answers ([`from_converse_json`]), `invoke` answers ([`from_invoke`]), and
//! both event streams ([`EventStreamScanner`]).
//!
//! # Normalization (to OpenAI's meaning, see [`super::Usage`])
//! * Converse `usage`: `inputTokens` excludes the prompt cache (as Anthropic's `input_tokens`), so
//!   prompt = `inputTokens + cacheReadInputTokens + cacheWriteInputTokens`, cached =
//!   `cacheReadInputTokens`, completion = `outputTokens`. Streamed: the `metadata` event's `usage`.
//! * `invoke`: Bedrock's own `x-amzn-bedrock-input-token-count` / `x-amzn-bedrock-output-token-count`
//!   headers first (every model), else the model's body: Anthropic's `usage`, Nova's `usage`
//!   (`inputTokens`, `outputTokens`, cache fields as Converse), Llama's `prompt_token_count` +
//!   `generation_token_count`, Titan's `inputTextTokenCount` + `results[].tokenCount`.
//!   Streamed: each `chunk` event's `bytes` (base64) is one of the model's own events; the last one
//!   carries `amazon-bedrock-invocationMetrics` (`inputTokenCount`, `outputTokenCount`, and the cache
//!   counts for models that cache), which settles it; Anthropic's `message_start` / `message_delta`
//!   usage is read too, for a stream cut before that last event.
//!
//! # Completion
//! A Converse stream completed when it carried `messageStop` and `metadata`; an invoke stream when
//! its last event carried `amazon-bedrock-invocationMetrics`. An `exception` message (throttling, a
//! model stream error, …) ends the stream without completing it. A frame that fails its checks
//! ([`super::eventstream`]) makes the stream unreadable: no usage is trusted from it at all (it is
//! settled as a stream without usage), and every byte from that frame on counts as content.

use super::eventstream::{base64_decode, Decoder, Message};
use super::json::uint;
use super::{ScanOutput, Source, Usage};
use crate::usage::Forward;
use serde::Deserialize;
use serde_json::{Map, Value};

/// Converse (and Nova) usage: `inputTokens`, `outputTokens`, `cacheReadInputTokens`,
/// `cacheWriteInputTokens`; `None` unless both input and output counts are there.
pub fn converse_usage(u: &Map<String, Value>) -> Option<Usage> {
    let input = uint(u, "inputTokens")?;
    let output = uint(u, "outputTokens")?;
    let read = uint(u, "cacheReadInputTokens").unwrap_or(0);
    let write = uint(u, "cacheWriteInputTokens").unwrap_or(0);
    let prompt = input.saturating_add(read).saturating_add(write);
    Some(Usage {
        prompt_tokens: prompt,
        completion_tokens: output,
        cached_tokens: read.min(prompt),
        reasoning_tokens: 0,
        source: Source::Provider,
    })
}

#[derive(Deserialize)]
struct UsageOnly {
    usage: Option<Value>,
}

/// Usage of a whole Converse answer (its top-level `usage`).
pub fn from_converse_json(body: &[u8]) -> Option<Usage> {
    let top: UsageOnly = serde_json::from_slice(body).ok()?;
    converse_usage(top.usage?.as_object()?)
}

/// Usage of a whole `invoke` answer: Bedrock's token-count headers (as Envoy hands them over) when
/// both are there, else what the model's body reports (see the module docs).
pub fn from_invoke(
    body: &[u8],
    input_header: Option<&str>,
    output_header: Option<&str>,
) -> Option<Usage> {
    if let (Some(i), Some(o)) = (input_header, output_header) {
        if let (Ok(i), Ok(o)) = (i.trim().parse::<u64>(), o.trim().parse::<u64>()) {
            return Some(Usage {
                source: Source::Provider,
                ..Usage::estimate(i, o)
            });
        }
    }
    let v: Value = serde_json::from_slice(body).ok()?;
    invoke_body_usage(v.as_object()?)
}

fn invoke_body_usage(o: &Map<String, Value>) -> Option<Usage> {
    if let Some(u) = o.get("usage").and_then(Value::as_object) {
        return converse_usage(u).or_else(|| super::complete_usage(u));
    }
    if let (Some(p), Some(c)) = (
        uint(o, "prompt_token_count"),
        uint(o, "generation_token_count"),
    ) {
        return Some(Usage {
            source: Source::Provider,
            ..Usage::estimate(p, c)
        });
    }
    if let Some(p) = uint(o, "inputTextTokenCount") {
        let c = o
            .get("results")?
            .as_array()?
            .iter()
            .map(|r| r.get("tokenCount").and_then(Value::as_u64))
            .sum::<Option<u64>>()?;
        return Some(Usage {
            source: Source::Provider,
            ..Usage::estimate(p, c)
        });
    }
    None
}

/// `amazon-bedrock-invocationMetrics` of an invoke stream's last event.
fn invocation_metrics(m: &Map<String, Value>) -> Option<Usage> {
    let input = uint(m, "inputTokenCount")?;
    let output = uint(m, "outputTokenCount")?;
    let read = uint(m, "cacheReadInputTokenCount").unwrap_or(0);
    let write = uint(m, "cacheWriteInputTokenCount").unwrap_or(0);
    let prompt = input.saturating_add(read).saturating_add(write);
    Some(Usage {
        prompt_tokens: prompt,
        completion_tokens: output,
        cached_tokens: read.min(prompt),
        reasoning_tokens: 0,
        source: Source::Provider,
    })
}

/// Which Bedrock stream a scanner reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BedrockStream {
    /// `converse-stream`.
    Converse,
    /// `invoke-with-response-stream`.
    Invoke,
}

/// Incremental reader of a Bedrock event stream: usage, completion and streamed content bytes.
/// Never changes the stream (every chunk is forwarded as it came).
#[derive(Debug)]
pub struct EventStreamScanner {
    which: BedrockStream,
    decoder: Decoder,
    usage: Option<Usage>,
    /// Anthropic events inside an invoke stream: input side from `message_start`, output from
    /// `message_delta` (used only when the invocation metrics never came).
    anthropic_input: Option<(u64, u64, u64)>,
    anthropic_output: Option<u64>,
    message_stop: bool,
    metadata: bool,
    exception: Option<String>,
    content_bytes: u64,
}

impl EventStreamScanner {
    /// A scanner for one response stream.
    pub fn new(which: BedrockStream) -> EventStreamScanner {
        EventStreamScanner {
            which,
            decoder: Decoder::default(),
            usage: None,
            anthropic_input: None,
            anthropic_output: None,
            message_stop: false,
            metadata: false,
            exception: None,
            content_bytes: 0,
        }
    }

    /// Feeds the next response chunk; the chunk is always forwarded unchanged.
    pub fn feed(&mut self, chunk: &[u8]) -> ScanOutput {
        let mut msgs = Vec::new();
        self.decoder.feed(chunk, &mut |m| msgs.push(m));
        for m in msgs {
            self.message(&m);
        }
        ScanOutput {
            forward: Forward::Unchanged,
        }
    }

    /// End of the stream (a message left half-read makes it unreadable). Nothing to append.
    pub fn finish(&mut self) -> Vec<u8> {
        self.decoder.finish();
        Vec::new()
    }

    /// The provider's usage; `None` while it has not come, and always once the stream is unreadable.
    pub fn usage(&self) -> Option<Usage> {
        if self.unreadable() {
            return None;
        }
        if self.usage.is_some() {
            return self.usage;
        }
        let (input, read, write) = self.anthropic_input?;
        let output = self.anthropic_output?;
        let prompt = input.saturating_add(read).saturating_add(write);
        Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: output,
            cached_tokens: read.min(prompt),
            reasoning_tokens: 0,
            source: Source::Provider,
        })
    }

    /// The stream ended as Bedrock ends a whole answer (see the module docs).
    pub fn completed(&self) -> bool {
        if self.unreadable() || self.exception.is_some() {
            return false;
        }
        match self.which {
            BedrockStream::Converse => self.message_stop && self.metadata,
            BedrockStream::Invoke => self.metadata,
        }
    }

    /// Bytes of generated content seen (text, tool input, reasoning), plus every byte from a frame
    /// that broke the stream on (errs high).
    pub fn content_bytes(&self) -> u64 {
        self.content_bytes
            .saturating_add(self.decoder.unframed_bytes())
    }

    /// A frame failed its checks: nothing the stream says is trusted.
    pub fn unreadable(&self) -> bool {
        self.decoder.broken().is_some()
    }

    /// The exception the stream ended with (`:exception-type`, or `:error-code`), if any.
    pub fn exception(&self) -> Option<&str> {
        self.exception.as_deref()
    }

    fn message(&mut self, m: &Message) {
        match m.header(":message-type") {
            Some("event") | None => {}
            Some("exception") => {
                self.exception = Some(
                    m.header(":exception-type")
                        .unwrap_or("exception")
                        .to_string(),
                );
                return;
            }
            Some(_) => {
                self.exception = Some(m.header(":error-code").unwrap_or("error").to_string());
                return;
            }
        }
        let Ok(v) = serde_json::from_slice::<Value>(&m.payload) else {
            return;
        };
        let Some(o) = v.as_object() else { return };
        match m.header(":event-type").unwrap_or("") {
            "contentBlockDelta" => {
                if let Some(d) = o.get("delta").and_then(Value::as_object) {
                    self.count(d.get("text"));
                    self.count(d.get("toolUse").and_then(|t| t.get("input")));
                    self.count(d.get("reasoningContent").and_then(|r| r.get("text")));
                }
            }
            "messageStop" => self.message_stop = true,
            "metadata" => {
                if let Some(u) = o
                    .get("usage")
                    .and_then(Value::as_object)
                    .and_then(converse_usage)
                {
                    self.usage = Some(u);
                    self.metadata = true;
                }
            }
            "chunk" => {
                let decoded = o
                    .get("bytes")
                    .and_then(Value::as_str)
                    .and_then(|b| base64_decode(b.as_bytes()));
                if let Some(inner) = decoded.and_then(|d| serde_json::from_slice::<Value>(&d).ok())
                {
                    self.model_event(&inner);
                }
            }
            _ => {}
        }
    }

    /// One of the model's own events inside an invoke stream's chunk.
    fn model_event(&mut self, e: &Value) {
        if let Some(u) = e
            .get("amazon-bedrock-invocationMetrics")
            .and_then(Value::as_object)
            .and_then(invocation_metrics)
        {
            self.usage = Some(u);
            self.metadata = true;
        }
        match e.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                if let Some(u) = e.pointer("/message/usage").and_then(Value::as_object) {
                    if let Some(i) = uint(u, "input_tokens") {
                        self.anthropic_input = Some((
                            i,
                            uint(u, "cache_read_input_tokens").unwrap_or(0),
                            uint(u, "cache_creation_input_tokens").unwrap_or(0),
                        ));
                    }
                }
            }
            Some("message_delta") => {
                if let Some(n) = e
                    .get("usage")
                    .and_then(Value::as_object)
                    .and_then(|u| uint(u, "output_tokens"))
                {
                    self.anthropic_output = Some(n);
                }
            }
            Some("content_block_delta") => {
                if let Some(d) = e.get("delta").and_then(Value::as_object) {
                    for k in ["text", "partial_json", "thinking"] {
                        self.count(d.get(k));
                    }
                }
            }
            _ => {
                // Other models' text fields (Llama `generation`, Titan `outputText`, Nova's
                // `contentBlockDelta.delta.text`, Mistral/OpenAI-shaped `choices`).
                for k in ["generation", "outputText", "completion", "text"] {
                    self.count(e.get(k));
                }
                self.count(e.pointer("/contentBlockDelta/delta/text"));
                for c in e
                    .get("choices")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    self.count(c.pointer("/delta/content"));
                    self.count(c.get("text"));
                }
            }
        }
    }

    fn count(&mut self, v: Option<&Value>) {
        if let Some(s) = v.and_then(Value::as_str) {
            self.content_bytes = self.content_bytes.saturating_add(s.len() as u64);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::super::eventstream::encode;
    use super::*;

    fn u(p: u64, c: u64, cached: u64) -> Usage {
        Usage {
            prompt_tokens: p,
            completion_tokens: c,
            cached_tokens: cached,
            reasoning_tokens: 0,
            source: Source::Provider,
        }
    }

    fn event(ty: &str, payload: &str) -> Vec<u8> {
        encode(
            &[
                (":event-type", ty),
                (":content-type", "application/json"),
                (":message-type", "event"),
            ],
            payload.as_bytes(),
        )
    }

    fn converse_stream() -> Vec<u8> {
        [
            event("messageStart", r#"{"role":"assistant"}"#),
            event("contentBlockDelta", r#"{"contentBlockIndex":0,"delta":{"text":"Hello"}}"#),
            event("contentBlockDelta", r#"{"contentBlockIndex":0,"delta":{"text":" world"}}"#),
            event("contentBlockStop", r#"{"contentBlockIndex":0}"#),
            event("messageStop", r#"{"stopReason":"end_turn"}"#),
            event(
                "metadata",
                r#"{"usage":{"inputTokens":12,"outputTokens":5,"totalTokens":117,"cacheReadInputTokens":100},"metrics":{"latencyMs":300}}"#,
            ),
        ]
        .concat()
    }

    #[test]
    fn a_converse_answer_adds_the_cache_to_the_prompt() {
        let body = br#"{"output":{"message":{"role":"assistant","content":[{"text":"hi"}]}},"stopReason":"end_turn",
            "usage":{"inputTokens":10,"outputTokens":4,"totalTokens":64,"cacheReadInputTokens":30,"cacheWriteInputTokens":20}}"#;
        assert_eq!(from_converse_json(body), Some(u(60, 4, 30)));
        assert_eq!(from_converse_json(br#"{"usage":{"inputTokens":10}}"#), None);
        assert_eq!(from_converse_json(b"nope"), None);
    }

    #[test]
    fn an_invoke_answer_is_settled_from_bedrocks_headers_then_the_body() {
        assert_eq!(from_invoke(b"{}", Some("7"), Some(" 3")), Some(u(7, 3, 0)));
        let anthropic = br#"{"type":"message","usage":{"input_tokens":9,"output_tokens":2,"cache_read_input_tokens":4}}"#;
        assert_eq!(from_invoke(anthropic, None, None), Some(u(13, 2, 4)));
        assert_eq!(
            from_invoke(anthropic, Some("x"), Some("1")),
            Some(u(13, 2, 4))
        );
        let nova = br#"{"output":{},"usage":{"inputTokens":5,"outputTokens":6}}"#;
        assert_eq!(from_invoke(nova, None, None), Some(u(5, 6, 0)));
        let llama = br#"{"generation":"hi","prompt_token_count":11,"generation_token_count":8}"#;
        assert_eq!(from_invoke(llama, None, None), Some(u(11, 8, 0)));
        let titan = br#"{"inputTextTokenCount":4,"results":[{"tokenCount":3},{"tokenCount":2}]}"#;
        assert_eq!(from_invoke(titan, None, None), Some(u(4, 5, 0)));
        assert_eq!(from_invoke(br#"{"generation":"x"}"#, None, None), None);
    }

    #[test]
    fn a_converse_stream_reports_its_metadata_usage_whatever_the_splits() {
        let stream = converse_stream();
        for cut in 0..stream.len() {
            let mut s = EventStreamScanner::new(BedrockStream::Converse);
            assert_eq!(s.feed(&stream[..cut]).forward, Forward::Unchanged);
            s.feed(&stream[cut..]);
            s.finish();
            assert_eq!(s.usage(), Some(u(112, 5, 100)), "cut {cut}");
            assert!(s.completed());
            assert_eq!(s.content_bytes(), 11);
        }
    }

    #[test]
    fn a_stream_cut_before_its_metadata_has_no_usage_and_did_not_complete() {
        let stream = converse_stream();
        let cut = stream.len() - 60;
        let mut s = EventStreamScanner::new(BedrockStream::Converse);
        s.feed(&stream[..cut]);
        s.finish();
        assert_eq!(s.usage(), None);
        assert!(!s.completed());
        assert!(s.unreadable(), "a half message at the end");
        assert!(s.content_bytes() >= 11);
    }

    #[test]
    fn a_corrupt_frame_makes_the_whole_stream_untrusted() {
        let mut stream = converse_stream();
        // Corrupt the payload of the last (metadata) message: its CRC no longer matches.
        let n = stream.len();
        stream[n - 10] ^= 0x01;
        let mut s = EventStreamScanner::new(BedrockStream::Converse);
        s.feed(&stream);
        s.finish();
        assert!(s.unreadable());
        assert_eq!(s.usage(), None);
        assert!(!s.completed());
        // A corrupt frame first: nothing after it is read, even a good metadata event.
        let mut bad = event("contentBlockDelta", r#"{"delta":{"text":"x"}}"#);
        bad[14] ^= 0x40;
        bad.extend(converse_stream());
        let mut s = EventStreamScanner::new(BedrockStream::Converse);
        s.feed(&bad);
        assert_eq!(s.usage(), None);
        assert!(s.content_bytes() as usize >= converse_stream().len());
    }

    #[test]
    fn an_exception_ends_the_stream_without_completing_it() {
        let mut stream = converse_stream();
        stream.truncate(stream.len() - event("metadata", "{}").len());
        let n = stream.len();
        let _ = n;
        let exc = encode(
            &[
                (":exception-type", "throttlingException"),
                (":content-type", "application/json"),
                (":message-type", "exception"),
            ],
            br#"{"message":"Too many tokens"}"#,
        );
        let stream = [converse_stream(), exc].concat();
        let mut s = EventStreamScanner::new(BedrockStream::Converse);
        s.feed(&stream);
        assert_eq!(s.exception(), Some("throttlingException"));
        assert!(!s.completed());
    }

    fn chunk(inner: &str) -> Vec<u8> {
        let b64 = base64(inner.as_bytes());
        event("chunk", &format!(r#"{{"bytes":"{b64}"}}"#))
    }

    fn base64(b: &[u8]) -> String {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for c in b.chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for i in 0..4 {
                if i <= c.len() {
                    out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[test]
    fn an_invoke_stream_of_anthropic_events_is_settled_by_the_invocation_metrics() {
        let stream = [
            chunk(
                r#"{"type":"message_start","message":{"usage":{"input_tokens":20,"output_tokens":1}}}"#,
            ),
            chunk(
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hey"}}"#,
            ),
            chunk(
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9}}"#,
            ),
            chunk(
                r#"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":21,"outputTokenCount":9,"invocationLatency":10,"firstByteLatency":5}}"#,
            ),
        ];
        let whole = stream.concat();
        let mut s = EventStreamScanner::new(BedrockStream::Invoke);
        s.feed(&whole);
        assert_eq!(s.usage(), Some(u(21, 9, 0)));
        assert!(s.completed());
        assert_eq!(s.content_bytes(), 3);
        // Without the last event: Anthropic's own counts, not completed.
        let mut s = EventStreamScanner::new(BedrockStream::Invoke);
        s.feed(&stream[..3].concat());
        assert_eq!(s.usage(), Some(u(20, 9, 0)));
        assert!(!s.completed());
        // A Llama stream: text and the metrics only.
        let mut s = EventStreamScanner::new(BedrockStream::Invoke);
        s.feed(&chunk(r#"{"generation":"abc","prompt_token_count":null}"#));
        s.feed(&chunk(r#"{"generation":"","amazon-bedrock-invocationMetrics":{"inputTokenCount":4,"outputTokenCount":2}}"#));
        assert_eq!(s.usage(), Some(u(4, 2, 0)));
        assert_eq!(s.content_bytes(), 3);
    }
}
