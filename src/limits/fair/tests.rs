use super::*;
use crate::config;
use crate::store::MemStore;

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
const KEY: &str = "tg:fs:p:~all";

/// One shared fair limit `p` of 100 tokens/s, burst 1,000 (and `extra` fields), with group levels
/// org and team.
fn cfg(extra: &str) -> Config {
    cfg_share(r#""fair""#, extra)
}

fn cfg_share(share: &str, extra: &str) -> Config {
    config::parse(
        format!(
            r#"{{"tenant_header": "x-tenant-id","trusted_headers": {{"set_by": "the test"}}, "groups": [{{"name": "org", "header": "x-org"}}, {{"name": "team", "header": "x-team"}}],
                "limits": [{{"name": "p", "scope": "shared", "tokens_per_second": 100, "burst": 1000, "share": {share}{extra}}}]}}"#
        )
        .as_bytes(),
    )
    .unwrap()
}

fn ask(s: &dyn SharedStore, c: &Config, tenant: &str, cost: u64, now: u64) -> Outcome {
    let rule = &c.limits[0];
    let share = rule.fair.as_deref().unwrap();
    let m = member(share, tenant, &c.groups, &[]);
    charge(s, c, rule, KEY, &m, cost, now, None).0
}

fn admitted(o: &Outcome) -> bool {
    matches!(o.decision, Decision::Admit { .. })
}

fn record(s: &MemStore) -> Record {
    store::peek::<Record>(s, KEY).unwrap().0.unwrap()
}

#[test]
fn a_member_alone_may_use_the_whole_limit() {
    let c = cfg("");
    let s = MemStore::new();
    let mut got = 0;
    // 50 tokens every 10 ms (5,000/s asked) for 10 s.
    for k in 0..1000 {
        let o = ask(&s, &c, "solo", 50, k * 10 * MS);
        if admitted(&o) {
            got += 50;
        }
    }
    let bound = 1000.0 + 100.0 * 9.99;
    assert!(got as f64 <= bound, "{got}");
    // All but the reserve the shares keep for newcomers: four average requests here (200 tokens).
    let r = record(&s);
    assert_eq!(r.reserve(), 200.0);
    assert!(got as f64 >= bound - 200.0 - 2.0 * 50.0, "{got} of {bound}");
}

#[test]
fn a_quiet_member_gets_all_it_asks_while_a_heavy_one_gets_the_rest() {
    let c = cfg("");
    let s = MemStore::new();
    let (mut quiet, mut heavy) = (0u64, 0u64);
    let mut quiet_refused = Vec::new();
    // The heavy member asks 10 tokens every 5 ms (2,000/s); the quiet one 10 every 500 ms (20/s).
    for k in 0..4000u64 {
        let now = k * 5 * MS;
        if admitted(&ask(&s, &c, "heavy", 10, now)) {
            heavy += 10;
        }
        if k % 100 == 50 {
            if admitted(&ask(&s, &c, "quiet", 10, now + MS)) {
                quiet += 10;
            } else {
                quiet_refused.push(now / MS);
            }
        }
    }
    assert!(quiet_refused.is_empty(), "refused at {quiet_refused:?} ms");
    assert_eq!(quiet, 400);
    assert!(heavy + quiet <= 1000 + 100 * 20);
    assert!(
        (heavy + quiet) as f64 >= 0.95 * (1000.0 + 100.0 * 20.0),
        "{heavy}"
    );
}

#[test]
fn stale_reads_from_another_worker_never_admit_more_than_the_bucket() {
    // Worker A reads in the headers phase; worker B charges; A's charge must start over from B's
    // write (the CAS), not from its stale read.
    let c = cfg("");
    let s = MemStore::new();
    let rule = &c.limits[0];
    let share = rule.fair.as_deref().unwrap();
    let (a, b) = (
        member(share, "a", &c.groups, &[]),
        member(share, "b", &c.groups, &[]),
    );
    let mut admitted_tokens = 0;
    for k in 0..200u64 {
        let now = k * MS;
        let mut seen = None;
        let _ = precheck(&s, rule, KEY, now, &mut seen);
        let (o, _) = charge(&s, &c, rule, KEY, &b, 20, now, None);
        if admitted(&o) {
            admitted_tokens += 20;
        }
        let (o, _) = charge(&s, &c, rule, KEY, &a, 20, now, seen);
        if admitted(&o) {
            admitted_tokens += 20;
        }
    }
    assert!(
        admitted_tokens as f64 <= 1000.0 + 100.0 * 0.2,
        "{admitted_tokens}"
    );
}

