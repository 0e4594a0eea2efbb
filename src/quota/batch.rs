//! Many reservations in one script call (group commit, see `flow::vm::batch`): the batch script, the
//! Webdis body that calls it and the reading of its reply, one result per reservation. Pure.
//!
//! The script is the reservation script itself wrapped as a Lua function of its own `KEYS` and `ARGV`
//! (`reserve_batch_head.lua` + the reservation script's text + `reserve_batch_tail.lua`), called once
//! per entry under `pcall`: each reservation is all or nothing exactly as when it is sent alone (the
//! same checks, the same records in `open`/`due`, the same tombstones and idempotency by request id,
//! the same sweep of what passed its deadline, per tenant), and one entry that fails does not stop the
//! others. The whole call runs atomically in Redis.
//!
//! ```text
//! EVALSHA/<sha1>/<9 n>/<9 keys of entry 1>/…/<9 keys of entry n>/tg3b/<n>/<13 args of entry 1>/…
//! reply: [<9 integers of entry 1>, …, <9 integers of entry n>]
//!        an entry refused by the script: [-1, code, 0, 0, 0, 0, 0, 0, 0]
//! ```
//!
//! Keys of different tenants hash to different Redis Cluster slots: behind a Redis Cluster a batch of
//! several tenants is refused whole with `CROSSSLOT` (nothing ran), and the caller sends each tenant's
//! reservations apart from then on.

use super::replies::reserve_values;
use super::scripts::{reserve_keys, reserve_parts, ReserveArgs};
use super::ReserveReply;
use crate::shim::webdis::{command_body, parse_int_array_of, ScriptCall, ShimError};

/// The protocol tag of the batch script (its first argument).
pub const BATCH_PROTOCOL_TAG: &str = "tg3b";

/// The batch reservation script.
pub const RESERVE_BATCH_SCRIPT: &str = concat!(
    include_str!("reserve_batch_head.lua"),
    include_str!("reserve_head.lua"),
    include_str!("common.lua"),
    include_str!("reserve.lua"),
    include_str!("reserve_batch_tail.lua")
);

/// SHA-1 of [`RESERVE_BATCH_SCRIPT`] (checked against the text in a unit test and against a real
/// Redis in `tests/redis_live.rs`).
pub const RESERVE_BATCH_SHA1: &str = "7f5001a5d8783138e3286addff4c5cf560586e61";

/// Integers per entry in the batch's reply.
const PER_ENTRY: usize = 9;

/// The Webdis body that runs the reservations `batch` in one call (an empty batch gives an empty
/// body).
pub fn reserve_batch_request(batch: &[&ReserveArgs], call: ScriptCall) -> String {
    if batch.is_empty() {
        return String::new();
    }
    let parts: Vec<_> = batch.iter().map(|a| reserve_parts(a)).collect();
    let mut keys: Vec<&str> = Vec::with_capacity(9 * parts.len());
    let mut argv: Vec<String> = Vec::with_capacity(2 + 13 * parts.len());
    argv.push(BATCH_PROTOCOL_TAG.to_string());
    argv.push(parts.len().to_string());
    for (k, a) in &parts {
        keys.extend(reserve_keys(k));
        argv.extend(a.iter().cloned());
    }
    command_body(call, RESERVE_BATCH_SCRIPT, RESERVE_BATCH_SHA1, &keys, &argv)
}

/// The message each refusal code of an entry stands for: the reservation script's own error, so that
/// an entry's failure is classified as if it had been sent alone ([`ShimError::may_have_run`]).
fn entry_error(code: i64) -> ShimError {
    let msg = match code {
        1 => crate::shim::webdis::ALREADY_RESERVED,
        2 => "ERR tokengate: not a count",
        3 => "ERR tokengate: bad argument",
        4 => "ERR tokengate: protocol mismatch",
        5 => "ERR tokengate: refused",
        // Redis failed while the entry ran: it may have written part of it.
        _ => "ERR the reservation failed in Redis while it ran",
    };
    ShimError::RedisError(msg.to_string())
}

