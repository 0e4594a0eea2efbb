//! Admission: from (tenant, model, estimated cost, now) to a decision on the shared buckets. Pure except
//! for the [`SharedStore`] it is handed, so it runs natively against [`crate::store::MemStore`].
//!
//! * [`bucket_key`] names the bucket of a rule for a tenant (and model, for per-model rules) and bounds
//!   how many bucket keys exist: a shared counter (`tg:n:buckets`) admits at most `max_tenants` keys;
//!   past that, new (tenant, model) pairs share one of 64 overflow buckets of their rule
//!   (`tg:b:<rule>:~overflow<N>`), counted by `tokengate_tenant_overflow`. Shared data never evicts, so
//!   the filter's memory stays bounded at roughly `(max_tenants + 64 × rules) × ~100 bytes`.
//! * [`precheck`] is the headers-phase read: reject before the upstream is contacted when the bucket
//!   cannot pass even a 1-token request.
//! * [`charge`] is the body-phase CAS read-modify-write that charges the estimated cost.

use crate::config::{Config, Rule};
use crate::limits::bucket::{self, BucketState, Snapshot, Verdict};
use crate::reply::{Class, Limits, Refusal};
use crate::store::hash;
use crate::store::keys;
use crate::store::registry::{claim_slot, KeySet};
use crate::store::{self, Codec, SharedStore, UpdateError, UpdateStats};

/// Name of the shared counter of created bucket keys ([`crate::store::keys::BUCKET_COUNTER`]).
pub const KEY_COUNTER: &str = keys::BUCKET_COUNTER;
/// Overflow buckets per rule.
pub const OVERFLOW_SLOTS: u64 = 64;

/// What the key lookup observed, for metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KeyInfo {
    /// The request was mapped to an overflow bucket.
    pub overflow: bool,
}

/// FNV-1a over `parts`, each followed by a 0 byte.
fn fnv1a(parts: &[&str]) -> u64 {
    parts.iter().fold(hash::FNV_OFFSET, |h, p| {
        hash::fnv1a(hash::fnv1a(h, p.as_bytes()), &[0])
    })
}

/// A model name made safe for a key: at most 128 bytes of `[A-Za-z0-9._:/@-]`, else `~other`.
pub fn key_model(model: &str) -> &str {
    let ok = !model.is_empty()
        && model.len() <= 128
        && model.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'@' | b'-')
        });
    if ok {
        model
    } else {
        "~other"
    }
}

/// The plain key of a rule's bucket for this tenant and model (no bound applied).
pub fn plain_key(rule: &Rule, tenant: &str, model: &str) -> String {
    let model = if rule.per_model {
        Some(key_model(model))
    } else {
        None
    };
    let mut key = String::with_capacity(
        6 + rule.name.len() + 1 + tenant.len() + model.map_or(0, |m| m.len() + 1),
    );
    key.push_str(keys::BUCKET);
    key.push_str(&rule.name);
    key.push(':');
    key.push_str(tenant);
    if let Some(m) = model {
        key.push(':');
        // ':' inside the model is written `%3A` (`%` is not a key character): the last ':' of a key
        // then always ends the tenant, so tenant `acme` with model `dev:m` and tenant `acme:dev` with
        // model `m` never share a bucket.
        for (i, part) in m.split(':').enumerate() {
            if i > 0 {
                key.push_str("%3A");
            }
            key.push_str(part);
        }
    }
    key
}

/// The key to use, creating a slot for it under the `max_tenants` bound, or an overflow key.
pub fn bucket_key(
    store: &dyn SharedStore,
    cfg: &Config,
    known: &mut KeySet,
    cache_limit: usize,
    rule: &Rule,
    tenant: &str,
    model: &str,
) -> (String, KeyInfo) {
    let key = plain_key(rule, tenant, model);
    if claim_slot(
        store,
        KEY_COUNTER,
        cfg.max_tenants,
        cfg.cas_max_retries,
        known,
        cache_limit,
        &key,
    ) {
        (key, KeyInfo::default())
    } else {
        let n = fnv1a(&[tenant, model]) % OVERFLOW_SLOTS;
        (
            format!("{}{}:~overflow{}", keys::BUCKET, rule.name, n),
            KeyInfo { overflow: true },
        )
    }
}

/// A decision on one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Charged `cost`; forward (after `wait_ms` when shaping).
    Admit {
        /// Bucket state after the charge, for `x-ratelimit-*`.
        snapshot: Snapshot,
        /// Tokens charged.
        cost: u64,
        /// Milliseconds to hold the request first (0 = none).
        wait_ms: u64,
    },
    /// Not charged; answer with this refusal (its class says why).
    Reject(Refusal),
    /// The shared store failed (CAS exhausted or host error); the caller applies the failure mode.
    StoreFailed(UpdateError),
}

