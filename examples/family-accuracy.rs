//! Estimator accuracy and cost per API family: every `corpus/*.jsonl` line framed as one user turn
//! of each family's request, estimated with `tokengate::estimate::estimate_with_model`.
//!
//! `cargo run --release --example family-accuracy`           the accuracy table
//! `valgrind --tool=callgrind --toggle-collect='family_accuracy::measure' \
//!     target/release/examples/family-accuracy instr <family>` instructions of one family's set
//! (`scripts`-free: read the `summary:` line of callgrind's output, divide by the request count the
//! example prints).
//!
//! Truth: OpenAI's `o200k_base` (tiktoken-rs, bundled vocabulary, as `benches/estimate.rs`) of the
//! text, plus the family's framing as the estimator counts it (a constant per family, printed: it is
//! the estimate of the body with the text taken out, checked constant across lines). Gemini and Claude
//! (Anthropic, Bedrock's Claude) bill with their own tokenizers, which no crate ships offline: the
//! ratios below say how the estimate compares with o200k, not with those bills (Gemini's SentencePiece
//! and Claude's tokenizers count English within about ±15 % of o200k and CJK differently); the
//! provider's usage settles every request. The size fallback (Bedrock `invoke` bodies of unknown
//! models) is compared with the same truth to show how much it errs high.

#[path = "../benches/common/corpus.rs"]
mod corpus;

use serde_json::json;
use std::hint::black_box;
use std::path::Path;
use tokengate::estimate::{estimate_with_model, text_tokens, ApiKind, OutputLimits};

const LIMITS: OutputLimits = OutputLimits {
    default_tokens: 1024,
    cap_tokens: 32768,
};

/// A family's request with `text` as its one user turn: (name, kind, path model, body).
struct Framing {
    name: &'static str,
    kind: ApiKind,
    model: Option<&'static str>,
    body: fn(&str) -> Vec<u8>,
}

const FAMILIES: [Framing; 7] = [
    Framing {
        name: "openai chat",
        kind: ApiKind::ChatCompletions,
        model: None,
        body: |t| {
            json!({"model": "gpt-4.1", "messages": [{"role": "user", "content": t}], "max_tokens": 256})
                .to_string()
                .into_bytes()
        },
    },
    Framing {
        name: "azure chat (deployment)",
        kind: ApiKind::ChatCompletions,
        model: Some("gpt-4.1"),
        body: |t| {
            json!({"messages": [{"role": "user", "content": t}], "max_tokens": 256})
                .to_string()
                .into_bytes()
        },
    },
    Framing {
        name: "anthropic messages",
        kind: ApiKind::AnthropicMessages,
        model: None,
        body: |t| {
            json!({"model": "claude-sonnet-4", "max_tokens": 256,
                   "messages": [{"role": "user", "content": [{"type": "text", "text": t}]}]})
            .to_string()
            .into_bytes()
        },
    },
    Framing {
        name: "gemini generateContent",
        kind: ApiKind::GeminiGenerate,
        model: Some("gemini-2.5-flash"),
        body: |t| {
            json!({"contents": [{"role": "user", "parts": [{"text": t}]}],
                   "generationConfig": {"maxOutputTokens": 256}})
            .to_string()
            .into_bytes()
        },
    },
    Framing {
        name: "bedrock converse",
        kind: ApiKind::BedrockConverse,
        model: Some("anthropic.claude-3-5-haiku-20241022-v1:0"),
        body: |t| {
            json!({"messages": [{"role": "user", "content": [{"text": t}]}],
                   "inferenceConfig": {"maxTokens": 256}})
            .to_string()
            .into_bytes()
        },
    },
    Framing {
        name: "bedrock invoke (claude)",
        kind: ApiKind::BedrockInvoke,
        model: Some("anthropic.claude-3-5-haiku-20241022-v1:0"),
        body: |t| {
            json!({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 256,
                   "messages": [{"role": "user", "content": [{"type": "text", "text": t}]}]})
            .to_string()
            .into_bytes()
        },
    },
    Framing {
        name: "bedrock invoke (llama, by size)",
        kind: ApiKind::BedrockInvoke,
        model: Some("meta.llama3-8b-instruct-v1:0"),
        body: |t| {
            json!({"prompt": t, "max_gen_len": 256})
                .to_string()
                .into_bytes()
        },
    },
];

