//! The Lua scripts of monthly quotas (in `src/quota/*.lua`, loaded by `include_str!`), their SHA-1s, and
//! the Webdis bodies that call them: each builder lays out KEYS and ARGV in the order its script's
//! documentation gives. One reservation per request; settlements (and charges of requests with no
//! known reservation) once the provider reported usage, grouped per tenant, many tenants' groups in one
//! call ([`SETTLE_BATCH_SCRIPT`]).
//!
//! A script's text must stay byte for byte what its `*_SHA1` names (`EVALSHA` calls it by that hash); a
//! unit test recomputes each SHA-1 from the included text, and `tests/redis_live.rs` checks them against
//! what a real Redis' `SCRIPT LOAD` returns.

use super::keys::QuotaKeys;
use crate::quota::calendar::MAX_UNIX_S;
use crate::shim::webdis::{command_body, lua_int, ScriptCall};

/// The protocol tag the v3 scripts check (a script refuses arguments laid out for another version).
pub const QUOTA_PROTOCOL_TAG: &str = "tg3";

/// The protocol tag of the v4 settlement script (v3 and the input/output tokens of each entry).
pub const SETTLE_PROTOCOL_TAG: &str = "tg4";

/// How long a tombstone lives (seconds): a settlement of a request resolved by its deadline, a resend
/// of a charge, or a reservation that reaches Redis after its request was reconciled, is recognised
/// for this long.
pub const TOMBSTONE_S: u64 = 3600;

/// The reservation script (all or nothing).
///
/// KEYS: `used_total, used_model, limit_override, limit_model_override, open, due, done, gone, leases`.
/// ARGV: `prompt_cost, output_cost, default_limit, default_model_limit (0 = none), expire_at_unix,
/// request_id, deadline_s, clamp (1/0), min_output_cost, has_model (1/0), tombstone_s, "tg3",
/// lease_owner` (this Envoy's lease field prefix, `L|<envoy>|`, or `-`).
/// Reply: `[allowed, used_after, limit, model_used_after, model_limit (-1 = none), held_elsewhere,
/// granted_output, reason, leases_elsewhere]` with reason 0 admitted, 1 tenant limit, 2 model limit,
/// 3 admitted clamped; `held_elsewhere` (0 when admitted): how much what is left (never a deficit)
/// would grow once other Envoys' leases of the account went back; `leases_elsewhere` (0/1): other
/// Envoys hold leases of the tenant, of any model (1 also beyond the 512 leases looked at).
///
/// An admitted reservation is recorded in `open` (`"<amount> <prompt_cost> <used keys>"`) with a
/// deadline `now + deadline_s` (Redis' clock) in `due`. Every call first resolves up to 16 reservations
/// past their deadline (their request never settled: Envoy stopped, the VM went away): each is charged
/// its prompt cost, the rest of its amount given back, and a tombstone `"S <prompt>"` lets a settlement
/// that still arrives apply the difference once. A request id already reserved or tombstoned is refused
/// with an error (a reservation that arrives after its request was reconciled does nothing).
pub const RESERVE_SCRIPT: &str = concat!(
    include_str!("reserve_head.lua"),
    include_str!("common.lua"),
    include_str!("reserve.lua")
);

/// SHA-1 of [`RESERVE_SCRIPT`] (what `SCRIPT LOAD` returns; checked against a real Redis in the tests).
pub const RESERVE_SHA1: &str = "c09ac96d358b16d76f22fb284bf1ddb47287432b";

