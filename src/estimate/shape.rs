//! The streaming walk's machinery: serde visitors (a [`Shape`] per kind of value) that fold the
//! body into counts as the JSON reader reads it, the object keys and `type` tags the walk knows, and
//! the small shapes every API family uses (flags, counts, strings, JSON-costed lists).

use super::text::{text_tokens, utf8_tokens};
use super::{EstimateError, Res};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// A field that must be a non-negative integer (`max_tokens`, `n`, …) when present and not null.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Num {
    Absent,
    Val(u64),
    Bad,
}

/// Estimate a JSON value as the text of its compact serialization.
pub(super) fn json_tokens(v: &Value) -> u64 {
    // Serialization recursion is bounded by serde_json's parse limit (the value came from a parse).
    serde_json::to_string(v).map_or(0, |s| text_tokens(&s))
}

/// `response_format` / `text.format`: counted as JSON unless it is `{"type":"text",…}` or not an object.
pub(super) fn format_tokens(v: &Value) -> u64 {
    match v {
        Value::Object(o) if o.get("type").and_then(Value::as_str) != Some("text") => json_tokens(v),
        _ => 0,
    }
}

// ---------------------------------------------------------------------------------------------------
// Streaming walk: serde visitors that fold the body into counts as the JSON reader reads it.

/// Object keys the walk looks at (one enum for every object shape; the rest is [`Key::Other`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Key {
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
    FileUrl,
    Title,
    Context,
    Role,
    Background,
    ImageUrl,
    Detail,
    Other,
}

impl Key {
    pub(super) fn of(s: &[u8]) -> Key {
        // By length first, then each key of that length compared whole (a comparison of a known
        // length: one or two word compares), not byte by byte as a match on byte patterns does.
        let is = |name: &[u8]| s == name;
        match s.len() {
            1 => {
                if is(b"n") {
                    Key::N
                } else {
                    Key::Other
                }
            }
            4 => {
                if is(b"text") {
                    Key::Text
                } else if is(b"name") {
                    Key::Name
                } else if is(b"type") {
                    Key::Type
                } else if is(b"data") {
                    Key::Data
                } else if is(b"file") {
                    Key::File
                } else if is(b"role") {
                    Key::Role
                } else {
                    Key::Other
                }
            }
            5 => {
                if is(b"model") {
                    Key::Model
                } else if is(b"tools") {
                    Key::Tools
                } else if is(b"input") {
                    Key::Input
                } else if is(b"title") {
                    Key::Title
                } else {
                    Key::Other
                }
            }
            6 => {
                if is(b"stream") {
                    Key::Stream
                } else if is(b"prompt") {
                    Key::Prompt
                } else if is(b"suffix") {
                    Key::Suffix
                } else if is(b"system") {
                    Key::System
                } else if is(b"output") {
                    Key::Output
                } else if is(b"source") {
                    Key::Source
                } else if is(b"format") {
                    Key::Format
                } else if is(b"detail") {
                    Key::Detail
                } else {
                    Key::Other
                }
            }
            7 => {
                if is(b"content") {
                    Key::Content
                } else if is(b"best_of") {
                    Key::BestOf
                } else if is(b"refusal") {
                    Key::Refusal
                } else if is(b"file_id") {
                    Key::FileId
                } else if is(b"context") {
                    Key::Context
                } else {
                    Key::Other
                }
            }
            8 => {
                if is(b"messages") {
                    Key::Messages
                } else if is(b"function") {
                    Key::Function
                } else if is(b"thinking") {
                    Key::Thinking
                } else if is(b"file_url") {
                    Key::FileUrl
                } else {
                    Key::Other
                }
            }
            9 => {
                if is(b"functions") {
                    Key::Functions
                } else if is(b"arguments") {
                    Key::Arguments
                } else if is(b"file_data") {
                    Key::FileData
                } else if is(b"image_url") {
                    Key::ImageUrl
                } else {
                    Key::Other
                }
            }
            10 => {
                if is(b"max_tokens") {
                    Key::MaxTokens
                } else if is(b"tool_calls") {
                    Key::ToolCalls
                } else if is(b"prediction") {
                    Key::Prediction
                } else if is(b"background") {
                    Key::Background
                } else {
                    Key::Other
                }
            }
            11 => {
                if is(b"input_audio") {
                    Key::InputAudio
                } else {
                    Key::Other
                }
            }
            12 => {
                if is(b"instructions") {
                    Key::Instructions
                } else if is(b"tool_call_id") {
                    Key::ToolCallId
                } else {
                    Key::Other
                }
            }
            13 => {
                if is(b"include_usage") {
                    Key::IncludeUsage
                } else if is(b"function_call") {
                    Key::FunctionCall
                } else {
                    Key::Other
                }
            }
            14 => {
                if is(b"stream_options") {
                    Key::StreamOptions
                } else {
                    Key::Other
                }
            }
            15 => {
                if is(b"response_format") {
                    Key::ResponseFormat
                } else {
                    Key::Other
                }
            }
            17 => {
                if is(b"max_output_tokens") {
                    Key::MaxOutputTokens
                } else {
                    Key::Other
                }
            }
            21 => {
                if is(b"max_completion_tokens") {
                    Key::MaxCompletionTokens
                } else {
                    Key::Other
                }
            }
            _ => Key::Other,
        }
    }
}

