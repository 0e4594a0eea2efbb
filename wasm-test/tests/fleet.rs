//! Three Envoy processes × 2 workers with the filter, sharing one Redis (a plain `redis-server`, or the
//! Redis Cluster behind Envoy's `redis_proxy`), all behind Webdis, under a bounded load of 100 tenants
//! (issue 14; figures in `docs/scaling.md`).
//!
//! Each run is one [`Plan`]: per-request quota reservations, leased quota (`quota.lease`), or leased quota
//! plus a global bucket rule. The clients count, per tenant, what they were served (the `usage` of each
//! answer) and the Redis side is read afterwards; a run passes when
//! - every tenant's counter, minus the leases still held, equals the usage it was served, and equals it
//!   once the idle leases went back (no token lost, none charged twice);
//! - no tenant was served beyond its monthly limit (the leases' bound is 0: a lease is counted in Redis
//!   when granted and spent only up to what was granted);
//! - under a global rule no tenant was served more estimated tokens than one bucket allows
//!   (`burst + tokens_per_second × t`);
//! - the tenants whose limits are small were refused (`monthly_quota_exceeded`, or `monthly_quota_leased` while other Envoys held leases) and nothing else failed.
//!
//! The long runs (`#[ignore]`, `make fleet`) last `FLEET_SECS` seconds each (default 15); the smoke test
//! runs in `make test` (3 s, 20 tenants). Every run prints its figures: requests/s, script calls per
//! request (`INFO commandstats`: `eval` + `evalsha` calls), refusals, lost/extra tokens.

use std::time::Duration;
use wasm_test::cluster::{ClusterOpts, ClusterShim, ProxyOpts};
use wasm_test::fleet::LoadResult;
use wasm_test::fleet::{
    self, class_table, refusals_text, run_load, table, GlobalPlan, Outcome, Plan, Store, TenantPlan,
};
use wasm_test::tg;
use wasm_test::{mock_provider, RedisServer, Webdis};

/// Seconds each long run lasts (`FLEET_SECS`, default 15).
fn fleet_secs() -> u64 {
    std::env::var("FLEET_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15)
}

/// Webdis and what is behind it.
enum Backend {
    Plain { webdis: Webdis, redis: RedisServer },
    Cluster(ClusterShim),
}

impl Backend {
    fn plain() -> Backend {
        let redis = RedisServer::start();
        let webdis = Webdis::start(redis.port);
        Backend::Plain { webdis, redis }
    }

    fn cluster() -> Backend {
        Backend::Cluster(ClusterShim::start(
            ClusterOpts::default(),
            ProxyOpts::default(),
        ))
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Plain { .. } => "redis",
            Backend::Cluster(_) => "cluster",
        }
    }

    fn webdis_port(&self) -> u16 {
        match self {
            Backend::Plain { webdis, .. } => webdis.port,
            Backend::Cluster(s) => s.webdis.port,
        }
    }

    fn store(&self) -> &dyn Store {
        match self {
            Backend::Plain { redis, .. } => redis,
            Backend::Cluster(s) => &s.cluster,
        }
    }
}

/// 100 tenants: 5 busy ones with no practical limit, 5 busy ones capped at 30 000 weighted tokens (a
/// few seconds of their traffic: they lease, then reserve one by one, then are refused), and 90 light
/// ones, every third capped at 600 (spent within a second or two).
fn tenants(n: usize) -> Vec<TenantPlan> {
    (0..n)
        .map(|i| {
            let (class, weight, limit) = match i {
                0..=4 => ("busy", 60, 1_000_000_000),
                5..=9 => ("busy-capped", 60, 30_000),
                _ if i % 3 == 0 => ("light-capped", 4, 600),
                _ => ("light", 4, 1_000_000),
            };
            TenantPlan {
                name: format!("t{i:03}"),
                weight,
                limit,
                class: class.into(),
            }
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    PerRequest,
    Leased,
    GlobalLeased,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::PerRequest => "quota per request",
            Mode::Leased => "quota leased",
            Mode::GlobalLeased => "global rule + quota leased",
        }
    }
}

