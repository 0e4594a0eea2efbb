//! Admission, in order: the one place that says which steps a metered request meets and in what order.
//! Each step lives in its own file under `steps/`; adding one is a new file and a line here.
//!
//! 1. [`AT_HEADERS`]: decided from the request headers alone. A refusal here means the upstream is
//!    never contacted.
//! 2. [`READ`]: the body is whole — what the request costs, which model it goes to, what is sent
//!    upstream. Nothing is charged yet.
//! 3. [`ADMIT`]: each step charges all or nothing, in order; a step may wait for its own callout. When
//!    one refuses, every step that ran gives back what it took ([`Step::undo`], last first), and the
//!    refusal is answered. Envoy started the upstream request when the headers phase ended: a refusal
//!    from here on drops it.
//! 4. Admitted: held by shaping until its release time, or let go.
//!
//! A refusal is data ([`Denial`]); [`Reason::row`](super::denial::Reason::row) gives its counter, audit decision and response code
//! details, and [`Request::deny`] answers it.

use super::answers;
use super::denial::Denial;
use super::state::{
    Audit, Charges, Forwarded, InFlight, Meta, Plan, QuotaReq, Replied, Request, Stage,
};
use super::step::{Draft, HeaderStep, Outcome, ReadStep, Step};
use super::steps::{
    body_size, breakers, cluster_breaker, edits, estimate, fair, global, identity, limits,
    model_breaker, precheck, quota, quota_marker,
};
use crate::flow::cx::Cx;
use crate::flow::effect::{Callout, CalloutReply, Effect, Headers, Next};
use crate::flow::metric::Metric;

/// The headers phase, in order.
pub(in crate::flow) const AT_HEADERS: [HeaderStep; 5] = [
    // 401/403: who pays (API key, JWT claim, trusted header) and their groups.
    identity::resolve,
    // 413: a `content-length` over `max_body_bytes`.
    body_size::declared,
    // 429: a tenant whose month is known spent (shared data, no callout).
    quota_marker::check,
    // 503, or a fallback route: the upstream cluster's breaker.
    cluster_breaker::check,
    // 429: a bucket or in-flight limit that certainly applies and cannot pass one more request.
    precheck::check,
];

/// Reading the whole body, in order.
pub(in crate::flow) const READ: [ReadStep; 3] = [
    // 400 (or a fixed charge), 403 for an unmetered background response: what the request costs.
    estimate::read,
    // 503, or a fallback model: the model's breaker.
    model_breaker::check,
    // 400: what is sent upstream (a fallback model, stream usage, output limits).
    edits::apply,
];

/// Admission, in order.
pub(in crate::flow) const ADMIT: [&dyn Step; 5] = [
    // 429/413: in-flight slots, then buckets in this Envoy's shared data (global ones are queued).
    &limits::Limits,
    // 429/413: fair limits, each charged as its member's share (a callout each for a global one).
    &fair::Fair,
    // 503: the admissions of the cluster and model breakers.
    &breakers::Breakers,
    // 429/413: global buckets in Redis (a callout each, or this Envoy's lease of the bucket).
    &global::Global,
    // 429/503: the monthly token quota, then every budget (a callout each, or this Envoy's lease).
    &quota::Quota,
];

impl Request {
    /// Runs the headers steps on `meta`; `Err` with the answer made when one refused.
    pub(super) fn check_headers(
        &mut self,
        cx: &mut Cx,
        h: &dyn Headers,
        meta: &mut Meta,
    ) -> Result<(), Next> {
        for step in AT_HEADERS {
            if let Err(d) = step(cx, h, meta) {
                return Err(self.deny(cx, meta, "", None, d));
            }
        }
        Ok(())
    }

