//! OpenAI chat completions: `messages` (with the per-message framing), tool calls, function calls and
//! Predicted Outputs.

use super::parts::Content;
use super::shape::{
    json_tokens, read_role, read_text, sum, sum_res, value, Ignore, Key, Shape, Str, KEY_SEED,
};
use super::text::text_tokens;
use super::{EstimateError, Res, MESSAGE_OVERHEAD, REPLY_PRIMER};
use serde::de::{value::MapAccessDeserializer, MapAccess, SeqAccess};
use serde::Deserialize;
use serde_json::Value;

/// `messages`: null (nothing, no reply primer) or an array of messages (plus the reply primer).
#[derive(Clone, Copy)]
pub(super) struct Messages<M>(pub(super) M);

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
pub(super) struct ChatMessage {
    pub(super) raw: bool,
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
        let mut role = None;
        let raw = self.raw;
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
            match k {
                Key::Content => {
                    content = read_text(&mut a, raw, Content::top("messages[].content", raw))?
                }
                Key::Name => name = read_text(&mut a, raw, Str)?,
                Key::ToolCalls => tool_calls = value(&mut a, ToolCalls)?,
                Key::FunctionCall => function_call = value(&mut a, FunctionCallShape)?,
                Key::ToolCallId => tool_call_id = read_text(&mut a, raw, Str)?,
                Key::Refusal => refusal = read_text(&mut a, raw, Str)?,
                Key::Role => role = Some(read_role(&mut a, raw)?),
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok((|| {
            Ok(MESSAGE_OVERHEAD
                .saturating_add(role.unwrap_or(0))
                .saturating_add(content?)
                .saturating_add(name.map_or(0, |n: u64| n.saturating_add(1)))
                .saturating_add(tool_calls?)
                .saturating_add(function_call)
                .saturating_add(tool_call_id.unwrap_or(0))
                .saturating_add(refusal.unwrap_or(0)))
        })())
    }
}

/// `tool_calls`: null or an array of `{"function": {…}}`.
#[derive(Clone, Copy)]
pub(super) struct ToolCalls;

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
pub(super) struct ToolCall;

impl<'de> Shape<'de> for ToolCall {
    type Out = u64;
    fn other(self) -> u64 {
        0
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let mut t = 0;
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
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
pub(super) struct FunctionCallShape;

impl<'de> Shape<'de> for FunctionCallShape {
    type Out = u64;
    fn other(self) -> u64 {
        0
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let mut name = None;
        let mut arguments = 0;
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
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
pub(super) struct Arguments;

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

/// Chat `prediction` (Predicted Outputs): `{"type": "content", "content": <string or text parts>}`,
/// counted as prompt text; null is nothing, anything else is a bad field.
#[derive(Clone, Copy)]
pub(super) struct Prediction {
    /// The fast walk (see [`Top::raw`](super::top::Top::raw)).
    pub(super) raw: bool,
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
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
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
