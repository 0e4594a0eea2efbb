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
//! | `/responses`           | `input` (string or items), `instructions`, `tools`, `text.format`, `prompt` (a template, as JSON text) | `max_output_tokens` |
//! | `/messages` (Anthropic)| `system`, `messages[].content` blocks (text, tool_use, tool_result), `tools` | `max_tokens` |
//!
//! The reserved output is what the body asks for (the largest present of `max_tokens`,
//! `max_completion_tokens`, `max_output_tokens`: err towards charging) or the per-model default from
//! [`OutputLimits`], clamped to the per-model cap, times `n` (legacy completions: the larger of `n`
//! and `best_of`, which the provider generates and bills), capped at [`MAX_N`] = 128.
//!
//! Parts that are not text have fixed or size-based costs: images [`IMAGE_TOKENS`] ([`IMAGE_LOW_TOKENS`]
//! with `detail: "low"`), audio
//! (`input_audio`) by the size of its base64 data ([`AUDIO_TOKENS_PER_KB`],
//! [`AUDIO_WAV_TOKENS_PER_KB`]), files by the size of `file_data` ([`FILE_TOKENS_PER_KB`]) or a
//! fixed [`FILE_ID_TOKENS`] for a `file_id`.
//!
//! The body is read by a strict JSON scanner of this module's own (see `json.rs`: escapes close
//! together, as in code and JSON, are found by 64-byte bit masks rather than one after the other).
//! The text of every script is counted in one pass that also checks its UTF-8 (see [`estimate`]),
//! with a tight loop per script for runs of ideographs, kana, Hangul, Thai and the alphabetic scripts
//! (Cyrillic, Greek, Hebrew, Arabic, Indic), a fast path for prose words (with or without accents)
//! and the single spaces between them, and other ASCII (code, JSON) a 64-byte window at a time from
//! bit masks, without a branch per piece (see `ascii.rs`). Measured speed and accuracy are in
//! `docs/estimator.md` (`cargo bench --bench estimate` prints both).
//!
//! Text is measured by [`text_tokens`], a single pass over the characters that mimics the pre-tokenizer
//! of OpenAI's `o200k_base`: ASCII letter words are costed by length, digits in groups of three,
//! punctuation and whitespace runs separately, and every other script (Thai, kana, CJK ideographs,
//! Hangul, Cyrillic, …) by a per-character rate plus a per-run rate, tabs, half-width kana and one
//! per text. The rates in [`WEIGHTS`] are fitted against `o200k_base` on the `corpus/` texts by
//! `examples/fit-estimator.rs` (`chars / 4` is 2–4× wrong for Thai and CJK).
//!
//! Framing follows the providers' published counting (see `docs/estimator.md`): OpenAI chat 3 per
//! message plus its role token, 1 per `name`, 3 for the reply primer, tools by OpenAI's method
//! (`tools.rs`); Anthropic tools add the tool-use system prompt. Content parts of a type the walk does
//! not know are estimated from their JSON size ([`SIZE_BYTES_PER_TOKEN`]).
//!
//! Example: `{"model":"gpt-4.1","messages":[{"role":"user","content":"Hello!"}],"max_tokens":64}`
//! estimates to about 9 prompt tokens (3 per message, 1 for the role, 3 for the reply primer, 2 for
//! the text) plus 64 output tokens.
//!
//! Layout: this file holds the public API and the driver ([`estimate`]); the body walk is `top.rs`
//! (the top-level object per API family), `chat.rs` (OpenAI chat messages, tool calls, predictions),
//! `tools.rs` (tool definitions by the providers' methods), `completions.rs` (prompt / embeddings
//! input), `responses.rs` (Responses input items), `anthropic.rs` (Anthropic messages and document
//! sources), `parts.rs` (content parts of every family), on the visitors of `shape.rs`, read by
//! `json.rs` (the fast scanner) or serde_json; `output.rs` is the output reservation. Text is counted
//! by `text.rs` (the pass over the characters), `latin.rs` (words of Latin letters, accented or
//! not), `ascii.rs` (ASCII 64 bytes at a time), `scripts.rs`
//! (runs of non-ASCII scripts), `classes.rs` and `tables.rs` (character classes), `words.rs` and
//! `words_table.rs` (the word tables: known words, rare letter pairs, short words), `pairs_table.rs`
//! (the Thai, hiragana and katakana pair tables of `scripts.rs`), `whole.rs` (features
//! of the whole text, read after the pass), and weighed by `weights.rs` with the weights of
//! `fitted.rs`. `exact.rs` (cargo feature `exact`) counts o200k_base tokens exactly: measured against
//! the estimator, not offered (see `docs/estimator.md`).
//!
//! Nothing here panics: malformed bodies become an [`EstimateError`], all arithmetic saturates, and the
//! walk over nested JSON is bounded ([`MAX_DEPTH`]) on top of the JSON readers' recursion limit (128,
//! serde_json's, which the fast walk's scanner keeps too).

