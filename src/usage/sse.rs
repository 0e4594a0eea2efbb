//! Server-sent event streams fed chunk by chunk ([`SseScanner`]): the final usage event (OpenAI's
//! injected `include_usage` chunk stripped again byte-exactly), whether the stream completed, and the
//! streamed content bytes for an estimate when it was cut.

use super::json::{complete_usage, from_value_with, uint};
use super::{Source, Usage};
use serde_json::{Map, Value};

/// What the host does with the chunk it just fed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forward {
    /// Forward the original chunk as is (no copy, no body rewrite).
    Unchanged,
    /// Replace the chunk with these bytes (possibly empty: everything is held back for now).
    Replace(Vec<u8>),
}

/// The result of [`SseScanner::feed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanOutput {
    /// What to send to the client for this chunk.
    pub forward: Forward,
}

/// Default bound of one SSE event kept in memory (64 KiB). Longer events are passed through and only
/// their tail is searched for usage (see [`SseScanner::overflowed`]).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 64 * 1024;
/// How much of an overflowing event's last line is kept to find a late `"usage"` object.
const SALVAGE_TAIL: usize = 8 * 1024;
/// How much of an overflowing event's start is kept to learn its `"type"`.
const HEAD_BYTES: usize = 512;

/// Anthropic streams split usage between `message_start` and `message_delta`.
#[derive(Debug, Clone, Copy, Default)]
struct AnthropicParts {
    input: u64,
    cache_read: u64,
    cache_write: u64,
    output: u64,
    /// An input count was seen (`message_start`'s, or a `message_delta`'s).
    has_input: bool,
    /// A `message_delta` with usage was seen: `output` is the message's final count. Before it, the
    /// `output_tokens` of `message_start` (1) says nothing of what was generated, so the stream has no
    /// usage yet (a stream cut there is charged as one without usage).
    finished: bool,
}

/// Incremental SSE reader: finds usage, the end of the stream and the streamed content size, and
/// optionally strips OpenAI's usage-only chunk (`"choices":[]` with `usage`).
///
/// Feed every response chunk in order with [`feed`](Self::feed); at end of stream call
/// [`finish`](Self::finish) and append what it returns. Handles `\n`, `\r\n` and `\r` line ends, several
/// `data:` lines per event, `event:` lines and `:` comments, and events split across chunks (kept in a
/// carry buffer bounded by `max_event_bytes`).
#[derive(Debug)]
pub struct SseScanner {
    strip: bool,
    max_event: usize,
    /// Raw bytes of the current event not yet forwarded (strip mode only).
    held: Vec<u8>,
    /// Strip mode: the current event overflowed and its bytes now go straight through.
    passthrough: bool,
    /// The previous line ended with `\r`; its end is processed once we know whether `\n` follows.
    cr_pending: bool,
    line: Vec<u8>,
    ev_name: String,
    data: Vec<u8>,
    has_data: bool,
    ev_bytes: usize,
    ev_overflow: bool,
    ov_head: Vec<u8>,
    need_head: bool,
    ov_tail: Vec<u8>,
    // Findings.
    usage: Option<Usage>,
    anthropic: Option<AnthropicParts>,
    completed: bool,
    content_bytes: u64,
    overflowed: bool,
    stripped: u32,
}

impl SseScanner {
    /// A scanner; `strip_usage_chunk` removes OpenAI's usage-only chunk from what is forwarded (set it
    /// only when the filter injected `include_usage` itself).
    pub fn new(strip_usage_chunk: bool) -> Self {
        Self::with_max_event(strip_usage_chunk, DEFAULT_MAX_EVENT_BYTES)
    }

    /// Same as [`new`](Self::new) with another bound for one event held in memory.
    pub fn with_max_event(strip_usage_chunk: bool, max_event_bytes: usize) -> Self {
        Self {
            strip: strip_usage_chunk,
            max_event: max_event_bytes.max(HEAD_BYTES),
            held: Vec::new(),
            passthrough: false,
            cr_pending: false,
            line: Vec::new(),
            ev_name: String::new(),
            data: Vec::new(),
            has_data: false,
            ev_bytes: 0,
            ev_overflow: false,
            ov_head: Vec::new(),
            need_head: false,
            ov_tail: Vec::new(),
            usage: None,
            anthropic: None,
            completed: false,
            content_bytes: 0,
            overflowed: false,
            stripped: 0,
        }
    }

