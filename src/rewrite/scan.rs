//! A strict JSON scanner that finds where the members of an object sit in the body bytes, so that
//! [`super`] can splice new values in without touching any other byte.
//!
//! It reads no values into memory: it checks the grammar and finds the spans. It refuses everything
//! serde_json refuses when it reads a `serde_json::Value` (the reference the filter and the property
//! test hold it to): a syntax error, a raw control character or invalid UTF-8 in a string, a bad escape,
//! a lone surrogate (`"\ud800"`), a number serde_json cannot represent (`1e400`: numbers other than
//! short integers are handed to serde_json itself), trailing bytes, nesting of 128 levels or more
//! (serde_json's recursion limit). On refusal the caller reports an error and edits nothing.
//!
//! ```text
//! { "model" : "gpt-4.1", "stream":true }
//!   ^start    ^value^     ^     ^value^ ^close
//! ```
//! A [`Member`] records where its key starts (the opening quote), the key's raw bytes (between the
//! quotes, escapes not decoded) and its value's span.

use std::ops::Range;

/// serde_json fails when it enters the 128th nested array or object; so does the scanner.
const MAX_NESTING: u32 = 127;

/// Why the scanner refused the bytes, with the byte offset where it noticed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScanError {
    /// What is wrong.
    pub what: &'static str,
    /// Byte offset in the body.
    pub at: usize,
}

type Res<T> = Result<T, ScanError>;

/// One member of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// Offset of the key's opening quote.
    pub start: usize,
    /// The key's raw bytes, between its quotes (escapes not decoded).
    pub key: Range<usize>,
    /// The value's bytes.
    pub value: Range<usize>,
}

/// An object's members in body order (duplicates included) and its braces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Object {
    /// Offset of `{`.
    pub open: usize,
    /// Offset of `}`.
    pub close: usize,
    /// Members in the order they appear.
    pub members: Vec<Member>,
}

/// What kind of document the body is.
pub(crate) enum Document {
    /// A JSON object: its top-level members.
    Object(Object),
    /// Valid JSON, but not an object.
    NotObject,
}

/// Checks the whole body and returns its top-level members.
pub(crate) fn document(bytes: &[u8]) -> Res<Document> {
    let mut s = Scanner::new(bytes);
    let doc = match s.peek() {
        Some(b'{') => Document::Object(s.object()?),
        Some(_) => {
            s.value()?;
            Document::NotObject
        }
        None => return Err(s.error("empty body")),
    };
    if s.peek().is_some() {
        return Err(s.error("trailing characters"));
    }
    Ok(doc)
}

/// The members of the object whose value span is `value` in a body [`document`] accepted; `None`
/// when that value is not an object.
pub(crate) fn object_at(bytes: &[u8], value: &Range<usize>) -> Option<Object> {
    if bytes.get(value.start) != Some(&b'{') {
        return None;
    }
    let mut s = Scanner::new(bytes);
    s.pos = value.start;
    s.object().ok()
}

/// The decoded key of `m` equals `name`. Keys without escapes (almost all) are compared as bytes.
pub(crate) fn key_is(bytes: &[u8], m: &Member, name: &str) -> bool {
    let raw = bytes.get(m.key.clone()).unwrap_or_default();
    if !raw.contains(&b'\\') {
        return raw == name.as_bytes();
    }
    decode(raw).is_some_and(|k| k == name)
}

/// The decoded text of a string value span (quotes included); `None` if it is not a string.
pub(crate) fn string_value(bytes: &[u8], value: &Range<usize>) -> Option<String> {
    let raw = bytes.get(value.clone())?;
    let inner = raw.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    decode(inner)
}

/// Decodes the escapes of a string's raw bytes (already checked by the scanner).
fn decode(raw: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while let Some(&b) = raw.get(i) {
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        let e = *raw.get(i + 1)?;
        let simple = match e {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'/' => Some(b'/'),
            b'b' => Some(8),
            b'f' => Some(12),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            _ => None,
        };
        if let Some(c) = simple {
            out.push(c);
            i += 2;
            continue;
        }
        let (c, len) = unicode_escape(raw, i).ok()?;
        let mut buf = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        i += len;
    }
    String::from_utf8(out).ok()
}

/// The scanner's position in one body.
struct Scanner<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Arrays and objects open around `pos`.
    depth: u32,
    /// Bit `d` set: the container at depth `d + 1` is an object (else an array).
    objects: u128,
}

