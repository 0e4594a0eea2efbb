//! `scripts/key-part.py`, which README "Operating" gives operators to type a tenant's Redis keys,
//! writes a key part as the filter does (`tokengate::store::keys::sanitize`), long and non-ASCII ones
//! included. Skipped (with a line) where `python3` is not installed.

use std::process::Command;
use tokengate::store::keys::sanitize;

#[test]
fn the_operators_script_writes_key_parts_as_the_filter_does() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/key-part.py");
    let long_cjk = "漢".repeat(50);
    let long_ascii = "tenant-".repeat(30);
    let values = [
        "alice@example.com",
        "meta-llama/Llama-3.1-8B",
        "~b:spend:team a",
        "team_a.b-c:x",
        "",
        long_cjk.as_str(),
        long_ascii.as_str(),
        "é{}%",
    ];
    for v in values {
        let out = match Command::new("python3").arg(script).arg(v).output() {
            Ok(o) => o,
            Err(e) => {
                println!("python3 not runnable ({e}): skipped");
                return;
            }
        };
        assert!(out.status.success(), "{v:?}: {out:?}");
        let got = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
        assert_eq!(got, sanitize(v), "{v:?}");
    }
}
