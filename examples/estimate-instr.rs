//! Instructions per KB of `tokengate::estimate`, per corpus class, counted natively by callgrind
//! (deterministic, unlike timings on a shared machine): chat-completions bodies of every class at
//! ~1 KB × 64 and ~16 KB × 8, built as `benches/estimate.rs` builds them.
//!
//! `scripts/estimate-instr.sh` runs it under `valgrind --tool=callgrind` with one dump per set
//! (`--toggle-collect` and `--dump-after` on `measure`) and prints instructions per KB per class;
//! run alone, it only prints the sets' sizes in its order. With the argument `dump` it prints
//! `text_tokens` of every corpus line and of 4000 random texts made from them (slices, mixes of
//! classes, random Thai), one a line, to check that an optimisation leaves the estimates as they were.
#[path = "../benches/common/bodies.rs"]
mod bodies;

use bodies::sized_bodies;
use std::hint::black_box;
use std::path::Path;
use tokengate::estimate::{estimate, text_tokens, ApiKind, OutputLimits};

/// The measured call: every body estimated once (one callgrind dump per call).
#[inline(never)]
fn measure(bodies: &[Vec<u8>]) {
    let limits = |_: Option<&str>| OutputLimits {
        default_tokens: 1024,
        cap_tokens: 32768,
    };
    for b in bodies {
        black_box(estimate(ApiKind::ChatCompletions, black_box(b), &limits).ok());
    }
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter_map(|n| n.strip_suffix(".jsonl").map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let load = |name: &str| -> Vec<String> {
        let raw = std::fs::read_to_string(dir.join(format!("{name}.jsonl"))).unwrap_or_default();
        raw.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v.get("text").and_then(|t| t.as_str()).map(str::to_string))
            .collect()
    };
    if std::env::args().nth(1).as_deref() == Some("dump") {
        dump(&names.iter().flat_map(|n| load(n)).collect::<Vec<_>>());
        return;
    }
    for name in names {
        let texts = load(&name);
        for (size, count) in [(1usize << 10, 64usize), (16 << 10, 8)] {
            let bodies = sized_bodies(&texts, size, count);
            let bytes: usize = bodies.iter().map(Vec::len).sum();
            println!("{name} {} {bytes}", size >> 10);
            measure(&bodies);
        }
    }
}

/// `text_tokens` of every text and of random texts made from them, one a line.
fn dump(texts: &[String]) {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut rand = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n.max(1) as u64) as usize
    };
    for t in texts {
        println!("{}", text_tokens(t));
    }
    let cut = |t: &str, mut k: usize| {
        while !t.is_char_boundary(k) {
            k -= 1;
        }
        k
    };
    for _ in 0..4000 {
        let mut s = String::new();
        for _ in 0..1 + rand(4) {
            let t = &texts[rand(texts.len())];
            let a = cut(t, rand(t.len()));
            let b = cut(t, a + rand(t.len() - a + 1));
            s.push_str(&t[a..b]);
            match rand(4) {
                0 => s.push(' '),
                1 => s.push('\t'),
                2 => {
                    for _ in 0..rand(40) {
                        let c = char::from_u32(0xE01 + rand(0x5B) as u32).unwrap_or(' ');
                        s.push(if rand(6) == 0 { ' ' } else { c });
                    }
                }
                _ => {}
            }
        }
        println!("{}", text_tokens(&s));
    }
}
