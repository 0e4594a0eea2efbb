//! Global bucket credits: tokens a request gives back to a global (Redis) bucket — a later admission
//! step refused it, or `refund_unused` found the provider used less — or takes after the fact (a debit:
//! it used more). Queued by the request, sent by the VM's tick, best effort: one Redis does not take is
//! dropped and counted (the bucket keeps the charge, erring towards limiting). With global leases a
//! credit goes to this Envoy's lease of the bucket first (a debit is taken from it first); only the rest
//! goes to Redis.

use super::gleases;
use super::state::Credit;
use crate::config::GlobalSettings;
use crate::flow::cx::Cx;
use crate::flow::effect::{CalloutReply, Effect, Purpose};
use crate::flow::metric::Metric;
use crate::flow::shim;
use crate::global;
use crate::limits::fair::global as fair_global;
use crate::shim::webdis::ShimError;

/// Credit callouts in flight at most per VM.
pub const MAX_INFLIGHT_CREDITS: usize = 64;

/// Queues a global credit, counting a drop (at most [`MAX_QUEUED_CREDITS`](super::state::MAX_QUEUED_CREDITS) wait).
pub fn enqueue(cx: &mut Cx, mut credit: Credit) {
    // A fair record is never leased.
    if let Some(pol) = cx.cfg.global.as_ref().and_then(|g| g.lease) {
        if credit.member.is_none() {
            credit.amount = gleases::absorb(cx, &pol, &credit);
        }
    }
    if cx.worker.credits.push(credit) {
        cx.inc(Metric::GlobalCreditsDropped);
    }
}

/// The tick: sends queued credits while the shim's breaker is closed (at most
/// [`MAX_INFLIGHT_CREDITS`] in flight).
pub fn tick(cx: &mut Cx, g: &GlobalSettings) {
    if cx.worker.credits.queue.is_empty() || shim::is_open(cx, &g.cluster, &g.shim_breaker) {
        return;
    }
    let w = &mut *cx.worker;
    let room = MAX_INFLIGHT_CREDITS.saturating_sub(w.credits.inflight.len());
    let n = room.min(w.credits.queue.len());
    let jobs: Vec<Credit> = w.credits.queue.drain(..n).collect();
    let (call, fair_call) = (
        shim::script_call(w.global_script_loaded),
        shim::script_call(w.fair_script_loaded),
    );
    for c in jobs {
        let Some(rule) = cx.cfg.rule(c.rule) else {
            continue;
        };
        let body = match (&c.member, rule.fair.as_deref()) {
            (Some(m), Some(share)) => fair_global::credit_request(
                &c.key,
                rule,
                share,
                &m.as_member(),
                c.amount,
                fair_call,
            ),
            _ => global::credit_request(&c.key, &rule.params, c.amount, call),
        };
        let credits = &mut cx.worker.credits;
        credits.next_id = credits.next_id.wrapping_add(1);
        let id = credits.next_id;
        credits.inflight.insert(id, c);
        cx.fx.push(Effect::Dispatch(shim::callout(
            Purpose::Credit(id),
            &g.cluster,
            &g.authority,
            g.timeout_ms,
            body,
        )));
    }
}

/// A credit answered (or its dispatch was refused).
pub fn on_reply(cx: &mut Cx, g: &GlobalSettings, id: u64, reply: CalloutReply) {
    let Some(c) = cx.worker.credits.inflight.remove(&id) else {
        return;
    };
    let read = if c.member.is_some() {
        shim::read(&g.cluster, &reply, fair_global::parse_reply).map(|_| ())
    } else {
        shim::read(&g.cluster, &reply, global::parse_reply).map(|_| ())
    };
    match read {
        Ok(()) => {
            // EVAL caches the script too.
            if c.member.is_some() {
                cx.worker.fair_script_loaded = true;
            } else {
                cx.worker.global_script_loaded = true;
            }
            if c.amount > 0 {
                cx.add(Metric::GlobalTokensCredited, c.amount.unsigned_abs());
                // The bucket holds these again: a refusal cached before is stale.
                global::forget_refusal(cx.store(), &c.key);
            } else {
                cx.add(Metric::GlobalTokensDebited, c.amount.unsigned_abs());
            }
        }
        Err(f) if f.error == ShimError::NoScript => {
            // Sent again with EVAL on the next tick.
            if c.member.is_some() {
                cx.worker.fair_script_loaded = false;
            } else {
                cx.worker.global_script_loaded = false;
            }
            cx.worker.credits.queue.push(c);
        }
        Err(f) => {
            cx.inc(Metric::GlobalShimErrors);
            cx.inc(Metric::GlobalCreditsDropped);
            if f.error == ShimError::Unavailable {
                shim::record(cx, &g.cluster, &g.shim_breaker, false, false);
            }
        }
    }
}
