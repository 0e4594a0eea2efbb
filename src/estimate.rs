//! Request body → estimated token cost, before the request reaches the provider (pure, no host calls).
//!
//! The filter must charge a bucket *before* the provider answers, so it needs an estimate of what the
//! request will cost: the billed input (prompt) plus the output it may generate. [`estimate`] reads the
//! body once with its own strict JSON scanner (again with `serde_json` if the scanner turns it down,
//! see [`estimate`]), streaming: no `Value` tree is built, strings are counted where they lie in the
//! body (borrowed, or unescaped into a scratch buffer), and only the fields that providers bill as
//! input are looked at:
//!
//! | API ([`ApiKind`])      | input counted                                                          | output reserved from |
//! |------------------------|------------------------------------------------------------------------|----------------------|
//! | `/chat/completions`    | `messages[]` (content strings and parts, `name`, `tool_calls`, `refusal`), `tools`, `functions`, `response_format`, `prediction.content` | the larger of `max_tokens` / `max_completion_tokens` × `n` |
//! | `/completions`         | `prompt` (string, strings, token ids), `suffix`                         | `max_tokens` × max(`n`, `best_of`) |
//! | `/embeddings`          | `input` (string, strings, token ids, arrays of token ids)              | none (0) |
//! | `/responses`           | `input` (string or items), `instructions`, `tools`, `text.format`       | `max_output_tokens` |
//! | `/messages` (Anthropic)| `system`, `messages[].content` blocks (text, tool_use, tool_result), `tools` | `max_tokens` |
//!
//! The reserved output is what the body asks for (the largest present of `max_tokens`,
//! `max_completion_tokens`, `max_output_tokens`: err towards charging) or the per-model default from
//! [`OutputLimits`], clamped to the per-model cap, times `n` (legacy completions: the larger of `n`
//! and `best_of`, which the provider generates and bills), capped at [`MAX_N`] = 128.
//!
//! Parts that are not text have fixed or size-based costs: images [`IMAGE_TOKENS`], audio
//! (`input_audio`) by the size of its base64 data ([`AUDIO_TOKENS_PER_KB`],
//! [`AUDIO_WAV_TOKENS_PER_KB`]), files by the size of `file_data` ([`FILE_TOKENS_PER_KB`]) or a
//! fixed [`FILE_ID_TOKENS`] for a `file_id`.
//!
//! Speed (native release build, `cargo bench --bench estimate`): about 1.3 to 1.7 µs per KB of
//! English, Chinese, Japanese or Korean body (the lower figure for bodies of 16 KB and more, the higher
//! for 1 KB, where the fixed cost of a call weighs), 0.7 to 0.95 for Thai; code, JSON-in-a-string and
//! mixed-script bodies 1.5 to 1.9; a short chat request about 0.4 µs. The body is read by a strict
//! JSON scanner of this module's own (see `json.rs`: escapes close together, as in code and JSON, are
//! found by 64-byte bit masks rather than one after the other). The text of every script is counted
//! in one pass that also checks its UTF-8 (see [`estimate`]), with a tight loop per script for runs of
//! ideographs, kana, Hangul and Thai, a fast path for prose words and the single spaces between them,
//! and other ASCII (code, JSON) a 64-byte window at a time from bit masks, without a branch per piece
//! (see `ascii.rs`).
//!
//! Text is measured by [`text_tokens`], a single pass over the characters that mimics the pre-tokenizer
//! of OpenAI's `o200k_base`: ASCII letter words are costed by length, digits in groups of three,
//! punctuation and whitespace runs separately, and every other script (Thai, kana, CJK ideographs,
//! Hangul, Cyrillic, …) by a per-character rate plus a per-run rate. The rates in [`WEIGHTS`] were fitted
//! against `o200k_base` on the `corpus/` texts; `chars / 4` is 2–4× wrong for Thai and CJK, this is
//! within ±15 % (p95) on most corpus classes (not yet on Latin-script European languages, Hindi,
//! Arabic and Vietnamese: 18–29 %). Run `cargo bench --bench estimate` to see the numbers.
//!
//! Example: `{"model":"gpt-4.1","messages":[{"role":"user","content":"Hello!"}],"max_tokens":64}`
//! estimates to about 9 prompt tokens (3 per message, 3 for the reply primer, 2 for the text) plus 64
//! output tokens.
//!
//! Nothing here panics: malformed bodies become an [`EstimateError`], all arithmetic saturates, and the
//! walk over nested JSON is bounded ([`MAX_DEPTH`]) on top of the JSON readers' recursion limit (128,
//! serde_json's, which the fast walk's scanner keeps too).

use serde::de::{
    self, value::MapAccessDeserializer, DeserializeSeed, MapAccess, SeqAccess, Visitor,
};
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

mod ascii;
mod json;

/// Fixed cost of one image input (`image_url`, `input_image`, Anthropic `image` block): the "low detail"
/// price of OpenAI vision models. High-detail images cost more; this is an estimate, not a bill.
pub const IMAGE_TOKENS: u64 = 85;
/// Per-message framing overhead (role and separators), as in OpenAI's token-counting guide.
pub const MESSAGE_OVERHEAD: u64 = 3;
/// Tokens that prime the assistant reply in chat-style APIs.
pub const REPLY_PRIMER: u64 = 3;
/// Largest `n` (number of choices) honoured when multiplying the output reservation (also caps
/// legacy completions' `best_of`).
pub const MAX_N: u64 = 128;
/// Audio input (`input_audio` part) in WAV / PCM: tokens per KB (1024 bytes) of its base64 `data`.
/// The length is unknown, so the rate assumes the smallest common WAV (8 kHz, 16-bit mono: 16 KB/s,
/// 21 KB/s as base64) at gpt-4o's ~10 input tokens per second of audio: 0.47, rounded up.
pub const AUDIO_WAV_TOKENS_PER_KB: u64 = 1;
/// Audio input in any other or no `format` (mp3, opus, …), per KB of base64: compressed audio at
/// 32 kbit/s (4 KB/s, 5.3 KB/s as base64) at ~10 tokens per second is 1.9, rounded up.
pub const AUDIO_TOKENS_PER_KB: u64 = 2;
/// File input (`file` part's `file_data`, Responses `input_file`), per KB of base64: PDFs are billed
/// as extracted text plus an image per page, about 1,000–1,500 tokens for a page of ~100 KB base64;
/// 16 per KB errs high.
pub const FILE_TOKENS_PER_KB: u64 = 16;
/// File input by `file_id` (its size is unknown to the filter): a fixed charge, about two pages.
pub const FILE_ID_TOKENS: u64 = 2048;
/// Deepest nesting of JSON values this module walks into (content blocks inside tool results, …).
pub const MAX_DEPTH: usize = 64;

/// The LLM API a request targets, derived from its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApiKind {
    /// OpenAI `POST /v1/chat/completions`.
    ChatCompletions,
    /// OpenAI legacy `POST /v1/completions`.
    Completions,
    /// OpenAI `POST /v1/embeddings`.
    Embeddings,
    /// OpenAI `POST /v1/responses`.
    Responses,
    /// Anthropic `POST /v1/messages`.
    AnthropicMessages,
}

/// OpenAI Assistants' `…/threads/<thread id>/messages` (stores a message, bills nothing).
fn is_thread_messages(path: &str) -> bool {
    let mut rev = path.rsplit('/');
    let _messages = rev.next();
    let _thread_id = rev.next();
    rev.next() == Some("threads")
}

impl ApiKind {
    /// From the request path (query string ignored); suffix match: "/chat/completions", "/completions",
    /// "/embeddings", "/responses", "/messages". None for anything else.
    pub fn from_path(path: &str) -> Option<ApiKind> {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        if path.ends_with("/chat/completions") {
            Some(ApiKind::ChatCompletions)
        } else if path.ends_with("/completions") {
            Some(ApiKind::Completions)
        } else if path.ends_with("/embeddings") {
            Some(ApiKind::Embeddings)
        } else if path.ends_with("/responses") {
            Some(ApiKind::Responses)
        } else if path.ends_with("/messages") && !is_thread_messages(path) {
            // Not OpenAI Assistants' `/v1/threads/{id}/messages`, which stores a message and bills
            // nothing.
            Some(ApiKind::AnthropicMessages)
        } else {
            None
        }
    }

    /// Stable short name for logs and metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            ApiKind::ChatCompletions => "chat_completions",
            ApiKind::Completions => "completions",
            ApiKind::Embeddings => "embeddings",
            ApiKind::Responses => "responses",
            ApiKind::AnthropicMessages => "anthropic_messages",
        }
    }
}

/// Per-model output reservation policy, provided by the caller.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutputLimits {
    /// Output tokens reserved when the body does not ask for a maximum.
    pub default_tokens: u64,
    /// Upper bound on the reserved output per choice, whatever the body asks for.
    pub cap_tokens: u64,
}

/// The estimated cost of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Which API the body was read as.
    pub kind: ApiKind,
    /// The `model` field of the body, if it is a string.
    pub model: Option<String>,
    /// Estimate of the billed input tokens.
    pub prompt_tokens: u64,
    /// Reserved output: requested (the largest of `max_tokens`, `max_completion_tokens`,
    /// `max_output_tokens`) or `limits.default_tokens`, clamped to `limits.cap_tokens`, times `n`
    /// (or legacy completions' `best_of` if larger, capped at [`MAX_N`]); 0 for embeddings.
    pub output_tokens: u64,
    /// What the body asked for (the largest of the output limits it sends), if anything.
    pub requested_output: Option<u64>,
    /// How many choices `output_tokens` reserves for (`n`, 1..=[`MAX_N`]; 1 for embeddings):
    /// `output_tokens` = per-choice output × this. Whoever lowers the output limit written into the
    /// body (the quota's `clamp_output`) divides by this same number, so keep them in step if the
    /// multiplier changes (e.g. `best_of`).
    pub output_choices: u64,
    /// `stream == true`.
    pub stream: bool,
    /// `stream_options.include_usage == true`.
    pub include_usage: bool,
}

impl Estimate {
    /// Prompt plus reserved output, saturating.
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.output_tokens)
    }
}

/// Why a body could not be estimated.
#[derive(Debug, Clone, PartialEq)]
pub enum EstimateError {
    /// The body is not valid JSON (or not UTF-8, or nested deeper than 128); carries the parser message.
    NotJson(String),
    /// The body is JSON but not an object.
    NotObject,
    /// A field the estimate depends on has the wrong type or value; carries the field path.
    BadField(&'static str),
}

impl fmt::Display for EstimateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EstimateError::NotJson(e) => write!(f, "body is not valid JSON: {e}"),
            EstimateError::NotObject => f.write_str("body is not a JSON object"),
            EstimateError::BadField(field) => {
                write!(f, "field `{field}` has the wrong type or value")
            }
        }
    }
}

impl std::error::Error for EstimateError {}

type Res<T> = Result<T, EstimateError>;

/// Parses the body once, streaming, and estimates.
///
/// The body is read straight into the estimate: string values are counted where they lie in the body
/// (or, unescaped, in a scratch buffer), fields that do not count are skipped, and only the
/// JSON-valued fields that are costed as JSON text (`tools`, `functions`, `response_format`,
/// `text.format`, tool `input` / `arguments` objects) are built as [`serde_json::Value`]. Errors keep
/// their precedence: invalid UTF-8 anywhere, then any syntax error, is [`EstimateError::NotJson`] even
/// when a field before it was wrong, then [`EstimateError::NotObject`], then the first
/// [`EstimateError::BadField`] in field order (model, stream, stream_options, prompt fields, output
/// fields). As with a parsed object, the last of duplicate keys wins.
///
/// Two walks give the same result. The fast walk reads the body with this module's own strict JSON
/// scanner (see `json.rs`), which accepts only what serde_json accepts, and reads the strings that
/// are counted raw, checking their UTF-8 in the pass that counts them (see [`Top::raw`]): on CJK, Thai
/// or Korean text that check costs as much as counting, so doing it twice cost a third of the time.
/// Any body the fast walk does not accept (an error, a counted field of another type, anything the
/// scanner is unsure of) is read again by the reference walk: `std::str::from_utf8` on the whole body,
/// then serde_json reading every string as a `&str`; it gives the result and the error message.
///
/// `limits` maps the body's model (if any) to its output policy.
pub fn estimate(
    kind: ApiKind,
    body: &[u8],
    limits: &dyn Fn(Option<&str>) -> OutputLimits,
) -> Result<Estimate, EstimateError> {
    estimate_by(kind, body, limits, true)
}

/// [`estimate`], with the fast walk tried first if `fast`.
fn estimate_by(
    kind: ApiKind,
    body: &[u8],
    limits: &dyn Fn(Option<&str>) -> OutputLimits,
    fast: bool,
) -> Result<Estimate, EstimateError> {
    let mut fields = Fields::new();
    let walked = if fast {
        walk_fast(body, kind, &mut fields).ok()
    } else {
        None
    };
    let is_object = match walked {
        Some(is_object) => is_object,
        None => {
            // Invalid UTF-8 anywhere (also in fields that are skipped) is an error before any other.
            let text =
                std::str::from_utf8(body).map_err(|e| EstimateError::NotJson(e.to_string()))?;
            if fast {
                // The fast walk stopped part way.
                fields = Fields::new();
            }
            walk(
                serde_json::Deserializer::from_str(text),
                kind,
                false,
                &mut fields,
            )
            .map_err(|e| EstimateError::NotJson(e.to_string()))?
        }
    };
    if !is_object {
        return Err(EstimateError::NotObject);
    }

    let model = std::mem::replace(&mut fields.model, Ok(None))?;
    let stream = fields.stream.clone()?;
    let include_usage = fields.stream_options.clone()?;
    let prompt_tokens = fields.prompt_tokens(kind)?;
    let requested_output = requested_output(&fields)?;
    let (output_tokens, output_choices) = if kind == ApiKind::Embeddings {
        (0, 1)
    } else {
        let lim = limits(model.as_deref());
        let per_choice = requested_output
            .unwrap_or(lim.default_tokens)
            .min(lim.cap_tokens);
        let n = choices(fields.n, fields.best_of)?;
        (per_choice.saturating_mul(n), n)
    };

    Ok(Estimate {
        kind,
        model,
        prompt_tokens,
        output_tokens,
        requested_output,
        output_choices,
        stream,
        include_usage,
    })
}

/// The reference walk: reads one JSON document (and nothing after it) into `fields`; false if it is
/// not an object.
fn walk<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
    kind: ApiKind,
    raw: bool,
    fields: &mut Fields,
) -> Result<bool, serde_json::Error> {
    let is_object = Seed(Top { kind, raw, fields }).deserialize(&mut de)?;
    de.end()?;
    Ok(is_object)
}

/// The fast walk: [`walk`] with this module's scanner, counted strings read raw.
fn walk_fast(body: &[u8], kind: ApiKind, fields: &mut Fields) -> Result<bool, json::Bail> {
    let mut de = json::Scanner::new(body);
    let is_object = Seed(Top {
        kind,
        raw: true,
        fields,
    })
    .deserialize(&mut de)?;
    de.end()?;
    Ok(is_object)
}

/// The largest present (non-null) of `max_tokens`, `max_completion_tokens`, `max_output_tokens`
/// (a body that sends two asks for the larger: the reservation errs towards charging); the first
/// bad one, in that order, is an error.
fn requested_output(f: &Fields) -> Res<Option<u64>> {
    let mut max = None;
    for (num, field) in [
        (f.max_tokens, "max_tokens"),
        (f.max_completion_tokens, "max_completion_tokens"),
        (f.max_output_tokens, "max_output_tokens"),
    ] {
        match num {
            Num::Absent => continue,
            Num::Val(v) => max = Some(max.map_or(v, |m: u64| m.max(v))),
            Num::Bad => return Err(EstimateError::BadField(field)),
        }
    }
    Ok(max)
}

/// Completions billed per request: `n` (1 when absent), or legacy completions' `best_of` if larger
/// (the provider generates, and bills, `best_of` completions server-side), capped at [`MAX_N`].
fn choices(n: Num, best_of: Num) -> Res<u64> {
    let count = |num: Num, field: &'static str| match num {
        Num::Absent => Ok(1),
        Num::Val(v) => Ok(v.clamp(1, MAX_N)),
        Num::Bad => Err(EstimateError::BadField(field)),
    };
    Ok(count(n, "n")?.max(count(best_of, "best_of")?))
}

/// Estimate a JSON value as the text of its compact serialization.
fn json_tokens(v: &Value) -> u64 {
    // Serialization recursion is bounded by serde_json's parse limit (the value came from a parse).
    serde_json::to_string(v).map_or(0, |s| text_tokens(&s))
}

/// `response_format` / `text.format`: counted as JSON unless it is `{"type":"text",…}` or not an object.
fn format_tokens(v: &Value) -> u64 {
    match v {
        Value::Object(o) if o.get("type").and_then(Value::as_str) != Some("text") => json_tokens(v),
        _ => 0,
    }
}

// ---------------------------------------------------------------------------------------------------
// Streaming walk: serde visitors that fold the body into counts as the JSON reader reads it.

/// What the walk keeps of the top-level object: one slot per field that matters to `kind`, each holding
/// the field's count or its error (so that a later syntax error still wins, and the last duplicate key
/// replaces earlier ones). Absent fields hold what an absent field means.
struct Fields {
    model: Res<Option<String>>,
    stream: Res<bool>,
    stream_options: Res<bool>,
    max_tokens: Num,
    max_completion_tokens: Num,
    max_output_tokens: Num,
    n: Num,
    /// Legacy completions `best_of`.
    best_of: Num,
    /// Chat or Anthropic `messages`, reply primer included.
    messages: Res<u64>,
    tools: Res<u64>,
    functions: Res<u64>,
    response_format: u64,
    /// Completions `prompt`.
    prompt: Res<u64>,
    suffix: u64,
    /// Embeddings or Responses `input`.
    input: Res<u64>,
    instructions: Res<u64>,
    /// Responses `text.format`.
    text: u64,
    system: Res<u64>,
    /// Chat `prediction` (Predicted Outputs).
    prediction: Res<u64>,
}

impl Fields {
    fn new() -> Fields {
        Fields {
            model: Ok(None),
            stream: Ok(false),
            stream_options: Ok(false),
            max_tokens: Num::Absent,
            max_completion_tokens: Num::Absent,
            max_output_tokens: Num::Absent,
            n: Num::Absent,
            best_of: Num::Absent,
            messages: Ok(0),
            tools: Ok(0),
            functions: Ok(0),
            response_format: 0,
            prompt: Ok(0),
            suffix: 0,
            input: Ok(0),
            instructions: Ok(0),
            text: 0,
            system: Ok(0),
            prediction: Ok(0),
        }
    }

    /// The billed input for `kind`; the first failing field in the order the fields are documented.
    fn prompt_tokens(&self, kind: ApiKind) -> Res<u64> {
        let parts: [&Res<u64>; 4] = match kind {
            ApiKind::ChatCompletions => [
                &self.messages,
                &self.tools,
                &self.functions,
                &self.prediction,
            ],
            ApiKind::Completions => [&self.prompt, &Ok(0), &Ok(0), &Ok(0)],
            ApiKind::Embeddings => [&self.input, &Ok(0), &Ok(0), &Ok(0)],
            ApiKind::Responses => [&self.input, &self.instructions, &self.tools, &Ok(0)],
            ApiKind::AnthropicMessages => [&self.system, &self.messages, &self.tools, &Ok(0)],
        };
        let mut t = match kind {
            ApiKind::ChatCompletions => self.response_format,
            ApiKind::Completions => self.suffix,
            ApiKind::Responses => self.text,
            ApiKind::Embeddings | ApiKind::AnthropicMessages => 0,
        };
        for p in parts {
            t = t.saturating_add(p.clone()?);
        }
        Ok(t)
    }
}

/// A field that must be a non-negative integer (`max_tokens`, `n`, …) when present and not null.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Num {
    Absent,
    Val(u64),
    Bad,
}

