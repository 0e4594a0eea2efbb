//! Writes the exact counter's rank table (`src/estimate/exact.rs`) to `target/o200k-exact.bin`,
//! which the `.wasm` built with the feature `exact-text` embeds:
//!
//! ```sh
//! cargo run --release --example gen-exact-table --features exact
//! cargo build --release --target wasm32-wasip1 -p tokengate --features exact-text
//! ```
//!
//! Prints the table's size per part; fails if a token is not found by the counter's own lookup.
#[path = "../benches/common/exact.rs"]
mod exact_tokens;

use std::path::Path;
use tokengate::estimate::exact::{build_table, Table};

fn main() -> Result<(), String> {
    let tokens = exact_tokens::o200k_tokens()?;
    let table = build_table(&tokens, exact_tokens::SLOT_BITS).ok_or("the tokens do not fit")?;
    let t = Table::parse(&table).ok_or("the table does not parse")?;
    for (r, tok) in tokens.iter().enumerate() {
        if t.rank(tok) != Some(r as u32) {
            return Err(format!("rank {r} not found"));
        }
    }
    let blob: usize = tokens.iter().map(Vec::len).sum();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/o200k-exact.bin");
    std::fs::write(&path, &table).map_err(|e| format!("{}: {e}", path.display()))?;
    println!(
        "{}: {} bytes ({} tokens; lengths {}, offsets {}, slots {}, token bytes {blob})",
        path.display(),
        table.len(),
        tokens.len(),
        tokens.len(),
        tokens.len().div_ceil(8) * 4,
        4usize << exact_tokens::SLOT_BITS,
    );
    Ok(())
}
