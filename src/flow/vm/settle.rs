//! Quota settlements, sent by one VM, through the shared-data journal ([`crate::store::journal`]): a request that ends pushes its
//! settlement (or the charge of a request with no known reservation); the VM holding the journal's claim
//! sends them and moves the journal's head once Redis took them. Nothing waits in one VM's memory
//! except what the journal could not take at that instant (retried on the next tick).
//!
//! **Group commit.** A window of the journal (at most [`WINDOW`] entries) goes to Redis as **one**
//! script call whatever the number of tenants in it ([`SETTLE_BATCH_SCRIPT`]): the settlements of each
//! tenant form a group (at most [`MAX_BATCH`] each), every group runs exactly as the settlement script
//! run alone, under `pcall`, and each group's outcome comes back. So a thousand light tenants cost one
//! call per window, not one per tenant. Behind a Redis Cluster (tenants' keys in different slots) the
//! call is refused whole with `CROSSSLOT` (nothing ran): each group is sent apart at once, and from then
//! on this VM sends one call per tenant group (logged once). `NOSCRIPT` sends the same call again at once
//! as `EVAL`.
//!
//! A call the shim could not take is sent again after a backoff (`quota.settle_retry_ms`, doubling, at
//! most 60 s) and while the shim's breaker is open nothing is sent: settlements wait in the journal for
//! as long as Redis is away (up to [`crate::store::journal::CAPACITY`] of them; beyond, new ones are dropped
//! and counted in `tokengate_quota_settle_dropped`). A group (or a
//! call) Redis refuses with an error (not an outage) does not stop the other groups of the call; it is
//! sent again after the same backoff, alone (what was taken is not resent), and given up after
//! `quota.settle_max_attempts` (logged, counted). Settlements are idempotent by request id: whatever is
//! sent again after Redis may have run it does nothing twice.
//!
//! [`SETTLE_BATCH_SCRIPT`]: crate::quota::scripts::SETTLE_BATCH_SCRIPT

use super::state::{Retry, Window};
use crate::config::QuotaSettings;
use crate::flow::cx::Cx;
use crate::flow::effect::{CalloutReply, Effect, Level, Purpose};
use crate::flow::metric::Metric;
use crate::flow::shim;
use crate::quota::scripts::settle_batch_request;
use crate::quota::settlement::{parse_settle_batch_reply, GroupOutcome, Job};
use crate::quota::{self, SettleArgs, SettleMode};
use crate::shim::webdis::ShimError;
use crate::store::journal::{self, PushError};
use std::collections::HashMap;

/// Entries read from the journal per window.
pub const WINDOW: usize = 128;
/// Most settlements of one tenant in one group of a call.
pub const MAX_BATCH: usize = 32;
/// Settlements kept in a VM when the journal is busy; beyond, the oldest is dropped (counted).
pub const MAX_LOCAL: usize = 10_000;
/// After a window was sent, the next waits this long unless a whole window waits: at most ten
/// settlement calls a second per VM holding the claim at a light load (a tick is 5–20 ms), and a
/// settlement waits at most this much longer than a tick.
pub const MIN_GAP_NS: u64 = 100_000_000;
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
    // Group commit: a call per window, and windows at most every MIN_GAP_NS unless one is full.
    let last = cx.worker.settle.last_sent;
    if backlog < WINDOW as u64 && last != 0 && now.saturating_sub(last) < MIN_GAP_NS {
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
    // After a failure only what was not taken goes again (the rest of the window was applied).
    let retry = cx.worker.settle.retry.take().filter(|r| r.head == head);
    // Settlements of one tenant go together, at most MAX_BATCH to a group (their keys share the
    // tenant's hash tag); the groups of the whole window go in one call.
    let mut groups: Vec<(String, Vec<Job>)> = Vec::new();
    for (seq, payload) in entries {
        let Some(job) = Job::decode(&payload) else {
            if retry.as_ref().is_none_or(|r| seq >= r.end) {
                cx.inc(Metric::QuotaSettleDropped);
            }
            continue;
        };
        if let Some(r) = &retry {
            if seq < r.end && !r.ids.contains(&job.args.keys.request_id) {
                continue;
            }
        }
        let tag = quota::tenant_tag(&job.args.keys).to_string();
        match groups
            .iter_mut()
            .find(|(t, b)| *t == tag && b.len() < MAX_BATCH)
        {
            Some((_, b)) => b.push(job),
            None => groups.push((tag, vec![job])),
        }
    }
    cx.worker.settle.window = Some(Window {
        head,
        end,
        batches: HashMap::default(),
        unavailable: false,
        refused: None,
        failed: Vec::new(),
    });
    let groups: Vec<Vec<Job>> = groups.into_iter().map(|(_, g)| g).collect();
    if groups.is_empty() {
        finish_window(cx, q);
        return;
    }
    let eval = !cx.worker.settle.loaded;
    cx.worker.settle.last_sent = now.max(1);
    if cx.worker.settle.per_tenant {
        for g in groups {
            dispatch(cx, q, vec![g], eval);
        }
    } else {
        dispatch(cx, q, groups, eval);
    }
}

