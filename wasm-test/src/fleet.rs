//! Load and bookkeeping for the fleet tests (`tests/fleet.rs`, `tests/cluster.rs`): several Envoys with
//! the filter in front of one mock provider, sharing one Redis (a plain [`RedisServer`] or a
//! [`RedisCluster`] through Webdis → `redis_proxy`), driven by client threads that count, per tenant,
//! what they were served.
//!
//! ```no_run
//! use wasm_test::fleet::{run_load, LoadSpec};
//! use std::time::Duration;
//!
//! let spec = LoadSpec {
//!     ports: vec![10000, 10001, 10002],                     // the Envoys' listeners
//!     tenants: (0..100).map(|i| format!("t{i:03}")).collect(),
//!     weights: vec![1; 100],
//!     clients: 12,
//!     duration: Duration::from_secs(20),
//!     max_requests_per_client: 100_000,
//!     max_tokens: 40,
//!     model: "gpt-test".into(),
//! };
//! let (result, ()) = run_load(&spec, |_start| {});
//! println!("{} requests, {:.0}/s", result.requests(), result.rate());
//! ```
//!
//! What a client counts for each answer ([`TenantTally`]): a 200 from the provider (`x-mock-port`) is
//! *served*, with the `usage` of its body (prompt + completion tokens: the filter charges exactly this
//! with unit weights) and its `x-tokengate-estimated-tokens` (what the buckets charged); anything else
//! is a refusal, counted by `x-tokengate-reason` (or `status-<code>` when the filter gave none), and a
//! transport error is counted apart. The Redis side is read with [`QuotaView`] (the month's counter,
//! the leases Envoys hold, the reservations still open) and [`Store::script_calls`]
//! (`INFO commandstats`: `eval` + `evalsha` calls).

use super::cluster::RedisCluster;
use super::{http, redis_cmd, RedisServer, RespValue};
use serde_json::Value;
use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// ---------------------------------------------------------------------------------------------
// Redis, plain or Cluster
// ---------------------------------------------------------------------------------------------

/// The Redis the Envoys share, read directly (not through the proxy) by the tests.
pub trait Store {
    /// A command concerning `key` (on the node that holds it).
    fn cmd(&self, key: &str, args: &[&str]) -> Result<RespValue, String>;
    /// Script calls (`eval` + `evalsha`) executed since the last [`reset_stats`](Store::reset_stats),
    /// over every (live) node.
    fn script_calls(&self) -> u64;
    /// `CONFIG RESETSTAT` on every (live) node.
    fn reset_stats(&self);
}

impl Store for RedisServer {
    fn cmd(&self, _key: &str, args: &[&str]) -> Result<RespValue, String> {
        redis_cmd(self.port, args)
    }
    fn script_calls(&self) -> u64 {
        let text = redis_cmd(self.port, &["INFO", "commandstats"])
            .ok()
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let s = super::cluster::parse_commandstats(&text);
        s.get("eval").copied().unwrap_or(0) + s.get("evalsha").copied().unwrap_or(0)
    }
    fn reset_stats(&self) {
        let _ = redis_cmd(self.port, &["CONFIG", "RESETSTAT"]);
    }
}

impl Store for RedisCluster {
    fn cmd(&self, key: &str, args: &[&str]) -> Result<RespValue, String> {
        self.cmd_for_key(key, args)
    }
    fn script_calls(&self) -> u64 {
        RedisCluster::script_calls(self)
    }
    fn reset_stats(&self) {
        RedisCluster::reset_stats(self)
    }
}

/// `"2026-11"`: the UTC month of a unix time (Howard Hinnant's civil-from-days; independent of the
/// filter's own calendar code).
pub fn month_label(unix_s: i64) -> String {
    let z = unix_s.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}")
}

/// The current UTC month label.
pub fn this_month() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    month_label(now)
}

/// One tenant's quota as Redis holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaView {
    /// `tg:q:{t}:<month>`: settled usage + open reservations + leases held.
    pub used: i64,
    /// Sum of what the tenant's leases hold (`tg:q:{t}:leases`, first field of each entry).
    pub leased: i64,
    /// Number of lease entries (one per Envoy that took a lease; an entry may hold 0).
    pub leases: usize,
    /// Reservations in flight (`HLEN tg:q:{t}:open`).
    pub open: i64,
}

