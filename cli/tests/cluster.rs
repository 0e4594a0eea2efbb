//! `tokengate` against the Redis Cluster of `make fleet` (3 masters behind Envoy's `redis_proxy` and
//! Webdis, `wasm-test/src/cluster.rs`): the filter's scripts write through the proxy, the CLI reads the
//! cluster directly from one node (`--redis` names any node; `INFO cluster` tells it is a cluster). The
//! report covers the tenants of every master; overrides, a give-back and the lease list reach the node
//! that holds each account's slot. Needs `ENVOY_BIN` (the proxy is an Envoy) as `make test` sets it.

mod common;

use common::{have_redis, now, ok, rows, write, Scripts};
use std::collections::BTreeSet;
use wasm_test::cluster::{key_slot, ClusterOpts, ClusterShim, ProxyOpts};
use wasm_test::TempDir;

#[test]
fn the_cli_reads_and_writes_a_redis_cluster_from_any_node() {
    if !have_redis() {
        return;
    }
    let shim = ClusterShim::start(
        ClusterOpts {
            replicas: 0,
            ..ClusterOpts::default()
        },
        ProxyOpts::default(),
    );
    let s = Scripts {
        webdis_port: shim.webdis.port,
        month: tokengate::quota::calendar::month_label(now(), 0),
    };
    // 12 tenants: their slots spread over the three masters.
    let tenants: Vec<String> = (0..12).map(|i| format!("tenant-{i}")).collect();
    let mut masters = BTreeSet::new();
    for (i, t) in tenants.iter().enumerate() {
        let id = format!("r{i}");
        assert!(s.reserve(t, Some("gpt-x"), &id, 100, 100, 1_000_000));
        s.settle(t, Some("gpt-x"), &id, 10 + i as u64);
        masters.insert(shim.cluster.master_of(&format!("tg:q:{{{t}}}:{}", s.month)));
    }
    assert_eq!(masters.len(), 3, "the tenants sit on every master");
    assert_eq!(
        s.lease("tenant-3", Some("gpt-x"), 0xabc, 5_000, 1_000_000),
        5_000
    );

    let dir = TempDir::new("cli-cluster");
    let cfg = write(
        dir.path(),
        "config.json",
        r#"{"rules": [{"tokens_per_second": 1, "burst": 1}],
            "quota": {"cluster": "webdis", "monthly_limit": 1000000, "lease": {}}}"#,
    );
    // Any node will do as the seed: the last port is a master too (no replicas here).
    let seed = format!(
        "redis://127.0.0.1:{}",
        shim.cluster.ports().last().copied().unwrap()
    );
    let tg = |args: &[&str]| {
        let mut a = vec!["--config", cfg.as_str(), "--redis", seed.as_str()];
        a.extend_from_slice(args);
        ok(&a)
    };
    let json = tg(&["usage", "--format", "json"]);
    let r = rows(&json);
    assert_eq!(r.len(), 12, "{json}");
    for (i, t) in tenants.iter().enumerate() {
        let row = r.iter().find(|x| &x.0 == t).unwrap();
        let key = format!("tg:q:{{{t}}}:{}", s.month);
        let counter = shim.cluster.get_int(&key).unwrap();
        assert_eq!(row.3, counter, "{t}: the report is the counter");
        let lease = if t == "tenant-3" { 5_000 } else { 0 };
        assert_eq!((row.4, row.6), (lease, 10 + i as i64), "{t}");
    }
    // Writes reach the slot's master, whichever node was the seed.
    tg(&["override", "set", "--tenant", "tenant-7", "--limit", "123"]);
    let key = "tg:q:{tenant-7}:limit";
    assert_eq!(
        shim.cluster.get_int(key),
        Some(123),
        "slot {}",
        key_slot(key)
    );
    assert!(tg(&["override", "list"]).contains("tenant-7"));
    let out = tg(&["month", "give-back", "tenant-3"]);
    assert!(out.contains("5013 -> 5000 tokens"), "{out}");
    let leases = tg(&["leases"]);
    assert!(
        leases.contains("tenant-3") && leases.contains("abc"),
        "{leases}"
    );
    println!("{}", tg(&["usage", "--by", "model"]));
}
