//! The per-request flow. In Envoy 1.40 a pause in the request-headers callback means the body never
//! arrives, and request headers are gone once the body is read; so the work is split this way:
//!
//! 1. **Request headers**: non-LLM paths and non-POST methods pass untouched. Resolve the tenant (401 when
//!    none), refuse a `content-length` over `max_body_bytes` (413), refuse a tenant whose quota is known
//!    exhausted (shared-data marker, 429), peek the cluster breaker (set the route header for a fallback
//!    cluster, or 503), and when the bucket is known from headers alone and cannot pass even one token,
//!    answer 429. Any of these answers means the upstream is never contacted. Otherwise continue (Envoy
//!    starts the upstream request); `content-length` is removed when the body may be rewritten.
//! 2. **Request body**: buffer to end of stream (413 past `max_body_bytes`), estimate the cost, peek the
//!    model breaker (rewrite `model` for a fallback, or 503), inject `include_usage`, charge the bucket
//!    (one CAS), take the breaker admissions (probe permits), then either continue, hold (shaping:
//!    released by the root's tick) or — with quotas — pause for the one reservation callout and resume
//!    from its answer. Rejections here drop the upstream request Envoy already started.
//! 3. **Response**: add `x-ratelimit-*`, `x-tokengate-estimated-tokens`, quota and fallback headers; scan
//!    SSE chunks (final event, usage; strip the injected usage chunk) or keep a JSON body for its usage.
//! 4. **End** (end of stream, or `on_log` for aborts): record the breaker outcome, queue the quota
//!    settlement (or reconciliation) for the root's tick, refund unused bucket tokens (`refund_unused`).

use super::abi::{self, Buffer, Level, Map};
use super::global as global_host;
use super::quota::{self as quota_host, Job};
use super::store::HostStore;
use super::{gauges, log, metrics, now_ns, KNOWN_KEYS_CACHE, VM};
use crate::accounting::{self, Ending, Reserved, UsageSource};
use crate::admission::{self, Decision, RejectReason};
use crate::breaker::{self, Transition};
use crate::bucket::{Snapshot, Verdict};
use crate::config::{
    Config, GlobalFailure, InvalidBody, QuotaFailure, QuotaSettings, Rule, StoreFailure,
};
use crate::estimate::{self, ApiKind};
use crate::failover::{self, Choice};
use crate::global;
use crate::identity;
use crate::quota::{
    self, ExhaustedMarker, Reason, ReconcileArgs, ReserveArgs, ScriptCall, SettleArgs, ShimError,
};
use crate::reply::{self, LocalReply};
use crate::rewrite::{self, Edits};
use crate::store::{Codec, SharedStore};
use crate::usage::{self, Forward, SseScanner};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not metered: forwarded untouched.
    Passthrough,
    /// Metered; waiting for the body.
    Metering,
    /// A local reply was sent.
    Replied,
    /// Admitted (possibly held first).
    Admitted,
}

/// One request's context.
pub struct Http {
    id: u32,
    cfg: Option<Rc<Config>>,
    phase: Phase,
    kind: Option<ApiKind>,
    tenant: String,
    model_hint: Option<String>,
    snapshot: Option<Snapshot>,
    /// The bucket read in the headers phase (key, value, CAS token): the body-phase charge of that
    /// same key starts from it instead of reading again (its CAS catches any write in between).
    prechecked: Option<(String, crate::store::Seen)>,
    cost: Option<u64>,
    shaped_ms: u64,
    /// Cluster chosen in the headers phase (after any fallback).
    cluster: Option<String>,
    /// When the chosen cluster's breaker was read CLOSED (ns), for [`failover::admit`].
    cluster_closed_at: Option<u64>,
    /// The model whose breaker was read CLOSED in the body phase (the fallback target when one was
    /// chosen); the admission skips its second read only for that very name.
    model_closed: Option<String>,
    /// Breakers this request was admitted by: (key, holds a probe permit).
    breakers: Vec<(String, bool)>,
    /// `x-tokengate-fallback` values.
    fallbacks: Vec<String>,
    /// Bucket charged, for a refund if a later step rejects: (rule index, key, cost).
    charged: Option<(usize, String, u64)>,
    /// Global (Redis) bucket charged, for a credit if a later step rejects: (rule index, key, cost).
    charged_global: Option<(usize, String, u64)>,
    /// The global bucket charge in flight.
    global_req: Option<GReq>,
    /// What the callout in flight is for.
    callout: Callout,
    /// Estimated (prompt, output) tokens, kept for the quota reservation after a global charge.
    est_tokens: (u64, u64),
    /// Choices the estimated output covers (`Estimate::output_choices`): a quota clamp divides by it.
    est_choices: u64,
    /// `quota::body_fingerprint` of the client's body (binds an idempotency key to the request).
    body_fingerprint: u64,
    /// Response facts for the breaker and the quota.
    resp: RespFacts,
    /// The model actually used (after any fallback).
    model: String,
    /// The request body as sent (kept while a quota callout may clamp it).
    body: Vec<u8>,
    /// `stream_options.include_usage` was added by us: strip the extra chunk.
    injected_usage: bool,
    /// Shaping release time, applied once every check passed.
    hold_until: Option<u64>,
    /// `x-request-id` (or a generated id): names the settlement.
    request_id: String,
    /// Client `Idempotency-Key`.
    idem_key: Option<String>,
    /// Quota reservation state.
    quota: Option<QReq>,
    /// The decision last written to the audit record (kept when settlement facts are added).
    decision: &'static str,
}

/// Shared-data count of exhausted-tenant markers.
const MARKER_COUNTER: &str = "tg:n:markers";
/// How long Redis remembers a request was settled (a retry after that could apply twice).
const SETTLED_MARKER_TTL_S: u64 = 2 * 86_400;
/// Largest JSON response kept to read its `usage`.
const MAX_JSON_RESPONSE: usize = 16 * 1024 * 1024;

/// What a context's callout in flight is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Callout {
    None,
    Reserve,
    Global,
}

/// One request's global bucket charge.
struct GReq {
    rule: usize,
    key: String,
    cost: u64,
    used_eval: bool,
    shim_probe: bool,
}

/// One request's quota reservation.
struct QReq {
    args: ReserveArgs,
    keys: quota::QuotaKeys,
    reserved: Reserved,
    expire_at: i64,
    limit: u64,
    remaining: Option<u64>,
    reset_s: u64,
    /// Choices the reserved output covers (the clamp divides by it).
    choices: u64,
    duplicate: bool,
    fail_open: bool,
    answered: bool,
    settled: bool,
    used_eval: bool,
    shim_probe: bool,
    actual: Option<u64>,
    source: Option<UsageSource>,
    /// The reservation callout failed in a way that may still have reserved (timeout, garbage):
    /// the request is reconciled instead of settled.
    uncertain: bool,
}

/// Seconds since the epoch for month arithmetic (host clock plus the configured skew).
fn unix_s(q: &QuotaSettings) -> i64 {
    i64::try_from(now_ns() / 1_000_000_000)
        .unwrap_or(0)
        .saturating_add(q.clock_skew_s)
}

/// The body field that carries the output limit for this API.
fn output_field(kind: ApiKind, body: &[u8]) -> &'static str {
    match kind {
        ApiKind::Responses => "max_output_tokens",
        ApiKind::ChatCompletions if body.windows(21).any(|w| w == b"max_completion_tokens") => {
            "max_completion_tokens"
        }
        _ => "max_tokens",
    }
}

/// The 503 when a bucket cannot record the request (`on_store_error: deny`, global `on_failure: closed`).
fn limiter_unavailable() -> LocalReply {
    reply::error(
        503,
        "server_error",
        "rate_limiter_unavailable",
        "The rate limiter could not record this request; retry shortly.",
    )
}

/// The 429 for an exhausted monthly quota.
fn quota_reply(limit: u64, remaining: u64, reset_s: u64, what: &str) -> LocalReply {
    let mut r = reply::error_with_reset(
        429,
        "insufficient_quota",
        "monthly_quota_exceeded",
        &format!("The monthly token quota {what} is used up ({limit} tokens); it resets at the start of next month."),
        reset_s as f64,
    );
    r.headers
        .push(("retry-after".to_string(), reset_s.max(1).to_string()));
    r.headers.extend(quota_headers(limit, remaining, reset_s));
    r
}

