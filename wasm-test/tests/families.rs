//! Every API family through real Envoy and the release tokengate.wasm, driven by its official client
//! (wasm-test/sdk/driver.py): `openai.AzureOpenAI` on deployment paths, Azure's v1 API (the OpenAI
//! client on `/openai/v1`), `google-genai` in Gemini API mode and in Vertex AI mode, and `boto3`
//! bedrock-runtime (`converse`, `converse_stream` over the AWS event stream). Redis and Webdis hold the
//! monthly quota; the mock provider speaks each family and keeps a ledger of what it served.
//!
//! For each family, one test:
//! 1. **admitted and streamed**: the plain and the streamed call parse with the SDK (the text and the
//!    usage in the family's own shape);
//! 2. **refused by a bucket**: a second call right after a large first one is refused in the family's
//!    shape; without retries the SDK raises at once, with its retries on it does what it documents —
//!    the OpenAI client and botocore wait the filter's retry hint and are admitted, google-genai retries
//!    on the status alone with its own short backoff and raises after its attempts;
//! 3. **refused by a spent quota**: raised at once by the OpenAI client (`x-should-retry: false`) and
//!    botocore (`ServiceQuotaExceededException` is a 400), retried by google-genai only with its retries
//!    on; the provider never sees it;
//! 4. **the ledger**: for every tenant, the quota counter in Redis (and its per-model counter, under the
//!    model the path names) equals the tokens the mock served.
//!
//! Attempts are counted at Envoy (`http.ingress.downstream_rq_total`) over each batch of calls.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};
use wasm_test::faults::{ledger, month_label, now_unix};
use wasm_test::sdk::{call, drive};
use wasm_test::tg::{self, rule};
use wasm_test::{mock_provider, Envoy, EnvoyOpts, MockProvider, RedisServer, RespValue, Webdis};

/// What the mock answers for an output limit of 8 (`t0 t1 … t7 `).
const TEXT8: &str = "t0 t1 t2 t3 t4 t5 t6 t7 ";
/// The Azure deployment the clients name, and the model the configuration maps it to.
const DEPLOYMENT: &str = "dep-1";
const AZURE_MODEL: &str = "gpt-4o";
const GEMINI_MODEL: &str = "gemini-2.5-flash";
const BEDROCK_MODEL: &str = "anthropic.claude-3-5-haiku-20241022-v1:0";
/// The spent tenants' monthly limit (their counter is set to it before they call).
const SPENT_LIMIT: u64 = 1000;
/// Bucket tenants: 1000 tokens refilled at 50/s. A first call of ~600 (max output 590) leaves ~400,
/// so a call right after it is refused for about 4 s.
const BUCKET_BURST: u64 = 1000;
const BUCKET_RATE: f64 = 50.0;
/// Upper bound for settlements to reach Redis.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// One family as its client calls it.
struct Family {
    /// Tenant prefix and label.
    name: &'static str,
    /// The driver's plain and streamed scenarios (a second stream for Azure: without `include_usage`).
    plain: &'static str,
    streams: &'static [(&'static str, &'static [&'static str])],
    /// Arguments every call takes (Azure: the deployment as `--model`).
    args: &'static [&'static str],
    /// The model the filter charges (the path's, or the deployment's).
    model: &'static str,
    kind: Client,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Client {
    OpenAi,
    Genai,
    Boto3,
}

/// The plugin configuration: a bucket for each `<family>-bucket` tenant, a roomy one for everyone
/// else; the quota for everyone (a small one for `<family>-spent`); Azure's deployment map.
fn config(f: &Family) -> Value {
    let bucket = format!("{}-bucket", f.name);
    let spent = format!("{}-spent", f.name);
    let rules = json!([
        rule("bucket", &bucket, "*", BUCKET_RATE, BUCKET_BURST),
        rule("all", "*", "*", 1_000_000.0, 1_000_000_000),
    ]);
    tg::merge(
        tg::config(rules),
        json!({
            "quota": {"cluster": "webdis", "timeout_ms": 1000, "monthly_limit": 1_000_000,
                      "tenants": {spent: {"monthly_limit": SPENT_LIMIT}},
                      // The ledger compares the counter with what was served within 5 s: a
                      // lease (on by default) would be counted until it goes back idle.
                      "lease": false},
            "azure_openai": {"deployments": {DEPLOYMENT: AZURE_MODEL}},
        }),
    )
}

