//! Content parts and blocks, shared by every API family: text, images, audio, files, tool use and
//! results, documents.

use super::shape::{
    json_tokens, read_text, sum, value, Ignore, KeepStr, Key, Seed, Shape, Size, Str, Tag, TypeTag,
    KEY_SEED,
};
use super::text::text_tokens;
use super::{
    EstimateError, Res, AUDIO_TOKENS_PER_KB, AUDIO_WAV_TOKENS_PER_KB, FILE_ID_TOKENS,
    FILE_TOKENS_PER_KB, IMAGE_LOW_TOKENS, IMAGE_TOKENS, MAX_DEPTH,
};
use serde::de::DeserializeSeed;
use serde::de::{MapAccess, SeqAccess};
use serde_json::Value;
use std::borrow::Cow;

/// A message `content`: null, a string, or an array of parts/blocks (OpenAI and Anthropic shapes).
#[derive(Clone, Copy)]
pub(super) struct Content {
    pub(super) depth: usize,
    pub(super) field: &'static str,
    /// The fast walk (see [`Top::raw`](super::top::Top::raw)).
    pub(super) raw: bool,
}

impl Content {
    pub(super) fn top(field: &'static str, raw: bool) -> Content {
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
pub(super) struct Part {
    pub(super) depth: usize,
    /// The fast walk (see [`Top::raw`](super::top::Top::raw)).
    pub(super) raw: bool,
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
        // `detail: "low"` inside chat's `image_url` object, and beside Responses' `input_image` URL.
        let mut low_in_url = false;
        let mut low_in_part = false;
        // Fields the walk has no use for, by their size (they count for a part of an unknown type).
        let mut extra = 0u64;
        let Part { depth, raw } = self;
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
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
                Key::FileId => file_id |= value(&mut a, Len)?.is_some(),
                // Responses `input_file` by URL: the provider fetches and bills the file, as a
                // `file_id`'s.
                Key::FileUrl => file_id |= value(&mut a, Len)?.is_some(),
                Key::Title => title = read_text(&mut a, raw, Str)?.unwrap_or(0),
                Key::Context => context = read_text(&mut a, raw, Str)?.unwrap_or(0),
                // Counted by their size for a part of an unknown type, as any other field.
                Key::ImageUrl => {
                    let (low, size) = value(&mut a, ImageUrl)?;
                    low_in_url |= low;
                    extra = extra.saturating_add(2).saturating_add(size);
                }
                Key::Detail => {
                    let (low, size) = value(&mut a, Detail)?;
                    low_in_part |= low;
                    extra = extra.saturating_add(2).saturating_add(size);
                }
                _ => extra = extra.saturating_add(2).saturating_add(value(&mut a, Size)?),
            }
        }
        Ok(match ty {
            // `detail: "low"` where the image's API reads it.
            Tag::ImageUrl if low_in_url => IMAGE_LOW_TOKENS,
            Tag::InputImage if low_in_part => IMAGE_LOW_TOKENS,
            Tag::Image | Tag::ImageUrl | Tag::InputImage | Tag::GeneratedImage => IMAGE_TOKENS,
            Tag::FileRef => 0,
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
            Tag::Text | Tag::FunctionCall | Tag::FunctionCallOutput => text.unwrap_or(0),
            // A part of a type the walk does not know: whatever it holds, the fields the walk
            // reads as they are counted elsewhere, the others by their size.
            Tag::Other => [
                text.unwrap_or(0),
                name.unwrap_or(0),
                thinking.unwrap_or(0),
                input.unwrap_or(0),
                content,
                source.as_ref().map_or(0, SourceParts::tokens),
                refusal.unwrap_or(0),
                audio.unwrap_or(0),
                file.unwrap_or_else(|| file_tokens(file_data, file_id)),
                title,
                context,
                extra,
            ]
            .iter()
            .fold(0u64, |t, &n| t.saturating_add(n)),
        })
    }
}

/// An image's `detail`: whether it is `"low"`, and its [`Size`].
#[derive(Clone, Copy)]
struct Detail;

impl<'de> Shape<'de> for Detail {
    type Out = (bool, u64);
    fn other(self) -> (bool, u64) {
        (false, Size.other())
    }
    fn string(self, s: &str) -> (bool, u64) {
        (s == "low", Size.string(s))
    }
    fn seq<A: SeqAccess<'de>>(self, a: A) -> Result<(bool, u64), A::Error> {
        Ok((false, Size.seq(a)?))
    }
    fn map<A: MapAccess<'de>>(self, a: A) -> Result<(bool, u64), A::Error> {
        Ok((false, Size.map(a)?))
    }
}

/// Chat's `image_url` (`{"url": …, "detail": …}`; Responses: the URL string): whether its `detail` is
/// `"low"`, and its [`Size`] (counted the same way, key by key).
#[derive(Clone, Copy)]
struct ImageUrl;

