//! Phase 2, global buckets: each `global` rule or limit charged in Redis through the shim, one callout
//! after another (or from this Envoy's lease of the bucket), and what `global_buckets.on_failure` does when
//! Redis cannot answer.

use super::answers;
use super::shim;
use super::state::{Charge, GlobalCharge, Plan, Request, Stage, Step};
use super::{Cx, Effect, Level, Metric, Next, Purpose};
use crate::config::GlobalFailure;
use crate::global;
use crate::shim::webdis::ScriptCall;

impl Request {
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
                    from_lease: 0,
                });
                self.start_global(cx, plan)
            }
            None => self.after_buckets(cx, plan),
        }
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
                super::glease::Taken::Miss(block, from) => {
                    gc.block = block;
                    gc.from_lease = from;
                }
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
        let idx = match &mut plan.step {
            Step::Global(gc) => {
                if gc.block.is_some() {
                    super::glease::abandon(cx, &gc.key);
                }
                restore_lease(cx, gc);
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
}

/// The request is not charged in Redis after all: what it took from this Envoy's lease goes back to it.
pub(super) fn restore_lease(cx: &mut Cx, gc: &mut GlobalCharge) {
    if gc.from_lease == 0 {
        return;
    }
    let amount = i64::try_from(std::mem::take(&mut gc.from_lease)).unwrap_or(i64::MAX);
    super::worker::enqueue_credit(
        cx,
        super::worker::Credit {
            key: gc.key.clone(),
            rule: gc.rule,
            amount,
        },
    );
}
