//! Group commit of quota reservations: reservations of different requests (different tenants, most of
//! all) that wait at the same moment go to Redis in one script call ([`crate::quota::batch`]).
//!
//! # Why
//! A tenant too light for a lease (thousands of tenants at a request a second each) costs a reservation
//! callout per request: one Webdis round trip and one Redis script call each, about 185 µs of Envoy CPU.
//! Batching makes that one call per round trip of the VM, whatever the number of tenants.
//!
//! # The rule (per VM)
//! * **Nothing in flight**: a reservation is sent at once, alone, as the request's own callout — the
//!   path of a single request is unchanged (no added latency, the same callout). The VM notes it
//!   ([`single_started`]).
//! * **A reservation call in flight** (a request's own, or a batch): the reservation waits in the VM's
//!   queue and its request pauses ([`queue`], the quota step answers `Outcome::Park`).
//! * The queue is sent as **one call** when the call in flight returns ([`single_done`], [`on_reply`]),
//!   at once when it holds `quota.batch.max_reservations` (a second call in flight), and when its oldest
//!   reservation has waited `quota.batch.max_wait_ms` (checked at each arrival and at each tick of the
//!   root, 20 ms). So a reservation waits at most about one round trip in the usual case, and never
//!   longer than the call in flight's timeout or the wait bound plus a tick.
//!
//! # Who sends, who answers
//! A batch call is sent by the **root context**, never by a request: Envoy owns every callout by its
//! root context and the SDK hands the answer to the context that dispatched it, so a batch sent by a
//! request would be lost for everyone in it if that request's client went. A request that sees the
//! queue must be sent asks for a root wake ([`Effect::WakeRoot`]: the host enqueues to this VM's own
//! shared queue, and the root runs `flush` in its `on_queue_ready`, on the next turn of the worker's
//! event loop); the tick flushes too, should the wake be lost. When a batch answers (at the root), each
//! entry's answer is kept ([`take`]) and its context listed in [`Batcher::ready`]; the host adapter
//! then runs each request's continuation — the quota step's `on_reply`, in that request's own context
//! (`proxy_set_effective_context`, as Envoy does for a request's own callout answer): admitted and
//! resumed, refused with its own answer, clamped, or sent on to its next reservation. A request that
//! is gone by then is skipped ([`Batcher::discard`]).
//!
//! # Guarantees, per request
//! * Each reservation is all or nothing and named by its request id, exactly as alone (the batch script
//!   runs the reservation script per entry); a request's answer is its own entry's.
//! * The shim's breaker counts **calls**: a batch is one success or one failure, and while the breaker
//!   is open nothing is queued (each request gets its `on_failure` at once, as without batching).
//! * A failed call (Webdis down, a timeout, garbage) gives every request in it the failure its own
//!   callout would have had: the `on_failure` of its quota or budget, and, when Redis may have run it
//!   (a timeout), a reconciliation at the end that charges what the request cost whatever Redis did.
//! * A client that goes while its reservation waits in the queue loses nothing (it is taken out: never
//!   sent); while it is in flight, the request is reconciled at 0 as after any callout whose client
//!   went (the tombstone makes a late reservation a no-op, or the reservation is settled to 0).
//! * `NOSCRIPT` sends the batch again as `EVAL`. `CROSSSLOT` (a Redis Cluster: tenants' keys in
//!   different slots; nothing ran) sends each tenant's reservations apart, and from then on this VM
//!   batches per tenant only (logged once).
//!
//! Settlements need nothing of this: they are sent from the root's tick (`super::settle`), one call
//! for each window of the journal, many tenants' groups in it.

use super::state::{BatchCall, BatchResult, Waiting};
use crate::config::{BatchSettings, QuotaSettings};
use crate::flow::cx::Cx;
use crate::flow::effect::{CalloutReply, Effect, Level, Purpose};
use crate::flow::metric::Metric;
use crate::flow::shim::{self, Failure};
use crate::quota::batch::{parse_reserve_batch_reply, reserve_batch_request};
use crate::quota::ReserveArgs;
use crate::shim::webdis::ShimError;

/// A request whose own reservation callout is forgotten after this long past its timeout (its answer
/// never came: the context went without `on_log`); it no longer holds the queue back.
const SINGLE_GRACE_NS: u64 = 1_000_000_000;

/// True when a reservation call of this VM is in flight: a new reservation then waits in the queue.
pub(in crate::flow) fn busy(cx: &mut Cx, q: &QuotaSettings) -> bool {
    expire_singles(cx, q);
    let b = &cx.worker.batch;
    !b.singles.is_empty() || !b.inflight.is_empty()
}

