//! Admission step: each `global` rule or limit the limits step queued, charged in Redis through the
//! shim, one callout after another — or from this Envoy's lease of the bucket (`global_buckets.lease`),
//! without a callout; a charge that misses the lease asks for a block with it. When Redis cannot answer,
//! `global_buckets.on_failure` applies: this Envoy's bucket instead (`local`), admit (`open`) or refuse
//! (`closed`, 503).

use super::limits::{charge_local, shadow_refusal};
use crate::config::GlobalFailure;
use crate::flow::cx::Cx;
use crate::flow::effect::{CalloutReply, Level, Purpose};
use crate::flow::metric::Metric;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::state::{Charge, Charges, GlobalCharge, InFlight, Plan, Sent};
use crate::flow::request::step::{Outcome, Step};
use crate::flow::shim;
use crate::flow::vm::credits;
use crate::flow::vm::gleases::{self, Taken};
use crate::flow::vm::state::Credit;
use crate::global;
use crate::limits::bucket::Verdict;
use crate::limits::local::{self, Decision};
use crate::shim::webdis::{ScriptCall, ShimError};
use crate::store::Codec;

/// The step.
pub(in crate::flow) struct Global;

impl Step for Global {
    fn start(&self, cx: &mut Cx, plan: &mut Plan) -> Outcome {
        next(cx, plan)
    }

    fn on_reply(&self, cx: &mut Cx, plan: &mut Plan, reply: CalloutReply) -> Outcome {
        let InFlight::Global(gc) = std::mem::replace(&mut plan.inflight, InFlight::Nothing) else {
            return Outcome::Continue;
        };
        match answered(cx, plan, gc, reply) {
            Outcome::Continue => next(cx, plan),
            other => other,
        }
    }

    fn undo(&self, cx: &mut Cx, plan: &mut Plan) {
        credit_back(cx, &mut plan.charges);
    }
}

/// Gives back the global charges of a request that was not sent after all (queued for the tick).
pub(in crate::flow) fn credit_back(cx: &mut Cx, charges: &mut Charges) {
    for c in std::mem::take(&mut charges.global) {
        credits::enqueue(
            cx,
            Credit {
                key: c.key,
                rule: c.rule,
                amount: i64::try_from(c.cost).unwrap_or(i64::MAX),
                member: None,
            },
        );
    }
}

/// Charges the queued global buckets until one needs a callout (or all are charged: every bucket
/// admitted, and a request that must wait for one is counted as shaped).
fn next(cx: &mut Cx, plan: &mut Plan) -> Outcome {
    while let Some((rule, key)) = plan.globals.pop() {
        let gc = GlobalCharge {
            rule,
            key,
            cost: plan.cost,
            sent: Sent::default(),
            block: None,
            from_lease: 0,
        };
        match start(cx, plan, gc) {
            Outcome::Continue => {}
            other => return other,
        }
    }
    if plan.wait_ms > 0 {
        cx.inc(Metric::RequestsShaped);
    }
    Outcome::Continue
}

/// Starts one global bucket charge: from this Envoy's lease when it holds the cost (also while Redis is
/// down), else a callout (asking for a block with it when leases are on).
fn start(cx: &mut Cx, plan: &mut Plan, mut gc: GlobalCharge) -> Outcome {
    let Some(g) = cx.cfg.global.as_ref() else {
        return Outcome::Continue;
    };
    if let Some(pol) = g.lease {
        match gleases::take(cx, &pol, gc.rule, &gc.key, gc.cost) {
            Taken::Hit(snapshot) => {
                if let Some(rule) = cx.cfg.rule(gc.rule) {
                    plan.bind(rule, snapshot, 0);
                }
                plan.charges.global.push(Charge {
                    rule: gc.rule,
                    key: gc.key,
                    cost: gc.cost,
                });
                return Outcome::Continue;
            }
            Taken::Miss(block, from) => {
                gc.block = block;
                gc.from_lease = from;
            }
        }
    }
    match shim::admit(cx, &g.cluster, &g.shim_breaker) {
        Ok(probe) => gc.sent.probe = probe,
        Err(_) => {
            let why = format!("the circuit of the shim at cluster '{}' is open", g.cluster);
            return unavailable(cx, plan, gc, &why);
        }
    }
    dispatch(cx, plan, gc, false)
}

/// Sends the charge (`eval`: as `EVAL`, after a NOSCRIPT).
fn dispatch(cx: &mut Cx, plan: &mut Plan, mut gc: GlobalCharge, eval: bool) -> Outcome {
    let cfg = cx.cfg;
    let (Some(g), Some(rule)) = (cfg.global.as_ref(), cfg.rule(gc.rule)) else {
        return Outcome::Continue;
    };
    let call = if eval {
        ScriptCall::Eval
    } else {
        shim::script_call(cx.worker.global_script_loaded)
    };
    gc.sent.eval = call == ScriptCall::Eval;
    // What the lease held of the cost is charged already.
    let cost = gc.cost.saturating_sub(gc.from_lease);
    let body = match gc.block {
        Some((block_tokens, block_requests)) => {
            let ask = global::LeaseAsk {
                block_tokens,
                block_requests,
                ..global::LeaseAsk::request()
            };
            global::lease_request(&gc.key, &rule.params, cost, rule.max_wait_ms, &ask, call)
        }
        None => global::charge_request(&gc.key, &rule.params, cost, rule.max_wait_ms, call),
    };
    plan.inflight = InFlight::Global(gc);
    Outcome::Await(shim::callout(
        Purpose::GlobalCharge,
        &g.cluster,
        &g.authority,
        g.timeout_ms,
        body,
    ))
}