    /// The body is whole: the reading steps, then admission. `body` is what the client sent.
    pub(super) fn admit_body(&mut self, cx: &mut Cx, meta: Meta, body: &[u8]) -> Next {
        let Some(kind) = meta.kind else {
            self.stage = Stage::Passthrough;
            return Next::Continue;
        };
        let mut draft = Draft {
            meta,
            kind,
            body,
            est: None,
            prompt: 0,
            output: 0,
            cost: 0,
            choices: 1,
            model: String::new(),
            model_closed: None,
            edits: Default::default(),
            fallbacks: Vec::new(),
            kept: Vec::new(),
            injected_usage: false,
        };
        for step in READ {
            if let Err(d) = step(cx, &mut draft) {
                let model = std::mem::take(&mut draft.model);
                return self.deny(cx, &draft.meta, &model, None, d);
            }
        }
        cx.add(Metric::TokensEstimated, draft.cost);
        let Draft {
            mut meta,
            model,
            model_closed,
            cost,
            prompt,
            output,
            choices,
            kept,
            injected_usage,
            fallbacks,
            ..
        } = draft;
        meta.fallbacks.extend(fallbacks);
        let plan = Box::new(Plan {
            context: self.id,
            meta,
            model,
            model_closed,
            cost,
            prompt,
            output,
            choices,
            body: kept,
            injected_usage,
            charges: Charges::default(),
            snapshot: None,
            wait_ms: 0,
            at: 0,
            inflight: InFlight::Nothing,
            globals: Vec::new(),
            fairs: Vec::new(),
            quotas: Vec::new(),
            pending_quotas: Vec::new(),
            downgraded: Vec::new(),
            first_denial: None,
        });
        self.admit(cx, plan, 0, false)
    }

    /// Runs the admission steps from `from` on; `resumed`: called from a callout's answer (the request
    /// is resumed, not continued, when admitted).
    fn admit(&mut self, cx: &mut Cx, mut plan: Box<Plan>, from: usize, resumed: bool) -> Next {
        let mut at = from;
        while let Some(step) = ADMIT.get(at) {
            plan.at = at;
            match step.start(cx, &mut plan) {
                Outcome::Continue => at += 1,
                Outcome::Await(callout) => return self.wait(cx, plan, callout),
                Outcome::Park => return self.park(plan),
                Outcome::Deny(d) => return self.refuse_plan(cx, plan, d, resumed),
            }
        }
        self.admitted(cx, plan, resumed)
    }

