//! Quota leases: one Envoy holds a block of a tenant's (× model's) monthly quota, spends it from shared
//! data without a callout per request, and reports what it used in later calls ([`LEASE_SCRIPT`]).
//!
//! Redis counts a lease in the tenant's counters the moment it is granted, exactly like a reservation:
//! `used` = settled usage + reservations in flight + leases held, so a limit is never overshot by leases
//! (only by usage above what was reserved, as with reservations). A lease is identified by
//! `L|<envoy>|<model>|<month>` and kept in `tg:q:{t}:leases` as `"<held> <reported total> <version> <keys>"`:
//! * a call reports the Envoy's *total* usage under this lease so far; Redis takes the part not reported
//!   yet out of what the lease holds (beyond it, adds it to the counters), so a resent call never counts
//!   twice;
//! * `want` grows the lease to at least that (as far as the limits allow, at most `max_grant` more);
//!   `target ≥ 0` shrinks it to that (what is given back leaves the counters);
//! * a lease not renewed within `ttl_s` is resolved by the next call of the tenant that sees it: what it
//!   holds goes back to the counters (usage its Envoy never reported is forgiven: at most one lease per
//!   Envoy per tenant × model), and its reported total is remembered as a tombstone for a day, so the
//!   Envoy's later report counts only what it had not reported.
//! * a call also reports the Envoy's *totals* of the provider's input and output tokens under this lease
//!   (since 0.2.0, [`crate::quota::lease::io`]); the lease's field of the month's `:io` hash holds the
//!   totals taken (`"<in> <out>"`), and only what exceeds them is added to `in`, `out`, `in:<model>`,
//!   `out:<model>` — like the reported total, a resent call never counts twice.

use crate::quota::calendar::MAX_UNIX_S;
use crate::quota::keys::QuotaKeys;
use crate::quota::scripts::{QUOTA_PROTOCOL_TAG, TOMBSTONE_S};
use crate::shim::webdis::{
    command_body, lua_int, parse_int_array, ScriptCall, ShimError, MAX_LUA_INT,
};

/// The lease script.
///
/// KEYS: `used_total, used_model, limit_override, limit_model_override, leases, due, done, gone, open,
/// io`.
/// ARGV: `lease_id, reported_total, want, target (-1 = none), default_limit, default_model_limit,
/// expire_at_unix, ttl_s, has_model (1/0), tombstone_s, max_grant, lease_tombstone_s, "tg3",
/// max_share_percent, tokens_in, tokens_out`.
/// Reply: `[held, used, limit, model_used, model_limit (-1 none), version, reported_total, tokens_in,
/// tokens_out]` (the last two: the input/output totals Redis holds for the lease).
///
/// v2 (0.2.0): v1 (0.1.0) had 9 keys, 14 arguments and a 7-long reply, and no input/output split;
/// each version sends its own text (its own SHA), both on the same records (`docs/upgrading.md`).
pub const LEASE_SCRIPT: &str = concat!(
    include_str!("lease_head.lua"),
    include_str!("../common.lua"),
    include_str!("lease.lua")
);

/// SHA-1 of [`LEASE_SCRIPT`].
pub const LEASE_SHA1: &str = "0ae65724b0f0e1154f94b6ded71b4adda81a6004";

/// How long a lease's reported total is remembered after the lease is gone.
pub const LEASE_TOMBSTONE_S: u64 = 24 * TOMBSTONE_S;

/// One lease call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseArgs {
    /// The tenant's (× model's) counter keys this month.
    pub keys: QuotaKeys,
    /// `L|<envoy>|<model>|<month>`.
    pub lease_id: String,
    /// Total usage this Envoy spent from this lease so far.
    pub reported_total: u64,
    /// Grow the lease to at least this much.
    pub want: u64,
    /// Shrink it to this (`None`: keep what it holds beyond `want`).
    pub target: Option<u64>,
    /// Tenant limit when no override exists.
    pub default_limit: u64,
    /// Tenant × model limit when no override exists (0 = none).
    pub default_model_limit: u64,
    /// The counters' fixed expiry.
    pub expire_at_unix: i64,
    /// A lease not renewed within this long is resolved.
    pub ttl_s: u64,
    /// Grow by at most this much in one call.
    pub max_grant: u64,
    /// Grow to at most this percent (1..=100) of what is left, the lease included: Redis knows what
    /// is left when the Envoy does not yet (a first lease).
    pub max_share_percent: u32,
    /// This Envoy's total of the provider's input tokens under this lease so far.
    pub tokens_in: u64,
    /// Its total of output tokens.
    pub tokens_out: u64,
}

