//! Phase 3, callout replies: the global bucket charge and the quota reservation answered (or the host
//! refused to send them); the admission resumes where it paused.

use super::admit::refund;
use super::answers;
use super::body::output_field;
use super::headers::unix_s;
use super::shim;
use super::state::{Audit, Charge, Plan, QuotaReq, Request, Stage, Step};
use super::{CalloutReply, Cx, Effect, Metric, Next, Purpose};
use crate::config::QuotaSettings;
use crate::global;
use crate::limits::bucket::Verdict;
use crate::limits::local::{self, Decision};
use crate::quota::calendar;
use crate::quota::{self, ExhaustedMarker, Reason};
use crate::rewrite::{self, Edits, Thinking};
use crate::shim::webdis::ShimError;
use crate::store::keys::MARKER_COUNTER;
use crate::store::Codec;

impl Request {
    /// A callout of this request answered (or the host refused it: [`CalloutReply::refused`]).
    pub fn on_callout_reply(&mut self, cx: &mut Cx, reply: CalloutReply) {
        let mut plan = match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Admitting(plan) => plan,
            other => {
                // A late reply for a request that moved on (it cannot happen: a request waits for its
                // one callout); nothing to do.
                self.stage = other;
                return;
            }
        };
        match std::mem::replace(&mut plan.step, Step::Done) {
            Step::Global(gc) => {
                plan.step = Step::Global(gc);
                self.on_global_reply(cx, plan, reply);
            }
            Step::Quota(qr) if qr.giving_back => self.on_given_back(cx, plan, *qr, reply),
            Step::Quota(qr) => self.on_reserve_reply(cx, plan, *qr, reply),
            Step::Done => self.stage = Stage::Admitting(plan),
        }
    }

    /// Which callout this request waits for.
    pub fn awaiting(&self) -> Option<Purpose> {
        match &self.stage {
            Stage::Admitting(p) => match p.step {
                Step::Global(_) => Some(Purpose::GlobalCharge),
                Step::Quota(ref qr) if qr.giving_back => Some(Purpose::LeaseGiveBack),
                Step::Quota(_) => Some(Purpose::Reserve),
                Step::Done => None,
            },
            _ => None,
        }
    }

    fn on_global_reply(&mut self, cx: &mut Cx, mut plan: Box<Plan>, reply: CalloutReply) {
        let cfg = cx.cfg;
        let Some(g) = cfg.global.as_ref() else {
            return;
        };
        let Step::Global(gc) = &plan.step else {
            return;
        };
        let (idx, used_eval, probe, cost, block, from_lease) = (
            gc.rule,
            gc.used_eval,
            gc.shim_probe,
            gc.cost,
            gc.block,
            gc.from_lease,
        );
        let Some(rule) = cfg.rule(idx) else {
            return;
        };
        let parsed = match reply.refused {
            Some(s) => Err((
                ShimError::Unavailable,
                shim::describe_refusal(&g.cluster, s),
            )),
            None => global::parse_reply(reply.status, &reply.body)
                .map_err(|e| (e.clone(), format!("{e} (cluster '{}')", g.cluster))),
        };
        match parsed {
            Err((ShimError::NoScript, _)) if !used_eval => {
                cx.worker.global_script_loaded = false;
                self.dispatch_global(cx, plan, true);
            }
            Err((_, why)) => {
                shim::record(cx, &g.cluster, &g.shim_breaker, false, probe);
                self.global_unavailable(cx, plan, &why);
            }
            Ok(r) => {
                shim::record(cx, &g.cluster, &g.shim_breaker, true, probe);
                if used_eval {
                    cx.worker.global_script_loaded = true;
                }
                cx.inc(Metric::GlobalCharged);
                let key = match std::mem::replace(&mut plan.step, Step::Done) {
                    Step::Global(gc) => gc.key,
                    _ => String::new(),
                };
                let mut r = r;
                if let Some(pol) = g.lease {
                    super::glease::answered(cx, &pol, idx, &key, cost, &r, block.is_some());
                    // What this Envoy now holds counts in what is left for `x-ratelimit-*`.
                    r.state.tokens += r.block_tokens as f64;
                    r.state.requests += r.block_requests as f64;
                }
                if matches!(
                    r.verdict,
                    Verdict::LimitTokens { .. } | Verdict::LimitRequests { .. }
                ) {
                    let seen = global::seen_after_refusal(&key, &r, cx.now());
                    let _ = cx.store().set(&global::seen_slot(&key), &seen.encode(), 0);
                }
                let snap = r.state.snapshot(&rule.params);
                match local::decision(r.verdict, snap, rule, cost) {
                    Decision::Admit {
                        snapshot, wait_ms, ..
                    } => {
                        plan.charges.global.push(Charge {
                            rule: idx,
                            key,
                            cost,
                        });
                        plan.bind(rule, snapshot, wait_ms);
                        self.next_global(cx, plan);
                    }
                    Decision::Reject(_) if rule.shadow => {
                        // Not charged in Redis: the part taken from the lease goes back (a shadow
                        // limit admits; its bucket is charged only for what it would have admitted).
                        restore(cx, idx, &key, from_lease);
                        super::admit::shadow_refusal(cx, rule, &plan.meta.tenant);
                        self.next_global(cx, plan);
                    }
                    Decision::Reject(refusal) => {
                        // Nothing was charged here; what earlier steps took is given back (and what
                        // this charge took from the lease).
                        restore(cx, idx, &key, from_lease);
                        self.reject_after_charges(cx, &mut plan, refusal);
                    }
                    Decision::StoreFailed(_) => {
                        plan.step = Step::Global(super::state::GlobalCharge {
                            rule: idx,
                            key,
                            cost,
                            used_eval,
                            shim_probe: probe,
                            started: true,
                            block: None,
                            from_lease,
                        });
                        self.global_unavailable(cx, plan, "unexpected verdict");
                    }
                }
            }
        }
    }

    fn on_reserve_reply(
        &mut self,
        cx: &mut Cx,
        mut plan: Box<Plan>,
        mut qr: QuotaReq,
        reply: CalloutReply,
    ) {
        let cfg = cx.cfg;
        let Some(q) = cfg.quota.as_ref() else {
            return;
        };
        let parsed = match reply.refused {
            Some(s) => Err((
                ShimError::Unavailable,
                shim::describe_refusal(&q.cluster, s),
            )),
            None => quota::parse_reserve_reply(reply.status, &reply.body)
                .map_err(|e| (e.clone(), format!("{e} (cluster '{}')", q.cluster))),
        };
        let probe = qr.shim_probe;
        match parsed {
            Err((ShimError::NoScript, _)) if !qr.used_eval => {
                cx.worker.quota_script_loaded = false;
                self.dispatch_reserve(cx, plan, qr, true);
            }
            Err((e, why)) => {
                shim::record(cx, &q.cluster, &q.shim_breaker, false, probe);
                if reply.refused.is_none() && e.may_have_run() {
                    // Redis may have run the script after all (a timeout, a proxy's error): reconcile
                    // at the end.
                    qr.uncertain = true;
                }
                self.quota_unavailable(cx, plan, qr, &why);
            }
            Ok(r) => {
                shim::record(cx, &q.cluster, &q.shim_breaker, true, probe);
                if qr.used_eval {
                    cx.worker.quota_script_loaded = true;
                }
                qr.answered = true;
                // This Envoy's lease of the account, if it holds one: Redis' counter includes all
                // of it, and its unspent part is left to this Envoy's requests.
                let lease = q
                    .lease
                    .as_ref()
                    .and_then(|_| super::lease::account(cx, &qr));
                // The limit that binds (tenant or tenant × model) and its remaining, as one pair.
                let (limit, remaining) = r.binding();
                let remaining = remaining.saturating_add(lease.map_or(0, |a| a.available()));
                qr.limit = limit;
                qr.remaining = Some(remaining);
                if r.allowed {
                    cx.inc(Metric::QuotaReserved);
                    if qr.budget.is_none() {
                        // Tokens only: a budget's amounts are money (or another account's tokens).
                        cx.add(
                            Metric::QuotaReservedTokens,
                            qr.reserved.prompt_cost.saturating_add(r.granted_output),
                        );
                    }
                    if r.reason == Reason::Clamped {
                        qr.reserved.output_cost = r.granted_output;
                        let tokens = quota::clamped_output_tokens(
                            r.granted_output,
                            &qr.reserved.weights,
                            qr.choices,
                        );
                        if let Err(max) = clamp_body(cx, &mut plan, tokens) {
                            // No thinking budget fits below what is left: Anthropic would refuse
                            // the request; refuse it here and give the reservations back.
                            refund(cx, &mut plan.charges);
                            super::reserve::give_back_quotas(cx, &mut plan.quotas);
                            let mut qr = qr;
                            super::end::refund_reservation(cx, &mut qr);
                            let audit = Audit {
                                tenant: plan.meta.tenant.clone(),
                                model: plan.model.clone(),
                                cost: Some(plan.cost),
                                decision: "thinking_does_not_fit",
                            };
                            self.answer(
                                cx,
                                audit,
                                None,
                                answers::thinking_does_not_fit(max),
                                "tokengate_thinking_does_not_fit",
                            );
                            return;
                        }
                    }
                    plan.quotas.push(qr);
                    self.next_quota(cx, plan);
                } else {
                    // Nothing was reserved here: nothing to settle; earlier ones are given back.
                    let account = qr.args.tenant.as_str();
                    // What this Envoy's lease holds unspent would make up the difference: it is given
                    // back, and the reservation sent again (once).
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
                    if let Some(l) = q.lease.as_ref().filter(|_| {
                        covered
                            && qr.refusal.is_none()
                            && matches!(r.reason, Reason::TenantLimit | Reason::ModelLimit)
                    }) {
                        if now_available == 0 {
                            // A sync gave the lease back (or requests spent it) after the
                            // reservation was sent: sent again, once; Redis has it if it went back.
                            qr.refusal = Some(r);
                            qr.answered = false;
                            self.start_reserve(cx, plan, qr);
                            return;
                        }
                        if super::lease::give_back(cx, q, l, &qr) {
                            qr.giving_back = true;
                            qr.refusal = Some(r);
                            // Nothing is reserved while it is given back.
                            qr.started = false;
                            plan.step = Step::Quota(Box::new(qr));
                            plan.sync = false;
                            self.stage = Stage::Admitting(plan);
                            return;
                        }
                    }
                    // Other Envoys' leases of the account hold what would make up the difference
                    // (Redis counts them, not this Envoy's): a retry after they went idle can pass
                    // (tokens only: a budget is refused).
                    let elsewhere = r.held_elsewhere;
                    let retry_elsewhere = q.lease.as_ref().filter(|_| {
                        elsewhere > 0
                            && qr.budget.is_none()
                            && r.remaining()
                                .saturating_add(now_available)
                                .saturating_add(elsewhere)
                                >= need
                    });
                    // Not while this Envoy still holds part of the account in a lease (or gave it
                    // back for this request: Redis may not have it yet): that part goes back to
                    // Redis at the next sync and the next request may get it. Nor while other
                    // Envoys' leases hold some of it (a smaller request may fit once they went back).
                    let leased = qr.refusal.is_some()
                        || lease.is_some_and(|a| a.held > 0)
                        || elsewhere > 0
                        || r.leases_elsewhere;
                    if r.reason == Reason::TenantLimit
                        && r.remaining() < q.exhausted_below
                        && !leased
                    {
                        mark_exhausted(cx, q, account, limit, r.remaining());
                    }
                    if let Some(l) = retry_elsewhere {
                        self.quota_leased(cx, plan, qr, r.reason, elsewhere, l);
                        return;
                    }
                    self.quota_exceeded(cx, plan, qr, r.reason);
                }
            }
        }
    }
}