/// `x-tokengate-quota-*` headers.
fn quota_headers(limit: u64, remaining: u64, reset_s: u64) -> Vec<(String, String)> {
    vec![
        ("x-tokengate-quota-limit".to_string(), limit.to_string()),
        (
            "x-tokengate-quota-remaining".to_string(),
            remaining.to_string(),
        ),
        ("x-tokengate-quota-reset".to_string(), reset_s.to_string()),
    ]
}

/// What the response said, for the breaker outcome.
#[derive(Default)]
struct RespFacts {
    status: u32,
    retry_after: Option<String>,
    reset_headers: Vec<String>,
    /// An SSE response: its final event, usage and content size.
    stream: Option<SseScanner>,
    /// Keep a JSON response body to read its `usage` (quota settlement, bucket refunds).
    collect: bool,
    /// The kept JSON body (bounded by `MAX_JSON_RESPONSE`).
    json: Vec<u8>,
    /// Unused bucket tokens were already given back.
    refunded: bool,
    /// The response reached its end of stream (the upstream finished it).
    ended: bool,
}

impl Http {
    /// A new context for request `id`.
    pub fn new(id: u32, cfg: Option<Rc<Config>>) -> Self {
        Http {
            id,
            cfg,
            phase: Phase::Passthrough,
            kind: None,
            tenant: String::new(),
            model_hint: None,
            snapshot: None,
            prechecked: None,
            charged_global: None,
            global_req: None,
            callout: Callout::None,
            est_tokens: (0, 0),
            est_choices: 1,
            body_fingerprint: 0,
            cost: None,
            shaped_ms: 0,
            cluster: None,
            cluster_closed_at: None,
            model_closed: None,
            breakers: Vec::new(),
            fallbacks: Vec::new(),
            charged: None,
            resp: RespFacts::default(),
            model: String::new(),
            body: Vec::new(),
            injected_usage: false,
            hold_until: None,
            request_id: String::new(),
            idem_key: None,
            quota: None,
            decision: "-",
        }
    }

    fn circuit_open(&mut self, what: &str, name: &str, reset_in_ms: u64) -> Action {
        metrics::inc(metrics::get().breaker_short_circuited);
        self.audit("circuit_open", name);
        let reset_s = reset_in_ms as f64 / 1000.0;
        let mut r = reply::error_with_reset(
            503,
            "upstream_unavailable",
            "circuit_open",
            &format!("The {what} '{name}' is failing and its circuit breaker is not letting requests through (open, or half-open with every probe in flight); retry after the reset."),
            reset_s,
        );
        r.headers.push((
            "retry-after".to_string(),
            reply::retry_after(reset_s).to_string(),
        ));
        self.send(&r, "tokengate_circuit_open")
    }

    /// Takes the breaker admissions for the chosen cluster and model (after the bucket admitted).
    /// `Err` = a breaker rejected (lost the last permit to another worker): the reply was sent.
    fn admit_breakers(&mut self, cfg: &Config, model: &str, now: u64) -> Result<(), Action> {
        let Some(b) = &cfg.breaker else {
            return Ok(());
        };
        // A cluster read CLOSED in the headers phase counts as seen closed for a second (long uploads
        // read it again).
        let cluster_closed = self
            .cluster_closed_at
            .is_some_and(|t| now.saturating_sub(t) < 1_000_000_000);
        let mut targets: Vec<(&str, String, bool)> = Vec::new();
        if let Some(c) = self.cluster.clone() {
            targets.push(("cluster", c, cluster_closed));
        }
        if b.keys.model && !model.is_empty() {
            let seen = self.model_closed.as_deref() == Some(model);
            targets.push(("model", model.to_string(), seen));
        }
        let store = HostStore;
        for (scope, name, seen_closed) in targets {
            let (res, t) = VM.with(|vm| {
                let mut vm = vm.borrow_mut();
                failover::admit(
                    &store,
                    b,
                    scope,
                    &name,
                    now,
                    cfg.cas_max_retries,
                    &mut vm.known_keys,
                    KNOWN_KEYS_CACHE,
                    seen_closed,
                )
            });
            if let Some(t) = t {
                transition(scope, &name, t);
            }
            match res {
                Ok(a) => {
                    if a.probe {
                        metrics::inc(metrics::get().breaker_probes);
                    }
                    if let Some(k) = a.key {
                        self.breakers.push((k, a.probe));
                    }
                }
                Err(reset) => {
                    self.refund(cfg, now);
                    return Err(self.circuit_open(scope, &name, reset));
                }
            }
        }
        Ok(())
    }

    /// Gives the bucket charge and any breaker probe permits back (the request was not sent after
    /// all).
    fn refund(&mut self, cfg: &Config, now: u64) {
        for (key, probe) in std::mem::take(&mut self.breakers) {
            if probe {
                let _ = breaker::release_probe_shared(&HostStore, &key, cfg.cas_max_retries);
            }
        }
        if let Some((idx, key, cost)) = self.charged.take() {
            if let Some(rule) = cfg.rules.get(idx) {
                if admission::credit(&HostStore, cfg, rule, &key, cost, now).is_ok() {
                    metrics::add(metrics::get().tokens_credited, cost);
                }
            }
        }
        if let Some((idx, key, cost)) = self.charged_global.take() {
            global_host::enqueue_credit(key, idx, i64::try_from(cost).unwrap_or(i64::MAX));
        }
    }

    fn send(&mut self, r: &LocalReply, details: &str) -> Action {
        self.phase = Phase::Replied;
        let headers: Vec<(&str, &str)> = r
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if let Err(s) = abi::send_local_response(r.status, &headers, &r.body, details) {
            log(
                Level::Warn,
                &format!("local reply {} refused by host (status {s})", r.status),
            );
            return Action::Continue;
        }
        Action::Pause
    }

    fn audit(&mut self, decision: &'static str, model: &str) {
        self.decision = decision;
        let tenant = if self.tenant.is_empty() {
            "-"
        } else {
            &self.tenant
        };
        // The model comes from the client's body: written percent-encoded (bounded), so that it can
        // never add fields or lines to the access log.
        let model = if model.is_empty() {
            std::borrow::Cow::Borrowed("-")
        } else {
            crate::quota::sanitized(model)
        };
        let model = model.as_ref();
        let estimated = reply::Dec::int(self.cost.unwrap_or(0));
        let mut rec = String::with_capacity(64 + tenant.len() + model.len());
        for part in [
            "tenant=",
            tenant,
            " model=",
            model,
            " estimated=",
            estimated.as_str(),
            " decision=",
            decision,
        ] {
            rec.push_str(part);
        }
        if let Some(q) = &self.quota {
            rec.push_str(&format!(" reserved={}", q.reserved.total()));
            if let (Some(a), Some(src)) = (q.actual, q.source) {
                rec.push_str(&format!(" actual={a} usage_source={}", src.as_str()));
            }
        }
        let _ = abi::set_property(&["tokengate_audit"], rec.as_bytes());
    }

    fn reject(&mut self, r: &LocalReply, reason: RejectReason, model: &str) -> Action {
        let m = metrics::get();
        let (id, name) = match reason {
            RejectReason::Tokens => (m.requests_limited_tokens, "limited_tokens"),
            RejectReason::Requests => (m.requests_limited_requests, "limited_requests"),
            RejectReason::TooLarge => {
                (m.requests_rejected_cost_exceeds_burst, "cost_exceeds_burst")
            }
        };
        metrics::inc(id);
        self.audit(name, model);
        match self.cost {
            // Body-phase refusals say what the request would have cost (what the client waits for).
            Some(cost) => {
                let mut r = r.clone();
                r.headers.push((
                    "x-tokengate-estimated-tokens".to_string(),
                    reply::Dec::int(cost).as_str().to_string(),
                ));
                self.send(&r, "tokengate_rejected")
            }
            None => self.send(r, "tokengate_rejected"),
        }
    }

