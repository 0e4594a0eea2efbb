//! Bedrock bodies: the Converse API (`converse`, `converse-stream`) and `invoke` /
//! `invoke-with-response-stream`, whose body is the model's own.
//!
//! Converse:
//! ```json
//! {"messages": [{"role": "user", "content": [{"text": "Hello"}, {"image": {"format": "png", "source": {"bytes": "iVBOR…"}}}]}],
//!  "system": [{"text": "Be brief."}],
//!  "toolConfig": {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {…}}}}]},
//!  "inferenceConfig": {"maxTokens": 256}}
//! ```
//!
//! | field | counted |
//! |---|---|
//! | `messages[]` | per message [`MESSAGE_OVERHEAD`] + its `role` + its content blocks, plus [`REPLY_PRIMER`] once |
//! | `text`, `reasoningContent.reasoningText.text` blocks | the text |
//! | `image` | [`IMAGE_TOKENS`] |
//! | `document` | its `name`, and its source: `text` / `content` as text, `bytes` (base64) of a text format (`txt`, `md`, `csv`, `html`) as its decoded size / 3, else [`FILE_TOKENS_PER_KB`]; `s3Location` [`FILE_ID_TOKENS`] |
//! | `video` | `bytes` [`VIDEO_TOKENS_PER_KB`](super::gemini::VIDEO_TOKENS_PER_KB), `s3Location` [`FILE_ID_TOKENS`] |
//! | `toolUse` | its JSON text + 3 |
//! | `toolResult` | its content blocks (`json` blocks as JSON text) + 3 |
//! | `cachePoint` | 0 |
//! | other blocks (`guardContent`, `citationsContent`, unknown) | by size |
//! | `system[]` | its blocks |
//! | `toolConfig` | its JSON text, plus [`ANTHROPIC_TOOL_SYSTEM_TOKENS`] for a non-empty `tools` list (Claude's tool-use prompt; other models' are smaller) |
//! | `promptVariables` | its JSON text |
//!
//! Output reserved: `inferenceConfig.maxTokens` (Nova's invoke body: `inferenceConfig.max_new_tokens`),
//! else the larger of the model's default and a Claude thinking budget in
//! `additionalModelRequestFields.thinking.budget_tokens`, clamped to the model's cap.
//!
//! `invoke` bodies (see [`invoke_shape`]): an Anthropic Messages body (`anthropic_version`, as Claude
//! on Bedrock takes it) is read as `/v1/messages`; Amazon Nova's `messages-v1` body (`schemaVersion`,
//! or Converse-shaped `messages` for a `nova` model) as Converse; any other body (Llama's `prompt`,
//! Titan's `inputText`, Mistral, Cohere, AI21, …) is counted by its size (each string at least as its
//! text estimate), so that a shape the filter does not know is never counted low, with the output from the first output limit it names
//! (`max_tokens`, `max_gen_len`, `maxTokenCount`, `max_new_tokens`, `maxTokens`,
//! `max_completion_tokens`, `max_tokens_to_sample`, at the top or one object down).

use super::shape::{json_tokens, read_text, value, Count, Ignore, Model, Seed, Shape, Size, Str};
use super::shape::{FromKey, KeysAs, Num};
use super::text::text_tokens;
use super::{gemini::VIDEO_TOKENS_PER_KB, parts::per_kb};
use super::{
    EstimateError, Res, ANTHROPIC_TOOL_SYSTEM_TOKENS, FILE_ID_TOKENS, FILE_TOKENS_PER_KB,
    IMAGE_TOKENS, MAX_DEPTH, MESSAGE_OVERHEAD, REPLY_PRIMER, SIZE_BYTES_PER_TOKEN,
};
use serde::de::{MapAccess, SeqAccess};
use serde_json::Value;
use std::borrow::Cow;

/// Object keys of Converse bodies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum K {
    Model,
    Messages,
    System,
    ToolConfig,
    Tools,
    InferenceConfig,
    MaxTokens,
    AdditionalFields,
    PromptVariables,
    Role,
    Content,
    Text,
    Image,
    Document,
    Video,
    ToolUse,
    ToolResult,
    Json,
    ReasoningContent,
    ReasoningText,
    CachePoint,
    Name,
    Source,
    Bytes,
    S3Location,
    Format,
    Other,
}