impl Request {
    /// The 429 of a quota (or budget) Redis refused for `reason`, with what `qr` says is left.
    /// `qr` is reconciled when its last reservation call may have run ([`QuotaReq::uncertain`]).
    pub(super) fn quota_exceeded(
        &mut self,
        cx: &mut Cx,
        mut plan: Box<Plan>,
        qr: QuotaReq,
        reason: Reason,
    ) -> Next {
        let Some(q) = cx.cfg.quota.as_ref() else {
            return Next::Pause;
        };
        // Counted where the refusal is the answer: not a first refusal that a give-back of this
        // Envoy's lease then turned into an admission.
        cx.inc(Metric::QuotaRejected);
        let what = whose_quota(reason, &plan.model);
        let refusal = answers::quota_exceeded(
            qr.limit,
            qr.remaining.unwrap_or(0),
            qr.reset_at,
            unix_s(cx, q),
            &what,
        );
        let (refusal, decision) = match qr.budget.and_then(|i| q.budgets.list.get(i)) {
            Some(b) => (
                answers::as_budget(refusal, b, q.budgets.unit(b)),
                "budget_exceeded",
            ),
            None => (refusal, "quota_exceeded"),
        };
        let reconcile = qr.uncertain.then_some(qr);
        self.quota_refused_with(cx, &mut plan, refusal, decision, reconcile)
    }

