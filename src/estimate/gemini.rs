//! Gemini API / Vertex AI `generateContent` and `streamGenerateContent` bodies.
//!
//! ```json
//! {"contents": [{"role": "user", "parts": [{"text": "Hello"}, {"inlineData": {"mimeType": "image/png", "data": "iVBOR…"}}]}],
//!  "systemInstruction": {"parts": [{"text": "Be brief."}]},
//!  "tools": [{"functionDeclarations": [{"name": "f", "parameters": {…}}]}],
//!  "generationConfig": {"maxOutputTokens": 256, "candidateCount": 1, "thinkingConfig": {"thinkingBudget": 1024}}}
//! ```
//!
//! The model is in the path (see [`super::route`]); a body's `model`, if any, is read but the path's
//! wins. Field names are read in both spellings Google's JSON accepts (`maxOutputTokens` and
//! `max_output_tokens`, `inlineData` and `inline_data`, …).
//!
//! | field | counted |
//! |---|---|
//! | `contents[]` | per content [`MESSAGE_OVERHEAD`] + its `role` + its parts, plus [`REPLY_PRIMER`] once |
//! | `parts[].text` | the text |
//! | `parts[].inlineData` | by `mimeType`: an image [`IMAGE_TOKENS`]; audio by size ([`AUDIO_TOKENS_PER_KB`] per KB of base64, WAV/PCM [`AUDIO_WAV_TOKENS_PER_KB`]); video [`VIDEO_TOKENS_PER_KB`]; text-like types (`text/*`, JSON, XML, code) as their decoded size / 3; anything else (PDF, …) [`FILE_TOKENS_PER_KB`] |
//! | `parts[].fileData` | an image [`IMAGE_TOKENS`], anything else [`FILE_ID_TOKENS`] (the filter cannot see it) |
//! | `parts[].functionCall`, `functionResponse`, `executableCode`, `codeExecutionResult` | their JSON text + 3 |
//! | other part fields (`thoughtSignature`, unknown ones) | by size ([`SIZE_BYTES_PER_TOKEN`](super::SIZE_BYTES_PER_TOKEN)) |
//! | `systemInstruction` | a content (a string is read as its text) |
//! | `tools`, `toolConfig`, `generationConfig.responseSchema` / `responseJsonSchema` | their JSON text |
//! | `cachedContent` | [`FILE_ID_TOKENS`]: cached tokens are billed (at a discount) but the filter cannot see them |
//!
//! Output reserved: `generationConfig.maxOutputTokens` (it bounds thinking and answer together), else
//! the larger of the model's default and `thinkingConfig.thinkingBudget`, clamped to the model's cap,
//! times `candidateCount` (1..=[`MAX_N`]).

use super::shape::{json_tokens, read_text, value, Ignore, Model, Seed, Shape, Size, Str};
use super::shape::{FromKey, KeysAs, Num};
use super::text::text_tokens;
use super::{parts::per_kb, MAX_N};
use super::{
    EstimateError, Res, AUDIO_TOKENS_PER_KB, AUDIO_WAV_TOKENS_PER_KB, FILE_ID_TOKENS,
    FILE_TOKENS_PER_KB, IMAGE_TOKENS, MAX_DEPTH, MESSAGE_OVERHEAD, REPLY_PRIMER,
};
use serde::de::{MapAccess, SeqAccess};
use serde_json::Value;
use std::borrow::Cow;

/// Video input (`inlineData` with a `video/*` type), per KB of base64: Gemini bills about 263 tokens
/// per second of video; compressed video at 0.5 Mbit/s is ~83 KB of base64 per second (3.2 per KB),
/// rounded up.
pub const VIDEO_TOKENS_PER_KB: u64 = 4;

/// The keys of Gemini request objects, in both spellings.
#[derive(Clone, Copy, PartialEq, Eq)]
enum K {
    Model,
    Contents,
    SystemInstruction,
    Tools,
    ToolConfig,
    GenerationConfig,
    CachedContent,
    Role,
    Parts,
    Text,
    InlineData,
    FileData,
    FunctionCall,
    FunctionResponse,
    ExecutableCode,
    CodeExecutionResult,
    Thought,
    MimeType,
    Data,
    MaxOutputTokens,
    CandidateCount,
    ThinkingConfig,
    ThinkingBudget,
    ResponseSchema,
    Other,
}

