//! Per-VM state and the root context's work, pure: requests held by shaping, quota settlements and
//! global-bucket credits queued off the request path, the caches that save host calls, and the log gate.
//!
//! * **Settlements** go to the shared-data journal as requests end; the VM holding the journal's claim
//!   sends them from its tick ([`on_tick`], see `settle.rs`), batched per tenant (their keys share one
//!   Redis Cluster slot). Redis applies each once per request id, so a resend never charges twice.
//! * **Credits** of global buckets (a later step refused the request, `refund_unused`) are sent the same
//!   way, best effort: one Redis does not take is dropped and counted (the bucket keeps the charge, erring
//!   towards limiting).
//! * **Global leases** (`global_buckets.lease`, see `glease.rs`): top-ups of accounts that ran low and
//!   give-backs of idle ones, sent from the tick; credits of a leased bucket go to this Envoy's lease
//!   first, to Redis only beyond it.
//! * Nothing is sent while the shim's breaker is open.

use super::{shim, CalloutReply, Cx, Effect, Level, Metric, Purpose};
use crate::config::GlobalSettings;
use crate::global;
use crate::identity::KeyCache;
use crate::shim::webdis::ShimError;
use crate::store::hash::FnvBuild;
use crate::store::registry::KeySet;
use std::collections::HashMap;

/// Credit callouts in flight at most per VM.
pub const MAX_INFLIGHT_CREDITS: usize = 64;
/// Credits kept queued per VM; beyond, the oldest is dropped (counted).
pub const MAX_QUEUED_CREDITS: usize = 10_000;
/// Most entries kept in [`Worker::known_keys`] before it is cleared.
pub const KNOWN_KEYS_CACHE: usize = 50_000;

pub use super::settle::Job;

/// A global bucket credit (negative: a debit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credit {
    /// Redis key of the bucket.
    pub key: String,
    /// Rule index (for its bucket parameters).
    pub rule: usize,
    /// Tokens.
    pub amount: i64,
}

/// This VM's state.
#[derive(Default)]
pub struct Worker {
    /// Requests held by shaping: (context id, release time ns).
    pub held: Vec<(u32, u64)>,
    /// Shared-data keys known to exist (saves a read per request; bounded by [`KNOWN_KEYS_CACHE`]).
    pub known_keys: KeySet,
    /// Tenant ids of recently seen API keys.
    pub key_tenants: KeyCache,
    /// Redis has the quota scripts cached (EVALSHA works).
    pub quota_script_loaded: bool,
    /// Redis has the global bucket script cached.
    pub global_script_loaded: bool,
    /// Log rate limiter.
    pub logs: super::logs::LogGate,
    /// The shim clusters were checked (once per VM, at its first tick).
    probed: bool,
    /// Probes in flight: cluster names by probe order.
    probes: Vec<String>,
    /// The VM's part of the settlement journal.
    pub settle: super::settle::Sender,
    /// The VM's lease syncs.
    pub leases: super::lease::Leases,
    /// The VM's global-bucket lease calls.
    pub gleases: super::glease::GLeases,
    /// Successes of failure-rate breakers not written yet.
    pub breakers: crate::breaker::failover::VmBreakers,
    credits: Vec<Credit>,
    credits_inflight: HashMap<u64, Credit, FnvBuild>,
    next_id: u64,
}

impl Worker {
    /// Holds request `id` until `until_ns` (released by [`on_tick`]).
    pub fn hold(&mut self, id: u32, until_ns: u64) {
        self.held.push((id, until_ns));
    }

    /// Forgets a context that went away (no harm if it was not held).
    pub fn forget(&mut self, id: u32) {
        self.held.retain(|(h, _)| *h != id);
    }

    /// Queues a global bucket credit (or debit) for the root's tick; true when the oldest had to be
    /// dropped to make room.
    pub fn enqueue_credit(&mut self, credit: Credit) -> bool {
        if credit.amount == 0 {
            return false;
        }
        let dropped = self.credits.len() >= MAX_QUEUED_CREDITS;
        if dropped {
            self.credits.remove(0);
        }
        self.credits.push(credit);
        dropped
    }

    /// Credits waiting (queued, not in flight).
    pub fn queued_credits(&self) -> usize {
        self.credits.len()
    }

    fn id(&mut self) -> u64 {
        self.next_id = self.next_id.wrapping_add(1);
        self.next_id
    }
}