impl<'a> Scanner<'a> {
    fn new(bytes: &'a [u8]) -> Scanner<'a> {
        Scanner {
            bytes,
            pos: 0,
            depth: 0,
            objects: 0,
        }
    }

    #[cold]
    fn error(&self, what: &'static str) -> ScanError {
        ScanError { what, at: self.pos }
    }

    /// Skips whitespace; the next byte (not consumed).
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes.get(self.pos) {
            if !matches!(b, b' ' | b'\n' | b'\t' | b'\r') {
                return Some(b);
            }
            self.pos += 1;
        }
        None
    }

    /// Skips whitespace and consumes `byte`.
    #[inline(always)]
    fn expect(&mut self, byte: u8, what: &'static str) -> Res<()> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error(what))
        }
    }

    /// Opens a container (its bracket consumed).
    fn enter(&mut self, object: bool) -> Res<()> {
        if self.depth >= MAX_NESTING {
            return Err(self.error("nesting too deep"));
        }
        let bit = 1u128 << self.depth;
        if object {
            self.objects |= bit;
        } else {
            self.objects &= !bit;
        }
        self.depth += 1;
        Ok(())
    }

    /// The innermost open container is an object.
    fn in_object(&self) -> bool {
        self.depth
            .checked_sub(1)
            .is_some_and(|d| self.objects & (1u128 << d) != 0)
    }

    /// The object at `pos` (after whitespace), its members recorded; every value checked.
    fn object(&mut self) -> Res<Object> {
        let open = self.pos;
        self.expect(b'{', "expected '{'")?;
        self.enter(true)?;
        let mut members = Vec::new();
        if self.peek() == Some(b'}') {
            let close = self.pos;
            self.pos += 1;
            self.depth -= 1;
            return Ok(Object {
                open,
                close,
                members,
            });
        }
        loop {
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a key"));
            }
            let start = self.pos;
            self.pos += 1;
            self.string()?;
            let key = start + 1..self.pos - 1;
            self.expect(b':', "expected ':'")?;
            self.peek();
            let vstart = self.pos;
            self.value()?;
            members.push(Member {
                start,
                key,
                value: vstart..self.pos,
            });
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    let close = self.pos;
                    self.pos += 1;
                    self.depth -= 1;
                    return Ok(Object {
                        open,
                        close,
                        members,
                    });
                }
                _ => return Err(self.error("expected ',' or '}'")),
            }
        }
    }

    /// Skips one value at `pos` (after whitespace), checking it; iterative, bounded by `MAX_NESTING`.
    fn value(&mut self) -> Res<()> {
        let base = self.depth;
        loop {
            // A value is expected here.
            match self.peek() {
                Some(b'{') => {
                    self.pos += 1;
                    self.enter(true)?;
                    if self.peek() == Some(b'}') {
                        self.pos += 1;
                        self.depth -= 1;
                    } else {
                        self.key()?;
                        continue;
                    }
                }
                Some(b'[') => {
                    self.pos += 1;
                    self.enter(false)?;
                    if self.peek() == Some(b']') {
                        self.pos += 1;
                        self.depth -= 1;
                    } else {
                        continue;
                    }
                }
                Some(b'"') => {
                    self.pos += 1;
                    self.string()?;
                }
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(b'n') => self.literal(b"null")?,
                Some(b'-' | b'0'..=b'9') => self.number()?,
                _ => return Err(self.error("expected a value")),
            }
            // After a value: close containers until one continues with a comma.
            loop {
                if self.depth == base {
                    return Ok(());
                }
                let object = self.in_object();
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        if object {
                            self.key()?;
                        }
                        break;
                    }
                    Some(b'}') if object => {
                        self.pos += 1;
                        self.depth -= 1;
                    }
                    Some(b']') if !object => {
                        self.pos += 1;
                        self.depth -= 1;
                    }
                    _ => return Err(self.error("expected ',' or a closing bracket")),
                }
            }
        }
    }

    /// A key and its colon, inside an object.
    fn key(&mut self) -> Res<()> {
        if self.peek() != Some(b'"') {
            return Err(self.error("expected a key"));
        }
        self.pos += 1;
        self.string()?;
        self.expect(b':', "expected ':'")
    }

    fn literal(&mut self, word: &[u8]) -> Res<()> {
        let end = self.pos + word.len();
        if self.bytes.get(self.pos..end) == Some(word) {
            self.pos = end;
            Ok(())
        } else {
            Err(self.error("expected a value"))
        }
    }

    /// A number at `pos`. Integers of up to 18 digits are checked here; anything else (fractions,
    /// exponents, long integers) is parsed by serde_json, which refuses what it cannot represent.
    fn number(&mut self) -> Res<()> {
        let start = self.pos;
        let mut i = start;
        if self.bytes.get(i) == Some(&b'-') {
            i += 1;
        }
        let digits_start = i;
        while let Some(b'0'..=b'9') = self.bytes.get(i) {
            i += 1;
        }
        let digits = i - digits_start;
        let simple = !matches!(self.bytes.get(i), Some(b'.' | b'e' | b'E' | b'-' | b'+'));
        if simple
            && (1..=18).contains(&digits)
            && (digits == 1 || self.bytes.get(digits_start) != Some(&b'0'))
        {
            self.pos = i;
            return Ok(());
        }
        // Every byte that can belong to a number: serde_json accepts the token only if it is exactly
        // one number (its grammar is greedy, so that is the number it would read in place).
        while let Some(b'0'..=b'9' | b'.' | b'e' | b'E' | b'-' | b'+') = self.bytes.get(i) {
            i += 1;
        }
        let token = self.bytes.get(start..i).unwrap_or_default();
        if serde_json::from_slice::<serde_json::Number>(token).is_err() {
            return Err(self.error("invalid number"));
        }
        self.pos = i;
        Ok(())
    }

    /// The rest of a string whose opening quote is consumed, up to and including its closing quote.
    fn string(&mut self) -> Res<()> {
        let bytes = self.bytes;
        let start = self.pos;
        let mut high = false;
        let mut i = start;
        loop {
            let (at, saw_high) = find_special(bytes, i);
            high |= saw_high;
            match bytes.get(at) {
                Some(b'"') => {
                    if high
                        && std::str::from_utf8(bytes.get(start..at).unwrap_or_default()).is_err()
                    {
                        self.pos = start;
                        return Err(self.error("invalid UTF-8 in a string"));
                    }
                    self.pos = at + 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    i = match bytes.get(at + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => at + 2,
                        Some(b'u') => match unicode_escape(bytes, at) {
                            Ok((_, len)) => at + len,
                            Err(what) => {
                                self.pos = at;
                                return Err(self.error(what));
                            }
                        },
                        _ => {
                            self.pos = at;
                            return Err(self.error("invalid escape"));
                        }
                    };
                }
                Some(_) => {
                    self.pos = at;
                    return Err(self.error("control character in a string"));
                }
                None => {
                    self.pos = at;
                    return Err(self.error("unterminated string"));
                }
            }
        }
    }
}

