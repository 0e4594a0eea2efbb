//! Phase 5, the end of a request (end of the response stream, or `on_log` for aborts): the breaker
//! outcome, the quota settlement (queued for the sender of the settlement journal), `refund_unused`. A
//! client that went before the request was sent upstream is the pipeline's to undo
//! ([`Request::abandon`]).

use super::answers;
use super::settlement::{reconcile, settle_reserved};
use super::state::{Charge, Forwarded, Hold, Request, Stage};
use super::steps::fair;
use super::steps::limits::release_slots;
use crate::breaker::{self, Outcome};
use crate::config::AbandonedCharge;
use crate::flow::cx::Cx;
use crate::flow::effect::Effect;
use crate::flow::metric::Metric;
use crate::flow::vm::state::Credit;
use crate::flow::vm::{breakers, credits, leases};
use crate::limits::local;
use crate::quota::accounting::{self, Ending};
use crate::usage::{self, StreamScanner};

impl Request {
    /// Envoy's `on_log`: the request is over (completed, failed or aborted by the client).
    pub fn on_log(&mut self, cx: &mut Cx) {
        let id = self.id;
        let still_held =
            matches!(self.stage, Stage::Held(_)) && cx.worker.held.iter().any(|(h, _)| *h == id);
        if still_held || matches!(self.stage, Stage::Admitting(_)) {
            self.abandon(cx);
            return;
        }
        if let Stage::Forwarded(f) | Stage::Held(f) = &mut self.stage {
            record(cx, f);
        }
        self.finish(cx, false);
    }

    /// Settles and refunds once (`ending_complete`: the response reached its end of stream).
    pub(super) fn finish(&mut self, cx: &mut Cx, ending_complete: bool) {
        match &mut self.stage {
            Stage::Forwarded(f) | Stage::Held(f) => {
                // The provider's usage, read once for the settlement and the refund (a JSON body is
                // parsed only when one of them needs it).
                let needed =
                    f.quotas.iter().any(|q| !q.settled()) || (f.refund && !f.resp.refunded);
                let usage = if needed { response_usage(f) } else { None };
                settle(cx, f, ending_complete, usage);
                refund_unused(cx, f, usage);
                release_slots(cx, &mut f.charges);
            }
            Stage::Replied(r) => {
                if let Some(mut qr) = r.reconcile.take() {
                    // The reservation's outcome is unknown and the request was refused: whatever the
                    // lost reservation did is undone (actual 0).
                    reconcile(cx, &mut qr, Ending::NotServed);
                    let rec = answers::audit_record(
                        &r.audit.tenant,
                        &r.audit.model,
                        r.audit.cost,
                        r.audit.decision,
                        std::slice::from_ref(&qr),
                        cx.cfg,
                    );
                    cx.fx.push(Effect::Audit(rec));
                }
            }
            _ => {}
        }
    }
}

/// The usage the response reported: the stream scanner's, or the whole answer's in its family's shape
/// ([`usage::from_answer`]: Bedrock `invoke` from its token-count headers first). Embeddings report no
/// output; every other API's usage without an output count is none.
fn response_usage(f: &Forwarded) -> Option<usage::Usage> {
    match (&f.resp.stream, f.meta.kind) {
        (Some(sc), _) => sc.usage(),
        (None, Some(kind)) => {
            let (input, output) = match f.resp.token_headers.as_deref() {
                Some((i, o)) => (Some(i.as_str()), Some(o.as_str())),
                None => (None, None),
            };
            usage::from_answer(kind, &f.resp.json, input, output)
        }
        (None, None) => usage::from_json_with_output(&f.resp.json),
    }
}

