//! Global buckets on the host side: the charge callout is made by the request's context
//! (`host::http`); credits (a later step refused the request, or `refund_unused`) are queued here and
//! sent by the root's tick, best effort: a credit Redis does not take is counted and dropped, so the
//! bucket keeps the charge (it errs towards limiting, never towards over-admitting).

use super::quota::{call_response, shim_admit_at, shim_record_at, webdis_dispatch};
use super::{metrics, VM};
use crate::config::GlobalSettings;
use crate::global;
use crate::quota::{ScriptCall, ShimError};

/// Credits sent at most at once per VM.
pub const MAX_INFLIGHT_CREDITS: usize = 64;
/// Credits kept queued per VM; beyond, the oldest is dropped (counted).
pub const MAX_QUEUED_CREDITS: usize = 10_000;

/// Which script call to use now (`EVALSHA` once Redis answered one of ours).
pub fn script_call() -> ScriptCall {
    if VM.with(|vm| vm.borrow().global_script_loaded) {
        ScriptCall::EvalSha
    } else {
        ScriptCall::Eval
    }
}

/// Remembers whether Redis has the bucket script cached.
pub fn set_script_loaded(loaded: bool) {
    VM.with(|vm| vm.borrow_mut().global_script_loaded = loaded);
}

/// Breaker on the shim: `Ok(probe)` or `Err(ms)` while open.
pub fn shim_admit(g: &GlobalSettings, retries: u32) -> Result<bool, u64> {
    shim_admit_at(&g.cluster, &g.shim_breaker, retries)
}

/// Reports a callout outcome to the shim breaker.
pub fn shim_record(g: &GlobalSettings, ok: bool, probe: bool, retries: u32) {
    shim_record_at(&g.cluster, &g.shim_breaker, ok, probe, retries);
}

/// Sends one command to the shim.
pub fn dispatch(g: &GlobalSettings, body: &str) -> Result<u32, u32> {
    webdis_dispatch(&g.cluster, &g.authority, g.timeout_ms, body)
}

/// The answer to the callout being delivered.
pub fn response(body_size: usize) -> Result<global::Reply, ShimError> {
    let (status, body) = call_response(body_size);
    global::parse_reply(status, &body)
}

/// Queues a credit of `amount` tokens to `key` for the root's tick (negative: a debit, usage above
/// the charge with `refund_unused`).
pub fn enqueue_credit(key: String, rule_idx: usize, amount: i64) {
    if amount == 0 {
        return;
    }
    VM.with(|vm| {
        let mut vm = vm.borrow_mut();
        if vm.global_credits.len() >= MAX_QUEUED_CREDITS {
            vm.global_credits.remove(0);
            metrics::inc(metrics::get().global_credits_dropped);
        }
        vm.global_credits.push((key, rule_idx, amount));
    });
}

/// Root tick: sends queued credits (none while the shim breaker is open: they wait).
pub fn tick(cfg: &crate::config::Config, g: &GlobalSettings) {
    let jobs: Vec<(String, usize, i64)> = VM.with(|vm| {
        let mut vm = vm.borrow_mut();
        let room = MAX_INFLIGHT_CREDITS.saturating_sub(vm.global_credits_inflight.len());
        let n = room.min(vm.global_credits.len());
        vm.global_credits.drain(..n).collect()
    });
    if jobs.is_empty() {
        return;
    }
    let call = script_call();
    for (key, idx, amount) in jobs {
        let Some(rule) = cfg.rules.get(idx) else {
            continue;
        };
        let body = global::credit_request(&key, &rule.params, amount, call);
        match dispatch(g, &body) {
            Ok(token) => VM.with(|vm| {
                vm.borrow_mut()
                    .global_credits_inflight
                    .insert(token, (key, idx, amount));
            }),
            Err(_) => metrics::inc(metrics::get().global_credits_dropped),
        }
    }
}

/// Root: a credit callout answered. False if `token` is not one of ours.
pub fn on_credit_response(
    cfg: &crate::config::Config,
    g: &GlobalSettings,
    token: u32,
    body_size: usize,
) -> bool {
    let Some((key, idx, amount)) =
        VM.with(|vm| vm.borrow_mut().global_credits_inflight.remove(&token))
    else {
        return false;
    };
    let m = metrics::get();
    match response(body_size) {
        Ok(_) => {
            // EVAL caches the script too.
            set_script_loaded(true);
            if amount > 0 {
                metrics::add(m.global_tokens_credited, amount.unsigned_abs());
            } else {
                metrics::add(m.global_tokens_debited, amount.unsigned_abs());
            }
        }
        Err(ShimError::NoScript) => {
            // Resent with EVAL on the next tick.
            set_script_loaded(false);
            VM.with(|vm| vm.borrow_mut().global_credits.push((key, idx, amount)));
        }
        Err(e) => {
            metrics::inc(m.global_shim_errors);
            metrics::inc(m.global_credits_dropped);
            if e == ShimError::Unavailable {
                shim_record(g, false, false, cfg.cas_max_retries);
            }
        }
    }
    true
}