/// The global rule of [`Mode::GlobalLeased`]: 2000 tokens/s with a burst of 4000 per tenant (the busy
/// tenants ask for more than that; the light ones for less).
const GLOBAL: GlobalPlan = GlobalPlan {
    rate: 2000.0,
    burst: 4000,
};

struct Run {
    backend: &'static str,
    mode: Mode,
    load: LoadResult,
    outcome: Outcome,
    script_calls: u64,
    leased: u64,
    syncs: u64,
    reserved: u64,
}

/// Three Envoys × 2 workers on `backend`, `n` tenants, `clients` client threads for `secs` seconds.
fn run(backend: &Backend, mode: Mode, n: usize, clients: usize, secs: u64) -> Run {
    let plan = Plan {
        tenants: tenants(n),
        lease: mode != Mode::PerRequest,
        global: (mode == Mode::GlobalLeased).then_some(GLOBAL),
        timeout_ms: 1000,
        shim_breaker_threshold: None,
    };
    let mock = mock_provider!();
    let envoys = fleet::start_envoys(
        3,
        mock.port,
        backend.webdis_port(),
        &plan.plugin_config(),
        2,
    );
    let store = backend.store();
    store.reset_stats();
    let spec = plan.load(
        envoys.iter().map(|e| e.port).collect(),
        clients,
        Duration::from_secs(secs),
    );
    let (load, ()) = run_load(&spec, |_| {});
    let script_calls = store.script_calls();
    let outcome = fleet::verify(&plan, store, &load, Duration::from_secs(20));
    for e in &envoys {
        tg::assert_no_panic(e);
    }
    Run {
        backend: backend.name(),
        mode,
        script_calls,
        leased: fleet::stat_sum(&envoys, "tokengate_quota_leased"),
        syncs: fleet::stat_sum(&envoys, "tokengate_quota_lease_syncs"),
        reserved: fleet::stat_sum(&envoys, "tokengate_quota_reserved"),
        load,
        outcome,
    }
}

/// The figures of a run, one row.
fn figures(r: &Run) -> Vec<String> {
    let total = r.load.total();
    let (over_n, over_tokens) = r.outcome.over_limit();
    vec![
        r.backend.into(),
        r.mode.name().into(),
        total.sent.to_string(),
        format!("{:.0}", r.load.rate()),
        total.served.to_string(),
        refusals_text(&total.refused),
        total.errors.to_string(),
        r.script_calls.to_string(),
        format!("{:.3}", r.script_calls as f64 / total.sent.max(1) as f64),
        format!(
            "{:.0} %",
            100.0 * r.leased as f64 / total.served.max(1) as f64
        ),
        r.syncs.to_string(),
        r.reserved.to_string(),
        r.outcome.lost().to_string(),
        r.outcome.extra().to_string(),
        format!("{over_n} ({over_tokens})"),
        r.outcome
            .worst_global_excess()
            .map_or("-".into(), |x| format!("{x:.0}")),
        r.outcome
            .settle_wait
            .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
        r.outcome
            .release_wait
            .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
    ]
}

/// The figures table's header.
const FIGURES: [&str; 18] = [
    "redis",
    "mode",
    "requests",
    "req/s",
    "served",
    "refused",
    "errors",
    "script calls",
    "calls/request",
    "leased",
    "lease syncs",
    "reservations",
    "lost tokens",
    "extra tokens",
    "over limit (tokens)",
    "worst global ±",
    "settled after",
    "leases back after",
];

/// The refusals a fleet run may see: a tenant's month spent (or held in other Envoys' leases), and its
/// token bucket.
const QUOTA_OR_BUCKET: [&str; 3] = [
    "monthly_quota_exceeded",
    "monthly_quota_leased",
    "tokens_per_second_exceeded",
];

