//! Redis Cluster behind Envoy's `redis_proxy` behind Webdis (`docs/scaling.md`, "Redis Cluster"): what
//! Envoy 1.40's `redis_proxy` carries for the filter's scripts, and the filter's quota (per request and
//! leased) and global buckets on three masters + three replicas, with a master killed under load.
//!
//! Every tenant's keys share its hash tag (`tg:q:{tenant}:…`, `tg:gb:{rule:tenant}…`), so each script
//! call touches one slot and Envoy routes it to the master owning the slot of its first key. Tenants here
//! are picked by slot so that each master holds the same number of them.
//!
//! The failover runs (`#[ignore]`, `make fleet`) kill the master of one shard with SIGKILL while three
//! Envoys × 2 workers are under load, wait for its replica's promotion, and check afterwards that each
//! tenant's counter equals the usage its clients were served (nothing lost, nothing charged twice),
//! that no tenant was served beyond its limit, and that the only refusals beyond quota and buckets are
//! the `*_unavailable` answers of the outage (`on_failure: closed`), from the kill until the proxy
//! routes the killed slots to the promoted replica plus one shim breaker recovery and one callout
//! timeout (the bound docs/operating-redis.md states).

use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use wasm_test::cluster::{key_slot, ClusterOpts, ClusterShim, ProxyOpts};
use wasm_test::fleet::{
    self, class_table, refusals_text, run_load, table, tenant_table, GlobalPlan, Plan, TenantPlan,
};
use wasm_test::{http, mock_provider, redis_cmd, tg, RespValue};

// ---------------------------------------------------------------------------------------------
// Webdis, raw
// ---------------------------------------------------------------------------------------------

/// Percent-encodes one Webdis path segment (only `[A-Za-z0-9_-]` raw), as the filter does.
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One command through Webdis (`POST /` with the command path as the body, as the filter sends it):
/// (HTTP status, the value under the command's name, e.g. `{"EVAL": <value>}` → `<value>`).
fn webdis(port: u16, args: &[&str]) -> (u16, Value) {
    let body: Vec<String> = args.iter().map(|a| enc(a)).collect();
    match http::request(
        port,
        "POST",
        "/",
        &[],
        body.join("/").as_bytes(),
        Duration::from_secs(5),
    ) {
        Ok(r) => {
            let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            let inner = v
                .as_object()
                .and_then(|o| o.values().next().cloned())
                .unwrap_or(Value::String(r.text()));
            (r.status, inner)
        }
        Err(e) => (0, Value::String(format!("transport: {e}"))),
    }
}

/// The Redis error text of a Webdis answer `[false, "ERR …"]`, if it is one.
fn redis_error(v: &Value) -> Option<String> {
    match v.as_array().map(Vec::as_slice) {
        Some([Value::Bool(false), Value::String(e)]) => Some(e.clone()),
        _ => None,
    }
}

/// Keeps Redis' main thread busy for `ARGV[1]` µs (a stand-in for a slow node).
const BUSY: &str = "local s = redis.call('TIME') local t0 = s[1] * 1000000 + s[2] \
    while true do local t = redis.call('TIME') if t[1] * 1000000 + t[2] - t0 > tonumber(ARGV[1]) then break end end \
    return 1";

/// `INCR KEYS[1]`.
const INCR: &str = "return redis.call('INCR', KEYS[1])";

/// `SCRIPT EXISTS <sha>` on one node.
fn script_exists(port: u16, sha: &str) -> bool {
    matches!(
        redis_cmd(port, &["SCRIPT", "EXISTS", sha]),
        Ok(RespValue::Array(Some(ref v))) if v.first() == Some(&RespValue::Int(1))
    )
}

/// `GET` on one node, as text (`MOVED …` for a key it does not own).
fn get_on(port: u16, key: &str) -> String {
    match redis_cmd(port, &["GET", key]) {
        Ok(RespValue::Error(e)) => e,
        Ok(v) => v.as_str().unwrap_or_else(|| format!("{v:?}")),
        Err(e) => e,
    }
}

/// One key per master: `tg:x:{a}` … (slots 15495, 3300, 7365).
const KEYS: [&str; 3] = ["tg:x:{a}", "tg:x:{b}", "tg:x:{c}"];

// ---------------------------------------------------------------------------------------------
// What the proxy carries
// ---------------------------------------------------------------------------------------------

