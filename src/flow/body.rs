//! Phase 2, request body: estimate, pick the model, edit the body, then the admission steps in order —
//! local bucket, breaker admissions, global bucket (callout), quota reservation (callout) — and let the
//! request go, hold it, or answer.

use super::answers;
use super::shim;
use super::state::{
    Audit, Charge, Charges, Forwarded, GlobalCharge, Plan, QuotaReq, Request, Stage, Step,
};
use super::worker::{self, Credit, KNOWN_KEYS_CACHE};
use super::{Body, Cx, Effect, Level, Metric, Next, Purpose};
use crate::accounting::Reserved;
use crate::admission::{self, Decision};
use crate::calendar;
use crate::config::{GlobalFailure, InvalidBody, QuotaFailure, StoreFailure};
use crate::estimate::{self, ApiKind};
use crate::failover::Choice;
use crate::global;
use crate::quota::{self, ReserveArgs};
use crate::reply::Refusal;
use crate::rewrite::{self, Edits};
use crate::store::UpdateError;
use crate::webdis::ScriptCall;

/// The body field that carries the output limit for this API.
pub(super) fn output_field(kind: ApiKind, body: &[u8]) -> &'static str {
    match kind {
        ApiKind::Responses => "max_output_tokens",
        ApiKind::ChatCompletions if body.windows(21).any(|w| w == b"max_completion_tokens") => {
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
        let meta = match std::mem::replace(&mut self.stage, Stage::Done) {
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
            edits.inject_include_usage = q.inject_stream_usage && e.stream && !e.include_usage;
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
                    if r.output_clamped {
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
        let mut meta = meta;
        meta.fallbacks.extend(fallbacks);
        let mut plan = Box::new(Plan {
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

        let now = cx.now();
        // Every matching limit (and the first matching rule) in turn, all or nothing: a refusal gives
        // back what the earlier ones took. Global buckets are charged last, by callouts, once the
        // breakers admitted the request.
        let mut globals: Vec<(usize, String)> = Vec::new();
        for idx in cfg.applicable(&plan.meta.tenant, &plan.meta.groups, &plan.model) {
            let Some(rule) = cfg.rule(idx) else {
                continue;
            };
            if let Some(max) = rule.max_in_flight {
                if let Err(next) = self.take_slot(cx, &mut plan, idx, max, now) {
                    return next;
                }
            }
            if !rule.has_bucket {
                continue;
            }
            if rule.global && cfg.global.is_some() {
                let key = global::key(rule, &subject(cfg, rule, &plan.meta), &plan.model);
                // Not sent when Redis refused this bucket moments ago and it cannot have refilled since.
                if let Some(refusal) =
                    super::headers::global_refused_from_cache(cx, rule, &key, cost)
                {
                    if rule.shadow {
                        shadow_refusal(cx, rule, &plan.meta.tenant);
                        continue;
                    }
                    cx.inc(Metric::GlobalRejectedCached);
                    return self.reject_after_charges(cx, &mut plan, refusal);
                }
                globals.push((idx, key));
            } else if let Err(next) = self.charge_local(cx, &mut plan, idx, now) {
                return next;
            }
        }
        if let Err(next) = self.admit_breakers(cx, &mut plan, model_closed.as_deref(), now) {
            return next;
        }
        globals.reverse();
        plan.globals = globals;
        self.next_global(cx, plan)
    }

    /// The next global bucket charge, or the steps after the buckets when none is left.
    pub(super) fn next_global(&mut self, cx: &mut Cx, mut plan: Box<Plan>) -> Next {
        match plan.globals.pop() {
            Some((rule, key)) => {
                plan.step = Step::Global(GlobalCharge {
                    rule,
                    key,
                    cost: plan.cost,
                    used_eval: false,
                    shim_probe: false,
                    started: false,
                    block: None,
                });
                self.start_global(cx, plan)
            }
            None => self.after_buckets(cx, plan),
        }
    }

    /// A bucket refused: what the request took is given back, and the 429/413 sent.
    pub(super) fn reject_after_charges(
        &mut self,
        cx: &mut Cx,
        plan: &mut Plan,
        refusal: Refusal,
    ) -> Next {
        refund(cx, &mut plan.charges);
        let (meta, model) = (plan.meta.clone(), plan.model.clone());
        self.reject(cx, &meta, &model, Some(plan.cost), refusal)
    }

    /// Takes one of the `max` in-flight slots of limit `idx` for this request: `Ok` (taken, or a shadow
    /// limit that would have refused), or the reply already made.
    fn take_slot(
        &mut self,
        cx: &mut Cx,
        plan: &mut Plan,
        idx: usize,
        max: u32,
        now: u64,
    ) -> Result<(), Next> {
        let cfg = cx.cfg;
        let Some(rule) = cfg.rule(idx) else {
            return Ok(());
        };
        let mut key = slot_key(rule, &subject(cfg, rule, &plan.meta));
        // Semaphore keys count against `max_tenants` like bucket keys; past it, subjects share 64
        // overflow semaphores per limit.
        if !admission::claim_slot(
            cx.host.store(),
            admission::KEY_COUNTER,
            cfg.max_tenants,
            cfg.cas_max_retries,
            &mut cx.worker.known_keys,
            KNOWN_KEYS_CACHE,
            &key,
        ) {
            cx.inc(Metric::TenantOverflow);
            let n = crate::hash::fnv1a(crate::hash::FNV_OFFSET, key.as_bytes())
                % admission::OVERFLOW_SLOTS;
            key = format!("{}{}:~overflow{n}", crate::keys::IN_FLIGHT, rule.name);
        }
        let owner = crate::inflight::owner(self.id, now);
        let ttl = crate::inflight::SLOT_TTL_S.saturating_mul(1_000_000_000);
        match crate::inflight::acquire(cx.store(), &key, max, owner, now, ttl, cfg.cas_max_retries)
        {
            Ok((acquired, corrupt)) => {
                if corrupt {
                    cx.inc(Metric::StateCorrupt);
                }
                match acquired {
                    crate::inflight::Acquired::Taken { .. } => {
                        plan.charges.slots.push((key, owner));
                        Ok(())
                    }
                    crate::inflight::Acquired::Full if rule.shadow => {
                        shadow_refusal(cx, rule, &plan.meta.tenant);
                        Ok(())
                    }
                    crate::inflight::Acquired::Full => {
                        let refusal = answers::too_many_in_flight(rule, max, &cfg.groups);
                        Err(self.reject_after_charges(cx, plan, refusal))
                    }
                }
            }
            Err(e) => {
                cx.inc(match e {
                    UpdateError::CasExhausted => Metric::CasExhausted,
                    UpdateError::Host => Metric::StoreErrors,
                });
                cx.log_failure(
                    Level::Warn,
                    "bucket_store",
                    format!("in-flight update failed at {key}: {e:?}; applying on_store_error"),
                );
                if cfg.on_store_error == StoreFailure::Deny {
                    return Err(self.refused_after_charges(
                        cx,
                        plan,
                        "deny_store_error",
                        answers::limiter_unavailable(),
                        "tokengate_store_error",
                    ));
                }
                Ok(())
            }
        }
    }

    /// Charges rule or limit `idx`'s bucket in this Envoy's shared data: `Ok` (admitted, `plan.wait_ms`
    /// raised when shaped; or a shadow limit that would have refused), or the reply already made (what
    /// was charged before given back).
    pub(super) fn charge_local(
        &mut self,
        cx: &mut Cx,
        plan: &mut Plan,
        idx: usize,
        now: u64,
    ) -> Result<(), Next> {
        let cfg = cx.cfg;
        let Some(rule) = cfg.rule(idx) else {
            return Ok(());
        };
        let who = subject(cfg, rule, &plan.meta);
        let (key, info) = admission::bucket_key(
            cx.host.store(),
            cfg,
            &mut cx.worker.known_keys,
            KNOWN_KEYS_CACHE,
            rule,
            &who,
            &plan.model,
        );
        if info.overflow {
            cx.inc(Metric::TenantOverflow);
        }
        let seen = match plan.meta.prechecked.take() {
            Some((k, seen)) if k == key => Some(seen),
            other => {
                plan.meta.prechecked = other;
                None
            }
        };
        let (decision, stats) =
            admission::charge(cx.store(), cfg, rule, &key, plan.cost, now, seen);
        if stats.corrupt {
            cx.inc(Metric::StateCorrupt);
            cx.log_failure(
                Level::Warn,
                "corrupt_bucket",
                format!("corrupt bucket state at {key}: reset to full"),
            );
        }
        match decision {
            Decision::Admit {
                snapshot,
                cost,
                wait_ms,
            } => {
                plan.charges.local.push(Charge {
                    rule: idx,
                    key,
                    cost,
                });
                plan.bind(rule, snapshot, wait_ms);
                Ok(())
            }
            Decision::Reject(_) if rule.shadow => {
                shadow_refusal(cx, rule, &plan.meta.tenant);
                Ok(())
            }
            Decision::Reject(refusal) => Err(self.reject_after_charges(cx, plan, refusal)),
            Decision::StoreFailed(e) => {
                cx.inc(match e {
                    UpdateError::CasExhausted => Metric::CasExhausted,
                    UpdateError::Host => Metric::StoreErrors,
                });
                cx.log_failure(
                    Level::Warn,
                    "bucket_store",
                    format!("bucket update failed at {key}: {e:?}; applying on_store_error"),
                );
                if cfg.on_store_error == StoreFailure::Deny {
                    return Err(self.refused_after_charges(
                        cx,
                        plan,
                        "deny_store_error",
                        answers::limiter_unavailable(),
                        "tokengate_store_error",
                    ));
                }
                Ok(())
            }
        }
    }

    /// Takes the breaker admissions for the chosen cluster and model (after the bucket admitted).
    /// `Err`: a breaker refused (lost the last permit to another worker); charges were given back and
    /// the reply made.
    fn admit_breakers(
        &mut self,
        cx: &mut Cx,
        plan: &mut Plan,
        model_closed: Option<&str>,
        now: u64,
    ) -> Result<(), Next> {
        let cfg = cx.cfg;
        let Some(b) = &cfg.breaker else {
            return Ok(());
        };
        for (scope, name, seen_closed) in
            super::breakers::targets(b, &plan.meta, &plan.model, model_closed, now)
                .into_iter()
                .flatten()
        {
            match super::breakers::admit(cx, b, scope, name.as_deref(), seen_closed, now) {
                Ok(Some(held)) => plan.charges.breakers.push(held),
                Ok(None) => {}
                Err(reset) => {
                    let name = name.unwrap_or_default();
                    cx.inc(Metric::BreakerShortCircuited);
                    refund(cx, &mut plan.charges);
                    let meta = plan.meta.clone();
                    return Err(self.refuse(
                        cx,
                        &meta,
                        &name,
                        "circuit_open",
                        answers::circuit_open(scope, &name, reset),
                        "tokengate_circuit_open",
                    ));
                }
            }
        }
        Ok(())
    }

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
                    let refusal = answers::as_budget(refusal, b, &q.budgets.currency);
                    return self.quota_refused(cx, &mut plan, refusal, "budget_exceeded_cached");
                }
            }
            if let Some(l) = q.lease.as_ref() {
                let account = qr.args.tenant.clone();
                let model = qr.args.model.clone();
                if let Some(a) = super::lease::take(cx, l, &account, model.as_deref(), &qr) {
                    // Reserved from this Envoy's lease: no callout.
                    qr.leased = true;
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
        refund(cx, &mut plan.charges);
        give_back_quotas(cx, &mut plan.quotas);
        let audit = Audit {
            tenant: plan.meta.tenant.clone(),
            model: plan.model.clone(),
            cost: Some(plan.cost),
            decision,
        };
        let details = if refusal.class == crate::reply::Class::QuotaUnavailable {
            "tokengate_quota_unavailable"
        } else {
            "tokengate_quota_exceeded"
        };
        self.answer(cx, audit, None, refusal, details)
    }

    /// Starts the global bucket charge.
    fn start_global(&mut self, cx: &mut Cx, mut plan: Box<Plan>) -> Next {
        let Some(g) = cx.cfg.global.as_ref() else {
            return self.after_buckets(cx, plan);
        };
        let Step::Global(gc) = &mut plan.step else {
            return self.after_buckets(cx, plan);
        };
        if let Some(pol) = g.lease {
            // From this Envoy's lease when it holds the cost (also while Redis is down); otherwise the
            // charge below asks for a block too.
            match super::glease::take(cx, &pol, gc.rule, &gc.key, gc.cost) {
                super::glease::Taken::Hit(snapshot) => {
                    let charge = Charge {
                        rule: gc.rule,
                        key: std::mem::take(&mut gc.key),
                        cost: gc.cost,
                    };
                    if let Some(rule) = cx.cfg.rule(charge.rule) {
                        plan.bind(rule, snapshot, 0);
                    }
                    plan.charges.global.push(charge);
                    plan.step = Step::Done;
                    return self.next_global(cx, plan);
                }
                super::glease::Taken::Miss(block) => gc.block = block,
            }
        }
        match shim::admit(cx, &g.cluster, &g.shim_breaker) {
            Ok(probe) => gc.shim_probe = probe,
            Err(_) => {
                let why = format!("the circuit of the shim at cluster '{}' is open", g.cluster);
                return self.global_unavailable(cx, plan, &why);
            }
        }
        self.dispatch_global(cx, plan, false)
    }

    /// Sends the global charge (`eval`: as `EVAL`, after a NOSCRIPT).
    pub(super) fn dispatch_global(&mut self, cx: &mut Cx, mut plan: Box<Plan>, eval: bool) -> Next {
        let cfg = cx.cfg;
        let (Some(g), Step::Global(gc)) = (cfg.global.as_ref(), &mut plan.step) else {
            return Next::Continue;
        };
        let Some(rule) = cfg.rule(gc.rule) else {
            return Next::Continue;
        };
        let call = if eval {
            ScriptCall::Eval
        } else {
            shim::script_call(cx.worker.global_script_loaded)
        };
        gc.used_eval = call == ScriptCall::Eval;
        gc.started = true;
        let body = match gc.block {
            Some((block_tokens, block_requests)) => {
                let ask = global::LeaseAsk {
                    block_tokens,
                    block_requests,
                    ..global::LeaseAsk::request()
                };
                global::lease_request(&gc.key, &rule.params, gc.cost, rule.max_wait_ms, &ask, call)
            }
            None => global::charge_request(&gc.key, &rule.params, gc.cost, rule.max_wait_ms, call),
        };
        cx.fx.push(Effect::Dispatch(shim::callout(
            Purpose::GlobalCharge,
            &g.cluster,
            &g.authority,
            g.timeout_ms,
            body,
        )));
        // The answer comes in a callout callback: from then on the request is resumed, not continued.
        plan.sync = false;
        self.stage = Stage::Admitting(plan);
        Next::Pause
    }

    /// Redis could not charge the global bucket: apply `global_buckets.on_failure`.
    pub(super) fn global_unavailable(
        &mut self,
        cx: &mut Cx,
        mut plan: Box<Plan>,
        why: &str,
    ) -> Next {
        let cfg = cx.cfg;
        cx.inc(Metric::GlobalShimErrors);
        let idx = match &plan.step {
            Step::Global(gc) => {
                if gc.block.is_some() {
                    super::glease::abandon(cx, &gc.key);
                }
                gc.rule
            }
            _ => usize::MAX,
        };
        plan.step = Step::Done;
        let policy = cfg
            .global
            .as_ref()
            .map_or(GlobalFailure::Local, |g| g.on_failure);
        match policy {
            GlobalFailure::Local => {
                cx.inc(Metric::GlobalFallbackLocal);
                cx.log_failure(
                    Level::Warn,
                    "global_shim",
                    format!("global bucket unavailable ({why}); charging this Envoy's bucket (on_failure=local)"),
                );
                let now = cx.now();
                match self.charge_local(cx, &mut plan, idx, now) {
                    Ok(()) => self.next_global(cx, plan),
                    Err(next) => next,
                }
            }
            GlobalFailure::Open => {
                cx.inc(Metric::GlobalFailOpen);
                cx.log_failure(
                    Level::Warn,
                    "global_shim",
                    format!("global bucket unavailable ({why}); admitting (on_failure=open)"),
                );
                self.next_global(cx, plan)
            }
            GlobalFailure::Closed => {
                cx.inc(Metric::GlobalFailClosed);
                cx.log_failure(
                    Level::Warn,
                    "global_shim",
                    format!("global bucket unavailable ({why}); rejecting (on_failure=closed)"),
                );
                self.refused_after_charges(
                    cx,
                    &mut plan,
                    "global_unavailable",
                    answers::limiter_unavailable(),
                    "tokengate_global_unavailable",
                )
            }
        }
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
            let price = q.budgets.price(&plan.model);
            out.push(self.reservation(
                cx,
                plan,
                account,
                None,
                price,
                (b.limit_micros, 0),
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
        };
        QuotaReq {
            keys: args.keys(),
            expire_at: args.expire_at_unix,
            reserved: Reserved {
                prompt_cost: args.prompt_cost,
                output_cost: args.output_cost,
                weights: w,
            },
            args,
            limit,
            remaining: None,
            reset_s: calendar::seconds_to_reset(now_s, offset),
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
            leased: false,
            budget,
        }
    }

    /// Starts the quota reservation callout.
    fn start_reserve(&mut self, cx: &mut Cx, plan: Box<Plan>, mut qr: QuotaReq) -> Next {
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

/// The admitted request, its audit record written.
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
    cx.fx.push(Effect::Audit(answers::audit_record(
        &plan.meta.tenant,
        &plan.model,
        Some(plan.cost),
        decision,
        &quotas,
        cx.cfg,
    )));
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

/// Gives the bucket charges and any breaker probe permits back (the request was not sent after all).
pub(super) fn refund(cx: &mut Cx, charges: &mut Charges) {
    let cfg = cx.cfg;
    super::breakers::release(cx, std::mem::take(&mut charges.breakers));
    release_slots(cx, charges);
    for c in std::mem::take(&mut charges.local) {
        if let Some(rule) = cfg.rule(c.rule) {
            let now = cx.now();
            if admission::credit(cx.store(), cfg, rule, &c.key, c.cost, now).is_ok() {
                cx.add(Metric::TokensCredited, c.cost);
            }
        }
    }
    for c in std::mem::take(&mut charges.global) {
        worker::enqueue_credit(
            cx,
            Credit {
                key: c.key,
                rule: c.rule,
                amount: i64::try_from(c.cost).unwrap_or(i64::MAX),
            },
        );
    }
}

/// Gives back the in-flight slots the request holds.
pub(super) fn release_slots(cx: &mut Cx, charges: &mut Charges) {
    for (key, owner) in std::mem::take(&mut charges.slots) {
        if let Err(e) = crate::inflight::release(cx.store(), &key, owner, cx.cfg.cas_max_retries) {
            // The slot expires by itself (crate::inflight::SLOT_TTL_S).
            cx.inc(Metric::StoreErrors);
            cx.log_failure(
                Level::Warn,
                "bucket_store",
                format!("in-flight release failed at {key}: {e:?}; the slot expires by itself"),
            );
        }
    }
}

/// Whose bucket or semaphore `rule` charges for this request (see [`crate::config::Rule::subject`]).
pub(super) fn subject(
    cfg: &crate::config::Config,
    rule: &crate::config::Rule,
    meta: &super::state::Meta,
) -> String {
    rule.subject(&meta.tenant, &cfg.groups, &meta.groups)
        .into_owned()
}

/// The shared-data key of a limit's in-flight slots for `subject`.
pub(super) fn slot_key(rule: &crate::config::Rule, subject: &str) -> String {
    format!("{}{}:{}", crate::keys::IN_FLIGHT, rule.name, subject)
}

/// A shadow limit would have refused: counted and logged, never enforced.
pub(super) fn shadow_refusal(cx: &mut Cx, rule: &crate::config::Rule, tenant: &str) {
    cx.inc(Metric::ShadowRefusals);
    cx.log_failure(
        Level::Info,
        "shadow_refusal",
        format!(
            "shadow limit '{}' would have refused a request of tenant '{tenant}'",
            rule.name
        ),
    );
}

impl Plan {
    /// Records an admitting bucket's state: `x-ratelimit-*` report the binding one (least remaining
    /// tokens; shadow limits never), and the request waits for the longest hold.
    pub(super) fn bind(
        &mut self,
        rule: &crate::config::Rule,
        snap: crate::bucket::Snapshot,
        wait_ms: u64,
    ) {
        if rule.shadow {
            return;
        }
        self.wait_ms = self.wait_ms.max(wait_ms);
        if self
            .snapshot
            .as_ref()
            .is_none_or(|s| snap.remaining_tokens < s.remaining_tokens)
        {
            self.snapshot = Some(snap);
        }
    }
}

/// Gives back reservations already made (a later step refused the request): a leased one to its lease,
/// any other by a settlement of 0.
pub(super) fn give_back_quotas(cx: &mut Cx, quotas: &mut Vec<QuotaReq>) {
    for mut qr in std::mem::take(quotas) {
        if qr.leased {
            qr.settled = true;
            let (account, model) = (qr.args.tenant.clone(), qr.args.model.clone());
            super::lease::settle(cx, &account, model.as_deref(), qr.reserved.total(), 0);
        } else if qr.uncertain {
            // Redis may have reserved it (or may still): charge 0, whatever it did.
            super::end::reconcile(cx, &mut qr, crate::accounting::Ending::NotServed);
        } else if qr.fail_open {
            // Nothing was reserved.
        } else {
            super::end::refund_reservation(cx, &mut qr);
        }
    }
}
