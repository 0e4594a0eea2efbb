//! Phase 4, the response: rate-limit, quota and fallback headers; a streamed answer scanned chunk by chunk
//! in its family's framing ([`scanner_for`]: SSE, Gemini's SSE or JSON array, Bedrock's AWS event
//! stream) for its end and usage (an injected OpenAI usage chunk stripped), or a whole answer kept to
//! read its usage at the end (Bedrock `invoke`: its token-count headers). An upstream that
//! answers while the admission is still pending is accounted as admitted ([`Request::on_response_headers`]).

use super::answers;
use super::end;
use super::state::{Hold, QuotaReq, Request, Stage};
use super::steps::quota;
use crate::estimate::ApiKind;
use crate::flow::cx::Cx;
use crate::flow::effect::{Body, Effect, Headers, Level, Next, Value};
use crate::flow::metric::Metric;
use crate::usage::{Forward, StreamScanner};
use std::borrow::Cow;

/// Largest JSON response kept to read its `usage`.
pub const MAX_JSON_RESPONSE: usize = 16 * 1024 * 1024;

impl Request {
    /// Envoy's response-headers callback.
    pub fn on_response_headers(
        &mut self,
        cx: &mut Cx,
        h: &dyn Headers,
        end_of_stream: bool,
    ) -> Next {
        if let Stage::Admitting(_) = self.stage {
            self.response_before_decision(cx);
        }
        let (Stage::Forwarded(f) | Stage::Held(f)) = &mut self.stage else {
            return Next::Continue;
        };
        f.resp.ended = end_of_stream;
        let settling = f.settling();
        let refunding = f.refund;
        let inspect = !f.charges.breakers.is_empty() || settling || refunding;
        if inspect || !f.quotas.is_empty() {
            f.resp.status = h.get(":status").and_then(|s| s.parse().ok()).unwrap_or(0);
            // Retry hints matter only on failures.
            if !f.charges.breakers.is_empty() && (f.resp.status == 429 || f.resp.status >= 500) {
                f.resp.retry_after = h.get("retry-after").map(str::to_string);
                for name in [
                    "x-ratelimit-reset-requests",
                    "x-ratelimit-reset-tokens",
                    "anthropic-ratelimit-requests-reset",
                ] {
                    if let Some(v) = h.get(name) {
                        f.resp.reset_headers.push(v.to_string());
                    }
                }
                if let Some(ms) = h.get("retry-after-ms") {
                    f.resp.reset_headers.push(format!("{}ms", ms.trim()));
                }
            }
            // A body the provider compressed anyway (it ignored the removed accept-encoding) cannot be
            // read: its usage is unknown (the estimate stands) and an SSE stream's end is not judged.
            if inspect && !is_encoded(h.get("content-encoding")) {
                let ok = (200..300).contains(&f.resp.status);
                let ct = h.get("content-type").unwrap_or_default();
                f.resp.stream = f
                    .meta
                    .kind
                    .and_then(|k| scanner_for(k, ct, ok, f.injected_usage));
                if f.resp.stream.is_none() && (settling || refunding) && ok {
                    if f.meta.kind == Some(ApiKind::BedrockInvoke) {
                        f.resp.token_headers = h
                            .get("x-amzn-bedrock-input-token-count")
                            .zip(h.get("x-amzn-bedrock-output-token-count"))
                            .map(|(i, o)| Box::new((i.to_string(), o.to_string())));
                    }
                    // Bedrock's token-count headers settle an `invoke` answer whatever its body.
                    f.resp.collect = !f.resp.token_headers.as_ref().is_some_and(|t| {
                        t.0.trim().parse::<u64>().is_ok() && t.1.trim().parse::<u64>().is_ok()
                    });
                }
            }
        }
        if let Some((qr, q)) = f.token_quota().zip(cx.cfg.quota.as_ref()) {
            if let Some(remaining) = qr.remaining {
                // A recent time (no clock read): the reset is never announced earlier than it is.
                let now_s = q.now_s(cx.host.recent_ns());
                let reset_s = crate::quota::calendar::seconds_until(qr.reset_at, now_s);
                for (k, v) in answers::quota_headers(qr.limit, remaining, reset_s) {
                    cx.fx
                        .push(Effect::SetResponseHeader(Cow::Borrowed(k), Value::Int(v)));
                }
            }
        }
        // The binding budget (least left, as a share of its limit).
        if let Some((qr, remaining)) = f
            .quotas
            .iter()
            .filter(|q| q.budget.is_some())
            .filter_map(|q| q.remaining.map(|r| (q, r)))
            .min_by(|a, b| {
                let share = |(q, r): &(&QuotaReq, u64)| *r as f64 / q.limit.max(1) as f64;
                share(a).total_cmp(&share(b))
            })
        {
            let unit = qr
                .budget
                .and_then(|i| {
                    let q = cx.cfg.quota.as_ref()?;
                    Some(q.budgets.unit(q.budgets.list.get(i)?))
                })
                .unwrap_or_default();
            for (k, v) in [
                (
                    "x-tokengate-budget-limit",
                    crate::reply::amount(qr.limit, unit),
                ),
                (
                    "x-tokengate-budget-remaining",
                    crate::reply::amount(remaining, unit),
                ),
            ] {
                cx.fx
                    .push(Effect::SetResponseHeader(Cow::Borrowed(k), Value::Text(v)));
            }
            if let Some(b) = qr
                .budget
                .and_then(|i| cx.cfg.quota.as_ref()?.budgets.list.get(i))
            {
                cx.fx.push(Effect::SetResponseHeader(
                    Cow::Borrowed("x-tokengate-budget"),
                    Value::Text(b.name.clone()),
                ));
            }
        }
        if f.injected_usage && matches!(f.resp.stream, Some(StreamScanner::Sse(_))) {
            // The body is rewritten chunk by chunk (the usage chunk removed).
            cx.fx.push(Effect::RemoveResponseHeader(Cow::Borrowed(
                "content-length",
            )));
        }
        if !f.downgraded.is_empty() {
            // Sent to a cheaper model by a spent limit or budget (`when_exhausted`).
            cx.fx.push(Effect::SetResponseHeader(
                Cow::Borrowed("x-tokengate-downgraded"),
                Value::Text(f.downgraded.join(", ")),
            ));
        }
        if !f.meta.fallbacks.is_empty() {
            // Every hop in one header, in order: `provider -> provider_fallback, gpt-4.1 -> deepseek`.
            cx.fx.push(Effect::SetResponseHeader(
                Cow::Borrowed("x-tokengate-fallback"),
                Value::Text(f.meta.fallbacks.join(", ")),
            ));
        }
        if let Some(snap) = &f.snapshot {
            // Whole trios per resource: the provider's when it has less left, else ours (see
            // `reply::merge_provider_headers`).
            let ours = crate::reply::Limits::from(snap);
            // A recent time, not a clock read: at most this request's own admission time, so a
            // reset is never announced earlier than the bucket refills.
            let now_ms = cx.host.recent_ns() / 1_000_000;
            let fx = &mut *cx.fx;
            crate::reply::merge_with(self.family, &|n| h.get(n), &ours, now_ms, |k, v| {
                fx.push(Effect::SetResponseHeader(
                    Cow::Borrowed(k),
                    Value::Text(v.to_string()),
                ));
            });
        }
        cx.fx.push(Effect::SetResponseHeader(
            Cow::Borrowed("x-tokengate-estimated-tokens"),
            Value::Int(f.cost),
        ));
        if f.shaped_ms > 0 {
            cx.fx.push(Effect::SetResponseHeader(
                Cow::Borrowed("x-tokengate-shaped-ms"),
                Value::Int(f.shaped_ms),
            ));
        }
        Next::Continue
    }

