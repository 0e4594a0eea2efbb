//! Admission step: the tenant's monthly token quota, then every budget in money that applies, each
//! reserved all or nothing — from this Envoy's lease of the account (no callout) or by a reservation
//! callout to Redis ([`crate::quota`]). Redis' answer may grant less output than asked (the body's
//! output limit is lowered to it), refuse (429; retryable when other Envoys' leases hold what is
//! missing), or — when this Envoy's own lease holds what is missing — be sent again once the lease went
//! back. When the shim cannot answer, the quota's (or budget's) `on_failure` applies.

use super::edits::limit_edits;
use super::quota_marker;
use crate::config::{LeaseSettings, QuotaFailure, QuotaSettings};
use crate::flow::cx::Cx;
use crate::flow::effect::{CalloutReply, Effect, Level, Purpose};
use crate::flow::metric::Metric;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::headers::settlement_id;
use crate::flow::request::settlement::{reconcile, refund_reservation};
use crate::flow::request::state::{Hold, InFlight, Plan, QuotaReq, Sent};
use crate::flow::request::step::{Outcome, Step};
use crate::flow::shim;
use crate::flow::vm::batch;
use crate::flow::vm::leases::{self, Ask};
use crate::flow::vm::state::BatchResult;
use crate::flow::vm::state::KNOWN_KEYS_CACHE;
use crate::flow::vm::tick::SETTLE_TICK_MS;
use crate::quota::accounting::{Ending, Reserved};
use crate::quota::{self, calendar, ExhaustedMarker, Reason as QuotaReason, ReserveArgs};
use crate::rewrite::{self, Edits, Thinking};
use crate::shim::webdis::{ScriptCall, ShimError};
use crate::store::Codec;

/// The step.
pub(in crate::flow) struct Quota;

impl Step for Quota {
    fn start(&self, cx: &mut Cx, plan: &mut Plan) -> Outcome {
        let mut quotas = requests(cx, plan);
        quotas.reverse();
        plan.pending_quotas = quotas;
        next(cx, plan)
    }

    fn on_reply(&self, cx: &mut Cx, plan: &mut Plan, reply: CalloutReply) -> Outcome {
        let InFlight::Quota(qr) = std::mem::replace(&mut plan.inflight, InFlight::Nothing) else {
            return Outcome::Continue;
        };
        let qr = *qr;
        let outcome = match qr.hold {
            Hold::GivingBack { eval } => given_back(cx, plan, qr, eval, reply),
            Hold::Sent(Sent { batched: true, .. }) => batched(cx, plan, qr),
            _ => reserved(cx, plan, qr, reply),
        };
        match outcome {
            Outcome::Continue => next(cx, plan),
            other => other,
        }
    }

    fn undo(&self, cx: &mut Cx, plan: &mut Plan) {
        give_back(cx, &mut plan.quotas);
    }
}

/// Gives back reservations already made (a later step refused the request, or the client went): a
/// leased one to its lease, one of unknown outcome reconciled at 0, any other by a settlement of 0.
pub(in crate::flow) fn give_back(cx: &mut Cx, quotas: &mut Vec<QuotaReq>) {
    for mut qr in std::mem::take(quotas) {
        match std::mem::replace(&mut qr.hold, Hold::Settled) {
            Hold::Lease(key) => leases::settle(cx, &key, qr.reserved.total(), 0),
            // Redis may have reserved it (or may still): charge 0, whatever it did.
            Hold::Uncertain | Hold::FailOpen { uncertain: true } => {
                reconcile(cx, &mut qr, Ending::NotServed)
            }
            // Nothing was reserved.
            Hold::FailOpen { uncertain: false } => {}
            _ => refund_reservation(cx, &mut qr),
        }
    }
}

/// The client went while a reservation callout was in flight: it may still reserve, so it joins the
/// reservations to give back (reconciled at 0). One still waiting in this VM's batch was never sent:
/// it is taken out, nothing to give back.
pub(in crate::flow) fn in_flight_to_settle(cx: &mut Cx, plan: &mut Plan) {
    if let InFlight::Quota(mut qr) = std::mem::replace(&mut plan.inflight, InFlight::Nothing) {
        if let Hold::Sent(s) = qr.hold {
            if s.batched {
                if batch::forget(cx, plan.context) {
                    return;
                }
            } else {
                batch::single_done(cx, plan.context);
            }
            qr.hold = Hold::Uncertain;
            plan.quotas.push(*qr);
        }
    }
}

