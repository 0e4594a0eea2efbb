//! The fast walk and ASCII windows against the reference walk and the byte-wise loop; fuzzing.

use super::*;
use crate::estimate::latin::{is_latin_ext, latin_ext_at, tail_steps, word_tail};

#[test]
fn arbitrary_bytes_never_panic() {
    // A cheap deterministic fuzz: random bytes (valid or not) through every entry point.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for len in 0..400usize {
        let mut buf = Vec::with_capacity(len);
        for _ in 0..len {
            buf.push((xorshift(&mut x) >> 24) as u8);
        }
        for kind in [
            ApiKind::ChatCompletions,
            ApiKind::Completions,
            ApiKind::Embeddings,
            ApiKind::Responses,
            ApiKind::AnthropicMessages,
        ] {
            let _ = estimate(kind, &buf, &limits);
        }
        let s = String::from_utf8_lossy(&buf);
        let _ = text_tokens(&s);
    }
    for cp in (0u32..0x11_0000).step_by(7) {
        if let Some(c) = char::from_u32(cp) {
            let _ = text_tokens(&c.to_string());
        }
    }
}

#[test]
fn raw_strings_are_checked_like_std_str_from_utf8_and_counted_like_text() {
    let mut cases: Vec<Vec<u8>> = [
        &b""[..],
        b"plain ascii",
        "caf\u{e9} 中文 한국어 ภาษา カタカナ 😀 \u{2028}\u{ff10}".as_bytes(),
        b"\x80",
        b"a\xbf",
        b"\xc0\xaf",
        b"\xc1\xbf",
        b"\xc2",
        b"\xc2\x7f",
        b"\xe0\x80\x80",
        b"\xe0\x9f\xbf",
        b"\xe0\xa0\x80",
        b"\xe4\xb8",
        b"\xe4\xb8\x41",
        b"\xed\x9f\xbf",
        b"\xed\xa0\x80",
        b"\xed\xbf\xbf",
        b"\xee\x80\x80",
        b"\xef\xbc",
        b"\xf0\x8f\xbf\xbf",
        b"\xf0\x90\x80\x80",
        b"\xf4\x8f\xbf\xbf",
        b"\xf4\x90\x80\x80",
        b"\xf5\x80\x80\x80",
        b"\xff",
        b"\xea\xb0\x80 \xea\xb0",
        b"\xe0\xb8\x81 \xe0\xb8",
    ]
    .iter()
    .map(|c| c.to_vec())
    .collect();
    // Valid text with one byte changed, dropped or cut off, in every script the scanner has a
    // loop for.
    let text =
        "Hello, 世界です。カタカナ 한국어 텍스트 ภาษาไทย café Ωμέγα 😀 12 \u{3000}x".as_bytes();
    for i in 0..text.len() {
        for b in [0x80, 0xbf, 0xc3, 0xe4, 0xed, 0xf0, 0xff, b' '] {
            let mut v = text.to_vec();
            v[i] = b;
            cases.push(v);
        }
        let mut v = text.to_vec();
        v.remove(i);
        cases.push(v);
        cases.push(text[..i].to_vec());
    }
    let mut x = 0x2545_F491_4F6C_DD1D;
    for len in 0..200 {
        cases.push((0..len).map(|_| (xorshift(&mut x) >> 24) as u8).collect());
    }
    for bytes in &cases {
        match std::str::from_utf8(bytes) {
            Ok(s) => assert_eq!(utf8_tokens(bytes), Some(text_tokens(s)), "{bytes:x?}"),
            Err(_) => assert_eq!(utf8_tokens(bytes), None, "{bytes:x?}"),
        }
    }
}