fn limited(v: Verdict, snap: &Snapshot, rule: &Rule) -> Option<Refusal> {
    let (class, reset_in_s, message) = match v {
        Verdict::LimitTokens { reset_in_s } => (
            Class::TokensPerSecond,
            reset_in_s,
            format!(
                "Rate limit reached for tokens ({} '{}'): limit {} tokens, refilling at {}/s.",
                rule.kind(),
                rule.name,
                rule.params.burst,
                rule.params.tokens_per_second
            ),
        ),
        Verdict::LimitRequests { reset_in_s } => (
            Class::RequestsPerMinute,
            reset_in_s,
            format!(
                "Rate limit reached for requests ({} '{}'): limit {} requests per minute.",
                rule.kind(),
                rule.name,
                rule.params.requests_per_minute.unwrap_or(0.0)
            ),
        ),
        _ => return None,
    };
    let mut r = Refusal::new(class, message);
    r.retry_after_s = Some(reset_in_s);
    r.limits = Some(Limits::from(snap));
    r.limit_name = Some(rule.name.clone());
    Some(r)
}

/// Headers-phase check: the reply to send now if the bucket is already too short for any request.
/// Reads only; a missing key means a full bucket.
///
/// What was read is left in `seen` (when the key exists), for [`charge`] to start from.
pub fn precheck(
    store: &dyn SharedStore,
    rule: &Rule,
    key: &str,
    now_ns: u64,
    seen: &mut Option<store::Seen>,
) -> Result<Option<Refusal>, bool> {
    let read = store.get(key).map_err(|_| false)?;
    let Some((bytes, cas)) = read else {
        return Ok(None);
    };
    let state = BucketState::decode(&bytes);
    *seen = Some((bytes, cas));
    match state {
        Some(state) => Ok(
            bucket::precheck(&state, &rule.params, now_ns, rule.max_wait_ms)
                .and_then(|(v, snap)| limited(v, &snap, rule)),
        ),
        None => Err(true),
    }
}

/// The 429 if a request of `cost` tokens could not be admitted (even after a `max_wait_ms` hold) by a
/// bucket whose balance is at most `state` (e.g. a global bucket's balance as Redis last reported it);
/// nothing is charged. A cost above the burst is left to the charge (413).
pub fn refusal_for(state: &BucketState, rule: &Rule, cost: u64, now_ns: u64) -> Option<Refusal> {
    let (v, snap, _) = bucket::charge(state, &rule.params, cost, now_ns, rule.max_wait_ms);
    limited(v, &snap, rule)
}

/// Body-phase charge of `cost` tokens and one request on `key`.
pub fn charge(
    store: &dyn SharedStore,
    cfg: &Config,
    rule: &Rule,
    key: &str,
    cost: u64,
    now_ns: u64,
    seen: Option<store::Seen>,
) -> (Decision, UpdateStats) {
    let init = BucketState::full(&rule.params, now_ns);
    let result = store::update_from(store, key, cfg.cas_max_retries, &init, seen, |s| {
        let (v, snap, next) = bucket::charge(s, &rule.params, cost, now_ns, rule.max_wait_ms);
        ((v, snap), next)
    });
    match result {
        Err(e) => (Decision::StoreFailed(e), UpdateStats::default()),
        Ok(((v, snap), stats)) => (decision(v, snap, rule, cost), stats),
    }
}

/// The decision for a bucket's verdict on a charge of `cost` (local or global bucket alike).
pub fn decision(v: Verdict, snap: Snapshot, rule: &Rule, cost: u64) -> Decision {
    match v {
        Verdict::Admit => Decision::Admit {
            snapshot: snap,
            cost,
            wait_ms: 0,
        },
        Verdict::Wait { wait_ms } => Decision::Admit {
            snapshot: snap,
            cost,
            wait_ms,
        },
        Verdict::TooLarge => {
            let mut r = Refusal::new(
                Class::CostExceedsBurst,
                format!(
                    "This request's estimated cost of {cost} tokens exceeds the burst of {} tokens of {} '{}'; it can never be admitted. Lower max_tokens or shorten the prompt.",
                    rule.params.burst, rule.kind(), rule.name
                ),
            );
            r.limit_name = Some(rule.name.clone());
            Decision::Reject(r)
        }
        other => match limited(other, &snap, rule) {
            Some(r) => Decision::Reject(r),
            None => Decision::StoreFailed(UpdateError::Host),
        },
    }
}