/// The reservations not made when the upstream answered before the admission was decided: the one in
/// flight and those still to make, or every one when this step had not started.
pub(in crate::flow) fn unmade(cx: &mut Cx, plan: &mut Plan) -> Vec<QuotaReq> {
    match std::mem::replace(&mut plan.inflight, InFlight::Nothing) {
        InFlight::Quota(qr) => {
            // Its answer, when it comes, is not read: it is reconciled at the end.
            match qr.hold {
                Hold::Sent(Sent { batched: true, .. }) => {
                    batch::forget(cx, plan.context);
                }
                Hold::Sent(_) => batch::single_done(cx, plan.context),
                _ => {}
            }
            let mut v = vec![*qr];
            v.extend(std::mem::take(&mut plan.pending_quotas));
            v
        }
        _ => requests(cx, plan),
    }
}

/// The next reservation (from this Envoy's lease, or by a callout), until every one was made.
fn next(cx: &mut Cx, plan: &mut Plan) -> Outcome {
    let Some(q) = cx.cfg.quota.as_ref() else {
        return Outcome::Continue;
    };
    while let Some(mut qr) = plan.pending_quotas.pop() {
        if let Some(b) = qr.budget.and_then(|i| q.budgets.list.get(i)) {
            if let Some(refusal) = quota_marker::exhausted(cx, q, &qr.args.tenant) {
                let refusal = answers::as_budget(refusal, b, q.budgets.unit(b));
                return Outcome::Deny(Denial::new(Reason::BudgetExceededCached, refusal));
            }
        }
        if q.lease.is_some() {
            let ask = Ask {
                tenant: &qr.args.tenant,
                model: qr.args.model.as_deref(),
                month: &qr.args.month,
                cost: qr.reserved.total(),
                tokens: qr.budget.is_none(),
            };
            if let Some((a, key)) = leases::take(cx, &ask) {
                // Reserved from this Envoy's lease: no callout.
                qr.hold = Hold::Lease(key);
                qr.limit = a.limit;
                qr.remaining = Some(a.remaining.saturating_add(a.available()));
                plan.quotas.push(qr);
                continue;
            }
        }
        return send(cx, plan, qr);
    }
    Outcome::Continue
}

/// Sends the reservation, unless the shim's breaker is open (then its `on_failure` applies); while
/// another reservation call of this VM is in flight it waits in the VM's batch instead
/// ([`batch`](crate::flow::vm::batch)).
fn send(cx: &mut Cx, plan: &mut Plan, mut qr: QuotaReq) -> Outcome {
    let Some(q) = cx.cfg.quota.as_ref() else {
        return Outcome::Continue;
    };
    if let Some(b) = q.batch.as_ref() {
        if batch::busy(cx, q) && !shim::is_open(cx, &q.cluster, &q.shim_breaker) {
            if q.lease.is_some() && qr.refusal.is_none() {
                qr.lease_available = leases::account(
                    cx,
                    &qr.args.tenant,
                    qr.args.model.as_deref(),
                    &qr.args.month,
                )
                .map_or(0, |a| a.available());
            }
            batch::queue(cx, b, plan.context, &qr.args);
            qr.hold = Hold::Sent(Sent {
                batched: true,
                ..Sent::default()
            });
            plan.inflight = InFlight::Quota(Box::new(qr));
            return Outcome::Park;
        }
    }
    match shim::admit(cx, &q.cluster, &q.shim_breaker) {
        Err(_) => {
            let why = format!(
                "the circuit of the quota shim at cluster '{}' is open",
                q.cluster
            );
            unavailable(cx, plan, qr, &why)
        }
        Ok(probe) => {
            if q.lease.is_some() && qr.refusal.is_none() {
                qr.lease_available = leases::account(
                    cx,
                    &qr.args.tenant,
                    qr.args.model.as_deref(),
                    &qr.args.month,
                )
                .map_or(0, |a| a.available());
            }
            dispatch(cx, plan, qr, false, probe)
        }
    }
}

