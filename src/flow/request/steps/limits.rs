//! Admission step: the first matching rule and every matching limit, each at its scope (tenant, group,
//! shared), charged in turn all or nothing — an in-flight slot, then a bucket in this Envoy's shared
//! data; a global bucket is only queued here for the global step (its refusal cache is read first). A
//! shadow limit that would refuse is counted and logged, never enforced. See docs/limits.md.

use crate::config::{Config, Rule, StoreFailure};
use crate::flow::cx::Cx;
use crate::flow::effect::Level;
use crate::flow::metric::Metric;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::state::{Charge, Charges, Meta, Plan};
use crate::flow::request::step::{Outcome, Step};
use crate::flow::vm::state::KNOWN_KEYS_CACHE;
use crate::global;
use crate::limits::bucket::Snapshot;
use crate::limits::inflight::{self, Acquired};
use crate::limits::local::{self, Decision};
use crate::store::registry::claim_slot;
use crate::store::UpdateError;

/// The step.
pub(in crate::flow) struct Limits;

impl Step for Limits {
    fn start(&self, cx: &mut Cx, plan: &mut Plan) -> Outcome {
        let cfg = cx.cfg;
        let cost = plan.cost;
        let now = cx.now();
        let mut globals: Vec<(usize, String)> = Vec::new();
        for idx in cfg.applicable(&plan.meta.tenant, &plan.meta.groups, &plan.model) {
            let Some(rule) = cfg.rule(idx) else {
                continue;
            };
            if let Some(max) = rule.max_in_flight {
                if let Err(d) = take_slot(cx, plan, idx, max, now) {
                    return Outcome::Deny(d);
                }
            }
            // A fair limit's bucket is charged by the fair step, with its member's share.
            if !rule.has_bucket || rule.fair.is_some() {
                continue;
            }
            if rule.global && cfg.global.is_some() {
                let key = global::key(rule, &subject(cfg, rule, &plan.meta), &plan.model);
                // Not sent when Redis refused this bucket moments ago and it cannot have refilled since.
                let leases = cfg.global.as_ref().is_some_and(|g| g.lease.is_some());
                if let Some(refusal) =
                    global::refused_from_cache(cx.store(), rule, &key, cost, now, leases)
                {
                    if rule.shadow {
                        shadow_refusal(cx, rule, &plan.meta.tenant);
                        continue;
                    }
                    cx.inc(Metric::GlobalRejectedCached);
                    return Outcome::Deny(Denial::bucket(refusal));
                }
                globals.push((idx, key));
            } else if let Err(d) = charge_local(cx, plan, idx, now) {
                return Outcome::Deny(d);
            }
        }
        // The global step charges them in this order.
        globals.reverse();
        plan.globals = globals;
        Outcome::Continue
    }

    fn undo(&self, cx: &mut Cx, plan: &mut Plan) {
        release(cx, &mut plan.charges);
    }
}

/// Gives back the in-flight slots and this Envoy's bucket charges of a request that was not sent
/// after all.
pub(in crate::flow) fn release(cx: &mut Cx, charges: &mut Charges) {
    let cfg = cx.cfg;
    release_slots(cx, charges);
    for c in std::mem::take(&mut charges.local) {
        if let Some(rule) = cfg.rule(c.rule) {
            let now = cx.now();
            if local::credit(cx.store(), cfg, rule, &c.key, c.cost, now).is_ok() {
                cx.add(Metric::TokensCredited, c.cost);
            }
        }
    }
}

/// Gives back the in-flight slots the request holds (it was not sent, or it ended).
pub(in crate::flow) fn release_slots(cx: &mut Cx, charges: &mut Charges) {
    for (key, owner) in std::mem::take(&mut charges.slots) {
        if let Err(e) = inflight::release(cx.store(), &key, owner, cx.cfg.cas_max_retries) {
            // The slot expires by itself (crate::limits::inflight::SLOT_TTL_S).
            cx.inc(Metric::StoreErrors);
            cx.log_failure(
                Level::Warn,
                "bucket_store",
                format!("in-flight release failed at {key}: {e:?}; the slot expires by itself"),
            );
        }
    }
}

