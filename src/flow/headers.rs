//! Phase 1, request headers: decide everything the headers allow, so that the upstream is never
//! contacted for a request refused here.

use super::answers;
use super::state::{Audit, Meta, Replied, Request, Stage};
use super::{Cx, Effect, Headers, Metric, Next};
use crate::estimate::ApiKind;
use crate::global;
use crate::identity;
use crate::limits::local;
use crate::quota::ExhaustedMarker;
use crate::reply::{Class, Dec, Family, Refusal};
use std::borrow::Cow;

/// The API an LLM call is for, from its method and path; `None` for anything else (passed untouched).
/// Query, fragment, `;` parameters of any segment, trailing slashes and ASCII case do not hide an LLM
/// path (an upstream that ignores them must not serve unmetered calls).
pub fn api_kind(method: Option<&str>, path: Option<&str>) -> Option<ApiKind> {
    if method != Some("POST") {
        return None;
    }
    ApiKind::from_path(&normalized_path(path))
}

/// A request path as the filter reads it: without query, fragment and `;` parameters of any segment,
/// in ASCII lower case, without trailing slashes.
pub fn normalized_path(path: Option<&str>) -> Cow<'_, str> {
    let path = path.unwrap_or_default();
    let path = path.split(['?', '#']).next().unwrap_or(path);
    if path.bytes().any(|b| b == b';' || b.is_ascii_uppercase()) {
        let clean: Vec<String> = path
            .split('/')
            .map(|seg| seg.split(';').next().unwrap_or(seg).to_ascii_lowercase())
            .collect();
        Cow::Owned(clean.join("/").trim_end_matches('/').to_string())
    } else {
        Cow::Borrowed(path.trim_end_matches('/'))
    }
}

/// Whether a request that is not a metered LLM call could still spend provider usage: any method but
/// `GET`, `HEAD`, `OPTIONS` and `DELETE`, and any request asking for a protocol upgrade (a WebSocket,
/// as OpenAI's Realtime API uses).
fn may_spend(h: &dyn Headers) -> bool {
    !matches!(
        h.get(":method"),
        Some("GET" | "HEAD" | "OPTIONS" | "DELETE")
    ) || upgrade(h)
}

/// Whether the request asks for a protocol upgrade (HTTP/1.1 `upgrade`, HTTP/2 extended CONNECT).
fn upgrade(h: &dyn Headers) -> bool {
    h.get("upgrade").is_some() || h.get(":protocol").is_some()
}

/// The family to answer an unmetered path in: Anthropic's for its paths (`…/messages…` but OpenAI
/// Assistants' `…/threads/…`, `…/complete`) or a client that sends `anthropic-version`, else OpenAI's.
fn family_of_path(path: &str, h: &dyn Headers) -> Family {
    if h.get("anthropic-version").is_some()
        || (path.contains("/messages") && !path.contains("/threads/"))
        || path.ends_with("/complete")
    {
        Family::Anthropic
    } else {
        Family::OpenAi
    }
}

