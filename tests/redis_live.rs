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
use tokengate::bucket::{self, BucketParams, BucketState, Verdict};
use tokengate::global::{argv, charge_request, parse_reply, Reply, SCRIPT, SHA1};
use tokengate::quota::*;
use tokengate::webdis::{command_body, ScriptCall, ShimError, MAX_LUA_INT};
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

/// Monthly quota scripts (reserve, settle, settle batch, reconcile).
mod quota {
    use super::*;

    fn reserve(st: &Stack, a: &ReserveArgs) -> Result<ReserveReply, ShimError> {
        let (s, b) = st.post(&reserve_request(a, ScriptCall::Eval));
        parse_reserve_reply(s, &b)
    }

    fn settle(st: &Stack, s: &SettleArgs) -> Result<SettleReply, ShimError> {
        let (code, b) = st.post(&settle_request(s, ScriptCall::Eval));
        parse_settle_reply(code, &b)
    }

    /// The reservation most tests start from: 100 + 50 tokens of a 1000 limit, no idempotency key.
    fn base() -> ReserveArgs {
        ReserveArgs {
            tenant: "acme".into(),
            model: Some("gpt-4.1".into()),
            month: "2026-11".into(),
            idempotency_key: None,
            body_fingerprint: 0xfeed,
            request_id: "req-1".into(),
            prompt_cost: 100,
            output_cost: 50,
            default_limit: 1000,
            default_model_limit: 0,
            expire_at_unix: 1_796_688_000,
            idem_window_s: 0,
            clamp_output: false,
            min_output_cost: 0,
        }
    }

    #[test]
    fn script_sha1_constants_match_what_redis_script_load_returns() {
        let Some(st) = Stack::start() else { return };
        assert_eq!(st.cli(&["SCRIPT", "LOAD", RESERVE_SCRIPT]), RESERVE_SHA1);
        assert_eq!(st.cli(&["SCRIPT", "LOAD", SETTLE_SCRIPT]), SETTLE_SHA1);
        assert_eq!(
            st.cli(&["SCRIPT", "LOAD", RECONCILE_SCRIPT]),
            RECONCILE_SHA1
        );
        assert_eq!(
            st.cli(&["SCRIPT", "LOAD", SETTLE_BATCH_SCRIPT]),
            SETTLE_BATCH_SHA1
        );
    }

    #[test]
    fn a_settlement_batch_applies_each_entry_once_through_webdis() {
        let Some(st) = Stack::start() else { return };
        let mut jobs = Vec::new();
        for (i, delta) in [(1, -20i64), (2, 5), (3, -500)] {
            let mut a = base();
            a.request_id = format!("b-{i}");
            reserve(&st, &a).unwrap();
            jobs.push(SettleArgs {
                keys: a.keys(),
                delta,
                expire_at_unix: 1_796_688_000,
                marker_ttl_s: 60,
                release_idempotency: false,
            });
        }
        let k = jobs[0].keys.clone();
        assert_eq!(st.cli(&["GET", &k.used_total]), "450");
        let refs: Vec<&SettleArgs> = jobs.iter().collect();
        let (status, body) = st.post(&settle_batch_request(&refs, ScriptCall::Eval));
        assert_eq!(
            parse_settle_batch_reply(status, &body, 3).unwrap(),
            [1, 1, 1]
        );
        // 450 - 20 + 5 - 500 stops at 0
        assert_eq!(st.cli(&["GET", &k.used_total]), "0");
        let (status, body) = st.post(&settle_batch_request(&refs, ScriptCall::EvalSha));
        assert_eq!(
            parse_settle_batch_reply(status, &body, 3).unwrap(),
            [0, 0, 0]
        );
        assert_eq!(tenant_tag(&k), "tg:q:{acme}");
    }