impl K {
    fn of(s: &[u8]) -> K {
        match s {
            b"model" => K::Model,
            b"messages" => K::Messages,
            b"system" => K::System,
            b"toolConfig" => K::ToolConfig,
            b"tools" => K::Tools,
            b"inferenceConfig" => K::InferenceConfig,
            b"maxTokens" | b"max_new_tokens" => K::MaxTokens,
            b"additionalModelRequestFields" => K::AdditionalFields,
            b"promptVariables" => K::PromptVariables,
            b"role" => K::Role,
            b"content" => K::Content,
            b"text" => K::Text,
            b"image" => K::Image,
            b"document" => K::Document,
            b"video" => K::Video,
            b"toolUse" => K::ToolUse,
            b"toolResult" => K::ToolResult,
            b"json" => K::Json,
            b"reasoningContent" => K::ReasoningContent,
            b"reasoningText" => K::ReasoningText,
            b"cachePoint" => K::CachePoint,
            b"name" => K::Name,
            b"source" => K::Source,
            b"bytes" => K::Bytes,
            b"s3Location" => K::S3Location,
            b"format" => K::Format,
            _ => K::Other,
        }
    }
}

impl FromKey for K {
    fn of(b: &[u8]) -> Self {
        K::of(b)
    }
}

/// What the walk keeps of a Converse body.
pub(super) struct ConverseFields {
    pub(super) model: Res<Option<String>>,
    messages: Res<u64>,
    system: u64,
    tools: u64,
    variables: u64,
    max_tokens: Num,
    thinking: Option<u64>,
}

impl ConverseFields {
    pub(super) fn new() -> ConverseFields {
        ConverseFields {
            model: Ok(None),
            messages: Ok(0),
            system: 0,
            tools: 0,
            variables: 0,
            max_tokens: Num::Absent,
            thinking: None,
        }
    }

    pub(super) fn prompt_tokens(&self) -> Res<u64> {
        Ok(self
            .messages
            .clone()?
            .saturating_add(self.system)
            .saturating_add(self.tools)
            .saturating_add(self.variables))
    }

    pub(super) fn requested_output(&self) -> Res<Option<u64>> {
        match self.max_tokens {
            Num::Absent => Ok(None),
            Num::Val(v) => Ok(Some(v)),
            Num::Bad => Err(EstimateError::BadField("inferenceConfig.maxTokens")),
        }
    }

    /// The output reserved when the body asks for none: the larger of the model's default and a
    /// thinking budget.
    pub(super) fn default_output(&self, default: u64) -> u64 {
        default.max(self.thinking.unwrap_or(0))
    }
}

/// A Converse body (also Nova's `messages-v1` invoke body).
pub(super) struct ConverseTop<'f> {
    pub(super) raw: bool,
    pub(super) fields: &'f mut ConverseFields,
}

impl<'de> Shape<'de> for ConverseTop<'_> {
    type Out = bool;
    fn other(self) -> bool {
        false
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<bool, A::Error> {
        let ConverseTop { raw, fields: f } = self;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            match k {
                K::Model => f.model = value(&mut a, Model)?,
                K::Messages => f.messages = value(&mut a, Messages { raw })?,
                K::System => f.system = value(&mut a, Blocks { depth: 0, raw })?,
                K::ToolConfig => f.tools = tool_config(&a.next_value::<Value>()?),
                K::InferenceConfig => f.max_tokens = value(&mut a, Inference)?,
                K::AdditionalFields => f.thinking = thinking_budget(&a.next_value::<Value>()?),
                K::PromptVariables => f.variables = json_tokens(&a.next_value::<Value>()?),
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(true)
    }
}

/// `toolConfig`: its JSON text, plus Claude's tool-use system prompt when it lists tools.
fn tool_config(v: &Value) -> u64 {
    let listed = v
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    json_tokens(v).saturating_add(if listed {
        ANTHROPIC_TOOL_SYSTEM_TOKENS
    } else {
        0
    })
}

/// `additionalModelRequestFields.thinking.budget_tokens` (Claude's extended thinking), if any.
fn thinking_budget(v: &Value) -> Option<u64> {
    v.get("thinking")?.get("budget_tokens")?.as_u64()
}

/// `inferenceConfig`: its `maxTokens` (or Nova's `max_new_tokens`); not an object: absent.
#[derive(Clone, Copy)]
struct Inference;

impl<'de> Shape<'de> for Inference {
    type Out = Num;
    fn other(self) -> Num {
        Num::Absent
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Num, A::Error> {
        let mut n = Num::Absent;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            match k {
                K::MaxTokens => n = value(&mut a, Count)?,
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(n)
    }
}

/// `messages`: null or an array of messages (plus the reply primer).
#[derive(Clone, Copy)]
struct Messages {
    raw: bool,
}

impl<'de> Shape<'de> for Messages {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField("messages"))
    }
    fn null(self) -> Res<u64> {
        Ok(0)
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let mut t = REPLY_PRIMER;
        while let Some(n) = a.next_element_seed(Seed(Message { raw: self.raw }))? {
            t = t.saturating_add(n);
        }
        Ok(Ok(t))
    }
}

/// One message: overhead, role, content blocks. Anything but an object by its size.
#[derive(Clone, Copy)]
struct Message {
    raw: bool,
}

impl<'de> Shape<'de> for Message {
    type Out = u64;
    fn other(self) -> u64 {
        Size.other()
    }
    fn string(self, s: &str) -> u64 {
        Size.string(s)
    }
    fn seq<A: SeqAccess<'de>>(self, a: A) -> Result<u64, A::Error> {
        Size.seq(a)
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let raw = self.raw;
        let mut t = MESSAGE_OVERHEAD;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            let n = match k {
                K::Role => super::shape::read_role(&mut a, raw)?,
                K::Content => value(&mut a, Blocks { depth: 0, raw })?,
                _ => value(&mut a, Size)?.saturating_add(2),
            };
            t = t.saturating_add(n);
        }
        Ok(t)
    }
}