#[test]
fn a_lower_level_gets_nothing_while_a_higher_one_wants_everything() {
    let c = cfg(
        r#", "priority": {"levels": ["interactive", "batch"], "members": {"nightly": "batch"}}"#,
    );
    let s = MemStore::new();
    // The interactive member asks far more than the limit for a second.
    for k in 0..400u64 {
        ask(&s, &c, "app", 20, k * 2500 * 1000);
    }
    let now = S + 10 * MS;
    let o = ask(&s, &c, "nightly", 10, now);
    assert_eq!(o.why, Some(Why::OverShare), "{o:?}");
    assert_eq!(o.view.share, 0.0);
    match &o.decision {
        Decision::Reject(r) => {
            assert_eq!(r.class, Class::TokensPerSecond);
            assert_eq!(r.retry_after_s, Some(1.0), "a window");
            assert!(r
                .message
                .starts_with("Fair share reached for tokens (limit 'p')"));
        }
        other => panic!("{other:?}"),
    }
    // Once the interactive member is gone for a window, batch gets the limit.
    let later = now + 3 * S;
    assert!(admitted(&ask(&s, &c, "nightly", 10, later)));
}

#[test]
fn weights_split_what_heavy_members_get() {
    let c = cfg(r#", "weights": {"big": 3}"#);
    let s = MemStore::new();
    let (mut big, mut small) = (0u64, 0u64);
    // Both ask 10 tokens every 2 ms for 30 s; the burst is counted out (first 10 s).
    for k in 0..15_000u64 {
        let now = k * 2 * MS;
        let count = now >= 10 * S;
        if admitted(&ask(&s, &c, "big", 10, now)) && count {
            big += 10;
        }
        if admitted(&ask(&s, &c, "small", 10, now + MS)) && count {
            small += 10;
        }
    }
    let ratio = big as f64 / small as f64;
    assert!((ratio - 3.0).abs() <= 0.3, "{big} / {small} = {ratio}");
}

#[test]
fn members_past_max_members_share_the_overflow_slot_and_idle_ones_free_theirs() {
    let c = cfg_share(r#"{"max_members": 2}"#, "");
    let s = MemStore::new();
    assert!(!ask(&s, &c, "a", 1, 0).view.overflow);
    assert!(!ask(&s, &c, "b", 1, MS).view.overflow);
    let o = ask(&s, &c, "c", 1, 2 * MS);
    assert!(o.view.overflow, "a third member has no slot of its own");
    assert!(ask(&s, &c, "d", 1, 3 * MS).view.overflow);
    let len = store::MemStore::get(&s, KEY).unwrap().unwrap().0.len();
    assert_eq!(len, 200 + 64 * 3);
    // `a` stays active; `b` is silent for more than a window: `c` takes its slot.
    ask(&s, &c, "a", 1, S);
    assert!(!ask(&s, &c, "c", 1, S + 10 * MS).view.overflow);
    assert_eq!(
        store::MemStore::get(&s, KEY).unwrap().unwrap().0.len(),
        len,
        "the record never grows"
    );
}

#[test]
fn a_cost_above_the_burst_is_413_and_writes_nothing() {
    let c = cfg("");
    let s = MemStore::new();
    ask(&s, &c, "a", 10, 0);
    let (_, cas) = s.get(KEY).unwrap().unwrap();
    let o = ask(&s, &c, "a", 1001, MS);
    assert!(
        matches!(&o.decision, Decision::Reject(r) if r.class == Class::CostExceedsBurst),
        "{o:?}"
    );
    assert_eq!(s.get(KEY).unwrap().unwrap().1, cas);
}

#[test]
fn an_empty_bucket_refuses_as_limit_empty_and_the_precheck_sees_it() {
    let c = cfg("");
    let s = MemStore::new();
    let rule = &c.limits[0];
    assert!(admitted(&ask(&s, &c, "a", 1000, 0)));
    let o = ask(&s, &c, "b", 10, MS);
    assert_eq!(o.why, Some(Why::LimitEmpty));
    assert!(matches!(&o.decision, Decision::Reject(r) if r.class == Class::TokensPerSecond));
    let r = precheck(&s, rule, KEY, 2 * MS, &mut None).unwrap().unwrap();
    assert_eq!(r.limit_name.as_deref(), Some("p"));
    assert_eq!(precheck(&s, rule, KEY, 20 * MS, &mut None), Ok(None));
    s.set(KEY, b"garbage", 0).unwrap();
    assert_eq!(precheck(&s, rule, KEY, 0, &mut None), Err(true));
    // A corrupt record is started afresh by the charge (full bucket), and flagged.
    let m = member(rule.fair.as_deref().unwrap(), "a", &c.groups, &[]);
    let (o, stats) = charge(&s, &c, rule, KEY, &m, 10, 30 * MS, None);
    assert!(stats.corrupt && admitted(&o));
}

#[test]
fn credit_gives_back_to_the_bucket_and_to_the_member() {
    let c = cfg("");
    let s = MemStore::new();
    let rule = &c.limits[0];
    let m = member(rule.fair.as_deref().unwrap(), "a", &c.groups, &[]);
    assert!(admitted(&ask(&s, &c, "a", 1000, 0)));
    let before = record(&s).table(&Tuning::of(rule.fair.as_deref().unwrap()), 0);
    credit(&s, &c, rule, KEY, m.hash, 600, 0).unwrap();
    let r = record(&s);
    assert_eq!(r.bucket().tokens, 600.0);
    let after = r.table(&Tuning::of(rule.fair.as_deref().unwrap()), 0);
    assert_eq!(after[0].2, before[0].2 + 600.0);
    // Taken back (usage above the charge): the bucket goes into debt, at most one burst deep.
    credit(&s, &c, rule, KEY, m.hash, -5000, 0).unwrap();
    assert_eq!(record(&s).bucket().tokens, -1000.0);
}

#[test]
fn a_record_of_another_shape_keeps_its_bucket_and_starts_its_table_afresh() {
    let s = MemStore::new();
    let c = cfg("");
    assert!(admitted(&ask(&s, &c, "a", 900, 0)));
    let c2 = cfg(r#", "priority": {"levels": ["hi", "lo"]}"#);
    let o = ask(&s, &c2, "a", 200, 0);
    assert_eq!(
        o.why,
        Some(Why::LimitEmpty),
        "the bucket was kept: 100 left"
    );
    let r = record(&s);
    assert_eq!(r.levels(), 2);
    assert_eq!(r.bucket().tokens, 100.0);
}

#[test]
fn the_clock_going_back_refills_and_accrues_nothing() {
    let c = cfg("");
    let s = MemStore::new();
    assert!(admitted(&ask(&s, &c, "a", 1000, 10 * S)));
    let o = ask(&s, &c, "a", 10, 5 * S);
    assert_eq!(o.why, Some(Why::LimitEmpty));
    let r = record(&s);
    assert_eq!(r.bucket().updated_ns, 10 * S);
}

#[test]
fn records_round_trip_and_reject_a_wrong_length_or_version() {
    let b = BucketState {
        tokens: 5.5,
        requests: 1.0,
        updated_ns: 7,
    };
    let r = Record::fresh(4, 2, &b);
    let bytes = r.encode();
    assert_eq!(bytes.len(), 200 + 64 * 5);
    assert_eq!(Record::decode(&bytes), Some(r.clone()));
    assert_eq!(Record::decode(&bytes[..bytes.len() - 1]), None);
    let mut v = bytes.clone();
    v[0] = 2;
    assert_eq!(Record::decode(&v), None);
    let mut v = bytes.clone();
    v[1] = 0;
    assert_eq!(Record::decode(&v), None, "no level");
    let mut v = bytes;
    v[8..16].copy_from_slice(&f64::NAN.to_le_bytes());
    assert_eq!(Record::decode(&v), None);
    assert_eq!(r.bucket(), b);
}

#[test]
fn group_members_are_keyed_by_their_path_and_weighed_by_their_id() {
    let c = config::parse(
        br#"{"tenant_header": "x-tenant-id","trusted_headers": {"set_by": "the test"}, "groups": [{"name": "org", "header": "x-org"}, {"name": "team", "header": "x-team"}],
             "limits": [{"name": "p", "scope": "org", "tokens_per_second": 10, "burst": 10,
                         "share": {"by": "team"}, "weights": {"search": 4}}]}"#,
    )
    .unwrap();
    let share = c.limits[0].fair.as_deref().unwrap();
    let acme = [Some("acme".to_string()), Some("search".to_string())];
    let globex = [Some("globex".to_string()), Some("search".to_string())];
    let a = member(share, "alice", &c.groups, &acme);
    let g = member(share, "bob", &c.groups, &globex);
    assert_eq!(a.id, "org=acme/team=search");
    assert_ne!(a.hash, g.hash);
    assert_eq!((a.weight, g.weight), (4.0, 4.0));
    let none = member(share, "carol", &c.groups, &[Some("acme".to_string()), None]);
    assert_eq!((none.id.as_ref(), none.weight), ("~none", 1.0));
}

#[test]
fn record_keys_are_bounded_by_max_tenants() {
    let c = config::parse(
        br#"{"tenant_header": "x-tenant-id","trusted_headers": {"set_by": "the test"}, "group_header": "x-team", "max_tenants": 2,
             "limits": [{"name": "p", "scope": "group", "tokens_per_second": 10, "burst": 10, "share": "fair"}]}"#,
    )
    .unwrap();
    let s = MemStore::new();
    let mut known = KeySet::default();
    let mut overflow = 0;
    for t in 0..10 {
        let (k, info) = record_key(
            &s,
            &c,
            &mut known,
            100,
            &c.limits[0],
            &format!("group=t{t}"),
            "m",
        );
        assert!(k.starts_with("tg:fs:p:"), "{k}");
        overflow += usize::from(info.overflow);
        s.set(&k, b"x", 0).unwrap();
    }
    assert_eq!(overflow, 8);
}

#[test]
fn any_bytes_of_a_record_s_shape_decide_without_panicking() {
    // Shared data is written by this filter only, but a record is still bytes: whatever they hold
    // (NaN, infinities, huge or negative numbers, levels out of range), a decision is made.
    let c = cfg(r#", "priority": {"levels": ["a", "b", "c"]}"#);
    let rule = &c.limits[0];
    let share = rule.fair.as_deref().unwrap();
    let t = Tuning::of(share);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let m = member(share, "a", &c.groups, &[]);
    let mut decided = 0;
    for _ in 0..2000 {
        let members = share.max_members;
        let mut b = Record::fresh(members, 3, &BucketState::full(&rule.params, 0)).encode();
        for byte in b.iter_mut().skip(1) {
            if next() % 3 == 0 {
                *byte = next() as u8;
            }
        }
        b[1] = 1 + (next() % 8) as u8;
        b[2..4].copy_from_slice(&members.to_le_bytes());
        if let Some(r) = Record::decode(&b) {
            let (_, _, next_rec) = decide(
                &r,
                share,
                &rule.params,
                &t,
                &m,
                next() % 2000,
                next() % (100 * S),
            );
            if let Some(n) = next_rec {
                assert!(Record::decode(&n.encode()).is_some());
            }
            decided += 1;
        }
    }
    assert!(decided > 100, "{decided}");
}
