//! The word table of `words.rs`, written by `cargo run --release --example gen-word-table`
//! from o200k_base: do not edit, regenerate. 45399 words in 55872 bytes:
//! - Ascii, bare: 4077 words (rank < 40000)
//! - Ascii, after a space: 11252 words (rank < 55000)
//! - Latin, after a space: 7413 words (rank < 200000)
//! - Alpha, after a space: 22657 words (rank < 200000)

/// Hash seed of the table.
pub(super) const SEED: u64 = 0x9e3779b97f4a7c15;
/// Bytes per block (the table has three).
pub(super) const BLOCK: usize = 18624;
/// The filter's fingerprint bytes.
pub(super) static FINGERPRINTS: [u8; 3 * BLOCK] = *include_bytes!("words.bin");
