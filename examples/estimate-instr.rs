//! Instructions per KB of `tokengate::estimate`, per corpus class, counted natively by callgrind
//! (deterministic, unlike timings on a shared machine): chat-completions bodies of every class at
//! ~1 KB × 64 and ~16 KB × 8, built as `benches/estimate.rs` builds them.
//!
//! `scripts/estimate-instr.sh` runs it under `valgrind --tool=callgrind` with one dump per set
//! (`--toggle-collect` and `--dump-after` on `measure`) and prints instructions per KB per class;
//! run alone, it only prints the sets' sizes in its order. With the argument `dump` it prints
//! `text_tokens` of every corpus line and of 4000 random texts made from them (slices, mixes of
//! classes, random Thai), one a line, to check that an optimisation leaves the estimates as they were,
//! then the `Estimate` (Debug) of every measured body (JSON escapes, framing) and of
//! every corpus line as its own chat body.
//!
//! `estimate-instr repeat <class> <KB> <times>` estimates one class's set (`sized_bodies` of ~`KB`
//! KB, 64 bodies at 1 KB, else 8; the class `every-line` is every corpus line as its own body, `tiny`
//! the 154-byte body, and `KB` is then ignored) `times` times and prints the bytes estimated, for
//! `perf stat` or `time` (CPU time per KB of one class; nothing else in the process).
#[path = "../benches/common/bodies.rs"]
mod bodies;

use bodies::{chat_body, sized_bodies};
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
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("dump") => {
            dump(&names.iter().flat_map(|n| load(n)).collect::<Vec<_>>());
            for name in &names {
                let texts = load(name);
                for (size, count) in [(1usize << 10, 64usize), (16 << 10, 8)] {
                    dump_bodies(&sized_bodies(&texts, size, count));
                }
                let lines: Vec<Vec<u8>> = texts.iter().map(|t| chat_body(&[t.as_str()])).collect();
                dump_bodies(&lines);
            }
            return;
        }
        Some("repeat") => {
            let arg = |k: usize| args.get(k).map(String::as_str).unwrap_or_default();
            let (Ok(kb), Ok(times)) = (arg(3).parse::<usize>(), arg(4).parse::<usize>()) else {
                eprintln!("usage: estimate-instr repeat <class> <KB> <times>");
                std::process::exit(2);
            };
            let count = if kb <= 1 { 64 } else { 8 };
            let bodies = match arg(2) {
                "every-line" => names
                    .iter()
                    .flat_map(|n| load(n))
                    .map(|t| chat_body(&[t.as_str()]))
                    .collect(),
                "tiny" => vec![TINY.to_vec()],
                class => sized_bodies(&load(class), kb << 10, count),
            };
            let bytes: usize = bodies.iter().map(Vec::len).sum();
            for _ in 0..times {
                measure(&bodies);
            }
            println!("{} {kb} {bytes} x {times}", arg(2));
            return;
        }
        _ => {}
    }
    let mut lines = Vec::new();
    for name in names {
        let texts = load(&name);
        for (size, count) in [(1usize << 10, 64usize), (16 << 10, 8)] {
            let bodies = sized_bodies(&texts, size, count);
            let bytes: usize = bodies.iter().map(Vec::len).sum();
            println!("{name} {} {bytes}", size >> 10);
            measure(&bodies);
        }
        lines.extend(texts.iter().map(|t| chat_body(&[t.as_str()])));
    }
    // Every corpus line as its own body (as `benches/estimate.rs` times it), and the 154-byte chat
    // body: the fixed cost of a call.
    let bytes: usize = lines.iter().map(Vec::len).sum();
    println!(
        "every-line {:.1} {bytes}",
        bytes as f64 / 1024.0 / lines.len().max(1) as f64
    );
    measure(&lines);
    println!("tiny-154B 0.15 {}", TINY.len());
    measure(&[TINY.to_vec()]);
}

/// The 154-byte chat body `benches/estimate.rs` times per call.
const TINY: &[u8] = br#"{"model":"gpt-4.1","max_tokens":16,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in one short sentence."}]}"#;

/// What `estimate` gives each body (the `Estimate` or the error, Debug), one a line.
fn dump_bodies(bodies: &[Vec<u8>]) {
    let limits = |_: Option<&str>| OutputLimits {
        default_tokens: 1024,
        cap_tokens: 32768,
    };
    for b in bodies {
        match estimate(ApiKind::ChatCompletions, b, &limits) {
            Ok(e) => println!("{e:?}"),
            Err(e) => println!("error {e:?}"),
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