/// The lease id of an Envoy for a tenant's model in a month.
pub fn lease_id(envoy: u64, model: Option<&str>, month: &str) -> String {
    format!(
        "L|{envoy:x}|{}|{}",
        crate::store::keys::sanitize(model.unwrap_or("-")),
        crate::store::keys::sanitize(month)
    )
}

/// The prefix of every [`lease_id`] of Envoy `envoy` (`L|<envoy hex>|`; `-`, which prefixes none,
/// for 0: an Envoy that never took a lease).
pub fn lease_owner(envoy: u64) -> String {
    if envoy == 0 {
        return "-".to_string();
    }
    format!("L|{envoy:x}|")
}

/// Keys of one lease call.
pub const LEASE_KEYS: usize = 10;
/// Arguments of one lease call.
pub const LEASE_ARGS: usize = 16;
/// Integers in the lease script's reply.
pub const LEASE_REPLY_LEN: usize = 9;

/// The keys of a lease call, in script order; `io` is the month's input/output hash (`a.keys.io()`,
/// made by the caller: one string per call, none kept in every request's keys).
pub fn lease_keys<'a>(a: &'a LeaseArgs, io: &'a str) -> [&'a str; LEASE_KEYS] {
    let k = &a.keys;
    [
        k.used_total.as_str(),
        k.used_model.as_str(),
        k.limit_override.as_str(),
        k.limit_model_override.as_str(),
        k.leases.as_str(),
        k.due.as_str(),
        k.done.as_str(),
        k.gone.as_str(),
        k.open.as_str(),
        io,
    ]
}

/// The arguments of a lease call, in script order.
pub fn lease_argv(a: &LeaseArgs) -> [String; LEASE_ARGS] {
    [
        a.lease_id.clone(),
        lua_int(a.reported_total),
        lua_int(a.want),
        a.target.map_or_else(|| "-1".to_string(), lua_int),
        lua_int(a.default_limit),
        lua_int(a.default_model_limit),
        a.expire_at_unix.clamp(0, MAX_UNIX_S).to_string(),
        lua_int(a.ttl_s.max(1)),
        if a.keys.has_model { "1" } else { "0" }.to_string(),
        lua_int(TOMBSTONE_S),
        lua_int(a.max_grant.min(MAX_LUA_INT)),
        lua_int(LEASE_TOMBSTONE_S),
        QUOTA_PROTOCOL_TAG.to_string(),
        a.max_share_percent.clamp(1, 100).to_string(),
        lua_int(a.tokens_in),
        lua_int(a.tokens_out),
    ]
}

/// The Webdis body that runs the lease script.
pub fn lease_request(a: &LeaseArgs, call: ScriptCall) -> String {
    let io = a.keys.io();
    command_body(
        call,
        LEASE_SCRIPT,
        LEASE_SHA1,
        &lease_keys(a, &io),
        &lease_argv(a),
    )
}

/// What a lease call left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseReply {
    /// What the lease holds now.
    pub held: u64,
    /// The tenant counter (leases included).
    pub used: u64,
    /// The tenant limit in force.
    pub limit: u64,
    /// The tenant × model counter.
    pub model_used: u64,
    /// The tenant × model limit (`None`: none).
    pub model_limit: Option<u64>,
    /// Incremented by every call: a reply with a lower version than one already applied is stale.
    pub version: u64,
    /// The reported total Redis now holds for the lease.
    pub reported_total: u64,
    /// The input/output totals Redis now holds for the lease (more than the call reported: the
    /// Envoy's record is behind, [`crate::quota::lease::io::synced`]).
    pub tokens_io: (u64, u64),
}

impl LeaseReply {
    /// What is left of the binding limit (tenant, or tenant × model when lower).
    pub fn remaining(&self) -> u64 {
        let t = self.limit.saturating_sub(self.used);
        match self.model_limit {
            Some(m) => t.min(m.saturating_sub(self.model_used)),
            None => t,
        }
    }