/// Redis, Webdis, the mock and Envoy for one family's test (dropped in reverse order).
struct Stack {
    envoy: Envoy,
    mock: MockProvider,
    _webdis: Webdis,
    redis: RedisServer,
}

impl Stack {
    fn start(f: &Family) -> Stack {
        Stack::start_with(config(f))
    }

    fn start_with(cfg: Value) -> Stack {
        let redis = RedisServer::start();
        let webdis = Webdis::start(redis.port);
        let mock = mock_provider!();
        let opts = EnvoyOpts::new(mock.port, cfg).webdis(webdis.port);
        let envoy = tg::start_opts(opts);
        Stack {
            envoy,
            mock,
            _webdis: webdis,
            redis,
        }
    }

    /// Runs `calls` as `tenant` in one driver process; the results and the requests Envoy received.
    fn batch(&self, f: &Family, tenant: &str, calls: &[(&str, Vec<&str>)]) -> (Vec<Value>, u64) {
        let calls: Vec<Vec<String>> = calls
            .iter()
            .map(|(scenario, extra)| {
                let mut args: Vec<&str> = vec!["--tenant", tenant];
                args.extend_from_slice(f.args);
                let tag = format!("x-mock-tenant={tenant}");
                let mut c = call(scenario, &args);
                c.extend(["--header".to_string(), tag]);
                c.extend(extra.iter().map(|s| s.to_string()));
                c
            })
            .collect();
        let before = self.requests();
        let got = drive(self.envoy.port, &calls);
        (got, self.requests() - before)
    }

    fn requests(&self) -> u64 {
        self.envoy
            .stat_opt("http.ingress.downstream_rq_total")
            .unwrap_or(0)
    }

    fn get(&self, key: &str) -> i64 {
        match self.redis.cmd(&["GET", key]) {
            Ok(RespValue::Bulk(None)) => 0,
            Ok(v) => v
                .as_int()
                .unwrap_or_else(|| panic!("GET {key}: not an integer: {v:?}")),
            Err(e) => panic!("GET {key}: {e}"),
        }
    }