/// The reservation callout (`eval`: as `EVAL`, after a NOSCRIPT; `probe`: the shim breaker's probe).
fn dispatch(cx: &mut Cx, plan: &mut Plan, mut qr: QuotaReq, eval: bool, probe: bool) -> Outcome {
    let Some(q) = cx.cfg.quota.as_ref() else {
        return Outcome::Continue;
    };
    let call = if eval {
        ScriptCall::Eval
    } else {
        shim::script_call(cx.worker.quota_script_loaded)
    };
    qr.hold = Hold::Sent(Sent {
        eval: call == ScriptCall::Eval,
        probe,
        batched: false,
    });
    if q.batch.is_some() {
        batch::single_started(cx, plan.context);
    }
    let body = quota::reserve_request(&qr.args, call);
    plan.inflight = InFlight::Quota(Box::new(qr));
    Outcome::Await(shim::callout(
        Purpose::Reserve,
        &q.cluster,
        &q.authority,
        q.timeout_ms,
        body,
    ))
}

/// Redis answered the reservation `qr` (or the shim failed).
fn reserved(cx: &mut Cx, plan: &mut Plan, mut qr: QuotaReq, reply: CalloutReply) -> Outcome {
    let Some(q) = cx.cfg.quota.as_ref() else {
        return Outcome::Continue;
    };
    let sent = match qr.hold {
        Hold::Sent(s) => s,
        _ => Sent::default(),
    };
    batch::single_done(cx, plan.context);
    let r = match shim::read(&q.cluster, &reply, quota::parse_reserve_reply) {
        Err(f) if f.error == ShimError::NoScript && !sent.eval => {
            cx.worker.quota_script_loaded = false;
            return dispatch(cx, plan, qr, true, sent.probe);
        }
        Err(f) => {
            shim::record(cx, &q.cluster, &q.shim_breaker, false, sent.probe);
            // Redis may have run the script after all (a timeout, a proxy's error): reconciled at the
            // end.
            qr.hold = if reply.refused.is_none() && f.error.may_have_run() {
                Hold::Uncertain
            } else {
                Hold::Planned
            };
            return unavailable(cx, plan, qr, &f.why);
        }
        Ok(r) => r,
    };
    shim::record(cx, &q.cluster, &q.shim_breaker, true, sent.probe);
    if sent.eval {
        cx.worker.quota_script_loaded = true;
    }
    answered(cx, plan, qr, r)
}

/// The batch that carried the reservation `qr` answered (the root continues the request with it): its
/// own entry's decision, or the failure of the call (the breaker counted the call once, at the root).
fn batched(cx: &mut Cx, plan: &mut Plan, mut qr: QuotaReq) -> Outcome {
    match batch::take(cx, plan.context) {
        Some(BatchResult { result: Ok(r), .. }) => answered(cx, plan, qr, r),
        Some(BatchResult {
            result: Err(f),
            may_have_run,
        }) => {
            qr.hold = if may_have_run {
                Hold::Uncertain
            } else {
                Hold::Planned
            };
            unavailable(cx, plan, qr, &f.why)
        }
        None => {
            // No answer was kept (it cannot happen: the root continues a request only with one).
            qr.hold = Hold::Uncertain;
            unavailable(cx, plan, qr, "the batch of reservations gave no answer")
        }
    }
}