impl Request {
    /// Envoy's request-headers callback.
    pub fn on_request_headers(
        &mut self,
        cx: &mut Cx,
        h: &dyn Headers,
        end_of_stream: bool,
    ) -> Next {
        let cfg = cx.cfg;
        // A request asking for a protocol upgrade (a WebSocket) has no body to meter, whatever its path:
        // it is judged as a write on a path that is not metered.
        let kind = if upgrade(h) {
            None
        } else {
            api_kind(h.get(":method"), h.get(":path"))
        };
        if let Some(b) = &cfg.breaker {
            // Only the filter may steer requests to a fallback cluster, on every path and method (a
            // client-sent value would pick the fallback route for requests the filter passes).
            if h.get(&b.route_header).is_some() {
                cx.fx.push(Effect::RemoveRequestHeader(Cow::Owned(
                    b.route_header.clone(),
                )));
            }
        }
        let Some(kind) = kind else {
            if may_spend(h) {
                let path = normalized_path(h.get(":path"));
                if !cfg.unmetered.allows(&path) {
                    cx.inc(Metric::RequestsRejectedUnmetered);
                    self.family = family_of_path(&path, h);
                    self.reply_id = reply_id(h, self.id, cx.now());
                    let method = h.get(":method").unwrap_or_default();
                    let refusal = answers::path_not_metered(method, &path);
                    return self.refuse(
                        cx,
                        &Meta::default(),
                        "",
                        "path_not_metered",
                        refusal,
                        "tokengate_path_not_metered",
                    );
                }
            }
            cx.inc(Metric::RequestsPassthrough);
            self.stage = Stage::Passthrough;
            return Next::Continue;
        };
        self.family = Family::of(kind);
        self.reply_id = reply_id(h, self.id, cx.now());
        let mut meta = Meta {
            kind: Some(kind),
            ..Meta::default()
        };
        if cfg.reads_responses && h.get("accept-encoding").is_some() {
            // The filter reads the response (usage for settlements and refunds, the end of SSE streams
            // for the breaker): ask the provider for it uncompressed. A compressor filter placed before
            // tokengate still compresses for the client.
            cx.fx.push(Effect::RemoveRequestHeader(Cow::Borrowed(
                "accept-encoding",
            )));
        }

        let header_tenant = cfg.tenant_header.as_deref().and_then(|n| h.get(n));
        if let (Some(name), Some(t)) = (cfg.tenant_header.as_deref(), header_tenant) {
            // Tenants derived from API keys are `key:<hash>`: nobody may name one in a header (a
            // forged `key:` tenant would charge someone else's key).
            if t.trim()
                .get(..4)
                .is_some_and(|p| p.eq_ignore_ascii_case("key:"))
            {
                cx.inc(Metric::RequestsRejectedNoTenant);
                return self.refuse(
                    cx,
                    &meta,
                    "",
                    "forbidden_tenant",
                    answers::forbidden_tenant(name),
                    "tokengate_forbidden_tenant",
                );
            }
        }
        // A key header sent twice with different values is two keys as well.
        let repeated = h.differs("authorization") || h.differs("x-api-key");
        let key =
            match identity::api_key(h.get("authorization"), h.get("x-api-key")).and_then(|k| {
                if repeated {
                    Err(identity::TwoKeys)
                } else {
                    Ok(k)
                }
            }) {
                Ok(key) => key,
                // Two different keys name no tenant; they only matter where the key would.
                Err(identity::TwoKeys)
                    if !cfg.api_key_tenants || identity::is_tenant_name(header_tenant) =>
                {
                    None
                }
                Err(identity::TwoKeys) => {
                    cx.inc(Metric::RequestsRejectedNoTenant);
                    return self.refuse(
                        cx,
                        &meta,
                        "",
                        "two_api_keys",
                        answers::two_api_keys(),
                        "tokengate_two_api_keys",
                    );
                }
            };
        let sources = identity::Sources {
            api_key_tenants: cfg.api_key_tenants,
            api_keys: cfg.api_keys.as_ref(),
            default_tenant: cfg.default_tenant.as_deref(),
        };
        match identity::resolve(header_tenant, key, sources, &mut cx.worker.key_tenants) {
            identity::Resolved::Tenant(t, _) => meta.tenant = t,
            identity::Resolved::UnknownKey => {
                cx.inc(Metric::RequestsRejectedNoTenant);
                return self.refuse(
                    cx,
                    &meta,
                    "",
                    "unknown_api_key",
                    answers::unknown_api_key(),
                    "tokengate_unknown_api_key",
                );
            }
            identity::Resolved::Nobody => {
                cx.inc(Metric::RequestsRejectedNoTenant);
                return self.refuse(
                    cx,
                    &meta,
                    "",
                    "no_tenant",
                    answers::missing_tenant(),
                    "tokengate_no_tenant",
                );
            }
        }
        if !cfg.groups.is_empty() {
            meta.groups = match cfg.tenant_groups.get(&meta.tenant) {
                Some(g) => g.clone(),
                // From the trusted headers; a value that is not a group id is no group.
                None => cfg
                    .groups
                    .iter()
                    .map(|l| {
                        l.header
                            .as_deref()
                            .and_then(|n| h.get(n))
                            .map(str::trim)
                            .filter(|v| identity::valid_tenant(v))
                            .map(str::to_string)
                    })
                    .collect(),
            };
        }
        meta.model_hint = cfg
            .model_header
            .as_deref()
            .and_then(|n| h.get(n))
            .filter(|s| !s.is_empty())
            .map(str::to_string);

        if let Some(len) = h
            .get("content-length")
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            if len > cfg.max_body_bytes as u64 {
                cx.inc(Metric::RequestsRejectedTooLarge);
                return self.refuse(
                    cx,
                    &meta,
                    "",
                    "too_large",
                    answers::too_large(cfg.max_body_bytes),
                    "tokengate_too_large",
                );
            }
        }

