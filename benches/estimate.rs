//! Accuracy and speed of `tokengate::estimate` (harness = false).
//!
//! `cargo bench --bench estimate -p tokengate`
//!
//! 1. Accuracy: every `corpus/*.jsonl` line (`{"text": …}`) is counted with OpenAI's `o200k_base`
//!    (tiktoken-rs, vocabulary bundled in the crate, no network) and estimated with `text_tokens` and
//!    with the naive `chars / 4`. Per class: median relative error and p95 |relative error|, on all lines
//!    and on the odd (held-out: the weights were fitted on the even lines) lines.
//! 2. Speed: chat-completions bodies (each corpus line; English and CJK text joined to ~1 KB, ~16 KB and
//!    ~256 KB; every other corpus class joined to ~1 KB and ~16 KB); `estimate` timed against
//!    `serde_json::from_slice::<Value>` alone in the same run, in µs per KB of body, best of 5
//!    interleaved trials of ≥ 120 ms. Then a 154-byte chat body in ns per call (the fixed cost of a
//!    call), and `text_tokens` alone.
//!
//! Exits non-zero when one of the target classes (English prose, code, JSON, Thai, Japanese, Chinese,
//! Korean, mixed) has p95 |error| above 15 % (all lines); the other script classes (Cyrillic, Greek,
//! Arabic, Hebrew, Hindi, accented Latin, Vietnamese) are not all fitted that far yet and fail above
//! 30 % (a regression guard); the `adversarial` class (synthetic junk: punctuation, random letters,
//! base64, whitespace runs, zero-width characters) is gated on its lowest estimate / real ratio
//! instead (at least 0.15, a regression guard: the estimate may be over on junk, the aim is never to
//! be far under; its table row shows that ratio). Speed is printed, never gated: absolute times
//! depend on the machine and its load (the target is ≤ 2 µs/KB natively).
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};
use tokengate::estimate::{estimate, text_tokens, ApiKind, OutputLimits};

const P95_LIMIT: f64 = 15.0;
/// Classes held to [`P95_LIMIT`]; every other script class to [`P95_GUARD`].
const TARGET_CLASSES: [&str; 8] = [
    "english", "code", "json", "thai", "japanese", "chinese", "korean", "mixed",
];
/// Regression guard of the script classes not yet fitted to [`P95_LIMIT`].
const P95_GUARD: f64 = 30.0;
/// Class gated on its lowest estimate / real ratio instead of p95.
const ADVERSARIAL: &str = "adversarial";
/// Lowest estimate / real ratio allowed in [`ADVERSARIAL`] (a regression guard).
const MIN_RATIO: f64 = 0.15;

fn load_corpus(dir: &Path) -> Result<Vec<(String, Vec<String>)>, String> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for p in paths {
        let name = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let body = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let mut texts = Vec::new();
        for (n, line) in body
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| format!("{}:{}: {e}", p.display(), n + 1))?;
            let t = v.get("text").and_then(|t| t.as_str());
            texts.push(
                t.ok_or(format!("{}:{}: no \"text\"", p.display(), n + 1))?
                    .to_string(),
            );
        }
        out.push((name, texts));
    }
    Ok(out)
}

/// Quantile by nearest rank on a sorted copy.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let idx = (s.len().saturating_sub(1) as f64 * q).round() as usize;
    s.get(idx).copied().unwrap_or(f64::NAN)
}

struct Stats {
    median: f64,
    p95: f64,
}

fn stats(errs: &[f64]) -> Stats {
    let abs: Vec<f64> = errs.iter().map(|e| e.abs()).collect();
    Stats {
        median: quantile(errs, 0.5),
        p95: quantile(&abs, 0.95),
    }
}