    /// The body is complete (or there is none): estimate, pick the model, charge, decide.
    fn decide(&mut self, cfg: &Config, body: &[u8]) -> Action {
        let m = metrics::get();
        let Some(kind) = self.kind else {
            return Action::Continue;
        };
        let hint = self.model_hint.as_deref();
        let est = match estimate::estimate(kind, body, &|model| cfg.output_limits(model.or(hint))) {
            Ok(e) => Some(e),
            Err(e) => match cfg.invalid_body {
                InvalidBody::Reject => {
                    metrics::inc(m.requests_rejected_invalid_body);
                    self.audit("invalid_body", "");
                    return self.send(
                        &reply::error(
                            400,
                            "invalid_request_error",
                            "invalid_body",
                            &format!(
                                "The request body could not be read as a request to the {} API: {e}",
                                kind.as_str()
                            ),
                        ),
                        "tokengate_invalid_body",
                    );
                }
                InvalidBody::Charge(_) => {
                    metrics::inc(m.requests_invalid_body_charged);
                    None
                }
            },
        };
        let (prompt, output, cost) = match (&est, cfg.invalid_body) {
            (Some(e), _) => (e.prompt_tokens, e.output_tokens, e.total()),
            (None, InvalidBody::Charge(t)) => (t, 0, t),
            (None, InvalidBody::Reject) => (0, 0, 0),
        };
        self.est_choices = est.as_ref().map_or(1, |e| e.output_choices);
        if cfg.quota.is_some() && self.idem_key.is_some() {
            self.body_fingerprint = quota::body_fingerprint(body);
        }
        let mut model = est
            .as_ref()
            .and_then(|e| e.model.clone())
            .or_else(|| self.model_hint.clone())
            .unwrap_or_default();

        // Body edits: a model fallback, and include_usage for quota settlement of streams.
        let mut edits = Edits::default();
        if let Some(b) = cfg
            .breaker
            .as_ref()
            .filter(|b| b.keys.model && !model.is_empty())
        {
            let next = |m: &str| b.model_fallback(m).map(|t| (t.to_string(), None));
            match failover::peek_chain(&HostStore, b, "model", &model, &next, now_ns()) {
                Ok(Choice {
                    target,
                    from: Some(from),
                    closed,
                    ..
                }) => {
                    self.model_closed = closed.then(|| target.clone());
                    edits.set_model = Some(target.clone());
                    self.fallbacks.push(format!("{from} -> {target}"));
                }
                Ok(choice) => self.model_closed = choice.closed.then_some(choice.target),
                Err(reset) => return self.circuit_open("model", &model, reset),
            }
        }
        if let (Some(q), Some(e)) = (&cfg.quota, &est) {
            edits.inject_include_usage = q.inject_stream_usage && e.stream && !e.include_usage;
            edits.max_output_field = output_field(kind, body).to_string();
        }
        if cfg.quota.is_some() {
            // Kept for a max_tokens clamp after the reservation.
            self.body = body.to_vec();
        }
        if edits.set_model.is_some() || edits.inject_include_usage {
            match rewrite::rewrite_with_report(body, &edits) {
                Ok(r) => {
                    if let Some(new_body) = r.body {
                        if abi::set_buffer(Buffer::RequestBody, 0, body.len(), &new_body).is_err() {
                            log(Level::Warn, "cannot rewrite the request body");
                            return self.circuit_open("model", &model, 1000);
                        }
                        if cfg.quota.is_some() {
                            self.body = new_body;
                        }
                    }
                    if r.model_changed {
                        metrics::inc(m.breaker_fallbacks);
                        if let Some(t) = edits.set_model.take() {
                            model = t;
                        }
                    }
                    self.injected_usage = r.injected_include_usage;
                }
                Err(e) => {
                    log(
                        Level::Warn,
                        &format!("cannot rewrite the request body: {e}"),
                    );
                    if edits.set_model.is_some() {
                        return self.circuit_open("model", &model, 1000);
                    }
                }
            }
        }
        self.model = model.clone();
        self.cost = Some(cost);
        metrics::add(m.tokens_estimated, cost);

        let now = now_ns();
        let mut wait_ms = 0;
        let mut global_charge = None;
        if let Some((idx, rule)) = cfg
            .rule_for(&self.tenant, &model)
            .and_then(|i| cfg.rules.get(i).map(|r| (i, r)))
        {
            if rule.global && cfg.global.is_some() {
                // Charged in Redis once the breakers admitted the request (unless Redis refused
                // this bucket moments ago and it cannot have refilled since).
                let key = global::key(rule, &self.tenant, &model);
                if let Some(action) = self.global_refused_from_cache(rule, &key, &model, cost) {
                    return action;
                }
                global_charge = Some((idx, key));
            } else {
                match self.charge_local(cfg, idx, &model, cost, now) {
                    Ok(w) => wait_ms = w,
                    Err(action) => return action,
                }
            }
        }
        if let Err(action) = self.admit_breakers(cfg, &model, now) {
            return action;
        }
        self.est_tokens = (prompt, output);
        if let Some((idx, key)) = global_charge {
            return self.start_global(cfg, idx, key, cost);
        }
        self.finish_admission(cfg, wait_ms, true)
    }

    /// Charges rule `idx`'s bucket in this Envoy's shared data: `Ok(wait_ms)` (admitted, held that
    /// long first when shaped), or the action of the reply already sent.
    fn charge_local(
        &mut self,
        cfg: &Config,
        idx: usize,
        model: &str,
        cost: u64,
        now: u64,
    ) -> Result<u64, Action> {
        let m = metrics::get();
        let Some(rule) = cfg.rules.get(idx) else {
            return Ok(0);
        };
        let store = HostStore;
        let (key, info) = VM.with(|vm| {
            let mut vm = vm.borrow_mut();
            admission::bucket_key(
                &store,
                cfg,
                &mut vm.known_keys,
                KNOWN_KEYS_CACHE,
                rule,
                &self.tenant,
                model,
            )
        });
        if info.overflow {
            metrics::inc(m.tenant_overflow);
        }
        let seen = self
            .prechecked
            .take()
            .and_then(|(k, seen)| (k == key).then_some(seen));
        let (decision, stats) = admission::charge(&store, cfg, rule, &key, cost, now, seen);
        if stats.corrupt {
            metrics::inc(m.state_corrupt);
            log(
                Level::Warn,
                &format!("corrupt bucket state at {key}: reset to full"),
            );
        }
        match decision {
            Decision::Admit {
                snapshot,
                cost,
                wait_ms,
            } => {
                self.charged = Some((idx, key, cost));
                self.snapshot = Some(snapshot);
                Ok(wait_ms)
            }
            Decision::Reject { reply, reason } => Err(self.reject(&reply, reason, model)),
            Decision::StoreFailed(e) => {
                let id = match e {
                    crate::store::UpdateError::CasExhausted => m.cas_exhausted,
                    crate::store::UpdateError::Host => m.store_errors,
                };
                metrics::inc(id);
                log(
                    Level::Warn,
                    &format!("bucket update failed at {key}: {e:?}; applying on_store_error"),
                );
                if cfg.on_store_error == StoreFailure::Deny {
                    self.audit("deny_store_error", model);
                    return Err(self.send(&limiter_unavailable(), "tokengate_store_error"));
                }
                Ok(0)
            }
        }
    }

    /// Every bucket admitted the request: hold it if shaped, then the quota, then let it go. `sync` as
    /// for [`Http::proceed`].
    fn finish_admission(&mut self, cfg: &Config, wait_ms: u64, sync: bool) -> Action {
        if wait_ms > 0 {
            metrics::inc(metrics::get().requests_shaped);
            self.shaped_ms = wait_ms;
            self.hold_until = Some(now_ns().saturating_add(wait_ms.saturating_mul(1_000_000)));
        }
        if let Some(q) = &cfg.quota {
            let (prompt, output) = self.est_tokens;
            return self.start_reserve(cfg, q, prompt, output, sync);
        }
        self.proceed(sync)
    }