/// Object keys the walk looks at (one enum for every object shape; the rest is [`Key::Other`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Model,
    Stream,
    StreamOptions,
    IncludeUsage,
    MaxTokens,
    MaxCompletionTokens,
    MaxOutputTokens,
    N,
    Messages,
    Tools,
    Functions,
    ResponseFormat,
    Prompt,
    Suffix,
    Input,
    Instructions,
    Text,
    System,
    Content,
    Name,
    ToolCalls,
    FunctionCall,
    ToolCallId,
    Function,
    Arguments,
    Type,
    Output,
    Thinking,
    Source,
    Data,
    Format,
    BestOf,
    Prediction,
    Refusal,
    InputAudio,
    File,
    FileData,
    FileId,
    Title,
    Context,
    Other,
}

impl Key {
    fn of(s: &[u8]) -> Key {
        match s {
            b"model" => Key::Model,
            b"stream" => Key::Stream,
            b"stream_options" => Key::StreamOptions,
            b"include_usage" => Key::IncludeUsage,
            b"max_tokens" => Key::MaxTokens,
            b"max_completion_tokens" => Key::MaxCompletionTokens,
            b"max_output_tokens" => Key::MaxOutputTokens,
            b"n" => Key::N,
            b"messages" => Key::Messages,
            b"tools" => Key::Tools,
            b"functions" => Key::Functions,
            b"response_format" => Key::ResponseFormat,
            b"prompt" => Key::Prompt,
            b"suffix" => Key::Suffix,
            b"input" => Key::Input,
            b"instructions" => Key::Instructions,
            b"text" => Key::Text,
            b"system" => Key::System,
            b"content" => Key::Content,
            b"name" => Key::Name,
            b"tool_calls" => Key::ToolCalls,
            b"function_call" => Key::FunctionCall,
            b"tool_call_id" => Key::ToolCallId,
            b"function" => Key::Function,
            b"arguments" => Key::Arguments,
            b"type" => Key::Type,
            b"output" => Key::Output,
            b"thinking" => Key::Thinking,
            b"source" => Key::Source,
            b"data" => Key::Data,
            b"best_of" => Key::BestOf,
            b"prediction" => Key::Prediction,
            b"refusal" => Key::Refusal,
            b"input_audio" => Key::InputAudio,
            b"file" => Key::File,
            b"file_data" => Key::FileData,
            b"file_id" => Key::FileId,
            b"format" => Key::Format,
            b"title" => Key::Title,
            b"context" => Key::Context,
            _ => Key::Other,
        }
    }
}

/// The `type` of a content part, Responses item or format (anything else, or not a string: `Other`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tag {
    Text,
    Image,
    ToolUse,
    ToolResult,
    Thinking,
    Document,
    Audio,
    File,
    Refusal,
    FunctionCall,
    FunctionCallOutput,
    Other,
}

impl Tag {
    fn of(s: &str) -> Tag {
        match s {
            "text" => Tag::Text,
            "image_url" | "input_image" | "image" => Tag::Image,
            "tool_use" | "server_tool_use" => Tag::ToolUse,
            // Anthropic search results: their content blocks, like a tool result's.
            "tool_result" | "search_result" => Tag::ToolResult,
            "thinking" => Tag::Thinking,
            "document" => Tag::Document,
            "input_audio" => Tag::Audio,
            "file" | "input_file" => Tag::File,
            "refusal" => Tag::Refusal,
            "function_call" | "custom_tool_call" => Tag::FunctionCall,
            "function_call_output" | "custom_tool_call_output" => Tag::FunctionCallOutput,
            _ => Tag::Other,
        }
    }
}

/// How one JSON value folds into a result, by its shape. Every case defaults to [`Shape::other`];
/// arrays and objects that a shape does not expect are read through and ignored, so a wrong type is a
/// value (usually a `BadField`), never a parse error.
trait Shape<'de>: Sized {
    type Out;
    /// Any value the shape has no case for.
    fn other(self) -> Self::Out;
    fn null(self) -> Self::Out {
        self.other()
    }
    fn boolean(self, _b: bool) -> Self::Out {
        self.other()
    }
    /// A non-negative integer.
    fn unsigned(self, _n: u64) -> Self::Out {
        self.other()
    }
    /// A negative integer or a float.
    fn number(self) -> Self::Out {
        self.other()
    }
    /// A string (borrowed from the body or from an unescape buffer).
    fn string(self, _s: &str) -> Self::Out {
        self.other()
    }
    /// A string of `n` tokens, read raw (see [`RawSeed`]); only for shapes that count strings.
    fn tokens(self, _n: u64) -> Self::Out {
        self.other()
    }
    /// A string without escapes, borrowed from the body for as long as the body lives.
    fn borrowed(self, s: &'de str) -> Self::Out {
        self.string(s)
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Out, A::Error> {
        while a.next_element_seed(Seed(Ignore))?.is_some() {}
        Ok(self.other())
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Out, A::Error> {
        while a.next_key_seed(Seed(Ignore))?.is_some() {
            a.next_value_seed(Seed(Ignore))?;
        }
        Ok(self.other())
    }
}

/// Adapter from a [`Shape`] to serde's `DeserializeSeed` + `Visitor` (always `deserialize_any`, so that
/// the recursion limit and number range checks apply to every value, read or skipped).
struct Seed<S>(S);

impl<'de, S: Shape<'de>> DeserializeSeed<'de> for Seed<S> {
    type Value = S::Out;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<S::Out, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S: Shape<'de>> Visitor<'de> for Seed<S> {
    type Value = S::Out;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<S::Out, E> {
        Ok(self.0.boolean(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<S::Out, E> {
        Ok(match u64::try_from(v) {
            Ok(u) => self.0.unsigned(u),
            Err(_) => self.0.number(),
        })
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<S::Out, E> {
        Ok(self.0.unsigned(v))
    }
    fn visit_f64<E: de::Error>(self, _v: f64) -> Result<S::Out, E> {
        Ok(self.0.number())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<S::Out, E> {
        Ok(self.0.string(v))
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<S::Out, E> {
        Ok(self.0.borrowed(v))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<S::Out, E> {
        Ok(self.0.string(&v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<S::Out, E> {
        Ok(self.0.null())
    }
    fn visit_none<E: de::Error>(self) -> Result<S::Out, E> {
        Ok(self.0.null())
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<S::Out, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, a: A) -> Result<S::Out, A::Error> {
        self.0.seq(a)
    }
    fn visit_map<A: MapAccess<'de>>(self, a: A) -> Result<S::Out, A::Error> {
        self.0.map(a)
    }
}

/// Adapter for shapes that count strings, on the fast walk: null, a string or an array (anything else
/// is a parse error, and the reference walk takes over). The scanner hands such a string over without
/// checking its UTF-8; [`utf8_tokens`] checks it while it counts, and an invalid one is a parse error
/// too.
struct RawSeed<S>(S);

impl<'de, S: Shape<'de>> DeserializeSeed<'de> for RawSeed<S> {
    type Value = S::Out;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<S::Out, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, S: Shape<'de>> Visitor<'de> for RawSeed<S> {
    type Value = S::Out;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("null, a string or an array")
    }
    fn visit_none<E: de::Error>(self) -> Result<S::Out, E> {
        Ok(self.0.null())
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<S::Out, D::Error> {
        d.deserialize_bytes(self)
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<S::Out, E> {
        match utf8_tokens(v) {
            Some(n) => Ok(self.0.tokens(n)),
            None => Err(E::custom("invalid UTF-8 in a string")),
        }
    }
    fn visit_seq<A: SeqAccess<'de>>(self, a: A) -> Result<S::Out, A::Error> {
        self.0.seq(a)
    }
}

/// Reads an object key as a [`Key`] without allocating.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        // serde_json reads an identifier as a string; the fast walk's scanner hands an ASCII key
        // over as bytes (checked: ASCII is UTF-8), sparing a call to `std::str::from_utf8`.
        d.deserialize_identifier(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(Key::of(v.as_bytes()))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Key, E> {
        Ok(Key::of(v))
    }
}

/// Reads the value of the current key with `shape`.
fn value<'de, A: MapAccess<'de>, S: Shape<'de>>(a: &mut A, shape: S) -> Result<S::Out, A::Error> {
    a.next_value_seed(Seed(shape))
}

/// Reads the value of the current key with a shape that counts strings: through [`RawSeed`] if `raw`.
fn read_text<'de, A: MapAccess<'de>, S: Shape<'de>>(
    a: &mut A,
    raw: bool,
    shape: S,
) -> Result<S::Out, A::Error> {
    if raw {
        a.next_value_seed(RawSeed(shape))
    } else {
        a.next_value_seed(Seed(shape))
    }
}

/// Sums `shape` over the elements of an array; the error is the first element's error, if any.
fn sum_res<'de, A: SeqAccess<'de>, S: Shape<'de, Out = Res<u64>> + Copy>(
    a: &mut A,
    shape: S,
) -> Result<Res<u64>, A::Error> {
    let mut total = 0u64;
    let mut first_err = None;
    while let Some(r) = a.next_element_seed(Seed(shape))? {
        match r {
            Ok(t) => total = total.saturating_add(t),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Ok(first_err.map_or(Ok(total), Err))
}

/// Sums `shape` over the elements of an array.
fn sum<'de, A: SeqAccess<'de>, S: Shape<'de, Out = u64> + Copy>(
    a: &mut A,
    shape: S,
) -> Result<u64, A::Error> {
    let mut total = 0u64;
    while let Some(t) = a.next_element_seed(Seed(shape))? {
        total = total.saturating_add(t);
    }
    Ok(total)
}

/// Any value, ignored (still fully parsed: syntax, UTF-8, number range and depth are checked).
#[derive(Clone, Copy)]
struct Ignore;

impl Shape<'_> for Ignore {
    type Out = ();
    fn other(self) {}
}

/// A string's tokens; None for anything else.
#[derive(Clone, Copy)]
struct Str;

impl Shape<'_> for Str {
    type Out = Option<u64>;
    fn other(self) -> Option<u64> {
        None
    }
    fn string(self, s: &str) -> Option<u64> {
        self.tokens(text_tokens(s))
    }
    fn tokens(self, n: u64) -> Option<u64> {
        Some(n)
    }
}

/// A string kept for later (borrowed when it has no escapes); None for anything else.
#[derive(Clone, Copy)]
struct KeepStr;

impl<'de> Shape<'de> for KeepStr {
    type Out = Option<Cow<'de, str>>;
    fn other(self) -> Self::Out {
        None
    }
    fn string(self, s: &str) -> Self::Out {
        Some(Cow::Owned(s.to_owned()))
    }
    fn borrowed(self, s: &'de str) -> Self::Out {
        Some(Cow::Borrowed(s))
    }
}

/// The `type` tag of an object.
#[derive(Clone, Copy)]
struct TypeTag;

impl Shape<'_> for TypeTag {
    type Out = Tag;
    fn other(self) -> Tag {
        Tag::Other
    }
    fn string(self, s: &str) -> Tag {
        Tag::of(s)
    }
}

/// An optional boolean: null is false, anything but a boolean is a bad field.
#[derive(Clone, Copy)]
struct Flag(&'static str);

impl Shape<'_> for Flag {
    type Out = Res<bool>;
    fn other(self) -> Res<bool> {
        Err(EstimateError::BadField(self.0))
    }
    fn null(self) -> Res<bool> {
        Ok(false)
    }
    fn boolean(self, b: bool) -> Res<bool> {
        Ok(b)
    }
}

/// An optional non-negative integer.
#[derive(Clone, Copy)]
struct Count;

impl Shape<'_> for Count {
    type Out = Num;
    fn other(self) -> Num {
        Num::Bad
    }
    fn null(self) -> Num {
        Num::Absent
    }
    fn unsigned(self, n: u64) -> Num {
        Num::Val(n)
    }
}

/// Whether a value is a number (token ids).
#[derive(Clone, Copy)]
struct IsNumber;

impl Shape<'_> for IsNumber {
    type Out = bool;
    fn other(self) -> bool {
        false
    }
    fn unsigned(self, _n: u64) -> bool {
        true
    }
    fn number(self) -> bool {
        true
    }
}

/// `model`: an optional string.
#[derive(Clone, Copy)]
struct Model;

impl Shape<'_> for Model {
    type Out = Res<Option<String>>;
    fn other(self) -> Self::Out {
        Err(EstimateError::BadField("model"))
    }
    fn null(self) -> Self::Out {
        Ok(None)
    }
    fn string(self, s: &str) -> Self::Out {
        Ok(Some(s.to_owned()))
    }
}

/// `stream_options`: an optional object whose `include_usage` is an optional boolean.
#[derive(Clone, Copy)]
struct StreamOptions;

impl<'de> Shape<'de> for StreamOptions {
    type Out = Res<bool>;
    fn other(self) -> Res<bool> {
        Err(EstimateError::BadField("stream_options"))
    }
    fn null(self) -> Res<bool> {
        Ok(false)
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Res<bool>, A::Error> {
        let mut include_usage = Ok(false);
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match k {
                Key::IncludeUsage => include_usage = value(&mut a, Flag("include_usage"))?,
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(include_usage)
    }
}

/// The body: an object, read into `fields` (anything else is false, i.e. [`EstimateError::NotObject`]).
struct Top<'f> {
    kind: ApiKind,
    /// The fast walk: the strings that are counted (message contents, text parts, prompts, …) are
    /// read with [`RawSeed`], every other string as a `&str` (checked for UTF-8 as it is read).
    raw: bool,
    fields: &'f mut Fields,
}

impl<'de> Shape<'de> for Top<'_> {
    type Out = bool;
    fn other(self) -> bool {
        false
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<bool, A::Error> {
        use ApiKind::*;
        let Top {
            kind,
            raw,
            fields: f,
        } = self;
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match (k, kind) {
                (Key::Model, _) => f.model = value(&mut a, Model)?,
                (Key::Stream, _) => f.stream = value(&mut a, Flag("stream"))?,
                (Key::StreamOptions, _) => f.stream_options = value(&mut a, StreamOptions)?,
                (Key::MaxTokens, _) => f.max_tokens = value(&mut a, Count)?,
                (Key::MaxCompletionTokens, _) => f.max_completion_tokens = value(&mut a, Count)?,
                (Key::MaxOutputTokens, _) => f.max_output_tokens = value(&mut a, Count)?,
                (Key::N, _) => f.n = value(&mut a, Count)?,
                (Key::BestOf, Completions) => f.best_of = value(&mut a, Count)?,
                (Key::Prediction, ChatCompletions) => {
                    f.prediction = value(&mut a, Prediction { raw })?
                }
                (Key::Messages, ChatCompletions) => {
                    f.messages = value(&mut a, Messages(ChatMessage { raw }))?
                }
                (Key::Messages, AnthropicMessages) => {
                    f.messages = value(&mut a, Messages(AnthropicMessage { raw }))?
                }
                (Key::Tools, ChatCompletions | Responses | AnthropicMessages) => {
                    f.tools = value(&mut a, JsonList("tools"))?
                }
                (Key::Functions, ChatCompletions) => {
                    f.functions = value(&mut a, JsonList("functions"))?
                }
                (Key::ResponseFormat, ChatCompletions) => {
                    f.response_format = format_tokens(&a.next_value::<Value>()?)
                }
                (Key::Prompt, Completions) => {
                    f.prompt = read_text(&mut a, raw, IdsOrText("prompt"))?
                }
                (Key::Suffix, Completions) => f.suffix = read_text(&mut a, raw, Str)?.unwrap_or(0),
                (Key::Input, Embeddings) => f.input = read_text(&mut a, raw, IdsOrText("input"))?,
                (Key::Input, Responses) => {
                    f.input = read_text(&mut a, raw, ResponsesInput { raw })?
                }
                (Key::Instructions, Responses) => {
                    f.instructions = read_text(&mut a, raw, Instructions)?
                }
                (Key::Text, Responses) => f.text = value(&mut a, TextConfig)?,
                (Key::System, AnthropicMessages) => {
                    f.system = read_text(&mut a, raw, Content::top("system", raw))?
                }
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(true)
    }
}

/// `messages`: null (nothing, no reply primer) or an array of messages (plus the reply primer).
#[derive(Clone, Copy)]
struct Messages<M>(M);

impl<'de, M: Shape<'de, Out = Res<u64>> + Copy> Shape<'de> for Messages<M> {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField("messages"))
    }
    fn null(self) -> Res<u64> {
        Ok(0)
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        Ok(sum_res(&mut a, self.0)?.map(|t| t.saturating_add(REPLY_PRIMER)))
    }
}

/// One chat message: overhead, `content`, `name`, `tool_calls`, `function_call`, `tool_call_id`.
#[derive(Clone, Copy)]
struct ChatMessage {
    raw: bool,
}

impl<'de> Shape<'de> for ChatMessage {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField("messages[]"))
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let mut content = Ok(0);
        let mut name = None;
        let mut tool_calls = Ok(0);
        let mut function_call = 0;
        let mut tool_call_id = None;
        let mut refusal = None;
        let raw = self.raw;
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match k {
                Key::Content => {
                    content = read_text(&mut a, raw, Content::top("messages[].content", raw))?
                }
                Key::Name => name = read_text(&mut a, raw, Str)?,
                Key::ToolCalls => tool_calls = value(&mut a, ToolCalls)?,
                Key::FunctionCall => function_call = value(&mut a, FunctionCallShape)?,
                Key::ToolCallId => tool_call_id = read_text(&mut a, raw, Str)?,
                Key::Refusal => refusal = read_text(&mut a, raw, Str)?,
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok((|| {
            Ok(MESSAGE_OVERHEAD
                .saturating_add(content?)
                .saturating_add(name.map_or(0, |n: u64| n.saturating_add(1)))
                .saturating_add(tool_calls?)
                .saturating_add(function_call)
                .saturating_add(tool_call_id.unwrap_or(0))
                .saturating_add(refusal.unwrap_or(0)))
        })())
    }
}

/// One Anthropic message: overhead and `content`.
#[derive(Clone, Copy)]
struct AnthropicMessage {
    raw: bool,
}

impl<'de> Shape<'de> for AnthropicMessage {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField("messages[]"))
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let mut content = Ok(0);
        let raw = self.raw;
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match k {
                Key::Content => {
                    content = read_text(&mut a, raw, Content::top("messages[].content", raw))?
                }
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(content.map(|c| MESSAGE_OVERHEAD.saturating_add(c)))
    }
}

/// `tool_calls`: null or an array of `{"function": {…}}`.
#[derive(Clone, Copy)]
struct ToolCalls;

impl<'de> Shape<'de> for ToolCalls {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField("messages[].tool_calls"))
    }
    fn null(self) -> Res<u64> {
        Ok(0)
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        Ok(Ok(sum(&mut a, ToolCall)?))
    }
}

/// One tool call: its `function`.
#[derive(Clone, Copy)]
struct ToolCall;

impl<'de> Shape<'de> for ToolCall {
    type Out = u64;
    fn other(self) -> u64 {
        0
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let mut t = 0;
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match k {
                Key::Function => t = value(&mut a, FunctionCallShape)?,
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(t)
    }
}

/// `{"name": …, "arguments": "<json text>" | {…}}` of a (tool) function call; 0 for anything else.
#[derive(Clone, Copy)]
struct FunctionCallShape;

impl<'de> Shape<'de> for FunctionCallShape {
    type Out = u64;
    fn other(self) -> u64 {
        0
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let mut name = None;
        let mut arguments = 0;
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match k {
                Key::Name => name = value(&mut a, Str)?,
                Key::Arguments => arguments = value(&mut a, Arguments)?,
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(3u64
            .saturating_add(name.unwrap_or(0))
            .saturating_add(arguments))
    }
}

/// `arguments`: a string (JSON text) or an object (costed as JSON); 0 for anything else.
#[derive(Clone, Copy)]
struct Arguments;

impl<'de> Shape<'de> for Arguments {
    type Out = u64;
    fn other(self) -> u64 {
        0
    }
    fn string(self, s: &str) -> u64 {
        text_tokens(s)
    }
    fn map<A: MapAccess<'de>>(self, a: A) -> Result<u64, A::Error> {
        let v = Value::deserialize(MapAccessDeserializer::new(a))?;
        Ok(json_tokens(&v))
    }
}

/// A message `content`: null, a string, or an array of parts/blocks (OpenAI and Anthropic shapes).
#[derive(Clone, Copy)]
struct Content {
    depth: usize,
    field: &'static str,
    /// The fast walk (see [`Top::raw`]).
    raw: bool,
}

impl Content {
    fn top(field: &'static str, raw: bool) -> Content {
        Content {
            depth: 0,
            field,
            raw,
        }
    }
}

impl<'de> Shape<'de> for Content {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField(self.field))
    }
    fn null(self) -> Res<u64> {
        Ok(0)
    }
    fn string(self, s: &str) -> Res<u64> {
        self.tokens(text_tokens(s))
    }
    fn tokens(self, n: u64) -> Res<u64> {
        Ok(n)
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let depth = self.depth.saturating_add(1);
        Ok(Ok(sum(
            &mut a,
            Part {
                depth,
                raw: self.raw,
            },
        )?))
    }
}

