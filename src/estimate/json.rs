//! The fast walk's JSON reader: a strict scanner over the body bytes that drives the same [`Shape`]
//! visitors as serde_json does (it is a `serde::Deserializer`), so the estimate cannot depend on which
//! of the two read the body.
//!
//! It accepts a subset of what serde_json accepts and gives up ([`Bail`]) on anything else or anything
//! it is not sure of: a syntax or UTF-8 error, a control character in a string, a lone surrogate, a
//! number it does not parse itself that serde_json does not parse either (`1e400`), nesting as deep as
//! serde_json's recursion limit, a value of a type a `deserialize_*` call does not take. The caller then
//! reads the body again with serde_json (the reference walk), which gives the result or the error
//! message. Within that subset it makes the same visitor calls as serde_json, with the same values:
//! numbers other than plain non-negative integers are parsed by serde_json itself.
//!
//! What it does differently is speed. Escapes far apart (prose) are found with a search that compilers
//! turn into vector instructions; close together (code, tables, JSON-in-a-string: an escape every
//! ten bytes or so), a window of 64 bytes is looked at at a time, the positions of its quotes,
//! backslashes and control characters found as one bit mask (from 16-byte vector compares where the
//! target has them), so that the work per escape is a few instructions that do not wait on one
//! another (serde_json finds each escape from the last and pays a `memcpy` call
//! and a dispatch for it). Short pieces between escapes are copied as one 16-byte block. Plain ASCII
//! keys are handed over as bytes, without a call to `std::str::from_utf8`. Strings are checked for
//! UTF-8 where serde_json checks them (every string but the counted ones, which
//! [`super::text::utf8_tokens`] checks as it counts them). The parsing is kept out of the generic visitor
//! code, so that the wasm build does not carry a copy of it per visitor.
//!
//! [`Shape`]: super::shape::Shape

use super::escapes::{
    copy, escapes, find_special, flush, piece, piece_then, special_bits, special_mask,
    unescape_one, ESCAPES, HELD, HI, PIECE, TMP, WINDOW,
};
pub(super) use super::escapes::{Bail, Res};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// Deepest nesting of arrays and objects accepted. serde_json counts down from 128 on entering each
/// array or object and fails on reaching 0, i.e. at the 128th level; so does this scanner.
const MAX_NESTING: u32 = 127;

/// A JSON reader over one body.
pub(super) struct Scanner<'de> {
    bytes: &'de [u8],
    /// Index of the next byte to read.
    pos: usize,
    /// Arrays and objects open around `pos`.
    depth: u32,
    /// Where escaped strings are unescaped.
    scratch: Vec<u8>,
}

/// Largest scratch buffer kept for the next body (see [`spare_scratch`]).
const SPARE_MAX: usize = 256 << 10;

thread_local! {
    /// The scratch buffer of the last body that unescaped a string, if at most [`SPARE_MAX`] bytes.
    static SPARE: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// An empty scratch buffer with room for `room` bytes: the one an earlier body left (no `malloc`
/// and `free` a body) if it is large enough, else a new one (not `reserve`'s growth path).
fn spare_scratch(room: usize) -> Vec<u8> {
    let spare = SPARE.with(std::cell::Cell::take);
    if spare.capacity() >= room {
        spare
    } else {
        Vec::with_capacity(room)
    }
}

impl Drop for Scanner<'_> {
    /// Leaves the scratch buffer (empty) for the next body's [`spare_scratch`], if not too large.
    fn drop(&mut self) {
        let mut scratch = std::mem::take(&mut self.scratch);
        if (1..=SPARE_MAX).contains(&scratch.capacity()) {
            scratch.clear();
            SPARE.with(|s| s.set(scratch));
        }
    }
}