/// Queues a settlement (in the shared-data journal).
pub fn enqueue_settlement(cx: &mut Cx, job: Job) {
    super::settle::enqueue(cx, job);
}

/// Queues a global credit, counting a drop. With leases, the credit goes to this Envoy's lease of the
/// bucket first (a debit is taken from it first); only the rest goes to Redis.
pub fn enqueue_credit(cx: &mut Cx, mut credit: Credit) {
    if let Some(pol) = cx.cfg.global.as_ref().and_then(|g| g.lease) {
        credit.amount = super::glease::absorb(cx, &pol, &credit);
    }
    if cx.worker.enqueue_credit(credit) {
        cx.inc(Metric::GlobalCreditsDropped);
    }
}

/// The root's tick: releases held requests that are due, sends due settlements and credits, logs the
/// summaries of suppressed log lines.
pub fn on_tick(cx: &mut Cx) {
    let now = cx.now();
    if !cx.worker.probed {
        cx.worker.probed = true;
        probe_clusters(cx);
    }
    if !cx.worker.held.is_empty() {
        let (due, keep): (Vec<_>, Vec<_>) = cx.worker.held.iter().partition(|(_, at)| *at <= now);
        cx.worker.held = keep;
        for (id, _) in due {
            cx.fx.push(Effect::ResumeContext(id));
        }
    }
    if let Some(q) = cx.cfg.quota.as_ref() {
        super::settle::tick(cx, q);
        if let Some(l) = q.lease.as_ref() {
            super::lease::tick(cx, q, l);
        }
    }
    if let Some(g) = cx.cfg.global.as_ref() {
        if let Some(pol) = g.lease {
            super::glease::tick(cx, g, &pol);
        }
        tick_credits(cx, g);
    }
    super::breakers::flush(cx, now, true);
    for (cause, n) in cx.worker.logs.summaries(now) {
        cx.fx.push(Effect::Log(
            Level::Warn,
            format!("{n} more '{cause}' failures in the last 10 s (log lines suppressed)"),
        ));
    }
}

/// The plugin is torn down (the root context's `on_done`): what this VM keeps for shared data is
/// written (ended leased requests, see [`super::lease::settle`]); what needs a callout is left.
pub fn on_done(cx: &mut Cx) {
    if cx.cfg.quota.as_ref().is_some_and(|q| q.lease.is_some()) {
        super::lease::flush(cx);
    }
}

fn tick_credits(cx: &mut Cx, g: &GlobalSettings) {
    if cx.worker.credits.is_empty() || shim::is_open(cx, &g.cluster, &g.shim_breaker) {
        return;
    }
    let w = &mut *cx.worker;
    let room = MAX_INFLIGHT_CREDITS.saturating_sub(w.credits_inflight.len());
    let n = room.min(w.credits.len());
    let jobs: Vec<Credit> = w.credits.drain(..n).collect();
    let call = shim::script_call(w.global_script_loaded);
    for c in jobs {
        let Some(rule) = cx.cfg.rule(c.rule) else {
            continue;
        };
        let body = global::credit_request(&c.key, &rule.params, c.amount, call);
        let id = cx.worker.id();
        cx.worker.credits_inflight.insert(id, c);
        cx.fx.push(Effect::Dispatch(shim::callout(
            Purpose::Credit(id),
            &g.cluster,
            &g.authority,
            g.timeout_ms,
            body,
        )));
    }
}

/// A root callout answered (or the host refused to dispatch it).
pub fn on_callout_reply(cx: &mut Cx, purpose: Purpose, reply: CalloutReply) {
    match purpose {
        Purpose::Settle(id) => {
            if let Some(q) = cx.cfg.quota.as_ref() {
                super::settle::on_reply(cx, q, id, reply);
            }
        }
        Purpose::Credit(id) => {
            if let Some(g) = cx.cfg.global.as_ref() {
                credit_reply(cx, g, id, reply);
            }
        }
        Purpose::Probe => probe_reply(cx, reply),
        Purpose::Lease(id) => {
            if let Some((q, l)) = cx
                .cfg
                .quota
                .as_ref()
                .and_then(|q| q.lease.as_ref().map(|l| (q, l)))
            {
                super::lease::on_reply(cx, q, l, id, reply);
            }
        }
        Purpose::GlobalLease(id) => {
            if let Some((g, pol)) = cx.cfg.global.as_ref().and_then(|g| g.lease.map(|l| (g, l))) {
                super::glease::on_reply(cx, g, &pol, id, reply);
            }
        }
        Purpose::GlobalCharge | Purpose::Reserve | Purpose::LeaseGiveBack => {}
    }
}