use serde::de::DeserializeSeed;
use std::fmt;

mod anthropic;
mod ascii;
mod bedrock;
mod bytes;
mod chat;
mod classes;
mod completions;
mod escapes;
#[cfg(feature = "exact")]
pub mod exact;
mod fitted;
mod gemini;
mod json;
mod latin;
mod output;
mod pairs_table;
mod parts;
mod responses;
mod route;
mod scripts;
mod shape;
mod tables;
mod text;
mod tools;
mod top;
mod weights;
mod whole;
mod words;
mod words_table;

use output::{choices, requested_output};
use shape::Seed;
use top::{Fields, Top};

pub use gemini::VIDEO_TOKENS_PER_KB;
pub use route::{route, PathModel, Route, MAX_PATH_MODEL_LEN};
pub use shape::SIZE_BYTES_PER_TOKEN;
pub use text::{text_features, text_tokens};
pub use tools::{
    ANTHROPIC_TOOL_SYSTEM_TOKENS, ENUM_INIT, ENUM_ITEM, FUNCTIONS_END, FUNCTION_INIT,
    PROPERTIES_INIT, PROPERTY_KEY,
};
pub use weights::{feature, FEATURE_NAMES, NUM_FEATURES, WEIGHTS};
pub use words::{
    greek_slot, greek_step, short_slot, word_hash, word_slots, GREEK_BACK, GREEK_BARE,
    GREEK_SPACED, MAX_WORD, MIN_ASCII, SHORT_BITS_LOG, WORD_TABLE,
};

/// Cost of one image input (`image_url`, `input_image`, Anthropic `image` block) that is not marked
/// `detail: "low"`: the most an image costs on Anthropic (~1.15 megapixels / 750) and above OpenAI's
/// tile price of any high-detail image (85 + 170 × 8 tiles = 1,445). Its size is not read: the
/// provider's usage settles it.
pub const IMAGE_TOKENS: u64 = 1600;
/// An OpenAI image with `detail: "low"`: its fixed price.
pub const IMAGE_LOW_TOKENS: u64 = 85;
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
    /// Anthropic `POST /v1/messages` (also Claude on Vertex AI's `:rawPredict` / `:streamRawPredict`,
    /// see [`route`]).
    AnthropicMessages,
    /// Gemini API / Vertex AI `POST …/models/{model}:generateContent`.
    GeminiGenerate,
    /// Gemini API / Vertex AI `POST …/models/{model}:streamGenerateContent` (SSE with `alt=sse`,
    /// else a streamed JSON array).
    GeminiStream,
    /// Bedrock `POST /model/{modelId}/converse`.
    BedrockConverse,
    /// Bedrock `POST /model/{modelId}/converse-stream` (AWS event stream).
    BedrockConverseStream,
    /// Bedrock `POST /model/{modelId}/invoke` (the model's own body).
    BedrockInvoke,
    /// Bedrock `POST /model/{modelId}/invoke-with-response-stream` (AWS event stream of the model's own
    /// events).
    BedrockInvokeStream,
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
            ApiKind::GeminiGenerate => "gemini_generate",
            ApiKind::GeminiStream => "gemini_stream",
            ApiKind::BedrockConverse => "bedrock_converse",
            ApiKind::BedrockConverseStream => "bedrock_converse_stream",
            ApiKind::BedrockInvoke => "bedrock_invoke",
            ApiKind::BedrockInvokeStream => "bedrock_invoke_stream",
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
    /// Responses `background == true`: the provider generates after its answer (which carries no
    /// usage), so the answer cannot settle it.
    pub background: bool,
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
/// are counted raw, checking their UTF-8 in the pass that counts them (see `top.rs`): on CJK, Thai
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