/// The settlement script: a batch of ONE tenant's settlements and charges (their keys share the tenant's
/// hash tag, so the batch stays on one Redis Cluster slot).
///
/// KEYS: `open, due, done, gone, leases`, then `used_total, used_model, used_io` per entry ([`QuotaKeys::io`]).
/// ARGV: `tombstone_s, "tg4"`, then per entry `mode ("s" settle | "c" charge), request_id, actual,
/// expire_at_unix, has_model (1/0), tokens_in, tokens_out`.
/// Reply: one integer per entry: 1 applied, 0 nothing to do (already applied), −1 a counter in Redis
/// is not a number or the entry is malformed.
///
/// Per entry: a reservation in `open` is replaced by `actual` (the counters move by actual − amount)
/// and removed; one resolved at its deadline (tombstone `S <min>`) moves by actual − min once; otherwise
/// `s` does nothing (already settled) and `c` — a charge without a reservation: a request admitted while
/// the shim was down, or one whose reservation's outcome is unknown — adds `actual` and leaves a
/// tombstone `C`, so a resend, or a reservation that reaches Redis late, does nothing. Counters never go
/// below 0. An entry applied (reply 1, so once per request) also adds `tokens_in`/`tokens_out` to the
/// account's month hash `used_io` (fields `in`, `out`, and `in:<model>`, `out:<model>` when a model is
/// tracked; expiry `expire_at_unix` like the counters); a hash of the wrong type or a field that is not a
/// number is left alone. Every call also resolves reservations past their deadline, as
/// [`RESERVE_SCRIPT`] does (adding nothing to `used_io`: no usage is known then).
pub const SETTLE_SCRIPT: &str = concat!(
    include_str!("settle_head.lua"),
    include_str!("common.lua"),
    include_str!("settle.lua")
);

/// SHA-1 of [`SETTLE_SCRIPT`] (checked against a real Redis in the tests).
pub const SETTLE_SHA1: &str = "aefcec0a602952164d38f39a58888018b93a5337";

/// Settlements of many tenants in one call (group commit of a window of the settlement journal, see
/// `flow::vm::settle`): [`SETTLE_SCRIPT`] wrapped as a Lua function of its own KEYS and ARGV
/// (`settle_batch_head.lua` + its text + `settle_batch_tail.lua`) and run once per tenant group under
/// `pcall`, so each group does exactly what it does when sent alone, and a group Redis refuses (a key of
/// the wrong type, say) does not stop the others. The whole call runs atomically in Redis.
///
/// KEYS: per group, [`SETTLE_SCRIPT`]'s `open, due, done, gone, leases, (used_total, used_model, used_io) × m`.
/// ARGV: `tombstone_s, "tg4s:<m1>,<m2>,…"` (each group's entry count, in order), then the 7 arguments
/// of every entry, group after group. Reply: one integer per entry, [`SETTLE_SCRIPT`]'s (1, 0, −1);
/// every entry of a group the script refused is −2, of a group Redis failed while it ran −3
/// (it may have written part of it: settlements are idempotent by request id, so it is sent again).
///
/// Keys of different tenants hash to different Redis Cluster slots: behind a Redis Cluster a call with
/// several tenants is refused whole with `CROSSSLOT` (nothing ran), and the caller sends each tenant's
/// group apart from then on.
pub const SETTLE_BATCH_SCRIPT: &str = concat!(
    include_str!("settle_batch_head.lua"),
    include_str!("settle_head.lua"),
    include_str!("common.lua"),
    include_str!("settle.lua"),
    include_str!("settle_batch_tail.lua")
);

/// SHA-1 of [`SETTLE_BATCH_SCRIPT`] (checked against the text in a unit test and against a real Redis
/// in `tests/redis_live.rs`).
pub const SETTLE_BATCH_SHA1: &str = "f95bf27995faa70c1a00a09df05e55beafc4f65a";

/// The group-count tag of [`SETTLE_BATCH_SCRIPT`] (`tg4s:` then the counts).
pub const SETTLE_BATCH_TAG: &str = "tg4s:";

/// Everything one reservation needs. Costs are weighted tokens (see [`weighted`](super::weighted)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveArgs {
    /// Tenant id (sanitized into the keys).
    pub tenant: String,
    /// Model to meter per tenant x model; `None` = only the tenant total.
    pub model: Option<String>,
    /// Month label from [`month_label`](crate::quota::calendar::month_label) at reservation time.
    pub month: String,
    /// Request id: names the reservation (its settlement finds it by this id).
    pub request_id: String,
    /// Weighted cost of the prompt (also what the reservation is charged if it is never settled).
    pub prompt_cost: u64,
    /// Weighted cost of the reserved output (max tokens).
    pub output_cost: u64,
    /// Tenant limit per month when no `tg:q:{t}:limit` override exists.
    pub default_limit: u64,
    /// Tenant x model limit when no override exists; 0 = no model limit.
    pub default_model_limit: u64,
    /// Fixed expiry of the counters: [`month_end_unix`] plus a grace period for late settlements.
    ///
    /// [`month_end_unix`]: crate::quota::calendar::month_end_unix
    pub expire_at_unix: i64,
    /// Seconds after which a reservation that was never settled is resolved (charged its prompt).
    pub deadline_s: u64,
    /// When the prompt fits but prompt + output does not, reserve what is left for the output.
    pub clamp_output: bool,
    /// Smallest output cost worth admitting when clamping (below it the request is rejected).
    pub min_output_cost: u64,
    /// This Envoy's lease field prefix ([`lease_owner`](super::lease_owner)): its own leases are
    /// not counted in a refusal's `held_elsewhere`.
    pub lease_owner: String,
}

