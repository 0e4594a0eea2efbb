//! A corpus class's most under- and over-estimated lines, for work on the estimator:
//!
//! ```sh
//! cargo run --release --example worst -- greek 6           # the 6 lowest and 6 highest lines
//! PIECES=1 cargo run --release --example worst -- greek 3  # … with o200k's pieces and per-word estimates
//! ```
//!
//! Prints the class's held-out aggregate (estimate ÷ o200k over the odd lines), then per line:
//! estimate ÷ o200k, both counts, the line's index (even = fitted split) and its start.
#[path = "../benches/common/corpus.rs"]
mod corpus;

use std::path::Path;
use tokengate::estimate::text_tokens;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let class = args.get(1).cloned().unwrap_or_default();
    let n: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(8);
    let bpe = tiktoken_rs::o200k_base().map_err(|e| format!("o200k_base: {e}"))?;
    let classes = corpus::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"))?;
    let Some(c) = classes.iter().find(|c| c.name == class) else {
        return Err(format!("no corpus class '{class}'"));
    };
    let mut rows: Vec<(f64, &corpus::Sample, u64)> = c
        .samples
        .iter()
        .map(|s| {
            let e = text_tokens(&s.text);
            (e as f64 / s.real, s, e)
        })
        .collect();
    let held: Vec<_> = rows.iter().filter(|r| !r.1.fitted()).collect();
    let est: f64 = held.iter().map(|r| r.2 as f64).sum();
    let real: f64 = held.iter().map(|r| r.1.real).sum();
    println!("{class}: held-out aggregate {:.3}", est / real);
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (ratio, s, e) in rows.iter().take(n).chain(rows.iter().rev().take(n)) {
        let start: String = s.text.chars().take(150).collect();
        println!(
            "{ratio:.3} o200k {} estimate {e} line {} {start:?}",
            s.real, s.line
        );
        if std::env::var_os("PIECES").is_some() {
            println!(
                "    {:?}",
                bpe.split_by_token(&s.text, false).unwrap_or_default()
            );
            let words: Vec<String> = s
                .text
                .split(' ')
                .map(|w| format!("{w}={}", text_tokens(&format!(" {w}"))))
                .collect();
            println!("    {}", words.join(" "));
        }
    }
    Ok(())
}
