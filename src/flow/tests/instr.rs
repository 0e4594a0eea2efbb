//! The bench's buckets row natively, for callgrind: where a request's instructions go in the pure flow
//! (Envoy's JIT code is anonymous in callgrind; this run names every function). Ignored in `cargo test`;
//! run `cargo test --release -p tokengate --lib flow::tests::instr -- --ignored` under
//! `valgrind --tool=callgrind --toggle-collect='*instr*requests*'` and read `callgrind_annotate --inclusive=yes`.
//! The fake's own work (maps for headers and shared data) is in the counts too; compare functions, not
//! totals, with Envoy's.

use super::*;

const BODY: &str = r#"{"model":"gpt-4.1","max_tokens":16,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in one short sentence."}]}"#;
const ANSWER: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"gpt-4.1","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":24,"completion_tokens":4,"total_tokens":28}}"#;

fn requests(e: &FakeEnvoy, n: usize) {
    for _ in 0..n {
        let mut c = e.send("/v1/chat/completions", &[TENANT], BODY);
        e.respond(
            &mut c,
            200,
            &[("content-type", "application/json")],
            &[ANSWER],
        );
    }
}

#[test]
#[ignore = "a profile, not a test: run under callgrind"]
fn instr_buckets_row() {
    let cfg = json!({
        "tenant_header": "x-tenant-id", "trusted_headers": {"set_by": "the bench"},
        "api_key_tenants": true,
        "rules": [{"name": "bench", "tenant": "*", "model": "*", "tokens_per_second": 100_000_000u64,
                   "burst": 1_000_000_000u64, "per_model": true}]
    });
    let breaker = std::env::var_os("INSTR_BREAKER").is_some();
    let mut cfg = cfg;
    if breaker {
        cfg["breaker"] = json!({"keys": ["cluster", "model"]});
    }
    let e = envoy(cfg);
    requests(&e, 50);
    requests(&e, 2000);
}
