//! Rolling upgrades (issue 28): the previous release and the current build side by side, under load, with
//! monthly quotas on leases and a global bucket rule in the Redis both share.
//!
//! - **Two Envoys, two versions** ([`old_and_new_envoys_share_redis_under_load`]): one Envoy runs the
//!   previous release (`wasm-test/artefacts/tokengate-v0.1.0.wasm`, checked against the sha256 recorded in
//!   its README), the other the current build; every tenant's clients alternate between them, as a
//!   Deployment mid-rollout does. The Redis keys, the Lua scripts and the lease entries are written and read
//!   by both versions.
//! - **A config reload of one Envoy** ([`a_config_reload_replaces_the_vm_under_load`]): one Envoy reads its
//!   listener from a file (LDS `path_config_source` on a watched directory). Under load the listener is
//!   replaced by one naming the current build (Envoy starts a new VM; the old one finishes the requests it
//!   holds, and both see the same shared data: buckets, breakers, lease accounts, the settlement queue),
//!   then rolled back to the previous release.
//!
//! A run passes when the ledger is exact: for every tenant, the Redis counter minus the leases still held
//! equals the usage its clients were served (no token lost, none charged twice), no tenant was served beyond
//! its limit or beyond what one global bucket allows, no reservation was left open, no transport error;
//! and when no refusal appears that either version alone would not give: the refusals are only the quota's
//! and the bucket's (`monthly_quota_exceeded`, `monthly_quota_leased`, `tokens_per_second_exceeded`), the
//! light uncapped tenants (below the global rate, far below their limits) are never refused, and neither
//! version counts a corrupt record, a store error, a shim error or a panic.
//!
//! `make test` runs the short versions (20 tenants; 8 s of load, and 28 s for the reloads: each takes
//! 5-10 s under load on 2 cores); `make fleet` the long ones (100 tenants, `FLEET_SECS` of load, at least
//! 45 s for the reloads). `UPGRADE_OLD_WASM` / `UPGRADE_NEW_WASM` replace either module (the new one
//! defaults to the current build, `TOKENGATE_WASM`); a module that does not charge (the empty filter of
//! `bench/empty-filter`) as the new one makes both tests fail (measured: the reload run lost 438,079
//! tokens and served 7 tenants beyond their limits). `UPGRADE_NO_LEASE=1` runs them with per-request
//! reservations instead of leases.

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};
use wasm_test::fleet::{
    self, class_table, refusals_text, run_load, table, GlobalPlan, LoadResult, Outcome, Plan,
    TenantPlan,
};
use wasm_test::{
    envoy_bin, http, mock_provider, render_bootstrap, repo_root, require_wasm, tg, Envoy,
    EnvoyOpts, RedisServer, TempDir, Webdis,
};

/// The sha256 of the kept v0.1.0 module (wasm-test/artefacts/README.md).
const OLD_SHA256: &str = "41301c15cadedefecc2ef54776c5c0be10fbbf0a5343f42c831a6be7fb96dcca";
/// What the previous release logs when a VM starts.
const OLD_VERSION: &str = "0.1.0";

/// One test at a time: each runs two Envoys × 2 workers, or one Envoy with two VM generations.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The previous release's module: `UPGRADE_OLD_WASM`, else the kept artefact (its sha256 checked).
fn old_wasm() -> PathBuf {
    if let Some(p) = std::env::var_os("UPGRADE_OLD_WASM") {
        return PathBuf::from(p);
    }
    let p = repo_root().join("wasm-test/artefacts/tokengate-v0.1.0.wasm");
    let bytes = fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let sha = format!("{:x}", Sha256::digest(&bytes));
    assert_eq!(
        sha,
        OLD_SHA256,
        "{} is not the v0.1.0 module recorded in wasm-test/artefacts/README.md",
        p.display()
    );
    p
}

