//! Global token buckets: a rule's bucket kept in Redis (through the Webdis shim), shared by every Envoy
//! replica, instead of in one Envoy's shared data. Pure: keys, the Lua script, the Webdis command bodies
//! and the reply parser; the host adapter (`host::http`) makes the callout.
//!
//! One callout per request (`EVALSHA` of [`SCRIPT`], `EVAL` when Redis does not know it yet) charges the
//! request's estimated cost and one request, atomically, with the same math as the local buckets
//! ([`crate::limits::bucket::charge`]: refill, burst, requests/minute, shaping debt, cost above burst) on Redis'
//! own clock (`TIME`), so replicas with skewed clocks still share one exact bucket: over any window the
//! tokens admitted across all replicas never exceed `burst + tokens_per_second × elapsed`.
//!
//! Keys: `tg:gb:{<rule>:<tenant>}[:<model>]` (parts made safe by [`crate::store::keys::sanitize`]; the hash tag
//! keeps one tenant's buckets on one Redis Cluster slot), a hash of `t` (tokens), `r` (requests), `u`
//! (updated, µs). Every write sets `PEXPIRE` to the time the bucket needs to be full again plus 60 s:
//! a bucket left idle that long is full anyway, so it simply disappears, and Redis holds only the
//! buckets in use.
//!
//! Refusal cache: when Redis refuses a request, the balances it reported are kept in this Envoy's shared
//! data ([`Seen`] in one of [`SEEN_SLOTS`] slots, picked by a hash of the key). Refill aside, every
//! replica's later charges only lower that balance, so while the balance refilled since cannot cover a
//! request (its estimate in the body phase, one token in the headers phase when the key is known there,
//! or one request/minute), the request is refused from the cache without a callout: a 429 storm against
//! a spent global bucket costs Redis nothing. Only a credit given back in that window is missed, which
//! errs towards limiting. A slot shared by two keys keeps the later one; the other asks Redis again.
//!
//! Reply: `[verdict, tokens × 1000, requests × 1000, µs, block tokens, block requests]`, verdict 0
//! admitted, 1 admitted after a wait of `µs` (shaping), 2 tokens short (`µs` until they would be there),
//! 3 requests/minute spent (same), 4 the cost exceeds the burst. The balances are after the charge (before
//! it when refused).
//!
//! Leases (`global_buckets.lease`, see [`crate::global::lease`]): the same call can also take a *block* beyond
//! the request's own cost — whole tokens (and requests) the bucket still holds after the charge, at most
//! what was asked, none while the bucket is shaped into debt — which this Envoy then spends from shared
//! data without a callout. A block is charged in Redis like any request, so what all Envoys admit never
//! exceeds what the bucket allowed; a call with cost 0 and no request takes a block alone, and a credit
//! can give requests back as well as tokens.

use crate::config::Rule;
use crate::limits::bucket::{BucketParams, BucketState, Verdict};
use crate::shim::webdis::{command_body, lua_int, parse_int_array, ScriptCall, ShimError};
use crate::store::hash::{fnv1a, FNV_OFFSET};
use crate::store::keys::{self, sanitize};
use crate::store::{read_f64, read_u64, Codec};

/// The last argument of every call of [`SCRIPT`] (a script of another version refuses it).
pub const PROTOCOL_TAG: &str = "tg2";

/// Shared-data slots of the refusal cache (`tg:gx:<n>`): a fixed number of keys, whatever the traffic.
pub const SEEN_SLOTS: u64 = 1024;

/// The balances Redis last reported when it refused a request for one global bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seen {
    /// FNV-1a of the Redis key (tells the keys sharing a slot apart).
    pub key_hash: u64,
    /// The balances, as of `state.updated_ns` (this Envoy's clock when the answer came).
    pub state: BucketState,
}

impl Seen {
    const VERSION: u8 = 1;
    const LEN: usize = 33;

    /// The cached state of `key` if `slot_value` holds it.
    pub fn for_key(slot_value: &[u8], key: &str) -> Option<BucketState> {
        Self::decode(slot_value)
            .filter(|s| s.key_hash == key_hash(key))
            .map(|s| s.state)
    }
}