/// A string's bytes: borrowed from the body (no escapes) or unescaped in the scratch buffer.
enum Text<'de, 's> {
    Body(&'de [u8]),
    Scratch(&'s [u8]),
}

/// [`Text`] checked for UTF-8.
enum Str<'de, 's> {
    Body(&'de str),
    Scratch(&'s str),
}

/// A number as serde_json reads it: a non-negative integer, a negative one, or a float.
enum Number {
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'de> Scanner<'de> {
    pub(super) fn new(bytes: &'de [u8]) -> Scanner<'de> {
        Scanner {
            bytes,
            pos: 0,
            depth: 0,
            scratch: Vec::new(),
        }
    }

    /// Only whitespace left after the value.
    pub(super) fn end(&mut self) -> Res<()> {
        match self.peek_token() {
            None => Ok(()),
            Some(_) => Err(Bail),
        }
    }

    /// Skips whitespace; the next byte (not consumed).
    #[inline(always)]
    fn peek_token(&mut self) -> Option<u8> {
        loop {
            let b = *self.bytes.get(self.pos)?;
            if b > b' ' || !matches!(b, b' ' | b'\n' | b'\t' | b'\r') {
                return Some(b);
            }
            self.pos += 1;
        }
    }

    /// Skips whitespace and consumes `byte`, or fails.
    #[inline(always)]
    fn expect(&mut self, byte: u8) -> Res<()> {
        if self.peek_token() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Bail)
        }
    }

    /// Consumes `word` (the rest of `null`, `true`, `false`).
    #[inline(always)]
    fn ident(&mut self, word: &[u8]) -> Res<()> {
        let end = self.pos + word.len();
        if self.bytes.get(self.pos..end) == Some(word) {
            self.pos = end;
            Ok(())
        } else {
            Err(Bail)
        }
    }

    /// Enters an array or object (its opening bracket consumed).
    #[inline(always)]
    fn enter(&mut self) -> Res<()> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(Bail);
        }
        Ok(())
    }

    /// A number starting at `pos` (a digit or `-`), as serde_json's `deserialize_any` reads it.
    #[inline(never)]
    fn number(&mut self) -> Res<Number> {
        let start = self.pos;
        // Plain non-negative integers of up to 19 digits (below 10^19 < 2^64) without a leading zero.
        let mut n = 0u64;
        let mut i = start;
        while let Some(&b) = self.bytes.get(i) {
            let d = b.wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            n = n.wrapping_mul(10).wrapping_add(u64::from(d));
            i += 1;
        }
        let digits = i - start;
        let plain = !matches!(self.bytes.get(i), Some(b'.' | b'e' | b'E' | b'-' | b'+'));
        if plain
            && (1..=19).contains(&digits)
            && (digits == 1 || self.bytes.get(start) != Some(&b'0'))
        {
            self.pos = i;
            return Ok(Number::U64(n));
        }
        // Anything else: the bytes that can belong to a number, parsed by serde_json alone (which
        // rejects them unless they are exactly one number: then it is the number serde_json reads in
        // place, as its number grammar is greedy).
        while let Some(b'0'..=b'9' | b'.' | b'e' | b'E' | b'-' | b'+') = self.bytes.get(i) {
            i += 1;
        }
        let token = self.bytes.get(start..i).ok_or(Bail)?;
        let number: serde_json::Number = serde_json::from_slice(token).map_err(|_| Bail)?;
        self.pos = i;
        if let Some(u) = number.as_u64() {
            Ok(Number::U64(u))
        } else if let Some(i) = number.as_i64() {
            Ok(Number::I64(i))
        } else {
            number.as_f64().map(Number::F64).ok_or(Bail)
        }
    }

    /// Reads a string whose opening quote is consumed; its bytes, unescaped (not checked for UTF-8).
    #[inline(always)]
    fn string(&mut self) -> Res<Text<'de, '_>> {
        let bytes = self.bytes;
        let start = self.pos;
        let i = find_special(bytes, start);
        match bytes.get(i) {
            Some(b'"') => {
                self.pos = i + 1;
                Ok(Text::Body(bytes.get(start..i).ok_or(Bail)?))
            }
            Some(b'\\') => self.unescape(start, i).map(Text::Scratch),
            _ => Err(Bail),
        }
    }

    /// Reads a string checked for UTF-8 (where serde_json checks it).
    #[inline(never)]
    fn text(&mut self) -> Res<Str<'de, '_>> {
        Ok(match self.string()? {
            Text::Body(b) => Str::Body(std::str::from_utf8(b).map_err(|_| Bail)?),
            Text::Scratch(b) => Str::Scratch(std::str::from_utf8(b).map_err(|_| Bail)?),
        })
    }

    /// A key (its opening quote consumed) that is ASCII without escapes (most), read; else None,
    /// nothing read.
    #[inline(always)]
    fn ascii_key(&mut self) -> Res<Option<&'de [u8]>> {
        let start = self.pos;
        // Most keys end within 16 bytes: their end and whether they are ASCII from two words (no
        // search in blocks, no separate ASCII test).
        if let Some(block) = self.bytes.get(start..).and_then(<[u8]>::first_chunk::<16>) {
            let x = u128::from_le_bytes(*block);
            // The lowest set bit of each word's mask is exact, so the lowest of the two is too.
            let m = u128::from(special_mask(x as u64))
                | u128::from(special_mask((x >> 64) as u64)) << 64;
            if m != 0 {
                let len = (m.trailing_zeros() / 8) as usize;
                return match block.get(len) {
                    Some(b'"') => {
                        // The high bits of the bytes before the quote (`len` ≤ 15).
                        let before = (1u128 << (8 * len)) - 1;
                        if x & before & (u128::from(HI) << 64 | u128::from(HI)) != 0 {
                            return Ok(None);
                        }
                        self.pos = start + len + 1;
                        Ok(Some(block.get(..len).ok_or(Bail)?))
                    }
                    Some(b'\\') => Ok(None),
                    _ => Err(Bail),
                };
            }
        }
        self.long_ascii_key()
    }

    /// [`Scanner::ascii_key`] of a key that does not end within 16 bytes (or near the body's end):
    /// out of line, so that the common case needs fewer registers.
    #[cold]
    #[inline(never)]
    fn long_ascii_key(&mut self) -> Res<Option<&'de [u8]>> {
        let start = self.pos;
        let i = find_special(self.bytes, start);
        match self.bytes.get(i) {
            Some(b'"') => {
                let key = self.bytes.get(start..i).ok_or(Bail)?;
                if key.is_ascii() {
                    self.pos = i + 1;
                    return Ok(Some(key));
                }
                Ok(None)
            }
            Some(b'\\') => Ok(None),
            _ => Err(Bail),
        }
    }