/// The four hex digits at `at` as a number.
#[inline(always)]
pub(crate) fn hex4(bytes: &[u8], at: usize) -> Option<u32> {
    let digits = bytes.get(at..at + 4)?;
    let mut v = 0u32;
    for &b in digits {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | u32::from(d);
    }
    Some(v)
}

/// The `\uXXXX` escape at `at` (or a surrogate pair of two): its character and length in bytes. A lone
/// surrogate fails, as in serde_json.
fn unicode_escape(bytes: &[u8], at: usize) -> Result<(char, usize), &'static str> {
    let hi = hex4(bytes, at + 2).ok_or("invalid \\u escape")?;
    let (cp, len) = match hi {
        0xD800..=0xDBFF => {
            if bytes.get(at + 6..at + 8) != Some(b"\\u") {
                return Err("lone surrogate");
            }
            let lo = hex4(bytes, at + 8).ok_or("invalid \\u escape")?;
            if !(0xDC00..=0xDFFF).contains(&lo) {
                return Err("lone surrogate");
            }
            (0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00), 12)
        }
        _ => (hi, 6),
    };
    // None for a lone trailing surrogate.
    Ok((char::from_u32(cp).ok_or("lone surrogate")?, len))
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Whether the word holds a quote, a backslash or a byte below 0x20 (exact as a yes/no).
#[inline(always)]
fn special(w: u64) -> bool {
    let zero = |x: u64| x.wrapping_sub(ONES) & !x;
    (zero(w ^ (ONES * u64::from(b'"')))
        | zero(w ^ (ONES * u64::from(b'\\')))
        | (w.wrapping_sub(ONES * 0x20) & !w))
        & HIGH
        != 0
}

/// Index of the first quote, backslash or control character from `at` (`bytes.len()` if none), and
/// whether a byte of 0x80 or more was passed on the way (only then is UTF-8 checked).
#[inline(always)]
fn find_special(bytes: &[u8], at: usize) -> (usize, bool) {
    let rest = bytes.get(at..).unwrap_or_default();
    let mut high = 0u64;
    let mut i = at;
    let mut words = rest.chunks_exact(8);
    for chunk in &mut words {
        let w = <[u8; 8]>::try_from(chunk).map_or(0, u64::from_le_bytes);
        if special(w) {
            break;
        }
        high |= w;
        i += 8;
    }
    for &b in bytes.get(i..).unwrap_or_default() {
        if b == b'"' || b == b'\\' || b < 0x20 {
            return (i, high & HIGH != 0);
        }
        high |= u64::from(b);
        i += 1;
    }
    (i, high & HIGH != 0)
}
