//! Global-bucket leases, the VM's side (the accounts are [`crate::global::lease`]): a request whose bucket's account holds its
//! cost is admitted from it in shared data — no callout; any other request is charged in Redis as
//! without leases, and that same call asks for a block when the bucket is busy. The tick of the VM that
//! saw an account run low tops it up; the VM holding the leader claim walks every account to top up
//! and to give idle ones back.

use super::state::{Credit, GLeaseCall, GLeaseKind};
use crate::config::GlobalSettings;
use crate::flow::cx::Cx;
use crate::flow::effect::{CalloutReply, Effect, Level, Purpose};
use crate::flow::metric::Metric;
use crate::flow::shim;
use crate::global::lease::{self, Answer, Plan, Policy, Take};
use crate::global::{self, LeaseAsk, Reply};
use crate::limits::bucket::{Snapshot, Verdict};
use crate::shim::webdis::ShimError;

/// Top-ups started per tick for accounts this VM saw run low.
pub const DIRTY_PER_TICK: usize = 16;
/// Accounts the leader looks at per tick.
pub const SCAN_PER_TICK: u64 = 32;
/// Accounts remembered as running low, per VM.
pub const MAX_DIRTY: usize = 1024;
/// Give-backs queued per VM at most (beyond, dropped: the bucket refills them anyway).
pub const MAX_RETURNS: usize = 1024;

/// What the lease did for a request's global charge.
pub enum Taken {
    /// Admitted from this Envoy's lease; `x-ratelimit-*` from this snapshot.
    Hit(Snapshot),
    /// Charged in Redis, with this block (tokens, requests) asked beyond it, and these tokens of the
    /// cost taken from the lease (Redis is charged the rest).
    Miss(Option<(u64, u64)>, u64),
}

/// Takes `cost` from the lease of rule `idx`'s bucket at Redis key `key`.
pub fn take(cx: &mut Cx, pol: &Policy, idx: usize, key: &str, cost: u64) -> Taken {
    let Some(rule) = cx.cfg.rule(idx) else {
        return Taken::Miss(None, 0);
    };
    let akey = lease::account_key(key);
    let now = cx.now();
    let retries = cx.cfg.cas_max_retries;
    let max = u64::from(cx.cfg.max_tenants);
    let store = cx.store();
    let may_create = || lease::REGISTRY.registered(store) < max;
    match lease::take(
        store,
        &akey,
        &rule.params,
        pol,
        cost,
        now,
        retries,
        may_create,
    ) {
        Take::Hit(a, refill) => {
            cx.inc(Metric::GlobalLeased);
            if refill {
                mark(cx, idx, key);
            }
            Taken::Hit(lease::snapshot(&a, &rule.params, now))
        }
        Take::Miss(ask, created, from) => {
            if created
                && !lease::REGISTRY.register(
                    cx.store(),
                    &lease::entry(idx, &rule.name, key),
                    cx.cfg.max_tenants,
                    retries,
                )
            {
                // Every registry slot is taken: this bucket is never leased here (the leader could not
                // give its lease back when idle).
                lease::forbid(cx.store(), &akey, retries);
                return Taken::Miss(None, from);
            }
            Taken::Miss(ask, from)
        }
        Take::Store => {
            cx.inc(Metric::StoreErrors);
            Taken::Miss(None, 0)
        }
    }
}

fn mark(cx: &mut Cx, idx: usize, key: &str) {
    let d = &mut cx.worker.gleases.dirty;
    if d.iter().any(|(i, k)| *i == idx && k == key) {
        return;
    }
    if d.len() >= MAX_DIRTY {
        d.remove(0);
    }
    d.push((idx, key.to_string()));
}

/// A request's charge answered: its use is measured, the block granted kept (beyond the caps, queued
/// back to Redis).
pub fn answered(
    cx: &mut Cx,
    pol: &Policy,
    idx: usize,
    key: &str,
    cost: u64,
    reply: &Reply,
    asked: bool,
) {
    let admitted = matches!(reply.verdict, Verdict::Admit | Verdict::Wait { .. });
    let ans = Answer {
        admitted_cost: if admitted { cost } else { 0 },
        admitted_requests: u64::from(admitted),
        block_tokens: reply.block_tokens,
        block_requests: reply.block_requests,
        seen: reply.state,
        asked,
    };
    keep(cx, pol, idx, key, &ans);
}