/// Queues a reservation of request `context`: it waits for the call in flight (or goes at once when
/// the queue is full or its oldest waited too long: a root wake is asked).
pub(in crate::flow) fn queue(cx: &mut Cx, b: &BatchSettings, context: u32, args: &ReserveArgs) {
    let now = cx.now();
    let bt = &mut cx.worker.batch;
    bt.queue.push(Waiting {
        context,
        args: args.clone(),
        since: now,
        gone: false,
    });
    let full = bt.queue.len() >= b.max_reservations;
    let late = bt
        .queue
        .first()
        .is_some_and(|w| now.saturating_sub(w.since) >= b.max_wait_ms.saturating_mul(1_000_000));
    cx.inc(Metric::QuotaBatched);
    if full || late {
        wake(cx);
    }
}

/// Request `context` sent its own reservation callout (nothing was in flight).
pub(in crate::flow) fn single_started(cx: &mut Cx, context: u32) {
    let now = cx.now();
    let s = &mut cx.worker.batch.singles;
    s.retain(|(c, _)| *c != context);
    s.push((context, now));
}

/// Request `context`'s own reservation callout answered (or its request went): when nothing else is
/// in flight, what waits is sent (a root wake).
pub(in crate::flow) fn single_done(cx: &mut Cx, context: u32) {
    let b = &mut cx.worker.batch;
    let before = b.singles.len();
    b.singles.retain(|(c, _)| *c != context);
    if b.singles.len() != before
        && b.singles.is_empty()
        && b.inflight.is_empty()
        && !b.queue.is_empty()
    {
        wake(cx);
    }
}

/// Request `context` went: true when its reservation was still waiting (taken out: never sent,
/// nothing reserved); false when it was sent (its answer will be dropped) or is not here.
pub(in crate::flow) fn forget(cx: &mut Cx, context: u32) -> bool {
    let b = &mut cx.worker.batch;
    b.results.remove(&context);
    b.ready.retain(|c| *c != context);
    let before = b.queue.len();
    b.queue.retain(|w| w.context != context);
    if b.queue.len() != before {
        return true;
    }
    for call in b.inflight.values_mut() {
        for w in call.entries.iter_mut().filter(|w| w.context == context) {
            w.gone = true;
        }
    }
    false
}

/// The answer of request `context`'s batched reservation, once (`None`: none came).
pub(in crate::flow) fn take(cx: &mut Cx, context: u32) -> Option<BatchResult> {
    cx.worker.batch.results.remove(&context)
}

fn wake(cx: &mut Cx) {
    if !cx.worker.batch.wake_asked {
        cx.worker.batch.wake_asked = true;
        cx.fx.push(Effect::WakeRoot);
    }
}

fn expire_singles(cx: &mut Cx, q: &QuotaSettings) {
    let now = cx.now();
    let limit = u64::from(q.timeout_ms)
        .saturating_mul(1_000_000)
        .saturating_add(SINGLE_GRACE_NS);
    cx.worker
        .batch
        .singles
        .retain(|(_, since)| now.saturating_sub(*since) < limit);
}

/// The root (woken, at its tick, or after a batch answered): sends what waits, as calls of at most
/// `max_reservations`, when nothing is in flight, when a batch is full, or when the oldest waited
/// `max_wait_ms`.
pub fn flush(cx: &mut Cx, q: &QuotaSettings) {
    cx.worker.batch.wake_asked = false;
    let Some(b) = q.batch.as_ref() else {
        return;
    };
    expire_singles(cx, q);
    let now = cx.now();
    let wait_ns = b.max_wait_ms.saturating_mul(1_000_000);
    loop {
        let bt = &mut cx.worker.batch;
        let Some(oldest) = bt.queue.first().map(|w| w.since) else {
            return;
        };
        let idle = bt.singles.is_empty() && bt.inflight.is_empty();
        let full = bt.queue.len() >= b.max_reservations;
        let late = now.saturating_sub(oldest) >= wait_ns;
        if !(idle || full || late) {
            return;
        }
        let entries = if bt.per_tenant {
            let tenant = bt
                .queue
                .first()
                .map(|w| w.args.tenant.clone())
                .unwrap_or_default();
            let (mut mine, mut rest) = (Vec::new(), Vec::new());
            for w in std::mem::take(&mut bt.queue) {
                if w.args.tenant == tenant && mine.len() < b.max_reservations {
                    mine.push(w);
                } else {
                    rest.push(w);
                }
            }
            bt.queue = rest;
            mine
        } else {
            let n = bt.queue.len().min(b.max_reservations);
            bt.queue.drain(..n).collect()
        };
        send(cx, q, entries);
    }
}

/// Sends `entries` as one call, unless the shim's breaker is open (then each gets the failure).
fn send(cx: &mut Cx, q: &QuotaSettings, entries: Vec<Waiting>) {
    match shim::admit(cx, &q.cluster, &q.shim_breaker) {
        Err(_) => {
            let f = Failure {
                error: ShimError::Unavailable,
                why: format!(
                    "the circuit of the quota shim at cluster '{}' is open",
                    q.cluster
                ),
            };
            answer_all(cx, entries, &f, false);
        }
        Ok(probe) => {
            let eval = !cx.worker.batch.loaded;
            dispatch(cx, q, entries, eval, probe);
        }
    }
}

