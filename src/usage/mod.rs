//! Actual token usage from provider responses: whole JSON bodies ([`from_json`]) and SSE streams fed
//! chunk by chunk ([`SseScanner`]). Pure and incremental; the host feeds it what Envoy hands over.
//!
//! # Why
//! A reservation charges an estimate (prompt estimate + max output); the settlement needs what was really
//! used. Non-streamed answers carry `usage` in the body; streamed ones carry it in one late event (OpenAI
//! only when `stream_options.include_usage` is set, which the filter may inject and then strip again so
//! the client sees exactly the stream it asked for). When a stream breaks before its usage, the scanner's
//! count of streamed content bytes gives an estimate of the output.
//!
//! # Normalization
//! Every format is mapped to OpenAI's meaning: `prompt_tokens` includes cached tokens, `completion_tokens`
//! includes reasoning tokens.
//! * OpenAI chat/completions/embeddings: `usage.prompt_tokens`, `usage.completion_tokens`,
//!   `prompt_tokens_details.cached_tokens`, `completion_tokens_details.reasoning_tokens`.
//! * OpenAI responses: `usage.input_tokens`, `usage.output_tokens`, `input_tokens_details.cached_tokens`,
//!   `output_tokens_details.reasoning_tokens` (streamed: `response.completed` → `response.usage`).
//! * Anthropic: `input_tokens` excludes the cache, so prompt = `input_tokens + cache_read_input_tokens +
//!   cache_creation_input_tokens` and cached = `cache_read_input_tokens` (streamed: `message_start`
//!   carries the input side, `message_delta` the cumulative `output_tokens`).
//!
//! * Gemini / Vertex AI: `usageMetadata` (see [`gemini`]); Bedrock: Converse `usage`, `invoke`
//!   token-count headers and bodies, and the AWS event stream's `metadata` event (see [`bedrock`],
//!   [`eventstream`]). [`StreamScanner`] holds any family's stream scanner.
//!
//! # Example
//! ```
//! # use tokengate::usage::*;
//! let mut s = SseScanner::new(true);
//! let out = s.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
//!     data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n");
//! assert_eq!(out.forward, Forward::Replace(
//!     b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n".to_vec()));
//! assert_eq!(s.usage().map(|u| u.prompt_tokens), Some(9));
//! assert!(s.completed());
//! ```

/// Where a [`Usage`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Reported by the provider.
    Provider,
    /// Estimated by the filter (no usage reported, e.g. an aborted stream).
    Estimate,
}

/// Tokens one request used, in OpenAI's meaning (cached ⊆ prompt, reasoning ⊆ completion).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub prompt_tokens: u64,
    /// Output tokens, reasoning ones included.
    pub completion_tokens: u64,
    /// Prompt tokens served from the provider's cache.
    pub cached_tokens: u64,
    /// Output tokens spent on reasoning.
    pub reasoning_tokens: u64,
    /// Reported or estimated.
    pub source: Source,
}

impl Usage {
    /// An estimate (no cached or reasoning split).
    pub fn estimate(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            cached_tokens: 0,
            reasoning_tokens: 0,
            source: Source::Estimate,
        }
    }
}

/// Output tokens estimated from streamed content bytes (≈ 4 bytes per token, rounded up).
pub fn estimate_tokens_from_bytes(bytes: u64) -> u64 {
    bytes.div_ceil(4)
}

pub mod bedrock;
pub mod eventstream;
pub mod gemini;
mod json;
mod sse;
mod stream;

pub use bedrock::{BedrockStream, EventStreamScanner};
pub use gemini::GeminiScanner;
pub use json::{complete_usage, from_json, from_json_with_output, from_usage_object};
pub use sse::{Forward, ScanOutput, SseScanner, DEFAULT_MAX_EVENT_BYTES};
pub use stream::{from_answer, StreamScanner};
