//! Quota settlements, sent by one VM, through the shared-data journal ([`crate::store::journal`]): a request that ends pushes its
//! settlement (or the charge of a request with no known reservation); the VM holding the journal's claim
//! sends them, batched per tenant, and moves the journal's head once Redis took them. Nothing waits in
//! one VM's memory except what the journal could not take at that instant (retried on the next tick).
//!
//! A batch the shim could not take is sent again after a backoff (`quota.settle_retry_ms`, doubling, at
//! most 60 s) and while the shim's breaker is open nothing is sent: settlements wait in the journal for
//! as long as Redis is away (up to [`crate::store::journal::CAPACITY`] of them; beyond, new ones are dropped
//! and counted in `tokengate_quota_settle_dropped`). A batch Redis refuses with an error (not an
//! outage) is given up after `quota.settle_max_attempts` (logged, counted).

use super::state::Window;
use crate::config::QuotaSettings;
use crate::flow::cx::Cx;
use crate::flow::effect::{CalloutReply, Effect, Level, Purpose};
use crate::flow::metric::Metric;
use crate::flow::shim;
use crate::quota::settlement::Job;
use crate::quota::{self, SettleArgs, SettleMode};
use crate::shim::webdis::ShimError;
use crate::store::journal::{self, PushError};
use std::collections::HashMap;

/// Entries read from the journal per window.
pub const WINDOW: usize = 128;
/// Most settlements of one tenant sent in one callout.
pub const MAX_BATCH: usize = 32;
/// Settlements kept in a VM when the journal is busy; beyond, the oldest is dropped (counted).
pub const MAX_LOCAL: usize = 10_000;
/// A slot whose push never completed is skipped after this long.
pub const STALL_NS: u64 = 2_000_000_000;

/// Queues a settlement in the journal.
pub fn enqueue(cx: &mut Cx, job: Job) {
    let retries = cx.cfg.cas_max_retries;
    match journal::push(cx.store(), &job.encode(), retries) {
        Ok(_) => {}
        Err(PushError::Full) => {
            cx.inc(Metric::QuotaSettleDropped);
            cx.log_failure(
                Level::Error,
                "settle_journal_full",
                format!(
                    "settlement for request {} dropped: {} settlements are waiting for the quota shim (the reservation stands until its deadline)",
                    job.args.keys.request_id,
                    journal::CAPACITY
                ),
            );
        }
        Err(PushError::Busy) => {
            let s = &mut cx.worker.settle;
            if s.local.len() >= MAX_LOCAL {
                s.local.remove(0);
                cx.inc(Metric::QuotaSettleDropped);
            }
            cx.worker.settle.local.push(job);
        }
    }
}

/// The root's tick: sends the next window of the journal when this VM holds the claim.
pub fn tick(cx: &mut Cx, q: &QuotaSettings) {
    let now = cx.now();
    let retries = cx.cfg.cas_max_retries;
    // What the journal could not take before.
    if !cx.worker.settle.local.is_empty() {
        let local = std::mem::take(&mut cx.worker.settle.local);
        for job in local {
            enqueue(cx, job);
        }
    }
    // Settlements waiting in shared data, for operators (a backlog that grows: Redis is not taking
    // them) and for tests that wait for every settlement to land.
    let (head, tail) = journal::bounds(cx.store());
    let backlog = tail.saturating_sub(head);
    if cx.worker.settle.backlog != Some(backlog) {
        cx.worker.settle.backlog = Some(backlog);
        cx.fx.push(Effect::Gauge(
            "tokengate_quota_settle_backlog".to_string(),
            backlog,
        ));
    }
    if cx.worker.settle.window.is_some() || now < cx.worker.settle.retry_at {
        return;
    }
    if head == tail || shim::is_open(cx, &q.cluster, &q.shim_breaker) {
        return;
    }
    if cx.worker.settle.owner == 0 {
        cx.worker.settle.owner = crate::store::claim::owner_id(cx.store(), retries).unwrap_or(0);
    }
    let owner = cx.worker.settle.owner;
    if owner == 0 || !journal::claim(cx.store(), owner, now, retries) {
        return;
    }
    let (head, entries, stalled) = journal::peek(cx.store(), WINDOW);
    if entries.is_empty() {
        if stalled {
            // A push that claimed a seq never wrote its slot: skip it after a while.
            match cx.worker.settle.stalled {
                Some((h, since)) if h == head && now.saturating_sub(since) > STALL_NS => {
                    if journal::advance(cx.store(), head, head + 1, retries) {
                        cx.inc(Metric::QuotaSettleDropped);
                    }
                    cx.worker.settle.stalled = None;
                }
                Some((h, _)) if h == head => {}
                _ => cx.worker.settle.stalled = Some((head, now)),
            }
        }
        return;
    }
    cx.worker.settle.stalled = None;
    let end = entries.last().map_or(head, |(seq, _)| seq + 1);
    // Settlements of one tenant go together (their keys share the tenant's hash tag).
    let mut groups: Vec<(String, Vec<Job>)> = Vec::new();
    for (_, payload) in entries {
        let Some(job) = Job::decode(&payload) else {
            cx.inc(Metric::QuotaSettleDropped);
            continue;
        };
        let tag = quota::tenant_tag(&job.args.keys).to_string();
        match groups
            .iter_mut()
            .find(|(t, b)| *t == tag && b.len() < MAX_BATCH)
        {
            Some((_, b)) => b.push(job),
            None => groups.push((tag, vec![job])),
        }
    }
    let call = shim::script_call(cx.worker.quota_script_loaded);
    let mut batches = HashMap::default();
    for (_, jobs) in groups {
        let args: Vec<&SettleArgs> = jobs.iter().map(|j| &j.args).collect();
        let body = quota::settle_request(&args, call);
        let s = &mut cx.worker.settle;
        s.next_id = s.next_id.wrapping_add(1);
        let id = s.next_id;
        batches.insert(id, jobs);
        cx.fx.push(Effect::Dispatch(shim::callout(
            Purpose::Settle(id),
            &q.cluster,
            &q.authority,
            q.timeout_ms,
            body,
        )));
    }
    let empty = batches.is_empty();
    cx.worker.settle.window = Some(Window {
        head,
        end,
        batches,
        unavailable: false,
        refused: None,
        noscript: false,
    });
    if empty {
        finish_window(cx, q);
    }
}

