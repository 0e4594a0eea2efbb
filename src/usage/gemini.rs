//! Gemini API / Vertex AI usage: whole answers ([`from_json`]) and `streamGenerateContent` streams
//! ([`GeminiScanner`]: SSE with `alt=sse`, or the streamed JSON array without it).
//!
//! # `usageMetadata` → [`Usage`] (what Google bills)
//! | Google | meaning | here |
//! |---|---|---|
//! | `promptTokenCount` | the prompt, cached content included | prompt |
//! | `toolUsePromptTokenCount` | results of Google-run tools (search, code execution) fed back to the model, billed as input | added to prompt |
//! | `cachedContentTokenCount` | the part of the prompt served from a context cache (billed at a discount) | cached (⊆ prompt) |
//! | `candidatesTokenCount` | generated answer tokens, every candidate | completion |
//! | `thoughtsTokenCount` | thinking tokens, billed as output | added to completion, and reasoning |
//! | `totalTokenCount` | the sum of the above | when `candidatesTokenCount` and `thoughtsTokenCount` are both absent (proto3 JSON leaves zeros out), completion = total − prompt |
//!
//! A `usageMetadata` without `promptTokenCount` is no usage (not even a zero prompt is implied).
//! Streams carry `usageMetadata` on every chunk, cumulative: the last one wins. A stream completed
//! when a chunk carried a `finishReason` (or `promptFeedback.blockReason`); Gemini ends its streams
//! by closing them, with no end marker. An `error` chunk ends it without completing it.

use super::json::uint;
use super::{Forward, ScanOutput, Source, Usage};
use serde::Deserialize;
use serde_json::{Map, Value};

/// Largest SSE event or array element held to be read (64 KiB); a larger one is passed through and
/// all its bytes count as content (it is never a usage-only chunk).
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;

/// Reads a `usageMetadata` object (see the module table).
pub fn usage_metadata(u: &Map<String, Value>) -> Option<Usage> {
    let prompt = uint(u, "promptTokenCount")?;
    let tool = uint(u, "toolUsePromptTokenCount").unwrap_or(0);
    let cached = uint(u, "cachedContentTokenCount").unwrap_or(0);
    let candidates = uint(u, "candidatesTokenCount");
    let thoughts = uint(u, "thoughtsTokenCount");
    let prompt_all = prompt.saturating_add(tool);
    let completion = match (candidates, thoughts) {
        (None, None) => uint(u, "totalTokenCount").map_or(0, |t| t.saturating_sub(prompt_all)),
        (c, t) => c.unwrap_or(0).saturating_add(t.unwrap_or(0)),
    };
    Some(Usage {
        prompt_tokens: prompt_all,
        completion_tokens: completion,
        cached_tokens: cached.min(prompt_all),
        reasoning_tokens: thoughts.unwrap_or(0).min(completion),
        source: Source::Provider,
    })
}

#[derive(Deserialize)]
struct MetadataOnly {
    #[serde(rename = "usageMetadata")]
    usage_metadata: Option<Value>,
}

/// Usage of a whole answer: its `usageMetadata`; for a streamed JSON array read whole, the last
/// element's that has one.
pub fn from_json(body: &[u8]) -> Option<Usage> {
    if body.trim_ascii_start().first() == Some(&b'[') {
        let all: Vec<MetadataOnly> = serde_json::from_slice(body).ok()?;
        return all.iter().rev().find_map(|m| {
            m.usage_metadata
                .as_ref()?
                .as_object()
                .and_then(usage_metadata)
        });
    }
    let top: MetadataOnly = serde_json::from_slice(body).ok()?;
    usage_metadata(top.usage_metadata?.as_object()?)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing but whitespace seen yet.
    Unknown,
    /// `data: {…}` events.
    Sse,
    /// `[{…},\r\n{…}]`.
    Array,
}