impl K {
    fn of(s: &[u8]) -> K {
        match s {
            b"model" => K::Model,
            b"contents" => K::Contents,
            b"systemInstruction" | b"system_instruction" => K::SystemInstruction,
            b"tools" => K::Tools,
            b"toolConfig" | b"tool_config" => K::ToolConfig,
            b"generationConfig" | b"generation_config" => K::GenerationConfig,
            b"cachedContent" | b"cached_content" => K::CachedContent,
            b"role" => K::Role,
            b"parts" => K::Parts,
            b"text" => K::Text,
            b"inlineData" | b"inline_data" => K::InlineData,
            b"fileData" | b"file_data" => K::FileData,
            b"functionCall" | b"function_call" => K::FunctionCall,
            b"functionResponse" | b"function_response" => K::FunctionResponse,
            b"executableCode" | b"executable_code" => K::ExecutableCode,
            b"codeExecutionResult" | b"code_execution_result" => K::CodeExecutionResult,
            b"thought" => K::Thought,
            b"mimeType" | b"mime_type" => K::MimeType,
            b"data" => K::Data,
            b"maxOutputTokens" | b"max_output_tokens" => K::MaxOutputTokens,
            b"candidateCount" | b"candidate_count" => K::CandidateCount,
            b"thinkingConfig" | b"thinking_config" => K::ThinkingConfig,
            b"thinkingBudget" | b"thinking_budget" => K::ThinkingBudget,
            b"responseSchema"
            | b"response_schema"
            | b"responseJsonSchema"
            | b"response_json_schema" => K::ResponseSchema,
            _ => K::Other,
        }
    }
}

impl FromKey for K {
    fn of(b: &[u8]) -> Self {
        K::of(b)
    }
}

/// What the walk keeps of a Gemini body.
pub(super) struct GeminiFields {
    pub(super) model: Res<Option<String>>,
    contents: Res<u64>,
    system: u64,
    tools: u64,
    schema: u64,
    cached: u64,
    max_output: Num,
    candidates: Num,
    /// `thinkingConfig.thinkingBudget` when a non-negative integer (-1, dynamic, is no budget).
    thinking: Option<u64>,
}

impl GeminiFields {
    pub(super) fn new() -> GeminiFields {
        GeminiFields {
            model: Ok(None),
            contents: Ok(0),
            system: 0,
            tools: 0,
            schema: 0,
            cached: 0,
            max_output: Num::Absent,
            candidates: Num::Absent,
            thinking: None,
        }
    }

    /// The billed input.
    pub(super) fn prompt_tokens(&self) -> Res<u64> {
        Ok(self
            .contents
            .clone()?
            .saturating_add(self.system)
            .saturating_add(self.tools)
            .saturating_add(self.schema)
            .saturating_add(self.cached))
    }

    /// What the body asks for (`maxOutputTokens`), if anything.
    pub(super) fn requested_output(&self) -> Res<Option<u64>> {
        match self.max_output {
            Num::Absent => Ok(None),
            Num::Val(v) => Ok(Some(v)),
            Num::Bad => Err(EstimateError::BadField("generationConfig.maxOutputTokens")),
        }
    }

    /// The output reserved per candidate when the body asks for none: the larger of the model's default
    /// and the thinking budget.
    pub(super) fn default_output(&self, default: u64) -> u64 {
        default.max(self.thinking.unwrap_or(0))
    }

    /// Candidates generated (and billed): `candidateCount`, 1..=[`MAX_N`].
    pub(super) fn choices(&self) -> Res<u64> {
        match self.candidates {
            Num::Absent => Ok(1),
            Num::Val(v) => Ok(v.clamp(1, MAX_N)),
            Num::Bad => Err(EstimateError::BadField("generationConfig.candidateCount")),
        }
    }
}

/// The body: an object read into its fields (anything else is false).
pub(super) struct GeminiTop<'f> {
    pub(super) raw: bool,
    pub(super) fields: &'f mut GeminiFields,
}