        let mut drop_length = false;
        if let Some(q) = &cfg.quota {
            let now = cx.now();
            // A tenant this VM is serving from a lease is not refused from its marker (one shared-data
            // read less per request; see `Leases::served_recently`).
            let leased = q.lease.is_some() && cx.worker.leases.served_recently(&meta.tenant, now);
            if let Some(reply) = (!leased)
                .then(|| exhausted_cached(cx, q, &meta.tenant))
                .flatten()
            {
                cx.inc(Metric::QuotaRejectedCached);
                return self.refuse(
                    cx,
                    &meta,
                    "",
                    "quota_exceeded_cached",
                    reply,
                    "tokengate_quota_exceeded",
                );
            }
            // Names this request's settlement (retries reuse it). Clients can send `x-request-id`, so it
            // is made unique with the context id and the time.
            let rid = h.get("x-request-id").unwrap_or_default();
            meta.request_id = settlement_id(rid, self.id, now);
            // The body may be rewritten (include_usage, max_tokens clamp).
            drop_length = true;
        }
        if let Some(b) = &cfg.breaker {
            // The body may be rewritten (model fallback).
            drop_length |= !b.model_fallbacks.is_empty();
            if b.keys.cluster {
                if let Err((cluster, reset)) = super::breakers::check_cluster(cx, b, &mut meta) {
                    cx.inc(Metric::BreakerShortCircuited);
                    return self.refuse(
                        cx,
                        &meta,
                        &cluster,
                        "circuit_open",
                        answers::circuit_open("cluster", &cluster, reset),
                        "tokengate_circuit_open",
                    );
                }
            }
        }
        // The output limit may be written into a body that has none (`output_limit_absent`, and a
        // background response under `background_responses: "reservation"`).
        drop_length |= cfg.write_absent_limit
            || (!cfg.refuse_background && meta.kind == Some(crate::estimate::ApiKind::Responses));
        if drop_length && h.get("content-length").is_some() {
            // Envoy does not fix content-length after a body rewrite: let it send the body chunked.
            cx.fx
                .push(Effect::RemoveRequestHeader(Cow::Borrowed("content-length")));
        } else {
            // Kept: a later rewrite (an output limit above the model's cap) must keep this length.
            meta.fixed_length = h
                .get("content-length")
                .and_then(|v| v.trim().parse::<usize>().ok());
        }