/// Shared-data key marking that a cluster was checked recently (one VM of the process checks it).
fn probe_key(cluster: &str) -> String {
    format!("tg:probe:{cluster}")
}

/// At a VM's first tick: checks each shim cluster the configuration names with a Webdis `PING`, so a
/// wrong cluster name (an Istio cluster is `outbound|<port>||<host>`) shows in the log at start, not as
/// a `quota_unavailable` on the first request. One VM of the process checks each cluster (the others
/// see its mark in shared data).
fn probe_clusters(cx: &mut Cx) {
    let mut targets: Vec<(String, String, u32)> = Vec::new();
    if let Some(q) = &cx.cfg.quota {
        targets.push((q.cluster.clone(), q.authority.clone(), q.timeout_ms));
    }
    if let Some(g) = &cx.cfg.global {
        if !targets.iter().any(|(c, ..)| *c == g.cluster) {
            targets.push((g.cluster.clone(), g.authority.clone(), g.timeout_ms));
        }
    }
    let now = cx.now();
    for (cluster, authority, timeout_ms) in targets {
        let key = probe_key(&cluster);
        let recent = matches!(cx.store().get(&key), Ok(Some((b, _))) if crate::store::read_u64(&b, 0)
            .is_some_and(|t| now.saturating_sub(t) < 60_000_000_000));
        if recent {
            continue;
        }
        let _ = cx.store().set(&key, &now.to_le_bytes(), 0);
        cx.worker.probes.push(cluster.clone());
        cx.fx.push(Effect::Dispatch(shim::callout(
            Purpose::Probe,
            &cluster,
            &authority,
            timeout_ms.max(1000),
            "PING".to_string(),
        )));
    }
}

fn probe_reply(cx: &mut Cx, reply: CalloutReply) {
    if cx.worker.probes.is_empty() {
        return;
    }
    let cluster = cx.worker.probes.remove(0);
    let pong = reply.status == 200 && reply.body.windows(4).any(|w| w == b"PONG");
    match reply.refused {
        Some(s) => {
            cx.inc(Metric::ShimClusterUnreachable);
            cx.log(
                Level::Error,
                format!(
                    "{}: quota and global-bucket calls to it will fail (on_failure applies)",
                    shim::describe_refusal(&cluster, s)
                ),
            );
        }
        None if pong => cx.log(
            Level::Info,
            format!("webdis shim at cluster '{cluster}' answers PING"),
        ),
        None => {
            cx.inc(Metric::ShimClusterUnreachable);
            cx.log(
                Level::Warn,
                format!(
                    "webdis shim at cluster '{cluster}' did not answer PING (HTTP {}{}): quota and global-bucket calls will fail until it does (on_failure applies)",
                    reply.status,
                    if reply.status == 503 { ": no healthy host, or Webdis cannot reach Redis" } else if reply.status == 504 { ": timeout" } else { "" }
                ),
            );
        }
    }
}

fn credit_reply(cx: &mut Cx, g: &GlobalSettings, id: u64, reply: CalloutReply) {
    let Some(c) = cx.worker.credits_inflight.remove(&id) else {
        return;
    };
    let result = match reply.refused {
        Some(_) => Err(ShimError::Unavailable),
        None => global::parse_reply(reply.status, &reply.body),
    };
    match result {
        Ok(_) => {
            // EVAL caches the script too.
            cx.worker.global_script_loaded = true;
            if c.amount > 0 {
                cx.add(Metric::GlobalTokensCredited, c.amount.unsigned_abs());
                // The bucket holds these again: a refusal cached before is stale.
                global::forget_refusal(cx.store(), &c.key);
            } else {
                cx.add(Metric::GlobalTokensDebited, c.amount.unsigned_abs());
            }
        }
        Err(ShimError::NoScript) => {
            // Sent again with EVAL on the next tick.
            cx.worker.global_script_loaded = false;
            cx.worker.credits.push(c);
        }
        Err(e) => {
            cx.inc(Metric::GlobalShimErrors);
            cx.inc(Metric::GlobalCreditsDropped);
            if e == ShimError::Unavailable {
                shim::record(cx, &g.cluster, &g.shim_breaker, false, false);
            }
        }
    }
}