impl<'de> Shape<'de> for GeminiTop<'_> {
    type Out = bool;
    fn other(self) -> bool {
        false
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<bool, A::Error> {
        let GeminiTop { raw, fields: f } = self;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            match k {
                K::Model => f.model = value(&mut a, Model)?,
                K::Contents => f.contents = value(&mut a, Contents { raw })?,
                K::SystemInstruction => f.system = value(&mut a, GContent { depth: 0, raw })?,
                K::Tools | K::ToolConfig => {
                    let t = json_tokens(&a.next_value::<Value>()?);
                    f.tools = f.tools.saturating_add(t);
                }
                K::GenerationConfig => {
                    let g = value(&mut a, GenConfig)?;
                    f.max_output = g.max_output;
                    f.candidates = g.candidates;
                    f.thinking = g.thinking;
                    f.schema = g.schema;
                }
                K::CachedContent => {
                    f.cached = match a.next_value::<Value>()? {
                        Value::String(s) if !s.is_empty() => FILE_ID_TOKENS,
                        _ => 0,
                    }
                }
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(true)
    }
}

/// `contents`: null, an array of contents (plus the reply primer), or one content object.
#[derive(Clone, Copy)]
struct Contents {
    raw: bool,
}

impl<'de> Shape<'de> for Contents {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField("contents"))
    }
    fn null(self) -> Res<u64> {
        Ok(0)
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let mut t = REPLY_PRIMER;
        let shape = GContent {
            depth: 0,
            raw: self.raw,
        };
        while let Some(n) = a.next_element_seed(Seed(shape))? {
            t = t.saturating_add(n);
        }
        Ok(Ok(t))
    }
    fn map<A: MapAccess<'de>>(self, a: A) -> Result<Res<u64>, A::Error> {
        let one = GContent {
            depth: 0,
            raw: self.raw,
        }
        .map(a)?;
        Ok(Ok(one.saturating_add(REPLY_PRIMER)))
    }
}

/// One content (`{"role", "parts"}`): overhead, role and parts. A string is its text (lenient: the
/// SDKs send objects); any other value by its size.
#[derive(Clone, Copy)]
struct GContent {
    depth: usize,
    raw: bool,
}

impl<'de> Shape<'de> for GContent {
    type Out = u64;
    fn other(self) -> u64 {
        Size.other()
    }
    fn null(self) -> u64 {
        0
    }
    fn string(self, s: &str) -> u64 {
        self.tokens(text_tokens(s))
    }
    fn tokens(self, n: u64) -> u64 {
        MESSAGE_OVERHEAD.saturating_add(n)
    }
    fn seq<A: SeqAccess<'de>>(self, a: A) -> Result<u64, A::Error> {
        // A list of parts where a content was expected.
        Ok(MESSAGE_OVERHEAD.saturating_add(
            Parts {
                depth: self.depth,
                raw: self.raw,
            }
            .seq(a)?,
        ))
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let GContent { depth, raw } = self;
        let mut t = MESSAGE_OVERHEAD;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            let n = match k {
                K::Role => super::shape::read_role(&mut a, raw)?,
                K::Parts => value(&mut a, Parts { depth, raw })?,
                _ => value(&mut a, Size)?.saturating_add(2),
            };
            t = t.saturating_add(n);
        }
        Ok(t)
    }
}

/// `parts`: an array of parts, one part object, or a string (its text).
#[derive(Clone, Copy)]
struct Parts {
    depth: usize,
    raw: bool,
}

impl<'de> Shape<'de> for Parts {
    type Out = u64;
    fn other(self) -> u64 {
        Size.other()
    }
    fn null(self) -> u64 {
        0
    }
    fn string(self, s: &str) -> u64 {
        text_tokens(s)
    }
    fn tokens(self, n: u64) -> u64 {
        n
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let part = GPart {
            depth: self.depth.saturating_add(1),
            raw: self.raw,
        };
        let mut t = 0u64;
        while let Some(n) = a.next_element_seed(Seed(part))? {
            t = t.saturating_add(n);
        }
        Ok(t)
    }
    fn map<A: MapAccess<'de>>(self, a: A) -> Result<u64, A::Error> {
        GPart {
            depth: self.depth.saturating_add(1),
            raw: self.raw,
        }
        .map(a)
    }
}

/// One part: what each of its fields costs (see the module table). Never an error.
#[derive(Clone, Copy)]
struct GPart {
    depth: usize,
    raw: bool,
}

impl<'de> Shape<'de> for GPart {
    type Out = u64;
    fn other(self) -> u64 {
        Size.other()
    }
    fn string(self, s: &str) -> u64 {
        text_tokens(s)
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        if self.depth > MAX_DEPTH {
            return Size.map(a);
        }
        let raw = self.raw;
        let mut t = 0u64;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            let n = match k {
                K::Text => read_text(&mut a, raw, Str)?.unwrap_or(0),
                K::InlineData => value(&mut a, Blob { inline: true })?,
                K::FileData => value(&mut a, Blob { inline: false })?,
                K::FunctionCall
                | K::FunctionResponse
                | K::ExecutableCode
                | K::CodeExecutionResult => {
                    json_tokens(&a.next_value::<Value>()?).saturating_add(3)
                }
                K::Thought => {
                    value(&mut a, Ignore)?;
                    0
                }
                _ => value(&mut a, Size)?.saturating_add(2),
            };
            t = t.saturating_add(n);
        }
        Ok(t)
    }
}

