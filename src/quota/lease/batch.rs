//! Syncs of many lease accounts in one script call: the batch script, its Webdis body and the reading
//! of its reply, one result per account. Pure.
//!
//! The script is the lease script itself wrapped as a Lua function of its own `KEYS` and `ARGV`
//! (`lease_batch_head.lua` + the lease script's text + `lease_batch_tail.lua`), called once per entry under
//! `pcall`: each entry does exactly what it does when sent alone (the same records, versions and
//! tombstones, the same sweep of the tenant's expired leases), an entry that fails does not stop the
//! others, and the whole call runs atomically in Redis.
//!
//! ```text
//! EVALSHA/<sha1>/<10 n>/<keys of entry 1>/…/<keys of entry n>/tgLb/<n>/10/16/9/<args of entry 1>/…
//! reply: [<status 1>, <9 integers of entry 1>, …]   status 0: ran; else a refusal (integers are 0)
//! ```
//!
//! Keys of different tenants hash to different Redis Cluster slots: behind a Redis Cluster a batch of
//! several tenants is refused whole with `CROSSSLOT` (nothing ran), and the caller batches each
//! tenant's accounts apart from then on.

use super::redis::{
    lease_argv, lease_keys, lease_values, LeaseArgs, LeaseReply, LEASE_ARGS, LEASE_KEYS,
    LEASE_REPLY_LEN,
};
use crate::shim::webdis::{command_body, parse_int_array_of, ScriptCall, ShimError};

/// The protocol tag of the batch script (its first argument).
pub const LEASE_BATCH_TAG: &str = "tgLb";

/// The lease batch script.
pub const LEASE_BATCH_SCRIPT: &str = concat!(
    include_str!("lease_batch_head.lua"),
    include_str!("lease_head.lua"),
    include_str!("../common.lua"),
    include_str!("lease.lua"),
    include_str!("lease_batch_tail.lua")
);

/// SHA-1 of [`LEASE_BATCH_SCRIPT`] (checked against the text in a unit test and against a real Redis
/// in `tests/redis_live.rs`).
pub const LEASE_BATCH_SHA1: &str = "b19b41a1644a6069203955b0d2454df841a85d35";

/// Integers per entry in the batch's reply: a status and the lease script's reply.
const PER_ENTRY: usize = 1 + LEASE_REPLY_LEN;

/// The Webdis body that runs the lease calls `batch` in one call (an empty batch gives an empty body).
pub fn lease_batch_request(batch: &[&LeaseArgs], call: ScriptCall) -> String {
    if batch.is_empty() {
        return String::new();
    }
    let mut keys: Vec<&str> = Vec::with_capacity(LEASE_KEYS * batch.len());
    let mut argv: Vec<String> = Vec::with_capacity(5 + LEASE_ARGS * batch.len());
    argv.extend([
        LEASE_BATCH_TAG.to_string(),
        batch.len().to_string(),
        LEASE_KEYS.to_string(),
        LEASE_ARGS.to_string(),
        LEASE_REPLY_LEN.to_string(),
    ]);
    let ios: Vec<String> = batch.iter().map(|a| a.keys.io()).collect();
    for (a, io) in batch.iter().zip(&ios) {
        keys.extend(lease_keys(a, io));
        argv.extend(lease_argv(a));
    }
    command_body(call, LEASE_BATCH_SCRIPT, LEASE_BATCH_SHA1, &keys, &argv)
}

/// The error an entry's status stands for: the lease script's own, as if it had been sent alone.
fn entry_error(code: i64) -> ShimError {
    let msg = match code {
        1 => "ERR tokengate: bad argument",
        2 => "ERR tokengate: protocol mismatch",
        3 => "ERR tokengate: not a count",
        4 => "ERR tokengate: refused",
        // Redis failed while the entry ran: it may have written part of it.
        _ => "ERR the lease call failed in Redis while it ran",
    };
    ShimError::RedisError(msg.to_string())
}

