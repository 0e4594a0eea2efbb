//! The AWS event-stream framing (`application/vnd.amazon.eventstream`) that Bedrock's
//! `converse-stream` and `invoke-with-response-stream` answer in, decoded incrementally: [`Decoder`].
//!
//! One message:
//! ```text
//! | total length u32 BE | headers length u32 BE | prelude CRC32 u32 BE |   (the prelude, 12 bytes)
//! | headers (headers length bytes) | payload | message CRC32 u32 BE |
//! ```
//! The prelude CRC covers the first 8 bytes, the message CRC everything before it (CRC-32/IEEE, as
//! zlib's). A header is `name length u8 | name | value type u8 | value`, the value by its type: 0 true,
//! 1 false, 2 byte, 3 i16, 4 i32, 5 i64, 6 bytes (u16 BE length + bytes), 7 string (u16 BE length +
//! UTF-8), 8 timestamp (i64 ms), 9 UUID (16 bytes).
//!
//! Never trusted blindly: every CRC is checked, lengths are checked against each other and against a
//! bound ([`DEFAULT_MAX_MESSAGE_BYTES`]), headers must fill their section exactly; the first message
//! that fails any check makes the stream [`Decoder::broken`] for good (nothing after it is read, since
//! the framing is lost). Memory is bounded: at most one message is held (up to the bound).

use std::fmt;

/// Largest message accepted (1 MiB): Bedrock's stream events are deltas of a few hundred bytes, and an
/// `invoke-with-response-stream` chunk is one model event.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Prelude (12) + message CRC (4).
const MIN_MESSAGE: usize = 16;

/// A header value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderValue {
    /// Types 0 and 1.
    Bool(bool),
    /// Types 2 (byte), 3 (short), 4 (integer), 5 (long), 8 (timestamp, ms).
    Int(i64),
    /// Type 6.
    Bytes(Vec<u8>),
    /// Type 7.
    String(String),
    /// Type 9.
    Uuid([u8; 16]),
}

/// One decoded message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Headers in order.
    pub headers: Vec<(String, HeaderValue)>,
    /// The payload (JSON for Bedrock's events).
    pub payload: Vec<u8>,
}

impl Message {
    /// A string header's value (`:event-type`, `:message-type`, `:exception-type`, …).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find_map(|(k, v)| match v {
            HeaderValue::String(s) if k == name => Some(s.as_str()),
            _ => None,
        })
    }
}

/// Why the stream cannot be read any further.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// The prelude's CRC does not match.
    PreludeCrc,
    /// The message's CRC does not match.
    MessageCrc,
    /// The total length is below 16, over the bound, or smaller than the headers it announces.
    Length,
    /// A header is cut, of an unknown type, or its name or string is not UTF-8.
    Header,
    /// The stream ended inside a message.
    Truncated,
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Broken::PreludeCrc => "event stream: prelude CRC mismatch",
            Broken::MessageCrc => "event stream: message CRC mismatch",
            Broken::Length => "event stream: impossible message length",
            Broken::Header => "event stream: malformed header",
            Broken::Truncated => "event stream: ended inside a message",
        })
    }
}

/// Incremental decoder: [`feed`](Self::feed) any split of the bytes, in order.
#[derive(Debug)]
pub struct Decoder {
    max: usize,
    buf: Vec<u8>,
    broken: Option<Broken>,
    /// Bytes fed after the stream broke (they cannot be framed).
    unframed: u64,
    messages: u64,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new(DEFAULT_MAX_MESSAGE_BYTES)
    }
}

impl Decoder {
    /// A decoder that refuses messages over `max_message_bytes` (at least 16).
    pub fn new(max_message_bytes: usize) -> Decoder {
        Decoder {
            max: max_message_bytes.max(MIN_MESSAGE),
            buf: Vec::new(),
            broken: None,
            unframed: 0,
            messages: 0,
        }
    }

