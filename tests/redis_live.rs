//! The Lua scripts of quotas and global buckets against a real `redis-server` behind a real Webdis,
//! started on free loopback ports by the `wasm-test` harness ([`RedisServer`], [`Webdis`]): the request
//! bodies the library builds, what Redis does with them, and how the library reads the answers.
//!
//! Why here and not in `wasm-test/tests/`: these tests call the library's pure API (body builders and
//! reply parsers) directly, so they need the `tokengate` crate; `wasm-test` deliberately does not depend
//! on it (its Envoy tests must compile while the filter does not). So this is an integration test of the
//! `tokengate` crate that borrows the harness's launchers (`wasm-test` is a dev-dependency: nothing of it
//! reaches the `.wasm`).
//!
//! When `redis-server` or `webdis` is not installed the tests are skipped with a message, except on CI
//! (`CI` set), where that is a failure. Every process is killed by PID when its guard drops.

use std::path::Path;
use tokengate::global::{
    argv, charge_request, lease_argv, parse_reply, LeaseAsk, Reply, SCRIPT, SHA1,
};
use tokengate::limits::bucket::{self, BucketParams, BucketState, Verdict};
use tokengate::quota::*;
use tokengate::shim::webdis::{command_body, ScriptCall, ShimError, MAX_LUA_INT};
use wasm_test::{http, redis_cmd, RedisServer, RespValue, Webdis};

/// True when `name` (or the path in `$var`) is an executable on `PATH`.
fn installed(var: &str, name: &str) -> bool {
    let bin = std::env::var(var).unwrap_or_else(|_| name.to_string());
    if bin.contains('/') {
        return Path::new(&bin).exists();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(&bin).exists()))
        .unwrap_or(false)
}

/// Redis + Webdis (and optionally an ACL-restricted second Webdis) on their own ports.
struct Stack {
    webdis: Vec<Webdis>,
    redis: Option<RedisServer>,
    redis_port: u16,
    client: std::cell::RefCell<http::Client>,
}

impl Stack {
    /// Starts Redis and Webdis; `None` (test skipped) when either is not installed, outside CI.
    fn start() -> Option<Stack> {
        if !installed("REDIS_SERVER", "redis-server") || !installed("WEBDIS_BIN", "webdis") {
            assert!(
                std::env::var_os("CI").is_none(),
                "redis-server or webdis not installed (scripts/deps.sh installs them)"
            );
            eprintln!("SKIPPED: redis-server or webdis not installed");
            return None;
        }
        let redis = RedisServer::start();
        let webdis = Webdis::start(redis.port);
        Some(Stack {
            client: std::cell::RefCell::new(http::Client::new(webdis.port)),
            redis_port: redis.port,
            webdis: vec![webdis],
            redis: Some(redis),
        })
    }

    /// A second Webdis whose ACL disables EVAL and EVALSHA; returns its port.
    fn start_acl_webdis(&mut self) -> u16 {
        let w = Webdis::start_with(
            self.redis_port,
            &serde_json::json!({"acl": [{"disabled": ["EVAL", "EVALSHA"]}]}),
        );
        let port = w.port;
        self.webdis.push(w);
        port
    }

    /// Kills redis-server (by PID); Webdis keeps running.
    fn stop_redis(&mut self) {
        self.redis = None;
    }

    /// Runs a Redis command; returns the reply as `redis-cli` prints it when piped (integers and
    /// strings bare, nil as an empty line, arrays one element a line, errors as their text).
    fn cli(&self, args: &[&str]) -> String {
        fn text(v: &RespValue) -> String {
            match v {
                RespValue::Simple(s) | RespValue::Error(s) => s.clone(),
                RespValue::Int(i) => i.to_string(),
                RespValue::Bulk(b) => {
                    String::from_utf8_lossy(b.as_deref().unwrap_or_default()).into()
                }
                RespValue::Array(a) => a
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .map(text)
                    .collect::<Vec<_>>()
                    .join("\n"),
            }
        }
        let reply = redis_cmd(self.redis_port, args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        text(&reply).trim().to_string()
    }

    /// `POST /` to Webdis with `body` on a kept-alive connection; returns (status, body).
    fn post(&self, body: &str) -> (u32, Vec<u8>) {
        post_with(&mut self.client.borrow_mut(), body)
    }
}

fn post_with(client: &mut http::Client, body: &str) -> (u32, Vec<u8>) {
    let r = client
        .post("/", &[], body.as_bytes())
        .unwrap_or_else(|e| panic!("POST / to webdis: {e}"));
    (u32::from(r.status), r.body)
}

/// `POST /` to the Webdis on `port`.
fn post_to(port: u16, body: &str) -> (u32, Vec<u8>) {
    post_with(&mut http::Client::new(port), body)
}

/// Monthly quota scripts (reserve v3, settle v3).
mod quota {
    use super::*;

    fn reserve(st: &Stack, a: &ReserveArgs) -> Result<ReserveReply, ShimError> {
        let (s, b) = st.post(&reserve_request(a, ScriptCall::Eval));
        parse_reserve_reply(s, &b)
    }

    fn settle(st: &Stack, batch: &[&SettleArgs]) -> Result<Vec<i64>, ShimError> {
        let (code, b) = st.post(&settle_request(batch, ScriptCall::Eval));
        parse_settle_reply(code, &b, batch.len())
    }

    /// The reservation most tests start from: 100 + 50 tokens of a 1000 limit.
    fn base() -> ReserveArgs {
        ReserveArgs {
            tenant: "acme".into(),
            model: Some("gpt-4.1".into()),
            month: "2026-11".into(),
            request_id: "req-1".into(),
            prompt_cost: 100,
            output_cost: 50,
            default_limit: 1000,
            default_model_limit: 0,
            expire_at_unix: 1_796_688_000,
            deadline_s: 600,
            clamp_output: false,
            min_output_cost: 0,
            lease_owner: "-".into(),
        }
    }

    fn with_id(id: &str) -> ReserveArgs {
        ReserveArgs {
            request_id: id.into(),
            ..base()
        }
    }

    fn entry(a: &ReserveArgs, mode: SettleMode, actual: u64) -> SettleArgs {
        SettleArgs {
            keys: a.keys(),
            mode,
            actual,
            expire_at_unix: a.expire_at_unix,
            tokens_in: actual / 3,
            tokens_out: actual - actual / 3,
        }
    }

    /// The input/output split of `a`'s month: `(in, out, in:<model>, out:<model>)` ("" when absent).
    fn io(st: &Stack, a: &ReserveArgs) -> [String; 4] {
        let k = a.keys().io();
        let m = a.model.clone().unwrap_or_default();
        [
            "in".to_string(),
            "out".into(),
            format!("in:{m}"),
            format!("out:{m}"),
        ]
        .map(|f| st.cli(&["HGET", &k, &f]))
    }

    fn used(st: &Stack, a: &ReserveArgs) -> (String, String) {
        let k = a.keys();
        (
            st.cli(&["GET", &k.used_total]),
            st.cli(&["GET", &k.used_model]),
        )
    }

    /// A lease call of this Envoy (`L|1|-|2026-11`) for tenant `acme` (limit 50,000), wanting `want`.
    fn lease(st: &Stack, want: u64, share: u32) -> LeaseReply {
        lease_to(st, 0, want, None, share)
    }

    /// [`lease`] reporting `reported_total`, with a `target` to shrink to.
    fn lease_to(
        st: &Stack,
        reported_total: u64,
        want: u64,
        target: Option<u64>,
        share: u32,
    ) -> LeaseReply {
        let a = LeaseArgs {
            keys: QuotaKeys::new("acme", None, "2026-11", "-"),
            lease_id: lease_id(1, None, "2026-11"),
            reported_total,
            want,
            target,
            default_limit: 50_000,
            default_model_limit: 0,
            expire_at_unix: 1_796_688_000,
            ttl_s: 60,
            max_grant: want,
            max_share_percent: share,
            tokens_in: 0,
            tokens_out: 0,
        };
        let (s, b) = st.post(&lease_request(&a, ScriptCall::Eval));
        parse_lease_reply(s, &b).unwrap()
    }

    /// A reservation of `prompt` tokens and no output for `tenant` (× `model`) under the default
    /// limits `(tenant, model)` (model 0: none).
    fn prompt_of(
        tenant: &str,
        model: Option<&str>,
        limits: (u64, u64),
        prompt: u64,
    ) -> ReserveArgs {
        ReserveArgs {
            tenant: tenant.into(),
            model: model.map(Into::into),
            default_limit: limits.0,
            default_model_limit: limits.1,
            prompt_cost: prompt,
            output_cost: 0,
            ..base()
        }
    }

