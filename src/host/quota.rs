//! Monthly quotas in Redis through the Webdis shim: the reservation callout on the request path, and the
//! settlement queue worked off the request path by the root context's tick.
//!
//! * One reservation callout per request (`dispatch_http_call` to `quota.cluster`), guarded by a breaker
//!   on the shim itself (`tg:cb:shim=<cluster>`): while it is open no callout is made and the failure
//!   policy applies at once, so a dead Webdis costs one timeout per recovery window.
//! * Settlements are queued per VM ([`SettleJob`]) and dispatched by the root's tick; a settlement the
//!   shim cannot take now is retried with exponential backoff (not lost) and is idempotent per request id
//!   in Redis, so a retry never charges or refunds twice. A settlement still queued when its VM dies
//!   (Envoy shutdown, VM reload) is lost; the reservation then stands as the charge.
//! * The first call of a VM uses `EVAL` (which also loads the script into Redis' cache), later ones
//!   `EVALSHA`; a `NOSCRIPT` answer switches back to `EVAL`.

use super::abi::{self, Buffer, Level, Map};
use super::store::HostStore;
use super::{log, metrics, now_ns, VM};
use crate::breaker::BreakerConfig;
use crate::breaker::{self, Admission, Outcome};
use crate::config::QuotaSettings;
use crate::quota::{self, ReconcileArgs, ScriptCall, SettleArgs, ShimError};

/// Settlements dispatched at most at once per VM.
pub const MAX_INFLIGHT_SETTLEMENTS: usize = 32;
/// Settlements kept queued per VM; beyond, the oldest is dropped (counted).
pub const MAX_QUEUED_SETTLEMENTS: usize = 100_000;

/// What a settlement job sends.
#[derive(Debug, Clone)]
pub enum Job {
    /// `actual − reserved` for a known reservation.
    Settle(SettleArgs),
    /// `actual` against whatever an uncertain reservation did (see `quota::RECONCILE_SCRIPT`).
    Reconcile(ReconcileArgs),
}

impl Job {
    fn marker(&self) -> &str {
        match self {
            Job::Settle(a) => &a.keys.settled,
            Job::Reconcile(a) => &a.keys.settled,
        }
    }
}

/// One settlement waiting to be sent (or re-sent).
#[derive(Debug, Clone)]
pub struct SettleJob {
    /// What to send.
    pub job: Job,
    /// Attempts made so far.
    pub attempts: u32,
    /// Not before (ns).
    pub due_ns: u64,
}

/// The shim breaker key.
pub fn shim_key(q: &QuotaSettings) -> String {
    breaker::key("shim", &q.cluster)
}

/// Asks the shim breaker whether a callout may be made now.
pub fn shim_admit(q: &QuotaSettings, retries: u32) -> Result<bool, u64> {
    shim_admit_at(&q.cluster, &q.shim_breaker, retries)
}

/// Reports a callout outcome to the shim breaker.
pub fn shim_record(q: &QuotaSettings, ok: bool, probe: bool, retries: u32) {
    shim_record_at(&q.cluster, &q.shim_breaker, ok, probe, retries);
}

/// Asks the breaker of the Webdis shim at `cluster` whether a callout may be made now: `Ok(probe)`, or
/// `Err(ms until it may)` while it is open. One breaker per cluster, whoever calls it (quota or global
/// buckets).
pub fn shim_admit_at(cluster: &str, cfg: &BreakerConfig, retries: u32) -> Result<bool, u64> {
    match breaker::admit_shared(
        &HostStore,
        &breaker::key("shim", cluster),
        cfg,
        now_ns(),
        retries,
    ) {
        Ok((Admission::Rejected { reset_in_ms }, t, _)) => {
            if let Some(t) = t {
                log_shim_transition(cluster, t);
            }
            Err(reset_in_ms)
        }
        Ok((a, t, _)) => {
            if let Some(t) = t {
                log_shim_transition(cluster, t);
            }
            Ok(a == Admission::Probe)
        }
        // The store failed: do not block traffic on it.
        Err(_) => Ok(false),
    }
}