/// Reads the batch's reply: `Err` for the call as a whole (the shim, Redis or the script's own checks
/// refused it: nothing of it is known), else one result per entry, in order.
pub fn parse_reserve_batch_reply(
    http_status: u32,
    body: &[u8],
    n: usize,
) -> Result<Vec<Result<ReserveReply, ShimError>>, ShimError> {
    let len = n.saturating_mul(PER_ENTRY);
    let a = parse_int_array_of(http_status, body, len..=len)?;
    Ok(a.chunks(PER_ENTRY)
        .map(|e| match e {
            [-1, code, ..] => Err(entry_error(*code)),
            values => reserve_values(values),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim::webdis::sha1_hex;

    fn args(tenant: &str, id: &str) -> ReserveArgs {
        let mut a = crate::quota::scripts::tests::args();
        a.tenant = tenant.into();
        a.request_id = id.into();
        a
    }

    #[test]
    fn the_batch_sha1_constant_is_the_sha1_of_its_script_text() {
        assert_eq!(
            sha1_hex(RESERVE_BATCH_SCRIPT.as_bytes()),
            RESERVE_BATCH_SHA1
        );
    }

    #[test]
    fn the_batch_script_wraps_the_reservation_script_unchanged() {
        assert!(RESERVE_BATCH_SCRIPT.contains(crate::quota::RESERVE_SCRIPT));
        assert!(RESERVE_BATCH_SCRIPT.starts_with("-- tokengate reserve batch v3"));
    }

    #[test]
    fn a_batch_body_lists_every_entrys_keys_then_the_tag_the_count_and_every_entrys_arguments() {
        let (a, b) = (args("acme", "r1"), args("zeta", "r2"));
        let body = reserve_batch_request(&[&a, &b], ScriptCall::EvalSha);
        let single_a = crate::quota::reserve_request(&a, ScriptCall::EvalSha);
        let single_b = crate::quota::reserve_request(&b, ScriptCall::EvalSha);
        // Each single body: EVALSHA/<sha>/9/<9 keys>/<13 args>.
        let seg = |s: &str| s.split('/').map(str::to_string).collect::<Vec<_>>();
        let (sa, sb, batch) = (seg(&single_a), seg(&single_b), seg(&body));
        assert_eq!(
            batch.get(..3),
            Some(&["EVALSHA".into(), RESERVE_BATCH_SHA1.into(), "18".into()][..])
        );
        assert_eq!(batch.get(3..12), sa.get(3..12));
        assert_eq!(batch.get(12..21), sb.get(3..12));
        assert_eq!(batch.get(21..23), Some(&["tg3b".into(), "2".into()][..]));
        assert_eq!(batch.get(23..36), sa.get(12..25));
        assert_eq!(batch.get(36..49), sb.get(12..25));
        assert_eq!(batch.len(), 49);
        assert!(reserve_batch_request(&[], ScriptCall::Eval).is_empty());
    }

    #[test]
    fn a_batch_reply_gives_each_entry_its_own_answer_or_its_own_refusal() {
        let body = br#"{"EVALSHA":[1,150,1000,150,-1,0,50,0,0, 0,990,1000,0,-1,0,0,1,0, -1,1,0,0,0,0,0,0,0, -1,2,0,0,0,0,0,0,0, -1,6,0,0,0,0,0,0,0]}"#;
        let r = parse_reserve_batch_reply(200, body, 5).unwrap();
        assert_eq!(r.len(), 5);
        assert!(r[0].as_ref().unwrap().allowed);
        assert!(!r[1].as_ref().unwrap().allowed);
        let dup = r[2].as_ref().unwrap_err();
        assert!(
            dup.may_have_run(),
            "a duplicate proves the first one reserved"
        );
        assert!(
            !r[3].as_ref().unwrap_err().may_have_run(),
            "the script refused before writing"
        );
        assert!(
            r[4].as_ref().unwrap_err().may_have_run(),
            "Redis failed while it ran"
        );
    }

    #[test]
    fn a_batch_reply_of_the_wrong_length_or_an_error_is_the_whole_calls_failure() {
        assert!(matches!(
            parse_reserve_batch_reply(200, br#"{"EVAL":[1,150,1000,150,-1,0,50,0,0]}"#, 2),
            Err(ShimError::Garbage(_))
        ));
        assert_eq!(
            parse_reserve_batch_reply(200, br#"{"EVALSHA":[false,"NOSCRIPT x"]}"#, 2),
            Err(ShimError::NoScript)
        );
        assert_eq!(
            parse_reserve_batch_reply(504, b"", 2),
            Err(ShimError::Unavailable)
        );
        let cross = parse_reserve_batch_reply(
            200,
            br#"{"EVAL":[false,"CROSSSLOT Keys in request don't hash to the same slot"]}"#,
            2,
        )
        .unwrap_err();
        assert!(!cross.may_have_run());
    }
}