/// Redis decided the reservation `qr` (`r`).
fn answered(cx: &mut Cx, plan: &mut Plan, mut qr: QuotaReq, r: quota::ReserveReply) -> Outcome {
    let Some(q) = cx.cfg.quota.as_ref() else {
        return Outcome::Continue;
    };
    // This Envoy's lease of the account, if it holds one: Redis' counter includes all of it, and its
    // unspent part is left to this Envoy's requests.
    let lease = q.lease.as_ref().and_then(|_| {
        leases::account(
            cx,
            &qr.args.tenant,
            qr.args.model.as_deref(),
            &qr.args.month,
        )
    });
    // The limit that binds (tenant or tenant × model) and its remaining, as one pair. The lease adds
    // what it held unspent both when the reservation was sent and now: a lease granted since may have
    // reached Redis after this reservation (its `used` does not count it), and what requests spent
    // since is gone.
    let (limit, remaining) = r.binding();
    let unspent = lease.map_or(0, |a| a.available()).min(qr.lease_available);
    let remaining = remaining.saturating_add(unspent);
    qr.limit = limit;
    qr.remaining = Some(remaining);
    if r.allowed {
        qr.hold = Hold::Redis;
        cx.inc(Metric::QuotaReserved);
        if qr.budget.is_none() {
            // Tokens only: a budget's amounts are money (or another account's tokens).
            cx.add(
                Metric::QuotaReservedTokens,
                qr.reserved.prompt_cost.saturating_add(r.granted_output),
            );
        }
        if r.reason == QuotaReason::Clamped {
            qr.reserved.output_cost = r.granted_output;
            let tokens =
                quota::clamped_output_tokens(r.granted_output, &qr.reserved.weights, qr.choices);
            if let Err(max) = clamp_body(cx, plan, tokens) {
                // No thinking budget fits below what is left: Anthropic would refuse the request;
                // it is refused here, and this reservation given back with the others.
                plan.quotas.push(qr);
                return Outcome::Deny(Denial::new(
                    Reason::ThinkingDoesNotFit,
                    answers::thinking_does_not_fit(max),
                ));
            }
        }
        plan.quotas.push(qr);
        return Outcome::Continue;
    }
    // Nothing was reserved here: nothing to settle; earlier ones are given back.
    let need = qr
        .reserved
        .prompt_cost
        .saturating_add(if qr.args.clamp_output {
            // The script grants a clamped output only when more than the prompt fits.
            qr.args.min_output_cost.max(1)
        } else {
            qr.reserved.output_cost
        });
    let now_available = lease.map_or(0, |a| a.available());
    let covered = r
        .remaining()
        .saturating_add(now_available.max(qr.lease_available))
        >= need;
    // What this Envoy's lease holds unspent would make up the difference: it is given back, and the
    // reservation sent again (once).
    if let Some(l) = q.lease.as_ref().filter(|_| {
        covered
            && qr.refusal.is_none()
            && matches!(r.reason, QuotaReason::TenantLimit | QuotaReason::ModelLimit)
    }) {
        if now_available == 0 {
            // A sync gave the lease back (or requests spent it) after the reservation was sent: sent
            // again, once; Redis has it if it went back.
            qr.refusal = Some(r);
            qr.hold = Hold::Planned;
            return send(cx, plan, qr);
        }
        if let Some(callout) =
            leases::give_back(cx, q, l, &qr.args.tenant, qr.args.model.as_deref())
        {
            // Nothing is reserved while it is given back.
            qr.hold = Hold::GivingBack { eval: false };
            qr.refusal = Some(r);
            plan.inflight = InFlight::Quota(Box::new(qr));
            return Outcome::Await(callout);
        }
    }
    // Other Envoys' leases of the account hold what would make up the difference (Redis counts them,
    // not this Envoy's): a retry after they went idle can pass (tokens only: a budget is refused).
    let elsewhere = r.held_elsewhere;
    let retry_elsewhere = q.lease.as_ref().filter(|_| {
        elsewhere > 0
            && qr.budget.is_none()
            && r.remaining()
                .saturating_add(now_available)
                .saturating_add(elsewhere)
                >= need
    });
    // Not while this Envoy still holds part of the account in a lease (or gave it back for this
    // request: Redis may not have it yet): that part goes back to Redis at the next sync and the next
    // request may get it. Nor while other Envoys' leases hold some of it (a smaller request may fit
    // once they went back).
    let leased = qr.refusal.is_some()
        || lease.is_some_and(|a| a.held > 0)
        || elsewhere > 0
        || r.leases_elsewhere;
    if r.reason == QuotaReason::TenantLimit && r.remaining() < q.exhausted_below && !leased {
        mark_exhausted(cx, q, &qr.args.tenant, limit, r.remaining());
    }
    match retry_elsewhere {
        Some(l) => leased_elsewhere(cx, plan, qr, r.reason, elsewhere, l),
        None => exceeded(cx, plan, qr, r.reason),
    }
}

