//! Writes the estimator's word table from o200k_base: `src/estimate/words.bin` (the filter's bytes)
//! and `src/estimate/words_table.rs` (its seed and block length, and the other word tables), and
//! `src/estimate/pairs_table.rs` (the Thai, hiragana and katakana letter pairs).
//!
//! ```sh
//! cargo run --release --example gen-word-table
//! ```
//!
//! The words are the tokens of tiktoken-rs' o200k_base that the estimator looks up (see
//! `examples/common/word_table.rs` for which, and `src/estimate/words.rs` for the lookup): words
//! of at least five ASCII letters, words with accented Latin letters and words of the alphabetic
//! scripts, each with its leading space or without, up to a rank limit per group. They go into an
//! 8-bit xor filter (Graf and Lemire 2020): three blocks of bytes, built by peeling; the first
//! seed of a fixed sequence for which peeling succeeds is taken, so the output is the same on every
//! run. The program prints the words per group and the table's size; it fails if a word it wrote
//! is not found by the estimator's own lookup.
#[path = "common/word_table.rs"]
mod word_table;

use std::collections::BTreeMap;
use std::path::Path;
use tokengate::estimate::{
    greek_slot, greek_step, short_slot, word_hash, word_slots, GREEK_BACK, GREEK_BARE,
    GREEK_SPACED, SHORT_BITS_LOG,
};