impl QuotaView {
    /// Reads a tenant's counter, leases and open reservations for `month`.
    pub fn read(store: &dyn Store, tenant: &str, month: &str) -> Result<QuotaView, String> {
        let p = format!("tg:q:{{{tenant}}}");
        let used_key = format!("{p}:{month}");
        let used = match store.cmd(&used_key, &["GET", &used_key])? {
            RespValue::Bulk(None) => 0,
            v => v.as_int().ok_or_else(|| format!("GET {used_key}: {v:?}"))?,
        };
        let leases_key = format!("{p}:leases");
        let (mut leased, mut leases) = (0, 0);
        if let RespValue::Array(Some(items)) = store.cmd(&leases_key, &["HGETALL", &leases_key])? {
            for pair in items.chunks(2) {
                let held = pair
                    .get(1)
                    .and_then(RespValue::as_str)
                    .and_then(|v| v.split(' ').next().and_then(|h| h.parse::<i64>().ok()))
                    .ok_or_else(|| format!("{leases_key}: unreadable entry {pair:?}"))?;
                leased += held;
                leases += 1;
            }
        }
        let open_key = format!("{p}:open");
        let open = store
            .cmd(&open_key, &["HLEN", &open_key])?
            .as_int()
            .unwrap_or(0);
        Ok(QuotaView {
            used,
            leased,
            leases,
            open,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------------

/// What [`run_load`] sends.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// Envoy listener ports; client `i` keeps a connection to `ports[i % len]`.
    pub ports: Vec<u16>,
    /// Tenant ids (sent in `x-tenant-id`).
    pub tenants: Vec<String>,
    /// Relative share of the requests per tenant (same length as `tenants`).
    pub weights: Vec<u32>,
    /// Client threads.
    pub clients: usize,
    /// How long the load runs.
    pub duration: Duration,
    /// Bound on the requests of one client.
    pub max_requests_per_client: u64,
    /// `max_tokens` of every body; each request asks the mock for 1..=`max_tokens` completion tokens
    /// (`x-mock-completion-tokens`), so usage is below the reservation and settlements matter.
    pub max_tokens: u64,
    /// The body's `model`.
    pub model: String,
}

/// What clients were answered for one tenant.
#[derive(Clone, Debug, Default)]
pub struct TenantTally {
    /// Requests sent.
    pub sent: u64,
    /// Served by the provider (200 with `x-mock-port`).
    pub served: u64,
    /// Sum of `usage.prompt_tokens + usage.completion_tokens` of the served answers.
    pub usage: u64,
    /// Sum of `x-tokengate-estimated-tokens` of the served answers (what token buckets charged).
    pub estimated: u64,
    /// Refusals by `x-tokengate-reason` (`status-<code>` when there is none).
    pub refused: BTreeMap<String, u64>,
    /// Transport errors (connect, timeout, closed).
    pub errors: u64,
    /// First and last moment (since the start) a served answer was sent.
    pub served_window: Option<(Duration, Duration)>,
    /// Refusals whose reason ends in `_unavailable` (since the start): when the first one was received,
    /// and when the request of the last one was sent. Each refusal was decided between its request's
    /// sending and its answer's receipt, so a bound on when the filter still refused holds for the
    /// second figure whatever the client's latency (and a bound on when it began, for the first).
    pub unavailable_window: Option<(Duration, Duration)>,
}

impl TenantTally {
    fn merge(&mut self, o: &TenantTally) {
        self.sent += o.sent;
        self.served += o.served;
        self.usage += o.usage;
        self.estimated += o.estimated;
        for (k, v) in &o.refused {
            *self.refused.entry(k.clone()).or_default() += v;
        }
        self.errors += o.errors;
        self.served_window = widen(self.served_window, o.served_window);
        self.unavailable_window = widen(self.unavailable_window, o.unavailable_window);
    }

    /// Refusals of any reason.
    pub fn refusals(&self) -> u64 {
        self.refused.values().sum()
    }
}

/// The smallest window holding both.
fn widen(
    a: Option<(Duration, Duration)>,
    b: Option<(Duration, Duration)>,
) -> Option<(Duration, Duration)> {
    match (a, b) {
        (Some(a), Some(b)) => Some((a.0.min(b.0), a.1.max(b.1))),
        (a, b) => a.or(b),
    }
}

/// Width of one [`LoadResult::timeline`] slot.
pub const SLOT: Duration = Duration::from_millis(250);

/// What [`run_load`] saw.
#[derive(Clone, Debug, Default)]
pub struct LoadResult {
    /// Per tenant.
    pub tenants: BTreeMap<String, TenantTally>,
    /// From the first request sent to the last answer.
    pub elapsed: Duration,
    /// Per [`SLOT`] since the start: answers by outcome (`served`, a refusal reason, `error`).
    pub timeline: Vec<BTreeMap<String, u64>>,
}

impl LoadResult {
    /// Requests sent.
    pub fn requests(&self) -> u64 {
        self.tenants.values().map(|t| t.sent).sum()
    }

    /// Requests answered per second.
    pub fn rate(&self) -> f64 {
        self.requests() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Everything summed over tenants.
    pub fn total(&self) -> TenantTally {
        let mut t = TenantTally::default();
        for v in self.tenants.values() {
            t.merge(v);
        }
        t
    }

    /// Time slots (start, end) in which some answer had outcome `what`, merged when adjacent.
    pub fn windows(&self, what: &str) -> Vec<(Duration, Duration)> {
        let mut out: Vec<(Duration, Duration)> = Vec::new();
        for (i, slot) in self.timeline.iter().enumerate() {
            if slot.get(what).copied().unwrap_or(0) == 0 {
                continue;
            }
            let (a, b) = (SLOT * i as u32, SLOT * (i as u32 + 1));
            match out.last_mut() {
                Some(last) if last.1 == a => last.1 = b,
                _ => out.push((a, b)),
            }
        }
        out
    }
}

/// A small deterministic generator (xorshift64*), one per client.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// The chat body every load request sends (a fixed 38-byte prompt: the mock reports 9 prompt tokens).
pub fn chat_body(model: &str, max_tokens: u64) -> Vec<u8> {
    serde_json::json!({"model": model, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Write one short sentence about rivers."}]})
    .to_string()
    .into_bytes()
}

/// Runs `spec.clients` client threads for `spec.duration` (each also bounded by
/// `max_requests_per_client`), calling `during` on this thread meanwhile with the start instant (a
/// test kills a Redis master from there). Returns the tallies and what `during` returned, once every
/// client has finished.
pub fn run_load<T>(spec: &LoadSpec, during: impl FnOnce(Instant) -> T) -> (LoadResult, T) {
    assert_eq!(
        spec.tenants.len(),
        spec.weights.len(),
        "one weight per tenant"
    );
    assert!(!spec.ports.is_empty() && !spec.tenants.is_empty());
    let total_weight: u64 = spec.weights.iter().map(|&w| u64::from(w)).sum();
    assert!(total_weight > 0, "some tenant gets traffic");
    let start = Instant::now();
    let body = chat_body(&spec.model, spec.max_tokens);
    let handles: Vec<_> = (0..spec.clients)
        .map(|i| {
            let spec = spec.clone();
            let body = body.clone();
            thread::spawn(move || client(i, &spec, &body, total_weight, start))
        })
        .collect();
    let out = during(start);
    let mut result = LoadResult::default();
    let mut last = start;
    for h in handles {
        let (tallies, timeline, ended) = h.join().unwrap_or_else(|_| panic!("a client panicked"));
        last = last.max(ended);
        for (t, tally) in tallies {
            result.tenants.entry(t).or_default().merge(&tally);
        }
        if result.timeline.len() < timeline.len() {
            result.timeline.resize(timeline.len(), BTreeMap::new());
        }
        for (slot, counts) in timeline.into_iter().enumerate() {
            for (k, v) in counts {
                *result.timeline[slot].entry(k).or_default() += v;
            }
        }
    }
    result.elapsed = last - start;
    (result, out)
}

type ClientOut = (
    BTreeMap<String, TenantTally>,
    Vec<BTreeMap<String, u64>>,
    Instant,
);

fn client(i: usize, spec: &LoadSpec, body: &[u8], total_weight: u64, start: Instant) -> ClientOut {
    let port = spec.ports[i % spec.ports.len()];
    let mut conn = http::Client::new(port);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
    let mut tallies: BTreeMap<String, TenantTally> = BTreeMap::new();
    let mut timeline: Vec<BTreeMap<String, u64>> = Vec::new();
    let deadline = start + spec.duration;
    for _ in 0..spec.max_requests_per_client {
        if Instant::now() >= deadline {
            break;
        }
        let mut pick = rng.next() % total_weight;
        let mut ti = 0;
        for (j, &w) in spec.weights.iter().enumerate() {
            if pick < u64::from(w) {
                ti = j;
                break;
            }
            pick -= u64::from(w);
        }
        let tenant = &spec.tenants[ti];
        let completion = (1 + rng.next() % spec.max_tokens.max(1)).to_string();
        let headers = [
            ("x-tenant-id", tenant.as_str()),
            ("content-type", "application/json"),
            ("x-mock-completion-tokens", completion.as_str()),
        ];
        let t = tallies.entry(tenant.clone()).or_default();
        t.sent += 1;
        let sent_at = start.elapsed();
        let outcome = match conn.post("/v1/chat/completions", &headers, body) {
            Ok(r) if r.status == 200 && r.header("x-mock-port").is_some() => {
                let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                let u = &v["usage"];
                let usage = u["prompt_tokens"].as_u64().unwrap_or(0)
                    + u["completion_tokens"].as_u64().unwrap_or(0);
                assert!(usage > 0, "a served answer without usage: {}", r.text());
                t.served += 1;
                t.usage += usage;
                t.estimated += r
                    .header("x-tokengate-estimated-tokens")
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                let at = start.elapsed();
                t.served_window = widen(t.served_window, Some((at, at)));
                "served".to_string()
            }
            Ok(r) => {
                let reason = r
                    .header("x-tokengate-reason")
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("status-{}", r.status));
                *t.refused.entry(reason.clone()).or_default() += 1;
                if reason.ends_with("_unavailable") {
                    let at = start.elapsed();
                    t.unavailable_window = widen(t.unavailable_window, Some((at, sent_at)));
                }
                reason
            }
            Err(_) => {
                t.errors += 1;
                "error".to_string()
            }
        };
        let slot = (start.elapsed().as_millis() / SLOT.as_millis()) as usize;
        if timeline.len() <= slot {
            timeline.resize(slot + 1, BTreeMap::new());
        }
        *timeline[slot].entry(outcome).or_default() += 1;
    }
    (tallies, timeline, Instant::now())
}

// ---------------------------------------------------------------------------------------------
// Envoys
// ---------------------------------------------------------------------------------------------

/// Starts `n` Envoys (each `--concurrency workers`) with the filter and `plugin_config`, in front of the
/// mock provider on `provider_port`, their `webdis` cluster at `webdis_port`; in parallel (the V8
/// compile is slow on a loaded machine), each given 90 s to be ready. Panics with the log tail.
pub fn start_envoys(
    n: usize,
    provider_port: u16,
    webdis_port: u16,
    plugin_config: &Value,
    workers: u32,
) -> Vec<super::Envoy> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let mut o = super::EnvoyOpts::new(provider_port, plugin_config.clone())
                .webdis(webdis_port)
                .concurrency(workers);
            o.ready_timeout = Duration::from_secs(90);
            thread::spawn(move || super::Envoy::start(o))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| match h.join() {
            Ok(Ok(e)) => e,
            Ok(Err(e)) => panic!("envoy did not start: {e}"),
            Err(_) => panic!("envoy start panicked"),
        })
        .collect()
}

/// The sum of one filter counter over Envoys (`tokengate_quota_leased`, …).
pub fn stat_sum(envoys: &[super::Envoy], name: &str) -> u64 {
    envoys.iter().map(|e| e.stat(name)).sum()
}

// ---------------------------------------------------------------------------------------------
// A run: tenants, config, verification
// ---------------------------------------------------------------------------------------------

/// One tenant of a [`Plan`].
#[derive(Clone, Debug)]
pub struct TenantPlan {
    /// Tenant id.
    pub name: String,
    /// Share of the load.
    pub weight: u32,
    /// `quota.tenants.<name>.monthly_limit`.
    pub limit: u64,
    /// A label for tables (`busy`, `capped`, the shard, …).
    pub class: String,
}

/// A global bucket rule (`"global": true`, every tenant), `global_buckets.on_failure: closed`.
#[derive(Clone, Copy, Debug)]
pub struct GlobalPlan {
    /// `tokens_per_second`.
    pub rate: f64,
    /// `burst`.
    pub burst: u64,
}

/// What the Envoys of a run are configured with.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Tenants, their limits and weights.
    pub tenants: Vec<TenantPlan>,
    /// `quota.lease` on (with [`LEASE`]).
    pub lease: bool,
    /// One global bucket rule instead of the roomy local rule.
    pub global: Option<GlobalPlan>,
    /// `quota.timeout_ms` and `global_buckets.timeout_ms`.
    pub timeout_ms: u64,
    /// `shim_breaker.failure_threshold` of both sections (None: the default, 3 failures in 10 s open
    /// it for 5 s).
    pub shim_breaker_threshold: Option<u32>,
}

/// The `quota.lease` of leased runs: leases from 512 tokens (so tenants with limits of a few tens of
/// thousands lease until they are nearly spent), given back after 2 s idle; the rest defaults
/// (horizon 2 s, at most 10 % of what is left per lease, renewed every 1 s, TTL 60 s).
pub const LEASE: &str = r#"{"min_tokens": 512, "idle_s": 2}"#;

impl Plan {
    /// The plugin config: tenant from `x-tenant-id`; quota on Webdis (`on_failure: closed`), the
    /// per-tenant limits, leases when asked; either a roomy local rule or the global rule.
    pub fn plugin_config(&self) -> Value {
        use serde_json::json;
        let tenants: serde_json::Map<String, Value> = self
            .tenants
            .iter()
            .map(|t| (t.name.clone(), json!({"monthly_limit": t.limit})))
            .collect();
        let mut quota = json!({"cluster": "webdis", "timeout_ms": self.timeout_ms,
            "monthly_limit": 1_000_000, "on_failure": "closed", "tenants": tenants});
        // Leases are on by default: the per-request mode turns them off.
        quota["lease"] = if self.lease {
            serde_json::from_str(LEASE).unwrap_or(Value::Null)
        } else {
            Value::Bool(false)
        };
        let breaker = self
            .shim_breaker_threshold
            .map(|n| json!({"failure_threshold": n}));
        if let Some(b) = &breaker {
            quota["shim_breaker"] = b.clone();
        }
        let mut cfg = json!({"tenant_header": "x-tenant-id","trusted_headers": {"set_by": "the test client: it is the trusted filter"}, "forward_identity_headers": true, "model_header": "x-tokengate-model",
            "api_key_tenants": false, "quota": quota});
        cfg["rules"] = match self.global {
            Some(g) => json!([{"name": "g", "tenant": "*", "model": "*",
                "tokens_per_second": g.rate, "burst": g.burst, "global": true}]),
            None => json!([{"name": "all", "tenant": "*", "model": "*",
                "tokens_per_second": 1e7, "burst": 1_000_000_000u64}]),
        };
        if self.global.is_some() {
            cfg["global_buckets"] =
                json!({"cluster": "webdis", "timeout_ms": self.timeout_ms, "on_failure": "closed"});
            if let Some(b) = breaker {
                cfg["global_buckets"]["shim_breaker"] = b;
            }
        }
        cfg
    }

    /// A [`LoadSpec`] over these tenants.
    pub fn load(&self, ports: Vec<u16>, clients: usize, duration: Duration) -> LoadSpec {
        LoadSpec {
            ports,
            tenants: self.tenants.iter().map(|t| t.name.clone()).collect(),
            weights: self.tenants.iter().map(|t| t.weight).collect(),
            clients,
            duration,
            max_requests_per_client: 1_000_000,
            max_tokens: 40,
            model: "gpt-test".into(),
        }
    }
}

/// How one tenant ended.
#[derive(Clone, Debug)]
pub struct TenantOutcome {
    /// The plan's tenant.
    pub plan: TenantPlan,
    /// What its clients got.
    pub tally: TenantTally,
    /// Redis once every settlement landed (leases may still be held).
    pub settled: QuotaView,
    /// Redis once the leases were given back (idle).
    pub end: QuotaView,
    /// Served usage above the limit (0 when within).
    pub over_limit: u64,
    /// Global rule: estimated tokens served minus what one bucket allows (`burst + rate × t`, `t` the
    /// last served answer since the start); negative when within.
    pub global_excess: Option<f64>,
}

impl TenantOutcome {
    /// What Redis counts beyond the leases minus what was served (`> 0`: charged more than served,
    /// `< 0`: tokens lost).
    pub fn diff(&self) -> i64 {
        self.end.used - self.end.leased - self.tally.usage as i64
    }
}

/// A run's outcome.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Per tenant, in plan order.
    pub tenants: Vec<TenantOutcome>,
    /// How long the settlements took to land after the load ended (None: not within the bound).
    pub settle_wait: Option<Duration>,
    /// How long until no lease held anything after the load ended (None: not within the bound).
    pub release_wait: Option<Duration>,
}

impl Outcome {
    /// Sum of [`TenantOutcome::diff`] where it is negative (tokens served and never counted).
    pub fn lost(&self) -> i64 {
        self.tenants.iter().map(|t| (-t.diff()).max(0)).sum()
    }
    /// Sum of [`TenantOutcome::diff`] where it is positive (tokens counted and never served).
    pub fn extra(&self) -> i64 {
        self.tenants.iter().map(|t| t.diff().max(0)).sum()
    }
    /// Tenants served beyond their limit, and by how much in total.
    pub fn over_limit(&self) -> (usize, u64) {
        let over: Vec<u64> = self
            .tenants
            .iter()
            .map(|t| t.over_limit)
            .filter(|&o| o > 0)
            .collect();
        (over.len(), over.iter().sum())
    }
    /// The largest [`TenantOutcome::global_excess`].
    pub fn worst_global_excess(&self) -> Option<f64> {
        self.tenants
            .iter()
            .filter_map(|t| t.global_excess)
            .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))))
    }
    /// Tenants with reservations still open in Redis.
    pub fn open_reservations(&self) -> i64 {
        self.tenants.iter().map(|t| t.end.open).sum()
    }
}