impl Codec for Seen {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::LEN);
        v.push(Self::VERSION);
        v.extend_from_slice(&self.key_hash.to_le_bytes());
        v.extend_from_slice(&self.state.tokens.to_le_bytes());
        v.extend_from_slice(&self.state.requests.to_le_bytes());
        v.extend_from_slice(&self.state.updated_ns.to_le_bytes());
        v
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != Self::LEN || b.first() != Some(&Self::VERSION) {
            return None;
        }
        Some(Seen {
            key_hash: read_u64(b, 1)?,
            state: BucketState {
                tokens: read_f64(b, 9)?,
                requests: read_f64(b, 17)?,
                updated_ns: read_u64(b, 25)?,
            },
        })
    }
}

fn key_hash(key: &str) -> u64 {
    fnv1a(FNV_OFFSET, key.as_bytes())
}

/// The shared-data slot of the refusal cache for `key`.
pub fn seen_slot(key: &str) -> String {
    format!("{}{}", keys::GLOBAL_SEEN, key_hash(key) % SEEN_SLOTS)
}

/// Forgets a refusal cached for `key` (tokens were given back to its bucket: what was cached no longer
/// bounds it). A slot holding another key is left alone.
pub fn forget_refusal(store: &dyn crate::store::SharedStore, key: &str) {
    let slot = seen_slot(key);
    if let Ok(Some((bytes, cas))) = store.get(&slot) {
        if Seen::for_key(&bytes, key).is_some() {
            let _ = store.set(&slot, &[], cas);
        }
    }
}

/// The 429 (or 413) for a global bucket that Redis refused moments ago and that cannot hold `cost`
/// tokens (or one request) yet, from the refusal cache in shared data; `None`: ask Redis. With
/// `leases` (`global_buckets.lease`), this Envoy's lease of the bucket may still hold the request:
/// then `None` too.
pub fn refused_from_cache(
    store: &dyn crate::store::SharedStore,
    rule: &Rule,
    key: &str,
    cost: u64,
    now_ns: u64,
    leases: bool,
) -> Option<crate::reply::Refusal> {
    let (bytes, _) = store.get(&seen_slot(key)).ok()??;
    let state = Seen::for_key(&bytes, key)?;
    let refusal = crate::limits::local::refusal_for(&state, rule, cost, now_ns)?;
    if leases
        && crate::global::lease::covers(
            store,
            &crate::global::lease::account_key(key),
            &rule.params,
            cost,
        )
    {
        return None;
    }
    Some(refusal)
}

/// What to cache after Redis refused a request on `key` at `now_ns` (this Envoy's clock).
pub fn seen_after_refusal(key: &str, reply: &Reply, now_ns: u64) -> Seen {
    Seen {
        key_hash: key_hash(key),
        state: BucketState {
            updated_ns: now_ns,
            ..reply.state
        },
    }
}

/// The bucket script (charge, or credit when `ARGV[6]` or `ARGV[12]` ≠ 0: a negative credit is a debit,
/// which may leave the bucket in debt down to −burst).
///
/// KEYS: `bucket`. ARGV: `cost, tokens_per_second, burst, requests_per_minute (0 = none), max_wait_ms,
/// credit (0 = charge, < 0 = debit), now_us (0 = Redis TIME; tests only), "tg2", requests charged with
/// the cost (1 for a request, 0 for a block alone), block tokens wanted, block requests wanted, requests
/// credited`.
pub const SCRIPT: &str = include_str!("bucket.lua");

/// SHA-1 of [`SCRIPT`] (what `SCRIPT LOAD` returns; checked by a unit test and against a real Redis in
/// `tests/redis_live.rs`).
pub const SHA1: &str = "0ca9394a17e7c88a3b20a4c0c6c894a429819ca2";

/// The Redis key of `rule`'s bucket for (tenant, model).
pub fn key(rule: &Rule, tenant: &str, model: &str) -> String {
    let mut k = format!(
        "{}{{{}:{}}}",
        keys::GLOBAL_BUCKET,
        sanitize(&rule.name),
        sanitize(tenant)
    );
    if rule.per_model {
        k.push(':');
        k.push_str(&sanitize(model));
    }
    k
}

