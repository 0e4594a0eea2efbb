//! The per-request flow (see ENVOY-NOTES for why it is split this way):
//!
//! 1. **Request headers**: non-LLM paths and non-POST methods pass untouched. Resolve the tenant (401 when
//!    none), read the model hint header, refuse a `content-length` over `max_body_bytes` (413), and when the
//!    bucket is already known from headers alone and cannot pass even one token, answer 429 now: the
//!    upstream is never contacted. Otherwise continue (Envoy starts the upstream request).
//! 2. **Request body**: buffer to end of stream (413 past `max_body_bytes`), estimate the cost, charge the
//!    bucket with one CAS update; admit, hold (shaping: released by the root's tick), or answer 429/413/400
//!    (the upstream request already started is dropped by Envoy).
//! 3. **Response headers**: add `x-ratelimit-*`, `x-tokengate-estimated-tokens` (and
//!    `x-tokengate-shaped-ms`).

use super::abi::{self, Buffer, Level, Map};
use super::store::HostStore;
use super::{gauges, log, metrics, now_ns, KNOWN_KEYS_CACHE, VM};
use crate::admission::{self, Decision, RejectReason};
use crate::breaker::{self, Transition};
use crate::failover::{self, Choice};
use crate::bucket::Snapshot;
use crate::config::{Config, InvalidBody, StoreFailure};
use crate::estimate::{self, ApiKind};
use crate::identity;
use crate::reply::{self, LocalReply};
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
    cost: Option<u64>,
    shaped_ms: u64,
    /// Cluster chosen in the headers phase (after any fallback).
    cluster: Option<String>,
    /// Breakers this request was admitted by: (key, holds a probe permit).
    breakers: Vec<(String, bool)>,
    /// `x-tokengate-fallback` values.
    fallbacks: Vec<String>,
    /// Bucket charged, for a refund if a later step rejects: (rule index, key, cost).
    charged: Option<(usize, String, u64)>,
    /// Response facts for the breaker.
    resp: RespFacts,
}

/// What the response said, for the breaker outcome.
#[derive(Default)]
struct RespFacts {
    status: u32,
    retry_after: Option<String>,
    reset_headers: Vec<String>,
    /// An SSE response: tracks whether its final event arrived.
    stream: Option<StreamEnd>,
}

/// Detects the final event of an SSE stream (`data: [DONE]`, Anthropic `message_stop`, Responses
/// `response.completed`) across chunk boundaries.
#[derive(Default)]
struct StreamEnd {
    tail: Vec<u8>,
    done: bool,
}

