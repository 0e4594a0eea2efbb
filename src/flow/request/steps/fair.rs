//! Admission step: the fair limits (`share: "fair"`), each charged as its member — the tenant, or its
//! group at the share's level — in one record that holds the limit's bucket and the members' shares
//! ([`crate::limits::fair`]): weighted max-min among the members active lately, priorities as strict
//! levels, work-conserving. A member under its share is admitted while the bucket holds the cost; one
//! over it is refused (429, `tokengate_fair_refused_over_share`) even while tokens are left, so that the
//! quiet ones get theirs. A `global` fair limit's record is in Redis (a callout each, no lease), its
//! failures handled as a global bucket's (`global_buckets.on_failure`). See docs/fair-share.md.
//!
//! Metrics per fair limit (names bounded by the configuration, never by tenants): the refusals
//! `tokengate_fair_refused_over_share.<limit>` and `tokengate_fair_refused_limit_empty.<limit>` (also
//! counted in the totals without the suffix), and the gauges `tokengate_fair_active_members.<limit>` and
//! `tokengate_fair_share.<limit>` of the record charged last, set when they change.

use super::limits::{shadow_refusal, subject};
use crate::config::{GlobalFailure, Rule, StoreFailure};
use crate::flow::cx::Cx;
use crate::flow::effect::{CalloutReply, Effect, Level, Purpose};
use crate::flow::metric::Metric;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::state::{Charges, FairCharge, FairMember, InFlight, Plan, Sent};
use crate::flow::request::step::{Outcome, Step};
use crate::flow::shim;
use crate::flow::vm::credits;
use crate::flow::vm::state::{Credit, KNOWN_KEYS_CACHE};
use crate::limits::fair::{self, global as fair_global, Why};
use crate::limits::local::Decision;
use crate::shim::webdis::{ScriptCall, ShimError};
use crate::store::UpdateError;

/// The step.
pub(in crate::flow) struct Fair;

impl Step for Fair {
    fn start(&self, cx: &mut Cx, plan: &mut Plan) -> Outcome {
        let cfg = cx.cfg;
        let mut fairs: Vec<usize> = cfg
            .applicable(&plan.meta.tenant, &plan.meta.groups, &plan.model)
            .into_iter()
            .filter(|i| {
                cfg.rule(*i)
                    .is_some_and(|r| r.fair.is_some() && r.has_bucket)
            })
            .collect();
        fairs.reverse();
        plan.fairs = fairs;
        next(cx, plan)
    }

    fn on_reply(&self, cx: &mut Cx, plan: &mut Plan, reply: CalloutReply) -> Outcome {
        let InFlight::Fair(fc, sent) = std::mem::replace(&mut plan.inflight, InFlight::Nothing)
        else {
            return Outcome::Continue;
        };
        match answered(cx, plan, fc, sent, reply) {
            Outcome::Continue => next(cx, plan),
            other => other,
        }
    }

    fn undo(&self, cx: &mut Cx, plan: &mut Plan) {
        give_back(cx, &mut plan.charges);
    }
}

/// Gives the fair charges of a request that was not sent after all back to their records and members.
pub(in crate::flow) fn give_back(cx: &mut Cx, charges: &mut Charges) {
    for c in std::mem::take(&mut charges.fair) {
        credit(cx, &c, i64::try_from(c.cost).unwrap_or(i64::MAX));
    }
}

/// Gives `amount` tokens back to a fair charge's record and member (negative: takes them): at once in
/// shared data, queued for the tick for a record in Redis.
pub(in crate::flow) fn credit(cx: &mut Cx, c: &FairCharge, amount: i64) {
    if amount == 0 {
        return;
    }
    if c.global {
        credits::enqueue(
            cx,
            Credit {
                key: c.key.clone(),
                rule: c.rule,
                amount,
                member: Some(c.member.clone()),
            },
        );
        return;
    }
    let cfg = cx.cfg;
    let Some(rule) = cfg.rule(c.rule) else {
        return;
    };
    let now = cx.now();
    if fair::credit(cx.store(), cfg, rule, &c.key, c.member.hash, amount, now).is_ok() {
        if amount > 0 {
            cx.add(Metric::TokensCredited, amount.unsigned_abs());
        } else {
            cx.add(Metric::TokensDebited, amount.unsigned_abs());
        }
    }
}

/// Charges the fair limits still to charge until one needs a callout (or all are charged).
fn next(cx: &mut Cx, plan: &mut Plan) -> Outcome {
    while let Some(idx) = plan.fairs.pop() {
        match start(cx, plan, idx) {
            Outcome::Continue => {}
            other => return other,
        }
    }
    Outcome::Continue
}