fn prompt(f: &Framing, body: &[u8]) -> u64 {
    estimate_with_model(f.kind, body, f.model, &|_| LIMITS)
        .map(|e| e.prompt_tokens)
        .unwrap_or(0)
}

/// The measured call (callgrind collects inside it only).
#[inline(never)]
fn measure(f: &Framing, bodies: &[Vec<u8>]) -> u64 {
    bodies
        .iter()
        .map(|b| prompt(f, black_box(b)))
        .fold(0, u64::wrapping_add)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    if args.first().map(String::as_str) == Some("instr") {
        let name = args.get(1).map(String::as_str).unwrap_or("openai chat");
        let Some(f) = FAMILIES.iter().find(|f| f.name.starts_with(name)) else {
            eprintln!("unknown family {name}");
            std::process::exit(2);
        };
        // The texts without counting them (o200k is not needed here, and slow under callgrind).
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .collect();
        paths.sort();
        let mut bodies = Vec::new();
        for p in paths {
            for line in std::fs::read_to_string(&p).unwrap_or_default().lines() {
                if let Some(t) = serde_json::from_str::<serde_json::Value>(line)
                    .ok()
                    .and_then(|v| v.get("text").and_then(|t| t.as_str()).map(str::to_string))
                {
                    bodies.push((f.body)(&t));
                }
            }
        }
        let bytes: usize = bodies.iter().map(Vec::len).sum();
        let total = measure(f, &bodies);
        println!(
            "{}: {} requests, {} KB, {} prompt tokens",
            f.name,
            bodies.len(),
            bytes / 1024,
            total
        );
        return;
    }
    let classes = match corpus::load(&dir) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    println!("| family | framing | class | n | median | p95 abs | aggregate (Σ est ÷ Σ o200k) | lowest |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for f in &FAMILIES {
        let mut framing: Option<(u64, u64)> = None;
        let mut all = Vec::new();
        for c in &classes {
            let mut pairs = Vec::new();
            for s in &c.samples {
                let est = prompt(f, &(f.body)(&s.text));
                let frame = est.saturating_sub(text_tokens(&s.text));
                framing =
                    Some(framing.map_or((frame, frame), |(lo, hi)| (lo.min(frame), hi.max(frame))));
                pairs.push((est as f64, s.real));
            }
            // Truth: o200k of the text plus this family's framing (its smallest, constant for the
            // structured walks; the size fallback has none of its own).
            all.push((c.name.clone(), pairs));
        }
        let (lo, hi) = framing.unwrap_or((0, 0));
        let frame = if f.name.contains("by size") { 0 } else { lo };
        let mut every = Vec::new();
        for (name, pairs) in &all {
            let pairs: Vec<(f64, f64)> =
                pairs.iter().map(|(e, r)| (*e, r + frame as f64)).collect();
            let st = corpus::stats(name, &pairs);
            println!(
                "| {} | {} | {} | {} | {:+.1} % | {:.1} % | {:.3} | {:.2} |",
                f.name,
                if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo}..{hi}")
                },
                name,
                st.n,
                st.median,
                st.p95,
                st.aggregate,
                st.lowest
            );
            every.extend(pairs);
        }
        let st = corpus::stats("all", &every);
        println!(
            "| **{}** | | **all** | {} | {:+.1} % | {:.1} % | **{:.3}** | {:.2} |",
            f.name, st.n, st.median, st.p95, st.aggregate, st.lowest
        );
    }
}
