//! Fair shares (issue 27, docs/fair-share.md) through real Envoy: a shared provider limit with
//! `share: "fair"` among five tenants (two quiet ones asking less than any cap, three heavy ones with
//! different weights on several connections), the same load with the limit first come, first served,
//! two Envoys sharing one global fair limit in Redis, and `when_exhausted` sending a request a limit or
//! a budget cannot serve to the cheaper model.
//!
//! Each load runs 10 s (bounded in time and in requests per client) on loopback; the tests take a lock
//! so that they never run at once (two shared cores). What each tenant asked and got is printed.
//!
//! What a tenant **asked** is the estimated cost (`x-tokengate-estimated-tokens`, one body per client,
//! so one cost per client) times the requests it sent; what it **got** is the sum over its 200s. The
//! bound of a limit is `burst + tokens_per_second × elapsed` with `elapsed` from before the first request
//! to after the last answer (the bucket is created full at the first request).
//!
//! Tolerances of a fair run (the issue's): each quiet tenant gets at least 95 % of what it asks; every
//! tenant gets within 10 % of its weighted max-min share of what the limit admitted in all (computed from
//! the asks and weights, [`max_min`]); the heavy ones split what the quiet ones left within 10 % of their
//! weights; the total is at least 95 % of `burst + rate × t` and never above it.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use wasm_test::http;
use wasm_test::tg;
use wasm_test::{mock_provider, Envoy, EnvoyOpts, MockProvider, RedisServer, RespValue, Webdis};

const MODEL: &str = "gpt-test";
/// The trusted header naming a request's team (`group_header`).
const TEAM: &str = "x-tokengate-team";
/// How long each load runs.
const LOAD: Duration = Duration::from_secs(10);
/// Requests per client thread at most, whatever the duration.
const MAX_PER_CLIENT: usize = 3000;
/// A heavy client that was refused waits this long before asking again.
const BACKOFF: Duration = Duration::from_millis(15);
/// The provider-wide limit: 3,000 tokens/s, burst 10,000 (the numbers).
const RATE: f64 = 3000.0;
const BURST: u64 = 10_000;

/// One load at a time: the measurements share two cores with everything else.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// The five tenants
// ---------------------------------------------------------------------------------------------

/// A tenant of the load: its team, its weight in the fair limit, its connections, its request size
/// (`max_tokens`) and its pace (`None`: as fast as answered; `Some(p)`: one request every `p`, on a
/// fixed schedule).
#[derive(Clone, Copy, Debug)]
struct Tenant {
    id: &'static str,
    team: &'static str,
    weight: f64,
    connections: usize,
    max_tokens: u64,
    pace: Option<Duration>,
}

/// Two quiet tenants asking about 550 and 330 tokens/s (a request of about 110 and 66 tokens every
/// 200 ms), and three heavy ones asking as fast as they are answered from 2, 3 and 2 connections, with
/// weights 2, 1 and 1: first come, first served would favour heavy-b (most connections), fair sharing
/// gives heavy-a twice what heavy-b and heavy-c get each.
const TENANTS: [Tenant; 5] = [
    Tenant {
        id: "quiet-a",
        team: "red",
        weight: 1.0,
        connections: 1,
        max_tokens: 96,
        pace: Some(Duration::from_millis(200)),
    },
    Tenant {
        id: "quiet-b",
        team: "blue",
        weight: 1.0,
        connections: 1,
        max_tokens: 52,
        pace: Some(Duration::from_millis(200)),
    },
    Tenant {
        id: "heavy-a",
        team: "red",
        weight: 2.0,
        connections: 2,
        max_tokens: 200,
        pace: None,
    },
    Tenant {
        id: "heavy-b",
        team: "blue",
        weight: 1.0,
        connections: 3,
        max_tokens: 200,
        pace: None,
    },
    Tenant {
        id: "heavy-c",
        team: "blue",
        weight: 1.0,
        connections: 2,
        max_tokens: 200,
        pace: None,
    },
];

impl Tenant {
    fn quiet(&self) -> bool {
        self.pace.is_some()
    }
}