    /// Visits a string checked for UTF-8.
    #[inline(always)]
    fn checked_str<V: Visitor<'de>>(&mut self, visitor: V) -> Res<V::Value> {
        match self.text()? {
            Str::Body(s) => visitor.visit_borrowed_str(s),
            Str::Scratch(s) => visitor.visit_str(s),
        }
    }

    /// Reads a string not checked for UTF-8.
    #[inline(always)]
    fn bytes(&mut self) -> Res<Text<'de, '_>> {
        self.string()
    }

    /// The rest of a string from `start` whose first escape is at `esc`: unescaped into the scratch
    /// buffer; the unescaped bytes.
    ///
    /// Escapes far apart are found one after the other. Where several in a row are close together
    /// the body is looked at in windows of 64 bytes at fixed steps: a bit mask of the quotes,
    /// backslashes and control characters in a window does not depend on the escapes before it, so
    /// the work per escape is a few instructions without a long chain of dependent ones (finding the
    /// next escape from the last one costs more than handling it, then).
    #[inline(never)]
    fn unescape(&mut self, start: usize, esc: usize) -> Res<&[u8]> {
        let bytes = self.bytes;
        let out = &mut self.scratch;
        out.clear();
        // Room for the longest the string can be unescaped (the rest of the body): no reallocation
        // below, and no bytes to set beforehand. The first time, an earlier body's buffer if it has the
        // room, else allocated as that (a later string starts later and needs less), without
        // `reserve`'s growth path.
        let room = bytes.len() - start + PIECE;
        if out.capacity() == 0 {
            *out = spare_scratch(room);
        } else {
            out.reserve(room);
        }
        out.extend_from_slice(bytes.get(start..esc).ok_or(Bail)?);
        // Bytes before `r` are copied or unescaped. Escapes far apart (most text) are found one
        // after the other; close together (code, JSON), a window at a time (`base`: where the
        // window starts; an escape that began before it may reach 11 bytes into it).
        let mut r = esc;
        let mut at = esc;
        let mut base = esc;
        let mut windows = false;
        // Escapes found one at a time in a row less than a window apart.
        let mut close = 0;
        // In windows, the bytes are first written to `tmp` (a stack array, its index in a
        // register, so that a piece and an escape cost no `Vec` length and capacity updates), and
        // appended to `out` from time to time: the text is `out` then `tmp[..o]`.
        let mut tmp = [0u8; TMP];
        let mut o = 0usize;
        loop {
            if !windows {
                copy(bytes, r, at, out)?;
                match bytes.get(at) {
                    Some(b'\\') => r = unescape_one(bytes, at, out)?,
                    Some(b'"') => {
                        self.pos = at + 1;
                        return Ok(self.scratch.as_slice());
                    }
                    _ => return Err(Bail),
                }
                at = find_special(bytes, r);
                close = if at - r < WINDOW { close + 1 } else { 0 };
                if close > 2 {
                    windows = true;
                    base = r;
                    close = 0;
                }
                continue;
            }
            // The window and the 64 bytes after it (the byte after an escape at its end, and the
            // fixed-size copies of pieces, are read from it without a bounds check).
            let Some(w) = bytes
                .get(base..)
                .and_then(<[u8]>::first_chunk::<{ 2 * WINDOW }>)
            else {
                flush(&tmp, &mut o, out);
                // The last bytes of the body, one at a time.
                loop {
                    match *bytes.get(r).ok_or(Bail)? {
                        b'\\' => r = unescape_one(bytes, r, out)?,
                        b'"' => {
                            self.pos = r + 1;
                            return Ok(self.scratch.as_slice());
                        }
                        b if b < 0x20 => return Err(Bail),
                        b => {
                            out.push(b);
                            r += 1;
                        }
                    }
                }
            };
            // Bytes of the window before `rel` are copied or unescaped (`r` ≥ `base`: the window
            // before was copied to its end; an escape that began there may reach 11 bytes in).
            // Bounded for the compiler too (`min`: the escapes below keep it ≤ 65), so that the
            // skip mask needs no test and pieces are read from `rel` without a mask.
            let mut rel = (r - base).min(WINDOW - 1);
            let window = w.first_chunk::<WINDOW>().unwrap_or(&[0; WINDOW]);
            let mut special = special_bits(window) & (u64::MAX << rel);
            // Back to one escape at a time after a window without one (a window with one costs
            // less than finding it alone: rows of a table, lines of code).
            windows = special != 0;
            // `tmp` holds less than a window's bytes from the windows before (it is flushed when it
            // holds more) and what this one unescaped: `o` < 64 + `rel` < `HELD` wherever it is
            // written to.
            //
            // First the escapes as if every special byte were a backslash (in a run of them every
            // second one begins an escape): each checked to be a backslash with a simple escape's
            // code, the byte after it cleared with the escape's bit. At the first that is not (a
            // quote, a control character, `\u`), the loop after this one reads on from there.
            let mut starts = escapes(special);
            while starts != 0 {
                let k = starts.trailing_zeros() as usize;
                // `k` < 64: the byte and the next are in `w`.
                let b = w.get(k).copied().unwrap_or(0);
                let code = w.get(k + 1).copied().unwrap_or(0);
                let simple = ESCAPES.get(usize::from(code)).copied().unwrap_or(0);
                if b != b'\\' || simple == 0 {
                    special &= u64::MAX << k;
                    break;
                }
                o = piece_then(w, rel, k, &mut tmp, o, simple);
                rel = k + 2;
                starts &= starts - 1;
            }
            if starts == 0 {
                special = 0;
            }
            while special != 0 {
                let k = special.trailing_zeros() as usize;
                o = piece(w, rel, k, &mut tmp, o);
                // `k` < 64: the byte and the next are in `w`.
                let b = w.get(k).copied().unwrap_or(0);
                let code = w.get(k + 1).copied().unwrap_or(0);
                let simple = ESCAPES.get(usize::from(code)).copied().unwrap_or(0);
                if b == b'\\' && simple != 0 {
                    if let Some(slot) = tmp.get_mut(o & (HELD - 1)) {
                        *slot = simple;
                    }
                    o += 1;
                    rel = k + 2;
                    // The backslash and the byte after it (perhaps a quote or backslash).
                    special &= !(3 << k);
                    continue;
                }
                flush(&tmp, &mut o, out);
                let at = base + k;
                match b {
                    b'\\' => {
                        r = unescape_one(bytes, at, out)?;
                        rel = r - base;
                        special &= u64::MAX
                            .checked_shl(u32::try_from(rel).unwrap_or(64))
                            .unwrap_or(0);
                    }
                    b'"' => {
                        self.pos = at + 1;
                        return Ok(self.scratch.as_slice());
                    }
                    _ => return Err(Bail),
                }
            }
            if windows && rel < WINDOW {
                // The rest of the window (the next one starts after it).
                o = piece(w, rel, WINDOW, &mut tmp, o);
                rel = WINDOW;
            }
            if !windows || o >= WINDOW {
                flush(&tmp, &mut o, out);
            }
            r = base + rel;
            base += WINDOW;
            if !windows {
                at = find_special(bytes, r.max(base));
            }
        }
    }
}