/// A settlement batch answered (or its dispatch was refused).
pub fn on_reply(cx: &mut Cx, q: &QuotaSettings, id: u64, reply: CalloutReply) {
    let Some(jobs) = cx
        .worker
        .settle
        .window
        .as_mut()
        .and_then(|w| w.batches.remove(&id))
    else {
        return;
    };
    let n = jobs.len();
    match shim::read(&q.cluster, &reply, |status, body| {
        quota::parse_settle_reply(status, body, n)
    }) {
        Ok(flags) => {
            cx.worker.quota_script_loaded = true;
            for (job, flag) in jobs.iter().zip(flags) {
                match flag {
                    1 => applied(cx, job),
                    0 => cx.inc(Metric::QuotaSettleDuplicates),
                    _ => {
                        cx.inc(Metric::QuotaSettleDropped);
                        cx.log_failure(
                            Level::Error,
                            "settle_not_a_number",
                            format!(
                                "settlement for request {} skipped: a counter in Redis is not a number",
                                job.args.keys.request_id
                            ),
                        );
                    }
                }
            }
        }
        Err(f) if f.error == ShimError::NoScript => {
            // Sent again at once, with EVAL.
            cx.worker.quota_script_loaded = false;
            if let Some(w) = cx.worker.settle.window.as_mut() {
                w.noscript = true;
            }
        }
        Err(shim::Failure { error: e, why }) => {
            cx.inc(Metric::QuotaShimErrors);
            if e == ShimError::Unavailable {
                shim::record(cx, &q.cluster, &q.shim_breaker, false, false);
            }
            cx.log_failure(
                Level::Warn,
                "settle_failed",
                format!(
                    "{} settlements not taken ({why}); sent again later",
                    jobs.len()
                ),
            );
            if let Some(w) = cx.worker.settle.window.as_mut() {
                match e {
                    ShimError::Unavailable => w.unavailable = true,
                    _ => w.refused = Some(why),
                }
            }
        }
    }
    if cx
        .worker
        .settle
        .window
        .as_ref()
        .is_some_and(|w| w.batches.is_empty())
    {
        finish_window(cx, q);
    }
}

/// Every batch of the window answered: move the journal's head, or send it all again later.
fn finish_window(cx: &mut Cx, q: &QuotaSettings) {
    let Some(w) = cx.worker.settle.window.take() else {
        return;
    };
    let now = cx.now();
    let retries = cx.cfg.cas_max_retries;
    let s = &mut cx.worker.settle;
    if w.noscript && !w.unavailable && w.refused.is_none() {
        // Sent again on the next tick, with EVAL.
        return;
    }
    let give_up = w.refused.is_some() && s.attempts.saturating_add(1) >= q.settle_max_attempts;
    if w.unavailable || (w.refused.is_some() && !give_up) {
        s.attempts = s.attempts.saturating_add(1);
        let backoff_ms = q
            .settle_retry_ms
            .saturating_mul(1u64 << s.attempts.min(10))
            .min(60_000);
        s.retry_at = now.saturating_add(backoff_ms.saturating_mul(1_000_000));
        cx.inc(Metric::QuotaSettleRetries);
        return;
    }
    s.attempts = 0;
    s.retry_at = 0;
    if give_up {
        let n = w.end.saturating_sub(w.head);
        cx.add(Metric::QuotaSettleDropped, n);
        cx.log_failure(
            Level::Error,
            "settle_given_up",
            format!(
                "{n} settlements given up after {} attempts ({}); their reservations stand until their deadline",
                q.settle_max_attempts,
                w.refused.unwrap_or_default()
            ),
        );
    }
    journal::advance(cx.store(), w.head, w.end, retries);
}

fn applied(cx: &mut Cx, job: &Job) {
    cx.inc(Metric::QuotaSettled);
    // The token counters count tenants' token quotas only: a budget's account (`~b:…`, percent-encoded
    // in its keys) counts money.
    let budget = quota::tenant_tag(&job.args.keys).contains("{%7Eb:");
    match job.args.mode {
        SettleMode::Settle if budget => {}
        SettleMode::Settle if job.args.actual < job.reserved => {
            cx.add(Metric::QuotaRefundedTokens, job.reserved - job.args.actual)
        }
        SettleMode::Settle => cx.add(
            Metric::QuotaExtraChargedTokens,
            job.args.actual - job.reserved,
        ),
        SettleMode::Charge => cx.inc(Metric::QuotaReconciled),
    }
}
