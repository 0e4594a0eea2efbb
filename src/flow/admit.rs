//! Phase 2, admission by buckets and limits: the first matching rule and every matching limit, each at its
//! scope (tenant, group, shared), charged in turn all or nothing — an in-flight slot, then a bucket in
//! this Envoy's shared data (global ones are queued for [`super::global_step`]) — then the breakers. A
//! refusal gives back what was taken before it (see docs/limits.md).

use super::answers;
use super::state::{Charge, Charges, Plan, Request};
use super::worker::{self, Credit, KNOWN_KEYS_CACHE};
use super::{Cx, Level, Metric, Next};
use crate::config::StoreFailure;
use crate::global;
use crate::limits::local::{self, Decision};
use crate::reply::Refusal;
use crate::store::UpdateError;

impl Request {
    /// The admission steps once the plan is made: every matching rule and limit in turn (in-flight
    /// slot, then bucket), all or nothing; the breakers; then the global buckets and the quota
    /// reservations, which need callouts.
    pub(super) fn admit(
        &mut self,
        cx: &mut Cx,
        mut plan: Box<Plan>,
        model_closed: Option<&str>,
    ) -> Next {
        let cfg = cx.cfg;
        let cost = plan.cost;
        let now = cx.now();
        // Every matching limit (and the first matching rule) in turn, all or nothing: a refusal gives
        // back what the earlier ones took. Global buckets are charged last, by callouts, once the
        // breakers admitted the request.
        let mut globals: Vec<(usize, String)> = Vec::new();
        for idx in cfg.applicable(&plan.meta.tenant, &plan.meta.groups, &plan.model) {
            let Some(rule) = cfg.rule(idx) else {
                continue;
            };
            if let Some(max) = rule.max_in_flight {
                if let Err(next) = self.take_slot(cx, &mut plan, idx, max, now) {
                    return next;
                }
            }
            if !rule.has_bucket {
                continue;
            }
            if rule.global && cfg.global.is_some() {
                let key = global::key(rule, &subject(cfg, rule, &plan.meta), &plan.model);
                // Not sent when Redis refused this bucket moments ago and it cannot have refilled since.
                if let Some(refusal) =
                    super::headers::global_refused_from_cache(cx, rule, &key, cost)
                {
                    if rule.shadow {
                        shadow_refusal(cx, rule, &plan.meta.tenant);
                        continue;
                    }
                    cx.inc(Metric::GlobalRejectedCached);
                    return self.reject_after_charges(cx, &mut plan, refusal);
                }
                globals.push((idx, key));
            } else if let Err(next) = self.charge_local(cx, &mut plan, idx, now) {
                return next;
            }
        }
        if let Err(next) = self.admit_breakers(cx, &mut plan, model_closed, now) {
            return next;
        }
        globals.reverse();
        plan.globals = globals;
        self.next_global(cx, plan)
    }

    /// A bucket refused: what the request took is given back, and the 429/413 sent.
    pub(super) fn reject_after_charges(
        &mut self,
        cx: &mut Cx,
        plan: &mut Plan,
        refusal: Refusal,
    ) -> Next {
        refund(cx, &mut plan.charges);
        let (meta, model) = (plan.meta.clone(), plan.model.clone());
        self.reject(cx, &meta, &model, Some(plan.cost), refusal)
    }

    /// Takes one of the `max` in-flight slots of limit `idx` for this request: `Ok` (taken, or a shadow
    /// limit that would have refused), or the reply already made.
    fn take_slot(
        &mut self,
        cx: &mut Cx,
        plan: &mut Plan,
        idx: usize,
        max: u32,
        now: u64,
    ) -> Result<(), Next> {
        let cfg = cx.cfg;
        let Some(rule) = cfg.rule(idx) else {
            return Ok(());
        };
        let mut key = slot_key(rule, &subject(cfg, rule, &plan.meta));
        // Semaphore keys count against `max_tenants` like bucket keys; past it, subjects share 64
        // overflow semaphores per limit.
        if !crate::store::registry::claim_slot(
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
        let owner = crate::limits::inflight::owner(self.id, now);
        let ttl = crate::limits::inflight::SLOT_TTL_S.saturating_mul(1_000_000_000);
        match crate::limits::inflight::acquire(
            cx.store(),
            &key,
            max,
            owner,
            now,
            ttl,
            cfg.cas_max_retries,
        ) {
            Ok((acquired, corrupt)) => {
                if corrupt {
                    cx.inc(Metric::StateCorrupt);
                }
                match acquired {
                    crate::limits::inflight::Acquired::Taken { .. } => {
                        plan.charges.slots.push((key, owner));
                        Ok(())
                    }
                    crate::limits::inflight::Acquired::Full if rule.shadow => {
                        shadow_refusal(cx, rule, &plan.meta.tenant);
                        Ok(())
                    }
                    crate::limits::inflight::Acquired::Full => {
                        let refusal = answers::too_many_in_flight(rule, max, &cfg.groups);
                        Err(self.reject_after_charges(cx, plan, refusal))
                    }
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
                if cfg.on_store_error == StoreFailure::Deny {
                    return Err(self.refused_after_charges(
                        cx,
                        plan,
                        "deny_store_error",
                        answers::limiter_unavailable(),
                        "tokengate_store_error",
                    ));
                }
                Ok(())
            }
        }
    }

    /// Charges rule or limit `idx`'s bucket in this Envoy's shared data: `Ok` (admitted, `plan.wait_ms`
    /// raised when shaped; or a shadow limit that would have refused), or the reply already made (what
    /// was charged before given back).
    pub(super) fn charge_local(
        &mut self,
        cx: &mut Cx,
        plan: &mut Plan,
        idx: usize,
        now: u64,
    ) -> Result<(), Next> {
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
            Decision::Reject(refusal) => Err(self.reject_after_charges(cx, plan, refusal)),
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
                if cfg.on_store_error == StoreFailure::Deny {
                    return Err(self.refused_after_charges(
                        cx,
                        plan,
                        "deny_store_error",
                        answers::limiter_unavailable(),
                        "tokengate_store_error",
                    ));
                }
                Ok(())
            }
        }
    }