/// Sends tenant `groups` of the window as one call of the settlement batch script.
fn dispatch(cx: &mut Cx, q: &QuotaSettings, groups: Vec<Vec<Job>>, eval: bool) {
    let body = {
        let args: Vec<Vec<&SettleArgs>> = groups
            .iter()
            .map(|g| g.iter().map(|j| &j.args).collect())
            .collect();
        settle_batch_request(&args, shim::script_call(!eval))
    };
    let s = &mut cx.worker.settle;
    s.next_id = s.next_id.wrapping_add(1);
    let id = s.next_id;
    let Some(w) = s.window.as_mut() else {
        return;
    };
    w.batches.insert(id, (groups, eval));
    cx.fx.push(Effect::Dispatch(shim::callout(
        Purpose::Settle(id),
        &q.cluster,
        &q.authority,
        q.timeout_ms,
        body,
    )));
}

/// A settlement call answered (or its dispatch was refused).
pub fn on_reply(cx: &mut Cx, q: &QuotaSettings, id: u64, reply: CalloutReply) {
    let Some((groups, eval)) = cx
        .worker
        .settle
        .window
        .as_mut()
        .and_then(|w| w.batches.remove(&id))
    else {
        return;
    };
    let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
    match shim::read(&q.cluster, &reply, |status, body| {
        parse_settle_batch_reply(status, body, &sizes)
    }) {
        Ok(outcomes) => {
            if eval {
                cx.worker.settle.loaded = true;
            }
            for (jobs, outcome) in groups.iter().zip(outcomes) {
                match outcome {
                    GroupOutcome::Ran(flags) => {
                        for (job, flag) in jobs.iter().zip(flags) {
                            ran(cx, job, flag);
                        }
                    }
                    GroupOutcome::Refused | GroupOutcome::Failed => {
                        cx.inc(Metric::QuotaShimErrors);
                        let why = format!(
                            "Redis refused the settlements of {} (cluster '{}'): {}",
                            jobs.first().map_or("", |j| quota::tenant_tag(&j.args.keys)),
                            q.cluster,
                            if outcome == GroupOutcome::Refused {
                                "the script refused their arguments"
                            } else {
                                "an error in Redis while they ran (a key of the wrong type?)"
                            }
                        );
                        not_taken(cx, jobs, why, false);
                    }
                }
            }
        }
        Err(f) if f.error == ShimError::NoScript && !eval => {
            // Redis lost its script cache: the same call again at once, as EVAL.
            cx.worker.settle.loaded = false;
            dispatch(cx, q, groups, true);
        }
        Err(f) if is_crossslot(&f.error) && groups.len() > 1 => {
            // A Redis Cluster: nothing ran. Each tenant group goes apart, now and from then on.
            if !cx.worker.settle.per_tenant {
                cx.worker.settle.per_tenant = true;
                cx.log(
                    Level::Warn,
                    format!(
                        "quota shim at cluster '{}' refused settlements of several tenants in one call ({}): settlements are sent per tenant from now on",
                        q.cluster, f.why
                    ),
                );
            }
            for g in groups {
                dispatch(cx, q, vec![g], eval);
            }
        }
        Err(shim::Failure { error: e, why }) => {
            cx.inc(Metric::QuotaShimErrors);
            let unavailable = e == ShimError::Unavailable;
            if unavailable {
                shim::record(cx, &q.cluster, &q.shim_breaker, false, false);
            }
            let jobs: Vec<Job> = groups.into_iter().flatten().collect();
            not_taken(cx, &jobs, why, unavailable);
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

/// What Redis answered for one settlement.
fn ran(cx: &mut Cx, job: &Job, flag: i64) {
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

/// `jobs` were not taken (`unavailable`: the shim was away; else Redis refused them): sent again.
fn not_taken(cx: &mut Cx, jobs: &[Job], why: String, unavailable: bool) {
    cx.log_failure(
        Level::Warn,
        "settle_failed",
        format!(
            "{} settlements not taken ({why}); sent again later",
            jobs.len()
        ),
    );
    if let Some(w) = cx.worker.settle.window.as_mut() {
        w.failed
            .extend(jobs.iter().map(|j| j.args.keys.request_id.clone()));
        if unavailable {
            w.unavailable = true;
        } else {
            w.refused = Some(why);
        }
    }
}

fn is_crossslot(e: &ShimError) -> bool {
    matches!(e, ShimError::RedisError(m) if m.starts_with("CROSSSLOT"))
}

/// Every call of the window answered: move the journal's head, or send what was not taken later.
fn finish_window(cx: &mut Cx, q: &QuotaSettings) {
    let Some(w) = cx.worker.settle.window.take() else {
        return;
    };
    let now = cx.now();
    let retries = cx.cfg.cas_max_retries;
    let s = &mut cx.worker.settle;
    let give_up = w.refused.is_some() && s.attempts.saturating_add(1) >= q.settle_max_attempts;
    if w.unavailable || (w.refused.is_some() && !give_up) {
        s.attempts = s.attempts.saturating_add(1);
        let backoff_ms = q
            .settle_retry_ms
            .saturating_mul(1u64 << s.attempts.min(10))
            .min(60_000);
        s.retry_at = now.saturating_add(backoff_ms.saturating_mul(1_000_000));
        s.retry = Some(Retry {
            head: w.head,
            end: w.end,
            ids: w.failed,
        });
        cx.inc(Metric::QuotaSettleRetries);
        return;
    }
    s.attempts = 0;
    s.retry_at = 0;
    if give_up {
        let n = w.failed.len() as u64;
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