/// [`estimate`] of a request whose path names its model ([`route`]: Gemini, Vertex AI, Bedrock, an
/// Azure deployment once mapped to its model): `path_model`, when given, is the estimate's `model`
/// and the one `limits` is asked about, whatever the body's `model` says (the provider serves the
/// path's). Gemini bodies are read by `gemini.rs`, Bedrock's by `bedrock.rs` (an `invoke` body by its
/// shape: Anthropic Messages, Nova's Converse-like body, or any other by its size); every other kind
/// as [`estimate`] reads it.
pub fn estimate_with_model(
    kind: ApiKind,
    body: &[u8],
    path_model: Option<&str>,
    limits: &dyn Fn(Option<&str>) -> OutputLimits,
) -> Result<Estimate, EstimateError> {
    estimate_model_by(kind, body, path_model, limits, true)
}

/// [`estimate_with_model`], with the fast walk tried first if `fast`.
fn estimate_model_by(
    kind: ApiKind,
    body: &[u8],
    path_model: Option<&str>,
    limits: &dyn Fn(Option<&str>) -> OutputLimits,
    fast: bool,
) -> Result<Estimate, EstimateError> {
    let limits = |m: Option<&str>| limits(path_model.or(m));
    let mut e = match kind {
        ApiKind::GeminiGenerate | ApiKind::GeminiStream => {
            gemini_estimate(kind, body, &limits, fast)?
        }
        ApiKind::BedrockConverse | ApiKind::BedrockConverseStream => {
            converse_estimate(kind, body, &limits, fast)?
        }
        ApiKind::BedrockInvoke | ApiKind::BedrockInvokeStream => {
            let text =
                std::str::from_utf8(body).map_err(|e| EstimateError::NotJson(e.to_string()))?;
            let v: serde_json::Value =
                serde_json::from_str(text).map_err(|e| EstimateError::NotJson(e.to_string()))?;
            if !v.is_object() {
                return Err(EstimateError::NotObject);
            }
            match bedrock::invoke_shape(&v, path_model) {
                bedrock::InvokeShape::Anthropic => Estimate {
                    kind,
                    stream: kind == ApiKind::BedrockInvokeStream,
                    include_usage: false,
                    ..estimate_by(ApiKind::AnthropicMessages, body, &limits, fast)?
                },
                bedrock::InvokeShape::Converse => converse_estimate(kind, body, &limits, fast)?,
                bedrock::InvokeShape::Size => {
                    let (prompt_tokens, requested) = bedrock::by_size(&v);
                    let requested_output = requested?;
                    let model = v.get("model").and_then(|m| m.as_str()).map(str::to_string);
                    let lim = limits(model.as_deref());
                    Estimate {
                        kind,
                        model,
                        prompt_tokens,
                        output_tokens: requested_output
                            .unwrap_or(lim.default_tokens)
                            .min(lim.cap_tokens),
                        requested_output,
                        output_choices: 1,
                        stream: kind == ApiKind::BedrockInvokeStream,
                        include_usage: false,
                        background: false,
                    }
                }
            }
        }
        _ => estimate_by(kind, body, &limits, fast)?,
    };
    if let Some(m) = path_model {
        e.model = Some(m.to_string());
    }
    Ok(e)
}

