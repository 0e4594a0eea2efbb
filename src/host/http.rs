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
use super::{log, metrics, now_ns, KNOWN_KEYS_CACHE, VM};
use crate::admission::{self, Decision, RejectReason};
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
        let model = model.unwrap_or_default();
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