/// The limits of the five-tenant load: a user limit and a team limit under the provider's (neither
/// binds a tenant below its fair share: heavy-a's share is about 1,060 tokens/s, team red's use about
/// 1,610), and the provider's 3,000 tokens/s, fair (weights of [`TENANTS`]) or not.
fn limits(fair: bool, global: bool) -> Value {
    let mut provider = json!({"name": "provider", "scope": "shared", "model": MODEL,
                              "tokens_per_second": RATE, "burst": BURST, "global": global});
    if fair {
        let weights: serde_json::Map<String, Value> = TENANTS
            .iter()
            .filter(|t| t.weight != 1.0)
            .map(|t| (t.id.to_string(), json!(t.weight)))
            .collect();
        provider["share"] = json!("fair");
        provider["weights"] = Value::Object(weights);
    }
    json!([
        {"name": "user", "scope": "tenant", "tokens_per_second": 1500, "burst": 5000},
        {"name": "team", "scope": "group", "tokens_per_second": 2400, "burst": 8000},
        provider,
    ])
}

/// Tenants from `x-tenant-id`, one group level from [`TEAM`].
fn config(limits: Value) -> Value {
    json!({"tenant_header": "x-tenant-id",
           "trusted_headers": {"set_by": "the test client: it is the trusted filter"},
           "forward_identity_headers": true, "api_key_tenants": false, "group_header": TEAM,
           "limits": limits})
}

fn opts(mock: &MockProvider, cfg: Value) -> EnvoyOpts {
    let mut o = EnvoyOpts::new(mock.port, cfg);
    o.ready_timeout = Duration::from_secs(60);
    o
}

// ---------------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------------

/// One answer.
#[derive(Clone, Debug)]
struct Outcome {
    tenant: &'static str,
    status: u16,
    /// `x-tokengate-estimated-tokens` (absent on a refusal made before the body was read).
    cost: Option<u64>,
    /// `x-tokengate-limit` of a refusal.
    limit: Option<String>,
}

/// What one tenant asked and got.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    requests: u64,
    admitted: u64,
    asked: u64,
    got: u64,
}

/// The answers of a load and how long it took.
struct Run {
    outcomes: Vec<Outcome>,
    elapsed_s: f64,
}

impl Run {
    /// Asked and got per tenant (a client's one cost stands for its refusals made before the body).
    fn tallies(&self) -> BTreeMap<&'static str, Tally> {
        let mut cost: BTreeMap<&str, u64> = BTreeMap::new();
        for o in &self.outcomes {
            if let Some(c) = o.cost {
                cost.entry(o.tenant).or_insert(c);
            }
        }
        let mut m: BTreeMap<&'static str, Tally> = BTreeMap::new();
        for o in &self.outcomes {
            let c = o.cost.or_else(|| cost.get(o.tenant).copied()).unwrap_or(0);
            let t = m.entry(o.tenant).or_default();
            t.requests += 1;
            t.asked += c;
            if o.status == 200 {
                t.admitted += 1;
                t.got += c;
            }
        }
        m
    }

    fn total(&self) -> u64 {
        self.tallies().values().map(|t| t.got).sum()
    }

    /// Every status other than 200 and 429, with the limit that refused.
    fn unexpected(&self) -> Vec<(u16, Option<String>)> {
        self.outcomes
            .iter()
            .filter(|o| o.status != 200 && o.status != 429)
            .map(|o| (o.status, o.limit.clone()))
            .collect()
    }

    fn refused_by(&self, name: &str) -> usize {
        self.outcomes
            .iter()
            .filter(|o| o.limit.as_deref() == Some(name))
            .count()
    }

    /// The per-tenant table (tokens/s) and the total against the bound.
    fn print(&self, title: &str) {
        let el = self.elapsed_s;
        println!("{title}: {el:.2} s, {} requests", self.outcomes.len());
        println!("  tenant   weight conns   asked/s     got/s   got/asked  max-min/s  got/max-min  requests admitted");
        let shares = fair_shares(self);
        for (id, t) in self.tallies() {
            let ten = TENANTS.iter().find(|x| x.id == id);
            let share = shares.get(id).copied().unwrap_or(0.0);
            println!(
                "  {id:<8} {:>6} {:>5} {:>9.0} {:>9.0} {:>10.1}% {:>10.0} {:>11.1}% {:>9} {:>8}",
                ten.map_or(0.0, |x| x.weight),
                ten.map_or(0, |x| x.connections),
                t.asked as f64 / el,
                t.got as f64 / el,
                100.0 * t.got as f64 / (t.asked.max(1)) as f64,
                share / el,
                100.0 * t.got as f64 / share.max(1.0),
                t.requests,
                t.admitted
            );
        }
        let bound = BURST as f64 + RATE * el;
        println!(
            "  total got {} tokens = {:.1} % of burst + rate x t = {bound:.0}; refused by user {}, team {}, provider {}",
            self.total(),
            100.0 * self.total() as f64 / bound,
            self.refused_by("user"),
            self.refused_by("team"),
            self.refused_by("provider"),
        );
    }
}