    /// The retryable 429 of a quota Redis refused for `reason` that other Envoys' leases would
    /// cover (`elsewhere`): they come back when idle, at their Envoy's walk over its accounts
    /// ([`retry_after_leases`]).
    fn quota_leased(
        &mut self,
        cx: &mut Cx,
        mut plan: Box<Plan>,
        qr: QuotaReq,
        reason: Reason,
        elsewhere: u64,
        l: &crate::config::LeaseSettings,
    ) {
        let Some(q) = cx.cfg.quota.as_ref() else {
            return;
        };
        cx.inc(Metric::QuotaRejected);
        let what = whose_quota(reason, &plan.model);
        let retry_s = retry_after_leases(cx, l);
        let refusal = answers::quota_leased(
            qr.limit,
            qr.remaining.unwrap_or(0),
            elsewhere,
            qr.reset_at,
            unix_s(cx, q),
            &what,
            retry_s,
        );
        let reconcile = qr.uncertain.then_some(qr);
        self.quota_refused_with(cx, &mut plan, refusal, "quota_held_elsewhere", reconcile);
    }

    /// The give-back of this Envoy's lease answered (or failed): the reservation is sent again.
    fn on_given_back(
        &mut self,
        cx: &mut Cx,
        mut plan: Box<Plan>,
        mut qr: QuotaReq,
        reply: CalloutReply,
    ) {
        let settings = cx
            .cfg
            .quota
            .as_ref()
            .and_then(|q| Some((q, q.lease.as_ref()?)));
        let gave = match settings {
            Some((q, l)) => {
                let noscript = reply.refused.is_none()
                    && quota::parse_lease_reply(reply.status, &reply.body)
                        == Err(ShimError::NoScript);
                if noscript && !qr.give_back_eval && super::lease::give_back_again(cx, q, l, &qr) {
                    // Redis restarted since the script was loaded: the give-back is sent again
                    // as EVAL.
                    qr.give_back_eval = true;
                    plan.step = Step::Quota(Box::new(qr));
                    self.stage = Stage::Admitting(plan);
                    return;
                }
                super::lease::given_back(cx, q, l, &qr, reply)
            }
            None => false,
        };
        qr.giving_back = false;
        if !gave {
            // Redis' refusal stands (and is the answer: not the shim's failure policy).
            let reason = qr.refusal.map_or(Reason::TenantLimit, |r| r.reason);
            self.quota_exceeded(cx, plan, qr, reason);
            return;
        }
        // What is left stays the first refusal's until the reservation answers again.
        qr.answered = false;
        self.start_reserve(cx, plan, qr);
    }
}

