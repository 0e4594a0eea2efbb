//! `tokengate` beside the built `.wasm` in a real Envoy 1.40 (`ENVOY_BIN`, `TOKENGATE_WASM`, as
//! `make test` sets them), Redis behind Webdis and the mock provider:
//!
//! * `check` prints, for each bad configuration, the very line the filter logs when Envoy loads it
//!   (`envoy --mode validate` runs `on_configure`), byte for byte: every bad-config case of the filter's
//!   Envoy tests (contract.rs, quota.rs, breaker.rs) and one or more per config section of its unit
//!   tests, syntax errors included (their line and column too), read from the very bootstrap Envoy read;
//! * `usage` after a run of requests through Envoy equals the ledger of what the mock provider served
//!   (each response's `usage`, weighted and priced here independently of the filter) and the raw
//!   counters in Redis.

mod common;

use common::{ok, rows, tg, write};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use wasm_test::tg::{config, merge, rule};
use wasm_test::{
    http, render_bootstrap, Envoy, EnvoyOpts, MockProvider, RedisServer, TempDir, Webdis,
};

fn mock() -> MockProvider {
    let bin = wasm_test::mock_provider_bin();
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = std::process::Command::new(cargo)
            .args(["build", "-q", "-p", "wasm-test", "--bin", "mock-provider"])
            .status()
            .expect("cargo build mock-provider");
        assert!(st.success());
    }
    MockProvider::start()
}

/// The text after the first `invalid configuration: ` of the first line holding it.
fn message(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        l.split_once("invalid configuration: ")
            .map(|(_, m)| m.to_string())
    })
}

