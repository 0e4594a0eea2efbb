//! Per-VM state and the root context's work, pure: requests held by shaping, quota settlements and
//! global-bucket credits queued off the request path, the caches that save host calls, and the log gate.
//!
//! * **Settlements** are queued by requests as they end and sent by the root's tick
//!   ([`on_tick`]); settlements of one tenant go together in one callout (their keys share one Redis
//!   Cluster slot). One the shim cannot take now is retried with exponential backoff, and is idempotent
//!   per request id in Redis, so a retry never charges or refunds twice.
//! * **Credits** of global buckets (a later step refused the request, `refund_unused`) are sent the same
//!   way, best effort: one Redis does not take is dropped and counted (the bucket keeps the charge, erring
//!   towards limiting).
//! * Nothing is sent while the shim's breaker is open.

use super::{shim, CalloutReply, Cx, Effect, Level, Metric, Purpose};
use crate::admission::KeySet;
use crate::config::{GlobalSettings, QuotaSettings};
use crate::global;
use crate::hash::FnvBuild;
use crate::identity::KeyCache;
use crate::quota::{self, SettleArgs, SettleMode};
use crate::webdis::ShimError;
use std::collections::HashMap;

/// Settlement callouts in flight at most per VM.
pub const MAX_INFLIGHT_SETTLEMENTS: usize = 32;
/// Settlements kept queued per VM; beyond, the oldest is dropped (counted).
pub const MAX_QUEUED_SETTLEMENTS: usize = 100_000;
/// Most settlements of one tenant sent in one callout.
pub const MAX_BATCH: usize = 32;
/// Credit callouts in flight at most per VM.
pub const MAX_INFLIGHT_CREDITS: usize = 64;
/// Credits kept queued per VM; beyond, the oldest is dropped (counted).
pub const MAX_QUEUED_CREDITS: usize = 10_000;
/// Most entries kept in [`Worker::known_keys`] before it is cleared.
pub const KNOWN_KEYS_CACHE: usize = 50_000;

/// What a settlement job sends.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The settlement (or charge).
    pub args: SettleArgs,
    /// What the reservation held (0 for a charge), for the refund / extra-charge counters.
    pub reserved: u64,
}

impl Job {
    fn marker(&self) -> String {
        format!(
            "{} of {}",
            self.args.keys.request_id,
            quota::tenant_tag(&self.args.keys)
        )
    }
}

