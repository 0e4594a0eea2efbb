//! Phase 2, quota reservations: the tenant's monthly token quota, then every budget in money that
//! applies, each reserved from this Envoy's lease or by a callout, all or nothing; what the quota's
//! `on_failure` does when the shim cannot answer.

use super::admit::refund;
use super::answers;
use super::shim;
use super::state::{Audit, Plan, QuotaReq, Request, Stage, Step};
use super::{Cx, Effect, Level, Metric, Next, Purpose};
use crate::config::QuotaFailure;
use crate::quota::accounting::Reserved;
use crate::quota::calendar;
use crate::quota::{self, ReserveArgs};
use crate::reply::Refusal;
use crate::shim::webdis::ScriptCall;

impl Request {
    /// Every bucket admitted: the quota next, or let the request go.
    pub(super) fn after_buckets(&mut self, cx: &mut Cx, mut plan: Box<Plan>) -> Next {
        if plan.wait_ms > 0 {
            cx.inc(Metric::RequestsShaped);
        }
        let mut quotas = self.quota_requests(cx, &plan);
        quotas.reverse();
        plan.pending_quotas = quotas;
        self.next_quota(cx, plan)
    }

    /// The next quota reservation (from this Envoy's lease, or by a callout), or let the request go
    /// once every one was made.
    pub(super) fn next_quota(&mut self, cx: &mut Cx, mut plan: Box<Plan>) -> Next {
        let Some(q) = cx.cfg.quota.as_ref() else {
            plan.step = Step::Done;
            return self.proceed(cx, plan);
        };
        while let Some(mut qr) = plan.pending_quotas.pop() {
            if let Some((_, b)) = qr
                .budget
                .and_then(|i| q.budgets.list.get(i).map(|b| (i, b)))
            {
                if let Some(refusal) = super::headers::exhausted_cached(cx, q, &qr.args.tenant) {
                    cx.inc(Metric::QuotaRejectedCached);
                    let refusal = answers::as_budget(refusal, b, q.budgets.unit(b));
                    return self.quota_refused(cx, &mut plan, refusal, "budget_exceeded_cached");
                }
            }
            if let Some(l) = q.lease.as_ref() {
                if let Some((a, key)) = super::lease::take(cx, l, &qr) {
                    // Reserved from this Envoy's lease: no callout.
                    qr.lease = Some(key);
                    qr.answered = true;
                    qr.limit = a.limit;
                    qr.remaining = Some(a.remaining.saturating_add(a.available()));
                    plan.quotas.push(qr);
                    continue;
                }
            }
            return self.start_reserve(cx, plan, qr);
        }
        plan.step = Step::Done;
        self.proceed(cx, plan)
    }

    /// A quota or budget refused (or its shim failed closed): every charge and earlier reservation is
    /// given back, and `refusal` sent.
    pub(super) fn quota_refused(
        &mut self,
        cx: &mut Cx,
        plan: &mut Plan,
        refusal: Refusal,
        decision: &'static str,
    ) -> Next {
        self.quota_refused_with(cx, plan, refusal, decision, None)
    }

    /// [`quota_refused`](Self::quota_refused), reconciling `reconcile` once the answer is sent.
    pub(super) fn quota_refused_with(
        &mut self,
        cx: &mut Cx,
        plan: &mut Plan,
        refusal: Refusal,
        decision: &'static str,
        reconcile: Option<QuotaReq>,
    ) -> Next {
        refund(cx, &mut plan.charges);
        give_back_quotas(cx, &mut plan.quotas);
        let audit = Audit {
            tenant: plan.meta.tenant.clone(),
            model: plan.model.clone(),
            cost: Some(plan.cost),
            decision,
        };
        let details = match refusal.class {
            crate::reply::Class::QuotaUnavailable => "tokengate_quota_unavailable",
            crate::reply::Class::QuotaLeased => "tokengate_quota_held_elsewhere",
            _ => "tokengate_quota_exceeded",
        };
        self.answer(cx, audit, reconcile, refusal, details)
    }