/// Through Webdis → Envoy 1.40 `redis_proxy` → the cluster: EVAL runs on the master owning its first
/// key (and only there); keys of two slots get Redis' CROSSSLOT; EVAL with no key is refused by Envoy;
/// EVALSHA of an unknown script gets NOSCRIPT; SCRIPT LOAD goes to every master (no replica) and answers
/// the SHA-1; once EVAL ran on a master, EVALSHA of that script works there and NOSCRIPTs on the others.
#[test]
fn the_redis_proxy_carries_eval_evalsha_and_script_load_to_the_masters() {
    let shim = ClusterShim::start(ClusterOpts::default(), ProxyOpts::default());
    let w = shim.webdis.port;
    let c = &shim.cluster;
    let masters = c.masters();
    assert_eq!(masters.len(), 3, "{:?}", c.topology());
    let incr_sha = "61636018f4e6b5817b89791bbed242f93fa089e3";
    // EVAL: by the first key's slot, to its master only.
    let mut owners = Vec::new();
    for key in KEYS {
        assert_eq!(webdis(w, &["EVAL", INCR, "1", key]), (200, Value::from(1)));
        let owner = c.master_of(key);
        owners.push(owner);
        for port in c.live_ports() {
            let got = get_on(port, key);
            if port == owner {
                assert_eq!(got, "1", "{key} on its master {port}");
            } else {
                assert!(got.starts_with("MOVED"), "{key} on {port}: {got}");
            }
        }
    }
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(owners.len(), 3, "the three keys are on three masters");
    // Keys of two slots: Redis refuses; no key: Envoy refuses (Redis would run it).
    let (_, v) = webdis(w, &["EVAL", INCR, "2", KEYS[0], KEYS[1]]);
    assert!(
        redis_error(&v).is_some_and(|e| e.starts_with("CROSSSLOT")),
        "{v}"
    );
    let (_, v) = webdis(w, &["EVAL", "return 1", "0"]);
    assert!(
        redis_error(&v).is_some_and(|e| e.contains("wrong number of arguments")),
        "{v}"
    );
    // EVALSHA of a script no node has: NOSCRIPT (the filter then sends EVAL).
    let unknown = "0123456789abcdef0123456789abcdef01234567";
    let (_, v) = webdis(w, &["EVALSHA", unknown, "1", KEYS[0]]);
    assert!(
        redis_error(&v).is_some_and(|e| e.starts_with("NOSCRIPT")),
        "{v}"
    );
    // EVAL loaded the script on the masters it ran on: EVALSHA works there.
    for key in KEYS {
        assert_eq!(
            webdis(w, &["EVALSHA", incr_sha, "1", key]),
            (200, Value::from(2)),
            "EVALSHA on {key}'s master after EVAL ran there"
        );
    }
    // A script EVAL ran on one master only is unknown to the others.
    let one = "return redis.call('GET', KEYS[1])";
    let one_sha = "d3c21d0c2b9ca22f82737626a27bcaf5d288f99f";
    assert_eq!(webdis(w, &["EVAL", one, "1", KEYS[0]]).1, Value::from("2"));
    let (_, v) = webdis(w, &["EVALSHA", one_sha, "1", KEYS[1]]);
    assert!(
        redis_error(&v).is_some_and(|e| e.starts_with("NOSCRIPT")),
        "EVAL on {}'s master does not load it on {}'s: {v}",
        KEYS[0],
        KEYS[1]
    );
    // SCRIPT LOAD through the proxy: every master, no replica.
    let (status, v) = webdis(w, &["SCRIPT", "LOAD", "return 7"]);
    let sha = v
        .as_str()
        .unwrap_or_else(|| panic!("SCRIPT LOAD: {status} {v}"));
    for port in c.live_ports() {
        assert_eq!(
            script_exists(port, sha),
            masters.contains(&port),
            "SCRIPT LOAD reached node {port} (master: {})",
            masters.contains(&port)
        );
    }
    for key in KEYS {
        assert_eq!(webdis(w, &["EVALSHA", sha, "1", key]).1, Value::from(7));
    }
    // The proxy counts what it carried per command (enable_command_stats).
    let p = &shim.proxy;
    assert!(p.stat("redis.tg_redis.command.eval.total") >= 6);
    assert!(p.stat("redis.tg_redis.command.evalsha.total") >= 8);
    assert_eq!(p.stat("redis.tg_redis.splitter.unsupported_command"), 0);
}