#[test]
fn fast_and_reference_walks_give_the_same_estimate() {
    // Every string the fast walk reads raw, with escapes, scripts, invalid UTF-8, surrogates, control
    // characters and unexpected types; the same body through both walks.
    let texts = [
        "plain",
        "caf\\u00e9 \\\"quoted\\\"\\nline two \\/ \\\\",
        "中文，日本語です。카타카나 한국어 ภาษาไทย",
        "\\ud83d\\ude00 emoji pair",
        "\\ud800 lone",
        "\\udc00 lone",
        "\\ud800\\u0041",
        "tab\\there",
        "",
    ];
    let raw_bytes: [&[u8]; 5] = [b"\xff", b"\xe4\xb8", b"\xed\xa0\x80", b"\xc0\xaf", b"\x01"];
    let templates = [
        (
            ApiKind::ChatCompletions,
            r#"{"model":"m","messages":[{"role":"user","content":"@","name":"@","tool_call_id":"@"},{"role":"user","content":[{"type":"text","text":"@"},{"type":"image_url"}]}],"max_tokens":7}"#,
        ),
        (
            ApiKind::AnthropicMessages,
            r#"{"system":"@","messages":[{"role":"user","content":[{"type":"tool_result","content":"@"},{"type":"thinking","thinking":"@"},{"type":"tool_use","name":"@","input":{"q":"@"}}]}]}"#,
        ),
        (
            ApiKind::Responses,
            r#"{"input":[{"role":"user","content":"@"},{"type":"function_call_output","output":"@"},{"type":"x","text":"@"}],"instructions":"@"}"#,
        ),
        (ApiKind::Responses, r#"{"input":"@","user":"@"}"#),
        (
            ApiKind::Completions,
            r#"{"prompt":["@",[1,2]],"suffix":"@"}"#,
        ),
        (ApiKind::Embeddings, r#"{"input":"@"}"#),
    ];
    let odd_values = ["null", "5", "true", "{}", "[]", "[\"x\"]", "1e400", "[1,]"];
    let mut bodies: Vec<(ApiKind, Vec<u8>)> = Vec::new();
    let mut x = 0x9E37_79B9_7F4A_7C15;
    for (kind, template) in templates {
        for round in 0..200 {
            let mut body = Vec::new();
            for (hole, piece) in template.split("\"@\"").enumerate() {
                if hole > 0 {
                    let r = xorshift(&mut x);
                    if round % 5 == 4 && r.is_multiple_of(7) {
                        // A value of another type where a string is counted.
                        body.extend_from_slice(odd_values[(r >> 8) as usize % 8].as_bytes());
                    } else {
                        body.push(b'"');
                        body.extend_from_slice(texts[(r >> 16) as usize % texts.len()].as_bytes());
                        if r.is_multiple_of(11) {
                            body.extend_from_slice(raw_bytes[(r >> 24) as usize % 5]);
                        }
                        body.push(b'"');
                    }
                }
                body.extend_from_slice(piece.as_bytes());
            }
            bodies.push((kind, body));
        }
    }
    let mut accepted = 0;
    for (kind, body) in &bodies {
        accepted += usize::from(walk_fast(body, *kind, &mut Fields::new()).is_ok());
        assert_eq!(
            estimate_by(*kind, body, &limits, true),
            estimate_by(*kind, body, &limits, false),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    // The fast walk reads most bodies itself.
    assert!(
        accepted > bodies.len() / 5,
        "{accepted} of {}",
        bodies.len()
    );
}

/// The texts of every `corpus/*.jsonl` line (files in name order).
fn corpus_texts() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    paths.sort();
    let mut texts = Vec::new();
    for p in paths {
        let body = std::fs::read_to_string(&p).unwrap();
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line).unwrap();
            texts.push(v["text"].as_str().unwrap().to_string());
        }
    }
    texts
}

/// `count_features` with ASCII windows and without: the same counts and the same verdict on UTF-8.
fn windows_count_like_bytes(bytes: &[u8]) {
    let (mut with, mut without) = ([0u64; NUM_FEATURES], [0u64; NUM_FEATURES]);
    let ok = count_features::<true>(bytes, &mut with, true);
    assert_eq!(
        ok,
        count_features::<false>(bytes, &mut without, false),
        "{:?}",
        String::from_utf8_lossy(bytes)
    );
    if ok {
        // Short words are asked of their table while the text's first ones were and once two were
        // not tokens (`short_unknown`): the windows keep that state apart from the byte-wise loop's
        // and ask a window's words at once, so which of a text's short words are asked (and found
        // not to be tokens) depends on the path. Junk is asked on both (see
        // `random_short_words_are_never_estimated_far_below_o200k_wherever_they_stand`).
        for f in [&mut with, &mut without] {
            f[feature::SHORT_ASKED] = 0;
            f[feature::LATIN_SHORT_UNKNOWN] = 0;
        }
        assert_eq!(with, without, "{:?}", String::from_utf8_lossy(bytes));
    }
}

#[test]
fn ascii_windows_count_like_the_byte_wise_loop() {
    // Every class of ASCII byte, and what the byte-wise loop looks at next to ASCII (Latin letters
    // that go on with a word, fullwidth digits and Unicode line breaks after spaces, other
    // scripts), in random texts of every length around the window's, then the corpus.
    let pieces = [
        "a",
        "z",
        "Q",
        "abc",
        "the",
        "camelCase",
        "HTTPServer",
        "ALLCAPS",
        "I",
        "x1",
        "ab12cd",
        "abcdefghij",
        "internationalization",
        // Words the word table knows, with a space before them and without.
        " return",
        "function",
        " because",
        "String",
        " WHERE",
        "IOException",
        " information",
        "Response",
        " Привет",
        " после",
        "INTERNATIONALIZATION",
        "0",
        "7",
        "123",
        "123456",
        " ",
        " ",
        " ",
        "  ",
        "    ",
        "\t",
        " \t",
        "\t\t",
        "\t \t\t",
        "\t\t\t\t",
        "\n\t\t",
        "\t\t\n",
        "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t",
        "ｶﾀｶﾅ",
        "\n",
        "\r\n",
        "\n    ",
        " \n",
        ".",
        ",",
        ";",
        "\"",
        "\\",
        "()",
        "{}",
        "==",
        "->",
        "_",
        "/*",
        "\u{0}",
        "\u{7}",
        "\u{b}",
        "\u{c}",
        "\u{1b}",
        "\u{7f}",
        "é",
        "café",
        "ÉCOLE",
        "naïve",
        "１",
        "Ａ",
        "\u{85}",
        "\u{a0}",
        "\u{2028}",
        "\u{3000}",
        "中文",
        "カタカナ",
        "한국",
        "ภาษา",
        "😀",
        "—",
        "“",
        "Ж",
        "!?.,;:",
        "!!!!!",
        "})));",
        "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
        "\n\n\n\n\n\n\n\n",
        "Q2hlY2sgdGhp+/",
        "9k",
        "Lm",
        "getHttpResponse",
        "\u{200b}",
    ];
    let mut x = 0x2545_F491_4F6C_DD1D;
    for round in 0..30_000 {
        let n = (xorshift(&mut x) % 48) as usize + round % 3;
        let mut text = String::new();
        for _ in 0..n {
            text.push_str(pieces[(xorshift(&mut x) >> 20) as usize % pieces.len()]);
        }
        windows_count_like_bytes(text.as_bytes());
        // Invalid UTF-8 in the middle too.
        if round % 16 == 0 && !text.is_empty() {
            let mut bytes = text.into_bytes();
            let at = (xorshift(&mut x) as usize) % bytes.len();
            bytes.insert(at, 0xff);
            windows_count_like_bytes(&bytes);
        }
    }
    let texts = corpus_texts();
    let all = texts.join("\n\n");
    for t in texts.iter().chain([&all]) {
        windows_count_like_bytes(t.as_bytes());
    }
}

#[test]
fn the_fast_walk_reads_corpus_bodies_itself_and_agrees_with_the_reference_walk() {
    // Plain and escaped texts of every script, short and long, in the shapes of every API; the
    // scanner accepts them all (no fallback) and gives the reference walk's estimate.
    let texts = corpus_texts();
    let mut contents: Vec<String> = texts.clone();
    for size in [1 << 10, 16 << 10] {
        for start in [0, 100, 200, 300] {
            let mut s = String::new();
            for t in texts.iter().cycle().skip(start) {
                if s.len() >= size {
                    break;
                }
                s.push_str(t);
                s.push_str("\n\n");
            }
            contents.push(s);
        }
    }
    for c in &contents {
        let bodies = [
            (
                ApiKind::ChatCompletions,
                serde_json::json!({"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": c, "name": "x"}], "max_tokens": 9, "stream": true}),
            ),
            (
                ApiKind::AnthropicMessages,
                serde_json::json!({"system": c, "messages": [{"role": "user", "content": [{"type": "text", "text": c}, {"type": "tool_result", "content": c}]}], "max_tokens": 9}),
            ),
            (
                ApiKind::Responses,
                serde_json::json!({"input": [{"role": "user", "content": c}], "instructions": "x", "tools": [{"type": "function", "name": "f", "parameters": {"a": [1, 2.5, null]}}]}),
            ),
            (
                ApiKind::Completions,
                serde_json::json!({"prompt": [c, "x"], "n": 2}),
            ),
            (ApiKind::Embeddings, serde_json::json!({"input": c})),
        ];
        for (kind, v) in bodies {
            for body in [v.to_string(), serde_json::to_string_pretty(&v).unwrap()] {
                let body = body.as_bytes();
                assert!(
                    walk_fast(body, kind, &mut Fields::new()).is_ok(),
                    "{}",
                    String::from_utf8_lossy(body)
                );
                assert_eq!(
                    estimate_by(kind, body, &limits, true),
                    estimate_by(kind, body, &limits, false)
                );
            }
        }
    }
}

