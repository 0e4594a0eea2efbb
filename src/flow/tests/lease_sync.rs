//! Quota lease syncs: the leader's walk over the accounts, many accounts' syncs in one script call, and
//! the input/output split each sync reports.

use super::lease::{
    account, cfg, granted_a_lease, lease_calls, lease_reply, only_lease_calls, usage_answer,
};
use super::*;
use crate::flow::Metric;

#[test]
fn the_leader_walks_the_accounts_every_100_ms_not_at_every_tick() {
    let e = envoy(cfg(json!({})));
    granted_a_lease(&e);
    let tick_reads = |ms: u64| {
        e.advance_ms(ms);
        let r = e.store.reads();
        e.tick(0);
        e.store.reads() - r
    };
    // The walk's reads (claim, registry count, slot, account) come once per WALK_MS.
    let walk = tick_reads(crate::flow::vm::leases::WALK_MS);
    let between = tick_reads(20);
    assert!(
        between < walk,
        "a tick between walks reads less ({between}) than a walk ({walk})"
    );
    assert!(tick_reads(80) > between, "the next walk after 100 ms");
}

/// The lease calls among the root callouts: the accounts of each, by tenant key (`{t}`) — one for the
/// lease script alone, several for the batch script.
fn lease_call_tenants(e: &FakeEnvoy) -> Vec<Vec<String>> {
    use crate::quota::lease::redis::LEASE_KEYS;
    e.root_callouts
        .borrow()
        .iter()
        .filter(|c| matches!(c.purpose, crate::flow::Purpose::Lease(_)))
        .map(|c| {
            let seg = segments(&c.body);
            let nkeys: usize = seg[2].parse().unwrap();
            seg[3..3 + nkeys]
                .chunks(LEASE_KEYS)
                .map(|k| k[0].split(['{', '}']).nth(1).unwrap().to_string())
                .collect()
        })
        .collect()
}

/// The body of the first lease call among the root callouts.
fn first_lease_body(e: &FakeEnvoy) -> String {
    e.root_callouts
        .borrow()
        .iter()
        .find(|c| matches!(c.purpose, crate::flow::Purpose::Lease(_)))
        .map(|c| c.body.clone())
        .expect("a lease call")
}

/// Tenants `t0..tn` each send a request reserved per request: each account asks for a lease.
fn cold_tenants(e: &FakeEnvoy, n: usize) {
    for i in 0..n {
        let t = format!("t{i}");
        let mut c = e.send(
            "/v1/chat/completions",
            &[("x-tenant-id", &t)],
            &chat("m", "hi", 50),
        );
        assert!(c.pending.is_some(), "per-request reservation");
        e.reply(&mut c, 200, &reserved(60, 1_000_000));
        usage_answer(e, &mut c, 30);
    }
}

