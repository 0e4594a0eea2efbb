//! The classes of random letters (`benches/common/junk.rs`) with the estimator as built: o200k,
//! estimate and the lowest ratio of a seed, for work on the estimator.
//!
//! ```sh
//! cargo run --release --example junk
//! ```
#[path = "../benches/common/junk.rs"]
mod junk;

fn main() -> Result<(), String> {
    let bpe = tiktoken_rs::o200k_base().map_err(|e| format!("o200k_base: {e}"))?;
    let count = |t: &str| bpe.encode_ordinary(t).len() as f64;
    let est = |t: &str| tokengate::estimate::text_tokens(t) as f64;
    println!("| class | o200k | estimate | ratio | lowest |");
    println!("|---|---:|---:|---:|---:|");
    for (label, real, e, low) in junk::report(&count, &est) {
        println!(
            "| {label} | {real:.0} | {e:.0} | {:.2} | {low:.2} |",
            e / real
        );
    }
    Ok(())
}