/// Redis answered the charge `gc` (or the host refused to send it).
fn answered(cx: &mut Cx, plan: &mut Plan, gc: GlobalCharge, reply: CalloutReply) -> Outcome {
    let cfg = cx.cfg;
    let (Some(g), Some(rule)) = (cfg.global.as_ref(), cfg.rule(gc.rule)) else {
        return Outcome::Continue;
    };
    let r = match shim::read(&g.cluster, &reply, global::parse_reply) {
        Err(f) if f.error == ShimError::NoScript && !gc.sent.eval => {
            cx.worker.global_script_loaded = false;
            return dispatch(cx, plan, gc, true);
        }
        Err(f) => {
            shim::record(cx, &g.cluster, &g.shim_breaker, false, gc.sent.probe);
            return unavailable(cx, plan, gc, &f.why);
        }
        Ok(r) => r,
    };
    shim::record(cx, &g.cluster, &g.shim_breaker, true, gc.sent.probe);
    if gc.sent.eval {
        cx.worker.global_script_loaded = true;
    }
    cx.inc(Metric::GlobalCharged);
    let (idx, cost, from_lease) = (gc.rule, gc.cost, gc.from_lease);
    let mut r = r;
    if let Some(pol) = g.lease {
        gleases::answered(cx, &pol, idx, &gc.key, cost, &r, gc.block.is_some());
        // What this Envoy now holds counts in what is left for `x-ratelimit-*`.
        r.state.tokens += r.block_tokens as f64;
        r.state.requests += r.block_requests as f64;
    }
    if matches!(
        r.verdict,
        Verdict::LimitTokens { .. } | Verdict::LimitRequests { .. }
    ) {
        let seen = global::seen_after_refusal(&gc.key, &r, cx.now());
        let _ = cx
            .store()
            .set(&global::seen_slot(&gc.key), &seen.encode(), 0);
    }
    let snap = r.state.snapshot(&rule.params);
    match local::decision(r.verdict, snap, rule, cost) {
        Decision::Admit {
            snapshot, wait_ms, ..
        } => {
            plan.charges.global.push(Charge {
                rule: idx,
                key: gc.key,
                cost,
            });
            plan.bind(rule, snapshot, wait_ms);
            Outcome::Continue
        }
        Decision::Reject(_) if rule.shadow => {
            // Not charged in Redis: the part taken from the lease goes back (a shadow limit admits;
            // its bucket is charged only for what it would have admitted).
            restore(cx, idx, &gc.key, from_lease);
            shadow_refusal(cx, rule, &plan.meta.tenant);
            Outcome::Continue
        }
        Decision::Reject(refusal) => {
            // Nothing was charged here; what this charge took from the lease goes back.
            restore(cx, idx, &gc.key, from_lease);
            Outcome::Deny(Denial::bucket(refusal))
        }
        Decision::StoreFailed(_) => {
            let gc = GlobalCharge {
                block: None,
                sent: gc.sent,
                ..gc
            };
            unavailable(cx, plan, gc, "unexpected verdict")
        }
    }
}

/// Redis could not charge the global bucket: `global_buckets.on_failure` applies.
fn unavailable(cx: &mut Cx, plan: &mut Plan, mut gc: GlobalCharge, why: &str) -> Outcome {
    let cfg = cx.cfg;
    cx.inc(Metric::GlobalShimErrors);
    if gc.block.is_some() {
        gleases::abandon(cx, &gc.key);
    }
    restore(cx, gc.rule, &gc.key, std::mem::take(&mut gc.from_lease));
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
            match charge_local(cx, plan, gc.rule, now) {
                Ok(()) => Outcome::Continue,
                Err(d) => Outcome::Deny(d),
            }
        }
        GlobalFailure::Open => {
            cx.inc(Metric::GlobalFailOpen);
            cx.log_failure(
                Level::Warn,
                "global_shim",
                format!("global bucket unavailable ({why}); admitting (on_failure=open)"),
            );
            Outcome::Continue
        }
        GlobalFailure::Closed => {
            cx.log_failure(
                Level::Warn,
                "global_shim",
                format!("global bucket unavailable ({why}); rejecting (on_failure=closed)"),
            );
            Outcome::Deny(Denial::new(
                Reason::GlobalUnavailable,
                answers::limiter_unavailable(),
            ))
        }
    }
}

/// Gives `amount` tokens taken from this Envoy's lease for a charge Redis did not make back to the
/// lease (queued as a credit: it goes to the lease first).
fn restore(cx: &mut Cx, rule: usize, key: &str, amount: u64) {
    if amount == 0 {
        return;
    }
    credits::enqueue(
        cx,
        Credit {
            key: key.to_string(),
            rule,
            amount: i64::try_from(amount).unwrap_or(i64::MAX),
            member: None,
        },
    );
}