    /// A lease of Envoy `envoy` for `tenant` (× `model`), limit `limit`, wanting `want`.
    fn lease_of(
        st: &Stack,
        envoy: u64,
        tenant: &str,
        model: Option<&str>,
        limit: u64,
        want: u64,
    ) -> LeaseReply {
        let a = LeaseArgs {
            keys: QuotaKeys::new(tenant, model, "2026-11", "-"),
            lease_id: lease_id(envoy, model, "2026-11"),
            reported_total: 0,
            want,
            target: None,
            default_limit: limit,
            default_model_limit: 0,
            expire_at_unix: 1_796_688_000,
            ttl_s: 60,
            max_grant: want,
            max_share_percent: 100,
            tokens_in: 0,
            tokens_out: 0,
        };
        let (s, b) = st.post(&lease_request(&a, ScriptCall::Eval));
        parse_lease_reply(s, &b).unwrap()
    }

    #[test]
    fn a_refusal_reports_what_other_envoys_leases_would_add_to_what_is_left() {
        // An Envoy refused for quota that other Envoys' leases hold answers a retryable 429.
        let Some(st) = Stack::start() else { return };
        assert_eq!(lease(&st, 4_000, 100).held, 4_000);
        let big = ReserveArgs {
            model: None,
            prompt_cost: 47_000,
            output_cost: 0,
            default_limit: 50_000,
            ..base()
        };
        let r = reserve(&st, &big).unwrap();
        assert!(!r.allowed);
        assert_eq!((r.remaining(), r.held_elsewhere), (46_000, 4_000));
        // Review: the Envoy holding that lease (1) is told of none: its own leases of any model
        // are not elsewhere.
        let own = ReserveArgs {
            request_id: "req-own".into(),
            lease_owner: lease_owner(1),
            ..big.clone()
        };
        let r = reserve(&st, &own).unwrap();
        assert_eq!((r.allowed, r.held_elsewhere), (false, 0));
        // Given back: nothing leased, and the request fits.
        lease_to(&st, 0, 0, Some(0), 100);
        let r = reserve(
            &st,
            &ReserveArgs {
                request_id: "req-3".into(),
                ..big
            },
        )
        .unwrap();
        assert!(r.allowed, "{r:?}");
    }

    #[test]
    fn a_refusal_of_an_account_over_its_limit_reports_growth_from_zero_and_any_lease_elsewhere() {
        // Review: 1,050 used of 1,000 (100 of it in another Envoy's lease) reported a growth of 100,
        // deficit included: a request of 80 got a retry that its lease coming back (50 left) refuses.
        let Some(st) = Stack::start() else { return };
        assert_eq!(lease_of(&st, 2, "gamma", None, 1_000, 100).held, 100);
        let a = prompt_of("gamma", None, (1_000, 0), 80);
        st.cli(&["INCRBY", &a.keys().used_total, "950"]);
        let r = reserve(&st, &a).unwrap();
        assert_eq!(
            (r.allowed, r.held_elsewhere, r.leases_elsewhere),
            (false, 50, true)
        );
        // A tie of tenant and model (both spent), the other Envoy's lease of another model: no
        // growth for this model, but leases elsewhere (no exhausted marker).
        assert_eq!(lease_of(&st, 3, "delta", Some("b"), 1_000, 500).held, 500);
        let t = ReserveArgs {
            request_id: "req-tie".into(),
            ..prompt_of("delta", Some("a"), (1_000, 500), 10)
        };
        st.cli(&["INCRBY", &t.keys().used_total, "500"]);
        st.cli(&["INCRBY", &t.keys().used_model, "500"]);
        let r = reserve(&st, &t).unwrap();
        assert_eq!(
            (
                r.allowed,
                r.remaining(),
                r.held_elsewhere,
                r.leases_elsewhere
            ),
            (false, 0, 0, true)
        );
    }

    #[test]
    fn a_tenant_refusal_counts_other_leases_only_up_to_the_models_own_limit() {
        // Review: a tenant-limit refusal reported every lease on the tenant's counter, though the
        // model's own limit would refuse the request once they went back: a retry that never passes.
        let Some(st) = Stack::start() else { return };
        // Envoy 2 leases 10,000 of model b; 7,000 more used: 3,000 of 20,000 left for the tenant.
        assert_eq!(
            lease_of(&st, 2, "beta", Some("b"), 20_000, 10_000).held,
            10_000
        );
        let a = prompt_of("beta", Some("a"), (20_000, 4_000), 5_000);
        st.cli(&["INCRBY", &a.keys().used_total, "7000"]);
        let r = reserve(&st, &a).unwrap();
        assert_eq!(
            (r.allowed, r.reason, r.remaining()),
            (false, Reason::TenantLimit, 3_000)
        );
        // With the lease back, 13,000 for the tenant but 4,000 for model a: it grows by 1,000.
        assert_eq!(r.held_elsewhere, 1_000);
        // Model b's own requests can use all of it: a tenant × model lease counts for its model.
        let b = ReserveArgs {
            request_id: "req-b".into(),
            model: Some("b".into()),
            default_model_limit: 0,
            ..a
        };
        let r = reserve(&st, &b).unwrap();
        assert_eq!((r.allowed, r.held_elsewhere), (false, 10_000));
    }

    #[test]
    fn a_lease_given_back_and_taken_again_goes_on_from_its_version() {
        // The Envoy takes a reply with a version at most the last it applied for a stale one: a
        // version that went back to 1 after a give-back made it ignore its next leases.
        let Some(st) = Stack::start() else { return };
        let mut last = 0;
        for round in 0..3 {
            let r = lease(&st, 1_000, 10);
            assert_eq!(r.held, 1_000, "round {round}");
            assert!(
                r.version > last,
                "round {round}: {} after {last}",
                r.version
            );
            let r = lease_to(&st, 0, 0, Some(0), 10);
            assert_eq!(r.held, 0);
            assert!(r.version > last);
            last = r.version;
        }
    }

    #[test]
    fn a_lease_given_back_keeps_a_reported_total_of_two_to_the_fifty_and_more_exact() {
        // Budgets count micro-units: a lease's reported total can pass 1e14, which Lua's `..` wrote
        // as `1e+14` in the tombstone, read back as 0 (the whole total counted again).
        let Some(st) = Stack::start() else { return };
        st.cli(&["SET", "tg:q:{acme}:limit", &(1u64 << 52).to_string()]);
        let total = (1u64 << 50) + 7;
        lease_to(&st, 0, 1_000, None, 100);
        // Reports the total (taken from the lease, the rest added), then gives the lease back.
        let r = lease_to(&st, total, 0, Some(0), 100);
        assert_eq!((r.held, r.reported_total, r.used), (0, total, total));
        // The same total reported again after the give-back counts nothing twice.
        let r = lease_to(&st, total, 1_000, None, 100);
        assert_eq!((r.reported_total, r.used), (total, total + 1_000));
    }

    const LEASE_V1_SHA1: &str = "49048e436ac6bd2d5f2870884173bbaec690cb65";

    /// 0.1.0's lease script (v1: 9 keys, 14 arguments, no split), as its kept module holds it.
    fn lease_v1_script(st: &Stack) -> String {
        let b =
            std::fs::read(wasm_test::repo_root().join("wasm-test/artefacts/tokengate-v0.1.0.wasm"))
                .expect("the kept v0.1.0 module");
        let start = b
            .windows(21)
            .position(|w| w == b"-- tokengate lease v1")
            .expect("v1 lease script in the module");
        let tail: &[u8] = b"return {o, used, lim, mused, mlim, ver, r}\n";
        let len = b[start..]
            .windows(tail.len())
            .position(|w| w == tail)
            .expect("its end")
            + tail.len();
        let text = String::from_utf8(b[start..start + len].to_vec()).unwrap();
        assert_eq!(
            st.cli(&["SCRIPT", "LOAD", &text]),
            LEASE_V1_SHA1,
            "0.1.0's lease script"
        );
        text
    }

