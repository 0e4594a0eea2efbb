//! Fair global buckets (`share: "fair"` with `global: true`): the record of [`super`] kept in Redis as a
//! hash and decided by one script, `src/global/fair.lua` ([`SCRIPT`]), on Redis' own clock — the same
//! water-filling, credits, reserve and decision as [`super::decide`], so every Envoy shares one exact
//! bucket and one table of members. Pure: the key, the command bodies and the reply parser; the flow
//! makes the callout (one per request, as a plain global bucket).
//!
//! ```text
//! tg:gf:{<limit>:<subject>}[:<model>]   hash: t r u (bucket) K l (shape) c e a s p n k (shares)
//!                                       L<l> C<l> (per level), m:<member> (packed), m:~overflow
//! ```
//! ARGV: `cost, tokens_per_second, burst, requests_per_minute (0 none), member, weight, level, levels,
//! max_members, window_us, default weight, default level, now_us (0 = Redis TIME), "tgf1", credit (0 =
//! charge; else given back, negative taken), requests charged (1)`.
//!
//! Reply: `[verdict, tokens × 1000, requests × 1000, µs, share × 1000, credit × 1000, active, overflow,
//! level share × 1000]` (the last: the water level of the first level that binds, 0 when none does),
//! verdict 0 admitted, 2 tokens short (limit empty; µs until they would be there), 3 requests/minute
//! spent, 4 the cost exceeds the burst, 5 over share (µs until the member's credit is back).
//!
//! Every write sets `PEXPIRE`: the time the bucket needs to be full again plus ten windows and 60 s (a
//! member's largest request fades over ten windows), so an idle record disappears.

use super::{over_share, Member, Outcome, ShareView, Why};
use crate::config::{FairShare, Rule};
use crate::limits::bucket::{BucketState, Verdict};
use crate::limits::local::{self, Decision};
use crate::shim::webdis::{command_body, lua_int, parse_int_array_of, ScriptCall, ShimError};
use crate::store::keys::sanitize;

/// The last-but-two argument of every call of [`SCRIPT`] (a script of another version refuses it).
pub const PROTOCOL_TAG: &str = "tgf1";

/// Redis key prefix of fair global records.
pub const KEY_PREFIX: &str = "tg:gf:";

/// The fair bucket script.
pub const SCRIPT: &str = include_str!("../../global/fair.lua");

/// SHA-1 of [`SCRIPT`] (what `SCRIPT LOAD` returns; checked by a unit test and against a real Redis in
/// `tests/fair_live.rs`).
pub const SHA1: &str = "c7373c2dea684393fae207a93e7a761c02c0953f";

/// The Redis key of `rule`'s fair record for `subject` (and model, for per-model limits).
pub fn key(rule: &Rule, subject: &str, model: &str) -> String {
    let mut k = format!(
        "{KEY_PREFIX}{{{}:{}}}",
        sanitize(&rule.name),
        sanitize(subject)
    );
    if rule.per_model {
        k.push(':');
        k.push_str(&sanitize(model));
    }
    k
}

/// A rate as Lua reads it back exactly.
fn num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:?}")
    } else {
        "0".to_string()
    }
}

/// [`SCRIPT`]'s ARGV for a charge of `cost` (`credit` 0) or a credit of `credit` tokens (negative: a
/// debit) by member `m`. `now_us` 0 lets the script read Redis' clock, as every call of the filter does.
pub fn argv(
    rule: &Rule,
    share: &FairShare,
    m: &Member,
    cost: u64,
    credit: i64,
    now_us: u64,
) -> Vec<String> {
    let p = &rule.params;
    vec![
        lua_int(cost),
        num(p.tokens_per_second),
        num(p.burst),
        num(p.requests_per_minute.unwrap_or(0.0)),
        sanitize(&m.id),
        num(m.weight),
        m.level.to_string(),
        share.levels.len().clamp(1, super::LEVELS).to_string(),
        share.max_members.to_string(),
        (share.window_ns / 1000).to_string(),
        num(share.default_weight),
        share.default_level.to_string(),
        now_us.to_string(),
        PROTOCOL_TAG.to_string(),
        credit.to_string(),
        "1".to_string(),
    ]
}

