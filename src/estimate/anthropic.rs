//! Anthropic messages: the message framing and document sources (their text, base64 by size, or a
//! fixed cost for a source the filter cannot see).

use super::parts::{file_tokens, per_kb, Content, ToolResultContent};
use super::shape::{read_text, value, Ignore, KeepStr, Key, KeySeed, Shape};
use super::text::text_tokens;
use super::{EstimateError, Res, FILE_ID_TOKENS, FILE_TOKENS_PER_KB, MESSAGE_OVERHEAD};
use serde::de::MapAccess;
use std::borrow::Cow;

/// One Anthropic message: overhead and `content`.
#[derive(Clone, Copy)]
pub(super) struct AnthropicMessage {
    pub(super) raw: bool,
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