/// The `type` of a content part, Responses item or format (anything else, or not a string: `Other`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Tag {
    Text,
    Image,
    ImageUrl,
    InputImage,
    ToolUse,
    ToolResult,
    Thinking,
    Document,
    Audio,
    File,
    Refusal,
    FunctionCall,
    FunctionCallOutput,
    GeneratedImage,
    FileRef,
    Other,
}

impl Tag {
    pub(super) fn of(s: &str) -> Tag {
        match s {
            // Responses' text parts (their annotations and logprobs are not billed).
            "text" | "input_text" | "output_text" | "summary_text" | "reasoning_text" => Tag::Text,
            // Chat's (`detail` inside its `image_url` object), Responses' (`detail` beside its URL).
            "image_url" => Tag::ImageUrl,
            // A computer call's output is a screenshot, billed as an image.
            "input_image" | "computer_screenshot" => Tag::InputImage,
            // A Responses image generation call passed back: its image, billed as one.
            "image_generation_call" => Tag::GeneratedImage,
            // Anthropic code-execution output files and container uploads: references to files in
            // the container, not context.
            "code_execution_output" | "bash_code_execution_output" | "container_upload" => {
                Tag::FileRef
            }
            // Anthropic's: no `detail`.
            "image" => Tag::Image,
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
pub(super) trait Shape<'de>: Sized {
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
pub(super) struct Seed<S>(pub(super) S);

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
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<S::Out, E> {
        // serde_json reads `-0` (an integer in JSON's grammar, 0 to the providers' Python) as −0.0: a
        // zero is 0 however it is written. Other numbers with a fraction or exponent stay numbers (a
        // float `max_tokens` is refused: its cap could not be written back exactly).
        Ok(if v == 0.0 {
            self.0.unsigned(0)
        } else {
            self.0.number()
        })
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
pub(super) struct RawSeed<S>(pub(super) S);

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

/// Reads an object key as a walk's key enum `K` without allocating.
pub(super) struct KeysAs<K>(PhantomData<K>);

/// Reads an object key as a [`Key`] without allocating.
pub(super) const KEY_SEED: KeysAs<Key> = KeysAs::SEED;

/// A walk's own key enum, read from the key's bytes.
pub(super) trait FromKey {
    /// The key of the bytes `b`.
    fn of(b: &[u8]) -> Self;
}

impl FromKey for Key {
    fn of(b: &[u8]) -> Self {
        Key::of(b)
    }
}

impl<K> KeysAs<K> {
    /// The seed (it holds nothing).
    pub(super) const SEED: Self = KeysAs(PhantomData);
}

impl<'de, K: FromKey> DeserializeSeed<'de> for KeysAs<K> {
    type Value = K;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<K, D::Error> {
        // serde_json reads an identifier as a string; the fast walk's scanner hands an ASCII key
        // over as bytes (checked: ASCII is UTF-8), sparing a call to `std::str::from_utf8`.
        d.deserialize_identifier(self)
    }
}

impl<K: FromKey> Visitor<'_> for KeysAs<K> {
    type Value = K;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<K, E> {
        Ok(K::of(v.as_bytes()))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<K, E> {
        Ok(K::of(v))
    }
}

/// Reads the value of the current key with `shape`.
pub(super) fn value<'de, A: MapAccess<'de>, S: Shape<'de>>(
    a: &mut A,
    shape: S,
) -> Result<S::Out, A::Error> {
    a.next_value_seed(Seed(shape))
}

/// Reads the value of the current key with a shape that counts strings: through [`RawSeed`] if `raw`.
pub(super) fn read_text<'de, A: MapAccess<'de>, S: Shape<'de>>(
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
pub(super) fn sum_res<'de, A: SeqAccess<'de>, S: Shape<'de, Out = Res<u64>> + Copy>(
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
pub(super) fn sum<'de, A: SeqAccess<'de>, S: Shape<'de, Out = u64> + Copy>(
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
pub(super) struct Ignore;

impl Shape<'_> for Ignore {
    type Out = ();
    fn other(self) {}
}

/// A string's tokens; None for anything else.
#[derive(Clone, Copy)]
pub(super) struct Str;

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

/// Bytes of JSON text per token in [`Size`]: o200k has about 4 bytes per token in English, 3 in code,
/// base64 and CJK (one token per ideograph); 3 errs high.
pub const SIZE_BYTES_PER_TOKEN: u64 = 3;

/// Any value, estimated from the size of its JSON text (for the fields of content parts of a type the
/// walk does not know): a string by its bytes ([`SIZE_BYTES_PER_TOKEN`] per token, rounded up) plus
/// 1 for its quotes and separator, a number, boolean or null 2, an array or object 1 plus its
/// elements, each key like a string plus 1 for its colon. JSON text has many one-character tokens
/// (`{"`, `":`, `,"`), so this errs high rather than low.
#[derive(Clone, Copy)]
pub(super) struct Size;

impl<'de> Shape<'de> for Size {
    type Out = u64;
    fn other(self) -> u64 {
        2
    }
    fn string(self, s: &str) -> u64 {
        (s.len() as u64)
            .div_ceil(SIZE_BYTES_PER_TOKEN)
            .saturating_add(1)
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        Ok(sum(&mut a, Size)?.saturating_add(1))
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<u64, A::Error> {
        let mut t = 1u64;
        while let Some(key) = a.next_key_seed(Seed(Size))? {
            t = t
                .saturating_add(key)
                .saturating_add(1)
                .saturating_add(value(&mut a, Size)?);
        }
        Ok(t)
    }
}

/// A message `role`: its tokens (the roles the APIs know are one o200k token each; another string
/// is estimated as text); 0 for anything else.
#[derive(Clone, Copy)]
pub(super) struct Role;

impl Shape<'_> for Role {
    type Out = u64;
    fn other(self) -> u64 {
        0
    }
    fn string(self, s: &str) -> u64 {
        if known_role(s.as_bytes()) {
            1
        } else {
            text_tokens(s)
        }
    }
}

/// Whether `s` is one of the roles that cost one token ([`Role`]).
#[inline(always)]
fn known_role(s: &[u8]) -> bool {
    matches!(
        s,
        b"user" | b"assistant" | b"system" | b"developer" | b"tool" | b"function"
    )
}

/// Reads a `role` value as [`Role`] does: through [`RawRole`] if `raw` (the fast walk).
pub(super) fn read_role<'de, A: MapAccess<'de>>(a: &mut A, raw: bool) -> Result<u64, A::Error> {
    if raw {
        a.next_value_seed(RawRole)
    } else {
        value(a, Role)
    }
}

/// [`Role`] on the fast walk, without checking the UTF-8 of a known role (ASCII): a string's bytes
/// unchecked, a known role 1 and any other string counted by [`utf8_tokens`] (which checks it: an
/// invalid one is a parse error, as in [`RawSeed`]); null or an array as [`Role`]; anything else a
/// parse error (the reference walk reads it).
pub(super) struct RawRole;

impl<'de> DeserializeSeed<'de> for RawRole {
    type Value = u64;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for RawRole {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("null, a string or an array")
    }
    fn visit_none<E: de::Error>(self) -> Result<u64, E> {
        Ok(Role.null())
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_bytes(self)
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<u64, E> {
        if known_role(v) {
            return Ok(1);
        }
        utf8_tokens(v).ok_or_else(|| E::custom("invalid UTF-8 in a string"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, a: A) -> Result<u64, A::Error> {
        Role.seq(a)
    }
}

/// A string kept for later (borrowed when it has no escapes); None for anything else.
#[derive(Clone, Copy)]
pub(super) struct KeepStr;

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
pub(super) struct TypeTag;

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
pub(super) struct Flag(pub(super) &'static str);

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
pub(super) struct Count;

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
pub(super) struct IsNumber;

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
pub(super) struct Model;

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
pub(super) struct StreamOptions;

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
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
            match k {
                Key::IncludeUsage => include_usage = value(&mut a, Flag("include_usage"))?,
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(include_usage)
    }
}