/// The give-back of this Envoy's lease answered (or failed): the reservation is sent again.
fn given_back(
    cx: &mut Cx,
    plan: &mut Plan,
    mut qr: QuotaReq,
    eval: bool,
    reply: CalloutReply,
) -> Outcome {
    let settings = cx
        .cfg
        .quota
        .as_ref()
        .and_then(|q| Some((q, q.lease.as_ref()?)));
    let (tenant, model) = (qr.args.tenant.clone(), qr.args.model.clone());
    let gave = match settings {
        Some((q, l)) => {
            let noscript = reply.refused.is_none()
                && quota::parse_lease_reply(reply.status, &reply.body) == Err(ShimError::NoScript);
            if noscript && !eval {
                if let Some(callout) = leases::give_back_again(cx, q, l, &tenant, model.as_deref())
                {
                    // Redis restarted since the script was loaded: the give-back is sent again as
                    // EVAL.
                    qr.hold = Hold::GivingBack { eval: true };
                    plan.inflight = InFlight::Quota(Box::new(qr));
                    return Outcome::Await(callout);
                }
            }
            leases::given_back(cx, q, l, &tenant, model.as_deref(), reply)
        }
        None => false,
    };
    qr.hold = Hold::Planned;
    if !gave {
        // Redis' refusal stands (and is the answer: not the shim's failure policy).
        let reason = qr.refusal.map_or(QuotaReason::TenantLimit, |r| r.reason);
        return exceeded(cx, plan, qr, reason);
    }
    // What is left stays the first refusal's until the reservation answers again.
    send(cx, plan, qr)
}

/// The quota shim could not answer: the tenant's (or the budget's) failure policy applies.
fn unavailable(cx: &mut Cx, plan: &mut Plan, mut qr: QuotaReq, why: &str) -> Outcome {
    let Some(q) = cx.cfg.quota.as_ref() else {
        return Outcome::Continue;
    };
    cx.inc(Metric::QuotaShimErrors);
    if let Some(r) = qr.refusal {
        // A reservation sent again after this Envoy gave its lease back: Redis refused the first, and
        // that refusal is the answer, whatever the shim's failure policy.
        cx.log_failure(
            Level::Warn,
            "quota_shim",
            format!("quota check failed ({why}) after a refusal; refused"),
        );
        return exceeded(cx, plan, qr, r.reason);
    }
    let policy = match qr.budget.and_then(|i| q.budgets.list.get(i)) {
        Some(b) => b.on_failure,
        None => q.tenant(&plan.meta.tenant).on_failure,
    };
    match policy {
        QuotaFailure::Open => {
            cx.inc(Metric::QuotaFailOpen);
            cx.log_failure(
                Level::Warn,
                "quota_shim",
                format!("quota check failed ({why}); admitting (on_failure=open)"),
            );
            qr.hold = Hold::FailOpen {
                uncertain: qr.uncertain(),
            };
            plan.quotas.push(qr);
            next(cx, plan)
        }
        QuotaFailure::Closed => {
            cx.log_failure(
                Level::Warn,
                "quota_shim",
                format!("quota check failed ({why}); rejecting (on_failure=closed)"),
            );
            let mut d = Denial::new(Reason::QuotaUnavailable, answers::quota_unavailable());
            d.reconcile = qr.uncertain().then(|| Box::new(qr));
            Outcome::Deny(d)
        }
    }
}

/// The 429 of a quota (or budget) Redis refused for `reason`, with what `qr` says is left. `qr` is
/// reconciled when its last reservation call may have run.
fn exceeded(cx: &mut Cx, plan: &Plan, qr: QuotaReq, reason: QuotaReason) -> Outcome {
    let Some(q) = cx.cfg.quota.as_ref() else {
        return Outcome::Continue;
    };
    let what = whose_quota(reason, &plan.model);
    let refusal = answers::quota_exceeded(
        qr.limit,
        qr.remaining.unwrap_or(0),
        qr.reset_at,
        q.now_s(cx.now()),
        &what,
    );
    let (refusal, reason) = match qr.budget.and_then(|i| q.budgets.list.get(i)) {
        Some(b) => (
            answers::as_budget(refusal, b, q.budgets.unit(b)),
            Reason::BudgetExceeded,
        ),
        None => (refusal, Reason::QuotaExceeded),
    };
    let mut d = Denial::new(reason, refusal);
    d.reconcile = qr.uncertain().then(|| Box::new(qr));
    Outcome::Deny(d)
}