/// Charges fair limit `idx`: its record in shared data, or a callout for a global one.
fn start(cx: &mut Cx, plan: &mut Plan, idx: usize) -> Outcome {
    let cfg = cx.cfg;
    let Some(rule) = cfg.rule(idx) else {
        return Outcome::Continue;
    };
    let Some(share) = rule.fair.as_deref() else {
        return Outcome::Continue;
    };
    let m = fair::member(share, &plan.meta.tenant, &cfg.groups, &plan.meta.groups);
    let member = FairMember {
        id: m.id.to_string(),
        hash: m.hash,
        weight: m.weight,
        level: m.level,
    };
    let who = subject(cfg, rule, &plan.meta);
    if rule.global {
        if let Some(g) = cfg.global.as_ref() {
            let fc = FairCharge {
                rule: idx,
                key: fair_global::key(rule, &who, &plan.model),
                member,
                cost: plan.cost,
                global: true,
            };
            return match shim::admit(cx, &g.cluster, &g.shim_breaker) {
                Ok(probe) => dispatch(
                    cx,
                    plan,
                    fc,
                    Sent {
                        probe,
                        ..Sent::default()
                    },
                ),
                Err(_) => {
                    let why = format!("the circuit of the shim at cluster '{}' is open", g.cluster);
                    unavailable(cx, plan, fc, &why)
                }
            };
        }
    }
    charge_local(cx, plan, idx, member, &who)
}