/// One content part or block. Unknown shapes count their `text` if any; never an error, so that new
/// part types from providers do not break metering. Beyond [`MAX_DEPTH`] parts count 0.
#[derive(Clone, Copy)]
struct Part {
    depth: usize,
    /// The fast walk (see [`Top::raw`]).
    raw: bool,
}

impl<'de> Shape<'de> for Part {
    type Out = u64;
    fn other(self) -> u64 {
        0
    }
    fn string(self, s: &str) -> u64 {
        if self.depth > MAX_DEPTH {
            0
        } else {
            text_tokens(s)
        }
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        if self.depth > MAX_DEPTH {
            while a.next_key_seed(Seed(Ignore))?.is_some() {
                a.next_value_seed(Seed(Ignore))?;
            }
            return Ok(0);
        }
        // The `type` may come after the fields it selects: strings are counted eagerly (a part has
        // few fields besides the one that counts), except `source.data`, which is usually a large
        // base64 image and is only kept (borrowed) until the source type is known.
        let mut ty = Tag::Other;
        let mut text = None;
        let mut name = None;
        let mut thinking = None;
        let mut input = None;
        let mut content = 0;
        let mut source = None;
        let mut refusal = None;
        let mut audio = None;
        let mut file = None;
        let mut file_data = None;
        let mut file_id = false;
        let mut title = 0;
        let mut context = 0;
        let Part { depth, raw } = self;
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match k {
                Key::Type => ty = value(&mut a, TypeTag)?,
                Key::Text => text = read_text(&mut a, raw, Str)?,
                Key::Name => name = read_text(&mut a, raw, Str)?,
                Key::Thinking => thinking = read_text(&mut a, raw, Str)?,
                Key::Input => input = Some(json_tokens(&a.next_value::<Value>()?)),
                Key::Content => content = read_text(&mut a, raw, ToolResultContent { depth, raw })?,
                Key::Source => source = value(&mut a, Source { depth, raw })?,
                Key::Refusal => refusal = read_text(&mut a, raw, Str)?,
                Key::InputAudio => audio = value(&mut a, Audio)?,
                Key::File => file = value(&mut a, FilePart)?,
                // Responses `input_file` parts carry these directly.
                Key::FileData => file_data = value(&mut a, Len)?,
                Key::FileId => file_id = value(&mut a, Len)?.is_some(),
                Key::Title => title = read_text(&mut a, raw, Str)?.unwrap_or(0),
                Key::Context => context = read_text(&mut a, raw, Str)?.unwrap_or(0),
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(match ty {
            Tag::Image => IMAGE_TOKENS,
            // Anthropic tool use: name + the input object as JSON.
            Tag::ToolUse => name
                .unwrap_or(0)
                .saturating_add(input.unwrap_or(0))
                .saturating_add(3),
            // Anthropic tool result: content is a string or blocks.
            Tag::ToolResult => content.saturating_add(3),
            Tag::Thinking => thinking.unwrap_or(0),
            // Anthropic documents (and the title and context sent with them).
            Tag::Document => source
                .as_ref()
                .map_or(0, SourceParts::tokens)
                .saturating_add(text.unwrap_or(0))
                .saturating_add(title)
                .saturating_add(context),
            Tag::Audio => audio.unwrap_or(0),
            Tag::File => file.unwrap_or_else(|| file_tokens(file_data, file_id)),
            Tag::Refusal => refusal.unwrap_or(0),
            _ => text.unwrap_or(0),
        })
    }
}

/// The length in bytes of a string (base64 data, ids); None for anything else.
#[derive(Clone, Copy)]
struct Len;

impl Shape<'_> for Len {
    type Out = Option<u64>;
    fn other(self) -> Option<u64> {
        None
    }
    fn string(self, s: &str) -> Option<u64> {
        Some(s.len() as u64)
    }
}

/// Tokens of `len` bytes at `per_kb` tokens per 1024, rounded up.
fn per_kb(len: u64, per_kb: u64) -> u64 {
    len.saturating_mul(per_kb).div_ceil(1024)
}

/// A file given by `file_data` (base64, size-based, see [`FILE_TOKENS_PER_KB`]) or `file_id`
/// ([`FILE_ID_TOKENS`]); the data wins when both are there, nothing is 0.
fn file_tokens(data: Option<u64>, id: bool) -> u64 {
    match data {
        Some(len) => per_kb(len, FILE_TOKENS_PER_KB),
        None if id => FILE_ID_TOKENS,
        None => 0,
    }
}

/// `input_audio`: `{"data": "<base64>", "format": "wav" | "mp3" | …}`, costed by the size of its data
/// (see [`AUDIO_TOKENS_PER_KB`], [`AUDIO_WAV_TOKENS_PER_KB`]); None for anything else.
#[derive(Clone, Copy)]
struct Audio;

impl<'de> Shape<'de> for Audio {
    type Out = Option<u64>;
    fn other(self) -> Option<u64> {
        None
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Option<u64>, A::Error> {
        let mut len = 0;
        let mut wav = false;
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match k {
                Key::Data => len = value(&mut a, Len)?.unwrap_or(0),
                Key::Format => wav = value(&mut a, AudioFormat)?,
                _ => value(&mut a, Ignore)?,
            }
        }
        let rate = if wav {
            AUDIO_WAV_TOKENS_PER_KB
        } else {
            AUDIO_TOKENS_PER_KB
        };
        Ok(Some(per_kb(len, rate)))
    }
}

/// Whether an audio `format` is uncompressed (`wav`, `pcm16`).
#[derive(Clone, Copy)]
struct AudioFormat;

impl Shape<'_> for AudioFormat {
    type Out = bool;
    fn other(self) -> bool {
        false
    }
    fn string(self, s: &str) -> bool {
        matches!(s, "wav" | "pcm16")
    }
}

/// A chat `file` part's `file`: `{"file_data": "<base64>"}` or `{"file_id": "…"}` (see
/// [`file_tokens`]); None for anything else.
#[derive(Clone, Copy)]
struct FilePart;

impl<'de> Shape<'de> for FilePart {
    type Out = Option<u64>;
    fn other(self) -> Option<u64> {
        None
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Option<u64>, A::Error> {
        let mut data = None;
        let mut id = false;
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match k {
                Key::FileData => data = value(&mut a, Len)?,
                Key::FileId => id = value(&mut a, Len)?.is_some(),
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(Some(file_tokens(data, id)))
    }
}

/// Chat `prediction` (Predicted Outputs): `{"type": "content", "content": <string or text parts>}`,
/// counted as prompt text; null is nothing, anything else is a bad field.
#[derive(Clone, Copy)]
struct Prediction {
    /// The fast walk (see [`Top::raw`]).
    raw: bool,
}

impl<'de> Shape<'de> for Prediction {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField("prediction"))
    }
    fn null(self) -> Res<u64> {
        Ok(0)
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let mut content = Ok(0);
        let raw = self.raw;
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match k {
                Key::Content => {
                    content = read_text(&mut a, raw, Content::top("prediction.content", raw))?
                }
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(content)
    }
}

/// The `content` of a tool result block: a string or blocks; 0 for anything else.
#[derive(Clone, Copy)]
struct ToolResultContent {
    depth: usize,
    /// The fast walk (see [`Top::raw`]).
    raw: bool,
}

impl<'de> Shape<'de> for ToolResultContent {
    type Out = u64;
    fn other(self) -> u64 {
        0
    }
    fn string(self, s: &str) -> u64 {
        self.tokens(text_tokens(s))
    }
    fn tokens(self, n: u64) -> u64 {
        n
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let depth = self.depth.saturating_add(1);
        sum(
            &mut a,
            Part {
                depth,
                raw: self.raw,
            },
        )
    }
}

/// A document `source`: whether its `type` is "text", and its `data` string (kept, not yet counted).
#[derive(Clone, Copy)]
struct Source {
    depth: usize,
    /// The fast walk (see [`Top::raw`]).
    raw: bool,
}

/// What a document `source` holds, costed once its `type` is known (it may come last).
struct SourceParts<'de> {
    /// `type`, when a string.
    ty: Option<Cow<'de, str>>,
    /// `data` (text, or base64), kept until the type is known.
    data: Option<Cow<'de, str>>,
    /// Tokens of `content` (a `content` source: a string or text blocks).
    content: u64,
}

impl<'de> SourceParts<'de> {
    /// Tokens of the document: its text; base64 (PDF) by size like a file; a `url` or `file` source
    /// (not seen by the filter) like a file id; blocks of a `content` source by their text.
    fn tokens(&self) -> u64 {
        let data_len = self.data.as_deref().map(|d| d.len() as u64);
        match self.ty.as_deref() {
            Some("text") => self.data.as_deref().map_or(0, text_tokens),
            Some("base64") => file_tokens(data_len, false),
            Some("url" | "file") => FILE_ID_TOKENS,
            Some("content") => self.content,
            _ => self
                .content
                .max(data_len.map_or(0, |l| per_kb(l, FILE_TOKENS_PER_KB))),
        }
    }
}

impl<'de> Shape<'de> for Source {
    type Out = Option<SourceParts<'de>>;
    fn other(self) -> Self::Out {
        None
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Out, A::Error> {
        let mut parts = SourceParts {
            ty: None,
            data: None,
            content: 0,
        };
        let Source { depth, raw } = self;
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match k {
                Key::Type => parts.ty = value(&mut a, KeepStr)?,
                Key::Data => parts.data = value(&mut a, KeepStr)?,
                Key::Content => {
                    parts.content = read_text(
                        &mut a,
                        raw,
                        ToolResultContent {
                            depth: depth.saturating_add(1),
                            raw,
                        },
                    )?
                }
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(Some(parts))
    }
}

/// `tools` / `functions`: null or an array, each element costed as its JSON text.
#[derive(Clone, Copy)]
struct JsonList(&'static str);

impl<'de> Shape<'de> for JsonList {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField(self.0))
    }
    fn null(self) -> Res<u64> {
        Ok(0)
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let mut t = 0u64;
        while let Some(v) = a.next_element::<Value>()? {
            t = t.saturating_add(json_tokens(&v));
        }
        Ok(Ok(t))
    }
}

/// `prompt` / `input`: a string, array of strings, array of token ids, or array of arrays of token ids.
#[derive(Clone, Copy)]
struct IdsOrText(&'static str);

impl<'de> Shape<'de> for IdsOrText {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField(self.0))
    }
    fn null(self) -> Res<u64> {
        Ok(0)
    }
    fn string(self, s: &str) -> Res<u64> {
        self.tokens(text_tokens(s))
    }
    fn tokens(self, n: u64) -> Res<u64> {
        Ok(n)
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        sum_res(&mut a, IdsOrTextItem(self.0))
    }
}

/// One element of `prompt` / `input`: a string, a token id, or an array of token ids.
#[derive(Clone, Copy)]
struct IdsOrTextItem(&'static str);

impl<'de> Shape<'de> for IdsOrTextItem {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField(self.0))
    }
    fn string(self, s: &str) -> Res<u64> {
        Ok(text_tokens(s))
    }
    fn unsigned(self, _n: u64) -> Res<u64> {
        Ok(1)
    }
    fn number(self) -> Res<u64> {
        Ok(1)
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let mut ids = 0u64;
        let mut all_numbers = true;
        while let Some(is_number) = a.next_element_seed(Seed(IsNumber))? {
            ids = ids.saturating_add(1);
            all_numbers &= is_number;
        }
        Ok(if all_numbers { Ok(ids) } else { self.other() })
    }
}

/// Responses `input`: a string (one user message) or an array of items (plus the reply primer).
#[derive(Clone, Copy)]
struct ResponsesInput {
    /// The fast walk (see [`Top::raw`]).
    raw: bool,
}

impl<'de> Shape<'de> for ResponsesInput {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField("input"))
    }
    fn null(self) -> Res<u64> {
        Ok(0)
    }
    fn string(self, s: &str) -> Res<u64> {
        self.tokens(text_tokens(s))
    }
    fn tokens(self, n: u64) -> Res<u64> {
        Ok(n.saturating_add(MESSAGE_OVERHEAD)
            .saturating_add(REPLY_PRIMER))
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let item = ResponseItem { raw: self.raw };
        Ok(sum_res(&mut a, item)?.map(|t| t.saturating_add(REPLY_PRIMER)))
    }
}

/// One item of a Responses `input` array: a message (`content` string or parts), a function call, a
/// function call output, or something newer (its `text`, if any).
#[derive(Clone, Copy)]
struct ResponseItem {
    /// The fast walk (see [`Top::raw`]).
    raw: bool,
}

impl<'de> Shape<'de> for ResponseItem {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField("input[]"))
    }
    fn string(self, s: &str) -> Res<u64> {
        Ok(text_tokens(s).saturating_add(MESSAGE_OVERHEAD))
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let mut content = None;
        let mut ty = Tag::Other;
        let mut name = None;
        let mut arguments = 0;
        let mut input = None;
        let mut output = Ok(0);
        let mut text = None;
        let raw = self.raw;
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match k {
                Key::Content => {
                    let shape = Content::top("input[].content", raw);
                    content = Some(read_text(&mut a, raw, shape)?);
                }
                Key::Type => ty = value(&mut a, TypeTag)?,
                Key::Name => name = read_text(&mut a, raw, Str)?,
                Key::Arguments => arguments = value(&mut a, Arguments)?,
                Key::Input => input = read_text(&mut a, raw, Str)?,
                Key::Output => {
                    let shape = Content::top("input[].output", raw);
                    output = read_text(&mut a, raw, shape)?;
                }
                Key::Text => text = read_text(&mut a, raw, Str)?,
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok((|| {
            let has_content = content.is_some();
            let mut t = MESSAGE_OVERHEAD.saturating_add(content.unwrap_or(Ok(0))?);
            match ty {
                Tag::FunctionCall => {
                    t = t
                        .saturating_add(3)
                        .saturating_add(name.unwrap_or(0))
                        .saturating_add(arguments)
                        .saturating_add(input.unwrap_or(0));
                }
                Tag::FunctionCallOutput => t = t.saturating_add(output?),
                _ => {
                    if !has_content {
                        t = t.saturating_add(text.unwrap_or(0));
                    }
                }
            }
            Ok(t)
        })())
    }
}

/// Responses `instructions`: null or a string (plus message overhead).
#[derive(Clone, Copy)]
struct Instructions;

impl Shape<'_> for Instructions {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField("instructions"))
    }
    fn null(self) -> Res<u64> {
        Ok(0)
    }
    fn string(self, s: &str) -> Res<u64> {
        self.tokens(text_tokens(s))
    }
    fn tokens(self, n: u64) -> Res<u64> {
        Ok(n.saturating_add(MESSAGE_OVERHEAD))
    }
}

/// Responses `text`: its `format`, costed as JSON unless it is plain text; 0 for anything else.
#[derive(Clone, Copy)]
struct TextConfig;