/// How long [`verify`] waits for the idle leases to go back ([`LEASE`]'s `idle_s` is 2 s; the leader
/// walks 32 accounts per 20 ms tick).
pub const RELEASE_WAIT: Duration = Duration::from_secs(8);

/// After the load: waits (bounded by `wait`, polling every 200 ms) until every tenant's counter minus
/// its leases equals the usage its clients were served, then (bounded by [`RELEASE_WAIT`]) until no
/// lease holds anything, and reads everything once more.
pub fn verify(plan: &Plan, store: &dyn Store, load: &LoadResult, wait: Duration) -> Outcome {
    let month = this_month();
    let read_all = || -> Vec<QuotaView> {
        plan.tenants
            .iter()
            .map(|t| {
                QuotaView::read(store, &t.name, &month)
                    .unwrap_or_else(|e| panic!("reading tenant {}: {e}", t.name))
            })
            .collect()
    };
    let usage = |name: &str| load.tenants.get(name).map_or(0, |t| t.usage) as i64;
    let t0 = Instant::now();
    let mut settle_wait = None;
    let settled = loop {
        let views = read_all();
        let done = plan
            .tenants
            .iter()
            .zip(&views)
            .all(|(t, v)| v.used - v.leased == usage(&t.name) && v.open == 0);
        if done {
            settle_wait = Some(t0.elapsed());
            break views;
        }
        if t0.elapsed() >= wait {
            break views;
        }
        thread::sleep(Duration::from_millis(200));
    };
    let t1 = Instant::now();
    let mut release_wait = None;
    let end = loop {
        let views = read_all();
        if views.iter().all(|v| v.leased == 0) {
            release_wait = Some(t0.elapsed());
            break views;
        }
        if t1.elapsed() >= RELEASE_WAIT {
            break views;
        }
        thread::sleep(Duration::from_millis(200));
    };
    let tenants = plan
        .tenants
        .iter()
        .zip(settled.into_iter().zip(end))
        .map(|(p, (settled, end))| {
            let tally = load.tenants.get(&p.name).cloned().unwrap_or_default();
            let global_excess = plan.global.map(|g| {
                let t = tally.served_window.map_or(0.0, |w| w.1.as_secs_f64());
                tally.estimated as f64 - (g.burst as f64 + g.rate * t)
            });
            TenantOutcome {
                over_limit: tally.usage.saturating_sub(p.limit),
                plan: p.clone(),
                tally,
                settled,
                end,
                global_excess,
            }
        })
        .collect();
    Outcome {
        tenants,
        settle_wait,
        release_wait,
    }
}