/// Whose quota a refusal for `reason` names, as the answer words it.
fn whose_quota(reason: Reason, model: &str) -> String {
    if reason == Reason::ModelLimit {
        format!("for model '{model}'")
    } else {
        "for this tenant".to_string()
    }
}

/// When other Envoys' idle leases are back in Redis, as this Envoy would give its own back: `idle_s`
/// after their last use, at the first sync after it (`refresh_ms`), once the leader's walk over the
/// accounts reaches them (this Envoy's number of accounts, [`SCAN_PER_TICK`] a 20 ms tick, standing in
/// for theirs), and a second for the calls; at most `ttl_s` (a lease whose Envoy went away is resolved
/// then) and 60 s (the SDKs ignore a longer `retry-after`). An estimate: a lease its Envoy keeps using
/// does not come back.
///
/// [`SCAN_PER_TICK`]: super::lease::SCAN_PER_TICK
fn retry_after_leases(cx: &Cx, l: &crate::config::LeaseSettings) -> f64 {
    let accounts = crate::store::peek::<crate::store::Count>(
        cx.store(),
        crate::quota::lease::account::COUNTER,
    )
    .ok()
    .and_then(|(c, _)| c)
    .map_or(0, |c| c.0);
    let walk_s = accounts.div_ceil(super::lease::SCAN_PER_TICK) as f64
        * f64::from(crate::host::root::SETTLE_TICK_MS)
        / 1000.0;
    let s = (l.policy.idle_ns.saturating_add(l.policy.refresh_ns)) as f64 / 1e9 + walk_s + 1.0;
    s.min(l.ttl_s as f64).min(60.0)
}

/// Lowers the output limit of the body to what the quota granted (and an Anthropic thinking budget
/// below it). `Err(max_tokens)`: no thinking budget of the minimum size fits below it.
fn clamp_body(cx: &mut Cx, plan: &mut Plan, tokens: u64) -> Result<(), u64> {
    let Some(kind) = plan.meta.kind else {
        return Ok(());
    };
    let edits = Edits {
        clamp_max_output: Some(tokens),
        max_output_field: output_field(kind, &plan.body).to_string(),
        ..Edits::default()
    };
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
    let now_s = unix_s(cx, q);
    let ok = crate::store::registry::claim_slot(
        cx.host.store(),
        MARKER_COUNTER,
        cx.cfg.max_tenants,
        cx.cfg.cas_max_retries,
        &mut cx.worker.known_keys,
        super::worker::KNOWN_KEYS_CACHE,
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
    let _ = cx
        .store()
        .set(&key, &crate::store::Codec::encode(&marker), 0);
}

/// Gives `amount` tokens taken from this Envoy's lease for a charge Redis refused back to the lease.
fn restore(cx: &mut Cx, rule: usize, key: &str, amount: u64) {
    if amount == 0 {
        return;
    }
    super::worker::enqueue_credit(
        cx,
        super::worker::Credit {
            key: key.to_string(),
            rule,
            amount: i64::try_from(amount).unwrap_or(i64::MAX),
        },
    );
}