#[test]
fn the_fast_walk_agrees_with_the_reference_walk_on_edge_cases() {
    // Numbers, nesting around serde_json's limit, escapes, whitespace, keys and syntax errors:
    // where the scanner is unsure it gives up, and the reference walk answers.
    let nested = |depth: usize, inner: &str| {
        format!(
            r#"{{"metadata":{}{inner}{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
    };
    let mut bodies: Vec<String> = [
        "0",
        "-0",
        "7",
        "-7",
        "1.0",
        "1e2",
        "1E+2",
        "1e-2",
        "2.5E308",
        "1e400",
        "-1e400",
        "1e-400",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999",
        "-9223372036854775808",
        "-9223372036854775809",
        "01",
        "-01",
        "1.",
        ".5",
        "-",
        "1e",
        "+1",
        "1_0",
        "0x10",
        "00",
        "1.2.3",
        "true",
        "false",
        "null",
        "\"7\"",
        "[]",
        "{}",
    ]
    .iter()
    .flat_map(|n| {
        [
            format!(r#"{{"max_tokens":{n},"messages":[{{"content":"hi"}}]}}"#),
            format!(r#"{{"temperature":{n}}}"#),
            format!(r#"{{"tools":[{{"a":{n}}}],"n":{n}}}"#),
            format!(r#"{{"prompt":[[1,{n}],{n}]}}"#),
        ]
    })
    .collect();
    for depth in [1, 60, 120, 125, 126, 127, 128, 129, 200] {
        bodies.push(nested(depth, "1"));
        bodies.push(nested(depth, r#""x""#));
        bodies.push(format!(
            r#"{{"messages":[{{"content":[{}{{"type":"text","text":"deep"}}{}]}}]}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        ));
    }
    for s in [
        r"\ud83d\ude00",
        r"\uD83D\uDE00",
        r"\ud800",
        r"\udc00",
        r"\ud800\u0041",
        r"\udbff\udfff",
        r"\u0000",
        r"\u001f",
        r"\u0022",
        r"\u005c",
        r"\u002F",
        r"\x",
        r"\u12",
        r"\u12g4",
        r"\",
        r"a\\",
        r#"\""#,
        r"\/\b\f\n\r\t",
        "\u{1}",
        "\t",
        "\u{7f}",
        "é",
        "\u{ff}",
    ] {
        for field in ["content", "name", "role"] {
            bodies.push(format!(r#"{{"messages":[{{"{field}":"a{s}b"}}]}}"#));
            bodies.push(format!(
                r#"{{"messages":[{{"{field}":"{}{s}{}"}}]}}"#,
                "x".repeat(70),
                "y \\n".repeat(30)
            ));
        }
    }
    bodies.extend(
        [
            " {\"model\" : \"m\" , \"messages\" :\n[ ]\t}\r\n",
            "{\"model\":\"a\",\"model\":\"b\"}",
            "{\"\\u006dodel\":\"m\"}",
            "{\"mod\\u00e9l\":\"m\",\"模型\":1}",
            "{\"messages\":[1,]}",
            "{\"messages\":[,1]}",
            "{\"a\":1,}",
            "{,\"a\":1}",
            "{\"a\" 1}",
            "{\"a\":1 \"b\":2}",
            "{\"a\":1}}",
            "{\"a\":1} x",
            "{\"a\":nul}",
            "{\"a\":tru}",
            "{\"a\":[}",
            "[1,2]",
            "\"x\"",
            "",
            "   ",
            "\u{feff}{}",
            "{'a':1}",
        ]
        .map(String::from),
    );
    for kind in [
        ApiKind::ChatCompletions,
        ApiKind::Completions,
        ApiKind::Embeddings,
        ApiKind::Responses,
        ApiKind::AnthropicMessages,
    ] {
        for body in &bodies {
            assert_eq!(
                estimate_by(kind, body.as_bytes(), &limits, true),
                estimate_by(kind, body.as_bytes(), &limits, false),
                "{kind:?} {body}"
            );
        }
    }
    // The scanner itself accepts plain numbers, nesting up to serde_json's limit (127 levels)
    // and valid escapes, and gives up where serde_json would fail.
    let accepts = |body: &str| {
        walk_fast(
            body.as_bytes(),
            ApiKind::ChatCompletions,
            &mut Fields::new(),
        )
        .is_ok()
    };
    assert!(accepts(&nested(126, "1")));
    assert!(!accepts(&nested(127, "1")));
    assert!(accepts(
        r#"{"max_tokens":12,"temperature":-0.5,"messages":[{"content":"\ud83d\ude00\n"}]}"#
    ));
    assert!(!accepts(r#"{"messages":[{"content":"\ud800"}]}"#));
    assert!(!accepts(r#"{"temperature":1e400}"#));
}

#[test]
fn a_word_tail_read_from_one_or_two_loads_is_the_one_read_a_step_at_a_time() {
    // Pieces around the edges of what an accented letter is (× ÷ and U+02B0 are not; Đ đ are not
    // of Latin Extended-A's feature; U+1F00 is Greek), stray and missing continuation bytes.
    let pieces: [&[u8]; 24] = [
        b"a",
        b"z",
        b"q",
        b"A",
        b" ",
        b"1",
        b"-",
        "é".as_bytes(),
        "ÿ".as_bytes(),
        "À".as_bytes(),
        "×".as_bytes(),
        "÷".as_bytes(),
        "Đ".as_bytes(),
        "đ".as_bytes(),
        "ł".as_bytes(),
        "ơ".as_bytes(),
        "ʯ".as_bytes(),
        "ʰ".as_bytes(),
        "ḁ".as_bytes(),
        "ỹ".as_bytes(),
        "ἀ".as_bytes(),
        "я".as_bytes(),
        b"\xa9",
        b"\xc3",
    ];
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut checked = 0usize;
    for len in 0..40usize {
        for _ in 0..200 {
            let mut buf = Vec::new();
            for _ in 0..len {
                // Letters more often than the rest: long words.
                let r = (xorshift(&mut x) >> 24) as usize;
                let piece = if r.is_multiple_of(3) {
                    r / 3 % 3
                } else {
                    r % pieces.len()
                };
                buf.extend_from_slice(pieces[piece]);
            }
            for i in 0..=buf.len() {
                assert_eq!(
                    word_tail(&buf, i),
                    tail_steps(&buf, i),
                    "at {i} of {:?}",
                    String::from_utf8_lossy(&buf)
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 100_000);
}

#[test]
fn accented_letters_are_read_without_a_decode_as_their_code_points_say() {
    // Every character of two bytes and of U+1000..=U+1FFF: an accented letter iff `is_latin_ext`,
    // of Latin Extended-A's feature iff U+0100..=U+017F but Đ đ (the rule before the table).
    let mut letters = 0;
    for cp in (0x80u32..0x800).chain(0x1000..0x2000) {
        let c = char::from_u32(cp).unwrap();
        let mut buf = [0u8; 4];
        let bytes = c.encode_utf8(&mut buf).as_bytes();
        let want = is_latin_ext(cp).then(|| {
            let a = (0x100..=0x17F).contains(&cp) && cp != 0x110 && cp != 0x111;
            (bytes.len(), a)
        });
        assert_eq!(latin_ext_at(bytes, 0), want, "U+{cp:04X}");
        letters += usize::from(want.is_some());
    }
    assert_eq!(letters, 0x2B0 - 0xC0 - 2 + 0x100);
}

#[test]
fn scanner_unescapes_like_serde_json() {
    // Strings of runs of plain characters (of every length: escapes close together, as in code and
    // tables, far apart, as in prose, and mixes that move between the two ways of finding them),
    // each run followed by a character that is escaped, sometimes as `\uXXXX` (surrogate pairs
    // too); what the scanner reads is what serde_json reads.
    use serde::Deserialize;
    let plain = ["a", "Z", "é", "中", "😀", " ", "/", "7"];
    let special = [
        '"', '\\', '\n', '\t', '\r', '\u{1}', '/', 'é', '中', '😀', 'x',
    ];
    let mut x = 0x2545_F491_4F6C_DD1D;
    for round in 0..3000 {
        let mut json = String::from("\"");
        let runs = xorshift(&mut x) % 40;
        for _ in 0..runs {
            let r = xorshift(&mut x);
            let len = match r % 4 {
                0 => r >> 8 & 3,
                1 => 5 + (r >> 8) % 20,
                2 => 30 + (r >> 8) % 120,
                _ => (r >> 8) % 70,
            };
            for _ in 0..len {
                json.push_str(plain[(xorshift(&mut x) % 8) as usize]);
            }
            let r = xorshift(&mut x);
            let c = special[(r % 11) as usize];
            match c {
                '"' => json.push_str("\\\""),
                '\\' => json.push_str("\\\\"),
                '\n' => json.push_str("\\n"),
                '\t' => json.push_str("\\t"),
                '\r' => json.push_str("\\r"),
                '/' if r >> 8 & 1 == 0 => json.push_str("\\/"),
                c if (c as u32) < 0x20 || r >> 8 & 1 == 0 => {
                    for unit in c.encode_utf16(&mut [0; 2]) {
                        json.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => json.push(c),
            }
        }
        json.push('"');
        if round % 2 == 0 {
            // Past the string's end: the body goes on (a string in the middle of a body).
            json.push(' ');
        }
        let expected: String = serde_json::from_str(&json).unwrap();
        let mut scanner = super::super::json::Scanner::new(json.as_bytes());
        let got = String::deserialize(&mut scanner).ok();
        assert_eq!(got.as_deref(), Some(expected.as_str()), "{json}");
    }
}

#[test]
fn a_window_of_byte_compares_marks_what_its_words_mark() {
    // The special-byte mask of a window (quotes, backslashes, control characters) from byte
    // compares (vector targets) and from words of eight bytes (the rest): the same bits, on windows
    // of bytes near each test's edges (0x1F / 0x20, 0x22, 0x5C, their values with the high bit
    // set, 0x7F / 0x80) and random ones.
    use super::super::escapes::{special_bits_bytes, special_bits_words, WINDOW};
    let edges = [
        0x00, 0x1F, 0x20, 0x21, 0x22, 0x23, 0x5B, 0x5C, 0x5D, 0x7F, 0x80, 0x9F, 0xA0, 0xA2, 0xDC,
        0xFF, b'a', b't', b'n',
    ];
    let mut x = 0x2545_F491_4F6C_DD1D;
    for round in 0..20_000u32 {
        let mut window = [0u8; WINDOW];
        for b in &mut window {
            let r = xorshift(&mut x);
            *b = if round.is_multiple_of(3) {
                r as u8
            } else {
                edges[(r % edges.len() as u64) as usize]
            };
        }
        let exact = window.iter().enumerate().fold(0u64, |m, (k, &b)| {
            m | u64::from(b == b'"' || b == b'\\' || b < 0x20) << k
        });
        assert_eq!(special_bits_bytes(&window), exact, "{window:?}");
        assert_eq!(special_bits_words(&window), exact, "{window:?}");
    }
}

#[test]
fn scanner_unescapes_tables_like_serde_json() {
    // Escapes every few bytes and rows with one line break (TSV, CSV and Markdown tables), so that
    // the scanner moves in and out of its windows at every offset, with now and then a `\uXXXX`
    // escape, an escaped quote or backslash, or a run of backslashes; what it reads is what
    // serde_json reads.
    use serde::Deserialize;
    let cells = [
        "", "7", "ab", "1.5", "naïve", "中文", "x y z", "| a |", "-----", "😀",
    ];
    let mut x = 0x9E37_79B9_7F4A_7C15;
    for round in 0..2000u32 {
        let mut json = String::from("\"");
        let rows = xorshift(&mut x) % 30;
        for _ in 0..rows {
            let cols = xorshift(&mut x) % 9;
            for c in 0..cols {
                let r = xorshift(&mut x);
                for _ in 0..=(r >> 8) % 4 {
                    json.push_str(cells[(r >> 16) as usize % cells.len()]);
                }
                let sep = match r % 16 {
                    0 => "\\u0009",
                    1 => "\\\"",
                    2 => "\\\\",
                    3 => "\\\\\\\\\\t",
                    4 => "\\/",
                    5 => " | ",
                    _ if round.is_multiple_of(2) => "\\t",
                    _ => ",",
                };
                if c + 1 < cols {
                    json.push_str(sep);
                }
            }
            json.push_str(if xorshift(&mut x).is_multiple_of(5) {
                "\\r\\n"
            } else {
                "\\n"
            });
        }
        json.push('"');
        let expected: String = serde_json::from_str(&json).unwrap();
        let mut scanner = super::super::json::Scanner::new(json.as_bytes());
        let got = String::deserialize(&mut scanner).ok();
        assert_eq!(got.as_deref(), Some(expected.as_str()), "{json}");
    }
}

#[test]
fn escapes_begin_where_a_backslash_at_a_time_finds_them() {
    // The bits where escapes begin in a window of backslashes (every second of a run, from its
    // first), from one subtraction, against the bits found one at a time; dense and sparse masks.
    use super::super::escapes::escapes;
    let mut x = 0x2545_F491_4F6C_DD1D;
    for round in 0..20_000u32 {
        let mut special = xorshift(&mut x);
        for _ in 0..round % 4 {
            special |= xorshift(&mut x);
        }
        if round.is_multiple_of(5) {
            special &= xorshift(&mut x);
        }
        let mut want = 0u64;
        let mut k = 0;
        while k < 64 {
            if special >> k & 1 == 1 {
                want |= 1 << k;
                k += 2;
            } else {
                k += 1;
            }
        }
        assert_eq!(escapes(special), want, "{special:#066b}");
    }
}

#[test]
fn a_role_read_raw_costs_what_the_reference_walk_says() {
    // The fast walk reads `role` as bytes (a known role without a UTF-8 check): every kind of value
    // and string gives the reference walk's estimate, or its error.
    let mut bodies: Vec<Vec<u8>> = [
        "null",
        "1",
        "-2.5",
        "true",
        "[]",
        "[\"user\", 7]",
        "{}",
        "{\"role\": \"user\"}",
        "\"user\"",
        "\"assistant\"",
        "\"system\"",
        "\"developer\"",
        "\"tool\"",
        "\"function\"",
        "\"us\\u0065r\"",
        "\"User\"",
        "\"users\"",
        "\"bot\"",
        "\"\"",
        "\"r\u{f4}le \u{4e2d}\u{6587}\"",
        "\"a\\nb\"",
    ]
    .iter()
    .map(|r| {
        format!(
            r#"{{"messages":[{{"role":{r},"content":"Hi there."}},{{"content":"x","role":{r}}}]}}"#
        )
        .into_bytes()
    })
    .collect();
    bodies.push(b"{\"messages\":[{\"role\":\"us\xffer\",\"content\":\"Hi\"}]}".to_vec());
    bodies.push(b"{\"messages\":[{\"role\":\"\xc3\",\"content\":\"Hi\"}]}".to_vec());
    let mut costs = std::collections::BTreeSet::new();
    for body in &bodies {
        let fast = estimate_by(ApiKind::ChatCompletions, body, &limits, true);
        assert_eq!(
            fast,
            estimate_by(ApiKind::ChatCompletions, body, &limits, false),
            "{}",
            String::from_utf8_lossy(body)
        );
        costs.insert(format!("{:?}", fast.map(|e| e.prompt_tokens)));
    }
    // Known roles, others, nothing and errors: at least four different results.
    assert!(costs.len() >= 4, "{costs:?}");
}