/// The retryable 429 of a quota Redis refused for `reason` that other Envoys' leases would cover
/// (`elsewhere`): they come back when idle, at their Envoy's walk over its accounts
/// ([`retry_after_leases`]).
fn leased_elsewhere(
    cx: &mut Cx,
    plan: &Plan,
    qr: QuotaReq,
    reason: QuotaReason,
    elsewhere: u64,
    l: &LeaseSettings,
) -> Outcome {
    let Some(q) = cx.cfg.quota.as_ref() else {
        return Outcome::Continue;
    };
    let what = whose_quota(reason, &plan.model);
    let retry_s = retry_after_leases(cx, l);
    let refusal = answers::quota_leased(
        qr.limit,
        qr.remaining.unwrap_or(0),
        elsewhere,
        qr.reset_at,
        q.now_s(cx.now()),
        &what,
        retry_s,
    );
    let mut d = Denial::new(Reason::QuotaHeldElsewhere, refusal);
    d.reconcile = qr.uncertain().then(|| Box::new(qr));
    Outcome::Deny(d)
}

/// Whose quota a refusal for `reason` names, as the answer words it.
fn whose_quota(reason: QuotaReason, model: &str) -> String {
    if reason == QuotaReason::ModelLimit {
        format!("for model '{model}'")
    } else {
        "for this tenant".to_string()
    }
}

/// When other Envoys' idle leases are back in Redis, as this Envoy would give its own back: `idle_s`
/// after their last use, at the first sync after it (`refresh_ms`), once the leader's walk over the
/// accounts reaches them (this Envoy's number of accounts, [`SCAN_PER_TICK`](leases::SCAN_PER_TICK) a
/// 20 ms tick, standing in for theirs), and a second for the calls; at most `ttl_s` (a lease whose
/// Envoy went away is resolved then) and 60 s (the SDKs ignore a longer `retry-after`). An estimate: a
/// lease its Envoy keeps using does not come back.
fn retry_after_leases(cx: &Cx, l: &LeaseSettings) -> f64 {
    let accounts = crate::store::peek::<crate::store::Count>(
        cx.store(),
        crate::quota::lease::account::COUNTER,
    )
    .ok()
    .and_then(|(c, _)| c)
    .map_or(0, |c| c.0);
    let walk_s =
        accounts.div_ceil(leases::SCAN_PER_TICK) as f64 * f64::from(SETTLE_TICK_MS) / 1000.0;
    let s = (l.policy.idle_ns.saturating_add(l.policy.refresh_ns)) as f64 / 1e9 + walk_s + 1.0;
    s.min(l.ttl_s as f64).min(60.0)
}

/// Lowers the output limit of the body to what the quota granted (and an Anthropic thinking budget
/// below it). `Err(max_tokens)`: no thinking budget of the minimum size fits below it.
fn clamp_body(cx: &mut Cx, plan: &mut Plan, tokens: u64) -> Result<(), u64> {
    let Some(kind) = plan.meta.kind else {
        return Ok(());
    };
    let mut edits = Edits {
        clamp_max_output: Some(tokens),
        ..Edits::default()
    };
    limit_edits(
        kind,
        &plan.body,
        plan.meta.path_model.as_deref(),
        &mut edits,
    );
    if let Ok(r) = rewrite::rewrite_with_report(&plan.body, &edits) {
        if let Thinking::DoesNotFit { max_tokens } = r.thinking {
            return Err(max_tokens);
        }
        if let Some(new_body) = r.body {
            cx.inc(Metric::QuotaClamped);
            plan.body.clone_from(&new_body);
            cx.fx.push(Effect::ReplaceRequestBody(new_body));
        }
    }
    Ok(())
}