    /// Feeds the next bytes; calls `on` for each message completed by them (in order). Nothing is
    /// called once the stream is broken.
    pub fn feed(&mut self, mut bytes: &[u8], on: &mut dyn FnMut(Message)) {
        if self.broken.is_some() {
            self.unframed = self.unframed.saturating_add(bytes.len() as u64);
            return;
        }
        while !bytes.is_empty() {
            // Take only what the current message still needs, so the buffer never holds more than one.
            let need = match self.total() {
                Ok(Some(total)) => total.saturating_sub(self.buf.len()),
                Ok(None) => 12usize.saturating_sub(self.buf.len()),
                Err(b) => return self.fail(b, bytes.len()),
            };
            let take = need.min(bytes.len()).max(1);
            let (head, rest) = bytes.split_at(take.min(bytes.len()));
            self.buf.extend_from_slice(head);
            bytes = rest;
            match self.total() {
                Err(b) => return self.fail(b, bytes.len()),
                Ok(Some(total)) if self.buf.len() >= total => {
                    let frame = std::mem::take(&mut self.buf);
                    match decode(&frame) {
                        Ok(m) => {
                            self.messages = self.messages.saturating_add(1);
                            on(m);
                        }
                        Err(b) => return self.fail(b, bytes.len()),
                    }
                }
                _ => {}
            }
        }
    }

    /// End of the stream: a message left half-read breaks it.
    pub fn finish(&mut self) {
        if self.broken.is_none() && !self.buf.is_empty() {
            self.broken = Some(Broken::Truncated);
            self.unframed = self.unframed.saturating_add(self.buf.len() as u64);
            self.buf.clear();
        }
    }

    /// Why the stream could not be read, if it could not.
    pub fn broken(&self) -> Option<Broken> {
        self.broken
    }

    /// Bytes that could not be framed (from the message that broke the stream on).
    pub fn unframed_bytes(&self) -> u64 {
        self.unframed
    }

    /// Messages decoded so far.
    pub fn messages(&self) -> u64 {
        self.messages
    }

    fn fail(&mut self, b: Broken, rest: usize) {
        self.broken = Some(b);
        self.unframed = self
            .unframed
            .saturating_add(self.buf.len() as u64)
            .saturating_add(rest as u64);
        self.buf = Vec::new();
    }

    /// The current message's total length once its prelude is in (checked), `None` before.
    fn total(&self) -> Result<Option<usize>, Broken> {
        let Some(prelude) = self.buf.get(..12) else {
            return Ok(None);
        };
        let total = be32(prelude, 0) as usize;
        let headers = be32(prelude, 4) as usize;
        if crc32(prelude.get(..8).unwrap_or_default()) != be32(prelude, 8) {
            return Err(Broken::PreludeCrc);
        }
        if total < MIN_MESSAGE || total > self.max || headers > total - MIN_MESSAGE {
            return Err(Broken::Length);
        }
        Ok(Some(total))
    }
}

/// Decodes one whole message (its prelude already checked).
fn decode(frame: &[u8]) -> Result<Message, Broken> {
    let total = frame.len();
    let headers_len = be32(frame, 4) as usize;
    let body = frame.get(..total - 4).ok_or(Broken::Length)?;
    if crc32(body) != be32(frame, total - 4) {
        return Err(Broken::MessageCrc);
    }
    let headers = frame.get(12..12 + headers_len).ok_or(Broken::Length)?;
    let payload = frame
        .get(12 + headers_len..total - 4)
        .ok_or(Broken::Length)?;
    Ok(Message {
        headers: parse_headers(headers)?,
        payload: payload.to_vec(),
    })
}

fn parse_headers(mut h: &[u8]) -> Result<Vec<(String, HeaderValue)>, Broken> {
    let mut out = Vec::new();
    while let Some((&name_len, rest)) = h.split_first() {
        let (name, rest) = rest
            .split_at_checked(usize::from(name_len))
            .ok_or(Broken::Header)?;
        let name = std::str::from_utf8(name).map_err(|_| Broken::Header)?;
        let (&ty, rest) = rest.split_first().ok_or(Broken::Header)?;
        let fixed = |n: usize, rest: &[u8]| -> Result<(i64, usize), Broken> {
            let b = rest.get(..n).ok_or(Broken::Header)?;
            let mut v: i64 = 0;
            for &x in b {
                v = (v << 8) | i64::from(x);
            }
            // Sign-extend the shorter widths.
            let shift = 64 - 8 * n as u32;
            Ok(((v << shift) >> shift, n))
        };
        let (value, used) = match ty {
            0 => (HeaderValue::Bool(true), 0),
            1 => (HeaderValue::Bool(false), 0),
            2 => fixed(1, rest).map(|(v, n)| (HeaderValue::Int(v), n))?,
            3 => fixed(2, rest).map(|(v, n)| (HeaderValue::Int(v), n))?,
            4 => fixed(4, rest).map(|(v, n)| (HeaderValue::Int(v), n))?,
            5 | 8 => fixed(8, rest).map(|(v, n)| (HeaderValue::Int(v), n))?,
            6 | 7 => {
                let len = rest.get(..2).ok_or(Broken::Header)?;
                let len = usize::from(u16::from_be_bytes([
                    len.first().copied().unwrap_or(0),
                    len.get(1).copied().unwrap_or(0),
                ]));
                let v = rest.get(2..2 + len).ok_or(Broken::Header)?;
                let value = if ty == 6 {
                    HeaderValue::Bytes(v.to_vec())
                } else {
                    HeaderValue::String(
                        std::str::from_utf8(v)
                            .map_err(|_| Broken::Header)?
                            .to_string(),
                    )
                };
                (value, 2 + len)
            }
            9 => {
                let v: [u8; 16] = rest
                    .get(..16)
                    .and_then(|b| b.try_into().ok())
                    .ok_or(Broken::Header)?;
                (HeaderValue::Uuid(v), 16)
            }
            _ => return Err(Broken::Header),
        };
        out.push((name.to_string(), value));
        h = rest.get(used..).ok_or(Broken::Header)?;
    }
    Ok(out)
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        v.copy_from_slice(s);
    }
    u32::from_be_bytes(v)
}