fn dispatch(cx: &mut Cx, q: &QuotaSettings, entries: Vec<Waiting>, eval: bool, probe: bool) {
    let call = shim::script_call(!eval);
    let body = {
        let args: Vec<&ReserveArgs> = entries.iter().map(|w| &w.args).collect();
        reserve_batch_request(&args, call)
    };
    let bt = &mut cx.worker.batch;
    bt.next_id = bt.next_id.wrapping_add(1);
    let id = bt.next_id;
    bt.inflight.insert(
        id,
        BatchCall {
            entries,
            eval,
            probe,
        },
    );
    cx.inc(Metric::QuotaBatchCalls);
    cx.fx.push(Effect::Dispatch(shim::callout(
        Purpose::Batch(id),
        &q.cluster,
        &q.authority,
        q.timeout_ms,
        body,
    )));
}

/// The answer of batch call `id` (or the host's refusal to send it).
pub fn on_reply(cx: &mut Cx, q: &QuotaSettings, id: u64, reply: CalloutReply) {
    let Some(call) = cx.worker.batch.inflight.remove(&id) else {
        return;
    };
    let n = call.entries.len();
    match shim::read(&q.cluster, &reply, |s, b| {
        parse_reserve_batch_reply(s, b, n)
    }) {
        Err(f) if f.error == ShimError::NoScript && !call.eval => {
            // Redis lost its script cache: the same batch again, as EVAL.
            cx.worker.batch.loaded = false;
            dispatch(cx, q, call.entries, true, call.probe);
        }
        Err(f) if is_crossslot(&f.error) && several_tenants(&call.entries) => {
            // A Redis Cluster: nothing ran. Each tenant's reservations go apart from now on.
            if !cx.worker.batch.per_tenant {
                cx.worker.batch.per_tenant = true;
                cx.log(
                    Level::Warn,
                    format!(
                        "quota shim at cluster '{}' refused a batch of several tenants ({}): reservations are batched per tenant from now on",
                        q.cluster, f.why
                    ),
                );
            }
            let bt = &mut cx.worker.batch;
            let mut entries: Vec<Waiting> = call.entries.into_iter().filter(|w| !w.gone).collect();
            entries.append(&mut bt.queue);
            bt.queue = entries;
            // Sent at once (not held behind another call).
            for w in &mut cx.worker.batch.queue {
                w.since = 0;
            }
        }
        Err(f) => {
            shim::record(cx, &q.cluster, &q.shim_breaker, false, call.probe);
            let may = reply.refused.is_none() && f.error.may_have_run();
            answer_all(cx, call.entries, &f, may);
        }
        Ok(results) => {
            shim::record(cx, &q.cluster, &q.shim_breaker, true, call.probe);
            if call.eval {
                cx.worker.batch.loaded = true;
            }
            for (w, r) in call.entries.into_iter().zip(results) {
                if w.gone {
                    continue;
                }
                let answer = match r {
                    Ok(r) => BatchResult {
                        result: Ok(r),
                        may_have_run: true,
                    },
                    Err(e) => BatchResult {
                        may_have_run: e.may_have_run(),
                        result: Err(Failure {
                            why: format!("{e} (cluster '{}', in a batch)", q.cluster),
                            error: e,
                        }),
                    },
                };
                deliver(cx, w.context, answer);
            }
        }
    }
    flush(cx, q);
}

/// Every entry of a call gets the same failure.
fn answer_all(cx: &mut Cx, entries: Vec<Waiting>, f: &Failure, may_have_run: bool) {
    for w in entries.into_iter().filter(|w| !w.gone) {
        deliver(
            cx,
            w.context,
            BatchResult {
                result: Err(f.clone()),
                may_have_run,
            },
        );
    }
}

fn deliver(cx: &mut Cx, context: u32, answer: BatchResult) {
    let b = &mut cx.worker.batch;
    b.results.insert(context, answer);
    b.ready.push(context);
}

fn is_crossslot(e: &ShimError) -> bool {
    matches!(e, ShimError::RedisError(m) if m.starts_with("CROSSSLOT"))
}

fn several_tenants(entries: &[Waiting]) -> bool {
    entries
        .first()
        .is_some_and(|a| entries.iter().any(|w| w.args.tenant != a.args.tenant))
}

/// The root's tick: what waits is sent when nothing is in flight or it waited too long (a lost wake,
/// or no arrival to notice the wait bound).
pub fn tick(cx: &mut Cx, q: &QuotaSettings) {
    if !cx.worker.batch.queue.is_empty() || cx.worker.batch.wake_asked {
        flush(cx, q);
    }
}
