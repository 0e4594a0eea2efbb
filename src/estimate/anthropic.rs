//! Anthropic messages: the message framing (a document `source` is read as a part, see
//! [`super::parts::Source`]).

use super::parts::Content;
use super::shape::{read_text, value, Ignore, Key, Shape, KEY_SEED};
use super::{EstimateError, Res, MESSAGE_OVERHEAD};
use serde::de::MapAccess;

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
        while let Some(k) = a.next_key_seed(KEY_SEED)? {
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