impl<'de> Shape<'de> for ImageUrl {
    type Out = (bool, u64);
    fn other(self) -> (bool, u64) {
        (false, Size.other())
    }
    fn string(self, s: &str) -> (bool, u64) {
        (false, Size.string(s))
    }
    fn seq<A: SeqAccess<'de>>(self, a: A) -> Result<(bool, u64), A::Error> {
        Ok((false, Size.seq(a)?))
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<(bool, u64), A::Error> {
        let mut t = 1u64;
        let mut low = false;
        while let Some(key) = a.next_key::<std::borrow::Cow<'de, str>>()? {
            let key_size =
                Seed(Size).deserialize(serde::de::value::StrDeserializer::<A::Error>::new(&key))?;
            let size = if key == "detail" {
                let (l, size) = value(&mut a, Detail)?;
                low |= l;
                size
            } else {
                value(&mut a, Size)?
            };
            t = t
                .saturating_add(key_size)
                .saturating_add(1)
                .saturating_add(size);
        }
        Ok((low, t))
    }
}

/// The length in bytes of a string (base64 data, ids); None for anything else.
#[derive(Clone, Copy)]
pub(super) struct Len;

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
pub(super) fn per_kb(len: u64, per_kb: u64) -> u64 {
    len.saturating_mul(per_kb).div_ceil(1024)
}

/// A file given by `file_data` (base64, size-based, see [`FILE_TOKENS_PER_KB`]) or `file_id`
/// ([`FILE_ID_TOKENS`]); the data wins when both are there, nothing is 0.
pub(super) fn file_tokens(data: Option<u64>, id: bool) -> u64 {
    match data {
        Some(len) => per_kb(len, FILE_TOKENS_PER_KB),
        None if id => FILE_ID_TOKENS,
        None => 0,
    }
}

/// `input_audio`: `{"data": "<base64>", "format": "wav" | "mp3" | …}`, costed by the size of its data
/// (see [`AUDIO_TOKENS_PER_KB`], [`AUDIO_WAV_TOKENS_PER_KB`]); None for anything else.
#[derive(Clone, Copy)]
pub(super) struct Audio;

impl<'de> Shape<'de> for Audio {
    type Out = Option<u64>;
    fn other(self) -> Option<u64> {
        None
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Option<u64>, A::Error> {
        let mut len = 0;
        let mut wav = false;
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
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
pub(super) struct AudioFormat;

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
pub(super) struct FilePart;

impl<'de> Shape<'de> for FilePart {
    type Out = Option<u64>;
    fn other(self) -> Option<u64> {
        None
    }
    fn map<A: MapAccess<'de>>(self, mut a: A) -> Result<Option<u64>, A::Error> {
        let mut data = None;
        let mut id = false;
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
            match k {
                Key::FileData => data = value(&mut a, Len)?,
                Key::FileId => id = value(&mut a, Len)?.is_some(),
                _ => value(&mut a, Ignore)?,
            }
        }
        Ok(Some(file_tokens(data, id)))
    }
}

/// The `content` of a tool result block: a string or blocks; 0 for anything else.
#[derive(Clone, Copy)]
pub(super) struct ToolResultContent {
    pub(super) depth: usize,
    /// The fast walk (see [`Top::raw`](super::top::Top::raw)).
    pub(super) raw: bool,
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
    /// One block as an object (Anthropic's server-tool results: `code_execution_result` with its
    /// `stdout`, `web_fetch_result` with its document): counted as a part.
    fn map<A: MapAccess<'de>>(self, a: A) -> Result<u64, A::Error> {
        Part {
            depth: self.depth.saturating_add(1),
            raw: self.raw,
        }
        .map(a)
    }
}

/// A document `source`: whether its `type` is "text", and its `data` string (kept, not yet counted).
#[derive(Clone, Copy)]
pub(super) struct Source {
    pub(super) depth: usize,
    /// The fast walk (see [`Top::raw`](super::top::Top::raw)).
    pub(super) raw: bool,
}

/// What a document `source` holds, costed once its `type` is known (it may come last).
pub(super) struct SourceParts<'de> {
    /// `type`, when a string.
    pub(super) ty: Option<Cow<'de, str>>,
    /// `data` (text, or base64), kept until the type is known.
    pub(super) data: Option<Cow<'de, str>>,
    /// Tokens of `content` (a `content` source: a string or text blocks).
    pub(super) content: u64,
}

impl<'de> SourceParts<'de> {
    /// Tokens of the document: its text; base64 (PDF) by size like a file; a `url` or `file` source
    /// (not seen by the filter) like a file id; blocks of a `content` source by their text.
    pub(super) fn tokens(&self) -> u64 {
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
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
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
