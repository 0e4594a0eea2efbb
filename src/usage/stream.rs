//! One type for every response stream the filter reads ([`StreamScanner`]), so that the request flow
//! can hold any family's scanner: SSE (OpenAI, Anthropic), Gemini (SSE or a JSON array) and Bedrock's
//! AWS event stream. Each feeds chunk by chunk and answers the same questions.

use super::bedrock::{BedrockStream, EventStreamScanner};
use super::gemini::GeminiScanner;
use super::{ScanOutput, SseScanner, Usage};
use crate::estimate::ApiKind;

/// A response stream's scanner, by API.
#[derive(Debug)]
pub enum StreamScanner {
    /// OpenAI and Anthropic server-sent events (also Claude on Vertex AI's `streamRawPredict`).
    Sse(SseScanner),
    /// Gemini / Vertex AI `streamGenerateContent`.
    Gemini(GeminiScanner),
    /// Bedrock `converse-stream` / `invoke-with-response-stream`.
    EventStream(EventStreamScanner),
}

impl StreamScanner {
    /// The scanner for a streamed answer of `kind`; `strip_usage_chunk` as [`SseScanner::new`] (only
    /// OpenAI's streams have a usage chunk the filter may have asked for).
    pub fn for_kind(kind: ApiKind, strip_usage_chunk: bool) -> StreamScanner {
        match kind {
            ApiKind::GeminiGenerate | ApiKind::GeminiStream => {
                StreamScanner::Gemini(GeminiScanner::new())
            }
            ApiKind::BedrockConverse | ApiKind::BedrockConverseStream => {
                StreamScanner::EventStream(EventStreamScanner::new(BedrockStream::Converse))
            }
            ApiKind::BedrockInvoke | ApiKind::BedrockInvokeStream => {
                StreamScanner::EventStream(EventStreamScanner::new(BedrockStream::Invoke))
            }
            _ => StreamScanner::Sse(SseScanner::new(strip_usage_chunk)),
        }
    }

    /// Feeds the next response chunk; returns what to forward in its place.
    pub fn feed(&mut self, chunk: &[u8]) -> ScanOutput {
        match self {
            StreamScanner::Sse(s) => s.feed(chunk),
            StreamScanner::Gemini(s) => s.feed(chunk),
            StreamScanner::EventStream(s) => s.feed(chunk),
        }
    }

    /// End of stream: bytes to append after the last chunk.
    pub fn finish(&mut self) -> Vec<u8> {
        match self {
            StreamScanner::Sse(s) => s.finish(),
            StreamScanner::Gemini(s) => s.finish(),
            StreamScanner::EventStream(s) => s.finish(),
        }
    }

    /// The provider's usage, once seen (never from an unreadable event stream).
    pub fn usage(&self) -> Option<Usage> {
        match self {
            StreamScanner::Sse(s) => s.usage(),
            StreamScanner::Gemini(s) => s.usage(),
            StreamScanner::EventStream(s) => s.usage(),
        }
    }

    /// The stream ended as its API ends a whole answer.
    pub fn completed(&self) -> bool {
        match self {
            StreamScanner::Sse(s) => s.completed(),
            StreamScanner::Gemini(s) => s.completed(),
            StreamScanner::EventStream(s) => s.completed(),
        }
    }

    /// Generated content bytes seen (to estimate the output of a stream cut short).
    pub fn content_bytes(&self) -> u64 {
        match self {
            StreamScanner::Sse(s) => s.content_bytes(),
            StreamScanner::Gemini(s) => s.content_bytes(),
            StreamScanner::EventStream(s) => s.content_bytes(),
        }
    }
}

/// Usage of a whole (not streamed) answer of `kind`. Bedrock `invoke` answers need Bedrock's
/// `x-amzn-bedrock-input-token-count` / `x-amzn-bedrock-output-token-count` response headers (pass
/// `None` when absent). OpenAI and Anthropic answers are read by
/// [`from_json_with_output`](super::from_json_with_output) (embeddings: [`from_json`](super::from_json)).
pub fn from_answer(
    kind: ApiKind,
    body: &[u8],
    input_header: Option<&str>,
    output_header: Option<&str>,
) -> Option<Usage> {
    match kind {
        ApiKind::GeminiGenerate | ApiKind::GeminiStream => super::gemini::from_json(body),
        ApiKind::BedrockConverse | ApiKind::BedrockConverseStream => {
            super::bedrock::from_converse_json(body)
        }
        ApiKind::BedrockInvoke | ApiKind::BedrockInvokeStream => {
            super::bedrock::from_invoke(body, input_header, output_header)
        }
        ApiKind::Embeddings => super::from_json(body),
        _ => super::from_json_with_output(body),
    }
}