/// Prints the run and asserts the invariants of the module doc.
fn check(r: &Run) {
    println!(
        "\n### {} / {} ({} Envoys × 2 workers)\n\n{}\n{}",
        r.backend,
        r.mode.name(),
        3,
        table(&FIGURES, &[figures(r)]),
        class_table(&r.outcome)
    );
    if std::env::var_os("FLEET_TENANTS").is_some() {
        println!("{}", fleet::tenant_table(&r.outcome));
    }
    let total = r.load.total();
    let bad: Vec<String> = r
        .outcome
        .tenants
        .iter()
        .filter(|t| t.diff() != 0 || t.over_limit > 0 || t.global_excess.is_some_and(|x| x > 1.0))
        .map(|t| format!("{t:?}"))
        .collect();
    assert!(bad.is_empty(), "tenants off:\n{}", bad.join("\n"));
    assert_eq!(total.errors, 0, "transport errors");
    let unexpected: Vec<&String> = total
        .refused
        .keys()
        .filter(|k| !QUOTA_OR_BUCKET.contains(&k.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "refusals other than quota and buckets: {:?}",
        total.refused
    );
    assert!(r.outcome.settle_wait.is_some(), "settlements landed");
    // Idle leases going back is asserted on its own (`an_idle_lease_goes_back_to_redis`): the counter
    // check above already takes the leases still held into account.
    assert_eq!(r.outcome.open_reservations(), 0, "no reservation left open");
    // The limit (600) is about one second of a light tenant's traffic: the limit bound. (Not every such
    // tenant reaches it on a loaded host: one sent 17 requests, 502 tokens, in 3 s. One that does not is
    // within its limit, which the over-limit check above asserts.)
    let capped = r
        .outcome
        .tenants
        .iter()
        .filter(|t| t.plan.class == "light-capped");
    assert!(
        capped
            .clone()
            .any(|t| t.tally.refused.contains_key("monthly_quota_exceeded")
                || t.tally.refused.contains_key("monthly_quota_leased")),
        "no light-capped tenant reached its limit: {:?}",
        capped
            .map(|t| (&t.plan.name, t.tally.sent, t.tally.usage))
            .collect::<Vec<_>>()
    );
    if r.mode != Mode::PerRequest {
        assert!(
            r.leased * 2 > total.served,
            "most served requests were covered by a lease: {} of {}",
            r.leased,
            total.served
        );
    }
    if r.mode == Mode::GlobalLeased {
        check_global_bucket_met(r);
    }
}

/// A busy tenant that asked for well over what one global bucket allows in the run (`burst + rate × t`)
/// met the bucket. The clients are closed-loop, so on a slow host (CI on 2 cores measured 306 req/s, 19
/// requests/s per busy tenant: 570 tokens/s against the rule's 2,000) no tenant may ask that much; such
/// a run says so and asserts only the bounds `check` asserted.
fn check_global_bucket_met(r: &Run) {
    let secs = r.load.elapsed.as_secs_f64();
    let allowed = GLOBAL.burst as f64 + GLOBAL.rate * secs;
    let asked = |t: &fleet::TenantOutcome| {
        let per_request = t.tally.estimated as f64 / t.tally.served.max(1) as f64;
        t.tally.sent as f64 * per_request
    };
    let over: Vec<&fleet::TenantOutcome> = r
        .outcome
        .tenants
        .iter()
        .filter(|t| asked(t) > 1.5 * allowed)
        .collect();
    if over.is_empty() {
        println!(
            "no tenant asked 1.5× what the global bucket allows in {secs:.1} s ({allowed:.0} tokens): \
             the bucket was not reached on this host"
        );
        return;
    }
    for t in over {
        assert!(
            t.tally.refused.contains_key("tokens_per_second_exceeded"),
            "{} asked {:.0} tokens against a global bucket of {allowed:.0} and was never refused by it",
            t.plan.name,
            asked(t)
        );
    }
}

/// Issue 14: an Envoy "gives back what it does not use (idle, expiry, drain)". With
/// `quota.lease.idle_s: 2` a tenant that stops sending has its lease returned to Redis: the lease entry
/// holds 0 and the counter equals the usage served. Bound: 2 s idle + 6 s for the leader's walk.

#[test]
fn an_idle_lease_goes_back_to_redis() {
    let b = Backend::plain();
    let plan = Plan {
        tenants: vec![TenantPlan {
            name: "idle".into(),
            weight: 1,
            limit: 1_000_000,
            class: "one".into(),
        }],
        lease: true,
        global: None,
        timeout_ms: 1000,
        shim_breaker_threshold: None,
    };
    let mock = mock_provider!();
    let envoys = fleet::start_envoys(1, mock.port, b.webdis_port(), &plan.plugin_config(), 2);
    let spec = plan.load(vec![envoys[0].port], 2, Duration::from_secs(2));
    let (load, ()) = run_load(&spec, |_| {});
    let served = load.total();
    assert_eq!(served.served, served.sent, "{served:?}");
    let leased = fleet::stat_sum(&envoys, "tokengate_quota_leased");
    assert!(
        leased * 2 > served.served,
        "the tenant ran on a lease: {leased} of {}",
        served.served
    );
    let month = fleet::this_month();
    let t0 = std::time::Instant::now();
    let mut views = Vec::new();
    let held = loop {
        let v = fleet::QuotaView::read(b.store(), "idle", &month).unwrap_or_else(|e| panic!("{e}"));
        views.push((t0.elapsed().as_millis(), v.clone()));
        if v.leased == 0 || t0.elapsed() > Duration::from_secs(8) {
            break v;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let syncs = fleet::stat_sum(&envoys, "tokengate_quota_lease_syncs");
    println!(
        "served {} requests ({} tokens) in 2 s; {leased} from the lease; {syncs} lease syncs; Redis \
         after {} ms idle: {held:?}",
        served.served,
        served.usage,
        t0.elapsed().as_millis()
    );
    assert_eq!(
        held.leased, 0,
        "8 s after the last request (idle_s: 2) the Envoy still holds its lease (renewed by {syncs} \
         syncs); Redis over time: {views:?}"
    );
    assert_eq!(held.used, served.usage as i64, "counter = usage served");
}

#[test]
fn smoke_three_envoys_share_one_redis_with_leases_and_a_global_rule() {
    let b = Backend::plain();
    let r = run(&b, Mode::GlobalLeased, 20, 6, 3);
    check(&r);
}

#[test]
#[ignore = "long: make fleet"]
fn three_envoys_on_one_redis_quota_per_request() {
    check(&run(
        &Backend::plain(),
        Mode::PerRequest,
        100,
        12,
        fleet_secs(),
    ));
}

#[test]
#[ignore = "long: make fleet"]
fn three_envoys_on_one_redis_quota_leased() {
    check(&run(&Backend::plain(), Mode::Leased, 100, 12, fleet_secs()));
}

#[test]
#[ignore = "long: make fleet"]
fn three_envoys_on_one_redis_global_rule_and_leased_quota() {
    check(&run(
        &Backend::plain(),
        Mode::GlobalLeased,
        100,
        12,
        fleet_secs(),
    ));
}

#[test]
#[ignore = "long: make fleet"]
fn three_envoys_on_the_cluster_quota_per_request() {
    check(&run(
        &Backend::cluster(),
        Mode::PerRequest,
        100,
        12,
        fleet_secs(),
    ));
}

#[test]
#[ignore = "long: make fleet"]
fn three_envoys_on_the_cluster_quota_leased() {
    check(&run(
        &Backend::cluster(),
        Mode::Leased,
        100,
        12,
        fleet_secs(),
    ));
}

#[test]
#[ignore = "long: make fleet"]
fn three_envoys_on_the_cluster_global_rule_and_leased_quota() {
    check(&run(
        &Backend::cluster(),
        Mode::GlobalLeased,
        100,
        12,
        fleet_secs(),
    ));
}