/// Reads `body` into `$fields` with the top-level shape `$top` (`{raw, fields}`): the fast walk first
/// if `$fast`, else (or when it gives up) the reference walk on fresh fields (`$fresh`). Evaluates to
/// `Result<bool, EstimateError>` (false: not an object).
macro_rules! walk_body {
    ($body:expr, $fast:expr, $fields:ident, $fresh:expr, $top:ident) => {{
        let walked = if $fast {
            let mut de = json::Scanner::new($body);
            let mut go = || -> Result<bool, json::Bail> {
                let o = Seed($top {
                    raw: true,
                    fields: &mut $fields,
                })
                .deserialize(&mut de)?;
                de.end()?;
                Ok(o)
            };
            go().ok()
        } else {
            None
        };
        match walked {
            Some(o) => Ok(o),
            None => {
                let text = std::str::from_utf8($body)
                    .map_err(|e| EstimateError::NotJson(e.to_string()))?;
                $fields = $fresh;
                let mut de = serde_json::Deserializer::from_str(text);
                Seed($top {
                    raw: false,
                    fields: &mut $fields,
                })
                .deserialize(&mut de)
                .and_then(|o| de.end().map(|()| o))
                .map_err(|e| EstimateError::NotJson(e.to_string()))
            }
        }
    }};
}

/// A Gemini `generateContent` body (see `gemini.rs`).
fn gemini_estimate(
    kind: ApiKind,
    body: &[u8],
    limits: &dyn Fn(Option<&str>) -> OutputLimits,
    fast: bool,
) -> Result<Estimate, EstimateError> {
    use gemini::{GeminiFields, GeminiTop};
    let mut f = GeminiFields::new();
    if !walk_body!(body, fast, f, GeminiFields::new(), GeminiTop)? {
        return Err(EstimateError::NotObject);
    }
    let model = std::mem::replace(&mut f.model, Ok(None))?;
    let prompt_tokens = f.prompt_tokens()?;
    let requested_output = f.requested_output()?;
    let n = f.choices()?;
    let lim = limits(model.as_deref());
    let per_choice = requested_output
        .unwrap_or_else(|| f.default_output(lim.default_tokens))
        .min(lim.cap_tokens);
    Ok(Estimate {
        kind,
        model,
        prompt_tokens,
        output_tokens: per_choice.saturating_mul(n),
        requested_output,
        output_choices: n,
        stream: kind == ApiKind::GeminiStream,
        include_usage: false,
        background: false,
    })
}

/// A Bedrock Converse body (or Nova's `messages-v1` invoke body; see `bedrock.rs`).
fn converse_estimate(
    kind: ApiKind,
    body: &[u8],
    limits: &dyn Fn(Option<&str>) -> OutputLimits,
    fast: bool,
) -> Result<Estimate, EstimateError> {
    use bedrock::{ConverseFields, ConverseTop};
    let mut f = ConverseFields::new();
    if !walk_body!(body, fast, f, ConverseFields::new(), ConverseTop)? {
        return Err(EstimateError::NotObject);
    }
    let model = std::mem::replace(&mut f.model, Ok(None))?;
    let prompt_tokens = f.prompt_tokens()?;
    let requested_output = f.requested_output()?;
    let lim = limits(model.as_deref());
    Ok(Estimate {
        kind,
        model,
        prompt_tokens,
        output_tokens: requested_output
            .unwrap_or_else(|| f.default_output(lim.default_tokens))
            .min(lim.cap_tokens),
        requested_output,
        output_choices: 1,
        stream: matches!(
            kind,
            ApiKind::BedrockConverseStream | ApiKind::BedrockInvokeStream
        ),
        include_usage: false,
        background: false,
    })
}

/// [`estimate`], with the fast walk tried first if `fast`.
fn estimate_by(
    kind: ApiKind,
    body: &[u8],
    limits: &dyn Fn(Option<&str>) -> OutputLimits,
    fast: bool,
) -> Result<Estimate, EstimateError> {
    if !matches!(
        kind,
        ApiKind::ChatCompletions
            | ApiKind::Completions
            | ApiKind::Embeddings
            | ApiKind::Responses
            | ApiKind::AnthropicMessages
    ) {
        return estimate_model_by(kind, body, None, limits, fast);
    }
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
    let background = fields.background.clone()?;
    let prompt_tokens = fields.prompt_tokens(kind)?;
    let requested_output = requested_output(
        fields.max_tokens,
        fields.max_completion_tokens,
        fields.max_output_tokens,
    )?;
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
        background,
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

#[cfg(test)]
#[allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing
)]
mod tests;