/// A list of content blocks (a string: its text; one object: one block).
#[derive(Clone, Copy)]
struct Blocks {
    depth: usize,
    raw: bool,
}

impl<'de> Shape<'de> for Blocks {
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
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let block = Block {
            depth: self.depth.saturating_add(1),
            raw: self.raw,
        };
        let mut t = 0u64;
        while let Some(n) = a.next_element_seed(Seed(block))? {
            t = t.saturating_add(n);
        }
        Ok(t)
    }
    fn map<A: MapAccess<'de>>(self, a: A) -> Result<u64, A::Error> {
        Block {
            depth: self.depth.saturating_add(1),
            raw: self.raw,
        }
        .map(a)
    }
}

/// One content block (a union: one key says what it is). Never an error.
#[derive(Clone, Copy)]
struct Block {
    depth: usize,
    raw: bool,
}

impl<'de> Shape<'de> for Block {
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
        let Block { depth, raw } = self;
        let mut t = 0u64;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            let n = match k {
                K::Text => read_text(&mut a, raw, Str)?.unwrap_or(0),
                K::Image => {
                    value(&mut a, Ignore)?;
                    IMAGE_TOKENS
                }
                K::Document => value(&mut a, Media { video: false })?,
                K::Video => value(&mut a, Media { video: true })?,
                K::ToolUse => json_tokens(&a.next_value::<Value>()?).saturating_add(3),
                K::ToolResult => value(&mut a, ToolResult { depth, raw })?.saturating_add(3),
                K::Json => json_tokens(&a.next_value::<Value>()?),
                K::ReasoningContent => value(&mut a, Reasoning { raw })?,
                K::CachePoint => {
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

/// `toolResult`: `{"toolUseId", "content": [blocks], "status"}`; its content blocks.
#[derive(Clone, Copy)]
struct ToolResult {
    depth: usize,
    raw: bool,
}

impl<'de> Shape<'de> for ToolResult {
    type Out = u64;
    fn other(self) -> u64 {
        Size.other()
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let mut t = 0u64;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            let n = match k {
                K::Content => value(
                    &mut a,
                    Blocks {
                        depth: self.depth,
                        raw: self.raw,
                    },
                )?,
                // `toolUseId`, `status`: identifiers, a token or two each.
                _ => value(&mut a, Size)?,
            };
            t = t.saturating_add(n);
        }
        Ok(t)
    }
}

/// `reasoningContent`: `{"reasoningText": {"text", "signature"}}` (its text) or
/// `{"redactedContent": base64}` (by size).
#[derive(Clone, Copy)]
struct Reasoning {
    raw: bool,
}

impl<'de> Shape<'de> for Reasoning {
    type Out = u64;
    fn other(self) -> u64 {
        Size.other()
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let mut t = 0u64;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            let n = match k {
                K::ReasoningText => value(&mut a, ReasoningText { raw: self.raw })?,
                _ => value(&mut a, Size)?,
            };
            t = t.saturating_add(n);
        }
        Ok(t)
    }
}

#[derive(Clone, Copy)]
struct ReasoningText {
    raw: bool,
}

impl<'de> Shape<'de> for ReasoningText {
    type Out = u64;
    fn other(self) -> u64 {
        Size.other()
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let mut t = 0u64;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            let n = match k {
                K::Text => read_text(&mut a, self.raw, Str)?.unwrap_or(0),
                // The signature is opaque and not billed as text.
                _ => {
                    value(&mut a, Ignore)?;
                    0
                }
            };
            t = t.saturating_add(n);
        }
        Ok(t)
    }
}

