//! Exact `o200k_base` token counting (cargo feature `exact`): what counting the text exactly, as
//! OpenAI's tokenizer does, would cost inside the filter, measured side by side with the estimator.
//! It is **not offered** as a configuration: it costs more than the issue that asked for it allows
//! (numbers in `docs/estimator.md`, "Exact counting"), so the filter never builds it unless asked.
//!
//! How it counts: the text is cut into pieces by o200k's pre-tokenizer regex ([`O200K_PATTERN`], run
//! by the `regex` crate, whose leftmost-first alternation is the same as tiktoken's; its one
//! look-ahead, `\s+(?!\S)`, is done by hand in [`Pieces`]), then each piece is merged by byte-pair
//! ranks as tiktoken's `byte_pair_merge` does (the lowest-ranked adjacent pair first, leftmost on a
//! tie), counting the tokens left. The ranks live in one compact byte table ([`Table`], written by
//! [`build_table`] from the tokens in rank order):
//!
//! ```text
//! "TGX1" | n: u32 | slot_bits: u32 | blob_len: u32
//! lens: n × u8                         the length of the token of each rank (at most 128 bytes)
//! offs: ceil(n / 8) × u32              where every 8th rank's bytes start in the blob
//! slots: 2^slot_bits × u32             open addressing, linear probing: rank | fingerprint << 18,
//!                                      u32::MAX empty
//! blob: blob_len bytes                 the tokens' bytes in rank order
//! ```
//!
//! The `.wasm` that measures it in Envoy (feature `exact-text`: every text the estimate counts is
//! counted by [`count`] instead of the text model) embeds the table that `cargo run --release
//! --example gen-exact-table` writes to `target/o200k-exact.bin`. Nothing here panics: a table that
//! does not parse counts every piece by its bytes (never fewer tokens than o200k), and pieces of any
//! length are merged in O(n log n) ([`merge_long`]) beyond [`SHORT_PIECE`] bytes.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// o200k_base's pre-tokenizer (tiktoken's `O200K_BASE_PAT_STR`) without its look-ahead
/// alternative `\s+(?!\S)`, which [`Pieces`] applies to the `\s+` match instead.
pub const O200K_PATTERN: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"|\s*[\r\n]+",
    r"|\s+",
);

/// Pieces up to this many bytes are merged by tiktoken's quadratic loop (fastest for short pieces);
/// longer ones by [`merge_long`].
pub const SHORT_PIECE: usize = 128;

const MAGIC: &[u8; 4] = b"TGX1";
const RANK_BITS: u32 = 18;
const RANK_MASK: u32 = (1 << RANK_BITS) - 1;
const EMPTY: u32 = u32::MAX;
const NO_RANK: u32 = u32::MAX;

/// The rank table, read from its bytes (see the module documentation).
pub struct Table<'a> {
    n: usize,
    lens: &'a [u8],
    offs: &'a [u8],
    slots: &'a [u8],
    mask: usize,
    blob: &'a [u8],
}

fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    let s = b.get(i..i.checked_add(4)?)?;
    Some(u32::from_le_bytes(<[u8; 4]>::try_from(s).ok()?))
}

/// The hash of a byte string (FxHash-like over eight bytes at a time).
fn hash(b: &[u8]) -> u32 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = (b.len() as u64).wrapping_mul(K);
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let x = <[u8; 8]>::try_from(c).map_or(0, u64::from_le_bytes);
        h = (h.rotate_left(5) ^ x).wrapping_mul(K);
    }
    let mut last = [0u8; 8];
    let rest = chunks.remainder();
    if let Some(dst) = last.get_mut(..rest.len()) {
        dst.copy_from_slice(rest);
    }
    h = (h.rotate_left(5) ^ u64::from_le_bytes(last)).wrapping_mul(K);
    (h >> 32) as u32 ^ h as u32
}

/// Writes the table of `tokens` (in rank order, fewer than 2^18, each 1..=255 bytes) with
/// 2^`slot_bits` slots. None if they do not fit.
pub fn build_table(tokens: &[Vec<u8>], slot_bits: u32) -> Option<Vec<u8>> {
    let n = tokens.len();
    if n >= RANK_MASK as usize || !(1..=24).contains(&slot_bits) || n >= (1usize << slot_bits) {
        return None;
    }
    let blob_len: usize = tokens.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(16 + n + n / 2 + (4usize << slot_bits) + blob_len);
    out.extend_from_slice(MAGIC);
    for v in [n, slot_bits as usize, blob_len] {
        out.extend_from_slice(&u32::try_from(v).ok()?.to_le_bytes());
    }
    for t in tokens {
        out.push(u8::try_from(t.len()).ok().filter(|&l| l > 0)?);
    }
    let mut off = 0usize;
    for (r, t) in tokens.iter().enumerate() {
        if r % 8 == 0 {
            out.extend_from_slice(&u32::try_from(off).ok()?.to_le_bytes());
        }
        off += t.len();
    }
    let size = 1usize << slot_bits;
    let mask = size - 1;
    let mut slots = vec![EMPTY; size];
    for (r, t) in tokens.iter().enumerate() {
        let h = hash(t);
        let fp = h >> RANK_BITS;
        let mut i = h as usize & mask;
        while slots.get(i).is_some_and(|&s| s != EMPTY) {
            i = (i + 1) & mask;
        }
        *slots.get_mut(i)? = r as u32 | fp << RANK_BITS;
    }
    for s in slots {
        out.extend_from_slice(&s.to_le_bytes());
    }
    for t in tokens {
        out.extend_from_slice(t);
    }
    Some(out)
}