/// Settles the reservation once the response ended (or the stream went away); `usage`: what the
/// response reported ([`response_usage`]).
fn settle(cx: &mut Cx, f: &mut Forwarded, ending_complete: bool, usage: Option<usage::Usage>) {
    if f.quotas.iter().all(|q| q.settled()) {
        return;
    }
    let status = f.resp.status;
    let (completed, content_bytes) = match &f.resp.stream {
        Some(sc) => (sc.completed(), sc.content_bytes()),
        // A JSON answer cut part way: its output is estimated from the bytes that arrived (structure
        // included, which errs towards charging; capped at the reservation).
        None => (ending_complete, f.resp.json.len() as u64),
    };
    // Envoy's own failure replies (503/504 …) and provider errors are not served: refunded. A response
    // cut before its end is charged its final usage when that arrived. Otherwise, when the client left
    // (no response headers at all, status 0, or Envoy's `downstream_…` details), the provider may go on
    // generating what tokengate never sees (a non-streamed answer runs to its end; hidden reasoning is
    // billed): `abandoned_charge` says whether the whole reservation is charged or the prompt plus the
    // output that reached Envoy. A stream the upstream cut is charged the prompt plus what arrived.
    let gave_up = upstream_gave_up(cx, status, f.resp.ended);
    let served = (200..300).contains(&status);
    let ending = if status != 0 && !served && !gave_up {
        Ending::NotServed
    } else if status != 0 && !served {
        // Envoy stopped waiting for a provider that had the whole request, before any answer: like a
        // client that left, whatever it generates is never seen.
        if abandoned_in_full(cx, 0) || f.meta.background {
            Ending::Abandoned { content_bytes: 0 }
        } else {
            Ending::Cut {
                usage: None,
                content_bytes: 0,
            }
        }
    } else if status != 0 && completed && ending_complete {
        Ending::Completed { usage }
    } else if f.meta.background {
        // A background response goes on generating whatever happens to its answer: anything short
        // of its completion is charged the whole reservation (or what arrived, if more).
        Ending::Abandoned {
            content_bytes: if status == 0 { 0 } else { content_bytes },
        }
    } else if usage.is_some() {
        Ending::Cut {
            usage,
            content_bytes,
        }
    } else if abandoned_in_full(cx, status) {
        Ending::Abandoned {
            content_bytes: if status == 0 { 0 } else { content_bytes },
        }
    } else {
        Ending::Cut {
            usage: None,
            content_bytes: if status == 0 { 0 } else { content_bytes },
        }
    };
    let mut settled_any = false;
    for qr in f.quotas.iter_mut().filter(|q| !q.settled()) {
        match &qr.hold {
            Hold::Lease(key) => {
                // Settled into this Envoy's lease; reported to Redis by the next sync.
                let st = accounting::settle(&qr.reserved, ending);
                leases::settle(cx, key, qr.reserved.total(), st.actual);
                let (tokens_in, tokens_out) = accounting::tokens_io(ending);
                leases::settle_io(cx, key, &qr.args.month, tokens_in, tokens_out);
                qr.hold = Hold::Settled;
                qr.actual = Some(st.actual);
                qr.source = Some(st.source);
            }
            // No reservation is known: charge what it cost (sent when the shim answers again).
            Hold::Uncertain | Hold::FailOpen { .. } => reconcile(cx, qr, ending),
            Hold::Redis => settle_reserved(cx, qr, ending),
            _ => continue,
        }
        settled_any = true;
    }
    if !settled_any {
        return;
    }
    let mut rec = answers::audit_record(
        &f.meta.tenant,
        &f.model,
        Some(f.cost),
        f.decision,
        &f.quotas,
        cx.cfg,
    );
    answers::add_downgrades(&mut rec, &f.downgraded);
    cx.fx.push(Effect::Audit(rec));
}

/// Envoy's details for a reply it made because it stopped waiting for an upstream that had the request:
/// the provider may still be generating (and billing) the answer.
/// (Envoy 1.40 labels a route timeout's reply `response_timeout`; older releases
/// `upstream_response_timeout`.)
const UPSTREAM_GAVE_UP: [&[u8]; 5] = [
    b"response_timeout",
    b"upstream_response_timeout",
    b"upstream_per_try_timeout",
    b"upstream_per_try_idle_timeout",
    b"upstream_max_stream_duration_reached",
];

/// Whether Envoy stopped waiting for the upstream ([`UPSTREAM_GAVE_UP`]): before any answer (its own
/// 504, not the provider's refusal or failure) or after the answer's headers (a stream reset).
/// A 2xx/3xx that reached its end of stream came whole from the upstream ("via_upstream"): the
/// property (a read of about 12k instructions in Envoy 1.40) is not read for it.
fn upstream_gave_up(cx: &Cx, status: u32, ended: bool) -> bool {
    status != 0
        && !(ended && (200..400).contains(&status))
        && cx
            .host
            .property(&["response", "code_details"])
            .is_some_and(|d| UPSTREAM_GAVE_UP.contains(&d.as_slice()))
}

/// Whether a response that ended without final usage is charged its whole reservation: the client left
/// (no response at all, or Envoy's details say the downstream went) or Envoy stopped waiting for the
/// upstream ([`UPSTREAM_GAVE_UP`]), and `quota.abandoned_charge` is `"reservation"`.
fn abandoned_in_full(cx: &Cx, status: u32) -> bool {
    let policy = cx
        .cfg
        .quota
        .as_ref()
        .map_or(AbandonedCharge::Reservation, |q| q.abandoned_charge);
    if policy != AbandonedCharge::Reservation {
        return false;
    }
    status == 0
        || cx
            .host
            .property(&["response", "code_details"])
            .is_some_and(|d| {
                d.starts_with(b"downstream_") || UPSTREAM_GAVE_UP.contains(&d.as_slice())
            })
}