    /// A callout of this request answered (or the host refused to send it): the step that waits for
    /// it goes on.
    pub fn on_callout_reply(&mut self, cx: &mut Cx, reply: CalloutReply) {
        let mut plan = match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Admitting(plan) => plan,
            other => {
                // A late reply for a request that moved on (it cannot happen: a request waits for
                // its one callout); nothing to do.
                self.stage = other;
                return;
            }
        };
        let at = plan.at;
        let Some(step) = ADMIT.get(at) else {
            self.stage = Stage::Admitting(plan);
            return;
        };
        match step.on_reply(cx, &mut plan, reply) {
            Outcome::Continue => {
                self.admit(cx, plan, at + 1, true);
            }
            Outcome::Await(callout) => {
                self.wait(cx, plan, callout);
            }
            Outcome::Park => {
                self.park(plan);
            }
            Outcome::Deny(d) => {
                self.refuse_plan(cx, plan, d, true);
            }
        }
    }

    /// A step waits for `callout`: it is sent, and the request pauses until its answer.
    fn wait(&mut self, cx: &mut Cx, plan: Box<Plan>, callout: Callout) -> Next {
        cx.fx.push(Effect::Dispatch(callout));
        self.stage = Stage::Admitting(plan);
        Next::Pause
    }

    /// A step waits for an answer the root brings (its reservation is in this VM's batch): the request
    /// pauses.
    fn park(&mut self, plan: Box<Plan>) -> Next {
        self.stage = Stage::Admitting(plan);
        Next::Pause
    }

    /// A refusal during admission: every step that ran gives back what it took (last first); then the
    /// request goes to a cheaper model when the refusing limit or budget says so (`when_exhausted`),
    /// or the refusal is answered (the first one, when the cheaper model refuses too).
    fn refuse_plan(
        &mut self,
        cx: &mut Cx,
        mut plan: Box<Plan>,
        d: Box<Denial>,
        resumed: bool,
    ) -> Next {
        for step in ADMIT.iter().take(plan.at + 1).rev() {
            step.undo(cx, &mut plan);
        }
        let d = match downgrade(cx, &mut plan, d) {
            Ok(()) => return self.admit(cx, plan, 0, resumed),
            Err(d) => d,
        };
        let (d, cost) = match plan.first_denial.take() {
            Some((first, cost)) => (first, cost),
            None => (d, plan.cost),
        };
        let cost = d.reason.row().reports_cost.then_some(cost);
        self.deny(cx, &plan.meta, &plan.model, cost, d)
    }

    /// Answers a refusal: counted ([`Reason::row`](super::denial::Reason::row)), audited, rendered in the request's API family;
    /// the request is [`Stage::Replied`] from here on. `model` and `cost`: what the audit record says
    /// of the request (the denial may name another model).
    pub(super) fn deny(
        &mut self,
        cx: &mut Cx,
        meta: &Meta,
        model: &str,
        cost: Option<u64>,
        d: Box<Denial>,
    ) -> Next {
        let row = d.reason.row();
        if let Some(m) = row.metric {
            cx.inc(m);
        }
        let audit = Audit {
            tenant: meta.tenant.clone(),
            model: d.model.unwrap_or_else(|| model.to_string()),
            cost,
            decision: row.decision,
        };
        cx.fx.push(Effect::Audit(answers::audit_record(
            &audit.tenant,
            &audit.model,
            audit.cost,
            audit.decision,
            &[],
            cx.cfg,
        )));
        let mut refusal = d.refusal;
        if refusal.estimated.is_none() {
            // Body-phase refusals say what the request would have cost (what the client waits for).
            refusal.estimated = audit.cost;
        }
        let reply =
            crate::reply::render(self.family, &refusal, &self.reply_id, cx.now() / 1_000_000);
        cx.fx.push(Effect::Reply {
            reply,
            details: row.details,
        });
        self.stage = Stage::Replied(Box::new(Replied {
            audit,
            reconcile: d.reconcile,
        }));
        Next::Pause
    }

    /// Every step admitted: the request goes on, or is held until its shaping release time.
    fn admitted(&mut self, cx: &mut Cx, mut plan: Box<Plan>, resumed: bool) -> Next {
        let quotas = std::mem::take(&mut plan.quotas);
        cx.inc(Metric::RequestsAdmitted);
        if !plan.downgraded.is_empty() {
            cx.inc(Metric::RequestsDowngraded);
        }
        let now = cx.now();
        let wait_ms = plan.wait_ms;
        if let Some(due) = (wait_ms > 0)
            .then(|| now.saturating_add(wait_ms.saturating_mul(1_000_000)))
            .filter(|d| *d > now)
        {
            let fwd = forwarded(cx, plan, quotas, "shaped");
            cx.worker.hold(self.id, due);
            self.stage = Stage::Held(Box::new(fwd));
            return Next::Pause;
        }
        let decision = if quotas.iter().any(QuotaReq::fail_open) {
            "admit_quota_fail_open"
        } else {
            "admit"
        };
        self.forward(cx, plan, quotas, decision);
        if resumed {
            cx.fx.push(Effect::Resume);
            Next::Pause
        } else {
            Next::Continue
        }
    }

    /// The request is admitted with `decision` (audited): from here on it is forwarded.
    pub(super) fn forward(
        &mut self,
        cx: &mut Cx,
        plan: Box<Plan>,
        quotas: Vec<QuotaReq>,
        decision: &'static str,
    ) {
        let fwd = forwarded(cx, plan, quotas, decision);
        self.stage = Stage::Forwarded(Box::new(fwd));
    }

    /// The client went before the request was sent upstream (while a callout of its admission was in
    /// flight, or while shaping held it): nothing was served, so every bucket charge, in-flight slot,
    /// probe permit and reservation is given back; a reservation whose callout had not answered is
    /// reconciled at 0 (Redis may run it still: the tombstone makes it a no-op). A global charge in
    /// flight is left to Redis (the bucket refills).
    pub(super) fn abandon(&mut self, cx: &mut Cx) {
        cx.inc(Metric::RequestsAbandoned);
        match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Admitting(mut plan) => {
                quota::in_flight_to_settle(cx, &mut plan);
                let record = answers::audit_record(
                    &plan.meta.tenant,
                    &plan.model,
                    Some(plan.cost),
                    "client_gone",
                    &plan.quotas,
                    cx.cfg,
                );
                for step in ADMIT.iter().take(plan.at + 1).rev() {
                    step.undo(cx, &mut plan);
                }
                cx.fx.push(Effect::Audit(record));
            }
            Stage::Held(f) => {
                cx.worker.forget(self.id);
                let mut f = *f;
                let record = answers::audit_record(
                    &f.meta.tenant,
                    &f.model,
                    Some(f.cost),
                    "client_gone",
                    &f.quotas,
                    cx.cfg,
                );
                give_back(cx, &mut f.charges, &mut f.quotas);
                cx.fx.push(Effect::Audit(record));
            }
            other => self.stage = other,
        }
    }
}