/// One settlement waiting to be sent (or sent again).
#[derive(Debug, Clone, PartialEq)]
pub struct SettleJob {
    /// What to send.
    pub job: Job,
    /// Attempts made so far.
    pub attempts: u32,
    /// Not before (ns).
    pub due_ns: u64,
}

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
    settle_queue: Vec<SettleJob>,
    settle_inflight: HashMap<u64, Vec<SettleJob>, FnvBuild>,
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

    /// Queues a quota settlement for the root's tick.
    pub fn enqueue_settlement(&mut self, job: Job) -> bool {
        let dropped = self.settle_queue.len() >= MAX_QUEUED_SETTLEMENTS;
        if dropped {
            self.settle_queue.remove(0);
        }
        self.settle_queue.push(SettleJob {
            job,
            attempts: 0,
            due_ns: 0,
        });
        dropped
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

    /// Settlements waiting (queued, not in flight).
    pub fn queued_settlements(&self) -> usize {
        self.settle_queue.len()
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

/// Queues a settlement, counting a drop.
pub fn enqueue_settlement(cx: &mut Cx, job: Job) {
    if cx.worker.enqueue_settlement(job) {
        cx.inc(Metric::QuotaSettleDropped);
    }
}

/// Queues a global credit, counting a drop.
pub fn enqueue_credit(cx: &mut Cx, credit: Credit) {
    if cx.worker.enqueue_credit(credit) {
        cx.inc(Metric::GlobalCreditsDropped);
    }
}

/// The root's tick: releases held requests that are due, sends due settlements and credits, logs the
/// summaries of suppressed log lines.
pub fn on_tick(cx: &mut Cx) {
    let now = cx.now();
    if !cx.worker.held.is_empty() {
        let (due, keep): (Vec<_>, Vec<_>) = cx.worker.held.iter().partition(|(_, at)| *at <= now);
        cx.worker.held = keep;
        for (id, _) in due {
            cx.fx.push(Effect::ResumeContext(id));
        }
    }
    if let Some(q) = cx.cfg.quota.as_ref() {
        tick_settlements(cx, q);
    }
    if let Some(g) = cx.cfg.global.as_ref() {
        tick_credits(cx, g);
    }
    for (cause, n) in cx.worker.logs.summaries(now) {
        cx.fx.push(Effect::Log(
            Level::Warn,
            format!("{n} more '{cause}' failures in the last 10 s (log lines suppressed)"),
        ));
    }
}

fn tick_settlements(cx: &mut Cx, q: &QuotaSettings) {
    let now = cx.now();
    if cx.worker.settle_queue.is_empty() || shim::is_open(cx, &q.cluster, &q.shim_breaker) {
        return;
    }
    // Settlements of one tenant go together (their keys share the tenant's hash tag).
    let w = &mut *cx.worker;
    let mut room = MAX_INFLIGHT_SETTLEMENTS.saturating_sub(w.settle_inflight.len());
    let mut batches: Vec<(String, Vec<SettleJob>)> = Vec::new();
    let mut keep = Vec::new();
    for job in std::mem::take(&mut w.settle_queue) {
        if job.due_ns > now {
            keep.push(job);
            continue;
        }
        let tag = quota::tenant_tag(&job.job.args.keys).to_string();
        let slot = batches
            .iter()
            .position(|(bt, b)| *bt == tag && b.len() < MAX_BATCH);
        match slot.and_then(|i| batches.get_mut(i)) {
            Some((_, batch)) => batch.push(job),
            None if room > 0 => {
                room -= 1;
                batches.push((tag, vec![job]));
            }
            None => keep.push(job),
        }
    }
    w.settle_queue = keep;
    let call = shim::script_call(w.quota_script_loaded);
    for (_, batch) in batches {
        let args: Vec<&SettleArgs> = batch.iter().map(|j| &j.job.args).collect();
        let body = quota::settle_request(&args, call);
        let id = cx.worker.id();
        cx.worker.settle_inflight.insert(id, batch);
        cx.fx.push(Effect::Dispatch(shim::callout(
            Purpose::Settle(id),
            &q.cluster,
            &q.authority,
            q.timeout_ms,
            body,
        )));
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
        let Some(rule) = cx.cfg.rules.get(c.rule) else {
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
                settle_reply(cx, q, id, reply);
            }
        }
        Purpose::Credit(id) => {
            if let Some(g) = cx.cfg.global.as_ref() {
                credit_reply(cx, g, id, reply);
            }
        }
        Purpose::GlobalCharge | Purpose::Reserve => {}
    }
}

fn settle_reply(cx: &mut Cx, q: &QuotaSettings, id: u64, reply: CalloutReply) {
    let Some(batch) = cx.worker.settle_inflight.remove(&id) else {
        return;
    };
    let result = match reply.refused {
        Some(s) => Err((
            ShimError::Unavailable,
            shim::describe_refusal(&q.cluster, s),
        )),
        None => quota::parse_settle_reply(reply.status, &reply.body, batch.len()).map_err(|e| {
            let why = format!("{e} (cluster '{}')", q.cluster);
            (e, why)
        }),
    };
    match result {
        Ok(flags) => {
            cx.worker.quota_script_loaded = true;
            for (job, flag) in batch.iter().zip(flags) {
                match flag {
                    1 => applied(cx, job),
                    0 => cx.inc(Metric::QuotaSettleDuplicates),
                    _ => {
                        cx.inc(Metric::QuotaSettleDropped);
                        cx.log_failure(
                            Level::Error,
                            "settle_not_a_number",
                            format!(
                                "settlement for {} skipped: a counter in Redis is not a number",
                                job.job.marker()
                            ),
                        );
                    }
                }
            }
        }
        Err((ShimError::NoScript, _)) => {
            cx.worker.quota_script_loaded = false;
            cx.worker.settle_queue.extend(batch);
        }
        Err((e, why)) => {
            cx.inc(Metric::QuotaShimErrors);
            if e == ShimError::Unavailable {
                shim::record(cx, &q.cluster, &q.shim_breaker, false, false);
            }
            for job in batch {
                retry(cx, q, job, &why);
            }
        }
    }
}

fn retry(cx: &mut Cx, q: &QuotaSettings, mut job: SettleJob, why: &str) {
    job.attempts = job.attempts.saturating_add(1);
    if job.attempts >= q.settle_max_attempts {
        cx.inc(Metric::QuotaSettleDropped);
        cx.log_failure(
            Level::Error,
            "settle_given_up",
            format!(
                "settlement for {} given up after {} attempts ({why}); the reservation stands",
                job.job.marker(),
                job.attempts
            ),
        );
        return;
    }
    cx.inc(Metric::QuotaSettleRetries);
    let backoff_ms = q
        .settle_retry_ms
        .saturating_mul(1u64 << job.attempts.min(10))
        .min(60_000);
    job.due_ns = cx
        .now()
        .saturating_add(backoff_ms.saturating_mul(1_000_000));
    cx.worker.settle_queue.push(job);
}

fn applied(cx: &mut Cx, job: &SettleJob) {
    cx.inc(Metric::QuotaSettled);
    let j = &job.job;
    match j.args.mode {
        SettleMode::Settle if j.args.actual < j.reserved => {
            cx.add(Metric::QuotaRefundedTokens, j.reserved - j.args.actual)
        }
        SettleMode::Settle => cx.add(Metric::QuotaExtraChargedTokens, j.args.actual - j.reserved),
        SettleMode::Charge => cx.inc(Metric::QuotaReconciled),
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