impl StreamEnd {
    const MARKERS: [&'static [u8]; 3] = [b"data: [DONE]", b"message_stop", b"response.completed"];
    fn feed(&mut self, chunk: &[u8]) {
        if self.done {
            return;
        }
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(chunk);
        if Self::MARKERS
            .iter()
            .any(|m| window.windows(m.len()).any(|w| w == *m))
        {
            self.done = true;
            return;
        }
        let keep = window.len().saturating_sub(24);
        self.tail = window.get(keep..).map(<[u8]>::to_vec).unwrap_or_default();
    }
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
            cost: None,
            shaped_ms: 0,
            cluster: None,
            breakers: Vec::new(),
            fallbacks: Vec::new(),
            charged: None,
            resp: RespFacts::default(),
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
            &format!("The {what} '{name}' is failing and its circuit breaker is open; retry after the reset."),
            reset_s,
        );
        r.headers
            .push(("retry-after".to_string(), reply::retry_after(reset_s).to_string()));
        self.send(&r, "tokengate_circuit_open")
    }

    /// Takes the breaker admissions for the chosen cluster and model (after the bucket admitted).
    /// `Err` = a breaker rejected (lost the last permit to another worker): the reply was sent.
    fn admit_breakers(&mut self, cfg: &Config, model: &str, now: u64) -> Result<(), Action> {
        let Some(b) = &cfg.breaker else {
            return Ok(());
        };
        let mut targets: Vec<(&str, String)> = Vec::new();
        if let Some(c) = self.cluster.clone() {
            targets.push(("cluster", c));
        }
        if b.keys.model && !model.is_empty() {
            targets.push(("model", model.to_string()));
        }
        let store = HostStore;
        for (scope, name) in targets {
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

    /// Gives the bucket charge back (the request was not sent after all).
    fn refund(&mut self, cfg: &Config, now: u64) {
        if let Some((idx, key, cost)) = self.charged.take() {
            if let Some(rule) = cfg.rules.get(idx) {
                if admission::credit(&HostStore, cfg, rule, &key, cost, now).is_ok() {
                    metrics::add(metrics::get().tokens_credited, cost);
                }
            }
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
            log(Level::Warn, &format!("local reply {} refused by host (status {s})", r.status));
            return Action::Continue;
        }
        Action::Pause
    }

    fn audit(&self, decision: &str, model: &str) {
        let rec = format!(
            "tenant={} model={} estimated={} decision={}",
            self.tenant,
            if model.is_empty() { "-" } else { model },
            self.cost.unwrap_or(0),
            decision
        );
        let _ = abi::set_property(&["tokengate_audit"], rec.as_bytes());
    }

    fn reject(&mut self, r: &LocalReply, reason: RejectReason, model: &str) -> Action {
        let m = metrics::get();
        let (id, name) = match reason {
            RejectReason::Tokens => (m.requests_limited_tokens, "limited_tokens"),
            RejectReason::Requests => (m.requests_limited_requests, "limited_requests"),
            RejectReason::TooLarge => (m.requests_rejected_cost_exceeds_burst, "cost_exceeds_burst"),
        };
        metrics::inc(id);
        self.audit(name, model);
        self.send(r, "tokengate_rejected")
    }

    /// The body is complete (or there is none): estimate, charge, decide.
    fn decide(&mut self, cfg: &Config, body: &[u8]) -> Action {
        let m = metrics::get();
        let Some(kind) = self.kind else {
            return Action::Continue;
        };
        let (cost, model) = match estimate::estimate(kind, body, &|model| cfg.output_limits(model)) {
            Ok(e) => (e.total(), e.model.or_else(|| self.model_hint.clone())),
            Err(e) => match cfg.invalid_body {
                InvalidBody::Reject => {
                    metrics::inc(m.requests_rejected_invalid_body);
                    self.audit("invalid_body", "");
                    return self.send(
                        &reply::error(
                            400,
                            "invalid_request_error",
                            "invalid_body",
                            &format!("The request body could not be read as a {} request: {e}", kind.as_str()),
                        ),
                        "tokengate_invalid_body",
                    );
                }
                InvalidBody::Charge(t) => {
                    metrics::inc(m.requests_invalid_body_charged);
                    (t, self.model_hint.clone())
                }
            },
        };
        let mut model = model.unwrap_or_default();
        if let Some(b) = cfg.breaker.as_ref().filter(|b| b.keys.model && !model.is_empty()) {
            let next = |m: &str| b.model_fallback(m).map(|t| (t.to_string(), None));
            match failover::peek_chain(&HostStore, b, "model", &model, &next, now_ns()) {
                Ok(Choice {
                    target,
                    from: Some(from),
                    ..
                }) => match crate::rewrite_model(body, &target) {
                    Some(new_body) => {
                        if abi::set_buffer(Buffer::RequestBody, 0, body.len(), &new_body).is_ok() {
                            metrics::inc(m.breaker_fallbacks);
                            self.fallbacks.push(format!("{from} -> {target}"));
                            model = target;
                        } else {
                            log(Level::Warn, "cannot rewrite the request body for a model fallback");
                            return self.circuit_open("model", &from, 1000);
                        }
                    }
                    None => return self.circuit_open("model", &from, 1000),
                },
                Ok(_) => {}
                Err(reset) => return self.circuit_open("model", &model, reset),
            }
        }
        self.cost = Some(cost);
        metrics::add(m.tokens_estimated, cost);
        let Some(rule) = cfg
            .rule_for(&self.tenant, &model)
            .and_then(|i| cfg.rules.get(i))
        else {
            // No rule applies to this tenant and model: admitted unmetered.
            metrics::inc(m.requests_admitted);
            self.phase = Phase::Admitted;
            self.audit("admit_no_rule", &model);
            return Action::Continue;
        };
        let store = HostStore;
        let now = now_ns();
        let (key, info) = VM.with(|vm| {
            let mut vm = vm.borrow_mut();
            admission::bucket_key(
                &store,
                cfg,
                &mut vm.known_keys,
                KNOWN_KEYS_CACHE,
                rule,
                &self.tenant,
                &model,
            )
        });
        if info.overflow {
            metrics::inc(m.tenant_overflow);
        }
        let (decision, stats) = admission::charge(&store, cfg, rule, &key, cost, now);
        if stats.corrupt {
            metrics::inc(m.state_corrupt);
            log(Level::Warn, &format!("corrupt bucket state at {key}: reset to full"));
        }
        match decision {
            Decision::Admit {
                snapshot,
                cost,
                wait_ms,
            } => {
                if let Some(idx) = cfg.rule_for(&self.tenant, &model) {
                    self.charged = Some((idx, key.clone(), cost));
                }
                if let Err(action) = self.admit_breakers(cfg, &model, now) {
                    return action;
                }
                self.snapshot = Some(snapshot);
                self.cost = Some(cost);
                self.phase = Phase::Admitted;
                metrics::inc(m.requests_admitted);
                if wait_ms > 0 {
                    metrics::inc(m.requests_shaped);
                    self.shaped_ms = wait_ms;
                    self.audit("shaped", &model);
                    let due = now.saturating_add(wait_ms.saturating_mul(1_000_000));
                    let id = self.id;
                    VM.with(|vm| vm.borrow_mut().held.push((id, due)));
                    return Action::Pause;
                }
                self.audit("admit", &model);
                Action::Continue
            }
            Decision::Reject { reply, reason } => self.reject(&reply, reason, &model),
            Decision::StoreFailed(e) => {
                let id = match e {
                    crate::store::UpdateError::CasExhausted => m.cas_exhausted,
                    crate::store::UpdateError::Host => m.store_errors,
                };
                metrics::inc(id);
                log(Level::Warn, &format!("bucket update failed at {key}: {e:?}; applying on_store_error"));
                match cfg.on_store_error {
                    StoreFailure::Allow => {
                        metrics::inc(m.requests_admitted);
                        self.phase = Phase::Admitted;
                        self.audit("admit_store_error", &model);
                        Action::Continue
                    }
                    StoreFailure::Deny => {
                        self.audit("deny_store_error", &model);
                        self.send(
                            &reply::error(
                                503,
                                "server_error",
                                "rate_limiter_unavailable",
                                "The rate limiter could not record this request; retry shortly.",
                            ),
                            "tokengate_store_error",
                        )
                    }
                }
            }
        }
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

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(cfg) = self.cfg.clone() else {
            return Action::Continue;
        };
        let m = metrics::get();
        let method = abi::get_header(Map::RequestHeaders, ":method");
        let path = abi::get_header(Map::RequestHeaders, ":path").unwrap_or_default();
        self.kind = match method.as_deref() {
            Some("POST") => ApiKind::from_path(&path),
            _ => None,
        };
        if self.kind.is_none() {
            metrics::inc(m.requests_passthrough);
            return Action::Continue;
        }
        self.phase = Phase::Metering;

        let header_tenant = cfg
            .tenant_header
            .as_deref()
            .and_then(|h| abi::get_header(Map::RequestHeaders, h));
        let auth = abi::get_header(Map::RequestHeaders, "authorization");
        let xkey = abi::get_header(Map::RequestHeaders, "x-api-key");
        let key = identity::api_key(auth.as_deref(), xkey.as_deref());
        match identity::resolve(
            header_tenant.as_deref(),
            key,
            cfg.api_key_tenants,
            cfg.default_tenant.as_deref(),
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
            .and_then(|h| abi::get_header(Map::RequestHeaders, h))
            .filter(|s| !s.is_empty());

        if let Some(len) = abi::get_header(Map::RequestHeaders, "content-length")
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            if len > cfg.max_body_bytes as u64 {
                return self.too_large(&cfg);
            }
        }

        if let Some(b) = &cfg.breaker {
            if !b.model_fallbacks.is_empty() {
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
                    match failover::peek_chain(&HostStore, b, "cluster", &cluster, &next, now_ns()) {
                        Ok(choice) => {
                            if let (Some(from), Some(route)) = (&choice.from, &choice.route) {
                                // Envoy re-picks the route when a header changes in this phase.
                                if abi::set_header(Map::RequestHeaders, &b.route_header, route).is_ok() {
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
        if let Some(rule) = rule_idx.and_then(|i| cfg.rules.get(i)) {
            let model = self.model_hint.clone().unwrap_or_default();
            let key = admission::plain_key(rule, &self.tenant, &model);
            match admission::precheck(&HostStore, rule, &key, now_ns()) {
                Ok(Some((r, reason))) => return self.reject(&r, reason, &model),
                Ok(None) => {}
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
                log(Level::Warn, &format!("cannot read the request body (status {s})"));
                self.decide(&cfg, &[])
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.phase != Phase::Admitted {
            return Action::Continue;
        }
        self.resp.status = abi::get_header(Map::ResponseHeaders, ":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if !self.breakers.is_empty() {
            self.resp.retry_after = abi::get_header(Map::ResponseHeaders, "retry-after");
            for h in [
                "x-ratelimit-reset-requests",
                "x-ratelimit-reset-tokens",
                "anthropic-ratelimit-requests-reset",
            ] {
                if let Some(v) = abi::get_header(Map::ResponseHeaders, h) {
                    self.resp.reset_headers.push(v);
                }
            }
            if let Some(ms) = abi::get_header(Map::ResponseHeaders, "retry-after-ms") {
                self.resp.reset_headers.push(format!("{}ms", ms.trim()));
            }
            let sse = abi::get_header(Map::ResponseHeaders, "content-type")
                .is_some_and(|c| c.contains("text/event-stream"));
            if sse {
                self.resp.stream = Some(StreamEnd::default());
            }
        }
        for f in &self.fallbacks {
            let _ = abi::add_header(Map::ResponseHeaders, "x-tokengate-fallback", f);
        }
        if let Some(snap) = &self.snapshot {
            for (k, v) in reply::ratelimit_headers(snap) {
                let _ = abi::set_header(Map::ResponseHeaders, &k, &v);
            }
        }
        if let Some(cost) = self.cost {
            let _ = abi::set_header(
                Map::ResponseHeaders,
                "x-tokengate-estimated-tokens",
                &cost.to_string(),
            );
        }
        if self.shaped_ms > 0 {
            let _ = abi::set_header(
                Map::ResponseHeaders,
                "x-tokengate-shaped-ms",
                &self.shaped_ms.to_string(),
            );
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        if let Some(stream) = self.resp.stream.as_mut() {
            if !stream.done && body_size > 0 {
                if let Ok(chunk) = abi::get_buffer(Buffer::ResponseBody, 0, body_size) {
                    stream.feed(&chunk);
                }
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.record_breakers();
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
        let status = abi::get_property(&["response", "code"])
            .ok()
            .flatten()
            .and_then(|v| crate::store::read_u64(&v, 0))
            .map(|c| u32::try_from(c).unwrap_or(0))
            .unwrap_or(self.resp.status);
        let details = abi::get_property(&["response", "code_details"])
            .ok()
            .flatten()
            .and_then(|v| String::from_utf8(v).ok());
        let completed = if b.count_incomplete_streams {
            self.resp.stream.as_ref().map(|s| s.done)
        } else {
            None
        };
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
            match breaker::record_shared(&HostStore, &key, &b.cfg, outcome, probe, now, cfg.cas_max_retries) {
                Ok((Some(t), _)) => transition_key(&key, t),
                Ok(_) => {}
                Err(e) => {
                    metrics::inc(metrics::get().store_errors);
                    log(Level::Warn, &format!("breaker update failed at {key}: {e:?}"));
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
                &format!("The request body exceeds the limit of {} bytes.", cfg.max_body_bytes),
            ),
            "tokengate_too_large",
        )
    }
}