impl<'de> Shape<'de> for TextConfig {
    type Out = u64;
    fn other(self) -> u64 {
        0
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let mut t = 0;
        while let Some(k) = a.next_key_seed(KeySeed)? {
            match k {
                Key::Format => t = format_tokens(&a.next_value::<Value>()?),
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(t)
    }
}

// ---------------------------------------------------------------------------------------------------
// Text → tokens

/// Number of features [`text_features`] counts.
pub const NUM_FEATURES: usize = 64;
// `utf8_tokens` weighs the features four at a time.
const _: () = assert!(NUM_FEATURES.is_multiple_of(4));

/// Feature indices (documentation for the calibration program and [`WEIGHTS`]).
pub mod feature {
    /// ASCII letter words of length 1..=8 are features 0..=7 (index = length − 1).
    pub const WORD_1: usize = 0;
    /// ASCII letter words of length 9 or 10.
    pub const WORD_9_10: usize = 8;
    /// ASCII letter words of length ≥ 11 (count).
    pub const WORD_LONG: usize = 9;
    /// Letters in words of length ≥ 11.
    pub const WORD_LONG_CHARS: usize = 10;
    /// Accented / extended Latin letters (Latin-1 supplement, Latin Extended-A/B, IPA).
    pub const LATIN_EXT: usize = 11;
    /// Cyrillic letters.
    pub const CYRILLIC: usize = 12;
    /// Greek letters.
    pub const GREEK: usize = 13;
    /// Arabic letters.
    pub const ARABIC: usize = 14;
    /// Devanagari and other Indic letters.
    pub const INDIC: usize = 15;
    /// Runs of Cyrillic (≈ words; the other alphabetic scripts have their own run features).
    pub const ALPHA_RUNS: usize = 16;
    /// Thai characters that occur in 50..150 multi-character o200k tokens.
    pub const THAI: usize = 17;
    /// Runs of Thai characters.
    pub const THAI_RUNS: usize = 18;
    /// Hiragana.
    pub const HIRAGANA: usize = 19;
    /// Katakana (full and half width).
    pub const KATAKANA: usize = 20;
    /// CJK ideographs that are one o200k token alone but never merge with neighbours.
    pub const HAN: usize = 21;
    /// Runs of kana/ideographs.
    pub const CJK_RUNS: usize = 22;
    /// Hangul syllables that are one o200k token alone but never merge with neighbours.
    pub const HANGUL: usize = 23;
    /// Runs of Hangul.
    pub const HANGUL_RUNS: usize = 24;
    /// Digit groups (runs split into groups of up to 3).
    pub const DIGIT_GROUPS: usize = 25;
    /// ASCII punctuation characters.
    pub const PUNCT: usize = 26;
    /// Runs of ASCII punctuation.
    pub const PUNCT_RUNS: usize = 27;
    /// CJK / fullwidth punctuation characters.
    pub const WIDE_PUNCT: usize = 28;
    /// Emoji (U+1F000 and above).
    pub const EMOJI: usize = 29;
    /// Other symbols, combining marks and unclassified characters.
    pub const OTHER: usize = 30;
    /// Runs of newlines (with the spaces around them).
    pub const NEWLINE_RUNS: usize = 31;
    /// Runs of 2 or more spaces/tabs not touching a newline (indentation, alignment).
    pub const SPACE_RUNS: usize = 32;
    /// Spaces directly before a digit (o200k never merges a space into a number).
    pub const SPACE_BEFORE_DIGIT: usize = 33;
    /// Upper-case ASCII letters (capitals and acronyms split more).
    pub const UPPER: usize = 34;
    /// Words preceded by a single punctuation character, which merges into the word.
    pub const PUNCT_WORD: usize = 35;
    /// CJK ideographs that are not a token of their own (encoded as bytes, ~2 tokens each).
    pub const HAN_RARE: usize = 36;
    /// CJK ideographs that also occur inside multi-character tokens (common words merge).
    pub const HAN_MERGE: usize = 37;
    /// Hangul syllables and jamo that are not a token of their own.
    pub const HANGUL_RARE: usize = 38;
    /// Hangul syllables that also occur inside multi-character tokens.
    pub const HANGUL_MERGE: usize = 39;
    /// Thai characters that occur in ≥ 150 multi-character o200k tokens (merge most).
    pub const THAI_COMMON: usize = 40;
    /// Thai characters that occur in < 50 multi-character o200k tokens (merge least).
    pub const THAI_RARE: usize = 41;
    /// Letters of all-capital ASCII words of length ≥ 2 (acronyms, SQL keywords, CONSTANTS).
    pub const CAPS_WORD_CHARS: usize = 42;
    /// Maximal runs of katakana (loanwords, which o200k often has as whole tokens).
    pub const KATAKANA_RUNS: usize = 43;
    /// ASCII words that start right after an ASCII letter: camelCase humps (`getHttp` + `Response`),
    /// which have no space to merge into (prose words do).
    pub const HUMP: usize = 44;
    /// ASCII words right after an ASCII digit, and digit runs right after an ASCII letter (`x86`,
    /// `utf8`, base64, hex): switches between letters and digits inside one blob.
    pub const ALNUM_SWITCH: usize = 45;
    /// ASCII punctuation from the fourth character of a run on that differs from the character
    /// before it: mixed runs (`!?.,;:`) are about one token per two characters, repeats
    /// (`========`) one token for many.
    pub const PUNCT_MIX: usize = 46;
    /// Newline runs, one per 16 newlines (o200k merges up to about 16 line breaks into a token).
    pub const NEWLINE_16: usize = 47;
    /// Space/tab runs, one per 128 (o200k's longest whitespace tokens).
    pub const SPACE_128: usize = 48;
    /// Symbols U+2000..=U+2BFF outside the punctuation block (arrows, math, currency, box drawing).
    pub const SYMBOL: usize = 49;
    /// Zero-width and format characters (ZWSP, ZWJ, bidi marks, word joiner, BOM, soft hyphen).
    pub const ZERO_WIDTH: usize = 50;
    /// Runs of zero-width / format characters.
    pub const ZERO_WIDTH_RUNS: usize = 51;
    /// Hebrew letters.
    pub const HEBREW: usize = 52;
    /// Letters of an alphabetic-script run (Cyrillic, Greek, Arabic, Hebrew, Indic) past its 12th:
    /// long runs are not words, o200k splits them into short pieces.
    pub const ALPHA_LONG: usize = 53;
    /// Accented Latin letters right after another one in the same word (Vietnamese `ườ`, random
    /// accented text).
    pub const LATIN_EXT_PAIR: usize = 54;
    /// Runs of Greek.
    pub const GREEK_RUNS: usize = 55;
    /// Runs of Arabic.
    pub const ARABIC_RUNS: usize = 56;
    /// Runs of Hebrew.
    pub const HEBREW_RUNS: usize = 57;
    /// Runs of Indic scripts.
    pub const INDIC_RUNS: usize = 58;
    /// Other characters from U+0800 on (letters of scripts without a feature of their own, which
    /// o200k mostly encodes as bytes; supplementary-plane characters other than emoji and Han).
    pub const OTHER_WIDE: usize = 59;
    /// Cyrillic letters that only Ukrainian (and Belarusian) use: і ї є ґ.
    pub const CYRILLIC_UK: usize = 60;
    /// All Cyrillic letters of a text with at least one of [`CYRILLIC_UK`] per 40 (Ukrainian, which
    /// o200k splits into about 1.4 times as many tokens as Russian). Derived: see `derive`.
    pub const CYRILLIC_UK_TEXT: usize = 61;
    /// Latin Extended-A letters (Polish, Czech, Hungarian, Turkish, … but not Vietnamese `đ`).
    pub const LATIN_EXT_A: usize = 62;
    /// ASCII words of a text with at least one accented Latin letter per 20 words: French, German,
    /// Spanish, Polish, … whose unaccented words are also rarer in o200k than English ones. Derived:
    /// see `derive`.
    pub const LATIN_EXT_A_TEXT: usize = 63;
}

/// Weight (tokens) of each feature.
///
/// Fitted against OpenAI `o200k_base` (tiktoken-rs) on the even-indexed lines of every `corpus/*.jsonl`
/// file but `adversarial` by weighted least squares minimising Σ((estimate − real)/real)², i.e.
/// relative error per sample (each class weighing the same, the eight original classes three times
/// as much), with a small ridge pull towards hand-set priors (which alone decide emoji). The
/// features that only junk has much of (mixed punctuation, newline and space runs, zero-width
/// characters, symbols, other scripts, long alphabetic runs, accented-letter pairs, camelCase humps,
/// letter/digit switches) are set by hand so that the `adversarial` class is not estimated far
/// below o200k (a little over is accepted: the limiter errs towards charging); digit groups are
/// fixed at 1 (o200k's rule). The odd-indexed lines are held out; the bench reports both.
pub const WEIGHTS: [f64; NUM_FEATURES] = [
    1.024, 0.993, 0.677, 1.008, 1.207, 0.892, 1.104, 1.408, 1.483, 1.023,
    0.125, // ASCII words: length 1..=8, 9-10, 11+ (count), 11+ (letters)
    0.150, 0.170, 0.320, 0.211, 0.257,
    0.511, // Latin-ext, Cyrillic, Greek, Arabic, Indic, Cyrillic runs
    0.615, -0.775, // Thai mid, Thai runs
    0.689, 0.636, 1.257, 0.172, // hiragana, katakana, Han, CJK runs
    1.154, 0.340, // Hangul, Hangul runs
    1.000, // digit groups
    0.050, 0.915, 1.050, // ASCII punct, punct runs, wide punct
    1.600, 1.039, // emoji, other
    0.247, 0.774, 0.777, -0.491,
    -0.556, // newline runs, space runs, space before digit, upper case, punct+word
    2.223, 0.685, 2.275, 0.589, // Han rare/merge, Hangul rare/merge
    0.379, 0.493, 0.501, // Thai common/rare, all-caps letters
    0.491, // katakana runs
    0.600, 0.900, 0.600, 1.000, // hump, alnum switch, punct mix, newlines / 16
    1.000, 1.500, 0.250, 1.000, // spaces / 128, symbols, zero-width, zero-width runs
    0.293, 0.550, 0.750, 0.522, // Hebrew, alpha long, Latin-ext pair, Greek runs
    0.512, 0.568, 0.491, 3.000, // Arabic runs, Hebrew runs, Indic runs, other wide
    0.222, 0.110, 0.818,
    0.093, // Ukrainian letters and text, Latin Extended-A letters and text
];

/// Character classes of non-ASCII code points (and, in [`ascii_cls`], of ASCII bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Cls {
    Lower,
    Upper,
    Digit,
    Space,
    Newline,
    Punct,
    LatinExt,
    Cyrillic,
    /// і ї є ґ (and capitals).
    CyrillicUk,
    Greek,
    Arabic,
    Hebrew,
    Indic,
    Thai,
    ThaiCommon,
    ThaiRare,
    Hiragana,
    Katakana,
    Han,
    HanRare,
    HanMerge,
    Hangul,
    HangulRare,
    HangulMerge,
    WidePunct,
    Emoji,
    /// Zero-width and format characters.
    ZeroWidth,
    /// Symbols U+2000..=U+2BFF outside the punctuation block.
    Symbol,
    /// Any other character from U+0800 on.
    OtherWide,
    Other,
}

#[inline(always)]
fn ascii_cls(b: u8) -> Cls {
    if b.is_ascii_lowercase() {
        Cls::Lower
    } else if b.is_ascii_uppercase() {
        Cls::Upper
    } else if b.is_ascii_digit() {
        Cls::Digit
    } else if b == b'\n' || b == b'\r' {
        Cls::Newline
    } else if b == b' ' || b == b'\t' || b == 0x0b || b == 0x0c {
        Cls::Space
    } else if !(0x20..0x7f).contains(&b) {
        Cls::Other
    } else {
        Cls::Punct
    }
}

/// Class of a non-ASCII code point: the scripts that make up long runs (Han, Hangul, Thai, kana) by one
/// range check and a table each, the rest by [`classify_other`].
#[inline(always)]
fn classify(c: u32) -> Cls {
    let han = c.wrapping_sub(0x4E00);
    if han < HAN_COUNT {
        return match packed_class(&HAN_PACKED, han) {
            2 => Cls::HanMerge,
            1 => Cls::Han,
            _ => Cls::HanRare,
        };
    }
    let hangul = c.wrapping_sub(0xAC00);
    if hangul < HANGUL_COUNT {
        return match packed_class(&HANGUL_PACKED, hangul) {
            2 => Cls::HangulMerge,
            1 => Cls::Hangul,
            _ => Cls::HangulRare,
        };
    }
    let thai = c.wrapping_sub(0xE00);
    if thai < 0x80 {
        return thai_class(c);
    }
    match c {
        0x3001..=0x303F => Cls::WidePunct,
        0x3040..=0x309F => Cls::Hiragana,
        0x30A0..=0x30FF => Cls::Katakana,
        // Fullwidth punctuation (as in `classify_other`, without the digits and letters between).
        0xFF01..=0xFF0F | 0xFF1A..=0xFF20 | 0xFF3B..=0xFF40 | 0xFF5B..=0xFF64 => Cls::WidePunct,
        _ => classify_other(c),
    }
}

/// Class of any code point (the general case of [`classify`]).
#[inline(never)]
fn classify_other(c: u32) -> Cls {
    match classify_block(c) {
        Cls::Other if c >= 0x800 => {
            if (0x2000..=0x2BFF).contains(&c) {
                Cls::Symbol
            } else {
                Cls::OtherWide
            }
        }
        cls => cls,
    }
}

/// [`classify_other`] by block, before characters from U+0800 on without a class are told apart.
#[inline(always)]
fn classify_block(c: u32) -> Cls {
    // Nested ranges so that the common blocks are reached in a few comparisons.
    if c < 0x3000 {
        if c < 0x370 {
            return match c {
                0..=0x7F => u8::try_from(c).map_or(Cls::Other, ascii_cls),
                0xA0 => Cls::Space,
                0x85 => Cls::Newline,
                0xAD => Cls::ZeroWidth,
                0xD7 | 0xF7 => Cls::Other,
                0xC0..=0x2AF => Cls::LatinExt,
                _ => Cls::Other,
            };
        }
        if c < 0x1000 {
            return match c {
                0x370..=0x3FF => Cls::Greek,
                0x404 | 0x406 | 0x407 | 0x454 | 0x456 | 0x457 | 0x490 | 0x491 => Cls::CyrillicUk,
                0x400..=0x52F => Cls::Cyrillic,
                0x590..=0x5FF => Cls::Hebrew,
                0x600..=0x6FF | 0x750..=0x77F | 0x8A0..=0x8FF => Cls::Arabic,
                0x900..=0xDFF => Cls::Indic,
                0xE00..=0xE7F => thai_class(c),
                _ => Cls::Other,
            };
        }
        return match c {
            0x1100..=0x11FF => Cls::HangulRare,
            0x1E00..=0x1EFF => Cls::LatinExt,
            0x1F00..=0x1FFF => Cls::Greek,
            0x2000..=0x200A | 0x202F | 0x205F => Cls::Space,
            0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x206F => Cls::ZeroWidth,
            0x2028 | 0x2029 => Cls::Newline,
            0x2010..=0x206F => Cls::Punct,
            _ => Cls::Other,
        };
    }
    if c < 0xA000 {
        return match c {
            0x4E00..=0x9FFF => classify(c),
            0x3000 => Cls::Space,
            0x3001..=0x303F => Cls::WidePunct,
            0x3040..=0x309F => Cls::Hiragana,
            0x30A0..=0x30FF | 0x31F0..=0x31FF => Cls::Katakana,
            0x3130..=0x318F => Cls::HangulRare,
            0x3400..=0x4DBF => Cls::HanRare,
            _ => Cls::Other,
        };
    }
    if c < 0x10000 {
        return match c {
            0xAC00..=0xD7A3 => classify(c),
            0xA960..=0xA97F | 0xD7A4..=0xD7FF => Cls::HangulRare,
            0xF900..=0xFAFF => Cls::HanRare,
            0xFE00..=0xFE0F | 0xFEFF => Cls::ZeroWidth,
            0xFB1D..=0xFB4F => Cls::Hebrew,
            0xFB50..=0xFDFF | 0xFE70..=0xFEFE => Cls::Arabic,
            0xFF10..=0xFF19 => Cls::Digit,
            0xFF21..=0xFF3A | 0xFF41..=0xFF5A => Cls::Han,
            0xFF01..=0xFF64 => Cls::WidePunct,
            0xFF65..=0xFF9F => Cls::Katakana,
            _ => Cls::Other,
        };
    }
    match c {
        0x1F000..=0x1FAFF => Cls::Emoji,
        0x20000..=0x3FFFF => Cls::HanRare,
        _ => Cls::Other,
    }
}

/// Thai, by how many multi-character o200k tokens contain the character (vocabulary scan):
/// ≥ 150: า น ร เ อ ่ ม ั ง ล ก ย ิ ี ต ด ว; 50..150: ้ ส ค ท บ ห ์ ุ แ พ ป จ ไ ็ ะ ข โ ื; the rest fewer.
#[inline(always)]
fn thai_class(c: u32) -> Cls {
    THAI_TABLE
        .get(c.wrapping_sub(0xE00) as usize)
        .copied()
        .unwrap_or(Cls::ThaiRare)
}

/// [`thai_class_slow`] for U+0E00..=U+0E7F.
static THAI_TABLE: [Cls; 0x80] = {
    let mut t = [Cls::ThaiRare; 0x80];
    let mut i = 0;
    while i < 0x80 {
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            t[i] = thai_class_slow(0xE00 + i as u32);
        }
        i += 1;
    }
    t
};

const fn thai_class_slow(c: u32) -> Cls {
    match c {
        0xE32 | 0xE19 | 0xE23 | 0xE40 | 0xE2D | 0xE48 | 0xE21 | 0xE31 | 0xE07 | 0xE25 | 0xE01
        | 0xE22 | 0xE34 | 0xE35 | 0xE15 | 0xE14 | 0xE27 => Cls::ThaiCommon,
        0xE49 | 0xE2A | 0xE04 | 0xE17 | 0xE1A | 0xE2B | 0xE4C | 0xE38 | 0xE41 | 0xE1E | 0xE1B
        | 0xE08 | 0xE44 | 0xE47 | 0xE30 | 0xE02 | 0xE42 | 0xE37 => Cls::Thai,
        _ => Cls::ThaiRare,
    }
}

/// Which run a class belongs to (consecutive characters of one run form one pre-token piece).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Run {
    Alpha,
    Thai,
    Cjk,
    Hangul,
}

#[inline]
fn run_of(c: Cls) -> Option<Run> {
    match c {
        Cls::Cyrillic | Cls::CyrillicUk | Cls::Greek | Cls::Arabic | Cls::Hebrew | Cls::Indic => {
            Some(Run::Alpha)
        }
        Cls::Thai | Cls::ThaiCommon | Cls::ThaiRare => Some(Run::Thai),
        Cls::Hiragana | Cls::Katakana | Cls::Han | Cls::HanRare | Cls::HanMerge => Some(Run::Cjk),
        Cls::Hangul | Cls::HangulRare | Cls::HangulMerge => Some(Run::Hangul),
        _ => None,
    }
}

/// Per-character feature of a script class (None for classes handled elsewhere).
#[inline]
fn char_feature(c: Cls) -> Option<usize> {
    Some(match c {
        Cls::LatinExt => feature::LATIN_EXT,
        Cls::Cyrillic => feature::CYRILLIC,
        Cls::CyrillicUk => feature::CYRILLIC_UK,
        Cls::Greek => feature::GREEK,
        Cls::Arabic => feature::ARABIC,
        Cls::Hebrew => feature::HEBREW,
        Cls::Indic => feature::INDIC,
        Cls::Thai => feature::THAI,
        Cls::ThaiCommon => feature::THAI_COMMON,
        Cls::ThaiRare => feature::THAI_RARE,
        Cls::Hiragana => feature::HIRAGANA,
        Cls::Katakana => feature::KATAKANA,
        Cls::Han => feature::HAN,
        Cls::HanRare => feature::HAN_RARE,
        Cls::HanMerge => feature::HAN_MERGE,
        Cls::Hangul => feature::HANGUL,
        Cls::HangulRare => feature::HANGUL_RARE,
        Cls::HangulMerge => feature::HANGUL_MERGE,
        Cls::WidePunct => feature::WIDE_PUNCT,
        Cls::Emoji => feature::EMOJI,
        Cls::Other => feature::OTHER,
        Cls::ZeroWidth => feature::ZERO_WIDTH,
        Cls::Symbol => feature::SYMBOL,
        Cls::OtherWide => feature::OTHER_WIDE,
        Cls::Punct => feature::PUNCT,
        Cls::Lower | Cls::Upper | Cls::Digit | Cls::Space | Cls::Newline => return None,
    })
}

/// Feature counters of one text: the [`NUM_FEATURES`] features, padded to 64 so that an index masked
/// with 63 is always in range (no bounds check, nothing to panic).
type Counts = [u64; 64];

#[inline(always)]
fn bump(f: &mut Counts, idx: usize, n: u64) {
    if let Some(slot) = f.get_mut(idx & 63) {
        // Every feature grows by at most the number of bytes it consumed (≤ isize::MAX in total for
        // one `&str`), so the counts cannot wrap.
        *slot = slot.wrapping_add(n);
    }
}

/// Feature of a plain ASCII word by its length (index: length, capped at 11 = "11 or more").
const WORD_FEATURE: [usize; 12] = [
    feature::WORD_1, // not used: a word has at least one letter
    feature::WORD_1,
    feature::WORD_1 + 1,
    feature::WORD_1 + 2,
    feature::WORD_1 + 3,
    feature::WORD_1 + 4,
    feature::WORD_1 + 5,
    feature::WORD_1 + 6,
    feature::WORD_1 + 7,
    feature::WORD_9_10,
    feature::WORD_9_10,
    feature::WORD_LONG,
];

/// Counts one word of `len` letters (the word-length features).
#[inline(always)]
fn count_word(f: &mut Counts, len: usize) {
    if len >= 11 {
        bump(f, feature::WORD_LONG_CHARS, len as u64);
    }
    bump(
        f,
        WORD_FEATURE
            .get(len.min(11))
            .copied()
            .unwrap_or(feature::WORD_LONG),
        1,
    );
}

/// Number of bytes from `i` on that satisfy `pred` (a tight loop without bounds checks).
#[inline(always)]
fn count_while(bytes: &[u8], i: usize, pred: impl Fn(u8) -> bool) -> usize {
    let mut n = 0;
    // `i + n` ≤ `bytes.len()` throughout, so the sum cannot overflow.
    while let Some(&b) = bytes.get(i + n) {
        if !pred(b) {
            break;
        }
        n += 1;
    }
    n
}

/// High bit set in each byte of `w` that is not an ASCII lower-case letter (SWAR, no branches).
#[inline(always)]
fn not_lower_mask(w: u64) -> u64 {
    const HI: u64 = 0x8080_8080_8080_8080;
    // Clearing the high bits first means the additions below never carry from one byte into the next.
    let x = w & !HI;
    let at_least_a = x.wrapping_add(0x1F1F_1F1F_1F1F_1F1F); // high bit set iff byte >= b'a'
    let past_z = x.wrapping_add(0x0505_0505_0505_0505); // high bit set iff byte >= b'z' + 1
    let lower = at_least_a & !past_z & !w & HI;
    !lower & HI
}