/// `inlineData` (`{"mimeType", "data": base64}`) or `fileData` (`{"mimeType", "fileUri"}`), costed
/// by its type once both are read.
#[derive(Clone, Copy)]
struct Blob {
    inline: bool,
}

impl<'de> Shape<'de> for Blob {
    type Out = u64;
    fn other(self) -> u64 {
        Size.other()
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let mut mime: Option<Cow<'de, str>> = None;
        let mut len = 0u64;
        let mut extra = 0u64;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            match k {
                K::MimeType => mime = value(&mut a, super::shape::KeepStr)?,
                K::Data => len = value(&mut a, super::parts::Len)?.unwrap_or(0),
                _ => extra = extra.saturating_add(value(&mut a, Size)?),
            }
        }
        let mime = mime.as_deref().unwrap_or("").to_ascii_lowercase();
        let cost = if mime.starts_with("image/") {
            IMAGE_TOKENS
        } else if !self.inline {
            // A file the filter cannot see (Files API, Cloud Storage, a YouTube URL).
            FILE_ID_TOKENS
        } else if mime.starts_with("audio/") {
            let wav = ["wav", "pcm", "l16", "aiff"]
                .iter()
                .any(|w| mime.contains(w));
            per_kb(
                len,
                if wav {
                    AUDIO_WAV_TOKENS_PER_KB
                } else {
                    AUDIO_TOKENS_PER_KB
                },
            )
        } else if mime.starts_with("video/") {
            per_kb(len, VIDEO_TOKENS_PER_KB)
        } else if text_like(&mime) {
            // Base64 of text: 3 bytes of text per 4, about 3 bytes per token.
            len.div_ceil(4)
        } else {
            per_kb(len, FILE_TOKENS_PER_KB)
        };
        // A file reference's `fileUri` is not billed text; an inline blob's other fields are few.
        Ok(if self.inline {
            cost.saturating_add(extra)
        } else {
            cost
        })
    }
}

/// MIME types whose data is text (billed as its text).
fn text_like(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/json"
                | "application/xml"
                | "application/x-javascript"
                | "application/javascript"
                | "application/x-python"
                | "application/x-typescript"
                | "application/rtf"
        )
}

/// `generationConfig`, as the walk keeps it.
struct Gen {
    max_output: Num,
    candidates: Num,
    thinking: Option<u64>,
    schema: u64,
}

#[derive(Clone, Copy)]
struct GenConfig;

