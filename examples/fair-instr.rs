//! Instructions per request of a fair limit's pure code against a plain shared limit's, counted natively
//! by callgrind (deterministic, unlike timings on a shared machine): the same traffic — five tenants on a
//! 3,000 tokens/s shared limit, two quiet and three heavy, every request a headers-phase read and a
//! body-phase charge — through `limits::local` (plain) and `limits::fair` (fair, 64 and 16 members).
//!
//! `valgrind --tool=callgrind --toggle-collect='*measure_*' target/release/examples/fair-instr` counts
//! both (`FAIR_INSTR_LIGHT=1`: a light load that every request passes, as in `make bench`); `callgrind_annotate` then shows `measure_plain`, `measure_fair_64` and `measure_fair_16`
//! inclusive (each serves the same [`REQUESTS`] requests). Run alone it prints what each admitted and
//! the record sizes. The host calls themselves (one read and one CAS write per request in both, the
//! write only for admitted requests in the plain one) are not in these counts: in Envoy they cost
//! 8–12 k instructions each (docs/benchmarks.md), plus the copy of the record.
//!
//! In a wasm engine: `cargo build --release --target wasm32-wasip1 --example fair-instr`, then run
//! `fair-instr <plain|fair64|fair16> <n>` under callgrind with node's WASI (V8, as in Envoy) for two
//! values of n and divide the difference by the requests (docs/fair-share.md, "Cost").

use std::hint::black_box;
use tokengate::config::{self, Config};
use tokengate::limits::{fair, local};
use tokengate::store::{MemStore, SharedStore};

/// Requests per measured run.
const REQUESTS: u64 = 20_000;

fn config(fair_members: Option<u16>) -> Config {
    let share = match fair_members {
        Some(n) => format!(r#", "share": {{"max_members": {n}}}"#),
        None => String::new(),
    };
    config::parse(
        format!(
            r#"{{"tenant_header": "x-tenant-id","trusted_headers": {{"set_by": "the test"}}, "limits": [{{"name": "p", "scope": "shared",
                "tokens_per_second": 3000, "burst": 10000{share}}}]}}"#
        )
        .as_bytes(),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

const TENANTS: [&str; 5] = ["quiet550", "quiet330", "heavy1", "heavy2", "heavy3"];

/// Request `k` of the traffic: (tenant, cost, now): 5,000 requests per second, heavy ones 90 % of them
/// (most refused); with `FAIR_INSTR_LIGHT` set, 10 requests per second (every one admitted, as in
/// `make bench`).
fn request(k: u64) -> (&'static str, u64, u64) {
    static GAP: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let gap = *GAP.get_or_init(|| {
        if std::env::var_os("FAIR_INSTR_LIGHT").is_some() {
            100_000_000
        } else {
            200_000
        }
    });
    let now = k * gap;
    let t = match k % 20 {
        0 => 0,
        10 => 1,
        n => 2 + (n % 3) as usize,
    };
    (TENANTS[t], if t < 2 { 55 } else { 212 }, now)
}

#[inline(never)]
fn measure_plain(s: &dyn SharedStore, c: &Config) -> u64 {
    let rule = &c.limits[0];
    let mut admitted = 0;
    for k in 0..REQUESTS {
        let (_, cost, now) = request(k);
        let key = "tg:b:p:~all";
        let mut seen = None;
        if let Ok(Some(_)) = local::precheck(s, rule, key, now, &mut seen) {
            continue;
        }
        let (d, _) = local::charge(s, c, rule, key, black_box(cost), now, seen);
        if matches!(d, local::Decision::Admit { .. }) {
            admitted += cost;
        }
    }
    admitted
}

#[inline(never)]
fn run_fair(s: &dyn SharedStore, c: &Config) -> u64 {
    let rule = &c.limits[0];
    let share = rule.fair.as_deref().unwrap_or_else(|| panic!("fair"));
    let members: Vec<fair::Member> = TENANTS
        .iter()
        .map(|t| fair::member(share, t, &c.groups, &[]))
        .collect();
    let mut admitted = 0;
    for k in 0..REQUESTS {
        let (tenant, cost, now) = request(k);
        let m = TENANTS
            .iter()
            .position(|t| *t == tenant)
            .and_then(|i| members.get(i))
            .unwrap_or_else(|| panic!("member"));
        let key = "tg:fs:p:~all";
        let mut seen = None;
        if let Ok(Some(_)) = fair::precheck(s, rule, key, now, &mut seen) {
            continue;
        }
        let (o, _) = fair::charge(s, c, rule, key, m, black_box(cost), now, seen);
        if matches!(o.decision, local::Decision::Admit { .. }) {
            admitted += cost;
        }
    }
    admitted
}

#[inline(never)]
fn measure_fair_64(s: &dyn SharedStore, c: &Config) -> u64 {
    run_fair(s, c) + black_box(64)
}

#[inline(never)]
fn measure_fair_16(s: &dyn SharedStore, c: &Config) -> u64 {
    run_fair(s, c) + black_box(16)
}

fn main() {
    // `fair-instr <plain|fair64|fair16> <n>`: only that run, n times the traffic (for a wasm build run
    // by a wasm engine under callgrind, where functions have no names: count a run with n and one with
    // 0, and divide the difference).
    let args: Vec<String> = std::env::args().collect();
    if let (Some(which), Some(n)) = (args.get(1), args.get(2).and_then(|n| n.parse::<u64>().ok())) {
        let s = MemStore::new();
        let mut admitted = 0;
        for _ in 0..n {
            admitted += match which.as_str() {
                "plain" => measure_plain(&s, &config(None)),
                "fair64" => measure_fair_64(&s, &config(Some(64))) - 64,
                _ => measure_fair_16(&s, &config(Some(16))) - 16,
            };
        }
        println!("{which} x{n}: admitted {admitted}");
        return;
    }
    let plain = config(None);
    let fair64 = config(Some(64));
    let fair16 = config(Some(16));
    let (s1, s2, s3) = (MemStore::new(), MemStore::new(), MemStore::new());
    let a = measure_plain(&s1, &plain);
    let b = measure_fair_64(&s2, &fair64) - 64;
    let c = measure_fair_16(&s3, &fair16) - 16;
    let len = |s: &MemStore, k: &str| s.get(k).ok().flatten().map_or(0, |(v, _)| v.len());
    println!(
        "{REQUESTS} requests over {:.1} s: admitted plain {a}, fair(64) {b}, fair(16) {c} tokens; record bytes: plain {}, fair(64) {}, fair(16) {}; reads plain {}, fair(64) {}",
        request(REQUESTS).2 as f64 / 1e9,
        len(&s1, "tg:b:p:~all"),
        len(&s2, "tg:fs:p:~all"),
        len(&s3, "tg:fs:p:~all"),
        s1.reads(),
        s2.reads()
    );
}