/// Length of the run of ASCII lower-case letters at `i`, eight bytes at a time.
#[inline(always)]
fn lower_run(bytes: &[u8], i: usize) -> usize {
    let mut n = 0usize;
    // `i + n` ≤ `bytes.len()` throughout, so the sums cannot overflow.
    while let Some(chunk) = bytes.get(i + n..i + n + 8) {
        let w = u64::from_le_bytes(<[u8; 8]>::try_from(chunk).unwrap_or([0; 8]));
        let m = not_lower_mask(w);
        if m != 0 {
            // Little-endian: the lowest set bit marks the first byte that is not a letter.
            return n + (m.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    n + count_while(bytes, i + n, |b| b.is_ascii_lowercase())
}

/// The per-letter feature of an accented Latin letter.
#[inline(always)]
fn latin_ext_feature(cp: u32) -> usize {
    if (0x100..=0x17F).contains(&cp) && cp != 0x110 && cp != 0x111 {
        feature::LATIN_EXT_A
    } else {
        feature::LATIN_EXT
    }
}

#[inline(always)]
fn is_latin_ext(cp: u32) -> bool {
    matches!(cp, 0xC0..=0xD6 | 0xD8..=0xF6 | 0xF8..=0x2AF | 0x1E00..=0x1EFF)
}

/// Scan one word of Latin letters starting at `i`: upper-case letters then lower-case ones (accented
/// letters count as lower case), so "camelCase" is two words and "HTTPServer" one, like o200k's
/// pre-tokenizer. Returns the index after the word (always > `i`).
#[inline(always)]
fn scan_word(bytes: &[u8], start: usize, f: &mut Counts, after_punct: bool) -> usize {
    // Index arithmetic below is bounded by `bytes.len()`, so it cannot overflow.
    let upper = count_while(bytes, start, |b| b.is_ascii_uppercase());
    let mut i = start + upper;
    let mut letters = upper;
    let mut mixed = false;
    // The letter before is an accented one.
    let mut ext = false;
    loop {
        let lower = lower_run(bytes, i);
        i += lower;
        letters += lower;
        mixed |= lower > 0;
        ext &= lower == 0;
        match decode(bytes, i) {
            Some((cp, n)) if is_latin_ext(cp) => {
                i += n;
                letters += 1;
                mixed = true;
                bump(f, latin_ext_feature(cp), 1);
                if ext {
                    bump(f, feature::LATIN_EXT_PAIR, 1);
                }
                ext = true;
            }
            _ => break,
        }
    }
    if letters == 0 {
        return start + 1; // not called on a non-letter; guarantees progress anyway
    }
    count_word(f, letters);
    if upper > 0 {
        let upper = u64::try_from(upper).unwrap_or(u64::MAX);
        bump(f, feature::UPPER, upper);
        if !mixed && upper >= 2 {
            bump(f, feature::CAPS_WORD_CHARS, upper);
        }
    }
    if after_punct {
        bump(f, feature::PUNCT_WORD, 1);
    }
    i
}

/// What follows a run of spaces: it decides whether the run has a feature of its own.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AfterSpaces {
    /// An ASCII or fullwidth digit.
    Digit,
    /// A line break (which takes the spaces into its own piece), or the end of the text.
    Newline,
    Other,
}

/// The class of the character at `i` (a character boundary of valid UTF-8), as far as spaces care:
/// [`classify`] would say `Digit` for 0-9 and U+FF10..=U+FF19, `Newline` for CR, LF, U+0085, U+2028
/// and U+2029.
#[inline(always)]
fn after_spaces(bytes: &[u8], i: usize) -> AfterSpaces {
    match bytes.get(i..) {
        None | Some([]) => AfterSpaces::Newline,
        Some([b'0'..=b'9', ..] | [0xEF, 0xBC, 0x90..=0x99, ..]) => AfterSpaces::Digit,
        Some([b'\n' | b'\r', ..] | [0xC2, 0x85, ..] | [0xE2, 0x80, 0xA8 | 0xA9, ..]) => {
            AfterSpaces::Newline
        }
        _ => AfterSpaces::Other,
    }
}

/// Byte classes for the ASCII dispatch of [`count_features`] (one bit each, from [`BYTE_CLASS`]).
const B_LOWER: u8 = 1;
const B_UPPER: u8 = 2;
const B_DIGIT: u8 = 4;
/// Space or tab.
const B_SPACE: u8 = 8;
/// `\n` or `\r`.
const B_NEWLINE: u8 = 16;
/// ASCII punctuation.
const B_PUNCT: u8 = 32;
/// Any other ASCII control character (and DEL).
const B_CONTROL: u8 = 64;
/// A byte of a non-ASCII character.
const B_HIGH: u8 = 128;

static BYTE_CLASS: [u8; 256] = {
    let mut t = [B_HIGH; 256];
    let mut b = 0;
    while b < 0x80 {
        let c = b as u8;
        let class = if c.is_ascii_lowercase() {
            B_LOWER
        } else if c.is_ascii_uppercase() {
            B_UPPER
        } else if c.is_ascii_digit() {
            B_DIGIT
        } else if c == b' ' || c == b'\t' {
            B_SPACE
        } else if c == b'\n' || c == b'\r' {
            B_NEWLINE
        } else if c.is_ascii_punctuation() {
            B_PUNCT
        } else {
            B_CONTROL
        };
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            t[b] = class;
        }
        b += 1;
    }
    t
};

#[inline(always)]
fn byte_class(b: u8) -> u8 {
    // A `u8` index into 256 entries: always in range.
    BYTE_CLASS.get(usize::from(b)).copied().unwrap_or(B_HIGH)
}

/// The [`byte_class`] of the byte before `i` (0 at the start).
#[inline(always)]
fn prev_class(bytes: &[u8], i: usize) -> u8 {
    bytes.get(i.wrapping_sub(1)).map_or(0, |&b| byte_class(b))
}

/// [`feature::PUNCT_MIX`] of one run of ASCII punctuation: its characters from the fourth on that
/// differ from the one before.
#[inline(never)]
pub(crate) fn punct_mix(run: &[u8]) -> u64 {
    let pairs = run.windows(2).skip(2);
    pairs.filter(|p| p.first() != p.get(1)).count() as u64
}

/// Number of bytes from `i` on whose class is in `classes`.
#[inline(always)]
fn run_of_class(bytes: &[u8], i: usize, classes: u8) -> usize {
    count_while(bytes, i, |b| byte_class(b) & classes != 0)
}

/// Count the features of `text` in one pass (exposed for the calibration program and the bench).
#[doc(hidden)]
pub fn text_features(text: &str) -> [u64; NUM_FEATURES] {
    let mut f: Counts = [0; 64];
    // A `&str` is valid UTF-8: the scan never stops early.
    count_text(text.as_bytes(), &mut f);
    derive(&mut f);
    let mut out = [0u64; NUM_FEATURES];
    for (o, n) in out.iter_mut().zip(f.iter()) {
        *o = *n;
    }
    out
}

/// Script-aware token estimate for one piece of text (the core). 0 for empty text, at least 1 otherwise.
pub fn text_tokens(text: &str) -> u64 {
    // A `&str` is valid UTF-8: never None.
    utf8_tokens(text.as_bytes()).unwrap_or(0)
}

/// [`text_tokens`] of bytes that may not be UTF-8 (a string read raw from the body): None if they are
/// not, checked in the same pass that counts them.
fn utf8_tokens(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return Some(0);
    }
    let windows = windows_pay(bytes);
    if windows || !TWO_LOOPS {
        tokens_of::<true>(bytes, windows)
    } else {
        tokens_of::<false>(bytes, false)
    }
}

/// [`utf8_tokens`] of non-empty `bytes` by [`count_features`] (one function for each loop, see
/// [`TWO_LOOPS`]).
#[inline(never)]
fn tokens_of<const WINDOWS: bool>(bytes: &[u8], windows: bool) -> Option<u64> {
    let mut f: Counts = [0; 64];
    if !count_features::<WINDOWS>(bytes, &mut f, windows) {
        return None;
    }
    derive(&mut f);
    let mut sum = 0.0f64;
    // In feature order, as a plain loop over all of them would add. Zero counts add nothing (the sum
    // is never -0.0), so they are skipped, four at a time: short texts touch few features.
    for (counts, weights) in f.chunks_exact(4).zip(WEIGHTS.chunks_exact(4)) {
        if counts.iter().fold(0, |any, &c| any | c) != 0 {
            for (count, w) in counts.iter().zip(weights) {
                if *count != 0 {
                    // u64 → f64 loses precision only beyond 2^53 features, far beyond any body.
                    sum += *count as f64 * w;
                }
            }
        }
    }
    // `as` saturates for f64 → u64 (NaN → 0).
    Some((sum.round() as u64).max(1))
}

/// The features that describe the whole text, from the counts of the others (see
/// [`feature::CYRILLIC_UK_TEXT`] and [`feature::LATIN_EXT_A_TEXT`]).
#[inline(always)]
fn derive(f: &mut Counts) {
    let count = |f: &Counts, idx: usize| f.get(idx).copied().unwrap_or(0);
    let uk = count(f, feature::CYRILLIC_UK);
    if uk != 0 {
        let cyrillic = count(f, feature::CYRILLIC).saturating_add(uk);
        if uk.saturating_mul(40) >= cyrillic {
            bump(f, feature::CYRILLIC_UK_TEXT, cyrillic);
        }
    }
    let accented = count(f, feature::LATIN_EXT_A).saturating_add(count(f, feature::LATIN_EXT));
    if accented != 0 {
        let words = f
            .get(feature::WORD_1..=feature::WORD_LONG)
            .map_or(0, |w| w.iter().fold(0u64, |a, &b| a.saturating_add(b)));
        if accented.saturating_mul(20) >= words {
            // Capitalised words too: German nouns split more than English ones.
            let upper = count(f, feature::UPPER);
            bump(f, feature::LATIN_EXT_A_TEXT, words.saturating_add(upper));
        }
    }
}

/// Whether `bytes` is worth reading with ASCII windows: long enough (a window costs about what the
/// byte-wise loop pays for 40 to 60 bytes of code, and most chat messages are shorter) and mostly
/// ASCII.
#[inline(always)]
fn windows_pay(bytes: &[u8]) -> bool {
    bytes.len() >= ascii::MIN_TEXT && ascii::mostly(bytes)
}

/// [`count_features`], with ASCII windows where they pay (see [`windows_pay`]).
#[inline(always)]
fn count_text(bytes: &[u8], f: &mut Counts) -> bool {
    let windows = windows_pay(bytes);
    if windows || !TWO_LOOPS {
        count_features::<true>(bytes, f, windows)
    } else {
        count_features::<false>(bytes, f, false)
    }
}

/// Whether text that is not read with ASCII windows has a loop of its own, without them. Where it
/// does not, windows are rarely used, but natively (x86_64) their mere presence in the loop slows the
/// script loops down by a few percent; the wasm build has the one loop, which is smaller.
const TWO_LOOPS: bool = !cfg!(target_arch = "wasm32");

/// The loop of [`text_features`]. Returns false (and stops) where `bytes` is not UTF-8: every
/// non-ASCII character is decoded by [`decode`] or by a pattern that only matches valid sequences.
/// `WINDOWS` and `windows`: ASCII is counted a window at a time where it can be (the counts are the
/// same).
#[inline(always)]
fn count_features<const WINDOWS: bool>(bytes: &[u8], f: &mut Counts, windows: bool) -> bool {
    // Index arithmetic is bounded by `bytes.len()` (≤ isize::MAX), so plain `+` cannot overflow.
    let mut i = 0usize;
    // The previous run was a single ASCII punctuation character (it merges into a following word).
    let mut after_punct = false;
    // ASCII is read a window at a time (see `ascii.rs`) from here on.
    let mut windows_at = if windows { 0 } else { usize::MAX };
    let mut tally = ascii::Tally::default();
    while let Some(&b) = bytes.get(i) {
        if WINDOWS && b < 0x80 && i >= windows_at {
            match ascii::window(bytes, i, after_punct, &mut tally) {
                ascii::Step::Counted {
                    next,
                    after_punct: single_punct,
                    prose,
                } => {
                    i = next;
                    after_punct = single_punct;
                    if prose {
                        windows_at = next + ascii::PROSE;
                    }
                    continue;
                }
                ascii::Step::Declined { until } => windows_at = until,
            }
        }
        let was_punct = after_punct;
        after_punct = false;
        let class = byte_class(b);
        if class & B_LOWER != 0 {
            // Fast path: words of ASCII lower-case letters not followed by an accented letter, the
            // single spaces between them (which have no feature of their own), and a capitalised
            // word after one.
            let mut was_punct = was_punct;
            // A lower-case word starts after a letter only where that letter is not ASCII.
            if prev_class(bytes, i) & B_DIGIT != 0 {
                bump(f, feature::ALNUM_SWITCH, 1);
            }
            loop {
                // Words shorter than eight letters (most): what follows them is in the same load.
                if let Some(w) = bytes
                    .get(i..i + 8)
                    .and_then(|c| <[u8; 8]>::try_from(c).ok())
                {
                    let w = u64::from_le_bytes(w);
                    let m = not_lower_mask(w);
                    if m != 0 {
                        // 1..=7: the byte at `i` is a letter.
                        let len = (m.trailing_zeros() / 8) as usize;
                        let next = (w >> (8 * len)) as u8;
                        if next >= 0x80 {
                            i = scan_word(bytes, i, f, was_punct);
                            break;
                        }
                        bump(f, feature::WORD_1 + len - 1, 1);
                        if was_punct {
                            bump(f, feature::PUNCT_WORD, 1);
                        }
                        i += len;
                        if next != b' ' {
                            break;
                        }
                        let after = if len < 7 {
                            (w >> (8 * (len + 1))) as u8
                        } else {
                            match bytes.get(i + 1) {
                                Some(&b) => b,
                                None => break,
                            }
                        };
                        if after.is_ascii_lowercase() {
                            i += 1;
                            was_punct = false;
                            continue;
                        }
                        if after.is_ascii_uppercase() {
                            i = scan_word(bytes, i + 1, f, false);
                        }
                        break;
                    }
                }
                let len = lower_run(bytes, i);
                if bytes.get(i + len).is_some_and(|&n| n >= 0x80) {
                    i = scan_word(bytes, i, f, was_punct);
                    break;
                }
                count_word(f, len);
                if was_punct {
                    bump(f, feature::PUNCT_WORD, 1);
                }
                i += len;
                match bytes.get(i..i + 2) {
                    Some([b' ', n]) if n.is_ascii_lowercase() => {
                        i += 1;
                        was_punct = false;
                    }
                    Some([b' ', n]) if n.is_ascii_uppercase() => {
                        i = scan_word(bytes, i + 1, f, false);
                        break;
                    }
                    _ => break,
                }
            }
        } else if class & B_SPACE != 0 {
            // The common case first: one space between two words has no feature of its own (it has
            // one only before a digit, ASCII or fullwidth, whose UTF-8 starts with 0xEF).
            if b == b' '
                && bytes
                    .get(i + 1)
                    .is_some_and(|&n| n != b' ' && n != b'\t' && n != 0xEF && !n.is_ascii_digit())
            {
                i += 1;
                continue;
            }
            let len = run_of_class(bytes, i, B_SPACE);
            i += len;
            bump(f, feature::SPACE_128, (len / 128) as u64);
            match after_spaces(bytes, i) {
                AfterSpaces::Digit => bump(f, feature::SPACE_BEFORE_DIGIT, 1),
                // Spaces before a newline or at the end belong to the newline piece.
                AfterSpaces::Newline => continue,
                AfterSpaces::Other => {}
            }
            if len >= 2 {
                bump(f, feature::SPACE_RUNS, 1);
            }
        } else if class & B_PUNCT != 0 {
            let len = run_of_class(bytes, i, B_PUNCT);
            if len >= 4 {
                bump(
                    f,
                    feature::PUNCT_MIX,
                    punct_mix(bytes.get(i..i + len).unwrap_or(&[])),
                );
            }
            i += len;
            after_punct = len == 1;
            bump(f, feature::PUNCT, len as u64);
            bump(f, feature::PUNCT_RUNS, 1);
        } else if class & B_UPPER != 0 {
            let prev = prev_class(bytes, i);
            if prev & (B_LOWER | B_UPPER) != 0 {
                bump(f, feature::HUMP, 1);
            } else if prev & B_DIGIT != 0 {
                bump(f, feature::ALNUM_SWITCH, 1);
            }
            i = scan_word(bytes, i, f, was_punct);
        } else if class & B_DIGIT != 0 {
            if prev_class(bytes, i) & (B_LOWER | B_UPPER) != 0 {
                bump(f, feature::ALNUM_SWITCH, 1);
            }
            let len = run_of_class(bytes, i, B_DIGIT);
            i += len;
            bump(f, feature::DIGIT_GROUPS, len.div_ceil(3) as u64);
        } else if class & B_NEWLINE != 0 {
            let len = run_of_class(bytes, i, B_NEWLINE);
            i += len;
            bump(f, feature::NEWLINE_RUNS, 1);
            bump(f, feature::NEWLINE_16, (len / 16) as u64);
        } else if class & B_HIGH != 0 {
            match scan_non_ascii(bytes, i, f, was_punct) {
                Some(next) => i = next,
                None => return false,
            }
        } else {
            // Other control characters.
            bump(f, feature::OTHER, 1);
            i += 1;
        }
    }
    if WINDOWS {
        tally.add_to(f);
    }
    true
}

/// One piece that starts with the non-ASCII character at `i`; returns the index after it (> `i`), or
/// None if no UTF-8 character starts at `i`.
#[inline(always)]
fn scan_non_ascii(bytes: &[u8], i: usize, f: &mut Counts, was_punct: bool) -> Option<usize> {
    let (cp, n) = decode(bytes, i)?;
    let j = i + n;
    // The scripts of long runs first, straight into their run loops.
    let han = cp.wrapping_sub(0x4E00);
    if han < HAN_COUNT {
        bump(f, feature::CJK_RUNS, 1);
        bump(f, han_feature(han), 1);
        return Some(scan_cjk(bytes, j, false, f));
    }
    let hangul = cp.wrapping_sub(0xAC00);
    if hangul < HANGUL_COUNT {
        bump(f, feature::HANGUL_RUNS, 1);
        bump(f, hangul_feature(hangul), 1);
        return Some(scan_hangul(bytes, j, f));
    }
    let thai = cp.wrapping_sub(0xE00);
    if thai < 0x80 {
        bump(f, feature::THAI_RUNS, 1);
        bump(f, thai_feature(thai), 1);
        return Some(scan_thai(bytes, j, f));
    }
    let cls = classify(cp);
    Some(match cls {
        Cls::LatinExt => scan_word(bytes, i, f, was_punct),
        // Unicode spaces, line separators, punctuation and digits: one piece each. A non-ASCII
        // space is never merged into a word by o200k: the typographic ones (U+2000–U+200A, U+205F)
        // are two tokens, no-break, narrow and ideographic spaces about one.
        Cls::Space => {
            // A run of the same space: o200k merges no-break and ideographic spaces (about 8 and
            // 16 to a token), not the typographic or narrow ones (two and one token each).
            let mut end = j;
            let mut run = 1u64;
            while let Some((next, m)) = decode(bytes, end) {
                if next != cp {
                    break;
                }
                end += m;
                run += 1;
            }
            if (0x2000..=0x200A).contains(&cp) || cp == 0x205F {
                bump(f, feature::SYMBOL, run);
            } else if cp == 0xA0 || cp == 0x3000 {
                bump(f, feature::PUNCT_RUNS, 1 + (run - 1) / 8);
            } else {
                bump(f, feature::PUNCT_RUNS, run);
            }
            end
        }
        Cls::Newline => {
            bump(f, feature::NEWLINE_RUNS, 1);
            j
        }
        Cls::Punct => {
            bump(f, feature::PUNCT, 1);
            bump(f, feature::PUNCT_RUNS, 1);
            j
        }
        Cls::Digit => {
            bump(f, feature::DIGIT_GROUPS, 1);
            j
        }
        Cls::ZeroWidth => {
            // A run of them is one piece; o200k merges a few into a token.
            let mut j = j;
            let mut n = 1u64;
            while let Some((cp, len)) = decode(bytes, j) {
                if classify(cp) != Cls::ZeroWidth {
                    break;
                }
                n += 1;
                j += len;
            }
            bump(f, feature::ZERO_WIDTH_RUNS, 1);
            bump(f, feature::ZERO_WIDTH, n);
            j
        }
        _ => {
            if let Some(idx) = char_feature(cls) {
                bump(f, idx, 1);
            }
            match run_of(cls) {
                Some(Run::Cjk) => {
                    bump(f, feature::CJK_RUNS, 1);
                    scan_cjk(bytes, j, cls == Cls::Katakana, f)
                }
                Some(Run::Hangul) => {
                    bump(f, feature::HANGUL_RUNS, 1);
                    scan_hangul(bytes, j, f)
                }
                Some(Run::Alpha) => {
                    bump(f, alpha_run_feature(cls), 1);
                    scan_run(bytes, j, Run::Alpha, f)
                }
                Some(Run::Thai) => {
                    bump(f, feature::THAI_RUNS, 1);
                    scan_run(bytes, j, Run::Thai, f)
                }
                None => j,
            }
        }
    })
}

/// The feature that counts runs of alphabetic scripts, by the class of the run's first letter.
#[inline(always)]
fn alpha_run_feature(cls: Cls) -> usize {
    match cls {
        Cls::Greek => feature::GREEK_RUNS,
        Cls::Arabic => feature::ARABIC_RUNS,
        Cls::Hebrew => feature::HEBREW_RUNS,
        Cls::Indic => feature::INDIC_RUNS,
        _ => feature::ALPHA_RUNS,
    }
}

