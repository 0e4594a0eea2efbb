//! The tokens of o200k_base in rank order (tiktoken-rs), for the exact counter's table
//! (`src/estimate/exact.rs`): written to a file by `examples/gen-exact-table.rs`, built in memory by
//! `benches/estimate.rs` and the exact counter's tests.
#![allow(dead_code)]

/// Slots of the table's hash (2^18: the 199,998 ranks at a load of 0.76, 1 MB).
pub const SLOT_BITS: u32 = 18;

/// Every token of o200k_base (not the special ones), in rank order.
pub fn o200k_tokens() -> Result<Vec<Vec<u8>>, String> {
    let bpe = tiktoken_rs::o200k_base().map_err(|e| format!("o200k_base: {e}"))?;
    let mut out = Vec::new();
    // The ranks are 0..199,997 without gaps; the special tokens come after a gap.
    while let Ok(b) = bpe.decode_bytes(&[out.len() as u32]) {
        out.push(b);
    }
    Ok(out)
}