/// A `document` or `video` block: `{"format", "name", "source": {…}}`.
#[derive(Clone, Copy)]
struct Media {
    video: bool,
}

impl<'de> Shape<'de> for Media {
    type Out = u64;
    fn other(self) -> u64 {
        Size.other()
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let mut format: Option<Cow<'de, str>> = None;
        let mut source = SourceCost::default();
        let mut t = 0u64;
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            match k {
                K::Format => format = value(&mut a, super::shape::KeepStr)?,
                K::Source => source = value(&mut a, SourceShape)?,
                K::Name => t = t.saturating_add(value(&mut a, Str)?.unwrap_or(0)),
                _ => t = t.saturating_add(value(&mut a, Size)?),
            }
        }
        let format = format.as_deref().unwrap_or("").to_ascii_lowercase();
        let bytes = source.bytes.map(|len| {
            if self.video {
                per_kb(len, VIDEO_TOKENS_PER_KB)
            } else if matches!(format.as_str(), "txt" | "md" | "csv" | "html") {
                len.div_ceil(4)
            } else {
                per_kb(len, FILE_TOKENS_PER_KB)
            }
        });
        let s3 = if source.s3 { FILE_ID_TOKENS } else { 0 };
        Ok(t.saturating_add(bytes.unwrap_or(0))
            .saturating_add(s3)
            .saturating_add(source.text))
    }
}

/// What a media `source` holds.
#[derive(Default)]
struct SourceCost {
    /// Length of the base64 `bytes`.
    bytes: Option<u64>,
    /// An `s3Location`.
    s3: bool,
    /// Tokens of a `text` or `content` source.
    text: u64,
}

#[derive(Clone, Copy)]
struct SourceShape;

impl<'de> Shape<'de> for SourceShape {
    type Out = SourceCost;
    fn other(self) -> SourceCost {
        SourceCost::default()
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<SourceCost, A::Error> {
        let mut s = SourceCost::default();
        while let Some(k) = a.next_key_seed(KeysAs::<K>::SEED)? {
            match k {
                K::Bytes => s.bytes = value(&mut a, super::parts::Len)?,
                K::S3Location => {
                    value(&mut a, Ignore)?;
                    s.s3 = true;
                }
                K::Text => s.text = s.text.saturating_add(value(&mut a, Str)?.unwrap_or(0)),
                K::Content => {
                    let n = value(
                        &mut a,
                        Blocks {
                            depth: 1,
                            raw: false,
                        },
                    )?;
                    s.text = s.text.saturating_add(n);
                }
                _ => s.text = s.text.saturating_add(value(&mut a, Size)?),
            }
        }
        Ok(s)
    }
}

/// How an `invoke` body is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum InvokeShape {
    /// An Anthropic Messages body (`anthropic_version`): read as `/v1/messages`.
    Anthropic,
    /// Amazon Nova's `messages-v1`: read as Converse.
    Converse,
    /// Any other: by its size.
    Size,
}

/// Which shape an `invoke` body has: `anthropic_version` → Anthropic; `schemaVersion`, or `messages`
/// for a model whose id names Nova → Converse; else by size. `v` is the parsed body.
pub(super) fn invoke_shape(v: &Value, model: Option<&str>) -> InvokeShape {
    let Some(o) = v.as_object() else {
        return InvokeShape::Size;
    };
    let model = model.unwrap_or("").to_ascii_lowercase();
    if o.contains_key("anthropic_version") {
        InvokeShape::Anthropic
    } else if o.contains_key("schemaVersion")
        || (o.contains_key("messages") && model.contains("nova"))
    {
        InvokeShape::Converse
    } else {
        InvokeShape::Size
    }
}

