//! The exact counter (feature `exact`) against tiktoken-rs: every corpus line, and texts built to
//! stress the pre-tokenizer's white space rule, contractions, numbers and long pieces.

use super::super::exact::{build_table, Counter, Table};
use super::xorshift;

fn table() -> (Vec<u8>, tiktoken_rs::CoreBPE) {
    let bpe = tiktoken_rs::o200k_base().unwrap();
    let mut tokens = Vec::new();
    while let Ok(b) = bpe.decode_bytes(&[tokens.len() as u32]) {
        tokens.push(b);
    }
    assert_eq!(tokens.len(), 199_998);
    (build_table(&tokens, 18).unwrap(), bpe)
}

#[test]
fn the_exact_counter_counts_as_o200k_does() {
    let (bytes, bpe) = table();
    let mut counter = Counter::new(&bytes);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut lines = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let body = std::fs::read_to_string(e.unwrap().path()).unwrap();
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let t = v["text"].as_str().unwrap();
            assert_eq!(
                counter.count(t),
                bpe.encode_ordinary(t).len() as u64,
                "{t:?}"
            );
            lines += 1;
        }
    }
    assert!(lines > 1500);
    // White space before words, at line ends and at the end; contractions; digits; long pieces
    // (merged by the heap, beyond 128 bytes); scripts.
    let pieces = [
        " ",
        "  ",
        "\t",
        "\n",
        " \n ",
        "\r\n",
        "word",
        "Word",
        "WORD",
        "'s",
        "'LL",
        "123456",
        "x",
        "日本語のテキスト",
        "ภาษาไทย",
        "!!",
        "...",
        "/",
        "é",
        "😀",
        "\u{200B}",
        "ab",
    ];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..3000 {
        let n = 1 + (xorshift(&mut x) % 12) as usize;
        let t: String = (0..n)
            .map(|_| pieces[(xorshift(&mut x) >> 20) as usize % pieces.len()])
            .collect();
        assert_eq!(
            counter.count(&t),
            bpe.encode_ordinary(&t).len() as u64,
            "{t:?}"
        );
    }
    for t in [
        "x".repeat(5000),
        "ab".repeat(700),
        "日本語".repeat(300),
        " ".repeat(300) + "a",
    ] {
        assert_eq!(counter.count(&t), bpe.encode_ordinary(&t).len() as u64);
    }
}

#[test]
fn a_table_that_does_not_parse_counts_bytes_never_fewer_than_o200k() {
    assert!(Table::parse(b"nope").is_none());
    let mut counter = Counter::new(b"TGX1");
    assert_eq!(counter.count("hello world"), 11);
}