    /// The 429 for a global bucket that Redis refused moments ago and that cannot hold `cost` tokens
    /// (or one request) yet, from the refusal cache in shared data (see [`crate::global`]); None = ask
    /// Redis. `cost` is 1 in the headers phase (the estimate is not known there).
    fn global_refused_from_cache(
        &mut self,
        rule: &Rule,
        key: &str,
        model: &str,
        cost: u64,
    ) -> Option<Action> {
        let (bytes, _) = HostStore.get(&global::seen_slot(key)).ok()??;
        let state = global::Seen::for_key(&bytes, key)?;
        let (reply, reason) = admission::refusal_for(&state, rule, cost, now_ns())?;
        metrics::inc(metrics::get().global_rejected_cached);
        Some(self.reject(&reply, reason, model))
    }

    /// Starts the global bucket charge of `cost` on `key` (rule `idx`).
    fn start_global(&mut self, cfg: &Config, idx: usize, key: String, cost: u64) -> Action {
        let Some(g) = cfg.global.as_ref() else {
            return self.finish_admission(cfg, 0, true);
        };
        let probe = match global_host::shim_admit(g, cfg.cas_max_retries) {
            Ok(probe) => probe,
            Err(_) => {
                return self.global_unavailable(cfg, idx, cost, "the shim's circuit is open", true)
            }
        };
        self.global_req = Some(GReq {
            rule: idx,
            key,
            cost,
            used_eval: false,
            shim_probe: probe,
        });
        self.dispatch_global(cfg, global_host::script_call(), true)
    }

    fn dispatch_global(&mut self, cfg: &Config, call: ScriptCall, sync: bool) -> Action {
        let (Some(g), Some(gr)) = (cfg.global.as_ref(), self.global_req.as_mut()) else {
            return Action::Continue;
        };
        let Some(rule) = cfg.rules.get(gr.rule) else {
            return Action::Continue;
        };
        gr.used_eval = call == ScriptCall::Eval;
        let body = global::charge_request(&gr.key, &rule.params, gr.cost, rule.max_wait_ms, call);
        match global_host::dispatch(g, &body) {
            Ok(_) => {
                self.callout = Callout::Global;
                Action::Pause
            }
            Err(s) => {
                let (probe, idx, cost) = (gr.shim_probe, gr.rule, gr.cost);
                global_host::shim_record(g, false, probe, cfg.cas_max_retries);
                self.global_unavailable(
                    cfg,
                    idx,
                    cost,
                    &format!("callout refused by host (status {s})"),
                    sync,
                )
            }
        }
    }

    /// The global charge answered.
    fn on_global_response(&mut self, body_size: usize) {
        let Some(cfg) = self.cfg.clone() else {
            return;
        };
        let Some(g) = cfg.global.as_ref() else {
            return;
        };
        let Some((idx, used_eval, probe, cost)) = self
            .global_req
            .as_ref()
            .map(|gr| (gr.rule, gr.used_eval, gr.shim_probe, gr.cost))
        else {
            return;
        };
        let Some(rule) = cfg.rules.get(idx) else {
            return;
        };
        match global_host::response(body_size) {
            Err(ShimError::NoScript) if !used_eval => {
                global_host::set_script_loaded(false);
                self.dispatch_global(&cfg, ScriptCall::Eval, false);
            }
            Err(e) => {
                global_host::shim_record(g, false, probe, cfg.cas_max_retries);
                self.global_unavailable(&cfg, idx, cost, &e.to_string(), false);
            }
            Ok(r) => {
                global_host::shim_record(g, true, probe, cfg.cas_max_retries);
                if used_eval {
                    global_host::set_script_loaded(true);
                }
                metrics::inc(metrics::get().global_charged);
                if matches!(
                    r.verdict,
                    Verdict::LimitTokens { .. } | Verdict::LimitRequests { .. }
                ) {
                    if let Some(gr) = &self.global_req {
                        let seen = global::seen_after_refusal(&gr.key, &r, now_ns());
                        let _ = HostStore.set(&global::seen_slot(&gr.key), &seen.encode(), 0);
                    }
                }
                let snap = r.state.snapshot(&rule.params);
                let model = self.model.clone();
                match admission::decision(r.verdict, snap, rule, cost) {
                    Decision::Admit {
                        snapshot, wait_ms, ..
                    } => {
                        if let Some(gr) = self.global_req.take() {
                            self.charged_global = Some((gr.rule, gr.key, gr.cost));
                        }
                        self.snapshot = Some(snapshot);
                        self.finish_admission(&cfg, wait_ms, false);
                    }
                    Decision::Reject { reply, reason } => {
                        // Nothing was charged; give back the breaker probe permits.
                        self.refund(&cfg, now_ns());
                        self.reject(&reply, reason, &model);
                    }
                    Decision::StoreFailed(_) => {
                        self.global_unavailable(&cfg, idx, cost, "unexpected verdict", false);
                    }
                }
            }
        }
    }

    /// Redis could not charge the global bucket: apply `global_buckets.on_failure`.
    fn global_unavailable(
        &mut self,
        cfg: &Config,
        idx: usize,
        cost: u64,
        why: &str,
        sync: bool,
    ) -> Action {
        let m = metrics::get();
        metrics::inc(m.global_shim_errors);
        self.global_req = None;
        let policy = cfg
            .global
            .as_ref()
            .map_or(GlobalFailure::Local, |g| g.on_failure);
        let model = self.model.clone();
        match policy {
            GlobalFailure::Local => {
                metrics::inc(m.global_fallback_local);
                log(
                    Level::Warn,
                    &format!("global bucket unavailable ({why}); charging this Envoy's bucket (on_failure=local)"),
                );
                match self.charge_local(cfg, idx, &model, cost, now_ns()) {
                    Ok(wait_ms) => self.finish_admission(cfg, wait_ms, sync),
                    Err(action) => {
                        self.refund(cfg, now_ns());
                        action
                    }
                }
            }
            GlobalFailure::Open => {
                metrics::inc(m.global_fail_open);
                log(
                    Level::Warn,
                    &format!("global bucket unavailable ({why}); admitting (on_failure=open)"),
                );
                self.finish_admission(cfg, 0, sync)
            }
            GlobalFailure::Closed => {
                metrics::inc(m.global_fail_closed);
                log(
                    Level::Warn,
                    &format!("global bucket unavailable ({why}); rejecting (on_failure=closed)"),
                );
                self.refund(cfg, now_ns());
                self.audit("global_unavailable", &model);
                self.send(&limiter_unavailable(), "tokengate_global_unavailable")
            }
        }
    }

    /// Lets the request go on (or be held until its shaping release time). `sync` = called from a
    /// request callback (return the action) rather than from a callout response (resume).
    fn proceed(&mut self, sync: bool) -> Action {
        let m = metrics::get();
        self.phase = Phase::Admitted;
        metrics::inc(m.requests_admitted);
        let model = self.model.clone();
        if let Some(due) = self.hold_until.filter(|d| *d > now_ns()) {
            self.audit("shaped", &model);
            let id = self.id;
            VM.with(|vm| vm.borrow_mut().held.push((id, due)));
            return Action::Pause;
        }
        self.audit(
            if self.quota.as_ref().is_some_and(|q| q.fail_open) {
                "admit_quota_fail_open"
            } else {
                "admit"
            },
            &model,
        );
        if sync {
            Action::Continue
        } else {
            if abi::resume_request().is_err() {
                log(
                    Level::Warn,
                    "cannot resume the request after the quota check",
                );
            }
            Action::Pause
        }
    }

