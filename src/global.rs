//! Global token buckets: a rule's bucket kept in Redis (through the Webdis shim), shared by every Envoy
//! replica, instead of in one Envoy's shared data. Pure: keys, the Lua script, the Webdis command bodies
//! and the reply parser; the host adapter (`host::http`) makes the callout.
//!
//! One callout per request (`EVALSHA` of [`SCRIPT`], `EVAL` when Redis does not know it yet) charges the
//! request's estimated cost and one request, atomically, with the same math as the local buckets
//! ([`crate::bucket::charge`]: refill, burst, requests/minute, shaping debt, cost above burst) on Redis'
//! own clock (`TIME`), so replicas with skewed clocks still share one exact bucket: over any window the
//! tokens admitted across all replicas never exceed `burst + tokens_per_second × elapsed`.
//!
//! Keys: `tg:gb:{<rule>:<tenant>}[:<model>]` (parts made safe by [`crate::quota::sanitize`]; the hash tag
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
//! Reply: `[verdict, tokens × 1000, requests × 1000, µs]`, verdict 0 admitted, 1 admitted after a wait of
//! `µs` (shaping), 2 tokens short (`µs` until they would be there), 3 requests/minute spent (same), 4 the
//! cost exceeds the burst. The balances are after the charge (before it when refused).

use crate::bucket::{BucketParams, BucketState, Verdict};
use crate::config::Rule;
use crate::hash::{fnv1a, FNV_OFFSET};
use crate::quota::{command_body, parse_int_array, sanitize, ScriptCall, ShimError, PROTOCOL_TAG};
use crate::store::{read_f64, read_u64, Codec};

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
    format!("tg:gx:{}", key_hash(key) % SEEN_SLOTS)
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

/// The bucket script (charge, or credit when ARGV[6] ≠ 0: a negative credit is a debit, which may
/// leave the bucket in debt down to −burst).
///
/// KEYS: `bucket`. ARGV: `cost, tokens_per_second, burst, requests_per_minute (0 = none), max_wait_ms,
/// credit (0 = charge, < 0 = debit), now_us (0 = Redis TIME; tests only), "tg1"`.
pub const SCRIPT: &str = r#"-- tokengate global bucket v1
if ARGV[8] ~= 'tg1' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local cost, rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, maxw, credit, now = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if not (cost and rate and burst and rpm and maxw and credit and now) or rate <= 0 or burst <= 0 then
  return redis.error_reply('ERR tokengate: bad argument')
end
if now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local v = redis.call('HMGET', KEYS[1], 't', 'r', 'u')
local t, r, u = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
if not (t and r and u) then t, r, u = burst, rpm, now end
local dt = math.max(0, now - u) / 1e6
t = math.min(burst, t + dt * rate)
if rpm > 0 then r = math.min(rpm, r + dt * rpm / 60) else r = 0 end
-- A stamp ahead of this clock (garbage, or a failover to a server whose clock is behind) refills
-- nothing and is pulled back to now, so the bucket is never stuck waiting for the clock.
u = now
local function store()
  redis.call('HSET', KEYS[1], 't', string.format('%.17g', t), 'r', string.format('%.17g', r), 'u', string.format('%d', u))
  local ttl = math.ceil((burst - t) / rate * 1000) + 60000
  if rpm > 0 then ttl = math.max(ttl, math.ceil((rpm - r) * 60000 / rpm) + 60000) end
  redis.call('PEXPIRE', KEYS[1], ttl)
end
local function out(verdict, us)
  return {verdict, math.floor(t * 1000), math.floor(r * 1000), us}
end
if credit ~= 0 then
  t = math.max(-burst, math.min(burst, t + credit))
  store()
  return out(0, 0)
end
-- Refusals store too: the refill is kept and the key always has its expiry.
if cost > burst then store() return out(4, 0) end
local tw = math.max(0, (cost - t) / rate)
local rw = 0
if rpm > 0 then rw = math.max(0, (1 - r) * 60 / rpm) end
local w = math.max(tw, rw)
if w > 0 and w > maxw / 1000 then
  store()
  if rw > tw then return out(3, math.ceil(rw * 1e6)) end
  return out(2, math.ceil(tw * 1e6))
end
t = t - cost
if rpm > 0 then r = r - 1 end
store()
if w > 0 then return out(1, math.ceil(w * 1e6)) end
return out(0, 0)
"#;

/// SHA-1 of [`SCRIPT`] (what `SCRIPT LOAD` returns; checked against a real Redis in the tests).
pub const SHA1: &str = "75649e2d74ef0a2277d22781482edfb6de1dd102";

/// The Redis key of `rule`'s bucket for (tenant, model).
pub fn key(rule: &Rule, tenant: &str, model: &str) -> String {
    let mut k = format!("tg:gb:{{{}:{}}}", sanitize(&rule.name), sanitize(tenant));
    if rule.per_model {
        k.push(':');
        k.push_str(&sanitize(model));
    }
    k
}