/// [`SCRIPT`]'s ARGV for a charge (`credit` 0) or a credit, in the script's order. `now_us` 0 lets the
/// script read Redis' own clock (`TIME`), as every call of the filter does; tests pin the clock with it.
pub fn argv(
    p: &BucketParams,
    cost: u64,
    max_wait_ms: u64,
    credit: i64,
    now_us: u64,
) -> Vec<String> {
    lease_argv(p, cost, max_wait_ms, credit, now_us, &LeaseAsk::request())
}

/// What a call asks beyond a plain charge: how many requests the cost stands for, the block wanted, and
/// the requests given back (credits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseAsk {
    /// Requests charged with the cost (1 for a request; 0 for a block alone).
    pub requests: u64,
    /// Block tokens wanted beyond the cost.
    pub block_tokens: u64,
    /// Block requests wanted beyond the request.
    pub block_requests: u64,
    /// Requests given back (with a credit).
    pub credit_requests: u64,
}

impl LeaseAsk {
    /// A plain request: one request, no block.
    pub fn request() -> Self {
        LeaseAsk {
            requests: 1,
            block_tokens: 0,
            block_requests: 0,
            credit_requests: 0,
        }
    }
}

/// [`SCRIPT`]'s full ARGV, in the script's order.
pub fn lease_argv(
    p: &BucketParams,
    cost: u64,
    max_wait_ms: u64,
    credit: i64,
    now_us: u64,
    ask: &LeaseAsk,
) -> Vec<String> {
    vec![
        lua_int(cost),
        num(p.tokens_per_second),
        num(p.burst),
        num(p.requests_per_minute.unwrap_or(0.0)),
        max_wait_ms.to_string(),
        credit.to_string(),
        now_us.to_string(),
        PROTOCOL_TAG.to_string(),
        lua_int(ask.requests),
        lua_int(ask.block_tokens),
        lua_int(ask.block_requests),
        lua_int(ask.credit_requests),
    ]
}

/// A rate as Lua reads it back exactly (shortest round-trip form; finite and positive by config).
fn num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:?}")
    } else {
        "0".to_string()
    }
}

/// Webdis body that charges `cost` tokens and one request (shaping up to `max_wait_ms`).
pub fn charge_request(
    key: &str,
    p: &BucketParams,
    cost: u64,
    max_wait_ms: u64,
    call: ScriptCall,
) -> String {
    command_body(
        call,
        SCRIPT,
        SHA1,
        &[key],
        &argv(p, cost, max_wait_ms, 0, 0),
    )
}

/// Webdis body that charges `cost` tokens and one request and asks for a lease block beyond them
/// (`ask.block_*`; no block while shaped), or (`cost` 0, `ask.requests` 0) a block alone.
pub fn lease_request(
    key: &str,
    p: &BucketParams,
    cost: u64,
    max_wait_ms: u64,
    ask: &LeaseAsk,
    call: ScriptCall,
) -> String {
    command_body(
        call,
        SCRIPT,
        SHA1,
        &[key],
        &lease_argv(p, cost, max_wait_ms, 0, 0, ask),
    )
}

/// Webdis body that gives a lease back: `tokens` (never above the burst) and `requests` (never above
/// requests/minute).
pub fn give_back_request(
    key: &str,
    p: &BucketParams,
    tokens: u64,
    requests: u64,
    call: ScriptCall,
) -> String {
    let ask = LeaseAsk {
        requests: 0,
        block_tokens: 0,
        block_requests: 0,
        credit_requests: requests,
    };
    let credit = i64::try_from(tokens).unwrap_or(i64::MAX);
    command_body(
        call,
        SCRIPT,
        SHA1,
        &[key],
        &lease_argv(p, 0, 0, credit, 0, &ask),
    )
}

/// Webdis body that gives `amount` tokens back (never above the burst), or takes them when negative
/// (never below −burst).
pub fn credit_request(key: &str, p: &BucketParams, amount: i64, call: ScriptCall) -> String {
    let amount = if amount == 0 { 1 } else { amount };
    command_body(call, SCRIPT, SHA1, &[key], &argv(p, 0, 0, amount, 0))
}