/// A tenant's connection: the Envoy port it sends to (a list: requests go round it).
#[derive(Clone)]
struct Conn {
    tenant: Tenant,
    ports: Vec<u16>,
}

/// Runs every connection in its own thread for [`LOAD`] (and at most [`MAX_PER_CLIENT`] requests).
/// A quiet tenant sends on a fixed schedule (no catching up in bursts: a late request is sent at once
/// and the schedule goes on from it); a heavy one sends again as soon as it is answered, after
/// [`BACKOFF`] when refused.
fn drive(conns: &[Conn]) -> Run {
    let start = Instant::now();
    let handles: Vec<_> = conns
        .iter()
        .cloned()
        .map(|c| {
            thread::spawn(move || {
                let t = c.tenant;
                let mut clients: Vec<http::Client> =
                    c.ports.iter().map(|p| http::Client::new(*p)).collect();
                let body = tg::chat(MODEL, t.max_tokens);
                let headers = [
                    ("x-tenant-id", t.id),
                    (TEAM, t.team),
                    ("content-type", "application/json"),
                ];
                let mut out = Vec::new();
                let mut due = Instant::now();
                while start.elapsed() < LOAD && out.len() < MAX_PER_CLIENT {
                    if let Some(p) = t.pace {
                        let now = Instant::now();
                        if due > now {
                            thread::sleep(due - now);
                        }
                        due = due.max(now) + p;
                    }
                    let n = out.len() % clients.len();
                    let r = clients[n]
                        .post(tg::CHAT, &headers, &body)
                        .unwrap_or_else(|e| panic!("{} POST: {e}", t.id));
                    out.push(Outcome {
                        tenant: t.id,
                        status: r.status,
                        cost: r
                            .header("x-tokengate-estimated-tokens")
                            .and_then(|v| v.parse().ok()),
                        limit: r.header("x-tokengate-limit").map(str::to_string),
                    });
                    if r.status != 200 && t.pace.is_none() {
                        thread::sleep(BACKOFF);
                    }
                }
                out
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for h in handles {
        outcomes.extend(h.join().expect("client thread"));
    }
    Run {
        outcomes,
        elapsed_s: start.elapsed().as_secs_f64(),
    }
}

/// The connections of [`TENANTS`], the `i`-th connection of every tenant on `ports[i % len]` (a quiet
/// tenant, with one connection, sends to every port in turn).
fn connections(ports: &[u16]) -> Vec<Conn> {
    let mut out = Vec::new();
    for t in TENANTS {
        if t.quiet() {
            out.push(Conn {
                tenant: t,
                ports: ports.to_vec(),
            });
        } else {
            for i in 0..t.connections {
                out.push(Conn {
                    tenant: t,
                    ports: vec![ports[i % ports.len()]],
                });
            }
        }
    }
    out
}

/// Weighted max-min shares of `capacity` among `(ask, weight)` pairs (water-filling): a member asking
/// less than `λ × weight` gets its ask, the others `λ × weight`, with `λ` such that the shares add up to
/// `capacity` (or every ask is met).
fn max_min(capacity: f64, members: &[(f64, f64)]) -> Vec<f64> {
    let mut share = vec![0.0; members.len()];
    let mut open: Vec<usize> = (0..members.len()).collect();
    let mut left = capacity;
    // Each round either meets at least one ask or ends: at most `members.len()` rounds.
    for _ in 0..=members.len() {
        let w: f64 = open.iter().map(|&i| members[i].1).sum();
        if open.is_empty() || w <= 0.0 {
            break;
        }
        let level = left / w;
        let (met, held): (Vec<usize>, Vec<usize>) = open
            .iter()
            .partition(|&&i| members[i].0 <= level * members[i].1);
        if met.is_empty() {
            for &i in &held {
                share[i] = level * members[i].1;
            }
            break;
        }
        for &i in &met {
            share[i] = members[i].0;
            left -= members[i].0;
        }
        open = held;
    }
    share
}

/// Each tenant's weighted max-min share (tokens) of what the run admitted in all, from what it asked.
fn fair_shares(run: &Run) -> BTreeMap<&'static str, f64> {
    let tallies = run.tallies();
    let members: Vec<(f64, f64)> = TENANTS
        .iter()
        .map(|t| (tallies.get(t.id).map_or(0, |x| x.asked) as f64, t.weight))
        .collect();
    let shares = max_min(run.total() as f64, &members);
    TENANTS.iter().map(|t| t.id).zip(shares).collect()
}

/// The "done when" on a fair run: each quiet tenant got at least 95 % of what it asked; the
/// heavy ones split what the quiet ones left within ±10 % of their weights; the total is at least 95 %
/// of the provider's `burst + rate × t` and never above it.
fn assert_fair(run: &Run) {
    assert!(run.unexpected().is_empty(), "{:?}", run.unexpected());
    let el = run.elapsed_s;
    let tallies = run.tallies();
    let bound = BURST as f64 + RATE * el;
    let total = run.total() as f64;
    assert!(
        total <= bound,
        "admitted {total} tokens > burst + rate x t = {bound:.0} ({el:.2} s)"
    );
    assert!(
        total >= 0.95 * bound,
        "admitted {total} tokens, {:.1} % of the bound {bound:.0}: the limit was not used",
        100.0 * total / bound
    );
    for t in TENANTS.iter().filter(|t| t.quiet()) {
        let x = tallies[t.id];
        assert!(x.requests >= 40, "{}: only {} requests", t.id, x.requests);
        assert!(
            x.got as f64 >= 0.95 * x.asked as f64,
            "{} asked {} tokens and got {} ({:.1} %)",
            t.id,
            x.asked,
            x.got,
            100.0 * x.got as f64 / x.asked as f64
        );
    }
    // Every tenant within 10 % of its weighted max-min share of what was admitted (a quiet tenant's
    // share is its ask).
    let shares = fair_shares(run);
    for t in &TENANTS {
        let (got, want) = (tallies[t.id].got as f64, shares[t.id]);
        assert!(
            (got - want).abs() <= 0.10 * want,
            "{} got {got} tokens, {:+.1} % off its max-min share {want:.0}",
            t.id,
            100.0 * (got - want) / want
        );
    }
    let heavy: Vec<&Tenant> = TENANTS.iter().filter(|t| !t.quiet()).collect();
    let rest: u64 = heavy.iter().map(|t| tallies[t.id].got).sum();
    let weights: f64 = heavy.iter().map(|t| t.weight).sum();
    for t in &heavy {
        let got = tallies[t.id].got as f64;
        let want = rest as f64 * t.weight / weights;
        assert!(
            (got - want).abs() <= 0.10 * want,
            "{} (weight {}) got {got} of the heavy tenants' {rest}: {:.1} % off its weight's part {want:.0}",
            t.id,
            t.weight,
            100.0 * (got - want) / want
        );
    }
}

/// A quiet tenant got less than 95 % of what it asked: the load starves quiet tenants first come,
/// first served (else the fair run would prove nothing).
fn assert_starved(run: &Run) {
    assert!(run.unexpected().is_empty(), "{:?}", run.unexpected());
    let tallies = run.tallies();
    let worst = TENANTS
        .iter()
        .filter(|t| t.quiet())
        .map(|t| tallies[t.id].got as f64 / tallies[t.id].asked.max(1) as f64)
        .fold(f64::INFINITY, f64::min);
    assert!(
        worst < 0.95,
        "first come, first served, every quiet tenant still got 95 % of its ask ({:.1} % at worst): the load shows nothing",
        100.0 * worst
    );
}

/// The fair-limit metrics of `envoys` after a fair run: refusals over share counted (in all and for
/// the limit), and the gauges of the limit (members active, the share per unit of weight) set.
fn assert_fair_metrics(envoys: &[&Envoy]) {
    let sum = |name: &str| envoys.iter().map(|e| e.stat(name)).sum::<u64>();
    let over = sum("tokengate_fair_refused_over_share");
    let empty = sum("tokengate_fair_refused_limit_empty");
    let over_p = sum("tokengate_fair_refused_over_share.provider");
    let empty_p = sum("tokengate_fair_refused_limit_empty.provider");
    println!(
        "  metrics: refused over share {over} (provider {over_p}), limit empty {empty} (provider {empty_p}); \
         gauges active members {:?}, fair share {:?} tokens/s per unit of weight",
        envoys
            .iter()
            .map(|e| e.stat_opt("tokengate_fair_active_members.provider"))
            .collect::<Vec<_>>(),
        envoys
            .iter()
            .map(|e| e.stat_opt("tokengate_fair_share.provider"))
            .collect::<Vec<_>>(),
    );
    assert!(over > 0, "heavy tenants were refused over their share");
    assert_eq!(
        (over, empty),
        (over_p, empty_p),
        "one fair limit: its counters are the totals"
    );
    for e in envoys {
        let active = e
            .stat_opt("tokengate_fair_active_members.provider")
            .expect("the active-members gauge of the fair limit");
        assert!(
            (3..=5).contains(&active),
            "active members {active}: the heavy tenants (and the quiet ones) asked within the window"
        );
        let share = e
            .stat_opt("tokengate_fair_share.provider")
            .expect("the fair-share gauge of the fair limit");
        assert!(
            (200..=3000).contains(&share),
            "the share per unit of weight {share} tokens/s: heavy tenants are held to about 530"
        );
        // In /stats/prometheus under Envoy's sanitised names (what the Grafana dashboard matches).
        let prom = e.prometheus();
        for n in [
            "tokengate_fair_active_members_provider",
            "tokengate_fair_share_provider",
            "tokengate_fair_refused_over_share_provider",
        ] {
            assert!(
                wasm_test::prometheus_value(&prom, n).is_some(),
                "no {n} in /stats/prometheus"
            );
        }
        tg::assert_no_panic(e);
    }
}

// ---------------------------------------------------------------------------------------------
// (a) Five tenants, one Envoy: fair and first come, first served
// ---------------------------------------------------------------------------------------------

#[test]
fn quiet_tenants_get_what_they_ask_and_heavy_ones_split_the_rest_by_weight() {
    let _one = serial();
    let mock = mock_provider!();
    // Both Envoys start at once (V8 compiles the module slowly on a loaded machine); they run in turn.
    let plain = {
        let o = opts(&mock, config(limits(false, false)));
        thread::spawn(move || tg::start_opts(o))
    };
    let fair = tg::start_opts(opts(&mock, config(limits(true, false))));
    let plain = plain.join().expect("the first come, first served Envoy");
    let run = drive(&connections(&[fair.port]));
    run.print("fair provider limit (share: fair), one Envoy, 2 workers");
    assert_fair_metrics(&[&fair]);
    drop(fair);

    let before = drive(&connections(&[plain.port]));
    before.print("the same load, provider limit first come, first served");
    assert_eq!(plain.stat("tokengate_fair_refused_over_share"), 0);
    assert_eq!(plain.stat_opt("tokengate_fair_share.provider"), None);
    tg::assert_no_panic(&plain);

    assert_starved(&before);
    assert_fair(&run);
}

// ---------------------------------------------------------------------------------------------
// (b) Two Envoys, one global fair limit in Redis
// ---------------------------------------------------------------------------------------------

/// docs/fair-share.md ("Across Envoys"): a global fair limit is one record in Redis, so the bounds of
/// one record hold for the fleet. Every tenant's connections are spread over both Envoys (2 workers
/// each); the quiet tenants send to both in turn. The user and team limits are this Envoy's own
/// (`global: false`): they never bind here.
#[test]
fn two_envoys_share_one_global_fair_limit() {
    let _one = serial();
    let mock = mock_provider!();
    let redis = RedisServer::start();
    let webdis = Webdis::start(redis.port);
    let cfg = tg::merge(
        config(limits(true, true)),
        json!({"global_buckets": {"cluster": "webdis", "timeout_ms": 1000, "on_failure": "closed"}}),
    );
    // One after the other: two Envoys compiling the module at once on a loaded two-core host were not
    // ready after 60 s.
    let envoys: Vec<Envoy> = (0..2)
        .map(|_| {
            let mut o = opts(&mock, cfg.clone()).webdis(webdis.port).concurrency(2);
            o.ready_timeout = Duration::from_secs(120);
            tg::start_opts(o)
        })
        .collect();
    let ports: Vec<u16> = envoys.iter().map(|e| e.port).collect();
    let run = drive(&connections(&ports));
    run.print("global fair provider limit, two Envoys x 2 workers, one Redis");
    let refs: Vec<&Envoy> = envoys.iter().collect();
    assert_fair_metrics(&refs);
    for e in &envoys {
        assert!(e.stat("tokengate_requests_admitted") > 0);
        assert_eq!(e.stat("tokengate_global_shim_errors"), 0);
        assert!(e.stat("tokengate_global_charged") > 0);
    }
    let keys = match redis.cmd(&["KEYS", "tg:gf:*"]) {
        Ok(RespValue::Array(Some(a))) => a.len(),
        other => panic!("KEYS: {other:?}"),
    };
    assert_eq!(keys, 1, "one record in Redis for the fleet");
    assert_fair(&run);
}

// ---------------------------------------------------------------------------------------------
// (c) when_exhausted: the cheaper model instead of a 429
// ---------------------------------------------------------------------------------------------

const BIG: &str = "gpt-big";
const MINI: &str = "gpt-mini";

fn post_model(envoy: &Envoy, tenant: &str, model: &str, max_tokens: u64) -> http::Response {
    tg::post_chat(envoy, tenant, &tg::chat(model, max_tokens))
}

/// The models the mock provider was asked for, in order.
fn models_served(mock: &MockProvider) -> Vec<String> {
    mock.requests()
        .iter()
        .map(|r| r.json()["model"].as_str().unwrap_or("").to_string())
        .collect()
}

/// A spent limit with `when_exhausted` sends the request to the cheaper model: the provider gets the
/// body with the cheaper model, the answer says `x-tokengate-downgraded: gpt-big -> gpt-mini`, the audit
/// record `downgraded=`, the cheaper model's limit is charged (its remaining tokens fall by each
/// request's estimate as that model) and the spent one is not. When the cheaper model's limit is spent
/// too, the client gets the first refusal (the limit of the model it asked for).
#[test]
fn a_spent_limit_sends_the_request_to_the_cheaper_model_and_charges_it() {
    let _one = serial();
    let mock = mock_provider!();
    let cfg = config(json!([
        {"name": "big", "scope": "shared", "model": BIG, "tokens_per_second": 0.001, "burst": 500,
         "when_exhausted": {"model": MINI}},
        {"name": "mini", "scope": "shared", "model": MINI, "tokens_per_second": 0.001, "burst": 1200},
    ]));
    let envoy = tg::start_opts(opts(&mock, cfg));
    // 2 x ~214 tokens fit the big limit's 500.
    for _ in 0..2 {
        let r = post_model(&envoy, "t1", BIG, 200);
        tg::admitted(&r);
        assert_eq!(r.header("x-tokengate-downgraded"), None);
    }
    let mut mini_left: Option<u64> = None;
    let mut downgraded = 0;
    for i in 0..8 {
        let r = post_model(&envoy, "t1", BIG, 200);
        if r.status != 200 {
            // The cheaper limit is spent too: the first refusal stands, the big limit's.
            let ours = tg::assert_error(
                &r,
                429,
                "tokens",
                "rate_limit_exceeded",
                "tokens_per_second_exceeded",
            );
            assert_eq!(r.header("x-tokengate-limit"), Some("big"), "{ours}");
            assert_eq!(ours["limit"], "big");
            assert!(
                i >= 4,
                "mini's 1,200 tokens hold 5 requests: refused at {i}"
            );
            break;
        }
        let cost = tg::estimated(&r);
        assert_eq!(
            r.header("x-tokengate-downgraded"),
            Some("gpt-big -> gpt-mini"),
            "{:?}",
            r.headers
        );
        let left = tg::header_u64(&r, "x-ratelimit-remaining-tokens");
        assert_eq!(
            tg::header_u64(&r, "x-ratelimit-limit-tokens"),
            1200,
            "the mini limit answers"
        );
        if let Some(before) = mini_left {
            assert_eq!(
                left,
                before - cost,
                "the mini limit is charged the request's estimate"
            );
        }
        mini_left = Some(left);
        downgraded += 1;
    }
    assert!(downgraded >= 4, "downgraded {downgraded}");
    let served = models_served(&mock);
    assert_eq!(served.len(), 2 + downgraded);
    assert!(served[..2].iter().all(|m| m == BIG), "{served:?}");
    assert!(
        served[2..].iter().all(|m| m == MINI),
        "the provider saw the cheaper model: {served:?}"
    );
    let log = envoy.wait_access_log(served.len() + 1, Duration::from_secs(3));
    let audited = log
        .lines()
        .filter(|l| l.contains("downgraded=gpt-big->gpt-mini") && l.contains("model=gpt-mini"))
        .count();
    assert_eq!(audited, downgraded, "audit records:\n{log}");
    assert_eq!(
        envoy.stat("tokengate_requests_downgraded"),
        downgraded as u64
    );
    tg::assert_no_panic(&envoy);
}

fn month_label() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    // Howard Hinnant's civil-from-days (UTC).
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}")
}

/// A budget in money that cannot cover a request of the expensive model sends it to the cheaper one:
/// the provider sees the cheaper model, the answer says so, and Redis holds exactly what the provider
/// served at each model's prices — the expensive requests at the expensive prices, the downgraded ones
/// at the cheaper prices (the mock's usage: prompt = text bytes / 4, completion = `max_tokens`).
#[test]
fn a_spent_budget_serves_the_cheaper_model_and_charges_its_prices() {
    let _one = serial();
    let mock = mock_provider!();
    let redis = RedisServer::start();
    let webdis = Webdis::start(redis.port);
    // Per million tokens: big 50 / 200, mini 0.5 / 2 (micro-dollars per token: 50, 200; 0.5, 2).
    let cfg = tg::merge(
        config(json!([
            {"name": "all", "scope": "tenant", "model": "*", "per_model": true,
             "tokens_per_second": 1_000_000, "burst": 1_000_000}
        ])),
        // Per request ("lease": false): Redis is compared with the served usage, and a lease counts its
        // unspent part until it goes back.
        json!({"quota": {"cluster": "webdis", "timeout_ms": 1000, "currency": "USD", "lease": false,
                         "prices": {BIG: {"input": 50, "output": 200}, MINI: {"input": 0.5, "output": 2}},
                         "budgets": [{"name": "spend", "scope": "shared", "monthly_limit": 0.1,
                                      "when_exhausted": {"model": MINI}}]}}),
    );
    let envoy = tg::start_opts(opts(&mock, cfg).webdis(webdis.port));
    // The mock's usage of a chat body of `tg::chat`: 38 bytes of prompt -> 9 tokens, completion
    // = max_tokens (100). Big: 9 x 50 + 100 x 200 = 20,450 µ$; mini: ⌈9 x 0.5 + 100 x 2⌉ = 205 µ$.
    let (prompt, completion) = (9u64, 100u64);
    let big_micros = prompt * 50 + completion * 200;
    let mini_micros = (prompt * 5 + completion * 20).div_ceil(10);
    let mut served = Vec::new();
    for _ in 0..8 {
        let r = post_model(&envoy, "t1", BIG, completion);
        tg::admitted(&r);
        served.push(r.header("x-tokengate-downgraded").map(str::to_string));
    }
    let big_n = served.iter().filter(|d| d.is_none()).count() as u64;
    let mini_n = served.len() as u64 - big_n;
    println!(
        "budget of 100,000 µ$: {big_n} requests of {BIG} at {big_micros} µ$, then {mini_n} of {MINI} at {mini_micros} µ$"
    );
    // The estimate reserves more than the usage (framing), so fewer than 100,000 / 20,450 fit.
    assert!((2..=4).contains(&big_n), "{served:?}");
    assert!(
        served[..big_n as usize].iter().all(Option::is_none)
            && served[big_n as usize..]
                .iter()
                .all(|d| d.as_deref() == Some("gpt-big -> gpt-mini")),
        "served as big until the budget could not cover it, then as mini: {served:?}"
    );
    let models = models_served(&mock);
    assert_eq!(models.len(), 8);
    assert!(
        models[big_n as usize..].iter().all(|m| m == MINI),
        "{models:?}"
    );
    let key = format!("tg:q:{{%7Eb:spend:%7Eall}}:{}", month_label());
    let want = (big_n * big_micros + mini_n * mini_micros) as i64;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = None;
    while Instant::now() < deadline {
        got = match redis.cmd(&["GET", &key]) {
            Ok(RespValue::Bulk(Some(b))) => String::from_utf8_lossy(&b).parse::<i64>().ok(),
            _ => None,
        };
        if got == Some(want) {
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let keys = redis.cmd(&["KEYS", "tg:q:*"]);
    assert_eq!(
        got,
        Some(want),
        "Redis holds usage x each model's price ({keys:?})"
    );
    assert_eq!(envoy.stat("tokengate_requests_downgraded"), mini_n);
    tg::assert_no_panic(&envoy);
}

/// A downgrade that loops or goes to a model nothing limits is refused at load: one line naming the
/// field, and Envoy does not start.
#[test]
fn a_downgrade_loop_or_an_unlimited_target_is_refused_at_load() {
    let _one = serial();
    let mock = mock_provider!();
    let cases = [
        (
            json!([
                {"name": "big", "scope": "shared", "model": BIG, "tokens_per_second": 10, "burst": 100,
                 "when_exhausted": {"model": MINI}},
                {"name": "mini", "scope": "shared", "model": MINI, "tokens_per_second": 10, "burst": 100,
                 "when_exhausted": {"model": BIG}},
            ]),
            "limits[0].when_exhausted.model: downgrades loop: gpt-mini -> gpt-big -> gpt-mini",
        ),
        (
            json!([
                {"name": "big", "scope": "shared", "model": BIG, "tokens_per_second": 10, "burst": 100,
                 "when_exhausted": {"model": "gpt-nowhere"}},
            ]),
            "limits[0].when_exhausted.model: 'gpt-nowhere' is not limited",
        ),
    ];
    let runs: Vec<_> = cases
        .into_iter()
        .map(|(limits, want)| {
            let o = opts(&mock, config(limits));
            (want, thread::spawn(move || Envoy::start_expect_failure(o)))
        })
        .collect();
    for (want, run) in runs {
        let log = run.join().expect("Envoy refused the configuration");
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(want)).collect();
        assert_eq!(
            lines.len(),
            1,
            "one line with {want:?} in:\n{}",
            wasm_test::tail(&log, 30)
        );
        assert!(lines[0].contains("invalid configuration"), "{}", lines[0]);
    }
}
