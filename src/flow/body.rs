//! Phase 2, request body: estimate, pick the model, edit the body, make the plan; then the admission
//! steps in order — rules and limits with the breakers ([`super::admit`]), global buckets
//! ([`super::global_step`], callouts), quota reservations ([`super::reserve`], callouts) — and let the
//! request go, hold it, or answer (here).

use super::admit::refund;
use super::answers;
use super::state::{Audit, Charges, Forwarded, Plan, QuotaReq, Request, Stage, Step};
use super::{Body, Cx, Effect, Level, Metric, Next};
use crate::breaker::failover::Choice;
use crate::config::InvalidBody;
use crate::estimate::{self, ApiKind};
use crate::reply::Refusal;
use crate::rewrite::{self, Edits};

/// The body field that carries the output limit for this API, where one is added to a body without
/// any: chat's `max_completion_tokens` (OpenAI's reasoning models refuse `max_tokens`), unless the body
/// already names `max_tokens` (a `null` one: the client's style).
pub(super) fn output_field(kind: ApiKind, body: &[u8]) -> &'static str {
    match kind {
        ApiKind::Responses => "max_output_tokens",
        ApiKind::ChatCompletions if !body.windows(12).any(|w| w == b"\"max_tokens\"") => {
            "max_completion_tokens"
        }
        _ => "max_tokens",
    }
}

impl Request {
    /// Envoy's request-body callback.
    pub fn on_request_body(&mut self, cx: &mut Cx, body_size: usize, end_of_stream: bool) -> Next {
        let Stage::AwaitingBody(meta) = &self.stage else {
            return Next::Continue;
        };
        if body_size > cx.cfg.max_body_bytes {
            let meta = (**meta).clone();
            cx.inc(Metric::RequestsRejectedTooLarge);
            return self.refuse(
                cx,
                &meta,
                "",
                "too_large",
                answers::too_large(cx.cfg.max_body_bytes),
                "tokengate_too_large",
            );
        }
        if !end_of_stream {
            return Next::Pause;
        }
        match cx.host.body(Body::Request, body_size) {
            Some(body) => self.decide(cx, &body, true),
            None => {
                cx.log_failure(
                    Level::Warn,
                    "read_body",
                    "cannot read the request body; estimating it as empty".to_string(),
                );
                self.decide(cx, &[], true)
            }
        }
    }

    /// The body is complete (or there is none): estimate, pick the model, charge, decide. `sync`: called
    /// from a stream callback (the returned [`Next`] is used).
    pub(super) fn decide(&mut self, cx: &mut Cx, body: &[u8], sync: bool) -> Next {
        let cfg = cx.cfg;
        let mut meta = match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::AwaitingBody(m) => *m,
            other => {
                self.stage = other;
                return Next::Continue;
            }
        };
        let Some(kind) = meta.kind else {
            self.stage = Stage::Passthrough;
            return Next::Continue;
        };
        let hint = meta.model_hint.as_deref();
        let est = match estimate::estimate(kind, body, &|model| cfg.output_limits(model.or(hint))) {
            Ok(e) => Some(e),
            Err(e) => match cfg.invalid_body {
                InvalidBody::Reject => {
                    cx.inc(Metric::RequestsRejectedInvalidBody);
                    return self.refuse(
                        cx,
                        &meta,
                        "",
                        "invalid_body",
                        answers::invalid_body(kind.as_str(), &e.to_string()),
                        "tokengate_invalid_body",
                    );
                }
                InvalidBody::Charge(_) => {
                    cx.inc(Metric::RequestsInvalidBodyCharged);
                    None
                }
            },
        };
        if cfg.refuse_background && est.as_ref().is_some_and(|e| e.background) {
            cx.inc(Metric::RequestsRejectedUnmetered);
            let model = est
                .as_ref()
                .and_then(|e| e.model.clone())
                .unwrap_or_default();
            return self.refuse(
                cx,
                &meta,
                &model,
                "background_not_metered",
                answers::background_not_metered(),
                "tokengate_background_not_metered",
            );
        }
        meta.background = est.as_ref().is_some_and(|e| e.background);
        let (prompt, output, cost) = match (&est, cfg.invalid_body) {
            (Some(e), _) => (e.prompt_tokens, e.output_tokens, e.total()),
            (None, InvalidBody::Charge(t)) => (t, 0, t),
            (None, InvalidBody::Reject) => (0, 0, 0),
        };
        let choices = est.as_ref().map_or(1, |e| e.output_choices);
        let mut model = est
            .as_ref()
            .and_then(|e| e.model.clone())
            .or_else(|| meta.model_hint.clone())
            .unwrap_or_default();