    /// Starts the quota reservation callout.
    fn start_reserve(
        &mut self,
        cfg: &Config,
        q: &QuotaSettings,
        prompt: u64,
        output: u64,
        sync: bool,
    ) -> Action {
        let now_s = unix_s(q);
        let tq = q.tenant(&self.tenant);
        let w = q.weights(&self.model);
        let model = (!self.model.is_empty()).then(|| self.model.clone());
        let default_model_limit = model
            .as_deref()
            .and_then(|m| tq.model_limits.iter().find(|(x, _)| x == m))
            .map(|(_, l)| *l)
            .unwrap_or(0);
        let args = ReserveArgs {
            tenant: self.tenant.clone(),
            model,
            month: quota::month_label(now_s, q.month_offset_minutes),
            idempotency_key: self.idem_key.clone(),
            body_fingerprint: self.body_fingerprint,
            request_id: self.request_id.clone(),
            prompt_cost: quota::weighted(prompt, 0, 0, 0, &w),
            output_cost: quota::weighted(0, output, 0, 0, &w),
            default_limit: tq.monthly_limit,
            default_model_limit,
            expire_at_unix: quota::month_end_unix(now_s, q.month_offset_minutes)
                .saturating_add(i64::try_from(q.grace_seconds).unwrap_or(0)),
            idem_window_s: q.idempotency_window_s,
            clamp_output: tq.clamp_output,
            min_output_cost: quota::min_clamped_output_cost(&w, self.est_choices),
        };
        let reserved = Reserved {
            prompt_cost: args.prompt_cost,
            output_cost: args.output_cost,
            weights: w,
        };
        self.quota = Some(QReq {
            keys: args.keys(),
            expire_at: args.expire_at_unix,
            args,
            reserved,
            limit: tq.monthly_limit,
            remaining: None,
            reset_s: quota::seconds_to_reset(now_s, q.month_offset_minutes),
            choices: self.est_choices,
            duplicate: false,
            fail_open: false,
            answered: false,
            settled: false,
            used_eval: false,
            shim_probe: false,
            actual: None,
            source: None,
            uncertain: false,
        });
        match quota_host::shim_admit(q, cfg.cas_max_retries) {
            Err(_) => {
                return self.quota_unavailable(cfg, q, "the quota shim's circuit is open", sync)
            }
            Ok(probe) => {
                if let Some(qr) = self.quota.as_mut() {
                    qr.shim_probe = probe;
                }
            }
        }
        self.dispatch_reserve(cfg, q, quota_host::script_call(), sync)
    }

    fn dispatch_reserve(
        &mut self,
        cfg: &Config,
        q: &QuotaSettings,
        call: ScriptCall,
        sync: bool,
    ) -> Action {
        let Some(qr) = self.quota.as_mut() else {
            return Action::Continue;
        };
        qr.used_eval = call == ScriptCall::Eval;
        let body = quota::reserve_request(&qr.args, call);
        match quota_host::dispatch(q, &body) {
            Ok(_) => {
                self.callout = Callout::Reserve;
                Action::Pause
            }
            Err(s) => {
                let probe = qr.shim_probe;
                quota_host::shim_record(q, false, probe, cfg.cas_max_retries);
                self.quota_unavailable(
                    cfg,
                    q,
                    &format!("callout refused by host (status {s})"),
                    sync,
                )
            }
        }
    }

    /// The shim could not answer: apply the tenant's failure policy.
    fn quota_unavailable(
        &mut self,
        cfg: &Config,
        q: &QuotaSettings,
        why: &str,
        sync: bool,
    ) -> Action {
        let m = metrics::get();
        metrics::inc(m.quota_shim_errors);
        match q.tenant(&self.tenant).on_failure {
            QuotaFailure::Open => {
                metrics::inc(m.quota_fail_open);
                log(
                    Level::Warn,
                    &format!("quota check failed ({why}); admitting (on_failure=open)"),
                );
                if let Some(qr) = self.quota.as_mut() {
                    qr.fail_open = true;
                    qr.answered = true;
                }
                self.proceed(sync)
            }
            QuotaFailure::Closed => {
                metrics::inc(m.quota_fail_closed);
                log(
                    Level::Warn,
                    &format!("quota check failed ({why}); rejecting (on_failure=closed)"),
                );
                self.refund(cfg, now_ns());
                let model = self.model.clone();
                self.audit("quota_unavailable", &model);
                self.send(
                    &reply::error(
                        503,
                        "server_error",
                        "quota_unavailable",
                        "The quota service is unavailable; retry shortly.",
                    ),
                    "tokengate_quota_unavailable",
                )
            }
        }
    }

    /// A reservation answered.
    fn on_reserve_response(&mut self, body_size: usize) {
        let Some(cfg) = self.cfg.clone() else {
            return;
        };
        let Some(q) = cfg.quota.as_ref() else {
            return;
        };
        let (status, body) = quota_host::call_response(body_size);
        let (used_eval, probe) = match self.quota.as_ref() {
            Some(qr) => (qr.used_eval, qr.shim_probe),
            None => return,
        };
        let m = metrics::get();
        match quota::parse_reserve_reply(status, &body) {
            Err(ShimError::NoScript) if !used_eval => {
                quota_host::set_script_loaded(false);
                self.dispatch_reserve(&cfg, q, ScriptCall::Eval, false);
            }
            Err(e) => {
                quota_host::shim_record(q, false, probe, cfg.cas_max_retries);
                if matches!(e, ShimError::Unavailable | ShimError::Garbage(_)) {
                    // Webdis may have run the script after all (a timeout): reconcile at the end.
                    if let Some(qr) = self.quota.as_mut() {
                        qr.uncertain = true;
                    }
                }
                self.quota_unavailable(&cfg, q, &e.to_string(), false);
            }
            Ok(r) => {
                quota_host::shim_record(q, true, probe, cfg.cas_max_retries);
                if used_eval {
                    quota_host::set_script_loaded(true);
                }
                let Some(qr) = self.quota.as_mut() else {
                    return;
                };
                qr.answered = true;
                // The limit that binds (tenant or tenant × model) and its remaining, as one pair.
                let (limit, remaining) = r.binding();
                qr.limit = limit;
                qr.remaining = Some(remaining);
                if r.allowed {
                    qr.duplicate = r.duplicate;
                    if r.duplicate {
                        metrics::inc(m.quota_duplicates);
                    } else {
                        metrics::inc(m.quota_reserved);
                        metrics::add(
                            m.quota_reserved_tokens,
                            qr.reserved.prompt_cost.saturating_add(r.granted_output),
                        );
                    }
                    // A duplicate (same body) gets the first request's clamp, never more output.
                    if r.reason == Reason::Clamped {
                        qr.reserved.output_cost = r.granted_output;
                        let tokens = quota::clamped_output_tokens(
                            r.granted_output,
                            &qr.reserved.weights,
                            qr.choices,
                        );
                        self.clamp_body(tokens);
                    }
                    self.proceed(false);
                } else {
                    // Nothing was reserved: nothing to settle.
                    qr.settled = true;
                    let (limit, reset_s) = (qr.limit, qr.reset_s);
                    metrics::inc(m.quota_rejected);
                    self.refund(&cfg, now_ns());
                    if r.reason == Reason::TenantLimit && r.remaining() < q.exhausted_below {
                        self.mark_exhausted(&cfg, q, limit, r.remaining());
                    }
                    let what = if r.reason == Reason::ModelLimit {
                        format!("for model '{}'", self.model)
                    } else {
                        "for this tenant".to_string()
                    };
                    let reply = quota_reply(limit, remaining, reset_s, &what);
                    let model = self.model.clone();
                    self.audit("quota_exceeded", &model);
                    self.send(&reply, "tokengate_quota_exceeded");
                }
            }
        }
    }

    fn clamp_body(&mut self, tokens: u64) {
        let Some(kind) = self.kind else {
            return;
        };
        let edits = Edits {
            clamp_max_output: Some(tokens),
            max_output_field: output_field(kind, &self.body).to_string(),
            ..Edits::default()
        };
        if let Ok(Some(new_body)) = rewrite::rewrite(&self.body, &edits) {
            if abi::set_buffer(Buffer::RequestBody, 0, self.body.len(), &new_body).is_ok() {
                metrics::inc(metrics::get().quota_clamped);
                self.body = new_body;
            }
        }
    }