/// Reads the batch's reply: `Err` for the call as a whole (the shim, Redis or the script's own checks
/// refused it: nothing of it is known), else one result per entry, in order.
pub fn parse_lease_batch_reply(
    http_status: u32,
    body: &[u8],
    n: usize,
) -> Result<Vec<Result<LeaseReply, ShimError>>, ShimError> {
    let len = n.saturating_mul(PER_ENTRY);
    let a = parse_int_array_of(http_status, body, len..=len)?;
    Ok(a.chunks(PER_ENTRY)
        .map(|e| match e.split_first() {
            Some((0, values)) => lease_values(values),
            Some((code, _)) => Err(entry_error(*code)),
            None => Err(ShimError::Garbage("empty entry".into())),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::lease::redis::{lease_id, lease_request, LEASE_SCRIPT, LEASE_SHA1};
    use crate::quota::QuotaKeys;
    use crate::shim::webdis::sha1_hex;

    fn args(tenant: &str, reported: u64) -> LeaseArgs {
        LeaseArgs {
            keys: QuotaKeys::new(tenant, Some("m"), "2026-12", "-"),
            lease_id: lease_id(0xab, Some("m"), "2026-12"),
            reported_total: reported,
            want: 100,
            target: None,
            default_limit: 1000,
            default_model_limit: 0,
            expire_at_unix: 9,
            ttl_s: 60,
            max_grant: 100,
            max_share_percent: 10,
            tokens_in: reported * 2,
            tokens_out: reported,
        }
    }

    #[test]
    fn the_batch_sha1_constant_is_the_sha1_of_its_script_text() {
        assert_eq!(sha1_hex(LEASE_BATCH_SCRIPT.as_bytes()), LEASE_BATCH_SHA1);
    }

    #[test]
    fn the_batch_script_wraps_the_lease_script_unchanged() {
        assert!(LEASE_BATCH_SCRIPT.contains(LEASE_SCRIPT));
        assert!(LEASE_BATCH_SCRIPT.starts_with("-- tokengate lease batch v1"));
        assert_ne!(LEASE_BATCH_SHA1, LEASE_SHA1);
    }

    #[test]
    fn a_batch_lays_out_every_entrys_keys_then_the_counts_then_every_entrys_arguments() {
        let (a, b) = (args("acme", 5), args("beta", 7));
        let body = lease_batch_request(&[&a, &b], ScriptCall::EvalSha);
        let one = |x: &LeaseArgs| lease_request(x, ScriptCall::EvalSha);
        // Each entry's keys and arguments are those of its call alone.
        let parts = |s: &str| -> Vec<String> { s.split('/').map(str::to_string).collect() };
        let (pa, pb, pab) = (parts(&one(&a)), parts(&one(&b)), parts(&body));
        assert_eq!(pab[0], "EVALSHA");
        assert_eq!(pab[1], LEASE_BATCH_SHA1);
        assert_eq!(pab[2], (2 * LEASE_KEYS).to_string());
        let keys = |p: &[String]| p[3..3 + LEASE_KEYS].to_vec();
        let argv = |p: &[String]| p[3 + LEASE_KEYS..].to_vec();
        assert_eq!(pab[3..3 + LEASE_KEYS], keys(&pa)[..]);
        assert_eq!(pab[3 + LEASE_KEYS..3 + 2 * LEASE_KEYS], keys(&pb)[..]);
        let rest = &pab[3 + 2 * LEASE_KEYS..];
        assert_eq!(rest[..5], ["tgLb", "2", "10", "16", "9"]);
        assert_eq!(rest[5..5 + LEASE_ARGS], argv(&pa)[..]);
        assert_eq!(rest[5 + LEASE_ARGS..], argv(&pb)[..]);
        assert_eq!(lease_batch_request(&[], ScriptCall::Eval), "");
    }

    #[test]
    fn a_batch_reply_gives_each_entry_its_reply_or_its_refusal() {
        let r = parse_lease_batch_reply(
            200,
            br#"{"EVAL":[0,40,900,1000,300,350,3,77,12,5,3,0,0,0,0,0,0,0,0,0,5,0,0,0,0,0,0,0,0,0]}"#,
            3,
        )
        .unwrap();
        assert_eq!(r.len(), 3);
        let first = r[0].as_ref().unwrap();
        assert_eq!(
            (
                first.held,
                first.version,
                first.reported_total,
                first.tokens_io
            ),
            (40, 3, 77, (12, 5))
        );
        assert!(
            matches!(&r[1], Err(ShimError::RedisError(m)) if m.starts_with("ERR tokengate: not a count"))
        );
        // Redis failed while the entry ran: it may have written.
        assert!(r[2].as_ref().unwrap_err().may_have_run());
        assert!(!r[1].as_ref().unwrap_err().may_have_run());
        // The wrong number of integers refuses the whole reply.
        assert!(matches!(
            parse_lease_batch_reply(200, br#"{"EVAL":[0,40,900,1000,300,350,3,77,0,0]}"#, 2),
            Err(ShimError::Garbage(_))
        ));
        assert!(matches!(
            parse_lease_batch_reply(200, br#"{"EVAL":[false,"NOSCRIPT No matching script"]}"#, 2),
            Err(ShimError::NoScript)
        ));
    }
}