impl ReserveArgs {
    /// The keys this reservation touches (reuse them for the settlement).
    pub fn keys(&self) -> QuotaKeys {
        QuotaKeys::new(
            &self.tenant,
            self.model.as_deref(),
            &self.month,
            &self.request_id,
        )
    }
}

fn flag(b: bool) -> String {
    if b { "1" } else { "0" }.to_string()
}

/// The Webdis body (`POST /`) that runs the reservation script.
pub fn reserve_request(args: &ReserveArgs, call: ScriptCall) -> String {
    let (k, argv) = reserve_parts(args);
    command_body(call, RESERVE_SCRIPT, RESERVE_SHA1, &reserve_keys(&k), &argv)
}

/// The reservation script's keys ([`reserve_keys`]) and arguments for `args`, in its order
/// (also one entry of a batch, [`crate::quota::batch`]).
pub(crate) fn reserve_parts(args: &ReserveArgs) -> (QuotaKeys, [String; 13]) {
    let k = args.keys();
    let argv = [
        lua_int(args.prompt_cost),
        lua_int(args.output_cost),
        lua_int(args.default_limit),
        lua_int(args.default_model_limit),
        args.expire_at_unix.clamp(0, MAX_UNIX_S).to_string(),
        k.request_id.clone(),
        lua_int(args.deadline_s.max(1)),
        flag(args.clamp_output),
        lua_int(args.min_output_cost),
        flag(k.has_model),
        lua_int(TOMBSTONE_S),
        QUOTA_PROTOCOL_TAG.to_string(),
        args.lease_owner.clone(),
    ];
    (k, argv)
}

/// The reservation script's KEYS, in its order.
pub(crate) fn reserve_keys(k: &QuotaKeys) -> [&str; 9] {
    [
        k.used_total.as_str(),
        k.used_model.as_str(),
        k.limit_override.as_str(),
        k.limit_model_override.as_str(),
        k.open.as_str(),
        k.due.as_str(),
        k.done.as_str(),
        k.gone.as_str(),
        k.leases.as_str(),
    ]
}

/// What a settlement entry does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleMode {
    /// Replace the request's reservation by its actual cost.
    Settle,
    /// Charge the actual cost of a request whose reservation does not exist or is unknown (admitted
    /// while the shim was down; callout timed out): reconciled against whatever reached Redis, once.
    Charge,
}

/// One settlement or charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleArgs {
    /// The keys from the reservation ([`ReserveArgs::keys`]).
    pub keys: QuotaKeys,
    /// Settle or charge.
    pub mode: SettleMode,
    /// Weighted tokens the request really cost.
    pub actual: u64,
    /// Same fixed expiry as the reservation.
    pub expire_at_unix: i64,
    /// The provider's input (prompt) tokens, 0 when no usage was reported (refunds, estimates).
    pub tokens_in: u64,
    /// The provider's output (completion) tokens, 0 when no usage was reported.
    pub tokens_out: u64,
}