        // Headers-phase refusal when the bucket is known without the body.
        if let Some(next) = self.precheck(cx, &mut meta) {
            return next;
        }
        self.stage = Stage::AwaitingBody(Box::new(meta));
        if end_of_stream {
            return self.decide(cx, &[], true);
        }
        Next::Continue
    }

    /// Refuses in the headers phase when a rule or limit that certainly applies (the model is known, or
    /// does not matter to it) cannot admit even one more request: its bucket is empty (read, not
    /// charged; a global bucket's from its refusal cache) or its in-flight slots are all held. Shadow
    /// limits are left to the body phase (they only count).
    fn precheck(&mut self, cx: &mut Cx, meta: &mut Meta) -> Option<Next> {
        let cfg = cx.cfg;
        let model = meta.model_hint.clone().unwrap_or_default();
        let mut idxs: Vec<usize> = match meta.model_hint.as_deref() {
            Some(m) => cfg.rule_for(&meta.tenant, m),
            None => cfg.rule_without_model(&meta.tenant),
        }
        .into_iter()
        .collect();
        let base = cfg.rules.len();
        for (j, l) in cfg.limits.iter().enumerate() {
            let known = meta.model_hint.is_some()
                || (l.model == crate::config::ModelMatch::Any && !(l.per_model && l.has_bucket));
            if known && !l.shadow && l.applies(&meta.tenant, &meta.groups, &model) {
                idxs.push(base + j);
            }
        }
        let now = cx.now();
        for idx in idxs {
            let rule = cfg.rule(idx)?;
            let who = super::admit::subject(cfg, rule, meta);
            if let Some(max) = rule.max_in_flight {
                let key = super::admit::slot_key(rule, &who);
                if crate::limits::inflight::in_flight(cx.store(), &key, now)
                    .is_ok_and(|n| n >= usize::try_from(max).unwrap_or(usize::MAX))
                {
                    let refusal = answers::too_many_in_flight(rule, max, &cfg.groups);
                    return Some(self.reject(cx, meta, &model, None, refusal));
                }
            }
            if !rule.has_bucket {
                continue;
            }
            if rule.global && cfg.global.is_some() {
                // A global bucket is in Redis: only its refusal cache is read here.
                let key = global::key(rule, &who, &model);
                if let Some(refusal) = global_refused_from_cache(cx, rule, &key, 1) {
                    cx.inc(Metric::GlobalRejectedCached);
                    return Some(self.reject(cx, meta, &model, None, refusal));
                }
            } else {
                let key = local::plain_key(rule, &who, &model);
                let mut seen = None;
                match local::precheck(cx.store(), rule, &key, now, &mut seen) {
                    Ok(Some(refusal)) => return Some(self.reject(cx, meta, &model, None, refusal)),
                    Ok(None) => {
                        if meta.prechecked.is_none() {
                            meta.prechecked = seen.map(|seen| (key, seen));
                        }
                    }
                    // The body phase reads again and repairs; nothing is decided here.
                    Err(true) => cx.inc(Metric::StateCorrupt),
                    Err(false) => cx.inc(Metric::StoreErrors),
                }
            }
        }
        None
    }

    /// Sends a local reply: the request is answered, nothing was charged (or it was given back).
    pub(super) fn refuse(
        &mut self,
        cx: &mut Cx,
        meta: &Meta,
        model: &str,
        decision: &'static str,
        refusal: Refusal,
        details: &'static str,
    ) -> Next {
        let audit = Audit {
            tenant: meta.tenant.clone(),
            model: model.to_string(),
            cost: None,
            decision,
        };
        self.answer(cx, audit, None, refusal, details)
    }

    /// Writes the audit record and the reply; the stage becomes [`Stage::Replied`].
    pub(super) fn answer(
        &mut self,
        cx: &mut Cx,
        audit: Audit,
        reconcile: Option<super::state::QuotaReq>,
        mut refusal: Refusal,
        details: &'static str,
    ) -> Next {
        cx.fx.push(Effect::Audit(answers::audit_record(
            &audit.tenant,
            &audit.model,
            audit.cost,
            audit.decision,
            &[],
            cx.cfg,
        )));
        if refusal.estimated.is_none() {
            // Body-phase refusals say what the request would have cost (what the client waits for).
            refusal.estimated = audit.cost;
        }
        let reply =
            crate::reply::render(self.family, &refusal, &self.reply_id, cx.now() / 1_000_000);
        cx.fx.push(Effect::Reply { reply, details });
        self.stage = Stage::Replied(Box::new(Replied { audit, reconcile }));
        Next::Pause
    }

    /// A bucket's 429/413: counted by reason; `cost` (known once the body was read) is reported in
    /// `x-tokengate-estimated-tokens`.
    pub(super) fn reject(
        &mut self,
        cx: &mut Cx,
        meta: &Meta,
        model: &str,
        cost: Option<u64>,
        refusal: Refusal,
    ) -> Next {
        let (metric, decision) = match refusal.class {
            Class::TokensPerSecond => (Metric::RequestsLimitedTokens, "limited_tokens"),
            Class::RequestsPerMinute => (Metric::RequestsLimitedRequests, "limited_requests"),
            Class::ConcurrencyLimit => (Metric::RequestsLimitedInFlight, "limited_in_flight"),
            _ => (
                Metric::RequestsRejectedCostExceedsBurst,
                "cost_exceeds_burst",
            ),
        };
        cx.inc(metric);
        let audit = Audit {
            tenant: meta.tenant.clone(),
            model: model.to_string(),
            cost,
            decision,
        };
        self.answer(cx, audit, None, refusal, "tokengate_rejected")
    }
}