/// A batch reply granting each of `n` accounts `held` (statuses in `refused` are refusals).
fn batch_grant(n: usize, held: i64, refused: &[(usize, i64)]) -> String {
    let mut v = Vec::new();
    for i in 0..n {
        match refused.iter().find(|(j, _)| *j == i) {
            Some((_, code)) => v.extend([*code, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            None => v.extend([0, held, 1060, 1_000_000, 1060, -1, 1, 0, 0, 0]),
        }
    }
    eval(&v)
}

#[test]
fn many_accounts_that_need_a_sync_in_one_tick_go_to_redis_in_one_script_call() {
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    cold_tenants(&e, 20);
    e.tick(0);
    let calls = lease_call_tenants(&e);
    assert_eq!(calls.len(), 1, "one call: {calls:?}");
    let mut tenants = calls[0].clone();
    tenants.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("t{i}")).collect();
    want.sort();
    assert_eq!(tenants, want);
    assert_eq!(e.metric(Metric::QuotaLeaseSyncs), 1);
    let order = calls[0].clone();
    let body = first_lease_body(&e);
    assert!(
        body.starts_with("EVAL/"),
        "the batch script is not loaded yet"
    );
    only_lease_calls(&e);
    // Each account gets its own answer: t{order[3]} is refused (not a count), the others granted.
    e.reply_root(0, 200, &batch_grant(20, 1000, &[(3, 3)]));
    assert_eq!(e.metric(Metric::QuotaShimErrors), 1);
    for (i, t) in order.iter().enumerate() {
        let c = e.send(
            "/v1/chat/completions",
            &[("x-tenant-id", t)],
            &chat("m", "hi", 50),
        );
        if i == 3 {
            assert!(
                c.pending.is_some(),
                "{t}: its sync failed, reserved per request"
            );
        } else {
            assert!(
                c.forwarded && c.pending.is_none(),
                "{t}: served from its lease"
            );
        }
    }
    // The refused account is asked again at the next tick, alone: the lease script itself.
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    let again = lease_call_tenants(&e);
    assert_eq!(again, vec![vec![order[3].clone()]]);
    let body = first_lease_body(&e);
    assert!(
        segments(&body).iter().any(|s| s == "tg3") && !body.contains("tgLb"),
        "{body}"
    );
}

#[test]
fn a_batch_behind_a_redis_cluster_is_sent_again_per_tenant_and_a_batch_noscript_as_eval() {
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    cold_tenants(&e, 6);
    e.tick(0);
    assert_eq!(lease_call_tenants(&e).len(), 1);
    only_lease_calls(&e);
    e.reply_root(
        0,
        200,
        r#"{"EVAL":[false,"CROSSSLOT Keys in request don't hash to the same slot"]}"#,
    );
    // Nothing ran, and it is no shim failure: every account goes again, each tenant's apart.
    assert_eq!(e.metric(Metric::QuotaShimErrors), 0);
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    let calls = lease_call_tenants(&e);
    assert_eq!(calls.len(), 6, "{calls:?}");
    assert!(calls.iter().all(|c| c.len() == 1));
    // Without a cluster, a batch answered NOSCRIPT goes again as EVAL, then EVALSHA once answered.
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    cold_tenants(&e, 4);
    e.tick(0);
    only_lease_calls(&e);
    e.reply_root(0, 200, &batch_grant(4, 1000, &[]));
    // Every account spends, then its refresh comes: one batch, by EVALSHA now.
    for i in 0..4 {
        let t = format!("t{i}");
        let mut c = e.send(
            "/v1/chat/completions",
            &[("x-tenant-id", &t)],
            &chat("m", "hi", 50),
        );
        usage_answer(&e, &mut c, 40);
    }
    e.advance_ms(1_100);
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    let sent = |e: &FakeEnvoy| {
        e.root_callouts
            .borrow()
            .iter()
            .filter(|c| matches!(c.purpose, crate::flow::Purpose::Lease(_)))
            .map(|c| c.body.split('/').next().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(sent(&e), ["EVALSHA"]);
    assert_eq!(lease_call_tenants(&e)[0].len(), 4);
    e.reply_root(0, 200, r#"{"EVAL":[false,"NOSCRIPT No matching script"]}"#);
    assert_eq!(e.metric(Metric::QuotaShimErrors), 0);
    e.tick(0);
    assert_eq!(sent(&e), ["EVAL"]);
    assert_eq!(lease_call_tenants(&e)[0].len(), 4);
}

/// Answers every lease call among the root callouts, granting each account `held`; returns the
/// tenants of the accounts answered.
fn grant_all(e: &FakeEnvoy, held: i64) -> Vec<String> {
    let calls = lease_call_tenants(e);
    only_lease_calls(e);
    let mut tenants = Vec::new();
    for accounts in calls {
        let body = if accounts.len() == 1 {
            lease_reply(held, 1060, 1, 0)
        } else {
            batch_grant(accounts.len(), held, &[])
        };
        e.reply_root(0, 200, &body);
        tenants.extend(accounts);
    }
    tenants
}

#[test]
fn with_many_accounts_the_leader_walks_them_all_once_per_refresh() {
    // 600 accounts and refresh_ms 200: a walk of 160 accounts per 100 ms would take 375 ms to see
    // them all; each must be reported within refresh_ms (and a tick) of its usage.
    let e = envoy(cfg(json!({"min_tokens": 1000, "refresh_ms": 200})));
    let n = 600;
    cold_tenants(&e, n);
    let mut granted = std::collections::HashSet::new();
    for _ in 0..200 {
        e.advance_ms(20);
        e.tick(0);
        granted.extend(grant_all(&e, 1000));
        e.root_callouts.borrow_mut().clear();
        if granted.len() == n {
            break;
        }
    }
    assert_eq!(granted.len(), n, "every account leased");
    // Every account spends from its lease.
    for i in 0..n {
        let t = format!("t{i}");
        let mut c = e.send(
            "/v1/chat/completions",
            &[("x-tenant-id", &t)],
            &chat("m", "hi", 50),
        );
        assert!(
            c.forwarded && c.pending.is_none(),
            "{t}: served from its lease"
        );
        usage_answer(&e, &mut c, 40);
    }
    e.advance_ms(200);
    let mut synced = std::collections::HashSet::new();
    for _ in 0..11 {
        e.advance_ms(20);
        e.tick(0);
        synced.extend(grant_all(&e, 1000));
        e.root_callouts.borrow_mut().clear();
    }
    assert_eq!(
        synced.len(),
        n,
        "every account reported within refresh_ms + a tick"
    );
}

#[test]
fn a_walk_covers_every_account_once_per_refresh_within_its_bounds() {
    use crate::flow::vm::leases::{walk_size, MAX_SCAN_PER_WALK, SCAN_PER_WALK};
    // Few accounts: the floor, 160 per 100 ms.
    assert_eq!(walk_size(100, 100, 1000), 100);
    assert_eq!(walk_size(1_000, 100, 1000), SCAN_PER_WALK);
    // 10,000 accounts at every 20 ms tick, refresh 1 s: 200 a tick, all of them in 50 ticks.
    assert_eq!(walk_size(10_000, 20, 1000), 200);
    // Never more than the cap (a first walk, or a long pause).
    assert_eq!(walk_size(100_000, 60_000, 1000), MAX_SCAN_PER_WALK);
    assert_eq!(walk_size(5, 0, 0), 1);
}

/// The lease calls' input/output totals (their last two arguments).
fn lease_io(e: &FakeEnvoy) -> Vec<(String, String)> {
    e.root_callouts
        .borrow()
        .iter()
        .filter(|c| matches!(c.purpose, crate::flow::Purpose::Lease(_)))
        .map(|c| {
            let seg = segments(&c.body);
            let nkeys: usize = seg[2].parse().unwrap();
            let a = &seg[3 + nkeys..];
            (a[14].clone(), a[15].clone())
        })
        .collect()
}

fn io_record(e: &FakeEnvoy) -> Option<crate::quota::lease::io::Io> {
    let key = crate::quota::lease::account::account_key("acme", Some("m"));
    crate::store::peek::<crate::quota::lease::io::Io>(
        &e.store,
        &crate::quota::lease::io::io_key(&key),
    )
    .unwrap()
    .0
}

#[test]
fn leased_requests_report_their_input_and_output_tokens_with_the_lease_at_the_tick() {
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    granted_a_lease(&e);
    for total in [40, 50, 61] {
        let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
        assert!(c.forwarded && c.pending.is_none(), "served from the lease");
        usage_answer(&e, &mut c, total);
    }
    // Kept by the VM until its tick: no shared-data write per request for the split.
    assert_eq!(io_record(&e), None);
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    let month = account(&e).month;
    // Prompt tokens 20 + 25 + 30, completion 20 + 25 + 31.
    assert_eq!(io_record(&e).unwrap().get(month), (75, 76));
    // The next sync reports them, with the usage.
    e.advance_ms(1_100);
    e.tick(0);
    let calls = lease_calls(&e);
    assert_eq!(calls.last().map(|c| c.0.as_str()), Some("151"));
    assert_eq!(
        lease_io(&e).last(),
        Some(&("75".to_string(), "76".to_string()))
    );
    // Redis answers that it holds more for the lease than was sent (the record was lost since it
    // reported 1,000 / 400): the record is raised so that the next report adds exactly 75 / 76.
    only_lease_calls(&e);
    e.reply_root(
        0,
        200,
        &eval(&[1000, 1211, 1_000_000, 1211, -1, 2, 151, 1000, 400]),
    );
    assert_eq!(io_record(&e).unwrap().get(month), (1075, 476));
    // An answer at or below what was sent changes nothing (no write).
    e.advance_ms(1_100);
    e.root_callouts.borrow_mut().clear();
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    usage_answer(&e, &mut c, 10);
    e.tick(0);
    assert_eq!(
        lease_io(&e).last(),
        Some(&("1080".to_string(), "481".to_string()))
    );
    e.reply_root(
        0,
        200,
        &eval(&[1000, 1221, 1_000_000, 1221, -1, 3, 161, 1080, 481]),
    );
    assert_eq!(io_record(&e).unwrap().get(month), (1080, 481));
}

#[test]
fn a_worker_torn_down_writes_the_split_of_the_leased_requests_it_kept() {
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    granted_a_lease(&e);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    usage_answer(&e, &mut c, 40);
    assert_eq!(io_record(&e), None);
    e.done(0);
    let month = account(&e).month;
    assert_eq!(io_record(&e).unwrap().get(month), (20, 20));
}

#[test]
fn last_months_ended_request_is_not_written_into_its_account_before_its_split() {
    // A request of the new month on the VM that kept a November request's end: written with it, the
    // end would let the leader give November's lease back (nothing in flight) and report its usage
    // before the tick wrote its input/output tokens, which no later sync of November would report.
    let e = envoy(cfg(json!({"min_tokens": 1000})));
    let dec_1: u64 = 1_796_083_200;
    e.now.set((dec_1 - 30) * 1_000_000_000);
    granted_a_lease(&e);
    let nov = account(&e).month;
    assert_eq!(nov, 202611);
    let mut c = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(c.forwarded && c.pending.is_none(), "served from the lease");
    let in_flight = account(&e).inflight;
    usage_answer(&e, &mut c, 40);
    e.advance_ms(31_000);
    // December: the account still holds November's lease; this request goes per request, and
    // November's request stays in flight until the tick.
    let c2 = e.send("/v1/chat/completions", &[TENANT], &chat("m", "hi", 50));
    assert!(c2.pending.is_some(), "per-request reservation");
    let a = account(&e);
    assert_eq!((a.month, a.inflight), (nov, in_flight));
    assert_eq!(io_record(&e), None);
    // The tick writes the split, then the end: the sync that gives November back carries both.
    e.root_callouts.borrow_mut().clear();
    e.tick(0);
    assert_eq!(io_record(&e).unwrap().get(nov), (20, 20));
    let a = account(&e);
    assert_eq!((a.inflight, a.consumed), (0, 40));
    let calls = lease_calls(&e);
    let io = lease_io(&e);
    let last = calls.iter().zip(io.iter()).find(|(c, _)| c.2 == "0");
    assert_eq!(
        last,
        Some((
            &("40".to_string(), "0".to_string(), "0".to_string()),
            &("20".to_string(), "20".to_string())
        )),
        "{calls:?} {io:?}"
    );
}