/// `refund_unused` rules: gives back to the bucket what the provider's usage (`usage`, see
/// [`response_usage`]) shows was not used (everything when the provider did not serve the request);
/// takes usage above the charge too. Without a response (client gone) or without reported usage the
/// estimate stands.
fn refund_unused(cx: &mut Cx, f: &mut Forwarded, usage: Option<usage::Usage>) {
    if f.resp.refunded {
        return;
    }
    f.resp.refunded = true;
    if !f.refund {
        // No charged rule gives tokens back.
        return;
    }
    let status = f.resp.status;
    // Envoy gave up on an upstream that had the request: the estimate stands, as for a client gone.
    let gave_up = upstream_gave_up(cx, status, f.resp.ended);
    let used = if status == 0 || !(200..300).contains(&status) {
        None
    } else {
        usage.map(|u| u.prompt_tokens.saturating_add(u.completion_tokens))
    };
    // Positive: tokens given back; negative: the provider's usage was above the charge and the
    // difference is taken too, so the bucket accounts for what was really spent.
    let amount = |cost: u64| -> i64 {
        if status == 0 || gave_up {
            0
        } else if !(200..300).contains(&status) {
            i64::try_from(cost).unwrap_or(i64::MAX)
        } else {
            used.map_or(0, |used| {
                let diff = i128::from(cost) - i128::from(used);
                i64::try_from(diff).unwrap_or(if diff < 0 { i64::MIN } else { i64::MAX })
            })
        }
    };
    let charges: Vec<(Charge, bool)> = f
        .charges
        .local
        .iter()
        .map(|c| (c.clone(), false))
        .chain(f.charges.global.iter().map(|c| (c.clone(), true)))
        .collect();
    for (charge, global) in charges {
        refund_one(cx, &charge, global, amount(charge.cost));
    }
    for c in f.charges.fair.clone() {
        if cx.cfg.rule(c.rule).is_some_and(|r| r.refund_unused) {
            let span = cx
                .cfg
                .rule(c.rule)
                .map_or(0, |r| (r.params.burst * 2.0).ceil() as i64);
            fair::credit(cx, &c, amount(c.cost).clamp(-span, span));
        }
    }
}

/// Gives `amount` back to one charged bucket whose rule has `refund_unused` (takes `-amount` when
/// negative).
fn refund_one(cx: &mut Cx, charge: &Charge, global: bool, amount: i64) {
    let cfg = cx.cfg;
    let Some(rule) = cfg.rule(charge.rule).filter(|r| r.refund_unused) else {
        return;
    };
    if amount == 0 {
        return;
    }
    let now = cx.now();
    if global {
        // Sent by the root's tick (counted in tokengate_global_tokens_credited / _debited when Redis
        // takes it).
        let span = i64::try_from((rule.params.burst * 2.0).ceil() as u64).unwrap_or(i64::MAX);
        credits::enqueue(
            cx,
            Credit {
                key: charge.key.clone(),
                rule: charge.rule,
                amount: amount.clamp(-span, span),
                member: None,
            },
        );
    } else if amount > 0 {
        let amount = amount.unsigned_abs();
        if local::credit(cx.store(), cfg, rule, &charge.key, amount, now).is_ok() {
            cx.add(Metric::TokensCredited, amount);
        }
    } else {
        let amount = amount.unsigned_abs();
        if let Ok(taken) = local::debit(cx.store(), cfg, rule, &charge.key, amount, now) {
            // What the bucket really lost (its debt stops one burst deep).
            cx.add(Metric::TokensDebited, taken);
        }
    }
}

/// The response reached its end of stream: a 2xx/3xx is judged now, from what the response showed (no
/// property is read for it, in `on_log` either), so that `on_log` has nothing left to do for it.
pub(super) fn at_end_of_stream(cx: &mut Cx, f: &mut Forwarded) {
    if f.resp.ended && (200..400).contains(&f.resp.status) {
        record(cx, f);
    }
}

/// Reports this request's outcome to the breakers that admitted it.
fn record(cx: &mut Cx, f: &mut Forwarded) {
    if f.charges.breakers.is_empty() {
        return;
    }
    let Some(b) = &cx.cfg.breaker else {
        return;
    };
    let status = if f.resp.status != 0 {
        f.resp.status
    } else {
        cx.host
            .property(&["response", "code"])
            .and_then(|v| crate::store::read_u64(&v, 0))
            .map(|c| u32::try_from(c).unwrap_or(0))
            .unwrap_or(0)
    };
    // A 2xx/3xx that reached its end of stream came whole from the upstream ("via_upstream"): its
    // details cannot change the outcome, so the property is not read.
    let details = if f.resp.ended && (200..400).contains(&status) {
        None
    } else {
        cx.host
            .property(&["response", "code_details"])
            .and_then(|v| String::from_utf8(v).ok())
    };
    let completed = if b.count_incomplete_streams {
        f.resp.stream.as_ref().map(StreamScanner::completed)
    } else {
        None
    };
    if !b.count_incomplete_streams
        && f.resp.stream.is_some()
        && breaker::cut_after_response_started(status, details.as_deref())
    {
        // A stream the upstream cut after it had started: that is what the option turns off (the
        // reset would otherwise count as one).
        return;
    }
    let Some(outcome) = breaker::classify(status, details.as_deref(), completed, &b.policy) else {
        return;
    };
    let outcome = if outcome == Outcome::Success {
        outcome
    } else {
        let resets: Vec<&str> = f.resp.reset_headers.iter().map(String::as_str).collect();
        outcome.with_retry_after(breaker::retry_after_ms(
            f.resp.retry_after.as_deref(),
            &resets,
        ))
    };
    let held = std::mem::take(&mut f.charges.breakers);
    breakers::write(cx, held, outcome, &f.model);
}