        // Body edits: a model fallback, and include_usage for quota settlement of streams.
        let mut edits = Edits::default();
        let mut model_closed = None;
        let mut fallbacks = Vec::new();
        if let Some(b) = cfg
            .breaker
            .as_ref()
            .filter(|b| b.keys.model && !model.is_empty())
        {
            match super::breakers::check_model(cx, b, &model) {
                Ok(Choice {
                    target,
                    from: Some(from),
                    closed,
                    ..
                }) => {
                    model_closed = closed.then(|| target.clone());
                    edits.set_model = Some(target.clone());
                    fallbacks.push(format!("{from} -> {target}"));
                }
                Ok(choice) => model_closed = choice.closed.then_some(choice.target),
                Err(reset) => {
                    cx.inc(Metric::BreakerShortCircuited);
                    return self.refuse(
                        cx,
                        &meta,
                        &model,
                        "circuit_open",
                        answers::circuit_open("model", &model, reset),
                        "tokengate_circuit_open",
                    );
                }
            }
        }
        if let (Some(q), Some(e)) = (&cfg.quota, &est) {
            // Only OpenAI chat and legacy completions know `stream_options.include_usage` (their
            // streams carry no usage without it); Anthropic's and Responses' streams always end with
            // their usage, and their APIs refuse fields they do not define.
            edits.inject_include_usage = q.inject_stream_usage
                && e.stream
                && !e.include_usage
                && matches!(e.kind, ApiKind::ChatCompletions | ApiKind::Completions);
            edits.max_output_field = output_field(kind, body).to_string();
        }
        if let Some(e) = est.as_ref().filter(|e| e.kind != ApiKind::Embeddings) {
            // The reservation covers at most the model's cap per choice: a body asking for more is
            // lowered to it, so that the provider never generates more than was reserved.
            let cap = cfg.output_limits(e.model.as_deref().or(hint)).cap_tokens;
            if e.output_tokens >= cap.saturating_mul(e.output_choices.max(1)) {
                edits.clamp_max_output = Some(cap);
                edits.clamp_present_only = true;
                edits.max_output_field = output_field(kind, body).to_string();
            }
        }
        // A body without an output limit gets the reserved one written in where the reservation must
        // bound what the provider generates: `output_limit_absent: "write"`, and a background response
        // (`background_responses: "reservation"`: charged its reservation, whatever it generates).
        let adds_limit = est.as_ref().is_some_and(|e| {
            e.kind != ApiKind::Embeddings
                && e.requested_output.is_none()
                && (e.background || cfg.write_absent_limit)
        });
        if let Some(e) = est.as_ref().filter(|_| adds_limit) {
            edits.clamp_max_output = Some(e.output_tokens / e.output_choices.max(1));
            edits.clamp_present_only = false;
            edits.max_output_field = output_field(kind, body).to_string();
        }
        // Kept for a max_tokens clamp after the reservation.
        let mut kept = if cfg.quota.is_some() {
            body.to_vec()
        } else {
            Vec::new()
        };
        let mut injected_usage = false;
        if edits.set_model.is_some()
            || edits.inject_include_usage
            || edits.clamp_max_output.is_some()
        {
            match rewrite::rewrite_with_report(body, &edits) {
                Ok(r) => {
                    if r.output_clamped && !adds_limit {
                        if let Some(refusal) = above_cap(cfg, &r, edits.clamp_max_output) {
                            cx.inc(Metric::RequestsRejectedInvalidBody);
                            return self.refuse(
                                cx,
                                &meta,
                                &model,
                                "output_above_cap",
                                refusal,
                                "tokengate_output_above_cap",
                            );
                        }
                        cx.inc(Metric::RequestsOutputCapped);
                    }
                    if let Some(mut new_body) = r.body {
                        if let Some(n) = meta.fixed_length {
                            // The upstream was promised `n` bytes (content-length kept): JSON allows
                            // trailing whitespace, so a shorter body is padded to exactly that.
                            if new_body.len() > n {
                                return self.refuse(
                                    cx,
                                    &meta,
                                    &model,
                                    "output_above_cap",
                                    answers::output_limit_too_large(
                                        edits.clamp_max_output.unwrap_or(0),
                                        "a plain integer of at most",
                                    ),
                                    "tokengate_output_above_cap",
                                );
                            }
                            new_body.resize(n, b' ');
                        }
                        if cfg.quota.is_some() {
                            kept.clone_from(&new_body);
                        }
                        cx.fx.push(Effect::ReplaceRequestBody(new_body));
                    }
                    if r.model_changed {
                        cx.inc(Metric::BreakerFallbacks);
                        if let Some(t) = edits.set_model.take() {
                            model = t;
                        }
                    }
                    injected_usage = r.injected_include_usage;
                }
                Err(e) => {
                    cx.log_failure(
                        Level::Warn,
                        "rewrite_body",
                        format!("cannot rewrite the request body: {e}"),
                    );
                    if edits.set_model.is_some() {
                        cx.inc(Metric::BreakerShortCircuited);
                        return self.refuse(
                            cx,
                            &meta,
                            &model,
                            "circuit_open",
                            answers::circuit_open("model", &model, 1000),
                            "tokengate_circuit_open",
                        );
                    }
                }
            }
        }
        cx.add(Metric::TokensEstimated, cost);
        meta.fallbacks.extend(fallbacks);
        let plan = Box::new(Plan {
            meta,
            model,
            cost,
            prompt,
            output,
            choices,
            body: kept,
            injected_usage,
            charges: Charges::default(),
            snapshot: None,
            wait_ms: 0,
            step: Step::Done,
            globals: Vec::new(),
            quotas: Vec::new(),
            pending_quotas: Vec::new(),
            sync,
        });