/// Output limit fields of the model-specific `invoke` bodies, in the order they are looked for.
const OUTPUT_KEYS: [&str; 7] = [
    "max_tokens",
    "max_completion_tokens",
    "max_tokens_to_sample",
    "max_gen_len",
    "max_new_tokens",
    "maxTokenCount",
    "maxTokens",
];

/// An `invoke` body of a shape the filter does not know: its size as JSON text
/// ([`SIZE_BYTES_PER_TOKEN`] per token; each string at least its text estimate), and the first output limit it names (at the top, or in an
/// object one level down: Titan's `textGenerationConfig.maxTokenCount`); a limit that is not a
/// non-negative integer is a bad field.
pub(super) fn by_size(v: &Value) -> (u64, Res<Option<u64>>) {
    let size = value_size(v, 0);
    let found = v
        .as_object()
        .and_then(|o| pick(o).or_else(|| o.values().filter_map(Value::as_object).find_map(pick)));
    let out = match found {
        None => Ok(None),
        Some((k, v)) => match v.as_u64() {
            Some(n) => Ok(Some(n)),
            None => Err(EstimateError::BadField(output_field(k))),
        },
    };
    (size, out)
}

/// The first output limit of `o`, by [`OUTPUT_KEYS`] order.
fn pick(o: &serde_json::Map<String, Value>) -> Option<(&'static str, &Value)> {
    OUTPUT_KEYS
        .iter()
        .find_map(|k| o.get(*k).filter(|v| !v.is_null()).map(|v| (*k, v)))
}

fn output_field(k: &str) -> &'static str {
    OUTPUT_KEYS
        .iter()
        .find(|o| **o == k)
        .copied()
        .unwrap_or("max_tokens")
}

