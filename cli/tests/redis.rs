//! `tokengate` against a real `redis-server`, whose keys are written by the filter's own Lua scripts
//! (reserve, settle, lease) sent through a real Webdis, as the filter sends them: the report is exact
//! against the counters (leases and reservations in flight shown apart), overrides are the keys the
//! scripts read, a give-back keeps what leases and requests in flight hold, and every failure is one line
//! and an exit code.

mod common;

use common::{have_redis, now, ok, rows, tg, write, Scripts};
use tokengate::quota::calendar::month_label;
use wasm_test::{RedisServer, TempDir, Webdis};

struct Stack {
    _webdis: Webdis,
    redis: RedisServer,
    webdis_port: u16,
    dir: TempDir,
    month: String,
}

const CONFIG: &str = r#"{
  "group_header": "x-team", "trusted_headers": {"set_by": "the test"},
  "rules": [{"tokens_per_second": 1000, "burst": 100000}],
  "quota": {"cluster": "webdis", "monthly_limit": 1000000, "currency": "USD", "lease": {},
    "tenants": {"alice@example.com": {"monthly_limit": 50000, "model_limits": {"gpt-x": 40000}}},
    "weights": {"gpt-x": {"input": 1, "output": 4}},
    "prices": {"gpt-x": {"input": 2.5, "output": 10}},
    "budgets": [{"name": "team-spend", "scope": "group", "monthly_limit": 100},
                {"name": "own", "scope": "tenant", "monthly_limit": 100000, "unit": "tokens"}]}
}"#;

impl Stack {
    fn start() -> Option<Stack> {
        if !have_redis() {
            return None;
        }
        let redis = RedisServer::start();
        let webdis = Webdis::start(redis.port);
        Some(Stack {
            webdis_port: webdis.port,
            _webdis: webdis,
            redis,
            dir: TempDir::new("cli-redis"),
            month: month_label(now(), 0),
        })
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.redis.port)
    }

    fn config(&self, text: &str) -> String {
        write(self.dir.path(), "config.json", text)
    }

    /// `tokengate --config <CONFIG> --redis <this Redis> args…` (exit 0), stdout.
    fn tg(&self, args: &[&str]) -> String {
        let cfg = self.config(CONFIG);
        let url = self.url();
        let mut a = vec!["--config", cfg.as_str(), "--redis", url.as_str()];
        a.extend_from_slice(args);
        ok(&a)
    }

    /// [`Stack::tg`] without expecting success.
    fn tg_result(&self, args: &[&str]) -> common::Run {
        let cfg = self.config(CONFIG);
        let url = self.url();
        let mut a = vec!["--config", cfg.as_str(), "--redis", url.as_str()];
        a.extend_from_slice(args);
        common::tg(&a)
    }

    fn scripts(&self) -> Scripts {
        Scripts {
            webdis_port: self.webdis_port,
            month: self.month.clone(),
        }
    }

    fn reserve(
        &self,
        account: &str,
        model: Option<&str>,
        id: &str,
        prompt: u64,
        output: u64,
        limit: u64,
    ) -> bool {
        self.scripts()
            .reserve(account, model, id, prompt, output, limit)
    }

    fn settle(&self, account: &str, model: Option<&str>, id: &str, actual: u64) {
        self.scripts().settle(account, model, id, actual)
    }

    fn lease(&self, account: &str, model: Option<&str>, envoy: u64, want: u64, limit: u64) -> u64 {
        self.scripts().lease(account, model, envoy, want, limit)
    }

    fn get(&self, key: &str) -> i64 {
        self.redis
            .cmd(&["GET", key])
            .ok()
            .and_then(|v| v.as_int())
            .unwrap_or(0)
    }
}