/// One table row per tenant: class, limit, sent, served, refusals, usage served, Redis counter at the
/// end, leases still held, open reservations, counter − leases − usage, usage over the limit, and for a
/// global rule the estimated tokens served against what the bucket allows.
pub fn tenant_table(o: &Outcome) -> String {
    let rows: Vec<Vec<String>> = o
        .tenants
        .iter()
        .map(|t| {
            vec![
                t.plan.name.clone(),
                t.plan.class.clone(),
                t.plan.limit.to_string(),
                t.tally.sent.to_string(),
                t.tally.served.to_string(),
                refusals_text(&t.tally.refused),
                t.tally.usage.to_string(),
                t.end.used.to_string(),
                t.end.leased.to_string(),
                t.end.open.to_string(),
                t.diff().to_string(),
                t.over_limit.to_string(),
                t.global_excess.map_or("-".into(), |x| format!("{x:.0}")),
            ]
        })
        .collect();
    table(
        &[
            "tenant",
            "class",
            "limit",
            "sent",
            "served",
            "refused",
            "usage",
            "counter",
            "leased",
            "open",
            "diff",
            "over",
            "global ±",
        ],
        &rows,
    )
}

/// One row per class: tenants, requests, served, refusals, usage, lost and extra tokens, tenants
/// over their limit.
pub fn class_table(o: &Outcome) -> String {
    let mut classes: Vec<String> = Vec::new();
    for t in &o.tenants {
        if !classes.contains(&t.plan.class) {
            classes.push(t.plan.class.clone());
        }
    }
    let rows: Vec<Vec<String>> = classes
        .iter()
        .map(|c| {
            let ts: Vec<&TenantOutcome> = o.tenants.iter().filter(|t| &t.plan.class == c).collect();
            let mut tally = TenantTally::default();
            for t in &ts {
                tally.merge(&t.tally);
            }
            let lost: i64 = ts.iter().map(|t| (-t.diff()).max(0)).sum();
            let extra: i64 = ts.iter().map(|t| t.diff().max(0)).sum();
            let over = ts.iter().filter(|t| t.over_limit > 0).count();
            let excess = ts
                .iter()
                .filter_map(|t| t.global_excess)
                .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
            vec![
                c.clone(),
                ts.len().to_string(),
                tally.sent.to_string(),
                tally.served.to_string(),
                refusals_text(&tally.refused),
                tally.usage.to_string(),
                lost.to_string(),
                extra.to_string(),
                over.to_string(),
                excess.map_or("-".into(), |x| format!("{x:.0}")),
            ]
        })
        .collect();
    table(
        &[
            "class",
            "tenants",
            "sent",
            "served",
            "refused",
            "usage",
            "lost",
            "extra",
            "over limit",
            "worst global ±",
        ],
        &rows,
    )
}