/// Gives back `amount` tokens to a bucket (the response used fewer tokens than were reserved).
pub fn credit(
    store: &dyn SharedStore,
    cfg: &Config,
    rule: &Rule,
    key: &str,
    amount: u64,
    now_ns: u64,
) -> Result<(), UpdateError> {
    adjust(store, cfg, rule, key, amount, now_ns, bucket::credit).map(|_| ())
}

/// Takes `amount` more tokens from the bucket at `key` (usage above the charge, `refund_unused`).
/// Returns the tokens really taken (the debt stops one burst deep).
pub fn debit(
    store: &dyn SharedStore,
    cfg: &Config,
    rule: &Rule,
    key: &str,
    amount: u64,
    now_ns: u64,
) -> Result<u64, UpdateError> {
    adjust(store, cfg, rule, key, amount, now_ns, bucket::debit)
}

/// One CAS update of the bucket at `key` with `f` (credit or debit); nothing for 0 tokens. Returns
/// how many tokens the balance really moved.
fn adjust(
    store: &dyn SharedStore,
    cfg: &Config,
    rule: &Rule,
    key: &str,
    amount: u64,
    now_ns: u64,
    f: fn(&BucketState, &crate::limits::bucket::BucketParams, u64, u64) -> BucketState,
) -> Result<u64, UpdateError> {
    if amount == 0 {
        return Ok(0);
    }
    let init = BucketState::full(&rule.params, now_ns);
    store::update(store, key, cfg.cas_max_retries, &init, |s| {
        let next = f(s, &rule.params, amount, now_ns);
        let moved = (s.refilled(&rule.params, now_ns).tokens - next.tokens).abs();
        (moved.round() as u64, Some(next))
    })
    .map(|(moved, _)| moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::store::MemStore;

    fn cfg(extra: &str) -> Config {
        config::parse(
            format!(
                r#"{{{extra} "rules":[{{"name":"r","tokens_per_second":10,"burst":100,"requests_per_minute":60}}]}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn key_count_is_bounded_and_extra_tenants_share_overflow_buckets() {
        let c = cfg(r#""max_tenants": 3,"#);
        let s = MemStore::new();
        let mut known = KeySet::default();
        let rule = &c.rules[0];
        let mut overflow = 0;
        for t in 0..50 {
            let (k, info) = bucket_key(&s, &c, &mut known, 1000, rule, &format!("t{t}"), "m");
            if info.overflow {
                overflow += 1;
                assert!(k.contains("~overflow"));
            }
            let _ = charge(&s, &c, rule, &k, 1, 0, None);
        }
        assert_eq!(overflow, 47);
        // 3 tenant keys + at most 64 overflow keys + the counter
        assert!(s.len() <= 3 + 64 + 1, "{}", s.len());
    }

    #[test]
    fn an_existing_key_needs_no_new_slot() {
        let c = cfg(r#""max_tenants": 1,"#);
        let s = MemStore::new();
        let rule = &c.rules[0];
        let (k1, _) = bucket_key(&s, &c, &mut KeySet::default(), 10, rule, "a", "m");
        let _ = charge(&s, &c, rule, &k1, 1, 0, None);
        // another VM (empty cache) still finds the key without a slot
        let (k2, info) = bucket_key(&s, &c, &mut KeySet::default(), 10, rule, "a", "m");
        assert_eq!(k1, k2);
        assert!(!info.overflow);
    }

    #[test]
    fn charge_admits_then_rejects_with_contract_reply() {
        let c = cfg("");
        let s = MemStore::new();
        let rule = &c.rules[0];
        let (d, st) = charge(&s, &c, rule, "k", 80, 0, None);
        assert!(st.created);
        assert!(matches!(d, Decision::Admit { cost: 80, .. }));
        let (d, _) = charge(&s, &c, rule, "k", 80, 0, None);
        match d {
            Decision::Reject(r) => {
                assert_eq!(r.class, Class::TokensPerSecond);
                assert_eq!(r.retry_after_s, Some(6.0));
                assert_eq!(r.limit_name.as_deref(), Some(rule.name.as_str()));
                assert_eq!(
                    r.limits.and_then(|l| l.tokens).map(|t| t.remaining),
                    Some(20)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn precheck_rejects_only_when_even_one_token_is_missing() {
        let c = cfg("");
        let s = MemStore::new();
        let rule = &c.rules[0];
        assert_eq!(precheck(&s, rule, "k", 0, &mut None), Ok(None));
        let _ = charge(&s, &c, rule, "k", 100, 0, None);
        let r = precheck(&s, rule, "k", 0, &mut None).unwrap().unwrap();
        assert_eq!(r.class, Class::TokensPerSecond);
        assert_eq!(precheck(&s, rule, "k", 200_000_000, &mut None), Ok(None));
        s.set("bad", b"xx", 0).unwrap();
        assert_eq!(precheck(&s, rule, "bad", 0, &mut None), Err(true));
    }

    #[test]
    fn charge_starts_from_the_precheck_read_and_stays_exact_when_it_is_stale() {
        let c = cfg("");
        let s = MemStore::new();
        let rule = &c.rules[0];
        let _ = charge(&s, &c, rule, "k", 10, 0, None);
        // Fresh: the charge reuses the headers-phase read (no second read).
        let mut seen = None;
        assert_eq!(precheck(&s, rule, "k", 0, &mut seen), Ok(None));
        assert!(seen.is_some());
        let reads = s.reads();
        let (d, st) = charge(&s, &c, rule, "k", 10, 0, seen);
        assert!(matches!(d, Decision::Admit { .. }));
        assert_eq!(s.reads(), reads, "no read when the earlier one is current");
        assert_eq!(st.retries, 0);
        // Stale: another worker charged 70 after the read; the CAS fails, the charge re-reads and
        // sees only 10 left, so 20 more is refused instead of admitted on the old state.
        let mut seen = None;
        assert_eq!(precheck(&s, rule, "k", 0, &mut seen), Ok(None));
        let _ = charge(&s, &c, rule, "k", 70, 0, None);
        let reads = s.reads();
        let (d, st) = charge(&s, &c, rule, "k", 20, 0, seen);
        assert!(
            matches!(&d, Decision::Reject(r) if r.class == Class::TokensPerSecond),
            "{d:?}"
        );
        assert_eq!(s.reads(), reads + 1);
        assert_eq!(st.retries, 0, "a stale earlier read is not a CAS conflict");
        // A missing key leaves nothing to reuse.
        let mut seen = None;
        assert_eq!(precheck(&s, rule, "other", 0, &mut seen), Ok(None));
        assert!(seen.is_none());
    }

    #[test]
    fn cost_above_burst_is_413_and_charges_nothing() {
        let c = cfg("");
        let s = MemStore::new();
        let rule = &c.rules[0];
        let (d, _) = charge(&s, &c, rule, "k", 101, 0, None);
        assert!(matches!(&d, Decision::Reject(r) if r.class == Class::CostExceedsBurst));
        let (d, _) = charge(&s, &c, rule, "k", 100, 0, None);
        assert!(matches!(d, Decision::Admit { .. }));
    }

    #[test]
    fn repeated_charges_never_admit_more_than_the_burst() {
        // Worker B writes between worker A's read and write on every other call: CAS retries keep
        // the total exact.
        let c = cfg("");
        let s = MemStore::new();
        let rule = &c.rules[0];
        let mut admitted = 0u64;
        for i in 0..40 {
            let (d, _) = charge(&s, &c, rule, "k", 7, 0, None);
            if matches!(d, Decision::Admit { .. }) {
                admitted += 7;
            }
            if i % 2 == 0 {
                let (d, _) = charge(&s, &c, rule, "k", 7, 0, None);
                if matches!(d, Decision::Admit { .. }) {
                    admitted += 7;
                }
            }
        }
        assert!(admitted <= 100);
        assert!(admitted >= 93);
    }

    #[test]
    fn credit_refunds_unused_tokens() {
        let c = cfg("");
        let s = MemStore::new();
        let rule = &c.rules[0];
        let _ = charge(&s, &c, rule, "k", 100, 0, None);
        credit(&s, &c, rule, "k", 60, 0).unwrap();
        let (d, _) = charge(&s, &c, rule, "k", 60, 0, None);
        assert!(matches!(d, Decision::Admit { .. }));
    }

    #[test]
    fn odd_model_names_share_one_safe_key() {
        assert_eq!(key_model("gpt-4.1"), "gpt-4.1");
        assert_eq!(key_model("evil model\n"), "~other");
        assert_eq!(key_model(&"m".repeat(300)), "~other");
        assert_eq!(key_model(""), "~other");
    }

    #[test]
    fn colons_in_tenant_and_model_never_make_two_pairs_share_a_key() {
        let c = cfg("");
        let rule = &c.rules[0];
        assert!(rule.per_model);
        let a = plain_key(rule, "acme:dev", "m");
        let b = plain_key(rule, "acme", "dev:m");
        assert_ne!(a, b);
        assert!(a.ends_with(":acme:dev:m"), "{a}");
        assert!(b.ends_with(":acme:dev%3Am"), "{b}");
        assert!(plain_key(rule, "key:ab12", "ft:gpt-4o:org::x")
            .ends_with(":key:ab12:ft%3Agpt-4o%3Aorg%3A%3Ax"));
    }
}