/// Webdis body that charges `cost` tokens and one request by member `m`.
pub fn charge_request(
    key: &str,
    rule: &Rule,
    share: &FairShare,
    m: &Member,
    cost: u64,
    call: ScriptCall,
) -> String {
    command_body(
        call,
        SCRIPT,
        SHA1,
        &[key],
        &argv(rule, share, m, cost, 0, 0),
    )
}

/// Webdis body that gives `amount` tokens back to the bucket and to member `m` (negative: takes them).
pub fn credit_request(
    key: &str,
    rule: &Rule,
    share: &FairShare,
    m: &Member,
    amount: i64,
    call: ScriptCall,
) -> String {
    let amount = if amount == 0 { 1 } else { amount };
    command_body(
        call,
        SCRIPT,
        SHA1,
        &[key],
        &argv(rule, share, m, 0, amount, 0),
    )
}

/// The script's answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reply {
    /// What the bucket said (`Admit` for admitted and over-share answers; see `why`).
    pub verdict: Verdict,
    /// Why it refused, when it did for want of tokens/requests (limit empty) or share.
    pub why: Option<Why>,
    /// The balances after the charge (before it when refused), `updated_ns` 0.
    pub state: BucketState,
    /// Over share: seconds until the member's credit is back.
    pub retry_s: f64,
    /// The member's share, credit and the table's state.
    pub view: ShareView,
}

/// Parses Webdis' answer to [`charge_request`] or [`credit_request`]. Never panics.
pub fn parse_reply(http_status: u32, body: &[u8]) -> Result<Reply, ShimError> {
    // A script of an earlier build answered without the level share.
    let a = parse_int_array_of(http_status, body, 8..=9)?;
    let (a, level) = match a.as_slice() {
        [head @ .., level] if head.len() == 8 => (head, *level),
        all => (all, 0),
    };
    let [verdict, tokens, requests, us, share, credit, active, overflow] = a else {
        return Err(ShimError::Garbage("wrong length".into()));
    };
    let us = u64::try_from(*us).map_err(|_| ShimError::Garbage(format!("negative wait: {us}")))?;
    let secs = us as f64 / 1e6;
    let (verdict, why) = match verdict {
        0 => (Verdict::Admit, None),
        2 => (
            Verdict::LimitTokens { reset_in_s: secs },
            Some(Why::LimitEmpty),
        ),
        3 => (
            Verdict::LimitRequests { reset_in_s: secs },
            Some(Why::LimitEmpty),
        ),
        4 => (Verdict::TooLarge, None),
        5 => (Verdict::Admit, Some(Why::OverShare)),
        v => return Err(ShimError::Garbage(format!("unknown verdict {v}"))),
    };
    Ok(Reply {
        verdict,
        why,
        state: BucketState {
            tokens: *tokens as f64 / 1000.0,
            requests: *requests as f64 / 1000.0,
            updated_ns: 0,
        },
        retry_s: secs,
        view: ShareView {
            share: *share as f64 / 1000.0,
            credit: *credit as f64 / 1000.0,
            active: u16::try_from(*active).unwrap_or(u16::MAX),
            overflow: *overflow != 0,
            level_share: level.max(0) as f64 / 1000.0,
        },
    })
}