/// Builds the filter for `hashes` (distinct) with `seed`'s hashes already taken: the fingerprint
/// bytes and the block length, or None if peeling fails.
fn build(hashes: &[u64]) -> Option<(Vec<u8>, usize)> {
    let n = hashes.len();
    let block = (32 + (n as f64 * 1.23).ceil() as usize) / 3;
    let size = 3 * block;
    let mut count = vec![0u32; size];
    let mut xor = vec![0u64; size];
    for &h in hashes {
        for s in word_slots(h, block).0 {
            count[s] += 1;
            xor[s] ^= h;
        }
    }
    let mut queue: Vec<usize> = (0..size).filter(|&s| count[s] == 1).collect();
    let mut stack: Vec<(u64, usize)> = Vec::with_capacity(n);
    while let Some(s) = queue.pop() {
        if count[s] != 1 {
            continue;
        }
        let h = xor[s];
        stack.push((h, s));
        for t in word_slots(h, block).0 {
            count[t] -= 1;
            xor[t] ^= h;
            if count[t] == 1 {
                queue.push(t);
            }
        }
    }
    if stack.len() != n {
        return None;
    }
    let mut fp = vec![0u8; size];
    for &(h, s) in stack.iter().rev() {
        let (slots, f) = word_slots(h, block);
        let others = slots
            .iter()
            .filter(|&&t| t != s)
            .fold(0u8, |a, &t| a ^ fp[t]);
        fp[s] = f ^ others;
    }
    Some((fp, block))
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bpe = match tiktoken_rs::o200k_base() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("o200k_base: {e}");
            std::process::exit(2);
        }
    };
    let entries = word_table::select(&bpe);
    let mut groups: BTreeMap<(word_table::Script, bool), usize> = BTreeMap::new();
    for e in &entries {
        *groups.entry((e.script, e.space)).or_default() += 1;
    }
    let mut built = None;
    for k in 1..=64u64 {
        let seed = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut hashes: Vec<u64> = entries
            .iter()
            .map(|e| word_hash(e.word.as_bytes(), 0, e.word.len(), e.space, seed))
            .collect();
        hashes.sort_unstable();
        hashes.dedup();
        if hashes.len() != entries.len() {
            continue;
        }
        if let Some((fp, block)) = build(&hashes) {
            built = Some((seed, fp, block));
            break;
        }
    }
    let Some((seed, fp, block)) = built else {
        eprintln!("no seed of 64 builds the filter");
        std::process::exit(1);
    };
    // Every word is found by the same lookup as the estimator's.
    for e in &entries {
        let h = word_hash(e.word.as_bytes(), 0, e.word.len(), e.space, seed);
        let (slots, f) = word_slots(h, block);
        if slots.iter().fold(0u8, |a, &s| a ^ fp[s]) != f {
            eprintln!("{:?} not found", e.word);
            std::process::exit(1);
        }
    }
    let mut summary = String::new();
    for ((script, space), n) in &groups {
        let limit = word_table::limit(*script, *space);
        let line = format!(
            "//! - {script:?}, {}: {n} words (rank < {limit})\n",
            if *space { "after a space" } else { "bare" }
        );
        print!("{}", line.trim_start_matches("//! - "));
        summary.push_str(&line);
    }
    println!(
        "{} words, {} bytes ({:.2} per word), seed {seed:#x}",
        entries.len(),
        fp.len(),
        fp.len() as f64 / entries.len() as f64
    );
    let [pair, prefix, mid, end4] = word_table::thai_pairs(&bpe, &entries);
    let (hira, kata) = word_table::kana_pairs(&bpe);
    let rare = word_table::rare_pairs(&bpe);
    // The Greek pieces: every Greek word of the table read forwards (after a space or not), and
    // those without a space read backwards too.
    let mut greek = vec![0u64; 1024];
    let mut set = |h: u64| {
        let (word, bits) = greek_slot(h);
        greek[word] |= bits;
    };
    for e in entries
        .iter()
        .filter(|e| e.script == word_table::Script::Greek)
    {
        let codes: Vec<u64> = e.word.chars().map(|c| u64::from(c) - 0x370 + 1).collect();
        let start = if e.space { GREEK_SPACED } else { GREEK_BARE };
        set(codes.iter().fold(start, |h, &c| greek_step(h, c)));
        if !e.space {
            set(codes
                .iter()
                .rev()
                .fold(GREEK_BACK, |h, &c| greek_step(h, c)));
        }
    }
    let greek_rows = hex_rows(&greek, 18);
    let short = word_table::short_words(&bpe);
    let mut short_bits = vec![0u64; 1 << (SHORT_BITS_LOG - 6)];
    for &x in &short {
        let (word, bit) = short_slot(x);
        short_bits[word] |= bit;
    }
    println!(
        "{} short words in {} bytes",
        short.len(),
        short_bits.len() * 8
    );
    let short_rows = hex_rows(&short_bits, 18);
    let rare_rows = hex_rows(&rare, 10);
    let bits = |b: &[u64; 144]| hex_rows(b, 18);
    let src = format!(
        "//! The word table of `words.rs`, written by `cargo run --release --example gen-word-table`\n\
         //! from o200k_base: do not edit, regenerate. {} words in {} bytes:\n\
         {summary}\n\
         /// Hash seed of the table.\n\
         pub(super) const SEED: u64 = {seed:#018x};\n\
         /// Bytes per block (the table has three).\n\
         pub(super) const BLOCK: usize = {block};\n\
         /// The filter's fingerprint bytes.\n\
         pub(super) static FINGERPRINTS: [u8; 3 * BLOCK] = *include_bytes!(\"words.bin\");\n\n\
         /// Rare pairs of ASCII letters (bit `b & 31` of row `a & 31` for the pair `a`, `b`, either\n\
         /// case): held by fewer than {} o200k tokens of ASCII letters.\n\
         #[rustfmt::skip]\n\
         pub(super) static RARE_PAIR: [u32; 32] = [\n{}];\n\n\
         /// Greek words of the table as pieces of longer words (the bits `greek_slot` of their hash, see\n\
         /// `greek_step` in `words.rs`): read forwards after a space, forwards without one, and\n\
         /// backwards without one.\n\
         #[rustfmt::skip]\n\
         pub(super) static GREEK_PIECE_BITS: [u64; 1024] = [\n{}];\n\n\
         /// The o200k tokens of a space and three or four lower-case ASCII letters ({} of them; see\n\
         /// `short_known` in `words.rs`).\n\
         #[rustfmt::skip]\n\
         pub(super) static SHORT_WORD_BITS: [u64; {}] = [\n{}];\n",
        entries.len(),
        fp.len(),
        word_table::RARE_PAIR_TOKENS,
        rare_rows,
        greek_rows,
        short.len(),
        short_bits.len(),
        short_rows,
    );
    let pairs_src = format!(
        "//! The letter-pair tables of `scripts.rs` (Thai, hiragana, katakana), written by `cargo run --release\n\
         //! --example gen-word-table` from o200k_base: do not edit, regenerate.\n\n\
         /// Pairs of Thai characters (codes from U+0E00, bit `96 a + b`) that are an o200k token.\n\
         #[rustfmt::skip]\n\
         pub(super) static THAI_PAIR: [u64; 144] = [\n{}];\n\n\
         /// Pairs of Thai characters that begin a Thai word of the table (three or four characters).\n\
         #[rustfmt::skip]\n\
         pub(super) static THAI_PREFIX: [u64; 144] = [\n{}];\n\n\
         /// Pairs of Thai characters that are the second and third of a Thai word of the table.\n\
         #[rustfmt::skip]\n\
         pub(super) static THAI_MID: [u64; 144] = [\n{}];\n\n\
         /// Pairs of Thai characters that are the third and fourth of a four-character Thai word of\n\
         /// the table.\n\
         #[rustfmt::skip]\n\
         pub(super) static THAI_END4: [u64; 144] = [\n{}];\n\n\
         /// Pairs of hiragana (codes from U+3040, bit `96 a + b`) that are an o200k token.\n\
         #[rustfmt::skip]\n\
         pub(super) static HIRA_PAIR: [u64; 144] = [\n{}];\n\n\
         /// Pairs of katakana (codes from U+30A0, bit `96 a + b`) that are an o200k token.\n\
         #[rustfmt::skip]\n\
         pub(super) static KATA_PAIR: [u64; 144] = [\n{}];\n",
        bits(&pair),
        bits(&prefix),
        bits(&mid),
        bits(&end4),
        bits(&hira),
        bits(&kata),
    );
    let dir = root.join("src/estimate");
    for (name, bytes) in [
        ("words.bin", fp.as_slice()),
        ("words_table.rs", src.as_bytes()),
        ("pairs_table.rs", pairs_src.as_bytes()),
    ] {
        if let Err(e) = std::fs::write(dir.join(name), bytes) {
            eprintln!("{name}: {e}");
            std::process::exit(2);
        }
    }
    println!("wrote src/estimate/words.bin, words_table.rs and pairs_table.rs");
}

/// `values` as source rows of four hexadecimal literals of `width` characters (with `0x`) each.
fn hex_rows<T: std::fmt::LowerHex>(values: &[T], width: usize) -> String {
    values
        .chunks(4)
        .map(|c| {
            let row: Vec<String> = c.iter().map(|x| format!("{x:#0width$x}")).collect();
            format!("    {},\n", row.join(", "))
        })
        .collect()
}