    /// Remembers in shared data that this tenant is out of quota (bounded keys; see README).
    fn mark_exhausted(
        &mut self,
        cfg: &Config,
        q: &QuotaSettings,
        effective_limit: u64,
        remaining: u64,
    ) {
        let key = ExhaustedMarker::key(&self.tenant);
        let now_s = unix_s(q);
        let ok = VM.with(|vm| {
            let mut vm = vm.borrow_mut();
            admission::claim_slot(
                &HostStore,
                MARKER_COUNTER,
                cfg.max_tenants,
                cfg.cas_max_retries,
                &mut vm.known_keys,
                KNOWN_KEYS_CACHE,
                &key,
            )
        });
        if !ok {
            return;
        }
        let until = quota::month_end_unix(now_s, q.month_offset_minutes)
            .min(now_s.saturating_add(i64::try_from(q.exhausted_recheck_s).unwrap_or(60)));
        let marker = ExhaustedMarker {
            month_end_unix: until,
            limit: effective_limit,
            config_limit: q.tenant(&self.tenant).monthly_limit,
            remaining,
        };
        let _ = HostStore.set(&key, &marker.encode(), 0);
    }

    /// Headers phase: the tenant is known to be exhausted (cached), answer without a callout.
    fn exhausted_cached(&mut self, q: &QuotaSettings) -> Option<Action> {
        let now_s = unix_s(q);
        let key = ExhaustedMarker::key(&self.tenant);
        let (marker, _) = crate::store::peek::<ExhaustedMarker>(&HostStore, &key).ok()?;
        let marker = marker?;
        let tq = q.tenant(&self.tenant);
        if !marker.is_active(now_s) || marker.config_limit != tq.monthly_limit {
            return None;
        }
        metrics::inc(metrics::get().quota_rejected_cached);
        let reply = quota_reply(
            marker.limit,
            marker.remaining,
            quota::seconds_to_reset(now_s, q.month_offset_minutes),
            "for this tenant",
        );
        self.audit("quota_exceeded_cached", "");
        Some(self.send(&reply, "tokengate_quota_exceeded"))
    }

    /// Settles the reservation once the response ended (or the stream went away).
    fn settle(&mut self, ending_complete: bool) {
        if self.quota.as_ref().is_none_or(|q| q.settled) {
            return;
        }
        let Some(cfg) = self.cfg.clone() else {
            return;
        };
        let status = self.resp.status;
        let (usage, completed, content_bytes) = match &self.resp.stream {
            Some(sc) => (sc.usage(), sc.completed(), sc.content_bytes()),
            // A JSON answer cut part way: its output is estimated from the bytes that arrived
            // (structure included, which errs towards charging; capped at the reservation).
            None => (
                usage::from_json(&self.resp.json),
                ending_complete,
                self.resp.json.len() as u64,
            ),
        };
        let Some(qr) = self.quota.as_mut() else {
            return;
        };
        if qr.settled || qr.duplicate {
            return;
        }
        // No response headers at all (status 0) means the client went away before any answer: the
        // provider may have billed the prompt, so that is charged (a cut with nothing streamed).
        // Envoy's own failure replies (503/504 …) and provider errors are not served: refunded.
        let ending = if status == 0 && self.phase == Phase::Admitted {
            Ending::Cut {
                usage: None,
                content_bytes: 0,
            }
        } else if !(200..300).contains(&status) {
            Ending::NotServed
        } else if completed && ending_complete {
            Ending::Completed { usage }
        } else {
            Ending::Cut {
                usage,
                content_bytes,
            }
        };
        if qr.uncertain {
            // Charge what the request really cost, whatever the lost reservation did.
            qr.settled = true;
            let st = accounting::settle(&qr.reserved, ending);
            qr.actual = Some(st.actual);
            qr.source = Some(st.source);
            quota_host::enqueue(Job::Reconcile(ReconcileArgs {
                keys: qr.keys.clone(),
                actual: st.actual,
                expire_at_unix: qr.expire_at,
                marker_ttl_s: SETTLED_MARKER_TTL_S,
            }));
            let (model, decision) = (self.model.clone(), self.decision);
            self.audit(decision, &model);
            return;
        }
        if !qr.answered || qr.fail_open {
            return;
        }
        qr.settled = true;
        let st = accounting::settle(&qr.reserved, ending);
        qr.actual = Some(st.actual);
        qr.source = Some(st.source);
        // Nothing charged in the end: the idempotency record (if this request wrote it) goes too.
        let release = st.actual == 0 && qr.keys.has_idem;
        if st.delta != 0 || release {
            quota_host::enqueue(Job::Settle(SettleArgs {
                keys: qr.keys.clone(),
                delta: st.delta,
                expire_at_unix: qr.expire_at,
                marker_ttl_s: SETTLED_MARKER_TTL_S,
                release_idempotency: release,
            }));
        } else {
            metrics::inc(metrics::get().quota_settled);
        }
        let _ = cfg;
        let (model, decision) = (self.model.clone(), self.decision);
        self.audit(decision, &model);
    }
}

impl Drop for Http {
    fn drop(&mut self) {
        if self.shaped_ms > 0 {
            let id = self.id;
            VM.with(|vm| {
                if let Ok(mut vm) = vm.try_borrow_mut() {
                    vm.held.retain(|(h, _)| *h != id);
                }
            });
        }
    }
}