/// The decision a reply stands for, as [`super::charge`] gives it for a local fair limit.
pub fn outcome(reply: &Reply, rule: &Rule, share: &FairShare, cost: u64) -> Outcome {
    let snap = reply.state.snapshot(&rule.params);
    let decision = match reply.why {
        Some(Why::OverShare) => {
            Decision::Reject(over_share(rule, share, &reply.view, reply.retry_s))
        }
        _ => local::decision(reply.verdict, snap, rule, cost),
    };
    Outcome {
        decision,
        why: reply.why,
        view: reply.view,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;

    fn cfg() -> crate::config::Config {
        config::parse(
            br#"{"tenant_header": "x-tenant-id","trusted_headers": {"set_by": "the test"}, "global_buckets": {"cluster": "webdis"},
                 "limits": [{"name": "p", "scope": "shared", "tokens_per_second": 3000, "burst": 10000,
                             "global": true, "share": "fair", "weights": {"acme": 2}}]}"#,
        )
        .unwrap()
    }

    #[test]
    fn the_sha1_constant_is_the_sha1_of_the_script_text() {
        assert_eq!(crate::shim::webdis::sha1_hex(SCRIPT.as_bytes()), SHA1);
    }

    #[test]
    fn keys_are_safe_and_tagged_by_limit_and_subject() {
        let c = cfg();
        assert_eq!(
            key(&c.limits[0], "~all", "gpt-4.1"),
            "tg:gf:{p:%7Eall}:gpt-4.1"
        );
        assert_eq!(
            key(&c.limits[0], "org=a/team=b", "m"),
            "tg:gf:{p:org%3Da%2Fteam%3Db}:m"
        );
    }

    #[test]
    fn request_bodies_carry_the_member_its_weight_and_the_protocol_tag() {
        let c = cfg();
        let rule = &c.limits[0];
        let share = rule.fair.as_deref().unwrap();
        let m = super::super::member(share, "acme", &c.groups, &[]);
        let b = charge_request("k", rule, share, &m, 42, ScriptCall::EvalSha);
        assert_eq!(
            b,
            format!("EVALSHA/{SHA1}/1/k/42/3000%2E0/10000%2E0/0%2E0/acme/2%2E0/0/1/64/1000000/1%2E0/0/0/tgf1/0/1")
        );
        let b = credit_request("k", rule, share, &m, -7, ScriptCall::Eval);
        assert!(b.starts_with("EVAL/") && b.ends_with("/tgf1/-7/1"), "{b}");
    }

    #[test]
    fn replies_parse_and_garbage_is_refused() {
        let c = cfg();
        let rule = &c.limits[0];
        let share = rule.fair.as_deref().unwrap();
        let r = parse_reply(200, br#"{"EVALSHA":[0,9000000,0,0,1250000,-150000,4,0]}"#).unwrap();
        assert_eq!((r.verdict, r.why), (Verdict::Admit, None));
        assert_eq!(
            (
                r.view.share,
                r.view.credit,
                r.view.active,
                r.view.level_share
            ),
            (1250.0, -150.0, 4, 0.0)
        );
        let r = parse_reply(
            200,
            br#"{"EVALSHA":[0,9000000,0,0,1250000,-150000,4,0,530250]}"#,
        )
        .unwrap();
        assert_eq!((r.view.active, r.view.level_share), (4, 530.25));
        assert!(matches!(
            outcome(&r, rule, share, 10).decision,
            Decision::Admit { .. }
        ));
        let r = parse_reply(200, br#"{"EVAL":[5,800000,0,120000,700000,-90000,3,1]}"#).unwrap();
        assert_eq!(r.why, Some(Why::OverShare));
        assert!(r.view.overflow);
        let o = outcome(&r, rule, share, 10);
        assert!(
            matches!(&o.decision, Decision::Reject(x) if x.retry_after_s == Some(0.12) && x.message.starts_with("Fair share reached")),
            "{o:?}"
        );
        let r = parse_reply(200, br#"{"EVAL":[2,100000,0,50000,0,0,3,0]}"#).unwrap();
        assert_eq!(r.why, Some(Why::LimitEmpty));
        assert!(matches!(
            outcome(&r, rule, share, 200).decision,
            Decision::Reject(x) if x.class == crate::reply::Class::TokensPerSecond
        ));
        let r = parse_reply(200, br#"{"EVAL":[4,0,0,0,0,0,0,0]}"#).unwrap();
        assert!(matches!(
            outcome(&r, rule, share, 20_000).decision,
            Decision::Reject(x) if x.class == crate::reply::Class::CostExceedsBurst
        ));
        for body in [
            &br#"{"EVAL":[9,0,0,0,0,0,0,0]}"#[..],
            br#"{"EVAL":[0,0,0,-1,0,0,0,0]}"#,
            br#"{"EVAL":[0,0,0,0,0,0]}"#,
            br#"{"EVAL":[0,0,0,0,0,0,0,0,0,0]}"#,
            b"garbage",
        ] {
            assert!(
                matches!(parse_reply(200, body), Err(ShimError::Garbage(_))),
                "{body:?}"
            );
        }
        assert_eq!(parse_reply(503, b""), Err(ShimError::Unavailable));
    }
}