/// Remembers in shared data that this tenant is out of quota (bounded keys; see README).
fn mark_exhausted(
    cx: &mut Cx,
    q: &QuotaSettings,
    tenant: &str,
    effective_limit: u64,
    remaining: u64,
) {
    let key = ExhaustedMarker::key(tenant);
    let now_s = q.now_s(cx.now());
    let ok = crate::store::registry::claim_slot(
        cx.host.store(),
        crate::store::keys::MARKER_COUNTER,
        cx.cfg.max_tenants,
        cx.cfg.cas_max_retries,
        &mut cx.worker.known_keys,
        KNOWN_KEYS_CACHE,
        &key,
    );
    if !ok {
        return;
    }
    let until = calendar::month_end_unix(now_s, q.month_offset_minutes)
        .min(now_s.saturating_add(i64::try_from(q.exhausted_recheck_s).unwrap_or(60)));
    let marker = ExhaustedMarker {
        month_end_unix: until,
        limit: effective_limit,
        config_limit: q.account_limit(tenant),
        remaining,
    };
    let _ = cx.store().set(&key, &marker.encode(), 0);
}

/// The reservations a request asks for: the tenant's token quota (when it has one), then every budget
/// that applies, priced at the model's prices.
pub(in crate::flow) fn requests(cx: &Cx, plan: &Plan) -> Vec<QuotaReq> {
    let Some(q) = cx.cfg.quota.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let tq = q.tenant(&plan.meta.tenant);
    let model = (!plan.model.is_empty()).then(|| plan.model.clone());
    if tq.monthly_limit > 0 {
        let default_model_limit = model
            .as_deref()
            .and_then(|m| tq.model_limits.iter().find(|(x, _)| x == m))
            .map(|(_, l)| *l)
            .unwrap_or(0);
        let w = q.weights(&plan.model);
        out.push(reservation(
            cx,
            q,
            plan,
            plan.meta.tenant.clone(),
            model.clone(),
            w,
            (tq.monthly_limit, default_model_limit),
            tq.clamp_output,
            None,
        ));
    }
    for (i, b) in q.budgets.list.iter().enumerate() {
        if !b.applies(&plan.meta.tenant, &plan.meta.groups) {
            continue;
        }
        let account = b.account(&plan.meta.tenant, &cx.cfg.groups, &plan.meta.groups);
        // A money budget at the model's prices (micro-units per token); a token budget at the quota's
        // weights. With the model, so that its per-model counter says what the subject spent on each
        // model (`tokengate usage --by model`); a budget has no per-model limit.
        let price = if b.tokens {
            q.weights(&plan.model)
        } else {
            q.budgets.price(&plan.model)
        };
        out.push(reservation(
            cx,
            q,
            plan,
            account,
            model.clone(),
            price,
            (b.limit, 0),
            false,
            Some(i),
        ));
    }
    out
}

/// One reservation of `account` (a tenant, or a budget's account) at `weights`.
#[allow(clippy::too_many_arguments)]
fn reservation(
    cx: &Cx,
    q: &QuotaSettings,
    plan: &Plan,
    account: String,
    model: Option<String>,
    w: quota::Weights,
    (limit, model_limit): (u64, u64),
    clamp_output: bool,
    budget: Option<usize>,
) -> QuotaReq {
    let (offset, grace, deadline) = (
        q.month_offset_minutes,
        q.grace_seconds,
        q.reservation_timeout_s,
    );
    let now_s = q.now_s(cx.now());
    let args = ReserveArgs {
        tenant: account,
        model,
        month: calendar::month_label(now_s, offset),
        request_id: settlement_id(&plan.meta.request_id, plan.context, cx.now()),
        prompt_cost: quota::weighted(plan.prompt, 0, 0, 0, &w),
        output_cost: quota::weighted(0, plan.output, 0, 0, &w),
        default_limit: limit,
        default_model_limit: model_limit,
        expire_at_unix: calendar::month_end_unix(now_s, offset)
            .saturating_add(i64::try_from(grace).unwrap_or(0)),
        deadline_s: deadline,
        clamp_output,
        min_output_cost: quota::min_clamped_output_cost(&w, plan.choices),
        lease_owner: leases::owner(cx),
    };
    QuotaReq {
        expire_at: args.expire_at_unix,
        reserved: Reserved {
            prompt_cost: args.prompt_cost,
            output_cost: args.output_cost,
            weights: w,
        },
        args,
        limit,
        remaining: None,
        reset_at: calendar::month_end_unix(now_s, offset),
        hold: Hold::Planned,
        refusal: None,
        lease_available: 0,
        choices: plan.choices,
        actual: None,
        source: None,
        budget,
    }
}
