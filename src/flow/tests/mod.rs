//! Native tests of the whole request flow through [`FakeEnvoy`](super::fake::FakeEnvoy): one per row of
//! the README's response contract and quota settlement table, and per failure mode.

mod batch;
mod breaker;
mod budgets;
mod contract;
mod failures;
mod fair;
mod families;
mod glease;
mod identity;
mod instr;
mod lease;
mod lease_sync;
mod limits;
mod settlement;
mod shaping;

use super::fake::{Call, FakeEnvoy};
use serde_json::{json, Value};

/// A chat body for model `m` asking at most `max` tokens.
pub fn chat(model: &str, text: &str, max: u64) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max})
        .to_string()
}

/// A streaming chat body.
pub fn chat_stream(model: &str, text: &str, max: u64) -> String {
    json!({"model": model, "stream": true, "messages": [{"role": "user", "content": text}], "max_tokens": max})
        .to_string()
}

/// A fake Envoy with `cfg` (JSON) on one worker.
pub fn envoy(cfg: Value) -> FakeEnvoy {
    FakeEnvoy::new(&cfg.to_string(), 1)
}

/// One rule for every tenant and model.
pub fn rule(tps: f64, burst: f64) -> Value {
    json!({"name": "all", "tokens_per_second": tps, "burst": burst})
}

/// The tenant header sent in tests.
pub const TENANT: (&str, &str) = ("x-tenant-id", "acme");

/// `{"EVAL":[…]}` as Webdis answers a script.
pub fn eval(values: &[i64]) -> String {
    json!({ "EVAL": values }).to_string()
}

/// A reservation reply admitting in full: used after, limit.
pub fn reserved(used: i64, limit: i64) -> String {
    eval(&[1, used, limit, 0, -1, 0, 0, 0])
}

/// The decoded segments of a Webdis command body (`EVALSHA/<sha>/<n>/<keys…>/<args…>`).
pub fn segments(body: &str) -> Vec<String> {
    body.split('/')
        .map(|s| {
            let mut out = Vec::new();
            let b = s.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%' && i + 2 < b.len() + 1 {
                    let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                    out.push(u8::from_str_radix(hex, 16).unwrap());
                    i += 3;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            String::from_utf8(out).unwrap()
        })
        .collect()
}

/// Asserts the call broke no Envoy rule.
pub fn clean(call: &Call) {
    assert!(
        call.violations.is_empty(),
        "Envoy rules broken: {:?}",
        call.violations
    );
}

/// The estimate the filter charged (`x-tokengate-estimated-tokens` of the response or the reply, else
/// the audit record's).
pub fn estimated(call: &Call) -> u64 {
    call.header("x-tokengate-estimated-tokens")
        .or_else(|| call.reply_header("x-tokengate-estimated-tokens"))
        .map(str::to_string)
        .or_else(|| call.audit_field("estimated"))
        .and_then(|v| v.parse().ok())
        .expect("an estimate")
}