    #[test]
    fn reconcile_charges_actual_minus_a_landed_reservation_and_blocks_a_late_one() {
        let Some(st) = Stack::start() else { return };
        // (a) the reservation landed before the reconciliation: net charge = actual
        let a = base();
        reserve(&st, &a).unwrap();
        let k = a.keys();
        assert_eq!(st.cli(&["GET", &k.used_total]), "150");
        let rec = ReconcileArgs {
            keys: k.clone(),
            actual: 40,
            expire_at_unix: 1_796_688_000,
            marker_ttl_s: 60,
        };
        let (status, body) = st.post(&reconcile_request(&rec, ScriptCall::Eval));
        assert!(parse_settle_reply(status, &body).unwrap().applied);
        assert_eq!(st.cli(&["GET", &k.used_total]), "40");
        // a repeat changes nothing
        let (status, body) = st.post(&reconcile_request(&rec, ScriptCall::Eval));
        assert!(!parse_settle_reply(status, &body).unwrap().applied);
        assert_eq!(st.cli(&["GET", &k.used_total]), "40");
        // (b) reconciled first (actual 0: not served), the reservation arrives late: no charge
        let mut b = base();
        b.request_id = "req-2".into();
        let kb = b.keys();
        let rec_b = ReconcileArgs {
            keys: kb.clone(),
            actual: 0,
            expire_at_unix: 1_796_688_000,
            marker_ttl_s: 60,
        };
        let (status, body) = st.post(&reconcile_request(&rec_b, ScriptCall::Eval));
        assert!(parse_settle_reply(status, &body).unwrap().applied);
        let late = reserve(&st, &b).unwrap_err();
        assert!(
            matches!(&late, ShimError::RedisError(e) if e.contains("reconciled")),
            "{late:?}"
        );
        assert_eq!(st.cli(&["GET", &kb.used_total]), "40");
    }