    /// The provider's final usage, once seen (the latest report wins). Anthropic's only once a
    /// `message_delta` carried the output count: `message_start`'s own usage is not the message's.
    pub fn usage(&self) -> Option<Usage> {
        if self.usage.is_some() {
            return self.usage;
        }
        self.anthropic
            .filter(|a| a.finished && a.has_input)
            .map(|a| {
                let prompt = a
                    .input
                    .saturating_add(a.cache_read)
                    .saturating_add(a.cache_write);
                Usage {
                    prompt_tokens: prompt,
                    completion_tokens: a.output,
                    cached_tokens: a.cache_read.min(prompt),
                    reasoning_tokens: 0,
                    source: Source::Provider,
                }
            })
    }

    /// The stream ended properly: `data: [DONE]`, Anthropic `message_stop`, or a responses-API
    /// `response.completed` / `response.incomplete` / `response.failed`.
    pub fn completed(&self) -> bool {
        self.completed
    }

    /// Bytes of generated content seen so far (text, reasoning, tool-call arguments), to estimate the
    /// output of a stream that broke off ([`estimate_tokens_from_bytes`]). An event over the bound is
    /// not parsed: all its bytes count (also while it is still arriving), which errs high.
    pub fn content_bytes(&self) -> u64 {
        let open = if self.ev_overflow { self.ev_bytes } else { 0 };
        self.content_bytes.saturating_add(open as u64)
    }

    /// Some event was larger than the bound: it was passed through unparsed (only its tail was searched
    /// for usage; its whole size counts in [`content_bytes`](Self::content_bytes)).
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// How many usage-only chunks were removed.
    pub fn stripped(&self) -> u32 {
        self.stripped
    }