/// Reports a callout outcome to the breaker of the Webdis shim at `cluster`.
pub fn shim_record_at(cluster: &str, cfg: &BreakerConfig, ok: bool, probe: bool, retries: u32) {
    let outcome = if ok {
        Outcome::Success
    } else {
        Outcome::Failure {
            retry_after_ms: None,
        }
    };
    if let Ok((Some(t), _)) = breaker::record_shared(
        &HostStore,
        &breaker::key("shim", cluster),
        cfg,
        outcome,
        probe,
        now_ns(),
        retries,
    ) {
        log_shim_transition(cluster, t);
    }
}

fn log_shim_transition(cluster: &str, t: breaker::Transition) {
    log(
        Level::Warn,
        &format!(
            "webdis shim {}: {} -> {} ({})",
            cluster,
            t.from.as_str(),
            t.to.as_str(),
            t.reason
        ),
    );
}

/// Which script call to use now.
pub fn script_call() -> ScriptCall {
    if VM.with(|vm| vm.borrow().script_loaded) {
        ScriptCall::EvalSha
    } else {
        ScriptCall::Eval
    }
}

/// Remembers whether Redis has the scripts cached.
pub fn set_script_loaded(loaded: bool) {
    VM.with(|vm| vm.borrow_mut().script_loaded = loaded);
}

/// Sends a Webdis command to the quota shim.
pub fn dispatch(q: &QuotaSettings, body: &str) -> Result<u32, u32> {
    webdis_dispatch(&q.cluster, &q.authority, q.timeout_ms, body)
}

/// Sends a Webdis command (`POST /` with the command path as the form body).
pub fn webdis_dispatch(
    cluster: &str,
    authority: &str,
    timeout_ms: u32,
    body: &str,
) -> Result<u32, u32> {
    let len = body.len().to_string();
    abi::dispatch_http_call(
        cluster,
        &[
            (":method", "POST"),
            (":path", quota::WEBDIS_PATH),
            (":authority", authority),
            ("content-type", "application/x-www-form-urlencoded"),
            ("content-length", &len),
        ],
        body.as_bytes(),
        timeout_ms,
    )
}

/// Status and body of the callout response being delivered.
pub fn call_response(body_size: usize) -> (u32, Vec<u8>) {
    let status = abi::get_header(Map::CallResponseHeaders, ":status")
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let body = abi::get_buffer(Buffer::CallResponseBody, 0, body_size).unwrap_or_default();
    (status, body)
}

/// Queues a settlement for the root's tick.
pub fn enqueue(job: Job) {
    VM.with(|vm| {
        let mut vm = vm.borrow_mut();
        if vm.settle_queue.len() >= MAX_QUEUED_SETTLEMENTS {
            vm.settle_queue.remove(0);
            metrics::inc(metrics::get().quota_settle_dropped);
        }
        vm.settle_queue.push(SettleJob {
            job,
            attempts: 0,
            due_ns: 0,
        });
    });
}

/// Most settlements of one tenant sent in one callout.
pub const MAX_BATCH: usize = 32;