    /// Takes the breaker admissions for the chosen cluster and model (after the bucket admitted).
    /// `Err`: a breaker refused (lost the last permit to another worker); charges were given back and
    /// the reply made.
    fn admit_breakers(
        &mut self,
        cx: &mut Cx,
        plan: &mut Plan,
        model_closed: Option<&str>,
        now: u64,
    ) -> Result<(), Next> {
        let cfg = cx.cfg;
        let Some(b) = &cfg.breaker else {
            return Ok(());
        };
        for (scope, name, seen_closed) in
            super::breakers::targets(b, &plan.meta, &plan.model, model_closed, now)
                .into_iter()
                .flatten()
        {
            match super::breakers::admit(cx, b, scope, name.as_deref(), seen_closed, now) {
                Ok(Some(held)) => plan.charges.breakers.push(held),
                Ok(None) => {}
                Err(reset) => {
                    let name = name.unwrap_or_default();
                    cx.inc(Metric::BreakerShortCircuited);
                    refund(cx, &mut plan.charges);
                    let meta = plan.meta.clone();
                    return Err(self.refuse(
                        cx,
                        &meta,
                        &name,
                        "circuit_open",
                        answers::circuit_open(scope, &name, reset),
                        "tokengate_circuit_open",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Gives the bucket charges and any breaker probe permits back (the request was not sent after all).
pub(super) fn refund(cx: &mut Cx, charges: &mut Charges) {
    let cfg = cx.cfg;
    super::breakers::release(cx, std::mem::take(&mut charges.breakers));
    release_slots(cx, charges);
    for c in std::mem::take(&mut charges.local) {
        if let Some(rule) = cfg.rule(c.rule) {
            let now = cx.now();
            if local::credit(cx.store(), cfg, rule, &c.key, c.cost, now).is_ok() {
                cx.add(Metric::TokensCredited, c.cost);
            }
        }
    }
    for c in std::mem::take(&mut charges.global) {
        worker::enqueue_credit(
            cx,
            Credit {
                key: c.key,
                rule: c.rule,
                amount: i64::try_from(c.cost).unwrap_or(i64::MAX),
            },
        );
    }
}

/// Gives back the in-flight slots the request holds.
pub(super) fn release_slots(cx: &mut Cx, charges: &mut Charges) {
    for (key, owner) in std::mem::take(&mut charges.slots) {
        if let Err(e) =
            crate::limits::inflight::release(cx.store(), &key, owner, cx.cfg.cas_max_retries)
        {
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

/// Whose bucket or semaphore `rule` charges for this request (see [`crate::config::Rule::subject`]).
pub(super) fn subject(
    cfg: &crate::config::Config,
    rule: &crate::config::Rule,
    meta: &super::state::Meta,
) -> String {
    rule.subject(&meta.tenant, &cfg.groups, &meta.groups)
        .into_owned()
}

/// The shared-data key of a limit's in-flight slots for `subject`.
pub(super) fn slot_key(rule: &crate::config::Rule, subject: &str) -> String {
    format!("{}{}:{}", crate::store::keys::IN_FLIGHT, rule.name, subject)
}

/// A shadow limit would have refused: counted and logged, never enforced.
pub(super) fn shadow_refusal(cx: &mut Cx, rule: &crate::config::Rule, tenant: &str) {
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
    pub(super) fn bind(
        &mut self,
        rule: &crate::config::Rule,
        snap: crate::limits::bucket::Snapshot,
        wait_ms: u64,
    ) {
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