/// The Webdis body that runs settlements of ONE tenant (see [`SETTLE_SCRIPT`]); an empty batch gives an
/// empty body.
pub fn settle_request(batch: &[&SettleArgs], call: ScriptCall) -> String {
    let Some(first) = batch.first() else {
        return String::new();
    };
    let k = &first.keys;
    let ios: Vec<String> = batch.iter().map(|a| a.keys.io()).collect();
    let mut keys: Vec<&str> = Vec::with_capacity(5 + batch.len() * 3);
    keys.extend([
        k.open.as_str(),
        k.due.as_str(),
        k.done.as_str(),
        k.gone.as_str(),
        k.leases.as_str(),
    ]);
    let mut argv: Vec<String> = Vec::with_capacity(2 + batch.len() * 7);
    argv.push(lua_int(TOMBSTONE_S));
    argv.push(SETTLE_PROTOCOL_TAG.to_string());
    for (a, io) in batch.iter().zip(&ios) {
        keys.push(a.keys.used_total.as_str());
        keys.push(a.keys.used_model.as_str());
        keys.push(io.as_str());
        push_settle_args(&mut argv, a);
    }
    command_body(call, SETTLE_SCRIPT, SETTLE_SHA1, &keys, &argv)
}

/// The Webdis body that runs the settlement `groups` (each ONE tenant's, non-empty) in one call of
/// [`SETTLE_BATCH_SCRIPT`]; empty groups are left out, and no group gives an empty body.
pub fn settle_batch_request(groups: &[Vec<&SettleArgs>], call: ScriptCall) -> String {
    let groups: Vec<&Vec<&SettleArgs>> = groups.iter().filter(|g| !g.is_empty()).collect();
    if groups.is_empty() {
        return String::new();
    }
    let n: usize = groups.iter().map(|g| g.len()).sum();
    let ios: Vec<Vec<String>> = groups
        .iter()
        .map(|g| g.iter().map(|a| a.keys.io()).collect())
        .collect();
    let mut keys: Vec<&str> = Vec::with_capacity(5 * groups.len() + 3 * n);
    let mut argv: Vec<String> = Vec::with_capacity(2 + 7 * n);
    argv.push(lua_int(TOMBSTONE_S));
    let counts: Vec<String> = groups.iter().map(|g| g.len().to_string()).collect();
    argv.push(format!("{SETTLE_BATCH_TAG}{}", counts.join(",")));
    for (g, gio) in groups.iter().zip(&ios) {
        let Some(first) = g.first() else { continue };
        let k = &first.keys;
        keys.extend([
            k.open.as_str(),
            k.due.as_str(),
            k.done.as_str(),
            k.gone.as_str(),
            k.leases.as_str(),
        ]);
        for (a, io) in g.iter().zip(gio) {
            keys.push(a.keys.used_total.as_str());
            keys.push(a.keys.used_model.as_str());
            keys.push(io.as_str());
            push_settle_args(&mut argv, a);
        }
    }
    command_body(call, SETTLE_BATCH_SCRIPT, SETTLE_BATCH_SHA1, &keys, &argv)
}