/// Charges fair limit `idx`'s record in this Envoy's shared data.
fn charge_local(
    cx: &mut Cx,
    plan: &mut Plan,
    idx: usize,
    member: FairMember,
    who: &str,
) -> Outcome {
    let cfg = cx.cfg;
    let Some(rule) = cfg.rule(idx) else {
        return Outcome::Continue;
    };
    let (key, info) = fair::record_key(
        cx.host.store(),
        cfg,
        &mut cx.worker.known_keys,
        KNOWN_KEYS_CACHE,
        rule,
        who,
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
    let now = cx.now();
    let m = member.as_member();
    let (outcome, stats) = fair::charge(cx.store(), cfg, rule, &key, &m, plan.cost, now, seen);
    if stats.corrupt {
        cx.inc(Metric::StateCorrupt);
        cx.log_failure(
            Level::Warn,
            "corrupt_bucket",
            format!("corrupt fair record at {key}: started afresh"),
        );
    }
    note_overflow(cx, &outcome.view);
    if !matches!(outcome.decision, Decision::StoreFailed(_)) {
        gauges(cx, idx, &outcome.view);
    }
    let fc = FairCharge {
        rule: idx,
        key,
        member,
        cost: plan.cost,
        global: false,
    };
    decided(cx, plan, fc, outcome.decision, outcome.why)
}

/// Counts a refusal of fair limit `rule`: over share, or its bucket empty (also a headers-phase refusal),
/// in all and for the limit.
pub(in crate::flow) fn count_refusal(cx: &mut Cx, rule: &Rule, over_share: bool) {
    let (total, name) = if over_share {
        (
            Metric::FairRefusedOverShare,
            format!("tokengate_fair_refused_over_share.{}", rule.name),
        )
    } else {
        (
            Metric::FairRefusedLimitEmpty,
            format!("tokengate_fair_refused_limit_empty.{}", rule.name),
        )
    };
    cx.inc(total);
    cx.fx.push(Effect::CountNamed(name, 1));
}

/// Sets fair limit `idx`'s gauges from what its record said, when they changed since this VM set them.
fn gauges(cx: &mut Cx, idx: usize, view: &fair::ShareView) {
    let Some(rule) = cx.cfg.rule(idx) else {
        return;
    };
    let active = u64::from(view.active);
    // Whole tokens/s: a gauge is an integer, and a steady share is not rewritten for its fractions.
    let share = view.level_share.max(0.0).round() as u64;
    let last = &mut cx.worker.fair_gauges;
    let (set_active, set_share) = match last.iter_mut().find(|g| g.0 == rule.name) {
        Some(g) => {
            let changed = (g.1 != active, g.2 != share);
            (g.1, g.2) = (active, share);
            changed
        }
        None => {
            last.push((rule.name.clone(), active, share));
            (true, true)
        }
    };
    if set_active {
        cx.fx.push(Effect::Gauge(
            format!("tokengate_fair_active_members.{}", rule.name),
            active,
        ));
    }
    if set_share {
        cx.fx.push(Effect::Gauge(
            format!("tokengate_fair_share.{}", rule.name),
            share,
        ));
    }
}

/// A member past the record's `max_members` shares the overflow member.
fn note_overflow(cx: &mut Cx, view: &fair::ShareView) {
    if view.overflow {
        cx.inc(Metric::FairOverflow);
    }
}

/// What a fair charge decided.
fn decided(
    cx: &mut Cx,
    plan: &mut Plan,
    fc: FairCharge,
    decision: Decision,
    why: Option<Why>,
) -> Outcome {
    let cfg = cx.cfg;
    let Some(rule) = cfg.rule(fc.rule) else {
        return Outcome::Continue;
    };
    match decision {
        Decision::Admit { snapshot, .. } => {
            plan.bind(rule, snapshot, 0);
            plan.charges.fair.push(fc);
            Outcome::Continue
        }
        Decision::Reject(_) if rule.shadow => {
            shadow_refusal(cx, rule, &plan.meta.tenant);
            Outcome::Continue
        }
        Decision::Reject(refusal) => {
            count_refusal(cx, rule, why == Some(Why::OverShare));
            Outcome::Deny(Denial::bucket(refusal))
        }
        Decision::StoreFailed(e) => {
            cx.inc(match e {
                UpdateError::CasExhausted => Metric::CasExhausted,
                UpdateError::Host => Metric::StoreErrors,
            });
            cx.log_failure(
                Level::Warn,
                "bucket_store",
                format!(
                    "fair record update failed at {}: {e:?}; applying on_store_error",
                    fc.key
                ),
            );
            if cfg.on_store_error == StoreFailure::Deny {
                return Outcome::Deny(Denial::new(
                    Reason::StoreError,
                    answers::limiter_unavailable(),
                ));
            }
            Outcome::Continue
        }
    }
}

/// Sends a global fair charge (`sent.eval`: as `EVAL`, after a NOSCRIPT).
fn dispatch(cx: &mut Cx, plan: &mut Plan, fc: FairCharge, mut sent: Sent) -> Outcome {
    let cfg = cx.cfg;
    let (Some(g), Some(rule)) = (cfg.global.as_ref(), cfg.rule(fc.rule)) else {
        return Outcome::Continue;
    };
    let Some(share) = rule.fair.as_deref() else {
        return Outcome::Continue;
    };
    let call = if sent.eval {
        ScriptCall::Eval
    } else {
        shim::script_call(cx.worker.fair_script_loaded)
    };
    sent.eval = call == ScriptCall::Eval;
    let body =
        fair_global::charge_request(&fc.key, rule, share, &fc.member.as_member(), fc.cost, call);
    plan.inflight = InFlight::Fair(fc, sent);
    Outcome::Await(shim::callout(
        Purpose::GlobalCharge,
        &g.cluster,
        &g.authority,
        g.timeout_ms,
        body,
    ))
}

/// Redis answered a global fair charge (or the host refused to send it).
fn answered(
    cx: &mut Cx,
    plan: &mut Plan,
    fc: FairCharge,
    sent: Sent,
    reply: CalloutReply,
) -> Outcome {
    let cfg = cx.cfg;
    let (Some(g), Some(rule)) = (cfg.global.as_ref(), cfg.rule(fc.rule)) else {
        return Outcome::Continue;
    };
    let Some(share) = rule.fair.as_deref() else {
        return Outcome::Continue;
    };
    let r = match shim::read(&g.cluster, &reply, fair_global::parse_reply) {
        Err(f) if f.error == ShimError::NoScript && !sent.eval => {
            cx.worker.fair_script_loaded = false;
            return dispatch(cx, plan, fc, Sent { eval: true, ..sent });
        }
        Err(f) => {
            shim::record(cx, &g.cluster, &g.shim_breaker, false, sent.probe);
            return unavailable(cx, plan, fc, &f.why);
        }
        Ok(r) => r,
    };
    shim::record(cx, &g.cluster, &g.shim_breaker, true, sent.probe);
    cx.worker.fair_script_loaded = true;
    cx.inc(Metric::GlobalCharged);
    let o = fair_global::outcome(&r, rule, share, fc.cost);
    note_overflow(cx, &o.view);
    gauges(cx, fc.rule, &o.view);
    decided(cx, plan, fc, o.decision, o.why)
}

/// Redis could not charge a global fair limit: `global_buckets.on_failure` — this Envoy's own fair
/// record instead (`local`), admit (`open`), or refuse (`closed`, 503).
fn unavailable(cx: &mut Cx, plan: &mut Plan, fc: FairCharge, why: &str) -> Outcome {
    let cfg = cx.cfg;
    cx.inc(Metric::GlobalShimErrors);
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
                format!("global fair limit unavailable ({why}); charging this Envoy's record (on_failure=local)"),
            );
            let Some(rule) = cfg.rule(fc.rule) else {
                return Outcome::Continue;
            };
            let who = subject(cfg, rule, &plan.meta);
            charge_local(cx, plan, fc.rule, fc.member, &who)
        }
        GlobalFailure::Open => {
            cx.inc(Metric::GlobalFailOpen);
            cx.log_failure(
                Level::Warn,
                "global_shim",
                format!("global fair limit unavailable ({why}); admitting (on_failure=open)"),
            );
            Outcome::Continue
        }
        GlobalFailure::Closed => {
            cx.log_failure(
                Level::Warn,
                "global_shim",
                format!("global fair limit unavailable ({why}); rejecting (on_failure=closed)"),
            );
            Outcome::Deny(Denial::new(
                Reason::GlobalUnavailable,
                answers::limiter_unavailable(),
            ))
        }
    }
}