/// CRC-32/IEEE (zlib's): reflected polynomial 0xEDB88320, init and final XOR 0xFFFFFFFF.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        let i = ((crc ^ u32::from(b)) & 0xFF) as usize;
        crc = (crc >> 8) ^ CRC_TABLE.get(i).copied().unwrap_or(0);
    }
    !crc
}

// The table is built at compile time, where an index out of range is a compile error, not a panic.
#[allow(clippy::indexing_slicing)]
const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Encodes one message (string headers only): what Bedrock sends, for tests and the mock provider.
pub fn encode(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    for (k, v) in headers {
        h.push(k.len().min(255) as u8);
        h.extend_from_slice(k.as_bytes().get(..k.len().min(255)).unwrap_or_default());
        h.push(7);
        let len = v.len().min(u16::MAX as usize);
        h.extend_from_slice(&(len as u16).to_be_bytes());
        h.extend_from_slice(v.as_bytes().get(..len).unwrap_or_default());
    }
    let total = (16 + h.len() + payload.len()) as u32;
    let mut m = Vec::with_capacity(total as usize);
    m.extend_from_slice(&total.to_be_bytes());
    m.extend_from_slice(&(h.len() as u32).to_be_bytes());
    let prelude_crc = crc32(&m);
    m.extend_from_slice(&prelude_crc.to_be_bytes());
    m.extend_from_slice(&h);
    m.extend_from_slice(payload);
    let crc = crc32(&m);
    m.extend_from_slice(&crc.to_be_bytes());
    m
}