    /// Envoy's response-body callback (one chunk; `body_size` bytes are readable through the host).
    pub fn on_response_body(&mut self, cx: &mut Cx, body_size: usize, end_of_stream: bool) -> Next {
        let (Stage::Forwarded(f) | Stage::Held(f)) = &mut self.stage else {
            return Next::Continue;
        };
        f.resp.ended |= end_of_stream;
        if let Some(sc) = f.resp.stream.as_mut() {
            if body_size > 0 {
                if let Some(chunk) = cx.host.body(Body::ResponseChunk, body_size) {
                    if let Forward::Replace(bytes) = sc.feed(&chunk).forward {
                        cx.fx.push(Effect::ReplaceResponseChunk(bytes));
                    }
                }
            }
            if end_of_stream {
                let rest = sc.finish();
                if !rest.is_empty() {
                    cx.fx.push(Effect::AppendResponseBody(rest));
                }
            }
        } else if f.resp.collect
            && body_size > 0
            && f.resp.json.len().saturating_add(body_size) <= MAX_JSON_RESPONSE
        {
            if let Some(chunk) = cx.host.body(Body::ResponseChunk, body_size) {
                f.resp.json.extend_from_slice(&chunk);
            }
        }
        if end_of_stream {
            end::at_end_of_stream(cx, f);
            self.finish(cx, true);
        }
        Next::Continue
    }
}