impl<'de> Shape<'de> for GenConfig {
    type Out = Gen;
    fn other(self) -> Gen {
        Gen {
            max_output: Num::Absent,
            candidates: Num::Absent,
            thinking: None,
            schema: 0,
        }
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Gen, A::Error> {
        let mut g = self.other();
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            match k {
                K::MaxOutputTokens => g.max_output = value(&mut a, super::shape::Count)?,
                K::CandidateCount => g.candidates = value(&mut a, super::shape::Count)?,
                K::ThinkingConfig => g.thinking = value(&mut a, Thinking)?,
                K::ResponseSchema => g.schema = json_tokens(&a.next_value::<Value>()?),
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(g)
    }
}

/// `thinkingConfig.thinkingBudget`: a non-negative integer, else none (-1 is "dynamic").
#[derive(Clone, Copy)]
struct Thinking;

impl<'de> Shape<'de> for Thinking {
    type Out = Option<u64>;
    fn other(self) -> Option<u64> {
        None
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Option<u64>, A::Error> {
        let mut budget = None;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            match k {
                K::ThinkingBudget => {
                    budget = match value(&mut a, super::shape::Count)? {
                        Num::Val(v) => Some(v),
                        _ => None,
                    }
                }
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(budget)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::super::{estimate_model_by, text_tokens, ApiKind, Estimate, OutputLimits};
    use super::*;

    const LIMITS: OutputLimits = OutputLimits {
        default_tokens: 100,
        cap_tokens: 10_000,
    };

    /// Both walks, which must agree; the fast one's result.
    fn est(body: &str) -> Estimate {
        est_kind(ApiKind::GeminiGenerate, body, Some("gemini-2.5-flash"))
    }

    fn est_kind(kind: ApiKind, body: &str, model: Option<&str>) -> Estimate {
        let fast = estimate_model_by(kind, body.as_bytes(), model, &|_| LIMITS, true);
        let reference = estimate_model_by(kind, body.as_bytes(), model, &|_| LIMITS, false);
        assert_eq!(fast, reference, "{body}");
        fast.unwrap()
    }

    fn text(s: &str) -> u64 {
        text_tokens(s)
    }

    #[test]
    fn a_text_conversation_counts_each_content_its_role_and_the_reply_primer() {
        let e = est(
            r#"{"contents":[{"role":"user","parts":[{"text":"Hello there, how are you?"}]},
                {"role":"model","parts":[{"text":"Fine."},{"text":"And you?"}]}],
                "generationConfig":{"maxOutputTokens":64}}"#,
        );
        let want = REPLY_PRIMER
            + 2 * MESSAGE_OVERHEAD
            + 1
            + text("model")
            + text("Hello there, how are you?")
            + text("Fine.")
            + text("And you?");
        assert_eq!(e.prompt_tokens, want);
        assert_eq!(e.output_tokens, 64);
        assert_eq!(e.requested_output, Some(64));
        assert_eq!(e.model.as_deref(), Some("gemini-2.5-flash"));
        assert!(!e.stream);
        assert_eq!(e.kind, ApiKind::GeminiGenerate);
        let s = est_kind(ApiKind::GeminiStream, r#"{"contents":[]}"#, None);
        assert!(s.stream);
        assert_eq!(s.model, None);
        assert_eq!(s.output_tokens, 100, "the model's default");
    }

    #[test]
    fn snake_case_field_names_count_the_same_as_camel_case() {
        let camel = est(
            r#"{"contents":[{"parts":[{"text":"hi"},{"inlineData":{"mimeType":"image/png","data":"AAAA"}}]}],
                "systemInstruction":{"parts":[{"text":"Be brief."}]},
                "generationConfig":{"maxOutputTokens":7,"candidateCount":2,"thinkingConfig":{"thinkingBudget":5}}}"#,
        );
        let snake = est(
            r#"{"contents":[{"parts":[{"text":"hi"},{"inline_data":{"mime_type":"image/png","data":"AAAA"}}]}],
                "system_instruction":{"parts":[{"text":"Be brief."}]},
                "generation_config":{"max_output_tokens":7,"candidate_count":2,"thinking_config":{"thinking_budget":5}}}"#,
        );
        assert_eq!(camel, snake);
        assert_eq!(camel.output_tokens, 14);
        assert_eq!(camel.output_choices, 2);
        assert!(camel.prompt_tokens > IMAGE_TOKENS);
    }

    #[test]
    fn media_parts_are_costed_by_their_type_and_size() {
        let part = |p: &str| {
            let with = est(&format!(r#"{{"contents":[{{"parts":[{p}]}}]}}"#));
            let without = est(r#"{"contents":[{"parts":[]}]}"#);
            with.prompt_tokens - without.prompt_tokens
        };
        let b64 = "A".repeat(10 * 1024);
        assert_eq!(
            part(r#"{"inlineData":{"mimeType":"image/jpeg","data":"/9j/"}}"#),
            IMAGE_TOKENS
        );
        assert_eq!(
            part(&format!(
                r#"{{"inlineData":{{"mimeType":"audio/mp3","data":"{b64}"}}}}"#
            )),
            10 * AUDIO_TOKENS_PER_KB
        );
        assert_eq!(
            part(&format!(
                r#"{{"inlineData":{{"data":"{b64}","mimeType":"audio/wav"}}}}"#
            )),
            10 * AUDIO_WAV_TOKENS_PER_KB
        );
        assert_eq!(
            part(&format!(
                r#"{{"inlineData":{{"mimeType":"video/mp4","data":"{b64}"}}}}"#
            )),
            10 * VIDEO_TOKENS_PER_KB
        );
        assert_eq!(
            part(&format!(
                r#"{{"inlineData":{{"mimeType":"application/pdf","data":"{b64}"}}}}"#
            )),
            10 * FILE_TOKENS_PER_KB
        );
        assert_eq!(
            part(&format!(
                r#"{{"inlineData":{{"mimeType":"text/plain","data":"{b64}"}}}}"#
            )),
            10 * 1024 / 4
        );
        assert_eq!(
            part(
                r#"{"fileData":{"mimeType":"video/mp4","fileUri":"https://www.youtube.com/watch?v=x"}}"#
            ),
            FILE_ID_TOKENS
        );
        assert_eq!(
            part(r#"{"fileData":{"fileUri":"gs://b/cat.png","mimeType":"image/png"}}"#),
            IMAGE_TOKENS
        );
        let call = r#"{"name":"get_weather","args":{"city":"Paris"}}"#;
        assert_eq!(
            part(&format!(r#"{{"functionCall":{call}}}"#)),
            json_tokens(&serde_json::from_str(call).unwrap()) + 3
        );
        // A field the walk does not know counts by its size, never as nothing.
        assert!(part(r#"{"somethingNew":{"payload":"a long string of some kind"}}"#) > 5);
        assert_eq!(part(r#"{"text":"x","thought":true}"#), text("x"));
    }

    #[test]
    fn tools_schema_and_cached_content_count() {
        let tools = r#"[{"functionDeclarations":[{"name":"f","description":"does f","parameters":{"type":"OBJECT","properties":{"a":{"type":"STRING"}}}}]}]"#;
        let base = est(r#"{"contents":[]}"#).prompt_tokens;
        let with = est(&format!(r#"{{"contents":[],"tools":{tools}}}"#)).prompt_tokens;
        assert_eq!(
            with - base,
            json_tokens(&serde_json::from_str(tools).unwrap())
        );
        let cached = est(r#"{"contents":[],"cachedContent":"cachedContents/abc"}"#);
        assert_eq!(cached.prompt_tokens - base, FILE_ID_TOKENS);
        let schema =
            est(r#"{"contents":[],"generationConfig":{"responseSchema":{"type":"OBJECT"}}}"#);
        assert!(schema.prompt_tokens > base);
    }

    #[test]
    fn the_thinking_budget_raises_the_default_output_but_not_an_explicit_one() {
        let e =
            est(r#"{"contents":[],"generationConfig":{"thinkingConfig":{"thinkingBudget":4096}}}"#);
        assert_eq!(e.output_tokens, 4096);
        assert_eq!(e.requested_output, None);
        let e = est(
            r#"{"contents":[],"generationConfig":{"maxOutputTokens":50,"thinkingConfig":{"thinkingBudget":4096}}}"#,
        );
        assert_eq!(e.output_tokens, 50);
        let e =
            est(r#"{"contents":[],"generationConfig":{"thinkingConfig":{"thinkingBudget":-1}}}"#);
        assert_eq!(e.output_tokens, 100);
        let e = est(
            r#"{"contents":[],"generationConfig":{"maxOutputTokens":99999,"candidateCount":500}}"#,
        );
        assert_eq!(
            e.output_tokens,
            10_000 * MAX_N,
            "clamped to the cap, candidates to MAX_N"
        );
    }

    #[test]
    fn bad_bodies_are_errors_and_odd_ones_are_counted() {
        let err = |b: &str| {
            estimate_model_by(
                ApiKind::GeminiGenerate,
                b.as_bytes(),
                None,
                &|_| LIMITS,
                true,
            )
            .unwrap_err()
        };
        assert!(matches!(err("not json"), EstimateError::NotJson(_)));
        assert_eq!(err("[]"), EstimateError::NotObject);
        assert_eq!(
            err(r#"{"contents":5}"#),
            EstimateError::BadField("contents")
        );
        assert_eq!(
            err(r#"{"generationConfig":{"maxOutputTokens":-1}}"#),
            EstimateError::BadField("generationConfig.maxOutputTokens")
        );
        assert_eq!(
            err(r#"{"generationConfig":{"candidateCount":"2"}}"#),
            EstimateError::BadField("generationConfig.candidateCount")
        );
        for odd in [
            r#"{}"#,
            r#"{"contents":null,"systemInstruction":"plain text"}"#,
            r#"{"contents":{"parts":{"text":"one object"}}}"#,
            r#"{"contents":[{"parts":"a string"}, 5, "text", [1], {"parts":[5,"s",[],{"x":{}}]}]}"#,
            r#"{"contents":[{"parts":[{"inlineData":"x"},{"fileData":[1]},{"functionCall":null}]}]}"#,
            r#"{"generationConfig":5,"tools":"x","cachedContent":7}"#,
        ] {
            let _ = est(odd);
        }
        let one = est(r#"{"contents":{"parts":{"text":"one object"}}}"#);
        assert_eq!(
            one.prompt_tokens,
            REPLY_PRIMER + MESSAGE_OVERHEAD + text("one object")
        );
    }
}