/// Per-character feature of a CJK ideograph (index into [`HAN_PACKED`]).
#[inline(always)]
fn han_feature(han: u32) -> usize {
    const BY_CLASS: [usize; 4] = [
        feature::HAN_RARE,
        feature::HAN,
        feature::HAN_MERGE,
        feature::HAN_RARE,
    ];
    let class = usize::from(packed_class(&HAN_PACKED, han));
    BY_CLASS.get(class).copied().unwrap_or(feature::HAN_RARE)
}

/// Per-character feature of a Hangul syllable (index into [`HANGUL_PACKED`]).
#[inline(always)]
fn hangul_feature(hangul: u32) -> usize {
    const BY_CLASS: [usize; 4] = [
        feature::HANGUL_RARE,
        feature::HANGUL,
        feature::HANGUL_MERGE,
        feature::HANGUL_RARE,
    ];
    let class = usize::from(packed_class(&HANGUL_PACKED, hangul));
    BY_CLASS.get(class).copied().unwrap_or(feature::HANGUL_RARE)
}

/// Per-character feature of a Thai-block character (`thai` = code point − U+0E00, < 0x80).
#[inline(always)]
fn thai_feature(thai: u32) -> usize {
    THAI_FEATURE
        .get(thai as usize)
        .map_or(feature::THAI_RARE, |&f| usize::from(f))
}

/// [`thai_class`] as a feature index, for U+0E00..=U+0E7F.
static THAI_FEATURE: [u8; 0x80] = {
    let mut t = [0u8; 0x80];
    let mut i = 0;
    while i < 0x80 {
        let f = match thai_class_slow(0xE00 + i as u32) {
            Cls::ThaiCommon => feature::THAI_COMMON,
            Cls::Thai => feature::THAI,
            _ => feature::THAI_RARE,
        };
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            t[i] = f as u8;
        }
        i += 1;
    }
    t
};

/// The code point of a three-byte UTF-8 sequence (lead byte 0xE0..=0xEF).
#[inline(always)]
fn cp3(b0: u8, b1: u8, b2: u8) -> u32 {
    (u32::from(b0 & 0x0F) << 12) | (u32::from(b1 & 0x3F) << 6) | u32::from(b2 & 0x3F)
}

/// The character at `j` if it is a valid three-byte sequence for U+1000..=U+D7FF (kana, ideographs,
/// Hangul; the lead bytes without an overlong or surrogate range of their own), else None.
#[inline(always)]
fn plain_cp3(bytes: &[u8], j: usize) -> Option<u32> {
    match *bytes.get(j..)? {
        [b0 @ 0xE1..=0xEC, b1 @ 0x80..=0xBF, b2 @ 0x80..=0xBF, ..]
        | [b0 @ 0xED, b1 @ 0x80..=0x9F, b2 @ 0x80..=0xBF, ..] => Some(cp3(b0, b1, b2)),
        _ => None,
    }
}

/// Rest of a run of kana and ideographs from `j` (the first character is counted); returns the index
/// after the run. `kata`: the first character is katakana.
#[inline(always)]
fn scan_cjk(bytes: &[u8], mut j: usize, kata: bool, f: &mut Counts) -> usize {
    let mut prev_kata = kata;
    let mut kata_runs = u64::from(kata);
    let (mut hiragana, mut katakana) = (0u64, 0u64);
    loop {
        let start = j;
        // Consecutive ideographs (U+4E00..=U+9FFF is E4 B8 80..=E9 BF BF), the bulk of Chinese.
        while let Some(&[b0 @ 0xE4..=0xE9, b1 @ 0x80..=0xBF, b2 @ 0x80..=0xBF, ..]) = bytes.get(j..)
        {
            let h = cp3(b0, b1, b2).wrapping_sub(0x4E00);
            if h >= HAN_COUNT {
                break;
            }
            bump(f, han_feature(h), 1);
            j += 3;
        }
        if j != start {
            prev_kata = false;
        }
        // Consecutive kana (U+3040..=U+30FF is E3 81 80..=E3 83 BF; katakana from U+30A0).
        while let Some(&[0xE3, b1 @ 0x81..=0x83, b2 @ 0x80..=0xBF, ..]) = bytes.get(j..) {
            let kata = cp3(0xE3, b1, b2) >= 0x30A0;
            katakana += u64::from(kata);
            hiragana += u64::from(!kata);
            kata_runs += u64::from(kata && !prev_kata);
            prev_kata = kata;
            j += 3;
        }
        if j != start {
            continue;
        }
        // Anything else by `decode` and `classify`.
        let Some((cp, n)) = decode(bytes, j) else {
            break;
        };
        let c = classify(cp);
        if run_of(c) != Some(Run::Cjk) {
            break;
        }
        bump(f, char_feature(c).unwrap_or(feature::OTHER), 1);
        let kata = c == Cls::Katakana;
        kata_runs += u64::from(kata && !prev_kata);
        prev_kata = kata;
        j += n;
    }
    bump(f, feature::HIRAGANA, hiragana);
    bump(f, feature::KATAKANA, katakana);
    bump(f, feature::KATAKANA_RUNS, kata_runs);
    j
}

/// Rest of a run of Hangul from `j` (the first character is counted); returns the index after it.
#[inline(always)]
fn scan_hangul(bytes: &[u8], mut j: usize, f: &mut Counts) -> usize {
    let mut runs = 0u64;
    loop {
        let (cp, n) = match plain_cp3(bytes, j) {
            Some(cp) => (cp, 3),
            None => {
                // One space and another syllable: that space has no feature of its own (see
                // `count_features`), and the next run is counted here.
                if bytes.get(j) == Some(&b' ') {
                    let h =
                        plain_cp3(bytes, j + 1).map_or(HANGUL_COUNT, |cp| cp.wrapping_sub(0xAC00));
                    if h < HANGUL_COUNT {
                        runs += 1;
                        bump(f, hangul_feature(h), 1);
                        j += 4;
                        continue;
                    }
                }
                match decode(bytes, j) {
                    Some(c) => c,
                    None => break,
                }
            }
        };
        let h = cp.wrapping_sub(0xAC00);
        if h < HANGUL_COUNT {
            bump(f, hangul_feature(h), 1);
        } else {
            let c = classify(cp);
            if run_of(c) != Some(Run::Hangul) {
                break;
            }
            bump(f, char_feature(c).unwrap_or(feature::OTHER), 1);
        }
        j += n;
    }
    bump(f, feature::HANGUL_RUNS, runs);
    j
}

/// Rest of a run of Thai from `j` (the first character is counted); returns the index after it.
#[inline(always)]
fn scan_thai(bytes: &[u8], mut j: usize, f: &mut Counts) -> usize {
    let mut runs = 0u64;
    // U+0E00..=U+0E7F is E0 B8 80..=E0 B9 BF; nothing else is in a Thai run.
    loop {
        while let Some(&[0xE0, b1 @ 0xB8..=0xB9, b2 @ 0x80..=0xBF, ..]) = bytes.get(j..) {
            bump(
                f,
                thai_feature((u32::from(b1 & 1) << 6) | u32::from(b2 & 0x3F)),
                1,
            );
            j += 3;
        }
        // One space and another Thai character: as in `scan_hangul`.
        match bytes.get(j..j + 4) {
            Some(&[b' ', 0xE0, b1 @ 0xB8..=0xB9, b2 @ 0x80..=0xBF]) => {
                runs += 1;
                bump(
                    f,
                    thai_feature((u32::from(b1 & 1) << 6) | u32::from(b2 & 0x3F)),
                    1,
                );
                j += 4;
            }
            _ => break,
        }
    }
    bump(f, feature::THAI_RUNS, runs);
    j
}

/// Letters of an alphabetic run up to which it costs like a word (see [`feature::ALPHA_LONG`]).
const ALPHA_WORD: u64 = 12;

/// Rest of a run of `run` from `j` (the first character is counted), the general case.
#[inline(always)]
fn scan_run(bytes: &[u8], mut j: usize, run: Run, f: &mut Counts) -> usize {
    let mut letters = 1u64;
    // ASCII never belongs to a script run: `decode` stops there.
    while let Some((cp, n)) = decode(bytes, j) {
        let c = classify(cp);
        if run_of(c) != Some(run) {
            break;
        }
        if let Some(idx) = char_feature(c) {
            bump(f, idx, 1);
        }
        letters += 1;
        j += n;
    }
    if run == Run::Alpha {
        bump(f, feature::ALPHA_LONG, letters.saturating_sub(ALPHA_WORD));
    }
    j
}

/// The non-ASCII character starting at byte `i` and its length in bytes; None for ASCII, at the end, and
/// where `bytes` is not UTF-8 there (a continuation byte, a truncated sequence, an overlong encoding, a
/// surrogate or a code point above U+10FFFF: the checks of `std::str::from_utf8`).
#[inline(always)]
fn decode(bytes: &[u8], i: usize) -> Option<(u32, usize)> {
    let cont = |b: u8| u32::from(b & 0x3F);
    match *bytes.get(i..)? {
        [b0 @ 0xC2..=0xDF, b1 @ 0x80..=0xBF, ..] => {
            Some(((u32::from(b0 & 0x1F) << 6) | cont(b1), 2))
        }
        [b0 @ 0xE0..=0xEF, b1 @ 0x80..=0xBF, b2 @ 0x80..=0xBF, ..] => {
            let cp = cp3(b0, b1, b2);
            (cp >= 0x800 && !(0xD800..=0xDFFF).contains(&cp)).then_some((cp, 3))
        }
        [b0 @ 0xF0..=0xF4, b1 @ 0x80..=0xBF, b2 @ 0x80..=0xBF, b3 @ 0x80..=0xBF, ..] => {
            let cp = (u32::from(b0 & 0x07) << 18) | (cont(b1) << 12) | (cont(b2) << 6) | cont(b3);
            (0x1_0000..=0x10_FFFF).contains(&cp).then_some((cp, 4))
        }
        _ => None,
    }
}

/// 2-bit class of entry `i` of a table packed four per byte (see [`HAN_PACKED`]); 0 past the end.
#[inline(always)]
fn packed_class(table: &[u8], i: u32) -> u8 {
    let i = i as usize;
    table.get(i >> 2).map_or(0, |b| (b >> ((i & 3) * 2)) & 3)
}

/// Value of one base64 digit (RFC 4648 alphabet).
const fn base64_digit(c: u8) -> u8 {
    match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    }
}

/// Repacks a table of 2-bit classes stored three per base64 digit into `N` bytes of four each.
/// Evaluated at compile time only (for [`HAN_PACKED`] and [`HANGUL_PACKED`]): an index out of range
/// there fails the build, it cannot panic at run time. Entries past the end of `b64` are 0.
#[allow(clippy::indexing_slicing)]
const fn repack<const N: usize>(b64: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N * 4 {
        if i / 3 < b64.len() {
            let class = (base64_digit(b64[i / 3]) >> (2 * (i % 3))) & 3;
            out[i / 4] |= class << (2 * (i % 4));
        }
        i += 1;
    }
    out
}

const HAN_COUNT: u32 = 0x9FFF - 0x4E00 + 1;
const HANGUL_COUNT: u32 = 0xD7A3 - 0xAC00 + 1;
/// [`HAN_CLASSES`] for U+4E00..=U+9FFF, four classes per byte.
static HAN_PACKED: [u8; (0x9FFF - 0x4E00 + 1) / 4] = repack(HAN_CLASSES);
/// [`HANGUL_CLASSES`] for U+AC00..=U+D7A3, four classes per byte.
static HANGUL_PACKED: [u8; (0xD7A3 - 0xAC00 + 1usize).div_ceil(4)] = repack(HANGUL_CLASSES);