fn keep(cx: &mut Cx, pol: &Policy, idx: usize, key: &str, ans: &Answer) {
    let Some(rule) = cx.cfg.rule(idx) else {
        return;
    };
    let now = cx.now();
    let akey = lease::account_key(key);
    cx.add(Metric::GlobalLeaseTokens, ans.block_tokens);
    let excess = lease::apply(
        cx.store(),
        &akey,
        &rule.params,
        pol,
        ans,
        now,
        cx.cfg.cas_max_retries,
    );
    let (t, r) = match excess {
        Some(x) => x,
        None => {
            cx.inc(Metric::StoreErrors);
            cx.log_failure(
                Level::Warn,
                "lease_store",
                format!("cannot keep a global lease block in {akey}: it goes back to Redis"),
            );
            (ans.block_tokens, ans.block_requests)
        }
    };
    if t > 0 || r > 0 {
        give_back_later(cx, idx, key, t, r);
    }
}

fn give_back_later(cx: &mut Cx, idx: usize, key: &str, tokens: u64, requests: u64) {
    let q = &mut cx.worker.gleases.returns;
    let full = q.len() >= MAX_RETURNS;
    if full {
        q.remove(0);
    }
    q.push((idx, key.to_string(), tokens, requests));
    if full {
        cx.inc(Metric::GlobalCreditsDropped);
    }
}

/// A request's charge that asked for a block got no answer: the ask is cleared.
pub fn abandon(cx: &mut Cx, key: &str) {
    lease::abandon(cx.store(), &lease::account_key(key), cx.cfg.cas_max_retries);
}

/// Tokens a request gives back (a later step refused it, `refund_unused`), or takes after the fact
/// (negative): into or out of this Envoy's lease as far as it can; returns the rest, for Redis.
pub fn absorb(cx: &mut Cx, pol: &Policy, c: &Credit) -> i64 {
    let Some(rule) = cx.cfg.rule(c.rule) else {
        return c.amount;
    };
    let akey = lease::account_key(&c.key);
    let retries = cx.cfg.cas_max_retries;
    let amount = c.amount.unsigned_abs();
    if c.amount > 0 {
        let rest = lease::credit(cx.store(), &akey, &rule.params, pol, amount, retries);
        cx.add(Metric::GlobalTokensCredited, amount - rest);
        i64::try_from(rest).unwrap_or(i64::MAX)
    } else {
        let rest = lease::debit(cx.store(), &akey, amount, retries);
        cx.add(Metric::GlobalTokensDebited, amount - rest);
        i64::try_from(rest).map_or(i64::MIN, |r| -r)
    }
}

/// The root's tick: queued give-backs, top-ups of accounts this VM saw run low, then (on the leader) a
/// slice of every account (top-ups, idle give-backs).
pub fn tick(cx: &mut Cx, g: &GlobalSettings, pol: &Policy) {
    if shim::is_open(cx, &g.cluster, &g.shim_breaker) {
        return;
    }
    let retries = cx.cfg.cas_max_retries;
    let n = cx.worker.gleases.returns.len().min(DIRTY_PER_TICK);
    let returns: Vec<_> = cx.worker.gleases.returns.drain(..n).collect();
    for (idx, key, t, r) in returns {
        dispatch(cx, g, idx, key, GLeaseKind::GiveBack(t, r));
    }
    let n = cx.worker.gleases.dirty.len().min(DIRTY_PER_TICK);
    let dirty: Vec<_> = cx.worker.gleases.dirty.drain(..n).collect();
    for (idx, key) in dirty {
        start(cx, g, pol, idx, key);
    }
    let now = cx.now();
    if cx.worker.gleases.owner == 0 {
        cx.worker.gleases.owner = crate::store::claim::owner_id(cx.store(), retries).unwrap_or(0);
    }
    let owner = cx.worker.gleases.owner;
    if owner == 0 || !crate::store::claim::hold(cx.store(), lease::LEADER, owner, now, retries) {
        return;
    }
    let total = lease::REGISTRY.registered(cx.store());
    for _ in 0..SCAN_PER_TICK.min(total) {
        let i = cx.worker.gleases.cursor % total;
        cx.worker.gleases.cursor = cx.worker.gleases.cursor.wrapping_add(1);
        let Some(entry) = lease::REGISTRY.slot(cx.store(), i) else {
            continue;
        };
        let Some((idx, name, key)) = lease::parse_entry(&entry) else {
            continue;
        };
        // The rule's index as registered, or (after a configuration change) where its name is now.
        let idx = if cx.cfg.rule(idx).is_some_and(|r| r.name == name) {
            Some(idx)
        } else {
            (0..cx.cfg.rules.len() + cx.cfg.limits.len())
                .find(|i| cx.cfg.rule(*i).is_some_and(|r| r.name == name && r.global))
        };
        if let Some(idx) = idx {
            start(cx, g, pol, idx, key.to_string());
        }
    }
}