/// Bad configurations, as the text the filter receives.
fn bad_configs() -> Vec<String> {
    let mut v: Vec<Value> = Vec::new();
    // wasm-test/tests/contract.rs, bad_config_is_refused_at_load.
    let good_rule = rule("all", "*", "*", 1.0, 1000);
    v.push(json!({"rules": [good_rule.clone()], "bogus_option": true}));
    v.push(json!({"rules": [rule("neg", "*", "*", -5.0, 1000)]}));
    v.push(json!({"rules": []}));
    // wasm-test/tests/quota.rs, bad_quota_config_is_refused.
    let base = config(json!([rule("all", "*", "*", 1000.0, 100_000)]));
    for q in [
        json!({"monthly_limit": 1000}),
        json!({"cluster": "webdis", "monthly_limit": 0}),
        json!({"cluster": "webdis"}),
        json!({"cluster": "webdis", "monthly_limit": 1000, "bogus_knob": 1}),
        json!({"cluster": "webdis", "monthly_limit": 1000, "on_failure": "maybe"}),
    ] {
        v.push(merge(base.clone(), json!({ "quota": q })));
    }
    // wasm-test/tests/breaker.rs, bad_breaker_config_is_refused_at_load.
    let base = config(json!([rule("all", "*", "*", 1.0, 1000)]));
    for b in [
        json!({"half_open_max_calls": 0}),
        json!({"probe_permits": 2}),
        json!({"failure_statuses": [[400, 499]]}),
        json!({"keys": ["provider"]}),
        json!({"half_open_max_calls": 2, "half_open_successes_to_close": 3}),
        json!({"recovery_ms": 5000, "max_recovery_ms": 1000}),
        json!({"cluster_fallbacks": {"provider": {"cluster": "provider", "route": "x"}}}),
    ] {
        v.push(merge(base.clone(), json!({ "breaker": b })));
    }
    let mut texts: Vec<String> = v.iter().map(Value::to_string).collect();
    // The unit tests' cases, one or more per section (src/config/*.rs), as raw text.
    let r = r#"{"tokens_per_second":10,"burst":100}"#;
    for t in [
        // shape.rs: syntax, trailing text, not an object, wrong type, unknown field, duplicate key.
        r#"{"rules":[{"tokens_per_second":10,"burst":100,}]}"#.to_string(),
        format!(r#"{{"rules":[{r}]}} x"#),
        "[1]".to_string(),
        r#"{"rules":[{"tokens_per_second":"fast","burst":1}]}"#.to_string(),
        format!(r#"{{"rules":[{r}],"models":{{"a":{{}},"b":{{}},"a":{{}}}}}}"#),
        // rules.rs: a name, a tenant glob, a model pattern, a control character (escaped on one line).
        r#"{"rules":[{"name":"a b","tokens_per_second":1,"burst":1}]}"#.to_string(),
        r#"{"rules":[{"tenant":"a*","tokens_per_second":1,"burst":1}]}"#.to_string(),
        r#"{"rules":[{"model":"gp*t","tokens_per_second":1,"burst":1}]}"#.to_string(),
        "{\"rules\":[{\"name\":\"a\\nb\",\"tokens_per_second\":1,\"burst\":1}]}".to_string(),
        // limits.rs and groups.rs.
        r#"{"limits":[{"scope":"team","tokens_per_second":1,"burst":1}]}"#.to_string(),
        r#"{"limits":[{"name":"x"}]}"#.to_string(),
        r#"{"limits":[{"max_in_flight":5000}]}"#.to_string(),
        format!(r#"{{"group_header":"x-team","groups":[{{"name":"team"}}],"rules":[{r}]}}"#),
        // top.rs and models.rs.
        format!(r#"{{"rules":[{r}],"default_tenant":"a b"}}"#),
        format!(r#"{{"rules":[{r}],"api_keys":{{"a":["nope"]}}}}"#),
        format!(r#"{{"rules":[{r}],"max_body_bytes":0}}"#),
        format!(r#"{{"rules":[{r}],"default_output":{{"max_tokens_cap":0}}}}"#),
        // quota.rs and budgets.rs.
        format!(
            r#"{{"rules":[{r}],"quota":{{"cluster":"w","monthly_limit":1,"abandoned_charge":"all"}}}}"#
        ),
        format!(
            r#"{{"rules":[{r}],"quota":{{"cluster":"w","monthly_limit":1,"idempotency_window_s":600}}}}"#
        ),
        format!(
            r#"{{"rules":[{r}],"quota":{{"cluster":"w","monthly_limit":1,"weights":{{"m":{{"output":-1}}}}}}}}"#
        ),
        format!(
            r#"{{"rules":[{r}],"quota":{{"cluster":"w","monthly_limit":1,"prices":{{"m":{{"input":1,"output":1}}}}}}}}"#
        ),
        r#"{"rules":[{"name":"spend","tokens_per_second":1,"burst":1}],"quota":{"cluster":"w","currency":"USD","prices":{"*":{"input":1,"output":1}},"budgets":[{"name":"spend","scope":"shared","monthly_limit":1}]}}"#.to_string(),
        format!(
            r#"{{"rules":[{r}],"quota":{{"cluster":"w","currency":"USD","prices":{{"*":{{"input":1,"output":1}}}},"budgets":[{{"name":"b","scope":"shared","monthly_limit":0}}]}}}}"#
        ),
        // global.rs, paths.rs, breaker.rs.
        r#"{"rules":[{"tokens_per_second":1,"burst":1,"global":true}]}"#.to_string(),
        format!(r#"{{"rules":[{r}],"unmetered_paths":{{"allow":["no-slash"]}}}}"#),
        format!(r#"{{"rules":[{r}],"breaker":{{"max_keys":100001}}}}"#),
    ] {
        texts.push(t);
    }
    texts
}

#[test]
fn check_prints_the_line_the_filter_logs_at_load_for_every_bad_config_case() {
    let dir = TempDir::new("cli-check");
    let placeholder = json!({"placeholder": "tokengate-cli-case"});
    let literal = Value::String(placeholder.to_string()).to_string();
    let started = Instant::now();
    let cases = bad_configs();
    let mut compared = 0;
    for (i, text) in cases.iter().enumerate() {
        let boot = render_bootstrap(
            &EnvoyOpts::new(wasm_test::free_port(), placeholder.clone()),
            dir.path(),
        );
        let yaml = std::fs::read_to_string(&boot.path).unwrap();
        assert!(
            yaml.contains(&literal),
            "the bootstrap holds the config as a JSON string"
        );
        let yaml = yaml.replace(&literal, &Value::String(text.clone()).to_string());
        let path = write(dir.path(), &format!("case{i}.yaml"), &yaml);
        let envoy = Envoy::validate(std::path::Path::new(&path))
            .err()
            .unwrap_or_else(|| panic!("Envoy accepted case {i}: {text}"));
        let from_envoy =
            message(&envoy).unwrap_or_else(|| panic!("case {i}: no load line:\n{envoy}"));
        let r = tg(&["check", &path]);
        assert_eq!(r.code, 1, "case {i}: {text}\n{}{}", r.out, r.err);
        let from_cli = message(&r.out).unwrap_or_else(|| panic!("case {i}: {}", r.out));
        assert_eq!(from_cli, from_envoy, "case {i}: {text}");
        compared += 1;
        println!("{from_cli}");
    }
    println!(
        "{compared} bad configurations: `tokengate check` printed the filter's load line byte for byte ({:.0?})",
        started.elapsed()
    );
    // The plain JSON gives the same line as the bootstrap holding it.
    let json = write(dir.path(), "bad.json", &cases[1]);
    assert_eq!(
        message(&tg(&["check", &json]).out),
        Some("rules[0].tokens_per_second: must be between 0.001 and 1e15, got -5".to_string())
    );
}

/// What one admitted request was charged, from the provider's `usage` in its response.
struct Served {
    tenant: &'static str,
    team: &'static str,
    model: &'static str,
    prompt: i64,
    completion: i64,
}

/// The provider's `usage` of an answer: the JSON body's, or a stream's last chunk with one.
fn usage_of(body: &[u8], stream: bool) -> Value {
    let text = String::from_utf8_lossy(body);
    if !stream {
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        return v["usage"].clone();
    }
    text.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["usage"].is_object())
        .map(|v| v["usage"].clone())
        .unwrap_or_else(|| panic!("no usage in the stream: {text}"))
}

/// `(account, model) -> (tokens_in, tokens_out)` of a `usage --format json` report (`None`: null).
fn io_rows(json: &str) -> BTreeMap<(String, String), (Option<i64>, Option<i64>)> {
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    v["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
            (
                (s("account"), s("model")),
                (r["tokens_in"].as_i64(), r["tokens_out"].as_i64()),
            )
        })
        .collect()
}

#[test]
fn the_usage_report_equals_the_ledger_of_a_run_through_envoy() {
    ledger_run(false);
}

/// The same run with leases (the default): requests are served from this Envoy's leases once a sync
/// granted one, and their usage and input/output split reach Redis with the next syncs. 0.2.0 before
/// the split of leased requests reported only the per-request reservations' tokens here (the first
/// request of each account and model).
#[test]
fn the_usage_report_equals_the_ledger_of_a_leased_run_through_envoy() {
    ledger_run(true);
}

/// 24 requests through Envoy; `tokengate usage` then equals the mock provider's ledger, per account,
/// model, team, in weighted tokens, money and the provider's input/output tokens.
fn ledger_run(lease: bool) {
    if !common::have_redis() {
        return;
    }
    let redis = RedisServer::start();
    let webdis = Webdis::start(redis.port);
    let mock = mock();
    let cfg = merge(
        config(json!([rule("all", "*", "*", 10_000_000.0, 1_000_000_000)])),
        // Per request, or leased (a lease holds its unspent part in `used`: `settled` is compared).
        json!({"group_header": "x-team",
               "quota": {"cluster": "webdis", "timeout_ms": 1000, "monthly_limit": 100_000_000,
                 "lease": if lease { json!({}) } else { json!(false) },
                 "currency": "USD",
                 "weights": {"gpt-test": {"input": 1, "output": 3}},
                 "prices": {"gpt-test": {"input": 2.5, "output": 10}, "*": {"input": 1, "output": 2}},
                 "budgets": [{"name": "team-spend", "scope": "group", "monthly_limit": 1000},
                             {"name": "own", "scope": "tenant", "monthly_limit": 100_000_000, "unit": "tokens"}]}}),
    );
    let mut opts = EnvoyOpts::new(mock.port, cfg.clone()).webdis(webdis.port);
    opts.ready_timeout = Duration::from_secs(60);
    let envoy = wasm_test::tg::start_opts(opts);
    let dir = TempDir::new("cli-ledger");
    let cfg_path = write(dir.path(), "config.json", &cfg.to_string());
    let url = format!("redis://127.0.0.1:{}", redis.port);
    // The load line names what is configured (it said `configured: 0 bucket rules` with limits only),
    // and `check` says the same.
    let summary = if lease {
        "configured: 1 bucket rules, 0 limits, quota (2 budgets, leases)"
    } else {
        "configured: 1 bucket rules, 0 limits, quota (2 budgets)"
    };
    assert!(
        envoy.wait_log(summary, Duration::from_secs(10)),
        "{}",
        envoy.log()
    );
    assert!(ok(&["check", &cfg_path]).ends_with(&format!(": ok: {summary}\n")));

    // 24 requests: two tenants, two teams, two models, a completion count lowered by the mock for some,
    // a third of them streamed (SSE, usage in the last chunk).
    let mut ledger = Vec::new();
    for i in 0..24u64 {
        let tenant = ["t-ann", "t-bo"][(i % 2) as usize];
        let team = ["red", "blue"][(i / 2 % 2) as usize];
        let model = ["gpt-test", "other-model"][(i / 4 % 2) as usize];
        let stream = i % 3 == 1;
        let mut body = json!({"model": model, "max_tokens": 20 + i * 7,
            "messages": [{"role": "user", "content": "Tell me about rivers ".repeat(1 + i as usize)}]});
        if stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        let completion = (10 + i * 3).to_string();
        let mut h = vec![
            ("x-tenant-id", tenant),
            ("x-team", team),
            ("content-type", "application/json"),
        ];
        if i % 3 == 0 {
            h.push(("x-mock-completion-tokens", completion.as_str()));
        }
        let r = http::post(
            envoy.port,
            wasm_test::tg::CHAT,
            &h,
            body.to_string().as_bytes(),
        )
        .unwrap_or_else(|e| panic!("POST: {e}"));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let u = &usage_of(&r.body, stream);
        ledger.push(Served {
            tenant,
            team,
            model,
            prompt: u["prompt_tokens"].as_i64().unwrap(),
            completion: u["completion_tokens"].as_i64().unwrap(),
        });
    }
    assert_eq!(mock.requests().len(), 24, "the mock served every request");

    // The ledger, priced here: weights 1/3 (gpt-test), 1/1 (other); prices 2.5/10 and 1/2 µ$ a token,
    // each request rounded up to the micro-dollar.
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for s in &ledger {
        let w = if s.model == "gpt-test" {
            s.prompt + 3 * s.completion
        } else {
            s.prompt + s.completion
        };
        let micros = if s.model == "gpt-test" {
            (s.prompt * 25 + s.completion * 100 + 9) / 10
        } else {
            s.prompt + 2 * s.completion
        };
        *want.entry(s.tenant.to_string()).or_default() += w;
        *want.entry(format!("own:{}", s.tenant)).or_default() += w;
        *want
            .entry(format!("team-spend:group={}", s.team))
            .or_default() += micros;
    }

    // The input/output split the ledger says each account's report holds.
    let io_of = |keep: &dyn Fn(&Served) -> bool| {
        let (i, o) = ledger
            .iter()
            .filter(|s| keep(s))
            .fold((0, 0), |(i, o), s| (i + s.prompt, o + s.completion));
        (Some(i), Some(o))
    };
    let mut want_io: BTreeMap<String, (Option<i64>, Option<i64>)> = BTreeMap::new();
    for t in ["t-ann", "t-bo"] {
        want_io.insert(t.to_string(), io_of(&|s| s.tenant == t));
        want_io.insert(format!("own:{t}"), io_of(&|s| s.tenant == t));
    }
    for team in ["red", "blue"] {
        want_io.insert(
            format!("team-spend:group={team}"),
            io_of(&|s| s.team == team),
        );
    }
    if lease {
        assert!(
            envoy.stat("tokengate_quota_leased") >= 24,
            "most reservations were served from leases: {}",
            envoy.stat("tokengate_quota_leased")
        );
    }
    // Settlements (and with leases the syncs that report what they served, at least every second)
    // are asynchronous: wait (bounded) until nothing is in flight and the report matches.
    let deadline = Instant::now() + Duration::from_secs(if lease { 30 } else { 10 });
    let (json, got) = loop {
        let json = ok(&[
            "--config", &cfg_path, "--redis", &url, "usage", "--format", "json",
        ]);
        let got: BTreeMap<String, (i64, i64)> =
            rows(&json).into_iter().map(|r| (r.0, (r.6, r.5))).collect();
        let settled = got.values().all(|(_, in_flight)| *in_flight == 0);
        let same = want
            .iter()
            .all(|(k, v)| got.get(k).map(|g| g.0) == Some(*v));
        let io = io_rows(&json);
        let same_io = want_io
            .iter()
            .all(|(k, v)| io.get(&(k.clone(), String::new())) == Some(v));
        if (settled && same && same_io) || Instant::now() >= deadline {
            break (json, got);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let got_settled: BTreeMap<String, i64> = got.iter().map(|(k, v)| (k.clone(), v.0)).collect();
    assert_eq!(got_settled, want, "report vs ledger:\n{json}");
    if !lease {
        // Per request: nothing held by leases, `used` is the ledger itself.
        assert!(rows(&json).iter().all(|r| r.4 == 0 && r.3 == r.6), "{json}");
    }
    if lease {
        println!(
            "leased run: {} of the reservations served from leases",
            envoy.stat("tokengate_quota_leased")
        );
    }
    // And against the raw counters.
    let month = tokengate::quota::calendar::month_label(common::now(), 0);
    for (acct, key) in [
        ("t-ann", format!("tg:q:{{t-ann}}:{month}")),
        (
            "team-spend:group=red",
            format!("tg:q:{{%7Eb:team-spend:group%3Dred}}:{month}"),
        ),
    ] {
        let raw = redis
            .cmd(&["GET", &key])
            .ok()
            .and_then(|v| v.as_int())
            .unwrap_or(-1);
        // What leases hold is counted in the counter too.
        let held = rows(&json)
            .into_iter()
            .find(|r| r.0 == acct)
            .map_or(0, |r| r.4);
        assert_eq!(raw - held, want[acct], "{key}");
    }
    // Per model: the tenant's model counters add up to the ledger per model.
    let by_model = rows(&ok(&[
        "--config", &cfg_path, "--redis", &url, "usage", "--by", "model", "--format", "json",
    ]));
    for t in ["t-ann", "t-bo"] {
        for m in ["gpt-test", "other-model"] {
            let w: i64 = ledger
                .iter()
                .filter(|s| s.tenant == t && s.model == m)
                .map(|s| {
                    if m == "gpt-test" {
                        s.prompt + 3 * s.completion
                    } else {
                        s.prompt + s.completion
                    }
                })
                .sum();
            let row = by_model.iter().find(|r| r.0 == t && r.1 == m).unwrap();
            assert_eq!(row.6, w, "{t} {m}");
        }
    }
    // What team X spent on model Y, in money: each budget subject's model counters equal the ledger
    // priced per model (the filter reserves budgets with the model, as it does a tenant's quota).
    for team in ["red", "blue"] {
        for m in ["gpt-test", "other-model"] {
            let micros: i64 = ledger
                .iter()
                .filter(|s| s.team == team && s.model == m)
                .map(|s| {
                    if m == "gpt-test" {
                        (s.prompt * 25 + s.completion * 100 + 9) / 10
                    } else {
                        s.prompt + 2 * s.completion
                    }
                })
                .sum();
            let acct = format!("team-spend:group={team}");
            let row = by_model.iter().find(|r| r.0 == acct && r.1 == m);
            assert_eq!(row.map(|r| r.6), Some(micros), "{acct} {m}");
        }
    }
    // The input/output split: each account's (and each account × model's) tokens in and out equal the
    // provider's prompt and completion tokens of the answers it served, JSON and SSE alike.
    let by_account = io_rows(&json);
    let by_model_io = io_rows(&ok(&[
        "--config", &cfg_path, "--redis", &url, "usage", "--by", "model", "--format", "json",
    ]));
    for t in ["t-ann", "t-bo"] {
        let want = io_of(&|s| s.tenant == t);
        assert_eq!(
            by_account[&(t.to_string(), String::new())],
            want,
            "{t}\n{json}"
        );
        assert_eq!(
            by_account[&(format!("own:{t}"), String::new())],
            want,
            "own:{t}"
        );
        for m in ["gpt-test", "other-model"] {
            let want = io_of(&|s| s.tenant == t && s.model == m);
            assert_eq!(
                by_model_io[&(t.to_string(), m.to_string())],
                want,
                "{t} {m}"
            );
        }
    }
    for team in ["red", "blue"] {
        let acct = format!("team-spend:group={team}");
        assert_eq!(
            by_account[&(acct.clone(), String::new())],
            io_of(&|s| s.team == team),
            "{acct}"
        );
        for m in ["gpt-test", "other-model"] {
            let want = io_of(&|s| s.team == team && s.model == m);
            assert_eq!(
                by_model_io[&(acct.clone(), m.to_string())],
                want,
                "{acct} {m}"
            );
        }
    }
    // The responses' usage is what the mock says it served (its own ledger, independent of Envoy).
    let served = wasm_test::faults::ledger(&mock);
    let (sum_in, sum_out) = io_of(&|_| true);
    let mock_in: u64 = served.answers.iter().map(|a| a.prompt).sum();
    let mock_out: u64 = served.answers.iter().map(|a| a.completion).sum();
    assert_eq!(
        (sum_in, sum_out),
        (Some(mock_in as i64), Some(mock_out as i64))
    );
    assert_eq!(served.answers.iter().filter(|a| a.stream).count(), 8);
    let table = ok(&["--config", &cfg_path, "--redis", &url, "usage"]);
    println!("ledger (mock-served usage, {} requests):", ledger.len());
    for (k, v) in &want {
        println!("  {k:<22} {v}");
    }
    println!("  provider usage: {mock_in} tokens in, {mock_out} tokens out (8 of them SSE)");
    println!("tokengate usage:\n{table}");
    println!(
        "{}",
        ok(&["--config", &cfg_path, "--redis", &url, "usage", "--group", "red", "--by", "model"])
    );
    wasm_test::tg::assert_no_panic(&envoy);
}