/// Incremental reader of a `streamGenerateContent` answer, SSE or JSON array (told apart by its first
/// byte). Never changes the stream.
#[derive(Debug)]
pub struct GeminiScanner {
    mode: Mode,
    /// SSE: the current line; array: the current element.
    cur: Vec<u8>,
    /// SSE: the current event's data.
    data: Vec<u8>,
    /// The current event or element went over [`MAX_CHUNK_BYTES`]: its bytes are counted, not kept.
    over: bool,
    over_bytes: u64,
    // Array mode: nesting, inside a string, after a backslash.
    depth: u32,
    in_str: bool,
    esc: bool,
    usage: Option<Usage>,
    finished: bool,
    error: bool,
    content_bytes: u64,
}

impl Default for GeminiScanner {
    fn default() -> Self {
        GeminiScanner::new()
    }
}

impl GeminiScanner {
    /// A scanner for one answer.
    pub fn new() -> GeminiScanner {
        GeminiScanner {
            mode: Mode::Unknown,
            cur: Vec::new(),
            data: Vec::new(),
            over: false,
            over_bytes: 0,
            depth: 0,
            in_str: false,
            esc: false,
            usage: None,
            finished: false,
            error: false,
            content_bytes: 0,
        }
    }

    /// Feeds the next response chunk; always forwarded unchanged.
    pub fn feed(&mut self, chunk: &[u8]) -> ScanOutput {
        let mut rest = chunk;
        if self.mode == Mode::Unknown {
            let start = rest.iter().position(|b| !b.is_ascii_whitespace());
            match start.and_then(|i| rest.get(i).map(|b| (i, *b))) {
                None => rest = &[],
                Some((i, b)) => {
                    self.mode = if b == b'[' { Mode::Array } else { Mode::Sse };
                    rest = rest.get(i..).unwrap_or_default();
                }
            }
        }
        match self.mode {
            Mode::Sse => self.sse(rest),
            Mode::Array => self.array(rest),
            Mode::Unknown => {}
        }
        ScanOutput {
            forward: Forward::Unchanged,
        }
    }

    /// End of the stream: a last SSE event without its blank line is read. Nothing to append.
    pub fn finish(&mut self) -> Vec<u8> {
        if self.mode == Mode::Sse {
            if !self.cur.is_empty() {
                self.line();
            }
            self.dispatch();
        }
        Vec::new()
    }

    /// The latest `usageMetadata`.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// A chunk carried a finish reason (or a block reason) and no error chunk came.
    pub fn completed(&self) -> bool {
        self.finished && !self.error
    }

    /// Bytes of generated text and function-call arguments seen, plus every byte of a chunk too large
    /// to read (errs high).
    pub fn content_bytes(&self) -> u64 {
        self.content_bytes.saturating_add(self.over_bytes)
    }