/// Tops up or gives back one account if it needs it.
fn start(cx: &mut Cx, g: &GlobalSettings, pol: &Policy, idx: usize, key: String) {
    let Some(rule) = cx.cfg.rule(idx) else {
        return;
    };
    let akey = lease::account_key(&key);
    let now = cx.now();
    match lease::plan(
        cx.store(),
        &akey,
        &rule.params,
        pol,
        now,
        cx.cfg.cas_max_retries,
    ) {
        Some(Plan::TopUp(t, r)) => dispatch(cx, g, idx, key, GLeaseKind::TopUp(t, r)),
        Some(Plan::GiveBack(t, r)) => dispatch(cx, g, idx, key, GLeaseKind::GiveBack(t, r)),
        None => {}
    }
}

fn dispatch(cx: &mut Cx, g: &GlobalSettings, idx: usize, key: String, kind: GLeaseKind) {
    let Some(rule) = cx.cfg.rule(idx) else {
        return;
    };
    let call = shim::script_call(cx.worker.global_script_loaded);
    let body = match kind {
        GLeaseKind::TopUp(t, r) => {
            let ask = LeaseAsk {
                requests: 0,
                block_tokens: t,
                block_requests: r,
                credit_requests: 0,
            };
            global::lease_request(&key, &rule.params, 0, 0, &ask, call)
        }
        GLeaseKind::GiveBack(t, r) => global::give_back_request(&key, &rule.params, t, r, call),
    };
    let s = &mut cx.worker.gleases;
    s.next_id = s.next_id.wrapping_add(1);
    let id = s.next_id;
    s.pending.insert(
        id,
        GLeaseCall {
            rule: idx,
            key,
            kind,
        },
    );
    cx.inc(Metric::GlobalLeaseCalls);
    cx.fx.push(Effect::Dispatch(shim::callout(
        Purpose::GlobalLease(id),
        &g.cluster,
        &g.authority,
        g.timeout_ms,
        body,
    )));
}

/// A top-up or give-back answered (or its dispatch was refused).
pub fn on_reply(cx: &mut Cx, g: &GlobalSettings, pol: &Policy, id: u64, reply: CalloutReply) {
    let Some(p) = cx.worker.gleases.pending.remove(&id) else {
        return;
    };
    match (p.kind, shim::read(&g.cluster, &reply, global::parse_reply)) {
        (GLeaseKind::TopUp(..), Ok(r)) => {
            cx.worker.global_script_loaded = true;
            let ans = Answer {
                admitted_cost: 0,
                admitted_requests: 0,
                block_tokens: r.block_tokens,
                block_requests: r.block_requests,
                seen: r.state,
                asked: true,
            };
            keep(cx, pol, p.rule, &p.key, &ans);
        }
        (GLeaseKind::GiveBack(t, _), Ok(_)) => {
            cx.worker.global_script_loaded = true;
            cx.add(Metric::GlobalLeaseReturnedTokens, t);
            // The bucket holds these again: a refusal cached before is stale.
            global::forget_refusal(cx.store(), &p.key);
        }
        (kind, Err(f)) if f.error == ShimError::NoScript => {
            // Sent again with EVAL on the next tick.
            cx.worker.global_script_loaded = false;
            match kind {
                GLeaseKind::TopUp(..) => {
                    abandon(cx, &p.key);
                    mark(cx, p.rule, &p.key);
                }
                GLeaseKind::GiveBack(t, r) => give_back_later(cx, p.rule, &p.key, t, r),
            }
        }
        (kind, Err(shim::Failure { error: e, why })) => {
            cx.inc(Metric::GlobalShimErrors);
            if e == ShimError::Unavailable {
                shim::record(cx, &g.cluster, &g.shim_breaker, false, false);
            }
            let what = match kind {
                GLeaseKind::TopUp(..) => {
                    abandon(cx, &p.key);
                    "lease top-up failed; asked again later"
                }
                GLeaseKind::GiveBack(..) => {
                    // The bucket refills what this lease held anyway.
                    cx.inc(Metric::GlobalCreditsDropped);
                    "lease give-back failed; dropped (the bucket refills it)"
                }
            };
            cx.log_failure(
                Level::Warn,
                "global_lease",
                format!("global bucket {}: {what} ({why})", p.key),
            );
        }
    }
}