#[test]
fn the_report_is_exact_against_the_counters_with_leases_and_reservations_apart() {
    let Some(s) = Stack::start() else { return };
    let (alice, bob) = ("alice@example.com", "bob");
    // alice: one request settled (reserved 100 + 400, used 300), one in flight (500), and a lease of
    // another Envoy holding 5,000 of her gpt-x.
    assert!(s.reserve(alice, Some("gpt-x"), "r1", 100, 400, 50_000));
    s.settle(alice, Some("gpt-x"), "r1", 300);
    assert!(s.reserve(alice, Some("gpt-x"), "r2", 100, 400, 50_000));
    assert_eq!(s.lease(alice, Some("gpt-x"), 0xbeef, 5_000, 50_000), 5_000);
    // bob: no model counter (a body without a model).
    assert!(s.reserve(bob, None, "r3", 10, 20, 1_000_000));
    s.settle(bob, None, "r3", 25);
    // Team red's money budget: 9,955 micro-dollars settled.
    let team = "~b:team-spend:group=red";
    assert!(s.reserve(team, None, "r4", 5_000, 8_000, 100_000_000));
    s.settle(team, None, "r4", 9_955);

    let json = s.tg(&["usage", "--format", "json"]);
    let r = rows(&json);
    let find = |acct: &str| {
        r.iter()
            .find(|x| x.0 == acct)
            .unwrap_or_else(|| panic!("no row {acct}:\n{json}"))
            .clone()
    };
    let a = find(alice);
    let key = format!("tg:q:{{alice%40example.com}}:{}", s.month);
    assert_eq!(a.3, s.get(&key), "used is the counter");
    assert_eq!((a.3, a.4, a.5, a.6), (5_800, 5_000, 500, 300), "{json}");
    assert_eq!(a.2, "tokens");
    let b = find(bob);
    assert_eq!((b.3, b.6), (25, 25));
    let t = find("team-spend:group=red");
    assert_eq!((t.2.as_str(), t.3), ("USD", 9_955));
    assert!(json.contains("\"amount\": \"0.009955\""), "{json}");
    // Totals per unit.
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let tokens = v["totals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["unit"] == "tokens")
        .unwrap();
    assert_eq!(tokens["used"]["base"], 5_825);

    // Per model: alice's gpt-x counter, bob's usage without a model counter as `*`.
    let by_model = rows(&s.tg(&["usage", "--by", "model", "--format", "json"]));
    assert!(by_model
        .iter()
        .any(|x| x.0 == alice && x.1 == "gpt-x" && x.3 == 5_800 && x.4 == 5_000));
    assert!(by_model
        .iter()
        .any(|x| x.0 == bob && x.1 == "*" && x.3 == 25));

    // Selections: a tenant, a group, a budget; the table and CSV say the same.
    let only = rows(&s.tg(&["usage", "--tenant", alice, "--format", "json"]));
    assert_eq!(only.len(), 1);
    let red = rows(&s.tg(&["usage", "--group", "red", "--format", "json"]));
    assert_eq!(red.len(), 1);
    assert_eq!(red[0].3, 9_955);
    let table = s.tg(&["usage"]);
    assert!(
        table.contains("team-spend:group=red") && table.contains("0.009955"),
        "{table}"
    );
    let csv = s.tg(&["usage", "--format", "csv", "--budget", "team-spend"]);
    assert!(csv.starts_with("kind,account,unit,used,"), "{csv}");
    assert!(
        csv.contains("budget,team-spend:group=red,USD,0.009955,0,0,0.009955,-,-,100,99.990045\r\n"),
        "{csv}"
    );
    println!("{table}");
}

#[test]
fn leases_show_which_envoy_holds_how_much_of_what() {
    let Some(s) = Stack::start() else { return };
    assert_eq!(
        s.lease("alice@example.com", Some("gpt-x"), 0xbeef, 4_000, 50_000),
        4_000
    );
    let before = now();
    let out = s.tg(&["leases"]);
    println!("{out}");
    let line = out
        .lines()
        .find(|l| l.contains("beef"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.starts_with("alice@example.com  gpt-x"), "{line}");
    assert!(line.contains("4000 tokens"), "{line}");
    // Since: the lease's version is the grant's time in ms.
    let since = tokengate_cli_utc(before);
    assert!(line.contains(&since[..15]), "{line} vs {since}");
    assert!(s
        .tg(&["leases", "--tenant", "bob"])
        .contains("no quota leases"));
}

/// The same UTC format as the CLI prints (date and hour and minute compared).
fn tokengate_cli_utc(t: i64) -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "-d", &format!("@{t}"), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn overrides_are_the_keys_the_scripts_read_with_ids_encoded() {
    let Some(s) = Stack::start() else { return };
    // A tenant id no request can carry is refused, not written.
    let bad = s.tg_result(&["override", "set", "--tenant", "bad tenant", "--limit", "5"]);
    assert_ne!(bad.code, 0, "{}{}", bad.out, bad.err);
    assert!(bad.err.contains("not a tenant id"), "{}", bad.err);
    let alice = "alice@example.com";
    // 60,000 is above her configured 50,000: refused, then admitted once the override raised it.
    assert!(!s.reserve(alice, None, "big1", 30_000, 30_000, 50_000));
    let out = s.tg(&["override", "set", "--tenant", alice, "--limit", "100000"]);
    assert!(
        out.starts_with("tg:q:{alice%40example.com}:limit: (configured) -> 100000 tokens"),
        "{out}"
    );
    assert_eq!(s.get("tg:q:{alice%40example.com}:limit"), 100_000);
    assert!(s.reserve(alice, None, "big2", 30_000, 30_000, 50_000));
    // A model limit and a budget in money (exact micro-units).
    s.tg(&[
        "override",
        "set",
        "--tenant",
        alice,
        "--model",
        "meta/llama",
        "--limit",
        "7",
    ]);
    assert_eq!(s.get("tg:q:{alice%40example.com}:limit:m:meta%2Fllama"), 7);
    s.tg(&[
        "override",
        "set",
        "--budget",
        "team-spend",
        "--group",
        "red",
        "--limit",
        "750.50",
    ]);
    assert_eq!(
        s.get("tg:q:{%7Eb:team-spend:group%3Dred}:limit"),
        750_500_000
    );
    let list = s.tg(&["override", "list"]);
    println!("{list}");
    assert!(
        list.contains("team-spend:group=red") && list.contains("750.5") && list.contains("USD"),
        "{list}"
    );
    assert!(list.contains("meta/llama"), "{list}");
    // The usage report uses the override as the limit.
    let json = s.tg(&["usage", "--tenant", alice, "--format", "json"]);
    assert!(
        json.contains("\"limit\": {\n        \"amount\": \"100000\""),
        "{json}"
    );
    let out = s.tg(&["override", "clear", "--tenant", alice]);
    assert!(out.contains("override removed"), "{out}");
    assert_eq!(s.get("tg:q:{alice%40example.com}:limit"), 0);
    // Wrong amounts and names: exit 2 or 5, one line.
    let cfg = s.config(CONFIG);
    let url = s.url();
    for (args, code) in [
        (
            vec!["override", "set", "--tenant", alice, "--limit", "1.5"],
            2,
        ),
        (
            vec![
                "override",
                "set",
                "--budget",
                "team-spend",
                "--group",
                "red",
                "--limit",
                "0.0000001",
            ],
            2,
        ),
        (
            vec!["override", "set", "--budget", "nope", "--limit", "1"],
            5,
        ),
        (
            vec!["override", "set", "--budget", "team-spend", "--limit", "1"],
            2,
        ),
        (
            vec![
                "override", "set", "--budget", "own", "--model", "m", "--tenant", "x", "--limit",
                "1",
            ],
            2,
        ),
    ] {
        let mut a = vec!["--config", cfg.as_str(), "--redis", url.as_str()];
        a.extend(args.iter().copied());
        let r = tg(&a);
        assert_eq!(r.code, code, "{args:?}: {}", r.err);
        assert_eq!(r.err.lines().count(), 1, "{}", r.err);
    }
}

#[test]
fn a_month_given_back_keeps_what_leases_and_requests_in_flight_hold() {
    let Some(s) = Stack::start() else { return };
    let alice = "alice@example.com";
    let key = format!("tg:q:{{alice%40example.com}}:{}", s.month);
    let mkey = format!("{key}:m:gpt-x");
    assert!(s.reserve(alice, Some("gpt-x"), "r1", 100, 400, 50_000));
    s.settle(alice, Some("gpt-x"), "r1", 30_000);
    assert!(s.reserve(alice, Some("gpt-x"), "r2", 100, 400, 50_000));
    assert_eq!(s.lease(alice, Some("gpt-x"), 0xbeef, 5_000, 50_000), 5_000);
    assert_eq!(s.get(&key), 35_500);
    // 14,500 left of 50,000: a 15,000 request is refused.
    assert!(!s.reserve(alice, Some("gpt-x"), "r3", 5_000, 10_000, 50_000));
    let out = s.tg(&["month", "give-back", alice]);
    println!("{out}");
    assert!(
        out.contains(&format!("{key}: 35500 -> 5500 tokens")),
        "{out}"
    );
    assert_eq!((s.get(&key), s.get(&mkey)), (5_500, 5_500));
    assert!(s.reserve(alice, Some("gpt-x"), "r3", 5_000, 10_000, 50_000));
    // The request in flight settles exactly against the lowered counter.
    s.settle(alice, Some("gpt-x"), "r2", 200);
    assert_eq!(s.get(&key), 5_500 - 500 + 200 + 15_000);
    // A budget's month, by its group.
    let team = "~b:team-spend:group=red";
    assert!(s.reserve(team, None, "b1", 10, 10, 100_000_000));
    s.settle(team, None, "b1", 5_000_000);
    let out = s.tg(&[
        "month",
        "give-back",
        "--budget",
        "team-spend",
        "--group",
        "red",
    ]);
    assert!(out.contains("5 -> 0 USD"), "{out}");
}

#[test]
fn failures_are_one_line_and_an_exit_code() {
    let Some(s) = Stack::start() else { return };
    let cfg = s.config(CONFIG);
    let url = s.url();
    let run = |extra: &[&str], cfg: &str| {
        let mut a = vec!["--config", cfg, "--redis", url.as_str()];
        a.extend_from_slice(extra);
        tg(&a)
    };
    // A budget Redis holds that the configuration does not define: exit 5, no money printed.
    assert!(s.reserve("~b:old-budget:group=red", None, "x1", 1, 1, 1_000_000));
    let r = run(&["usage"], &cfg);
    assert_eq!(r.code, 5, "{}{}", r.out, r.err);
    assert!(
        r.err.contains("\"old-budget\"") && r.err.contains("defines no such budget"),
        "{}",
        r.err
    );
    assert!(r.out.is_empty());
    s.redis
        .cmd(&[
            "DEL",
            &format!("tg:q:{{%7Eb:old-budget:group%3Dred}}:{}", s.month),
        ])
        .unwrap();
    // A configuration without a quota section against quota counters: exit 5.
    assert!(s.reserve("t", None, "x2", 1, 1, 1_000_000));
    let noquota = write(
        s.dir.path(),
        "noquota.json",
        r#"{"rules": [{"tokens_per_second": 1, "burst": 1}]}"#,
    );
    let r = run(&["usage"], &noquota);
    assert_eq!(r.code, 5, "{}", r.err);
    // Another key schema version: exit 4.
    s.redis.cmd(&["SET", "tg:schema", "9"]).unwrap();
    let r = run(&["usage"], &cfg);
    assert_eq!(r.code, 4, "{}", r.err);
    assert!(r.err.contains("schema version \"9\""), "{}", r.err);
    s.redis.cmd(&["SET", "tg:schema", "3"]).unwrap();
    assert_eq!(run(&["usage"], &cfg).code, 0);
    // A lease record of another shape: exit 4 naming the key.
    s.redis
        .cmd(&["HSET", "tg:q:{t}:leases", "L|1|-|x", "12 garbage"])
        .unwrap();
    let r = run(&["leases"], &cfg);
    assert_eq!(r.code, 4, "{}", r.err);
    assert!(r.err.contains("tg:q:{t}:leases"), "{}", r.err);
    // Redis unreachable: exit 3, one line.
    let dead = format!("redis://127.0.0.1:{}", wasm_test::free_port());
    let r = tg(&["--config", &cfg, "--redis", &dead, "usage"]);
    assert_eq!(r.code, 3);
    assert!(
        r.err
            .starts_with("tokengate: cannot reach Redis at redis://127.0.0.1:"),
        "{}",
        r.err
    );
    assert_eq!(r.err.lines().count(), 1);
    // A bad month, an unreadable config: exit 2.
    assert_eq!(run(&["usage", "--month", "2026-13"], &cfg).code, 2);
    assert_eq!(run(&["usage"], "/nonexistent.json").code, 2);
    // An invalid configuration: exit 1, the filter's message.
    let bad = write(
        s.dir.path(),
        "bad.json",
        r#"{"rules": [{"tokens_per_second": 1, "burst": -5}]}"#,
    );
    let r = run(&["usage"], &bad);
    assert_eq!(r.code, 1);
    assert!(
        r.err.ends_with(
            "invalid configuration: rules[0].burst: must be between 1 and 1e15, got -5\n"
        ),
        "{}",
        r.err
    );
}

#[test]
fn help_shows_examples_and_exits_zero() {
    let out = ok(&["--help"]);
    assert!(
        out.contains("Examples:") && out.contains("tokengate usage --group team=red"),
        "{out}"
    );
    for sub in ["check", "explain", "usage", "leases"] {
        let out = ok(&[sub, "--help"]);
        assert!(out.contains("Example"), "{sub}: {out}");
    }
    assert!(ok(&["override", "set", "--help"]).contains("750.50"));
    assert!(ok(&["month", "give-back", "--help"]).contains("give-back alice"));
    let r = tg(&["usage", "--by", "nothing"]);
    assert_eq!(r.code, 2);
}

#[test]
fn budget_counters_per_model_are_reported_in_money_when_redis_has_them() {
    // The filter keeps no per-model counter for a budget today (it reserves budgets without the model);
    // a filter that passed the model would get them from the same scripts, and the report reads them:
    // what team red spent on each model, in money.
    let Some(s) = Stack::start() else { return };
    let team = "~b:team-spend:group=red";
    assert!(s.reserve(team, Some("gpt-x"), "m1", 10, 10, 100_000_000));
    s.settle(team, Some("gpt-x"), "m1", 1_250_000);
    assert!(s.reserve(team, Some("gpt-y"), "m2", 10, 10, 100_000_000));
    s.settle(team, Some("gpt-y"), "m2", 500);
    let out = s.tg(&[
        "usage",
        "--group",
        "group=red",
        "--by",
        "model",
        "--format",
        "csv",
    ]);
    let (cfg, url) = (s.config(CONFIG), s.url());
    let r = tg(&[
        "--config", &cfg, "--redis", &url, "usage", "--group", "team=red",
    ]);
    assert_eq!(r.code, 2, "a level the configuration lacks: {}", r.err);
    println!("{out}");
    assert!(
        out.contains("budget,team-spend:group=red,gpt-x,USD,1.25,"),
        "{out}"
    );
    assert!(
        out.contains("budget,team-spend:group=red,gpt-y,USD,0.0005,"),
        "{out}"
    );
    assert!(out.contains("total,,,USD,1.2505,"), "{out}");
}