    /// The binding limit (tenant's, or the tenant × model limit when it has less left).
    pub fn binding_limit(&self) -> u64 {
        match self.model_limit {
            Some(m) if m.saturating_sub(self.model_used) < self.limit.saturating_sub(self.used) => {
                m
            }
            _ => self.limit,
        }
    }
}

/// Parses the lease script's answer. Never panics.
pub fn parse_lease_reply(http_status: u32, body: &[u8]) -> Result<LeaseReply, ShimError> {
    lease_values(&parse_int_array(http_status, body, LEASE_REPLY_LEN)?)
}

/// The lease script's reply from its [`LEASE_REPLY_LEN`] integers. Never panics.
pub fn lease_values(a: &[i64]) -> Result<LeaseReply, ShimError> {
    let [held, used, limit, mused, mlimit, version, reported, tin, tout] = a else {
        return Err(ShimError::Garbage("wrong length".into()));
    };
    let non_neg = |n: i64, what: &str| {
        u64::try_from(n).map_err(|_| ShimError::Garbage(format!("negative {what}: {n}")))
    };
    Ok(LeaseReply {
        held: non_neg(*held, "held")?,
        used: non_neg(*used, "used")?,
        limit: non_neg(*limit, "limit")?,
        model_used: non_neg(*mused, "model used")?,
        model_limit: match *mlimit {
            -1 => None,
            n => Some(non_neg(n, "model limit")?),
        },
        version: non_neg(*version, "version")?,
        reported_total: non_neg(*reported, "reported")?,
        tokens_io: (non_neg(*tin, "tokens in")?, non_neg(*tout, "tokens out")?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim::webdis::sha1_hex;

    #[test]
    fn the_sha1_constant_is_the_sha1_of_the_script_text() {
        assert_eq!(sha1_hex(LEASE_SCRIPT.as_bytes()), LEASE_SHA1);
    }

    #[test]
    fn a_lease_call_lays_out_its_keys_and_arguments_in_script_order() {
        let keys = QuotaKeys::new("acme", Some("m"), "2026-11", "-");
        let a = LeaseArgs {
            lease_id: lease_id(0xab, Some("m"), "2026-11"),
            keys,
            reported_total: 5,
            want: 100,
            target: None,
            default_limit: 1000,
            default_model_limit: 0,
            expire_at_unix: 9,
            ttl_s: 60,
            max_grant: 50,
            max_share_percent: 10,
            tokens_in: 70,
            tokens_out: 8,
        };
        assert_eq!(a.lease_id, "L|ab|m|2026-11");
        let body = lease_request(&a, ScriptCall::EvalSha);
        assert!(
            body.starts_with(&format!("EVALSHA/{LEASE_SHA1}/10/")),
            "{body}"
        );
        assert!(
            body.contains("%3Aopen/tg%3Aq%3A%7Bacme%7D%3A2026-11%3Aio/L%7Cab%7Cm%7C2026-11/"),
            "{body}"
        );
        assert!(
            body.ends_with(
                "/L%7Cab%7Cm%7C2026-11/5/100/-1/1000/0/9/60/1/3600/50/86400/tg3/10/70/8"
            ),
            "{body}"
        );
    }

    #[test]
    fn a_lease_reply_parses_and_says_what_is_left() {
        let r = parse_lease_reply(200, br#"{"EVAL":[40,900,1000,300,350,3,77,12,5]}"#).unwrap();
        assert_eq!((r.held, r.version, r.reported_total), (40, 3, 77));
        assert_eq!(r.tokens_io, (12, 5));
        assert_eq!(r.remaining(), 50);
        assert_eq!(r.binding_limit(), 350);
        assert!(matches!(
            parse_lease_reply(200, br#"{"EVAL":[-1,0,0,0,-1,0,0,0,0]}"#),
            Err(ShimError::Garbage(_))
        ));
        // v1's reply (no split) is not v2's.
        assert!(matches!(
            parse_lease_reply(200, br#"{"EVAL":[40,900,1000,300,350,3,77]}"#),
            Err(ShimError::Garbage(_))
        ));
        assert!(matches!(
            parse_lease_reply(200, br#"{"EVAL":[40,900,1000,300,350,3,77,-1,0]}"#),
            Err(ShimError::Garbage(_))
        ));
    }
}