/// The script's answer: the verdict, the balances it left (tokens and requests; `updated_ns` 0) and
/// the lease block it granted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reply {
    /// As [`crate::limits::bucket::charge`] would say.
    pub verdict: Verdict,
    /// The balances after the charge and the block (before them when refused), for `x-ratelimit-*`.
    pub state: BucketState,
    /// Block tokens granted (charged in Redis, this Envoy's to spend).
    pub block_tokens: u64,
    /// Block requests granted.
    pub block_requests: u64,
}

/// Parses Webdis' answer to [`charge_request`] or [`credit_request`]. Never panics.
pub fn parse_reply(http_status: u32, body: &[u8]) -> Result<Reply, ShimError> {
    let a = parse_int_array(http_status, body, 6)?;
    let [verdict, tokens, requests, us, bt, br] = a.as_slice() else {
        return Err(ShimError::Garbage("wrong length".into()));
    };
    let us = u64::try_from(*us).map_err(|_| ShimError::Garbage(format!("negative wait: {us}")))?;
    let block =
        |n: i64| u64::try_from(n).map_err(|_| ShimError::Garbage(format!("negative block: {n}")));
    let (block_tokens, block_requests) = (block(*bt)?, block(*br)?);
    let secs = us as f64 / 1e6;
    let verdict = match verdict {
        0 => Verdict::Admit,
        1 => Verdict::Wait {
            wait_ms: us.div_ceil(1000),
        },
        2 => Verdict::LimitTokens { reset_in_s: secs },
        3 => Verdict::LimitRequests { reset_in_s: secs },
        4 => Verdict::TooLarge,
        v => return Err(ShimError::Garbage(format!("unknown verdict {v}"))),
    };
    Ok(Reply {
        verdict,
        state: BucketState {
            tokens: *tokens as f64 / 1000.0,
            requests: *requests as f64 / 1000.0,
            updated_ns: 0,
        },
        block_tokens,
        block_requests,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ModelMatch, Rule};

    fn rule(per_model: bool) -> Rule {
        Rule {
            name: "gpt".into(),
            tenant: None,
            model: ModelMatch::Any,
            per_model,
            params: BucketParams {
                tokens_per_second: 10.0,
                burst: 100.0,
                requests_per_minute: None,
            },
            max_wait_ms: 0,
            refund_unused: false,
            global: true,
            scope: crate::config::Scope::Tenant,
            group: None,
            has_bucket: true,
            is_limit: false,
            max_in_flight: None,
            shadow: false,
            fair: None,
            when_exhausted: None,
        }
    }

    #[test]
    fn the_refusal_cache_refuses_only_until_one_token_could_be_back() {
        let r = rule(true);
        let reply = parse_reply(200, br#"{"EVAL":[2,-500,0,3000000,0,0]}"#).unwrap();
        let key = key(&r, "acme", "m");
        let seen = seen_after_refusal(&key, &reply, 1_000_000_000);
        let bytes = seen.encode();
        assert_eq!(Seen::decode(&bytes), Some(seen));
        assert!(seen_slot(&key).starts_with("tg:gx:"));
        let state = Seen::for_key(&bytes, &key).unwrap();
        assert_eq!(Seen::for_key(&bytes, "tg:gb:{gpt:other}:m"), None);
        assert_eq!(Seen::decode(&bytes[1..]), None);
        // −0.5 tokens at 10/s: one token is back 150 ms later.
        let at = |ms: u64| {
            crate::limits::bucket::precheck(&state, &r.params, 1_000_000_000 + ms * 1_000_000, 0)
        };
        assert!(matches!(at(0), Some((Verdict::LimitTokens { .. }, _))));
        assert!(matches!(at(149), Some((Verdict::LimitTokens { .. }, _))));
        assert_eq!(at(150), None);
        // A hold of 200 ms covers it at once.
        assert_eq!(
            crate::limits::bucket::precheck(&state, &r.params, 1_000_000_000, 200),
            None
        );
    }

    #[test]
    fn the_sha1_constant_is_the_sha1_of_the_script_text() {
        assert_eq!(crate::shim::webdis::sha1_hex(SCRIPT.as_bytes()), SHA1);
    }

    #[test]
    fn keys_are_safe_and_tagged_by_rule_and_tenant() {
        assert_eq!(
            key(&rule(true), "acme", "gpt-4.1"),
            "tg:gb:{gpt:acme}:gpt-4.1"
        );
        assert_eq!(key(&rule(false), "acme", "gpt-4.1"), "tg:gb:{gpt:acme}");
        let k = key(&rule(true), "a}b{c", "m/x y");
        assert_eq!(k, "tg:gb:{gpt:a%7Db%7Bc}:m%2Fx%20y");
    }

    #[test]
    fn request_bodies_carry_the_rates_and_the_protocol_tag() {
        let p = rule(true).params;
        let b = charge_request("k", &p, 42, 250, ScriptCall::EvalSha);
        assert_eq!(
            b,
            format!("EVALSHA/{SHA1}/1/k/42/10%2E0/100%2E0/0%2E0/250/0/0/tg2/1/0/0/0")
        );
        let b = credit_request("k", &p, 7, ScriptCall::EvalSha);
        assert!(
            b.ends_with("/0/10%2E0/100%2E0/0%2E0/0/7/0/tg2/1/0/0/0"),
            "{b}"
        );
        let ask = LeaseAsk {
            requests: 1,
            block_tokens: 500,
            block_requests: 3,
            credit_requests: 0,
        };
        let b = lease_request("k", &p, 42, 0, &ask, ScriptCall::EvalSha);
        assert!(
            b.ends_with("/42/10%2E0/100%2E0/0%2E0/0/0/0/tg2/1/500/3/0"),
            "{b}"
        );
        let b = give_back_request("k", &p, 70, 2, ScriptCall::EvalSha);
        assert!(
            b.ends_with("/0/10%2E0/100%2E0/0%2E0/0/70/0/tg2/0/0/0/2"),
            "{b}"
        );
        assert!(charge_request("k", &p, 1, 0, ScriptCall::Eval).starts_with("EVAL/"));
    }

    #[test]
    fn replies_parse_and_garbage_is_refused() {
        let r = parse_reply(200, br#"{"EVALSHA":[0,40000,0,0,0,0]}"#).unwrap();
        assert_eq!(r.verdict, Verdict::Admit);
        assert_eq!((r.block_tokens, r.block_requests), (0, 0));
        assert_eq!(r.state.tokens, 40.0);
        let r = parse_reply(200, br#"{"EVAL":[0,1000,2000,0,700,5]}"#).unwrap();
        assert_eq!((r.block_tokens, r.block_requests), (700, 5));
        let r = parse_reply(200, br#"{"EVALSHA":[2,-1500,0,2500000,0,0]}"#).unwrap();
        assert_eq!(r.verdict, Verdict::LimitTokens { reset_in_s: 2.5 });
        assert_eq!(r.state.tokens, -1.5);
        let r = parse_reply(200, br#"{"EVAL":[1,0,0,1500,0,0]}"#).unwrap();
        assert_eq!(r.verdict, Verdict::Wait { wait_ms: 2 });
        assert_eq!(
            parse_reply(200, br#"{"EVAL":[3,0,0,1000000,0,0]}"#)
                .unwrap()
                .verdict,
            Verdict::LimitRequests { reset_in_s: 1.0 }
        );
        assert_eq!(
            parse_reply(200, br#"{"EVAL":[4,0,0,0,0,0]}"#)
                .unwrap()
                .verdict,
            Verdict::TooLarge
        );
        for (status, body) in [
            (200, &br#"{"EVAL":[9,0,0,0,0,0]}"#[..]),
            (200, br#"{"EVAL":[0,0,0,-1,0,0]}"#),
            (200, br#"{"EVAL":[0,0,0]}"#),
            (200, br#"{"EVAL":[0,0,0,0]}"#),
            (200, br#"{"EVAL":[0,0,0,0,-1,0]}"#),
            (200, br#"{"EVAL":"x"}"#),
            (200, b"garbage"),
            (404, b""),
        ] {
            assert!(
                matches!(parse_reply(status, body), Err(ShimError::Garbage(_))),
                "{body:?}"
            );
        }
        assert_eq!(parse_reply(0, b""), Err(ShimError::Unavailable));
        assert_eq!(parse_reply(503, b"x"), Err(ShimError::Unavailable));
        assert_eq!(
            parse_reply(
                200,
                br#"{"EVALSHA":[false,"NOSCRIPT No matching script."]}"#
            ),
            Err(ShimError::NoScript)
        );
    }
}