/// Implements the `deserialize_*` methods that the visitors never call: the scanner gives up.
macro_rules! bail {
    ($($method:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, _visitor: V) -> Res<V::Value> {
                Err(Bail)
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for &mut Scanner<'de> {
    type Error = Bail;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        match self.peek_token().ok_or(Bail)? {
            b'"' => {
                self.pos += 1;
                self.checked_str(visitor)
            }
            b'{' => {
                self.pos += 1;
                self.map(visitor)
            }
            b'[' => {
                self.pos += 1;
                self.seq(visitor)
            }
            b'-' | b'0'..=b'9' => match self.number()? {
                Number::U64(u) => visitor.visit_u64(u),
                Number::I64(i) => visitor.visit_i64(i),
                Number::F64(f) => visitor.visit_f64(f),
            },
            b'n' => {
                self.pos += 1;
                self.ident(b"ull")?;
                visitor.visit_unit()
            }
            b't' => {
                self.pos += 1;
                self.ident(b"rue")?;
                visitor.visit_bool(true)
            }
            b'f' => {
                self.pos += 1;
                self.ident(b"alse")?;
                visitor.visit_bool(false)
            }
            _ => Err(Bail),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        if self.peek_token() == Some(b'n') {
            self.pos += 1;
            self.ident(b"ull")?;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    /// A string's bytes unchecked (as serde_json's `deserialize_bytes`), or an array.
    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        match self.peek_token() {
            Some(b'"') => {
                self.pos += 1;
                match self.bytes()? {
                    Text::Body(b) => visitor.visit_borrowed_bytes(b),
                    Text::Scratch(b) => visitor.visit_bytes(b),
                }
            }
            Some(b'[') => {
                self.pos += 1;
                self.seq(visitor)
            }
            _ => Err(Bail),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        if self.peek_token() == Some(b'"') {
            self.pos += 1;
            self.checked_str(visitor)
        } else {
            Err(Bail)
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        self.deserialize_any(visitor)
    }

    bail! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_f32 deserialize_f64
        deserialize_char deserialize_unit deserialize_seq deserialize_map deserialize_identifier
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, _: V) -> Res<V::Value> {
        Err(Bail)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, _: V) -> Res<V::Value> {
        Err(Bail)
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, _: V) -> Res<V::Value> {
        Err(Bail)
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        _: V,
    ) -> Res<V::Value> {
        Err(Bail)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Res<V::Value> {
        Err(Bail)
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Res<V::Value> {
        Err(Bail)
    }
}

impl<'de> Scanner<'de> {
    /// An array whose `[` is consumed: the visitor reads it, then the `]` must follow.
    fn seq<V: Visitor<'de>>(&mut self, visitor: V) -> Res<V::Value> {
        self.enter()?;
        let value = visitor.visit_seq(Elements {
            de: self,
            first: true,
        })?;
        self.expect(b']')?;
        self.depth -= 1;
        Ok(value)
    }

    /// An object whose `{` is consumed: the visitor reads it, then the `}` must follow.
    fn map<V: Visitor<'de>>(&mut self, visitor: V) -> Res<V::Value> {
        self.enter()?;
        let value = visitor.visit_map(Entries {
            de: self,
            first: true,
        })?;
        self.expect(b'}')?;
        self.depth -= 1;
        Ok(value)
    }
}

/// The elements of an array.
struct Elements<'a, 'de> {
    de: &'a mut Scanner<'de>,
    first: bool,
}

impl<'de> SeqAccess<'de> for Elements<'_, 'de> {
    type Error = Bail;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Res<Option<T::Value>> {
        match self.de.peek_token() {
            Some(b']') => return Ok(None),
            // After a comma a value must follow (`]` there fails in `deserialize_*`).
            Some(b',') if !self.first => self.de.pos += 1,
            Some(_) if self.first => {}
            _ => return Err(Bail),
        }
        self.first = false;
        seed.deserialize(&mut *self.de).map(Some)
    }
}

/// The entries of an object.
struct Entries<'a, 'de> {
    de: &'a mut Scanner<'de>,
    first: bool,
}

impl<'de> MapAccess<'de> for Entries<'_, 'de> {
    type Error = Bail;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Res<Option<K::Value>> {
        match self.de.peek_token() {
            Some(b'}') => return Ok(None),
            Some(b',') if !self.first => {
                self.de.pos += 1;
                if self.de.peek_token() != Some(b'"') {
                    return Err(Bail);
                }
            }
            Some(b'"') if self.first => {}
            _ => return Err(Bail),
        }
        self.first = false;
        self.de.pos += 1;
        seed.deserialize(Key { de: &mut *self.de }).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Res<V::Value> {
        self.de.expect(b':')?;
        seed.deserialize(&mut *self.de)
    }
}

/// An object key (its opening quote consumed): a string, whatever type is asked for (as serde_json's
/// keys for the requests the visitors make: `deserialize_str`, `deserialize_any`).
struct Key<'a, 'de> {
    de: &'a mut Scanner<'de>,
}

impl<'de> de::Deserializer<'de> for Key<'_, 'de> {
    type Error = Bail;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        self.de.checked_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        self.de.checked_str(visitor)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        self.de.checked_str(visitor)
    }

    /// ASCII keys as bytes (ASCII is UTF-8: checking it is checking the key), others as strings.
    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        match self.de.ascii_key()? {
            Some(key) => visitor.visit_borrowed_bytes(key),
            None => self.de.checked_str(visitor),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        self.de.checked_str(visitor)
    }

    bail! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_f32 deserialize_f64
        deserialize_char deserialize_unit deserialize_seq deserialize_map deserialize_option
        deserialize_bytes deserialize_byte_buf
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, _: V) -> Res<V::Value> {
        Err(Bail)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, _: V) -> Res<V::Value> {
        Err(Bail)
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, _: V) -> Res<V::Value> {
        Err(Bail)
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        _: V,
    ) -> Res<V::Value> {
        Err(Bail)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Res<V::Value> {
        Err(Bail)
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Res<V::Value> {
        Err(Bail)
    }
}