/// Takes one of the `max` in-flight slots of limit `idx` for this request: `Ok` (taken, or a shadow
/// limit that would have refused), or the refusal.
fn take_slot(
    cx: &mut Cx,
    plan: &mut Plan,
    idx: usize,
    max: u32,
    now: u64,
) -> Result<(), Box<Denial>> {
    let cfg = cx.cfg;
    let Some(rule) = cfg.rule(idx) else {
        return Ok(());
    };
    let mut key = slot_key(rule, &subject(cfg, rule, &plan.meta));
    // Semaphore keys count against `max_tenants` like bucket keys; past it, subjects share 64 overflow
    // semaphores per limit.
    if !claim_slot(
        cx.host.store(),
        local::KEY_COUNTER,
        cfg.max_tenants,
        cfg.cas_max_retries,
        &mut cx.worker.known_keys,
        KNOWN_KEYS_CACHE,
        &key,
    ) {
        cx.inc(Metric::TenantOverflow);
        let n = crate::store::hash::fnv1a(crate::store::hash::FNV_OFFSET, key.as_bytes())
            % local::OVERFLOW_SLOTS;
        key = format!(
            "{}{}:~overflow{n}",
            crate::store::keys::IN_FLIGHT,
            rule.name
        );
    }
    let owner = inflight::owner(plan_id(plan), now);
    let ttl = inflight::SLOT_TTL_S.saturating_mul(1_000_000_000);
    match inflight::acquire(cx.store(), &key, max, owner, now, ttl, cfg.cas_max_retries) {
        Ok((acquired, corrupt)) => {
            if corrupt {
                cx.inc(Metric::StateCorrupt);
            }
            match acquired {
                Acquired::Taken { .. } => {
                    plan.charges.slots.push((key, owner));
                    Ok(())
                }
                Acquired::Full if rule.shadow => {
                    shadow_refusal(cx, rule, &plan.meta.tenant);
                    Ok(())
                }
                Acquired::Full => Err(Denial::bucket(answers::too_many_in_flight(
                    rule,
                    max,
                    &cfg.groups,
                ))),
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
            store_failed(cfg)
        }
    }
}

/// The request's id for its in-flight slots.
fn plan_id(plan: &Plan) -> u32 {
    plan.context
}

/// `on_store_error`: `Ok` to admit, or the refusal.
fn store_failed(cfg: &Config) -> Result<(), Box<Denial>> {
    if cfg.on_store_error == StoreFailure::Deny {
        return Err(Denial::new(
            Reason::StoreError,
            answers::limiter_unavailable(),
        ));
    }
    Ok(())
}

/// Charges rule or limit `idx`'s bucket in this Envoy's shared data: `Ok` (admitted, `plan.wait_ms`
/// raised when shaped; or a shadow limit that would have refused), or the refusal (what was charged
/// before is given back by the pipeline).
pub(in crate::flow) fn charge_local(
    cx: &mut Cx,
    plan: &mut Plan,
    idx: usize,
    now: u64,
) -> Result<(), Box<Denial>> {
    let cfg = cx.cfg;
    let Some(rule) = cfg.rule(idx) else {
        return Ok(());
    };
    let who = subject(cfg, rule, &plan.meta);
    let (key, info) = local::bucket_key(
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
    let (decision, stats) = local::charge(cx.store(), cfg, rule, &key, plan.cost, now, seen);
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
        Decision::Reject(refusal) => Err(Denial::bucket(refusal)),
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
            store_failed(cfg)
        }
    }
}

/// Whose bucket or semaphore `rule` charges for this request (see [`Rule::subject`]).
pub(in crate::flow) fn subject(cfg: &Config, rule: &Rule, meta: &Meta) -> String {
    rule.subject(&meta.tenant, &cfg.groups, &meta.groups)
        .into_owned()
}

/// The shared-data key of a limit's in-flight slots for `subject`.
pub(in crate::flow) fn slot_key(rule: &Rule, subject: &str) -> String {
    format!("{}{}:{}", crate::store::keys::IN_FLIGHT, rule.name, subject)
}

/// A shadow limit would have refused: counted and logged, never enforced.
pub(in crate::flow) fn shadow_refusal(cx: &mut Cx, rule: &Rule, tenant: &str) {
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
    pub(in crate::flow) fn bind(&mut self, rule: &Rule, snap: Snapshot, wait_ms: u64) {
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