/// Standard base64 (with or without padding) decoded; `None` for anything else.
pub fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    let s = s
        .strip_suffix(b"==")
        .or_else(|| s.strip_suffix(b"="))
        .unwrap_or(s);
    let mut out = Vec::with_capacity(s.len() / 4 * 3 + 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in s {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    (bits < 6).then_some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn collect(d: &mut Decoder, chunks: &[&[u8]]) -> Vec<Message> {
        let mut got = Vec::new();
        for c in chunks {
            d.feed(c, &mut |m| got.push(m));
        }
        d.finish();
        got
    }

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            crc32(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
    }

    #[test]
    fn a_known_message_from_the_aws_test_suite_decodes() {
        // "all_headers" vector of the AWS event-stream test suite (aws-c-event-stream).
        let frame: Vec<u8> = vec![
            0x00, 0x00, 0x00, 0x3D, 0x00, 0x00, 0x00, 0x20, 0x07, 0xFD, 0x83, 0x96, 0x0C, b'c',
            b'o', b'n', b't', b'e', b'n', b't', b'-', b't', b'y', b'p', b'e', 0x07, 0x00, 0x10,
            b'a', b'p', b'p', b'l', b'i', b'c', b'a', b't', b'i', b'o', b'n', b'/', b'j', b's',
            b'o', b'n', b'{', b'\'', b'f', b'o', b'o', b'\'', b':', b'\'', b'b', b'a', b'r', b'\'',
            b'}', 0x8D, 0x9C, 0x08, 0xB1,
        ];
        let got = collect(&mut Decoder::default(), &[&frame]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].header("content-type"), Some("application/json"));
        assert_eq!(got[0].payload, b"{'foo':'bar'}");
        assert_eq!(
            encode(&[("content-type", "application/json")], b"{'foo':'bar'}"),
            frame
        );
    }

    #[test]
    fn messages_split_anywhere_decode_the_same() {
        let mut stream = Vec::new();
        for i in 0..5 {
            stream.extend(encode(
                &[
                    (":message-type", "event"),
                    (":event-type", "contentBlockDelta"),
                ],
                format!("{{\"i\":{i}}}").as_bytes(),
            ));
        }
        let whole = collect(&mut Decoder::default(), &[&stream]);
        assert_eq!(whole.len(), 5);
        for cut in 0..stream.len() {
            let mut d = Decoder::default();
            assert_eq!(collect(&mut d, &[&stream[..cut], &stream[cut..]]), whole);
            assert_eq!(d.broken(), None);
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(collect(&mut Decoder::default(), &bytes), whole);
    }

    #[test]
    fn a_flipped_bit_anywhere_breaks_the_stream_and_nothing_after_it_is_read() {
        let one = encode(&[(":event-type", "metadata")], b"{\"usage\":{}}");
        for i in 0..one.len() {
            for bit in [0, 3, 7] {
                let mut bad = one.clone();
                bad[i] ^= 1 << bit;
                let mut stream = bad.clone();
                stream.extend(&one);
                let mut d = Decoder::default();
                let got = collect(&mut d, &[&stream]);
                assert!(got.is_empty(), "byte {i} bit {bit}: {got:?}");
                assert!(d.broken().is_some(), "byte {i} bit {bit}");
            }
        }
    }

    #[test]
    fn lengths_are_bounded_and_a_cut_message_is_truncated() {
        let big = encode(&[], &[b'x'; 100]);
        let mut d = Decoder::new(64);
        assert!(collect(&mut d, &[&big]).is_empty());
        assert_eq!(d.broken(), Some(Broken::Length));
        let mut d = Decoder::default();
        assert!(collect(&mut d, &[&big[..50]]).is_empty());
        assert_eq!(d.broken(), Some(Broken::Truncated));
        // A headers length larger than the message.
        let mut m = 20u32.to_be_bytes().to_vec();
        m.extend(100u32.to_be_bytes());
        let crc = crc32(&m);
        m.extend(crc.to_be_bytes());
        let mut d = Decoder::default();
        d.feed(&m, &mut |_| panic!("nothing decodes"));
        assert_eq!(d.broken(), Some(Broken::Length));
    }

    #[test]
    fn every_header_type_is_read() {
        let mut h = Vec::new();
        let mut push = |name: &str, ty: u8, v: &[u8]| {
            h.push(name.len() as u8);
            h.extend_from_slice(name.as_bytes());
            h.push(ty);
            h.extend_from_slice(v);
        };
        push("t", 0, &[]);
        push("f", 1, &[]);
        push("b", 2, &[0xFF]);
        push("s", 3, &[0x80, 0x00]);
        push("i", 4, &[0, 0, 1, 0]);
        push("l", 5, &[0, 0, 0, 0, 0, 0, 0, 7]);
        push("y", 6, &[0, 2, 1, 2]);
        push("u", 9, &[9; 16]);
        let total = (16 + h.len()) as u32;
        let mut m = total.to_be_bytes().to_vec();
        m.extend((h.len() as u32).to_be_bytes());
        let c = crc32(&m);
        m.extend(c.to_be_bytes());
        m.extend(&h);
        let c = crc32(&m);
        m.extend(c.to_be_bytes());
        let got = collect(&mut Decoder::default(), &[&m]);
        let values: Vec<HeaderValue> = got[0].headers.iter().map(|(_, v)| v.clone()).collect();
        assert_eq!(
            values,
            [
                HeaderValue::Bool(true),
                HeaderValue::Bool(false),
                HeaderValue::Int(-1),
                HeaderValue::Int(-32768),
                HeaderValue::Int(256),
                HeaderValue::Int(7),
                HeaderValue::Bytes(vec![1, 2]),
                HeaderValue::Uuid([9; 16]),
            ]
        );
    }

    #[test]
    fn base64_decodes_standard_text() {
        assert_eq!(base64_decode(b"aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode(b"aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode(b"eyJhIjoxfQ==").unwrap(), b"{\"a\":1}");
        assert_eq!(base64_decode(b"").unwrap(), b"");
        assert!(base64_decode(b"a$==").is_none());
        assert!(base64_decode(b"a").is_none());
    }
}
