//! Legacy completions' `prompt` and embeddings' `input`: strings, arrays of strings, token ids.

use super::shape::{sum_res, IsNumber, Seed, Shape};
use super::text::text_tokens;
use super::{EstimateError, Res};
use serde::de::SeqAccess;

/// `prompt` / `input`: a string, array of strings, array of token ids, or array of arrays of token ids.
#[derive(Clone, Copy)]
pub(super) struct IdsOrText(pub(super) &'static str);

impl<'de> Shape<'de> for IdsOrText {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField(self.0))
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
        sum_res(&mut a, IdsOrTextItem(self.0))
    }
}

/// One element of `prompt` / `input`: a string, a token id, or an array of token ids.
#[derive(Clone, Copy)]
pub(super) struct IdsOrTextItem(pub(super) &'static str);

impl<'de> Shape<'de> for IdsOrTextItem {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField(self.0))
    }
    fn string(self, s: &str) -> Res<u64> {
        Ok(text_tokens(s))
    }
    fn unsigned(self, _n: u64) -> Res<u64> {
        Ok(1)
    }
    fn number(self) -> Res<u64> {
        Ok(1)
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let mut ids = 0u64;
        let mut all_numbers = true;
        while let Some(is_number) = a.next_element_seed(Seed(IsNumber))? {
            ids = ids.saturating_add(1);
            all_numbers &= is_number;
        }
        Ok(if all_numbers { Ok(ids) } else { self.other() })
    }
}