impl Context for Http {
    fn on_http_call_response(
        &mut self,
        _token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        match std::mem::replace(&mut self.callout, Callout::None) {
            Callout::Global => self.on_global_response(body_size),
            Callout::Reserve | Callout::None => self.on_reserve_response(body_size),
        }
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(cfg) = self.cfg.clone() else {
            return Action::Continue;
        };
        let m = metrics::get();
        // One host call for every header this request needs (pseudo-headers included).
        let headers = abi::HeaderBlob::get(Map::RequestHeaders);
        let h = |name: &str| headers.find(name);
        self.kind = match h(":method") {
            // Trailing slashes do not hide an LLM path (`/v1/chat/completions/` is metered too).
            Some("POST") => {
                let path = h(":path").unwrap_or_default();
                // Query, fragment and `;` parameters are not part of the endpoint's name, and
                // neither is case (an upstream that ignores it must not serve unmetered calls).
                let path = path.split(['?', '#']).next().unwrap_or(path);
                if path.bytes().any(|b| b == b';' || b.is_ascii_uppercase()) {
                    // `;` parameters of any segment dropped (`/v1/chat;a=b/completions`), case folded.
                    let clean: Vec<String> = path
                        .split('/')
                        .map(|seg| seg.split(';').next().unwrap_or(seg).to_ascii_lowercase())
                        .collect();
                    ApiKind::from_path(clean.join("/").trim_end_matches('/'))
                } else {
                    ApiKind::from_path(path.trim_end_matches('/'))
                }
            }
            _ => None,
        };
        if let Some(b) = &cfg.breaker {
            // Only the filter may steer requests to a fallback cluster, on every path and method
            // (a client-sent value would pick the fallback route for requests the filter passes).
            if h(&b.route_header).is_some() {
                let _ = abi::remove_header(Map::RequestHeaders, &b.route_header);
            }
        }
        if self.kind.is_none() {
            metrics::inc(m.requests_passthrough);
            return Action::Continue;
        }
        self.phase = Phase::Metering;
        if cfg.reads_responses && h("accept-encoding").is_some() {
            // The filter reads the response (usage for settlements and refunds, the end of SSE
            // streams for the breaker): ask the provider for it uncompressed. A compressor filter
            // placed before tokengate still compresses for the client.
            let _ = abi::remove_header(Map::RequestHeaders, "accept-encoding");
        }

        let header_tenant = cfg.tenant_header.as_deref().and_then(h);
        let key = identity::api_key(h("authorization"), h("x-api-key"));
        match identity::resolve_with(
            header_tenant,
            key,
            cfg.api_key_tenants,
            cfg.default_tenant.as_deref(),
            |k| VM.with(|vm| vm.borrow_mut().key_tenants.tenant(k)),
        ) {
            Some((t, _)) => self.tenant = t,
            None => {
                metrics::inc(m.requests_rejected_no_tenant);
                self.audit("no_tenant", "");
                return self.send(
                    &reply::error(
                        401,
                        "authentication_error",
                        "missing_tenant",
                        "No tenant could be determined for this request: send the tenant header or an API key.",
                    ),
                    "tokengate_no_tenant",
                );
            }
        }
        self.model_hint = cfg
            .model_header
            .as_deref()
            .and_then(h)
            .filter(|s| !s.is_empty())
            .map(str::to_string);

        if let Some(len) = h("content-length").and_then(|v| v.trim().parse::<u64>().ok()) {
            if len > cfg.max_body_bytes as u64 {
                return self.too_large(&cfg);
            }
        }

        if let Some(q) = &cfg.quota {
            if let Some(action) = self.exhausted_cached(q) {
                return action;
            }
            // Names this request's settlement (retries reuse it). Clients can send `x-request-id`, so
            // it is made unique with the context id and the time.
            let rid = h("x-request-id").unwrap_or_default();
            self.request_id = format!("{}-{}-{}", rid.get(..64).unwrap_or(rid), self.id, now_ns());
            self.idem_key = h("idempotency-key")
                .or_else(|| h("x-idempotency-key"))
                .filter(|k| !k.trim().is_empty())
                .map(str::to_string);
            // The body may be rewritten (include_usage, max_tokens clamp): let Envoy send it chunked.
            if h("content-length").is_some() {
                let _ = abi::remove_header(Map::RequestHeaders, "content-length");
            }
        }
        if let Some(b) = &cfg.breaker {
            if !b.model_fallbacks.is_empty() && cfg.quota.is_none() && h("content-length").is_some()
            {
                // The body may be rewritten (model fallback): let Envoy send it chunked.
                let _ = abi::remove_header(Map::RequestHeaders, "content-length");
            }
            if b.keys.cluster {
                let cluster = abi::get_property(&["xds", "cluster_name"])
                    .ok()
                    .flatten()
                    .and_then(|v| String::from_utf8(v).ok())
                    .filter(|c| !c.is_empty());
                if let Some(cluster) = cluster {
                    let next = |c: &str| {
                        b.cluster_fallback(c)
                            .map(|f| (f.to.clone(), Some(f.route.clone())))
                    };
                    let now = now_ns();
                    match failover::peek_chain(&HostStore, b, "cluster", &cluster, &next, now) {
                        Ok(choice) => {
                            if choice.closed {
                                self.cluster_closed_at = Some(now);
                            }
                            if let (Some(from), Some(route)) = (&choice.from, &choice.route) {
                                // Envoy re-picks the route when a header changes in this phase.
                                if abi::set_header(Map::RequestHeaders, &b.route_header, route)
                                    .is_ok()
                                {
                                    metrics::inc(m.breaker_fallbacks);
                                    self.fallbacks.push(format!("{from} -> {}", choice.target));
                                    self.cluster = Some(choice.target);
                                } else {
                                    return self.circuit_open("cluster", from, 1000);
                                }
                            } else {
                                self.cluster = Some(choice.target);
                            }
                        }
                        Err(reset) => return self.circuit_open("cluster", &cluster, reset),
                    }
                }
            }
        }

        // Headers-phase rejection when the bucket is known without the body.
        let rule_idx = match self.model_hint.as_deref() {
            Some(model) => cfg.rule_for(&self.tenant, model),
            None => cfg.rule_without_model(&self.tenant),
        };
        if let Some(rule) = rule_idx
            .and_then(|i| cfg.rules.get(i))
            .filter(|r| r.global && cfg.global.is_some())
        {
            // A global rule's bucket is in Redis: only its refusal cache is read here.
            let model = self.model_hint.clone().unwrap_or_default();
            let key = global::key(rule, &self.tenant, &model);
            if let Some(action) = self.global_refused_from_cache(rule, &key, &model, 1) {
                return action;
            }
        } else if let Some(rule) = rule_idx.and_then(|i| cfg.rules.get(i)) {
            let model = self.model_hint.clone().unwrap_or_default();
            let key = admission::plain_key(rule, &self.tenant, &model);
            let mut seen = None;
            match admission::precheck(&HostStore, rule, &key, now_ns(), &mut seen) {
                Ok(Some((r, reason))) => return self.reject(&r, reason, &model),
                Ok(None) => {
                    self.prechecked = seen.map(|seen| (key, seen));
                }
                Err(corrupt) => {
                    // The body phase re-reads and repairs; nothing is decided here.
                    if corrupt {
                        metrics::inc(m.state_corrupt);
                    } else {
                        metrics::inc(m.store_errors);
                    }
                }
            }
        }
        if end_of_stream {
            return self.decide(&cfg, &[]);
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.phase != Phase::Metering {
            return Action::Continue;
        }
        let Some(cfg) = self.cfg.clone() else {
            return Action::Continue;
        };
        if body_size > cfg.max_body_bytes {
            return self.too_large(&cfg);
        }
        if !end_of_stream {
            return Action::Pause;
        }
        match abi::get_buffer(Buffer::RequestBody, 0, body_size) {
            Ok(body) => self.decide(&cfg, &body),
            Err(s) => {
                log(
                    Level::Warn,
                    &format!("cannot read the request body (status {s})"),
                );
                self.decide(&cfg, &[])
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if self.phase != Phase::Admitted {
            return Action::Continue;
        }
        self.resp.ended = end_of_stream;
        let refunding = self
            .charged
            .as_ref()
            .or(self.charged_global.as_ref())
            .and_then(|(i, _, _)| self.cfg.as_ref().and_then(|c| c.rules.get(*i)))
            .is_some_and(|r| r.refund_unused);
        let settling = self
            .quota
            .as_ref()
            .is_some_and(|q| !q.duplicate && ((q.answered && !q.fail_open) || q.uncertain));
        let inspect = !self.breakers.is_empty() || settling || refunding;
        if inspect || self.quota.is_some() {
            // Every response header this request looks at, in one host call (one data-returning call
            // costs about as much as a header write; a read per header cost 10 k instructions each).
            let headers = abi::HeaderBlob::get(Map::ResponseHeaders);
            self.resp.status = headers
                .find(":status")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            // Retry hints matter only on failures.
            if !self.breakers.is_empty() && (self.resp.status == 429 || self.resp.status >= 500) {
                self.resp.retry_after = headers.find("retry-after").map(str::to_string);
                for h in [
                    "x-ratelimit-reset-requests",
                    "x-ratelimit-reset-tokens",
                    "anthropic-ratelimit-requests-reset",
                ] {
                    if let Some(v) = headers.find(h) {
                        self.resp.reset_headers.push(v.to_string());
                    }
                }
                if let Some(ms) = headers.find("retry-after-ms") {
                    self.resp.reset_headers.push(format!("{}ms", ms.trim()));
                }
            }
            // A body the provider compressed anyway (it ignored the removed accept-encoding) cannot be
            // read: its usage is unknown (the estimate stands) and an SSE stream's end is not judged.
            let encoded = headers.find("content-encoding").is_some_and(|e| {
                !e.trim().is_empty() && !e.trim().eq_ignore_ascii_case("identity")
            });
            if inspect && !encoded {
                let sse = headers
                    .find("content-type")
                    .is_some_and(|c| c.contains("text/event-stream"));
                if sse {
                    self.resp.stream = Some(SseScanner::new(self.injected_usage));
                } else {
                    self.resp.collect =
                        (settling || refunding) && (200..300).contains(&self.resp.status);
                }
            }
        }
        if let Some(qr) = &self.quota {
            if let Some(remaining) = qr.remaining {
                for (k, v) in quota_headers(qr.limit, remaining, qr.reset_s) {
                    let _ = abi::set_header(Map::ResponseHeaders, &k, &v);
                }
            }
        }
        if self.resp.stream.is_some() && self.injected_usage {
            // The body is rewritten chunk by chunk (the usage chunk removed).
            let _ = abi::remove_header(Map::ResponseHeaders, "content-length");
        }
        if !self.fallbacks.is_empty() {
            // Every hop in one header, in order: `provider -> provider_fallback, gpt-4.1 -> deepseek`.
            let _ = abi::set_header(
                Map::ResponseHeaders,
                "x-tokengate-fallback",
                &self.fallbacks.join(", "),
            );
        }
        if let Some(snap) = &self.snapshot {
            reply::each_ratelimit_header(snap, |k, v| {
                let _ = abi::set_header(Map::ResponseHeaders, k, v);
            });
        }
        if let Some(cost) = self.cost {
            let _ = abi::set_header(
                Map::ResponseHeaders,
                "x-tokengate-estimated-tokens",
                reply::Dec::int(cost).as_str(),
            );
        }
        if self.shaped_ms > 0 {
            let _ = abi::set_header(
                Map::ResponseHeaders,
                "x-tokengate-shaped-ms",
                reply::Dec::int(self.shaped_ms).as_str(),
            );
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.phase != Phase::Admitted {
            return Action::Continue;
        }
        self.resp.ended |= end_of_stream;
        if let Some(sc) = self.resp.stream.as_mut() {
            if body_size > 0 {
                if let Ok(chunk) = abi::get_buffer(Buffer::ResponseBody, 0, body_size) {
                    if let Forward::Replace(bytes) = sc.feed(&chunk).forward {
                        let _ = abi::set_buffer(Buffer::ResponseBody, 0, body_size, &bytes);
                    }
                }
            }
            if end_of_stream {
                let rest = sc.finish();
                if !rest.is_empty() {
                    // A start at or past the buffer's end appends.
                    let _ = abi::set_buffer(Buffer::ResponseBody, u32::MAX as usize, 0, &rest);
                }
            }
        } else if self.resp.collect
            && body_size > 0
            && self.resp.json.len().saturating_add(body_size) <= MAX_JSON_RESPONSE
        {
            if let Ok(chunk) = abi::get_buffer(Buffer::ResponseBody, 0, body_size) {
                self.resp.json.extend_from_slice(&chunk);
            }
        }
        if end_of_stream {
            self.settle(true);
            self.refund_unused();
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.record_breakers();
        self.settle(false);
        self.refund_unused();
    }
}

impl Http {
    /// `refund_unused` rules: gives back to the bucket what the provider's usage shows was not used
    /// (everything when the provider did not serve the request). Without a response (client gone) or
    /// without reported usage the estimate stands.
    fn refund_unused(&mut self) {
        if self.resp.refunded || self.phase != Phase::Admitted {
            return;
        }
        let Some(cfg) = self.cfg.clone() else {
            return;
        };
        let (charged, global) = match (&self.charged, &self.charged_global) {
            (Some(c), _) => (c.clone(), false),
            (None, Some(c)) => (c.clone(), true),
            (None, None) => return,
        };
        let (idx, key, cost) = charged;
        let Some(rule) = cfg.rules.get(idx).filter(|r| r.refund_unused) else {
            return;
        };
        self.resp.refunded = true;
        let status = self.resp.status;
        // Positive: tokens given back; negative: the provider's usage was above the charge and the
        // difference is taken too, so the bucket accounts for what was really spent.
        let amount: i64 = if status == 0 {
            0
        } else if !(200..300).contains(&status) {
            i64::try_from(cost).unwrap_or(i64::MAX)
        } else {
            let usage = match &self.resp.stream {
                Some(sc) => sc.usage(),
                None => usage::from_json(&self.resp.json),
            };
            usage.map_or(0, |u| {
                let used = u.prompt_tokens.saturating_add(u.completion_tokens);
                let diff = i128::from(cost) - i128::from(used);
                i64::try_from(diff).unwrap_or(if diff < 0 { i64::MIN } else { i64::MAX })
            })
        };
        if amount == 0 {
            return;
        }
        let m = metrics::get();
        if global {
            // Sent by the root's tick (counted in tokengate_global_tokens_credited / _debited when
            // Redis takes it).
            let span = i64::try_from((rule.params.burst * 2.0).ceil() as u64).unwrap_or(i64::MAX);
            global_host::enqueue_credit(key, idx, amount.clamp(-span, span));
        } else if amount > 0 {
            let amount = amount.unsigned_abs();
            if admission::credit(&HostStore, &cfg, rule, &key, amount, now_ns()).is_ok() {
                metrics::add(m.tokens_credited, amount);
            }
        } else {
            let amount = amount.unsigned_abs();
            if let Ok(taken) = admission::debit(&HostStore, &cfg, rule, &key, amount, now_ns()) {
                // What the bucket really lost (its debt stops one burst deep).
                metrics::add(m.tokens_debited, taken);
            }
        }
    }
}

impl Http {
    /// Reports this request's outcome to the breakers that admitted it.
    fn record_breakers(&mut self) {
        if self.breakers.is_empty() {
            return;
        }
        let Some(cfg) = self.cfg.clone() else {
            return;
        };
        let Some(b) = &cfg.breaker else {
            return;
        };
        let status = if self.resp.status != 0 {
            self.resp.status
        } else {
            abi::get_property(&["response", "code"])
                .ok()
                .flatten()
                .and_then(|v| crate::store::read_u64(&v, 0))
                .map(|c| u32::try_from(c).unwrap_or(0))
                .unwrap_or(0)
        };
        // A 2xx/3xx that reached its end of stream came whole from the upstream ("via_upstream"): its
        // details cannot change the outcome, so the property is not read.
        let details = if self.resp.ended && (200..400).contains(&status) {
            None
        } else {
            abi::get_property(&["response", "code_details"])
                .ok()
                .flatten()
                .and_then(|v| String::from_utf8(v).ok())
        };
        let completed = if b.count_incomplete_streams {
            self.resp.stream.as_ref().map(SseScanner::completed)
        } else {
            None
        };
        if !b.count_incomplete_streams
            && self.resp.stream.is_some()
            && breaker::cut_after_response_started(status, details.as_deref())
        {
            // A stream the upstream cut after it had started: that is what the option turns off
            // (the reset would otherwise count as one).
            return;
        }
        let Some(outcome) = breaker::classify(status, details.as_deref(), completed, &b.policy)
        else {
            return;
        };
        let resets: Vec<&str> = self.resp.reset_headers.iter().map(String::as_str).collect();
        let outcome = outcome.with_retry_after(breaker::retry_after_ms(
            self.resp.retry_after.as_deref(),
            &resets,
        ));
        let now = now_ns();
        for (key, probe) in std::mem::take(&mut self.breakers) {
            // A plain success changes nothing unless successes are counted for a failure rate:
            // no shared-data access at all (record_shared would return at once too).
            if breaker::record_is_noop(&b.cfg, outcome, probe) {
                continue;
            }
            match breaker::record_shared(
                &HostStore,
                &key,
                &b.cfg,
                outcome,
                probe,
                now,
                cfg.cas_max_retries,
            ) {
                Ok((Some(t), _)) => transition_key(&key, t),
                Ok(_) => {}
                Err(e) => {
                    metrics::inc(metrics::get().store_errors);
                    log(
                        Level::Warn,
                        &format!("breaker update failed at {key}: {e:?}"),
                    );
                }
            }
        }
    }
}

/// Logs and counts a breaker transition.
fn transition(scope: &str, name: &str, t: Transition) {
    transition_key(&breaker::key(scope, name), t);
}

fn transition_key(key: &str, t: Transition) {
    log(
        Level::Info,
        &format!(
            "breaker {key}: {} -> {} ({})",
            t.from.as_str(),
            t.to.as_str(),
            t.reason
        ),
    );
    let m = metrics::get();
    metrics::inc(match t.to {
        breaker::State::Open => m.breaker_opened,
        breaker::State::HalfOpen => m.breaker_half_opened,
        breaker::State::Closed => m.breaker_closed,
    });
    gauges::set_breaker_state(key, failover::gauge(t.to));
}

impl Http {
    fn too_large(&mut self, cfg: &Config) -> Action {
        metrics::inc(metrics::get().requests_rejected_too_large);
        self.audit("too_large", "");
        self.send(
            &reply::error(
                413,
                "invalid_request_error",
                "request_too_large",
                &format!(
                    "The request body exceeds the limit of {} bytes.",
                    cfg.max_body_bytes
                ),
            ),
            "tokengate_too_large",
        )
    }
}