impl<'a> Table<'a> {
    /// Reads a table written by [`build_table`]; None if `b` is not one.
    pub fn parse(b: &'a [u8]) -> Option<Table<'a>> {
        if b.get(..4)? != MAGIC {
            return None;
        }
        let n = u32_at(b, 4)? as usize;
        let slot_bits = u32_at(b, 8)?;
        let blob_len = u32_at(b, 12)? as usize;
        if !(1..=24).contains(&slot_bits) {
            return None;
        }
        let size = 1usize << slot_bits;
        let lens_at = 16usize;
        let offs_at = lens_at + n;
        let slots_at = offs_at + n.div_ceil(8) * 4;
        let blob_at = slots_at + size * 4;
        let table = Table {
            n,
            lens: b.get(lens_at..offs_at)?,
            offs: b.get(offs_at..slots_at)?,
            slots: b.get(slots_at..blob_at)?,
            mask: size - 1,
            blob: b.get(blob_at..blob_at.checked_add(blob_len)?)?,
        };
        Some(table)
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the table has no tokens.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The bytes of the token of rank `r`.
    fn token(&self, r: usize) -> Option<&'a [u8]> {
        let base = r & !7;
        let mut off = u32_at(self.offs, base / 2)? as usize;
        for &l in self.lens.get(base..r)? {
            off += usize::from(l);
        }
        let len = usize::from(*self.lens.get(r)?);
        self.blob.get(off..off + len)
    }

    /// The rank of `bytes`, if they are a token.
    pub fn rank(&self, bytes: &[u8]) -> Option<u32> {
        let h = hash(bytes);
        let fp = h >> RANK_BITS;
        let mut i = h as usize & self.mask;
        for _ in 0..=self.mask {
            let s = u32_at(self.slots, i * 4)?;
            if s == EMPTY {
                return None;
            }
            if s >> RANK_BITS == fp {
                let r = s & RANK_MASK;
                if self.token(r as usize) == Some(bytes) {
                    return Some(r);
                }
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    fn rank_or_none(&self, bytes: Option<&[u8]>) -> u32 {
        bytes.and_then(|b| self.rank(b)).unwrap_or(NO_RANK)
    }

    /// Tokens of one piece (tiktoken's `byte_pair_merge`, counted).
    pub fn piece_tokens(&self, piece: &[u8], parts: &mut Vec<(usize, u32)>) -> usize {
        if piece.len() <= 1 || self.rank(piece).is_some() {
            return piece.len().min(1);
        }
        if piece.len() > SHORT_PIECE {
            return self.merge_long(piece);
        }
        // (start, rank of the pair that starts there), as tiktoken's `_byte_pair_merge`.
        parts.clear();
        let mut min = (NO_RANK, usize::MAX);
        for i in 0..piece.len() - 1 {
            let r = self.rank_or_none(piece.get(i..i + 2));
            if r < min.0 {
                min = (r, i);
            }
            parts.push((i, r));
        }
        parts.push((piece.len() - 1, NO_RANK));
        parts.push((piece.len(), NO_RANK));
        let rank_at = |parts: &[(usize, u32)], i: usize| -> u32 {
            match (parts.get(i), parts.get(i + 3)) {
                (Some(&(a, _)), Some(&(b, _))) => self.rank_or_none(piece.get(a..b)),
                _ => NO_RANK,
            }
        };
        while min.0 != NO_RANK {
            let i = min.1;
            if i > 0 {
                let r = rank_at(parts, i - 1);
                if let Some(p) = parts.get_mut(i - 1) {
                    p.1 = r;
                }
            }
            let r = rank_at(parts, i);
            if let Some(p) = parts.get_mut(i) {
                p.1 = r;
            }
            if i + 1 < parts.len() {
                parts.remove(i + 1);
            }
            min = (NO_RANK, usize::MAX);
            for (k, &(_, r)) in parts.iter().take(parts.len().saturating_sub(1)).enumerate() {
                if r < min.0 {
                    min = (r, k);
                }
            }
        }
        parts.len().saturating_sub(1)
    }

    /// Tokens of a long piece: the same merges from a heap of candidate pairs (lowest rank, then
    /// leftmost, first), tokens kept as a linked list: O(n log n) where the loop above is O(n²).
    pub fn merge_long(&self, piece: &[u8]) -> usize {
        let n = piece.len();
        // Token starting at i ends at next[i]; prev[i] is the token before it (usize::MAX: none).
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::with_capacity(n);
        for i in 0..n.saturating_sub(1) {
            let r = self.rank_or_none(piece.get(i..i + 2));
            if r != NO_RANK {
                heap.push(Reverse((r, i, i + 2)));
            }
        }
        let mut tokens = n;
        while let Some(Reverse((_, start, end))) = heap.pop() {
            // Still the two tokens it was made of?
            let Some(&mid) = next.get(start) else {
                continue;
            };
            if !alive.get(start).copied().unwrap_or(false)
                || mid >= n
                || next.get(mid).copied() != Some(end)
            {
                continue;
            }
            if let Some(a) = alive.get_mut(mid) {
                *a = false;
            }
            if let Some(x) = next.get_mut(start) {
                *x = end;
            }
            if let Some(p) = prev.get_mut(end) {
                *p = start;
            }
            tokens -= 1;
            let p = prev.get(start).copied().unwrap_or(usize::MAX);
            if p != usize::MAX {
                let r = self.rank_or_none(piece.get(p..end));
                if r != NO_RANK {
                    heap.push(Reverse((r, p, end)));
                }
            }
            if end < n {
                let after = next.get(end).copied().unwrap_or(n);
                let r = self.rank_or_none(piece.get(start..after));
                if r != NO_RANK {
                    heap.push(Reverse((r, start, after)));
                }
            }
        }
        tokens
    }
}

/// The pieces of o200k's pre-tokenizer in `text`, as byte ranges.
pub struct Pieces<'r, 't> {
    re: &'r regex::Regex,
    text: &'t str,
    at: usize,
}

impl<'r, 't> Pieces<'r, 't> {
    /// The pieces of `text` by `re` (compiled from [`O200K_PATTERN`]).
    pub fn new(re: &'r regex::Regex, text: &'t str) -> Self {
        Pieces { re, text, at: 0 }
    }
}

impl Iterator for Pieces<'_, '_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        let m = self.re.find_at(self.text, self.at)?;
        let (start, mut end) = (m.start(), m.end());
        let s = m.as_str();
        // `\s+` took a whole run of white space (no line break at its end: `\s*[\r\n]+` would have
        // matched first) that a non-space follows: o200k's `\s+(?!\S)` leaves that run's last
        // character to the next piece (when the run has two characters or more).
        if end < self.text.len() && s.chars().all(char::is_whitespace) && !s.ends_with(['\r', '\n'])
        {
            if let Some((last, _)) = s.char_indices().next_back() {
                if last > 0 {
                    end = start + last;
                }
            }
        }
        if end <= self.at {
            // Cannot happen (every alternative matches one character at least); never loop.
            return None;
        }
        self.at = end;
        Some((start, end))
    }
}

/// A counter: the table, the compiled pre-tokenizer and a scratch buffer.
pub struct Counter<'a> {
    table: Option<Table<'a>>,
    re: Option<regex::Regex>,
    parts: Vec<(usize, u32)>,
}

impl<'a> Counter<'a> {
    /// A counter over the table bytes `b` (see [`build_table`]).
    pub fn new(b: &'a [u8]) -> Self {
        Counter {
            table: Table::parse(b),
            re: regex::Regex::new(O200K_PATTERN).ok(),
            parts: Vec::new(),
        }
    }

    /// The o200k_base tokens of `text` (its UTF-8 bytes if the table or the regex is missing:
    /// never fewer than o200k's).
    pub fn count(&mut self, text: &str) -> u64 {
        let (Some(table), Some(re)) = (&self.table, &self.re) else {
            return text.len() as u64;
        };
        let mut n = 0u64;
        for (s, e) in Pieces::new(re, text) {
            let piece = text.as_bytes().get(s..e).unwrap_or_default();
            n += table.piece_tokens(piece, &mut self.parts) as u64;
        }
        n
    }
}

#[cfg(feature = "exact-text")]
static TABLE: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/target/o200k-exact.bin"
));

#[cfg(feature = "exact-text")]
thread_local! {
    static COUNTER: std::cell::RefCell<Counter<'static>> = std::cell::RefCell::new(Counter::new(TABLE));
}

/// The o200k_base tokens of `text` with the embedded table (feature `exact-text`).
#[cfg(feature = "exact-text")]
pub fn count(text: &str) -> u64 {
    COUNTER.with(|c| {
        c.try_borrow_mut()
            .map_or(text.len() as u64, |mut c| c.count(text))
    })
}