/// The 429 for a global bucket that Redis refused moments ago and that cannot hold `cost` tokens (or
/// one request) yet, from the refusal cache in shared data (see [`crate::global`]); `None` = ask Redis.
pub(super) fn global_refused_from_cache(
    cx: &Cx,
    rule: &crate::config::Rule,
    key: &str,
    cost: u64,
) -> Option<Refusal> {
    let (bytes, _) = cx.store().get(&global::seen_slot(key)).ok()??;
    let state = global::Seen::for_key(&bytes, key)?;
    let refusal = local::refusal_for(&state, rule, cost, cx.now())?;
    // Redis refused, but this Envoy's lease of the bucket may still hold the request.
    if cx.cfg.global.as_ref().is_some_and(|g| g.lease.is_some())
        && crate::global::lease::covers(
            cx.store(),
            &crate::global::lease::account_key(key),
            &rule.params,
            cost,
        )
    {
        return None;
    }
    Some(refusal)
}

/// The name of a request's settlement: `<client x-request-id, first 64 bytes>-<context id>-<ns>` (built
/// without `core::fmt`: this runs for every metered request of a tenant with a quota).
pub(super) fn settlement_id(client_id: &str, context: u32, now_ns: u64) -> String {
    let client_id = client_id.get(..64).unwrap_or(client_id);
    let (context, now) = (Dec::int(u64::from(context)), Dec::int(now_ns));
    let mut id = String::with_capacity(client_id.len() + 2 + context.as_str().len() + 20);
    for part in [client_id, "-", context.as_str(), "-", now.as_str()] {
        id.push_str(part);
    }
    id
}

/// Seconds since the epoch for month arithmetic (host clock plus the configured skew).
pub(super) fn unix_s(cx: &Cx, q: &crate::config::QuotaSettings) -> i64 {
    i64::try_from(cx.now() / 1_000_000_000)
        .unwrap_or(0)
        .saturating_add(q.clock_skew_s)
}

/// The 429 of a tenant known to be exhausted (shared-data marker), without a callout.
pub(super) fn exhausted_cached(
    cx: &Cx,
    q: &crate::config::QuotaSettings,
    tenant: &str,
) -> Option<Refusal> {
    let now_s = unix_s(cx, q);
    let key = ExhaustedMarker::key(tenant);
    let (marker, _) = crate::store::peek::<ExhaustedMarker>(cx.store(), &key).ok()?;
    let marker = marker?;
    if !marker.is_active(now_s) || marker.config_limit != q.account_limit(tenant) {
        return None;
    }
    Some(answers::quota_exceeded(
        marker.limit,
        marker.remaining,
        crate::quota::calendar::month_end_unix(now_s, q.month_offset_minutes),
        now_s,
        "for this tenant",
    ))
}

/// The id a reply carries: the client's `x-request-id` (at most 128 bytes), else one of ours.
fn reply_id(h: &dyn Headers, id: u32, now: u64) -> String {
    match h.get("x-request-id").filter(|v| !v.is_empty()) {
        Some(v) => v.get(..128).unwrap_or(v).to_string(),
        None => format!("tg-{id}-{now}"),
    }
}

#[cfg(test)]
mod tests {
    use super::settlement_id;

    #[test]
    fn settlement_ids_are_the_client_id_prefix_the_context_and_the_time() {
        let long = "r".repeat(100);
        // 63 ASCII bytes then a 2-byte character: byte 64 is not a boundary, the whole id is kept.
        let split = format!("{}é{}", "a".repeat(63), "b".repeat(10));
        for (client, ctx, now) in [
            ("", 0u32, 0u64),
            ("abc", 7, 1_794_700_800_123_456_789),
            (long.as_str(), u32::MAX, u64::MAX),
            (split.as_str(), 3, 42),
        ] {
            let want = format!("{}-{ctx}-{now}", client.get(..64).unwrap_or(client));
            assert_eq!(settlement_id(client, ctx, now), want);
        }
        assert_eq!(settlement_id(&long, 1, 2).len(), 64 + 4);
    }
}