fn argv(p: &BucketParams, cost: u64, max_wait_ms: u64, credit: i64, now_us: u64) -> Vec<String> {
    vec![
        cost.to_string(),
        num(p.tokens_per_second),
        num(p.burst),
        num(p.requests_per_minute.unwrap_or(0.0)),
        max_wait_ms.to_string(),
        credit.to_string(),
        now_us.to_string(),
        PROTOCOL_TAG.to_string(),
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

/// Webdis body that gives `amount` tokens back (never above the burst), or takes them when negative
/// (never below −burst).
pub fn credit_request(key: &str, p: &BucketParams, amount: i64, call: ScriptCall) -> String {
    let amount = if amount == 0 { 1 } else { amount };
    command_body(call, SCRIPT, SHA1, &[key], &argv(p, 0, 0, amount, 0))
}

/// The script's answer: the verdict and the balances it left (tokens and requests; `updated_ns` 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reply {
    /// As [`crate::bucket::charge`] would say.
    pub verdict: Verdict,
    /// The balances after the charge (before it when refused), for `x-ratelimit-*`.
    pub state: BucketState,
}

/// Parses Webdis' answer to [`charge_request`] or [`credit_request`]. Never panics.
pub fn parse_reply(http_status: u32, body: &[u8]) -> Result<Reply, ShimError> {
    let a = parse_int_array(http_status, body, 4)?;
    let [verdict, tokens, requests, us] = a.as_slice() else {
        return Err(ShimError::Garbage("wrong length".into()));
    };
    let us = u64::try_from(*us).map_err(|_| ShimError::Garbage(format!("negative wait: {us}")))?;
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
        }
    }

    #[test]
    fn the_refusal_cache_refuses_only_until_one_token_could_be_back() {
        let r = rule(true);
        let reply = parse_reply(200, br#"{"EVAL":[2,-500,0,3000000]}"#).unwrap();
        let key = key(&r, "acme", "m");
        let seen = seen_after_refusal(&key, &reply, 1_000_000_000);
        let bytes = seen.encode();
        assert_eq!(Seen::decode(&bytes), Some(seen));
        assert!(seen_slot(&key).starts_with("tg:gx:"));
        let state = Seen::for_key(&bytes, &key).unwrap();
        assert_eq!(Seen::for_key(&bytes, "tg:gb:{gpt:other}:m"), None);
        assert_eq!(Seen::decode(&bytes[1..]), None);
        // −0.5 tokens at 10/s: one token is back 150 ms later.
        let at =
            |ms: u64| crate::bucket::precheck(&state, &r.params, 1_000_000_000 + ms * 1_000_000, 0);
        assert!(matches!(at(0), Some((Verdict::LimitTokens { .. }, _))));
        assert!(matches!(at(149), Some((Verdict::LimitTokens { .. }, _))));
        assert_eq!(at(150), None);
        // A hold of 200 ms covers it at once.
        assert_eq!(
            crate::bucket::precheck(&state, &r.params, 1_000_000_000, 200),
            None
        );
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
            format!("EVALSHA/{SHA1}/1/k/42/10%2E0/100%2E0/0%2E0/250/0/0/tg1")
        );
        let b = credit_request("k", &p, 7, ScriptCall::EvalSha);
        assert!(b.ends_with("/0/10%2E0/100%2E0/0%2E0/0/7/0/tg1"), "{b}");
        assert!(charge_request("k", &p, 1, 0, ScriptCall::Eval).starts_with("EVAL/"));
    }

    #[test]
    fn replies_parse_and_garbage_is_refused() {
        let r = parse_reply(200, br#"{"EVALSHA":[0,40000,0,0]}"#).unwrap();
        assert_eq!(r.verdict, Verdict::Admit);
        assert_eq!(r.state.tokens, 40.0);
        let r = parse_reply(200, br#"{"EVALSHA":[2,-1500,0,2500000]}"#).unwrap();
        assert_eq!(r.verdict, Verdict::LimitTokens { reset_in_s: 2.5 });
        assert_eq!(r.state.tokens, -1.5);
        let r = parse_reply(200, br#"{"EVAL":[1,0,0,1500]}"#).unwrap();
        assert_eq!(r.verdict, Verdict::Wait { wait_ms: 2 });
        assert_eq!(
            parse_reply(200, br#"{"EVAL":[3,0,0,1000000]}"#)
                .unwrap()
                .verdict,
            Verdict::LimitRequests { reset_in_s: 1.0 }
        );
        assert_eq!(
            parse_reply(200, br#"{"EVAL":[4,0,0,0]}"#).unwrap().verdict,
            Verdict::TooLarge
        );
        for (status, body) in [
            (200, &br#"{"EVAL":[9,0,0,0]}"#[..]),
            (200, br#"{"EVAL":[0,0,0,-1]}"#),
            (200, br#"{"EVAL":[0,0,0]}"#),
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

/// The script against a real Redis (through a real Webdis): the same verdicts and balances as
/// [`crate::bucket::charge`] on random sequences, the SHA-1, key expiry and garbage in Redis.
#[cfg(test)]
mod live {
    use super::*;
    use crate::bucket::{self, BucketState};
    use crate::quota::live::Stack;

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