/// A master killed by SIGKILL while a client calls EVALSHA on one key per shard through Webdis every
/// 10 ms: the killed shard answers `upstream failure` (fast) until its replica is promoted; then the
/// promoted replica answers NOSCRIPT (it never had the script: neither EVAL nor SCRIPT LOAD loads a
/// replica), EVAL loads it, and EVALSHA works again. Prints the timings.
#[test]
#[ignore = "long: make fleet"]
fn after_a_failover_evalsha_answers_noscript_until_eval_runs_once() {
    let mut shim = ClusterShim::start(ClusterOpts::default(), ProxyOpts::default());
    let w = shim.webdis.port;
    let incr_sha = "61636018f4e6b5817b89791bbed242f93fa089e3";
    let (_, loaded) = webdis(w, &["SCRIPT", "LOAD", INCR]);
    assert_eq!(loaded, Value::from(incr_sha));
    for key in KEYS {
        assert!(webdis(w, &["EVALSHA", incr_sha, "1", key]).1.is_i64());
    }
    let victim = shim.cluster.master_of(KEYS[0]);
    let replica = shim.cluster.replica_of(victim).expect("a replica");
    assert!(
        !script_exists(replica, incr_sha),
        "replicas never get scripts"
    );
    let before: Vec<i64> = KEYS
        .iter()
        .map(|k| shim.cluster.get_int(k).unwrap_or(0))
        .collect();

    // The increments so far have reached the replica: this test is about the script cache, not about
    // asynchronous replication (a promoted replica may miss a dead master's last acknowledged writes,
    // docs/operating-redis.md), which would otherwise make the count below miss one now and then.
    // (`WAIT` would not do: it waits for the writes of its own connection, which made none.) The
    // replica's replication offset reaches the master's.
    let offset = |port: u16, field: &str| -> Option<i64> {
        let info = redis_cmd(port, &["INFO", "replication"]).ok()?.as_str()?;
        info.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
    };
    let master_offset = offset(victim, "master_repl_offset").expect("the master's offset");
    let caught_up = Instant::now() + Duration::from_secs(5);
    while offset(replica, "slave_repl_offset").unwrap_or(-1) < master_offset {
        assert!(
            Instant::now() < caught_up,
            "the replica did not reach the master's replication offset {master_offset}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = shim.cluster.kill(victim);
    // Per key: answers in order, each with its time since the kill and latency.
    let mut seen: BTreeMap<&str, Vec<(Duration, String, Duration)>> = BTreeMap::new();
    let mut successes = [0i64; 3];
    let mut promoted_at = None;
    let deadline = killed + Duration::from_secs(30);
    let mut all_ok_since: Option<Duration> = None;
    while Instant::now() < deadline {
        let mut all_ok = true;
        for (i, key) in KEYS.iter().enumerate() {
            let t = Instant::now();
            let (_, v) = webdis(w, &["EVALSHA", incr_sha, "1", key]);
            let took = t.elapsed();
            let at = killed.elapsed();
            let what = match (v.as_i64(), redis_error(&v)) {
                (Some(_), _) => {
                    successes[i] += 1;
                    "ok".to_string()
                }
                (None, Some(e)) if e.starts_with("NOSCRIPT") => {
                    all_ok = false;
                    // What the filter does: EVAL with the same arguments.
                    let (_, v) = webdis(w, &["EVAL", INCR, "1", key]);
                    if v.is_i64() {
                        successes[i] += 1;
                    }
                    format!("NOSCRIPT, then EVAL: {v}")
                }
                (None, Some(e)) => {
                    all_ok = false;
                    e
                }
                (None, None) => {
                    all_ok = false;
                    v.to_string()
                }
            };
            let log = seen.entry(key).or_default();
            if log.last().map(|l| &l.1) != Some(&what) {
                log.push((at, what, took));
            }
        }
        if promoted_at.is_none() && shim.cluster.master_of_slot(key_slot(KEYS[0])) == Some(replica)
        {
            promoted_at = Some(killed.elapsed());
        }
        if all_ok {
            let since = *all_ok_since.get_or_insert(killed.elapsed());
            if killed.elapsed() - since > Duration::from_secs(1) {
                break;
            }
        } else {
            all_ok_since = None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let promoted = shim
        .cluster
        .wait_failover(victim, Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "killed master {victim}; replica {replica} promoted (CLUSTER NODES) {:?} after the kill",
        promoted_at
    );
    let mut rows = Vec::new();
    for (key, log) in &seen {
        for (at, what, took) in log {
            rows.push(vec![
                key.to_string(),
                format!("{:.2} s", at.as_secs_f64()),
                what.clone(),
                format!("{:.1} ms", took.as_secs_f64() * 1000.0),
            ]);
        }
    }
    println!(
        "{}",
        table(&["key", "from (since kill)", "answer", "latency"], &rows)
    );
    assert_eq!(promoted, replica);
    let killed_log = &seen[KEYS[0]];
    assert!(
        killed_log.iter().any(|l| l.1 == "upstream failure"),
        "the killed shard failed meanwhile: {killed_log:?}"
    );
    assert!(
        killed_log
            .iter()
            .any(|l| l.1.starts_with("NOSCRIPT, then EVAL: ")),
        "the promoted replica did not know the script: {killed_log:?}"
    );
    assert_eq!(
        killed_log.last().map(|l| l.1.as_str()),
        Some("ok"),
        "EVALSHA works again once EVAL ran: {killed_log:?}"
    );
    // No increment the client saw acknowledged was lost in the promotion.
    for (i, key) in KEYS.iter().enumerate() {
        let now = shim.cluster.get_int(key).unwrap_or(0);
        assert_eq!(
            now,
            before[i] + successes[i],
            "{key}: acknowledged increments kept"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The filter through the cluster
// ---------------------------------------------------------------------------------------------

/// `per_master` tenants per master, named `<prefix><n>` and picked by slot; the class is the master's
/// port. Limits alternate between `capped` and a practically unlimited one.
fn tenants_by_master(
    shim: &ClusterShim,
    prefix: &str,
    per_master: usize,
    capped: u64,
) -> Vec<TenantPlan> {
    let masters = shim.cluster.masters();
    let mut count: BTreeMap<u16, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for n in 0..10_000 {
        if out.len() == per_master * masters.len() {
            break;
        }
        let name = format!("{prefix}{n:03}");
        let master = shim.cluster.master_of(&format!("tg:q:{{{name}}}:x"));
        let c = count.entry(master).or_default();
        if *c >= per_master {
            continue;
        }
        *c += 1;
        let limit = if out.len() % 2 == 0 {
            capped
        } else {
            1_000_000_000
        };
        out.push(TenantPlan {
            name,
            weight: 1,
            limit,
            class: format!("master {master}"),
        });
    }
    assert_eq!(
        out.len(),
        per_master * masters.len(),
        "tenants for every master"
    );
    out
}

/// `n` tenants, `<prefix><n>`, whose quota keys (`tg:q:{t}:…`) and global bucket (`tg:gb:{g:t}`) are
/// all on one master (the class is its port); limits alternate as in [`tenants_by_master`].
fn tenants_on_one_master(
    shim: &ClusterShim,
    prefix: &str,
    n: usize,
    capped: u64,
) -> Vec<TenantPlan> {
    let master = shim.cluster.master_of(&format!("tg:q:{{{prefix}000}}:x"));
    let out: Vec<TenantPlan> = (0..10_000)
        .map(|i| format!("{prefix}{i:03}"))
        .filter(|t| {
            shim.cluster.master_of(&format!("tg:q:{{{t}}}:x")) == master
                && shim.cluster.master_of(&format!("tg:gb:{{g:{t}}}")) == master
        })
        .take(n)
        .enumerate()
        .map(|(i, name)| TenantPlan {
            name,
            weight: 1,
            limit: if i % 2 == 0 { capped } else { 1_000_000_000 },
            class: format!("master {master}"),
        })
        .collect();
    assert_eq!(out.len(), n, "tenants on master {master}");
    out
}

/// The filter's quota (leased) and global rule through Webdis → `redis_proxy` → the cluster, with 3
/// tenants on each master, one Envoy × 2 workers, 3 s of load: every master ran the scripts, every
/// counter equals the usage served, no limit or bucket was exceeded.
#[test]
fn smoke_leased_quota_and_a_global_rule_through_the_cluster() {
    let shim = ClusterShim::start(ClusterOpts::default(), ProxyOpts::default());
    let plan = Plan {
        tenants: tenants_by_master(&shim, "s", 3, 20_000),
        lease: true,
        global: Some(GlobalPlan {
            rate: 2000.0,
            burst: 4000,
        }),
        timeout_ms: 1000,
        shim_breaker_threshold: None,
    };
    let mock = mock_provider!();
    let envoys = fleet::start_envoys(1, mock.port, shim.webdis.port, &plan.plugin_config(), 2);
    shim.cluster.reset_stats();
    let spec = plan.load(vec![envoys[0].port], 6, Duration::from_secs(3));
    let (load, ()) = run_load(&spec, |_| {});
    let per_master: Vec<(u16, u64)> = shim
        .cluster
        .masters()
        .into_iter()
        .map(|p| {
            let s = shim.cluster.commandstats(p);
            (
                p,
                s.get("eval").copied().unwrap_or(0) + s.get("evalsha").copied().unwrap_or(0),
            )
        })
        .collect();
    let o = fleet::verify(&plan, &shim.cluster, &load, Duration::from_secs(15));
    println!(
        "{} requests, {:.0}/s; script calls per master {per_master:?}\n{}",
        load.requests(),
        load.rate(),
        tenant_table(&o)
    );
    tg::assert_no_panic(&envoys[0]);
    assert!(per_master.iter().all(|&(_, n)| n > 0), "{per_master:?}");
    let total = load.total();
    assert_eq!(total.errors, 0);
    assert!(
        total
            .refused
            .keys()
            .all(|k| k.starts_with("monthly_quota_") || k == "tokens_per_second_exceeded"),
        "{:?}",
        total.refused
    );
    assert!(total.served > 0);
    for t in &o.tenants {
        assert_eq!(t.diff(), 0, "{t:?}");
        assert_eq!(t.over_limit, 0, "{t:?}");
        assert!(t.global_excess.is_some_and(|x| x <= 1.0), "{t:?}");
    }
    assert!(
        fleet::stat_sum(&envoys, "tokengate_quota_leased") > 0,
        "leases were used"
    );
}

/// The deterministic form of what a failover can do: Redis runs a reservation after Envoy's
/// `redis_proxy` already answered `upstream failure` for it (here: the master is busy for 800 ms, the
/// proxy's `op_timeout` is 200 ms and it drops the connection, Redis still reads and runs the command
/// that was in the socket; in a failover: the master dies after running and replicating the script,
/// before its reply left). The filter takes the error for a refusal (`quota_unavailable`, with
/// `on_failure: closed`) and never reconciles the request, so the tenant is charged the whole
/// reservation for a request nobody served (until `reservation_timeout_s`, then its prompt).
#[test]
fn a_reservation_answered_upstream_failure_by_the_proxy_is_not_charged() {
    let shim = ClusterShim::start(
        ClusterOpts::default(),
        ProxyOpts {
            op_timeout_ms: 200,
            ..ProxyOpts::default()
        },
    );
    let plan = Plan {
        tenants: vec![TenantPlan {
            name: "slow".into(),
            weight: 1,
            limit: 1_000_000,
            class: "one".into(),
        }],
        lease: false,
        global: None,
        // Longer than the proxy's op_timeout: the proxy's answer is what the filter sees.
        timeout_ms: 2000,
        shim_breaker_threshold: None,
    };
    let mock = mock_provider!();
    let envoys = fleet::start_envoys(1, mock.port, shim.webdis.port, &plan.plugin_config(), 1);
    let master = shim.cluster.master_of("tg:q:{slow}:x");
    let month = fleet::this_month();
    // One request served normally first: the script is loaded, the counter exists.
    let body = fleet::chat_body("gpt-test", 40);
    let h = [
        ("x-tenant-id", "slow"),
        ("content-type", "application/json"),
    ];
    let r = http::post(envoys[0].port, tg::CHAT, &h, &body).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let served = v["usage"]["prompt_tokens"].as_i64().unwrap_or(0)
        + v["usage"]["completion_tokens"].as_i64().unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while fleet::QuotaView::read(&shim.cluster, "slow", &month)
        .map(|q| q.used != served || q.open != 0)
        .unwrap_or(true)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The master is busy for 800 ms; the next reservation waits in its socket.
    let busy = std::thread::spawn(move || redis_cmd(master, &["EVAL", BUSY, "0", "800000"]));
    std::thread::sleep(Duration::from_millis(100));
    let r = http::post(envoys[0].port, tg::CHAT, &h, &body).unwrap_or_else(|e| panic!("{e}"));
    let reason = r.header("x-tokengate-reason").unwrap_or("").to_string();
    assert_eq!(
        (r.status, reason.as_str()),
        (503, "quota_unavailable"),
        "{}",
        r.text()
    );
    assert!(matches!(busy.join(), Ok(Ok(RespValue::Int(1)))));
    // Only the first request was served: after the settlement delay, the counter must say so.
    let deadline = Instant::now() + Duration::from_secs(5);
    let view = loop {
        let q =
            fleet::QuotaView::read(&shim.cluster, "slow", &month).unwrap_or_else(|e| panic!("{e}"));
        if (q.used == served && q.open == 0) || Instant::now() >= deadline {
            break q;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    tg::assert_no_panic(&envoys[0]);
    assert_eq!(
        (view.used, view.open),
        (served, 0),
        "the tenant was served {served} tokens; Redis charged {} with {} reservation(s) still open, \
         for the request the filter refused with 503 quota_unavailable after the proxy's \
         `upstream failure` (Redis ran it after all)",
        view.used,
        view.open
    );
}

/// How the clients saw one failover.
struct FailoverRun {
    victim: u16,
    promoted: u16,
    /// Kill → promoted replica serving its slots with `cluster_state:ok` everywhere.
    promotion: Duration,
    /// Kill → the proxy routes the killed slots to the promoted replica (a `GET` of the first tenant's
    /// key through it answers; polled every 20 ms from the promotion on).
    routed: Duration,
    killed_at: Duration,
    /// The kill, in wall-clock time (to place Envoy's log lines).
    killed_wall: std::time::SystemTime,
}

/// Seconds since the Unix epoch of an Envoy log line's `[YYYY-MM-DD HH:MM:SS.mmm]` prefix (UTC), if any.
fn log_line_time(line: &str) -> Option<f64> {
    let ts = line.strip_prefix('[')?.get(..23)?;
    let (date, time) = ts.split_once(' ')?;
    let d: Vec<i64> = date.split('-').filter_map(|x| x.parse().ok()).collect();
    let t: Vec<f64> = time.split(':').filter_map(|x| x.parse().ok()).collect();
    let ([y, m, dd], [hh, mm, ss]) = (d.as_slice(), t.as_slice()) else {
        return None;
    };
    // Days since the epoch (proleptic Gregorian, Howard Hinnant's days_from_civil).
    let y = if *m <= 2 { y - 1 } else { *y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + dd - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + hh * 3600.0 + mm * 60.0 + ss)
}

/// Each Envoy's shim breaker transitions (`webdis shim …: a -> b (why)`), seconds since the kill.
fn shim_transitions(
    envoys: &[wasm_test::Envoy],
    killed: std::time::SystemTime,
) -> Vec<Vec<String>> {
    let k = killed
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut rows = Vec::new();
    for (i, e) in envoys.iter().enumerate() {
        for line in e.log().lines() {
            let Some(at) = line.find("webdis shim ").map(|p| &line[p..]) else {
                continue;
            };
            let since = log_line_time(line).map_or("?".into(), |t| format!("{:+.2} s", t - k));
            rows.push(vec![format!("envoy {i}"), since, at.to_string()]);
        }
    }
    rows
}

/// The default `shim_breaker.recovery_ms`: how long the shim breaker stays open each time it opens.
const SHIM_RECOVERY: Duration = Duration::from_secs(5);

/// The callouts' `timeout_ms` in the failover runs.
const CALLOUT_TIMEOUT: Duration = Duration::from_secs(1);

/// The load before the kill in the failover runs.
const LOAD_BEFORE_KILL: Duration = Duration::from_secs(5);

/// One failover run.
struct Case {
    /// `quota.lease` on.
    lease: bool,
    /// A global bucket rule.
    global: Option<GlobalPlan>,
    /// The shim breaker's `failure_threshold` (None: the default 3 in 10 s, open for 5 s).
    breaker: Option<u32>,
    /// The cluster's `--cluster-node-timeout` (ms).
    node_timeout_ms: u64,
    /// Every tenant (quota and global bucket) on the killed master: when the proxy routes the slots
    /// only after the shim breakers' first probe, the probes fail (asserted: some Envoy logs
    /// `half_open -> open (probe_failed)`).
    one_shard: bool,
}

/// 10 tenants per master (half of them capped at 20 000 weighted tokens; or 30 on one master), three
/// Envoys × 2 workers, 12 clients; the master of the first tenant's shard is killed 5 s in, the load
/// goes on for 16 s + the node timeout after that (the promotion takes about the node timeout + 1–3 s,
/// the proxy's routing 0.1–3 s more, the bound below 6 s more: 3–6 s to spare).
///
/// The bound checked: a tenant gets `*_unavailable` answers from the kill until the proxy routes the
/// killed slots to the promoted replica (`routed`), and with the shim breaker for at most one more
/// `recovery_ms` plus one callout timeout (a probe sent before `routed` fails, at the latest when it
/// times out, and opens the breaker for `recovery_ms` again; the next probe goes to the new master).
/// Without the breaker no request sent after `routed` is refused. The load runs long enough past the
/// bound that a breaker held longer would show.
fn failover(case: Case) {
    let Case {
        lease,
        global,
        breaker,
        node_timeout_ms,
        one_shard,
    } = case;
    let mut shim = ClusterShim::start(
        ClusterOpts {
            node_timeout_ms,
            ..ClusterOpts::default()
        },
        ProxyOpts::default(),
    );
    let plan = Plan {
        tenants: if one_shard {
            tenants_on_one_master(&shim, "f", 30, 20_000)
        } else {
            tenants_by_master(&shim, "f", 10, 20_000)
        },
        lease,
        global,
        timeout_ms: CALLOUT_TIMEOUT.as_millis() as u64,
        shim_breaker_threshold: breaker,
    };
    let victim_key = format!("tg:q:{{{}}}:x", plan.tenants[0].name);
    let victim = shim.cluster.master_of(&victim_key);
    let mock = mock_provider!();
    let envoys = fleet::start_envoys(3, mock.port, shim.webdis.port, &plan.plugin_config(), 2);
    let spec = plan.load(
        envoys.iter().map(|e| e.port).collect(),
        12,
        LOAD_BEFORE_KILL + Duration::from_secs(16) + Duration::from_millis(node_timeout_ms),
    );
    let proxy_port = shim.proxy.port;
    let cluster = &mut shim.cluster;
    let (load, run) = run_load(&spec, |start| {
        std::thread::sleep(LOAD_BEFORE_KILL.saturating_sub(start.elapsed()));
        let killed = cluster.kill(victim);
        let killed_wall = std::time::SystemTime::now();
        let promoted = cluster
            .wait_failover(victim, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no failover: {e}"));
        let promotion = killed.elapsed();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !matches!(
            redis_cmd(proxy_port, &["GET", &victim_key]),
            Ok(RespValue::Bulk(_))
        ) {
            assert!(
                Instant::now() < deadline,
                "the proxy did not route {victim_key} to the promoted replica"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        FailoverRun {
            victim,
            promoted,
            promotion,
            routed: killed.elapsed(),
            killed_at: killed - start,
            killed_wall,
        }
    });
    let o = fleet::verify(&plan, &shim.cluster, &load, Duration::from_secs(20));
    for e in &envoys {
        tg::assert_no_panic(e);
    }
    let victim_class = format!("master {}", run.victim);
    let unavailable = ["quota_unavailable", "rate_limiter_unavailable"];
    let total = load.total();
    let mode = format!(
        "{}{}{}",
        if lease {
            "quota leased"
        } else {
            "quota per request"
        },
        if global.is_some() {
            " + global rule"
        } else {
            ""
        },
        if breaker.is_some() {
            ", shim breaker off"
        } else {
            ""
        }
    ) + if one_shard {
        ", every tenant on the killed master"
    } else {
        ""
    } + &format!(", node timeout {node_timeout_ms} ms");
    let outage = (run.killed_at, run.killed_at + run.promotion);
    let routed = run.killed_at + run.routed;
    // The last moment a request may be refused for the outage (see above).
    let bound = routed
        + if breaker.is_none() {
            SHIM_RECOVERY + CALLOUT_TIMEOUT
        } else {
            Duration::ZERO
        };
    // Per shard: when its tenants got *_unavailable answers, and how many.
    let mut shards: BTreeMap<String, fleet::TenantTally> = BTreeMap::new();
    for t in &o.tenants {
        let class = if t.plan.class == victim_class {
            format!("{} (killed)", t.plan.class)
        } else {
            t.plan.class.clone()
        };
        let e = shards.entry(class).or_default();
        e.sent += t.tally.sent;
        e.served += t.tally.served;
        for (k, v) in &t.tally.refused {
            *e.refused.entry(k.clone()).or_default() += v;
        }
        e.unavailable_window = match (e.unavailable_window, t.tally.unavailable_window) {
            (Some(a), Some(b)) => Some((a.0.min(b.0), a.1.max(b.1))),
            (a, b) => a.or(b),
        };
    }
    let shard_rows: Vec<Vec<String>> = shards
        .iter()
        .map(|(k, t)| {
            let n: u64 = unavailable
                .iter()
                .map(|u| t.refused.get(*u).copied().unwrap_or(0))
                .sum();
            vec![
                k.clone(),
                t.sent.to_string(),
                t.served.to_string(),
                n.to_string(),
                t.unavailable_window.map_or("-".into(), |(a, b)| {
                    format!(
                        "{:+.2} … {:+.2} s",
                        a.as_secs_f64() - outage.0.as_secs_f64(),
                        b.as_secs_f64() - outage.0.as_secs_f64()
                    )
                }),
            ]
        })
        .collect();
    println!(
        "\n### failover: {mode}\n\nkilled master {} at {:.2} s; replica {} promoted {:.2} s later, \
         routed by the proxy {:.2} s after the kill (bound for *_unavailable: {:+.2} s); \
         {} requests ({:.0}/s), refused {}; answers between the kill and the promotion: {}\n\n{}\n{}\n{}",
        run.victim,
        run.killed_at.as_secs_f64(),
        run.promoted,
        run.promotion.as_secs_f64(),
        run.routed.as_secs_f64(),
        (bound - run.killed_at).as_secs_f64(),
        total.sent,
        load.rate(),
        refusals_text(&total.refused),
        refusals_text(&served_between(&load, outage)),
        table(
            &[
                "shard",
                "sent",
                "served",
                "*_unavailable",
                "first answered … last sent (since the kill)"
            ],
            &shard_rows
        ),
        class_table(&o),
        tenant_table(&o)
    );
    println!(
        "shim breaker transitions (since the kill):\n{}",
        table(
            &["envoy", "at", "transition"],
            &shim_transitions(&envoys, run.killed_wall)
        )
    );
    // The invariants.
    assert_eq!(total.errors, 0, "transport errors");
    for k in total.refused.keys() {
        assert!(
            k.starts_with("monthly_quota_")
                || k == "tokens_per_second_exceeded"
                || unavailable.contains(&k.as_str()),
            "unexpected refusal {k}: {:?}",
            total.refused
        );
    }
    let transitions = shim_transitions(&envoys, run.killed_wall);
    assert!(
        !one_shard || transitions.iter().any(|r| r[2].ends_with("(probe_failed)")),
        "a shim probe was meant to fail before the proxy routed the slots ({:.2} s after the kill)",
        run.routed.as_secs_f64()
    );
    assert!(
        load.elapsed > bound + Duration::from_secs(1),
        "the load ended {:.2} s after the kill, too soon to see whether refusals stop by the bound \
         ({:.2} s after it)",
        (load.elapsed - run.killed_at).as_secs_f64(),
        (bound - run.killed_at).as_secs_f64()
    );
    for t in &o.tenants {
        if let Some((first_answered, last_sent)) = t.tally.unavailable_window {
            assert!(
                first_answered >= outage.0 && last_sent <= bound,
                "{}: *_unavailable answered from {:+.2} s, sent until {:+.2} s after the kill; \
                 allowed: from the kill until {:+.2} s (routed {:.2} s{})",
                t.plan.name,
                first_answered.as_secs_f64() - outage.0.as_secs_f64(),
                last_sent.as_secs_f64() - outage.0.as_secs_f64(),
                (bound - run.killed_at).as_secs_f64(),
                run.routed.as_secs_f64(),
                if breaker.is_none() {
                    " + the shim breaker's recovery_ms 5 s + one callout timeout 1 s"
                } else {
                    ""
                }
            );
        }
    }
    let victim_unavailable: u64 = o
        .tenants
        .iter()
        .filter(|t| t.plan.class == victim_class)
        .map(|t| {
            unavailable
                .iter()
                .map(|u| t.tally.refused.get(*u).copied().unwrap_or(0))
                .sum::<u64>()
        })
        .sum();
    assert!(
        lease || victim_unavailable > 0,
        "per-request calls of the killed shard's tenants failed during the outage"
    );
    let bad: Vec<String> = o
        .tenants
        .iter()
        .filter(|t| t.diff() != 0 || t.over_limit > 0 || t.global_excess.is_some_and(|x| x > 1.0))
        .map(|t| format!("{t:?}"))
        .collect();
    assert!(
        bad.is_empty(),
        "tenants whose counter is not the usage served, or served beyond a limit or bucket:\n{}",
        bad.join("\n")
    );
    assert_eq!(o.open_reservations(), 0, "no reservation left open");
    // Every tenant with quota left was served again after the failover.
    for t in &o.tenants {
        if t.plan.limit > 100_000 {
            let back = t
                .tally
                .unavailable_window
                .map_or(routed, |w| w.1.max(routed));
            assert!(
                t.tally.served_window.is_some_and(|w| w.1 > back),
                "{} served after the outage",
                t.plan.name
            );
        }
    }
}

/// Answers whose slot lies within `(from, to)`, by outcome.
fn served_between(
    load: &fleet::LoadResult,
    (from, to): (Duration, Duration),
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (i, slot) in load.timeline.iter().enumerate() {
        let at = fleet::SLOT * i as u32;
        if at >= from && at + fleet::SLOT <= to {
            for (k, v) in slot {
                *out.entry(k.clone()).or_default() += v;
            }
        }
    }
    out
}

/// The global rule of the failover runs: 2000 tokens/s, burst 4000, per tenant.
const GLOBAL: GlobalPlan = GlobalPlan {
    rate: 2000.0,
    burst: 4000,
};

#[test]
#[ignore = "long: make fleet"]
fn a_master_killed_under_load_quota_per_request_and_a_global_rule() {
    failover(Case {
        lease: false,
        global: Some(GLOBAL),
        breaker: None,
        node_timeout_ms: 2000,
        one_shard: false,
    });
}

/// Every tenant on the killed master, and a node timeout of 5 s: the replica is promoted (and the
/// proxy routes its slots) only after the shim breakers' first probe, 5 s after they opened (Redis
/// marks a master failing only after the node timeout, and a replica waits at least 500 ms more before
/// its election; with a node timeout of 4 s, routing came 7–10 s after the kill in 6 runs: the node
/// timeout + 1–3 s of failure detection and election + the proxy's next good 1 s refresh). The probes
/// fail and the breakers open again for `recovery_ms`, not for a doubled recovery (the breaker before
/// the fix: refusals until 15 s after the kill, past the bound when routed before 9 s; the load runs
/// to 21 s after the kill). (A CI run of the test above once had a promotion after 4.6 s, a failed
/// probe at +5 s and tenants refused to the end of the load, 11 s after the kill: the breaker held
/// 10 s more.)
#[test]
#[ignore = "long: make fleet"]
fn a_master_promoted_after_the_first_shim_probe_quota_per_request_and_a_global_rule() {
    failover(Case {
        lease: false,
        global: Some(GLOBAL),
        breaker: None,
        node_timeout_ms: 5000,
        one_shard: true,
    });
}

#[test]
#[ignore = "long: make fleet"]
fn a_master_killed_under_load_quota_leased() {
    failover(Case {
        lease: true,
        global: None,
        breaker: None,
        node_timeout_ms: 2000,
        one_shard: false,
    });
}

/// As [`a_master_killed_under_load_quota_leased`] with the shim breaker kept shut (a threshold no run
/// reaches): what a dead shard costs the other shards without it.
#[test]
#[ignore = "long: make fleet"]
fn a_master_killed_under_load_quota_leased_shim_breaker_off() {
    failover(Case {
        lease: true,
        global: None,
        breaker: Some(1_000_000_000),
        node_timeout_ms: 2000,
        one_shard: false,
    });
}