/// The new module: `UPGRADE_NEW_WASM`, else the current build.
fn new_wasm() -> PathBuf {
    std::env::var_os("UPGRADE_NEW_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(require_wasm)
}

/// `[package] version` of the repository's Cargo.toml: what the current build logs.
fn new_version() -> String {
    let text = fs::read_to_string(repo_root().join("Cargo.toml")).unwrap_or_default();
    text.lines()
        .find_map(|l| {
            l.strip_prefix("version = \"")
                .and_then(|r| r.strip_suffix('"'))
        })
        .unwrap_or_else(|| panic!("no version in Cargo.toml"))
        .to_string()
}

/// Seconds of load of the long runs (`FLEET_SECS`, default 15).
fn fleet_secs() -> u64 {
    std::env::var("FLEET_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15)
}

/// Tenants as in tests/fleet.rs: busy uncapped, busy capped at 12 000 (they lease, then reserve one by one,
/// then are refused), light ones every third capped at 600.
fn tenants(n: usize) -> Vec<TenantPlan> {
    (0..n)
        .map(|i| {
            let (class, weight, limit) = match i {
                0..=1 => ("busy", 60, 1_000_000_000),
                2..=3 => ("busy-capped", 60, 12_000),
                _ if i % 3 == 0 => ("light-capped", 4, 600),
                _ => ("light", 4, 1_000_000),
            };
            TenantPlan {
                name: format!("u{i:03}"),
                weight,
                limit,
                class: class.into(),
            }
        })
        .collect()
}

/// Leased quota and a global bucket of 2000 tokens/s, burst 4000, per tenant (in Redis).
fn plan(n: usize) -> Plan {
    Plan {
        tenants: tenants(n),
        lease: std::env::var_os("UPGRADE_NO_LEASE").is_none(),
        global: Some(GlobalPlan {
            rate: 2000.0,
            burst: 4000,
        }),
        timeout_ms: 1000,
        shim_breaker_threshold: None,
    }
}

/// The refusals either version gives under this load.
const EXPECTED_REFUSALS: [&str; 3] = [
    "monthly_quota_exceeded",
    "monthly_quota_leased",
    "tokens_per_second_exceeded",
];

/// Counters that must stay 0 in every VM of both versions.
const MUST_BE_ZERO: [&str; 5] = [
    "tokengate_state_corrupt",
    "tokengate_store_errors",
    "tokengate_quota_shim_errors",
    "tokengate_global_shim_errors",
    "tokengate_quota_settle_dropped",
];

/// Asserts the ledger and the refusals (module doc); prints the figures.
fn check(what: &str, load: &LoadResult, outcome: &Outcome, counters: &[(String, u64)]) {
    let total = load.total();
    let (over_n, over_tokens) = outcome.over_limit();
    println!(
        "\n### {what}\n\n{}\n{}",
        table(
            &[
                "requests",
                "req/s",
                "served",
                "refused",
                "errors",
                "lost tokens",
                "extra tokens",
                "over limit",
                "worst global ±",
                "settled after",
                "leases back after"
            ],
            &[vec![
                total.sent.to_string(),
                format!("{:.0}", load.rate()),
                total.served.to_string(),
                refusals_text(&total.refused),
                total.errors.to_string(),
                outcome.lost().to_string(),
                outcome.extra().to_string(),
                format!("{over_n} ({over_tokens})"),
                outcome
                    .worst_global_excess()
                    .map_or("-".into(), |x| format!("{x:.0}")),
                outcome
                    .settle_wait
                    .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
                outcome
                    .release_wait
                    .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
            ]]
        ),
        class_table(outcome)
    );
    let off: Vec<String> = outcome
        .tenants
        .iter()
        .filter(|t| t.diff() != 0 || t.over_limit > 0 || t.global_excess.is_some_and(|x| x > 1.0))
        .map(|t| format!("{t:?}"))
        .collect();
    assert!(
        off.is_empty(),
        "{what}: tenants whose Redis counter is not what they were served (or over a limit):\n{}",
        off.join("\n")
    );
    assert!(
        outcome.settle_wait.is_some(),
        "{what}: the settlements did not land"
    );
    assert_eq!(
        outcome.open_reservations(),
        0,
        "{what}: reservations left open"
    );
    assert_eq!(total.errors, 0, "{what}: transport errors");
    let unexpected: Vec<&String> = total
        .refused
        .keys()
        .filter(|k| !EXPECTED_REFUSALS.contains(&k.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{what}: refusals neither version gives under this load: {:?}",
        total.refused
    );
    let light_refused: Vec<(&String, &std::collections::BTreeMap<String, u64>)> = outcome
        .tenants
        .iter()
        .filter(|t| t.plan.class == "light" && t.tally.refusals() > 0)
        // The clients are closed-loop: on a fast host a "light" tenant asks far more than on CI's
        // (measured here: 47–56 requests/s, 1,400–1,680 tokens/s against the rule's 2,000). A tenant
        // using over half its global rate meets the documented bound of global leases: the bucket is
        // held in blocks per Envoy (docs/scaling.md, "Global-bucket leases"), and one Envoy's empty
        // block refuses while another holds the rest — with 0.1.0 alone as well (measured). Only
        // tenants below half the rate must never be refused; the bounds above hold for every tenant.
        .filter(|t| {
            let per_request = t.tally.estimated as f64 / t.tally.served.max(1) as f64;
            let asked = t.tally.sent as f64 * per_request;
            asked <= 0.5 * (4000.0 + 2000.0 * load.elapsed.as_secs_f64())
        })
        .map(|t| (&t.plan.name, &t.tally.refused))
        .collect();
    assert!(
        light_refused.is_empty(),
        "{what}: light uncapped tenants refused: {light_refused:?}"
    );
    assert!(
        total.refused.contains_key("monthly_quota_exceeded")
            || total.refused.contains_key("monthly_quota_leased"),
        "{what}: no capped tenant reached its limit (the load did not exercise the quota)"
    );
    let bad: Vec<&(String, u64)> = counters.iter().filter(|(_, v)| *v != 0).collect();
    assert!(bad.is_empty(), "{what}: error counters: {bad:?}");
}

/// The provider's view: `load` with each tenant's `usage` replaced by the tokens the mock provider
/// served it (`GET /_mock/ledger`: every answer it gave, also those whose client went away). The Redis
/// counter must equal this, whatever the clients saw; and no client sees more than the provider served.
fn provider_view(load: &LoadResult, mock: &wasm_test::MockProvider) -> LoadResult {
    let ledger = wasm_test::faults::ledger(mock);
    let mut view = load.clone();
    for (tenant, tally) in view.tenants.iter_mut() {
        let served = ledger.tenant_tokens.get(tenant).copied().unwrap_or(0);
        assert!(
            tally.usage <= served,
            "tenant {tenant}: clients got {} tokens, the provider served {served}",
            tally.usage
        );
        tally.usage = served;
    }
    let unknown: Vec<&String> = ledger
        .tenant_tokens
        .keys()
        .filter(|t| !view.tenants.contains_key(*t))
        .collect();
    assert!(
        unknown.is_empty(),
        "the provider served unknown tenants {unknown:?}"
    );
    view
}

/// Both versions' module files and what they log.
struct Versions {
    old: PathBuf,
    new: PathBuf,
    new_version: String,
}

fn versions() -> Versions {
    Versions {
        old: old_wasm(),
        new: new_wasm(),
        new_version: new_version(),
    }
}

/// Two Envoys × 2 workers, the previous release and the current build, sharing one Redis.
/// The plugin configuration the previous release accepts: 0.2.0 added `trusted_headers` (a tenant header
/// is identity only with it) and `forward_identity_headers`, which 0.1.0 refuses as unknown fields. A
/// rolling upgrade ships each version its own configuration (docs/upgrading.md).
fn old_config(cfg: &serde_json::Value) -> serde_json::Value {
    let mut c = cfg.clone();
    if let Some(o) = c.as_object_mut() {
        o.remove("trusted_headers");
        o.remove("forward_identity_headers");
    }
    c
}

/// The listener text `listener` with the new configuration replaced by the old one's (or back).
fn listener_for(listener: &str, from: &serde_json::Value, to: &serde_json::Value) -> String {
    let lit = |c: &serde_json::Value| serde_json::Value::String(c.to_string()).to_string();
    listener.replace(&lit(from), &lit(to))
}

fn two_versions(n: usize, clients: usize, secs: u64) {
    let _serial = serial();
    let v = versions();
    let redis = RedisServer::start();
    let webdis = Webdis::start(redis.port);
    let mock = mock_provider!();
    let plan = plan(n);
    let cfg = plan.plugin_config();
    let handles: Vec<_> = [
        (v.old.clone(), old_config(&cfg)),
        (v.new.clone(), cfg.clone()),
    ]
    .into_iter()
    .map(|(wasm, cfg)| {
        let mut o = EnvoyOpts::new(mock.port, cfg)
            .webdis(webdis.port)
            .concurrency(2);
        o.wasm = Some(wasm);
        o.ready_timeout = Duration::from_secs(90);
        thread::spawn(move || Envoy::start(o))
    })
    .collect();
    let envoys: Vec<Envoy> = handles
        .into_iter()
        .map(|h| match h.join() {
            Ok(Ok(e)) => e,
            Ok(Err(e)) => panic!("envoy did not start: {e}"),
            Err(_) => panic!("envoy start panicked"),
        })
        .collect();
    let (old, new) = (&envoys[0], &envoys[1]);
    if std::env::var_os("UPGRADE_OLD_WASM").is_none() {
        assert!(
            old.wait_log(
                &format!("tokengate {OLD_VERSION} ("),
                Duration::from_secs(5)
            ),
            "the old Envoy does not log version {OLD_VERSION}:\n{}",
            old.log()
        );
    }
    if std::env::var_os("UPGRADE_NEW_WASM").is_none() {
        assert!(
            new.wait_log(
                &format!("tokengate {} (", v.new_version),
                Duration::from_secs(5)
            ),
            "the new Envoy does not log Cargo.toml's version {}:\n{}",
            v.new_version,
            new.log()
        );
    }
    // Client i talks to ports[i % 2]: every tenant's traffic is split across the two versions.
    let spec = plan.load(
        envoys.iter().map(|e| e.port).collect(),
        clients,
        Duration::from_secs(secs),
    );
    let (load, ()) = run_load(&spec, |_| {});
    let outcome = fleet::verify(
        &plan,
        &redis,
        &provider_view(&load, &mock),
        Duration::from_secs(20),
    );
    let mut counters = Vec::new();
    for (name, e) in [("old", old), ("new", new)] {
        tg::assert_no_panic(e);
        for c in MUST_BE_ZERO {
            counters.push((format!("{name} {c}"), e.stat(c)));
        }
    }
    println!(
        "leased (old / new): {} / {}; served by the new Envoy: {} of {}",
        old.stat("tokengate_quota_leased"),
        new.stat("tokengate_quota_leased"),
        new.stat("tokengate_requests_admitted"),
        load.total().served
    );
    check(
        &format!("v{OLD_VERSION} and v{} side by side", v.new_version),
        &load,
        &outcome,
        &counters,
    );
    assert!(
        old.stat("tokengate_requests_admitted") > 0 && new.stat("tokengate_requests_admitted") > 0,
        "both versions admitted requests"
    );
}

// ---------------------------------------------------------------------------------------------
// One Envoy whose listener comes from a watched file (LDS), so that a test can reload it
// ---------------------------------------------------------------------------------------------

/// An Envoy with `dynamic_resources.lds_config.path_config_source` (killed by PID on drop).
struct LdsEnvoy {
    port: u16,
    admin_port: u16,
    child: Child,
    lds_dir: PathBuf,
    /// The listener with the current release's configuration, and with the previous one's.
    listener: String,
    old_listener: String,
    log_path: PathBuf,
    generation: u32,
    // Removed after the process is gone.
    dir: TempDir,
}

impl LdsEnvoy {
    /// Renders the harness's bootstrap, moves its listener into `<dir>/lds/lds.yaml` (module `wasm`), and
    /// starts Envoy on it with `--drain-strategy immediate` (a replaced listener's connections are closed
    /// after their current request, so clients move to the new VM at once) and `--drain-time-s 10` (what
    /// is still open then is closed, in-flight requests included: measured with 2 s, a few requests were
    /// cut, each charged its estimate for want of a usage report while the provider counted its actual
    /// usage; with 10 s none is left by then).
    fn start(opts: &EnvoyOpts, wasm: &Path) -> LdsEnvoy {
        let dir = TempDir::new("upgrade-lds");
        let boot = render_bootstrap(opts, dir.path());
        let text = fs::read_to_string(&boot.path).unwrap_or_else(|e| panic!("bootstrap: {e}"));
        let (head, rest) = text
            .split_once("  listeners:\n")
            .unwrap_or_else(|| panic!("no listeners in the bootstrap"));
        let (listener_block, clusters) = rest
            .split_once("  clusters:\n")
            .unwrap_or_else(|| panic!("no clusters in the bootstrap"));
        // "  - name: tokengate_listener" ... (indented under static_resources) -> one LDS resource.
        let mut listener = String::new();
        for line in listener_block.lines() {
            let line = line.strip_prefix("  ").unwrap_or(line);
            if let Some(rest) = line.strip_prefix("- name: ") {
                listener.push_str(
                    "- \"@type\": type.googleapis.com/envoy.config.listener.v3.Listener\n  name: ",
                );
                listener.push_str(rest);
            } else {
                listener.push_str(line);
            }
            listener.push('\n');
        }
        let harness_wasm =
            Value::String(dir.path().join("tokengate.wasm").display().to_string()).to_string();
        assert!(
            listener.contains(&harness_wasm),
            "the listener names {harness_wasm}"
        );
        let listener = listener.replace(&harness_wasm, "{{WASM}}");
        let old_listener = listener_for(
            &listener,
            &opts.plugin_config,
            &old_config(&opts.plugin_config),
        );
        let lds_dir = dir.path().join("lds");
        fs::create_dir_all(&lds_dir).unwrap_or_else(|e| panic!("{e}"));
        let lds_literal = |p: &Path| Value::String(p.display().to_string()).to_string();
        let bootstrap = format!(
            "node: {{ id: upgrade-test, cluster: upgrade-test }}\n{head}  clusters:\n{clusters}\
             dynamic_resources:\n  lds_config:\n    resource_api_version: V3\n    path_config_source:\n      \
             path: {}\n      watched_directory: {{ path: {} }}\n",
            lds_literal(&lds_dir.join("lds.yaml")),
            lds_literal(&lds_dir),
        );
        let boot_path = dir.path().join("envoy-lds.yaml");
        fs::write(&boot_path, bootstrap).unwrap_or_else(|e| panic!("{e}"));
        write_listener(dir.path(), &lds_dir, &old_listener, 1, wasm);
        let log_path = dir.path().join("envoy.log");
        let log = fs::File::create(&log_path).unwrap_or_else(|e| panic!("envoy.log: {e}"));
        let log2 = log.try_clone().unwrap_or_else(|e| panic!("envoy.log: {e}"));
        let child = Command::new(envoy_bin())
            .arg("-c")
            .arg(&boot_path)
            .args(["--concurrency", &opts.concurrency.to_string()])
            .arg("--disable-hot-restart")
            .args(["-l", "warning", "--component-log-level", "wasm:info"])
            .args(["--drain-time-s", "10", "--drain-strategy", "immediate"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log2))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn envoy: {e}"));
        let mut me = LdsEnvoy {
            port: boot.port,
            admin_port: boot.admin_port,
            child,
            lds_dir,
            listener,
            old_listener,
            log_path,
            generation: 1,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok(Some(s)) = me.child.try_wait() {
                panic!("envoy exited ({s}) before ready:\n{}", me.log());
            }
            if me.listeners_ready() {
                return me;
            }
            assert!(
                Instant::now() < deadline,
                "envoy not ready after 90 s:\n{}",
                me.log()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Replaces the listener by one naming `wasm` (with the configuration of its release: `old`);
    /// waits (bounded) until Envoy accepted it.
    fn reload(&mut self, wasm: &Path, old: bool) {
        let before = self.stat("listener_manager.lds.update_success");
        self.generation += 1;
        let listener = if old {
            &self.old_listener
        } else {
            &self.listener
        };
        write_listener(
            self.dir.path(),
            &self.lds_dir,
            listener,
            self.generation,
            wasm,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.stat("listener_manager.lds.update_success") <= before {
            assert!(
                self.stat("listener_manager.lds.update_rejected") == 0,
                "Envoy rejected the new listener:\n{}",
                self.log()
            );
            assert!(
                Instant::now() < deadline,
                "the listener update was not applied within 30 s:\n{}",
                self.log()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn listeners_ready(&self) -> bool {
        http::get(self.admin_port, "/ready", &[])
            .map(|r| r.status == 200 && r.text().trim() == "LIVE")
            .unwrap_or(false)
            && self.stat("listener_manager.total_listeners_active") >= 1
    }

    fn stats(&self) -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        let Ok(r) = http::get(self.admin_port, "/stats?format=json", &[]) else {
            return out;
        };
        let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        for s in v["stats"].as_array().into_iter().flatten() {
            if let (Some(n), Some(x)) = (s["name"].as_str(), s["value"].as_u64()) {
                out.insert(n.to_string(), x);
            }
        }
        out
    }

    fn stat(&self, name: &str) -> u64 {
        let s = self.stats();
        s.get(name)
            .or_else(|| s.get(&format!("wasmcustom.{name}")))
            .copied()
            .unwrap_or(0)
    }

    fn log(&self) -> String {
        fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// How many VMs logged `tokengate <version> (` at start.
    fn starts(&self, version: &str) -> usize {
        let needle = format!("tokengate {version} (");
        self.log()
            .lines()
            .filter(|l| l.contains(&needle) && l.contains("starting"))
            .count()
    }
}

/// Writes `listener` naming `wasm` (a private copy per generation) into a temp file of the watched
/// directory `lds_dir`, then moves it over lds.yaml: Envoy reloads on the move.
fn write_listener(dir: &Path, lds_dir: &Path, listener: &str, generation: u32, wasm: &Path) {
    let copy = dir.join(format!("module-{generation}.wasm"));
    fs::copy(wasm, &copy).unwrap_or_else(|e| panic!("copy {}: {e}", wasm.display()));
    let text = "resources:\n".to_string()
        + &listener.replace(
            "{{WASM}}",
            &Value::String(copy.display().to_string()).to_string(),
        );
    let tmp = lds_dir.join(format!(".lds-{generation}.yaml"));
    fs::write(&tmp, text).unwrap_or_else(|e| panic!("{e}"));
    fs::rename(&tmp, lds_dir.join("lds.yaml")).unwrap_or_else(|e| panic!("{e}"));
}

impl Drop for LdsEnvoy {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One Envoy (2 workers) on the previous release; under load its listener is replaced by one naming the
/// current build at a quarter of the run, and rolled back 4 s after the new listener took over.
fn reload_under_load(n: usize, clients: usize, secs: u64) {
    let _serial = serial();
    let v = versions();
    let redis = RedisServer::start();
    let webdis = Webdis::start(redis.port);
    let mock = mock_provider!();
    let plan = plan(n);
    let opts = EnvoyOpts::new(mock.port, plan.plugin_config())
        .webdis(webdis.port)
        .concurrency(2);
    let mut envoy = LdsEnvoy::start(&opts, &v.old);
    let old_starts = envoy.starts(OLD_VERSION);
    let spec = plan.load(vec![envoy.port], clients, Duration::from_secs(secs));
    // The upgrade at a quarter of the run, the rollback 4 s after the new listener took over. A listener
    // update counts once Envoy compiled the new module and warmed the listener (5-7 s measured under this
    // load on a 2-core machine, up to 10 s with 12 clients; the rollback is quicker when the old VM is
    // still alive, draining); the
    // listener it replaces serves meanwhile.
    let quarter = Duration::from_secs(secs) / 4;
    let (load, (upgrade, rollback)) = run_load(&spec, |start| {
        thread::sleep(quarter.saturating_sub(start.elapsed()));
        let t0 = start.elapsed();
        envoy.reload(&v.new, false);
        let up = start.elapsed();
        thread::sleep(Duration::from_secs(4));
        let t1 = start.elapsed();
        envoy.reload(&v.old, true);
        ((t0, up), (t1, start.elapsed()))
    });
    let (after_upgrade, after_rollback) = (upgrade.1, rollback.1);
    let outcome = fleet::verify(
        &plan,
        &redis,
        &provider_view(&load, &mock),
        Duration::from_secs(20),
    );
    let new_starts = envoy.starts(&v.new_version);
    let old_starts_end = envoy.starts(OLD_VERSION);
    println!(
        "listener replaced: v{} asked at {:.1} s, serving at {:.1} s; back to v{OLD_VERSION} asked at \
         {:.1} s, serving at {:.1} s; VMs started: v{OLD_VERSION} {old_starts} at start, {old_starts_end} \
         in all, v{} {new_starts}; LDS updates {}",
        v.new_version,
        upgrade.0.as_secs_f64(),
        upgrade.1.as_secs_f64(),
        rollback.0.as_secs_f64(),
        rollback.1.as_secs_f64(),
        v.new_version,
        envoy.stat("listener_manager.lds.update_success"),
    );
    let log = envoy.log();
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("panicked") || l.contains("Wasm VM failed") || l.contains("wasm trap")
        })
        .collect();
    assert!(bad.is_empty(), "filter failure:\n{}", bad.join("\n"));
    if std::env::var_os("UPGRADE_NEW_WASM").is_none() && v.new_version != OLD_VERSION {
        assert!(
            new_starts > 0,
            "no VM of v{} started after the reload:\n{log}",
            v.new_version
        );
    }
    // Served both before and after each reload.
    let served = load.windows("served");
    assert!(
        served.first().is_some_and(|w| w.0 < quarter)
            && served
                .last()
                .is_some_and(|w| w.1 > after_rollback + fleet::SLOT),
        "requests were served before the upgrade, after it (at {after_upgrade:?}) and after the \
         rollback (at {after_rollback:?}; a slower reload needs a longer run): {served:?}"
    );
    let counters: Vec<(String, u64)> = MUST_BE_ZERO
        .iter()
        .map(|c| (c.to_string(), envoy.stat(c)))
        .collect();
    check(
        &format!(
            "one Envoy reloaded v{OLD_VERSION} -> v{} -> v{OLD_VERSION} under load",
            v.new_version
        ),
        &load,
        &outcome,
        &counters,
    );
}

#[test]
fn old_and_new_envoys_share_redis_under_load() {
    two_versions(20, 6, 8);
}

#[test]
fn a_config_reload_replaces_the_vm_under_load() {
    // 60 s: on a loaded 2-core host a reload took up to 14 s (Envoy compiles the 2 MB module for each
    // worker); the upgrade comes at 15 s, the rollback 4 s after the new listener serves, and requests
    // must be served after it.
    reload_under_load(20, 6, 60);
}

#[test]
#[ignore = "long: make fleet"]
fn old_and_new_envoys_share_redis_under_load_long() {
    two_versions(100, 12, fleet_secs());
}

#[test]
#[ignore = "long: make fleet"]
fn a_config_reload_replaces_the_vm_under_load_long() {
    reload_under_load(100, 12, fleet_secs().max(45));
}