fn push_settle_args(argv: &mut Vec<String>, a: &SettleArgs) {
    argv.push(
        match a.mode {
            SettleMode::Settle => "s",
            SettleMode::Charge => "c",
        }
        .to_string(),
    );
    argv.push(a.keys.request_id.clone());
    argv.push(lua_int(a.actual));
    argv.push(a.expire_at_unix.clamp(0, MAX_UNIX_S).to_string());
    argv.push(flag(a.keys.has_model));
    argv.push(lua_int(a.tokens_in));
    argv.push(lua_int(a.tokens_out));
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::shim::webdis::{sha1_hex, webdis_encode};

    #[test]
    fn every_sha1_constant_is_the_sha1_of_its_script_text() {
        for (script, sha) in [
            (RESERVE_SCRIPT, RESERVE_SHA1),
            (SETTLE_SCRIPT, SETTLE_SHA1),
            (SETTLE_BATCH_SCRIPT, SETTLE_BATCH_SHA1),
        ] {
            assert_eq!(
                sha1_hex(script.as_bytes()),
                sha,
                "{}",
                script.lines().next().unwrap_or("")
            );
        }
    }

    #[test]
    fn the_reservation_scripts_duplicate_answer_is_the_one_read_as_proof_it_ran() {
        let line = format!(
            "return redis.error_reply('{}')",
            crate::shim::webdis::ALREADY_RESERVED
        );
        assert!(RESERVE_SCRIPT.contains(&line));
        let dup = crate::shim::webdis::ShimError::RedisError(
            crate::shim::webdis::ALREADY_RESERVED.into(),
        );
        assert!(dup.may_have_run());
        let bad_arg =
            crate::shim::webdis::ShimError::RedisError("ERR tokengate: bad argument".into());
        assert!(!bad_arg.may_have_run());
    }

    pub(crate) fn args() -> ReserveArgs {
        ReserveArgs {
            tenant: "acme".into(),
            model: Some("gpt-4.1".into()),
            month: "2026-11".into(),
            request_id: "req-1".into(),
            prompt_cost: 100,
            output_cost: 50,
            default_limit: 1000,
            default_model_limit: 0,
            expire_at_unix: 1_796_688_000,
            deadline_s: 600,
            clamp_output: false,
            min_output_cost: 0,
            lease_owner: "-".into(),
        }
    }

    #[test]
    fn reserve_request_encodes_keys_and_arguments_in_script_order() {
        let body = reserve_request(&args(), ScriptCall::EvalSha);
        assert_eq!(
            body,
            format!(
                "EVALSHA/{RESERVE_SHA1}/9/tg%3Aq%3A%7Bacme%7D%3A2026-11/\
                 tg%3Aq%3A%7Bacme%7D%3A2026-11%3Am%3Agpt-4%2E1/tg%3Aq%3A%7Bacme%7D%3Alimit/\
                 tg%3Aq%3A%7Bacme%7D%3Alimit%3Am%3Agpt-4%2E1/tg%3Aq%3A%7Bacme%7D%3Aopen/\
                 tg%3Aq%3A%7Bacme%7D%3Adue/tg%3Aq%3A%7Bacme%7D%3Adone/tg%3Aq%3A%7Bacme%7D%3Agone/\
                 tg%3Aq%3A%7Bacme%7D%3Aleases/\
                 100/50/1000/0/1796688000/req-1/600/0/0/1/3600/tg3/-"
            )
        );
    }

    #[test]
    fn encoded_bodies_never_contain_raw_slash_plus_dot_or_space_inside_segments() {
        let mut a = args();
        a.tenant = "a/b+c d.json".into();
        a.request_id = "x.json".into();
        a.lease_owner = crate::quota::lease_owner(0xabc);
        for body in [
            reserve_request(&a, ScriptCall::Eval),
            reserve_request(&a, ScriptCall::EvalSha),
        ] {
            assert!(!body.contains('+') && !body.contains(' ') && !body.contains('.'));
            assert!(body.ends_with("/tg3/L%7Cabc%7C"), "{body}");
            let segments = body.split('/').count();
            assert_eq!(segments, 2 + 1 + 9 + 13);
        }
        assert!(webdis_encode(RESERVE_SCRIPT)
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'%' || b == b'_' || b == b'-'));
    }

    #[test]
    fn evalsha_bodies_are_an_order_of_magnitude_smaller_than_eval_bodies() {
        let eval = reserve_request(&args(), ScriptCall::Eval).len();
        let sha = reserve_request(&args(), ScriptCall::EvalSha).len();
        eprintln!("reserve body: EVAL {eval} bytes, EVALSHA {sha} bytes");
        assert!(sha < 500 && eval > 2000);
    }

    #[test]
    fn a_settlement_batch_lists_the_tenants_keys_once_then_each_entry() {
        let a = args();
        let s = SettleArgs {
            keys: a.keys(),
            mode: SettleMode::Settle,
            actual: u64::MAX,
            expire_at_unix: 10,
            tokens_in: 12,
            tokens_out: 34,
        };
        let c = SettleArgs {
            mode: SettleMode::Charge,
            actual: 7,
            tokens_in: 0,
            tokens_out: 0,
            ..s.clone()
        };
        let body = settle_request(&[&s, &c], ScriptCall::EvalSha);
        assert!(body.starts_with(&format!(
            "EVALSHA/{SETTLE_SHA1}/11/tg%3Aq%3A%7Bacme%7D%3Aopen/"
        )));
        assert!(
            body.contains("%3A2026-11%3Am%3Agpt-4%2E1/tg%3Aq%3A%7Bacme%7D%3A2026-11%3Aio/"),
            "{body}"
        );
        assert!(
            body.ends_with("/3600/tg4/s/req-1/9007199254740991/10/1/12/34/c/req-1/7/10/1/0/0"),
            "{body}"
        );
        assert!(settle_request(&[], ScriptCall::Eval).is_empty());
    }
}