    fn sse(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                self.line();
            } else if self.cur.len() < MAX_CHUNK_BYTES {
                self.cur.push(b);
            } else {
                self.over = true;
                self.over_bytes = self.over_bytes.saturating_add(1);
            }
        }
    }

    fn line(&mut self) {
        let mut line = std::mem::take(&mut self.cur);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.is_empty() {
            self.dispatch();
            return;
        }
        if let Some(v) = line.strip_prefix(b"data:") {
            let v = v.strip_prefix(b" ").unwrap_or(v);
            if !self.data.is_empty() {
                self.data.push(b'\n');
            }
            if self.data.len().saturating_add(v.len()) <= MAX_CHUNK_BYTES {
                self.data.extend_from_slice(v);
            } else {
                self.over = true;
                self.over_bytes = self.over_bytes.saturating_add(v.len() as u64);
            }
        }
    }

    fn dispatch(&mut self) {
        let data = std::mem::take(&mut self.data);
        if self.over {
            self.over = false;
            self.over_bytes = self.over_bytes.saturating_add(data.len() as u64);
            return;
        }
        if !data.is_empty() {
            self.chunk(&data);
        }
    }

    fn array(&mut self, bytes: &[u8]) {
        for &b in bytes {
            let inside = self.depth >= 2 || (self.depth == 1 && b == b'{' && !self.in_str);
            if self.in_str {
                if self.esc {
                    self.esc = false;
                } else if b == b'\\' {
                    self.esc = true;
                } else if b == b'"' {
                    self.in_str = false;
                }
            } else {
                match b {
                    b'"' => self.in_str = true,
                    b'[' | b'{' => self.depth = self.depth.saturating_add(1),
                    b']' | b'}' => self.depth = self.depth.saturating_sub(1),
                    _ => {}
                }
            }
            if inside {
                if self.cur.len() < MAX_CHUNK_BYTES {
                    self.cur.push(b);
                } else {
                    self.over = true;
                    self.over_bytes = self.over_bytes.saturating_add(1);
                }
                if self.depth == 1 && !self.in_str {
                    // An element closed.
                    let elem = std::mem::take(&mut self.cur);
                    if self.over {
                        self.over = false;
                        self.over_bytes = self.over_bytes.saturating_add(elem.len() as u64);
                    } else {
                        self.chunk(&elem);
                    }
                }
            }
        }
    }

    /// One `GenerateContentResponse`.
    fn chunk(&mut self, json: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(json) else {
            return;
        };
        let Some(o) = v.as_object() else { return };
        if o.contains_key("error") {
            self.error = true;
            return;
        }
        if let Some(u) = o
            .get("usageMetadata")
            .and_then(Value::as_object)
            .and_then(usage_metadata)
        {
            self.usage = Some(u);
        }
        if v.pointer("/promptFeedback/blockReason")
            .is_some_and(|r| !r.is_null())
        {
            self.finished = true;
        }
        for c in o
            .get("candidates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if c.get("finishReason")
                .and_then(Value::as_str)
                .is_some_and(|r| !r.is_empty() && r != "FINISH_REASON_UNSPECIFIED")
            {
                self.finished = true;
            }
            let parts = c.pointer("/content/parts").and_then(Value::as_array);
            for p in parts.into_iter().flatten() {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    self.content_bytes = self.content_bytes.saturating_add(t.len() as u64);
                }
                if let Some(f) = p.get("functionCall") {
                    let n = serde_json::to_string(f).map_or(0, |s| s.len());
                    self.content_bytes = self.content_bytes.saturating_add(n as u64);
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn u(p: u64, c: u64, cached: u64, r: u64) -> Usage {
        Usage {
            prompt_tokens: p,
            completion_tokens: c,
            cached_tokens: cached,
            reasoning_tokens: r,
            source: Source::Provider,
        }
    }

    #[test]
    fn usage_metadata_maps_onto_what_google_bills() {
        let body = br#"{"candidates":[{"content":{"parts":[{"text":"hi"}],"role":"model"},"finishReason":"STOP"}],
            "usageMetadata":{"promptTokenCount":100,"candidatesTokenCount":20,"thoughtsTokenCount":30,
            "cachedContentTokenCount":64,"toolUsePromptTokenCount":5,"totalTokenCount":155},"modelVersion":"gemini-2.5-flash"}"#;
        assert_eq!(from_json(body), Some(u(105, 50, 64, 30)));
        // Zeros are left out by proto3 JSON: the total says what was generated.
        assert_eq!(
            from_json(br#"{"usageMetadata":{"promptTokenCount":9,"totalTokenCount":12}}"#),
            Some(u(9, 3, 0, 0))
        );
        assert_eq!(
            from_json(br#"{"usageMetadata":{"promptTokenCount":9,"totalTokenCount":9}}"#),
            Some(u(9, 0, 0, 0))
        );
        for none in [
            &br#"{"usageMetadata":{"candidatesTokenCount":9}}"#[..],
            br#"{"usageMetadata":null}"#,
            br#"{}"#,
            b"not json",
            br#"{"usageMetadata":{"promptTokenCount":"9"}}"#,
        ] {
            assert_eq!(from_json(none), None, "{}", String::from_utf8_lossy(none));
        }
        let array = br#"[{"candidates":[],"usageMetadata":{"promptTokenCount":3}},
            {"candidates":[],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":7}}]"#;
        assert_eq!(from_json(array), Some(u(3, 7, 0, 0)));
    }

    const SSE: &[u8] = b"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hel\"}],\"role\": \"model\"}}],\"usageMetadata\": {\"promptTokenCount\": 8,\"totalTokenCount\": 8},\"modelVersion\": \"gemini-2.5-flash\"}\r\n\r\n\
data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"lo\"}],\"role\": \"model\"},\"finishReason\": \"STOP\"}],\"usageMetadata\": {\"promptTokenCount\": 8,\"candidatesTokenCount\": 2,\"thoughtsTokenCount\": 4,\"totalTokenCount\": 14}}\r\n\r\n";

    #[test]
    fn an_sse_stream_reports_the_last_usage_and_completes_on_a_finish_reason() {
        for cut in 0..SSE.len() {
            let mut s = GeminiScanner::new();
            assert_eq!(s.feed(&SSE[..cut]).forward, Forward::Unchanged);
            s.feed(&SSE[cut..]);
            s.finish();
            assert_eq!(s.usage(), Some(u(8, 6, 0, 4)), "cut {cut}");
            assert!(s.completed());
            assert_eq!(s.content_bytes(), 5);
        }
        let first_event = SSE.iter().position(|&b| b == b'\r').unwrap() + 4;
        let mut s = GeminiScanner::new();
        s.feed(&SSE[..first_event]);
        assert!(!s.completed(), "no finish reason yet");
        assert_eq!(s.usage(), Some(u(8, 0, 0, 0)));
    }

    #[test]
    fn a_json_array_stream_is_read_element_by_element() {
        let stream =
            br#"[{"candidates": [{"content": {"parts": [{"text": "a \"quoted\" ]} brace"}]}}],
"usageMetadata": {"promptTokenCount": 5}}
,
{"candidates": [{"content": {"parts": [{"text": "!"}]},"finishReason": "MAX_TOKENS"}],
"usageMetadata": {"promptTokenCount": 5,"candidatesTokenCount": 3,"totalTokenCount": 8}}
]"#;
        for cut in 0..stream.len() {
            let mut s = GeminiScanner::new();
            s.feed(&stream[..cut]);
            s.feed(&stream[cut..]);
            s.finish();
            assert_eq!(s.usage(), Some(u(5, 3, 0, 0)), "cut {cut}");
            assert!(s.completed());
            assert_eq!(s.content_bytes(), "a \"quoted\" ]} brace".len() as u64 + 1);
        }
    }

    #[test]
    fn an_error_chunk_or_an_oversized_chunk_is_handled() {
        let mut s = GeminiScanner::new();
        s.feed(b"data: {\"candidates\":[{\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":1}}\n\n");
        s.feed(b"data: {\"error\":{\"code\":500,\"message\":\"x\",\"status\":\"INTERNAL\"}}\n\n");
        assert!(!s.completed());
        let big = format!(
            "data: {{\"candidates\":[{{\"content\":{{\"parts\":[{{\"text\":\"{}\"}}]}}}}]}}\n\n",
            "x".repeat(MAX_CHUNK_BYTES + 10)
        );
        let mut s = GeminiScanner::new();
        s.feed(big.as_bytes());
        s.feed(b"data: {\"candidates\":[{\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":2,\"candidatesTokenCount\":1}}\n\n");
        assert!(s.content_bytes() > MAX_CHUNK_BYTES as u64);
        assert_eq!(s.usage(), Some(u(2, 1, 0, 0)));
        assert!(s.completed());
    }
}