    #[test]
    fn a_lease_adds_only_what_its_input_output_totals_grew_by_and_a_resend_adds_nothing() {
        let Some(st) = Stack::start() else { return };
        let keys = QuotaKeys::new("acme", Some("gpt-4.1"), "2026-11", "-");
        let io_key = keys.io();
        let call = |envoy: u64, reported_total: u64, target: Option<u64>, io: (u64, u64)| {
            let a = LeaseArgs {
                keys: keys.clone(),
                lease_id: lease_id(envoy, Some("gpt-4.1"), "2026-11"),
                reported_total,
                want: 1_000,
                target,
                default_limit: 50_000,
                default_model_limit: 0,
                expire_at_unix: 1_796_688_000,
                ttl_s: 60,
                max_grant: 1_000,
                max_share_percent: 100,
                tokens_in: io.0,
                tokens_out: io.1,
            };
            let (s, b) = st.post(&lease_request(&a, ScriptCall::Eval));
            parse_lease_reply(s, &b).unwrap()
        };
        let split =
            || ["in", "out", "in:gpt-4.1", "out:gpt-4.1"].map(|f| st.cli(&["HGET", &io_key, f]));
        let field = |envoy: u64| {
            st.cli(&[
                "HGET",
                &io_key,
                &lease_id(envoy, Some("gpt-4.1"), "2026-11"),
            ])
        };
        // A first lease with nothing to report writes no hash.
        assert_eq!(call(1, 0, None, (0, 0)).tokens_io, (0, 0));
        assert_eq!(st.cli(&["EXISTS", &io_key]), "0");
        // Reported: added to the account and its model, the lease's field holds what was taken.
        let r = call(1, 100, None, (70, 30));
        assert_eq!((r.reported_total, r.tokens_io), (100, (70, 30)));
        assert_eq!(split(), ["70", "30", "70", "30"]);
        assert_eq!(field(1), "70 30");
        // The same call sent again, and a lower (older) one: nothing added.
        assert_eq!(call(1, 100, None, (70, 30)).tokens_io, (70, 30));
        assert_eq!(call(1, 100, None, (60, 10)).tokens_io, (70, 30));
        assert_eq!(split(), ["70", "30", "70", "30"]);
        // Only what grew: 20 in, nothing out.
        assert_eq!(call(1, 150, None, (90, 30)).tokens_io, (90, 30));
        assert_eq!(split(), ["90", "30", "90", "30"]);
        // Another Envoy's lease of the account adds its own.
        assert_eq!(call(2, 10, None, (5, 5)).tokens_io, (5, 5));
        assert_eq!(split(), ["95", "35", "95", "35"]);
        // A settlement per request adds to the same hash.
        let req = ReserveArgs {
            default_limit: 50_000,
            ..with_id("req-io")
        };
        assert!(reserve(&st, &req).unwrap().allowed);
        let mut e = entry(&req, SettleMode::Settle, 30);
        e.tokens_in = 10;
        e.tokens_out = 20;
        assert_eq!(settle(&st, &[&e]).unwrap(), vec![1]);
        assert_eq!(split(), ["105", "55", "105", "55"]);
        // Given back with what is left to report: added; the field outlives the lease, so the
        // same totals reported once the lease is taken again add nothing.
        let r = call(1, 200, Some(0), (100, 40));
        assert_eq!((r.held, r.tokens_io), (0, (100, 40)));
        assert_eq!(
            st.cli(&[
                "HEXISTS",
                &keys.leases,
                &lease_id(1, Some("gpt-4.1"), "2026-11")
            ]),
            "0"
        );
        assert_eq!(split(), ["115", "65", "115", "65"]);
        assert_eq!(call(1, 200, None, (100, 40)).tokens_io, (100, 40));
        assert_eq!(split(), ["115", "65", "115", "65"]);
        // The hash expires with the counters.
        assert_eq!(st.cli(&["EXPIRETIME", &io_key]), "1796688000");
        // 0.1.0's script on the same lease (a VM of the old module in the same Envoy, mid-reload):
        // it reports its weighted total, leaves the hash alone, and the new script's next call goes
        // on from both.
        let v1 = lease_v1_script(&st);
        let k = &keys;
        let v1_keys = [
            k.used_total.as_str(),
            k.used_model.as_str(),
            k.limit_override.as_str(),
            k.limit_model_override.as_str(),
            k.leases.as_str(),
            k.due.as_str(),
            k.done.as_str(),
            k.gone.as_str(),
            k.open.as_str(),
        ];
        let v1_args: Vec<String> = [
            lease_id(1, Some("gpt-4.1"), "2026-11"),
            "260".into(),
            "1000".into(),
            "-1".into(),
            "50000".into(),
            "0".into(),
            "1796688000".into(),
            "60".into(),
            "1".into(),
            "3600".into(),
            "1000".into(),
            "86400".into(),
            "tg3".into(),
            "100".into(),
        ]
        .into();
        let sha = LEASE_V1_SHA1;
        let v1_call = || {
            st.post(&command_body(
                ScriptCall::Eval,
                &v1,
                sha,
                &v1_keys,
                &v1_args,
            ))
        };
        let (s, b) = v1_call();
        assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
        let old: Vec<i64> = serde_json::from_slice::<serde_json::Value>(&b).unwrap()["EVAL"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        assert_eq!(old.len(), 7);
        assert_eq!(old[6], 260, "v1 took the weighted total");
        assert_eq!(split(), ["115", "65", "115", "65"]);
        let r = call(1, 260, None, (130, 50));
        assert_eq!((r.reported_total, r.tokens_io), (260, (130, 50)));
        assert_eq!(split(), ["145", "75", "145", "75"]);
        // v1 still reads the record v2 wrote (its end-anchored pattern: nothing appended to it).
        let (s, b) = v1_call();
        assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
        // A field that is not two counts is left alone, and the call goes on.
        st.cli(&[
            "HSET",
            &io_key,
            &lease_id(3, Some("gpt-4.1"), "2026-11"),
            "junk",
        ]);
        let r = call(3, 5, None, (9, 9));
        assert_eq!((r.reported_total, r.tokens_io), (5, (0, 0)));
        assert_eq!(split(), ["145", "75", "145", "75"]);
    }

    #[test]
    fn a_lease_holds_at_most_its_share_of_what_is_left() {
        // bb12: a first lease sized from one request (4 × 9,010) took 36,040 of the 50,000 left.
        let Some(st) = Stack::start() else { return };
        st.cli(&["SET", "tg:q:{acme}:2026-11", "10000"]);
        let r = lease(&st, 36_040, 10);
        // 10 % of the 40,000 left.
        assert_eq!((r.held, r.used), (4_000, 14_000));
        // Growing again: 10 % of what is left with the lease counted as left (36,000 + 4,000).
        let r = lease(&st, 36_040, 10);
        assert_eq!(r.held, 4_000);
        // A larger share lets it grow, never beyond what is left.
        let r = lease(&st, 36_040, 50);
        assert_eq!((r.held, r.used), (20_000, 30_000));
        let r = lease(&st, 80_000, 100);
        assert_eq!((r.held, r.used), (40_000, 50_000));
    }

    #[test]
    fn script_sha1_constants_match_what_redis_script_load_returns() {
        let Some(st) = Stack::start() else { return };
        assert_eq!(st.cli(&["SCRIPT", "LOAD", RESERVE_SCRIPT]), RESERVE_SHA1);
        assert_eq!(st.cli(&["SCRIPT", "LOAD", SETTLE_SCRIPT]), SETTLE_SHA1);
        assert_eq!(st.cli(&["SCRIPT", "LOAD", LEASE_SCRIPT]), LEASE_SHA1);
        assert_eq!(
            st.cli(&[
                "SCRIPT",
                "LOAD",
                tokengate::quota::scripts::SETTLE_BATCH_SCRIPT
            ]),
            tokengate::quota::scripts::SETTLE_BATCH_SHA1
        );
    }

    /// Every `tg:*` key of a Redis, with its value (hash fields and sorted-set members sorted; scores,
    /// which hold Redis' clock, left out).
    fn dump(st: &Stack) -> Vec<(String, String)> {
        let mut keys: Vec<String> = st
            .cli(&["KEYS", "tg:*"])
            .lines()
            .map(str::to_string)
            .collect();
        keys.sort();
        keys.into_iter()
            .map(|k| {
                let v = match st.cli(&["TYPE", &k]).as_str() {
                    "string" => st.cli(&["GET", &k]),
                    "hash" => {
                        let all = st.cli(&["HGETALL", &k]);
                        let l: Vec<&str> = all.lines().collect();
                        let mut pairs: Vec<String> = l.chunks(2).map(|p| p.join("=")).collect();
                        pairs.sort();
                        pairs.join(",")
                    }
                    "zset" => {
                        let mut m: Vec<String> = st
                            .cli(&["ZRANGE", &k, "0", "-1"])
                            .lines()
                            .map(str::to_string)
                            .collect();
                        m.sort();
                        m.join(",")
                    }
                    t => format!("type {t}"),
                };
                (k, v)
            })
            .collect()
    }

    #[test]
    fn a_settlement_batch_of_many_tenants_does_in_one_call_what_per_tenant_calls_do() {
        use tokengate::quota::scripts::{
            settle_batch_request, SETTLE_BATCH_SCRIPT, SETTLE_BATCH_SHA1,
        };
        use tokengate::quota::settlement::{parse_settle_batch_reply, GroupOutcome};
        let (Some(alone), Some(batched)) = (Stack::start(), Stack::start()) else {
            return;
        };
        assert_eq!(
            batched.cli(&["SCRIPT", "LOAD", SETTLE_BATCH_SCRIPT]),
            SETTLE_BATCH_SHA1
        );
        // 40 tenants, two reservations each, on both Redis.
        let n = 40;
        let res = |i: usize, r: &str| ReserveArgs {
            tenant: format!("t{i}"),
            request_id: format!("{r}{i}"),
            ..base()
        };
        for st in [&alone, &batched] {
            for i in 0..n {
                for r in ["a", "b"] {
                    assert!(reserve(st, &res(i, r)).unwrap().allowed);
                }
            }
            // Tenant 7's `open` is not a hash: Redis fails its settlements.
            st.cli(&["DEL", &res(7, "a").keys().open]);
            st.cli(&["SET", &res(7, "a").keys().open, "x"]);
        }
        // Per tenant: settle a below its reservation, b above, charge a request never reserved, and
        // settle a again (nothing to do); tenant 0 also has a second group (its charge again).
        let mut groups: Vec<Vec<SettleArgs>> = (0..n)
            .map(|i| {
                vec![
                    entry(&res(i, "a"), SettleMode::Settle, 10),
                    entry(&res(i, "b"), SettleMode::Settle, 200),
                    entry(&res(i, "c"), SettleMode::Charge, 7),
                    entry(&res(i, "a"), SettleMode::Settle, 10),
                ]
            })
            .collect();
        groups.push(vec![entry(&res(0, "c"), SettleMode::Charge, 7)]);
        // Alone: one call per group.
        let mut flags_alone = Vec::new();
        for (i, g) in groups.iter().enumerate() {
            let refs: Vec<&SettleArgs> = g.iter().collect();
            match settle(&alone, &refs) {
                Ok(f) => flags_alone.push(Some(f)),
                Err(ShimError::RedisError(e)) if i == 7 => {
                    assert!(e.contains("WRONGTYPE"), "{e}");
                    flags_alone.push(None);
                }
                Err(e) => panic!("group {i}: {e}"),
            }
        }
        // Batched: every group in one call.
        let refs: Vec<Vec<&SettleArgs>> = groups.iter().map(|g| g.iter().collect()).collect();
        let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
        let before = batched.cli(&["INFO", "commandstats"]);
        assert!(!before.contains("cmdstat_evalsha:"), "{before}");
        let (code, body) = batched.post(&settle_batch_request(&refs, ScriptCall::EvalSha));
        let outcomes = parse_settle_batch_reply(code, &body, &sizes).unwrap();
        assert_eq!(outcomes.len(), groups.len());
        for (i, (o, a)) in outcomes.iter().zip(&flags_alone).enumerate() {
            match a {
                Some(f) => assert_eq!(o, &GroupOutcome::Ran(f.clone()), "group {i}"),
                // The failed group does not stop the others.
                None => assert_eq!(o, &GroupOutcome::Failed, "group {i}"),
            }
        }
        assert_eq!(flags_alone[0], Some(vec![1, 1, 1, 0]));
        assert_eq!(
            flags_alone[n],
            Some(vec![0]),
            "a charge sent again does nothing"
        );
        // One script call; Redis holds the same keys and values as after the calls per tenant.
        let calls = batched.cli(&["INFO", "commandstats"]);
        assert!(calls.contains("cmdstat_evalsha:calls=1,"), "{calls}");
        let (a, b) = (dump(&alone), dump(&batched));
        assert!(a.len() >= 4 * n, "{}", a.len());
        assert_eq!(a, b);
        assert_eq!(used(&batched, &res(3, "a")), ("217".into(), "217".into()));
        // Sent again whole (a retry): nothing moves but the group Redis fails.
        let (code, body) = batched.post(&settle_batch_request(&refs, ScriptCall::EvalSha));
        let again = parse_settle_batch_reply(code, &body, &sizes).unwrap();
        for (i, o) in again.iter().enumerate() {
            if i == 7 {
                assert_eq!(o, &GroupOutcome::Failed);
            } else {
                assert!(
                    matches!(o, GroupOutcome::Ran(f) if f.iter().all(|x| *x == 0)),
                    "{i}: {o:?}"
                );
            }
        }
        assert_eq!(dump(&batched), b);
        // The script's own checks refuse a malformed call whole.
        let bad = command_body(
            ScriptCall::EvalSha,
            SETTLE_BATCH_SCRIPT,
            SETTLE_BATCH_SHA1,
            &["k1"],
            &["3600".into(), "tg4s:2".into()],
        );
        let (code, body) = batched.post(&bad);
        assert!(matches!(
            parse_settle_batch_reply(code, &body, &[2]),
            Err(ShimError::RedisError(e)) if e.contains("bad argument")
        ));
    }

    #[test]
    fn a_lease_batch_syncs_each_account_as_if_sent_alone_for_many_tenants_in_one_call() {
        use tokengate::quota::lease::batch::*;
        let (Some(alone), Some(batched)) = (Stack::start(), Stack::start()) else {
            return;
        };
        assert_eq!(
            batched.cli(&["SCRIPT", "LOAD", LEASE_BATCH_SCRIPT]),
            LEASE_BATCH_SHA1
        );
        let call = |tenant: &str, model: Option<&str>, reported: u64, want: u64| LeaseArgs {
            keys: QuotaKeys::new(tenant, model, "2026-11", "-"),
            lease_id: lease_id(3, model, "2026-11"),
            reported_total: reported,
            want,
            target: None,
            default_limit: 10_000,
            default_model_limit: 0,
            expire_at_unix: 1_796_688_000,
            ttl_s: 60,
            max_grant: want,
            max_share_percent: 50,
            tokens_in: reported,
            tokens_out: reported / 2,
        };
        // 40 tenants (every third with a model), and tenant 5's counter not a count.
        let round = |reported: u64| -> Vec<LeaseArgs> {
            (0..40)
                .map(|i| {
                    let model = (i % 3 == 0).then_some("m");
                    call(&format!("t{i}"), model, reported * i, 1_000 + i)
                })
                .collect()
        };
        let t5 = QuotaKeys::new("t5", None, "2026-11", "-");
        for st in [&alone, &batched] {
            st.cli(&["SET", &t5.used_total, "x"]);
        }
        let state = |st: &Stack, a: &LeaseArgs| {
            let rec = st.cli(&["HGET", &a.keys.leases, &a.lease_id]);
            // The lease record without its version (the time in ms at a first grant).
            let held_reported: Vec<&str> = rec.split(' ').take(2).collect();
            (
                st.cli(&["GET", &a.keys.used_total]),
                held_reported.join(" "),
                ["in", "out", "in:m", a.lease_id.as_str()]
                    .map(|f| st.cli(&["HGET", &a.keys.io(), f])),
            )
        };
        for (r, reported) in [(0, 0), (1, 10), (2, 10)] {
            let entries = round(reported);
            let refs: Vec<&LeaseArgs> = entries.iter().collect();
            let before = batched.cli(&["INFO", "commandstats"]);
            let (code, body) = batched.post(&lease_batch_request(&refs, ScriptCall::EvalSha));
            let got = parse_lease_batch_reply(code, &body, refs.len()).unwrap();
            let after = batched.cli(&["INFO", "commandstats"]);
            let calls = |s: &str| {
                s.lines()
                    .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
                    .and_then(|l| l.split(',').next())
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            assert_eq!(
                calls(&after),
                calls(&before) + 1,
                "one script call, round {r}"
            );
            assert_eq!(got.len(), 40);
            for (i, (a, g)) in entries.iter().zip(&got).enumerate() {
                let (s, b) = alone.post(&lease_request(a, ScriptCall::Eval));
                let one = parse_lease_reply(s, &b);
                if i == 5 {
                    assert!(
                        matches!(&one, Err(ShimError::RedisError(e)) if e.contains("not a count"))
                    );
                    assert!(
                        matches!(g, Err(ShimError::RedisError(e)) if e.contains("not a count")),
                        "{g:?}"
                    );
                    continue;
                }
                let (one, g) = (one.unwrap(), g.as_ref().unwrap());
                assert_eq!(
                    (
                        g.held,
                        g.used,
                        g.limit,
                        g.model_used,
                        g.model_limit,
                        g.reported_total,
                        g.tokens_io
                    ),
                    (
                        one.held,
                        one.used,
                        one.limit,
                        one.model_used,
                        one.model_limit,
                        one.reported_total,
                        one.tokens_io
                    ),
                    "round {r} entry {i}"
                );
                assert_eq!(state(&alone, a), state(&batched, a), "round {r} entry {i}");
            }
            if r == 2 {
                // Round 2 resends round 1's totals: nothing more is counted.
                let t7 = &entries[7];
                assert_eq!(state(&batched, t7).1, format!("{} 70", 1_007));
                assert_eq!(state(&batched, t7).2[0], "70");
                assert_eq!(state(&batched, t7).2[3], "70 35");
            }
        }
    }

    #[test]
    fn a_batch_reserves_each_entry_as_if_sent_alone_for_many_tenants_in_one_call() {
        use tokengate::quota::batch::*;
        let Some(st) = Stack::start() else { return };
        assert_eq!(
            st.cli(&["SCRIPT", "LOAD", RESERVE_BATCH_SCRIPT]),
            RESERVE_BATCH_SHA1
        );
        // 50 tenants: each one's reservation fits; then tenant 0 again over its limit, a duplicate
        // request id, and tenant 1 once more (fits).
        let mut entries: Vec<ReserveArgs> = (0..50)
            .map(|i| ReserveArgs {
                tenant: format!("t{i}"),
                request_id: format!("r{i}"),
                ..base()
            })
            .collect();
        entries.push(ReserveArgs {
            tenant: "t0".into(),
            request_id: "big".into(),
            prompt_cost: 900,
            ..base()
        });
        entries.push(ReserveArgs {
            tenant: "t2".into(),
            request_id: "r2".into(),
            ..base()
        });
        entries.push(ReserveArgs {
            tenant: "t1".into(),
            request_id: "again".into(),
            ..base()
        });
        let refs: Vec<&ReserveArgs> = entries.iter().collect();
        let (code, body) = st.post(&reserve_batch_request(&refs, ScriptCall::EvalSha));
        let r = parse_reserve_batch_reply(code, &body, refs.len()).unwrap();
        assert_eq!(r.len(), 53);
        for (i, e) in r.iter().take(50).enumerate() {
            let e = e.as_ref().unwrap();
            assert!(e.allowed, "entry {i}");
            assert_eq!(e.used_after, 150);
            if i != 1 {
                assert_eq!(used(&st, &entries[i]), ("150".into(), "150".into()));
            }
        }
        // All or nothing per entry: refused and charged nothing.
        let big = r[50].as_ref().unwrap();
        assert!(!big.allowed && big.reason == Reason::TenantLimit);
        assert_eq!(used(&st, &entries[0]).0, "150");
        // The same request id again: refused as the reservation script refuses it.
        assert_eq!(
            r[51].as_ref().unwrap_err(),
            &ShimError::RedisError(tokengate::shim::webdis::ALREADY_RESERVED.into())
        );
        assert_eq!(used(&st, &entries[2]).0, "150");
        assert_eq!(r[52].as_ref().unwrap().used_after, 300);
        assert_eq!(used(&st, &entries[1]).0, "300");
        // Settled one at a time by the settlement script, exactly.
        let s = entry(&entries[1], SettleMode::Settle, 10);
        assert_eq!(settle(&st, &[&s]).unwrap(), vec![1]);
        assert_eq!(used(&st, &entries[1]).0, "160");
        // One command for the whole batch.
        let calls = st.cli(&["INFO", "commandstats"]);
        assert!(calls.contains("cmdstat_evalsha:calls=1,"), "{calls}");
    }

    #[test]
    fn a_batch_entry_that_fails_in_redis_does_not_stop_the_others() {
        use tokengate::quota::batch::*;
        let Some(st) = Stack::start() else { return };
        let a = ReserveArgs {
            tenant: "bad".into(),
            ..base()
        };
        let b = ReserveArgs {
            tenant: "good".into(),
            ..base()
        };
        // Not a number where the script reads a count; a key of the wrong type where it writes.
        st.cli(&["SET", &a.keys().used_total, "x"]);
        let c = ReserveArgs {
            tenant: "wrongtype".into(),
            ..base()
        };
        st.cli(&["HSET", &c.keys().used_total, "f", "1"]);
        let (code, body) = st.post(&reserve_batch_request(&[&a, &b, &c], ScriptCall::Eval));
        let r = parse_reserve_batch_reply(code, &body, 3).unwrap();
        assert!(!r[0].as_ref().unwrap_err().may_have_run());
        assert!(r[1].as_ref().unwrap().allowed);
        assert!(r[2].as_ref().unwrap_err().may_have_run());
        assert_eq!(used(&st, &b).0, "150");
    }

    #[test]
    fn reservation_through_webdis_charges_both_counters_and_expires_them_at_a_fixed_instant() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        let r = reserve(&st, &a).unwrap();
        assert!(r.allowed);
        assert_eq!((r.used_after, r.limit, r.granted_output), (150, 1000, 50));
        assert_eq!(used(&st, &a), ("150".into(), "150".into()));
        let k = a.keys();
        assert_eq!(st.cli(&["EXPIRETIME", &k.used_total]), "1796688000");
        assert_eq!(st.cli(&["EXPIRETIME", &k.used_model]), "1796688000");
        // The reservation is recorded with its deadline.
        assert_eq!(
            st.cli(&["HGET", &k.open, "req-1"]),
            format!("150 100 {} {}", k.used_total, k.used_model)
        );
        let deadline: i64 = st.cli(&["ZSCORE", &k.due, "req-1"]).parse().unwrap();
        let now: i64 = st.cli(&["TIME"]).lines().next().unwrap().parse().unwrap();
        assert!((deadline - now - 600).abs() <= 2, "{deadline} vs {now}");
    }

    #[test]
    fn reservation_over_the_tenant_limit_is_rejected_and_charges_nothing() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.prompt_cost = 900;
        assert!(reserve(&st, &a).unwrap().allowed);
        let r = reserve(&st, &with_id("req-2")).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.reason, Reason::TenantLimit);
        assert_eq!(r.used_after, 950);
        assert_eq!(used(&st, &a).0, "950");
        assert_eq!(st.cli(&["HEXISTS", &a.keys().open, "req-2"]), "0");
    }

