//! The top-level object of a body: which field goes to which shape, per API family, and what the
//! walk keeps of each ([`Fields`]).

use super::anthropic::AnthropicMessage;
use super::chat::{ChatMessage, Messages, Prediction};
use super::completions::IdsOrText;
use super::parts::Content;
use super::responses::{Instructions, ResponsesInput, TextConfig};
use super::shape::Num;
use super::shape::{
    format_tokens, read_text, value, Count, Flag, Ignore, Key, Model, Shape, Str, StreamOptions,
    KEY_SEED,
};
use super::tools::Tools;
use super::{ApiKind, Res};
use serde::de::MapAccess;
use serde_json::Value;

/// What the walk keeps of the top-level object: one slot per field that matters to `kind`, each holding
/// the field's count or its error (so that a later syntax error still wins, and the last duplicate key
/// replaces earlier ones). Absent fields hold what an absent field means.
pub(super) struct Fields {
    pub(super) model: Res<Option<String>>,
    pub(super) stream: Res<bool>,
    pub(super) stream_options: Res<bool>,
    /// Responses `background`.
    pub(super) background: Res<bool>,
    pub(super) max_tokens: Num,
    pub(super) max_completion_tokens: Num,
    pub(super) max_output_tokens: Num,
    pub(super) n: Num,
    /// Legacy completions `best_of`.
    pub(super) best_of: Num,
    /// Chat or Anthropic `messages`, reply primer included.
    pub(super) messages: Res<u64>,
    pub(super) tools: Res<u64>,
    pub(super) functions: Res<u64>,
    pub(super) response_format: u64,
    /// Completions `prompt`, or a Responses `prompt` template (its JSON text).
    pub(super) prompt: Res<u64>,
    pub(super) suffix: u64,
    /// Embeddings or Responses `input`.
    pub(super) input: Res<u64>,
    pub(super) instructions: Res<u64>,
    /// Responses `text.format`.
    pub(super) text: u64,
    pub(super) system: Res<u64>,
    /// Chat `prediction` (Predicted Outputs).
    pub(super) prediction: Res<u64>,
}

impl Fields {
    pub(super) fn new() -> Fields {
        Fields {
            model: Ok(None),
            stream: Ok(false),
            stream_options: Ok(false),
            background: Ok(false),
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
    pub(super) fn prompt_tokens(&self, kind: ApiKind) -> Res<u64> {
        let parts: [&Res<u64>; 4] = match kind {
            ApiKind::ChatCompletions => [
                &self.messages,
                &self.tools,
                &self.functions,
                &self.prediction,
            ],
            ApiKind::Completions => [&self.prompt, &Ok(0), &Ok(0), &Ok(0)],
            ApiKind::Embeddings => [&self.input, &Ok(0), &Ok(0), &Ok(0)],
            ApiKind::Responses => [&self.input, &self.instructions, &self.tools, &self.prompt],
            ApiKind::AnthropicMessages => [&self.system, &self.messages, &self.tools, &Ok(0)],
            // Read by their own walks (`gemini.rs`, `bedrock.rs`), never by this one.
            ApiKind::GeminiGenerate
            | ApiKind::GeminiStream
            | ApiKind::BedrockConverse
            | ApiKind::BedrockConverseStream
            | ApiKind::BedrockInvoke
            | ApiKind::BedrockInvokeStream => [&Ok(0), &Ok(0), &Ok(0), &Ok(0)],
        };
        let mut t = match kind {
            ApiKind::ChatCompletions => self.response_format,
            ApiKind::Completions => self.suffix,
            ApiKind::Responses => self.text,
            _ => 0,
        };
        for p in parts {
            t = t.saturating_add(p.clone()?);
        }
        Ok(t)
    }
}

/// The body: an object, read into `fields` (anything else is false, i.e. [`EstimateError::NotObject`](super::EstimateError::NotObject)).
pub(super) struct Top<'f> {
    pub(super) kind: ApiKind,
    /// The fast walk: the strings that are counted (message contents, text parts, prompts, …) are
    /// read with [`RawSeed`](super::shape::RawSeed), every other string as a `&str` (checked for UTF-8 as it is read).
    pub(super) raw: bool,
    pub(super) fields: &'f mut Fields,
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
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
            match (k, kind) {
                (Key::Model, _) => f.model = value(&mut a, Model)?,
                (Key::Stream, _) => f.stream = value(&mut a, Flag("stream"))?,
                (Key::StreamOptions, _) => f.stream_options = value(&mut a, StreamOptions)?,
                (Key::MaxTokens, _) => f.max_tokens = value(&mut a, Count)?,
                (Key::MaxCompletionTokens, _) => f.max_completion_tokens = value(&mut a, Count)?,
                (Key::MaxOutputTokens, _) => f.max_output_tokens = value(&mut a, Count)?,
                (Key::N, _) => f.n = value(&mut a, Count)?,
                (Key::Background, Responses) => f.background = value(&mut a, Flag("background"))?,
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
                (Key::Tools, ChatCompletions | Responses) => {
                    f.tools = value(&mut a, Tools::openai("tools"))?
                }
                (Key::Tools, AnthropicMessages) => {
                    f.tools = value(&mut a, Tools::anthropic("tools"))?
                }
                (Key::Functions, ChatCompletions) => {
                    f.functions = value(&mut a, Tools::openai("functions"))?
                }
                (Key::ResponseFormat, ChatCompletions) => {
                    f.response_format = format_tokens(&a.next_value::<Value>()?)
                }
                // A Responses prompt template (`{"id", "version", "variables"}`): its variables
                // are billed text; counted as its JSON text.
                (Key::Prompt, Responses) => {
                    f.prompt = Ok(super::shape::json_tokens(&a.next_value::<Value>()?))
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