// ---------------------------------------------------------------------------------------------
// Tables
// ---------------------------------------------------------------------------------------------

/// Formats rows as a Markdown table (every row as long as `header`).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect();
        format!("| {} |\n", padded.join(" | "))
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out += &format!(
        "|{}|\n",
        widths
            .iter()
            .map(|w| format!("{}:", "-".repeat(w + 1)))
            .collect::<Vec<_>>()
            .join("|")
    );
    for r in rows {
        out += &line(r.clone());
    }
    out
}

/// Refusal counts as `reason×n, …` (`-` when none).
pub fn refusals_text(refused: &BTreeMap<String, u64>) -> String {
    if refused.is_empty() {
        return "-".into();
    }
    refused
        .iter()
        .map(|(k, v)| format!("{k}×{v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn month_labels_turn_at_utc_month_ends() {
        assert_eq!(month_label(0), "1970-01");
        // 2024-02-29T23:59:59Z and a second later.
        assert_eq!(month_label(1_709_251_199), "2024-02");
        assert_eq!(month_label(1_709_251_200), "2024-03");
        // 2025-12-31T23:59:59Z and a second later.
        assert_eq!(month_label(1_767_225_599), "2025-12");
        assert_eq!(month_label(1_767_225_600), "2026-01");
    }

    #[test]
    fn a_table_pads_every_column() {
        let t = table(&["a", "bb"], &[vec!["123".into(), "4".into()]]);
        assert_eq!(t, "|   a | bb |\n|----:|---:|\n| 123 |  4 |\n");
    }
}
