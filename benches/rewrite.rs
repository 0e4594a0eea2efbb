//! Speed of `tokengate::rewrite` (byte-preserving splices) side by side with what it replaced: parse
//! into a `serde_json::Value`, edit, serialize again (harness = false).
//!
//! `cargo bench --bench rewrite -p tokengate`
//!
//! Bodies: a 0.2 KB chat request, a 6 KB one with a tool's JSON schema (60 properties), 256 KB of English prose and
//! 256 KB of CJK text, each with a model change + `include_usage` injection + output clamp. Each pair is
//! timed in the same run, best of 2 × 5 interleaved trials of ≥ 100 ms; the table prints µs per call and the
//! ratio reference / splice. Never gated (absolute times depend on the machine and its load); the
//! result of both is checked to parse equal before timing.
use serde_json::{Map, Value};
use std::hint::black_box;
use std::time::{Duration, Instant};
use tokengate::rewrite::{rewrite, Edits, LimitAt};

/// The serde_json implementation `rewrite` replaced (same edits, keys come back sorted).
fn reference(body: &[u8], e: &Edits) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object_mut()?;
    if let Some(m) = &e.set_model {
        obj.insert("model".into(), Value::String(m.clone()));
    }
    if e.inject_include_usage && obj.get("stream") == Some(&Value::Bool(true)) {
        let mut so = Map::new();
        so.insert("include_usage".into(), Value::Bool(true));
        obj.insert("stream_options".into(), Value::Object(so));
    }
    if let Some(max) = e.clamp_max_output {
        obj.insert(e.max_output_field.clone(), Value::from(max));
    }
    serde_json::to_vec(&v).ok()
}

/// Best time per call of `f` over 5 trials of at least 100 ms.
fn time(f: &mut dyn FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < Duration::from_millis(100) {
            f();
            n += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() / n as f64);
    }
    best * 1e6
}

fn chat(content: &str, extra: &str) -> Vec<u8> {
    let body = serde_json::json!({
        "model": "gpt-4.1", "stream": true, "max_tokens": 4096, "temperature": 0.7,
        "messages": [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": content}]
    })
    .to_string();
    // Pretty-ish spacing as SDKs send it, plus any extra members.
    let body = body.replacen('{', &format!("{{{extra}"), 1);
    body.replace("\":", "\": ")
        .replace(",\"", ", \"")
        .into_bytes()
}

fn tools() -> String {
    let mut props = String::new();
    for i in 0..60 {
        props.push_str(&format!(
            "\"field_{i}\": {{\"type\": \"string\", \"description\": \"The value number {i} of the record, as text\"}}, "
        ));
    }
    let schema = format!(
        "{{\"type\": \"object\", \"properties\": {{{}}}, \"required\": [\"field_0\"]}}",
        props.trim_end_matches(", ")
    );
    format!(
        "\"tools\": [{{\"type\": \"function\", \"function\": {{\"name\": \"save\", \"parameters\": {schema}}}}}], "
    )
}

fn main() {
    let edits = Edits {
        set_model: Some("gpt-4.1-mini".into()),
        inject_include_usage: true,
        clamp_max_output: Some(1000),
        max_output_field: "max_tokens".into(),
        clamp_present_only: false,
        limit_at: LimitAt::Top,
    };
    let prose = "The quick brown fox jumps over the lazy dog. \"Quoted\" words and\nnew lines. ";
    let cjk = "東京は日本の首都であり、世界最大の都市圏の一つです。人口は約一千四百万人です。";
    let cases = [
        ("chat 0.2 KB", chat("Hello there!", "")),
        ("tools 6 KB", chat("Save this record.", &tools())),
        (
            "prose 256 KB",
            chat(&prose.repeat(256 * 1024 / prose.len()), ""),
        ),
        ("cjk 256 KB", chat(&cjk.repeat(256 * 1024 / cjk.len()), "")),
    ];
    println!(
        "{:<14} {:>9} {:>14} {:>14} {:>7}",
        "body", "bytes", "splice µs", "serde µs", "ratio"
    );
    for (name, body) in &cases {
        let ours = rewrite(body, &edits).ok().flatten().unwrap_or_default();
        let theirs = reference(body, &edits).unwrap_or_default();
        let same = serde_json::from_slice::<Value>(&ours).ok()
            == serde_json::from_slice::<Value>(&theirs).ok();
        if !same {
            eprintln!("{name}: the two rewrites differ");
            std::process::exit(1);
        }
        let mut a = f64::INFINITY;
        let mut b = f64::INFINITY;
        for _ in 0..2 {
            a = a.min(time(&mut || {
                black_box(rewrite(black_box(body), &edits).ok());
            }));
            b = b.min(time(&mut || {
                black_box(reference(black_box(body), &edits));
            }));
        }
        println!(
            "{:<14} {:>9} {:>14.2} {:>14.2} {:>6.1}x",
            name,
            body.len(),
            a,
            b,
            b / a
        );
    }
}
