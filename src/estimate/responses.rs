//! OpenAI Responses: `input` (a string or items), `instructions`, `text.format`.

use super::chat::Arguments;
use super::parts::Content;
use super::shape::{
    format_tokens, read_text, sum_res, value, Ignore, Key, Role, Shape, Size, Str, Tag, TypeTag,
    KEY_SEED,
};
use super::text::text_tokens;
use super::{EstimateError, Res, MESSAGE_OVERHEAD, REPLY_PRIMER};
use serde::de::{MapAccess, SeqAccess};
use serde_json::Value;

/// The role token of a message the body gives without a role (a string `input`, a string item,
/// `instructions`): `user`, `system` and `developer` are one o200k token each.
const IMPLICIT_ROLE: u64 = 1;

/// Responses `input`: a string (one user message) or an array of items (plus the reply primer).
#[derive(Clone, Copy)]
pub(super) struct ResponsesInput {
    /// The fast walk (see [`Top::raw`](super::top::Top::raw)).
    pub(super) raw: bool,
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
            .saturating_add(IMPLICIT_ROLE)
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
pub(super) struct ResponseItem {
    /// The fast walk (see [`Top::raw`](super::top::Top::raw)).
    pub(super) raw: bool,
}

impl<'de> Shape<'de> for ResponseItem {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField("input[]"))
    }
    fn string(self, s: &str) -> Res<u64> {
        Ok(text_tokens(s)
            .saturating_add(MESSAGE_OVERHEAD)
            .saturating_add(IMPLICIT_ROLE))
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let mut content = None;
        let mut ty = Tag::Other;
        let mut name = None;
        let mut arguments = 0;
        let mut input: Option<Res<u64>> = None;
        let mut output = Ok(0);
        let mut text = None;
        let mut role = None;
        // Fields the walk has no use for, by their size (they count for an item of an unknown type).
        let mut extra = 0u64;
        let raw = self.raw;
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
            match k {
                Key::Content => {
                    let shape = Content::top("input[].content", raw);
                    content = Some(read_text(&mut a, raw, shape)?);
                }
                Key::Type => ty = value(&mut a, TypeTag)?,
                Key::Name => name = read_text(&mut a, raw, Str)?,
                Key::Arguments => arguments = value(&mut a, Arguments)?,
                Key::Input => {
                    input = Some(read_text(
                        &mut a,
                        raw,
                        Loose(Content::top("input[].input", raw)),
                    )?)
                }
                Key::Output => {
                    let shape = Loose(Content::top("input[].output", raw));
                    output = read_text(&mut a, raw, shape)?;
                }
                Key::Text => text = read_text(&mut a, raw, Str)?,
                Key::Role => role = Some(value(&mut a, Role)?),
                _ => extra = extra.saturating_add(2).saturating_add(value(&mut a, Size)?),
            }
        }
        Ok((|| {
            let has_content = content.is_some();
            let mut t = MESSAGE_OVERHEAD
                .saturating_add(role.unwrap_or(0))
                .saturating_add(content.unwrap_or(Ok(0))?);
            match ty {
                Tag::FunctionCall => {
                    t = t
                        .saturating_add(3)
                        .saturating_add(name.unwrap_or(0))
                        .saturating_add(arguments)
                        .saturating_add(input.unwrap_or(Ok(0))?);
                }
                Tag::FunctionCallOutput => t = t.saturating_add(output?),
                // Its `result` is the image (base64): billed as an image, not by its size.
                Tag::GeneratedImage => t = t.saturating_add(super::IMAGE_TOKENS),
                _ if has_content && role.is_some() => {}
                _ => {
                    // An item of a type the walk does not know (an MCP or shell call, its output, a
                    // computer call's screenshot, …; or a message without content): all it holds,
                    // the fields the walk reads as it counts them, the rest by size.
                    t = [
                        text.unwrap_or(0),
                        name.unwrap_or(0),
                        arguments,
                        input.unwrap_or(Ok(0))?,
                        output?,
                        extra,
                    ]
                    .iter()
                    .fold(t, |t, &n| t.saturating_add(n));
                }
            }
            Ok(t)
        })())
    }
}

/// A field of a Responses item that is text or content parts for the items the walk knows, and
/// anything at all for the others (an object, such as a computer call's screenshot: as a part; a
/// number or boolean: 2). Never an error but for the content it wraps.
#[derive(Clone, Copy)]
struct Loose(Content);

impl<'de> Shape<'de> for Loose {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Ok(Size.other())
    }
    fn null(self) -> Res<u64> {
        Ok(0)
    }
    fn string(self, s: &str) -> Res<u64> {
        self.0.string(s)
    }
    fn tokens(self, n: u64) -> Res<u64> {
        self.0.tokens(n)
    }
    fn seq<A: SeqAccess<'de>>(self, a: A) -> Result<Res<u64>, A::Error> {
        self.0.seq(a)
    }
    /// An object: as a content part (a computer call's screenshot is an image; an object of a type
    /// the walk does not know counts all it holds, the rest by size).
    fn map<A: MapAccess<'de>>(self, a: A) -> Result<Res<u64>, A::Error> {
        super::parts::Part {
            depth: 1,
            raw: self.0.raw,
        }
        .map(a)
        .map(Ok)
    }
}

/// Responses `instructions`: null or a string (plus message overhead).
#[derive(Clone, Copy)]
pub(super) struct Instructions;

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
        Ok(n.saturating_add(MESSAGE_OVERHEAD)
            .saturating_add(IMPLICIT_ROLE))
    }
}

/// Responses `text`: its `format`, costed as JSON unless it is plain text; 0 for anything else.
#[derive(Clone, Copy)]
pub(super) struct TextConfig;

impl<'de> Shape<'de> for TextConfig {
    type Out = u64;
    fn other(self) -> u64 {
        0
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let mut t = 0;
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
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