    #[test]
    fn model_limit_rejects_before_the_tenant_limit_and_says_so() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.default_model_limit = 200;
        assert!(reserve(&st, &a).unwrap().allowed);
        let mut b = with_id("r2");
        b.default_model_limit = 200;
        let r = reserve(&st, &b).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.reason, Reason::ModelLimit);
        assert_eq!(r.binding(), (200, 50));
    }

    #[test]
    fn operator_overrides_replace_the_default_limits() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        st.cli(&["SET", &a.keys().limit_override, "100"]);
        let r = reserve(&st, &a).unwrap();
        assert!(!r.allowed);
        assert_eq!(r.limit, 100);
        st.cli(&["SET", &a.keys().limit_override, "5000"]);
        assert_eq!(reserve(&st, &a).unwrap().limit, 5000);
    }

    #[test]
    fn a_corrupt_override_is_a_redis_error_not_a_silent_default() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        st.cli(&["SET", &a.keys().limit_override, "lots"]);
        assert!(matches!(reserve(&st, &a), Err(ShimError::RedisError(_))));
    }

    #[test]
    fn clamping_grants_the_output_that_is_left_when_the_prompt_fits() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.prompt_cost = 800;
        assert!(reserve(&st, &a).unwrap().allowed);
        let mut b = with_id("r2");
        b.clamp_output = true;
        b.output_cost = 500;
        b.min_output_cost = 10;
        let r = reserve(&st, &b).unwrap();
        assert!(r.allowed);
        assert_eq!((r.reason, r.granted_output), (Reason::Clamped, 50));
        assert_eq!(used(&st, &a).0, "1000");
    }

    #[test]
    fn clamping_never_admits_a_prompt_that_does_not_fit() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.prompt_cost = 1001;
        a.clamp_output = true;
        assert!(!reserve(&st, &a).unwrap().allowed);
    }

    #[test]
    fn settlement_replaces_the_reservation_once_and_leaves_nothing_behind() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        reserve(&st, &a).unwrap();
        let s = entry(&a, SettleMode::Settle, 120);
        assert_eq!(settle(&st, &[&s]).unwrap(), vec![1]);
        assert_eq!(used(&st, &a), ("120".into(), "120".into()));
        // A resend does nothing.
        assert_eq!(settle(&st, &[&s]).unwrap(), vec![0]);
        assert_eq!(used(&st, &a).0, "120");
        // Nothing of the request stays in Redis.
        let k = a.keys();
        assert_eq!(st.cli(&["HLEN", &k.open]), "0");
        assert_eq!(st.cli(&["ZCARD", &k.due]), "0");
        assert_eq!(st.cli(&["HLEN", &k.done]), "0");
        // Counters never go below 0.
        reserve(&st, &with_id("r2")).unwrap();
        st.cli(&["SET", &k.used_total, "10"]);
        let z = entry(&with_id("r2"), SettleMode::Settle, 0);
        assert_eq!(settle(&st, &[&z]).unwrap(), vec![1]);
        assert_eq!(used(&st, &a).0, "0");
    }

    #[test]
    fn settlement_without_a_model_touches_only_the_tenant_counter() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.model = None;
        reserve(&st, &a).unwrap();
        assert_eq!(
            settle(&st, &[&entry(&a, SettleMode::Settle, 10)]).unwrap(),
            vec![1]
        );
        assert_eq!(st.cli(&["GET", &a.keys().used_total]), "10");
        assert_eq!(st.cli(&["EXISTS", &a.keys().used_model]), "0");
    }

    #[test]
    fn a_batch_settles_several_requests_of_one_tenant_in_one_call() {
        let Some(st) = Stack::start() else { return };
        let ids: Vec<ReserveArgs> = (0..5).map(|i| with_id(&format!("b{i}"))).collect();
        for a in &ids {
            reserve(&st, a).unwrap();
        }
        assert_eq!(used(&st, &ids[0]).0, "750");
        let entries: Vec<SettleArgs> = ids
            .iter()
            .enumerate()
            .map(|(i, a)| entry(a, SettleMode::Settle, 10 * i as u64))
            .collect();
        let refs: Vec<&SettleArgs> = entries.iter().collect();
        assert_eq!(settle(&st, &refs).unwrap(), vec![1; 5]);
        assert_eq!(used(&st, &ids[0]).0, "100"); // 0 + 10 + 20 + 30 + 40
        assert_eq!(settle(&st, &refs).unwrap(), vec![0; 5]);
    }

    #[test]
    fn a_reservation_never_settled_is_charged_its_prompt_after_its_deadline() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.deadline_s = 1;
        reserve(&st, &a).unwrap();
        assert_eq!(used(&st, &a).0, "150");
        std::thread::sleep(std::time::Duration::from_millis(2100));
        // Any later call of the tenant resolves it: 150 reserved → 100 (the prompt) charged.
        let mut b = with_id("r2");
        b.prompt_cost = 1;
        b.output_cost = 1;
        reserve(&st, &b).unwrap();
        assert_eq!(used(&st, &a), ("102".into(), "102".into()));
        let k = a.keys();
        assert_eq!(st.cli(&["HEXISTS", &k.open, "req-1"]), "0");
        assert!(st.cli(&["HGET", &k.done, "req-1"]).starts_with("S 100 "));
        // A settlement that still arrives applies the difference to its usage, once.
        let s = entry(&a, SettleMode::Settle, 130);
        assert_eq!(settle(&st, &[&s]).unwrap(), vec![1]);
        assert_eq!(used(&st, &a).0, "132");
        assert_eq!(settle(&st, &[&s]).unwrap(), vec![0]);
        assert_eq!(used(&st, &a).0, "132");
    }

    #[test]
    fn a_charge_without_a_reservation_applies_once_and_blocks_a_late_reservation() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        // Admitted while the shim was down (or its reservation timed out): charged its usage.
        let c = entry(&a, SettleMode::Charge, 40);
        assert_eq!(settle(&st, &[&c]).unwrap(), vec![1]);
        assert_eq!(used(&st, &a), ("40".into(), "40".into()));
        assert_eq!(
            settle(&st, &[&c]).unwrap(),
            vec![0],
            "a resend does nothing"
        );
        // The reservation that was in flight reaches Redis late: it does nothing.
        assert!(matches!(reserve(&st, &a), Err(ShimError::RedisError(_))));
        assert_eq!(used(&st, &a).0, "40");
    }

    #[test]
    fn the_input_output_split_is_added_once_per_applied_settlement_and_never_by_the_deadline() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        reserve(&st, &a).unwrap();
        let mut s = entry(&a, SettleMode::Settle, 120);
        (s.tokens_in, s.tokens_out) = (90, 30);
        assert_eq!(settle(&st, &[&s]).unwrap(), vec![1]);
        assert_eq!(io(&st, &a), ["90", "30", "90", "30"]);
        // A resend adds nothing.
        assert_eq!(settle(&st, &[&s]).unwrap(), vec![0]);
        assert_eq!(io(&st, &a), ["90", "30", "90", "30"]);
        // Same expiry as the counters.
        let k = a.keys();
        assert_eq!(
            st.cli(&["TTL", &k.io()]).parse::<i64>().unwrap() / 10,
            st.cli(&["TTL", &k.used_total]).parse::<i64>().unwrap() / 10
        );
        // A charge without a reservation adds its split once; a refund (0, 0) adds nothing.
        let mut c = entry(&with_id("c1"), SettleMode::Charge, 40);
        (c.tokens_in, c.tokens_out) = (4, 5);
        assert_eq!(settle(&st, &[&c, &c]).unwrap(), vec![1, 0]);
        reserve(&st, &with_id("r0")).unwrap();
        let mut z = entry(&with_id("r0"), SettleMode::Settle, 0);
        (z.tokens_in, z.tokens_out) = (0, 0);
        assert_eq!(settle(&st, &[&z]).unwrap(), vec![1]);
        assert_eq!(io(&st, &a), ["94", "35", "94", "35"]);
        // Resolved at its deadline: the counters move, the split does not (no usage is known);
        // the settlement that still arrives adds its split, once.
        let mut d = with_id("d1");
        d.deadline_s = 1;
        reserve(&st, &d).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2100));
        reserve(&st, &with_id("d2")).unwrap();
        assert!(st.cli(&["HGET", &k.done, "d1"]).starts_with("S 100 "));
        assert_eq!(io(&st, &a), ["94", "35", "94", "35"]);
        let mut late = entry(&d, SettleMode::Settle, 130);
        (late.tokens_in, late.tokens_out) = (100, 10);
        assert_eq!(settle(&st, &[&late, &late]).unwrap(), vec![1, 0]);
        assert_eq!(io(&st, &a), ["194", "45", "194", "45"]);
        // Without a model: only the account's fields.
        let mut n = with_id("n1");
        n.model = None;
        reserve(&st, &n).unwrap();
        let mut e = entry(&n, SettleMode::Settle, 10);
        (e.tokens_in, e.tokens_out) = (6, 1);
        assert_eq!(settle(&st, &[&e]).unwrap(), vec![1]);
        assert_eq!(io(&st, &a), ["200", "46", "194", "45"]);
        assert_eq!(st.cli(&["HLEN", &k.io()]), "4");
        // A split key of the wrong type never undoes or blocks a settlement.
        st.cli(&["DEL", &k.io()]);
        st.cli(&["SET", &k.io(), "x"]);
        reserve(&st, &with_id("w1")).unwrap();
        let before = used(&st, &a).0.parse::<i64>().unwrap();
        assert_eq!(
            settle(&st, &[&entry(&with_id("w1"), SettleMode::Settle, 50)]).unwrap(),
            vec![1]
        );
        assert_eq!(used(&st, &a).0.parse::<i64>().unwrap(), before - 150 + 50);
        assert_eq!(st.cli(&["GET", &k.io()]), "x");
        // A malformed split is a malformed entry: nothing applied.
        reserve(&st, &with_id("m1")).unwrap();
        let body = settle_request(
            &[&entry(&with_id("m1"), SettleMode::Settle, 5)],
            ScriptCall::Eval,
        )
        .replace("/5/1796688000/1/1/4", "/5/1796688000/1/-1/4");
        let (code, b) = st.post(&body);
        assert_eq!(parse_settle_reply(code, &b, 1).unwrap(), vec![-1]);
    }

    #[test]
    fn a_charge_of_a_reservation_that_did_land_replaces_it() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        reserve(&st, &a).unwrap();
        let c = entry(&a, SettleMode::Charge, 0);
        assert_eq!(settle(&st, &[&c]).unwrap(), vec![1]);
        assert_eq!(used(&st, &a).0, "0");
        assert_eq!(settle(&st, &[&c]).unwrap(), vec![0]);
    }

    #[test]
    fn redis_holds_a_few_keys_per_tenant_not_per_request() {
        let Some(st) = Stack::start() else { return };
        for i in 0..200 {
            let a = with_id(&format!("m{i}"));
            let mut a = a;
            a.default_limit = 1_000_000;
            reserve(&st, &a).unwrap();
            settle(&st, &[&entry(&a, SettleMode::Settle, 7)]).unwrap();
        }
        let keys = st.cli(&["DBSIZE"]);
        assert!(
            keys.parse::<u64>().unwrap() <= 7,
            "keys after 200 settled requests: {keys}"
        );
        assert_eq!(st.cli(&["GET", &base().keys().used_total]), "1400");
    }

    /// A Webdis command body (`EVALSHA/<sha>/<n>/<keys…>/<args…>`, percent-encoded segments) as the
    /// argument list of the same Redis command.
    fn redis_args(body: &str) -> Vec<Vec<u8>> {
        body.split('/')
            .map(|seg| {
                let b = seg.as_bytes();
                let mut out = Vec::with_capacity(b.len());
                let mut i = 0;
                while i < b.len() {
                    if b[i] == b'%' && i + 2 < b.len() + 1 {
                        out.push(u8::from_str_radix(&seg[i + 1..i + 3], 16).unwrap());
                        i += 3;
                    } else {
                        out.push(b[i]);
                        i += 1;
                    }
                }
                out
            })
            .collect()
    }

    /// The memory of every key (`MEMORY USAGE` summed): exact and repeatable, unlike `INFO memory`,
    /// whose totals move with client buffers and the Lua heap (how fast this test read its pipelines'
    /// replies, when the Lua garbage collector last ran).
    fn used_memory(st: &Stack) -> i64 {
        st.cli(&[
            "EVAL",
            "local s = 0 for _, k in ipairs(redis.call('KEYS', '*')) do s = s + redis.call('MEMORY', 'USAGE', k, 'SAMPLES', '0') end return s",
            "0",
        ])
        .trim()
        .parse()
        .unwrap()
    }

    /// Issue 11: Redis memory is O(tenants + requests in flight), not O(requests): 100,000 requests of
    /// 1,000 tenants (reserved, then settled), measured with `MEMORY USAGE` of every key.
    #[test]
    fn redis_memory_grows_with_tenants_not_with_requests() {
        let Some(st) = Stack::start() else { return };
        st.cli(&["SCRIPT", "LOAD", RESERVE_SCRIPT]);
        st.cli(&["SCRIPT", "LOAD", SETTLE_SCRIPT]);
        let mut conn = wasm_test::RedisConn::connect(st.redis_port).unwrap();
        let base_mem = used_memory(&st);
        let tenants = 1000;
        let mut mem_after = Vec::new();
        let mut n = 0u64;
        let started = std::time::Instant::now();
        for round in 0..100 {
            // 1,000 requests: one per tenant, reserved then settled (in batches per tenant).
            let args: Vec<ReserveArgs> = (0..tenants)
                .map(|t| ReserveArgs {
                    tenant: format!("tenant-{t}"),
                    request_id: format!("r{round}-{t}-{n}"),
                    default_limit: 1_000_000_000,
                    ..base()
                })
                .collect();
            n += tenants as u64;
            let reserves: Vec<Vec<Vec<u8>>> = args
                .iter()
                .map(|a| redis_args(&reserve_request(a, ScriptCall::EvalSha)))
                .collect();
            for r in conn.pipeline(&reserves).unwrap() {
                assert!(!matches!(r, wasm_test::RespValue::Error(_)), "{r:?}");
            }
            let entries: Vec<SettleArgs> = args
                .iter()
                .map(|a| entry(a, SettleMode::Settle, 120))
                .collect();
            let settles: Vec<Vec<Vec<u8>>> = entries
                .iter()
                .map(|e| redis_args(&settle_request(&[e], ScriptCall::EvalSha)))
                .collect();
            for r in conn.pipeline(&settles).unwrap() {
                assert!(!matches!(r, wasm_test::RespValue::Error(_)), "{r:?}");
            }
            if round == 9 || round == 99 {
                mem_after.push((n, used_memory(&st) - base_mem));
            }
        }
        // What one Redis core does with these scripts (pipelined, no Webdis): the input of the
        // capacity model in docs/scaling.md.
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "{} script calls (reserve + settle of {n} requests) in {secs:.1} s: {:.0} calls/s",
            2 * n,
            2.0 * n as f64 / secs
        );
        let keys: u64 = st.cli(&["DBSIZE"]).parse().unwrap();
        let (n10, m10) = mem_after[0];
        let (n100, m100) = mem_after[1];
        eprintln!(
            "Redis after {n10} requests: {m10} bytes; after {n100}: {m100} bytes ({} bytes per tenant, {keys} keys for {tenants} tenants)",
            m100 / tenants as i64
        );
        assert_eq!(
            keys,
            3 * tenants as u64,
            "two counters and the input/output split per tenant, nothing per request"
        );
        assert!(
            m100 < m10 + 8 * 1024,
            "memory grew with requests: {m10} after {n10}, {m100} after {n100}"
        );
        assert!(
            m100 / (tenants as i64) < 600,
            "{m100} bytes for {tenants} tenants"
        );
        // 100 settled requests per tenant.
        assert_eq!(
            st.cli(&["GET", &base().keys().used_total.replace("acme", "tenant-7")]),
            "12000"
        );
    }

    #[test]
    fn counts_near_two_to_the_fifty_three_stay_exact() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.default_limit = MAX_LUA_INT;
        a.prompt_cost = 4_000_000_000_000_000;
        a.output_cost = 123_456_789;
        let r = reserve(&st, &a).unwrap();
        assert_eq!(r.used_after, 4_000_000_123_456_789);
        let s = entry(&a, SettleMode::Settle, 4_000_000_123_456_786);
        assert_eq!(settle(&st, &[&s]).unwrap(), vec![1]);
        assert_eq!(st.cli(&["GET", &a.keys().used_total]), "4000000123456786");
    }

    #[test]
    fn awkward_tenant_model_and_ids_survive_webdis_encoding() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.tenant = "a/b+c d{x}%.json".into();
        a.model = Some("ft:gpt-4o:org/x.raw".into());
        a.request_id = "id.json".into();
        assert!(reserve(&st, &a).unwrap().allowed);
        let k = a.keys();
        assert_eq!(k.used_total, "tg:q:{a%2Fb%2Bc%20d%7Bx%7D%25.json}:2026-11");
        assert_eq!(st.cli(&["GET", &k.used_total]), "150");
        assert_eq!(st.cli(&["GET", &k.used_model]), "150");
        assert_eq!(st.cli(&["HEXISTS", &k.open, "id.json"]), "1");
        // Same Redis Cluster slot: Cluster hashes only what lies between the first `{` and the next `}`.
        let tag = |key: &str| {
            let open = key
                .find('{')
                .unwrap_or_else(|| panic!("no hash tag: {key}"));
            let len = key[open..]
                .find('}')
                .unwrap_or_else(|| panic!("unclosed: {key}"));
            key[open + 1..open + len].to_string()
        };
        assert_eq!(tag(&k.used_total), "a%2Fb%2Bc%20d%7Bx%7D%25.json");
        for key in [
            &k.used_model,
            &k.open,
            &k.due,
            &k.done,
            &k.gone,
            &k.limit_override,
        ] {
            assert_eq!(tag(key), tag(&k.used_total), "{key}");
        }
        assert_eq!(
            settle(&st, &[&entry(&a, SettleMode::Settle, 1)]).unwrap(),
            vec![1]
        );
    }

    #[test]
    fn evalsha_reports_noscript_until_an_eval_loads_the_script() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        st.cli(&["SCRIPT", "FLUSH"]);
        let (s, b) = st.post(&reserve_request(&a, ScriptCall::EvalSha));
        assert_eq!(parse_reserve_reply(s, &b), Err(ShimError::NoScript));
        let e = entry(&a, SettleMode::Settle, 1);
        let (s, b) = st.post(&settle_request(&[&e], ScriptCall::EvalSha));
        assert_eq!(parse_settle_reply(s, &b, 1), Err(ShimError::NoScript));
        assert!(reserve(&st, &a).unwrap().allowed); // EVAL
        let (s, b) = st.post(&reserve_request(&with_id("r2"), ScriptCall::EvalSha));
        assert_eq!(parse_reserve_reply(s, &b).unwrap().used_after, 300);
    }

    #[test]
    fn webdis_acl_denial_is_forbidden() {
        let Some(mut st) = Stack::start() else { return };
        let port = st.start_acl_webdis();
        let (s, b) = post_to(port, &reserve_request(&base(), ScriptCall::Eval));
        assert_eq!(parse_reserve_reply(s, &b), Err(ShimError::Forbidden));
    }

    #[test]
    fn redis_down_behind_webdis_is_unavailable() {
        let Some(mut st) = Stack::start() else { return };
        st.stop_redis(); // kills redis-server by PID
        let (s, b) = st.post(&reserve_request(&base(), ScriptCall::Eval));
        assert_eq!(
            parse_reserve_reply(s, &b),
            Err(ShimError::Unavailable),
            "{s} {:?}",
            String::from_utf8_lossy(&b)
        );
    }

    #[test]
    fn a_mismatched_protocol_tag_is_refused_by_the_script() {
        let Some(st) = Stack::start() else { return };
        let body = reserve_request(&base(), ScriptCall::Eval).replace("/tg3", "/tg0");
        let (s, b) = st.post(&body);
        assert_eq!(
            parse_reserve_reply(s, &b),
            Err(ShimError::RedisError(
                "ERR tokengate: protocol mismatch".into()
            ))
        );
    }

    #[test]
    fn print_one_real_exchange() {
        let Some(st) = Stack::start() else { return };
        let body = reserve_request(&base(), ScriptCall::EvalSha);
        let _ = reserve(&st, &with_id("warm"));
        let (s, b) = st.post(&body);
        eprintln!(
            "REQUEST POST / body ({} bytes):\n{body}\nRESPONSE {s}: {}",
            body.len(),
            String::from_utf8_lossy(&b)
        );
    }
}