/// The [`Size`] of a parsed value.
fn value_size(v: &Value, depth: usize) -> u64 {
    if depth > MAX_DEPTH {
        return 0;
    }
    match v {
        // By size, but never below the text estimate: text whose tokens are shorter than 3 bytes
        // (identifiers, numbers, tables) would otherwise be counted low.
        Value::String(s) => (s.len() as u64)
            .div_ceil(SIZE_BYTES_PER_TOKEN)
            .saturating_add(1)
            .max(text_tokens(s)),
        Value::Array(a) => a
            .iter()
            .fold(1u64, |t, x| t.saturating_add(value_size(x, depth + 1))),
        Value::Object(o) => o.iter().fold(1u64, |t, (k, x)| {
            t.saturating_add((k.len() as u64).div_ceil(SIZE_BYTES_PER_TOKEN))
                .saturating_add(2)
                .saturating_add(value_size(x, depth + 1))
        }),
        _ => 2,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::super::{estimate, estimate_model_by, ApiKind, Estimate, OutputLimits};
    use super::*;

    const LIMITS: OutputLimits = OutputLimits {
        default_tokens: 100,
        cap_tokens: 10_000,
    };

    fn est_kind(kind: ApiKind, body: &str, model: Option<&str>) -> Estimate {
        let fast = estimate_model_by(kind, body.as_bytes(), model, &|_| LIMITS, true);
        let reference = estimate_model_by(kind, body.as_bytes(), model, &|_| LIMITS, false);
        assert_eq!(fast, reference, "{body}");
        fast.unwrap()
    }

    fn est(body: &str) -> Estimate {
        est_kind(ApiKind::BedrockConverse, body, Some("anthropic.claude-x"))
    }

    fn text(s: &str) -> u64 {
        text_tokens(s)
    }

    #[test]
    fn a_converse_conversation_counts_messages_system_and_the_output_cap() {
        let e = est(
            r#"{"messages":[{"role":"user","content":[{"text":"Hello there"}]},
                {"role":"assistant","content":[{"text":"Hi!"}]}],
                "system":[{"text":"Be brief."}],
                "inferenceConfig":{"maxTokens":256,"temperature":0.5}}"#,
        );
        let want = REPLY_PRIMER
            + 2 * (MESSAGE_OVERHEAD + 1)
            + text("Hello there")
            + text("Hi!")
            + text("Be brief.");
        assert_eq!(e.prompt_tokens, want);
        assert_eq!(e.output_tokens, 256);
        assert_eq!(e.requested_output, Some(256));
        assert_eq!(e.model.as_deref(), Some("anthropic.claude-x"));
        assert!(!e.stream);
        let s = est_kind(ApiKind::BedrockConverseStream, r#"{"messages":[]}"#, None);
        assert!(s.stream);
        assert_eq!(s.output_tokens, 100);
    }

    #[test]
    fn blocks_are_costed_by_kind() {
        let block = |b: &str| {
            let with = est(&format!(
                r#"{{"messages":[{{"role":"user","content":[{b}]}}]}}"#
            ));
            let without = est(r#"{"messages":[{"role":"user","content":[]}]}"#);
            with.prompt_tokens - without.prompt_tokens
        };
        let b64 = "A".repeat(10 * 1024);
        assert_eq!(
            block(r#"{"image":{"format":"png","source":{"bytes":"iVBOR"}}}"#),
            IMAGE_TOKENS
        );
        assert_eq!(
            block(&format!(
                r#"{{"document":{{"format":"pdf","name":"report","source":{{"bytes":"{b64}"}}}}}}"#
            )),
            text("report") + 10 * FILE_TOKENS_PER_KB
        );
        assert_eq!(
            block(&format!(
                r#"{{"document":{{"source":{{"bytes":"{b64}"}},"format":"csv","name":"t"}}}}"#
            )),
            text("t") + 10 * 1024 / 4
        );
        assert_eq!(
            block(
                r#"{"document":{"format":"pdf","name":"n","source":{"s3Location":{"uri":"s3://b/k"}}}}"#
            ),
            text("n") + FILE_ID_TOKENS
        );
        assert_eq!(
            block(&format!(
                r#"{{"video":{{"format":"mp4","source":{{"bytes":"{b64}"}}}}}}"#
            )),
            10 * VIDEO_TOKENS_PER_KB
        );
        let tool_use = r#"{"toolUseId":"t1","name":"f","input":{"a":1}}"#;
        assert_eq!(
            block(&format!(r#"{{"toolUse":{tool_use}}}"#)),
            json_tokens(&serde_json::from_str(tool_use).unwrap()) + 3
        );
        let result = block(
            r#"{"toolResult":{"toolUseId":"t1","content":[{"text":"sunny"},{"json":{"t":21}}],"status":"success"}}"#,
        );
        assert!(result >= text("sunny") + json_tokens(&serde_json::json!({"t":21})) + 3);
        assert_eq!(block(r#"{"cachePoint":{"type":"default"}}"#), 0);
        assert_eq!(
            block(r#"{"reasoningContent":{"reasoningText":{"text":"think","signature":"c2ln"}}}"#),
            text("think")
        );
        assert!(block(r#"{"guardContent":{"text":{"text":"guarded text here"}}}"#) > 3);
    }

    #[test]
    fn tools_add_their_text_and_claudes_tool_prompt() {
        let base = est(r#"{"messages":[]}"#).prompt_tokens;
        let cfg =
            r#"{"tools":[{"toolSpec":{"name":"f","inputSchema":{"json":{"type":"object"}}}}]}"#;
        let with = est(&format!(r#"{{"messages":[],"toolConfig":{cfg}}}"#)).prompt_tokens;
        assert_eq!(
            with - base,
            json_tokens(&serde_json::from_str(cfg).unwrap()) + ANTHROPIC_TOOL_SYSTEM_TOKENS
        );
    }

    #[test]
    fn a_thinking_budget_raises_the_default_output() {
        let e = est(
            r#"{"messages":[],"additionalModelRequestFields":{"thinking":{"type":"enabled","budget_tokens":2048}}}"#,
        );
        assert_eq!(e.output_tokens, 2048);
        let e = est(
            r#"{"messages":[],"inferenceConfig":{"maxTokens":4096},"additionalModelRequestFields":{"thinking":{"budget_tokens":2048}}}"#,
        );
        assert_eq!(e.output_tokens, 4096);
        let e = est(r#"{"messages":[],"inferenceConfig":{"maxTokens":1000000}}"#);
        assert_eq!(e.output_tokens, 10_000);
    }

    #[test]
    fn an_anthropic_invoke_body_is_read_as_anthropic_messages() {
        let body = r#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":300,"system":"Be brief.",
            "messages":[{"role":"user","content":[{"type":"text","text":"Hello"}]}]}"#;
        let e = est_kind(
            ApiKind::BedrockInvoke,
            body,
            Some("anthropic.claude-3-haiku"),
        );
        let m = estimate(ApiKind::AnthropicMessages, body.as_bytes(), &|_| LIMITS).unwrap();
        assert_eq!(e.prompt_tokens, m.prompt_tokens);
        assert_eq!(e.output_tokens, 300);
        assert_eq!(e.kind, ApiKind::BedrockInvoke);
        assert_eq!(e.model.as_deref(), Some("anthropic.claude-3-haiku"));
        let s = est_kind(ApiKind::BedrockInvokeStream, body, Some("m"));
        assert!(s.stream);
    }

    #[test]
    fn a_nova_invoke_body_is_read_as_converse() {
        let body = r#"{"schemaVersion":"messages-v1","messages":[{"role":"user","content":[{"text":"Hello"}]}],
            "system":[{"text":"Be brief."}],"inferenceConfig":{"max_new_tokens":77}}"#;
        let e = est_kind(ApiKind::BedrockInvoke, body, Some("amazon.nova-lite-v1:0"));
        let c = est_kind(
            ApiKind::BedrockConverse,
            body,
            Some("amazon.nova-lite-v1:0"),
        );
        assert_eq!(e.prompt_tokens, c.prompt_tokens);
        assert_eq!(e.output_tokens, 77);
    }

    #[test]
    fn other_invoke_bodies_are_counted_by_size_with_their_output_limit() {
        let prompt = "word ".repeat(300);
        let llama = format!(r#"{{"prompt":"{prompt}","max_gen_len":512,"temperature":0.5}}"#);
        let e = est_kind(
            ApiKind::BedrockInvoke,
            &llama,
            Some("meta.llama3-8b-instruct-v1:0"),
        );
        assert!(e.prompt_tokens >= prompt.len() as u64 / SIZE_BYTES_PER_TOKEN);
        assert!(
            e.prompt_tokens >= text(&prompt),
            "never below the text estimate"
        );
        assert_eq!(e.output_tokens, 512);
        let titan = r#"{"inputText":"Hi","textGenerationConfig":{"maxTokenCount":64}}"#;
        assert_eq!(
            est_kind(
                ApiKind::BedrockInvoke,
                titan,
                Some("amazon.titan-text-express-v1")
            )
            .output_tokens,
            64
        );
        let none = est_kind(ApiKind::BedrockInvoke, r#"{"inputText":"Hi"}"#, None);
        assert_eq!(none.output_tokens, 100);
        let bad = estimate_model_by(
            ApiKind::BedrockInvoke,
            br#"{"prompt":"x","max_tokens":"many"}"#,
            None,
            &|_| LIMITS,
            true,
        );
        assert_eq!(bad, Err(EstimateError::BadField("max_tokens")));
    }

    #[test]
    fn bad_bodies_are_errors_and_odd_ones_are_counted() {
        for kind in [ApiKind::BedrockConverse, ApiKind::BedrockInvoke] {
            let err = |b: &str| {
                estimate_model_by(kind, b.as_bytes(), None, &|_| LIMITS, true).unwrap_err()
            };
            assert!(matches!(err("{"), EstimateError::NotJson(_)));
            assert_eq!(err("7"), EstimateError::NotObject);
        }
        let err = |b: &str| {
            estimate_model_by(
                ApiKind::BedrockConverse,
                b.as_bytes(),
                None,
                &|_| LIMITS,
                true,
            )
            .unwrap_err()
        };
        assert_eq!(
            err(r#"{"messages":"hi"}"#),
            EstimateError::BadField("messages")
        );
        assert_eq!(
            err(r#"{"inferenceConfig":{"maxTokens":1.5}}"#),
            EstimateError::BadField("inferenceConfig.maxTokens")
        );
        for odd in [
            r#"{}"#,
            r#"{"messages":[5,"s",[],{"content":"plain"},{"content":{"text":"one"}},{"content":[7,{"x":1}]}]}"#,
            r#"{"system":"s","toolConfig":5,"inferenceConfig":"x","additionalModelRequestFields":[]}"#,
            r#"{"messages":[{"content":[{"toolResult":{"content":[{"toolResult":{"content":[{"text":"deep"}]}}]}}]}]}"#,
            r#"{"messages":[{"content":[{"document":5},{"video":{"source":7}},{"image":null}]}]}"#,
        ] {
            let _ = est(odd);
        }
    }
}