    /// Feeds the next response chunk; returns what to forward to the client in its place.
    pub fn feed(&mut self, chunk: &[u8]) -> ScanOutput {
        let held_before = !self.held.is_empty();
        let stripped_before = self.stripped;
        let mut out = Vec::new();
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.cr_pending {
                self.cr_pending = false;
                if let Some((b'\n', after)) = rest.split_first() {
                    self.push_raw(b"\n", &mut out);
                    rest = after;
                }
                self.end_line(&mut out);
                continue;
            }
            match rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
                None => {
                    self.push_raw(rest, &mut out);
                    self.push_line(rest);
                    rest = &[];
                }
                Some(p) => {
                    let (content, tail) = rest.split_at_checked(p).unwrap_or((rest, &[]));
                    self.push_raw(content, &mut out);
                    self.push_line(content);
                    let Some((term, after)) = tail.split_first() else {
                        break;
                    };
                    self.push_raw(std::slice::from_ref(term), &mut out);
                    rest = after;
                    if *term == b'\r' {
                        self.cr_pending = true;
                    } else {
                        self.end_line(&mut out);
                    }
                }
            }
        }
        let unchanged = !self.strip
            || (!held_before && self.held.is_empty() && self.stripped == stripped_before);
        ScanOutput {
            forward: if unchanged {
                Forward::Unchanged
            } else {
                Forward::Replace(out)
            },
        }
    }

    /// End of stream: processes a last event without its blank line and returns the bytes still held
    /// back, to append after the last chunk (always empty when not stripping).
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.cr_pending {
            self.cr_pending = false;
            self.end_line(&mut out);
        }
        if !self.line.is_empty() {
            self.end_line(&mut out);
        }
        if self.has_data || self.ev_overflow || !self.held.is_empty() {
            self.dispatch(&mut out);
        }
        if self.strip {
            out
        } else {
            Vec::new()
        }
    }

    fn push_raw(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        self.ev_bytes = self.ev_bytes.saturating_add(bytes.len());
        if self.strip {
            if self.passthrough {
                out.extend_from_slice(bytes);
            } else {
                self.held.extend_from_slice(bytes);
            }
        }
        if !self.ev_overflow && self.ev_bytes > self.max_event {
            // Step: the event is too large to keep. Remember its start (to learn its type), forward what
            // was held (a usage-only chunk is never this large, so it will not be stripped), and from now
            // on keep only the tail of each line.
            self.ev_overflow = true;
            self.overflowed = true;
            let mut head = std::mem::take(&mut self.data);
            head.truncate(HEAD_BYTES);
            self.ov_head = head;
            self.need_head = true;
            if self.strip {
                self.passthrough = true;
                out.append(&mut self.held);
            }
        }
    }

    fn push_line(&mut self, bytes: &[u8]) {
        self.line.extend_from_slice(bytes);
        if self.need_head {
            self.need_head = false;
            let room = HEAD_BYTES.saturating_sub(self.ov_head.len());
            let take = self
                .line
                .get(..room.min(self.line.len()))
                .unwrap_or_default();
            self.ov_head.extend_from_slice(take);
        }
        if self.ev_overflow && self.line.len() > 2 * SALVAGE_TAIL {
            let cut = self.line.len() - SALVAGE_TAIL;
            self.line.drain(..cut);
        }
    }

    fn end_line(&mut self, out: &mut Vec<u8>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if self.ev_overflow {
            self.ov_tail = line;
            return;
        }
        if line.first() == Some(&b':') {
            return; // comment
        }
        let (name, value) = match line.iter().position(|b| *b == b':') {
            Some(p) => {
                let (n, v) = line.split_at_checked(p).unwrap_or((&line, &[]));
                let v = v.get(1..).unwrap_or_default();
                (n, v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line.as_slice(), &[][..]),
        };
        match name {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.ev_name = String::from_utf8_lossy(value).chars().take(64).collect();
            }
            _ => {}
        }
    }

    /// One event is complete: learn from it, then forward or drop its raw bytes.
    fn dispatch(&mut self, out: &mut Vec<u8>) {
        let drop = if self.ev_overflow {
            self.content_bytes = self.content_bytes.saturating_add(self.ev_bytes as u64);
            self.salvage()
        } else {
            self.inspect()
        };
        if self.strip {
            if drop {
                self.stripped = self.stripped.saturating_add(1);
            } else {
                out.append(&mut self.held);
            }
        }
        self.held.clear();
        self.passthrough = false;
        self.ev_name.clear();
        self.data.clear();
        self.has_data = false;
        self.ev_bytes = 0;
        self.ev_overflow = false;
        self.ov_head.clear();
        self.need_head = false;
        self.ov_tail.clear();
    }

    /// Reads a complete event; returns true when it must be stripped.
    fn inspect(&mut self) -> bool {
        if !self.has_data {
            return false;
        }
        let data = self.data.as_slice();
        if data.trim_ascii() == b"[DONE]" {
            self.completed = true;
            return false;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return false;
        };
        let Some(obj) = v.as_object() else {
            return false;
        };
        let kind = obj
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(self.ev_name.as_str())
            .to_string();
        match kind.as_str() {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage").and_then(Value::as_object) {
                    self.merge_anthropic(u);
                }
            }
            "message_delta" => {
                if let Some(u) = obj.get("usage").and_then(Value::as_object) {
                    self.merge_anthropic(u);
                    // Only an output count finishes the usage (`"usage":{}` says nothing of it).
                    if let Some(a) = self
                        .anthropic
                        .as_mut()
                        .filter(|_| uint(u, "output_tokens").is_some())
                    {
                        a.finished = true;
                    }
                }
            }
            "message_stop" => self.completed = true,
            "content_block_delta" => {
                if let Some(d) = obj.get("delta").and_then(Value::as_object) {
                    for key in ["text", "partial_json", "thinking"] {
                        self.count(d.get(key));
                    }
                }
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.completed = true;
                if let Some(u) = from_value_with(&v, complete_usage) {
                    self.usage = Some(u);
                }
            }
            k if k.starts_with("response.") && k.ends_with(".delta") => {
                self.count(obj.get("delta"))
            }
            _ => return self.inspect_openai_chunk(obj),
        }
        false
    }

    fn inspect_openai_chunk(&mut self, obj: &Map<String, Value>) -> bool {
        let choices = obj.get("choices").and_then(Value::as_array);
        for c in choices.into_iter().flatten() {
            self.count(c.get("text"));
            if let Some(d) = c.get("delta").and_then(Value::as_object) {
                for key in ["content", "reasoning_content", "reasoning", "refusal"] {
                    self.count(d.get(key));
                }
                for call in d
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    self.count(call.pointer("/function/arguments"));
                }
            }
        }
        let Some(u) = obj.get("usage").and_then(Value::as_object) else {
            return false;
        };
        if let Some(parsed) = complete_usage(u) {
            self.usage = Some(parsed);
        }
        self.strip && choices.is_some_and(Vec::is_empty)
    }

    fn merge_anthropic(&mut self, u: &Map<String, Value>) {
        let a = self.anthropic.get_or_insert_with(AnthropicParts::default);
        if let Some(n) = uint(u, "input_tokens") {
            a.input = n;
            a.has_input = true;
        }
        if let Some(n) = uint(u, "cache_read_input_tokens") {
            a.cache_read = n;
        }
        if let Some(n) = uint(u, "cache_creation_input_tokens") {
            a.cache_write = n;
        }
        if let Some(n) = uint(u, "output_tokens") {
            a.output = n;
        }
    }

    fn count(&mut self, v: Option<&Value>) {
        if let Some(s) = v.and_then(Value::as_str) {
            self.content_bytes = self.content_bytes.saturating_add(s.len() as u64);
        }
    }

    /// An overflowed event is never stripped; look for its type in its head and a `"usage"` object in
    /// the tail of its last line.
    fn salvage(&mut self) -> bool {
        let kind = find_type(&self.ov_head).unwrap_or_else(|| self.ev_name.clone());
        if matches!(
            kind.as_str(),
            "response.completed" | "response.incomplete" | "response.failed"
        ) {
            self.completed = true;
        }
        let tail = &self.ov_tail;
        let needle = b"\"usage\"";
        let mut found = None;
        let mut from = 0usize;
        while let Some(p) = tail
            .get(from..)
            .and_then(|t| t.windows(needle.len()).position(|w| w == needle))
        {
            found = Some(from + p);
            from = from + p + 1;
        }
        let Some(at) = found else { return false };
        let after = tail.get(at + needle.len()..).unwrap_or_default();
        let after = after.trim_ascii_start();
        let Some(after) = after.strip_prefix(b":") else {
            return false;
        };
        let mut it = serde_json::Deserializer::from_slice(after).into_iter::<Value>();
        if let Some(Ok(Value::Object(u))) = it.next() {
            if let Some(parsed) = complete_usage(&u) {
                self.usage = Some(parsed);
            }
        }
        false
    }
}

