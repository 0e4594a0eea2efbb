//! Accuracy and speed of `tokengate::estimate` (harness = false).
//!
//! `cargo bench --bench estimate -p tokengate`
//!
//! 1. Accuracy: every `corpus/*.jsonl` line (`{"text": …}`) is counted with OpenAI's `o200k_base`
//!    (tiktoken-rs, vocabulary bundled in the crate, no network) and estimated with `text_tokens` and
//!    with the naive `chars / 4`. Per class: median relative error and p95 |relative error|, on all lines
//!    and on the odd (held-out: the weights were fitted on the even lines) lines.
//! 2. Speed: each sample wrapped in a chat-completions body; `estimate` timed against
//!    `serde_json::from_slice::<Value>` alone, in µs per KB of body (bounded: ≤ 1 s and ≤ 10 000 passes each).
//!
//! Exits non-zero when any class has p95 |error| above 15 % (all lines).
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};
use tokengate::estimate::{estimate, text_tokens, ApiKind, OutputLimits};

const P95_LIMIT: f64 = 15.0;

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

/// Time `f` over all `bodies` repeatedly; returns µs per KB.
fn time_per_kb(bodies: &[Vec<u8>], mut f: impl FnMut(&[u8])) -> f64 {
    let bytes: usize = bodies.iter().map(Vec::len).sum();
    let budget = Duration::from_secs(1);
    let start = Instant::now();
    let mut passes = 0u32;
    while passes < 10_000 && (passes < 3 || start.elapsed() < budget) {
        for b in bodies {
            f(black_box(b));
        }
        passes += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    secs * 1e6 / (bytes as f64 / 1024.0 * f64::from(passes))
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
    println!("| class | samples | ours median | ours p95 | held-out median | held-out p95 | chars/4 median | chars/4 p95 |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
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
        println!(
            "| {name} | {} | {:+.1} % | {:.1} % | {:+.1} % | {:.1} % | {:+.1} % | {:.1} % |",
            texts.len(),
            o.median,
            o.p95,
            h.median,
            h.p95,
            n.median,
            n.p95
        );
        if o.p95 > P95_LIMIT || o.p95.is_nan() {
            failed.push(name.clone());
        }
    }

    // Speed: chat-completions bodies around each sample.
    let bodies: Vec<Vec<u8>> = corpus
        .iter()
        .flat_map(|(_, texts)| texts.iter())
        .map(|t| {
            serde_json::json!({
                "model": "gpt-4.1",
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": t}
                ],
                "max_tokens": 256,
                "stream": true,
                "stream_options": {"include_usage": true}
            })
            .to_string()
            .into_bytes()
        })
        .collect();
    let limits = |_: Option<&str>| OutputLimits {
        default_tokens: 1024,
        cap_tokens: 32768,
    };
    let kb = bodies.iter().map(Vec::len).sum::<usize>() as f64 / 1024.0;
    let ours = time_per_kb(&bodies, |b| {
        black_box(estimate(ApiKind::ChatCompletions, b, &limits).ok());
    });
    let parse = time_per_kb(&bodies, |b| {
        black_box(serde_json::from_slice::<serde_json::Value>(b).ok());
    });
    println!(
        "\nSpeed ({} chat-completions bodies, {kb:.0} KB in total, release build):\n",
        bodies.len()
    );
    println!("| what | µs per KB |");
    println!("|---|---:|");
    println!("| `estimate` (parse + walk + count) | {ours:.3} |");
    println!("| `serde_json::from_slice::<Value>` alone | {parse:.3} |");
    println!("| ratio estimate / parse | {:.2}× |", ours / parse);

    if !failed.is_empty() {
        eprintln!(
            "\nFAIL: p95 |error| above {P95_LIMIT} % for: {}",
            failed.join(", ")
        );
        std::process::exit(1);
    }
    println!("\nOK: every class within p95 |error| <= {P95_LIMIT} %");
}