/// The scanner of a streamed answer of `kind` with `content_type`, by the framing it is sent in:
/// `text/event-stream` (OpenAI, Anthropic, Gemini's `alt=sse`: Gemini's scanner for its APIs), Bedrock's
/// `application/vnd.amazon.eventstream` (for Bedrock's APIs only), or the JSON array a `2xx`
/// `streamGenerateContent` without `alt=sse` streams. `None`: a whole answer (read at its end).
/// `strip_usage_chunk`: `include_usage` was injected (only an OpenAI SSE stream carries that chunk).
pub fn scanner_for(
    kind: ApiKind,
    content_type: &str,
    ok: bool,
    strip_usage_chunk: bool,
) -> Option<StreamScanner> {
    let bedrock = matches!(
        kind,
        ApiKind::BedrockConverse
            | ApiKind::BedrockConverseStream
            | ApiKind::BedrockInvoke
            | ApiKind::BedrockInvokeStream
    );
    if has_ascii_ci(content_type, "text/event-stream") {
        return Some(if bedrock {
            // Bedrock streams are never SSE; read as plain SSE (no usage a Bedrock scanner trusts).
            StreamScanner::Sse(crate::usage::SseScanner::new(false))
        } else {
            StreamScanner::for_kind(kind, strip_usage_chunk)
        });
    }
    if bedrock && has_ascii_ci(content_type, "application/vnd.amazon.eventstream") {
        return Some(StreamScanner::for_kind(kind, false));
    }
    (kind == ApiKind::GeminiStream && ok).then(|| StreamScanner::for_kind(kind, false))
}

/// `haystack` contains `needle` (ASCII, case-insensitive), without allocating.
fn has_ascii_ci(haystack: &str, needle: &str) -> bool {
    haystack
        .as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// A `content-encoding` other than identity.
pub fn is_encoded(v: Option<&str>) -> bool {
    v.is_some_and(|e| !e.trim().is_empty() && !e.trim().eq_ignore_ascii_case("identity"))
}

impl Request {
    /// The upstream answered while the admission was still pending (a provider that answers before
    /// reading the body, e.g. refusing a key). The answer cannot be stopped any more, so the request is
    /// accounted as admitted from here on: what was charged stays charged; a global charge in flight
    /// keeps whatever Redis does with it (as after a timeout); the quota is *reconciled* at the end —
    /// charged what the response shows it cost, whatever a reservation in flight does (the tombstone
    /// makes a late one a no-op) — and a callout answer that arrives later is ignored. Counted in
    /// `tokengate_responses_before_decision`.
    fn response_before_decision(&mut self, cx: &mut Cx) {
        let Stage::Admitting(mut plan) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return;
        };
        cx.inc(Metric::ResponsesBeforeDecision);
        cx.log_failure(
            Level::Warn,
            "response_before_decision",
            "the upstream answered before the filter decided on the request (does it read the whole body before answering?); accounting it as admitted".to_string(),
        );
        // Reservations made stay; the one in flight and those not made yet are reconciled.
        let mut quotas = std::mem::take(&mut plan.quotas);
        let mut rest = quota::unmade(cx, &mut plan);
        for qr in &mut rest {
            qr.hold = Hold::Uncertain;
        }
        quotas.extend(rest);
        self.forward(cx, plan, quotas, "response_before_decision");
    }
}
