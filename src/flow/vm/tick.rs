//! The root context's work, once per tick: release requests held by shaping, check the shim clusters
//! (first tick), send settlements, lease syncs and global credits, write the successes gathered for
//! failure-rate breakers, and log the summaries of suppressed lines. Also the answers to the callouts
//! this work made ([`on_callout_reply`]) and the VM's last words ([`on_done`]).

use super::{batch, breakers, credits, gleases, leases, probes, settle};
use crate::flow::cx::Cx;
use crate::flow::effect::{CalloutReply, Effect, Level, Purpose};

/// Tick period while shaping is configured: the granularity of releasing held requests.
pub const SHAPING_TICK_MS: u32 = 5;
/// Tick period for quota settlements and global credits alone.
pub const SETTLE_TICK_MS: u32 = 20;
/// Tick period otherwise (log summaries).
pub const IDLE_TICK_MS: u32 = 1000;

/// The tick period for a configuration.
pub fn period_ms(cfg: &crate::config::Config) -> u32 {
    if cfg.shaping() {
        SHAPING_TICK_MS
    } else if cfg.quota.is_some() || cfg.global.is_some() {
        SETTLE_TICK_MS
    } else {
        IDLE_TICK_MS
    }
}

/// The root's tick: releases held requests that are due, sends due settlements and credits, logs the
/// summaries of suppressed log lines.
pub fn on_tick(cx: &mut Cx) {
    let now = cx.now();
    if !cx.worker.probes.done {
        cx.worker.probes.done = true;
        probes::start(cx);
    }
    if !cx.worker.held.is_empty() {
        let (due, keep): (Vec<_>, Vec<_>) = cx.worker.held.iter().partition(|(_, at)| *at <= now);
        cx.worker.held = keep;
        for (id, _) in due {
            cx.fx.push(Effect::ResumeContext(id));
        }
    }
    if let Some(q) = cx.cfg.quota.as_ref() {
        settle::tick(cx, q);
        batch::tick(cx, q);
        if let Some(l) = q.lease.as_ref() {
            leases::tick(cx, q, l);
        }
    }
    if let Some(g) = cx.cfg.global.as_ref() {
        if let Some(pol) = g.lease {
            gleases::tick(cx, g, &pol);
        }
        credits::tick(cx, g);
    }
    breakers::flush(cx, now, true);
    for (cause, n) in cx.worker.logs.summaries(now) {
        cx.fx.push(Effect::Log(
            Level::Warn,
            format!("{n} more '{cause}' failures in the last 10 s (log lines suppressed)"),
        ));
    }
}

/// The root was woken ([`Effect::WakeRoot`]): reservations waiting in this VM's batch are sent.
pub fn on_wake(cx: &mut Cx) {
    if let Some(q) = cx.cfg.quota.as_ref() {
        batch::flush(cx, q);
    }
}

/// The plugin is torn down (the root context's `on_done`): what this VM keeps for shared data is
/// written (ended leased requests, see [`leases::settle`]); what needs a callout is left.
pub fn on_done(cx: &mut Cx) {
    if cx.cfg.quota.as_ref().is_some_and(|q| q.lease.is_some()) {
        leases::flush(cx);
    }
}

/// A root callout answered (or the host refused to dispatch it).
pub fn on_callout_reply(cx: &mut Cx, purpose: Purpose, reply: CalloutReply) {
    match purpose {
        Purpose::Settle(id) => {
            if let Some(q) = cx.cfg.quota.as_ref() {
                settle::on_reply(cx, q, id, reply);
            }
        }
        Purpose::Credit(id) => {
            if let Some(g) = cx.cfg.global.as_ref() {
                credits::on_reply(cx, g, id, reply);
            }
        }
        Purpose::Probe => probes::on_reply(cx, reply),
        Purpose::Lease(id) => {
            if let Some((q, l)) = cx
                .cfg
                .quota
                .as_ref()
                .and_then(|q| q.lease.as_ref().map(|l| (q, l)))
            {
                leases::on_reply(cx, q, l, id, reply);
            }
        }
        Purpose::GlobalLease(id) => {
            if let Some((g, pol)) = cx.cfg.global.as_ref().and_then(|g| g.lease.map(|l| (g, l))) {
                gleases::on_reply(cx, g, &pol, id, reply);
            }
        }
        Purpose::Batch(id) => {
            if let Some(q) = cx.cfg.quota.as_ref() {
                batch::on_reply(cx, q, id, reply);
            }
        }
        Purpose::GlobalCharge | Purpose::Reserve | Purpose::LeaseGiveBack => {}
    }
}