/// The global bucket script: the same verdicts and balances as [`bucket::charge`] on random sequences,
/// key expiry and garbage in Redis.
mod global_bucket {
    use super::*;

    fn call(
        st: &Stack,
        key: &str,
        p: &BucketParams,
        cost: u64,
        wait: u64,
        credit: i64,
        now_us: u64,
    ) -> Reply {
        let body = command_body(
            ScriptCall::Eval,
            SCRIPT,
            SHA1,
            &[key],
            &argv(p, cost, wait, credit, now_us),
        );
        let (status, reply) = st.post(&body);
        parse_reply(status, &reply)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&reply)))
    }

    #[test]
    fn the_sha1_is_what_redis_computes() {
        let Some(st) = Stack::start() else { return };
        assert_eq!(st.cli(&["SCRIPT", "LOAD", SCRIPT]), SHA1);
    }

    #[test]
    fn the_script_decides_like_the_local_bucket() {
        let Some(st) = Stack::start() else { return };
        // A small deterministic generator: costs, gaps, rates, shaping.
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for case in 0..12 {
            let p = BucketParams {
                tokens_per_second: [10.0, 0.5, 1000.0, 3.25][case % 4],
                burst: [100.0, 7.0, 5000.0, 64.5][case % 4],
                requests_per_minute: if case % 3 == 0 {
                    Some([5.0, 60.0][case % 2])
                } else {
                    None
                },
            };
            let wait = if case % 5 == 4 { 800 } else { 0 };
            let key = format!("tg:gb:{{t:{case}}}");
            let mut local = BucketState::full(&p, 1_000_000_000);
            let mut now_us = 1_000_000u64;
            for _ in 0..60 {
                now_us += next(400_000);
                let cost = next(p.burst as u64 + 2);
                let got = call(&st, &key, &p, cost, wait, 0, now_us);
                let (v, _, after) = bucket::charge(&local, &p, cost, now_us * 1000, wait);
                let refilled = local.refilled(&p, now_us * 1000);
                let want = after.unwrap_or(refilled);
                match (got.verdict, v) {
                    (
                        Verdict::LimitTokens { reset_in_s: a },
                        Verdict::LimitTokens { reset_in_s: b },
                    )
                    | (
                        Verdict::LimitRequests { reset_in_s: a },
                        Verdict::LimitRequests { reset_in_s: b },
                    ) => {
                        assert!((a - b).abs() < 2e-6, "case {case}: {a} vs {b}")
                    }
                    (Verdict::Wait { wait_ms: a }, Verdict::Wait { wait_ms: b }) => {
                        assert!(a.abs_diff(b) <= 1, "case {case}: {a} vs {b}")
                    }
                    (a, b) => assert_eq!(a, b, "case {case} cost {cost} at {now_us}"),
                }
                assert!(
                    (got.state.tokens - want.tokens).abs() <= 0.0011,
                    "case {case}: {got:?} vs {want:?}"
                );
                assert!(
                    (got.state.requests - want.requests).abs() <= 0.0011,
                    "case {case}"
                );
                if let Some(a) = after {
                    local = a;
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn lease_call(
        st: &Stack,
        key: &str,
        p: &BucketParams,
        cost: u64,
        wait: u64,
        credit: i64,
        now_us: u64,
        ask: LeaseAsk,
    ) -> Reply {
        let body = command_body(
            ScriptCall::Eval,
            SCRIPT,
            SHA1,
            &[key],
            &lease_argv(p, cost, wait, credit, now_us, &ask),
        );
        let (status, reply) = st.post(&body);
        parse_reply(status, &reply)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&reply)))
    }

    fn ask(requests: u64, bt: u64, br: u64, cr: u64) -> LeaseAsk {
        LeaseAsk {
            requests,
            block_tokens: bt,
            block_requests: br,
            credit_requests: cr,
        }
    }

    #[test]
    fn a_block_is_granted_only_from_what_the_bucket_holds_after_the_charge() {
        let Some(st) = Stack::start() else { return };
        let p = BucketParams {
            tokens_per_second: 10.0,
            burst: 1000.0,
            requests_per_minute: None,
        };
        // A request of 100 with a block of 500: both taken.
        let r = lease_call(&st, "l", &p, 100, 0, 0, 1_000_000, ask(1, 500, 0, 0));
        assert_eq!(
            (r.verdict, r.block_tokens, r.state.tokens),
            (Verdict::Admit, 500, 400.0)
        );
        // A block alone (no cost, no request) takes whole tokens, at most what is there.
        let r = lease_call(&st, "l", &p, 0, 0, 0, 1_000_000, ask(0, 1000, 0, 0));
        assert_eq!(
            (r.verdict, r.block_tokens, r.state.tokens),
            (Verdict::Admit, 400, 0.0)
        );
        // 0.55 s later 5.5 tokens are back: a request of 5 passes, its block gets the whole 0.
        let r = lease_call(&st, "l", &p, 5, 0, 0, 1_550_000, ask(1, 100, 0, 0));
        assert_eq!((r.verdict, r.block_tokens), (Verdict::Admit, 0));
        assert!((r.state.tokens - 0.5).abs() < 1e-9, "{r:?}");
        // Refused: no block either.
        let r = lease_call(&st, "l", &p, 50, 0, 0, 1_550_000, ask(1, 100, 0, 0));
        assert!(matches!(r.verdict, Verdict::LimitTokens { .. }), "{r:?}");
        assert_eq!(r.block_tokens, 0);
        // Shaped into debt: admitted after a wait, no block.
        let r = lease_call(&st, "l", &p, 50, 10_000, 0, 1_550_000, ask(1, 100, 0, 0));
        assert!(matches!(r.verdict, Verdict::Wait { .. }), "{r:?}");
        assert_eq!(r.block_tokens, 0);
        // Giving a lease back: tokens never above the burst.
        let r = lease_call(&st, "l", &p, 0, 0, 2000, 1_550_000, ask(0, 0, 0, 0));
        assert_eq!((r.state.tokens, r.block_tokens), (1000.0, 0));
    }

    #[test]
    fn a_block_of_a_bucket_with_requests_per_minute_carries_requests_or_nothing() {
        let Some(st) = Stack::start() else { return };
        let p = BucketParams {
            tokens_per_second: 1000.0,
            burst: 100_000.0,
            requests_per_minute: Some(10.0),
        };
        let r = lease_call(&st, "q", &p, 100, 0, 0, 1_000_000, ask(1, 1000, 4, 0));
        assert_eq!((r.block_tokens, r.block_requests), (1000, 4));
        assert_eq!(r.state.requests, 5.0);
        // Only 5 requests left: a block asking 8 gets 5 of them.
        let r = lease_call(&st, "q", &p, 0, 0, 0, 1_000_000, ask(0, 1000, 8, 0));
        assert_eq!((r.block_tokens, r.block_requests), (1000, 5));
        // No whole request left: tokens alone would serve nothing.
        let r = lease_call(&st, "q", &p, 0, 0, 0, 1_000_000, ask(0, 1000, 1, 0));
        assert_eq!((r.block_tokens, r.block_requests), (0, 0));
        // Requests given back (never above requests/minute); a request is then admitted again.
        let r = lease_call(&st, "q", &p, 0, 0, 0, 1_000_000, ask(0, 0, 0, 50));
        assert_eq!(r.state.requests, 10.0);
        let r = lease_call(&st, "q", &p, 100, 0, 0, 1_000_000, ask(1, 0, 0, 0));
        assert_eq!((r.verdict, r.state.requests), (Verdict::Admit, 9.0));
    }

    #[test]
    fn credits_cap_at_the_burst_and_keys_expire_when_idle() {
        let Some(st) = Stack::start() else { return };
        let p = BucketParams {
            tokens_per_second: 10.0,
            burst: 100.0,
            requests_per_minute: None,
        };
        let r = call(&st, "k", &p, 80, 0, 0, 1_000_000);
        assert_eq!((r.verdict, r.state.tokens), (Verdict::Admit, 20.0));
        let r = call(&st, "k", &p, 0, 0, 30, 1_000_000);
        assert_eq!(r.state.tokens, 50.0);
        let r = call(&st, "k", &p, 0, 0, 500, 1_000_000);
        assert_eq!(r.state.tokens, 100.0);
        // Negative credits are debits (usage above the charge), at most one burst into debt.
        let r = call(&st, "k", &p, 0, 0, -150, 1_000_000);
        assert_eq!(r.state.tokens, -50.0);
        let r = call(&st, "k", &p, 0, 0, -500, 1_000_000);
        assert_eq!(r.state.tokens, -100.0);
        let r = call(&st, "k", &p, 0, 0, 200, 1_000_000);
        assert_eq!(r.state.tokens, 100.0);
        // Drained: refills in 10 s; the key lives that long plus 60 s, no longer.
        call(&st, "k", &p, 100, 0, 0, 1_000_000);
        let ttl: i64 = st.cli(&["PTTL", "k"]).parse().unwrap();
        assert!((69_000..=70_000).contains(&ttl), "{ttl}");
        // Production calls use Redis' own clock.
        let r = call(&st, "k2", &p, 1, 0, 0, 0);
        assert_eq!(r.verdict, Verdict::Admit);
        let u: u64 = st.cli(&["HGET", "k2", "u"]).parse().unwrap();
        assert!(u > 1_700_000_000_000_000, "{u}");
    }

    #[test]
    fn garbage_in_redis_is_an_error_or_a_fresh_bucket_never_a_crash() {
        let Some(st) = Stack::start() else { return };
        let p = BucketParams {
            tokens_per_second: 10.0,
            burst: 100.0,
            requests_per_minute: None,
        };
        // Wrong type: Redis refuses, the host applies the failure policy.
        st.cli(&["SET", "s", "x"]);
        let body = charge_request("s", &p, 1, 0, ScriptCall::Eval);
        let (status, reply) = st.post(&body);
        assert!(matches!(
            parse_reply(status, &reply),
            Err(ShimError::RedisError(_))
        ));
        // Unreadable fields: treated as a full bucket.
        st.cli(&["HSET", "h", "t", "abc", "r", "0", "u", "zz"]);
        let r = call(&st, "h", &p, 10, 0, 0, 5);
        assert_eq!((r.verdict, r.state.tokens), (Verdict::Admit, 90.0));
        // A stamp far in the future (garbage, or written by a server whose clock was ahead): the
        // bucket refills from now on instead of waiting for that clock, and the key gets its expiry.
        st.cli(&["HSET", "f", "t", "0", "r", "0", "u", "99999999999999999"]);
        let r = call(&st, "f", &p, 10, 0, 0, 5_000_000);
        assert!(matches!(r.verdict, Verdict::LimitTokens { .. }), "{r:?}");
        let ttl: i64 = st.cli(&["PTTL", "f"]).parse().unwrap();
        assert!(ttl > 0, "{ttl}");
        let r = call(&st, "f", &p, 10, 0, 0, 6_000_000);
        assert_eq!(r.verdict, Verdict::Admit, "{r:?}");
    }
}