/// Gives back everything an admitted request took (it was not sent after all): what each admission
/// step's [`Step::undo`] gives back, last step first.
pub(in crate::flow) fn give_back(cx: &mut Cx, charges: &mut Charges, quotas: &mut Vec<QuotaReq>) {
    quota::give_back(cx, quotas);
    global::credit_back(cx, charges);
    breakers::release(cx, charges);
    fair::give_back(cx, charges);
    limits::release(cx, charges);
}

/// The admitted request, its audit record written (or left to its settlement).
fn forwarded(
    cx: &mut Cx,
    plan: Box<Plan>,
    quotas: Vec<QuotaReq>,
    decision: &'static str,
) -> Forwarded {
    let plan = *plan;
    let refund = plan
        .charges
        .local
        .iter()
        .chain(plan.charges.global.iter())
        .map(|c| c.rule)
        .chain(plan.charges.fair.iter().map(|c| c.rule))
        .filter_map(|i| cx.cfg.rule(i))
        .any(|r| r.refund_unused);
    if quotas.is_empty() {
        let mut rec = answers::audit_record(
            &plan.meta.tenant,
            &plan.model,
            Some(plan.cost),
            decision,
            &quotas,
            cx.cfg,
        );
        answers::add_downgrades(&mut rec, &plan.downgraded);
        cx.fx.push(Effect::Audit(rec));
    }
    // A request with reservations is always settled — at the end of its response, or in `on_log`
    // when the client went (a held one is given back there) — and Envoy writes the access log after
    // `on_log`: the settlement's record (this one plus what was used) is the one logged, so it is
    // the only one written.
    Forwarded {
        refund,
        meta: plan.meta,
        model: plan.model,
        cost: plan.cost,
        injected_usage: plan.injected_usage,
        charges: plan.charges,
        snapshot: plan.snapshot,
        shaped_ms: plan.wait_ms,
        quotas,
        decision,
        downgraded: plan.downgraded,
        resp: Default::default(),
    }
}

/// Sends a request a limit or budget refused to the model its `when_exhausted` names: what it was
/// charged is given back already; the body's model is rewritten (byte-preserving), the request estimated
/// again as that model and admitted from the first step, charged and limited as it. `Err`: the refusal
/// stands (no `when_exhausted`, a model the path names, too many hops, a body that cannot be
/// rewritten).
fn downgrade(cx: &mut Cx, plan: &mut Plan, d: Box<Denial>) -> Result<(), Box<Denial>> {
    use super::denial::Reason;
    let cfg = cx.cfg;
    let exhausted = matches!(
        d.reason,
        Reason::LimitedTokens
            | Reason::LimitedRequests
            | Reason::BudgetExceeded
            | Reason::BudgetExceededCached
    );
    let target = match d.refusal.limit_name.as_deref() {
        Some(name) if exhausted => cfg.downgrade_of(name),
        _ => None,
    };
    let (Some(target), Some(kind)) = (target, plan.meta.kind) else {
        return Err(d);
    };
    if plan.meta.path_model.is_some()
        || plan.downgraded.len() >= crate::config::MAX_DOWNGRADE_HOPS
        || target == plan.model
    {
        return Err(d);
    }
    let edits = crate::rewrite::Edits {
        set_model: Some(target.to_string()),
        ..crate::rewrite::Edits::default()
    };
    let Ok(Some(body)) = crate::rewrite::rewrite(&plan.body, &edits) else {
        return Err(d);
    };
    let limits = |m: Option<&str>| cfg.output_limits(m.or(Some(target)));
    let Ok(est) = crate::estimate::estimate_with_model(kind, &body, Some(target), &limits) else {
        return Err(d);
    };
    cx.fx.push(Effect::ReplaceRequestBody(body.clone()));
    plan.downgraded.push(format!("{} -> {target}", plan.model));
    if plan.first_denial.is_none() {
        plan.first_denial = Some((d, plan.cost));
    }
    plan.body = body;
    plan.model = target.to_string();
    plan.model_closed = None;
    plan.prompt = est.prompt_tokens;
    plan.output = est.output_tokens;
    plan.cost = est.total();
    plan.choices = est.output_choices;
    plan.charges = Charges::default();
    plan.snapshot = None;
    plan.wait_ms = 0;
    plan.inflight = InFlight::Nothing;
    plan.globals.clear();
    plan.fairs.clear();
    plan.quotas.clear();
    plan.pending_quotas.clear();
    Ok(())
}