        self.admit(cx, plan, model_closed.as_deref())
    }

    /// Gives every charge back and answers.
    pub(super) fn refused_after_charges(
        &mut self,
        cx: &mut Cx,
        plan: &mut Plan,
        decision: &'static str,
        refusal: Refusal,
        details: &'static str,
    ) -> Next {
        refund(cx, &mut plan.charges);
        let audit = Audit {
            tenant: plan.meta.tenant.clone(),
            model: plan.model.clone(),
            cost: Some(plan.cost),
            decision,
        };
        self.answer(cx, audit, None, refusal, details)
    }

    /// Lets the request go on (or holds it until its shaping release time).
    pub(super) fn proceed(&mut self, cx: &mut Cx, mut plan: Box<Plan>) -> Next {
        let quotas = std::mem::take(&mut plan.quotas);
        cx.inc(Metric::RequestsAdmitted);
        let now = cx.now();
        let (wait_ms, sync) = (plan.wait_ms, plan.sync);
        if let Some(due) = (wait_ms > 0)
            .then(|| now.saturating_add(wait_ms.saturating_mul(1_000_000)))
            .filter(|d| *d > now)
        {
            let fwd = forwarded(cx, plan, quotas, "shaped");
            cx.worker.hold(self.id, due);
            self.stage = Stage::Held(Box::new(fwd));
            return Next::Pause;
        }
        let decision = if quotas.iter().any(|q| q.fail_open) {
            "admit_quota_fail_open"
        } else {
            "admit"
        };
        self.forward(cx, plan, quotas, decision);
        if sync {
            Next::Continue
        } else {
            cx.fx.push(Effect::Resume);
            Next::Pause
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
        .filter_map(|c| cx.cfg.rule(c.rule))
        .any(|r| r.refund_unused);
    if quotas.is_empty() {
        cx.fx.push(Effect::Audit(answers::audit_record(
            &plan.meta.tenant,
            &plan.model,
            Some(plan.cost),
            decision,
            &quotas,
            cx.cfg,
        )));
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
        resp: Default::default(),
    }
}

/// The refusal of a body whose output limit is above the cap (`output_above_cap: refuse`), or whose
/// thinking budget cannot fit below the cap; `None` to lower it.
fn above_cap(
    cfg: &crate::config::Config,
    r: &rewrite::Rewritten,
    cap: Option<u64>,
) -> Option<Refusal> {
    let cap = cap.unwrap_or(0);
    if let rewrite::Thinking::DoesNotFit { max_tokens } = r.thinking {
        return Some(answers::thinking_does_not_fit(max_tokens));
    }
    (cfg.output_above_cap == crate::config::AboveCap::Refuse)
        .then(|| answers::output_limit_too_large(cap, "at most"))
}