/// The value of the first `"type":"…"` in `head` (a JSON prefix).
fn find_type(head: &[u8]) -> Option<String> {
    let needle = b"\"type\"";
    let p = head.windows(needle.len()).position(|w| w == needle)?;
    let rest = head
        .get(p + needle.len()..)?
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let rest = rest.strip_prefix(b"\"")?;
    let end = rest.iter().position(|b| *b == b'"')?;
    Some(String::from_utf8_lossy(rest.get(..end)?).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::{estimate_tokens_from_bytes, from_json, from_json_with_output, Source};

    fn u(p: u64, c: u64, cached: u64, r: u64) -> Usage {
        Usage {
            prompt_tokens: p,
            completion_tokens: c,
            cached_tokens: cached,
            reasoning_tokens: r,
            source: Source::Provider,
        }
    }

    /// Feeds `chunks` and returns exactly what the client would receive.
    fn run(s: &mut SseScanner, chunks: &[&[u8]]) -> Vec<u8> {
        let mut client = Vec::new();
        for c in chunks {
            match s.feed(c).forward {
                Forward::Unchanged => client.extend_from_slice(c),
                Forward::Replace(b) => client.extend_from_slice(&b),
            }
        }
        client.extend_from_slice(&s.finish());
        client
    }

    const OPENAI_STREAM: &[u8] = b"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n\
data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}],\"usage\":null}\n\n\
data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n\
data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":4},\"completion_tokens_details\":{\"reasoning_tokens\":2}}}\n\n\
data: [DONE]\n\n";

    fn openai_without_usage_chunk() -> Vec<u8> {
        let s = String::from_utf8(OPENAI_STREAM.to_vec()).unwrap();
        let start = s.find("data: {\"id\":\"c1\",\"choices\":[],").unwrap();
        let end = s[start..].find("\n\n").unwrap() + start + 2;
        format!("{}{}", &s[..start], &s[end..]).into_bytes()
    }

    #[test]
    fn openai_stream_reports_usage_completion_and_content_bytes_without_touching_bytes() {
        let mut s = SseScanner::new(false);
        assert_eq!(s.feed(OPENAI_STREAM).forward, Forward::Unchanged);
        assert!(s.finish().is_empty());
        assert_eq!(s.usage(), Some(u(12, 5, 4, 2)));
        assert!(s.completed());
        assert_eq!(s.content_bytes(), 5);
        assert_eq!(s.stripped(), 0);
    }

    #[test]
    fn stripping_removes_exactly_the_usage_only_chunk() {
        let mut s = SseScanner::new(true);
        assert_eq!(run(&mut s, &[OPENAI_STREAM]), openai_without_usage_chunk());
        assert_eq!(s.usage(), Some(u(12, 5, 4, 2)));
        assert_eq!(s.stripped(), 1);
    }

    #[test]
    fn stripping_is_byte_exact_whatever_the_chunk_boundaries() {
        let want = openai_without_usage_chunk();
        for cut in 0..=OPENAI_STREAM.len() {
            let (a, b) = OPENAI_STREAM.split_at(cut);
            let mut s = SseScanner::new(true);
            assert_eq!(run(&mut s, &[a, b]), want, "cut at {cut}");
            assert_eq!(s.usage(), Some(u(12, 5, 4, 2)), "cut at {cut}");
            assert!(s.completed());
        }
        let bytes: Vec<&[u8]> = OPENAI_STREAM.chunks(1).collect();
        let mut s = SseScanner::new(true);
        assert_eq!(run(&mut s, &bytes), want);
    }

    #[test]
    fn crlf_streams_are_stripped_byte_exactly_even_when_split_between_cr_and_lf() {
        let crlf: Vec<u8> = String::from_utf8(OPENAI_STREAM.to_vec())
            .unwrap()
            .replace('\n', "\r\n")
            .into_bytes();
        let want: Vec<u8> = String::from_utf8(openai_without_usage_chunk())
            .unwrap()
            .replace('\n', "\r\n")
            .into_bytes();
        for cut in 0..=crlf.len() {
            let (a, b) = crlf.split_at(cut);
            let mut s = SseScanner::new(true);
            assert_eq!(run(&mut s, &[a, b]), want, "cut at {cut}");
            assert_eq!(s.usage().map(|x| x.prompt_tokens), Some(12));
        }
        let cr: Vec<u8> = String::from_utf8(OPENAI_STREAM.to_vec())
            .unwrap()
            .replace('\n', "\r")
            .into_bytes();
        let mut s = SseScanner::new(true);
        let got = run(&mut s, &cr.chunks(7).collect::<Vec<_>>());
        assert_eq!(
            got,
            String::from_utf8(openai_without_usage_chunk())
                .unwrap()
                .replace('\n', "\r")
                .into_bytes()
        );
    }

    #[test]
    fn whole_events_in_a_chunk_are_forwarded_unchanged_while_stripping() {
        let mut s = SseScanner::new(true);
        let first = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
        assert_eq!(s.feed(first).forward, Forward::Unchanged);
        assert_eq!(
            s.feed(b"data: {\"choices\":[{\"del").forward,
            Forward::Replace(vec![])
        );
        assert_eq!(
            s.feed(b"ta\":{}}]}\n\n: keep-alive\n\n").forward,
            Forward::Replace(b"data: {\"choices\":[{\"delta\":{}}]}\n\n: keep-alive\n\n".to_vec())
        );
    }

    #[test]
    fn a_client_that_asked_for_usage_itself_keeps_the_usage_chunk() {
        let mut s = SseScanner::new(false);
        assert_eq!(
            run(&mut s, &[&OPENAI_STREAM[..100], &OPENAI_STREAM[100..]]),
            OPENAI_STREAM
        );
        assert_eq!(s.usage().map(|x| x.completion_tokens), Some(5));
    }

    #[test]
    fn usage_in_a_chunk_that_still_has_choices_is_read_but_never_stripped() {
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"xy\"}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n";
        let mut s = SseScanner::new(true);
        assert_eq!(run(&mut s, &[stream]), stream);
        assert_eq!(s.usage().map(|x| x.prompt_tokens), Some(3));
    }

    #[test]
    fn anthropic_stream_merges_message_start_and_message_delta() {
        let stream = b"event: message_start\n\
data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n\
event: content_block_delta\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello!\"}}\n\n\
event: ping\ndata: {\"type\": \"ping\"}\n\n\
event: message_delta\n\
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let mut s = SseScanner::new(false);
        s.feed(&stream[..77]);
        assert!(!s.completed());
        s.feed(&stream[77..]);
        assert_eq!(s.usage(), Some(u(125, 15, 100, 0)));
        assert!(s.completed());
        assert_eq!(s.content_bytes(), 6);
    }

    #[test]
    fn a_final_usage_without_an_output_count_is_no_usage() {
        // Black-box run: `"usage":{}` on message_delta settled input + message_start's 1 output
        // token; an OpenAI final chunk with the prompt count only settled the prompt alone.
        let mut s = SseScanner::new(false);
        s.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n");
        s.feed(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{}}\n\n");
        assert_eq!(s.usage(), None);
        let mut s = SseScanner::new(false);
        s.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10}}\n\ndata: [DONE]\n\n");
        assert!(s.completed());
        assert_eq!(s.usage(), None);
        let body = br#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":10,"total_tokens":10}}"#;
        assert_eq!(from_json_with_output(body), None);
        // Review: the counts of one format, both of them; an Anthropic stream without an input count.
        for u in [
            br#"{"usage":{"prompt_tokens":10,"output_tokens":5}}"#.as_slice(),
            br#"{"usage":{"completion_tokens":5}}"#,
            br#"{"usage":{"output_tokens":5}}"#,
        ] {
            assert_eq!(
                from_json_with_output(u),
                None,
                "{}",
                String::from_utf8_lossy(u)
            );
        }
        let mut s = SseScanner::new(false);
        s.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n");
        s.feed(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}}\n\n");
        assert_eq!(s.usage(), None);
        // A `usage: null` event with a complete `response.usage` still counts.
        let mut s = SseScanner::new(false);
        s.feed(b"data: {\"type\":\"response.completed\",\"usage\":null,\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":4}}}\n\n");
        assert_eq!(s.usage().map(|u| u.completion_tokens), Some(4));
        // Embeddings report no output: their usage stands.
        assert_eq!(from_json(body).map(|u| u.prompt_tokens), Some(10));
        assert_eq!(
            from_json_with_output(br#"{"usage":{"prompt_tokens":10,"completion_tokens":0}}"#)
                .map(|u| u.completion_tokens),
            Some(0)
        );
    }

    #[test]
    fn anthropic_stream_has_no_usage_before_message_delta() {
        // `message_start` reports `output_tokens: 1`: a stream cut after it (the client gone mid-way)
        // must not be settled as if that were the message's usage.
        let stream = b"event: message_start\n\
data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n\
event: content_block_delta\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello there\"}}\n\n";
        let mut s = SseScanner::new(false);
        s.feed(stream);
        assert_eq!(s.usage(), None);
        assert!(!s.completed());
        assert_eq!(s.content_bytes(), 11);
        s.feed(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}}\n\n");
        assert_eq!(s.usage(), Some(u(25, 40, 0, 0)));
    }

    #[test]
    fn responses_stream_takes_usage_from_response_completed() {
        let stream = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n\
event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi there\"}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":9,\"output_tokens\":3,\"output_tokens_details\":{\"reasoning_tokens\":1}}}}\n\n";
        let mut s = SseScanner::new(false);
        s.feed(stream);
        assert_eq!(s.usage(), Some(u(9, 3, 0, 1)));
        assert!(s.completed());
        assert_eq!(s.content_bytes(), 8);
    }

    #[test]
    fn multi_line_data_comments_and_event_names_follow_the_sse_rules() {
        // The JSON is split over two data lines (joined with \n, still valid JSON); `event:` names the type.
        let stream = b": comment\nevent: response.completed\ndata: {\"response\":\ndata: {\"usage\":{\"input_tokens\":4,\"output_tokens\":2}}}\nid: 7\nretry: 10\n\n";
        let mut s = SseScanner::new(false);
        s.feed(stream);
        assert_eq!(
            s.usage().map(|x| (x.prompt_tokens, x.completion_tokens)),
            Some((4, 2))
        );
        assert!(s.completed());
    }

    #[test]
    fn an_aborted_stream_has_no_usage_but_counts_streamed_content_for_an_estimate() {
        let mut s = SseScanner::new(true);
        let out = run(
            &mut s,
            &[b"data: {\"choices\":[{\"delta\":{\"content\":\"abcdefghij\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"{\\\"a\\\":1}\"}}]}}]}\n\ndata: {\"cho"],
        );
        assert!(
            out.ends_with(b"data: {\"cho"),
            "the partial tail is flushed by finish"
        );
        assert_eq!(s.usage(), None);
        assert!(!s.completed());
        assert_eq!(s.content_bytes(), 10 + 7);
        assert_eq!(estimate_tokens_from_bytes(s.content_bytes()), 5);
        assert_eq!(Usage::estimate(3, 5).source, Source::Estimate);
    }

    #[test]
    fn a_usage_chunk_cut_off_at_end_of_stream_is_still_read_and_stripped() {
        let mut s = SseScanner::new(true);
        let out = run(&mut s, &[b"data: [DONE]\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1}}"]);
        assert_eq!(out, b"data: [DONE]\n\n");
        assert_eq!(s.usage().map(|x| x.prompt_tokens), Some(2));
    }

    #[test]
    fn an_oversized_event_passes_through_unchanged_and_its_usage_is_salvaged_from_the_tail() {
        let big_text = "x".repeat(300_000);
        let event = format!(
            "event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"output\":[{{\"text\":\"{big_text}\"}}],\"usage\":{{\"input_tokens\":11,\"output_tokens\":75000}},\"user\":null}}}}\n\ndata: [DONE]\n\n"
        );
        for strip in [false, true] {
            let mut s = SseScanner::with_max_event(strip, 64 * 1024);
            let chunks: Vec<&[u8]> = event.as_bytes().chunks(4096).collect();
            assert_eq!(run(&mut s, &chunks), event.as_bytes());
            assert!(s.overflowed());
            assert!(s.completed());
            assert_eq!(
                s.usage().map(|x| (x.prompt_tokens, x.completion_tokens)),
                Some((11, 75_000))
            );
            assert!(
                s.line.capacity() < 200_000 && s.held.is_empty(),
                "memory stays bounded"
            );
        }
        // A single chunk bigger than the bound.
        let mut s = SseScanner::with_max_event(true, 1024);
        assert_eq!(run(&mut s, &[event.as_bytes()]), event.as_bytes());
        assert_eq!(s.usage().map(|x| x.prompt_tokens), Some(11));
    }

    #[test]
    fn events_after_an_oversized_one_are_parsed_normally() {
        let mut s = SseScanner::with_max_event(true, 600);
        let big = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
            "y".repeat(5000)
        );
        let usage =
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n";
        let out = run(&mut s, &[big.as_bytes(), usage, b"data: [DONE]\n\n"]);
        assert_eq!(out, format!("{big}data: [DONE]\n\n").into_bytes());
        assert_eq!(s.stripped(), 1);
    }

    #[test]
    fn an_oversized_event_counts_all_its_bytes_as_content_even_part_way() {
        // A stream cut without usage is charged from its content bytes: an event too large to parse
        // must not count as nothing.
        let text = "z".repeat(200_000);
        let big = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n");
        let mut s = SseScanner::with_max_event(false, 64 * 1024);
        let half = big.len() / 2;
        s.feed(big.as_bytes().get(..half).unwrap());
        assert!(
            s.content_bytes() >= half as u64,
            "part way: {}",
            s.content_bytes()
        );
        s.feed(big.as_bytes().get(half..).unwrap());
        let whole = s.content_bytes();
        assert!(
            whole >= text.len() as u64 && whole <= big.len() as u64,
            "{whole}"
        );
        // Events after it add their content as usual.
        s.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"abc\"}}]}\n\n");
        assert_eq!(s.content_bytes(), whole + 3);
    }

    #[test]
    fn garbage_input_never_panics_and_is_forwarded_as_is() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut junk = Vec::new();
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let alphabet = b"data: {}[]\r\n:\"usage\"choices";
            junk.push(alphabet[(seed % alphabet.len() as u64) as usize]);
        }
        for strip in [false, true] {
            let mut s = SseScanner::with_max_event(strip, 1000);
            let chunks: Vec<&[u8]> = junk.chunks(333).collect();
            let out = run(&mut s, &chunks);
            if !strip || s.stripped() == 0 {
                assert_eq!(out, junk);
            }
        }
    }
}