/// µs per KB of running `f` over all `bodies`: the best of `TRIALS` trials of ≥ `TRIAL` each (the
/// minimum is the least noisy estimate on a shared machine).
fn time_per_kb(bodies: &[Vec<u8>], f: &mut dyn FnMut(&[u8])) -> f64 {
    let bytes: usize = bodies.iter().map(Vec::len).sum();
    let mut passes = 0u32;
    let start = Instant::now();
    while passes < 100_000 && (passes < 2 || start.elapsed() < TRIAL) {
        for b in bodies {
            f(black_box(b));
        }
        passes += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    secs * 1e6 / (bytes as f64 / 1024.0 * f64::from(passes))
}

const TRIALS: usize = 5;
const TRIAL: Duration = Duration::from_millis(120);

/// Best-of-`TRIALS` µs/KB of each function, trials interleaved so that load spikes hit all of them.
/// A function under test: one call per body.
type Bench<'a> = &'a mut dyn FnMut(&[u8]);

fn compare(bodies: &[Vec<u8>], fs: &mut [Bench<'_>]) -> Vec<f64> {
    let mut best = vec![f64::INFINITY; fs.len()];
    for _ in 0..TRIALS {
        for (f, b) in fs.iter_mut().zip(best.iter_mut()) {
            *b = b.min(time_per_kb(bodies, *f));
        }
    }
    best
}

fn chat_body(texts: &[&str]) -> Vec<u8> {
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a helpful assistant."})];
    for t in texts {
        messages.push(serde_json::json!({"role": "user", "content": t}));
    }
    serde_json::json!({
        "model": "gpt-4.1",
        "messages": messages,
        "max_tokens": 256,
        "stream": true,
        "stream_options": {"include_usage": true}
    })
    .to_string()
    .into_bytes()
}

/// Bodies of about `size` bytes: one user message of corpus texts joined (cycling, so the bodies
/// differ) and cut at a character boundary.
fn sized_bodies(texts: &[String], size: usize, count: usize) -> Vec<Vec<u8>> {
    // The rest of the body (model, system message, options) is about 180 bytes.
    let target = size.saturating_sub(180).max(1);
    let mut out = Vec::new();
    let mut next = texts.iter().cycle();
    for _ in 0..count {
        let mut content = String::new();
        while content.len() < target {
            match next.next() {
                Some(t) => {
                    content.push_str(t);
                    content.push_str("\n\n");
                }
                None => break,
            }
        }
        let mut cut = target.min(content.len());
        while !content.is_char_boundary(cut) {
            cut -= 1;
        }
        content.truncate(cut);
        out.push(chat_body(&[content.as_str()]));
    }
    out
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let corpus = match load_corpus(&dir) {
        Ok(c) if !c.is_empty() => c,
        Ok(_) => {
            eprintln!("no corpus/*.jsonl under {}", dir.display());
            std::process::exit(2);
        }
        Err(e) => {
            eprintln!("corpus: {e}");
            std::process::exit(2);
        }
    };
    let bpe = match tiktoken_rs::o200k_base() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("o200k_base: {e}");
            std::process::exit(2);
        }
    };

    println!(
        "Token estimate vs o200k_base (relative error per sample: (estimate - real) / real)\n"
    );
    println!("| class | samples | ours median | ours p95 | held-out median | held-out p95 | chars/4 median | chars/4 p95 | lowest estimate / real |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut failed = Vec::new();
    for (name, texts) in &corpus {
        let (mut ours, mut held, mut naive) = (Vec::new(), Vec::new(), Vec::new());
        for (i, t) in texts.iter().enumerate() {
            let real = bpe.encode_ordinary(t).len().max(1) as f64;
            let e = (text_tokens(t) as f64 - real) / real * 100.0;
            ours.push(e);
            if i % 2 == 1 {
                held.push(e);
            }
            let chars4 = (t.chars().count() as f64 / 4.0).ceil();
            naive.push((chars4 - real) / real * 100.0);
        }
        let (o, h, n) = (stats(&ours), stats(&held), stats(&naive));
        let lowest = ours
            .iter()
            .fold(f64::INFINITY, |m, e| m.min(1.0 + e / 100.0));
        println!(
            "| {name} | {} | {:+.1} % | {:.1} % | {:+.1} % | {:.1} % | {:+.1} % | {:.1} % | {lowest:.2} |",
            texts.len(),
            o.median,
            o.p95,
            h.median,
            h.p95,
            n.median,
            n.p95
        );
        let bad = if name == ADVERSARIAL {
            lowest < MIN_RATIO || lowest.is_nan()
        } else if TARGET_CLASSES.contains(&name.as_str()) {
            o.p95 > P95_LIMIT || o.p95.is_nan()
        } else {
            o.p95 > P95_GUARD || o.p95.is_nan()
        };
        if bad {
            failed.push(name.clone());
        }
    }

    // Speed. Absolute numbers depend on the machine and its load; they are printed, never gated.
    let limits = |_: Option<&str>| OutputLimits {
        default_tokens: 1024,
        cap_tokens: 32768,
    };
    let class = |name: &str| -> Vec<String> {
        corpus
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, t)| t.iter().cloned())
            .collect()
    };
    let (english, chinese) = (class("english"), class("chinese"));
    // The fixed cost of a call: what a short chat request pays (once per request in the filter).
    let tiny = br#"{"model":"gpt-4.1","max_tokens":16,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in one short sentence."}]}"#.to_vec();
    let all: Vec<Vec<u8>> = corpus
        .iter()
        .flat_map(|(_, texts)| texts.iter())
        .map(|t| chat_body(&[t]))
        .collect();
    let mut sets: Vec<(String, Vec<Vec<u8>>)> = vec![
        (format!("every corpus line, {} bodies", all.len()), all),
        (
            "English ~1 KB × 64".into(),
            sized_bodies(&english, 1 << 10, 64),
        ),
        (
            "English ~16 KB × 8".into(),
            sized_bodies(&english, 16 << 10, 8),
        ),
        (
            "English ~256 KB × 1".into(),
            sized_bodies(&english, 256 << 10, 1),
        ),
        ("CJK ~1 KB × 64".into(), sized_bodies(&chinese, 1 << 10, 64)),
        ("CJK ~16 KB × 8".into(), sized_bodies(&chinese, 16 << 10, 8)),
        (
            "CJK ~256 KB × 1".into(),
            sized_bodies(&chinese, 256 << 10, 1),
        ),
    ];
    // The other corpus classes (CJK above is Chinese).
    for name in [
        "japanese",
        "korean",
        "thai",
        "code",
        "json",
        "mixed",
        "cyrillic",
        "latin",
        "adversarial",
    ] {
        let texts = class(name);
        sets.push((
            format!("{name} ~1 KB × 64"),
            sized_bodies(&texts, 1 << 10, 64),
        ));
        sets.push((
            format!("{name} ~16 KB × 8"),
            sized_bodies(&texts, 16 << 10, 8),
        ));
    }
    println!("\nSpeed of `estimate` (chat-completions bodies; µs per KB of body, best of {TRIALS} interleaved trials):\n");
    println!(
        "| bodies | KB each | `estimate` | `from_slice::<Value>` alone | estimate / Value parse |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (label, bodies) in &sets {
        let kb_each =
            bodies.iter().map(Vec::len).sum::<usize>() as f64 / 1024.0 / bodies.len().max(1) as f64;
        let mut ours = |b: &[u8]| {
            black_box(estimate(ApiKind::ChatCompletions, b, &limits).ok());
        };
        let mut parse = |b: &[u8]| {
            black_box(serde_json::from_slice::<serde_json::Value>(b).ok());
        };
        let t = compare(bodies, &mut [&mut ours, &mut parse]);
        let (ours, parse) = (
            t.first().copied().unwrap_or(f64::NAN),
            t.get(1).copied().unwrap_or(f64::NAN),
        );
        println!(
            "| {label} | {kb_each:.1} | {ours:.3} | {parse:.3} | {:.2}× |",
            ours / parse
        );
    }
    let mut ours = |b: &[u8]| {
        black_box(estimate(ApiKind::ChatCompletions, b, &limits).ok());
    };
    let t = compare(std::slice::from_ref(&tiny), &mut [&mut ours]);
    println!(
        "\n`estimate` on the 154-byte chat body: {:.0} ns per call",
        t.first().copied().unwrap_or(f64::NAN) * tiny.len() as f64 / 1024.0 * 1000.0
    );
    // Where the time goes: `text_tokens` alone over the texts (per KB of text).
    let texts: Vec<Vec<u8>> = corpus
        .iter()
        .flat_map(|(_, t)| t.iter())
        .map(|t| t.clone().into_bytes())
        .collect();
    let mut count = |b: &[u8]| {
        black_box(text_tokens(std::str::from_utf8(b).unwrap_or("")));
    };
    let t = compare(&texts, &mut [&mut count]);
    println!(
        "\n`text_tokens` alone over every corpus line: {:.3} µs per KB of text",
        t.first().copied().unwrap_or(f64::NAN)
    );

    if !failed.is_empty() {
        eprintln!(
            "\nFAIL: p95 |error| above {P95_LIMIT} % (target classes) or {P95_GUARD} % (other scripts), or for {ADVERSARIAL} an estimate below {MIN_RATIO} of real, for: {}",
            failed.join(", ")
        );
        std::process::exit(1);
    }
    println!("\nOK: target classes within p95 |error| <= {P95_LIMIT} %, other scripts <= {P95_GUARD} %, {ADVERSARIAL}: estimate >= {MIN_RATIO} of real");
}