/// Root tick: dispatches due settlements (none while the shim breaker is open). Settlements of one
/// tenant go together in one callout (their keys share one Redis Cluster slot).
pub fn tick(q: &QuotaSettings) {
    let now = now_ns();
    if VM.with(|vm| vm.borrow().settle_queue.is_empty()) {
        return;
    }
    if let Ok((Some(st), _)) = crate::store::peek::<breaker::BreakerState>(&HostStore, &shim_key(q))
    {
        if breaker::peek_state(&st, &q.shim_breaker, now).1 > 0 {
            return;
        }
    }
    // (tenant tag for settlements, None for a reconciliation; jobs)
    let batches: Vec<(Option<String>, Vec<SettleJob>)> = VM.with(|vm| {
        let mut vm = vm.borrow_mut();
        let mut room = MAX_INFLIGHT_SETTLEMENTS.saturating_sub(vm.settle_inflight.len());
        let mut batches: Vec<(Option<String>, Vec<SettleJob>)> = Vec::new();
        let mut keep = Vec::new();
        for job in std::mem::take(&mut vm.settle_queue) {
            if job.due_ns > now {
                keep.push(job);
                continue;
            }
            let tag = match &job.job {
                Job::Settle(a) => Some(quota::tenant_tag(&a.keys).to_string()),
                Job::Reconcile(_) => None,
            };
            let slot = tag.as_ref().and_then(|t| {
                batches
                    .iter()
                    .position(|(bt, b)| bt.as_ref() == Some(t) && b.len() < MAX_BATCH)
            });
            match slot.and_then(|i| batches.get_mut(i)) {
                Some((_, batch)) => batch.push(job),
                None if room > 0 => {
                    room -= 1;
                    batches.push((tag, vec![job]));
                }
                None => keep.push(job),
            }
        }
        vm.settle_queue = keep;
        batches
    });
    let call = script_call();
    for (_, batch) in batches {
        let body = match batch.first().map(|j| &j.job) {
            Some(Job::Reconcile(a)) => quota::reconcile_request(a, call),
            _ => {
                let args: Vec<&SettleArgs> = batch
                    .iter()
                    .filter_map(|j| match &j.job {
                        Job::Settle(a) => Some(a),
                        Job::Reconcile(_) => None,
                    })
                    .collect();
                quota::settle_batch_request(&args, call)
            }
        };
        match dispatch(q, &body) {
            Ok(token) => VM.with(|vm| {
                vm.borrow_mut().settle_inflight.insert(token, batch);
            }),
            Err(_) => {
                for job in batch {
                    retry(q, job, "dispatch refused");
                }
            }
        }
    }
}

fn retry(q: &QuotaSettings, mut job: SettleJob, why: &str) {
    let m = metrics::get();
    job.attempts = job.attempts.saturating_add(1);
    if job.attempts >= q.settle_max_attempts {
        metrics::inc(m.quota_settle_dropped);
        log(
            Level::Error,
            &format!(
                "settlement for {} given up after {} attempts ({why}); the reservation stands",
                job.job.marker(),
                job.attempts
            ),
        );
        return;
    }
    metrics::inc(m.quota_settle_retries);
    let backoff_ms = q
        .settle_retry_ms
        .saturating_mul(1u64 << job.attempts.min(10))
        .min(60_000);
    job.due_ns = now_ns().saturating_add(backoff_ms.saturating_mul(1_000_000));
    VM.with(|vm| vm.borrow_mut().settle_queue.push(job));
}

fn applied(job: &SettleJob) {
    let m = metrics::get();
    metrics::inc(m.quota_settled);
    match &job.job {
        Job::Settle(a) if a.delta < 0 => {
            metrics::add(m.quota_refunded_tokens, a.delta.unsigned_abs())
        }
        Job::Settle(a) => metrics::add(m.quota_extra_charged_tokens, a.delta.unsigned_abs()),
        Job::Reconcile(_) => metrics::inc(m.quota_reconciled),
    }
}

/// Root: a settlement callout answered.
pub fn on_settle_response(q: &QuotaSettings, token: u32, body_size: usize) {
    let Some(batch) = VM.with(|vm| vm.borrow_mut().settle_inflight.remove(&token)) else {
        return;
    };
    let (status, body) = call_response(body_size);
    let m = metrics::get();
    let result = match batch.first().map(|j| &j.job) {
        Some(Job::Reconcile(_)) => {
            quota::parse_settle_reply(status, &body).map(|r| vec![i64::from(r.applied)])
        }
        _ => quota::parse_settle_batch_reply(status, &body, batch.len()),
    };
    match result {
        Ok(flags) => {
            set_script_loaded(true);
            for (job, flag) in batch.iter().zip(flags) {
                match flag {
                    1 => applied(job),
                    0 => metrics::inc(m.quota_settle_duplicates),
                    _ => {
                        metrics::inc(m.quota_settle_dropped);
                        log(
                            Level::Error,
                            &format!(
                                "settlement for {} skipped: a counter in Redis is not a number",
                                job.job.marker()
                            ),
                        );
                    }
                }
            }
        }
        Err(ShimError::NoScript) => {
            set_script_loaded(false);
            VM.with(|vm| vm.borrow_mut().settle_queue.extend(batch));
        }
        Err(e) => {
            metrics::inc(m.quota_shim_errors);
            if e == ShimError::Unavailable {
                shim_record(q, false, false, 8);
            }
            let why = e.to_string();
            for job in batch {
                retry(q, job, &why);
            }
        }
    }
}