// Per-character classes of CJK ideographs U+4E00..=U+9FFF (HAN_CLASSES) and Hangul syllables
// U+AC00..=U+D7A3 (HANGUL_CLASSES) in the o200k_base vocabulary: 0 = not a token of its own (byte
// fallback), 1 = a token of its own, 2 = a token of its own that also occurs inside multi-character
// tokens. Three classes per base64 digit (value = c0 | c1 << 2 | c2 << 4). Generated by a program
// that encodes every code point with tiktoken-rs and scans the vocabulary for multi-character tokens.
/// Han classes (see above).
const HAN_CLASSES: &[u8] = b"\
KCoqoAoIhoAAaECCiERpkAECKGiABVAiKACAAoIAAABIgooYooAogggkEaCEAACgGgAokAUKKAAgKAhAgAKgIgAAgQECAqCh\
CECAAGgABIAAgAAqBiASCIEAEAAgAAAgAACgAAAAAiQiABAQAgAAACpAQAAAABACIAAAgQAAgAAAAAECYAACARgAACAAAAhE\
AAIAABAAgIAAIAAAAEJAABABAAAAAgAAAAQACAEQAAAAAAAhAQAAAAAAAAAAAgAAAIAAAAAAAAAAAACAAAAAAiYGKiQGBACA\
AgohKkopCqAAoEhCQAAiCIAAAEQkICIABACBCCAAAQgBSAAhCAQoIEAYQAAJAmJCCYAiAIAoiBAEABBCEAAAAAQgUAIIEAAA\
AAEAAAAAACqCAoCAYCABACAQAAAIIgAhQIAAAAAAAAEAIAAAAAKBAAAAAAAAAQKAJCoIgCZmhAgGABIAKKUAAACKECAAIIBg\
AAhAAAAAACIYAYqKIEqAAAoKgKoogKAAAKgGqkAhABJAgKogAEQSQEAAhAAAAIAAQAgAAAIBAmAAAAkAAABAAAAASAAAAAAA\
IAgAIAAAAAACYACBQAAAAAAAAAgAAAAAAAAAgSAAAAAAgABgAAAAAAAJgAAAAAAAAIAEAAAABYAAAAAEAAKAAAAAAABAAAAA\
AAAAABAAAAAAAQAEAAAQAAAAAAAABAAQAAAAAAAAAIAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAggIGAAggUCACK\
AAhgAABIBAIgAIAACCAIgIBgQAUCACKBIABEAAAAAAAgAAIAAAAAAAAAAAAAAAAAABAAgAQAAAIAAAAAAAAKAACAAAAAAAAA\
EAAAAggBAAAAAAAAEEQAQAAAACAAAAAAACAAAAEQEACAAEAAAAAAAQAgAAAAAAAAAAAgQICAAAAACiAiAQCICCBgoCCCCQBA\
AAYhARgoAAAAIAAAAGqCIACgCAAQQQAEAAAAQAAAICAAQAIAKKAEBAAABAAAAAAQIBEAAAAACGAAAAAAIAAAAAAIAAAAAABA\
AACAAAAgAAAAAAAAgAAAAAAAAAAQAAACUAAACAAAAAAAAgAAAAAAAAAAEAAAAAAAAAAAAAAAAAAAAAAACUoBABYIIAAAAIAA\
IiYSCBAQikaqCAEEAFCCkCQIAIAUAAAhAARQAAAEaKGJiFKpIIBIEAgAAAACAEiVqgAYABACAACAEAAQIAAAAgAAAAAAACIA\
EAABEAEABAAAAAAAAAAAAQAAAAQAQAAAAAAAQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\
AAAAAAAAAgCCoKAIoIAQAgKBCIgAgAACAACgoFEECQAAEAAAAgAAAAAAAAAoiIYhAGCEACoiAIEAgCECAAIAAAAAEAAAAAAA\
ABAAAAAYgAgYBACgAgkAAFAAAAABESCAAAAAAAJCAAAIQgAAJAAhBUgCCKQIACAEEAAJgAkgAgAgYAABAAoBCEAQACAAIAAB\
JAAAgABFAgABECBAAAAgAAAAABgIAAAAgAABACAEAAAAAQAAAAAAAJIISAAEAAAAAgAEAgAAAEgAAEAQACAAAAAAAAIAAAIg\
AAAAAAAAAAEAAEIEAAAAAABgAAgAAAAAAAAAAAAAAAAAAAAAAAAAAACAEAAAAAAAAAAAAAAAAAQAAAAgaAiAAAAEgAQIRGEg\
CAAgYgKCBAAQAiYAFACCgKAAgAAQIFQEQoAQAQABAUAAYgACQFSgBCACJIAQAAgkoAICAgAAAAAiIAAQAAAEAAAAAAAAIAAQ\
gAAAgAAgAAAQAYQAgAAQAQCiiAAIAAAAAAABAKCAACABAAACAEAAAAAAAAIAAAgEAAAAFAAAQAAASBAAAAgAAAAAIAAAAIAA\
ABAAAQBAAABABAAGAAQAAAAAQgAAAABAAABAAAAAAAAAAAAAAAAAEAAAAAIAggIoAggABhAQIAAUQAQACYQAAAAgAAAAAiAA\
AIAAIKAAIkABIAEgAAIAAIBWJUAAgABAQABAiAYAAAoAIIAhAAAAhACAABAYAACAAAgAgGQEgAAIABAAEAFAAAAABABABAAA\
AAAAAAAAAoAAAAAAhIgBhJIAKiAAACIhAAgYGSAAgAgoQQAkKAAABiACBgYCAAAkIIAAAIAgQYAAAABAAABAAAQAAAUgBAgA\
AgAAAQkAABAAACEgIAEAAgAAgAAAAqgAQBhABQAAAAAQEAAAAABAAQABAAAAAAABAASAAJAAAAgAAAIAQAAEAAAAAACAAAAA\
AAAAIABAAIAAAAAAAAAAAAAAAAAAAABAAAAAIAABAkAIAAAAAAAACAAAAAAAAAAAAAAQAAAACAAAAAAAAAAAEACAAAAQAQAA\
IBAEAAAAAAAAAAEAAAAAACAAAAAAAQAEAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABAAAAAAkGgAAAEAABI\
AAABCAIAAAApqgAAQFEgAAAAgCAAQAAAAAAAAAACQAABEAAlgoAgAAAAACAAAAAAAAAAAhggAAAgABAAAIgAAQCgIAAAABAg\
JEAAAAAAQgASAUAAgABCAhBAQAAgAgIQIEAFAAACABAJEIAACBAAEQAAACAAABEIAgAEAACAACCCkAIIABAABAAEoABABCAA\
AAgCAAEAEBAAgYAQQQAAAAAAAAAAAIAAEAAQAgAQACAAIEAABAAQAYAAIEIAAIAAAAAAAAAIBAAAAAAAAAAAgFAAAAgAQAAA\
AAAIAAAAAAAAAAEAEAAIAggABAAABAAQgAAAACgAAAAEAAIAAAAAAAAAAAAABEQAAAAAkAAAAAAAAAAAAAAAAgAAAAAgAAAA\
CAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEAASUAEAAEAAABQABAAAAAAAAEAAgGBAAACAAAAAAQ\
AAFAIAAAAAAAAAAAAAAAAgAEAAAAgAQAAAAABAAAEAAABCAAAAAAAAAAQAAAAAAgAAAAAgAAAAAQAAAAAQAAABAAAAAAAAAA\
AACAAAAAAAAAAAAAKglAIAAgCIAAAQIAkAECAACAIAAAAAAAAAAAAAAAAEIAgAAAgAAAAIAgAAgAAAgAAAgACAAAAABAAAoA\
AAAkgAQAAAAAAAAAAAAAAAAAAAAAAEAAAIIhAAAIABAAAgAgSAAQAAAAAQAAAAAABAAAEAAAAACggAAAAAAAAAAAgAAQBAAA\
AAAAAAAAAABAAAAAAAAAAAEAAAAAAAAAAAAAAEAAAAAAAAAAAAAABAEEAAAAQAAAAAAAAAAAhEIYAIAAZiYkAAABAIAAAgAA\
AgAoAEAEAAAAgAAAEAIAAAAAACIEAAQIAgEAAAAAABAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEAAQAAAAAAAAAAAAAAAqK\
AIJAAAAAAAAAAAAEAAAAAAAEiAQKgJIgAFAAgAgACACCAQoAAAAAAGAAAAAAAAQACAAAAAAAABAhAAAAAAAAAAAAAAAAAAAA\
AAAABAAAAAAAAAAAAAAAAAACEgAQAAAQYAAAAAgIAAAAAAAAAIAAAIAAAAAAEAAAAAAAhAAAAAAAAAAFEAAAAAAAAAgAAASA\
EAAAAAAAAAAAAEAAAAAAAAAAAAAAAAAAAAAAAAAAgICAAAAAAABAoAACCQAAAAAAIAAAACAAAAAAACAAAAAgUoAAAhAKAIAg\
AABAAKAAACAAAAIJAAAAAAAAAACiAAAgAABAEAAAAAAAAAAAAECIAhAAAgAAACABAgAAAAAAAAAAAAIAAAACgJACAAIAQQAA\
AAAAAgQAAAAAgAgAAAAAAAAEIBACiAEAAAAAAAAAEAiAAAAAAAIAAgAAAQACAAAABAIBAAAAAAAAAAAIAAAAAAAAAAAAAAAA\
EAAAAAAAAAAAAAACAAAAAAAAAAAgAAIAAAACAABQAAAACAAEAAAAgAAAAAAAUAAAAAAAAAAAACQAGAACAEAJAICQACoAAgAA\
gEAACIAAAAABgAAAkABAAAAAAAAQAACAAAAAEACAAAAAAAAQQAAIAEAACAAAAAAAAEAAAAAAAAAAAAAIAAAAUQAAAAAAAAAA\
AAAAAAAAAAAAAAQAAAAAAECogIEUEVAiAKqAIiIBJYIAAiBCAIAACCAAAAAggIAAAAACAAgAQAAAAAAAIAIIAAAAkACIAAAA\
AQAEgAAAAABACQAAAAAAIQAAAEAEBAAABAAAAAAAAJgiIAgABAEAAAAAAAAQAAAAAAAICAgAiACAAABgQAEAAAEAEEAAgAAA\
IUABABCAQAAQgAgEAABASQAAAAAAQEACQAAAAgAAQAAAAAAAEAgAAAAAAAQAEAAAAAAAAEEAIAGAAAAAAAAABAAAAAAAAAAB\
BAAAAAAAAAAgAACBAKAEAAAQBQAIBCAUAAAICIAAEAAAACAAAAAAAAAAAAEYABCEgAAAAAAAAQAAAAQQIBQAEAAAAQICABAA\
AQBAAgAAAAAgAAAAAAAAAAAAAAAAQEAAAAACAIBAAAAhAAAQAAEAAAAAEABQAAAEAAAQAQBgAAAAAAQAAAAACAAAAAEIAAAA\
AEAABAAAAQAAIEgAAAAAIAAAEAAAABEAICAAAAAAAAAEAAAAAAACAAAAAAAEAAAAAAAAAAAAAgAAAAAAAAAAAAAAAAAAAAAA\
EAAAAAAAAAAAAgAAAAAAAAAAEAAAAAAAAEAAAAAAAAAAgARAAAAAAAAAAAIAAAACAEAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\
AAAAgkABQAEAAAEAAAABIAAAAAAAAAAAAAAAAAAAAAAAABIAAAAgAAAAAAAAAAAAQAAAAAAAAEAAAAAAAAAAAAAAAAAAAAAA\
AAAAAAAEAAAAAAACAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAgAAAgAACEQAQIBCAAAAAAA\
AAAQAAAEAIAAAAIBAAAAAQBCAAEAEQQBAEAAAAAACQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAACAAAAAAiAIACEAgABA\
AAIEAAEAAQgKioAAgAAAAAIEAAAAAAAASAgIQAAACAAAAABCEBAECAAAAAAAIAAEQABAAgIAAAAAAgQCAAgAQAAAgoQEAAAQ\
AAIQAAAIAAAAAAAAAAAAAAAAAAAAAAEBAAAAAAAAAAAAAQAAAAQAAAAIAAQAACAACAAEAAEAAAAKCoAqiAgIgqgIagABIBCC\
ggCAISgghCCiAEEAACAABACABAACABAAAACEAAAAAAACAACAAAACAAAAAEAAAAAAJAQCBAAQBGQAACAAAAAAQAAAgAAAAAgA\
AAAAAAAAAgIqpJIiAooCAQgAAJEASAKIhEAQAIQlAAAAIAKAAAAAAAIAAAAgAAAAABAABgAAAgEAAIAgAhAAAAAAAAEAAAAA\
AAAFAAAAAAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAAAAAIAAAAAAAAAQQAAAAAAgAAAAAAAAQAgAgAAAAAAAAAAQAEAAEAA\
AAABAAAAAAAAgkgkAEAgIAIKEAAiQAEEABRAAUBAUoCBIGAIKIgipBAAgBgAARACaBBGAGhAkAogAAAAYAgQBACgQRBgFCAA\
BRABkAABBAoABAAAEAAAAAIIQACAAAEAAAAAgQAAAAAAAIABAQAAIAAAAAAAAAAAAAAAAAAAAAAAAAACgAAAAAAAAAAAAFAA\
AAABAACAAAAAAAEAAAAAAAAggoKCAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAAAAAAAEAAAIAAAAAAAAAA\
AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAAAAAQgAAAAAAAAAAAAAAAAAAAAAABAAAAAAAAAAAAAAAAAAAAAAAA\
AAQAAAAAAAAAAAAAAAAAAAAAAAAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAACAAAAAAAAgAAAAAAAIEEAAIIAAQAgEAAAAAAAQA\
AAAAIAAIQAiBEAIABAACAQAEAACAAAAAAAEAAAAAAEAAAAAAAAEAAKAAECAgAAAAgAAAAgBAAAAAAAAAAAAACAAASgCECAIA\
EgAAAAAAAAIAAACAgWCQACgKBkgAAAAAgIAGAEAVQQAAQABkCEAQCAAAAAAAAAAICoCAAQABEABUAECAAAKgAIAQAQAAAAAE\
AAAAAACACAAAAAAAgABBgICAIAAAAAAAAAAQAAAAAAAAAAAAAAAAAAAAAAAgAAAAAAACAAIAAAEWoEAABAQAAAAAAQAAAAYA\
AAAAGAQACACAAAAAAgCmQBgIAAACQJgCAAgAAAAAAAAAAAAIAAAQgCAAAAEEAAAAAAAEAIAAAAAAAEAAAAAAAAAAAAAAAAAA\
AAAAUIAAAAAAQIAAAACCAAAABEAAAAAAAQAAAAAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAAAAAAAAAAAAAAAEAAAAAAIgBgAEI\
AAAACQAgQAAACEAABAAAAAAAAAAACIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQAQQAAABgAQAAAAAAAAAAAAAAAAAAAAAAA\
AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAIACAAAAAAAABAAAAAAAAEAA\
AAAAAAAAAAAAEAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\
AAAAAAAAAAAAAAAAAAAAAREAAQAAAAAgAgAAABAAAAAAAAAACAAAABAAAAAAABAgAABAAAAAAGAgCAAIYAgAQAAAAAAAAAAA\
AAAAgAEAAAQAAAAAAAAQAAAAAAQAAAAAQAAAAAAAAAAACAABAAACAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\
";
/// Hangul classes (see above).
const HANGUL_CLASSES: &[u8] = b"\
KIQAAYCCIoAAAAAAAAAAAAAAAAAAAAAAAAAAAIgABAghAAgAAAAAAIAAJIgAAAQCAIAAAAAAAAgBBEAAAhAACIAAAAACAAAA\
AAAAAAQAAAAAAAAACAAAAAAAAoQACAAAEAAABAAAAAAAAAAAAAAAAEAAAAAAAAgACAAAAAAAKIgAAoAAAAAAAAAAAAgABEAA\
BAAACAQAAAAAAEAAAAAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAgAAAAAAAAABAAAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAA\
AAAAAAAAAAAAAAAAAAAAAAAAAAAAAEAAAAQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABAQAAEAAEAAAAAAAAAQA\
AAAACAAACIgAAUgAAIQABAAABAQAAAAAAgAAAAAAAAAAAIAABAgAAAgAAAAAACAAGIAAAEACAAAAAAAAAAgABEAAAQAYAAAA\
AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAIQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAACIgAAAACAAAAAAAA\
AAgBCAAACQAAGIkAAYECAIAAAAAgAAAAAAAAAAAAAAAAAAAAAYgAAAQAAAgAAIAAAAAAAAAAAAAAAAAAAAAAAAgCBIAAAgAA\
AAAAAAAAAEAAAAAACAgACEAAJAAAAAAAAAAAAIAABAAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAAAAAAAAAAGIgAAAECAAAA\
AAAAAAgAAAAAAQAACAAAAAAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAEgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAgAAAAA\
AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABAAAAAEA\
AAAAAAAAAAAAAAAAAAAAKEAAAoACAYgAAAghAAACAAAAAgAAAAAAAAAAAYgABAgCAAoBBAAAABAAKIQAAkgCAIAAAAAAAAgC\
CEAAICAAAAAAAAAAAAAAAAAAAAQAAAAAAAAACAAAAAAAAIAAAAQCAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAgAAEAAAAAACIgA\
AIAAAAAAAAAAAAgCCEAAKhAAKIiAAAEGAYQAAAAAAAAAAAAAAAAAAAAAAAAAAYgABAAAAAgABAAAAAAACIAAAAASAAAAAAAA\
AAgCBEAABBAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAIgACAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAA\
CAAAAAAAAAAAAAAAAAgACIAAAQEAWIoAAEACAYAAAAAAAAAAAAAAAAAAAAAAAAAAAIgACAQCAAQACEAAAAAAEIgAAAABAAAA\
AAAAAAgCCEAAAQAABAAAAAQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAogABAAAAQAAAAAAAAAAAAAAAAAAAAAAAAAAAAgAAAAA\
AAAACAgAAAAAAAAAAAAAAAgABEAAAQEABAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\
AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\
AAAAAAAABEAAAAAAAAAAAAAAAAAAAAAAAAAAKIgAAIACAoAAAAAAIAAAAAAAIAAAAAAAAAAAAogACAABIAgACEAAAAAABIQA\
AAQAAAAAAAAAAAgCBEAAAgAAAAAAAAAAAEAAAAAAAAAAAAAAAAAABAAAAAAAAYgACAQAAAAAAAAAAAAAAAAAAAAAAEAAAAAC\
AAQAAAAAAAAACEgAAkECAAAAAAAAAAgCCIAAKQAIBAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAAAAAAAAAA\
AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\
AAAAAAAAAAAAAAAACEAAAIAAAAAAAAAAAAQBBAAAAAAAKIiAAUgCgYQABAAAAAgCAAAAAgAAAAAAAAAAAogACAQqCAgABEAA\
AAAAKIgAAEgCAIAAAAAAAAgBCIAAIAAABIAAAAgBAEAAAAAAAAgAAAAAAAAAGAAAAAACAogACAgQAAgACIAAAEAACAAAAQAA\
AIQAAAAAAAgCBEAAAgAACIgAAIACAIAAAAAAAAgBCYAAKIAAKEQAAUACAIAAAAAAIAAAAAAAAAAAAAAAAAAAAogABAgCIAgC\
BAAAAAAACAAAAAgAAAAAAAAAAAgCCAAABgAgBAAAAAAAAAAAAAAAAAQAAAAAAAAABAAAAAAAAYgABAAAIAQAAAAAAAAAAAAA\
AAAAAAAAAAAAAAAAAAAAAAAACIQAAEACAAAAAAAAAAgCCIAAJhAAGAAAAAAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\
AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\
AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQBAAAAAAAAGEhAAIAJAkAAAAAAAAAAAAAAAAAAAAAAAAAAAYgA\
BAQQIAgAAAAAAAAABAAAAAQAAAAAAAAAAAgBBAAAAQAAAAAAAAAAAAAAAAAAAAgAAAAAAAAAAAAAAAAAAoQACAQAIAQAAAAA\
AAAAAAAAAAAAAEAAAAAAAAAAAAAAAAAAGAAAAAABAAAAAAAAAAgBCEAABQAACAQAAAAAAEAAAAAAAAAAAAAAAAAAAAAAAAAA\
AEQABAQBAAgAAAAAABAABAAAAAAAAAAAAAAAAAgACEAAAQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAAA\
AAAAAAAAAAAAAAAAAAAAAAAAAAQAAAAAAAAACEgAAIAAAAAAAAAAAAgABEAAAQAAKEQAAAABAoAAAAAAAAAAAAAAAAAAAAAA\
AAAAAIQACAAAAAgBCIAACAAAAAAAAAAAAAAAAAAAAAgBBAAAAgAAAAAAAAAAAAAAAAAAAAQAAAAAAAAAAAAAAAAAAIAAAAAA\
AAAAAAAAAAAAAAAAAAAAAEAAAAAAAAQAAAAAAAAAKIQAAAAAAAAAAAAAAAQBBAAABgAACIQAAAAAAYQAAAAAAAAAAAAAAAAA\
AAAAAAAAAEAAAAAAAAgAAAAAAAAABEAAAAACAEAAAAAAAAgBBEAACAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAACAAAAAAAAEAA\
BAgAEAAAAAAAAAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAACEgAAAAAAAAAAAAAAAgBBIAAARAAKIgAAoACAIAAAAAAKAAAAAAA\
AgAAAAAAAAAAAEQAAAgAAAQAAAAAAAAAFIQAAQACAEAAAAAAAAgBBEAACQAAKIgAAAACAAAAAAAAAAgCAAAAAAAACAAAAAAA\
AIQAAAAAAAAAAAAAAAAAAAAAAAAAAEAAAAAAAAQAAAAAAAAAAAAAAQABAEAAAAAAAAgABAAABAAA\
";

#[cfg(test)]
#[allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing
)]
mod tests {
    use super::*;

    fn limits(_: Option<&str>) -> OutputLimits {
        OutputLimits {
            default_tokens: 1000,
            cap_tokens: 4000,
        }
    }

    fn est(kind: ApiKind, body: &str) -> Result<Estimate, EstimateError> {
        estimate(kind, body.as_bytes(), &limits)
    }

    fn ok(kind: ApiKind, body: &str) -> Estimate {
        match est(kind, body) {
            Ok(e) => e,
            Err(e) => panic!("{body}: {e}"),
        }
    }

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
        assert_eq!(msg.prompt_tokens, base + MESSAGE_OVERHEAD + r);
        let part = ok(
            ApiKind::ChatCompletions,
            &format!(
                r#"{{"messages":[{{"role":"user","content":"hi"}},{{"role":"assistant","content":[{{"type":"refusal","refusal":"{refusal}"}}]}}]}}"#
            ),
        );
        assert_eq!(part.prompt_tokens, base + MESSAGE_OVERHEAD + r);
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
    fn empty_text_is_zero_tokens_and_any_text_at_least_one() {
        assert_eq!(text_tokens(""), 0);
        assert_eq!(text_tokens(" "), 1);
        assert_eq!(text_tokens("a"), 1);
        assert_eq!(text_tokens("\u{0}"), 1);
    }

    fn in_range(text: &str, lo: u64, hi: u64) {
        let t = text_tokens(text);
        assert!((lo..=hi).contains(&t), "{text:?}: {t} not in {lo}..={hi}");
    }