    #[test]
    fn reserve_script_runs_directly_through_redis_cli_eval() {
        let Some(st) = Stack::start() else { return };
        let k = base().keys();
        let keys = [
            &k.used_total,
            &k.used_model,
            &k.limit_override,
            &k.limit_model_override,
            &k.idem,
            &k.request,
        ];
        let mut cmd: Vec<&str> = vec!["EVAL", RESERVE_SCRIPT, "6"];
        cmd.extend(keys.iter().map(|s| s.as_str()));
        cmd.extend([
            "100",
            "50",
            "1000",
            "0",
            "1796688000",
            "0",
            "req-1",
            "0",
            "0",
            "1",
            "feed",
            "3",
            "tg1",
        ]);
        assert_eq!(
            st.cli(&cmd).lines().collect::<Vec<_>>(),
            ["1", "150", "1000", "150", "-1", "0", "50", "0"]
        );
        assert_eq!(st.cli(&["GET", &k.used_total]), "150");
        assert_eq!(st.cli(&["GET", &k.used_model]), "150");
        assert_eq!(st.cli(&["EXPIRETIME", &k.used_total]), "1796688000");
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "0");
    }

    #[test]
    fn reservation_through_webdis_charges_both_counters_and_expires_them_at_a_fixed_instant() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        let k = a.keys();
        let r1 = reserve(&st, &a).unwrap();
        assert_eq!(
            (
                r1.allowed,
                r1.used_after,
                r1.model_used_after,
                r1.granted_output
            ),
            (true, 150, 150, 50)
        );
        assert_eq!(r1.model_limit, None);
        let r2 = reserve(&st, &a).unwrap();
        assert_eq!(r2.used_after, 300);
        // EXPIREAT, not EXPIRE: the expiry stays the month end + grace no matter how many calls.
        assert_eq!(st.cli(&["EXPIRETIME", &k.used_total]), "1796688000");
        assert_eq!(st.cli(&["EXPIRETIME", &k.used_model]), "1796688000");
    }

    #[test]
    fn reservation_over_the_tenant_limit_is_rejected_and_charges_nothing() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.prompt_cost = 900;
        a.output_cost = 100;
        assert!(reserve(&st, &a).unwrap().allowed); // exactly the limit
        a.prompt_cost = 1;
        a.output_cost = 0;
        let r = reserve(&st, &a).unwrap();
        assert_eq!(
            (r.allowed, r.used_after, r.limit, r.reason),
            (false, 1000, 1000, Reason::TenantLimit)
        );
        assert_eq!(r.remaining(), 0);
        assert_eq!(st.cli(&["GET", &a.keys().used_total]), "1000");
    }

    #[test]
    fn model_limit_rejects_before_the_tenant_limit_and_says_so() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.default_model_limit = 200;
        assert_eq!(reserve(&st, &a).unwrap().model_limit, Some(200));
        let r = reserve(&st, &a).unwrap();
        assert_eq!(
            (r.allowed, r.reason, r.used_after, r.model_used_after),
            (false, Reason::ModelLimit, 150, 150)
        );
        // Another model of the same tenant is not affected by that model's counter.
        a.model = Some("gpt-4.1-mini".into());
        assert!(reserve(&st, &a).unwrap().allowed);
    }

    #[test]
    fn operator_overrides_replace_the_default_limits() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        let k = a.keys();
        st.cli(&["SET", &k.limit_override, "100"]);
        let r = reserve(&st, &a).unwrap();
        assert_eq!((r.allowed, r.limit), (false, 100));
        st.cli(&["SET", &k.limit_override, "5000"]);
        st.cli(&["SET", &k.limit_model_override, "0"]);
        let r = reserve(&st, &a).unwrap();
        assert_eq!(
            (r.allowed, r.limit, r.model_limit, r.reason),
            (false, 5000, Some(0), Reason::ModelLimit)
        );
    }

    #[test]
    fn a_corrupt_override_is_a_redis_error_not_a_silent_default() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        st.cli(&["SET", &a.keys().limit_override, "lots"]);
        match reserve(&st, &a) {
            Err(ShimError::RedisError(m)) => assert!(m.contains("not a count"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_repeated_idempotency_key_returns_the_first_decision_and_charges_once() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.idempotency_key = Some("client-key/1.json".into());
        a.idem_window_s = 600;
        let first = reserve(&st, &a).unwrap();
        assert!(!first.duplicate);
        a.request_id = "req-2".into();
        let again = reserve(&st, &a).unwrap();
        assert_eq!(
            again,
            ReserveReply {
                duplicate: true,
                ..first
            }
        );
        assert_eq!(st.cli(&["GET", &a.keys().used_total]), "150");
        let ttl: i64 = st.cli(&["TTL", &a.keys().idem]).parse().unwrap();
        assert!((590..=600).contains(&ttl), "{ttl}");
        assert!(st
            .cli(&["GET", &a.keys().idem])
            .starts_with("2 000000000000feed 1 req-1 "));
        // A later repeat reports the usage as it is now (another request charged 150 meanwhile).
        let mut other = base();
        other.request_id = "req-x".into();
        reserve(&st, &other).unwrap();
        a.request_id = "req-3".into();
        let third = reserve(&st, &a).unwrap();
        assert!(third.duplicate);
        assert_eq!(third.used_after, 300);
        assert_eq!(third.limit, first.limit);
    }

    fn idem_args(key: &str, rid: &str, fingerprint: u64) -> ReserveArgs {
        let mut a = base();
        a.idempotency_key = Some(key.into());
        a.idem_window_s = 600;
        a.request_id = rid.into();
        a.body_fingerprint = fingerprint;
        a
    }

    fn full_refund(a: &ReserveArgs, reserved: u64) -> SettleArgs {
        SettleArgs {
            keys: a.keys(),
            delta: -(reserved as i64),
            expire_at_unix: a.expire_at_unix,
            marker_ttl_s: 60,
            release_idempotency: true,
        }
    }

    #[test]
    fn a_repeated_key_with_a_different_body_is_charged_and_leaves_the_record_alone() {
        let Some(st) = Stack::start() else { return };
        let first = idem_args("K", "req-1", 0xaaaa);
        assert!(!reserve(&st, &first).unwrap().duplicate);
        let record = st.cli(&["GET", &first.keys().idem]);
        let mut other = idem_args("K", "req-2", 0xbbbb);
        other.output_cost = 500;
        let r = reserve(&st, &other).unwrap();
        assert!(r.allowed && !r.duplicate, "{r:?}");
        assert_eq!(r.used_after, 150 + 600);
        assert_eq!(st.cli(&["GET", &first.keys().idem]), record, "untouched");
        // Over the limit it is refused like any request, not admitted as a duplicate.
        let mut big = idem_args("K", "req-3", 0xcccc);
        big.output_cost = 5_000;
        let r = reserve(&st, &big).unwrap();
        assert_eq!((r.allowed, r.reason), (false, Reason::TenantLimit));
        // The first body is still a (free) duplicate.
        let again = reserve(&st, &idem_args("K", "req-4", 0xaaaa)).unwrap();
        assert!(again.duplicate);
        assert_eq!(st.cli(&["GET", &first.keys().used_total]), "750");
    }

    #[test]
    fn free_repeats_of_one_key_are_bounded_then_charged() {
        let Some(st) = Stack::start() else { return };
        let a = idem_args("K", "req-0", 0xaaaa);
        let first = reserve(&st, &a).unwrap();
        assert!(!first.duplicate);
        let ttl0: i64 = st.cli(&["PTTL", &a.keys().idem]).parse().unwrap();
        for i in 1..=IDEMPOTENT_FREE_REPEATS {
            let r = reserve(&st, &idem_args("K", &format!("req-{i}"), 0xaaaa)).unwrap();
            assert_eq!(
                r,
                ReserveReply {
                    duplicate: true,
                    ..first
                },
                "repeat {i}"
            );
        }
        assert_eq!(st.cli(&["GET", &a.keys().used_total]), "150");
        let rec = st.cli(&["GET", &a.keys().idem]);
        assert_eq!(
            rec,
            format!("2 000000000000aaaa {IDEMPOTENT_FREE_REPEATS} req-0 1,150,1000,150,-1,0,50,0")
        );
        // Counting repeats never pushes the window forward.
        let ttl: i64 = st.cli(&["PTTL", &a.keys().idem]).parse().unwrap();
        assert!(ttl <= ttl0 && ttl > ttl0 - 5_000, "{ttl0} -> {ttl}");
        // Beyond the bound: charged like any request, the record stays as it is.
        for i in 1..=2u64 {
            let r = reserve(&st, &idem_args("K", &format!("req-x{i}"), 0xaaaa)).unwrap();
            assert!(r.allowed && !r.duplicate);
            assert_eq!(r.used_after, 150 + 150 * i);
        }
        assert_eq!(st.cli(&["GET", &a.keys().idem]), rec);
    }

    #[test]
    fn free_repeats_of_a_request_that_is_then_refunded_are_charged() {
        let Some(st) = Stack::start() else { return };
        // Two free repeats are served while the first request runs; then it fails (full refund).
        let a = idem_args("R", "req-1", 0xaaaa);
        let k = a.keys();
        reserve(&st, &a).unwrap();
        for rid in ["req-2", "req-3"] {
            let dup = reserve(&st, &idem_args("R", rid, 0xaaaa)).unwrap();
            assert!(dup.duplicate);
        }
        assert_eq!(st.cli(&["GET", &k.used_total]), "150");
        assert!(settle(&st, &full_refund(&a, 150)).unwrap().applied);
        // The two repeats were served: each is charged the first one's reservation.
        assert_eq!(st.cli(&["GET", &k.used_total]), "300");
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "0");
        // The same through the batch script and through a reconciliation.
        let b = idem_args("S", "s-1", 0xaaaa);
        reserve(&st, &b).unwrap();
        reserve(&st, &idem_args("S", "s-2", 0xaaaa)).unwrap();
        let (status, body) = st.post(&settle_batch_request(
            &[&full_refund(&b, 150)],
            ScriptCall::Eval,
        ));
        assert_eq!(parse_settle_batch_reply(status, &body, 1).unwrap(), [1]);
        assert_eq!(st.cli(&["GET", &b.keys().used_total]), "450");
        let c = idem_args("T", "t-1", 0xaaaa);
        reserve(&st, &c).unwrap();
        reserve(&st, &idem_args("T", "t-2", 0xaaaa)).unwrap();
        let rec = ReconcileArgs {
            keys: c.keys(),
            actual: 0,
            expire_at_unix: c.expire_at_unix,
            marker_ttl_s: 60,
        };
        let (status, body) = st.post(&reconcile_request(&rec, ScriptCall::Eval));
        assert!(parse_settle_reply(status, &body).unwrap().applied);
        assert_eq!(st.cli(&["GET", &c.keys().used_total]), "600");
    }

    #[test]
    fn a_fully_refunded_first_request_releases_its_key_so_the_retry_is_charged() {
        let Some(st) = Stack::start() else { return };
        let a = idem_args("K", "req-1", 0xaaaa);
        let k = a.keys();
        reserve(&st, &a).unwrap();
        // Another request with that key but another body is refunded in full: not its record.
        let other = idem_args("K", "req-2", 0xbbbb);
        reserve(&st, &other).unwrap();
        assert!(settle(&st, &full_refund(&other, 150)).unwrap().applied);
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "1");
        // A partial refund (the request was served) keeps it.
        let mut partial = full_refund(&a, 40);
        partial.release_idempotency = false;
        let mut p2 = partial.clone();
        p2.keys = idem_args("K", "req-9", 0xaaaa).keys();
        settle(&st, &p2).unwrap();
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "1");
        // The owner's full refund deletes it; the retry (same body) is reserved and charged.
        assert!(settle(&st, &full_refund(&a, 150)).unwrap().applied);
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "0");
        assert_eq!(st.cli(&["GET", &k.used_total]), "0"); // 150 + 150 - 150 - 40 - 150, floor 0
        let retry = reserve(&st, &idem_args("K", "req-3", 0xaaaa)).unwrap();
        assert!(retry.allowed && !retry.duplicate);
        assert_eq!(retry.used_after, 150);
        assert!(st
            .cli(&["GET", &k.idem])
            .starts_with("2 000000000000aaaa 0 req-3 "));
        // The same through the batch script, and through a reconciliation that charged nothing.
        let (status, body) = st.post(&settle_batch_request(
            &[&full_refund(&idem_args("K", "req-3", 0xaaaa), 150)],
            ScriptCall::Eval,
        ));
        assert_eq!(parse_settle_batch_reply(status, &body, 1).unwrap(), [1]);
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "0");
        let b = idem_args("K", "req-4", 0xaaaa);
        reserve(&st, &b).unwrap();
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "1");
        let rec = ReconcileArgs {
            keys: b.keys(),
            actual: 0,
            expire_at_unix: b.expire_at_unix,
            marker_ttl_s: 60,
        };
        let (status, body) = st.post(&reconcile_request(&rec, ScriptCall::Eval));
        assert!(parse_settle_reply(status, &body).unwrap().applied);
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "0");
        assert_eq!(st.cli(&["GET", &k.used_total]), "0");
    }

    #[test]
    fn an_idempotency_record_in_another_format_never_makes_a_duplicate() {
        let Some(st) = Stack::start() else { return };
        let a = idem_args("K", "req-1", 0xaaaa);
        let k = a.keys();
        // What version 1 of the script stored (no fingerprint, no bound).
        st.cli(&["SET", &k.idem, "1,5,1000,5,-1,0,0,0 old-req", "EX", "600"]);
        let r = reserve(&st, &a).unwrap();
        assert!(r.allowed && !r.duplicate);
        assert_eq!(st.cli(&["GET", &k.idem]), "1,5,1000,5,-1,0,0,0 old-req");
        // A full refund by the request does not touch a record it did not write.
        settle(&st, &full_refund(&a, 150)).unwrap();
        assert_eq!(st.cli(&["EXISTS", &k.idem]), "1");
        // A fingerprint that could break the record format is refused.
        let body = reserve_request(&a, ScriptCall::Eval).replace("/000000000000aaaa/", "/a%20b/");
        let (s, b) = st.post(&body);
        assert_eq!(
            parse_reserve_reply(s, &b),
            Err(ShimError::RedisError("ERR tokengate: bad argument".into()))
        );
    }

    #[test]
    fn clamping_grants_the_output_that_is_left_when_the_prompt_fits() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.prompt_cost = 800;
        a.output_cost = 0;
        reserve(&st, &a).unwrap();
        a.prompt_cost = 100;
        a.output_cost = 500;
        a.clamp_output = true;
        a.min_output_cost = 10;
        let r = reserve(&st, &a).unwrap();
        assert_eq!(
            (r.allowed, r.granted_output, r.used_after, r.reason),
            (true, 100, 1000, Reason::Clamped)
        );
        // Nothing left for output now: even a fitting prompt... is rejected (0 < min_output_cost).
        a.prompt_cost = 0;
        let r = reserve(&st, &a).unwrap();
        assert_eq!(
            (r.allowed, r.granted_output, r.reason),
            (false, 0, Reason::TenantLimit)
        );
    }

    #[test]
    fn clamping_never_admits_a_prompt_that_does_not_fit() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.prompt_cost = 1001;
        a.output_cost = 10;
        a.clamp_output = true;
        assert!(!reserve(&st, &a).unwrap().allowed);
        a.prompt_cost = 995;
        a.min_output_cost = 6;
        assert!(!reserve(&st, &a).unwrap().allowed, "5 left < min 6");
        a.min_output_cost = 5;
        assert_eq!(reserve(&st, &a).unwrap().granted_output, 5);
    }

    #[test]
    fn settlement_applies_once_per_request_id_and_never_goes_below_zero() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        reserve(&st, &a).unwrap(); // 150
        let mut s = SettleArgs {
            keys: a.keys(),
            delta: -40,
            expire_at_unix: a.expire_at_unix,
            marker_ttl_s: 3600,
            release_idempotency: false,
        };
        assert_eq!(
            settle(&st, &s).unwrap(),
            SettleReply {
                applied: true,
                used_after: 110,
                model_used_after: 110
            }
        );
        assert_eq!(
            settle(&st, &s).unwrap(),
            SettleReply {
                applied: false,
                used_after: 110,
                model_used_after: 110
            }
        );
        s.keys = QuotaKeys::new("acme", Some("gpt-4.1"), "2026-11", None, "req-9");
        s.delta = -10_000;
        assert_eq!(
            settle(&st, &s).unwrap(),
            SettleReply {
                applied: true,
                used_after: 0,
                model_used_after: 0
            }
        );
        assert_eq!(st.cli(&["EXPIRETIME", &s.keys.used_total]), "1796688000");
        let ttl: i64 = st.cli(&["TTL", &s.keys.settled]).parse().unwrap();
        assert!((3590..=3600).contains(&ttl));
    }

    #[test]
    fn settlement_without_a_model_touches_only_the_tenant_counter() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.model = None;
        assert_eq!(reserve(&st, &a).unwrap().model_used_after, 0);
        let s = SettleArgs {
            keys: a.keys(),
            delta: 25,
            expire_at_unix: a.expire_at_unix,
            marker_ttl_s: 60,
            release_idempotency: false,
        };
        assert_eq!(
            settle(&st, &s).unwrap(),
            SettleReply {
                applied: true,
                used_after: 175,
                model_used_after: 0
            }
        );
        assert_eq!(st.cli(&["EXISTS", &a.keys().used_model]), "0");
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
        let s = SettleArgs {
            keys: a.keys(),
            delta: -3,
            expire_at_unix: a.expire_at_unix,
            marker_ttl_s: 60,
            release_idempotency: false,
        };
        assert_eq!(settle(&st, &s).unwrap().used_after, 4_000_000_123_456_786);
        assert_eq!(st.cli(&["GET", &a.keys().used_total]), "4000000123456786");
    }

    #[test]
    fn awkward_tenant_model_and_ids_survive_webdis_encoding() {
        let Some(st) = Stack::start() else { return };
        let mut a = base();
        a.tenant = "a/b+c d{x}%.json".into();
        a.model = Some("ft:gpt-4o:org/x.raw".into());
        a.request_id = "id.json".into();
        a.idempotency_key = Some("k+/ .raw".into());
        a.idem_window_s = 60;
        assert!(reserve(&st, &a).unwrap().allowed);
        let k = a.keys();
        assert_eq!(k.used_total, "tg:q:{a%2Fb%2Bc%20d%7Bx%7D%25.json}:2026-11");
        assert_eq!(st.cli(&["GET", &k.used_total]), "150");
        assert_eq!(st.cli(&["GET", &k.used_model]), "150");
        assert_eq!(
            st.cli(&["GET", &k.idem]),
            "2 000000000000feed 0 id.json 1,150,1000,150,-1,0,50,0"
        );
        // Same Redis Cluster slot: Cluster hashes only what lies between the first `{` and the next `}`.
        // (`CLUSTER KEYSLOT` cannot tell: this Redis runs without cluster support and answers an error.)
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
            &k.idem,
            &k.settled,
            &k.request,
            &k.limit_override,
        ] {
            assert_eq!(tag(key), tag(&k.used_total), "{key}");
        }
    }

    #[test]
    fn evalsha_reports_noscript_until_an_eval_loads_the_script() {
        let Some(st) = Stack::start() else { return };
        let a = base();
        st.cli(&["SCRIPT", "FLUSH"]);
        let (s, b) = st.post(&reserve_request(&a, ScriptCall::EvalSha));
        assert_eq!(parse_reserve_reply(s, &b), Err(ShimError::NoScript));
        let (s, b) = st.post(&settle_request(
            &SettleArgs {
                keys: a.keys(),
                delta: 1,
                expire_at_unix: 1,
                marker_ttl_s: 1,
                release_idempotency: false,
            },
            ScriptCall::EvalSha,
        ));
        assert_eq!(parse_settle_reply(s, &b), Err(ShimError::NoScript));
        assert!(reserve(&st, &a).unwrap().allowed); // EVAL
        let (s, b) = st.post(&reserve_request(&a, ScriptCall::EvalSha));
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
        let body = reserve_request(&base(), ScriptCall::Eval).replace("/tg1", "/tg0");
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
        let _ = reserve(&st, &base());
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
