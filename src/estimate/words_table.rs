//! The word table of `words.rs`, written by `cargo run --release --example gen-word-table`
//! from o200k_base: do not edit, regenerate. 59253 words in 72912 bytes:
//! - Ascii, bare: 4077 words (rank < 40000)
//! - Ascii, after a space: 17403 words (rank < 80000)
//! - Latin, bare: 1418 words (rank < 80000)
//! - Latin, after a space: 7413 words (rank < 200000)
//! - Alpha, bare: 6285 words (rank < 80000)
//! - Alpha, after a space: 22657 words (rank < 200000)

/// Hash seed of the table.
pub(super) const SEED: u64 = 0x9e3779b97f4a7c15;
/// Bytes per block (the table has three).
pub(super) const BLOCK: usize = 24304;
/// The filter's fingerprint bytes.
pub(super) static FINGERPRINTS: [u8; 3 * BLOCK] = *include_bytes!("words.bin");