    #[test]
    fn fixed_texts_in_each_script_land_near_o200k_counts() {
        // Reference counts from o200k_base in comments.
        in_range("The quick brown fox jumps over the lazy dog.", 9, 12); // 10
        in_range("fn main() { println!(\"hello\"); }", 8, 13); // 10
        in_range(r#"{"key": [1, 2], "name": "tokengate"}"#, 12, 18); // 15
        in_range("สวัสดีครับ วันนี้อากาศดี", 8, 13); // 10
        in_range("今日は良い天気ですね。", 5, 9); // 7
        in_range("今天天气很好。", 4, 7); // 5
        in_range("오늘 날씨가 좋네요.", 5, 9); // 7
        in_range(
            "Привет, как дела? Сегодня хорошая погода, и мы идём в парк.",
            14,
            24,
        ); // 19
        in_range("Ça coûte très cher, mais c'est délicieux à Genève.", 9, 16); // 12
        in_range("1234567 3.14159", 6, 10); // 8
        in_range("😀🎉👍", 3, 7); // 6
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
            doc(
                serde_json::json!({"type": "document", "source": {"type": "file", "file_id": "f1"}})
            ),
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
    fn adversarial_runs_are_not_estimated_far_below_o200k() {
        // o200k_base counts in comments; the estimate may be a little over, never far under.
        in_range(&"!?.,;:".repeat(500), 1700, 3000); // 2000
        in_range(&"\n".repeat(3000), 160, 282); // 188
        in_range(&" ".repeat(3000), 20, 40); // 24
        in_range(&"\u{200b}".repeat(2000), 425, 750); // 500
        in_range(&"\u{2000}".repeat(1000), 1400, 2400); // 2000
        in_range(&"word\u{2000}".repeat(500), 1200, 1800); // 1500
        in_range(&"\u{a0}".repeat(1000), 100, 250); // 125
        in_range(&"word\u{a0}".repeat(500), 850, 1200); // 1000
        in_range(&"\u{202f}".repeat(1000), 850, 1200); // 1000
        in_range(&"\u{3000}".repeat(1000), 55, 150); // 63
        in_range(
            &"getHttpResponseHandlerFactoryInstance ".repeat(100),
            510,
            900,
        ); // 600
        in_range(&"áéíóúñçàèìòù".repeat(100), 1020, 1800); // 1200
        in_range(&"жзкщфывапролдэюбьтимсчя".repeat(60), 765, 1350); // 901
                                                                    // A repeated punctuation character is one token for many, as in o200k.
        in_range(&"=".repeat(64), 1, 8); // 1
    }

    #[test]
    fn scripts_chars_over_four_misjudge_are_estimated_per_character_class() {
        // chars/4 says 17 for this Thai sentence; o200k says 35 (one of the corpus' worst cases).
        let thai = "เสิร์ฟต้มข่าไก่ร้อน ๆ โรยด้วยผักชีและพริกเผาเล็กน้อยเพื่อเพิ่มสีสัน";
        in_range(thai, 26, 42);
    }

    #[test]
    fn escaped_strings_count_like_their_unescaped_text() {
        // Escaped strings are counted from a scratch buffer, plain ones where they lie in the body:
        // both paths must count the same text.
        let plain = ok(
            ApiKind::ChatCompletions,
            r#"{"messages":[{"role":"user","content":"caf\u00e9 \"quoted\"\nline two"}]}"#,
        );
        let text = "café \"quoted\"\nline two";
        assert_eq!(
            plain.prompt_tokens,
            MESSAGE_OVERHEAD + REPLY_PRIMER + text_tokens(text)
        );
        let raw = serde_json::json!({"messages": [{"role": "user", "content": text}]}).to_string();
        assert_eq!(
            ok(ApiKind::ChatCompletions, &raw).prompt_tokens,
            plain.prompt_tokens
        );
        // Escaped and plain model names and document data (kept, then counted) agree too.
        let e = ok(ApiKind::ChatCompletions, r#"{"model":"gpt\u002d4.1"}"#);
        assert_eq!(e.model.as_deref(), Some("gpt-4.1"));
        let doc = |data: &str| {
            ok(
                ApiKind::AnthropicMessages,
                &format!(
                    r#"{{"messages":[{{"role":"user","content":[{{"type":"document","source":{{"data":"{data}","type":"text"}}}}]}}]}}"#
                ),
            )
            .prompt_tokens
        };
        assert_eq!(doc("a/b c"), doc("a\\/b\\u0020c"));
        assert_eq!(
            doc("a/b c"),
            MESSAGE_OVERHEAD + REPLY_PRIMER + text_tokens("a/b c")
        );
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
            MESSAGE_OVERHEAD + REPLY_PRIMER
        );
    }

    #[test]
    fn huge_strings_in_every_script_are_counted_in_one_pass() {
        for unit in [
            "word ",
            "Hello, World! ",
            "今天天气很好。",
            "오늘 날씨가 좋네요. ",
            "สวัสดีครับ ",
        ] {
            let big = unit.repeat((1 << 20) / unit.len());
            let one = text_tokens(unit);
            let n = u64::try_from((1 << 20) / unit.len()).unwrap();
            let t = text_tokens(&big);
            // Pieces merge across repetitions (o200k does too), so only the order of magnitude is fixed.
            assert!(
                t >= n / 2 && t <= n * one * 2,
                "{unit:?}: {t} for {n} × {one}"
            );
            let body =
                serde_json::json!({"messages": [{"role": "user", "content": big}]}).to_string();
            assert_eq!(
                ok(ApiKind::ChatCompletions, &body).prompt_tokens,
                t + MESSAGE_OVERHEAD + REPLY_PRIMER
            );
        }
    }

    #[test]
    fn eight_byte_word_scanning_matches_a_byte_by_byte_scan() {
        let text = "a ab abc abcd abcdefgh abcdefghi abcdefghijklmnopq abcdefghijklmnopqrstuvwxyzabcdefg z{ y` x| w@";
        for start in 0..text.len() {
            let bytes = text.as_bytes();
            let slow = bytes[start..]
                .iter()
                .take_while(|b| b.is_ascii_lowercase())
                .count();
            assert_eq!(lower_run(bytes, start), slow, "at {start}");
        }
        for b in 0..=255u8 {
            let w = u64::from_le_bytes([b'a', b, b'z', b, b, b'q', 0x80, b]);
            let expect = [b'a', b, b'z', b, b, b'q', 0x80, b]
                .iter()
                .enumerate()
                .fold(0u64, |m, (k, &x)| {
                    if x.is_ascii_lowercase() {
                        m
                    } else {
                        m | 0x80 << (8 * k)
                    }
                });
            assert_eq!(not_lower_mask(w), expect, "byte {b:#x}");
        }
        // Words split by the fast path and by the general scan count the same.
        assert_eq!(
            text_features("abcdefghijkl café naïve résumé x"),
            text_features("abcdefghijkl café naïve résumé x")
        );
        in_range("abcdefghijklmnopqrstuvwxyz", 2, 6);
        in_range("façade", 1, 3);
    }

    #[test]
    fn packed_class_tables_match_their_base64_source() {
        // The previous decoder, applied to the base64 text directly.
        fn base64_class(table: &[u8], i: usize) -> u8 {
            let digit = base64_digit(table.get(i / 3).copied().unwrap_or(b'A'));
            (digit >> (2 * (i % 3))) & 3
        }
        for i in 0..HAN_COUNT {
            assert_eq!(
                packed_class(&HAN_PACKED, i),
                base64_class(HAN_CLASSES, i as usize),
                "han {i}"
            );
        }
        for i in 0..HANGUL_COUNT {
            assert_eq!(
                packed_class(&HANGUL_PACKED, i),
                base64_class(HANGUL_CLASSES, i as usize),
                "hangul {i}"
            );
        }
        for c in 0xE00..0xE80 {
            assert!(thai_class(c) == thai_class_slow(c));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A cheap deterministic fuzz: random bytes (valid or not) through every entry point.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for len in 0..400usize {
            let mut buf = Vec::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf.push((x >> 24) as u8);
            }
            for kind in [
                ApiKind::ChatCompletions,
                ApiKind::Completions,
                ApiKind::Embeddings,
                ApiKind::Responses,
                ApiKind::AnthropicMessages,
            ] {
                let _ = estimate(kind, &buf, &limits);
            }
            let s = String::from_utf8_lossy(&buf);
            let _ = text_tokens(&s);
        }
        for cp in (0u32..0x11_0000).step_by(7) {
            if let Some(c) = char::from_u32(cp) {
                let _ = text_tokens(&c.to_string());
            }
        }
    }

    /// A deterministic xorshift stream for the generated cases below.
    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    #[test]
    fn raw_strings_are_checked_like_std_str_from_utf8_and_counted_like_text() {
        let mut cases: Vec<Vec<u8>> = [
            &b""[..],
            b"plain ascii",
            "caf\u{e9} 中文 한국어 ภาษา カタカナ 😀 \u{2028}\u{ff10}".as_bytes(),
            b"\x80",
            b"a\xbf",
            b"\xc0\xaf",
            b"\xc1\xbf",
            b"\xc2",
            b"\xc2\x7f",
            b"\xe0\x80\x80",
            b"\xe0\x9f\xbf",
            b"\xe0\xa0\x80",
            b"\xe4\xb8",
            b"\xe4\xb8\x41",
            b"\xed\x9f\xbf",
            b"\xed\xa0\x80",
            b"\xed\xbf\xbf",
            b"\xee\x80\x80",
            b"\xef\xbc",
            b"\xf0\x8f\xbf\xbf",
            b"\xf0\x90\x80\x80",
            b"\xf4\x8f\xbf\xbf",
            b"\xf4\x90\x80\x80",
            b"\xf5\x80\x80\x80",
            b"\xff",
            b"\xea\xb0\x80 \xea\xb0",
            b"\xe0\xb8\x81 \xe0\xb8",
        ]
        .iter()
        .map(|c| c.to_vec())
        .collect();
        // Valid text with one byte changed, dropped or cut off, in every script the scanner has a
        // loop for.
        let text =
            "Hello, 世界です。カタカナ 한국어 텍스트 ภาษาไทย café Ωμέγα 😀 12 \u{3000}x".as_bytes();
        for i in 0..text.len() {
            for b in [0x80, 0xbf, 0xc3, 0xe4, 0xed, 0xf0, 0xff, b' '] {
                let mut v = text.to_vec();
                v[i] = b;
                cases.push(v);
            }
            let mut v = text.to_vec();
            v.remove(i);
            cases.push(v);
            cases.push(text[..i].to_vec());
        }
        let mut x = 0x2545_F491_4F6C_DD1D;
        for len in 0..200 {
            cases.push((0..len).map(|_| (xorshift(&mut x) >> 24) as u8).collect());
        }
        for bytes in &cases {
            match std::str::from_utf8(bytes) {
                Ok(s) => assert_eq!(utf8_tokens(bytes), Some(text_tokens(s)), "{bytes:x?}"),
                Err(_) => assert_eq!(utf8_tokens(bytes), None, "{bytes:x?}"),
            }
        }
    }

    #[test]
    fn fast_and_reference_walks_give_the_same_estimate() {
        // Every string the fast walk reads raw, with escapes, scripts, invalid UTF-8, surrogates, control
        // characters and unexpected types; the same body through both walks.
        let texts = [
            "plain",
            "caf\\u00e9 \\\"quoted\\\"\\nline two \\/ \\\\",
            "中文，日本語です。카타카나 한국어 ภาษาไทย",
            "\\ud83d\\ude00 emoji pair",
            "\\ud800 lone",
            "\\udc00 lone",
            "\\ud800\\u0041",
            "tab\\there",
            "",
        ];
        let raw_bytes: [&[u8]; 5] = [b"\xff", b"\xe4\xb8", b"\xed\xa0\x80", b"\xc0\xaf", b"\x01"];
        let templates = [
            (
                ApiKind::ChatCompletions,
                r#"{"model":"m","messages":[{"role":"user","content":"@","name":"@","tool_call_id":"@"},{"role":"user","content":[{"type":"text","text":"@"},{"type":"image_url"}]}],"max_tokens":7}"#,
            ),
            (
                ApiKind::AnthropicMessages,
                r#"{"system":"@","messages":[{"role":"user","content":[{"type":"tool_result","content":"@"},{"type":"thinking","thinking":"@"},{"type":"tool_use","name":"@","input":{"q":"@"}}]}]}"#,
            ),
            (
                ApiKind::Responses,
                r#"{"input":[{"role":"user","content":"@"},{"type":"function_call_output","output":"@"},{"type":"x","text":"@"}],"instructions":"@"}"#,
            ),
            (ApiKind::Responses, r#"{"input":"@","user":"@"}"#),
            (
                ApiKind::Completions,
                r#"{"prompt":["@",[1,2]],"suffix":"@"}"#,
            ),
            (ApiKind::Embeddings, r#"{"input":"@"}"#),
        ];
        let odd_values = ["null", "5", "true", "{}", "[]", "[\"x\"]", "1e400", "[1,]"];
        let mut bodies: Vec<(ApiKind, Vec<u8>)> = Vec::new();
        let mut x = 0x9E37_79B9_7F4A_7C15;
        for (kind, template) in templates {
            for round in 0..200 {
                let mut body = Vec::new();
                for (hole, piece) in template.split("\"@\"").enumerate() {
                    if hole > 0 {
                        let r = xorshift(&mut x);
                        if round % 5 == 4 && r.is_multiple_of(7) {
                            // A value of another type where a string is counted.
                            body.extend_from_slice(odd_values[(r >> 8) as usize % 8].as_bytes());
                        } else {
                            body.push(b'"');
                            body.extend_from_slice(
                                texts[(r >> 16) as usize % texts.len()].as_bytes(),
                            );
                            if r.is_multiple_of(11) {
                                body.extend_from_slice(raw_bytes[(r >> 24) as usize % 5]);
                            }
                            body.push(b'"');
                        }
                    }
                    body.extend_from_slice(piece.as_bytes());
                }
                bodies.push((kind, body));
            }
        }
        let mut accepted = 0;
        for (kind, body) in &bodies {
            accepted += usize::from(walk_fast(body, *kind, &mut Fields::new()).is_ok());
            assert_eq!(
                estimate_by(*kind, body, &limits, true),
                estimate_by(*kind, body, &limits, false),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        // The fast walk reads most bodies itself.
        assert!(
            accepted > bodies.len() / 5,
            "{accepted} of {}",
            bodies.len()
        );
    }

    /// The texts of every `corpus/*.jsonl` line (files in name order).
    fn corpus_texts() -> Vec<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .collect();
        paths.sort();
        let mut texts = Vec::new();
        for p in paths {
            let body = std::fs::read_to_string(&p).unwrap();
            for line in body.lines().filter(|l| !l.trim().is_empty()) {
                let v: Value = serde_json::from_str(line).unwrap();
                texts.push(v["text"].as_str().unwrap().to_string());
            }
        }
        texts
    }

    /// `count_features` with ASCII windows and without: the same counts and the same verdict on UTF-8.
    fn windows_count_like_bytes(bytes: &[u8]) {
        let (mut with, mut without) = ([0u64; 64], [0u64; 64]);
        let ok = count_features::<true>(bytes, &mut with, true);
        assert_eq!(
            ok,
            count_features::<false>(bytes, &mut without, false),
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
        if ok {
            assert_eq!(with, without, "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn ascii_windows_count_like_the_byte_wise_loop() {
        // Every class of ASCII byte, and what the byte-wise loop looks at next to ASCII (Latin letters
        // that go on with a word, fullwidth digits and Unicode line breaks after spaces, other
        // scripts), in random texts of every length around the window's, then the corpus.
        let pieces = [
            "a",
            "z",
            "Q",
            "abc",
            "the",
            "camelCase",
            "HTTPServer",
            "ALLCAPS",
            "I",
            "x1",
            "ab12cd",
            "abcdefghij",
            "internationalization",
            "INTERNATIONALIZATION",
            "0",
            "7",
            "123",
            "123456",
            " ",
            " ",
            " ",
            "  ",
            "    ",
            "\t",
            " \t",
            "\n",
            "\r\n",
            "\n    ",
            " \n",
            ".",
            ",",
            ";",
            "\"",
            "\\",
            "()",
            "{}",
            "==",
            "->",
            "_",
            "/*",
            "\u{0}",
            "\u{7}",
            "\u{b}",
            "\u{c}",
            "\u{1b}",
            "\u{7f}",
            "é",
            "café",
            "ÉCOLE",
            "naïve",
            "１",
            "Ａ",
            "\u{85}",
            "\u{a0}",
            "\u{2028}",
            "\u{3000}",
            "中文",
            "カタカナ",
            "한국",
            "ภาษา",
            "😀",
            "—",
            "“",
            "Ж",
            "!?.,;:",
            "!!!!!",
            "})));",
            "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
            "\n\n\n\n\n\n\n\n",
            "Q2hlY2sgdGhp+/",
            "9k",
            "Lm",
            "getHttpResponse",
            "\u{200b}",
        ];
        let mut x = 0x2545_F491_4F6C_DD1D;
        for round in 0..30_000 {
            let n = (xorshift(&mut x) % 48) as usize + round % 3;
            let mut text = String::new();
            for _ in 0..n {
                text.push_str(pieces[(xorshift(&mut x) >> 20) as usize % pieces.len()]);
            }
            windows_count_like_bytes(text.as_bytes());
            // Invalid UTF-8 in the middle too.
            if round % 16 == 0 && !text.is_empty() {
                let mut bytes = text.into_bytes();
                let at = (xorshift(&mut x) as usize) % bytes.len();
                bytes.insert(at, 0xff);
                windows_count_like_bytes(&bytes);
            }
        }
        let texts = corpus_texts();
        let all = texts.join("\n\n");
        for t in texts.iter().chain([&all]) {
            windows_count_like_bytes(t.as_bytes());
        }
    }

    #[test]
    fn the_fast_walk_reads_corpus_bodies_itself_and_agrees_with_the_reference_walk() {
        // Plain and escaped texts of every script, short and long, in the shapes of every API; the
        // scanner accepts them all (no fallback) and gives the reference walk's estimate.
        let texts = corpus_texts();
        let mut contents: Vec<String> = texts.clone();
        for size in [1 << 10, 16 << 10] {
            for start in [0, 100, 200, 300] {
                let mut s = String::new();
                for t in texts.iter().cycle().skip(start) {
                    if s.len() >= size {
                        break;
                    }
                    s.push_str(t);
                    s.push_str("\n\n");
                }
                contents.push(s);
            }
        }
        for c in &contents {
            let bodies = [
                (
                    ApiKind::ChatCompletions,
                    serde_json::json!({"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": c, "name": "x"}], "max_tokens": 9, "stream": true}),
                ),
                (
                    ApiKind::AnthropicMessages,
                    serde_json::json!({"system": c, "messages": [{"role": "user", "content": [{"type": "text", "text": c}, {"type": "tool_result", "content": c}]}], "max_tokens": 9}),
                ),
                (
                    ApiKind::Responses,
                    serde_json::json!({"input": [{"role": "user", "content": c}], "instructions": "x", "tools": [{"type": "function", "name": "f", "parameters": {"a": [1, 2.5, null]}}]}),
                ),
                (
                    ApiKind::Completions,
                    serde_json::json!({"prompt": [c, "x"], "n": 2}),
                ),
                (ApiKind::Embeddings, serde_json::json!({"input": c})),
            ];
            for (kind, v) in bodies {
                for body in [v.to_string(), serde_json::to_string_pretty(&v).unwrap()] {
                    let body = body.as_bytes();
                    assert!(
                        walk_fast(body, kind, &mut Fields::new()).is_ok(),
                        "{}",
                        String::from_utf8_lossy(body)
                    );
                    assert_eq!(
                        estimate_by(kind, body, &limits, true),
                        estimate_by(kind, body, &limits, false)
                    );
                }
            }
        }
    }

    #[test]
    fn the_fast_walk_agrees_with_the_reference_walk_on_edge_cases() {
        // Numbers, nesting around serde_json's limit, escapes, whitespace, keys and syntax errors:
        // where the scanner is unsure it gives up, and the reference walk answers.
        let nested = |depth: usize, inner: &str| {
            format!(
                r#"{{"metadata":{}{inner}{}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        let mut bodies: Vec<String> = [
            "0",
            "-0",
            "7",
            "-7",
            "1.0",
            "1e2",
            "1E+2",
            "1e-2",
            "2.5E308",
            "1e400",
            "-1e400",
            "1e-400",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999999",
            "-9223372036854775808",
            "-9223372036854775809",
            "01",
            "-01",
            "1.",
            ".5",
            "-",
            "1e",
            "+1",
            "1_0",
            "0x10",
            "00",
            "1.2.3",
            "true",
            "false",
            "null",
            "\"7\"",
            "[]",
            "{}",
        ]
        .iter()
        .flat_map(|n| {
            [
                format!(r#"{{"max_tokens":{n},"messages":[{{"content":"hi"}}]}}"#),
                format!(r#"{{"temperature":{n}}}"#),
                format!(r#"{{"tools":[{{"a":{n}}}],"n":{n}}}"#),
                format!(r#"{{"prompt":[[1,{n}],{n}]}}"#),
            ]
        })
        .collect();
        for depth in [1, 60, 120, 125, 126, 127, 128, 129, 200] {
            bodies.push(nested(depth, "1"));
            bodies.push(nested(depth, r#""x""#));
            bodies.push(format!(
                r#"{{"messages":[{{"content":[{}{{"type":"text","text":"deep"}}{}]}}]}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            ));
        }
        for s in [
            r"\ud83d\ude00",
            r"\uD83D\uDE00",
            r"\ud800",
            r"\udc00",
            r"\ud800\u0041",
            r"\udbff\udfff",
            r"\u0000",
            r"\u001f",
            r"\u0022",
            r"\u005c",
            r"\u002F",
            r"\x",
            r"\u12",
            r"\u12g4",
            r"\",
            r"a\\",
            r#"\""#,
            r"\/\b\f\n\r\t",
            "\u{1}",
            "\t",
            "\u{7f}",
            "é",
            "\u{ff}",
        ] {
            for field in ["content", "name", "role"] {
                bodies.push(format!(r#"{{"messages":[{{"{field}":"a{s}b"}}]}}"#));
                bodies.push(format!(
                    r#"{{"messages":[{{"{field}":"{}{s}{}"}}]}}"#,
                    "x".repeat(70),
                    "y \\n".repeat(30)
                ));
            }
        }
        bodies.extend(
            [
                " {\"model\" : \"m\" , \"messages\" :\n[ ]\t}\r\n",
                "{\"model\":\"a\",\"model\":\"b\"}",
                "{\"\\u006dodel\":\"m\"}",
                "{\"mod\\u00e9l\":\"m\",\"模型\":1}",
                "{\"messages\":[1,]}",
                "{\"messages\":[,1]}",
                "{\"a\":1,}",
                "{,\"a\":1}",
                "{\"a\" 1}",
                "{\"a\":1 \"b\":2}",
                "{\"a\":1}}",
                "{\"a\":1} x",
                "{\"a\":nul}",
                "{\"a\":tru}",
                "{\"a\":[}",
                "[1,2]",
                "\"x\"",
                "",
                "   ",
                "\u{feff}{}",
                "{'a':1}",
            ]
            .map(String::from),
        );
        for kind in [
            ApiKind::ChatCompletions,
            ApiKind::Completions,
            ApiKind::Embeddings,
            ApiKind::Responses,
            ApiKind::AnthropicMessages,
        ] {
            for body in &bodies {
                assert_eq!(
                    estimate_by(kind, body.as_bytes(), &limits, true),
                    estimate_by(kind, body.as_bytes(), &limits, false),
                    "{kind:?} {body}"
                );
            }
        }
        // The scanner itself accepts plain numbers, nesting up to serde_json's limit (127 levels)
        // and valid escapes, and gives up where serde_json would fail.
        let accepts = |body: &str| {
            walk_fast(
                body.as_bytes(),
                ApiKind::ChatCompletions,
                &mut Fields::new(),
            )
            .is_ok()
        };
        assert!(accepts(&nested(126, "1")));
        assert!(!accepts(&nested(127, "1")));
        assert!(accepts(
            r#"{"max_tokens":12,"temperature":-0.5,"messages":[{"content":"\ud83d\ude00\n"}]}"#
        ));
        assert!(!accepts(r#"{"messages":[{"content":"\ud800"}]}"#));
        assert!(!accepts(r#"{"temperature":1e400}"#));
    }

    #[test]
    fn counts_are_pinned_to_the_calibrated_model() {
        // FNV-1a over `text_tokens` and `text_features` of every corpus line (files in name order)
        // and `text_tokens` of every 7th code point alone and as " cc": the values the estimator gave
        // when its weights were fitted. A faster implementation must keep them; a refit of the
        // weights changes them on purpose (then update the constant, with the bench's accuracy table).
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |v: u64| {
            for b in v.to_le_bytes() {
                hash ^= u64::from(b);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .collect();
        paths.sort();
        let mut lines = 0;
        for p in paths {
            let body = std::fs::read_to_string(&p).unwrap();
            for line in body.lines().filter(|l| !l.trim().is_empty()) {
                let v: Value = serde_json::from_str(line).unwrap();
                let t = v["text"].as_str().unwrap();
                eat(text_tokens(t));
                for n in text_features(t) {
                    eat(n);
                }
                lines += 1;
            }
        }
        let mut s = String::new();
        for cp in (0u32..0x11_0000).step_by(7) {
            if let Some(c) = char::from_u32(cp) {
                s.clear();
                s.push(c);
                eat(text_tokens(&s));
                s.push(' ');
                s.push(c);
                s.push(c);
                eat(text_tokens(&s));
            }
        }
        assert_eq!((lines, hash), (768, 0xeb58_f908_c8b7_e600));
    }
}