    /// The reservations this request asks for: the tenant's token quota (when it has one), then every
    /// budget that applies, priced at the model's prices.
    pub(super) fn quota_requests(&self, cx: &Cx, plan: &Plan) -> Vec<QuotaReq> {
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
            out.push(self.reservation(
                cx,
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
            // A money budget at the model's prices (micro-units per token); a token budget at the
            // quota's weights.
            let price = if b.tokens {
                q.weights(&plan.model)
            } else {
                q.budgets.price(&plan.model)
            };
            out.push(self.reservation(
                cx,
                plan,
                account,
                None,
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
        &self,
        cx: &Cx,
        plan: &Plan,
        account: String,
        model: Option<String>,
        w: crate::quota::Weights,
        (limit, model_limit): (u64, u64),
        clamp_output: bool,
        budget: Option<usize>,
    ) -> QuotaReq {
        let q = cx.cfg.quota.as_ref();
        let (offset, grace, deadline) = q.map_or((0, 0, 3600), |q| {
            (
                q.month_offset_minutes,
                q.grace_seconds,
                q.reservation_timeout_s,
            )
        });
        let now_s = q.map_or(0, |q| super::headers::unix_s(cx, q));
        let args = ReserveArgs {
            tenant: account,
            model,
            month: calendar::month_label(now_s, offset),
            request_id: plan.meta.request_id.clone(),
            prompt_cost: quota::weighted(plan.prompt, 0, 0, 0, &w),
            output_cost: quota::weighted(0, plan.output, 0, 0, &w),
            default_limit: limit,
            default_model_limit: model_limit,
            expire_at_unix: calendar::month_end_unix(now_s, offset)
                .saturating_add(i64::try_from(grace).unwrap_or(0)),
            deadline_s: deadline,
            clamp_output,
            min_output_cost: quota::min_clamped_output_cost(&w, plan.choices),
            lease_owner: super::lease::owner(cx),
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
            giving_back: false,
            refusal: None,
            lease_available: 0,
            give_back_eval: false,
            choices: plan.choices,
            fail_open: false,
            answered: false,
            settled: false,
            used_eval: false,
            shim_probe: false,
            started: false,
            actual: None,
            source: None,
            uncertain: false,
            lease: None,
            budget,
        }
    }

    /// Starts the quota reservation callout.
    pub(super) fn start_reserve(&mut self, cx: &mut Cx, plan: Box<Plan>, mut qr: QuotaReq) -> Next {
        let Some(q) = cx.cfg.quota.as_ref() else {
            return self.proceed(cx, plan);
        };
        match shim::admit(cx, &q.cluster, &q.shim_breaker) {
            Err(_) => {
                let why = format!(
                    "the circuit of the quota shim at cluster '{}' is open",
                    q.cluster
                );
                self.quota_unavailable(cx, plan, qr, &why)
            }
            Ok(probe) => {
                qr.shim_probe = probe;
                if q.lease.is_some() && qr.refusal.is_none() {
                    qr.lease_available =
                        super::lease::account(cx, &qr).map_or(0, |a| a.available());
                }
                self.dispatch_reserve(cx, plan, qr, false)
            }
        }
    }

    /// Sends the reservation (`eval`: as `EVAL`, after a NOSCRIPT).
    pub(super) fn dispatch_reserve(
        &mut self,
        cx: &mut Cx,
        mut plan: Box<Plan>,
        mut qr: QuotaReq,
        eval: bool,
    ) -> Next {
        let Some(q) = cx.cfg.quota.as_ref() else {
            return self.proceed(cx, plan);
        };
        let call = if eval {
            ScriptCall::Eval
        } else {
            shim::script_call(cx.worker.quota_script_loaded)
        };
        qr.used_eval = call == ScriptCall::Eval;
        qr.started = true;
        let body = quota::reserve_request(&qr.args, call);
        cx.fx.push(Effect::Dispatch(shim::callout(
            Purpose::Reserve,
            &q.cluster,
            &q.authority,
            q.timeout_ms,
            body,
        )));
        plan.step = Step::Quota(Box::new(qr));
        // The answer comes in a callout callback: from then on the request is resumed, not continued.
        plan.sync = false;
        self.stage = Stage::Admitting(plan);
        Next::Pause
    }

    /// The quota shim could not answer: apply the tenant's (or the budget's) failure policy.
    pub(super) fn quota_unavailable(
        &mut self,
        cx: &mut Cx,
        mut plan: Box<Plan>,
        mut qr: QuotaReq,
        why: &str,
    ) -> Next {
        let Some(q) = cx.cfg.quota.as_ref() else {
            return self.proceed(cx, plan);
        };
        cx.inc(Metric::QuotaShimErrors);
        if let Some(r) = qr.refusal {
            // A reservation sent again after this Envoy gave its lease back: Redis refused the
            // first, and that refusal is the answer, whatever the shim's failure policy.
            cx.log_failure(
                Level::Warn,
                "quota_shim",
                format!("quota check failed ({why}) after a refusal; refused"),
            );
            return self.quota_exceeded(cx, plan, qr, r.reason);
        }
        plan.step = Step::Done;
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
                qr.fail_open = true;
                qr.answered = true;
                plan.quotas.push(qr);
                self.next_quota(cx, plan)
            }
            QuotaFailure::Closed => {
                cx.inc(Metric::QuotaFailClosed);
                cx.log_failure(
                    Level::Warn,
                    "quota_shim",
                    format!("quota check failed ({why}); rejecting (on_failure=closed)"),
                );
                refund(cx, &mut plan.charges);
                give_back_quotas(cx, &mut plan.quotas);
                let audit = Audit {
                    tenant: plan.meta.tenant.clone(),
                    model: plan.model.clone(),
                    cost: Some(plan.cost),
                    decision: "quota_unavailable",
                };
                let reconcile = qr.uncertain.then_some(qr);
                self.answer(
                    cx,
                    audit,
                    reconcile,
                    answers::quota_unavailable(),
                    "tokengate_quota_unavailable",
                )
            }
        }
    }
}

/// Gives back reservations already made (a later step refused the request): a leased one to its lease,
/// any other by a settlement of 0.
pub(super) fn give_back_quotas(cx: &mut Cx, quotas: &mut Vec<QuotaReq>) {
    for mut qr in std::mem::take(quotas) {
        if let Some(key) = qr.lease.as_deref() {
            qr.settled = true;
            super::lease::settle(cx, key, qr.reserved.total(), 0);
        } else if qr.uncertain {
            // Redis may have reserved it (or may still): charge 0, whatever it did.
            super::end::reconcile(cx, &mut qr, crate::quota::accounting::Ending::NotServed);
        } else if qr.fail_open {
            // Nothing was reserved.
        } else {
            super::end::refund_reservation(cx, &mut qr);
        }
    }
}