    /// Polls (bounded) until `key` holds `want`; the last value read.
    fn wait_key(&self, key: &str, want: i64) -> i64 {
        let deadline = Instant::now() + SETTLE_WAIT;
        loop {
            let v = self.get(key);
            if v == want || Instant::now() >= deadline {
                return v;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `tg:q:{tenant}:<month>`.
fn used_key(tenant: &str) -> String {
    format!("tg:q:{{{tenant}}}:{}", month_label(now_unix()))
}

fn assert_ok(f: &Family, got: &Value) {
    assert_eq!(got["ok"], true, "{}: the SDK call failed: {got}", f.name);
}

/// The usage the SDK parsed, as (prompt, output), in each family's own names.
fn parsed_usage(f: &Family, got: &Value) -> Option<(u64, u64)> {
    let u = &got["usage"];
    let n = |k: &str| u[k].as_u64();
    match f.kind {
        Client::OpenAi => Some((n("prompt_tokens")?, n("completion_tokens")?)),
        Client::Genai => Some((n("prompt_token_count")?, n("candidates_token_count")?)),
        Client::Boto3 => Some((n("inputTokens")?, n("outputTokens")?)),
    }
}

/// The SDK's exception for a refusal and its status; `reason`'s class in the family's names.
fn assert_refused(f: &Family, got: &Value, what: &str, bucket: bool) {
    assert_eq!(got["ok"], false, "{} {what}: admitted: {got}", f.name);
    match f.kind {
        Client::OpenAi => {
            assert_eq!(
                got["exception"], "RateLimitError",
                "{} {what}: {got}",
                f.name
            );
            assert_eq!(got["status_code"], 429, "{got}");
            let code = if bucket {
                "rate_limit_exceeded"
            } else {
                "insufficient_quota"
            };
            assert_eq!(got["code"], code, "{} {what}: {got}", f.name);
        }
        Client::Genai => {
            assert_eq!(got["exception"], "ClientError", "{} {what}: {got}", f.name);
            assert_eq!(got["status_code"], 429, "{got}");
            assert_eq!(got["status"], "RESOURCE_EXHAUSTED", "{got}");
        }
        Client::Boto3 => {
            let (exc, status) = if bucket {
                ("ThrottlingException", 429)
            } else {
                ("ServiceQuotaExceededException", 400)
            };
            assert_eq!(got["exception"], exc, "{} {what}: {got}", f.name);
            assert_eq!(got["code"], exc, "{got}");
            assert_eq!(got["status_code"], status, "{got}");
        }
    }
}

/// The whole story of one family (see the module docs).
fn family(f: &Family) {
    let s = Stack::start(f);
    let no_retries = vec!["--max-retries", "0"];
    let retries = vec!["--max-retries", "2"];

    // 1. Admitted and streamed.
    let ok = format!("{}-ok", f.name);
    let mut calls = vec![(f.plain, no_retries.clone())];
    for (scenario, extra) in f.streams {
        let mut a = no_retries.clone();
        a.extend_from_slice(extra);
        calls.push((scenario, a));
    }
    let (got, n) = s.batch(f, &ok, &calls);
    assert_eq!(n, calls.len() as u64, "one request each");
    for g in &got {
        assert_ok(f, g);
        assert_eq!(g["text"], TEXT8, "{}: {g}", f.name);
    }
    assert_eq!(parsed_usage(f, &got[0]).map(|u| u.1), Some(8), "{}", got[0]);
    for (g, (scenario, extra)) in got[1..].iter().zip(f.streams) {
        if extra.contains(&"--no-stream-usage") {
            // The usage chunk the filter asked for is stripped again: the client sees its stream.
            assert_eq!(g["usage"], Value::Null, "{scenario}: {g}");
        } else {
            assert_eq!(parsed_usage(f, g).map(|u| u.1), Some(8), "{scenario}: {g}");
        }
    }
    let sent = s.mock.requests();
    assert_eq!(sent.len(), calls.len());
    assert_eq!(
        s.envoy.stat("tokengate_requests_admitted"),
        calls.len() as u64
    );

    // 2. Refused by a bucket: a large call, one without retries right after it, one with them.
    let bucket = format!("{}-bucket", f.name);
    let big = |extra: &Vec<&'static str>| {
        let mut a = extra.clone();
        a.extend(["--max-tokens", "590"]);
        a
    };
    let (got, n) = s.batch(
        f,
        &bucket,
        &[
            (f.plain, big(&no_retries)),
            (f.plain, big(&no_retries)),
            (f.plain, big(&retries)),
        ],
    );
    assert_ok(f, &got[0]);
    assert_refused(f, &got[1], "bucket, no retries", true);
    let elapsed = got[2]["elapsed"].as_f64().unwrap_or(0.0);
    match f.kind {
        Client::OpenAi | Client::Boto3 => {
            // Waited the filter's hint (retry-after-ms, x-amz-retry-after: about 4 s), then admitted.
            assert_ok(f, &got[2]);
            assert_eq!(n, 4, "{}: 1 + 1 + a retry", f.name);
            assert!(elapsed > 2.0, "{}: waited the hint: {elapsed} s", f.name);
        }
        Client::Genai => {
            // Its own backoff (50, 100 ms here): still refused after its three attempts.
            assert_refused(f, &got[2], "bucket, with retries", true);
            assert_eq!(n, 5, "{}: 1 + 1 + three attempts", f.name);
        }
    }
    assert!(elapsed < 20.0, "{}: {elapsed} s", f.name);

    // 3. Refused by a spent quota.
    let spent = format!("{}-spent", f.name);
    let key = used_key(&spent);
    s.redis
        .cmd(&["SET", &key, &SPENT_LIMIT.to_string()])
        .unwrap();
    let (got, n) = s.batch(
        f,
        &spent,
        &[(f.plain, no_retries.clone()), (f.plain, retries.clone())],
    );
    assert_refused(f, &got[0], "spent, no retries", false);
    assert_refused(f, &got[1], "spent, with retries", false);
    let want = match f.kind {
        // x-should-retry: false; a 400 botocore never retries.
        Client::OpenAi | Client::Boto3 => 2,
        // google-genai retries a 429 on its status, whatever the answer says.
        Client::Genai => 4,
    };
    assert_eq!(n, want, "{}: attempts on a spent quota", f.name);
    for g in &got {
        assert!(
            g["elapsed"].as_f64().unwrap_or(9.0) < 3.0,
            "{}: a spent quota is no wait: {g}",
            f.name
        );
    }
    assert_eq!(s.get(&key), SPENT_LIMIT as i64, "nothing charged");

    // 4. The quota ledger in Redis equals the usage the mock served, per tenant and per model.
    let l = ledger(&s.mock);
    assert!(
        l.answers.iter().all(|a| a.tenant != spent),
        "the provider never saw the spent tenant"
    );
    let mut served: BTreeMap<String, u64> = BTreeMap::new();
    for a in &l.answers {
        assert_eq!(a.outcome, "complete", "{}: {a:?}", f.name);
        *served.entry(a.tenant.clone()).or_default() += a.tokens;
    }
    assert_eq!(
        served.keys().collect::<Vec<_>>(),
        [&bucket, &ok],
        "{}: {served:?}",
        f.name
    );
    let mut report = Vec::new();
    for (tenant, tokens) in &served {
        let want = *tokens as i64;
        let got = s.wait_key(&used_key(tenant), want);
        let model = s.wait_key(&format!("{}:m:{}", used_key(tenant), f.model), want);
        println!(
            "{:<9} {tenant:<16} served {want:>5}  redis {got:>5}  redis[{}] {model:>5}",
            f.name, f.model
        );
        if got != want || model != want {
            report.push(format!(
                "{tenant}: served {want}, redis {got}, model {model}"
            ));
        }
    }
    assert!(report.is_empty(), "{}: {}", f.name, report.join("; "));
    tg::assert_no_panic(&s.envoy);
}

#[test]
fn azure_openai_deployments_through_envoy() {
    family(&Family {
        name: "azure",
        plain: "azure-chat",
        streams: &[
            ("azure-chat-stream", &[]),
            ("azure-chat-stream", &["--no-stream-usage"]),
        ],
        args: &["--model", DEPLOYMENT],
        model: AZURE_MODEL,
        kind: Client::OpenAi,
    });
}

#[test]
fn azure_openai_v1_through_envoy() {
    family(&Family {
        name: "azure-v1",
        plain: "azure-v1-chat",
        streams: &[
            ("azure-v1-chat-stream", &[]),
            ("azure-v1-chat-stream", &["--no-stream-usage"]),
        ],
        args: &["--model", DEPLOYMENT],
        model: AZURE_MODEL,
        kind: Client::OpenAi,
    });
}

#[test]
fn gemini_api_through_envoy() {
    family(&Family {
        name: "gemini",
        plain: "gemini-generate",
        streams: &[("gemini-stream", &[])],
        args: &[],
        model: GEMINI_MODEL,
        kind: Client::Genai,
    });
}

#[test]
fn vertex_ai_through_envoy() {
    family(&Family {
        name: "vertex",
        plain: "vertex-generate",
        streams: &[("vertex-stream", &[])],
        args: &[],
        model: GEMINI_MODEL,
        kind: Client::Genai,
    });
}

#[test]
fn bedrock_converse_through_envoy() {
    family(&Family {
        name: "bedrock",
        plain: "bedrock-converse",
        streams: &[("bedrock-converse-stream", &[])],
        args: &[],
        model: BEDROCK_MODEL,
        kind: Client::Boto3,
    });
}

// ---------------------------------------------------------------------------------------------
// The other APIs of each family, and the body edits, over plain HTTP
// ---------------------------------------------------------------------------------------------

const CONVERSE_PATH: &str = "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse";
const INVOKE_PATH: &str = "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/invoke";
const INVOKE_STREAM_PATH: &str =
    "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/invoke-with-response-stream";
const LLAMA_INVOKE_PATH: &str = "/model/meta.llama3-8b-instruct-v1%3A0/invoke";
const GEMINI_PATH: &str = "/v1beta/models/gemini-2.5-flash:generateContent";
const GEMINI_ARRAY_PATH: &str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent";
const VERTEX_CLAUDE_PATH: &str =
    "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:rawPredict";
const VERTEX_CLAUDE_STREAM_PATH: &str =
    "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict";
const PROMPT: &str = "Write one short sentence about rivers.";

fn gemini_body(max: u64) -> Value {
    json!({"contents": [{"role": "user", "parts": [{"text": PROMPT}]}],
           "generationConfig": {"temperature": 0.5, "maxOutputTokens": max}})
}

fn converse_body(max: u64) -> Value {
    json!({"messages": [{"role": "user", "content": [{"text": PROMPT}]}],
           "inferenceConfig": {"maxTokens": max}})
}

fn claude_body(max: u64, stream: bool, version: &str) -> Value {
    let mut v = json!({"anthropic_version": version, "max_tokens": max,
                       "messages": [{"role": "user", "content": PROMPT}]});
    if stream {
        v["stream"] = json!(true);
    }
    v
}

#[test]
fn every_familys_api_settles_what_the_mock_served_and_clamps_its_own_output_field() {
    let f = Family {
        name: "raw",
        plain: "",
        streams: &[],
        args: &[],
        model: "",
        kind: Client::OpenAi,
    };
    let mut cfg = config(&f);
    cfg["quota"]["tenants"] = json!({
        "clamp-gemini": {"monthly_limit": 300, "clamp_output": true},
        "clamp-converse": {"monthly_limit": 300, "clamp_output": true},
        "clamp-invoke": {"monthly_limit": 300, "clamp_output": true},
    });
    let s = Stack::start_with(cfg);
    struct Case {
        tenant: &'static str,
        path: &'static str,
        body: Value,
        stream: bool,
        /// Where the output limit sits in the body, and whether the quota clamps it.
        limit: &'static str,
        clamped: bool,
    }
    let cases = [
        Case {
            tenant: "gemini-array",
            path: GEMINI_ARRAY_PATH,
            body: gemini_body(12),
            stream: true,
            limit: "/generationConfig/maxOutputTokens",
            clamped: false,
        },
        Case {
            tenant: "invoke-claude",
            path: INVOKE_PATH,
            body: claude_body(12, false, "bedrock-2023-05-31"),
            stream: false,
            limit: "/max_tokens",
            clamped: false,
        },
        Case {
            tenant: "invoke-stream",
            path: INVOKE_STREAM_PATH,
            body: claude_body(12, false, "bedrock-2023-05-31"),
            stream: true,
            limit: "/max_tokens",
            clamped: false,
        },
        Case {
            tenant: "invoke-llama",
            path: LLAMA_INVOKE_PATH,
            body: json!({"prompt": PROMPT, "max_gen_len": 12, "temperature": 0.2}),
            stream: false,
            limit: "/max_gen_len",
            clamped: false,
        },
        Case {
            tenant: "vertex-claude",
            path: VERTEX_CLAUDE_PATH,
            body: claude_body(12, false, "vertex-2023-10-16"),
            stream: false,
            limit: "/max_tokens",
            clamped: false,
        },
        Case {
            tenant: "vertex-claude-sse",
            path: VERTEX_CLAUDE_STREAM_PATH,
            body: claude_body(12, true, "vertex-2023-10-16"),
            stream: true,
            limit: "/max_tokens",
            clamped: false,
        },
        Case {
            tenant: "clamp-gemini",
            path: GEMINI_PATH,
            body: gemini_body(1000),
            stream: false,
            limit: "/generationConfig/maxOutputTokens",
            clamped: true,
        },
        Case {
            tenant: "clamp-converse",
            path: CONVERSE_PATH,
            body: converse_body(1000),
            stream: false,
            limit: "/inferenceConfig/maxTokens",
            clamped: true,
        },
        Case {
            tenant: "clamp-invoke",
            path: INVOKE_PATH,
            body: claude_body(1000, false, "bedrock-2023-05-31"),
            stream: false,
            limit: "/max_tokens",
            clamped: true,
        },
    ];
    for c in &cases {
        let headers = [
            ("x-tenant-id", c.tenant),
            ("x-mock-tenant", c.tenant),
            ("x-mock-tag", c.tenant),
            ("content-type", "application/json"),
        ];
        let body = c.body.to_string();
        if c.stream {
            let r = wasm_test::http::post_stream(
                s.envoy.port,
                c.path,
                &headers,
                body.as_bytes(),
                &wasm_test::http::StreamOpts::default(),
            )
            .unwrap();
            assert_eq!(r.status, 200, "{}: {}", c.tenant, r.text());
            assert!(r.complete, "{}", c.tenant);
        } else {
            let r = wasm_test::http::post(s.envoy.port, c.path, &headers, body.as_bytes()).unwrap();
            assert_eq!(r.status, 200, "{}: {}", c.tenant, r.text());
        }
        let sent = s
            .mock
            .requests()
            .into_iter()
            .find(|r| r.header("x-mock-tag") == Some(c.tenant))
            .unwrap_or_else(|| panic!("{}: the provider got it", c.tenant))
            .json();
        let asked = c.body.pointer(c.limit).and_then(Value::as_u64);
        let got = sent.pointer(c.limit).and_then(Value::as_u64);
        if c.clamped {
            assert!(
                got.is_some_and(|g| g < 300 && g > 200),
                "{}: lowered to what the quota has left: {sent}",
                c.tenant
            );
            // Everything else as sent.
            let mut want = c.body.clone();
            if let (Some(w), Some(g)) = (want.pointer_mut(c.limit), got) {
                *w = json!(g);
            }
            assert_eq!(sent, want, "{}", c.tenant);
        } else {
            assert_eq!(got, asked, "{}: {sent}", c.tenant);
        }
    }
    let l = ledger(&s.mock);
    let by = l.by_tag();
    let mut report = Vec::new();
    for c in &cases {
        let a = by
            .get(c.tenant)
            .unwrap_or_else(|| panic!("{}: in the ledger", c.tenant));
        assert_eq!(a.outcome, "complete", "{}: {a:?}", c.tenant);
        let want = a.tokens as i64;
        let got = s.wait_key(&used_key(c.tenant), want);
        println!("{:<18} served {want:>4}  redis {got:>4}", c.tenant);
        if got != want {
            report.push(format!("{}: served {want}, redis {got}", c.tenant));
        }
    }
    assert!(report.is_empty(), "{}", report.join("; "));
    tg::assert_no_panic(&s.envoy);
}

#[test]
fn an_open_breaker_of_a_model_the_path_names_refuses_in_the_familys_shape_without_a_fallback() {
    let mock = mock_provider!();
    let cfg = tg::merge(
        tg::config(json!([rule("all", "*", "*", 1_000_000.0, 1_000_000_000)])),
        json!({"breaker": {"keys": ["model"], "failure_threshold": 3, "recovery_ms": 60000,
               "model_fallbacks": {BEDROCK_MODEL: "amazon.nova-lite-v1:0"}}}),
    );
    let envoy = tg::start(&mock, cfg);
    let body = converse_body(8).to_string();
    let post = |extra: &[(&str, &str)]| {
        let mut h = vec![("x-tenant-id", "b"), ("content-type", "application/json")];
        h.extend_from_slice(extra);
        wasm_test::http::post(envoy.port, CONVERSE_PATH, &h, body.as_bytes()).unwrap()
    };
    for _ in 0..3 {
        assert_eq!(post(&[("x-mock-status", "500")]).status, 500);
    }
    let before = mock.requests().len();
    let r = post(&[]);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.header("x-amzn-errortype"),
        Some("ServiceUnavailableException")
    );
    assert_eq!(r.header("x-tokengate-reason"), Some("circuit_open"));
    assert!(r.header("x-amz-retry-after").is_some(), "{:?}", r.headers);
    assert!(r.header("x-tokengate-fallback").is_none());
    assert_eq!(mock.requests().len(), before, "the provider was not asked");
    // botocore reads it as its own retryable exception.
    let got = drive(
        envoy.port,
        &[call(
            "bedrock-converse",
            &["--tenant", "b", "--max-retries", "0"],
        )],
    );
    assert_eq!(
        got[0]["exception"], "ServiceUnavailableException",
        "{}",
        got[0]
    );
    tg::assert_no_panic(&envoy);
}
